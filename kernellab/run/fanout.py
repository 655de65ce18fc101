"""Fan work out over a `concurrent.futures.Executor` and stream the results back as they finish.

The executor is a process pool on this machine (`process_pool`), or any other Executor: Dask's
`distributed.Client(...).get_executor()` runs the tasks on a cluster's workers (one per GPU with dask-cuda's
`LocalCUDACluster`). Tasks are module-level functions of plain data, so a process pool can pickle them; the user's
own callables inside them (launch, inputs, reference) need Dask's cloudpickle, or module-level functions.
"""
from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import socket
import sys
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable, Iterator, Sequence

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
