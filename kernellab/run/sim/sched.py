"""Numba's CUDA simulator with a faster block scheduler: a block's CUDA threads take turns in one OS thread.

numba-cuda's simulator (numba/cuda/simulator) runs every CUDA thread as an OS thread, and a block manager polls them
until all wait in `syncthreads()`; under the GIL each barrier costs milliseconds (a 9x9 tiled matmul with two
barriers per tile took 0.8 s). Here each CUDA thread is a greenlet (where greenlet is missing, an OS thread that runs
only while it holds the turn; KERNELLAB_SIM_THREADS=1 forces these), and the block scheduler hands the turn over: a thread runs until it reaches a barrier,
a warp-level function or its end, then the next thread runs. A barrier is a hand-off, not a wait. Everything else
is numba-cuda's: its `FakeCUDAModule` (subclassed here so that threadIdx, blockIdx, laneid and the barriers read the
scheduler's current thread), its shared, local and constant arrays, atomics, argument copies and the swapping of the
kernel's `cuda` global for the fake module during the launch.

Kept from numba-cuda's simulator: blocks run one after another in its grid order; a `syncthreads()` (and `_count`,
`_and`, `_or`) releases when every thread of the block that has not returned waits at one (returned threads count
as arrived, as on a GPU); an exception in a thread stops the launch and names the thread as numba-cuda does
("tid=[x, y, z] ctaid=[x, y, z]: message").
Added: the warp-level functions numba-cuda's simulator lacks (`syncwarp`, `shfl_sync`, `shfl_up_sync`,
`shfl_down_sync`, `shfl_xor_sync`, `all_sync`, `any_sync`, `eq_sync`, `ballot_sync`, `match_any_sync`,
`match_all_sync`, `activemask`, `lanemask_lt`), each a meeting of the lanes its mask names (lanes that returned
count as arrived and give nothing). Threads take turns in threadIdx order (x fastest, so a warp's lanes are
neighbours). A block whose threads wait for each other in a way no release can satisfy (a `syncwarp` whose lanes
wait in `syncthreads`) raises SimulatedDeadlockError; on a GPU it hangs or is undefined.

Hooks for the race detector (kernellab.run.sim.race): an observer sees each barrier release, `yield_turn()` lets a
thread give the turn away after each shared-memory access (so that threads interleave access by access, close to a
warp's lockstep), and each thread counts the `syncthreads()` it passed (`epoch`) and lists the `syncwarp()`s it took
part in (`warp_syncs`).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from collections import deque

import numpy as np

from ...errors import KernellabError

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF

try:  # greenlet: a thread switch costs about a microsecond
    import greenlet as _greenlet
except ImportError:  # pragma: no cover - exercised where greenlet is not installed
    _greenlet = None

_current = None          # the SimThread that holds the turn (one at a time; launches are serialised)
_track = False           # whether threads note their kernel frame and barrier sites (observed launches only)

_RUNNING, _BLOCK, _WARP, _YIELD = "running", "block", "warp", "yield"


class SimulatedDeadlockError(KernellabError):
    """The threads of a simulated block wait for each other in a way that no barrier release can end."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


def backend() -> str:
    """How simulated CUDA threads take turns here: 'greenlet' or 'threads'."""
    return "greenlet" if _greenlet is not None and not os.environ.get("KERNELLAB_SIM_THREADS") else "threads"


def current():
    """The simulated CUDA thread that is running (None outside a launch)."""
    return _current


# ---------------------------------------------------------------------------------------------------------------------
# Fibers: a CUDA thread's body, run until it gives the turn back


class _Killed(BaseException):
    """Raised inside an abandoned fiber so that it unwinds."""


class _GreenletFiber:
    __slots__ = ("_g",)

    def __init__(self, body):
        self._g = _greenlet.greenlet(body)

    def resume(self):
        self._g.switch()

    def suspend(self):
        self._g.parent.switch()

    def frame(self):
        """The innermost frame of the suspended fiber."""
        return self._g.gr_frame

    def kill(self):
        if self._g and not self._g.dead:
            try:
                self._g.throw(_Killed)
            except _Killed:
                pass


