"""Isolated launches, compute-sanitizer and Nsight Compute on a real GPU, on small kernels with known faults.

Run on a GPU machine: tools/gpu/run.py tests-measure, or `pytest -m gpu tests/gpu/test_tools_gpu.py`. With $KERNELLAB_ARTIFACTS
set, every raw tool output is saved there (sanitize_*.txt, ncu_*.csv) to replace the hand-written fixtures in
tests/fixtures/, worker_ipc.txt records whether CUDA IPC was used (and why not), worker_staging.txt the staged
round trips of carved 64 MiB tensors, and worker_timings.txt the isolated-launch timings seen here.
"""
import contextlib
import os
import re
import time

import pytest

import kernellab
from kernellab.run.launch import worker as W
from kernellab.run.launch.worker import IsolatedLaunchError

from faulty_kernels import compile_faulty, line_of, save

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mod():
    return compile_faulty()


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


@pytest.fixture(autouse=True)
def _settings():
    yield
    vars(W.settings).update(vars(W.IsolationSettings()))     # in place: kernellab.kernel keeps this object


def ipc_probe(t) -> tuple[bool, str]:
    """Whether a spawned process can open `t`'s allocation through CUDA IPC (CuPy's calls, without kernellab)."""
    import subprocess
    import sys

    import cupy

    try:
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(t.data_ptr()))
    except Exception as exc:
        return False, f"cudaIpcGetMemHandle in this process: {type(exc).__name__}: {exc}"
    code = ("import sys, cupy\n"
            "p = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(sys.argv[1]))\n"
            "x = cupy.ndarray((1,), cupy.float32, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(p, 4, None), 0))\n"
            "print(repr(float(x.get()[0])))\n"
            "cupy.cuda.runtime.ipcCloseMemHandle(p)\n")
    proc = subprocess.run([sys.executable, "-c", code, handle.hex()], capture_output=True, text=True, timeout=120)
    out = (proc.stdout + proc.stderr).strip()
    try:
        ok = proc.returncode == 0 and float(proc.stdout.split()[-1]) == t[0].item()
    except (ValueError, IndexError):
        ok = False
    return ok, out[-800:]


def copied_with_a_reason(run) -> set:
    """The arguments a 'x, y copied, not shared: <why>' note names."""
    return {name for n in run.notes if " copied, not shared: " in n
            for name in n.split(" copied, not shared: ")[0].split(", ")}


@contextlib.contextmanager
def own_segments(torch):
    """Each torch allocation made inside gets its own cudaMalloc segment: a private memory pool, empty at first.

    torch.cuda.empty_cache() does not ensure that: a block that stays alive pins its whole segment, and new tensors
    are carved from the segment's free rest. cuBLAS/cuBLASLt workspaces are such blocks (empty_cache never frees
    them), so after any matmul in the session (the bench tests run before these) a 64 MiB tensor may start deep
    inside a 1 GiB segment, which kernellab does not lend (a kernel in the worker could reach the rest).
    """
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        pytest.skip(f"torch {torch.__version__} has no torch.cuda.MemPool/use_mem_pool to get fresh segments")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        yield pool


