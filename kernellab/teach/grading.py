"""Grade many submissions of one exercise at once, fanned out over an executor: `grade_many(exercise_id, submissions)`.

The grader is any callable `grade(exercise_id, submission) -> result` whose result has `.passed` and `.findings`;
by default it is `kernellab.teach.grade`, looked up by name on the worker that runs each submission (teach/ sits above
run/, so this module does not import it). For a class on a JupyterHub, the executor is a Dask client's over the GPU
pool (docs/GRADING.md): each submission is graded on one worker's GPU and its row names that GPU.
"""
from __future__ import annotations

import importlib
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import report
from ..errors import KernellabError
from ..run import fanout
from ..run.measure.autotune import where

DEFAULT_GRADER = "kernellab.teach:grade"


class GradingError(KernellabError, ValueError):
    """`grade_many` was called with something it cannot use."""


@dataclass(frozen=True)
class GradeRow:
    """One submission's grade: passed or not, what the grader found, where and how long it ran."""

    submission: str                      # its name (the key of the submissions dict, or its position)
    passed: bool | None                  # None when the grader itself failed (see error)
    findings: tuple[str, ...] = ()
    error: str | None = None             # the grader raised, or the task could not run
    device: str | None = None            # the GPU model the grader ran on
    gpu: str | None = None               # which GPU: model, host and PCI bus id
    worker: str | None = None
    wall_ms: float | None = None
    result: Any = field(default=None, repr=False, compare=False)   # the grader's own result, where it could travel
    kinds: tuple[str, ...] = ()          # each finding's kind, in order ("stale_output", "impossible_speed", ...)

    @property
    def status(self) -> str:
        return "error" if self.passed is None else "passed" if self.passed else "failed"

    @property
    def finding(self) -> str | None:
        """The kind of the first finding (what rejected it), or None."""
        return self.kinds[0] if self.kinds else None

    @property
    def ranked(self) -> bool:
        """Whether its time may be ranked: it passed and no finding flags it (an impossible speed never is)."""
        return self.passed is True and not self.kinds

    def to_json(self) -> dict:
        return {"submission": self.submission, "status": self.status, "passed": self.passed,
                "findings": list(self.findings), "kinds": list(self.kinds), "finding": self.finding,
                "ranked": self.ranked, "error": self.error, "device": self.device, "gpu": self.gpu,
                "worker": self.worker, "wall_ms": self.wall_ms}