class _ThreadFiber:
    """An OS thread that runs only between resume() and its next suspend(): the same turn-taking as a greenlet."""

    __slots__ = ("_body", "_go", "_back", "_thread", "_killed", "_finished")

    def __init__(self, body):
        self._body = body
        self._go, self._back = threading.Semaphore(0), threading.Semaphore(0)
        self._thread = None
        self._killed = self._finished = False

    def _main(self):
        self._go.acquire()
        try:
            if not self._killed:
                self._body()
        except _Killed:
            pass
        finally:
            self._finished = True
            self._back.release()

    def resume(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, daemon=True)
            self._thread.start()
        self._go.release()
        self._back.acquire()

    def suspend(self):
        self._back.release()
        self._go.acquire()
        if self._killed:
            raise _Killed

    def frame(self):
        """The innermost frame of the suspended fiber."""
        return sys._current_frames().get(self._thread.ident) if self._thread is not None else None

    def kill(self):
        if self._thread is not None and not self._finished:
            self._killed = True
            self.resume()


def _fiber(body):
    return _GreenletFiber(body) if backend() == "greenlet" else _ThreadFiber(body)


# ---------------------------------------------------------------------------------------------------------------------
# Threads and the block scheduler


class Dim3:
    """threadIdx / blockIdx: x, y, z, iterable (numba-cuda's Dim3, with slots)."""

    __slots__ = ("x", "y", "z")

    def __init__(self, x, y, z):
        self.x, self.y, self.z = x, y, z

    def __iter__(self):
        yield self.x
        yield self.y
        yield self.z

    def __repr__(self):
        return f"Dim3({self.x}, {self.y}, {self.z})"

    __str__ = lambda self: f"({self.x}, {self.y}, {self.z})"  # noqa: E731


class SimThread:
    """One simulated CUDA thread: its indices, its fiber, and what it waits for."""

    __slots__ = ("threadIdx", "blockIdx", "thread_id", "warp", "lane", "fiber", "state", "done", "op", "value",
                 "mask", "result", "epoch", "warp_syncs", "counts", "frame", "site", "kernel_line", "exception",
                 "scheduler")

    def __init__(self, scheduler, block_idx, thread_idx, thread_id):
        self.scheduler = scheduler
        self.threadIdx = Dim3(*thread_idx)
        self.blockIdx = Dim3(*block_idx)
        self.thread_id = thread_id                  # linear: x + bx * (y + by * z)
        self.warp, self.lane = divmod(thread_id, WARP_SIZE)
        self.state = _RUNNING
        self.done = False
        self.op = self.value = self.mask = self.result = None
        self.epoch = 0                              # syncthreads() passed
        self.warp_syncs: list[int] = []             # ids of the syncwarp() meetings taken part in
        self.counts: dict = {}                      # per-thread counters for tracers (kernellab.run.sim.trace)
        self.frame = None                           # the kernel's own frame (noted when tracking)
        self.site = None                            # (filename, line) of the barrier it waits at
        self.kernel_line = None                     # the kernel frame's line at that barrier
        self.exception = None

    def __repr__(self):
        return f"<simulated thread {tuple(self.threadIdx)} of block {tuple(self.blockIdx)}>"


