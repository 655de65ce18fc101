"""Why are large CUDA tensors copied to the isolated worker instead of lent through CUDA IPC? Run on the GPU machine.

Usage there (repo root): PYTHONPATH=$PWD python3 tools/gpu/diag_ipc.py [--out diag_ipc.txt]     (about a minute)

Prints, step by step, each with its result or its error:
 0. the setup: versions, allocator settings (PYTORCH_CUDA_ALLOC_CONF, expandable segments, backend), ptrace_scope,
    virtualization hints;
 a. three 64 MiB torch tensors: their address, the driver's allocation range (cuMemGetAddressRange), torch's
    segment (memory_snapshot), kernellab's verdict (`lend`: a handle, or why not); then CUDA IPC across two
    processes (the child *spawned*, never forked), three ways: torch's own IPC (a CUDA tensor through a
    torch.multiprocessing spawn queue), CuPy's cudaIpcGetMemHandle/cudaIpcOpenMemHandle on the torch tensor, and
    the same on a plain cudaMalloc (CuPy, no pool), which separates "no IPC on this machine" from "torch's memory";
 b. kernellab's worker path on those tensors: run.shared, run.staged, run.copied, run.notes, the session's IPC
    state, and whether C == A + B;
 c. one warm-worker round trip (median ms) with 4 KiB and with 3 x 64 MiB arguments, lent, staged (GPU copies
    through the worker's own buffers) and copied as bytes;
 d. where a new 64 MiB tensor lands after cuBLAS work, as in a pytest session after the bench tests:
    torch.cuda.empty_cache() does not free cuBLAS workspaces, so their segment stays and new tensors are carved
    from its free rest (kernellab does not lend them; it stages them), and the path an isolated launch on it takes.
"""
import argparse
import os
import platform
import statistics
import subprocess
import time
import traceback

MIB = 1 << 20
N_BIG = 16 * MIB                 # floats: 64 MiB
SRC = r"""extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""
_lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    _lines.append(text)


def step(label: str, fn, show=None):
    """Run one step; print 'label: result' or 'label: FAILED Type: message'; return the result (None on failure)."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:
        ms = (time.perf_counter() - t0) * 1e3
        say(f"  {label}: FAILED {type(exc).__name__}: {str(exc).strip()[:600]} ({ms:.0f} ms)")
        return None
    try:
        text = show(out) if show else (out if out is not None else "ok")
    except Exception:
        text = repr(out)[:300]
    say(f"  {label}: {text}")
    return out


def _handle_text(h: bytes) -> str:
    return f"ok, {len(h)} bytes ({h.hex()[:24]}...)"


# --- children (spawned: a fresh interpreter each) ----------------------------------------------------------------

def _torch_child(q_in, q_out):
    try:
        import torch

        t = q_in.get(timeout=60)                        # torch maps the parent's allocation (its CUDA IPC)
        first = float(t[0].item())
        t[1] = 42.0
        torch.cuda.synchronize()
        q_out.put(("ok", f"child opened it: {tuple(t.shape)} on {t.device}, t[0] = {first!r}; wrote t[1] = 42.0"))
        del t
    except Exception as exc:
        q_out.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))


