"""racecheck and synccheck without a GPU: a Numba kernel's launch in the simulator, its shared memory watched.

`sanitize_simulated(kernel, grid, block, args, tool="racecheck")` runs one launch in Numba's CUDA simulator
(kernellab.run.simsched's scheduler) with every `cuda.shared.array` replaced by a recording array
(kernellab.run.simtrace). Each shared-memory access is kept with its block, thread, source line, address, and the
thread's place between barriers: how many `syncthreads()` it had passed, and which `syncwarp()`s it had taken part
in. The findings come back as the GPU sanitizer's own result type (kernellab.run.sanitize.SanitizerReport and
Finding), so they print, render and serialise the same way, and a program reads them the same way:
`finding.kind` ("race", "barrier", "deadlock"), `finding.hazard` ("RAW", "WAR", "WAW"), `finding.lines`,
`finding.thread` / `finding.other_thread` (threadIdx), `finding.block`, `finding.address`.

What counts as a race (racecheck), as compute-sanitizer's racecheck defines a hazard:
- two accesses to the same shared-memory byte by different threads of one block, at least one of them a write,
  with nothing but reads between them: each byte keeps a shadow of its last write and the reads since, and each new
  access is checked against that shadow (as a shadow-memory checker does), so a read is paired with the write it
  reads from, and a write with the write and the reads it replaces;
- not ordered by a barrier: no `syncthreads()` (or `_count`/`_and`/`_or`) between them, and, for two threads of the
  same warp, no `syncwarp()` that both took part in between them. Threads of one warp are not assumed to run in
  lockstep (since Volta they need not: compute-sanitizer reports such hazards too, and `syncwarp()` silences them);
  warp shuffles and votes do not order shared-memory accesses;
- two atomics never race with each other; an atomic and a plain read or write of the same element do.
The hazard's name follows the order in which the simulator ran the two accesses (threads take turns access by
access, close to a warp's lockstep): a write then a read is RAW, a read then a write WAR, two writes WAW. On a GPU
the order, and so the name, can differ between runs; the pair of lines does not. One finding per pair of lines
(as kernellab merges the GPU tool's hazards), with the first example's threads and address and the number of
hazardous (byte, thread pair) combinations of that pair as its count.

What counts as a barrier error (synccheck):
- a `syncthreads()` that some threads of a warp wait at while others of that warp are elsewhere: at another barrier
  line, or past the barrier (returned at a later line) — "Divergent thread(s) in warp", one per waiting thread as
  compute-sanitizer counts them;
- a `syncthreads()` that whole warps of the block skip while others wait at it — "Divergent thread(s) in block";
- a `syncwarp()` whose mask names a lane that went past it and returned;
- threads waiting in `syncwarp()` for lanes that wait in `syncthreads()` (the simulator reports the deadlock and
  goes on; on a GPU it hangs).
A thread that returned *before* the barrier's line (an early `return`, or an `if` around the whole body) is not
divergent: a GPU counts threads that exited as arrived. Which of the two a thread did is read from the line it
returned at, compared with the barrier's line in the kernel's own body.

Limits: only what this launch did is seen (as with compute-sanitizer), global memory is not checked, and addresses
are the simulator's layout (arrays at 128-byte-aligned offsets in creation order), not the GPU's.
"""
from __future__ import annotations

import linecache
import math
import re
import time
from collections import defaultdict

import numpy as np

from ..errors import KernellabError
from . import simsched
from .sanitize import Finding, Location, SanitizerReport, combine
from .simtrace import _Recorder

SIM_TOOLS = ("racecheck", "synccheck")
NOTE = ("found by kernellab's simulator checks (Numba CUDA simulator, no GPU): every shared-memory access and barrier "
        "of this launch, in compute-sanitizer's terms; see kernellab.run.simrace for the rules")
_ACCESS = {"load": "Read", "store": "Write", "atomic": "Atomic"}
_SHARED_NAME = re.compile(r"(\w+)\s*=\s*cuda\.shared\.array\s*\(")


def sim_tools(tool: str) -> tuple[tuple[str, ...], list[str]]:
    """The simulator checks a `tool` argument asks for, and notes (e.g. for 'all')."""
    if tool == "all":
        return SIM_TOOLS, ["memcheck and initcheck need a GPU (compute-sanitizer); in the simulator an out-of-bounds "
                           "index raises IndexError at its line"]
    tools = tuple(t.strip() for t in str(tool).split("+"))
    for t in tools:
        if t in ("memcheck", "initcheck"):
            raise KernellabError(f"{t} runs under compute-sanitizer on a GPU; without one, tool='racecheck' and "
                                 f"tool='synccheck' run in the simulator (an out-of-bounds index already raises "
                                 f"IndexError there, naming its line, thread and block)")
        if t not in SIM_TOOLS:
            raise ValueError(f"unknown tool {t!r}; in the simulator: racecheck, synccheck, racecheck+synccheck or all")
    return tools, []


