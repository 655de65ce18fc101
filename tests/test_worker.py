"""Isolated launches, compute-sanitizer and Nsight Compute without a GPU.

- The worker protocol runs real worker processes with a stand-in GPU (tests/fixtures/fake_gpu.py): warm reuse,
  outputs copied back, a hung kernel killed at its timeout and replaced, a poisoned context replaced, a crash,
  printf capture, interrupts. Isolated launches say why each large tensor was copied instead of lent.
- The real worker runner (kernellab.run.launch.job.run_job) runs in a worker on a stand-in cupy that keeps CUDA's
  stream-ordering rules (tests/fixtures/fake_cupy): results and NaN notes of warm-worker launches.
- Staging buffers run for real across processes: the stand-in cupy's cudaMalloc maps a file, the caller maps the
  same file (fixtures/fake_gpu.py's FileStagingIO), and NumPy arrays stand in for CUDA tensors carved from a
  caching allocator's segment. Results, NaN notes, reuse and growth, aliasing, a fault and a timeout mid-run (the
  caller's segment untouched, the staging maps closed and reopened for the next worker), the fallbacks to bytes.
- The sanitizer and profiler parsers read real captures from an H200 (tests/fixtures/captured/, and the
  sanitizer_memcheck_misaligned/racecheck captures of the tool GPU tests in tests/fixtures/) and hand-written samples
  in the tools' documented formats for the cases no capture covers (see tests/fixtures/README.md); the subprocess
  plumbing runs against stand-in `compute-sanitizer` and `ncu` scripts.
- %launch is driven through a real IPython shell; the Kernel hooks are checked to dispatch.
"""
import os
import pathlib
import signal
import stat
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kernellab
import kernellab.kernel
from kernellab.run.launch import worker as W
from kernellab.run.launch.job import ArgSpec, JobResult, KernelJob
from kernellab.run.nvtools.ncu import (DEFAULT_METRICS, ProfileReport, format_value, parse_csv, profile,
                                       report_from_output)
