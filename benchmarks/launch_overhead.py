"""What one kernel launch costs the host: kernellab's `k[grid, block](...)` against CuPy's RawKernel and a torch op.

Method: one block of 32 threads running `y[i] = a * x[i] + b` on 32 floats (the kernel takes well under the launch
time, so the GPU keeps up and the host's cost is what is timed). Each case is a loop of --launches calls between two
time.perf_counter() readings, the stream synchronised before the first reading and after the last; the table shows
the median over --rounds loops of (loop time / launches), in microseconds, and the 10th-90th percentile spread.
Asynchronous cases are compared with CuPy's RawKernel called the same way; synchronous ones with RawKernel followed
by a stream synchronisation (what kernellab's default launch adds is that wait). Target (issue 17): kernellab with
sync=False at most 1.25x RawKernel, the synchronous launch about RawKernel + synchronise.

Cases: kernellab with torch tensors (sync=False, and the default sync), kernellab with CuPy arrays (sync=False),
CuPy RawKernel on CuPy arrays (asynchronous, and + stream.synchronize()), torch's in-place `y.add_(1.0)`.
`--python-only` needs no GPU: it times kernellab's Python path (checks, packing, the launch path's bookkeeping) with a
stand-in driver (libc's abs() behind libcuda's ctypes argtypes, so ctypes' conversions are paid) and CPU tensors
posing as the device's, to see where host time goes. `--breakdown` (GPU) times the launcher, the generated launch
(LaunchPath.fast: CuPy's Cython launchKernel, and ctypes), the general path (LaunchPath.run) and each piece alone.

`--cpu` needs no GPU: the host path of the one-kernel registered op of `--ops`, stage by stage (dispatcher, the op's
own work, the allocation, the generated launch, the record of a launch that did not wait) with the stand-in driver
(the launch a C call, as CuPy's launchKernel is), over 100k calls a case (time.perf_counter_ns); `--profile` adds
cProfile's view. Beside it: torch.library.custom_op with the same launcher, a kernellab.op with a backward, and plain
torch.library.Library ops whose Python kernels do nothing or allocate (the dispatcher's own floor). Then tutorial 04's
kl::layernorm as a training step calls it (x requiring grad, w and b Parameters): forward and `y.backward(dy)`
against F.layer_norm's on the same CPU tensors (one intra-op thread), and the parts (the forward alone, the backward
op, each launcher, the dispatcher's path); its kernels compile for sm_90 and launch through the stand-in
(standin_tutorial). `--no-norm` leaves that table out. `--attention` does the same for tutorial 08's
kl_flash_attention (forward, then backward through autograd, the backward on step 3 as on an H100), stage by stage,
warm and with cold caches, with kernellab.tensor_map stood in by a Python cache hit (CPU memory has no map).
`--entry` (no GPU) times tutorial 07's attention entry point and its kl::attention op against the step each picks,
called directly, and against the old entry point (ENTRY_BEFORE), at small grid shapes planned as on an H200.

`--ops` (GPU, issue 30) times registered ops (kernellab.op) as a model calls them: host µs per call of a one-kernel
op (target <= 15 µs) beside the bare launch, torch.library.custom_op around the same launcher and one aten op;
tutorial 07's attention as an op beside an SDPA call of the same small shape (target <= 1.25x); and the GPU time per
call of a replayed CUDA graph of captured op calls against one of bare kernel launches (target: the same).

Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 benchmarks/launch_overhead.py [--launches 2000]
[--rounds 15] [--out table.md] [--breakdown | --ops | --cpu [--profile] | --python-only | --attention | --entry].
Takes about 10 s (--ops: about a minute, compiling tutorial 07's kernels; --cpu: about a minute on a shared 2-core
machine).
"""
import argparse
import math
import statistics
import time

import kernellab

SRC = r"""
extern "C" __global__ void axpb(const float* x, float* y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
N = 32


def per_launch_us(loop, launches: int, rounds: int, sync) -> list[float]:
    """µs per launch of `loop(launches)`, one figure per round (after one warm-up round)."""
    loop(min(launches, 100))
    sync()
    out = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        loop(launches)
        sync()
        out.append((time.perf_counter() - t0) / launches * 1e6)
    return out


def spread(us: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(us, n=10) if len(us) >= 10 else [min(us)] * 9 + [max(us)]
    return statistics.median(us), q[0], q[-1]


def launcher_loops(k, x, y):
    """(loop(m): m launches of k[1, 32](x, y, 2.0, 1.0, N, sync=False), the same loop with the default sync)."""
    def kl_async(m):
        launch = k[1, 32]
        for _ in range(m):
            launch(x, y, 2.0, 1.0, N, sync=False)

    def kl_sync(m):
        launch = k[1, 32]
        for _ in range(m):
            launch(x, y, 2.0, 1.0, N)
    return kl_async, kl_sync


def gpu_cases(launches: int, rounds: int) -> list[tuple[str, list[float], str]]:
    """(case, µs per launch each round, baseline case) for every case."""
    import cupy
    import torch

    k = kernellab.compile_cuda(SRC).axpb
    raw = cupy.RawKernel(SRC, "axpb")
    x, y = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    cx, cy = cupy.random.rand(N, dtype=cupy.float32), cupy.empty(N, dtype=cupy.float32)
    a, b = cupy.float32(2.0), cupy.float32(1.0)
    n32 = cupy.int32(N)
    stream = cupy.cuda.get_current_stream()
    torch_sync = torch.cuda.synchronize

    def both_sync():
        torch.cuda.synchronize()
        stream.synchronize()

    kl_async, kl_sync = launcher_loops(k, x, y)

    def kl_cupy(m):
        launch = k[1, 32]
        for _ in range(m):
            launch(cx, cy, 2.0, 1.0, N, sync=False)

    def raw_async(m):
        for _ in range(m):
            raw((1,), (32,), (cx, cy, a, b, n32))

    def raw_sync(m):
        for _ in range(m):
            raw((1,), (32,), (cx, cy, a, b, n32))
            stream.synchronize()

    def kl_cluster(m):
        launch = k[1, 32]
        for _ in range(m):
            launch(x, y, 2.0, 1.0, N, sync=False, cluster=(1, 1, 1))

    def torch_add(m):
        for _ in range(m):
            y.add_(1.0)

    k[1, 32](x, y, 2.0, 1.0, N)                        # compile, load and check once before timing
    torch.testing.assert_close(y, 2 * x + 1)
    return [
        ("CuPy RawKernel", per_launch_us(raw_async, launches, rounds, both_sync), "CuPy RawKernel"),
        ("kernellab, sync=False (torch tensors)", per_launch_us(kl_async, launches, rounds, torch_sync),
         "CuPy RawKernel"),
        ("kernellab, sync=False (CuPy arrays)", per_launch_us(kl_cupy, launches, rounds, both_sync), "CuPy RawKernel"),
        ("kernellab, cluster=(1, 1, 1), sync=False (cuLaunchKernelEx; torch tensors)",
         per_launch_us(kl_cluster, launches, rounds, torch_sync), "CuPy RawKernel"),
        ("torch y.add_(1.0)", per_launch_us(torch_add, launches, rounds, torch_sync), "CuPy RawKernel"),
        ("CuPy RawKernel + synchronize", per_launch_us(raw_sync, launches, rounds, both_sync),
         "CuPy RawKernel + synchronize"),
        ("kernellab, default sync (torch tensors)", per_launch_us(kl_sync, launches, rounds, torch_sync),
         "CuPy RawKernel + synchronize"),
    ]


def breakdown_cases(launches: int, rounds: int) -> list[tuple[str, list[float], str]]:
    """Where a launch's host time goes on the GPU: the launcher, the generated launch (LaunchPath.fast) and each of its
    pieces timed alone, the general path (LaunchPath.run), and the raw driver calls: CuPy's Cython launchKernel (what
    the generated launch calls where CuPy is importable) against ctypes."""
    import ctypes
    import threading

    import torch

    from kernellab.run.launch import launch as L
    from kernellab.run.launch.cudriver import Driver, _cupy_launch_kernel, _lib
    from kernellab.run.launch.tensor_map import tensor_map_cache_clear

    k = kernellab.compile_cuda(SRC).axpb
    x, y = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    launcher = k[1, 32]
    launcher(x, y, 2.0, 1.0, N)
    launcher(x, y, 2.0, 1.0, N)
    path, cfg, args = k._path, launcher._config, (x, y, 2.0, 1.0, N)
    plan, fast = path.plan(args), launcher._fast
    assert plan is not None and cfg is not None and fast, "the launcher did not take the generated launch"
    index, handle = path.device.index, L.torch_stream_handle(path.device.index)
    raw_stream = L.torch_stream_function()
    lib = _lib()
    fn, params = path.function_handle, path.params_address
    cupy_launch = _cupy_launch_kernel()
    # The same kernel through a second launch path whose generated launch calls ctypes' cuLaunchKernel.
    ctypes_path = L.LaunchPath(fn, path.params, path.device, name=k.name, signature=path.signature,
                               max_threads_per_block=path.max_threads_per_block,
                               static_shared_bytes=path.static_shared_bytes, driver=Driver(cupy_launch=False))
    ctypes_fast = ctypes_path.fast(cfg, tuple(map(type, args)))
    status = ctypes.c_int(0)
    status_p = ctypes.pointer(status)

    def full(m):
        for _ in range(m):
            launcher(x, y, 2.0, 1.0, N, sync=False)

    def full_sync(m):
        for _ in range(m):
            launcher(x, y, 2.0, 1.0, N)

    def generated(m):
        for _ in range(m):
            fast(args, None, False)

    def generated_ctypes(m):
        for _ in range(m):
            ctypes_fast(args, None, False)

    def run_only(m):
        for _ in range(m):
            path.run(cfg, args, None, False)

    def checks(m):
        check = plan.check
        for _ in range(m):
            check(x, y, 2.0, 1.0, N)

    def stream(m):
        for _ in range(m):
            raw_stream(index)

    def pack(m):
        values, pack_into, buf, base = plan.check(*args), path._struct.pack_into, path._buffer, path._base
        for _ in range(m):
            pack_into(buf, base, *values)

    def lock(m):
        lk = threading.Lock()
        acquire, release = lk.acquire, lk.release
        for _ in range(m):
            acquire()
            release()

    def capture_query(m):
        q = lib.cuStreamIsCapturing
        for _ in range(m):
            q(handle, status_p)

    def driver_launch(m):
        d = path.driver
        for _ in range(m):
            d.launch(fn, cfg.grid, cfg.block, cfg.shared_bytes, handle, params, index)

    def ctypes_launch(m):
        f = lib.cuLaunchKernel
        for _ in range(m):
            f(fn, 1, 1, 1, 32, 1, 1, 0, handle, params, None)

    def cupy_raw(m):
        f = cupy_launch
        for _ in range(m):
            f(fn, 1, 1, 1, 32, 1, 1, 0, handle, params, 0)

    # kernellab.tensor_map three ways: a cache hit; a layout mapped before at a new address (a training step's fresh
    # tensors: the driver's address replacement); and a full encode (the cache emptied first). Each call of the
    # middle case takes a view at an address no call has used (16 bytes apart in one buffer).
    fresh_views = iter(range(launches * rounds * 2 + 64))
    pool = torch.empty(128 * 64 + 8 * (launches * rounds * 2 + 64), device="cuda", dtype=torch.bfloat16)
    hot = pool[: 128 * 64].view(128, 64)
    kernellab.tensor_map(hot, (64, 64))

    def map_hit(m):
        for _ in range(m):
            kernellab.tensor_map(hot, (64, 64))

    def map_moved(m):
        views = [pool.as_strided((128, 64), (64, 1), 8 * next(fresh_views)) for _ in range(m)]
        t0 = time.perf_counter()
        for v in views:
            kernellab.tensor_map(v, (64, 64))
        return time.perf_counter() - t0

    def map_encode(m):
        clear = tensor_map_cache_clear
        for _ in range(m):
            clear()
            kernellab.tensor_map(hot, (64, 64))

    base = "kernellab, sync=False (full)"
    sync = torch.cuda.synchronize
    none = lambda: None  # noqa: E731
    cases = [(base, per_launch_us(full, launches, rounds, sync), base),
             ("kernellab, default sync (full)", per_launch_us(full_sync, launches, rounds, sync), base),
             (f"generated launch alone ({'CuPy launchKernel' if cupy_launch else 'ctypes'})",
              per_launch_us(generated, launches, rounds, sync), base),
             ("generated launch alone, ctypes cuLaunchKernel", per_launch_us(generated_ctypes, launches, rounds, sync),
              base),
             ("LaunchPath.run (the general path)", per_launch_us(run_only, launches, rounds, sync), base),
             ("plan.check alone", per_launch_us(checks, launches, rounds, none), base),
             ("torch raw stream alone", per_launch_us(stream, launches, rounds, none), base),
             ("struct.pack_into alone", per_launch_us(pack, launches, rounds, none), base),
             ("lock acquire + release alone", per_launch_us(lock, launches, rounds, none), base),
             ("cuStreamIsCapturing (ctypes) alone", per_launch_us(capture_query, launches, rounds, none), base),
             ("Driver.launch (packed, ctypes)", per_launch_us(driver_launch, launches, rounds, sync), base),
             ("ctypes cuLaunchKernel, argtypes", per_launch_us(ctypes_launch, launches, rounds, sync), base)]
    if cupy_launch:
        cases.append(("cupy.cuda.driver.launchKernel direct", per_launch_us(cupy_raw, launches, rounds, sync), base))
    cases += [("tensor_map, cache hit", per_launch_us(map_hit, launches, rounds, none), base),
              ("tensor_map, known layout at a new address (address replaced)",
               timed_per_call_us(map_moved, launches, rounds), base),
              ("tensor_map, full encode (cache emptied first)", per_launch_us(map_encode, launches, rounds, none),
               base)]
    tensor_map_cache_clear()
    return cases


def timed_per_call_us(loop, calls: int, rounds: int) -> list[float]:
    """µs per call, one figure a round, where `loop(calls)` times itself (after its own set-up) and returns seconds."""
    return [loop(calls) / calls * 1e6 for _ in range(rounds)]


def standin_lib():
    """libcuda's launch-path entry points played by libc's abs() with the same ctypes argtypes: each call pays what a
    real one pays in ctypes (the conversions, the foreign call) and returns 0 for function handle 0 and stream 0;
    cuLaunchKernelEx (a CUlaunchConfig pointer first) by libc's strnlen(config, function): 0 for function 0."""
    import ctypes

    from kernellab.run.launch.cudriver import CUlaunchConfig

    libc = ctypes.CDLL(None)
    p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int

    class Lib:
        pass

    lib = Lib()
    for name, argtypes in (("cuLaunchKernel", [p, u, u, u, u, u, u, u, p, p, p]), ("cuStreamSynchronize", [p]),
                           ("cuStreamIsCapturing", [p, ctypes.POINTER(i)]),
                           ("cuLaunchKernelEx", [ctypes.POINTER(CUlaunchConfig), p, p, p])):
        fn = libc["strnlen" if name == "cuLaunchKernelEx" else "abs"]   # a new function object: its own argtypes
        fn.argtypes, fn.restype = argtypes, i
        setattr(lib, name, fn)
    return lib