def sanitize_simulated(kernel, grid, block, args, *, tool: str = "racecheck", shared_bytes: int = 0,
                       line_offset: int = 0, line_label: str = "line", name: str | None = None) -> SanitizerReport:
    """Run `kernel[grid, block](*args)` in the simulator and report races (racecheck) and barrier errors (synccheck).

    `kernel`: a `@cuda.jit` kernel, its Python function or a NumbaKernel; `args`: NumPy arrays, torch tensors and
    numbers (not modified: the launch runs on copies). `tool`: 'racecheck', 'synccheck', 'racecheck+synccheck' or
    'all' (both). Lines are the kernel file's (plus `line_offset`). A Python exception in a thread ends the launch:
    its findings so far come back, with the error in the notes and `job_status` 'error'.
    """
    from . import numba_sim
    from .simtrace import _launch_lock, _python_function, _simulated_device_functions, install_recorder

    tools, notes = sim_tools(tool)
    py_func = _python_function(kernel)
    grid3, block3 = numba_sim._dim3(grid), numba_sim._dim3(block)
    host, _ = numba_sim.to_host(args)
    host = [np.array(h, copy=True) if isinstance(h, np.ndarray) else h for h in host]
    recorder = _RaceRecorder()
    observer = _BarrierObserver(block3)
    status = "ok"
    t0 = time.perf_counter()
    try:
        with _launch_lock, _simulated_device_functions(py_func):
            simsched.launch(py_func, grid3, block3, host, dynamic_smem_bytes=shared_bytes,
                            extensions=getattr(kernel, "extensions", ()) or (),
                            function_for=numba_sim.factory_call(kernel), observer=observer, strict=False,
                            module_hook=lambda module: install_recorder(module, recorder))
    except Exception as exc:
        err = numba_sim.kernel_error(exc, py_func, grid3, block3, line_offset, line_label)
        status = "error"
        notes.append(f"the launch itself: {str(err).splitlines()[0]}")
    wall_ms = (time.perf_counter() - t0) * 1e3
    places = _Places(py_func, name or py_func.__name__, line_offset, recorder.allocations)
    reports = []
    for t in tools:
        if t == "racecheck":
            findings = _races(recorder.events, observer.warp_syncs, block3, places)
        else:
            findings = observer.findings(places)
        count = sum(f.count for f in findings)
        reports.append(SanitizerReport(tool=t, kernel=places.kernel, findings=tuple(findings), error_count=count,
                                       notes=tuple([NOTE] + notes), exit_code=None, job_status=status,
                                       wall_ms=wall_ms, simulated=True))
    if len(reports) == 1:
        return reports[0]
    both = combine(reports)
    return SanitizerReport(**{**both.__dict__, "notes": reports[0].notes, "exit_code": None})


# ---------------------------------------------------------------------------------------------------------------------
# Recording


class _RaceRecorder(_Recorder):
    """Shared-memory accesses with the thread's barrier position; gives the turn away after each one."""

    def record(self, kind: str, width: int, address: int) -> None:
        t = simsched.current()
        if t.frame is None:
            simsched.note_frame(t)
        frame = simsched.user_frame(1)
        self.events.append((t.scheduler.block_idx, t.thread_id, t.epoch, len(t.warp_syncs), kind, width, address,
                            frame.f_code.co_filename, frame.f_lineno))
        simsched.yield_turn()


