"""racecheck, synccheck and a shared-memory initcheck without a GPU: a Numba kernel's launch in the simulator, its
shared memory watched.

`sanitize_simulated(kernel, grid, block, args, tool="racecheck")` runs one launch in Numba's CUDA simulator
(kernellab.run.sim.sched's scheduler) with every `cuda.shared.array` replaced by a recording array
(kernellab.run.sim.trace). Each shared-memory access is kept with its block, thread, source line, address, and the
thread's place between barriers: how many `syncthreads()` it had passed, and which `syncwarp()`s it had taken part
in. The findings come back as the GPU sanitizer's own result type (kernellab.run.nvtools.sanitize.SanitizerReport and
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
  lockstep (since Volta they need not: compute-sanitizer reports such hazards too, as "(Warp Level Programming)"
  warnings, and `syncwarp()` silences them); warp shuffles and votes do not order shared-memory accesses;
- atomics are left out: racecheck reported no hazard between the plain stores `h[t] = 0` and the `atomic.add`s on the
  same bins of histogram_init_racy (0 hazards, 0 warnings), so the shadow holds plain accesses only. That race is
  real (an add from another warp can land before the store of 0 and be lost): the simulator still finds plain
  accesses that conflict with an atomic, and says so in a note, not a finding. What racecheck does with other mixes
  of atomics and plain accesses was not measured.
The hazard's name follows the order in which the simulator ran the two accesses (threads take turns access by
access, close to a warp's lockstep): a write then a read is RAW, a read then a write WAR, two writes WAW. On a GPU
the order, and so the name, can differ between runs; the pair of lines does not. One finding per pair of lines
(as kernellab merges the GPU tool's hazards), with the first example's threads and address and the number of
hazardous (byte, thread pair) combinations of that pair as its count. compute-sanitizer prints at most
`--print-limit` hazards (100 by default) and drops the rest, pairs of lines included: compare with a report that
printed everything (kernellab.run.nvtools.sanitize notes a cut one).

What counts as a barrier error (synccheck). A GPU releases a `syncthreads()` when every thread of the block that has
not exited has arrived, and synccheck on sm_90, as the golden table shows it, flags a warp whose still-running lanes
do not all take part in the barrier, and a block whose threads wait at different barriers:
- a `syncthreads()` that some threads of a warp wait at while others of that warp are elsewhere: at another barrier
  line, or past the barrier without having reached it (they skipped it and returned at a later line) — "Divergent
  thread(s) in warp", one per waiting thread as compute-sanitizer counts them (divergent_warp_barrier: ptxas
  predicates the barrier of a short `if`, `@!P0 BAR.SYNC`, so the lanes that skip it are still running when the
  others arrive; SASS read from numba-cuda 0.30.4 and ptxas 13.0, the GPU machine's versions);
- threads of the block waiting at different `syncthreads()` lines at once — "Divergent thread(s) in block";
- a `syncwarp()` whose mask names a lane that went past it and returned;
- threads waiting in `syncwarp()` for lanes that wait in `syncthreads()` (the simulator reports the deadlock and
  goes on; on a GPU it hangs).
A thread that returned counts as arrived, with no finding, when
- it returned before the barrier's line (an early `return`, or an `if` around the whole body): early_exit_ok;
- its whole warp returned, no lane of it waiting at the barrier: divergent_block_barrier, clean on the GPU;
- the barrier lies directly in the body of a `for` or `while` loop (not in an `if` inside it) that it left sooner
  than other lanes of its warp: loop_trip_barrier, clean on the GPU. ptxas reaches a loop's barrier through a
  branch and `WARPSYNC.ALL`, which holds the lanes going round again until the lanes that left have exited.
The last two break CUDA's rule for a conditional `syncthreads()` (its condition must be the same for the whole
block), and the report says so in a note. Which case a thread is in is read from the line it returned at, compared
with the barrier's line in the kernel's own body, and from the source around the barrier. The GPU's verdict on lanes
that skip a barrier and exit follows the code ptxas made (a predicated barrier, or a branch and `WARPSYNC.ALL`),
which the simulator does not see: a barrier in a long `if` (ptxas branches around it and adds `WARPSYNC.ALL`) is
flagged here where the GPU may well stay clean (not measured), and a barrier in a device function counts as not
in a loop.

The corpus tests/fixtures/race_corpus.py holds the evidence: tests/golden/racecheck_sm90.csv records
compute-sanitizer's verdicts on every case (tools/gpu/record_racecheck.py), and tests/test_simrace.py checks that
this module gives the same ones.

What counts as an uninitialized read (initcheck, here for shared memory: compute-sanitizer's initcheck watches global
memory, and a GPU's shared memory holds whatever the SM's previous block left there, zeros by chance or not): a
read, or an atomic, of a shared byte that no thread of the block had written before it in this launch, where no
thread stores to that byte between the same two barriers either (a store there, unordered with the read, is a
race: racecheck's finding, not this one). One finding per source line of such reads, with the first example's thread,
block and element, and the number of such reads at that line as its count. This names, say, a flip that reads
`tile[length - t]` one past what a short last chunk stored: on a GPU its output is stale data that changes from
run to run, in the simulator whatever the array held.

Limits: only what this launch did is seen (as with compute-sanitizer), global memory is not checked, and addresses
are the simulator's layout (arrays at 128-byte-aligned offsets in creation order), not the GPU's.
"""
from __future__ import annotations

