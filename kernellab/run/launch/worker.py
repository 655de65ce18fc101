"""Isolated launches: a warm worker process runs the kernel, so a fault cannot poison the caller's CUDA context.

How a launch goes (`run_isolated`):
1. The caller checks the launch as Kernel.launch does (grid, block, shared memory, every argument's type), waits
   for its GPU work, and builds a `KernelJob`. Each tensor takes one of three paths:
   - shared: a large CUDA tensor that owns its whole allocation is lent through CUDA IPC (no copy); a kernel that
     writes out of bounds can reach nothing else of the caller's;
   - staged: any other CUDA tensor (a view, a block carved from a caching allocator's segment) is copied device to
     device into one of the worker's own staging buffers (plain cudaMalloc, one per argument, kept and grown across
     jobs, mapped here through CUDA IPC), and the written ones are copied back after a clean finish. The worker
     never sees the caller's memory, so a faulty kernel can only corrupt its own buffers;
   - copied: host data, and every tensor when CUDA IPC is unavailable, travels as bytes through the pipe (slow
     for large data: each such copy gets a note saying why).
2. The worker (`python -m kernellab.run.launch.worker`, started with subprocess: a fresh interpreter, never a fork of a
   process holding a CUDA context) runs the job on its own context and sends back the copied arguments' bytes.
3. The caller copies the results into its tensors. A sticky fault poisons only the worker's context: the worker
   exits, the caller unmaps its staging buffers, a fresh worker starts at once, and the caller gets a LaunchError
   naming the fault (and, with `diagnose`, the faulting line from compute-sanitizer). A kernel that runs past its
   timeout is killed the same way. Neither copies anything back.

Requests and replies are length-prefixed frames on two dedicated pipes; the worker's stdout and stderr (device
printf included) go to a file the caller reads after each job. Workers live in a pool per GPU, shut down at exit.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import importlib
import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ... import report
from ...errors import KernellabError, LaunchError
from . import job as _job
from .device import DeviceInfo
from .job import JobResult, KernelImage, KernelJob, storage_dtype, tensor_of
from .launch import LaunchConfig

DEFAULT_RUNNER = "kernellab.run.launch.job:run_job"
DEFAULT_INIT = "kernellab.run.launch.job:init_worker"
DEFAULT_STAGE = "kernellab.run.launch.job:stage_buffers"


@dataclass
class IsolationSettings:
    """The notebook-wide defaults for launches (`set_isolation`, or `%config KernellabRun.isolate = True`)."""

    isolate: bool = False              # every launch runs in the worker unless it says isolate=False
    timeout_s: float = 60.0            # a launch running longer is killed (a hung kernel, not a slow one)
    diagnose: bool = True              # after a fault, re-run the job under compute-sanitizer memcheck
    share_min_bytes: int = 1 << 20     # CUDA tensors this large that own their allocation are lent through IPC
    stage_min_bytes: int = 0           # other CUDA tensors this large go through the worker's staging buffers
    stage_keep_bytes: int = 2 << 30    # a worker keeps at most this much staging memory between launches
    start_timeout_s: float = 120.0     # a worker that is not ready by then is reported as failed


settings = IsolationSettings()


def set_isolation(on: bool = True, *, timeout_s: float | None = None, diagnose: bool | None = None) -> None:
    """Make every launch run isolated in a worker (on=True) or in this process (on=False)."""
    settings.isolate = bool(on)
    if timeout_s is not None:
        settings.timeout_s = float(timeout_s)
    if diagnose is not None:
        settings.diagnose = bool(diagnose)


@contextlib.contextmanager
def isolation(on: bool = True):
    """`with isolation(False): ...` sets the notebook-wide isolation for a block (e.g. while timing in-process)."""
    before = settings.isolate
    settings.isolate = bool(on)
    try:
        yield
    finally:
        settings.isolate = before


class WorkerError(KernellabError):
    """A worker could not be started or stopped answering for a reason other than the kernel."""


class StagingUnavailable(KernellabError):
    """The worker's staging buffers could not be used for this launch: copy its tensors instead.

    `permanent`: CUDA IPC does not work between this process and the worker (copy from now on); otherwise the
    worker could not allocate them this time (e.g. out of memory).
    """

    def __init__(self, reason: str, *, permanent: bool, facts: dict | None = None):
        super().__init__(reason)
        self.reason, self.permanent, self.facts = reason, permanent, facts or {}


class IsolatedLaunchError(LaunchError):
    """The kernel failed in the worker; this process's CUDA context is untouched (`sticky` is False)."""

    def __init__(self, message: str, *, status: str, cuda_error: str | None = None, job=None, diagnosis=None):
        super().__init__(message, sticky=False, cuda_error=cuda_error, job=job)
        self.status = status               # "fault", "launch_error", "error", "timeout" or "crashed"
        self.diagnosis = diagnosis         # a SanitizerReport when the fault was diagnosed


# --- frames ---------------------------------------------------------------------------------------------------

_LEN = struct.Struct("<Q")