class _BarrierObserver:
    """Sees each barrier release of a launch; keeps the synccheck findings and each thread's syncwarp() meetings."""

    def __init__(self, block3):
        self.block3 = block3
        self.warp_syncs: dict[tuple, list[int]] = {}      # (block, thread id) -> syncwarp() meeting ids
        self._found: dict[tuple, dict] = {}                 # (kind, message, file, line) -> finding fields

    # hooks called by kernellab.run.simsched
    def block_barrier(self, scheduler, waiting) -> None:
        threads = scheduler.threads
        warps: dict[int, list] = defaultdict(list)
        for t in waiting:
            warps[t.warp].append(t)
        first_line = min((t.kernel_line for t in waiting if t.kernel_line is not None), default=None)
        warp_level = False
        for w, lanes in sorted(warps.items()):
            members = threads[w * 32:(w + 1) * 32]
            sites = {t.site for t in lanes}
            line = min((t.kernel_line for t in lanes if t.kernel_line is not None), default=None)
            away = [m for m in members if m.done and _went_past(m, line)]
            if len(sites) == 1 and not away:
                continue
            warp_level = True
            for site in sorted(sites, key=lambda s: s[1]):
                at = [t for t in lanes if t.site == site]
                others = [m for m in members if m not in at]
                self._add("barrier", "Barrier error detected. Divergent thread(s) in warp", site, at, scheduler,
                          f"{_who(at, 'thread')} of warp {w} wait at this syncthreads(); {_elsewhere(others)}")
        if warp_level:
            return
        sites = {t.site for t in waiting}
        skipped = [t for t in threads if t.done and _went_past(t, first_line)]
        if len(sites) > 1 or skipped:
            for site in sorted(sites, key=lambda s: s[1]):
                at = [t for t in waiting if t.site == site]
                others = [t for t in threads if t not in at]
                self._add("barrier", "Barrier error detected. Divergent thread(s) in block", site, at[:1], scheduler,
                          f"{_who(at, 'thread')} wait at this syncthreads(); {_elsewhere(others)}", count=len(at))

    def warp_barrier(self, scheduler, lanes, members) -> None:
        line = min((t.kernel_line for t in lanes if t.kernel_line is not None), default=None)
        away = [m for m in members if m.done and _went_past(m, line)]
        if away:
            site = lanes[0].site
            self._add("barrier", "Barrier error detected. Divergent thread(s) in warp", site, lanes, scheduler,
                      f"syncwarp(): its mask names {_who(away, 'lane', lane=True)}, which "
                      f"{'has' if len(away) == 1 else 'have'} gone past it and returned")

    def deadlock(self, scheduler, waiting, blocked, text) -> None:
        self._add("deadlock", "Deadlock: syncwarp() or a warp function waits for lanes that wait in syncthreads()",
                  waiting.site, [waiting], scheduler, text)

    def block_done(self, scheduler) -> None:
        for t in scheduler.threads:
            if t.warp_syncs:
                self.warp_syncs[(scheduler.block_idx, t.thread_id)] = t.warp_syncs

    # findings
    def _add(self, kind, message, site, threads, scheduler, detail, count=None) -> None:
        key = (kind, message) + tuple(site or ("", 0))
        entry = self._found.get(key)
        n = len(threads) if count is None else count
        if entry is None:
            self._found[key] = {"kind": kind, "message": message, "site": site, "count": n, "detail": detail,
                                "thread": tuple(threads[0].threadIdx) if threads else None,
                                "block": scheduler.block_idx}
        else:
            entry["count"] += n

    def findings(self, places: "_Places") -> list[Finding]:
        out = []
        for e in sorted(self._found.values(), key=lambda e: (e["site"] or ("", 0))[1]):
            where = places.location(*e["site"]) if e["site"] else Location(function=places.kernel)
            out.append(Finding(tool="synccheck", kind=e["kind"], message=e["message"], where=where,
                               thread=e["thread"], block=e["block"], detail=e["detail"], count=e["count"]))
        return out


def _went_past(t, line) -> bool:
    """Whether thread `t`, which returned, returned at or after `line` of the kernel (rather than before it)."""
    if line is None or t.frame is None:
        return False
    return t.frame.f_lineno >= line


def _who(threads, word: str, lane: bool = False) -> str:
    ids = sorted((t.lane if lane else t.thread_id) for t in threads)
    return f"{word}{'s' if len(ids) != 1 else ''} {_ranges(ids)}"


def _elsewhere(others) -> str:
    if not others:
        return "every other thread too"
    waiting = [t for t in others if not t.done and t.site is not None]
    gone = [t for t in others if t.done]
    parts = []
    by_line: dict[int, list] = defaultdict(list)
    for t in waiting:
        by_line[t.site[1]].append(t)
    for line, ts in sorted(by_line.items()):
        parts.append(f"{_who(ts, 'thread')} wait at the barrier of line {line}")
    returned: dict = defaultdict(list)
    for t in gone:
        returned[t.frame.f_lineno if t.frame is not None else None].append(t)
    for line, ts in sorted(returned.items(), key=lambda kv: kv[0] or 0):
        parts.append(f"{_who(ts, 'thread')} returned" + (f" at line {line}" if line else ""))
    return "; ".join(parts) if parts else "the others are elsewhere"


def _ranges(ids) -> str:
    """'0-15, 20' from [0, 1, ..., 15, 20]."""
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    if len(out) > 6:
        return f"{', '.join(out[:3])}, ..., {out[-1]} ({len(ids)} in all)"
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# Races