def test_isolated_launch_stages_small_and_shares_large_outputs(mod, torch):
    big = 16 * 2**20                                              # 64 MiB each: lent through CUDA IPC
    with own_segments(torch) as pool:                             # each its own allocation (see own_segments)
        A, B = torch.randn(big, device="cuda"), torch.randn(big, device="cuda")
        C = torch.zeros_like(A)
    works, probe = ipc_probe(A)
    n = 4096
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full_like(a, float("nan"))
    run = mod.vadd[(n + 255) // 256, 256](a, b, c, n, isolate=True)
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)
    assert run.pid != os.getpid()
    if works:                                                      # small CUDA tensors: GPU copies, no notes
        assert run.staged == ("a", "b", "c") and not run.copied and not run.shared and not run.notes, str(run)
    else:
        assert run.copied == ("a", "b", "c") and all("not staged" in n for n in run.notes), f"{run}\n{probe}"
    run2 = mod.vadd.run_isolated((big + 255) // 256, 256, A, B, C, big)
    torch.testing.assert_close(C, A + B, rtol=0, atol=0)          # shared or copied, the results are right
    assert run2.pid == run.pid and not run2.cold                   # the same warm worker
    save("worker_ipc.txt", f"{run}\n\n{run2}\n\nCUDA IPC probe (a spawned process opens A's handle): "
                           f"{'works' if works else 'fails'}\n{probe}\n")
    if works:
        assert set(run2.shared) == {"a", "b", "c"} and not copied_with_a_reason(run2), \
            f"CUDA IPC works here (a spawned process opened A), yet kernellab copied: {run2}"
    else:                                                          # no IPC here: copied, and the notes say why
        assert run2.copied == ("a", "b", "c") and copied_with_a_reason(run2) == {"a", "b", "c"}, f"{run2}\n{probe}"
    del A, B, C, pool


def test_tensors_inside_a_larger_allocation_are_staged_and_the_run_says_why(mod, torch):
    n = 4 * 2**20                                                  # 16 MiB per tensor
    with own_segments(torch) as pool:
        seg = torch.randn(3 * n, device="cuda")                    # one 48 MiB allocation
        c = torch.zeros(n, device="cuda")                          # its own 16 MiB allocation
    a, b = seg[:n], seg[n:2 * n]                                   # at its start; 16 MiB into it
    works, probe = ipc_probe(c)
    run = mod.vadd.run_isolated((n + 255) // 256, 256, a, b, c, n)
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)
    save("worker_ipc_views.txt", f"{run}\n" + "".join(f"  {k} not lent: {v}\n" for k, v in run.not_shared))
    if not works:
        assert run.copied == ("a", "b", "c") and copied_with_a_reason(run) == {"a", "b", "c"}, f"{run}\n{probe}"
        return
    assert run.staged == ("a", "b") and run.shared == ("c",) and not run.copied and not run.notes, str(run)
    why = dict(run.not_shared)
    assert why["a"] == ("its allocation is 48.0 MiB for 16.0 MiB of data (a caching allocator's segment shared "
                        "with other tensors); lending it would let the worker's kernel reach them"), str(why)
    assert why["b"].startswith("it starts 16.0 MiB into a 48.0 MiB allocation"), str(why)
    del seg, a, b, c, pool


def carved(torch, n: int, parts: int):
    """A segment of (parts + 2) * n floats in its own allocation, and `parts` views of n floats from its inside."""
    with own_segments(torch) as pool:
        seg = torch.randn((parts + 2) * n, device="cuda")
    return pool, seg, [seg[(k + 1) * n:(k + 2) * n] for k in range(parts)]


def test_carved_large_tensors_are_staged_exact_and_fast(mod, torch):
    n = 16 * 2**20                                                 # 64 MiB per tensor, like worker_overhead
    pool, seg, (a, b, c) = carved(torch, n, 3)
    edges = (seg[:n].clone(), seg[4 * n:].clone())
    ms, runs = [], []
    for k in range(6):
        a.add_(1.0)                                                # new inputs every launch
        t0 = time.perf_counter()
        runs.append(mod.vadd.run_isolated((n + 255) // 256, 256, a, b, c, n))
        ms.append((time.perf_counter() - t0) * 1e3)
        torch.testing.assert_close(c, a + b, rtol=0, atol=0, msg=lambda m: f"launch {k}: {m}")
    run = runs[-1]
    warm = sorted(ms[1:])[len(ms[1:]) // 2]
    save("worker_staging.txt", f"{run}\n\nround trips (ms, the first allocates the staging buffers): "
                               + ", ".join(f"{t:.2f}" for t in ms) + f"\nwarm median {warm:.2f} ms\n"
                               + "".join(f"  {k} not lent: {v}\n" for k, v in run.not_shared))
    if run.copied:
        pytest.skip(f"CUDA IPC is unavailable here, so carved tensors are copied as bytes: {run}")
    assert run.staged == ("a", "b", "c") and not run.notes, str(run)
    assert torch.equal(seg[:n], edges[0]) and torch.equal(seg[4 * n:], edges[1])   # the neighbours: untouched
    assert warm < 100, f"staged 3 x 64 MiB round trip {warm:.1f} ms (bytes through the pipe took ~2,000 ms): {ms}"
    del pool, seg, a, b, c


def test_fault_on_a_carved_tensor_leaves_the_callers_segment_intact(mod, torch):
    n = 4 * 2**20                                                  # 16 MiB: a whole number of 2 MiB pages
    pool, seg, (x,) = carved(torch, n, 1)
    before = seg.clone()
    ok = mod.scale2.run_isolated((n + 255) // 256, 256, x, n)
    if not ok.staged:
        pytest.skip(f"CUDA IPC is unavailable here, so nothing is staged: {ok}")
    before[n:2 * n] *= 2
    assert torch.equal(seg, before)
    workers = W.default_pool(torch.cuda.current_device())
    old = workers.worker
    assert old.staging and all(slot.ptr for slot in old.staging.values())
    # 1. one block past x's end: in-process this overwrites seg[2n:2n + 256]; here it hits the worker's memory
    try:
        small = mod.oob_write.run_isolated(1, 256, x, n, diagnose=False)
        outcome = f"finished: {small}"
    except IsolatedLaunchError as exc:
        outcome = f"faulted: {exc.status}"
    assert torch.equal(seg, before), f"the caller's segment changed ({outcome})"
    # 2. far out of bounds: a sticky fault in the worker
    old = workers.worker
    with pytest.raises(IsolatedLaunchError) as info:
        mod.oob_write.run_isolated(4, 256, x, 1 << 28, diagnose=False)
    assert info.value.status == "fault" and "session is unaffected" in str(info.value)
    assert old.staging == {} and not old.alive                     # its staging buffers were unmapped here
    assert torch.equal(seg, before) and (torch.ones(3, device="cuda") * 2).sum().item() == 6.0
    again = mod.scale2.run_isolated((n + 255) // 256, 256, x, n)
    before[n:2 * n] *= 2
    assert again.pid != ok.pid and again.staged == ("x",) and torch.equal(seg, before)
    save("worker_staging_fault.txt", f"one block out of bounds: {outcome}\nfar out of bounds: {info.value}\n"
                                     f"after: {again}\n")
    del pool, seg, x


def test_warm_worker_uses_each_launchs_own_inputs(mod, torch):
    """Copied inputs must land before the kernel runs, in a warm worker too (its memory holds the last job's data)."""
    c = torch.empty(4096, device="cuda")
    for k in range(8):
        a, b = torch.randn(4096, device="cuda"), torch.full((4096,), float(k), device="cuda")
        run = mod.vadd.run_isolated(16, 256, a, b, c, 4096)
        torch.testing.assert_close(c, a + b, rtol=0, atol=0, msg=lambda m: f"launch {k} in worker {run.pid}: {m}")
    assert not run.cold


def test_isolated_fault_leaves_this_process_working_and_names_the_line(mod, torch):
    x = torch.zeros(1024, device="cuda")
    keep = torch.arange(10.0, device="cuda")
    first = mod.vadd.run_isolated(1, 32, keep, keep, torch.empty_like(keep), 10)
    with pytest.raises(IsolatedLaunchError) as info:
        mod.oob_write.run_isolated(4, 256, x, 1 << 28, timeout_s=60)
    err = info.value
    save("isolated_fault.txt", str(err))
    assert err.status == "fault" and not err.sticky
    assert "Exception ignored" not in str(err), str(err)        # CuPy's destructor noise from the dead context
    # where the stray address lands decides the driver's word: an illegal address or an invalid address space
    assert re.search(r"(?i)illegal|InvalidAddressSpace", str(err)) and "session is unaffected" in str(err)
    assert err.diagnosis is not None and err.diagnosis.findings, str(err)
    f = err.diagnosis.findings[0]
    assert f.where.cell_line == line_of("x[i + n] = 1.0f;") and f.thread is not None and f.block is not None
    assert f"line {line_of('x[i + n] = 1.0f;')}: x[i + n] = 1.0f;" in str(err)
    assert keep.sum().item() == 45.0                                # this process's context is fine
    again = mod.vadd.run_isolated(1, 32, keep, keep, torch.empty_like(keep), 10)
    assert again.pid != first.pid                                   # a new worker replaced the poisoned one


def test_misaligned_access_in_a_worker(mod, torch):
    x = torch.zeros(256, device="cuda")
    with pytest.raises(IsolatedLaunchError) as info:
        mod.misaligned.run_isolated(1, 32, x)
    assert info.value.status == "fault" and "misaligned" in str(info.value).lower()


def test_endless_kernel_is_killed_at_the_timeout(mod, torch):
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    t0 = time.perf_counter()
    with pytest.raises(IsolatedLaunchError) as info:
        mod.spin.run_isolated(1, 1, flag, timeout_s=3)
    took = time.perf_counter() - t0
    assert info.value.status == "timeout" and "did not finish within 3 s" in str(info.value) and took < 30
    assert flag.item() == 0                                          # this process still works
    c = torch.empty(8, device="cuda")
    mod.vadd.run_isolated(1, 32, torch.ones(8, device="cuda"), torch.ones(8, device="cuda"), c, 8)
    assert c.sum().item() == 16.0
    save("worker_timings.txt", f"timeout kill and report: {took:.2f} s for timeout_s=3\n")


def test_nan_output_is_noted(mod, torch):
    a = torch.full((64,), float("inf"), device="cuda")
    c = torch.zeros(64, device="cuda")
    run = mod.vadd.run_isolated(1, 64, a, -a, c, 64)               # inf + -inf = NaN
    assert torch.isnan(c).all(), f"c = {c[:4].tolist()}...: the kernel did not see this launch's inputs ({run})"
    assert run.notes == ("c (float32[64]) holds 64 NaN of 64 elements after the launch, the first at index 0",)


def test_memcheck_finds_the_out_of_bounds_write(mod, torch):
    x = torch.zeros(1000, device="cuda")
    rep = mod.oob_write.sanitize(1, 32, x, 1000)                    # one element past the end: no crash without it
    save("sanitize_memcheck_oob.txt", rep.raw)
    assert not rep.ok and rep.findings, rep.raw[-3000:]
    f = rep.findings[0]
    assert f.kind == "invalid_write" and f.size_bytes == 4 and f.function == "oob_write"
    assert f.where.cell_line == line_of("x[i + n] = 1.0f;") and f.where.source_line.strip() == "x[i + n] = 1.0f;"
    assert f.thread == (0, 0, 0) and f.block == (0, 0, 0) and "after the nearest allocation" in f.detail
    assert x.sum().item() == 0                                       # the caller's tensor is untouched
    clean = mod.vadd.sanitize(1, 32, x, x, torch.zeros_like(x), 32)
    save("sanitize_memcheck_clean.txt", clean.raw)
    assert clean.ok and clean.error_count == 0, clean.raw[-3000:]


def test_a_sanitizer_run_says_what_it_cost_by_part(mod, torch):
    """A clean memcheck run's ToolCost (what autotune_multigpu.py compares between pools): every part measured, the
    job's marks having come back from under the tool, each in its place within the wall time; saved as
    sanitize_cost.txt. tool_start_s and imports_s need /proc/uptime and the process's start to share a clock."""
    x = torch.zeros(1000, device="cuda")
    rep = mod.vadd.sanitize(1, 32, x, x, torch.zeros_like(x), 32)
    c = rep.cost
    save("sanitize_cost.txt", repr(c))
    assert rep.ok and c is not None, rep.raw[-2000:]
    assert None not in (c.cpu_s, c.read_bytes, c.read_chars, c.context_s, c.to_kernel_s, c.kernel_s,
                        c.after_kernel_s), c
    assert c.tool_start_s is not None and c.imports_s is not None, f"no process start from /proc here: {c}"
    assert c.tool_start_s + c.imports_s + c.context_s <= c.to_kernel_s + 0.02 < c.wall_s, c
    assert 0 < c.context_s and 0 <= c.kernel_s < 5 and c.cpu_s > 0 and c.read_chars > 0, c


def test_memcheck_misaligned(mod, torch):
    rep = mod.misaligned.sanitize(1, 32, torch.zeros(256, device="cuda"))
    save("sanitize_memcheck_misaligned.txt", rep.raw)
    assert rep.findings and rep.findings[0].kind == "misaligned", rep.raw[-3000:]
    assert rep.findings[0].where.cell_line == line_of("p[threadIdx.x] = 1.0f;")


def test_racecheck_synccheck_initcheck(mod, torch):
    x, y = torch.randn(128, device="cuda"), torch.zeros(128, device="cuda")
    race = mod.racy_reverse.sanitize(2, 64, x, y, tool="racecheck")
    save("sanitize_racecheck.txt", race.raw)
    assert race.findings and race.findings[0].kind == "race", race.raw[-3000:]
    lines = {race.findings[0].where.cell_line, race.findings[0].other.cell_line}
    assert lines == {line_of("tile[threadIdx.x] = x["), line_of("= tile[63 - threadIdx.x];")}
    sync = mod.divergent_barrier.sanitize(1, 64, y, tool="synccheck")
    save("sanitize_synccheck.txt", sync.raw)
    assert sync.findings and sync.findings[0].kind == "barrier", sync.raw[-3000:]
    assert sync.findings[0].where.cell_line == line_of("if (threadIdx.x < 16) __syncthreads();")
    # initcheck: a job whose scratch tensor is never initialised (fill="empty"), as a kernel's own scratch would be
    from dataclasses import replace

    from kernellab.run.launch.job import KernelJob
    from kernellab.run.nvtools.sanitize import sanitize

    job = KernelJob.from_launch(mod.reads_scratch.image(), 1, 32, (x, y))
    job = replace(job, args=(replace(job.args[0], data=None, fill="empty"), job.args[1]))
    init = sanitize(job, "initcheck")
    save("sanitize_initcheck.txt", init.raw)
    assert init.findings and init.findings[0].kind == "uninitialized_read", init.raw[-3000:]
    assert init.findings[0].where.cell_line == line_of("scratch[threadIdx.x] + 1.0f")


def test_profile_default_metrics_and_full_set(mod, torch):
    n = 1024
    a, b = torch.randn(n, n, device="cuda"), torch.empty(n, n, device="cuda")
    rep = mod.transpose32.profile((n // 32, n // 32), (32, 32), a, b, n)
    save("ncu_default.csv", rep.raw)
    if rep.permission_denied:
        pytest.skip("GPU performance counters are not permitted here: " + str(rep))
    assert rep.ok, rep.raw[-3000:]
    assert rep.duration_ms and rep.duration_ms > 0 and rep.device
    assert rep.shared_wavefronts_per_request("ld") == pytest.approx(32.0, rel=0.05)   # the [32][32] tile
    assert rep.shared_wavefronts_per_request("st") == pytest.approx(1.0, rel=0.05)
    for label in ("achieved occupancy", "DRAM throughput", "SM throughput", "L1 hit rate", "L2 hit rate",
                  "shared load bank conflicts"):
        assert rep.get(label) is not None, label
    full = mod.transpose32.profile((n // 32, n // 32), (32, 32), a, b, n, full=True)
    save("ncu_full.csv", full.raw)
    assert full.ok and full.section_set == "full" and any(m.section == "Occupancy" for m in full.metrics)
    assert any("SharedMemoryConflicts" in note or "UncoalescedSharedAccess" in note for note in full.notes)


def test_profile_of_a_cpp_kernel_matches_its_mangled_symbol(torch):
    m = kernellab.compile_cuda("__global__ void twice(float* x) { x[threadIdx.x] *= 2; }\n")
    rep = m.twice.profile(1, 32, torch.ones(32, device="cuda"))
    if rep.permission_denied:
        pytest.skip("counters not permitted")
    assert rep.ok and rep.duration_ms > 0, rep.raw[-3000:]