class _Timeout(Exception):
    pass


class _Closed(Exception):
    pass


def _write_frame(fd: int, payload: bytes) -> None:
    data = memoryview(_LEN.pack(len(payload)) + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout()
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise _Closed()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None) -> bytes:
    (n,) = _LEN.unpack(_read_exact(fd, _LEN.size, deadline))
    return _read_exact(fd, n, deadline)


def _big_pipe(fd: int) -> None:
    with contextlib.suppress(Exception):
        fcntl.fcntl(fd, 1031, 1 << 20)     # F_SETPIPE_SZ: 1 MiB pipes move tensors in fewer wakeups


# --- one worker process -----------------------------------------------------------------------------------------


class Worker:
    """One worker process: start it, send it jobs with a timeout, kill it."""

    def __init__(self, device: int | None = None, *, runner: str = DEFAULT_RUNNER, init: str | None = DEFAULT_INIT,
                 env: dict | None = None, stage: str | None = DEFAULT_STAGE):
        self.device, self.runner, self.init, self.extra_env = device, runner, init, dict(env or {})
        self.stage_fn = stage
        self.staging: dict[int, _Slot] = {}    # the worker's staging buffers, as this process knows and maps them
        self._staging_io = None                # what mapped them (closes them too)
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.jobs = 0
        self.started_at = 0.0
        self.ready_ms: float | None = None   # from start() to the worker's hello
        self._to_worker = self._from_worker = None
        self._log = None
        self._log_pos = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "Worker":
        """Start the process (returns at once; `wait_ready` waits for its CUDA context)."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        for fd in (req_r, req_w, rep_r, rep_w):
            _big_pipe(fd)
        self._log = tempfile.TemporaryFile(prefix="kernellab-worker-")
        fcntl.fcntl(self._log.fileno(), fcntl.F_SETFL, fcntl.fcntl(self._log.fileno(), fcntl.F_GETFL) | os.O_APPEND)
        cmd = [sys.executable, "-m", "kernellab.run.launch.worker", "--fd-in", str(req_r), "--fd-out", str(rep_w),
               "--runner", self.runner]
        if self.init:
            cmd += ["--init", self.init]
        if self.stage_fn:
            cmd += ["--stage", self.stage_fn]
        if self.device is not None:
            cmd += ["--device", str(self.device)]
        env = dict(os.environ)
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the folder above kernellab/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update(self.extra_env)
        self.started_at = time.perf_counter()
        # A new session: a notebook interrupt (SIGINT to the kernel's process group) does not reach the worker;
        # the caller kills it instead, see WorkerPool.run.
        self.proc = subprocess.Popen(cmd, pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
        os.close(req_r)
        os.close(rep_w)
        self._to_worker, self._from_worker = req_w, rep_r
        return self

    def wait_ready(self, timeout_s: float) -> dict:
        """Wait for the worker's hello (its CUDA context is up); raise WorkerError if it fails or takes too long."""
        if self.ready_ms is not None:
            return self.info
        try:
            hello = _read_frame(self._from_worker, time.monotonic() + timeout_s)
        except (_Timeout, _Closed) as exc:
            why = "did not become ready within %.0f s" % timeout_s if isinstance(exc, _Timeout) else "exited"
            log = self.take_output()
            self.kill()
            raise WorkerError(f"the kernellab worker process {why} while starting"
                              + (f"; its output:\n{log[-3000:]}" if log.strip() else "")) from None

        self.info = json.loads(hello[1:]) if hello[:1] == b"H" else {}
        if hello[:1] != b"H":
            log = self.take_output()
            self.kill()
            raise WorkerError(f"the kernellab worker could not start: {hello[1:].decode(errors='replace')}"
                              + (f"\n{log[-3000:]}" if log.strip() else ""))
        self.ready_ms = (time.perf_counter() - self.started_at) * 1e3
        return self.info

    def request(self, job_bytes: bytes, timeout_s: float) -> JobResult:
        """Send one job and wait for its result; raises _Timeout or _Closed (the pool turns them into results)."""
        try:
            _write_frame(self._to_worker, b"R" + job_bytes)
        except (BrokenPipeError, OSError):
            raise _Closed() from None
        reply = _read_frame(self._from_worker, time.monotonic() + timeout_s)
        self.jobs += 1
        return JobResult.from_bytes(reply)

    # -- staging buffers ----------------------------------------------------------------------------------------
    @property
    def staging_bytes(self) -> int:
        """Device memory held in this worker's staging buffers."""
        return sum(slot.nbytes for slot in self.staging.values())

    def stage(self, sizes: list[int], io, timeout_s: float) -> list[tuple[int, int]]:
        """(slot, address in this process) of a staging buffer for each of `sizes` (bytes), all distinct.

        Reuses the worker's buffers (the smallest that fits each, largest arguments first); grows or adds the
        others in one request, unmapping here first what the worker is about to free; maps new ones through CUDA
        IPC with `io`. Raises StagingUnavailable when the worker cannot allocate them or they cannot be mapped,
        _Timeout or _Closed when the worker does not answer.
        """
        if self._staging_io is not None and self._staging_io is not io:
            self.close_staging()                            # mapped by another io (tests swap it): start over
        self._staging_io = io
        free = dict(self.staging)
        chosen: list[int | None] = [None] * len(sizes)
        largest_first = sorted(range(len(sizes)), key=lambda i: -sizes[i])
        for i in largest_first:
            fits = [s for s, slot in free.items() if slot.nbytes >= sizes[i]]
            if fits:
                chosen[i] = min(fits, key=lambda s: (free[s].nbytes, s))
                del free[chosen[i]]
        grow: dict[int, int] = {}
        new_slot = max(self.staging, default=-1) + 1
        for i in largest_first:
            if chosen[i] is None:
                if free:                                    # regrow one this launch does not use
                    s = max(free, key=lambda k: (free[k].nbytes, -k))
                    del free[s]
                else:
                    s, new_slot = new_slot, new_slot + 1
                chosen[i], grow[s] = s, sizes[i]
        if grow:
            for s in grow:
                self._unmap(s)
            reply = self._ask_stage({"sizes": {str(s): n for s, n in grow.items()}}, timeout_s)
            for s, info in reply.get("slots", {}).items():
                self.staging[int(s)] = _Slot(bytes.fromhex(info["handle"]), int(info["bytes"]))
            missing = [s for s in grow if s not in self.staging]
            if missing:
                raise StagingUnavailable(f"the worker did not return staging buffer(s) {missing}", permanent=True)
        for s in set(chosen):
            slot = self.staging[s]
            if slot.ptr is None:
                try:
                    slot.ptr = int(io.open(slot.handle, self.device))
                except Exception as exc:
                    raise StagingUnavailable(f"cudaIpcOpenMemHandle failed here on the worker's buffer "
                                             f"({type(exc).__name__}: {exc})", permanent=True) from None
        return [(s, self.staging[s].ptr) for s in chosen]

    def free_staging(self, timeout_s: float = 30.0) -> None:
        """Unmap the staging buffers here, then have the worker free them."""
        self.close_staging()
        if self.alive:
            self._ask_stage({"free": "all"}, timeout_s)

    def close_staging(self) -> None:
        """Unmap the worker's staging buffers from this process (before it is replaced or stopped)."""
        for s in list(self.staging):
            self._unmap(s)

    def _unmap(self, s: int) -> None:
        slot = self.staging.pop(s, None)
        if slot is not None and slot.ptr is not None and self._staging_io is not None:
            with contextlib.suppress(Exception):             # a dead worker's memory: nothing left to do
                self._staging_io.close(slot.ptr, self.device)

    def _ask_stage(self, request: dict, timeout_s: float) -> dict:
        try:
            _write_frame(self._to_worker, b"S" + json.dumps(request).encode())
        except (BrokenPipeError, OSError, TypeError):
            raise _Closed() from None
        reply = _read_frame(self._from_worker, time.monotonic() + timeout_s)
        if reply[:1] == b"S":
            return json.loads(reply[1:])
        text = reply[1:].decode(errors="replace").strip()
        transient = any(s in text for s in ("MemoryAllocation", "out of memory", "OUT_OF_MEMORY"))
        raise StagingUnavailable(f"the worker could not allocate its staging buffers: {text}" if transient
                                 else f"the worker could not provide staging buffers: {text}",
                                 permanent=not transient)

    def take_output(self) -> str:
        """What the worker printed since the last call (stdout and stderr, device printf included)."""
        if self._log is None:
            return ""
        self._log.seek(self._log_pos)
        data = self._log.read()
        self._log_pos += len(data)
        return data.decode(errors="replace")

    def kill(self) -> None:
        """Unmap its staging buffers here, stop the process now (SIGKILL) and reap it."""
        self.close_staging()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=30)
        self._close_fds()

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        self.close_staging()
        if self.alive:
            with contextlib.suppress(Exception):
                _write_frame(self._to_worker, b"Q")
                self.proc.wait(timeout=timeout_s)
        self.kill()

    def _close_fds(self) -> None:
        for name in ("_to_worker", "_from_worker"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)