import ast
import linecache
import math
import re
import time
from collections import defaultdict

import numpy as np

from ...errors import KernellabError
from ..findings import Finding, Location, SanitizerReport, combine
from . import sched as simsched
from .numba_sim import (as_dim3, factory_call, kernel_error, launch_lock, python_function, simulated_device_functions,
                        to_host)
from .trace import Recorder, install_recorder

SIM_TOOLS = ("racecheck", "synccheck", "initcheck")
NOTE = ("found by kernellab's simulator checks (Numba CUDA simulator, no GPU): every shared-memory access and barrier "
        "of this launch, in compute-sanitizer's terms; see kernellab.run.sim.race for the rules")
_ACCESS = {"load": "Read", "store": "Write", "atomic": "Atomic"}
_GOLDEN = "compute-sanitizer 2025.3.1 on an H100, checked on kernellab's race corpus"
UNREPORTED_RACE = f"a race racecheck does not report ({_GOLDEN}), so neither does this check"
UNREPORTED_BARRIER = f"a barrier misuse synccheck does not report on sm_90 ({_GOLDEN}), so neither does this check"
INITCHECK_SCOPE = ("initcheck in the simulator watches shared memory (reads of bytes no thread of the block wrote); "
                   "compute-sanitizer's initcheck, on a GPU, watches global memory")
_SHARED_NAME = re.compile(r"(\w+)\s*=\s*cuda\.shared\.array\s*\(")


def sim_tools(tool: str) -> tuple[tuple[str, ...], list[str]]:
    """The simulator checks a `tool` argument asks for, and notes (e.g. for 'all')."""
    if tool == "all":
        return SIM_TOOLS, ["memcheck needs a GPU (compute-sanitizer); in the simulator an out-of-bounds index raises "
                           "IndexError at its line", INITCHECK_SCOPE]
    tools = tuple(t.strip() for t in str(tool).split("+"))
    for t in tools:
        if t == "memcheck":
            raise KernellabError("memcheck runs under compute-sanitizer on a GPU; without one, tool='racecheck', "
                                 "'synccheck' and 'initcheck' (shared memory) run in the simulator (an out-of-bounds "
                                 "index already raises IndexError there, naming its line, thread and block)")
        if t not in SIM_TOOLS:
            raise ValueError(f"unknown tool {t!r}; in the simulator: racecheck, synccheck, initcheck (shared "
                             f"memory), joined with '+', or all")
    return tools, [INITCHECK_SCOPE] if "initcheck" in tools else []