def _cupy_child(handle_hex, nbytes, q_out):
    try:
        import cupy

        ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(handle_hex))
        steps = [f"cudaIpcOpenMemHandle -> 0x{ptr:x}"]
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
        x = cupy.ndarray((nbytes // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        steps.append(f"read x[0] = {float(x[0].get())!r}")
        x[1] = 42.0
        cupy.cuda.runtime.deviceSynchronize()
        steps.append("wrote x[1] = 42.0")
        del x, mem
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        steps.append("cudaIpcCloseMemHandle ok")
        q_out.put(("ok", "; ".join(steps)))
    except Exception as exc:
        q_out.put(("error", f"{type(exc).__name__}: {exc}"))


def _spawned(target, args, q_out, timeout_s=120):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=target, args=args)
    proc.start()
    try:
        status, text = q_out.get(timeout=timeout_s)
    except Exception as exc:
        status, text = "error", f"no answer from the child ({type(exc).__name__}); exit code {proc.exitcode}"
    proc.join(30)
    if proc.is_alive():
        proc.kill()
    return status, text


# --- the steps ---------------------------------------------------------------------------------------------------

def setup(torch, cupy):
    say("0. setup")
    say(f"  python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"cupy {cupy.__version__}, kernel {platform.release()}")
    step("cuda.bindings", lambda: __import__("cuda.bindings", fromlist=["x"]).__version__)
    step("device", lambda: f"{torch.cuda.get_device_name()} (driver {cupy.cuda.runtime.driverGetVersion()}, "
                           f"runtime {cupy.cuda.runtime.runtimeGetVersion()})")
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                "CUDA_VISIBLE_DEVICES", "CUPY_GPU_MEMORY_LIMIT"):
        say(f"  ${var} = {os.environ.get(var)!r}")
    step("torch allocator backend", lambda: torch.cuda.get_allocator_backend())
    step("torch allocator settings", lambda: {k: v for k, v in torch.cuda.memory._snapshot().get(
        "allocator_settings", {}).items()} or "(not reported)")
    step("/proc/sys/kernel/yama/ptrace_scope", lambda: open("/proc/sys/kernel/yama/ptrace_scope").read().strip())
    step("hypervisor flag in /proc/cpuinfo", lambda: "hypervisor" in open("/proc/cpuinfo").read())
    step("DMI product", lambda: open("/sys/class/dmi/id/product_name").read().strip())
    step("nvidia-smi", lambda: subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,virtualization_mode,compute_mode", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip())


def describe_tensor(name, t, torch):
    from kernellab.run.launch import job as J

    ptr = t.data_ptr()
    say(f"  {name}: {t.numel() * 4 / MIB:.0f} MiB at 0x{ptr:x}")

    def address_range():
        base, size = J._address_range(ptr)
        return f"base 0x{base:x}, size {size:,} bytes ({size / MIB:.2f} MiB), the tensor at offset {ptr - base:,}"

    step(f"{name} cuMemGetAddressRange", address_range)

    def segment():
        for seg in torch.cuda.memory_snapshot():
            if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                return (f"segment 0x{seg['address']:x}, {seg['total_size'] / MIB:.2f} MiB, {seg.get('segment_type')}, "
                        f"{len(seg.get('blocks', []))} block(s), allocated {seg.get('allocated_size', 0) / MIB:.2f} MiB")
        return "not in any torch segment"

    step(f"{name} torch segment", segment)
    lent = J.lend(t)
    say(f"  {name} kernellab lend(): " + (f"lent (64-byte handle, offset {lent[1]})" if not isinstance(lent, str)
                                          else f"copied: {lent}"))


def cross_process(torch, cupy, A):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    say("  -- torch's CUDA IPC (the tensor through a spawn-context queue)")
    before = float(A[1].item())
    shared = step("parent A.untyped_storage()._share_cuda_()", lambda: A.untyped_storage()._share_cuda_(),
                  show=lambda r: f"ok: device {r[0]}, handle {len(r[1])} bytes, storage {r[2]:,} bytes, "
                                 f"offset {r[3]:,}")
    if shared is not None:
        q_in, q_out = ctx.Queue(), ctx.Queue()
        q_in.put(A)
        status, text = _spawned(_torch_child, (q_in, q_out), q_out)
        torch.cuda.synchronize()
        say(f"  torch child: {status}: {text}")
        say(f"  parent sees A[1] = {float(A[1].item())!r} (was {before!r}; 42.0 if the child wrote)")
        A[1] = before

    say("  -- CuPy cudaIpcGetMemHandle / cudaIpcOpenMemHandle on the torch tensor")
    handle = step("parent cudaIpcGetMemHandle(A)", lambda: bytes(cupy.cuda.runtime.ipcGetMemHandle(A.data_ptr())),
                  show=_handle_text)
    if handle:
        q = ctx.Queue()
        status, text = _spawned(_cupy_child, (handle.hex(), A.numel() * 4, q), q)
        torch.cuda.synchronize()
        say(f"  cupy child: {status}: {text}")
        say(f"  parent sees A[1] = {float(A[1].item())!r} (expected 42.0 if the child wrote); A[0] = "
            f"{float(A[0].item())!r}")
        A[1] = before

    say("  -- the same on a plain cudaMalloc (CuPy, no memory pool): IPC on this machine, torch aside")
    ptr = step("cudaMalloc(64 MiB)", lambda: cupy.cuda.runtime.malloc(64 * MIB), show=lambda p: f"0x{p:x}")
    if ptr:
        x = cupy.ndarray((16 * MIB,), cupy.float32, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, 64 * MIB,
                                                                                                    None), 0))
        x[:2] = cupy.asarray([7.0, 0.0], dtype=cupy.float32)
        cupy.cuda.runtime.deviceSynchronize()
        h = step("parent cudaIpcGetMemHandle(cudaMalloc)", lambda: bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)),
                 show=_handle_text)
        if h:
            q = ctx.Queue()
            status, text = _spawned(_cupy_child, (h.hex(), 64 * MIB, q), q)
            say(f"  cupy child: {status}: {text} (expected x[0] = 7.0)")
            say(f"  parent sees x[1] = {float(x[1].get())!r} (expected 42.0)")
        del x
        cupy.cuda.runtime.free(ptr)


