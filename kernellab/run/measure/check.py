"""Check a candidate against a reference on fresh random inputs: `check(candidate, reference, inputs)`.

How a check runs, trial by trial (trial t draws its inputs from `torch.Generator().manual_seed(seed + t)`):
1. `inputs(generator)` makes the argument tuple; it is kept untouched as the snapshot.
2. The reference runs on a float64 copy (floating tensors upcast) where it accepts one, and on a copy in the
   inputs' own dtypes, which fixes the expected output count, shapes and dtypes.
3. The candidate runs on its own copy. Arguments it writes its results into (found by the tensors it returns,
   or named with `outputs=`) are filled with NaN first, so elements it never writes fail; torch tensors and NumPy
   arrays alike (integer outputs get the integer maximum).
4. Each output is compared elementwise: |yours - ref| <= atol + rtol * |ref|, with defaults chosen by the
   output's precision and atol scaled by the reference's RMS, so an all-zero output cannot pass. NaN or Inf
   where the reference is finite always fails. An argument the candidate changed but did not return fails.
The check stops at the first failing trial and keeps that trial's errors; a passing check keeps the trial
with the largest error. A candidate that cheats (writes nothing into recycled memory, returns a view or a subclass,
caches, patches the comparison, calls the library op; docs/GRADING.md's threat model) fails with a finding that
names the attack: `report.finding`, from kernellab.run.measure.integrity.
"""
from __future__ import annotations

import math
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kernellab.errors import KernellabError
from kernellab.render.check_html import check_report_html
from kernellab.report import mimebundle
from ..launch import worker as _worker
from . import integrity

# Default tolerances per arithmetic precision: (rtol, atol as a multiple of the reference's RMS).
# u is the unit roundoff 2**-(mantissa bits + 1). Summing in a different order, fused multiply-adds and
# fast intrinsics move results by a few u times sqrt(terms); wrong indexing moves them by O(1) x RMS.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),      # u = 1.1e-16: loose, so float64 candidates never fail on summation order
    "float32": (1e-4, 1e-4),      # u = 6.0e-8: ~1,700 u, a different order over reductions of ~10^6 terms
    "tf32": (5e-3, 5e-3),         # inputs rounded to 10 mantissa bits (u = 4.9e-4), fp32 accumulation
    "bfloat16": (1.6e-2, 1.6e-2),  # u = 3.9e-3: the output's own rounding plus fp32 accumulation
    "float16": (2e-3, 2e-3),      # u = 4.9e-4: the output's own rounding plus fp32 accumulation
    "exact": (0.0, 0.0),          # integer and boolean outputs
}
_WORST_COUNT = 8          # elements kept for the "yours vs reference" table
_MAP_SHAPE = (64, 128)    # the error heatmap is max-pooled down to at most this many rows and columns


class CheckError(KernellabError, ValueError):
    """`check` was called with arguments it cannot use (the report covers everything that fails later)."""