@dataclass
class _Slot:
    """One of a worker's staging buffers, as the caller knows it."""

    handle: bytes                      # its cudaIpcMemHandle
    nbytes: int                        # its capacity
    ptr: int | None = None             # where this process mapped it (None: not yet)


class WorkerPool:
    """The warm worker of one GPU: replaces it after a fault, a timeout or a crash, and starts the next one early."""

    def __init__(self, device: int | None = None, *, runner: str = DEFAULT_RUNNER, init: str | None = DEFAULT_INIT,
                 env: dict | None = None, start_timeout_s: float | None = None, stage: str | None = DEFAULT_STAGE):
        self.device, self.runner, self.init, self.env, self.stage = device, runner, init, env, stage
        self.start_timeout_s = start_timeout_s
        self.worker: Worker | None = None
        self.replaced = 0                      # workers discarded after a fault, timeout or crash
        self.last_ready_ms: float | None = None
        self._lock = threading.Lock()

    def _spawn(self) -> Worker:
        self.worker = Worker(self.device, runner=self.runner, init=self.init, env=self.env, stage=self.stage).start()
        return self.worker

    def ensure(self) -> tuple[Worker, bool]:
        """(worker, cold): a ready worker, and whether this call had to wait for it to start."""
        w = self.worker if self.worker is not None and self.worker.alive else None
        if w is None:
            if self.worker is not None:
                self.worker.kill()
            w = self._spawn()
        cold = w.ready_ms is None
        w.wait_ready(self.start_timeout_s or settings.start_timeout_s)
        if cold:
            self.last_ready_ms = w.ready_ms
        return w, cold

    def run(self, job: KernelJob, timeout_s: float | None = None, staging: "StagingPlan | None" = None
            ) -> tuple[JobResult, dict]:
        """Run `job` in the worker: (result, facts). Timeouts and crashes come back as results, never raise.

        With `staging` (the job's staged tensors), they are copied into the worker's staging buffers first and the
        written ones copied back after a clean finish; StagingUnavailable (nothing ran) when that is not possible.
        """
        timeout_s = settings.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            w, cold = self.ensure()
            facts = {"pid": w.pid, "cold": cold, "ready_ms": w.ready_ms if cold else None,
                     "device": w.info.get("device", "")}
            try:
                if staging:
                    job = staging.upload(w, job, timeout_s)
                result = w.request(job.to_bytes(), timeout_s)
            except StagingUnavailable as exc:
                exc.facts = facts
                try:
                    w.free_staging(timeout_s)         # the copies that follow may need that memory
                except (_Timeout, _Closed, StagingUnavailable):
                    self._replace(w)
                raise
            except _Timeout:
                out = w.take_output()
                self._replace(w)
                return JobResult("timeout", message=f"{job.label} did not finish within {timeout_s:g} s",
                                 stdout=out, pid=facts["pid"]), facts
            except _Closed:
                w.kill()
                code = w.proc.returncode if w.proc else None
                out = w.take_output()
                self._replace(w)
                return JobResult("crashed", message=f"the worker process exited ({_exit_text(code)}) while running "
                                                    f"{job.label}", stdout=out, pid=facts["pid"]), facts
            except BaseException:                     # KeyboardInterrupt: the kernel may be hung, replace the worker
                self._replace(w)
                raise
            out = w.take_output()
            if out:
                result = _with_stdout(result, out)
            if result.poisoned or result.status == "fault":
                self._replace(w)                      # unmaps its staging buffers first; nothing is copied back
            elif result.ok and staging:
                try:
                    staging.download()
                    if w.staging_bytes > settings.stage_keep_bytes:
                        w.free_staging(timeout_s)
                except (_Timeout, _Closed, StagingUnavailable):
                    self._replace(w)
            return result, facts

    def release_staging(self) -> None:
        """Free the warm worker's staging buffers (they are allocated again by the next launch that needs them)."""
        with self._lock:
            if self.worker is not None and self.worker.alive:
                try:
                    self.worker.free_staging()
                except (_Timeout, _Closed, StagingUnavailable):
                    self._replace(self.worker)

    def _replace(self, w: Worker) -> None:
        w.kill()
        self.replaced += 1
        self._spawn()                # the next worker starts now, while the caller reads the error

    def shutdown(self) -> None:
        with self._lock:
            if self.worker is not None:
                self.worker.close()
                self.worker = None