class _StandinDrivers:
    """Drivers over the stand-in library (standin_lib): `ctypes` calls it as kernellab's Driver does; `run` has no
    raw calls (every launch through LaunchPath.run and Driver.launch); `call` has a C builtin (min of the 11 ints: 0)
    in place of the ctypes cuLaunchKernel, about what CuPy's Cython launchKernel costs on top of the driver (the
    GPU's generated launch calls that where CuPy imports)."""

    def __init__(self, lib):
        from kernellab.run.launch.cudriver import Driver

        class RunDriver(Driver):
            def __init__(self, lib):
                super().__init__(lib)
                self.launch_kernel = None

        class CallDriver(Driver):
            def __init__(self, lib):
                super().__init__(lib)
                self.launch_kernel = min

        self.ctypes, self.run, self.call = (lambda: Driver(lib)), (lambda: RunDriver(lib)), (lambda: CallDriver(lib))


def standin_kernel():
    """(axpb compiled for sm_90, with_driver(driver): give it a launch path on the stand-in device, lib): a kernel
    launched on no GPU. CPU tensors pose as device index -1's, torch's current stream is 0 (through a C callable,
    as torch._C._cuda_getCurrentRawStream), and the driver's calls go to libc's abs() through ctypes (standin_lib).
    Patches kernellab's torch stream lookups for the rest of the process."""
    from kernellab.run.launch import launch as L
    from kernellab.run.launch.device import DeviceInfo

    k = kernellab.compile_cuda(SRC, arch="sm_90").axpb
    dev = DeviceInfo(index=-1, name="stand-in", arch="sm_90", multiprocessors=132)
    lib = standin_lib()
    L.torch_stream_handle = lambda index: 0
    L.torch_stream_function = lambda: (0).__mul__           # a C callable, as torch._C._cuda_getCurrentRawStream

    def with_driver(driver):
        k._path = L.LaunchPath(0, k.params, dev, name=k.name, signature=str(k.signature),
                               max_threads_per_block=k.resources.max_threads_per_block,
                               static_shared_bytes=k.resources.shared_bytes, driver=driver)
        k._launchers.clear()
    return k, with_driver, lib


def python_only_cases(launches: int, rounds: int) -> list[tuple[str, list[float], str]]:
    """kernellab's host path with a stand-in driver (no GPU): CPU tensors pose as device index -1's, and the
    Driver's calls go to libc's abs() through ctypes (standin_lib), so the ctypes conversions are timed."""
    import torch

    from kernellab.run.launch import launch as L

    k, with_driver, lib = standin_kernel()
    drivers = _StandinDrivers(lib)
    x, y = torch.randn(N), torch.empty(N)
    args = (x, y, 2.0, 1.0, N)
    kl_async, kl_sync = launcher_loops(k, x, y)

    def run_only(m):
        path, cfg = k._path, k[1, 32]._config
        for _ in range(m):
            path.run(cfg, args, None, False)

    def kl_cluster(m):
        launch = k[2, 32]
        for _ in range(m):
            launch(x, y, 2.0, 1.0, N, sync=False, cluster=2)

    def without_cluster_launches(driver):
        driver.launch_kernel_ex = None                  # the general path for cluster launches: LaunchPath.run
        return driver

    def checks_only(m):
        values = k._path.plan(args).check
        for _ in range(m):
            values(x, y, 2.0, 1.0, N)

    def marshal(m):
        for _ in range(m):
            L.marshal_args(k.params, args, None, any_device=True)

    def ctypes_call(m):
        f = lib.cuLaunchKernel
        for _ in range(m):
            f(0, 1, 1, 1, 32, 1, 1, 0, 0, 12345678, 0)

    def timed(driver, fn):
        with_driver(driver)
        kl_async(2)
        assert bool(k[1, 32]._fast) == (driver.launch_kernel is not None)
        return per_launch_us(fn, launches, rounds, none)

    none = lambda: None  # noqa: E731
    base = "generated launch, sync=False (ctypes stand-in)"
    cases = [
        (base, timed(drivers.ctypes(), kl_async), base),
        ("generated launch, default sync (ctypes stand-in)", timed(drivers.ctypes(), kl_sync), base),
        ("generated launch, sync=False (C-call stand-in, as CuPy's launchKernel)", timed(drivers.call(), kl_async),
         base),
        ("launcher -> LaunchPath.run -> Driver.launch, sync=False (ctypes stand-in)", timed(drivers.run(), kl_async),
         base),
        ("launcher -> LaunchPath.run -> Driver.launch, default sync (ctypes stand-in)", timed(drivers.run(), kl_sync),
         base),
        ("LaunchPath.run alone, sync=False (ctypes stand-in)", timed(drivers.run(), run_only), base),
        ("cluster launch k[2, 32](..., cluster=2), sync=False: generated (cuLaunchKernelEx, ctypes stand-in)",
         timed(drivers.ctypes(), kl_cluster), base),
        ("the same cluster launch by LaunchPath.run's general path -> Driver.launch (ctypes stand-in)",
         timed(without_cluster_launches(drivers.ctypes()), kl_cluster), base),
        ("stand-in cuLaunchKernel alone (ctypes, 11 args)", per_launch_us(ctypes_call, launches, rounds, none), base),
        ("the plan's checks alone", per_launch_us(checks_only, launches, rounds, none), base),
        ("marshal_args (the slow path's checks)", per_launch_us(marshal, launches, rounds, none), base),
    ]
    return cases


