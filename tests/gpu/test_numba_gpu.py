"""Numba kernels on a real GPU: launches on torch CUDA tensors, CuPy arrays and Numba device arrays (zero copy),
argument errors, streams, the simulator beside real launches, and resources against the driver's own figures.

On the GPU machine numba-cuda needs NumPy < 2.5: tools/gpu/run.py installs the carried wheels (tools/gpu/wheels.sh)
ahead of the machine's NumPy."""
import numpy as np
import pytest

import kernellab

pytestmark = pytest.mark.gpu

SOURCE = """from numba import cuda, float32

@cuda.jit
def vadd(a, b, c, n):
    i = cuda.grid(1)                         # one thread per element
    if i < n:
        c[i] = a[i] + b[i]

@cuda.jit
def transpose(a, out):
    tile = cuda.shared.array((32, 33), float32)   # padded: no bank conflicts on the column read
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockIdx.x * 32, cuda.blockIdx.y * 32
    if by + y < a.shape[0] and bx + x < a.shape[1]:
        tile[y, x] = a[by + y, bx + x]
    cuda.syncthreads()
    if bx + y < out.shape[0] and by + x < out.shape[1]:
        out[bx + y, by + x] = tile[x, y]

@cuda.jit
def block_sum(x, out):
    buf = cuda.shared.array(0, float32)      # dynamic shared memory, sized by the launch
    t = cuda.threadIdx.x
    buf[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    if t == 0:
        s = 0.0
        for j in range(cuda.blockDim.x):
            s += buf[j]
        out[cuda.blockIdx.x] = s
"""
VADD_SIG = "float32[::1], float32[::1], float32[::1], int32"


def test_numba_cuda_imports_with_the_carried_numpy():
    import numba.cuda

    assert tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 5), (
        f"NumPy {np.__version__}: numba-cuda needs < 2.5; carry the wheels from tools/gpu/wheels.sh")
    assert numba.cuda.is_available()


@pytest.fixture(scope="module")
def mod():
    from kernellab.kernel_numba import numba_module

    return numba_module(SOURCE, signatures={"vadd": VADD_SIG})


def test_cell_defaults_to_the_gpu(mod):
    import torch

    major, minor = torch.cuda.get_device_capability()
    assert mod.arch == f"sm_{major}{minor}" and not mod.simulate
    assert "runs on the GPU" in str(mod)
    assert isinstance(mod.vadd, kernellab.Kernel) and not mod.vadd.simulate


