"""Grade many submissions at once, fanned out over an executor: `grade_many(exercise_id, submissions)` for one
exercise, `grade_class({exercise_id: submissions})` for a class (every exercise in one fan-out).

The grader is any callable `grade(exercise_id, submission) -> result` whose result has `.passed` and `.findings`;
by default it is `kernellab.teach.grade`, looked up by name on the worker that runs each submission (teach/ sits above
run/, so this module does not import it). For a class on a JupyterHub, the executor is a Dask client's over the GPU
pool (docs/GRADING.md): each submission is graded on one worker's GPU and its row names that GPU; a worker that
dies or hangs loses no grade (kernellab.run.fanout.jobs: its submissions are graded again elsewhere, and their rows
say so in `rerun`).
"""
from __future__ import annotations

import importlib
import math
import pickle
import time
from dataclasses import dataclass, field, replace
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
    rerun: str | None = None             # it was graded again elsewhere: its worker died or was restarted (why)
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
                "worker": self.worker, "wall_ms": self.wall_ms, "rerun": self.rerun}


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
        reruns = sum(r.rerun is not None for r in self.rows)
        gpus = len(self.devices)
        return (f"{self.exercise_id}: {self.passed} of {len(self.rows)} passed"
                + (f", {errors} could not be graded" if errors else "")
                + (f", {reruns} graded again after a lost worker" if reruns else "")
                + f" ({self.wall_s:.1f} s" + (f" on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "") + ")")

    def _cells(self, r: GradeRow) -> list:
        what = r.error or "; ".join(f"{k}: {f}" if k else f for k, f in
                                    zip([*r.kinds, *[""] * len(r.findings)], r.findings))
        return [r.submission, r.status, (what.splitlines() or [""])[0][:100], r.gpu or "-",
                f"{r.wall_ms:.0f}" if r.wall_ms is not None else "-", r.rerun or ""]

    def __str__(self) -> str:
        head = ["submission", "grade", "findings", "GPU", "ms", "re-run"]
        return self.headline() + "\n" + report.text_table(head, [self._cells(r) for r in self.rows])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = []
        for r in self.rows:
            cells = self._cells(r)
            color = {"passed": "#080", "failed": "#c00", "error": "#a60"}[r.status]
            cells[1] = report.Raw(f"<b style='color:{color}'>{r.status}</b>", r.status)
            rows.append(cells)
        return report.html_table(["submission", "grade", "findings", "GPU", "ms", "re-run"], rows,
                                 caption=self.headline())

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


def _items(submissions) -> list[tuple[str, Any]]:
    if isinstance(submissions, dict):
        return [(str(k), v) for k, v in submissions.items()]
    if isinstance(submissions, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(submissions)]
    raise GradingError("submissions must be a dict {name: submission} or a list of submissions")


def _grader(grade):
    grader = DEFAULT_GRADER if grade is None else grade
    if not callable(grader) and not (isinstance(grader, str) and ":" in grader):
        raise GradingError(f"grade must be a callable grade(exercise_id, submission) or 'module:function', "
                           f"got {grader!r}")
    return grader


def _grade_tasks(tasks: list[GradeTask], executor, timeout_s: float | None, desc: str, progress: bool
                 ) -> list[GradeRow]:
    """One row per task, in order: graded here one after another, or fanned out over the executor (a lost or hung
    worker's submissions are graded again elsewhere, and their rows say so)."""
    if executor is None:
        if tasks:
            resolve_grader(tasks[0].grader)    # fail once, here, rather than once per submission
    else:
        fanout.prepare(executor, fanout.WORKER_IMPORTS + (__name__,))   # before any task arrives
    rows: list[GradeRow | None] = [None] * len(tasks)
    bar = fanout.Progress(len(tasks), desc, progress)
    results = (fanout.JobDone(i, grade_one(t)) for i, t in enumerate(tasks)) if executor is None else \
        fanout.jobs(executor, grade_one, tasks, timeout_s=timeout_s)
    passed = 0
    for done in results:
        got, t = done.value, tasks[done.index]
        if isinstance(got, fanout.JobTimeout):
            got = GradeRow(t.name, None, error=f"no grade: {got}", worker=done.worker)
        elif isinstance(got, BaseException):
            got = GradeRow(t.name, None, error=f"the grading task failed: {type(got).__name__}: {got}",
                           worker=done.worker)
        if done.rerun:
            got = replace(got, rerun=done.rerun)
        rows[done.index] = got
        passed += got.passed is True
        bar.update(1, f"{passed} passed")
    bar.close()
    return rows


def grade_many(exercise_id: str, submissions, *, executor=None, grade: Callable | str | None = None,
               progress: bool = True, timeout_s: float | None = None) -> GradeTable:
    """Grade every submission of one exercise: one row per submission, in the order given.

    submissions: {name: submission} or a list (named by position). executor: any concurrent.futures.Executor
    (Dask's `Client(...).get_executor()` grades on the cluster's workers, each on its GPU); None grades here, one
    after another. grade: `grade(exercise_id, submission) -> result with .passed and .findings`; default
    kernellab.teach.grade, found by name where each submission is graded (it takes a kernel or the cell's source
    text). timeout_s (Dask executors): a submission still being graded that long after it started is given up, as
    an error row, and its worker restarted; a worker that dies or is restarted loses nothing: its submissions are
    graded again elsewhere and their rows say so (`rerun`).
    """
    return grade_class({exercise_id: submissions}, executor=executor, grade=grade, progress=progress,
                       timeout_s=timeout_s).tables[0]


@dataclass(frozen=True)
class ClassGrades:
    """The grades of a class: one GradeTable per exercise, graded together in one fan-out."""

    tables: tuple[GradeTable, ...]
    wall_s: float = 0.0

    def table(self, exercise_id: str) -> GradeTable:
        for t in self.tables:
            if t.exercise_id == exercise_id:
                return t
        raise KeyError(f"no exercise {exercise_id!r} in these grades")

    @property
    def rows(self) -> tuple[GradeRow, ...]:
        return tuple(r for t in self.tables for r in t.rows)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tables)

    def headline(self) -> str:
        rows = self.rows
        errors = sum(r.passed is None for r in rows)
        reruns = sum(r.rerun is not None for r in rows)
        gpus = len(dict.fromkeys(r.gpu for r in rows if r.gpu))
        return (f"{len(rows)} submissions over {len(self.tables)} exercises: {self.passed} passed"
                + (f", {errors} could not be graded" if errors else "")
                + (f", {reruns} graded again after a lost worker" if reruns else "")
                + f" ({self.wall_s:.1f} s" + (f" on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "") + ")")

    def __str__(self) -> str:
        return "\n\n".join([self.headline()] + [str(t) for t in self.tables])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return f"<div><b>{report.esc(self.headline())}</b></div>" + "".join(t._repr_html_() for t in self.tables)

    def to_json(self) -> dict:
        """{"kind": "class-grades", "version": 1, "title", "tables" (GradeTable.to_json), "wall_s"}."""
        return {"kind": "class-grades", "version": 1, "title": self.headline(),
                "tables": [t.to_json() for t in self.tables], "wall_s": self.wall_s}


def grade_class(work: dict, *, executor=None, grade: Callable | str | None = None, progress: bool = True,
                timeout_s: float | None = None) -> ClassGrades:
    """Grade a class: `work` is {exercise_id: submissions} (each as grade_many takes them), all fanned out at once
    over `executor` (so no GPU idles between exercises), the exercises whose checks touch the most elements first;
    one GradeTable per exercise, in the order given, rows in the order given. grade and timeout_s as in grade_many."""
    if not isinstance(work, dict) or not work:
        raise GradingError("work must be a dict {exercise_id: submissions}, e.g. {'01-reverse': {'ana': source}}")
    grader = _grader(grade)
    t0 = time.perf_counter()
    spans, tasks = {}, []
    # the exercises whose checks touch the most elements go out first: a pool's last wave is then the cheap ones'
    for exercise_id in sorted(work, key=lambda e: -_checked_elements(str(e))):      # stable: ties as given
        items = _items(work[exercise_id])
        spans[exercise_id] = (len(tasks), len(tasks) + len(items))
        tasks += [GradeTask(str(exercise_id), name, sub, grader) for name, sub in items]
    desc = f"grade {next(iter(work))}" if len(work) == 1 else f"grade {len(work)} exercises"
    rows = _grade_tasks(tasks, executor, timeout_s, desc, progress)
    wall_s = time.perf_counter() - t0
    return ClassGrades(tuple(GradeTable(str(e), tuple(rows[spans[e][0]:spans[e][1]]), wall_s) for e in work),
                       wall_s)


def _checked_elements(exercise_id: str) -> int:
    """The elements a kernellab.teach exercise's checks touch on a GPU (the sum over its shapes of their sizes): a
    guess of its grading cost, used only to order a class's submissions; 0 for an exercise kernellab does not know."""
    try:
        ex = importlib.import_module("kernellab.teach").exercise(exercise_id)
    except (ImportError, KernellabError):
        return 0
    return sum(math.prod(shape) for shape in ex.shapes)
