"""The grader: what `kernellab.grade(id, kernel)` runs, and how it turns what it sees into findings with hints.

In order, stopping early only where nothing further can run:
1. The kernel object: a Kernel (or the cell's module holding it) of the exercise's kind, with the expected parameters.
2. What the compiler says, no GPU needed: compiled for the tutorial's arch, no spills, no local memory, and in its
   SASS a global store, shared loads and stores where the task needs a tile (LDS/STS), a barrier where it needs one
   (BAR.SYNC), and the exercise's own instructions (e.g. LDG.E.128); the PTX reads each guard parameter (`n`).
3. Running it, on a GPU (each launch isolated in a worker, so a fault cannot end the notebook's CUDA context) or, for
   Numba kernels without one, in the simulator: fresh random inputs for every problem shape and launch configuration,
   the outputs filled with a marked NaN so that unwritten elements show, each output compared with the reference.
4. On a GPU, compute-sanitizer on one awkward shape: memcheck, and racecheck and synccheck where the task has shared
   memory or barriers; in the simulator, its race detector and barrier check (`k.sanitize(...,
   tool="racecheck+synccheck")`, kernellab.run.sim.race) where the task has them, and its shared-memory initcheck
   where the task has shared memory (a read of a tile element no thread stored).
5. The optional speed bar (GPU only), once everything else passed.
Before all that, the spec's own sanity: on the same shapes, an all-zero answer and an input-copy answer must fail.
A wrong kernel never raises: every problem becomes a finding, and the verdict is failed.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import resource
import secrets
import time
import traceback
import warnings

import numpy as np

from ..analysis.arch import base_arch
from ..compile import numba_backend as nb
from ..compile.signature import parse_param
from ..errors import KernellabError, NoGPUError
from ..kernel import Kernel, KernelCollection
from ..kernel_numba import numba_kernel
from ..run.launch import device as _device
from ..run.launch.worker import IsolatedLaunchError
from ..run.measure.bench import bench
from ..run.nvtools import sanitize_pool as _sanitize_pool
from ..run.nvtools.sanitize import ToolNotFoundError
from ..run.sim.cuda import cpu as _cpu_path
from ..run.sim.numba_sim import SimulatedKernelError, SimulatorNotice
from . import compare as _cmp
from .result import Check, Finding, GradeResult, Speed
from .spec import Exercise, dim3

# Hints by finding kind: what usually causes it and how to fix it. An exercise's own hints take precedence.
DEFAULT_HINTS = {
    "no_kernel": "run the exercise's %%cuda cell (or its Numba cell) first, then pass the kernel it defines",
    "compile_error": "the cell does not compile (or, for a Numba cell, raised as Python): the first error is "
                     "quoted; fix it and run the cell again",
    "wrong_kind": "this exercise wants the kernel its stub cell defines: keep the stub's magic and kernel name",
    "signature": "keep the stub's parameter list: the grader launches the kernel with those arguments",
    "arch": "compile for the tutorial's arch: %%cuda --arch sm_90 (the default where there is no GPU)",
    "spills": "registers spill to local memory: fewer live values per thread, or a smaller unrolled loop",
    "local_memory": "a per-thread array indexed at run time lives in (slow) local memory: index it with constants "
                    "or keep the values in registers",
    "no_store": "the kernel never writes its output: replace the `// TODO` with the body",
    "missing_guard": "the grid is rounded up to whole blocks, so some threads fall past the end: guard them",
    "no_shared": "the task goes through a `__shared__` tile: stage the data there and read it back",
    "missing_barrier": "a `__syncthreads()` is missing between the shared-memory write and the read: without it a "
                       "thread may read a tile element before the thread that writes it has",
    "out_of_bounds": "guard the access: threads past the end of the data must not read or write",
    "misaligned": "a wide (vector) access needs an address aligned to its size: handle the unaligned tail with "
                  "scalar accesses",
    "race": "a `__syncthreads()` is missing between the shared-memory write and the read",
    "uninitialized": "a thread reads a shared-memory element that no thread stored: keep the reads inside what the "
                     "writes cover (on a short last block too), or store every element the reads can reach",
    "barrier": "every thread of the block must reach each `__syncthreads()`: do not put it inside a branch that "
               "only some threads take (guard the memory accesses instead)",
    "fault": "the kernel faulted: the memcheck finding beside this one names the line",
    "timeout": "the kernel did not finish: an endless loop, or a barrier not every thread reaches?",
    "unwritten": "every output element needs one thread that writes it: check the index covers the whole output "
                 "(and the grid covers every element)",
    "wrong_values": "compare your index arithmetic with the reference on a small shape by hand",
    "off_by_one": "check the index at both ends: the first and the last element",
    "zero_output": "the output is all zeros: is the result stored to the output argument?",
    "input_copy": "the output is the input unchanged: the index mapping is missing",
    "launch_config": "the kernel must work for every block size the grader tries: use blockDim, not a constant",
    "input_mutated": "inputs are read-only: write results only to the output arguments",
    "nondeterministic": "initialise everything you read: a value left in memory by an earlier run is not an input",
    "cached_result": "compute on every launch: no `__device__` state that skips the work after the first",
    "impossible_speed": "check the kernel writes its whole output; a time below the roofline means work was skipped",
    "timer_patched": "leave the timing alone: the grader measures the kernel, not Python",
    "other_stream": "launch on the current stream: work elsewhere escapes the timing",
    "background_thread": "do the work before returning: threads left running escape the timing",
    "l2_persistence": "leave the L2 persistence settings alone: the grader flushes the cache before each launch",
    "error": "the kernel raised in the simulator: the line is named above",
    "spec": "this is a bug in the exercise, not in your kernel: please report it",
    "internal": "this is a bug in the grader, not (necessarily) in your kernel: please report it",
}

_STORE = re.compile(r"\b(STG|REDG|RED|ATOMG|ATOM|ST)\.")   # REDG: sm_90's global reduction (atomicAdd, result unused)
_LOCAL = re.compile(r"\b(LDL|STL)\b")
_SHARED_STORE = re.compile(r"\bSTS\b")
_SHARED_LOAD = re.compile(r"\b(LDS|LDSM)\b")
_BARRIER = re.compile(r"\bBAR\.(SYNC|RED|ARV)")

# The order findings are shown in: the most specific cause first. A finding that names the cell lines (a race, an
# out-of-bounds access, a barrier not every thread reaches) comes before what the compiled code lacks (no barrier,
# no guard), and both before the symptoms (wrong or unwritten values), which then follow from the cause above.
_CAUSE_FIRST = {"spec": 0, "internal": 0, "no_kernel": 0, "wrong_kind": 0, "signature": 0,
                "race": 1, "barrier": 1, "uninitialized": 1, "out_of_bounds": 1, "misaligned": 1, "error": 1,
                "fault": 2, "timeout": 2,
                "unwritten": 4, "wrong_values": 4, "off_by_one": 4, "zero_output": 4, "input_copy": 4,
                "launch_config": 4}          # anything else (compile-level findings): 3
_BARRIER_KINDS = ("race", "barrier", "missing_barrier", "uninitialized")
_SYMPTOMS = ("unwritten", "wrong_values", "off_by_one", "zero_output", "input_copy")


class ExerciseError(KernellabError, KeyError):
    """No exercise of that id: the message lists the ids there are."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return self.args[0] if self.args else ""


