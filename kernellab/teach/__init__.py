"""Graded exercises: `kernellab.exercises()` lists them, `kernellab.grade(id, kernel)` grades a learner's kernel.

Each tutorial's exercises live in one module here, `ex<NN>_<name>.py` (e.g. ex01_first_kernel.py), and register
themselves on import with `register(Exercise(...))`; `exercises()` and `grade()` import every such module first.
How to add one: docs/AUTHORING-EXERCISES.md. What a grader runs: kernellab/teach/grader.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import linecache
import pkgutil
import time
import traceback

from ..errors import KernellabError
from ..kernel import compile_cuda

from .grader import DEFAULT_HINTS, ExerciseError, grade as _grade, spec_problems
from .result import Check, ExerciseTable, Finding, GradeResult, Speed
from .spec import Exercise, Launch, SassRule, SpeedBar, ceil_div

__all__ = ["Check", "DEFAULT_HINTS", "Exercise", "ExerciseError", "ExerciseTable", "Finding", "GradeResult",
           "Launch", "SassRule", "Speed", "SpeedBar", "ceil_div", "exercise", "exercises", "grade", "register",
           "kernel_from_cell", "spec_problems", "unregister"]

_REGISTRY: dict[str, Exercise] = {}
_loaded = False


def register(ex: Exercise) -> Exercise:
    """Add `ex` to the registry (an exercise module calls this on import); the same id twice is an error."""
    old = _REGISTRY.get(ex.id)
    if old is not None and old is not ex:
        raise ExerciseError(f"exercise id {ex.id!r} is registered twice ({old.tutorial}: {old.title!r} and "
                            f"{ex.tutorial}: {ex.title!r}); give each exercise its own id")
    _REGISTRY[ex.id] = ex
    return ex


def unregister(exercise_id: str) -> None:
    """Remove an exercise (tests that register their own)."""
    _REGISTRY.pop(exercise_id, None)


def _load_all() -> None:
    """Import every `kernellab.teach.ex*` module once: each registers its tutorial's exercises."""
    global _loaded
    if _loaded:
        return
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("ex") and info.name[2:3].isdigit():
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def exercise(exercise_id: str) -> Exercise:
    """The exercise of that id (ExerciseError listing the ids there are, if none)."""
    _load_all()
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ExerciseError(f"no exercise {exercise_id!r}; the exercises are: {known} "
                            f"(kernellab.exercises() lists them)") from None


def exercises(tutorial: str | None = None) -> ExerciseTable:
    """The exercises (of one tutorial: "01" or "01-first-kernel"), in tutorial order: id, tutorial, title, tests."""
    _load_all()
    rows = []
    for ex in sorted(_REGISTRY.values(), key=lambda e: (e.tutorial, _order(e))):
        if tutorial is not None and tutorial not in (ex.tutorial, ex.number):
            continue
        rows.append((ex.id, ex.tutorial, ex.title, ex.tests, ex.kind))
    return ExerciseTable(rows=tuple(rows))


def grade(exercise_id: str, kernel, *, seed: int | None = None, speed: bool = True) -> GradeResult:
    """Grade `kernel` for exercise `exercise_id`: a GradeResult (passed, findings with hints); never raises for a
    wrong kernel. `kernel` is the kernel the exercise's cell defines, or that cell's source text (what a class
    submits: compiled, or run as Python for a Numba exercise, as the cell would be; a cell that does not compile is
    a `compile_error` finding). Without a GPU a %%cuda kernel is graded as far as the compiler allows, and the
    result says what needs a GPU. `seed` fixes the random inputs (default: fresh each time); speed=False skips the
    speed bar."""
    ex = exercise(exercise_id)
    compile_s = None
    if isinstance(kernel, str):
        t0 = time.perf_counter()
        kernel = kernel_from_cell(ex, kernel)
        compile_s = round(time.perf_counter() - t0, 4)
        if isinstance(kernel, GradeResult):
            return dataclasses.replace(kernel, stage_s=(("compile", compile_s),))
    result = _grade(ex, kernel, seed=seed, speed=speed)
    if compile_s is None:
        return result
    return dataclasses.replace(result, stage_s=(("compile", compile_s),) + result.stage_s)


def kernel_from_cell(ex: Exercise, source: str):
    """The kernel (or module) a cell's source text defines, built as the exercise's cell builds it (a %%cuda cell's
    body compiled for the tutorial's arch, its first line numbered 2; a Numba cell run as Python), or a failed
    GradeResult with a `compile_error` finding when it cannot be built."""
    try:
        if ex.kind == "cuda":
            return compile_cuda(source, arch=ex.arch, first_line=2, filename="cell.cu")
        # Numba (its debug info) and the simulator (the cell lines its findings quote) read the source back
        filename = f"<cell {ex.id} {hashlib.sha1(source.encode()).hexdigest()[:12]}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict = {"__name__": "kernellab_cell"}
        exec(compile(source, filename, "exec"), namespace)
        if ex.kernel not in namespace:
            return None               # the grader's no_kernel finding names what is missing
        return namespace[ex.kernel]
    except Exception as exc:                     # whatever the cell raises is its finding
        if isinstance(exc, KernellabError):
            message = str(exc).strip()
        elif isinstance(exc, SyntaxError):
            message = f"the cell has a SyntaxError at line {exc.lineno}: {exc.msg}"
        else:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell ")]
            at = f" at line {frames[-1].lineno}" if frames else ""
            message = f"the cell raised {type(exc).__name__}{at}: {exc}"
        lines = message.splitlines() or [type(exc).__name__]
        first = next((l for l in lines if "error:" in l or ": error" in l), lines[0])
        finding = Finding(kind="compile_error", message=first.strip(),
                          hint=ex.hints.get("compile_error", DEFAULT_HINTS["compile_error"]))
        return GradeResult(exercise=ex.id, title=ex.title, kernel=ex.kernel, passed=False, findings=(finding,),
                           notes=(message[-2000:],))


def _order(ex: Exercise) -> int:
    """Registration order within a tutorial: the order its module registers them in (the notebook's)."""
    return list(_REGISTRY).index(ex.id)