def sanitize_simulated(kernel, grid, block, args, *, tool: str = "racecheck", shared_bytes: int = 0,
                       line_offset: int = 0, line_label: str = "line", name: str | None = None) -> SanitizerReport:
    """Run `kernel[grid, block](*args)` in the simulator and report races (racecheck), barrier errors (synccheck) and
    reads of shared memory no thread wrote (initcheck).

    `kernel`: a `@cuda.jit` kernel, its Python function or a NumbaKernel; `args`: NumPy arrays, torch tensors and
    numbers (not modified: the launch runs on copies). `tool`: 'racecheck', 'synccheck', 'initcheck', several
    joined with '+', or 'all' (the three). Lines are the kernel file's (plus `line_offset`). A Python exception in a thread ends the launch:
    its findings so far come back, with the error in the notes and `job_status` 'error'.
    """
    tools, notes = sim_tools(tool)
    py_func = python_function(kernel)
    grid3, block3 = as_dim3(grid), as_dim3(block)
    host, _ = to_host(args)
    host = [np.array(h, copy=True) if isinstance(h, np.ndarray) else h for h in host]
    recorder = _RaceRecorder()
    observer = _BarrierObserver(block3)
    status = "ok"
    t0 = time.perf_counter()
    try:
        with launch_lock, simulated_device_functions(py_func):
            simsched.launch(py_func, grid3, block3, host, dynamic_smem_bytes=shared_bytes,
                            extensions=getattr(kernel, "extensions", ()) or (),
                            function_for=factory_call(kernel), observer=observer, strict=False,
                            module_hook=lambda module: install_recorder(module, recorder))
    except Exception as exc:
        err = kernel_error(exc, py_func, grid3, block3, line_offset, line_label)
        status = "error"
        notes.append(f"the launch itself: {str(err).splitlines()[0]}")
    wall_ms = (time.perf_counter() - t0) * 1e3
    places = _Places(py_func, name or py_func.__name__, line_offset, recorder.allocations)
    reports, unreported_by = [], {}
    for t in tools:
        if t == "racecheck":
            findings, unreported = _races(recorder.events, observer.warp_syncs, block3, places)
        elif t == "initcheck":
            findings, unreported = _uninitialized(recorder.events, block3, places), []
        else:
            findings, unreported = observer.findings(places), observer.unreported()
        unreported_by[t] = unreported
        count = sum(f.count for f in findings)
        reports.append(SanitizerReport(tool=t, kernel=places.kernel, findings=tuple(findings), error_count=count,
                                       notes=tuple([NOTE] + notes + unreported), exit_code=None,
                                       job_status=status, wall_ms=wall_ms, simulated=True))
    if len(reports) == 1:
        return reports[0]
    both = combine(reports)
    shared = len(reports[0].notes) - len(unreported_by[reports[0].tool])    # NOTE and the launch's notes
    return SanitizerReport(**{**both.__dict__, "notes": reports[0].notes[:shared] + tuple(
        n for r in reports for n in unreported_by[r.tool]), "exit_code": None})


# ---------------------------------------------------------------------------------------------------------------------
# Recording