def grade(ex: Exercise, kernel, *, seed: int | None = None, speed: bool = True) -> GradeResult:
    """Grade `kernel` against exercise `ex` (see the module docstring); never raises for a wrong kernel."""
    g = _Grading(ex, seed)
    cpu0 = _cpu_seconds()
    try:
        g.run(kernel, speed)
    except Exception as exc:   # a grader bug: a failed verdict that says so, never a stopped notebook
        g.add("internal", f"the grader failed: {type(exc).__name__}: {exc}")
        g.notes.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2000:])
    cpu1 = _cpu_seconds()
    g.stage_s["cpu: this process"] = cpu1[0] - cpu0[0]
    g.stage_s["cpu: this process, in the kernel (system)"] = cpu1[2] - cpu0[2]
    g.stage_s["cpu: tools' processes"] = cpu1[1] - cpu0[1]
    return g.result()


def _cpu_seconds() -> tuple[float, float, float]:
    """(CPU seconds of this process, of its finished child processes (compute-sanitizer and what it ran), and of
    this process in the operating system's kernel: page faults, copies through pipes)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), kids.ru_utime + kids.ru_stime, resource.getrusage(resource.RUSAGE_SELF).ru_stime


class _Grading:
    """The state of one grading: findings (one per kind), checks, notes."""

    def __init__(self, ex: Exercise, seed: int | None):
        self.ex = ex
        self.seed = secrets.randbits(31) if seed is None else int(seed)
        self.findings: list[Finding] = []
        self.checks: list[Check] = []
        self.notes: list[str] = []
        self.kernel_name = ex.kernel
        self.complete = True
        self.needs_gpu = ""
        self.not_run = False               # the kernel could not run here at all: the grade cannot say passed
        self.speed: Speed | None = None
        self.stage_s: dict[str, float] = {}   # where the time went, by step (GradeResult.stage_s)
        self.tool_costs: list = []             # (step, ToolCost) per compute-sanitizer run (GradeResult.tool_costs)

    @contextlib.contextmanager
    def timed(self, step: str):
        """Add the block's wall time to `step`."""
        t0 = time.perf_counter()
        self.stage_s.setdefault(step, 0.0)       # in the order the steps start: a step timed inside another follows it
        try:
            yield
        finally:
            self.stage_s[step] += time.perf_counter() - t0

    # -- recording ------------------------------------------------------------------------------------------
    def add(self, kind: str, message: str, *, cell_line: int | None = None, where: str = "") -> None:
        """A finding, unless one of this kind is there already (the first is the clearest)."""
        if any(f.kind == kind for f in self.findings):
            return
        hint = self.ex.hints.get(kind, DEFAULT_HINTS.get(kind, ""))
        self.findings.append(Finding(kind=kind, message=message, hint=hint, cell_line=cell_line, where=where))

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(what=what, passed=bool(ok), detail=detail))
        return bool(ok)

    def ordered_findings(self) -> tuple[Finding, ...]:
        """The findings, most specific cause first (_CAUSE_FIRST); where a barrier finding explains wrong values,
        their hint says so instead of guessing at the index arithmetic."""
        found = sorted(self.findings, key=lambda f: _CAUSE_FIRST.get(f.kind, 3))
        cause = next((f for f in found if f.kind in _BARRIER_KINDS), None)
        if cause is None:
            return tuple(found)
        what = {"race": "the race", "barrier": "the barrier error", "uninitialized": "the uninitialized read",
                "missing_barrier": "the missing barrier"}[cause.kind]
        return tuple(dataclasses.replace(f, hint=f"{what} above can give these values: fix it first, then grade "
                                                 f"again (if they stay wrong: {f.hint})" if f.hint else
                                         f"{what} above can give these values: fix it first, then grade again")
                     if f.kind in _SYMPTOMS else f for f in found)

    def barrier_name(self) -> str:
        """The block barrier in the kernel's own language."""
        return "cuda.syncthreads()" if self.ex.kind == "numba" else "__syncthreads()"

    def result(self) -> GradeResult:
        return GradeResult(exercise=self.ex.id, title=self.ex.title, kernel=self.kernel_name,
                           passed=not self.findings and not self.not_run, findings=self.ordered_findings(),
                           checks=tuple(self.checks),
                           complete=self.complete and not self.needs_gpu, needs_gpu=self.needs_gpu, speed=self.speed,
                           seed=self.seed, notes=tuple(self.notes),
                           stage_s=tuple((k, round(v, 4)) for k, v in self.stage_s.items()),
                           tool_costs=tuple(self.tool_costs))

    # -- the steps --------------------------------------------------------------------------------------------
    def run(self, kernel, want_speed: bool) -> None:
        ex = self.ex
        for problem in spec_problems(ex):
            self.add("spec", problem)
        k = self.resolve(kernel)
        if k is None or not self.signature_fits(k):
            return
        gpu, reason = _device.gpu_status()
        simulated = ex.kind == "numba" and bool(getattr(k, "simulate", False))
        if ex.kind == "cuda":
            with self.timed("compiler checks"):
                self.static_checks(k)
            if any(f.kind == "no_store" for f in self.findings):
                self.notes.append("not launched: a kernel that stores nothing has nothing to check yet")
                return
        if simulated:
            with self.timed("launches (simulator)"):
                self.run_all(k, simulated=True)
            with self.timed("compiler checks"):
                self.numba_static_checks(k)
            with self.timed("race and init checks (simulator)"):
                self.sim_racecheck(k)
        elif gpu:
            with self.timed("launches (GPU)"):
                ran_ok = self.run_all(k, simulated=False)
            if ran_ok:
                with self.timed("determinism runs (GPU)"):
                    self.determinism(k)
            if ex.kind == "numba":
                with self.timed("compiler checks"):
                    self.numba_static_checks(k)
            if any(f.kind == "timeout" for f in self.findings):
                # it would hang under each tool (120 s apiece) and in the simulator (for good): the timeout is the
                # finding, and the fan-out's own timeout (grade_class) need not end the grading
                self.notes.append("compute-sanitizer and the simulator were not run: the kernel did not finish on "
                                  "the GPU, and would not under them either")
                return
            self.sanitizers(k)
            if ex.kind == "numba":
                # The puzzles' kernels are graded in the simulator as well: on hardware a one-warp block steps
                # together and hides a missing barrier (values right, compute-sanitizer's racecheck silent on an
                # H100), which the simulator's interleaving and race detector expose.
                sim_k = _simulated_copy(k)
                if sim_k is not None:
                    with self.timed("launches (simulator)"):
                        self.run_all(sim_k, simulated=True)
                    with self.timed("race and init checks (simulator)"):
                        self.sim_racecheck(sim_k)
            if want_speed and ex.speed is not None and ran_ok and not self.findings:
                with self.timed("speed bar"):
                    self.measure_speed(k)
        else:
            with self.timed("CPU path build"):
                cpu_k, why = _cpu_copy(k) if ex.kind == "cuda" else (None, "")
            if cpu_k is not None:
                self.run_on_cpu(cpu_k, reason)
                return
            tools = ", ".join(self.sanitizer_tools(gpu=True))
            shapes = ex.shapes
            configs = sum(len(ex.launch.configs(s)) for s in shapes)
            self.needs_gpu = (f"running it ({configs} launches on {len(shapes)} problem shapes with fresh random "
                              f"inputs and NaN-filled outputs, compute-sanitizer {tools}) needs a CUDA GPU: {reason}"
                              + (f"; and {why}" if why else ""))
            self.complete = False
            self.not_run = True

    def run_on_cpu(self, k, reason: str) -> None:
        """No GPU: the CUDA C++ kernel runs on the CPU path (kernellab.run.sim.cuda), on the shapes small enough for
        it, every launch bounds-checked, then its race, barrier and shared initcheck where the task has them."""
        ex = self.ex
        shapes = cpu_shapes(ex)
        dropped = [s for s in ex.shapes if s not in shapes]
        with self.timed("launches (CPU path)"):
            ran_ok = self.run_all(k, simulated=True, shapes=shapes, label="CPU")
        with self.timed("race and init checks (CPU path)"):
            self.sim_racecheck(k, shapes=shapes, label="CPU")
        self.notes.append(f"ran on the CPU (kernellab's CUDA C++ emulator; no GPU: {reason}): every launch checked "
                          f"for out-of-bounds accesses of its arguments and shared arrays, with the cell line")
        left = []
        if dropped:
            left.append(f"the {len(dropped)} larger shape{'s' if len(dropped) != 1 else ''} "
                        f"({', '.join(_shape_text(ex, s) for s in dropped)}), too slow on the CPU")
        left.append("compute-sanitizer's own run")
        if ex.speed is not None:
            left.append("the speed bar")
        self.needs_gpu = f"{', '.join(left)} need a CUDA GPU: {reason}"
        self.complete = False
        if not ran_ok and not self.findings:
            self.not_run = True

    def resolve(self, kernel):
        """The Kernel to grade, from a Kernel, a cell's module, or (Numba) a @cuda.jit function; None with a finding."""
        ex = self.ex
        if kernel is None:
            self.add("no_kernel", f"no kernel was given: pass the `{ex.kernel}` that the exercise's cell defines")
            return None

        if isinstance(kernel, KernelCollection):
            try:
                kernel = kernel[ex.kernel]
            except KeyError:
                names = ", ".join(k.name for k in kernel.kernels) or "none"
                self.add("no_kernel", f"the cell defines no kernel named `{ex.kernel}` (it has: {names})")
                return None
        if ex.kind == "numba" and not isinstance(kernel, Kernel):
            try:
                nb.kernel_function(kernel)
            except Exception:
                self.add("wrong_kind", f"expected the Numba kernel `{ex.kernel}` (a @cuda.jit function), got a "
                                       f"{type(kernel).__name__}")
                return None
            kernel = numba_kernel(kernel)
        if not isinstance(kernel, Kernel):
            self.add("wrong_kind", f"expected the kernel `{ex.kernel}` that the exercise's cell defines, got a "
                                   f"{type(kernel).__name__}")
            return None
        if kernel.backend != ex.kind:
            want = "a %%cuda (CUDA C++)" if ex.kind == "cuda" else "a Numba (@cuda.jit)"
            self.add("wrong_kind", f"this exercise wants {want} kernel; `{kernel.name}` is a {kernel.backend} kernel")
            return None
        self.kernel_name = kernel.name
        return kernel

    def signature_fits(self, k) -> bool:
        ex = self.ex
        want = ex.signature
        if ex.kind == "numba":
            have = nb.param_names(k.py_func)
            n = len(ex.names)
            ok = len(have) == n
            detail = f"{k.name}({', '.join(have)})"
            if not self.check(f"takes {n} parameters ({want})", ok, detail):
                self.add("signature", f"`{k.name}` takes {len(have)} parameters ({', '.join(have)}); the exercise "
                                      f"passes {n}: ({want})")
            return ok

        expected = [parse_param(p, i) for i, p in enumerate(s.strip() for s in want.split(","))]
        have = list(k.params)
        problems = []
        if len(have) != len(expected):
            problems.append(f"it takes {len(have)} parameters, the exercise passes {len(expected)}")
        else:
            for i, (h, e) in enumerate(zip(have, expected)):
                if (h.base, h.pointer) != (e.base, e.pointer):
                    problems.append(f"parameter {i} is `{h}`, the exercise passes `{e}`")
        ok = not problems
        if not self.check(f"signature ({want})", ok, str(k.signature)):
            self.add("signature", f"`{k.signature}` does not fit: {'; '.join(problems)}",
                     cell_line=k.signature.line)
        return ok

    # -- what the compiler says -------------------------------------------------------------------------------
    def static_checks(self, k) -> None:
        ex = self.ex
        res = k.resources
        base = base_arch(res.arch)
        if self.check(f"compiles for {ex.arch}", base == ex.arch, res.arch) is False:
            self.add("arch", f"`{k.name}` was compiled for {res.arch}; the tutorial's arch is {ex.arch}")
        if not self.check("no spills", not res.spills,
                          f"{res.spill_store_bytes} B stored / {res.spill_load_bytes} B loaded"):
            self.add("spills", f"registers spill: {res.spill_store_bytes} bytes stored to and {res.spill_load_bytes} "
                               f"loaded from local memory per thread")
        try:
            sass = k.sass
        except Exception as exc:
            sass = None
            self.notes.append(f"the SASS could not be read here ({type(exc).__name__}: {exc}); its checks were skipped")
        local = res.local_bytes > 0 or bool(sass and _LOCAL.search(sass))
        if not self.check("no local memory", not local, f"{res.local_bytes} B stack frame"):
            self.add("local_memory", f"`{k.name}` uses local memory ({res.local_bytes} B per thread"
                                     f"{', LDL/STL in its SASS' if sass and _LOCAL.search(sass) else ''})")
        if sass is not None:
            stores = bool(_STORE.search(sass))
            if not self.check("stores to global memory (STG)", stores):
                self.add("no_store", f"`{k.name}` never stores to global memory (no STG in its SASS): its output "
                                     f"stays unwritten")
                return                  # an empty stub: the checks below would only repeat that it does nothing
            if ex.needs_shared:
                ok = bool(_SHARED_STORE.search(sass) and _SHARED_LOAD.search(sass))
                if not self.check("goes through shared memory (STS and LDS)", ok):
                    self.add("no_shared", f"`{k.name}` has no shared-memory {'stores (STS)' if not _SHARED_STORE.search(sass) else 'loads (LDS)'} "
                                          f"in its SASS, and the task needs a shared-memory tile")
            if ex.needs_barrier:
                if not self.check("has a barrier (BAR.SYNC)", _BARRIER.search(sass)):
                    self.add("missing_barrier", f"`{k.name}` has no `{self.barrier_name()}` (no BAR.SYNC in its SASS)")
            for rule in ex.sass:
                if not self.check(f"SASS has {rule.pattern}", re.search(rule.pattern, sass)):
                    self.add(rule.kind, f"`{k.name}`: {rule.message}")
        if ex.kind == "cuda" and ex.guards:
            self.guard_checks(k)

    def numba_static_checks(self, k) -> None:
        """A Numba kernel is compiled at its first launch (the arguments give the types): check it after the runs."""
        if getattr(k, "compiled", None) is not None:
            self.static_checks(k)
        else:
            self.notes.append("the Numba kernel was not compiled for a GPU here, so its resources and SASS were not "
                              "checked")

    def guard_checks(self, k) -> None:
        """Each guard parameter is read somewhere (its ld.param is in the PTX): else nothing bounds the threads."""
        ptx = k.ptx
        expected = self.ex.names
        for name in self.ex.guards:
            if name not in expected:
                continue
            i = expected.index(name)
            learner_name = k.params[i].name if i < len(k.params) else name
            read = re.search(rf"\[{re.escape(k.symbol)}_param_{i}\]", ptx) is not None
            if not self.check(f"reads `{learner_name}` (guards the threads)", read):
                self.add("missing_guard", f"`{k.name}` never reads `{learner_name}`, so nothing stops the threads "
                                          f"past the end from reading and writing out of bounds",
                         cell_line=k.signature.line)

    # -- running ----------------------------------------------------------------------------------------------
    def run_all(self, k, *, simulated: bool, shapes=None, label: str | None = None) -> bool:
        """Every shape and launch configuration; True when every run matched the reference."""
        ex = self.ex
        shapes = ex.shapes_for(simulated) if shapes is None else shapes
        label = label or ("simulator" if simulated else "GPU")
        ran, failed = 0, []
        tried, failing = [], set()                 # blocks tried, and those that failed on some shape
        for si, shape in enumerate(shapes):
            for ci, (grid, block) in enumerate(ex.launch.configs(shape)):
                rng = np.random.default_rng([self.seed, si, ci])
                with self.timed("of the launches: inputs and reference (host)"):
                    args = tuple(ex.make_args(shape, rng))
                    expected = _as_tuple(ex.reference(*_reference_args(args, ex.outputs)))
                where = f"{_shape_text(ex, shape)}, grid {_dim(grid)}, block {_dim(block)}"
                try:
                    ok = self.run_one(k, args, expected, grid, block, where, simulated)
                except _RunFailed as exc:
                    self.check(f"launches on {len(shapes)} shapes ({label})", False,
                               f"stopped at the first {exc.kind}: {where}")
                    self.notes.append(f"the launches stopped at the first {exc.kind} ({where}); each one costs a "
                                      f"fresh worker process")
                    return False
                ran += 1
                if block not in tried:
                    tried.append(block)
                if not ok:
                    failing.add(block)
                    failed.append(where)
        self.check(f"{ran} launches on {len(shapes)} shapes ({label})", not failed,
                   f"{len(failed)} failed, first: {failed[0]}" if failed else "all matched the reference")
        good = [b for b in tried if b not in failing]
        if not ex.launch.fixed and failing and good:
            self.add("launch_config", f"right with block {', '.join(_dim(b) for b in good)} on every shape, but "
                                      f"wrong with block {', '.join(_dim(b) for b in tried if b in failing)}")
        return not failed

    def run_one(self, k, args, expected, grid, block, where, simulated, poison=None) -> bool:
        ex = self.ex
        for i in ex.outputs:
            if poison is None:
                _cmp.poison_(args[i])
            else:
                args[i][...] = poison
        inputs = {ex.arg_name(i): a for i, a in enumerate(args)
                  if isinstance(a, np.ndarray) and i not in ex.outputs}
        before = {name: a.copy() for name, a in inputs.items()}
        try:
            with self.timed("of the launches: the kernel's runs and copies"):
                outs = self._launch_sim(k, args, grid, block, where) if simulated else \
                    self._launch_gpu(k, args, grid, block)
        except _RunFailed as exc:
            self.add(exc.kind, exc.message, cell_line=exc.cell_line, where=where)
            if exc.kind in ("fault", "timeout"):
                raise                           # each costs a fresh worker: one is enough, the sanitizer says where
            return False
        after = inputs if simulated else {ex.arg_name(i): _to_host(a) for i, a in enumerate(self._last_dev)
                                          if ex.arg_name(i) in before}
        changed = [name for name, old in before.items() if not _cmp.same_bytes(old, after[name])]
        if changed:
            self.add("input_mutated", f"the kernel wrote into {', '.join(f'`{n}`' for n in changed)}, "
                                      f"{'an input' if len(changed) == 1 else 'inputs'} it must only read",
                     where=where)
            self.check("inputs unchanged", False, ", ".join(changed))
            return False
        ok = True
        for j, (i, out) in enumerate(zip(ex.outputs, outs)):
            for p in _cmp.compare(out, expected[j], ex.arg_name(i), rtol=ex.rtol, atol=ex.atol, inputs=inputs):
                self.add(p.kind, p.message, where=where)
                ok = False
        return ok

    def _launch_sim(self, k, args, grid, block, where=""):
        try:
            with warnings.catch_warnings():       # the result says it ran in the simulator
                warnings.simplefilter("ignore", SimulatorNotice)
                k.launch(grid, block, *args, shared_bytes=self.ex.launch.shared_bytes)
        except SimulatedKernelError as exc:
            if exc.exception == "IndexError" and getattr(exc, "findings", None) is not None:
                # the CPU path of CUDA C++: the launch went on past the access (reads saw zeros, writes were
                # dropped), as on a GPU, so its outputs are compared too
                at = f" at cell line {exc.line}" if exc.line else ""
                code = f": `{exc.source}`" if exc.source else ""
                who = f"thread {_dim(exc.thread)} of block {_dim(exc.block)}" if exc.thread and exc.block else ""
                self.add("out_of_bounds", f"out of bounds{at}{code} ({who}: {exc.detail})", cell_line=exc.line,
                         where=where)
                return [args[i] for i in self.ex.outputs]
            at = f" at cell line {exc.line}" if exc.line else ""
            code = f": `{exc.source}`" if exc.source else ""
            who = f"thread {_dim(exc.thread)} of block {_dim(exc.block)}" if exc.thread and exc.block else ""
            if exc.exception == "IndexError":
                raise _RunFailed("out_of_bounds", f"out of bounds{at}{code} ({who}: {exc.detail})",
                                 exc.line) from None
            raise _RunFailed("error", f"{exc.exception}{at}{code} ({who}): {exc.detail}", exc.line) from None
        except KernellabError as exc:
            raise _RunFailed("error", str(exc).splitlines()[0]) from None
        return [args[i] for i in self.ex.outputs]

    def _launch_gpu(self, k, args, grid, block):
        dev = _to_device(args)
        self._last_dev = dev
        try:
            k.launch(grid, block, *dev, shared_bytes=self.ex.launch.shared_bytes, isolate=True, timeout_s=30)
        except IsolatedLaunchError as exc:
            kind = "timeout" if exc.status == "timeout" else "fault"
            raise _RunFailed(kind, str(exc).splitlines()[0]) from None
        except KernellabError as exc:
            raise _RunFailed("fault", str(exc).splitlines()[0]) from None
        return [_to_host(dev[i]) for i in self.ex.outputs]

    def determinism(self, k) -> None:
        """The sanitizer's shape again, twice, with the outputs first holding zeros and then the largest finite value
        (not the NaN of the other runs): a kernel that reads memory it never wrote, or races, disagrees."""
        shape, grid, block, args = self._sanitize_launch()
        expected = _as_tuple(self.ex.reference(*_reference_args(args, self.ex.outputs)))
        where = f"{_shape_text(self.ex, shape)}, grid {_dim(grid)}, block {_dim(block)} (determinism run)"
        results = []
        for fill in ("zero", "max"):
            run_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
            value = {i: _fill_value(run_args[i].dtype, fill) for i in self.ex.outputs}
            before = len(self.findings)
            try:
                ok = self._quiet_run(k, run_args, expected, grid, block, where, value)
            except _RunFailed:
                return
            del self.findings[before:]           # the verdict of a determinism run is the one finding below
            results.append(ok)
        ok = all(results)
        if not self.check("two more runs agree (outputs zeroed, then filled)", ok, where):
            self.add("nondeterministic", "the kernel's answer changes with what the output memory held before it ran "
                                         "(zeros, or the largest value): it reads memory it never wrote, or races",
                     where=where)

    def _quiet_run(self, k, args, expected, grid, block, where, fills) -> bool:
        ex = self.ex
        for i in ex.outputs:
            args[i][...] = fills[i]
        outs = self._launch_gpu(k, args, grid, block)
        return all(not _cmp.mismatches(out, np.asarray(expected[j]), ex.rtol, ex.atol).any()
                   for j, out in enumerate(outs))

    # -- sanitizers -------------------------------------------------------------------------------------------
    def sanitizer_tools(self, gpu: bool = False) -> tuple[str, ...]:
        ex = self.ex
        tools = ["memcheck"]
        if gpu:
            tools.append("initcheck")     # reads of global memory never written (shared memory: the simulator's)
        if ex.needs_shared or ex.needs_barrier:
            tools.append("racecheck")
        if ex.needs_barrier:
            tools.append("synccheck")
        return tuple(tools)

    def _sanitize_launch(self):
        ex = self.ex
        shape = ex.shape_for_sanitizer()
        grid, block = ex.launch.configs(shape)[0]
        args = tuple(ex.make_args(shape, np.random.default_rng([self.seed, 999])))
        for i in ex.outputs:
            _cmp.poison_(args[i])
        return shape, grid, block, args

    def sanitizers(self, k) -> None:
        shape, grid, block, args = self._sanitize_launch()
        dev = _to_device(args)
        where = f"{_shape_text(self.ex, shape)}, grid {_dim(grid)}, block {_dim(block)}"
        # with KERNELLAB_SANITIZER_POOL=1, each tool runs in this process's warm compute-sanitizer of that tool (one
        # CUDA context per worker and tool, not per submission: kernellab.run.nvtools.sanitize_pool); unset, one-shot
        pool = _sanitize_pool.default_on()
        for tool in self.sanitizer_tools(gpu=True):
            try:
                with self.timed(f"compute-sanitizer {tool}"):
                    rep = k.sanitize(grid, block, *dev, shared_bytes=self.ex.launch.shared_bytes, tool=tool,
                                     timeout_s=120, pool=pool)
            except ToolNotFoundError as exc:
                self.notes.append(f"{tool} was not run: {exc}")
                continue
            if getattr(rep, "cost", None) is not None:
                self.tool_costs.append((f"compute-sanitizer {tool}", rep.cost))
            self.sanitizer_findings(rep, tool, where)

    def sim_racecheck(self, k, shapes=None, label: str = "simulator") -> None:
        """The simulator's race detector, and its barrier check where the task needs a barrier (as a GPU runs
        racecheck and synccheck), and its shared-memory initcheck where the task has shared memory, through the
        public `k.sanitize(tool="racecheck+synccheck+initcheck")`: one simulated launch."""
        if not (self.ex.needs_shared or self.ex.needs_barrier):
            return
        tools = tuple(t for t in self.sanitizer_tools() if t != "memcheck")     # racecheck[, synccheck]
        if self.ex.needs_shared:
            tools += ("initcheck",)
        shape, grid, block, args = self._sanitize_launch()
        small = self.ex.shapes_for(True) if shapes is None else shapes
        if shape not in small:
            shape = small[min(1, len(small) - 1)]
            grid, block = self.ex.launch.configs(shape)[0]
            args = tuple(self.ex.make_args(shape, np.random.default_rng([self.seed, 999])))
        try:
            rep = k.sanitize(grid, block, *args, shared_bytes=self.ex.launch.shared_bytes, tool="+".join(tools))
        except (NotImplementedError, NoGPUError, KernellabError) as exc:
            self.notes.append(f"{' and '.join(tools)} {'was' if len(tools) == 1 else 'were'} not run (the "
                              f"simulator's race detector is not in this kernellab: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
            return
        where = f"{_shape_text(self.ex, shape)}, grid {_dim(grid)}, block {_dim(block)} ({label})"
        for tool in tools:
            part = rep
            if len(tools) > 1:      # the combined report's findings, by the tool that found them
                mine = tuple(f for f in getattr(rep, "findings", ()) or () if getattr(f, "tool", tool) == tool)
                part = dataclasses.replace(rep, tool=tool, findings=mine,
                                           error_count=sum(getattr(f, "count", 1) or 1 for f in mine))
            self.sanitizer_findings(part, tool, where)

    def sanitizer_findings(self, rep, tool: str, where: str) -> None:
        findings = tuple(getattr(rep, "findings", ()) or ())
        timed_out = bool(getattr(rep, "timed_out", False))
        self.check(tool, not findings and not timed_out and getattr(rep, "ok", True),
                   f"{len(findings)} problem{'s' if len(findings) != 1 else ''}" if findings else "clean")
        if timed_out:
            self.add("timeout", f"the kernel did not finish under {tool}", where=where)
        for f in findings:
            line = getattr(f.where, "cell_line", None) or getattr(f.where, "line", None)
            src = (getattr(f.where, "source_line", None) or "").strip()
            at = f" at cell line {line}" if line else ""
            code = f": `{src}`" if src else ""
            who = f" (thread {_dim(f.thread)} of block {_dim(f.block)})" if f.thread and f.block else ""
            if f.kind in ("invalid_write", "invalid_read"):
                access = "write" if f.kind == "invalid_write" else "read"
                self.add("out_of_bounds", f"out of bounds {access}{at}{code}{who}", cell_line=line, where=where)
            elif f.kind == "misaligned":
                self.add("misaligned", f"misaligned access{at}{code}{who}", cell_line=line, where=where)
            elif f.kind == "race":
                other = getattr(f, "other", None)
                oline = (getattr(other, "cell_line", None) or getattr(other, "line", None)) if other else None
                if line and oline and line != oline:
                    pair = f"between cell line {line} and line {oline}"
                else:
                    pair = f"at cell line {line}, between threads" if line else "in shared memory"
                self.add("race", f"race {pair} ({(f.access or 'access').lower()} / "
                                 f"{(f.other_access or 'access').lower()} of the same shared-memory word)",
                         cell_line=line, where=where)
            elif f.kind in ("barrier", "deadlock"):
                self.add("barrier", f"barrier error{at}{code}: {f.message}", cell_line=line, where=where)
            elif f.kind == "uninitialized_read":
                what = ("read of a shared-memory element no thread stored" if "__shared__" in (f.message or "")
                        else "read of memory never written")
                self.add("uninitialized", f"{what}{at}{code}{who}", cell_line=line, where=where)
            else:
                self.add("fault", f"{f.message}{at}{code}{who}", cell_line=line, where=where)

    # -- speed ------------------------------------------------------------------------------------------------
    def measure_speed(self, k) -> None:
        bar = self.ex.speed
        shape = tuple(bar.shape)
        grid, block = self.ex.launch.configs(shape)[0]
        args = tuple(self.ex.make_args(shape, np.random.default_rng([self.seed, 1000])))
        dev = _to_device(args)
        shared = self.ex.launch.shared_bytes

        def yours(*a):
            k.launch(grid, block, *a, shared_bytes=shared)

        yours.__name__ = k.name
        try:
            result = bench(yours, dev, baselines={bar.baseline: bar.run_baseline},
                           bytes=bar.bytes(shape) if bar.bytes else None, name=k.name, rounds=5, rep_ms=50)
        except Exception as exc:
            self.notes.append(f"the speed bar was not measured: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            return
        for f in getattr(result, "findings", ()):
            self.add(f.kind, f"the speed measurement: {f.message}")
        self.after_timing(yours, args, dev, shape)
        if not getattr(result, "trusted", True) or any(f.kind == "cached_result" for f in self.findings):
            self.notes.append("the speed was not recorded: a timing defence tripped (flagged, never ranked)")
            return
        base = result.baselines[0]
        self.speed = Speed(bar=bar.describe(), fraction=bar.fraction, ratio=result.speedup(bar.baseline).ratio,
                           kernel_ms=result.median_ms, baseline_ms=base.median_ms, gbps=result.gbps, shape=shape)


    def after_timing(self, yours, args, dev, shape) -> None:
        """One more launch as timed, on outputs filled again with the poison (the baseline wrote its answer there):
        a kernel that computes only on its first launch (a static `__device__` flag) leaves them unwritten. (Only
        unwritten elements count: the values were checked on the grading shapes, whose tolerances hold there.)"""
        ex = self.ex
        host = [np.array(args[i], copy=True) for i in ex.outputs]
        for i, h in zip(ex.outputs, host):
            _cmp.poison_(h)
            _copy_into(dev[i], h)
        try:
            yours(*dev)
        except Exception as exc:
            self.notes.append(f"the launch after timing raised: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            return
        for i in ex.outputs:
            never = _cmp.unwritten(_to_host(dev[i]))
            if never.any():
                self.add("cached_result", f"after timing, one more launch at shape {shape} left "
                                          f"{int(never.sum()):,} elements of `{ex.arg_name(i)}` unwritten: the kernel "
                                          f"does not compute on every launch (state kept from an earlier launch), so "
                                          f"its time is not its work")
                return


class _RunFailed(Exception):
    def __init__(self, kind: str, message: str, cell_line: int | None = None):
        super().__init__(message)
        self.kind, self.message, self.cell_line = kind, message, cell_line


# --- the spec's own sanity ------------------------------------------------------------------------------------

_SPEC_CHECKED: dict[tuple[str, int], tuple[str, ...]] = {}


def _spec_problems(ex: Exercise) -> tuple[str, ...]:
    problems = []
    rejected = {"an all-zero answer": False, "an input-copy answer": False}
    tried = {"an all-zero answer": False, "an input-copy answer": False}
    for si, shape in enumerate(sorted(set(ex.shapes) | set(ex.sim_shapes or ()), key=lambda s: int(np.prod(s)))):
        if int(np.prod(shape)) > 1 << 20:
            continue            # the big shapes say nothing the small ones do not, and cost memory
        args = tuple(ex.make_args(shape, np.random.default_rng([0, si])))
        expected = _as_tuple(ex.reference(*_reference_args(args, ex.outputs)))
        if len(expected) != len(ex.outputs):
            return (f"the reference returns {len(expected)} outputs but the exercise names {len(ex.outputs)}",)
        inputs = [a for i, a in enumerate(args) if isinstance(a, np.ndarray) and i not in ex.outputs]
        for j, i in enumerate(ex.outputs):
            out, ref = args[i], np.asarray(expected[j])
            if out.shape != ref.shape:
                return (f"output `{ex.arg_name(i)}` has shape {out.shape} but the reference returns {ref.shape} "
                        f"(shape {shape})",)
            answers = {"an all-zero answer": np.zeros_like(out)}
            src = next((a for a in inputs if a.dtype == out.dtype and a.size >= out.size), None)
            if src is not None:
                answers["an input-copy answer"] = src.reshape(-1)[:out.size].reshape(out.shape).copy()
            for label, answer in answers.items():
                tried[label] = True
                bad = _cmp.mismatches(answer, ref, ex.rtol, ex.atol).any()
                rejected[label] |= bool(bad)
                if not bad and not np.array_equal(answer, ref):
                    problems.append(f"the reference accepts {label} for `{ex.arg_name(i)}` at shape {shape}")
    for label, was in rejected.items():
        if tried[label] and not was:
            problems.append(f"{label} passes on every shape: the comparison cannot tell it from a solution")
    return tuple(problems)


def spec_problems(ex: Exercise) -> tuple[str, ...]:
    """What is wrong with the exercise itself: an all-zero or input-copy answer it would accept (empty: sound)."""
    key = (ex.id, id(ex))
    if key not in _SPEC_CHECKED:
        _SPEC_CHECKED[key] = _spec_problems(ex)
    return _SPEC_CHECKED[key]


# --- small helpers ---------------------------------------------------------------------------------------------

def _as_tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _fill_value(dtype, fill: str):
    """0, or the largest value of `dtype` (finite for floats; True for booleans)."""
    if fill == "zero":
        return 0
    if dtype.kind == "f":
        return np.finfo(dtype).max
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def _reference_args(args, outputs) -> tuple:
    """What the exercise's reference is called with: copies of the output arrays (it may fill and return them) and
    read-only views of the rest (an input it wrote into would raise; no copy of a large input per launch)."""
    def view(a):
        v = a.view()
        v.flags.writeable = False
        return v

    return tuple((a.copy() if i in outputs else view(a)) if isinstance(a, np.ndarray) else a
                 for i, a in enumerate(args))


def _to_device(args) -> tuple:
    """NumPy arrays as CUDA torch tensors (numbers as they are)."""
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(a)).cuda() if isinstance(a, np.ndarray) else a for a in args)


def _copy_into(dst, src: np.ndarray) -> None:
    """Copy host `src` into device tensor (or, on a fake GPU, array) `dst` in place."""
    if isinstance(dst, np.ndarray):
        dst[...] = src
    else:
        import torch

        dst.copy_(torch.from_numpy(np.ascontiguousarray(src)))


def _to_host(t) -> np.ndarray:
    """A CUDA torch tensor's contents as a NumPy array."""
    return t.cpu().numpy()


def _dim(t) -> str:
    t = dim3(t)
    while len(t) > 1 and t[-1] == 1:
        t = t[:-1]
    return "(" + ", ".join(map(str, t)) + ")" if len(t) > 1 else str(t[0])


def _shape_text(ex: Exercise, shape) -> str:
    return f"shape {'x'.join(map(str, shape))}"


CPU_THREADS = 1 << 16        # threads a shape may launch (over its launch configurations) on the CPU path
CPU_ELEMENTS = 1 << 18       # and elements a shape may hold


def cpu_shapes(ex: Exercise) -> tuple:
    """The exercise's shapes the CPU path runs: its simulator shapes where it has them, else those whose launches
    (every configuration) start at most CPU_THREADS threads and hold at most CPU_ELEMENTS elements; at least the
    smallest."""
    if ex.sim_shapes:
        return tuple(ex.sim_shapes)
    keep = []
    for s in ex.shapes:
        threads = 0
        for grid, block in ex.launch.configs(s):
            g, b = dim3(grid), dim3(block)
            threads += g[0] * g[1] * g[2] * b[0] * b[1] * b[2]
        elements = int(np.prod(s)) if isinstance(s, tuple) else int(s)
        if threads <= CPU_THREADS and elements <= CPU_ELEMENTS:
            keep.append(s)
    return tuple(keep) or tuple(ex.shapes[:1])


def _cpu_copy(k):
    """(the kernel on the CPU path, '') or (None, why it cannot run there)."""
    if getattr(k, "backend", None) != "cuda" or getattr(k, "module", None) is None:
        return None, "only CUDA C++ kernels run on the CPU path"
    why = _cpu_path.unsupported(k.module.source or "", k.module.first_line)
    if not why:
        ok, why = _cpu_path.available()
        if ok:
            try:
                _cpu_path.host_kernel(k.image())
            except Exception as exc:
                lines = str(exc).strip().splitlines()
                first = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else type(exc).__name__)
                why = f"the CPU path could not build it: {first.strip()[:300]}"
            else:
                c = copy.copy(k)
                c.simulate = True
                c._launchers = {}
                return c, ""
    return None, why


def _simulated_copy(k):
    """The same Numba kernel set to run in the simulator, or None where it cannot be (not a NumbaKernel)."""
    if not hasattr(k, "simulate"):
        return None
    sim = copy.copy(k)
    sim.simulate = True
    return sim