def _races(events, warp_syncs, block3, places: "_Places") -> list[Finding]:
    """One Finding per pair of source lines with unordered conflicting accesses (see the module docstring)."""
    if not events:
        return []
    unit = 0
    for e in events:
        unit = math.gcd(unit, e[5])
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (blk, _tid, epoch, _wc, _kind, width, addr, _f, _l) in enumerate(events):
        for u in range(addr // unit, (addr + width) // unit):
            groups[(blk, epoch, u)].append(i)
    found: dict[tuple, dict] = {}

    def check(a, b, unit_address):
        if a[1] == b[1]:
            return
        same_warp = a[1] // 32 == b[1] // 32
        if same_warp and _ordered(a, b, warp_syncs):
            return
        lines = tuple(sorted(((a[7], a[8]), (b[7], b[8]))))
        entry = found.get(lines)
        if entry is None:
            found[lines] = {"first": a, "second": b, "address": unit_address, "count": 1, "same_warp": same_warp}
        else:
            entry["count"] += 1

    for (_blk, _epoch, u), idxs in groups.items():
        if len(idxs) < 2:
            continue
        last_write, reads = None, []          # the byte's shadow: its last write and the reads since
        for i in idxs:
            e = events[i]
            if e[4] == "load":
                if last_write is not None:
                    check(last_write, e, u * unit)
                reads.append(e)
                continue
            if last_write is not None and not (last_write[4] == "atomic" and e[4] == "atomic"):
                check(last_write, e, u * unit)
            for r in reads:
                check(r, e, u * unit)
            last_write, reads = e, []
    out = []
    for lines, e in sorted(found.items(), key=lambda kv: (kv[0][0][1], kv[0][1][1])):
        a, b = e["first"], e["second"]
        kind = "RAW" if a[4] != "load" and b[4] == "load" else "WAR" if a[4] == "load" else "WAW"
        order = ("threads of one warp, and no syncwarp() or syncthreads() orders these accesses" if e["same_warp"]
                 else "no syncthreads() orders these accesses")
        out.append(Finding(tool="racecheck", kind="race", message=f"shared-memory data race ({kind} hazard)",
                           where=places.location(a[7], a[8]), other=places.location(b[7], b[8]),
                           access=_ACCESS[a[4]], other_access=_ACCESS[b[4]], thread=_thread_idx(a[1], block3),
                           other_thread=_thread_idx(b[1], block3), block=tuple(a[0]), address=hex(e["address"]),
                           size_bytes=a[5], detail=f"{places.element(e['address'], a[5])}; {order}",
                           count=e["count"]))
    return out


def _ordered(a, b, warp_syncs) -> bool:
    """Whether a syncwarp() that both threads took part in lies after access `a` and before access `b`."""
    after_a = warp_syncs.get((a[0], a[1]), [])[a[3]:]
    before_b = warp_syncs.get((b[0], b[1]), [])[:b[3]]
    return bool(after_a) and bool(before_b) and not set(after_a).isdisjoint(before_b)


def _thread_idx(tid: int, block3) -> tuple[int, int, int]:
    bx, by, _ = block3
    return tid % bx, (tid // bx) % by, tid // (bx * by)


class _Places:
    """Source locations and shared-array elements, named as the user sees them."""

    def __init__(self, py_func, kernel: str, line_offset: int, allocations):
        self.kernel = kernel
        self.kernel_file = py_func.__code__.co_filename
        self.line_offset = line_offset
        self.allocations = allocations      # (filename, line, shape, dtype, base, nbytes, dynamic)

    def location(self, filename: str, line: int) -> Location:
        own = filename == self.kernel_file
        shown = line + self.line_offset if own else line
        source = linecache.getline(filename, line).rstrip("\n")
        return Location(function=self.kernel, file=filename, line=shown, cell_line=shown if own else None,
                        source_line=source or None)

    def element(self, address: int, width: int) -> str:
        """'tile[3, 5] (the shared array of line 4)' for a byte address in the simulator's shared-memory layout."""
        for filename, line, shape, dtype, base, nbytes, dynamic in self.allocations:
            if base <= address < base + max(nbytes, 1):
                own = filename == self.kernel_file
                shown = line + self.line_offset if own else line
                if dynamic:
                    return f"byte {address - base} of the dynamic shared memory (line {shown})"
                m = _SHARED_NAME.search(linecache.getline(filename, line))
                name = m.group(1) if m else "shared"
                itemsize = np.dtype(dtype).itemsize
                index = np.unravel_index((address - base) // itemsize, shape)
                return f"{name}[{', '.join(str(int(i)) for i in index)}] (the shared array of line {shown})"
        return f"shared byte {address}"