def _with_stdout(result: JobResult, out: str) -> JobResult:
    return replace(result, stdout=(result.stdout + out) if result.stdout else out)


def _exit_text(code) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


_pools: dict = {}
_pools_lock = threading.Lock()


def default_pool(device: int | None = None) -> WorkerPool:
    """The shared pool of GPU `device` (created on first use)."""
    with _pools_lock:
        pool = _pools.get(device)
        if pool is None:
            pool = _pools[device] = WorkerPool(device)
        return pool


def shutdown() -> None:
    """Stop every worker this process started (also runs at exit)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        with contextlib.suppress(Exception):
            p.shutdown()


atexit.register(shutdown)


# --- the caller's side of an isolated launch ------------------------------------------------------------------


class CudaStagingIO:
    """The caller's CUDA calls for staging: map a worker's buffer (CUDA IPC), copy device to device, unmap."""

    def open(self, handle: bytes, device: int | None) -> int:
        import cupy

        with self.device(device):
            return int(cupy.cuda.runtime.ipcOpenMemHandle(handle))

    def close(self, ptr: int, device: int | None) -> None:
        import cupy

        with self.device(device):
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)

    def device(self, device: int | None):
        if device is None:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(device)

    def stream(self, x) -> int:
        """The caller's current stream for `x`: torch's for torch tensors, else CuPy's."""
        if type(x).__module__.split(".")[0] == "torch":
            import torch

            return int(torch.cuda.current_stream(x.device).cuda_stream)
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        import cupy

        cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, 4, stream)     # cudaMemcpyDefault: device to device (UVA)

    def synchronize(self, stream: int) -> None:
        import cupy

        cupy.cuda.runtime.streamSynchronize(stream)