@dataclass(frozen=True)
class GradeTable:
    """The grades of one exercise: one row per submission, in the order given."""

    exercise_id: str
    rows: tuple[GradeRow, ...]
    wall_s: float = 0.0

    @property
    def passed(self) -> int:
        return sum(r.passed is True for r in self.rows)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.gpu for r in self.rows if r.gpu))

    def row(self, submission: str) -> GradeRow:
        for r in self.rows:
            if r.submission == submission:
                return r
        raise KeyError(f"no submission {submission!r}")

    def headline(self) -> str:
        errors = sum(r.passed is None for r in self.rows)
        gpus = len(self.devices)
        return (f"{self.exercise_id}: {self.passed} of {len(self.rows)} passed"
                + (f", {errors} could not be graded" if errors else "")
                + f" ({self.wall_s:.1f} s" + (f" on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "") + ")")

    def _cells(self, r: GradeRow) -> list:
        what = r.error or "; ".join(f"{k}: {f}" if k else f for k, f in
                                    zip([*r.kinds, *[""] * len(r.findings)], r.findings))
        return [r.submission, r.status, (what.splitlines() or [""])[0][:100], r.gpu or "-",
                f"{r.wall_ms:.0f}" if r.wall_ms is not None else "-"]

    def __str__(self) -> str:
        head = ["submission", "grade", "findings", "GPU", "ms"]
        return self.headline() + "\n" + report.text_table(head, [self._cells(r) for r in self.rows])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = []
        for r in self.rows:
            cells = self._cells(r)
            color = {"passed": "#080", "failed": "#c00", "error": "#a60"}[r.status]
            cells[1] = report.Raw(f"<b style='color:{color}'>{r.status}</b>", r.status)
            rows.append(cells)
        return report.html_table(["submission", "grade", "findings", "GPU", "ms"], rows, caption=self.headline())

    def to_json(self) -> dict:
        """{"kind": "grades", "version": 1, "title", "exercise_id", "passed", "rows" (GradeRow.to_json), "wall_s"}."""
        return {"kind": "grades", "version": 1, "title": self.headline(), "exercise_id": self.exercise_id,
                "passed": self.passed, "rows": [r.to_json() for r in self.rows], "wall_s": self.wall_s}


@dataclass(frozen=True)
class GradeTask:
    """One submission to grade: plain data plus the grader (a callable, or "module:function" found on the worker)."""

    exercise_id: str
    name: str
    submission: Any
    grader: Any


def resolve_grader(grader) -> Callable:
    """The grading callable: `grader` itself, or the function a "module:function" string names."""
    if callable(grader):
        return grader
    mod, _, attr = str(grader).partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise GradingError(f"the grader {grader!r} is not available here ({type(exc).__name__}: {exc}); "
                           f"kernellab.teach provides kernellab.teach.grade, or pass grade=your_grader") from None


def grade_one(task: GradeTask) -> GradeRow:
    """Grade one submission where this runs; a grader that raises gives a row with the error, not an exception."""

    here = where()
    t0 = time.perf_counter()
    base = {"submission": task.name, "device": here.device, "gpu": here.gpu, "worker": here.worker}
    try:
        result = resolve_grader(task.grader)(task.exercise_id, task.submission)
    except Exception as exc:
        return GradeRow(passed=None, error=f"{type(exc).__name__}: {exc}",
                        wall_ms=(time.perf_counter() - t0) * 1e3, **base)
    wall_ms = (time.perf_counter() - t0) * 1e3
    if not hasattr(result, "passed"):
        return GradeRow(passed=None, error=f"the grader returned a {type(result).__name__} without .passed",
                        wall_ms=wall_ms, **base)
    findings = getattr(result, "findings", ()) or ()
    if isinstance(findings, str):
        findings = (findings,)
    kinds = tuple(str(getattr(f, "kind", "")) for f in findings if getattr(f, "kind", None))
    try:
        pickle.dumps(result)
        keep = result
    except Exception:                  # e.g. it holds a live kernel: the summary travels, the object stays
        keep = None
    return GradeRow(passed=bool(result.passed), findings=tuple(str(f) for f in findings), wall_ms=wall_ms,
                    result=keep, kinds=kinds, **base)


def grade_many(exercise_id: str, submissions, *, executor=None, grade: Callable | str | None = None,
               progress: bool = True) -> GradeTable:
    """Grade every submission of one exercise: one row per submission, in the order given.

    submissions: {name: submission} or a list (named by position). executor: any concurrent.futures.Executor
    (Dask's `Client(...).get_executor()` grades on the cluster's workers, each on its GPU); None grades here, one
    after another. grade: `grade(exercise_id, submission) -> result with .passed and .findings`; default
    kernellab.teach.grade, found by name where each submission is graded.
    """
    if isinstance(submissions, dict):
        items = [(str(k), v) for k, v in submissions.items()]
    elif isinstance(submissions, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(submissions)]
    else:
        raise GradingError("submissions must be a dict {name: submission} or a list of submissions")
    grader = DEFAULT_GRADER if grade is None else grade
    if not callable(grader) and not (isinstance(grader, str) and ":" in grader):
        raise GradingError(f"grade must be a callable grade(exercise_id, submission) or 'module:function', "
                           f"got {grader!r}")
    if executor is None:
        resolve_grader(grader)                 # fail once, here, rather than once per submission
    else:
        fanout.prepare(executor, fanout.WORKER_IMPORTS + (__name__,))   # before any task arrives
    t0 = time.perf_counter()
    tasks = [GradeTask(str(exercise_id), name, sub, grader) for name, sub in items]
    rows: list[GradeRow | None] = [None] * len(tasks)
    bar = fanout.Progress(len(tasks), f"grade {exercise_id}", progress)
    results = ((i, grade_one(t)) for i, t in enumerate(tasks)) if executor is None else \
        fanout.stream(executor, grade_one, tasks)
    passed = 0
    for i, got in results:
        if isinstance(got, BaseException):
            got = GradeRow(tasks[i].name, None, error=f"the grading task failed: {type(got).__name__}: {got}")
        rows[i] = got
        passed += got.passed is True
        bar.update(1, f"{passed} passed")
    bar.close()
    return GradeTable(str(exercise_id), tuple(rows), time.perf_counter() - t0)