class BlockScheduler:
    """Runs the blocks of one launch, one at a time; within a block, threads take turns."""

    def __init__(self, function, grid_dim, block_dim, args, *, observer=None, strict: bool = True):
        self.function = function
        self.grid_dim, self.block_dim = tuple(grid_dim), tuple(block_dim)
        self.args = args
        self.observer = observer
        self.strict = strict                 # raise on a deadlock (plain launches); else report and go on
        self.threads: list[SimThread] = []
        self.block_idx = None
        self.generation = 0                  # syncthreads() releases in this block
        self._warp_meetings = 0              # syncwarp() releases in this launch (ids)
        self.deadlocks: list[str] = []

    # -- one block ---------------------------------------------------------------------------------------------
    def run_block(self, block_idx) -> None:
        global _current
        bx, by, bz = self.block_dim
        self.block_idx = tuple(block_idx)
        self.generation = 0
        threads = []
        for tid in range(bx * by * bz):
            t = SimThread(self, block_idx, (tid % bx, (tid // bx) % by, tid // (bx * by)), tid)
            t.fiber = _fiber(self._body(t))
            threads.append(t)
        self.threads = threads
        queue = deque(threads)
        try:
            while True:
                while queue:
                    t = queue.popleft()
                    _current = t
                    try:
                        t.fiber.resume()
                    finally:
                        _current = None
                    if t.exception is not None:
                        exc, tb = t.exception
                        raise exc.with_traceback(tb)
                    if t.state is _YIELD:
                        t.state = _RUNNING
                        queue.append(t)
                live = [t for t in threads if not t.done]
                if not live:
                    break
                queue.extend(self._release(live))
        finally:
            if self.observer is not None:
                self.observer.block_done(self)
            for t in threads:
                if not t.done:
                    t.fiber.kill()

    def _body(self, t: SimThread):
        function, args = self.function, self.args

        def body():
            try:
                function(*args)
            except _Killed:
                raise
            except Exception as e:  # numba-cuda's wording, which kernellab.run.sim.numba_sim parses
                prefix = f"tid={list(t.threadIdx)} ctaid={list(t.blockIdx)}"
                msg = f"{prefix}: {e}" if str(e) else prefix
                try:
                    wrapped = type(e)(msg)
                except Exception:
                    wrapped = e
                t.exception = (wrapped, sys.exc_info()[2])
            finally:
                t.done = True
                t.state = _RUNNING

        return body

    # -- waiting (called by the running thread) ------------------------------------------------------------------
    def _wait(self, t: SimThread, state: str, op: str, value=None, mask=None):
        t.state, t.op, t.value, t.mask = state, op, value, mask
        if _track:
            _note_site(t)
        t.fiber.suspend()
        return t.result

    # -- releasing ------------------------------------------------------------------------------------------------
    def _release(self, live: list[SimThread]) -> list[SimThread]:
        at_block = [t for t in live if t.state is _BLOCK]
        if len(at_block) == len(live):
            self._release_block(at_block)
            return at_block
        released = []
        for lanes in self._warps_waiting(live).values():
            members = self._members(lanes)
            if all(m.done or m.state is _WARP for m in members):
                self._release_warp(lanes, members)
                released += lanes
        if not released:                   # activemask() waits for no one: the lanes that reached it meet
            for lanes in self._warps_waiting([t for t in live if t.op == "activemask"]).values():
                self._release_warp(lanes, lanes)
                released += lanes
        if released:
            released.sort(key=lambda t: t.thread_id)
            return released
        return self._deadlock(live)

    def _warps_waiting(self, live):
        warps: dict[int, list[SimThread]] = {}
        for t in live:
            if t.state is _WARP:
                warps.setdefault(t.warp, []).append(t)
        return warps

    def _members(self, lanes: list[SimThread]) -> list[SimThread]:
        """The threads of the lanes' warp that their masks name."""
        union = 0
        for t in lanes:
            union |= t.mask
        base = lanes[0].warp * WARP_SIZE
        return [self.threads[base + lane] for lane in range(WARP_SIZE)
                if union >> lane & 1 and base + lane < len(self.threads)]

    def _release_block(self, waiting: list[SimThread]) -> None:
        values = [t.value for t in waiting if t.op != "sync"]
        result = None
        if values:
            op = next(t.op for t in waiting if t.op != "sync")
            if op == "count":
                result = int(np.count_nonzero(values))
            elif op == "and":
                result = 1 if all(values) else 0
            else:
                result = 1 if any(values) else 0
        if self.observer is not None:
            self.observer.block_barrier(self, waiting)
        self.generation += 1
        for t in waiting:
            t.epoch += 1
            t.result = result
            t.state = _RUNNING

    def _release_warp(self, lanes: list[SimThread], members: list[SimThread]) -> None:
        by_lane = {m.lane: m for m in members if not m.done and m.state is _WARP}
        meeting = None
        if any(t.op == "syncwarp" for t in lanes):
            self._warp_meetings += 1
            meeting = self._warp_meetings
            if self.observer is not None:
                self.observer.warp_barrier(self, lanes, members)
        for t in lanes:
            t.result = _collective(t, by_lane)
            if t.op == "syncwarp":
                t.warp_syncs.append(meeting)
            t.state = _RUNNING

    def _deadlock(self, live: list[SimThread]) -> list[SimThread]:
        warp_waiters = [t for t in live if t.state is _WARP]
        block_waiters = [t for t in live if t.state is _BLOCK]
        w, b = warp_waiters[0], block_waiters[0] if block_waiters else None
        for t in (w, b):
            if t is not None and t.site is None:
                frame = t.fiber.frame()
                while frame is not None and _internal(frame.f_code.co_filename):
                    frame = frame.f_back
                t.site = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
        name = {"syncwarp": "syncwarp()"}.get(w.op, f"{w.op}()")
        where = f" at line {w.site[1]}" if w.site else ""
        text = (f"thread {tuple(w.threadIdx)} of block {tuple(w.blockIdx)} waits in {name}{where} for lanes of its "
                f"warp that wait in syncthreads()" + (f" at line {b.site[1]}" if b and b.site else "")
                + ": neither can go on (on a GPU this hangs or is undefined)")
        if self.strict:
            raise SimulatedDeadlockError(f"{getattr(self.function, '__name__', 'kernel')}: {text}")
        self.deadlocks.append(text)
        if self.observer is not None:
            self.observer.deadlock(self, w, b, text)
        released = []
        for lanes in self._warps_waiting(live).values():
            self._release_warp(lanes, [m for m in self._members(lanes)])
            released += lanes
        return sorted(released, key=lambda t: t.thread_id)


def _collective(t: SimThread, by_lane: dict) -> object:
    """The result of a warp-level function for lane `t`, from the lanes that met (`by_lane`: lane -> thread)."""
    op, mask = t.op, t.mask
    if op == "syncwarp":
        return None
    if op.startswith("shfl"):
        value, arg = t.value
        if op == "shfl":
            src = int(arg) % WARP_SIZE
        elif op == "shfl_up":
            src = t.lane - int(arg)
        elif op == "shfl_down":
            src = t.lane + int(arg)
        else:
            src = t.lane ^ (int(arg) & (WARP_SIZE - 1))
        other = by_lane.get(src) if 0 <= src < WARP_SIZE else None
        if other is None or not other.op.startswith("shfl"):
            return value
        return other.value[0]
    lanes = [by_lane[k] for k in sorted(by_lane) if mask >> k & 1]
    values = [x.value for x in lanes]
    if op == "all":
        return int(all(values))
    if op == "any":
        return int(any(values))
    if op == "eq":
        return int(all(bool(v) == bool(values[0]) for v in values)) if values else 1
    if op == "ballot":
        return sum(1 << x.lane for x in lanes if x.value)
    if op == "match_any":
        return sum(1 << x.lane for x in lanes if x.value == t.value)
    if op == "activemask":
        return sum(1 << x.lane for x in by_lane.values() if x.op == "activemask")
    if op == "match_all":
        same = all(v == t.value for v in values)
        return (sum(1 << x.lane for x in lanes) if same else 0), int(same)
    raise AssertionError(op)


# ---------------------------------------------------------------------------------------------------------------------
# Where a thread is: its kernel frame and barrier sites (tracked launches only)


_RUN_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..")) + os.sep  # kernellab/run/
_sim_dirs: list[str] = []


_internal_files: dict[str, bool] = {}


def _internal(filename: str) -> bool:
    """Whether a frame of `filename` is kernellab's run/ layer or numba-cuda's simulator (not the user's code)."""
    known = _internal_files.get(filename)
    if known is not None:
        return known
    if not _sim_dirs:
        from numba.cuda.simulator import kernel as sim_kernel

        _sim_dirs.append(os.path.dirname(os.path.abspath(sim_kernel.__file__)) + os.sep)
    path = os.path.abspath(filename)
    known = _internal_files[filename] = (path.startswith(_RUN_DIR) or path.startswith(_sim_dirs[0])
                                         or path == os.path.abspath(threading.__file__))
    return known


def user_frame(depth: int = 2):
    """The first frame outside kernellab's run/ layer and numba-cuda's simulator."""
    frame = sys._getframe(depth)
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def note_frame(t: SimThread) -> None:
    """Remember the kernel's own frame of thread `t` (its last line tells where it returned)."""
    if t.frame is not None:
        return
    code = t.scheduler.function.__code__
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    t.frame = frame


def _note_site(t: SimThread) -> None:
    note_frame(t)
    frame = user_frame(3)
    t.site = (frame.f_code.co_filename, frame.f_lineno)
    t.kernel_line = t.frame.f_lineno if t.frame is not None else None


# ---------------------------------------------------------------------------------------------------------------------
# The fake `cuda` module, scheduled


_module_class = None


def module_class():
    """numba-cuda's FakeCUDAModule with threadIdx, blockIdx, laneid, barriers and warp functions scheduled here."""
    global _module_class
    if _module_class is not None:
        return _module_class
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    class _Grid:
        def sync(self):
            _current.scheduler._wait(_current, _BLOCK, "sync")

    class _CG:
        def this_grid(self):
            return _Grid()

    def thread():
        t = _current
        if _track and t.frame is None:
            note_frame(t)
        return t

    def mask_of(mask):
        m = int(mask) & FULL_MASK
        return m

    class ScheduledCUDAModule(FakeCUDAModule):
        """The fake `cuda` of a launch run by kernellab.run.sim.sched's block scheduler."""

        @property
        def threadIdx(self):
            return thread().threadIdx

        @property
        def blockIdx(self):
            return thread().blockIdx

        @property
        def laneid(self):
            return _current.lane

        @property
        def cg(self):
            return _CG()

        def grid(self, n):
            thread()
            return FakeCUDAModule.grid(self, n)

        # block barriers
        def syncthreads(self):
            t = _current
            t.scheduler._wait(t, _BLOCK, "sync")

        def syncthreads_count(self, predicate):
            t = _current
            return t.scheduler._wait(t, _BLOCK, "count", bool(predicate))

        def syncthreads_and(self, predicate):
            t = _current
            return t.scheduler._wait(t, _BLOCK, "and", bool(predicate))

        def syncthreads_or(self, predicate):
            t = _current
            return t.scheduler._wait(t, _BLOCK, "or", bool(predicate))

        # warp-level functions
        def syncwarp(self, mask=FULL_MASK):
            t = _current
            t.scheduler._wait(t, _WARP, "syncwarp", None, mask_of(mask) | 1 << t.lane)

        def _shfl(self, op, mask, value, arg):
            t = _current
            return t.scheduler._wait(t, _WARP, op, (value, arg), mask_of(mask) | 1 << t.lane)

        def shfl_sync(self, mask, value, src_lane):
            return self._shfl("shfl", mask, value, src_lane)

        def shfl_up_sync(self, mask, value, delta):
            return self._shfl("shfl_up", mask, value, delta)

        def shfl_down_sync(self, mask, value, delta):
            return self._shfl("shfl_down", mask, value, delta)

        def shfl_xor_sync(self, mask, value, lane_mask):
            return self._shfl("shfl_xor", mask, value, lane_mask)

        def _vote(self, op, mask, value):
            t = _current
            return t.scheduler._wait(t, _WARP, op, value, mask_of(mask) | 1 << t.lane)

        def all_sync(self, mask, predicate):
            return self._vote("all", mask, bool(predicate))

        def any_sync(self, mask, predicate):
            return self._vote("any", mask, bool(predicate))

        def eq_sync(self, mask, predicate):
            return self._vote("eq", mask, bool(predicate))

        def ballot_sync(self, mask, predicate):
            return self._vote("ballot", mask, bool(predicate))

        def match_any_sync(self, mask, value):
            return self._vote("match_any", mask, value)

        def match_all_sync(self, mask, value):
            return self._vote("match_all", mask, value)

        def activemask(self):
            """The lanes of the warp that reach this activemask() together (those that did not return first)."""
            return self._vote("activemask", FULL_MASK, None)

        def lanemask_lt(self):
            return (1 << _current.lane) - 1

    _module_class = ScheduledCUDAModule
    return _module_class


def yield_turn() -> None:
    """Give the turn to the next thread of the block (the running thread runs again after the others had theirs)."""
    t = _current
    t.state = _YIELD
    t.fiber.suspend()


# ---------------------------------------------------------------------------------------------------------------------
# A launch


def launch(function, grid, block, args, *, dynamic_smem_bytes: int = 0, extensions=(), module_hook=None,
           function_for=None, observer=None, strict: bool = True) -> BlockScheduler:
    """Run `function[grid, block, 0, dynamic_smem_bytes](*args)` in the simulator with the turn-taking scheduler.

    `function` is the kernel's Python function; NumPy array arguments are copied in and back as numba-cuda's
    simulator does. `module_hook(module)` may change the launch's fake `cuda` module before it runs (tracers put
    recording shared arrays in it); `function_for(module)`, if given, makes the function to run from that module
    (kernel factories: `def k(cuda): ...; return kernel`). `observer` sees barrier releases (see the module
    docstring); `strict=False` reports a deadlock to it instead of raising. The caller holds the simulator's launch
    lock. Returns the scheduler (its `deadlocks`).
    """
    global _track

    from numba.cuda.errors import normalize_kernel_dimensions
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator.args import ArgHint, InOut
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray
    from numba.cuda.simulator.kernelapi import swapped_cuda_module

    grid_dim, block_dim = normalize_kernel_dimensions(grid, block)
    module = module_class()(grid_dim, block_dim, dynamic_smem_bytes)
    if module_hook is not None:
        module_hook(module)
    run = function_for(module) if function_for is not None else function
    retr: list = []

    def fake_arg(arg):  # numba-cuda's FakeCUDAKernel.__call__, unchanged
        _, arg = functools.reduce(lambda ty_val, ext: ext.prepare_args(*ty_val, stream=0, retr=retr),
                                  list(extensions or ()), (None, arg))
        if isinstance(arg, np.ndarray) and arg.ndim > 0:
            ret = InOut(arg).to_device(retr)
        elif isinstance(arg, ArgHint):
            ret = arg.to_device(retr)
        elif isinstance(arg, np.void):
            ret = FakeCUDAArray(arg)
        else:
            ret = arg
        return FakeWithinKernelCUDAArray(ret) if isinstance(ret, FakeCUDAArray) else ret

    scheduler = BlockScheduler(run, grid_dim, block_dim, None, observer=observer, strict=strict)
    _track = observer is not None
    try:
        with sim_kernel._push_kernel_context(module):
            scheduler.args = [fake_arg(a) for a in args]
            with swapped_cuda_module(run, module):
                for grid_point in np.ndindex(*grid_dim):
                    scheduler.run_block(grid_point)
            for write_back in retr:
                write_back()
    finally:
        _track = False
    return scheduler