staging_io = CudaStagingIO()


class StagingPlan:
    """The staged tensors of one isolated launch: one worker buffer per distinct tensor, filled device to device
    before the launch; the written ones are copied back after a clean finish (never after a fault or a timeout).

    The copies run on the caller's current torch (or CuPy) stream, which is then synchronized: the worker's kernel
    sees the data, and the caller's tensors hold the results when run_isolated returns.
    """

    def __init__(self, job: KernelJob, args, io=None):
        self.io = io if io is not None else staging_io
        self.device = job.device
        items: dict[int, list] = {}                          # the job's slot -> [tensor, bytes, written]
        for spec, x in zip(job.args, args):
            if spec.staged:
                x = _job.tensor_of(x)                        # a tensor map's tensor
                item = items.setdefault(spec.stage_slot, [x, 0, False])
                item[1] = max(item[1], spec.nbytes)
                item[2] = item[2] or spec.writes
        self.slots = sorted(items)
        self.items = [(x, n, w, _job.device_pointer(x)) for x, n, w in (items[k] for k in self.slots)]
        self.ptrs: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def upload(self, worker: "Worker", job: KernelJob, timeout_s: float) -> KernelJob:
        """Copy the tensors into `worker`'s staging buffers; the job, its staged arguments pointing at them."""
        placed = worker.stage([n for _, n, _, _ in self.items], self.io, timeout_s)
        self.ptrs = [ptr for _, ptr in placed]
        self._copy(((ptr, src, n, x) for (x, n, _, src), ptr in zip(self.items, self.ptrs)))
        where = {k: s for k, (s, _) in zip(self.slots, placed)}
        return replace(job, args=tuple(replace(a, stage_slot=where[a.stage_slot]) if a.staged else a
                                       for a in job.args))

    def download(self) -> None:
        """Copy the written tensors back from the staging buffers."""
        self._copy(((dst, ptr, n, x) for (x, n, w, dst), ptr in zip(self.items, self.ptrs) if w))

    def _copy(self, copies) -> None:
        io, streams = self.io, {}
        with io.device(self.device):
            for dst, src, n, x in copies:
                stream = streams.setdefault(id(x), io.stream(x))
                io.copy(dst, src, n, stream)
            for stream in set(streams.values()):
                io.synchronize(stream)


# --- the caller's side of an isolated launch ------------------------------------------------------------------