class _RaceRecorder(Recorder):
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
        self._unreported: dict[tuple, str] = {}             # (what, file, line) -> note: misuse synccheck misses
        self._loops: dict[tuple, bool] = {}                 # barrier site -> whether a loop's body holds it

    # hooks called by kernellab.run.sim.sched
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
            if away and len(sites) == 1 and self._in_loop(lanes[0].site):
                self._note("left", sites, f"{_who(away, 'thread')} of warp {w} returned at line "
                           f"{_returned_at(away)} while {_who(lanes, 'thread')} wait at the syncthreads() of line "
                           f"{lanes[0].site[1]}, in a loop that they go round more often (ptxas puts WARPSYNC.ALL "
                           f"before a loop's barrier: the lanes that left have exited when the others arrive)")
                away = []
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
        if len(sites) > 1:
            for site in sorted(sites, key=lambda s: s[1]):
                at = [t for t in waiting if t.site == site]
                others = [t for t in threads if t not in at]
                self._add("barrier", "Barrier error detected. Divergent thread(s) in block", site, at[:1], scheduler,
                          f"{_who(at, 'thread')} wait at this syncthreads(); {_elsewhere(others)}", count=len(at))
            return
        skipped = [t for t in threads if t.done and t.warp not in warps and _went_past(t, first_line)]
        if skipped:
            self._note("skipped", sites, f"{_elsewhere(skipped)} while {_who(waiting, 'thread')} wait at the "
                       f"syncthreads() of line {waiting[0].site[1]} (a GPU counts threads that exited as arrived)")

    def _in_loop(self, site) -> bool:
        """Whether the barrier at `site` (file, line) sits directly in the body of a `for` or `while` loop."""
        known = self._loops.get(site)
        if known is None:
            known = self._loops[site] = _in_loop_body(*site) if site else False
        return known

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
    def _note(self, what, sites, text) -> None:
        """Keep the first note of its kind per barrier: a barrier misuse that synccheck does not report."""
        site = min(sites, key=lambda s: (s or ("", 0))[1]) or ("", 0)
        self._unreported.setdefault((what,) + tuple(site), text)

    def unreported(self) -> list[str]:
        """Notes on barriers that break CUDA's rule (every thread of the block reaches a syncthreads() or none) in ways
        compute-sanitizer's synccheck does not report on sm_90."""
        return [f"{UNREPORTED_BARRIER}: {text}; CUDA allows syncthreads() in conditional code only where the "
                f"condition is the same for the whole block" for _key, text in sorted(self._unreported.items(),
                                                                                       key=lambda kv: kv[0][2])]

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


def _in_loop_body(filename: str, line: int) -> bool:
    """Whether the statement at `line` of `filename` lies directly in a `for` or `while` body (not in an `if` in it);
    False where the source cannot be read or parsed."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return False

    def holder(node):
        for field in ("body", "orelse", "finalbody", "handlers"):
            for stmt in getattr(node, field, None) or ():
                if not isinstance(stmt, ast.AST) or not stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                    continue
                inner = holder(stmt)
                if inner is not None:
                    return inner
                return (node, field) if stmt.lineno == line or not hasattr(stmt, "body") else None
        return None

    found = holder(tree)
    return found is not None and isinstance(found[0], (ast.For, ast.While)) and found[1] == "body"


def _returned_at(threads) -> str:
    lines = sorted({t.frame.f_lineno for t in threads if t.frame is not None})
    return ", ".join(str(n) for n in lines) or "?"


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


def _races(events, warp_syncs, block3, places: "_Places") -> tuple[list[Finding], list[str]]:
    """One Finding per pair of source lines with unordered conflicting accesses (see the module docstring), and a
    note per pair of lines where a plain access and an atomic conflict (a race that racecheck does not report)."""
    if not events:
        return [], []
    unit = 0
    for e in events:
        unit = math.gcd(unit, e[5])
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (blk, _tid, epoch, _wc, _kind, width, addr, _f, _l) in enumerate(events):
        for u in range(addr // unit, (addr + width) // unit):
            groups[(blk, epoch, u)].append(i)
    found: dict[tuple, dict] = {}            # pairs of lines racecheck reports
    unreported: dict[tuple, dict] = {}       # pairs of lines where a plain access races with an atomic

    def check(a, b, unit_address, into):
        if a[1] == b[1]:
            return
        same_warp = a[1] // 32 == b[1] // 32
        if same_warp and _ordered(a, b, warp_syncs):
            return
        lines = tuple(sorted(((a[7], a[8]), (b[7], b[8]))))
        entry = into.get(lines)
        if entry is None:
            into[lines] = {"first": a, "second": b, "address": unit_address, "count": 1, "same_warp": same_warp}
        else:
            entry["count"] += 1

    def shadow(idxs, u, keep):
        """Each access against the byte's shadow (its last write and the reads since); `keep(a, b)` picks pairs."""
        last_write, reads = None, []
        for i in idxs:
            e = events[i]
            if e[4] == "load":
                if last_write is not None:
                    keep(last_write, e, u * unit)
                reads.append(e)
                continue
            if last_write is not None and not (last_write[4] == "atomic" and e[4] == "atomic"):
                keep(last_write, e, u * unit)
            for r in reads:
                keep(r, e, u * unit)
            last_write, reads = e, []

    for (_blk, _epoch, u), idxs in groups.items():
        if len(idxs) < 2:
            continue
        plain = [i for i in idxs if events[i][4] != "atomic"]
        shadow(plain, u, lambda a, b, addr: check(a, b, addr, found))
        if len(plain) < len(idxs) and plain:
            shadow(idxs, u, lambda a, b, addr: check(a, b, addr, unreported)
                   if "atomic" in (a[4], b[4]) and a[4] != b[4] else None)
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
    notes = []
    for lines, e in sorted(unreported.items(), key=lambda kv: (kv[0][0][1], kv[0][1][1])):
        a, b = e["first"], e["second"]
        notes.append(f"{UNREPORTED_RACE}: {_ACCESS[a[4]]} at {places.location(a[7], a[8])} and {_ACCESS[b[4]]} at "
                     f"{places.location(b[7], b[8])} touch {places.element(e['address'], a[5])} with no "
                     f"syncthreads() between them ({e['count']:,} times); a plain access racing with an atomic is "
                     f"still a data race")
    return out, notes