def test_vadd_on_torch_with_odd_size(mod):
    import torch

    n = 1000
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full((n,), float("nan"), device="cuda")
    mod.vadd[(n + 255) // 256, 256](a, b, c, n)
    torch.testing.assert_close(c, a + b)


def test_torch_tensors_are_passed_zero_copy(mod):
    import torch
    from numba.cuda.cudadrv.devicearray import auto_device

    big = torch.zeros(1024 + 16, device="cuda")
    view = big[16:]                             # contiguous, at an offset into the same allocation
    dev, copied = auto_device(view)             # what numba-cuda's launcher does with each array argument
    assert not copied and dev.__cuda_array_interface__["data"][0] == view.data_ptr()
    ones = torch.ones(1024, device="cuda")
    mod.vadd[4, 256](ones, ones, view, 1024)    # written in place through the view
    assert (big[:16] == 0).all() and (big[16:] == 2).all()


def test_cupy_arrays_are_passed_zero_copy(mod):
    import cupy
    from numba.cuda.cudadrv.devicearray import auto_device

    n = 777
    a, b = cupy.arange(n, dtype=cupy.float32), cupy.ones(n, dtype=cupy.float32)
    c = cupy.zeros(n, dtype=cupy.float32)
    dev, copied = auto_device(c)
    assert not copied and dev.__cuda_array_interface__["data"][0] == c.data.ptr
    mod.vadd[(n + 127) // 128, 128](a, b, c, n)
    cupy.testing.assert_array_equal(c, a + 1)


def test_numba_device_arrays(mod):
    from numba import cuda

    a = cuda.to_device(np.arange(64, dtype=np.float32))
    c = cuda.device_array(64, np.float32)
    mod.vadd[1, 64](a, a, c, 64)
    np.testing.assert_array_equal(c.copy_to_host(), 2 * np.arange(64, dtype=np.float32))


def test_signature_from_the_first_launch_and_resources_match_the_driver(mod):
    import torch

    k = mod.transpose
    assert k.pending
    a = torch.randn(100, 70, device="cuda")
    out = torch.empty(70, 100, device="cuda")
    k[(3, 4), (32, 32)](a, out)
    torch.testing.assert_close(out, a.T)
    assert k.numba_signature == "float32[:, ::1], float32[:, ::1]"
    compiled = k.dispatcher.overloads[k.compiled.argtypes]   # numba-cuda's own build for this GPU
    ours = k.resources
    print(f"transpose: ptxas {ours.registers} regs / {ours.shared_bytes} B smem / {ours.local_bytes} B local; "
          f"driver {compiled.regs_per_thread} regs / {compiled.shared_mem_per_block} B / "
          f"{compiled.local_mem_per_thread} B")
    assert ours.shared_bytes == 32 * 33 * 4
    assert compiled.shared_mem_per_block in (ours.shared_bytes, ours.shared_bytes + 1024)
    assert abs(compiled.regs_per_thread - ours.registers) <= 8   # numba links with nvJitLink (LTO) for the GPU
    assert compiled.local_mem_per_thread == ours.local_bytes


def test_dynamic_shared_memory(mod):
    import torch

    x = torch.arange(4 * 128, dtype=torch.float32, device="cuda")
    out = torch.zeros(4, device="cuda")
    mod.block_sum[4, 128, 128 * 4](x, out)
    torch.testing.assert_close(out, x.view(4, 128).sum(1))


def test_launch_on_a_torch_stream_without_sync(mod):
    import torch

    n = 1 << 20
    a = torch.ones(n, device="cuda")
    c = torch.zeros(n, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        mod.vadd[n // 256, 256](a, a, c, n, sync=False)   # torch's current stream: s
    s.synchronize()
    assert (c == 2).all()
    mod.vadd[n // 256, 256](a, c, c, n, stream=s)
    assert (c == 3).all()


def test_check_against_torch(mod):
    import torch

    def candidate(a, b):
        c = torch.empty_like(a)
        mod.vadd[(a.numel() + 255) // 256, 256](a, b, c, a.numel())
        return c

    report = kernellab.check(candidate, lambda a, b: a + b,
                             lambda g: (torch.randn(3001, generator=g, device="cuda"),
                                        torch.randn(3001, generator=g, device="cuda")), generator_device="cuda")
    assert report.passed, report


@pytest.mark.parametrize("make, match", [
    (lambda t, cp: (np.zeros(8, np.float32),) * 3 + (8,), r"argument 0 \('a', float32\[::1\]\).*runs on the GPU"),
    (lambda t, cp: (t.zeros(8),) * 3 + (8,), r"argument 0 \('a'.*device cpu.*runs on the GPU"),
    (lambda t, cp: (t.zeros(8, device="cuda", dtype=t.float64),) + (t.zeros(8, device="cuda"),) * 2 + (8,),
     r"argument 0 \('a', float32\[::1\]\) expects float32 elements but got a torch tensor \(dtype float64"),
    (lambda t, cp: (cp.zeros(8, dtype=cp.float32),) * 2 + (cp.zeros(16, dtype=cp.float32)[::2], 8),
     r"argument 2 \('c', float32\[::1\]\) needs a C-contiguous array"),
    (lambda t, cp: (t.zeros(8, device="cuda"),) * 3 + (2**31,), r"argument 3 \('n', int32\) is int32"),
])
def test_argument_errors_name_the_argument(mod, make, match):
    import cupy
    import torch

    with pytest.raises(kernellab.ArgumentError, match=match):
        mod.vadd[1, 8](*make(torch, cupy))


def test_simulator_beside_real_launches():
    import torch
    from kernellab.kernel_numba import numba_module
    from kernellab.run.sim.numba_sim import SimulatorNotice

    sim = numba_module(SOURCE, signatures={"vadd": VADD_SIG}, simulate=True, name="sim")
    real = numba_module(SOURCE, signatures={"vadd": VADD_SIG})
    a = torch.arange(64, dtype=torch.float32, device="cuda")
    c_sim, c_real = torch.zeros_like(a), torch.zeros_like(a)
    with pytest.warns(SimulatorNotice):
        sim.vadd[2, 32](a, a, c_sim, 64)          # CUDA tensors are copied to the host and back
    real.vadd[2, 32](a, a, c_real, 64)
    assert torch.equal(c_sim, c_real) and torch.equal(c_real, 2 * a)
    assert "runs in the simulator" in str(sim) and "runs on the GPU" in str(real)


def test_magic_on_the_gpu():
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    result = ip.run_cell(f"%%numba --signature 'vadd: {VADD_SIG}'\n" + SOURCE)
    assert result.success, result.error_in_exec
    assert not ip.user_ns["vadd"].simulate      # the cell's other kernels wait for a signature: its card is a display
    ip.user_ns.update(a=torch.ones(100, device="cuda"), c=torch.zeros(100, device="cuda"))
    result = ip.run_cell("vadd[1, 128](a, a, c, 100)\nc.sum().item()")
    assert result.success and result.result == 200


# --- Numba kernels in another process: the warm worker, compute-sanitizer, Nsight Compute -----------------------------

FAULTS = """from numba import cuda

@cuda.jit
def oob_write(x, n):
    i = cuda.grid(1)
    x[i + n] = 1.0                           # n past the end
"""


def _line(source: str, fragment: str, first_line: int = 1) -> int:
    return next(k for k, text in enumerate(source.splitlines(), start=first_line) if fragment in text)


@pytest.fixture(scope="module")
def faults():
    from kernellab.kernel_numba import numba_module

    return numba_module(FAULTS, signatures={"oob_write": "float32[::1], int64"}, first_line=2)


def _save(name: str, text: str) -> None:
    import os

    out = os.environ.get("KERNELLAB_ARTIFACTS")
    if out:
        with open(os.path.join(out, name), "w") as fh:
            fh.write(text)


def test_isolated_numba_launches_copy_results_back(mod):
    import torch

    n = 1000
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full((n,), float("nan"), device="cuda")
    run = mod.vadd[(n + 255) // 256, 256](a, b, c, n, isolate=True)
    assert run is not None and run.pid != __import__("os").getpid()
    torch.testing.assert_close(c, a + b)
    x = torch.randn(45, 70, device="cuda")                        # 2-D: shape and strides travel as Numba's struct
    out = torch.full((70, 45), float("nan"), device="cuda")
    mod.transpose[(3, 2), (32, 32)](x, out, isolate=True)
    torch.testing.assert_close(out, x.t())
    kernellab.set_isolation(True)                                # the notebook-wide setting applies to Numba too
    try:
        c.fill_(float("nan"))
        assert mod.vadd[(n + 255) // 256, 256](a, b, c, n) is not None
    finally:
        kernellab.set_isolation(False)
    torch.testing.assert_close(c, a + b)


def test_isolated_numba_fault_leaves_this_process_working_and_names_the_line(faults):
    import torch

    from kernellab.run.launch.worker import IsolatedLaunchError

    keep = torch.arange(10.0, device="cuda")
    x = torch.zeros(1024, device="cuda")
    with pytest.raises(IsolatedLaunchError) as info:
        faults.oob_write.run_isolated(4, 256, x, 1 << 28, timeout_s=60)
    err = info.value
    _save("numba_isolated_fault.txt", str(err))
    assert err.status == "fault" and "session is unaffected" in str(err), str(err)
    assert "Exception ignored" not in str(err), str(err)        # CuPy's destructor noise from the dead context
    line = _line(FAULTS, "x[i + n] = 1.0", first_line=2)
    assert err.diagnosis is not None and err.diagnosis.findings, str(err)
    assert err.diagnosis.findings[0].where.cell_line == line, str(err)
    assert keep.sum().item() == 45.0                              # this process's context is fine


def test_numba_memcheck_names_the_cell_line(faults):
    import torch

    x = torch.zeros(1000, device="cuda")
    rep = faults.oob_write.sanitize(1, 32, x, 1000)                # one element past the end
    _save("numba_memcheck_oob.txt", rep.raw)
    assert not rep.ok and rep.findings, rep.raw[-3000:]
    f = rep.findings[0]
    assert f.kind == "invalid_write" and f.size_bytes == 4
    assert f.where.cell_line == _line(FAULTS, "x[i + n] = 1.0", first_line=2), rep.raw[-3000:]
    assert f.where.source_line.strip().startswith("x[i + n] = 1.0")
    assert x.sum().item() == 0


def test_numba_kernel_under_nsight_compute(mod):
    import torch

    n = 1 << 20
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    rep = mod.vadd.profile(n // 256, 256, a, b, c, n)
    _save("numba_ncu.csv", rep.raw)
    if rep.permission_denied:
        pytest.skip("GPU performance counters are not permitted here: " + str(rep))
    assert rep.ok and rep.duration_ms and rep.duration_ms > 0, rep.raw[-3000:]


FACTORY_SOURCE = """
TPB = 4

def shift_add(cuda):
    def call(out, a, size):
        shared = cuda.shared.array(TPB, numba.float32)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < size:
            shared[cuda.threadIdx.x] = a[i]
        cuda.syncthreads()
        if i < size:
            out[i] = shared[(cuda.threadIdx.x + 1) % TPB] + 10
    return call

import numba
"""


def test_a_kernel_factory_on_the_gpu_and_a_rebound_global():
    """The factory style (the function takes `cuda`) on a GPU, and a rebound global: the kernel is compiled again,
    so the GPU and the simulator agree on the new value."""
    import torch

    from kernellab.kernel_numba import GlobalsChanged, numba_module

    ns = {}
    k = numba_module(FACTORY_SOURCE, namespace=ns).shift_add
    assert not k.simulate and k.factory is not None

    def expect(a, tpb):
        return (a.view(-1, tpb)[:, [(j + 1) % tpb for j in range(tpb)]].reshape(-1) + 10)

    a = torch.arange(8, dtype=torch.float32, device="cuda")
    out = torch.zeros(8, device="cuda")
    k[2, 4](out, a, 8)
    torch.testing.assert_close(out, expect(a, 4))
    ns["TPB"] = 2
    with pytest.warns(GlobalsChanged, match="TPB"):
        k[4, 2](out, a, 8)
    torch.testing.assert_close(out, expect(a, 2))
    assert k.resources.shared_bytes == 2 * 4
    host = np.zeros(8, np.float32)
    k.simulate = True
    k[4, 2](host, a.cpu().numpy(), 8)
    np.testing.assert_array_equal(host, expect(a, 2).cpu().numpy())