from kernellab.run.nvtools.sanitize import (SanitizerReport, ToolNotFoundError, parse_location, report_from_text,
                                            sanitize, sanitize_last)

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
CAPTURED = FIXTURES / "captured"
ROOT = HERE.parent
FAKE_ENV = {"PYTHONPATH": os.pathsep.join([str(FIXTURES), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def fake_job(behaviour: str, n: int = 8) -> KernelJob:
    """A job for the stand-in GPU: `behaviour` is what its 'kernel' does (see fixtures/fake_gpu.py)."""
    x = np.arange(n, dtype=np.float32)
    return KernelJob(symbol=behaviour, name=behaviour, grid=(1, 1, 1), block=(32, 1, 1),
                     args=(ArgSpec("tensor", "x", "float32", (n,), data=x.tobytes(), writes=True),
                           ArgSpec("tensor", "y", "float32", (n,), data=x.tobytes(), writes=False),
                           ArgSpec("scalar", "n", "int32", value=n)))


@pytest.fixture
def pool():
    p = W.WorkerPool(runner="fake_gpu:run", init="fake_gpu:init", env=FAKE_ENV, start_timeout_s=60)
    yield p
    p.shutdown()


# --- the worker protocol --------------------------------------------------------------------------------------


def test_warm_worker_runs_jobs_and_returns_outputs(pool):
    result, facts = pool.run(fake_job("double"), timeout_s=30)
    assert result.ok and facts["cold"] and facts["ready_ms"] > 0 and facts["device"] == "Fake GPU"
    assert np.array_equal(np.frombuffer(result.output(0), np.float32), np.arange(8) * 2)
    assert result.output(1) is None                                  # const arguments do not come back
    pid = facts["pid"]
    again, facts2 = pool.run(fake_job("double"), timeout_s=30)
    assert facts2["pid"] == pid and not facts2["cold"]               # the same warm process
    assert again.notes == (f"job 2 in pid {pid}",)                   # and its state carried over


def test_outputs_are_copied_into_the_callers_arrays(pool):
    x = np.arange(8, dtype=np.float32)
    y = np.arange(8, dtype=np.float32)
    job = fake_job("double")
    result, _ = pool.run(job, timeout_s=30)
    W.apply_outputs((x, y, 8), job, result)
    assert np.array_equal(x, np.arange(8) * 2) and np.array_equal(y, np.arange(8))


def test_large_payloads_cross_the_pipe(pool):
    result, _ = pool.run(fake_job("double", n=3_000_000), timeout_s=60)   # 12 MB each way
    out = np.frombuffer(result.output(0), np.float32)
    assert out.shape == (3_000_000,) and out[-1] == 2 * 2_999_999


def test_hung_kernel_is_killed_at_the_timeout_and_replaced(pool):
    _, facts = pool.run(fake_job("double"), timeout_s=30)
    old = pool.worker
    t0 = time.perf_counter()
    result, _ = pool.run(fake_job("hang"), timeout_s=1.0)
    assert result.status == "timeout" and "did not finish within 1 s" in result.message
    assert time.perf_counter() - t0 < 10
    assert not old.alive and old.proc.returncode == -signal.SIGKILL
    assert pool.worker is not old and pool.replaced == 1            # a fresh worker was started at once
    ok, facts2 = pool.run(fake_job("double"), timeout_s=30)
    assert ok.ok and facts2["pid"] != facts["pid"]
    err = W.isolated_error(result, fake_job("hang"))
    assert err.status == "timeout" and not err.sticky
    assert "killed" in str(err) and "session is unaffected" in str(err) and "timeout_s" in str(err)


def test_poisoned_context_is_replaced(pool):
    _, facts = pool.run(fake_job("double"), timeout_s=30)
    old = pool.worker
    result, _ = pool.run(fake_job("sticky"), timeout_s=30)
    assert result.status == "fault" and result.poisoned and "illegal memory access" in result.cuda_error
    assert not old.alive and pool.worker is not old
    ok, facts2 = pool.run(fake_job("double"), timeout_s=30)
    assert ok.ok and facts2["pid"] != facts["pid"]
    err = W.isolated_error(result, fake_job("sticky"))
    text = str(err)
    assert isinstance(err, kernellab.LaunchError) and not err.sticky and err.status == "fault"
    assert "sticky" in text and "illegal memory access" in text and "fresh worker" in text
    assert "sticky.sanitize((1, 1, 1), (32, 1, 1), *args)" in text   # the exact call to find the line


def test_non_sticky_launch_error_keeps_the_worker(pool):
    _, facts = pool.run(fake_job("double"), timeout_s=30)
    result, facts2 = pool.run(fake_job("launch_error"), timeout_s=30)
    assert result.status == "launch_error" and facts2["pid"] == facts["pid"] and pool.replaced == 0
    assert "fewer threads per block" in str(W.isolated_error(result, fake_job("launch_error")))


def test_crash_is_reported_and_replaced(pool):
    result, facts = pool.run(fake_job("crash"), timeout_s=30)
    assert result.status == "crashed" and "exit code 7" in result.message
    ok, facts2 = pool.run(fake_job("double"), timeout_s=30)
    assert ok.ok and facts2["pid"] != facts["pid"]


def test_runner_exception_becomes_an_error_result(pool):
    result, _ = pool.run(fake_job("raise"), timeout_s=30)
    assert result.status == "error" and "the runner itself failed" in result.message
    assert pool.replaced == 0


def test_worker_output_is_captured_per_job(pool):
    result, _ = pool.run(fake_job("print"), timeout_s=30)
    assert result.stdout == "hello from the fake device\n"
    quiet, _ = pool.run(fake_job("double"), timeout_s=30)
    assert quiet.stdout == ""


def test_nan_note_travels_back(pool):
    result, _ = pool.run(fake_job("nan"), timeout_s=30)
    assert result.notes == ("x (float32[8]) holds 8 NaN of 8 elements after the launch, the first at index 0",)


def test_interrupt_kills_the_worker_and_propagates(pool):
    pool.run(fake_job("double"), timeout_s=30)
    old = pool.worker
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        pool.run(fake_job("hang"), timeout_s=60)
    assert not old.alive and pool.worker is not old


def test_failed_start_says_why():
    p = W.WorkerPool(runner="fake_gpu:run", init="fake_gpu:init", env=dict(FAKE_ENV, FAKE_GPU_INIT="fail"),
                     start_timeout_s=60)
    with pytest.raises(W.WorkerError, match="could not start: RuntimeError: no CUDA-capable device"):
        p.run(fake_job("double"))
    p.shutdown()


def test_shutdown_stops_every_worker(pool):
    pool.run(fake_job("double"), timeout_s=30)
    w = pool.worker
    pool.shutdown()
    assert not w.alive and pool.worker is None


FAKE_SRC = """extern "C" __global__ void ipc_once(float* x, const float* y, int n) { x[threadIdx.x] += y[0]; }
extern "C" __global__ void sticky(float* x, const float* y, int n) { x[threadIdx.x] += y[0]; }
extern "C" __global__ void scribble(float* x, int n) { x[threadIdx.x] = -1.0f; x[threadIdx.x + n] = -1.0f; }
extern "C" __global__ void spin(float* x, int n) { while (x[0] == 0.0f) { } }
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


@pytest.fixture
def fake_launch(monkeypatch, tmp_cache):
    """run_isolated's caller side with the GPU checks stood in: kernels compiled for real, NumPy arguments."""
    from kernellab.run.launch.device import DeviceInfo
    from kernellab.run.launch.launch import make_config

    dev = DeviceInfo(0, "Fake GPU", "sm_90", 132)
    monkeypatch.setattr(kernellab.kernel.Kernel, "check_launch", lambda k, g, b, a, s=0, cluster=None: (make_config(
        g, b, s, max_threads_per_block=1024, static_shared_bytes=0, device=dev, cluster=cluster), dev))
    monkeypatch.setattr(W, "sync_caller", lambda: None)
    monkeypatch.setattr(W, "_ipc_state", {"broken": None})
    return kernellab.compile_cuda(FAKE_SRC, arch="sm_90")


def test_run_isolated_copies_back_and_falls_back_from_ipc(pool, fake_launch, monkeypatch):
    from kernellab.run.launch import job as J

    monkeypatch.setattr(W.settings, "share_min_bytes", 32)
    monkeypatch.setattr(J, "lend", lambda x, disabled=None: disabled or (b"\1" * 64, 0))   # as a CUDA tensor would
    x, y = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
    run = fake_launch.ipc_once.run_isolated(1, 32, x, y, 8, pool=pool)       # the worker cannot open them
    assert W._ipc_state["broken"] and "CUDA IPC is not available" in W._ipc_state["broken"]
    assert np.array_equal(x, np.arange(8) * 2) and np.array_equal(y, np.ones(8))   # the fake 'kernel' doubles x
    assert run.kernel == "ipc_once" and run.copied == ("x", "y") and run.shared == () and run.device == "Fake GPU"
    assert run.cold and run.ready_ms > 0 and run.grid == (1, 1, 1) and run.block == (32, 1, 1)
    assert run.notes[0] == ("x, y copied, not shared: the worker could not open it through CUDA IPC (IpcUnavailable: "
                            "CUDA IPC is not available here (cudaErrorNotSupported)); isolated launches copy from now "
                            "on in this session")
    again = fake_launch.ipc_once.run_isolated(1, 32, x, y, 8, pool=pool)     # later launches say so too
    assert again.shared == () and again.notes[0] == (
        "x, y copied, not shared: CUDA IPC failed earlier in this session, so isolated launches copy "
        "(IpcUnavailable: CUDA IPC is not available here (cudaErrorNotSupported))")
    assert "note: x, y copied, not shared" in str(again) and "copied as bytes: x, y" in str(again)


def test_run_isolated_says_why_a_large_tensor_is_copied(pool, fake_launch, monkeypatch):
    monkeypatch.setattr(W.settings, "share_min_bytes", 32)
    a, b, c = np.arange(8, dtype=np.float32), np.ones(4, dtype=np.float32), np.ones(8, dtype=np.float32)
    run = fake_launch.vadd.run_isolated(1, 32, a, b, c, 8, pool=pool)       # 32, 16 and 32 bytes
    assert run.copied == ("a", "b", "c") and run.notes[0] == "a, c copied, not shared: it is host memory"
    assert not any("b copied" in n or "b, " in n for n in run.notes)              # below share_min_bytes: no note
    monkeypatch.setattr(W.settings, "share_min_bytes", 1 << 20)
    assert not any("copied" in n for n in fake_launch.vadd.run_isolated(1, 32, a, b, c, 8, pool=pool).notes)


STREAM_ENV = {"PYTHONPATH": os.pathsep.join([str(FIXTURES / "fake_cupy"), str(ROOT)])}


@pytest.fixture
def stream_pool():
    """Workers running the real runner (kernellab.run.launch.job.run_job) on the stream-ordered stand-in cupy."""
    p = W.WorkerPool(env=STREAM_ENV, start_timeout_s=60)
    yield p
    p.shutdown()


def test_warm_worker_reads_this_launchs_inputs_and_notes_nan(stream_pool, fake_launch):
    vadd = fake_launch.vadd
    ones, c = np.ones(64, dtype=np.float32), np.zeros(64, dtype=np.float32)
    first = vadd.run_isolated(1, 64, ones, ones, c, 64, pool=stream_pool)
    assert first.cold and first.device == "Stand-in GPU (stream-ordered)" and np.array_equal(c, np.full(64, 2.0))
    a = np.full(64, np.inf, dtype=np.float32)
    run = vadd.run_isolated(1, 64, a, -a, c, 64, pool=stream_pool)              # inf + -inf = NaN
    assert not run.cold and run.pid == first.pid and np.isnan(c).all()
    assert run.notes == ("c (float32[64]) holds 64 NaN of 64 elements after the launch, the first at index 0",)
    x = np.arange(64, dtype=np.float32)
    vadd.run_isolated(1, 64, x, ones, c, 64, pool=stream_pool)
    assert np.array_equal(c, x + 1)


def test_run_isolated_fault_without_a_sanitizer_says_how_to_look(pool, fake_launch, monkeypatch):
    from kernellab.compile import toolkit

    monkeypatch.setattr(toolkit, "find_tool", lambda name: None)
    x = np.zeros(8, dtype=np.float32)
    with pytest.raises(W.IsolatedLaunchError) as info:
        fake_launch.sticky.run_isolated(4, 32, x, x, 8, pool=pool)
    text = str(info.value)
    assert info.value.status == "fault" and info.value.diagnosis is None
    assert "compute-sanitizer could not diagnose it here" in text and "sticky.sanitize((4, 1, 1), (32, 1, 1)" in text
    assert np.array_equal(x, np.zeros(8))                                          # no copy-back after a fault


# --- staging buffers: carved CUDA tensors copied on the device through the worker's own memory -------------------


def _load_fake_gpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_gpu", FIXTURES / "fake_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Segments:
    """NumPy arrays standing in for a caching allocator's segments (each 2 MiB larger than the array, as a segment
    with free space left): views of them are carved CUDA tensors, which kernellab does not lend."""

    def __init__(self):
        self.ranges = []

    def new(self, values) -> np.ndarray:
        seg = np.array(values, dtype=np.float32)
        self.ranges.append((seg.ctypes.data, seg.nbytes + (2 << 20), seg))
        return seg

    def pointer(self, x):
        """The 'device address' of x: inside a segment, else None (host memory)."""
        if isinstance(x, np.ndarray) and any(b <= x.ctypes.data < b + seg.nbytes for b, _, seg in self.ranges):
            return x.ctypes.data
        return None

    def address_range(self, ptr):
        for base, size, _ in self.ranges:
            if base <= ptr < base + size:
                return base, size
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: not device memory")


@pytest.fixture
def staging(monkeypatch, tmp_path, fake_launch):
    """Workers on the stand-in cupy with real cross-process staging buffers (files in tmp_path); NumPy arrays are
    'CUDA tensors' (their host address as device address) whose allocations are the Segments registered."""
    from kernellab.run.launch import job as J

    io = _load_fake_gpu().FileStagingIO()
    segs = Segments()
    monkeypatch.setattr(W, "staging_io", io)
    monkeypatch.setattr(J, "device_pointer", segs.pointer)
    monkeypatch.setattr(J, "_address_range", segs.address_range)
    monkeypatch.setattr(W, "settings", W.IsolationSettings(share_min_bytes=64))   # lend is asked, and refuses
    env = dict(STREAM_ENV, FAKE_CUPY_IPC_DIR=str(tmp_path))
    pools = []

    def make_pool(**extra_env):
        pools.append(W.WorkerPool(env=dict(env, **extra_env), start_timeout_s=60))
        return pools[-1]

    import types

    yield types.SimpleNamespace(io=io, segs=segs, pool=make_pool(), make_pool=make_pool, k=fake_launch,
                                files=lambda: sorted(tmp_path.glob("fake-cudamalloc-*")))
    for p in pools:
        p.shutdown()


def test_carved_tensors_are_staged_and_the_results_come_back(staging):
    vadd, io, n = staging.k.vadd, staging.io, 64
    seg = staging.segs.new(np.concatenate([np.arange(2 * n), np.full(n, np.nan)]))
    a, b, c = seg[:n], seg[n:2 * n], seg[2 * n:]                           # carved: none owns its allocation
    run = vadd.run_isolated(1, n, a, b, c, n, pool=staging.pool)
    assert np.array_equal(c, np.arange(n) + np.arange(n, 2 * n)) and np.array_equal(seg[:2 * n], np.arange(2 * n))
    assert (run.staged, run.shared, run.copied, run.notes) == (("a", "b", "c"), (), (), ())
    assert run.paths == {"a": "staged", "b": "staged", "c": "staged"}
    assert dict(run.not_shared)["b"].startswith("it starts 256 bytes into a 2.0 MiB allocation")
    assert dict(run.not_shared)["a"].startswith("its allocation is 2.0 MiB for 256 bytes of data")
    assert "staged (GPU copies through the worker's own buffers): a, b, c" in str(run)
    assert "staged (GPU copies)" in run._repr_html_() and len(io.opened) == 3 and len(staging.files()) == 3
    # a warm worker reuses its buffers: no new maps; the NaN scan reads the staged output
    a[:], b[:] = np.inf, -np.inf
    again = vadd.run_isolated(1, n, a, b, c, n, pool=staging.pool)
    assert again.pid == run.pid and len(io.opened) == 3 and np.isnan(c).all()
    assert again.notes == ("c (float32[64]) holds 64 NaN of 64 elements after the launch, the first at index 0",)
    # a tensor passed twice is staged once: two copies in, one back
    a[:] = np.arange(n)
    before = len(io.copies)
    vadd.run_isolated(1, n, a, a, c, n, pool=staging.pool)
    assert np.array_equal(c, 2 * np.arange(n)) and len(io.copies) - before == 3
    # larger arguments: the buffers grow (this process unmaps the old ones first), the results stay exact
    big = 1 << 20                                                           # 4 MiB: more than a 2 MiB buffer
    seg2 = staging.segs.new(np.arange(3 * big) % 1000)
    x, y, z = seg2[:big], seg2[big:2 * big], seg2[2 * big:]
    grown = vadd.run_isolated(big // 256, 256, x, y, z, big, pool=staging.pool)
    assert grown.staged == ("a", "b", "c") and np.array_equal(z, x + y) and z.any()
    assert len(io.opened) == 6 and sorted(io.closed) == sorted(io.opened[:3]) and len(io.mapped) == 3
    assert len(staging.files()) == 3                                        # the worker freed the small ones


def test_fault_mid_run_leaves_the_callers_segment_untouched_and_reopens_staging(staging):
    n, pool, io = 64, staging.pool, staging.io
    seg = staging.segs.new(np.arange(4 * n))
    keep = seg.copy()
    x = seg[n:2 * n]                                                        # carved from the middle of the segment
    first = staging.k.vadd.run_isolated(1, n, seg[:n], seg[:n], seg[3 * n:], n, pool=pool)
    keep[3 * n:] = 2 * np.arange(n)
    mapped = io.mapped
    assert first.staged == ("a", "b", "c") and len(mapped) == 2
    with pytest.raises(W.IsolatedLaunchError) as info:                     # writes -1 into x, then faults
        staging.k.scribble.run_isolated(1, n, x, n, pool=pool, diagnose=False)
    assert info.value.status == "fault" and "illegal memory access" in str(info.value)
    assert np.array_equal(seg, keep)                                        # x and its neighbours: untouched
    assert io.mapped == [] and sorted(io.closed) == sorted(mapped)          # unmapped before the next worker
    assert pool.replaced == 1
    again = staging.k.vadd.run_isolated(1, n, x, x, seg[:n], n, pool=pool)
    assert again.pid != first.pid and np.array_equal(seg[:n], 2 * keep[n:2 * n])
    assert len(io.mapped) == 2 and not set(io.mapped) & set(mapped)        # the new worker's buffers


def test_timeout_mid_run_leaves_the_callers_tensor_untouched(staging):
    seg = staging.segs.new(np.zeros(128))
    x = seg[64:]
    with pytest.raises(W.IsolatedLaunchError) as info:                     # writes x[0] = -1, then never ends
        staging.k.spin.run_isolated(1, 1, x, 64, pool=staging.pool, timeout_s=1)
    assert info.value.status == "timeout" and not seg.any()
    assert staging.io.mapped == [] and len(staging.io.closed) == 1


def test_staging_falls_back_to_bytes_when_this_process_cannot_map_it(staging):
    staging.io.fail = "cudaErrorNotSupported: operation not supported"
    vadd, n = staging.k.vadd, 64
    seg = staging.segs.new(np.arange(3 * n))
    a, b, c = seg[:n], seg[n:2 * n], seg[2 * n:]
    run = vadd.run_isolated(1, n, a, b, c, n, pool=staging.pool)
    assert np.array_equal(c, np.arange(n) + np.arange(n, 2 * n)) and run.copied == ("a", "b", "c") and not run.staged
    why = ("cudaIpcOpenMemHandle failed here on the worker's buffer (RuntimeError: cudaErrorNotSupported: operation "
           "not supported)")
    assert run.notes == (f"a, b, c copied, not staged: {why}; isolated launches copy from now on in this session",)
    assert W._ipc_state["broken"] == why and staging.files() == []          # the worker freed what it allocated
    later = vadd.run_isolated(1, n, a, b, c, n, pool=staging.pool)
    assert later.notes == (f"a, b, c copied, not staged: CUDA IPC failed earlier in this session, so isolated "
                           f"launches copy ({why})",) and later.pid == run.pid


def test_worker_out_of_memory_for_staging_copies_that_launch(staging):
    pool = staging.make_pool(FAKE_CUPY_MALLOC="fail")
    n = 64
    seg = staging.segs.new(np.arange(3 * n))
    run = staging.k.vadd.run_isolated(1, n, seg[:n], seg[n:2 * n], seg[2 * n:], n, pool=pool)
    assert np.array_equal(seg[2 * n:], np.arange(n) + np.arange(n, 2 * n)) and run.copied == ("a", "b", "c")
    assert run.notes == ("a, b, c copied, not staged: the worker could not allocate its staging buffers: "
                         "CUDARuntimeError: cudaErrorMemoryAllocation: out of memory",)
    assert W._ipc_state["broken"] is None and run.cold                     # not a lasting verdict


def test_staging_is_released_above_the_limit_and_at_shutdown(staging):
    n, pool, io = 64, staging.pool, staging.io
    seg = staging.segs.new(np.arange(3 * n))
    args = (seg[:n], seg[n:2 * n], seg[2 * n:], n)
    staging.k.vadd.run_isolated(1, n, *args, pool=pool)
    assert len(io.mapped) == 3 and pool.worker.staging_bytes == 3 * (2 << 20)
    pool.release_staging()
    assert io.mapped == [] and staging.files() == [] and pool.worker.staging == {}
    W.settings.stage_keep_bytes = 4 << 20                                   # less than three 2 MiB buffers
    staging.k.vadd.run_isolated(1, n, *args, pool=pool)
    assert io.mapped == [] and staging.files() == [] and len(io.opened) == 6
    W.settings.stage_keep_bytes = 2 << 30
    staging.k.vadd.run_isolated(1, n, *args, pool=pool)
    assert len(io.mapped) == 3
    pool.shutdown()
    assert io.mapped == [] and len(io.closed) == len(io.opened) == 9


def test_staging_threshold_and_host_data(staging):
    n = 64
    seg = staging.segs.new(np.arange(2 * n))
    host = np.zeros(n, dtype=np.float32)                                    # not 'device' memory: bytes
    W.settings.stage_min_bytes = 1 << 20                                    # above these tensors: bytes too
    run = staging.k.vadd.run_isolated(1, n, seg[:n], seg[n:], host, n, pool=staging.pool)
    assert run.copied == ("a", "b", "c") and len(run.notes) == 3 and run.notes[2] == (
        "c copied, not shared: it is host memory")
    assert run.notes[1].startswith("b copied, not shared: it starts 256 bytes into a 2.0 MiB allocation")
    W.settings.stage_min_bytes = 0
    run = staging.k.vadd.run_isolated(1, n, seg[:n], seg[n:], host, n, pool=staging.pool)
    assert (run.staged, run.copied) == (("a", "b"), ("c",)) and np.array_equal(host, np.arange(n) * 2 + n)


def test_settings_and_isolation_context():
    before = W.settings.isolate
    with W.isolation(True):
        assert W.settings.isolate
    assert W.settings.isolate == before
    W.set_isolation(True, timeout_s=5, diagnose=False)
    try:
        assert (W.settings.isolate, W.settings.timeout_s, W.settings.diagnose) == (True, 5.0, False)
    finally:                       # reset in place: kernellab.kernel keeps this object (launches read it, not a new one)
        vars(W.settings).update(vars(W.IsolationSettings()))


def test_isolated_run_reads_well():
    run = W.IsolatedRun(kernel="vadd", grid=(4, 1, 1), block=(256, 1, 1), kernel_ms=0.0123, wall_ms=1.4, pid=123,
                        device="NVIDIA H200", cold=True, ready_ms=812.0, shared=("a",), staged=("b",), copied=("c",),
                        notes=("c (float32[4]) holds 4 NaN of 4 elements after the launch, the first at index 0",),
                        stdout="hi\n")
    text = str(run)
    assert "ran isolated in worker 123 on NVIDIA H200" in text and "started a worker in 812 ms" in text
    assert "note: c (float32[4]) holds 4 NaN" in text and "hi" in text
    assert "shared with the worker (CUDA IPC, no copy): a" in text and "copied as bytes: c" in text
    assert "staged (GPU copies through the worker's own buffers): b" in text
    assert run.paths == {"a": "shared", "b": "staged", "c": "copied"}
    html = run._repr_html_()
    assert "<table" in html and "staged (GPU copies)" in html and "copied as bytes" in html


# --- compute-sanitizer reports --------------------------------------------------------------------------------


def _cell_job(source: str, name: str, filename: str = "cell.cu") -> KernelJob:
    return KernelJob(symbol=name, name=name, grid=(1, 1, 1), block=(32, 1, 1), args=(), source=source, first_line=2,
                     filename=filename)


def test_memcheck_capture_is_deduplicated_with_thread_block_and_line():
    text = (CAPTURED / "sanitizer_memcheck.txt").read_text()
    src = "\n" * 10 + "    out[i + 256] = 1.0f;  // one block too far\n"
    job = _cell_job(src, "oob_write", filename="749ae013bc3d2d5994ad1e260bc34586cb6400c5.cubin.cu")
    rep = report_from_text(text, tool="memcheck", job=job)
    assert rep.error_count == 259 and not rep.ok
    assert len(rep.findings) == 1                                    # 20 printed reports, one distinct problem
    f = rep.findings[0]
    assert f.kind == "invalid_write" and f.size_bytes == 4 and f.count == 20
    assert f.message == "Invalid __global__ write of size 4 bytes" and f.function == "oob_write"
    assert (f.thread, f.block) == ((0, 0, 0), (0, 0, 0))
    assert f.address == "0x7f5c94800400" and "1 bytes after the nearest allocation" in f.detail
    assert f.where.line == 12 and f.where.cell_line == 12 and f.where.source_line.strip().startswith("out[i + 256]")
    assert any("not printed" in n for n in rep.notes) and any("Target application returned" in n for n in rep.notes)
    text = f.describe()
    assert text.splitlines()[0] == ("Invalid __global__ write of size 4 bytes at line 12: out[i + 256] = 1.0f;  "
                                    "// one block too far")
    assert "by thread (0,0,0) in block (0,0,0); out of bounds; 1 bytes after" in text
    assert text.endswith("reported 20 times")


def test_racecheck_capture_becomes_one_race():
    rep = report_from_text((CAPTURED / "sanitizer_racecheck.txt").read_text(), tool="racecheck")
    assert len(rep.findings) == 1
    f = rep.findings[0]
    assert f.kind == "race" and "WAW" in f.message and f.block == (0, 0, 0) and f.thread == (32, 0, 0)
    assert f.where.line == 16 and f.other.line == 16 and f.access == "Write" and f.other_access == "Write"


def test_synccheck_and_initcheck_captures():
    sync = report_from_text((CAPTURED / "sanitizer_synccheck.txt").read_text(), tool="synccheck")
    assert [f.kind for f in sync.findings] == ["barrier"] and sync.findings[0].where.line == 21
    assert sync.findings[0].message.startswith("Barrier error detected. Divergent thread(s) in warp")
    init = report_from_text((CAPTURED / "sanitizer_initcheck.txt").read_text(), tool="initcheck")
    f = init.findings[0]
    assert len(init.findings) == 1 and f.kind == "uninitialized_read" and f.size_bytes == 4
    assert f.where.function == "uninit" and f.where.line == 19 and f.address == "0x7fdb34800000" and f.count > 1


# The lines of tests/gpu/test_tools_gpu.py's SRC that the H200 captures in tests/fixtures/ point at (cell lines).
H200_CELL = {12: "    p[threadIdx.x] = 1.0f;", 19: "    tile[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];",
             20: "    y[blockIdx.x * 64 + threadIdx.x] = tile[63 - threadIdx.x];"}


def _h200_cell_job(name: str) -> KernelJob:
    lines = [H200_CELL.get(n, "") for n in range(2, max(H200_CELL) + 1)]
    return _cell_job("\n".join(lines) + "\n", name)


def test_misaligned_capture_from_the_h200_run():
    text = (FIXTURES / "sanitizer_memcheck_misaligned.txt").read_text()
    mis = report_from_text(text, tool="memcheck", job=_h200_cell_job("misaligned"))
    assert mis.error_count == 43 and not mis.ok and len(mis.findings) == 1     # 32 accesses + 11 API errors
    f = mis.findings[0]
    assert (f.kind, f.message, f.size_bytes, f.count) == ("misaligned", "Invalid __global__ write of size 4 bytes", 4,
                                                           32)
    assert (f.where.function, f.where.pc, f.where.file, f.where.line) == ("misaligned", 0x60, "cell.cu", 12)
    assert f.where.cell_line == 12 and f.where.source_line == "    p[threadIdx.x] = 1.0f;"
    assert (f.thread, f.block, f.address) == ((0, 0, 0), (0, 0, 0), "0x7f41f0800002")
    assert f.detail == "misaligned; inside the nearest allocation at 0x7f41f0800000 of size 1,024 bytes"
    # under compute-sanitizer the fault surfaces as an unspecified launch failure, not cudaErrorMisalignedAddress
    assert mis.notes[0] == ('Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on '
                            'CUDA API call to cudaStreamSynchronize.')
    assert len(mis.notes) == 7 and mis.notes[-1] == "Target application returned an error"
    assert not any("cudaErrorMisalignedAddress" in n for n in mis.notes)
    assert str(mis).splitlines()[1] == "  Invalid __global__ write of size 4 bytes at line 12: p[threadIdx.x] = 1.0f;"


def test_racecheck_capture_from_the_h200_run():
    text = (FIXTURES / "sanitizer_racecheck.txt").read_text()
    race = report_from_text(text, tool="racecheck", job=_h200_cell_job("racy_reverse"))
    assert race.error_count == 513 and not race.ok
    (note,) = race.notes                                                      # the tool printed 100 of its 513
    assert note.startswith("racecheck printed 100 of 513 hazards (print limit)"), note
    assert len(race.findings) == 1                                            # 100 printed hazards, one race
    r = race.findings[0]
    assert (r.kind, r.message, r.count) == ("race", "shared-memory data race (RAW hazard)", 100)
    assert (r.where.function, r.where.pc, r.where.line, r.access) == ("racy_reverse", 0x100, 19, "Write")
    assert (r.other.function, r.other.pc, r.other.line, r.other_access) == ("racy_reverse", 0x110, 20, "Read")
    assert (r.thread, r.other_thread, r.block, r.address) == ((31, 0, 0), (32, 0, 0), (0, 0, 0), "0x47c")
    assert r.where.source_line == H200_CELL[19] and r.other.source_line == H200_CELL[20]


def test_racecheck_analysis_lines_are_merged_with_the_hazards():
    """Hand-written in compute-sanitizer's documented analysis format ("Race reported between ..."): no capture has
    shown these lines yet (CUDA 13's --racecheck-report all printed hazards only on the H200)."""
    text = """========= COMPUTE-SANITIZER
========= Error: Potential RAW hazard detected at __shared__ 0x4 in block (0,0,0) :
=========     Write Thread (1,0,0) at racy_reverse(const float *, float *)+0x1d0 in cell.cu:5
=========     Read Thread (62,0,0) at racy_reverse(const float *, float *)+0x210 in cell.cu:6
=========     Current Value : 0, Incoming Value : 1065353216
=========
========= Error: Race reported between Write access at racy_reverse(const float *, float *)+0x1d0 in cell.cu:5
=========     and Read access at racy_reverse(const float *, float *)+0x210 in cell.cu:6 [248 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
    race = report_from_text(text, tool="racecheck")
    assert len(race.findings) == 1 and race.error_count == 1
    r = race.findings[0]
    assert (r.where.line, r.other.line, r.access, r.other_access) == (5, 6, "Write", "Read")
    assert r.thread == (1, 0, 0) and r.block == (0, 0, 0) and r.count == 248


def test_legacy_location_format():
    """tests/fixtures/sanitizer_memcheck_legacy.txt is hand-written (CUDA 11's "at 0xPC in file:line:function")."""
    src = "__global__ void oob_read(const float* x, float* y) {\n    y[threadIdx.x] = x[threadIdx.x + 1024];\n}\n"
    job = _cell_job("\n" * 2 + src, "oob_read")                      # line 5 of the cell is the read
    legacy = report_from_text((FIXTURES / "sanitizer_memcheck_legacy.txt").read_text(), tool="memcheck", job=job)
    f = legacy.findings[0]
    assert (f.kind, f.where.function, f.where.line, f.where.pc) == ("invalid_read", "oob_read", 5, 0x70)
    assert f.where.source_line.strip() == "y[threadIdx.x] = x[threadIdx.x + 1024];" and f.block == (3, 0, 0)


def test_locations_in_every_format():
    assert parse_location("at vadd+0x90 in cell.cu:4").line == 4
    loc = parse_location("racy(const float *, float *)+0x1d0 in /tmp/x/cell.cu:5")
    assert (loc.function, loc.pc, loc.file, loc.line) == ("racy(const float *, float *)", 0x1D0, "/tmp/x/cell.cu", 5)
    assert parse_location("at gkyl_kernel+0x330").line is None and parse_location("at gkyl_kernel+0x330").pc == 0x330
    old = parse_location("at 0x000000c8 in /src/my.cuh:75:void proj<double>(double*, int)")
    assert (old.file, old.line, old.function) == ("/src/my.cuh", 75, "void proj<double>(double*, int)")
    assert parse_location("at 0x3b0 in void boot<2048>(unsigned long*)").function == "void boot<2048>(unsigned long*)"


def test_clean_report_and_reprs():
    rep = report_from_text("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", tool="memcheck",
                           kernel="vadd")
    assert rep.ok and bool(rep) and str(rep) == "memcheck: no problems found in vadd"
    bad = report_from_text((CAPTURED / "sanitizer_memcheck.txt").read_text(), tool="memcheck", kernel="oob_write")
    j = bad.to_json()
    assert j["kind"] == "sanitize" and j["version"] == 1 and j["findings"][0]["thread"] == [0, 0, 0]
    bundle = bad._repr_mimebundle_()
    assert "application/vnd.kernellab.report+json" in bundle and "<table" in bundle["text/html"]
    assert "Invalid __global__ write of size 4 bytes" in str(bad)


def _script(tmp_path, name, body) -> str:
    path = tmp_path / name
    path.write_text("#!" + sys.executable + "\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_sanitize_runs_the_tool_on_a_job_file(tmp_path):
    log = tmp_path / "argv.txt"
    fake = _script(tmp_path, "compute-sanitizer", f"""
        import sys
        open({str(log)!r}, "w").write("\\n".join(sys.argv[1:]))
        sys.stdout.write(open({str(CAPTURED / 'sanitizer_memcheck.txt')!r}).read())
        sys.exit(1)
    """)
    rep = sanitize(fake_job("oob"), "memcheck", executable=fake)
    argv = log.read_text().splitlines()
    assert argv[:8] == ["--tool", "memcheck", "--print-limit", "100", "--show-backtrace", "no",
                        "--destroy-on-device-error", "kernel"]    # a caught access ends the kernel, not the context
    assert argv[-5:-3] == ["-m", "kernellab.run.launch.job"] and argv[-2] == "--out"
    assert rep.findings and rep.exit_code == 1 and rep.error_count == 259
    assert any("did not write a result" in n for n in rep.notes)      # the stand-in never ran the job
    race = sanitize(fake_job("oob"), "racecheck", executable=fake)
    assert "--racecheck-report" in log.read_text()
    both = sanitize(fake_job("oob"), "memcheck+initcheck", executable=fake)
    assert both.tool == "memcheck+initcheck" and len(both.findings) == 2
    with pytest.raises(ValueError, match="unknown compute-sanitizer tool 'leakcheck'"):
        sanitize(fake_job("oob"), "leakcheck", executable=fake)


def test_sanitize_timeout(tmp_path):
    fake = _script(tmp_path, "compute-sanitizer", "import time\ntime.sleep(60)\n")
    rep = sanitize(fake_job("hang"), "memcheck", executable=fake, timeout_s=1)
    assert rep.timed_out and not rep.ok and "did not finish" in rep.headline()


def test_sanitize_last_uses_the_job_of_the_last_error():
    with pytest.raises(kernellab.KernellabError, match="no failed launch"):
        sanitize_last(error=ValueError("x"))


def test_sanitizer_missing_says_where_it_looked(monkeypatch):
    from kernellab.compile import toolkit

    monkeypatch.setattr(toolkit, "find_tool", lambda name: None)
    with pytest.raises(ToolNotFoundError, match="compute-sanitizer was not found"):
        sanitize(fake_job("x"))


# --- Nsight Compute reports -------------------------------------------------------------------------------------


def test_default_metrics_capture():
    rep = report_from_output((CAPTURED / "ncu_metrics_details.csv").read_text(), kernel="transpose_naive")
    assert rep.ok and rep.grid == "(32, 32, 1)" and rep.block == "(32, 32, 1)"
    assert rep["duration"] == pytest.approx(9.568e-6) and rep.duration_ms == pytest.approx(9.568e-3)
    assert rep["achieved occupancy"] == pytest.approx(86.76)
    assert rep["shared load wavefronts"] == 1_048_686 and rep["shared load bank conflicts"] == 1_015_918
    assert rep.shared_wavefronts_per_request("ld") == pytest.approx(32.0, rel=1e-3)
    assert rep.shared_wavefronts_per_request("st") == pytest.approx(1.0)
    text = str(rep)
    assert "duration" in text and "9.57 us" in text and "86.8 %" in text and "32.0-way" in text
    assert "no bank conflicts" in text
    labels = [m.label for m in rep.metrics]
    assert labels.index("duration") < labels.index("L2 hit rate")     # the default set's order
    j = rep.to_json()
    assert j["kind"] == "profile" and j["shared_wavefronts_per_request"]["ld"] == pytest.approx(32.0, rel=1e-3)


def test_raw_page_and_full_set_captures():
    metrics, facts = parse_csv((CAPTURED / "ncu_metrics_raw.csv").read_text())
    by = {m.name: m for m in metrics}
    assert by["gpu__time_duration.sum"].value == pytest.approx(by["gpu__time_duration.sum"].value) and facts["kernels"]
    assert by["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"].value > 1e6
    full = report_from_output((CAPTURED / "ncu_full_details.csv").read_text(), kernel="transpose_naive",
                              section_set="full")
    assert full.ok and full["L2 Hit Rate"] == pytest.approx(54.17) and full["Registers Per Thread"] == 16
    assert full["Cluster Scheduling Policy"] == "PolicySpread"
    assert any(m.section == "Occupancy" for m in full.metrics) and "section" in str(full).splitlines()[1]
    assert any("ncu: Unable to access the following 6 metrics" in n for n in full.notes)


def test_permission_and_no_kernel_outputs():
    denied = report_from_output((FIXTURES / "ncu_permission.txt").read_text(), kernel="vadd")
    assert denied.permission_denied and not denied.ok
    text = str(denied)
    assert "not permitted" in text and "NVreg_RestrictProfilingToAdminUsers=0" in text
    assert "kernel.occupancy(block)" in text and "bank_wavefronts" in text
    none = report_from_output((FIXTURES / "ncu_no_kernels.txt").read_text(), kernel="vadd")
    assert not none.ok and "no launch of vadd was profiled" in none.error
    bad = report_from_output("==ERROR== Failed to find metric sm__bogus.sum\n", kernel="vadd")
    assert "rejected the metric list" in bad.error


def test_value_formats():
    assert format_value(9.568e-6, "second") == "9.57 us"
    assert format_value(4 * 2**20, "byte") == "4.00 MiB"
    assert format_value(63.25, "%") == "63.2 %"
    assert format_value(1048576.0, "") == "1,048,576"
    assert format_value(None, "%") == "n/a"
    assert format_value(1.97e9, "hz") == "1.97 GHz"


def test_profile_runs_ncu_on_a_job_file(tmp_path):
    log = tmp_path / "argv.txt"
    fake = _script(tmp_path, "ncu", f"""
        import sys
        open({str(log)!r}, "w").write("\\n".join(sys.argv[1:]))
        sys.stdout.write(open({str(CAPTURED / 'ncu_metrics_details.csv')!r}).read())
    """)
    rep = profile(fake_job("transpose_naive"), executable=fake)
    argv = log.read_text().splitlines()
    assert argv[:2] == ["--clock-control", "none"] and "--csv" in argv
    assert argv[argv.index("-k") + 1] == "regex:^transpose_naive$" and argv[argv.index("-c") + 1] == "1"
    assert argv[argv.index("--metrics") + 1].split(",") == [m for m, _ in DEFAULT_METRICS]
    assert rep.ok and rep["shared load bank conflicts"] == 1_015_918
    profile(fake_job("t"), section_set="full", executable=fake)
    argv = log.read_text().splitlines()
    assert argv[argv.index("--set") + 1] == "full" and "--metrics" not in argv
    with pytest.raises(ValueError, match="unknown ncu section set"):
        profile(fake_job("t"), section_set="everything", executable=fake)


# --- %launch and the Kernel hooks ----------------------------------------------------------------------------

SRC = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


@pytest.fixture(scope="module")
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernellab")
    shell.run_line_magic("load_ext", "kernellab.notebook.run_magics")
    return shell


@pytest.fixture
def calls(monkeypatch):
    """Record what %launch dispatches to, instead of running it."""
    seen = []
    from kernellab.kernel import Kernel

    def record(kind, answer):
        return lambda kernel, grid, block, *args, **k: seen.append((kind, (kernel, grid, block, args), k)) or answer

    monkeypatch.setattr(Kernel, "run_isolated", record("isolated", "isolated-run"))
    monkeypatch.setattr(Kernel, "sanitize", record("sanitize", "sanitizer-report"))
    monkeypatch.setattr(Kernel, "profile", record("profile", "profile-report"))
    yield seen
    vars(W.settings).update(vars(W.IsolationSettings()))     # in place: kernellab.kernel keeps this object


def test_launch_magic_dispatches(ip, calls, tmp_cache):
    ip.run_cell("%%cuda --arch sm_90\n" + SRC)
    ip.user_ns.update(a=np.ones(4, np.float32), c=np.zeros(4, np.float32), n=4)
    assert ip.run_line_magic("launch", "--isolate vadd[1, 32](a, a, c, n)") == "isolated-run"
    kind, (kernel, grid, block, args), kw = calls[-1]
    assert kind == "isolated" and kernel is ip.user_ns["vadd"] and (grid, block) == (1, 32) and args[3] == 4
    assert kw == {"shared_bytes": 0, "timeout_s": None}
    assert ip.run_line_magic("launch", "--sanitize vadd[(1,), (32,)](*[a, a, c], n)") == "sanitizer-report"
    assert calls[-1][2]["tool"] == "memcheck" and calls[-1][1][3][2] is ip.user_ns["c"]
    ip.run_line_magic("launch", "--sanitize=racecheck vadd[1, 32, 128](a, a, c, n)")
    assert calls[-1][2] == {"shared_bytes": 128, "tool": "racecheck"}
    ip.run_line_magic("launch", "--profile=full vadd[1, 32](a, a, c, n)")
    assert calls[-1][0] == "profile" and calls[-1][2]["section_set"] == "full"
    ip.run_line_magic("launch", "--profile --metrics gpu__time_duration.sum,dram__bytes.sum vadd[1, 32](a, a, c, n)")
    assert calls[-1][2]["section_set"] is None and calls[-1][2]["metrics"] == ["gpu__time_duration.sum",
                                                                               "dram__bytes.sum"]
    ip.run_line_magic("launch", "--isolate --timeout 2.5 vadd[1, 32](a, a, c, n, shared_bytes=64)")
    assert calls[-1][2] == {"shared_bytes": 64, "timeout_s": 2.5}


def test_launch_magic_usage_errors(ip, calls, tmp_cache):
    from IPython.core.error import UsageError

    ip.run_cell("%%cuda --arch sm_90\n" + SRC)
    for line, msg in (("", "kernel\\[grid, block\\]\\(args...\\)"),
                      ("vadd(1, 2)", "got 'vadd\\(1, 2\\)'"),
                      ("vadd[1, 32](a, b", "is not Python"),
                      ("--isolate --sanitize vadd[1, 32](1)", "choose one of"),
                      ("--bogus vadd[1, 32](1)", "unrecognized arguments"),
                      ("vadd[1, 32](1, stream=0)", "only shared_bytes="),
                      ("len[1, 2](3)", "object is not subscriptable|not a kernel launch"),
                      ("vadd[1](1)", "launch as vadd\\[grid, block\\]")):
        with pytest.raises((UsageError, TypeError), match=msg):
            ip.run_line_magic("launch", line)


def test_config_sets_the_notebook_wide_isolation(ip, calls):
    ip.run_line_magic("config", "KernellabRun.isolate = True")
    ip.run_line_magic("config", "KernellabRun.timeout_s = 7.5")
    assert W.settings.isolate and W.settings.timeout_s == 7.5
    ip.run_line_magic("config", "KernellabRun.isolate = False")
    assert not W.settings.isolate
    assert "--sanitize" in ip.find_line_magic("launch").__doc__


def test_kernel_launch_follows_the_isolation_setting(monkeypatch, tmp_cache):
    mod = kernellab.compile_cuda(SRC, arch="sm_90")
    seen = []
    monkeypatch.setattr(kernellab.kernel.Kernel, "run_isolated",
                        lambda kernel, grid, block, *args, **k: seen.append(((kernel, grid, block, args), k)) or "ran")
    a = np.ones(4, np.float32)
    assert mod.vadd[1, 32](a, a, a, 4, isolate=True, timeout_s=3) == "ran"
    (kernel, grid, block, args), kw = seen[-1]
    assert kernel is mod.vadd and args[3] == 4 and kw == {"shared_bytes": 0, "timeout_s": 3, "cluster": None}
    with W.isolation(True):
        mod.vadd[2, 64, 256](a, a, a, 4)
    assert seen[-1][1]["shared_bytes"] == 256 and len(seen) == 2
    if not kernellab.has_gpu():
        with pytest.raises(kernellab.NoGPUError):          # isolate=False: in-process, needs a GPU here
            mod.vadd[1, 32](a, a, a, 4, isolate=False)


def test_kernel_sanitize_and_profile_hooks(monkeypatch, tmp_cache):
    """Kernel.sanitize and Kernel.profile hand the tool one value, the launch's KernelJob, with the tool's options."""
    import dataclasses
    import types

    import kernellab.run.nvtools.ncu as P
    import kernellab.run.nvtools.sanitize as S
    from kernellab.kernel import Kernel
    from kernellab.run.launch import device

    mod = kernellab.compile_cuda(SRC, arch="sm_90")

    @dataclasses.dataclass(frozen=True)
    class Report:
        what: str
        device: str = ""

    monkeypatch.setattr(Kernel, "job", lambda self, grid, block, *args, **k: ("job", self.name, grid, block, args, k))
    monkeypatch.setattr(device, "device_info", lambda index=None: types.SimpleNamespace(name="Fake GPU"))
    monkeypatch.setattr(S, "sanitize", lambda job, tool, **k: ("s", job, tool, k))
    monkeypatch.setattr(P, "profile", lambda job, **k: Report(repr((job, k))))
    assert mod.vadd.sanitize(1, 32, 1, 2, 3, 4, tool="racecheck", timeout_s=5) == (
        "s", ("job", "vadd", 1, 32, (1, 2, 3, 4), {"shared_bytes": 0, "cluster": None}), "racecheck", {"timeout_s": 5})
    rep = mod.vadd.profile(1, 32, 1, 2, 3, 4, full=True, shared_bytes=64)
    assert rep.device == "Fake GPU" and rep.what == repr((("job", "vadd", 1, 32, (1, 2, 3, 4),
                                                           {"shared_bytes": 64, "cluster": None}),
                                                          {"metrics": None, "section_set": "full"}))


def test_in_process_sticky_error_names_the_sanitize_call():
    from kernellab.run.launch.launch import LaunchConfig, as_launch_error

    class IllegalAddress(Exception):
        pass

    err = as_launch_error(IllegalAddress("cudaErrorIllegalAddress: an illegal memory access was encountered"), "vadd",
                        LaunchConfig((4, 1, 1), (256, 1, 1)), during="run")
    text = str(err)
    assert err.sticky and "context of this process is lost" in text and "restart" in text
    assert "kernellab.run.nvtools.sanitize.sanitize_last()" in text and "vadd.sanitize((4, 1, 1), (256, 1, 1), *args)" in text
    assert "isolate=True" in text


def test_worker_output_drops_cupy_destructor_noise_after_a_fault():
    """Captured from a real H200 run (tests/gpu/test_tools_gpu.py, isolated_fault.txt): after a fault, each CuPy
    event freed in the dead context printed a traceback into the error message."""
    from kernellab.run.launch.worker import worker_output_lines

    noise = """Exception ignored in: <cyfunction Event.__del__ at 0x7fb25e3cd640>
Traceback (most recent call last):
  File "cupy/cuda/stream.pyx", line 135, in cupy.cuda.stream.Event.__del__
  File "cupy_backends/cuda/api/runtime.pyx", line 1065, in cupy_backends.cuda.api.runtime.eventDestroy
  File "cupy_backends/cuda/api/runtime.pyx", line 146, in cupy_backends.cuda.api.runtime.check_status
cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered
"""
    text = "printf from thread 3: i = 7\n" + noise + noise + "Exception ignored in: <function f at 0x1>\nValueError: mine\n"
    assert worker_output_lines(text) == [
        "printf from thread 3: i = 7",
        "Exception ignored in: <function f at 0x1>",          # not a destructor of a dead context: kept
        "ValueError: mine",
        "(2 errors from CuPy objects freed in the dead CUDA context omitted)"]
    assert worker_output_lines("") == [] and worker_output_lines("just output\n") == ["just output"]


def test_failed_driver_entry_point_lookups_are_not_the_kernels_errors():
    """As memcheck reported tutorial 06's wgmma kernel on an H100: no kernel error, but the host
    process's failed cuGetProcAddress lookups counted in the ERROR SUMMARY. They leave the kernel clean; any other
    failed API call (a launch failure, say) still counts."""
    lookup = ('========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to '
              'cuGetProcAddress_v2.\n')
    text = "========= COMPUTE-SANITIZER\n" + lookup * 34 + "========= ERROR SUMMARY: 34 errors\n"
    rep = report_from_text(text, tool="memcheck", kernel="wgmma_bf16")
    assert rep.ok and rep.error_count == 0 and not rep.findings, str(rep)
    assert any("34 failed cuGetProcAddress" in n for n in rep.notes)
    launch = ('========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API '
              'call to cudaStreamSynchronize.\n')
    worse = report_from_text("========= COMPUTE-SANITIZER\n" + lookup * 2 + launch + "========= ERROR SUMMARY: 3 errors\n",
                             tool="memcheck", kernel="k")
    assert not worse.ok and worse.error_count == 1