@dataclass(frozen=True)
class IsolatedRun:
    """One isolated launch that finished: where it ran, how long it took, what it noticed."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    kernel_ms: float | None            # CUDA events in the worker, around the launch alone
    wall_ms: float                     # the caller's whole round trip (checks, transfers, the launch)
    pid: int | None
    device: str
    cold: bool                         # this launch waited for a worker to start
    ready_ms: float | None             # how long that start took
    shared: tuple[str, ...] = ()       # arguments lent through CUDA IPC (no copy)
    staged: tuple[str, ...] = ()       # copied device to device through the worker's staging buffers
    copied: tuple[str, ...] = ()       # arguments that travelled as bytes
    notes: tuple[str, ...] = ()
    stdout: str = field(default="", repr=False)
    not_shared: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # (name, why) of large staged tensors

    @property
    def paths(self) -> dict[str, str]:
        """{argument: "shared" | "staged" | "copied"} for each tensor argument."""
        return {**{n: "copied" for n in self.copied}, **{n: "staged" for n in self.staged},
                **{n: "shared" for n in self.shared}}

    def __str__(self) -> str:
        ms = f"{self.kernel_ms:.3f} ms kernel, " if self.kernel_ms is not None else ""
        start = f" (started a worker in {self.ready_ms:.0f} ms)" if self.cold and self.ready_ms else ""
        lines = [f"{self.kernel}[{self.grid}, {self.block}] ran isolated in worker {self.pid} on {self.device}: "
                 f"{ms}{self.wall_ms:.2f} ms round trip{start}"]
        if self.shared:
            lines.append(f"  shared with the worker (CUDA IPC, no copy): {', '.join(self.shared)}")
        if self.staged:
            lines.append(f"  staged (GPU copies through the worker's own buffers): {', '.join(self.staged)}")
        if self.copied:
            lines.append(f"  copied as bytes: {', '.join(self.copied)}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.stdout:
            lines.append("  output:\n" + "\n".join("    " + l for l in self.stdout.rstrip().splitlines()))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = [["kernel", f"{self.kernel}[{self.grid}, {self.block}]"], ["worker", f"pid {self.pid} on {self.device}"],
                ["kernel time", f"{self.kernel_ms:.3f} ms" if self.kernel_ms is not None else "-"],
                ["round trip", f"{self.wall_ms:.2f} ms" + (f" (cold start {self.ready_ms:.0f} ms)" if self.cold
                                                           and self.ready_ms else "")]]
        if self.shared:
            rows.append(["shared (CUDA IPC, no copy)", ", ".join(self.shared)])
        if self.staged:
            rows.append(["staged (GPU copies)", ", ".join(self.staged)])
        if self.copied:
            rows.append(["copied as bytes", ", ".join(self.copied)])
        out = [report.html_table(["isolated launch", ""], rows)]
        out += [f"<div style='color:#a60'>note: {report.esc(n)}</div>" for n in self.notes]
        if self.stdout:
            out.append(f"<pre>{report.esc(self.stdout)}</pre>")
        return "".join(out)


_ipc_state = {"broken": None}   # why lending tensors failed in this session, once it has


def sync_caller() -> None:
    """Wait for this process's queued GPU work, so the worker sees the arguments' final values."""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    if "cupy" in sys.modules:
        sys.modules["cupy"].cuda.runtime.deviceSynchronize()


def run_isolated(kernel: KernelImage, cfg: LaunchConfig, dev: DeviceInfo, args, *, timeout_s: float | None = None,
                 diagnose: bool | None = None, pool: WorkerPool | None = None) -> IsolatedRun:
    """Launch `kernel` (a compiled kernel's KernelImage) with the checked configuration `cfg` in the warm worker of
    GPU `dev`; copy its results into `args`; raise IsolatedLaunchError on failure. Kernel.run_isolated makes the
    launch's checks and calls this.

    CUDA tensors of at least settings.share_min_bytes that own their allocation are lent through CUDA IPC; other
    CUDA tensors of at least settings.stage_min_bytes are staged (GPU copies through the worker's own buffers); the
    rest travel as bytes. Each tensor of share_min_bytes or more copied as bytes, and each CUDA tensor that could
    not be staged, gets a note saying why (host memory, CUDA IPC unavailable here, the worker out of memory for
    staging, ...). The run says which path each argument took (shared, staged, copied)."""
    t0 = time.perf_counter()
    args = tuple(args)
    sync_caller()
    not_shared: dict[str, str] = {}
    not_staged: dict[str, str] = {}

    def build(data: str = "share", stage: bool = True) -> KernelJob:
        broken = _ipc_state["broken"]
        disabled = f"CUDA IPC failed earlier in this session, so isolated launches copy ({broken})" if broken else None
        return KernelJob.from_launch(kernel, cfg.grid, cfg.block, args, cfg.shared_bytes, data=data, device=dev.index,
                                     share_min_bytes=settings.share_min_bytes, not_shared=not_shared,
                                     share_disabled=disabled, not_staged=not_staged, stage_disabled=disabled,
                                     stage_min_bytes=settings.stage_min_bytes if stage else None,
                                     cluster=cfg.cluster)

    def names(job: KernelJob, path: str) -> list[str]:
        return [_arg_name(a, pos) for pos, a in enumerate(job.args) if a.kind == "tensor" and _path(a) == path]

    job = build()
    pool = pool or default_pool(dev.index)
    first = None
    try:
        result, facts = pool.run(job, timeout_s, staging=StagingPlan(job, args))
    except StagingUnavailable as exc:              # nothing ran: copy the staged tensors instead
        first = exc.facts
        if exc.permanent:
            _ipc_state["broken"] = exc.reason          # copy from now on (e.g. a VM without IPC)
            why = f"{exc.reason}; isolated launches copy from now on in this session"
            not_staged.update(dict.fromkeys(names(job, "staged"), why))
            not_shared.update(dict.fromkeys(names(job, "shared"), why))
            job = build(data="copy")
        else:
            not_staged.update(dict.fromkeys(names(job, "staged"), exc.reason))
            job = build(stage=False)
        result, facts = pool.run(job, timeout_s)
    if result.status == "error" and "CUDA IPC is not available" in result.message:
        why = result.message.split(" failed: ", 1)[-1]
        _ipc_state["broken"] = why                     # copy from now on (e.g. a VM without IPC)
        not_shared.update(dict.fromkeys(names(job, "shared"), f"the worker could not open it through CUDA IPC "
                                                              f"({why}); isolated launches copy from now on in this "
                                                              f"session"))
        not_staged.update(dict.fromkeys(names(job, "staged"), f"CUDA IPC failed in the worker ({why}); isolated "
                                                              f"launches copy from now on in this session"))
        job = build(data="copy")
        first = first or facts
        result, facts = pool.run(job, timeout_s)
    if first:
        facts = dict(facts, cold=first["cold"] or facts["cold"], ready_ms=first["ready_ms"] or facts["ready_ms"])
    if not result.ok:
        raise isolated_error(result, job, kernel=kernel, args=args,
                             diagnose=settings.diagnose if diagnose is None else diagnose)
    apply_outputs(args, job, result)
    staged = names(job, "staged")
    return IsolatedRun(kernel=job.label, grid=job.grid, block=job.block, kernel_ms=result.kernel_ms,
                       wall_ms=(time.perf_counter() - t0) * 1e3, pid=facts["pid"], device=facts["device"],
                       cold=facts["cold"], ready_ms=facts["ready_ms"], shared=tuple(names(job, "shared")),
                       staged=tuple(staged), copied=tuple(names(job, "copied")),
                       notes=copy_notes(names(job, "copied"), not_shared, not_staged) + tuple(result.notes),
                       stdout=result.stdout, not_shared=tuple((n, not_shared[n]) for n in staged if n in not_shared))


def _arg_name(spec, pos: int) -> str:
    return spec.name or f"argument {pos}"


def _path(spec) -> str:
    return "shared" if spec.shared else "staged" if spec.staged else "copied"


def copy_notes(copied, not_shared: dict, not_staged: dict) -> tuple[str, ...]:
    """'a, b copied, not shared: <why>', 'c copied, not staged: <why>': one note per reason, for the copied arguments
    that have one (not lent: `not_shared`, not staged: `not_staged`, both {name: why})."""
    by_reason: dict[str, tuple[list[str], set[str]]] = {}
    for name in copied:
        if name in not_staged and not_shared.get(name) != not_staged[name]:
            how, why = "staged", not_staged[name]
        elif name in not_shared:
            how, why = "shared", not_shared[name]
        else:
            continue
        names, hows = by_reason.setdefault(why, ([], set()))
        names.append(name)
        hows.add(how)
    return tuple(f"{', '.join(names)} copied, not {' or '.join(sorted(hows))}: {why}"
                 for why, (names, hows) in by_reason.items())


def apply_outputs(args, job: KernelJob, result: JobResult) -> None:
    """Copy the worker's written arguments back into the caller's tensors (shared ones were written in place)."""

    for index, data in result.outputs:
        target, spec = tensor_of(args[index]), job.args[index]
        mod = type(target).__module__.split(".")[0]
        if mod == "torch":
            import torch

            if target.numel():
                src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                with torch.no_grad():
                    target.view(-1).view(torch.uint8).copy_(src.to(target.device))
        elif mod == "cupy":
            target.set(np.frombuffer(data, dtype=storage_dtype(spec.dtype)).reshape(spec.shape))
        elif isinstance(target, np.ndarray):
            np.copyto(target, np.frombuffer(data, dtype=target.dtype).reshape(target.shape))
        else:
            import cupy

            cupy.asarray(target).set(np.frombuffer(data, dtype=storage_dtype(spec.dtype)).reshape(spec.shape))


def isolated_error(result: JobResult, job: KernelJob, *, kernel: KernelImage | None = None, args=None,
                   diagnose: bool = False) -> IsolatedLaunchError:
    """The error for a job that did not finish well in a worker: what happened, that the session is fine, what next."""
    cfg = f"grid={job.grid}, block={job.block}" + (f", shared_bytes={job.shared_bytes}" if job.shared_bytes else "")
    name = job.label
    call = f"{name}.sanitize({job.grid}, {job.block}, *args)"
    shared = [a.name for a in job.args if a.shared and a.writes]
    partial = (f" The arguments lent to the worker ({', '.join(shared)}) may hold partial results." if shared else "")
    diagnosis = None
    if result.status == "fault":
        head = (f"{name} faulted in the isolated worker: {result.cuda_error or result.message} ({cfg}). "
                f"Your session is unaffected: the worker's CUDA context was discarded and a fresh worker is starting."
                + partial)
        if diagnose and kernel is not None and args is not None:
            diagnosis, text = _diagnose(kernel, job, args)
            head += "\n" + text
        else:
            head += f"\nFind the faulting line with {call} (compute-sanitizer memcheck)."
    elif result.status == "timeout":
        head = (f"{result.message} in the isolated worker ({cfg}): it was killed and a fresh worker is starting; your session is unaffected.{partial} "
                f"An endless loop, a barrier not every thread reaches, or a grid far larger than intended? If the "
                f"kernel is just slow, pass a larger timeout_s.")
    elif result.status == "crashed":
        head = (f"{result.message} ({cfg}); a fresh worker is starting and your session is unaffected.")
    elif result.status == "launch_error":
        text = result.cuda_error or result.message
        hint = ""
        if "OUT_OF_RESOURCES" in text or "TooManyResources" in text:
            hint = " The block asks for more registers or shared memory than an SM has: use fewer threads per block."
        head = f"{name} failed to launch in the isolated worker: {text} ({cfg}).{hint}"
    else:
        head = f"{name} could not run in the isolated worker: {result.message}"
    shown = worker_output_lines(result.stdout)
    if shown:
        head += "\nworker output:\n" + "\n".join("  " + l for l in shown[-20:])
    return IsolatedLaunchError(head, status=result.status, cuda_error=result.cuda_error, job=job,
                               diagnosis=diagnosis)


def worker_output_lines(text: str) -> list[str]:
    """The worker's output, less the "Exception ignored in ... __del__" tracebacks that CuPy objects (events,
    memory) print when they are freed in a context a fault has already killed: they repeat the fault, not news."""
    lines = text.rstrip().splitlines()
    out, dropped, i = [], 0, 0
    while i < len(lines):
        if lines[i].startswith("Exception ignored in:") and "__del__" in lines[i]:
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t", "Traceback"))):
                j += 1
            if j < len(lines) and "cuda" in lines[j].lower():
                dropped += 1
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    if dropped:
        out.append(f"({dropped} error{'s' if dropped != 1 else ''} from CuPy objects freed in the dead CUDA context "
                   f"omitted)")
    return out


# Runs a job under compute-sanitizer memcheck: (job, timeout_s) -> SanitizerReport. compute-sanitizer's module
# (run/nvtools/sanitize.py) sits above this one, so it installs itself here when it is imported (kernellab.kernel
# imports it); until then a fault is reported without the diagnosis.
fault_sanitizer: Callable[[KernelJob, float], Any] | None = None


def _diagnose(kernel: KernelImage, job: KernelJob, args) -> tuple[object, str]:
    """Re-run the faulting launch under compute-sanitizer memcheck and summarize where it faulted."""
    try:
        if fault_sanitizer is None:
            raise KernellabError("kernellab.run.nvtools.sanitize is not loaded")
        copy = KernelJob.from_launch(kernel, job.grid, job.block, args, job.shared_bytes, data="copy",
                                     device=job.device)
        rep = fault_sanitizer(copy, max(settings.timeout_s, 120.0))
    except Exception as exc:  # no compute-sanitizer here: say how to look by hand
        return None, (f"(compute-sanitizer could not diagnose it here: {exc}). Find the faulting line with "
                      f"{job.label}.sanitize({job.grid}, {job.block}, *args).")
    if rep.findings:
        return rep, "compute-sanitizer memcheck, on the same launch:\n" + rep.summary(limit=3)
    return rep, ("compute-sanitizer memcheck found no invalid access on the same launch (" + rep.headline() +
                 "); the fault may be a trap, an assert or an illegal instruction.")


def run_job_isolated(job: KernelJob, *, timeout_s: float | None = None, pool: WorkerPool | None = None) -> JobResult:
    """Runs a prepared job in a worker and return its JobResult as is (no checks, no copy-back)."""
    pool = pool or default_pool(job.device)
    return pool.run(job, timeout_s)[0]


# --- the worker's side ----------------------------------------------------------------------------------------


def _load(spec: str):
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: go when the caller goes


def _flush_c_stdio() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)              # device printf goes through C stdio


def serve(fd_in: int, fd_out: int, runner: str, init: str | None, device: int | None,
          stage: str | None = None) -> int:
    """The worker's loop: hello, then one request at a time until quit or EOF. A poisoned context ends it.

    Requests: b"R" + a job (the reply is its JobResult), b"S" + JSON for the staging buffers (`stage(request,
    state)`; the reply is b"S" + its JSON answer, or b"E" + what failed), b"Q" (quit).
    """
    _die_with_parent()
    state: dict = {}
    try:
        info = _load(init)(device) if init else {"pid": os.getpid()}
        run = _load(runner)
        stager = _load(stage) if stage else None
    except Exception as exc:
        _write_frame(fd_out, b"E" + f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}".encode())
        return 1
    state["device_name"] = info.get("device", "")
    _write_frame(fd_out, b"H" + json.dumps(info).encode())
    while True:
        try:
            frame = _read_frame(fd_in)
        except _Closed:
            return 0
        if frame[:1] == b"Q":
            return 0
        if frame[:1] == b"S":
            try:
                if stager is None:
                    raise KernellabError("this worker was started without staging buffers (--stage)")
                reply = b"S" + json.dumps(stager(json.loads(frame[1:]), state)).encode()
            except Exception as exc:
                reply = b"E" + f"{type(exc).__name__}: {exc}".encode()
            _write_frame(fd_out, reply)
            continue
        if frame[:1] != b"R":
            continue
        try:
            job = KernelJob.from_bytes(frame[1:])
            result = run(job, state)
        except Exception as exc:
            result = JobResult("error", message=f"{type(exc).__name__}: {exc}", pid=os.getpid())
        _flush_c_stdio()
        _write_frame(fd_out, result.to_bytes())
        if result.poisoned or result.status == "fault":
            os._exit(3)                               # a poisoned context: leave, the caller starts a new worker


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernellab.run.launch.worker",
                                 description="kernellab's GPU worker (started by kernellab.run.launch.worker.Worker)")
    ap.add_argument("--fd-in", type=int, required=True)
    ap.add_argument("--fd-out", type=int, required=True)
    ap.add_argument("--runner", default=DEFAULT_RUNNER)
    ap.add_argument("--init", default=None)
    ap.add_argument("--stage", default=None)
    ap.add_argument("--device", type=int, default=None)
    ns = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return serve(ns.fd_in, ns.fd_out, ns.runner, ns.init, ns.device, ns.stage)


if __name__ == "__main__":
    sys.exit(main())