def interleaved_us(fns: list, calls: int, rounds: int) -> tuple[list[list[float]], list[list[float]]]:
    """µs per call of each f() in `fns`, `rounds` figures each, by the wall clock (time.perf_counter_ns) and by this
    thread's CPU time (time.thread_time_ns: what the calls cost where other processes share the cores): every round
    times `calls // rounds` calls of each function in turn, so a busy machine slows every case alike; a warm-up
    round first."""
    per_round = max(1, calls // rounds)
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for r in range(rounds + 1):
        for i, f in enumerate(fns):
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            for _ in range(per_round):
                f()
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            if r:
                wall[i].append((t1 - t0) / per_round / 1e3)
                cpu[i].append((c1 - c0) / per_round / 1e3)
    return wall, cpu


def cpu_table(cases, title: str) -> str:
    """The --cpu table: per case this thread's CPU time per call (the median round, and the best), the wall clock's
    best round, and the share of the op's (CPU, median) time."""
    lines = [title, "", "| stage | CPU µs per call, median | best | wall µs, best round | share of the op |",
             "|---|---|---|---|---|"]
    whole = statistics.median(cases[0][2])
    for name, wall, cpu in cases:
        med = statistics.median(cpu)
        lines.append(f"| {name} | {med:.2f} | {min(cpu):.2f} | {min(wall):.2f} | {med / whole:.2f} |")
    return "\n".join(lines)


def cpu_op_setup():
    """A one-kernel op as --ops registers it (klcpu::axpb: torch.empty_like, then the launch, no wait), here on CPU
    tensors with the stand-in driver's C call as the launch (standin_kernel); beside it the same launcher as
    torch.library.custom_op and as a kernellab.op with a backward, and two plain torch.library.Library ops (a
    Python kernel that returns None, one that returns torch.empty_like): the dispatcher's own floor.
    Returns a namespace of these and the tensors."""
    import types

    import torch

    k, with_driver, lib = standin_kernel()
    with_driver(_StandinDrivers(lib).call())
    x, y = torch.randn(N), torch.empty(N)
    launch = k[1, 32]
    for _ in range(2):
        launch(x, y, 2.0, 1.0, N, sync=False)
    assert launch._fast, "the stand-in launcher did not take the generated launch"

    def axpb_launcher(x):
        out = torch.empty_like(x)
        launch(x, out, 2.0, 1.0, x.numel())
        return out

    tag = f"{time.monotonic_ns() % 1_000_000}"              # a fresh namespace: ops cannot be redefined in a process
    ns = f"klcpu{tag}"
    axpb = kernellab.op(f"{ns}::axpb", "(Tensor x) -> Tensor", outputs=lambda x: x,
                        device_types=("cpu",))(axpb_launcher)

    def backward(ctx, grad):
        return grad * 2.0
    axpb_grad = kernellab.op(f"{ns}::axpb_grad", "(Tensor x) -> Tensor", outputs=lambda x: x, device_types=("cpu",),
                             backward=backward)(axpb_launcher)

    @torch.library.custom_op(f"{ns}::axpb_custom_op", mutates_args=(), device_types="cpu")
    def axpb_custom(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        launch(x, out, 2.0, 1.0, x.numel(), sync=False)
        return out

    axpb_custom.register_fake(lambda x: torch.empty_like(x))
    plain = torch.library.Library(ns, "FRAGMENT")
    plain.define("nothing(Tensor x) -> ()")
    plain.impl("nothing", lambda x: None, "CPU")
    plain.define("alloc(Tensor x) -> Tensor")
    plain.impl("alloc", lambda x: torch.empty_like(x), "CPU")
    ops = getattr(torch.ops, ns)
    # The stand-in launches nothing: the output is empty_like's; check the wiring, not the values.
    for f in (axpb, axpb_grad, axpb_custom):
        out = f(x)
        assert out.shape == x.shape and out.dtype == x.dtype and out is not x
    return types.SimpleNamespace(k=k, launch=launch, x=x, y=y, axpb=axpb, axpb_grad=axpb_grad, custom=axpb_custom,
                                 nothing=ops.nothing.default, alloc=ops.alloc.default, plain_lib=plain)


def cold_call_us(fn, calls: int, flush) -> float:
    """The median µs of `calls` calls of fn(), each after writing the host array `flush` (CPU caches cold, as torch's
    own host code leaves them between a step's launches)."""
    took = []
    for i in range(calls):
        flush.fill(i)
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1e6


def inside_op(f):
    """f wrapped to run as inside an op: Op._impl sets DEFER_SYNC around its launcher, so launches do not wait."""
    from kernellab.run.launch import launch as L

    def run():
        token = L.DEFER_SYNC.set(True)
        try:
            return f()
        finally:
            L.DEFER_SYNC.reset(token)
    return run


def cpu_cases(calls: int, rounds: int) -> list[tuple[str, list[float], str]]:
    """The host path of a one-kernel registered op (kernellab.op) on the CPU, stage by stage (cpu_op_setup): each
    stage timed alone over `calls` calls, so the op's cost can be read as the sum of its parts. Returns (case, wall
    µs per round, CPU µs per round) per case."""
    import torch

    from kernellab.run.launch import launch as L

    s = cpu_op_setup()
    x, y, launch, axpb = s.x, s.y, s.launch, s.axpb
    overload, impl, launcher = axpb.overload, axpb._impl, axpb.launcher
    cfg, fast, args = launch._config, launch._fast, (x, y, 2.0, 1.0, N)
    xg = x.clone().requires_grad_(True)

    def launcher_deferred():
        with L.deferred_sync():
            launcher(x)

    def enter_exit():
        with L.deferred_sync():
            pass

    one = "kernellab.op, one kernel: axpb(x)"    # the first row: the others' shares are of it
    named = [
        (one, lambda: axpb(x)),
        ("the same op through torch.ops (OpOverload)", lambda: overload(x)),
        ("  Op._impl alone (no dispatcher): launcher, no-wait rule, output check", lambda: impl(x)),
        ("  the launcher inside deferred_sync() (entered per call)", launcher_deferred),
        ("  the launcher, the no-wait context set per call", inside_op(lambda: launcher(x))),
        ("    torch.empty_like(x) (the output)", lambda: torch.empty_like(x)),
        ("    launch as in an op: sync=None, deferred (generated launch + record)",
         inside_op(lambda: launch(x, y, 2.0, 1.0, N))),
        ("      the generated launch alone (without _Launcher.__call__)",
         inside_op(lambda: fast(args, None, None))),
        ("    bare launch, sync=False", lambda: launch(x, y, 2.0, 1.0, N, sync=False)),
        ("    record_async alone (the no-wait launch's record)", lambda: L.record_async("axpb", cfg)),
        ("    deferred_sync() enter + exit alone", enter_exit),
        ("  Library op, Python kernel returning None (dispatcher floor)", lambda: s.nothing(x)),
        ("  Library op, Python kernel returning torch.empty_like(x)", lambda: s.alloc(x)),
        ("torch x.mul(2.0) (one aten op, allocates)", lambda: x.mul(2.0)),
        ("kernellab.op with backward=, no input requires grad", lambda: s.axpb_grad(x)),
        ("kernellab.op with backward=, input requires grad", lambda: s.axpb_grad(xg)),
        ("torch.library.custom_op, same launcher", lambda: s.custom(x)),
    ]
    for _ in range(3):
        L.RECENT_LAUNCHES.clear()
    wall, cpu = interleaved_us([f for _, f in named], calls, rounds)
    return [(name, w, c) for (name, _), w, c in zip(named, wall, cpu)]


NORM_SHAPE = (16, 768)      # rows x cols of the --cpu norm rows: GPT-2 small's width; F.layer_norm's CPU arithmetic at
                            # this size is a few µs of its figure (ours computes nothing: the stand-in launches)


def standin_tutorial(notebook: str, modules: tuple[str, ...], lib=None) -> dict:
    """A tutorial's launcher namespace (notebook_cells.load_tutorial) whose kernels are compiled for sm_90 (NVRTC, no
    GPU: the disk cache keeps them) and launch through the stand-in driver's C call (standin_kernel), on CPU tensors
    posing as device -1's: the ops' and launchers' real Python, with launches that do nothing. Patches kernellab's
    torch stream lookups for the rest of the process."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    from notebook_cells import load_tutorial

    ns = load_tutorial(notebook, compile=lambda src: kernellab.compile_cuda(src, arch="sm_90", first_line=2,
                                                                            filename="cell.cu"))
    lib = lib or standin_lib()
    for name in modules:
        standin_module(ns[name], lib)
    return ns


def standin_module(module, lib=None):
    """Every kernel of `module` (compiled for sm_90) launched through the stand-in driver's C call, on CPU tensors
    posing as device -1's (standin_tutorial's way, for a module compiled outside a tutorial). Patches kernellab's
    torch stream lookups for the rest of the process; returns the module."""
    from kernellab.run.launch import launch as L
    from kernellab.run.launch.device import DeviceInfo

    driver = _StandinDrivers(lib or standin_lib()).call()
    dev = DeviceInfo(index=-1, name="stand-in", arch="sm_90", multiprocessors=132)
    L.torch_stream_handle = lambda index: 0
    L.torch_stream_function = lambda: (0).__mul__
    for k in module.kernels:
        k._path = L.LaunchPath(0, k.params, dev, name=k.name, signature=str(k.signature),
                               max_threads_per_block=k.resources.max_threads_per_block,
                               static_shared_bytes=k.resources.shared_bytes, driver=driver)
        k._launchers.clear()
    return module


def norm_op_setup(shape=NORM_SHAPE):
    """Tutorial 04's kl::layernorm as a model calls it, on the stand-in (standin_tutorial): x [rows, cols] float32
    requiring grad, w and b nn.Parameters, dy the output's gradient; the op and F.layer_norm warmed up (the first
    calls make the plans, the generated launches and the outputs' checks). Returns a namespace."""
    import types

    import torch
    import torch.nn.functional as F

    ns = standin_tutorial("04-layernorm.py", ("norm_kernels", "norm_backward", "layernorm_simple"))
    rows, cols = shape
    x = torch.randn(rows, cols, requires_grad=True)
    w, b = torch.nn.Parameter(torch.ones(cols)), torch.nn.Parameter(torch.zeros(cols))
    dy = torch.randn(rows, cols)
    op = ns["kl_layernorm"]

    def ours():
        op(x, w, b, 1e-5).backward(dy)

    def theirs():
        F.layer_norm(x, (cols,), w, b, 1e-5).backward(dy)

    for _ in range(12):                     # past the op's first checked calls (kernellab.ops.CHECKED_CALLS)
        ours()
        theirs()
    x.grad = w.grad = b.grad = None
    return types.SimpleNamespace(ns=ns, op=op, x=x, w=w, b=b, dy=dy, cols=cols, ours=ours, theirs=theirs)


def norm_cpu_cases(calls: int, rounds: int) -> list[tuple[str, list[float], list[float]]]:
    """Tutorial 04's LayerNorm op forward and backward against F.layer_norm's (norm_op_setup), and its parts: the
    forward alone (recording the graph), the backward op and each launcher alone, the same calls through the
    dispatcher (torch.ops.kl.layernorm: torch's Autograd kernel). (case, wall µs per round, CPU µs per round)."""
    import torch
    import torch.nn.functional as F

    s = norm_op_setup()
    x, w, b, dy, cols, op, ns = s.x, s.w, s.b, s.dy, s.cols, s.op, s.ns
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    backward_op, overload = ns["kl_layernorm_backward"], op.overload

    def through_dispatcher():
        overload(x, w, b, 1e-5).backward(dy)

    def chain(norm, n=12):
        """n norms in a row and one backward for all, as a model's layers are: the engine's start paid once."""
        def run():
            h = x
            for _ in range(n):
                h = norm(h)
            h.backward(dy)
        return run

    def backward_op_alone():
        with torch.no_grad():                  # as in the graph's backward: grad mode off
            backward_op(dy, xd, w, 1e-5)

    named = [
        ("kl::layernorm forward + backward (y.backward(dy))", s.ours),
        ("F.layer_norm forward + backward (y.backward(dy))", s.theirs),
        ("  kl::layernorm forward alone, recording the graph", lambda: op(x, w, b, 1e-5)),
        ("  F.layer_norm forward alone, recording the graph", lambda: F.layer_norm(x, (cols,), w, b, 1e-5)),
        ("  kl::layernorm_backward op alone, grad mode off (what the graph's node calls)", backward_op_alone),
        ("    layernorm launcher alone (1 launch)", lambda: ns["layernorm"](xd, wd, bd)),
        ("    layernorm_backward launcher alone (2 launches)", lambda: ns["layernorm_backward"](dy, xd, wd)),
        ("kl::layernorm forward + backward through the dispatcher (torch.ops.kl.layernorm)", through_dispatcher),
        ("12 x kl::layernorm in a row, one backward (a model's layers)", chain(lambda h: op(h, w, b, 1e-5))),
        ("12 x F.layer_norm in a row, one backward", chain(lambda h: F.layer_norm(h, (cols,), w, b, 1e-5))),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # F.layer_norm's arithmetic on one thread: no pool waking per call
    try:
        wall, cpu = interleaved_us([f for _, f in named], calls, rounds)
    finally:
        torch.set_num_threads(threads)
    x.grad = w.grad = b.grad = None
    return [(name, wl, c) for (name, _), wl, c in zip(named, wall, cpu)]


def norm_table(cases, title: str) -> str:
    """The --cpu norm table: CPU µs per call (median round, best) and the ratio to F.layer_norm's forward + backward."""
    lines = [title, "", "| case | CPU µs per call, median | best | wall µs, best round | vs F.layer_norm fwd + bwd |",
             "|---|---|---|---|---|"]
    base = statistics.median(cases[1][2])
    for name, wall, cpu in cases:
        med = statistics.median(cpu)
        ratio = f"{med / base:.2f}x"
        if name.startswith("12 x F.layer_norm"):
            ratio = "1.00x (the row above's baseline)"
        elif name.startswith("12 x kl::"):
            chained = statistics.median(next(c for n, _, c in cases if n.startswith("12 x F.layer_norm")))
            ratio = f"{med / chained:.2f}x of 12 x F.layer_norm"
        lines.append(f"| {name} | {med:.2f} | {min(cpu):.2f} | {min(wall):.2f} | {ratio} |")
    return "\n".join(lines)


def context_cases(calls: int, rounds: int, heap_objects: int = 4_000_000,
                  flush_bytes: int = 64 << 20) -> list[tuple[str, float, float, float]]:
    """Tutorial 04's kl::layernorm forward + backward (norm_op_setup) and its forward launcher alone, as a training
    step's context may change them: a heap of `heap_objects` more live Python containers (what a cyclic GC's full
    collection walks), that heap after gc.freeze(), the GC off, and cold CPU caches (`flush_bytes` of host memory
    written before each call, as torch's own host code runs between a step's launches). Per case: (name, fwd + bwd
    µs a call, forward launcher µs a call, GC collections per 1000 calls of fwd + bwd, F.layer_norm's fwd + bwd µs a
    call: the baseline, in the same case); medians of the rounds."""
    import gc

    import numpy as np

    import kernellab.ops
    s = norm_op_setup()
    launcher, seen = s.op.launcher, []
    s.op.launcher = lambda *a: seen.append(a) or launcher(*a)
    s.ours()
    s.op.launcher = launcher
    args, flush = seen[0], np.zeros(flush_bytes // 8)

    def launcher_alone():
        token = kernellab.ops.DEFER_SYNC.set(True)          # launches do not wait, as inside the op (Op._impl)
        try:
            launcher(*args)
        finally:
            kernellab.ops.DEFER_SYNC.reset(token)

    def per_call(fn, cold=False) -> tuple[float, float]:
        started = [0]

        def count(phase, info):
            started[0] += phase == "start"
        gc.callbacks.append(count)
        try:
            medians, n = [], max(calls // 20, 5) if cold else calls
            for _ in range(rounds):
                if cold:
                    medians.append(cold_call_us(fn, n, flush))
                else:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn()
                    medians.append((time.perf_counter() - t0) / n * 1e6)
        finally:
            gc.callbacks.remove(count)
        return statistics.median(medians), 1000 * started[0] / (rounds * n)

    def case(name, cold=False):
        both, collections = per_call(s.ours, cold)
        return name, both, per_call(launcher_alone, cold)[0], collections, per_call(s.theirs, cold)[0]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # F.layer_norm's arithmetic on one thread, as in the --cpu table
    try:
        return _context_cases(case, heap_objects, flush_bytes)
    finally:
        torch.set_num_threads(threads)


def _context_cases(case, heap_objects: int, flush_bytes: int) -> list[tuple[str, float, float, float, float]]:
    """context_cases' cases in turn: case(name, cold) times one."""
    import gc

    cases = [case(f"as set up ({len(gc.get_objects()):,} objects tracked)")]
    heap = [[i] for i in range(heap_objects)]
    gc.collect()
    try:
        cases.append(case(f"+ {heap_objects:,} live lists ({len(gc.get_objects()):,} tracked), GC on"))
        gc.freeze()
        try:
            cases.append(case("  the same heap after gc.freeze()"))
        finally:
            gc.unfreeze()
        enabled = gc.isenabled()
        gc.disable()
        try:
            cases.append(case("  the same heap, GC off"))
        finally:
            if enabled:
                gc.enable()
    finally:
        del heap
        gc.collect()
    # The first case again, last: the cases run one after another, so a host whose speed drifts (clocks, neighbours)
    # shows here as a difference between the two, not as an effect of the heap or the GC.
    cases.append(case(f"as set up, again after the cases above ({len(gc.get_objects()):,} objects tracked)"))
    cases.append(case(f"cold CPU caches ({flush_bytes >> 20} MiB host write before each call)", cold=True))
    return cases


def cold_interleaved_us(fns: list, calls: int, flush, prepare=None) -> list[float]:
    """The median µs of `calls` cold calls of each f() in `fns`, taken in turn (a flush of the host array `flush`
    before every call, so the cases see the same machine): where prepare[i] is given, prepare[i]() runs before the
    flush and its result is f's argument (a backward's graph, made warm, run cold)."""
    took = [[] for _ in fns]
    prepare = prepare or [None] * len(fns)
    for i in range(calls):
        for j, f in enumerate(fns):
            state = None if prepare[j] is None else prepare[j]()
            flush.fill(i)
            if state is None:
                t0 = time.perf_counter()
                f()
            else:
                t0 = time.perf_counter()
                f(state)
            took[j].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e6 for t in took]


def calls_made(fn) -> tuple[int, int]:
    """(Python calls, C calls) one call of fn() makes (sys.setprofile's "call" and "c_call" events), fn's own frame
    not counted (a C function fn counts as its one C call)."""
    import sys

    counts = [0, 0]

    def profile(frame, event, arg):
        if event == "call":
            counts[0] += 1
        elif event == "c_call":
            counts[1] += 1
    fn()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    own = 1 if hasattr(fn, "__code__") else 0     # fn's own frame (a C function has none: its c_call is counted)
    return counts[0] - own, counts[1] - 1           # setprofile(None)'s c_call


def norm_cold_cases(calls: int, rounds: int, cold_calls: int, flush_bytes: int = 64 << 20) -> list[tuple]:
    """Tutorial 04's kl::layernorm forward + backward as a training step calls it (norm_op_setup) against
    F.layer_norm's, stage by stage down to the launch's pieces, warm (interleaved_us, this thread's CPU time) and with
    cold caches (cold_interleaved_us after a `flush_bytes` host write, wall time), with the Python and C calls each
    stage makes (calls_made). Rows whose name ends with "[backward]" time y.backward(dy) alone, the forward run warm
    before the flush. Returns (name, warm CPU µs per round, cold µs, Python calls, C calls) per row."""
    import threading

    import numpy as np
    import torch
    import torch.nn.functional as F

    import kernellab.ops
    from kernellab.run.launch import launch as L

    s = norm_op_setup()
    x, w, b, dy, cols, op, ns = s.x, s.w, s.b, s.dy, s.cols, s.op, s.ns
    xd = x.detach()
    launcher, backward_launcher, backward_op = ns["layernorm"], ns["layernorm_backward"], ns["kl_layernorm_backward"]
    y = torch.empty_like(xd)
    rows = xd.shape[0]
    forward = ns["_LAUNCHES"][("layernorm", rows, cols, xd.dtype)][1]
    # As the op's forward calls them: x a Tensor, w and b Parameters (the generated launch is per argument types).
    launch_args = (xd, w, b, y, rows, cols, ns["_LAUNCHES"][("layernorm", rows, cols, xd.dtype)][2].row_threads,
                   1e-5)
    fast = forward._fast
    assert fast, "the forward launcher's generated launch is not made"
    path = forward._path
    pack, buf, base = path._struct.pack_into, path._buffer, path._base
    values = (1, 2, 3, 4, rows, cols, launch_args[6], 1e-5)
    lock = threading.Lock()
    check_layout = ns["_check_layout"]
    defer = kernellab.ops.DEFER_SYNC

    def deferred(f, *args):
        """f(*args) with launches not waiting, as inside the op (the row's Python calls: f's and below)."""
        def run():
            token = defer.set(True)
            try:
                return f(*args)
            finally:
                defer.reset(token)
        return run

    def getters():
        for t in (xd, w, b, y):
            t.dtype, t.get_device(), t.is_contiguous(), t.data_ptr()

    def locked():
        lock.acquire()
        lock.release()

    def graph_ours():
        return op(x, w, b, 1e-5)

    def graph_theirs():
        return F.layer_norm(x, (cols,), w, b, 1e-5)

    def run_backward(out):
        out.backward(dy)

    def backward_op_alone():
        with torch.no_grad():
            backward_op(dy, xd, w, 1e-5)

    # The eager call's first test (the modes, tracers and transforms it reads), as its generated source has it.
    source = op._call.source.splitlines()
    first = source.index("        return OVERLOAD(*args)")
    space = dict(op._call.__globals__)
    exec(compile("\n".join(["def door_guards():"] + source[1:first] + ["        return True", "    return False"]),
                 "<the eager call's guards>", "exec"), space)
    door_guards = space["door_guards"]
    assert door_guards() is False
    try:                                    # the launcher's check: y, its own empty_like, left out where it can be
        check_layout(xd, w, b, None)
        layout_args = (xd, w, b, None)
    except AttributeError:
        layout_args = (xd, w, b, y)

    named = [   # (name, fn, prepare)
        ("F.layer_norm forward + backward (y.backward(dy)): the baseline", s.theirs, None),
        ("kl::layernorm forward + backward (y.backward(dy))", s.ours, None),
        ("  F.layer_norm forward alone, recording the graph", graph_theirs, None),
        ("  kl::layernorm forward alone, recording the graph", graph_ours, None),
        ("  F.layer_norm's y.backward(dy) alone [backward]", run_backward, graph_theirs),
        ("  kl::layernorm's y.backward(dy) alone [backward]", run_backward, graph_ours),
        ("    kl::layernorm_backward op alone, grad mode off", backward_op_alone, None),
        ("      layernorm_backward launcher alone (2 launches)", deferred(backward_launcher, dy, xd, w), None),
        ("    the eager call's guards (the modes, tracers and transforms it reads)", door_guards, None),
        ("    layernorm launcher alone (1 launch)", deferred(launcher, xd, w, b), None),
        ("      torch.empty_like(x) (its output)", lambda: torch.empty_like(xd), None),
        ("      _check_layout(x, w, b[, y]) (the tutorial's check)", lambda: check_layout(*layout_args), None),
        ("      kernel[grid, block](...) as configured (_Launcher.__call__ + generated launch)",
         deferred(forward, *launch_args), None),
        ("        the generated launch alone", deferred(fast, launch_args, None, None), None),
        ("          4 tensors' dtype, get_device(), is_contiguous(), data_ptr()", getters, None),
        ("          struct pack_into of the 8 values", lambda: pack(buf, base, *values), None),
        ("          lock acquire + release", locked, None),
        ("          DEFER_SYNC.get()", L.DEFER_SYNC.get, None),
        ("  an empty call (the timer's floor)", lambda: None, None),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        warm = []
        for name, f, prep in named:
            if prep is None:
                warm.append(f)
            else:
                def both(f=f, prep=prep):
                    f(prep())
                warm.append(both)
        _, cpu = interleaved_us(warm, calls, rounds)
        for j, (name, f, prep) in enumerate(named):          # the [backward] rows: minus their forward's warm time
            if prep is not None:
                forward_row = 2 if prep is graph_theirs else 3
                cpu[j] = [c - statistics.median(cpu[forward_row]) for c in cpu[j]]
        cold = cold_interleaved_us([f for _, f, _ in named], cold_calls, np.zeros(flush_bytes // 8),
                                   [p for _, _, p in named])
        made = []
        for name, f, prep in named:
            if prep is None:
                made.append(calls_made(f))
            else:
                both = calls_made(lambda f=f, prep=prep: f(prep()))
                fwd = calls_made(prep)
                made.append((both[0] - fwd[0] - 1, both[1] - fwd[1]))
    finally:
        torch.set_num_threads(threads)
        x.grad = w.grad = b.grad = None
    return [(name, c, cd, py, cc) for (name, _, _), c, cd, (py, cc) in zip(named, cpu, cold, made)]


def cold_table(cases, title: str) -> str:
    """The --cold table: per stage warm CPU µs (median round), cold µs (median call), cold / warm, the Python and C
    calls it makes, and the cold time against F.layer_norm's forward + backward (the first row)."""
    lines = [title, "", "| stage | warm µs | cold µs | cold / warm | Python calls | C calls | cold vs F.layer_norm "
             "fwd + bwd cold |", "|---|---|---|---|---|---|---|"]
    base = cases[0][2]
    for name, warm, cold, py, cc in cases:
        med = statistics.median(warm)
        lines.append(f"| {name} | {med:.2f} | {cold:.1f} | {cold / med if med > 0 else float('nan'):.1f}x | {py} | "
                     f"{cc} | {cold / base:.2f}x |")
    return "\n".join(lines)


ATTENTION_SHAPE = (1, 12, 128, 64)   # B, H, N, d of the --attention rows: GPT-2 small's heads and head dim; B and N
                                     # small (the training script's are 16 and 1024) because the stand-in's tensors
                                     # are CPU tensors, whose allocator maps 25 MB outputs page by page where the
                                     # GPU's caching allocator hands back a block: the host path's Python is the same


def standin_tensor_map():
    """A stand-in for kernellab.tensor_map on CPU tensors (the real one maps CUDA memory only): what its cache hit does
    (a key of the tensor's address, shape, strides, dtype, GPU and the box; one dict lookup; one copy of the map's
    fields with the tensor put in), the map's 128 bytes zeros. On an H100 host (NOTES-launch.md) a real hit costs
    2.7 µs, a known layout at a new address (the driver's address replacement) 11.3, a full encode 39.5."""
    from kernellab.run.launch.tensor_map import TENSOR_MAP_BYTES, TensorMap

    cache: dict = {}

    def tensor_map(tensor, box, **options):
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.get_device(), box)
        hit = cache.get(key)
        if hit is None:
            made = TensorMap(tensor=None, shape=tuple(tensor.shape), dtype=str(tensor.dtype).split(".")[-1],
                             box=tuple(box), strides_bytes=tuple(s * tensor.element_size() for s in tensor.stride()),
                             element_strides=(1,) * tensor.dim(), global_address=tensor.data_ptr(),
                             encoded=bytes(TENSOR_MAP_BYTES))
            hit = cache[key] = dict(made.__dict__)
        found = object.__new__(TensorMap)
        fields = hit.copy()
        fields["tensor"] = tensor
        object.__setattr__(found, "__dict__", fields)
        return found
    return tensor_map


def standin_tutorial_ops(notebook: str, tag: str):
    """(ns, standin): the tutorial's launcher cells loaded with their kernels compiled (each `%%cuda` cell for its
    arch, sm_90 by default) and its ops registered also on "cpu" under `tag::` (kl:: is the tutorial's CUDA
    registration); standin(kernels) points each kernel's launches at the stand-in driver's C call on device -1, an
    sm_90 of 132 SMs, on stream 0."""
    import pathlib
    import sys

    from kernellab.run.launch import launch as L
    from kernellab.run.launch.device import DeviceInfo

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    from notebook_cells import load_tutorial, named_cuda_cells_with_arch

    arch_of = {src: arch for arch, src in named_cuda_cells_with_arch(notebook).values()}
    real_op = kernellab.op

    def op_on_cpu(name, schema=None, **kw):
        return real_op(name.replace("kl::", f"{tag}::"), schema, **{**kw, "device_types": ("cuda", "cpu")})
    kernellab.op = op_on_cpu
    try:
        ns = load_tutorial(notebook, compile=lambda src: kernellab.compile_cuda(
            src, arch=arch_of.get(src) or "sm_90", first_line=2, filename="cell.cu"))
    finally:
        kernellab.op = real_op
    driver = _StandinDrivers(standin_lib()).call()
    dev = DeviceInfo(index=-1, name="stand-in", arch="sm_90", multiprocessors=132,
                     shared_per_block_optin_bytes=227 * 1024, shared_per_sm_bytes=228 * 1024)
    L.torch_stream_handle = lambda index: 0
    L.torch_stream_function = lambda: (0).__mul__

    def standin(kernels):
        for k in kernels:
            k._path = L.LaunchPath(0, k.params, dev, name=k.name, signature=str(k.signature),
                                   max_threads_per_block=k.resources.max_threads_per_block,
                                   static_shared_bytes=k.resources.shared_bytes, driver=driver)
            k._launchers.clear()
    return ns, standin


def attention_op_setup(shape=ATTENTION_SHAPE, causal=True):
    """Tutorial 08's kl_flash_attention as benchmarks/train_gpt2.py calls it (forward, then backward through
    autograd), on the stand-in: the notebook's launcher cells with its kernels compiled (step 2's for sm_90, step 3's
    for sm_90a, tutorial 07's forward for sm_90) and launched through the stand-in driver's C call, on CPU tensors
    posing as device -1's, which the backward treats as an H100 (capability (9, 0): step 3, the op's choice at
    d = 64). Stood in, and said so in the table: kernellab.tensor_map (standin_tensor_map: CPU memory has no map),
    and the ops' registration (kernellab.op also on "cpu" and in a namespace of its own, since kl:: is the
    tutorial's CUDA registration). q, k, v require grad and are contiguous (a model's transposed heads would add
    three .contiguous() copies: torch's work, on the GPU). Returns a namespace; .restore() puts kernellab.op and
    kernellab.tensor_map back."""
    import pathlib
    import re
    import types

    import torch

    real_map = kernellab.tensor_map
    ns, standin = standin_tutorial_ops("08-attention-backward.py", f"klcpu{time.monotonic_ns() % 1_000_000}")
    here = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "07-fused-attention.py"
    cells = re.split(r"^# %%(?: .*)?\n", here.read_text(), flags=re.M)
    cell = next(c for c in cells if c.startswith("# %%cuda") and "--name fa2_cell" in c.partition("\n")[0])
    ns["_fa2_forward"]["module"] = kernellab.compile_cuda(cell.partition("\n")[2], arch="sm_90", first_line=2,
                                                          filename="07-fused-attention.py:step2")
    standin(k for module in (ns["attn_bwd"], ns["attn_bwd_h"], ns["_fa2_forward"]["module"]) for k in module.kernels)
    ns["_capability"][-1] = (9, 0)                  # the stand-in device is an H100 (the op's backward: step 3)
    kernellab.tensor_map = standin_tensor_map()

    def restore():
        kernellab.tensor_map = real_map
        ns["_capability"].pop(-1, None)

    B, H, N, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.bfloat16).requires_grad_(True) for _ in range(3))
    do = torch.randn(B, H, N, d, generator=g).to(torch.bfloat16)
    attention = ns["kl_flash_attention"]

    def ours():
        attention(q, k, v, causal).backward(do)
        q.grad = k.grad = v.grad = None     # as zero_grad(set_to_none=True): the next step's gradients are stolen, not
                                            # added (an addition would be the CPU's arithmetic, not host path)

    for _ in range(12):                     # past the ops' first checked calls (kernellab.ops.CHECKED_CALLS)
        ours()
    return types.SimpleNamespace(ns=ns, q=q, k=k, v=v, do=do, causal=causal, ours=ours, restore=restore,
                                 tensor_map=kernellab.tensor_map)


def attention_named_cases(s) -> list:
    """(case, fn) for the --attention table: the op's forward + backward and its stages, each alone (attention_op_setup)."""
    import torch

    ns, causal = s.ns, s.causal
    q, k, v, do = (x.detach() for x in (s.q, s.k, s.v, s.do))
    o, lse = ns["attention_forward"](q, k, v, causal)
    B, H, N, d = q.shape
    fwd_op, bwd_op, forward, hopper = (ns["kl_flash_attention_lse"], ns["kl_attention_backward"],
                                       ns["attention_forward"], ns["attention_backward_hopper"])
    step2 = ns["attention_backward"]
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    rows = B * H * N
    delta, dq_accum = torch.empty(B, H, N), torch.empty(B, H, N, d)
    tensor_map, attn_bwd, attn_bwd_h = s.tensor_map, ns["attn_bwd"], ns["attn_bwd_h"]
    pre = attn_bwd["bwd_pre_bf16_d64"][(math.ceil(rows / 4),), 128]
    main = attn_bwd_h[f"hbwd_bf16_d64{'_causal' if causal else ''}"][(math.ceil(N / ns["HBWD_KEYS"]), B * H),
                                                                     ns["HBWD_THREADS"], ns["hbwd_smem_bytes"](d)]
    convert = attn_bwd["bwd_dq_convert_bf16"][(min(math.ceil(q.numel() / 256), 4096),), 256]
    maps = [tensor_map(x.view(B * H, N, d), (1, 64, 64)) for x in (q, k, v, do)]

    def backward_op_alone():
        with torch.no_grad():                            # as the graph's node calls it
            bwd_op(q, k, v, o, lse, do, causal)

    def allocations():                                   # as attention_backward_hopper allocates
        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        pad = -(-rows // 64) * 64
        torch.empty(pad + rows * d, dtype=torch.float32, device=q.device)[pad:]

    def checks():                                        # as attention_backward_hopper checks, every call
        if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and do.is_contiguous()):
            raise ValueError

    hbwd_table, op_table = ns["_HBWD_LAUNCHES"], ns["_OP_BACKWARD"]

    def kernels_found():                                 # step 3's per-shape table
        hbwd_table.get((q.dtype, B, H, N, d, causal))

    def backward_chosen():                               # the op's per-shape table of launchers
        op_table.get((q.get_device(), q.dtype, q.shape, causal))

    attention, qg, kg, vg = ns["kl_flash_attention"], s.q, s.k, s.v

    def layers(n=12):
        """n attention calls in a row (each one's q the last output) and one backward, as a model's layers are: the
        engine's start and the gradient's checks paid once; the row reports the time per layer."""
        kvs = [(kg.detach().clone().requires_grad_(True), vg.detach().clone().requires_grad_(True))
               for _ in range(n)]                        # each layer its own k, v: no gradient added to another's

        def run():
            h = qg
            for kl, vl in kvs:
                h = attention(h, kl, vl, causal)
            h.backward(do)
            qg.grad = None
            for kl, vl in kvs:
                kl.grad = vl.grad = None
        return run

    return [
        ("kl_flash_attention forward + backward (o.backward(do))", s.ours),
        ("  per layer of 12 in a row and one backward (a model's layers; the row's time / 12)", layers()),
        ("  kl::flash_attention_lse forward alone, recording the graph", lambda: fwd_op(s.q, s.k, s.v, causal)),
        ("    attention_forward launcher alone (1 launch)", inside_op(lambda: forward(q, k, v, causal))),
        ("  kl::attention_backward op alone, grad mode off (what the graph's node calls)", backward_op_alone),
        ("    attention_backward_hopper launcher alone (3 launches, 4 maps)",
         inside_op(lambda: hopper(q, k, v, o, lse, do, causal))),
        ("      its allocations (dq, dk, dv; one for delta and dq_accum, and dq_accum's slice)", allocations),
        ("      its 4 tensor maps (stood in: a cache hit in Python)",
         lambda: [tensor_map(x.view(B * H, N, d), (1, 64, 64)) for x in (q, k, v, do)]),
        ("      its checks (4 x is_contiguous; head dim and dtype at a shape's first call)", checks),
        ("      its configured kernels found (_HBWD_LAUNCHES, one lookup a call)", kernels_found),
        ("      its 3 launches alone (configured, no wait)", inside_op(lambda: (
            pre(o, do, delta, dq_accum, rows), main(*maps, lse, delta, dq_accum, dk, dv, N, d ** -0.5),
            convert(dq_accum, dq, q.numel())))),
        ("      the op's choice of backward (_OP_BACKWARD, one lookup a call)", backward_chosen),
        ("      hopper_backward_applies (a shape's first call only)", lambda: ns["hopper_backward_applies"](q)),
        ("    step 2's atomic_w8 launcher alone (3 launches), for comparison",
         inside_op(lambda: step2(q, k, v, o, lse, do, causal, "atomic_w8"))),
    ]


# Small shapes of tutorial 07's grid (B, H, N, d, causal), where a call's kernel is short and the host's time shows:
# the H200's plan takes the 64-row variant or step 3 (three tensor maps) at B*H = 16 and 64, step 2 (pointers) at
# B*H = 256, N = 128.
ENTRY_SHAPES = ((1, 16, 128, 64, True), (1, 16, 128, 64, False), (1, 16, 128, 128, False), (1, 16, 512, 64, False),
                (4, 16, 256, 64, True), (4, 16, 256, 128, True), (16, 16, 128, 64, False))
ENTRY_DEVICE = "NVIDIA H200"            # the device name the entry point plans for (its constants pick the kernel)

# Tutorial 07's entry point as it was before its per-shape launch was made a ready call (the key built from q.device,
# the checks, the family's branch and the maps' list every call): kept here so both run interleaved in one process.
ENTRY_BEFORE = r"""
_attention_launches = {}


def attention(q, k, v, out=None, causal=False, kernel=None, ctas=None):
    key = (q.shape, q.dtype, q.device, causal, kernel, ctas)
    found = _attention_launches.get(key)
    if found is None:
        if q.dtype not in (torch.bfloat16, torch.float16) or q.dim() != 4 or q.shape[-1] not in (64, 128):
            raise ValueError(f"attention takes [B, H, N, d] bf16 or fp16 tensors with d = 64 or 128; got "
                             f"{tuple(q.shape)} {q.dtype}")
        found = _attention_launches[key] = _attention_launch_before(q, causal, kernel, ctas)
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()) or not (q.shape == k.shape == v.shape):
        raise ValueError("attention takes contiguous q, k, v of one shape [B, H, N, d]")
    plan, launch, scalars = found
    out = torch.empty_like(q) if out is None else out
    if plan.family == "fa2":
        launch(q, k, v, out, None, *scalars)
    else:
        B, H, N, d = q.shape
        maps = [kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64))
                for x, rows in ((q, plan.block_m), (k, plan.block_n), (v, plan.block_n))]
        launch(*maps, out, *scalars)
    return out


def _attention_launch_before(q, causal, kernel, ctas):
    B, H, N, d = q.shape
    plan = attention_plan(q, causal, kernel)
    grid = (min(ctas or plan.ctas, plan.ctas),) if plan.persistent else (math.ceil(N / plan.block_m), B * H)
    launch = ATTENTION_KERNELS[plan.entry][grid, plan.threads, plan.shared_bytes]
    if plan.persistent:
        if q.device not in _attention_counters:
            _attention_counters[q.device] = torch.zeros(1, dtype=torch.int32, device=q.device)
        heads_per_section = max(1, min(B * H, (16 << 20) // (2 * N * d * q.element_size())))
        scalars = (N, B * H, heads_per_section, _attention_counters[q.device], d ** -0.5)
    else:
        scalars = (N, d ** -0.5)
    return plan, launch, scalars
"""


def entry_setup(device_name: str = ENTRY_DEVICE):
    """Tutorial 07's entry point (`attention`, the `kl::attention` op) on the stand-in: the notebook's launcher cell
    with its kernels compiled (step 2 for sm_90, steps 3 and 3b for sm_90a) and launched through the stand-in driver's
    C call, on CPU tensors posing as device -1's, planned as on `device_name` (132 SMs); kernellab.tensor_map stood in
    (standin_tensor_map), kl::attention registered also on "cpu" in a namespace of its own. Beside it: ENTRY_BEFORE
    (the entry point before its ready per-shape calls) and the grid's step op (benchmarks/attention.py --grid: a
    registered op taking the step's name, which calls the entry point with `kernel=`). Returns a namespace;
    .restore() puts kernellab.op and kernellab.tensor_map back."""
    import types

    import torch

    real_op, real_map = kernellab.op, kernellab.tensor_map
    tag = f"klentry{time.monotonic_ns() % 1_000_000}"
    ns, standin = standin_tutorial_ops("07-fused-attention.py", tag)
    standin(ns["ATTENTION_KERNELS"].values())
    cpu = torch.device("cpu")
    ns["_attention_sms"][cpu], ns["_attention_gpus"][cpu] = 132, device_name
    before = dict(ns)
    exec(compile(ENTRY_BEFORE, "launch_overhead.py:ENTRY_BEFORE", "exec"), before)
    kernellab.tensor_map = standin_tensor_map()
    attention = ns["attention"]

    @real_op(f"{tag}::attention_step", "(Tensor q, Tensor k, Tensor v, bool causal, str kernel) -> Tensor",
             outputs=lambda q, k, v, causal, kernel: q, device_types=("cuda", "cpu"))
    def step_op(q, k, v, causal, kernel):
        return attention(q, k, v, causal=causal, kernel=kernel)

    @real_op(f"{tag}::attention_before", "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor",
             outputs=lambda q, k, v, causal: q, device_types=("cuda", "cpu"))
    def op_before(q, k, v, causal):                      # kl::attention as it was: the old entry point
        return before["attention"](q, k, v, causal=causal)

    def restore():
        kernellab.tensor_map = real_map
    return types.SimpleNamespace(ns=ns, attention=attention, op=ns["kl_attention"], step_op=step_op,
                                 before=before["attention"], op_before=op_before, restore=restore)


def entry_named_cases(s, shape) -> tuple[str, list]:
    """(the plan's kernel, [(case, fn)]) for one shape of the --entry table: the entry point and its op against the
    step it picks, called directly (its launch configured once: what any launcher of that step pays a call) and as
    the grid times it (the step op), and the entry point before its ready per-shape calls."""
    import torch

    B, H, N, d, causal = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.bfloat16) for _ in range(3))
    ns, attention, before = s.ns, s.attention, s.before
    plan = ns["attention_plan"](q, causal)
    kern = ns["ATTENTION_KERNELS"][plan.entry]
    grid = (plan.ctas,) if plan.persistent else (math.ceil(N / plan.block_m), B * H)
    launch = kern[grid, plan.threads, plan.shared_bytes]
    counter = torch.zeros(1, dtype=torch.int32)
    tensor_map = kernellab.tensor_map

    if plan.family == "fa2":
        def step():                                      # step 2: pointers
            out = torch.empty_like(q)
            launch(q, k, v, out, None, N, d ** -0.5)
            return out
    else:
        sections = max(1, min(B * H, (16 << 20) // (2 * N * d * q.element_size())))
        scalars = (N, B * H, sections, counter, d ** -0.5) if plan.persistent else (N, d ** -0.5)
        rows_q, rows_kv = plan.block_m, plan.block_n

        def step():                                      # steps 3 and 3b: three tensor maps
            out = torch.empty_like(q)
            launch(tensor_map(q.view(B * H, N, d), (1, rows_q, 64)), tensor_map(k.view(B * H, N, d), (1, rows_kv, 64)),
                   tensor_map(v.view(B * H, N, d), (1, rows_kv, 64)), out, *scalars)
            return out
    name = plan.kernel
    cases = [
        ("the step's own call (its launch configured once)", inside_op(step)),
        ("attention(q, k, v, causal=causal)", inside_op(lambda: attention(q, k, v, causal=causal))),
        ("attention, before (ENTRY_BEFORE)", inside_op(lambda: before(q, k, v, causal=causal))),
        ("attention(..., kernel=its step)", inside_op(lambda: attention(q, k, v, causal=causal, kernel=name))),
        ("kl::attention op", lambda: s.op(q, k, v, causal)),
        ("kl::attention op, before", lambda: s.op_before(q, k, v, causal)),
        ("the grid's step op (kernel=its step)", lambda: s.step_op(q, k, v, causal, name)),
    ]
    for _, fn in cases:                                  # past the ops' first checked calls (kernellab.ops)
        for _ in range(12):
            fn()
    return name, cases


def entry_cpu_cases(calls: int, rounds: int, shapes=ENTRY_SHAPES) -> list[tuple[tuple, str, list]]:
    """Per shape (shape, the plan's kernel, [(case, CPU µs per round)]): every case of every shape interleaved round
    by round (interleaved_us), one intra-op thread; the median of the rounds is the table's figure."""
    import torch

    s = entry_setup()
    try:
        named = [(shape, *entry_named_cases(s, shape)) for shape in shapes]
        flat = [fn for _, _, cases in named for _, fn in cases]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _, cpu = interleaved_us(flat, calls, rounds)
        finally:
            torch.set_num_threads(threads)
    finally:
        s.restore()
    out, i = [], 0
    for shape, kernel, cases in named:
        out.append((shape, kernel, [(name, cpu[i + j]) for j, (name, _) in enumerate(cases)]))
        i += len(cases)
    return out


def entry_table(results, title: str) -> str:
    """The --entry table: per shape the CPU µs a call (median round) of each case, the entry point's ratio to the
    step's own call and its op's to the grid's step op, each beside the old entry point's (in brackets)."""
    names = [name for name, _ in results[0][2]]
    lines = [title, "", "| B*H, N, d, mask | plan | " + " | ".join(names) + " | entry / step (before) | "
             "op / the grid's step op (before) |", "|---" * (len(names) + 4) + "|"]
    for (B, H, N, d, causal), kernel, cases in results:
        med = {name: statistics.median(us) for name, us in cases}
        step, entry, before, _, op, op_before, step_op = (med[n] for n in names)
        lines.append(f"| {B * H}, {N}, {d}, {'causal' if causal else 'full'} | {kernel} | "
                     + " | ".join(f"{med[n]:.2f}" for n in names)
                     + f" | {entry / step:.2f}x ({before / step:.2f}x) "
                       f"| {op / step_op:.2f}x ({op_before / step_op:.2f}x) |")
    return "\n".join(lines)


def attention_cpu_cases(calls: int, rounds: int, cold_calls: int = 0,
                        flush_bytes: int = 64 << 20) -> list[tuple[str, list[float], list[float], float | None]]:
    """Tutorial 08's attention op forward + backward and its stages on the CPU (attention_named_cases), warm (each
    case's calls in a row, rounds taken in turn) and, where cold_calls, with cold caches (`flush_bytes` of host memory
    written before each call, as torch's own host code runs between a step's launches; the median call):
    (case, wall µs per round, CPU µs per round, cold µs or None)."""
    import numpy as np
    import torch

    s = attention_op_setup()
    try:
        named = attention_named_cases(s)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            wall, cpu = interleaved_us([f for _, f in named], calls, rounds)
            for j, (name, _) in enumerate(named):
                if name.startswith("  per layer of 12"):
                    wall[j], cpu[j] = [w / 12 for w in wall[j]], [c / 12 for c in cpu[j]]
            cold = [None] * len(named)
            if cold_calls:
                flush = np.zeros(flush_bytes // 8)
                for j, (_, fn) in enumerate(named):
                    cold[j] = cold_call_us(fn, cold_calls, flush) / (12 if named[j][0].startswith("  per layer of 12")
                                                                      else 1)
        finally:
            torch.set_num_threads(threads)
    finally:
        s.restore()
    return [(name, w, c, cd) for (name, _), w, c, cd in zip(named, wall, cpu, cold)]


def attention_table(cases, title: str) -> str:
    """The --attention table: CPU µs a call (median round, best), cold µs a call, share of the op's fwd + bwd."""
    lines = [title, "", "| stage | CPU µs per call, median | best | cold caches, µs (median call) | share of fwd + bwd |",
             "|---|---|---|---|---|"]
    whole = statistics.median(cases[0][2])
    for name, wall, cpu, cold in cases:
        med = statistics.median(cpu)
        lines.append(f"| {name} | {med:.2f} | {min(cpu):.2f} | {'-' if cold is None else f'{cold:.1f}'} "
                     f"| {med / whole:.2f} |")
    return "\n".join(lines)


def context_table(cases, title: str) -> str:
    """The --context table: µs a call of the op's forward + backward and of its launcher alone, each case's ratio to
    the first row's, the GC's collections, and F.layer_norm's forward + backward in the same case (the baseline: the
    op's ratio to it is the target's, <= 1.3x with cold caches)."""
    lines = [title, "", "| case | fwd + bwd µs a call | vs as set up | forward launcher µs | vs as set up | "
             "GC collections per 1000 calls | F.layer_norm fwd + bwd µs | kl::layernorm / F.layer_norm |",
             "|---|---|---|---|---|---|---|---|"]
    base_both, base_launcher = cases[0][1], cases[0][2]
    for name, both, alone, collections, theirs in cases:
        lines.append(f"| {name} | {both:.1f} | {both / base_both:.2f}x | {alone:.1f} | {alone / base_launcher:.2f}x "
                     f"| {collections:.2f} | {theirs:.1f} | {both / theirs:.2f}x |")
    return "\n".join(lines)


def cpu_profile(calls: int, top: int = 14) -> str:
    """cProfile of `calls` calls of the one-kernel op (cpu_op_setup): where its Python time goes, by function."""
    import cProfile
    import io
    import pstats

    s = cpu_op_setup()
    axpb, x = s.axpb, s.x
    for _ in range(100):
        axpb(x)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        axpb(x)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def _attention_op(name: str):
    """Tutorial 07's final kernel (the persistent family, step 3b) registered as an op, or None where it cannot load."""
    import sys

    import torch

    root = __import__("pathlib").Path(__file__).resolve().parent
    sys.path.insert(0, str(root))
    import attention as A                                    # benchmarks/attention.py: the notebook's kernels

    families, configs = A.load_families(None, None)
    fam = next((f for f, ks in families.items() if any(p.name == "work_counter" for p in next(iter(ks.values())).params)),
               list(families)[-1])
    att = A.launcher(families[fam], configs[fam])

    @kernellab.op(name, "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor", outputs=lambda q, k, v, causal: q)
    def attention(q, k, v, causal):
        return att(q, k, v, torch.empty_like(q), causal)
    return fam, attention


def ops_cases(launches: int, rounds: int) -> list[tuple[str, list[float], str]]:
    """Host time per call of registered ops (kernellab.op): a one-kernel op against the bare launch and torch's own
    ops, the same launcher as torch.library.custom_op, and tutorial 07's attention as an op against an SDPA call of
    the same (small, host-bound) shape; then CUDA-graph replay of captured calls, per call, op against bare kernel."""
    import torch
    import torch.nn.functional as F

    k = kernellab.compile_cuda(SRC).axpb
    x, y = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    launch = k[1, 32]

    @kernellab.op("klbench::axpb", "(Tensor x) -> Tensor", outputs=lambda x: x)
    def axpb(x):
        out = torch.empty_like(x)
        launch(x, out, 2.0, 1.0, x.numel())
        return out

    @torch.library.custom_op("klbench::axpb_custom_op", mutates_args=())
    def axpb_custom(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        launch(x, out, 2.0, 1.0, x.numel(), sync=False)
        return out

    axpb_custom.register_fake(lambda x: torch.empty_like(x))
    torch.testing.assert_close(axpb(x), 2 * x + 1)
    torch.testing.assert_close(axpb_custom(x), 2 * x + 1)
    overload = axpb.overload

    def loop(f):
        def run(m):
            for _ in range(m):
                f()
        return run

    sync = torch.cuda.synchronize
    one = "kernellab.op, one kernel: axpb(x)"
    cases = [
        (one, per_launch_us(loop(lambda: axpb(x)), launches, rounds, sync), one),
        ("the same op through torch.ops (OpOverload)", per_launch_us(loop(lambda: overload(x)), launches, rounds, sync),
         one),
        ("bare launch k[1, 32](x, y, ...), sync=False, no allocation",
         per_launch_us(loop(lambda: launch(x, y, 2.0, 1.0, N, sync=False)), launches, rounds, sync), one),
        ("torch.library.custom_op, same launcher", per_launch_us(loop(lambda: axpb_custom(x)), launches, rounds, sync),
         one),
        ("torch x.mul(2.0) (one aten op, allocates)", per_launch_us(loop(lambda: x.mul(2.0)), launches, rounds, sync),
         one),
    ]
    try:
        fam, attention = _attention_op("klbench::attention")
    except Exception as exc:                                 # no sm_90 here, or the notebook's kernels do not load
        print(f"attention op skipped: {type(exc).__name__}: {str(exc)[:200]}")
    else:
        q, kk, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        torch.testing.assert_close(attention(q, kk, v, False), F.scaled_dot_product_attention(q, kk, v), atol=2e-2,
                                   rtol=2e-2)
        sd = "SDPA, [1, 2, 128, 64] bf16"
        cases += [(sd, per_launch_us(loop(lambda: F.scaled_dot_product_attention(q, kk, v)), launches // 4, rounds,
                                     sync), sd),
                  (f"kernellab.op attention ({fam}), same shape",
                   per_launch_us(loop(lambda: attention(q, kk, v, False)), launches // 4, rounds, sync), sd)]
    cases += graph_cases(launch, axpb, x, y, rounds)
    return cases


def graph_cases(launch, op, x, y, rounds: int, calls: int = 200) -> list[tuple[str, list[float], str]]:
    """µs of GPU time per call when a CUDA graph of `calls` captured calls is replayed: the op against the bare
    kernel (CUDA events around each replay). Each captured op call writes a new output (the graph's own memory), so
    the bare kernel writes to `calls` buffers in turn as well: the same kernels on the same memory traffic."""
    import torch

    outs = [torch.empty_like(y) for _ in range(calls)]
    turn = iter(range(1 << 30))

    def graph_of(f):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            f()
            with torch.cuda.graph(g, stream=stream):
                for _ in range(calls):
                    f()
        torch.cuda.current_stream().wait_stream(stream)
        return g

    def per_call(g):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        out = []
        for _ in range(rounds):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / calls)
        return out

    bare = "CUDA graph replay, bare kernel"
    return [(bare, per_call(graph_of(lambda: launch(x, outs[next(turn) % calls], 2.0, 1.0, N))), bare),
            ("CUDA graph replay, kernellab.op", per_call(graph_of(lambda: op(x))), bare)]


def table(cases, title: str) -> str:
    medians = {name: spread(us)[0] for name, us, _ in cases}
    lines = [f"{title}", "", "| case | µs per launch | 10-90 % | ratio to baseline | baseline |",
             "|---|---|---|---|---|"]
    for name, us, base in cases:
        med, p10, p90 = spread(us)
        lines.append(f"| {name} | {med:.2f} | {p10:.2f}-{p90:.2f} | {med / medians[base]:.2f}x | {base} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=None, help="launches per timed loop (default 2000; --cpu: "
                    "100000)")
    ap.add_argument("--rounds", type=int, default=None, help="timed loops per case (default 15; --cpu: 20, "
                    "taking turns with the other cases)")
    ap.add_argument("--python-only", action="store_true", help="no GPU: time the host path with a stand-in driver")
    ap.add_argument("--breakdown", action="store_true", help="GPU: time each stage of the launch path alone")
    ap.add_argument("--ops", action="store_true", help="GPU: registered ops (kernellab.op) against SDPA, custom_op "
                    "and CUDA-graph replay of the bare kernel")
    ap.add_argument("--cpu", action="store_true", help="no GPU: a registered op's host path stage by stage, with a "
                    "stand-in driver (add --profile for cProfile's view of it)")
    ap.add_argument("--profile", action="store_true", help="with --cpu: also print cProfile of the op's calls")
    ap.add_argument("--no-norm", action="store_true", help="with --cpu: leave out tutorial 04's LayerNorm op (its "
                    "kernels compile for sm_90 on a first run: about 20 s)")
    ap.add_argument("--context", action="store_true", help="no GPU: tutorial 04's LayerNorm op (stand-in driver) "
                    "with a large heap of live objects, gc.freeze(), the GC off, and cold CPU caches")
    ap.add_argument("--cold", action="store_true", help="no GPU: tutorial 04's LayerNorm op forward + backward "
                    "against F.layer_norm's, stage by stage, warm and with cold CPU caches, with the Python and C "
                    "calls of each stage")
    ap.add_argument("--attention", action="store_true", help="no GPU: tutorial 08's attention op (forward + backward, "
                    "as a training step calls it) stage by stage, warm and with cold caches, stand-in driver and "
                    "tensor maps")
    ap.add_argument("--entry", action="store_true", help="no GPU: tutorial 07's attention entry point and its "
                    "kl::attention op against the step each picks, called directly, per call at small grid shapes "
                    "(stand-in driver and tensor maps)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    big = args.cpu
    args.launches = args.launches or (100_000 if big else 20_000 if args.attention else 4000 if args.entry else 2000)
    args.rounds = args.rounds or (20 if big else 15)
    if args.entry:
        import platform

        import torch

        text = entry_table(
            entry_cpu_cases(args.launches, args.rounds),
            f"tutorial 07's attention entry point on the CPU ({platform.processor() or platform.machine()}, torch "
            f"{torch.__version__}), bf16, planned as on an {ENTRY_DEVICE} (132 SMs): this thread's CPU µs a call, "
            f"median of {args.rounds} rounds of {args.launches // args.rounds} calls a case, every case of every shape "
            f"taken in turn; stand-in launches (a C call), tensor maps stood in (a cache hit in Python); launches as "
            f"inside an op (no wait)")
    elif args.attention:
        import platform

        import torch

        calls = args.launches
        cold = max(calls // 100, 20)
        text = attention_table(
            attention_cpu_cases(calls, args.rounds, cold),
            f"tutorial 08's kl_flash_attention forward + backward on the CPU ({platform.processor() or platform.machine()}"
            f", torch {torch.__version__}), [B, H, N, d] = {list(ATTENTION_SHAPE)} bf16, causal, as a training step "
            f"calls it: stand-in launches (a C call), tensor maps stood in (a cache hit in Python), the backward taking "
            f"step 3 as on an H100; {calls} calls a case in {args.rounds} rounds taken in turn, {cold} calls with cold "
            f"caches (64 MiB written before each); indented rows are parts of the row above, timed alone")
    elif args.cold:
        import platform

        import torch

        calls, cold = args.launches, max(args.launches // 20, 50)
        text = cold_table(norm_cold_cases(calls, args.rounds, cold),
                          f"tutorial 04's kl::layernorm forward + backward with cold CPU caches, stage by stage, against "
                          f"F.layer_norm's: {NORM_SHAPE[0]} x {NORM_SHAPE[1]} float32, stand-in launches, on the CPU "
                          f"({platform.processor() or platform.machine()}, torch {torch.__version__}); warm: this "
                          f"thread's CPU µs, {calls} calls a case in {args.rounds} rounds taken in turn; cold: the "
                          f"median of {cold} calls, each after a 64 MiB host write, the cases in turn; calls: "
                          f"sys.setprofile's events (indented rows are parts of the row above, timed alone)")
    elif args.context:
        import platform

        calls = args.launches
        text = context_table(context_cases(calls, args.rounds),
                             f"a training step's context on the host path of tutorial 04's kl::layernorm, "
                             f"{NORM_SHAPE[0]} x {NORM_SHAPE[1]} float32, stand-in launches, on the CPU "
                             f"({platform.processor() or platform.machine()}; {calls} calls a round, {calls // 20} "
                             f"with cold caches, median of {args.rounds} rounds)")
    elif args.cpu:
        import platform

        import torch

        text = cpu_table(cpu_cases(args.launches, args.rounds),
                     f"host path of a registered op on the CPU ({platform.processor() or platform.machine()}, torch "
                     f"{torch.__version__}, stand-in driver; {args.launches} calls a case in {args.rounds} rounds "
                     f"taken in turn; indented rows are parts of the row above, timed alone)")
        if args.profile:
            text += "\n\ncProfile of the op's calls (tottime: in the function itself):\n\n" + cpu_profile(
                min(args.launches, 20_000))
        if not args.no_norm:
            calls = max(args.launches // 10, args.rounds)
            text += "\n\n" + norm_table(
                norm_cpu_cases(calls, args.rounds),
                f"tutorial 04's kl::layernorm (forward, backward) on the CPU, {NORM_SHAPE[0]} x {NORM_SHAPE[1]} float32, "
                f"stand-in launches, against F.layer_norm doing the same on CPU tensors ({calls} calls a case in "
                f"{args.rounds} rounds taken in turn; target: forward + backward within 1.3x of F.layer_norm's)")
    elif args.python_only:
        text = table(python_only_cases(args.launches, args.rounds),
                     "kernellab's host path, stand-in driver (no GPU)")
    elif args.ops:
        import torch

        text = table(ops_cases(args.launches, args.rounds),
                     f"host time per call of registered ops on {torch.cuda.get_device_name()} (targets: one-kernel op "
                     f"<= 15 µs; attention op <= 1.25x SDPA; graph replay of the op = the bare kernel)")
    elif args.breakdown:
        import torch

        text = table(breakdown_cases(args.launches, args.rounds),
                     f"where a launch's host time goes on {torch.cuda.get_device_name()}")
    else:
        import torch

        text = table(gpu_cases(args.launches, args.rounds),
                     f"launch overhead on {torch.cuda.get_device_name()} (one 32-thread block, {args.launches} "
                     f"launches x {args.rounds} rounds)")
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