def worker_path(torch, vadd, A, B, C, W):
    say("b. kernellab's worker path (run_isolated, 3 x 64 MiB)")
    C.zero_()
    run = step("run_isolated", lambda: vadd.run_isolated((N_BIG + 255) // 256, 256, A, B, C, N_BIG),
               show=lambda r: "returned")
    if run is not None:
        say("  " + str(run).replace("\n", "\n  "))
        say(f"  run.shared = {run.shared}, run.staged = {run.staged}, run.copied = {run.copied}")
        for n in run.notes:
            say(f"  note: {n}")
        say(f"  C == A + B: {bool(torch.equal(C, A + B))}")
    say(f"  session IPC state (_ipc_state['broken']): {W._ipc_state['broken']!r}")


def timings(torch, cupy, vadd, A, B, C, W, reps_small: int, reps_big: int):
    say("c. one warm-worker round trip, median of a few (ms, wall clock around run_isolated)")
    n_small = 1024                                                      # 4 KiB per tensor
    rows = []

    def setting(**kw):
        W.settings = W.IsolationSettings(**kw)

    def median_ms(args, n, reps):
        grid = (n + 255) // 256
        try:
            last = vadd.run_isolated(grid, 256, *args)                # warm-up (worker already started)
            ms = []
            for _ in range(reps):
                t0 = time.perf_counter()
                last = vadd.run_isolated(grid, 256, *args)
                ms.append((time.perf_counter() - t0) * 1e3)
        except Exception as exc:
            return float("nan"), f"FAILED {type(exc).__name__}: {str(exc)[:300]}", ""
        how = "; ".join(f"{path} {','.join(names)}" for path, names in
                        (("shared", last.shared), ("staged", last.staged), ("copied", last.copied)) if names)
        why = next((n for n in last.notes if "copied, not" in n), "")
        return statistics.median(ms), how, why

    ta, tb, tc = (torch.randn(n_small, device="cuda") for _ in range(3))
    rows.append(("3 x 4 KiB torch", "default (staged)", *median_ms((ta, tb, tc, n_small), n_small, reps_small)))
    cupy.cuda.set_allocator(None)                                       # one exact cudaMalloc per array: lendable
    try:
        ca, cb, cc = (cupy.random.standard_normal(n_small, dtype=cupy.float32) for _ in range(3))
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    setting(stage_min_bytes=1 << 62)
    rows.append(("3 x 4 KiB torch", "stage_min_bytes = 2**62 (copy)", *median_ms((ta, tb, tc, n_small), n_small,
                                                                                reps_small)))
    setting(share_min_bytes=0)
    rows.append(("3 x 4 KiB cupy cudaMalloc", "share_min_bytes = 0", *median_ms((ca, cb, cc, n_small), n_small,
                                                                            reps_small)))
    setting()
    rows.append(("3 x 64 MiB torch", "default (lend)", *median_ms((A, B, C, N_BIG), N_BIG, reps_big)))
    setting(share_min_bytes=1 << 62)
    rows.append(("3 x 64 MiB torch", "share_min_bytes = 2**62 (stage)", *median_ms((A, B, C, N_BIG), N_BIG,
                                                                                   reps_big)))
    setting(share_min_bytes=1 << 62, stage_min_bytes=1 << 62)
    rows.append(("3 x 64 MiB torch", "both = 2**62 (copy)", *median_ms((A, B, C, N_BIG), N_BIG,
                                                                       max(1, reps_big // 2))))
    setting()
    say(f"  {'arguments':26} {'setting':34} {'median ms':>10}  how")
    for what, setting, ms, how, why in rows:
        say(f"  {what:26} {setting:34} {ms:10.2f}  {how}")
        if why:
            say(f"  {'':26} {'':34} {'':10}  ({why})")


def after_cublas(torch, W, vadd):
    say("d. after cuBLAS work: 1 GiB freed to the cache, a matmul (its workspace comes from the cache), "
        "empty_cache(), then a new 64 MiB tensor")
    torch.cuda.empty_cache()                      # only the 1 GiB block below is cached when the matmul runs
    buf = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    del buf
    x = torch.randn(2048, 2048, device="cuda")
    y = x @ x
    torch.cuda.synchronize()
    del x, y
    torch.cuda.empty_cache()
    step("segments kept after empty_cache", lambda: ", ".join(
        f"{s['total_size'] / MIB:.0f} MiB ({s['allocated_size'] / MIB:.0f} MiB in use)"
        for s in torch.cuda.memory_snapshot()))
    D = torch.randn(N_BIG, device="cuda")
    describe_tensor("D", D, torch)
    expect = D + D
    run = step("run_isolated(vadd, D, D, D)", lambda: vadd.run_isolated((N_BIG + 255) // 256, 256, D, D, D, N_BIG),
               show=lambda r: f"shared {r.shared}, staged {r.staged}, copied {r.copied}, {r.wall_ms:.2f} ms")
    if run is not None:
        say(f"  D == 2 D before: {bool(torch.equal(D, expect))}")
        for n in run.notes:
            say(f"  note: {n}")
    del D, expect


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--reps", type=int, default=20, help="round trips timed with 4 KiB arguments")
    ap.add_argument("--reps-big", type=int, default=4, help="round trips timed with 64 MiB arguments")
    a = ap.parse_args()
    t_start = time.perf_counter()
    import cupy
    import torch

    import kernellab
    from kernellab.run.launch import worker as W

    setup(torch, cupy)
    say("a. 64 MiB torch tensors and CUDA IPC across two processes (spawned)")
    torch.cuda.empty_cache()
    A, B = torch.randn(N_BIG, device="cuda"), torch.randn(N_BIG, device="cuda")
    C = torch.zeros_like(A)
    for name, t in (("A", A), ("B", B), ("C", C)):
        describe_tensor(name, t, torch)
    cross_process(torch, cupy, A)
    vadd = kernellab.compile_cuda(SRC).vadd
    worker_path(torch, vadd, A, B, C, W)
    timings(torch, cupy, vadd, A, B, C, W, a.reps, a.reps_big)
    del A, B, C
    step("d", lambda: after_cublas(torch, W, vadd), show=lambda r: "done")
    W.shutdown()
    say(f"done in {time.perf_counter() - t_start:.0f} s")
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("\n".join(_lines) + "\n")


if __name__ == "__main__":
    main()