@dataclass(frozen=True)
class CheckReport:
    """The outcome of `check`: pass or fail, the errors of the trial shown, and where they sit."""

    passed: bool
    trials: int                          # trials run (a failing check stops at its first failing trial)
    max_abs_error: float                 # over every trial run and every output
    max_rel_error: float                 # |yours - ref| / |ref| over elements whose reference is non-zero
    mismatches: int                      # elements out of tolerance in the first failing trial (0 when passed)
    worst: tuple[tuple[int, ...], ...]   # indices of the largest errors (relative to the tolerance), largest first
    rtol: float
    atol: float                          # the absolute tolerance used in the trial shown
    precision: str                       # the row of TOLERANCES used, or "explicit"
    tolerance: str                       # the rule, in words, with the numbers filled in
    message: str                         # one line: why it failed, or a summary when it passed
    seed: int                            # trial t used seed + t
    failing_trial: int | None = None
    failing_seed: int | None = None
    output_index: int | None = None      # the output shown (failing, or with the largest error)
    output_count: int = 0
    shape: tuple[int, ...] | None = None  # of the output shown
    dtype: str | None = None             # of the output shown, candidate's
    reference_precision: str | None = None  # dtype the reference was computed in, e.g. "float64"
    reference_own_error: float | None = None  # max abs error of the reference run in the inputs' dtypes
    worst_values: tuple[tuple[tuple[int, ...], float, float, float], ...] = ()  # (index, yours, ref, error/tolerance)
    mutated_inputs: tuple[str, ...] = ()  # arguments the candidate changed without returning them
    output_arguments: tuple[int, ...] = ()  # arguments filled with NaN before each candidate run
    exception: str | None = None         # "ValueError: ..." when the candidate, reference or inputs raised
    traceback: str = field(default="", repr=False, compare=False)
    generator_device: str = "cpu"
    error_map: Any = field(default=None, repr=False, compare=False)  # 2-D NumPy array, error/tolerance pooled
    reference_note: str | None = None    # why the reference is not in float64 where it was asked to be
    free_memory_filled_bytes: int = 0    # free GPU memory of torch's caching allocator filled with NaN (largest trial)
    findings: tuple = ()                 # IntegrityFinding(kind, message) for each defence that tripped (integrity.py)
    distribution: str = "given"          # the input distribution of the trial shown (integrity.DISTRIBUTIONS)
    distributions: tuple[str, ...] = ("given",)  # the distributions the trials went through, in turn
    strict: bool = False                 # run with strict=True (every defence on)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def finding(self) -> str | None:
        """The kind of the first integrity finding ("stale_output", "fake_output", ...), or None."""
        return self.findings[0].kind if self.findings else None

    @property
    def reproduce(self) -> str | None:
        """A line that rebuilds the failing trial's arguments, or None when it passed."""
        if self.failing_seed is None:
            return None
        gen = "" if self.generator_device == "cpu" else repr(self.generator_device)
        line = f"args = inputs(torch.Generator({gen}).manual_seed({self.failing_seed}))"
        if self.distribution != "given":
            line += (f"; args = kernellab.run.measure.integrity.redraw(args, {self.distribution!r}, "
                     f"{self.failing_seed}, skip={tuple(self.output_arguments)})")
        return line

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"check {verdict}: {self.message}"]
        if self.dtype is not None:
            lines.append(f"  max abs error {_fmt(self.max_abs_error)}, max rel error {_fmt(self.max_rel_error)}"
                         f" over {self.trials} trial{'s' if self.trials != 1 else ''} (seeds {self.seed}.."
                         f"{self.seed + self.trials - 1})")
            lines.append(f"  tolerance: {self.tolerance}")
            if self.reference_precision:
                ref = f"  reference computed in {self.reference_precision}"
                if self.reference_own_error is not None and self.reference_precision != self.dtype:
                    ref += f"; the reference run in the inputs' dtypes is off by up to {_fmt(self.reference_own_error)}"
                lines.append(ref)
        if self.reference_note:
            lines.append(f"  note: {self.reference_note}")
        if self.output_arguments:
            lines.append(f"  output arguments filled with NaN before each run: {_arg_list(self.output_arguments)}")
        if self.free_memory_filled_bytes:
            lines.append(f"  free GPU memory filled with NaN before each run (torch's caching allocator, up to "
                         f"{_mib(self.free_memory_filled_bytes)}): results in torch.empty memory must be written")
        out_of_tolerance = [w for w in self.worst_values if w[3] > 1]
        if not self.passed and out_of_tolerance:
            lines.append("  worst elements (index: yours vs reference, error / tolerance):")
            for idx, yours, ref, ratio in out_of_tolerance:
                lines.append(f"    {_index(idx)}: {_fmt(yours)} vs {_fmt(ref)}, {_fmt(ratio)}")
        elif self.worst_values and self.max_abs_error > 0:
            idx, yours, ref, ratio = self.worst_values[0]
            lines.append(f"  largest error at {_index(idx)}: {_fmt(yours)} vs {_fmt(ref)}, "
                         f"{_fmt(ratio)} of the tolerance")
        for f in self.findings:
            lines.append(f"  finding {f}")
        if self.distribution != "given":
            lines.append(f"  inputs: the {self.distribution} distribution (integrity.redraw of inputs' draw)")
        if self.exception:
            lines.append(f"  {self.exception}")
        if self.reproduce:
            lines.append(f"  reproduce: {self.reproduce}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return check_report_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "check", "version": 1, "title", "passed", "trials", "max_abs_error", "max_rel_error",
        "mismatches", "worst" (index lists), "worst_values" ([index, yours, reference, error/tolerance]),
        "rtol", "atol",
        "precision", "tolerance", "message", "seed", "failing_trial", "failing_seed", "reproduce",
        "output_index", "output_count", "shape", "dtype", "reference_precision", "reference_own_error",
        "mutated_inputs", "output_arguments", "exception", "error_map" (rows of error/tolerance, pooled),
        "reference_note", "free_memory_filled_bytes", "findings" ([{kind, message}]), "finding", "distribution",
        "distributions", "strict"}. Non-finite numbers are the strings "inf", "-inf" and "nan"."""
        return {
            "kind": "check", "version": 1,
            "title": f"check {'passed' if self.passed else 'failed'}",
            "passed": self.passed, "trials": self.trials,
            "max_abs_error": _json_num(self.max_abs_error), "max_rel_error": _json_num(self.max_rel_error),
            "mismatches": self.mismatches, "worst": [list(i) for i in self.worst],
            "worst_values": [[list(i), _json_num(y), _json_num(r), _json_num(q)] for i, y, r, q in self.worst_values],
            "rtol": self.rtol, "atol": _json_num(self.atol), "precision": self.precision,
            "tolerance": self.tolerance, "message": self.message, "seed": self.seed,
            "failing_trial": self.failing_trial, "failing_seed": self.failing_seed, "reproduce": self.reproduce,
            "output_index": self.output_index, "output_count": self.output_count,
            "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
            "reference_precision": self.reference_precision,
            "reference_own_error": _json_num(self.reference_own_error),
            "mutated_inputs": list(self.mutated_inputs), "output_arguments": list(self.output_arguments),
            "exception": self.exception,
            "error_map": None if self.error_map is None else
            [[_json_num(v) for v in row] for row in np.asarray(self.error_map).tolist()],
            "reference_note": self.reference_note, "free_memory_filled_bytes": self.free_memory_filled_bytes,
            "findings": [f.to_json() for f in self.findings], "finding": self.finding,
            "distribution": self.distribution, "distributions": list(self.distributions), "strict": self.strict,
        }


def check(candidate: Callable, reference: Callable, inputs: Callable, *, trials: int = 5,
          atol: float | None = None, rtol: float | None = None, seed: int = 0,
          precision: str | None = None, outputs: tuple[int, ...] | None = None,
          generator_device: str = "cpu", isolate: bool | None = None, fill_free_memory: bool = True,
          strict: bool = False, distributions: tuple[str, ...] | None = None, allowed_ops=None,
          forbidden_ops=()) -> CheckReport:
    """Compare `candidate(*args)` with `reference(*args)` on `trials` fresh argument sets from `inputs(generator)`.

    `precision` picks the default tolerances ("float64", "float32", "tf32", "bfloat16", "float16"; default:
    the output's dtype; say "tf32" for fp32 outputs computed on TF32 tensor cores). `outputs` names the
    arguments the candidate writes its results into (default: found from the tensors it returns; `()` turns
    the NaN fill off). `generator_device` is where the generator handed to `inputs` lives ("cuda" to draw
    GPU tensors directly; the default "cpu" gives the same numbers on every machine). `isolate=True` runs the
    candidate's kernel launches in a worker process (None: the notebook-wide setting), so that a faulty kernel
    fails its trial instead of poisoning this process. `fill_free_memory` (default on) fills the free blocks of
    torch's CUDA caching allocator with NaN before each candidate run, so that a result the candidate allocates
    with torch.empty holds NaN, not a recycled right answer, where the kernel writes nothing.

    Defences against a cheating candidate (docs/GRADING.md's threat model), each a finding in `report.findings`
    with a stable kind: always on, outputs must be plain dense tensors of their own memory ("fake_output"), inputs
    unchanged ("input_mutated"), no thread of the candidate's left running ("background_thread"); odd trials run the
    candidate before the reference, and an answer of an earlier trial is named: memory the reference left behind
    ("stale_output") or the candidate's own ("cached_result"). `strict=True` (graders, leaderboards) adds: trials in
    turn over `distributions` (default integrity.DISTRIBUTIONS: given, uniform, heavy-tailed, offset;
    "fits_test_data" when only the given one passes), a second run of the first trial on memory zeroed instead of
    NaN ("nondeterministic"), an error far above the reference's own in a float32/float64 contract
    ("low_precision"), and the aten ops the candidate dispatches: none of the reference's compute ops unless
    `allowed_ops` names them, nor any of `forbidden_ops` ("library_call"; either also turns this on alone).
    """
    _validate(candidate, reference, inputs, trials, atol, rtol, precision, outputs)
    if distributions is None:
        distributions = integrity.DISTRIBUTIONS if strict else ("given",)
    distributions = tuple(distributions)
    if not distributions or any(d not in integrity.DISTRIBUTIONS for d in distributions):
        raise CheckError(f"distributions={distributions!r}: expected names among {integrity.DISTRIBUTIONS}")
    state = _CheckState(candidate, reference, inputs, atol, rtol, precision, outputs, seed, generator_device)
    state.fill_free_memory = bool(fill_free_memory)
    state.strict, state.distributions = bool(strict), distributions
    state.library = bool(strict or allowed_ops is not None or forbidden_ops)
    state.allowed_ops, state.forbidden_ops = allowed_ops, tuple(forbidden_ops or ())
    state.guard = integrity.TimingGuard(extra=integrity.check_targets(sys.modules[__name__]))
    state.threads = integrity.ThreadWatch()
    with _worker.isolation(_worker.settings.isolate if isolate is None else isolate):
        for trial in range(trials):
            failure = state.run_trial(trial)
            if failure is not None:
                return failure
    patched = state.guard.changed()
    if patched:
        state.guard.restore()
        return state._found("harness_patched", f"the candidate replaced {', '.join(patched[:6])} (put back): the "
                                               f"comparison cannot be trusted", trials - 1)
    if state.pending_low is not None:
        low, trial = state.pending_low
        return state._found(low.kind, low.message, trial)
    return state.passed_report(trials)


# --- the trial loop -----------------------------------------------------------------------------------------


@dataclass
class _Compared:
    """One output of one trial, compared."""

    index: int
    max_abs: float
    max_rel: float
    max_ratio: float        # largest error / tolerance (> 1 is out of tolerance)
    mismatches: int
    atol: float
    rtol: float
    precision: str
    tolerance: str
    worst: tuple
    worst_values: tuple
    error_map: Any
    shape: tuple
    dtype: str
    ref_own_error: float | None


class _CheckState:
    """What carries from trial to trial: the reference's precision, the output arguments, the worst so far."""

    def __init__(self, candidate, reference, inputs, atol, rtol, precision, outputs, seed, generator_device):
        self.candidate, self.reference, self.inputs = candidate, reference, inputs
        self.atol, self.rtol, self.precision = atol, rtol, precision
        self.outputs = None if outputs is None else tuple(outputs)
        self.seed, self.generator_device = seed, generator_device
        self.upcast_reference = True       # becomes False if the reference refuses float64 arguments
        self.reference_note = None         # ... and why
        self.reference_precision = None
        self.fill_free_memory = True
        self.filled_bytes = 0
        self.max_abs, self.max_rel = 0.0, 0.0
        self.shown: _Compared | None = None  # the output with the largest error/tolerance so far
        self.output_count = 0
        self.strict = False
        self.distributions: tuple[str, ...] = ("given",)
        self.distribution = "given"        # of the trial running
        self.given_passed = False          # a trial on the given distribution passed
        self.library = False
        self.allowed_ops, self.forbidden_ops = None, ()
        self.findings: list = []
        self.previous_ref = None           # the reference's values of the previous trial (stale answers)
        self.previous_cand = None          # the candidate's outputs of the previous trial (cached answers)
        self.trial_seed = seed
        self.pending_low = None            # (finding, trial): strict's low_precision on a passing trial
        self.guard = None                  # integrity.TimingGuard over what the comparison uses
        self.threads = None                # integrity.ThreadWatch from the check's start

    # one trial ------------------------------------------------------------------------------------------------
    def run_trial(self, trial: int) -> CheckReport | None:
        """Run one trial; a report when it fails, None when it passes."""
        import torch

        seed = self.seed + trial
        self.trial_seed = seed
        gen = torch.Generator(device=self.generator_device).manual_seed(seed)
        try:
            args = self.inputs(gen)
        except Exception as exc:
            return self._raised("inputs(generator)", exc, trial)
        if isinstance(args, (torch.Tensor, np.ndarray)):
            args = (args,)
        if not isinstance(args, (tuple, list)):
            raise CheckError(f"inputs(generator) returned a {type(args).__name__}; expected a tuple of arguments "
                             f"for candidate(*args), e.g. `lambda g: (torch.randn(1000, generator=g),)`")
        args = tuple(args)
        if self.outputs is not None:
            bad = [i for i in self.outputs if not (-len(args) <= i < len(args))
                   or not _is_array(args[i])]
            if bad:
                raise CheckError(f"outputs={self.outputs} names argument(s) {bad}, but inputs(generator) returned "
                                 f"{len(args)} arguments and those are not tensors; name tensor arguments only")
            self.outputs = tuple(i % len(args) for i in self.outputs)
        # The trial's input distribution: the given draw, or (strict) a redraw of its floating inputs.
        self.distribution = self.distributions[trial % len(self.distributions)]
        if self.distribution != "given":
            args = integrity.redraw(args, self.distribution, seed, skip=self.outputs or ())

        # Odd trials (once the outputs are known) run the candidate first: no reference answer of this trial then
        # lies in freed memory for a torch.empty to find.
        candidate_first = trial % 2 == 1 and self.outputs is not None
        ran = None
        if candidate_first:
            ran = self._run_candidate(args, trial)
            if isinstance(ran, CheckReport):
                return ran

        # The reference: in the inputs' dtypes (the contract), and in float64 (the values) where it allows.
        try:
            ref_native = self._call_reference(args)
        except _OutputTypeError as exc:
            return self._failed(str(exc), trial)
        except Exception as exc:
            return self._raised("the reference", exc, trial)
        ref_values = ref_native
        if self.upcast_reference and _has_low_precision_float(args):
            why = None
            try:
                ref_values = self._call_reference(args, upcast=True)
            except Exception as exc:            # out of memory, an op without float64, float32 weights mixed in
                ref_values, why = None, f"it raised {type(exc).__name__}: {_first_line(exc)}"
            if why is None and ref_native is not None and (
                    ref_values is None or len(ref_values) != len(ref_native)
                    or any(v.shape != n.shape for v, n in zip(ref_values, ref_native))):
                why = "on float64 arguments it returned other outputs (count or shapes) than in the inputs' dtypes"
            if why is not None:
                self.upcast_reference = False
                ref_values = ref_native
                native = _reference_precision(ref_native) if ref_native else None
                self.reference_note = (f"the reference could not run in float64 ({why}); the values are checked "
                                       f"against the reference in the inputs' dtypes ({native or 'as returned'}), "
                                       f"whose own rounding errors count against you")
        if self.reference_precision is None:
            self.reference_precision = _reference_precision(ref_values)

        # The candidate, on its own copy, with its output arguments filled with NaN.
        if self.outputs is None:
            discovered = self._discover_outputs(args, ref_native, trial)
            if isinstance(discovered, CheckReport):
                return discovered
            self.outputs = discovered
        if ran is None:
            ran = self._run_candidate(args, trial)
            if isinstance(ran, CheckReport):
                return ran
        cand, cand_args = ran
        if ref_native is None:
            return self._failed("the reference returned None: return the expected tensor(s)", trial)

        # The contract: count, shape, dtype, and plain dense tensors of their own memory.
        self.output_count = len(ref_native)
        if len(cand) != len(ref_native):
            return self._failed(f"the candidate returned {_count(len(cand))} but the reference returned "
                                f"{_count(len(ref_native))}", trial)
        for j, (c, r) in enumerate(zip(cand, ref_native)):
            if tuple(c.shape) != tuple(r.shape):
                return self._failed(f"output {j}: the candidate's shape is {tuple(c.shape)} but the reference's "
                                    f"is {tuple(r.shape)}", trial)
            if c.dtype != r.dtype:
                return self._failed(f"output {j}: the candidate's dtype is {_dtype(c.dtype)} but the reference's "
                                    f"is {_dtype(r.dtype)}", trial)
        changed = _mutations(args, cand_args, set(self.outputs))      # every input the candidate wrote
        written = set(self.outputs) | {_top_index(m[0]) for m in changed}
        fake = integrity.output_problems(cand, cand_args, written=written)
        if fake:
            return self._found("fake_output", "; ".join(fake), trial)

        # Inputs the candidate changed without returning them.
        returned_args = _aliased(cand, cand_args)
        mutated = [m for m in changed if _top_index(m[0]) not in returned_args]
        if mutated:
            names = tuple(m[0] for m in mutated)
            detail = "; ".join(f"{name} at {n:,} element{'s' if n != 1 else ''}, first at {_index(idx)}"
                               for name, n, idx in mutated)
            return self._found("input_mutated", f"the candidate changed its inputs without returning them: {detail}",
                               trial, mutated=names)

        # The values.
        for j, (c, r_nat, r_val) in enumerate(zip(cand, ref_native, ref_values)):
            comp = _compare(j, c, r_val, r_nat, self.atol, self.rtol, self.precision)
            self.max_abs = max(self.max_abs, comp.max_abs)
            self.max_rel = max(self.max_rel, comp.max_rel)
            if self.shown is None or comp.max_ratio > self.shown.max_ratio:
                self.shown = comp
            if comp.mismatches:
                self.shown = comp
                self._name_mismatch(j, c, r_val, comp, args)
                return self._mismatch_report(comp, trial)
            if self.strict:
                low = integrity.low_precision_finding(comp.max_abs, comp.ref_own_error, _rms(r_val),
                                                      self.precision or _precision_of(c.dtype), comp.dtype)
                if low is not None and self.pending_low is None:
                    self.pending_low = (low, trial)     # reported after the trials: a wrong answer elsewhere wins
        if self.strict and trial == 0:
            again = self._rerun_on_zeroed_memory(args, ref_values, ref_native, cand, trial)
            if again is not None:
                return again
        # Kept (not copied: nothing else holds the reference's; a candidate that keeps writing its own returned tensor
        # is a cache, and comparing with itself says so) for naming a later trial's earlier answer.
        self.previous_ref = tuple(r.detach() for r in ref_values)
        self.previous_cand = tuple(c.detach() for c in cand)
        if self.distribution == "given":
            self.given_passed = True
        return None

    def _run_candidate(self, args, trial):
        """(outputs, its arguments) of the candidate on a copy of `args`, or a failing report. Its output arguments
        are filled with NaN (and free GPU memory too); the threads it leaves and (strict) the ops it calls are
        watched."""
        cand_args = _clone(args)
        for i in self.outputs or ():
            _poison_(cand_args[i])
        if self.fill_free_memory:
            self.filled_bytes = max(self.filled_bytes, fill_free_memory(_cuda_devices(args)))
        watch = self.threads or integrity.ThreadWatch()   # threads alive when the check began; others: the candidate's
        recorder = integrity.OpRecorder() if self.library and trial == 0 else None
        try:
            if recorder is not None:
                with recorder:
                    returned = self.candidate(*cand_args)
            else:
                returned = self.candidate(*cand_args)
        except Exception as exc:
            return self._raised("the candidate", exc, trial)
        patched = self.guard.changed() if self.guard is not None else []
        if patched:
            self.guard.restore()
            return self._found("harness_patched", f"the candidate replaced {', '.join(patched[:6])} (put back): the "
                                                  f"comparison cannot be trusted", trial)
        thread = watch.finding("the candidate", grace_s=0.05)
        if thread is not None and not integrity.environment_threads(watch.new()):
            return self._found(thread.kind, thread.message, trial)
        if recorder is not None and recorder.streams:
            import torch

            side = recorder.streams - {torch.cuda.current_stream().cuda_stream}
            if side:
                return self._found("other_stream", f"the candidate ran torch ops on {len(side)} stream"
                                                   f"{'s' if len(side) != 1 else ''} other than the current one: "
                                                   f"work there escapes a timing on the current stream", trial)
        if recorder is not None:
            lib = integrity.library_finding(recorder.compute_ops(), self._reference_ops(args), self.allowed_ops,
                                            self.forbidden_ops)
            if lib is None and any(getattr(a, "is_cuda", False) for a in args) \
                    and "library" not in set(self.allowed_ops or ()):
                lib = self._library_kernels(args)
            if lib is not None:
                return self._found(lib.kind, lib.message, trial)
        try:
            cand = self._candidate_outputs(returned, cand_args)
        except _OutputTypeError as exc:
            return self._failed(str(exc), trial)
        if cand is None:
            return self._failed("the candidate returned None: return the output tensor(s), or name the arguments "
                                "it writes with outputs=(i, ...)", trial)
        return cand, cand_args

    def _candidate_outputs(self, returned, cand_args):
        """as_outputs of what the candidate returned, or of the arguments named by `outputs` when it returned None."""
        if returned is None and self.outputs:
            returned = tuple(cand_args[i] for i in self.outputs)
        return as_outputs(returned, "candidate")

    def _right_on_given(self, seed: int) -> bool:
        """Whether the candidate is right on the given distribution's draw for `seed` (every output in tolerance)."""
        import torch

        try:
            args = tuple(self.inputs(torch.Generator(device=self.generator_device).manual_seed(seed)))
            ref = self._call_reference(args, upcast=self.upcast_reference and _has_low_precision_float(args))
            cand_args = _clone(args)
            cand = self._candidate_outputs(self.candidate(*cand_args), cand_args)
            return cand is not None and len(cand) == len(ref) and all(
                not _compare(j, c, r, r, self.atol, self.rtol, self.precision).mismatches
                for j, (c, r) in enumerate(zip(cand, ref)))
        except Exception:
            return False

    def _library_kernels(self, args):
        """library_call when one more call of the candidate, under torch.profiler, launches a vendor library's
        kernel (cuBLAS, CUTLASS, cuDNN, flash-attention: kernels outside torch's dispatcher, e.g. through CuPy)."""
        try:
            names = integrity.profiled_kernels(lambda: self.candidate(*_clone(args)))
        except Exception:
            return None
        found = integrity.library_kernels(names)
        if not found:
            return None
        return integrity.IntegrityFinding("library_call", f"the candidate launched a library kernel: "
                                                          f"{', '.join(found[:3])} (allow it with "
                                                          f"allowed_ops=('library',))")

    def _reference_ops(self, args) -> set[str]:
        """The compute ops (aten) the reference dispatches on a copy of `args`."""
        rec = integrity.OpRecorder()
        try:
            with rec:
                self.reference(*_clone(args))
        except Exception:
            pass
        return rec.compute_ops()

    def _rerun_on_zeroed_memory(self, args, ref_values, ref_native, first, trial):
        """strict: the candidate again on the same inputs, with output arguments and free GPU memory zeroed instead
        of NaN; a finding when this run disagrees with the reference (and the first agreed)."""
        import torch

        cand_args = _clone(args)
        for i in self.outputs or ():
            if isinstance(cand_args[i], torch.Tensor):
                cand_args[i].zero_()
        if self.fill_free_memory:
            fill_free_memory(_cuda_devices(args), byte=0)
        try:
            returned = self.candidate(*cand_args)
        except Exception as exc:
            return self._raised("the candidate (second run)", exc, trial)
        try:
            cand = self._candidate_outputs(returned, cand_args)
        except _OutputTypeError as exc:
            return self._failed(str(exc), trial)
        for j, (c, r_nat, r_val) in enumerate(zip(cand or (), ref_native, ref_values)):
            comp = _compare(j, c, r_val, r_nat, self.atol, self.rtol, self.precision)
            if comp.mismatches:
                self.shown = comp
                return self._found("nondeterministic", f"a second run on the same inputs (memory zeroed, not NaN) "
                                                       f"put {comp.mismatches:,} elements of output {j} out of "
                                                       f"tolerance: it reads memory it never wrote, or races",
                                   trial, mismatches=comp.mismatches)
        return None

    def _name_mismatch(self, j, c, r_val, comp, args) -> None:
        """Name a mismatch that is an attack: the free-memory fill or the previous trial's answer (stale_output),
        the candidate's own earlier answer (cached_result), or low precision."""
        import torch

        if c.is_floating_point() and c.numel() and c.element_size() in (2, 4, 8):
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[c.element_size()]
            raw = c.detach().contiguous().view(bits)
            filled = raw == -1                              # every byte FREE_MEMORY_BYTE (0xFF)
            if bool(filled.any()):
                n = int(filled.sum())
                self.findings.append(integrity.IntegrityFinding(
                    "stale_output", f"{n:,} elements of output {j} hold the fill of free GPU memory: the candidate "
                                    f"allocated them (torch.empty) and never wrote them"))
                return
        if self.distribution != "given" and self.given_passed and self._right_on_given(self.trial_seed):
            self.findings.append(integrity.IntegrityFinding(
                "fits_test_data", f"right on the given inputs (again now, on this trial's seed), wrong on the "
                                  f"{self.distribution} distribution: an answer fitted to the test data (or a kernel "
                                  f"that breaks on those values)"))
            return
        earlier = [e for e in (self.previous_ref, self.previous_cand)
                   if e is not None and j < len(e) and tuple(e[j].shape) == tuple(c.shape)]
        if c.numel() and any(not _compare(j, c, e[j].to(r_val.dtype) if e[j].is_floating_point() else e[j], e[j],
                                          self.atol, self.rtol, self.precision).mismatches for e in earlier):
            # An earlier trial's answer. Which attack: the candidate again, right after the reference on these inputs
            # (and no free-memory fill): right now means it reads what the reference leaves behind (stale memory);
            # the earlier answer again means it keeps its own (a cache).
            kind = "cached_result"
            try:
                self._call_reference(args)
                again = as_outputs(self.candidate(*_clone(args)), "candidate")
                if again is not None and j < len(again) and tuple(again[j].shape) == tuple(c.shape) and \
                        not _compare(j, again[j], r_val, r_val, self.atol, self.rtol, self.precision).mismatches:
                    kind = "stale_output"
            except Exception:
                pass
            self.findings.append(integrity.IntegrityFinding(
                kind, f"output {j} is the answer of an earlier trial, on other inputs: "
                      + ("memory an earlier computation left, not written now (right only when the reference ran "
                         "just before it)" if kind == "stale_output"
                         else "results cached (by pointer, shape or id) or replayed")))
            return
        low = integrity.low_precision_finding(comp.max_abs, comp.ref_own_error, _rms(r_val),
                                              self.precision or _precision_of(c.dtype), comp.dtype)
        if low is not None and comp.max_ratio < 100:
            self.findings.append(low)

    def _call_reference(self, args, upcast: bool = False):
        """The reference's outputs on a copy of `args`; its output arguments where it returns None."""
        ref_args = _clone(args, upcast=upcast)
        out = as_outputs(self.reference(*ref_args), "reference")
        if out is None and self.outputs:
            out = tuple(ref_args[i] for i in self.outputs)
        return out

    def _discover_outputs(self, args, ref_native, trial):
        """Arguments the candidate returns and whose old contents the reference does not read."""
        import torch

        probe_args = _clone(args)
        try:
            returned = self.candidate(*probe_args)
        except Exception as exc:
            return self._raised("the candidate", exc, trial)
        try:
            probe = as_outputs(returned, "candidate")
        except _OutputTypeError:
            return ()
        if probe is None or ref_native is None:
            return ()
        found = []
        for i in sorted(_aliased(probe, probe_args)):
            if not _is_array(args[i]) or not _poisonable(args[i]):
                continue
            poisoned = _clone(args)
            _poison_(poisoned[i])
            try:
                ref_poisoned = as_outputs(self.reference(*poisoned), "reference")
            except Exception:
                continue                       # the reference cares about its contents: an input too
            if ref_poisoned is not None and len(ref_poisoned) == len(ref_native) and all(
                    _identical(a, b) for a, b in zip(ref_poisoned, ref_native)):
                found.append(i)
        return tuple(found)

    # reports --------------------------------------------------------------------------------------------------
    def _base(self, trial: int, passed: bool) -> dict:
        s = self.shown
        rtol, atol, prec, tol = self._tolerance_fields()
        return dict(
            passed=passed, trials=trial + 1 if not passed else trial, max_abs_error=self.max_abs,
            max_rel_error=self.max_rel, mismatches=0, worst=s.worst if s else (), rtol=rtol, atol=atol,
            precision=prec, tolerance=tol, seed=self.seed,
            failing_trial=None if passed else trial, failing_seed=None if passed else self.seed + trial,
            output_index=s.index if s else None, output_count=self.output_count,
            shape=s.shape if s else None, dtype=s.dtype if s else None,
            reference_precision=self.reference_precision, reference_own_error=s.ref_own_error if s else None,
            worst_values=s.worst_values if s else (), output_arguments=tuple(self.outputs or ()),
            generator_device=str(self.generator_device), error_map=s.error_map if s else None,
            reference_note=self.reference_note, free_memory_filled_bytes=self.filled_bytes,
            findings=tuple(self.findings), distribution=self.distribution, distributions=self.distributions,
            strict=self.strict)

    def _tolerance_fields(self):
        if self.shown is not None:
            s = self.shown
            return s.rtol, s.atol, s.precision, s.tolerance
        rtol = self.rtol if self.rtol is not None else float("nan")
        atol = self.atol if self.atol is not None else float("nan")
        return rtol, atol, self.precision or "unknown", "not reached"

    def _raised(self, who: str, exc: Exception, trial: int) -> CheckReport:
        seed = self.seed + trial
        fields = self._base(trial, passed=False)
        fields.update(message=f"{who} raised in trial {trial} (seed {seed})",
                      exception=f"{type(exc).__name__}: {exc}",
                      traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return CheckReport(**fields)

    def _failed(self, why: str, trial: int, mutated: tuple[str, ...] = ()) -> CheckReport:
        fields = self._base(trial, passed=False)
        fields.update(message=f"trial {trial} (seed {self.seed + trial}): {why}", mutated_inputs=mutated)
        return CheckReport(**fields)

    def _found(self, kind: str, why: str, trial: int, mutated: tuple[str, ...] = (), mismatches: int = 0
               ) -> CheckReport:
        """A failing report for an attack: an integrity finding of `kind`, and the message says it."""
        self.findings.append(integrity.IntegrityFinding(kind, why))
        fields = self._base(trial, passed=False)
        fields.update(message=f"trial {trial} (seed {self.seed + trial}): {kind}: {why}", mutated_inputs=mutated,
                      mismatches=mismatches)
        return CheckReport(**fields)

    def _mismatch_report(self, comp: _Compared, trial: int) -> CheckReport:
        fields = self._base(trial, passed=False)
        total = math.prod(comp.shape)
        where = f"output {comp.index} " if self.output_count > 1 else ""
        hint = ""
        if comp.precision == "float32" and comp.max_ratio < 100:
            hint = " (if it computes on TF32 tensor cores, pass precision='tf32')"
        named = f" ({self.findings[-1].kind})" if self.findings else ""
        fields.update(mismatches=comp.mismatches,
                      message=f"trial {trial} (seed {self.seed + trial}): {comp.mismatches:,} of {total:,} elements "
                              f"of {where}({comp.dtype}, shape {comp.shape}) out of tolerance{named}{hint}")
        return CheckReport(**fields)

    def passed_report(self, trials: int) -> CheckReport:
        fields = self._base(trials, passed=True)
        s = self.shown
        outs = _count(self.output_count)
        if s and self.output_count == 1:
            outs += f" ({s.dtype}, shape {s.shape})"
        fields.update(message=f"{trials} trial{'s' if trials != 1 else ''}, {outs} within tolerance")
        return CheckReport(**fields)


# --- comparing one output -----------------------------------------------------------------------------------


def _compare(j, cand, ref_values, ref_native, atol, rtol, precision) -> _Compared:
    """Compare one candidate output with the reference's values, elementwise, in float64."""
    import torch

    prec = precision or _precision_of(cand.dtype)
    d_rtol, d_atol_scale = TOLERANCES["exact" if prec == "exact" else prec]
    complex_out = cand.is_complex() or ref_values.is_complex()
    wide = torch.complex128 if complex_out else torch.float64
    r = ref_values.detach().to(wide)
    c = cand.detach().to(device=r.device, dtype=wide)

    r_abs = r.abs()
    finite_ref = torch.isfinite(r)
    rms = float(r_abs[finite_ref].pow(2).mean().sqrt()) if bool(finite_ref.any()) else 0.0
    use_rtol = d_rtol if rtol is None else float(rtol)
    if atol is not None:
        use_atol = float(atol)
        label = "explicit" if rtol is not None else f"{prec} rtol, explicit atol"
        rule = f"|yours - ref| <= atol + rtol*|ref| with rtol={use_rtol:.3g}, atol={use_atol:.3g}"
    else:
        tiny = float(torch.finfo(_finfo_dtype(prec)).tiny) if prec != "exact" else 0.0
        use_atol = d_atol_scale * rms if rms > 0 else tiny
        label = prec if rtol is None else f"explicit rtol, {prec} atol"
        rule = (f"|yours - ref| <= atol + rtol*|ref| with rtol={use_rtol:.3g}, "
                f"atol={d_atol_scale:.3g} x rms(ref) = {use_atol:.3g}")
    if rtol is None and atol is None:
        rule = f"{prec} defaults: " + rule

    diff = (c - r).abs()
    allowed = use_atol + use_rtol * r_abs
    finite_cand = torch.isfinite(c)
    both_nan = torch.isnan(r) & torch.isnan(c)
    # A finite reference: within tolerance and finite. A non-finite one: the same Inf, or NaN for NaN.
    ok = torch.where(finite_ref, (diff <= allowed) & finite_cand, (c == r) | both_nan)
    err = torch.where(finite_ref & finite_cand, diff, torch.where(ok, 0.0, math.inf))
    ratio = err / allowed.clamp_min(1e-300)   # <= 1 within tolerance; 0/inf (Inf reference) gives 0
    ratio = torch.where(ok, ratio.nan_to_num(nan=0.0, posinf=math.inf), ratio.nan_to_num(nan=math.inf, posinf=math.inf))
    nonzero_ref = finite_ref & (r_abs > 0)
    rel = torch.where(nonzero_ref, err / r_abs.clamp_min(1e-300), 0.0)

    mismatches = int((~ok).sum())
    max_abs = float(err.max()) if err.numel() else 0.0
    max_rel = float(rel.max()) if rel.numel() else 0.0
    max_ratio = float(ratio.max()) if ratio.numel() else 0.0

    worst, worst_values = _worst(ratio, c, r)
    own = None
    if ref_native is not ref_values and not complex_out:
        own_diff = (ref_native.detach().to(device=r.device, dtype=wide) - r).abs()
        own = float(own_diff[finite_ref].max()) if bool(finite_ref.any()) else 0.0
    return _Compared(index=j, max_abs=max_abs, max_rel=max_rel, max_ratio=max_ratio, mismatches=mismatches,
                     atol=use_atol, rtol=use_rtol, precision=label, tolerance=rule, worst=worst,
                     worst_values=worst_values, error_map=_error_map(ratio), shape=tuple(cand.shape),
                     dtype=_dtype(cand.dtype), ref_own_error=own)


def mismatch_count(cand, ref, atol=None, rtol=None, precision=None) -> int:
    """Elements of `cand` out of tolerance against `ref` by `_compare`'s rule, without its report (cheap)."""
    import torch

    if tuple(cand.shape) != tuple(ref.shape):
        return max(cand.numel(), ref.numel(), 1)
    prec = precision or _precision_of(cand.dtype)
    d_rtol, d_atol_scale = TOLERANCES["exact" if prec == "exact" else prec]
    wide = torch.complex128 if (cand.is_complex() or ref.is_complex()) else torch.float64
    r = ref.detach().to(wide)
    c = cand.detach().to(device=r.device, dtype=wide)
    finite_ref = torch.isfinite(r)
    rms = float(r.abs()[finite_ref].pow(2).mean().sqrt()) if bool(finite_ref.any()) else 0.0
    use_atol = float(atol) if atol is not None else d_atol_scale * rms
    use_rtol = d_rtol if rtol is None else float(rtol)
    ok = torch.where(finite_ref, ((c - r).abs() <= use_atol + use_rtol * r.abs()) & torch.isfinite(c),
                     (c == r) | (torch.isnan(r) & torch.isnan(c)))
    return int((~ok).sum())


def _worst(ratio, c, r):
    """Indices (largest error/tolerance first) and (index, yours, reference, error/tolerance) of the worst elements."""
    import torch

    n = ratio.numel()
    if n == 0:
        return (), ()
    k = min(_WORST_COUNT, n)
    flat = ratio.reshape(-1)
    top = torch.topk(flat, k).indices.cpu().numpy()
    shape = tuple(ratio.shape)
    idxs = [tuple(int(v) for v in np.unravel_index(int(t), shape)) if shape else () for t in top]
    cf, rf = c.reshape(-1), r.reshape(-1)
    values = tuple((idx, _scalar(cf[int(t)]), _scalar(rf[int(t)]), _scalar(flat[int(t)])) for idx, t in zip(idxs, top))
    return tuple(idxs), values


def _error_map(ratio):
    """error/tolerance as a 2-D NumPy array, max-pooled to at most _MAP_SHAPE (higher ranks: flattened rows)."""
    import torch

    if ratio.numel() == 0:
        return np.zeros((0, 0))
    if ratio.dim() == 0:
        grid = ratio.reshape(1, 1)
    elif ratio.dim() == 1:
        grid = ratio.reshape(1, -1)
    else:
        grid = ratio.reshape(-1, ratio.shape[-1])
    rows, cols = grid.shape
    out = (min(rows, _MAP_SHAPE[0]), min(cols, _MAP_SHAPE[1]))
    if out != (rows, cols):
        finite = torch.nan_to_num(grid, posinf=1e300)  # adaptive_max_pool2d keeps the worst cell of each block
        grid = torch.nn.functional.adaptive_max_pool2d(finite[None, None], out)[0, 0]
        grid = torch.where(grid >= 1e300, math.inf, grid)
    return grid.detach().cpu().numpy().astype(np.float64)


# --- argument helpers -----------------------------------------------------------------------------------------


class _OutputTypeError(Exception):
    """A callable returned something that is not a tensor (or a tuple of tensors)."""


def as_outputs(value, who: str):
    """A tuple of tensors from a tensor, a tuple/list of tensors, NumPy arrays or scalars; None for None."""
    import torch

    if value is None:
        return None
    items = value if isinstance(value, (tuple, list)) else (value,)
    out = []
    for k, v in enumerate(items):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, np.ndarray):
            out.append(torch.from_numpy(v))
        elif isinstance(v, (bool, int, float, complex, np.generic)):
            out.append(torch.tensor(v))
        else:
            raise _OutputTypeError(f"the {who} returned a {type(v).__name__} as output {k}; expected tensors")
    return tuple(out)


def _clone(args, upcast: bool = False):
    """A deep copy of the arguments' tensors (floating ones in float64 when `upcast`), other values as they are."""
    import torch

    def one(v):
        if isinstance(v, np.ndarray):
            if upcast and v.dtype.kind == "f" and v.dtype != np.float64:
                return v.astype(np.float64)
            if upcast and v.dtype.kind == "c" and v.dtype != np.complex128:
                return v.astype(np.complex128)
            return v.copy()
        if isinstance(v, torch.Tensor):
            t = v.detach().clone()
            if upcast and t.is_floating_point() and t.dtype != torch.float64:
                t = t.to(torch.float64)
            elif upcast and t.is_complex() and t.dtype != torch.complex128:
                t = t.to(torch.complex128)
            return t
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return v

    return tuple(one(v) for v in args)


def _has_low_precision_float(args) -> bool:
    import torch

    def walk(v):
        if isinstance(v, np.ndarray):
            return v.dtype.kind in "fc" and v.dtype not in (np.float64, np.complex128)
        if isinstance(v, torch.Tensor):
            return ((v.is_floating_point() and v.dtype != torch.float64)
                    or (v.is_complex() and v.dtype != torch.complex128))
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        if isinstance(v, dict):
            return any(walk(x) for x in v.values())
        return False

    return any(walk(v) for v in args)


def _reference_precision(outputs) -> str | None:
    if not outputs:
        return None
    for t in outputs:
        if t.is_floating_point() or t.is_complex():
            return _dtype(t.dtype)
    return _dtype(outputs[0].dtype)


def _is_array(v) -> bool:
    """A torch tensor or a NumPy array (both are arguments the check copies, fills and compares)."""
    import torch

    return isinstance(v, (torch.Tensor, np.ndarray))


def _poisonable(t) -> bool:
    import torch

    if isinstance(t, np.ndarray):
        return t.dtype != np.bool_ and t.size > 0 and t.dtype.kind in "fciu"
    return t.dtype != torch.bool and t.numel() > 0


def _poison_(t) -> None:
    """Fill an output argument with a value no correct kernel leaves there: NaN, or the integer maximum."""
    import torch

    if not _poisonable(t):
        return
    if isinstance(t, np.ndarray):
        t.fill(math.nan if t.dtype.kind in "fc" else np.iinfo(t.dtype).max)
    elif t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    else:
        t.fill_(torch.iinfo(t.dtype).max)


# Every byte 0xFF is a NaN in every floating format (float64/32/16, bfloat16; -1 in integers).
FREE_MEMORY_BYTE = 0xFF


def free_blocks(snapshot, device: int) -> list[tuple[int, int]]:
    """(address, bytes) of each free block that torch's caching allocator keeps on `device`, from
    torch.cuda.memory_snapshot(): blocks in state "inactive" of the default pool (private pools belong to CUDA graphs,
    whose replays may rely on what they left there)."""
    out = []
    for seg in snapshot:
        if seg.get("device", 0) != device or tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0):
            continue
        addr = seg["address"]
        for block in seg.get("blocks", ()):
            start = block.get("address", addr)
            if block.get("state") == "inactive" and block["size"] > 0:
                out.append((start, block["size"]))
            addr = start + block["size"]
    return out


class _RawBytes:
    """`bytes` bytes of device memory at `address`, in the CUDA array interface (torch.as_tensor wraps it)."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


def fill_free_memory(devices, byte: int = FREE_MEMORY_BYTE) -> int:
    """Fill the free blocks of torch's caching allocator on `devices` with NaN bytes (or `byte`); return the bytes
    filled.

    A candidate that allocates its result with torch.empty gets one of these blocks; where its kernel writes nothing
    the result then holds NaN, not whatever an earlier run left there (often the right answer: the reference's
    result, or the candidate's own from the previous call). Costs one memory snapshot and one fill per free block
    (at DRAM bandwidth), then a device synchronisation so that no stream reuses a block before its fill.
    """
    import torch

    if not devices or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    snapshot = torch.cuda.memory_snapshot()
    total = 0
    for device in sorted(set(devices)):
        blocks = free_blocks(snapshot, device)
        with torch.cuda.device(device):
            for address, nbytes in blocks:
                torch.as_tensor(_RawBytes(address, nbytes), device=f"cuda:{device}").fill_(byte)
                total += nbytes
            if blocks:
                torch.cuda.synchronize(device)
    return total


def _cuda_devices(args) -> set[int]:
    """The CUDA devices of the arguments' tensors (with torch's current device once CUDA is in use)."""
    import torch

    found: set[int] = set()

    def walk(v):
        if isinstance(v, torch.Tensor):
            if v.is_cuda:
                found.add(v.device.index)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    for a in args:
        walk(a)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        found.add(torch.cuda.current_device())
    return found


def _identical(a, b) -> bool:
    """Same shape, dtype and elements, NaN equal to NaN."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:
        b = b.to(a.device)
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same = same | (torch.isnan(a) & torch.isnan(b))
    return bool(same.all())


def _top_index(name: str) -> int:
    """"argument 3" or "argument 3[1]" (a name from _mutations) -> 3."""
    return int(name.split()[1].split("[")[0])


def _rms(t) -> float:
    """The root mean square of a tensor's finite values (0 for none)."""
    import torch

    if not t.numel():
        return 0.0
    a = t.detach().abs().to(torch.float64)
    a = a[torch.isfinite(a)]
    return float(a.pow(2).mean().sqrt()) if a.numel() else 0.0


def _storage_ptr(t) -> int:
    return t.untyped_storage().data_ptr()


def _aliased(outputs, args) -> set[int]:
    """Indices of top-level tensor (or NumPy array) arguments whose memory a returned tensor shares."""
    import torch

    ptrs = {_storage_ptr(o) for o in outputs if o.numel() > 0} | {o.data_ptr() for o in outputs if o.numel() > 0}
    found = set()
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.numel() > 0 and _storage_ptr(a) in ptrs:
            found.add(i)
        elif isinstance(a, np.ndarray) and a.size > 0 and a.__array_interface__["data"][0] in ptrs:
            found.add(i)
    return found


def _mutations(before, after, skip: set[int]):
    """(name, changed elements, first changed index) for each tensor argument that differs."""
    import torch

    found = []

    def walk(name, b, a):
        if isinstance(b, np.ndarray) and isinstance(a, np.ndarray) and b.dtype.kind in "fciub":
            b, a = torch.from_numpy(np.ascontiguousarray(b)), torch.from_numpy(np.ascontiguousarray(a))
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape:
                found.append((name, b.numel(), ()))
                return
            a2 = a.detach().to(b.device)
            same = (a2 == b)
            if b.is_floating_point() or b.is_complex():
                same = same | (torch.isnan(a2) & torch.isnan(b))
            changed = ~same
            n = int(changed.sum())
            if n:
                first = torch.nonzero(changed)[0].tolist() if changed.dim() else []
                found.append((name, n, tuple(int(v) for v in first)))
        elif isinstance(b, (list, tuple)) and isinstance(a, (list, tuple)):
            for k, (bb, aa) in enumerate(zip(b, a)):
                walk(f"{name}[{k}]", bb, aa)
        elif isinstance(b, dict) and isinstance(a, dict):
            for k in b:
                walk(f"{name}[{k!r}]", b[k], a.get(k))

    for i, (b, a) in enumerate(zip(before, after)):
        if i not in skip:
            walk(f"argument {i}", b, a)
    return found


# --- small formatting and validation helpers ----------------------------------------------------------------


def _validate(candidate, reference, inputs, trials, atol, rtol, precision, outputs) -> None:
    for name, f in (("candidate", candidate), ("reference", reference), ("inputs", inputs)):
        if not callable(f):
            raise CheckError(f"{name} must be callable, got {type(f).__name__}; "
                             f"e.g. check(my_add, torch.add, lambda g: (torch.randn(1000, generator=g),) * 2)")
    if not isinstance(trials, int) or trials < 1:
        raise CheckError(f"trials must be a positive integer, got {trials!r}")
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and not (isinstance(v, (int, float)) and v >= 0):
            raise CheckError(f"{name} must be a non-negative number or None (for the default), got {v!r}")
    if precision is not None and precision not in TOLERANCES:
        raise CheckError(f"precision={precision!r} has no default tolerances; expected one of "
                         f"{', '.join(TOLERANCES)}")
    if outputs is not None and not (isinstance(outputs, (tuple, list)) and all(isinstance(i, int) for i in outputs)):
        raise CheckError(f"outputs must be a tuple of argument indices, e.g. outputs=(2,), got {outputs!r}")


def _precision_of(dtype) -> str:
    import torch

    if dtype in (torch.float64, torch.complex128):
        return "float64"
    if dtype in (torch.float32, torch.complex64):
        return "float32"
    if dtype == torch.bfloat16:
        return "bfloat16"
    if dtype in (torch.float16, torch.complex32):
        return "float16"
    if dtype.is_floating_point:        # float8 and friends: as loose as the coarsest row we have
        return "bfloat16"
    return "exact"


def _finfo_dtype(precision: str):
    import torch

    return {"float64": torch.float64, "float32": torch.float32, "tf32": torch.float32,
            "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _scalar(t) -> float:
    v = t.item()
    return float(v.real) if isinstance(v, complex) else float(v)


def _first_line(exc: BaseException, width: int = 160) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if len(text) <= width else text[:width - 3] + "..."


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n} output{'s' if n != 1 else ''}"


def _arg_list(idx) -> str:
    return ", ".join(f"argument {i}" for i in idx)


def _index(idx) -> str:
    return "(" + ", ".join(str(i) for i in idx) + ("," if len(idx) == 1 else "") + ")"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return f"{v:.4g}"


def _json_num(v):
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v
