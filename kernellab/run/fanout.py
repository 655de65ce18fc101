"""Fan work out over a `concurrent.futures.Executor` and stream the results back as they finish.

The executor is a process pool on this machine (`process_pool`), or any other Executor: Dask's
`distributed.Client(...).get_executor()` runs the tasks on a cluster's workers (one per GPU with dask-cuda's
`LocalCUDACluster`). Tasks are module-level functions of plain data, so a process pool can pickle them; the user's
own callables inside them (launch, inputs, reference) need Dask's cloudpickle, or module-level functions.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, as_completed, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import KernellabError

_pool: ProcessPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def cpu_count() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_pool(workers: int | None = None, preload: Sequence[str] = ()) -> ProcessPoolExecutor:
    """A process pool of up to `workers` (default: one per core; processes start as tasks need them), kept warm
    between calls and shut down at exit.

    Its processes come from a fork server: a notebook's process may hold a CUDA context and threads, which a plain
    fork would copy into each child half-alive; the fork server is a clean process started once, with `preload`
    imported (the callers name their own module: autotune its tasks' module). Tasks must be functions of importable
    modules (not of __main__).
    """
    global _pool, _pool_size

    workers = workers or cpu_count()
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)
            if "forkserver" in multiprocessing.get_all_start_methods():
                ctx = multiprocessing.get_context("forkserver")
                # The server imports the task modules once (each child is a fork of it, ready at once) and not the
                # caller's __main__: a script run without an `if __name__ == "__main__":` guard is not run again.
                ctx.set_forkserver_preload(list(preload))
            else:
                ctx = multiprocessing.get_context("spawn")
            _pool, _pool_size = ProcessPoolExecutor(max_workers=workers, mp_context=ctx), workers
        return _pool


def shutdown_pool() -> None:
    """Stop the shared process pool (it starts again on next use)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
        _pool, _pool_size = None, 0


atexit.register(shutdown_pool)


def stream(executor: Executor, fn: Callable, items: Iterable, *, on_result: Callable[[int, Any], None] | None = None
           ) -> Iterator[tuple[int, Any]]:
    """(index, fn(item)) for every item as each finishes on `executor`; a task that raised (or could not be sent,
    e.g. a lambda for a process pool) gives (index, the exception) instead, so one failure never ends the stream."""
    futures: dict[Future, int] = {}
    failed: list[tuple[int, BaseException]] = []
    for i, item in enumerate(items):
        try:
            futures[executor.submit(fn, item)] = i
        except Exception as exc:            # e.g. Dask refusing an object it cannot serialize
            failed.append((i, exc))
    for i, exc in failed:
        yield i, exc
    for f in as_completed(futures):
        try:
            value = f.result()
        except Exception as exc:
            value = exc
        yield futures[f], value


# What every worker imports before its first task; callers add the module of their tasks (see prepare).
WORKER_IMPORTS = ("torch", "cupy")


def prepare(executor: Executor, modules: Sequence[str] = WORKER_IMPORTS) -> bool:
    """Import `modules` (those installed) on every worker of a Dask executor, in each worker's main thread, before any
    task is sent; True if that was done. Without it, the first task that carries a torch object makes a worker import
    torch while unpickling the task, off the main thread and beside another task's import, which was seen to fail on
    an H100 worker (torch's operator-schema registration raising mid-import). Other executors: nothing to do."""
    client = getattr(executor, "_client", None)
    run = getattr(client, "run", None)
    if run is None:
        return False
    try:
        run(_import_modules, list(modules))
    except Exception:                       # a worker that cannot even do this reports it on the first real task
        return False
    return True


def _import_modules(names: list[str]) -> list[str]:
    """The modules of `names` this process could import (run on a worker by `prepare`)."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
            done.append(name)
        except ImportError:
            pass
    return done


@contextlib.contextmanager
def gpu_lock(gpu: str | None):
    """Hold `gpu` (a GPU's name with its host and bus id; None: no lock) for this process alone, among the processes
    of this host that ask for it, until the block ends: a file lock in the temporary folder, released if the process
    dies."""
    if gpu is None:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"kernellab-gpu-{hashlib.sha1(gpu.encode()).hexdigest()[:16]}.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def worker_name() -> str:
    """Which worker this is: the Dask worker's address inside a Dask task, else host:pid."""
    if "distributed" in sys.modules:
        try:
            from distributed import get_worker

            return get_worker().address
        except (ImportError, ValueError):
            pass
    return f"{socket.gethostname()}:{os.getpid()}"


class Progress:
    """A tqdm bar when tqdm is there and `enabled`, else nothing; update() and describe() either way."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = None
        if enabled and total:
            try:
                from tqdm.auto import tqdm
            except ImportError:            # tqdm is a dependency, but a bar is not worth failing for
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, leave=False)

    def update(self, n: int = 1, postfix: str | None = None) -> None:
        if self.bar is not None:
            if postfix is not None:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)

    def describe(self, desc: str) -> None:
        if self.bar is not None:
            self.bar.set_description(desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- jobs that survive a lost worker or a hung one (Dask executors) ---------------------------------------------------


class JobTimeout(KernellabError, TimeoutError):
    """A job gave no result within `timeout_s` of starting on its worker (a hung kernel, an endless loop): the job
    was given up and its worker process restarted, so that the other jobs go on."""


@dataclass(frozen=True)
class JobDone:
    """One finished job: `fn(item)` or the exception it raised, and whether it had to start again elsewhere."""

    index: int
    value: Any                        # fn(item), or the exception (JobTimeout for a hung job)
    reruns: int = 0                   # how many times it was started again after its worker was lost
    rerun: str | None = None          # why, in words ("its worker ... died while it ran; re-run on ...")
    worker: str | None = None         # the worker that gave the result (Dask), else None


_running: dict[str, float] = {}       # on a worker: the jobs started and not finished, with their start time
_running_lock = threading.Lock()


def _tracked(fn: Callable, item, key: str):
    """Run `fn(item)` on a worker, noted in `_running` while it runs (the client's watchdog reads it)."""
    with _running_lock:
        _running[key] = time.monotonic()
    try:
        return fn(item)
    finally:
        with _running_lock:
            _running.pop(key, None)


def _running_jobs() -> dict[str, float]:
    """{key: seconds running} of this worker's tracked jobs (run on every worker by the watchdog)."""
    now = time.monotonic()
    with _running_lock:
        return {k: now - t for k, t in _running.items()}


def _suspicious(keys: list[str], dask_scheduler=None) -> dict[str, int]:
    """{key: how many times a worker it was on died} (run on the Dask scheduler)."""
    out = {}
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        if ts is not None:
            out[k] = ts.suspicious
    return out


def dask_client(executor):
    """The distributed.Client behind a Dask executor (`client.get_executor()`, or the client itself), else None."""
    if executor is None:
        return None
    if type(executor).__name__ == "Client" and hasattr(executor, "run_on_scheduler"):
        return executor
    client = getattr(executor, "_client", None)
    return client if hasattr(client, "run_on_scheduler") else None


def jobs(executor: Executor, fn: Callable, items: Iterable, *, timeout_s: float | None = None,
         poll_s: float = 0.5) -> Iterator[JobDone]:
    """A JobDone for every item as each finishes on `executor`; nothing is lost when a worker is.

    On a Dask executor (or client):
    - A worker process that dies (killed, out of memory, a crash in a driver) takes its jobs with it; the scheduler
      starts them again on another worker, and their JobDone says so (`reruns`, `rerun`). Dask fails a job with
      `distributed.KilledWorker` once more workers died under it than the scheduler allows (3 by default), counting
      the jobs waiting their turn there too, so a job queued behind a killer is failed with it. Each job so failed
      is held back and sent again under a new key once nothing else is running, one at a time: alone in the pool,
      only a job that kills every worker it runs on fails again, and that failure is its result (KilledWorker).
    - With `timeout_s`, a job still running `timeout_s` after it started on its worker is given up (its value is a
      JobTimeout) and that worker is restarted: its other jobs are re-run elsewhere and say so.
    - Each result is fetched and released as it arrives, so a worker lost later costs no finished result.
    - A pool left with no worker for 5 minutes (every nanny gave up) ends the jobs still waiting, each with an error.
    Other executors (a process pool): as `stream`, without the timeout.
    """
    client = dask_client(executor)
    if client is None:
        for i, value in stream(executor, fn, items):
            yield JobDone(i, value)
        return
    yield from _dask_jobs(client, [Job(fn, item) for item in items], timeout_s, poll_s)


@dataclass(frozen=True)
class Job:
    """One job for `pipeline`: fn(item), and where a Dask executor should run it."""

    fn: Callable
    item: Any
    workers: tuple[str, ...] = ()     # Dask worker addresses to run on; elsewhere only when none of them is left
    priority: int = 0                 # higher first, where jobs wait for the same worker (Dask)


def pipeline(executor: Executor, first: Sequence[Job], follow: Callable[[JobDone], Job | None], *,
             poll_s: float = 0.5) -> Iterator[JobDone]:
    """Run the `first` jobs; as each finishes, `follow(done)` may give a job that goes out at once (a compile's
    check-and-time, say), while the other first jobs still run: no stage waits for the whole previous stage. Yields a
    JobDone for every job as it finishes, first and followers alike: indexes 0..len(first)-1 are the first jobs, the
    followers are numbered on in the order they were made (`follow` sees the done job's index; keep your own map).
    On a Dask executor, nothing is lost when a worker is (as `jobs`), and each job's `workers` and `priority` place
    it: a follower restricted to one worker per GPU, with a higher priority than the first jobs still queued, runs
    on those workers as soon as the job in hand ends. Other executors: every job anywhere, in the order it came."""
    client = dask_client(executor)
    if client is not None:
        yield from _dask_jobs(client, list(first), None, poll_s, follow=follow)
        return

    futures: dict[Future, int] = {}
    count = 0

    def submit(job: Job) -> JobDone | None:
        nonlocal count
        i, count = count, count + 1
        try:
            futures[executor.submit(job.fn, job.item)] = i
        except Exception as exc:            # e.g. a process pool refusing a lambda
            return JobDone(i, exc)
        return None

    ready = [d for d in map(submit, first) if d is not None]
    while ready or futures:
        while ready:
            d = ready.pop(0)
            nxt = follow(d)
            if nxt is not None:
                failed = submit(nxt)
                if failed is not None:
                    ready.append(failed)
            yield d
        if futures:
            for f in wait(futures, return_when=FIRST_COMPLETED).done:
                i = futures.pop(f)
                try:
                    value = f.result()
                except Exception as exc:
                    value = exc
                ready.append(JobDone(i, value))


def _dask_jobs(client, work: list[Job], timeout_s: float | None, poll_s: float, no_workers_s: float = 300.0,
               follow: Callable[[JobDone], Job | None] | None = None) -> Iterator[JobDone]:
    import distributed

    pending: dict[str, tuple[int, Any]] = {}            # key -> (index, future)

    def submit(i: int) -> None:
        job = work[i]
        # Dask groups tasks by the name before the dash
        key = f"{getattr(job.fn, '__name__', 'job')}-{uuid.uuid4().hex}"
        placed = {"workers": list(job.workers), "allow_other_workers": True} if job.workers else {}
        if job.priority:
            placed["priority"] = job.priority
        pending[key] = (i, client.submit(_tracked, job.fn, job.item, key, key=key, pure=False, **placed))

    def add(i: int):
        try:
            submit(i)
        except Exception as exc:                        # e.g. an object Dask cannot serialize
            yield from finished(JobDone(i, exc))

    def finished(done: JobDone):
        nxt = follow(done) if follow is not None else None
        if nxt is not None:
            work.append(nxt)
            yield from add(len(work) - 1)
        yield done

    for i in range(len(work)):
        yield from add(i)
    moved: dict[str, str] = {}                          # key -> why it left a worker restarted by the watchdog
    no_workers_since: float | None = None
    deaths: dict[int, int] = {}                         # index -> worker deaths in its earlier tries
    held: list[int] = []                                # failed as KilledWorker, waiting to run alone
    alone: set[int] = set()                             # sent again alone: a KilledWorker now is its own
    while pending or held:
        if not pending:                                 # nothing else runs: the next held job goes alone
            i = held.pop(0)
            alone.add(i)
            submit(i)
        try:
            done = distributed.wait([f for _, f in pending.values()], timeout=poll_s,
                                    return_when="FIRST_COMPLETED").done
        except TimeoutError:
            done = set()
        if done:
            keys = [f.key for f in done]
            try:
                lost = client.run_on_scheduler(_suspicious, keys)
            except Exception:                           # an old scheduler: the counts are a courtesy
                lost = {}
            holders = _who_has(client, done)            # one question to the scheduler for the whole batch
            for f in done:
                i, _ = pending.pop(f.key)
                try:
                    value = f.result()
                except Exception as exc:
                    value = exc
                where = holders.get(f.key)
                f.release()                             # the result is here now: a worker lost later costs nothing
                died = lost.get(f.key, 0) + deaths.get(i, 0)
                if type(value).__name__ == "KilledWorker" and i not in alone:
                    # Dask counts a death against every job assigned to the worker, those waiting their turn too:
                    # a job queued behind one that kills its workers is failed with it. Held back and sent again
                    # alone (under a new key) once the others are done: only the job that does the killing fails.
                    deaths[i] = died
                    held.append(i)
                    continue
                n = max(died, int(f.key in moved))      # a restart by the watchdog counts as a death there too
                rerun = None
                if n:
                    why = moved.get(f.key) or f"the worker it was on died {_times(died)} while it was there"
                    if f.key in moved and died > 1:
                        why += f", and a worker died {_times(died - 1)} more"
                    rerun = why + (f"; re-run on {where}" if where else "; re-run on another worker")
                yield from finished(JobDone(i, value, n, rerun, where))
        if timeout_s is not None and pending:
            for d in _give_up_hung(client, pending, moved, timeout_s):
                yield from finished(d)
        if pending and not done:
            if _workers(client):
                no_workers_since = None
            elif no_workers_since is None:
                no_workers_since = time.monotonic()
            elif time.monotonic() - no_workers_since > no_workers_s:
                for key, (i, f) in list(pending.items()):
                    f.cancel()
                    yield JobDone(i, KernellabError(f"not run: the pool has had no worker for {no_workers_s:g} s "
                                                    f"(every worker died and none came back)"))
                pending.clear()


def _workers(client) -> int:
    try:
        return len(client.scheduler_info()["workers"])
    except Exception:
        return 1                                        # cannot tell: keep waiting


def _who_has(client, futures) -> dict[str, str]:
    """{key: the worker holding its result} for the finished futures (those the scheduler can tell)."""
    try:
        found = client.who_has(list(futures))
    except Exception:
        return {}
    return {k: v[0] for k, v in found.items() if v}


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _give_up_hung(client, pending: dict, moved: dict, timeout_s: float) -> Iterator[JobDone]:
    """Jobs running past `timeout_s` on their worker: a JobTimeout each, and their workers restarted."""
    try:
        running = client.run(_running_jobs, on_error="ignore")
    except TypeError:                                   # an older distributed without on_error
        running = client.run(_running_jobs)
    hung_workers = []
    for addr, jobs_there in running.items():
        if not isinstance(jobs_there, dict):
            continue
        for key, elapsed in jobs_there.items():
            if elapsed > timeout_s and key in pending:
                i, f = pending.pop(key)
                f.cancel()
                yield JobDone(i, JobTimeout(f"no result {elapsed:.0f} s after it started on {addr} (timeout_s="
                                            f"{timeout_s:g}): given up, and the worker restarted"), 0, None, addr)
                hung_workers.append((addr, i))
    if not hung_workers:
        return
    addrs = list(dict.fromkeys(a for a, _ in hung_workers))
    processing = client.processing(addrs)
    pids = client.run(os.getpid, workers=addrs)
    for addr, i in hung_workers:
        if pids.get(addr) in (None, os.getpid()):
            continue                  # a thread of this process (LocalCluster(processes=False)): cannot be ended
        for key in processing.get(addr, ()):
            if key in pending and key not in moved:
                moved[key] = f"its worker {addr} was restarted when job {i} hung there"
        # os._exit, not client.restart_workers: a graceful close waits for the hung thread before it kills
        client.run(_exit_worker, workers=[addr], on_error="ignore")


def _exit_worker() -> None:
    """End this worker's process in a moment (its nanny starts a fresh one; its jobs go elsewhere); returns first,
    so that the caller's `client.run` gets its answer."""
    threading.Timer(0.05, _end_process).start()


def _end_process() -> None:
    """Kill every process below this one, then exit at once: the hung job's own children (an isolated launch worker
    running the hung kernel and holding its GPU context, a process pool's workers and their fork server) would
    otherwise outlive it without a parent, still running."""
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(70)


def _descendants(root: int) -> list[int]:
    """The processes below `root` (children, theirs, ...), from /proc; where there is no /proc, the multiprocessing
    children only."""
    try:
        parent_of = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])   # field 4: the ppid
                except (OSError, ValueError, IndexError):
                    continue
    except OSError:
        return [c.pid for c in multiprocessing.active_children() if c.pid]
    found, frontier = [], [root]
    while frontier:
        below = [pid for pid, ppid in parent_of.items() if ppid in frontier]
        found += below
        frontier = below
    return found
