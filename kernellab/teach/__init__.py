"""Graded exercises: `kernellab.exercises()` lists them, `kernellab.grade(id, kernel)` grades a learner's kernel.

Each tutorial's exercises live in one module here, `ex<NN>_<name>.py` (e.g. ex01_first_kernel.py), and register
themselves on import with `register(Exercise(...))`; `exercises()` and `grade()` import every such module first.
How to add one: docs/AUTHORING-EXERCISES.md. What a grader runs: kernellab/teach/grader.py.
"""
from __future__ import annotations

import importlib
import pkgutil

from .grader import DEFAULT_HINTS, ExerciseError, grade as _grade, spec_problems
from .result import Check, ExerciseTable, Finding, GradeResult, Speed
from .spec import Exercise, Launch, SassRule, SpeedBar, ceil_div

__all__ = ["Check", "DEFAULT_HINTS", "Exercise", "ExerciseError", "ExerciseTable", "Finding", "GradeResult",
           "Launch", "SassRule", "Speed", "SpeedBar", "ceil_div", "exercise", "exercises", "grade", "register",
           "spec_problems", "unregister"]

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
    wrong kernel. Without a GPU a %%cuda kernel is graded as far as the compiler allows, and the result says what
    needs a GPU. `seed` fixes the random inputs (default: fresh each time); speed=False skips the speed bar."""
    return _grade(exercise(exercise_id), kernel, seed=seed, speed=speed)


def _order(ex: Exercise) -> int:
    """Registration order within a tutorial: the order its module registers them in (the notebook's)."""
    return list(_REGISTRY).index(ex.id)