# ---------------------------------------------------------------------------------------------------------------------
# Uninitialized reads


def _uninitialized(events, block3, places: "_Places") -> list[Finding]:
    """One Finding per source line that reads (or atomically updates) shared bytes no thread of the block had
    written before, in the simulator's order, and that no thread writes between the same two barriers."""
    written: dict[tuple, set] = defaultdict(set)              # block -> bytes written so far
    unordered: dict[tuple, set] = defaultdict(set)            # (block, epoch) -> bytes stored in that epoch
    for blk, _tid, epoch, _wc, kind, width, addr, _f, _l in events:
        if kind == "store":                                    # (atomics do not race with one another)
            unordered[(blk, epoch)].update(range(addr, addr + width))
    found: dict[tuple, dict] = {}
    for e in events:
        blk, _tid, epoch, _wc, kind, width, addr, filename, line = e
        if kind != "store":
            seen, racy = written[blk], unordered[(blk, epoch)]
            missing = next((b for b in range(addr, addr + width) if b not in seen and b not in racy), None)
            if missing is not None:
                entry = found.setdefault((filename, line), {"event": e, "address": missing, "count": 0})
                entry["count"] += 1
        if kind != "load":
            written[blk].update(range(addr, addr + width))
    out = []
    for (filename, line), entry in sorted(found.items(), key=lambda kv: kv[0][1]):
        blk, tid, _epoch, _wc, kind, width, addr, _f, _l = entry["event"]
        what = "atomic update" if kind == "atomic" else "read"
        out.append(Finding(tool="initcheck", kind="uninitialized_read",
                           message=f"Uninitialized __shared__ memory {what} of size {width} bytes",
                           where=places.location(filename, line), thread=_thread_idx(tid, block3), block=tuple(blk),
                           address=hex(entry["address"]), size_bytes=width, access=_ACCESS[kind],
                           detail=f"{places.element(entry['address'], 1)}: no thread of the block wrote it before "
                                  f"this {what} (shared memory is not zeroed at launch)", count=entry["count"]))
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
