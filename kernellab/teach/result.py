"""What `kernellab.grade` and `kernellab.exercises` return: a verdict with its findings, and the list of exercises."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import report

_CELL = "padding: 2px 8px; text-align: left; vertical-align: top; border-bottom: 1px solid #ddd"


def _code(text: str) -> str:
    """HTML-escaped text with its `backticked` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", report.esc(text))


def _table(headers, rows) -> str:
    """A left-aligned HTML table of already-escaped cells (prose reads better left-aligned than report's tables)."""
    head = "".join(f"<th style='{_CELL}'>{report.esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table style='{report.STYLE}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(frozen=True)
class Finding:
    """One problem the grader found: its kind, what it saw, a hint tied to the cause, and the cell line if known."""

    kind: str                    # "out_of_bounds", "race", "missing_barrier", "unwritten", "wrong_values", ...
    message: str                 # "out of bounds at cell line 6: `c[i] = a[i] + b[i];`"
    hint: str = ""               # "guard `i < n`: the grid is rounded up to whole blocks"
    cell_line: int | None = None  # the line in the learner's cell, where the cause is known
    where: str = ""              # the launch or check it came from: "n=257, grid (2,1,1), block (256,1,1)"

    def __str__(self) -> str:
        text = self.message + (f" [{self.where}]" if self.where else "")
        return text + (f"\n    hint: {self.hint}" if self.hint else "")

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message, "hint": self.hint, "cell_line": self.cell_line,
                "where": self.where}


@dataclass(frozen=True)
class Check:
    """One thing the grader checked, and whether it held."""

    what: str                    # "compiles for sm_90", "n=257 with block 128", "memcheck"
    passed: bool
    detail: str = ""

    def to_json(self) -> dict:
        return {"check": self.what, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class Speed:
    """The optional speed bar: the kernel against a PyTorch baseline, timed in one run. Never needed to pass."""

    bar: str                     # ">= 70% of the speed of a copy of the same bytes"
    fraction: float              # the bar
    ratio: float                 # the kernel's speed / the baseline's (baseline time / kernel time)
    kernel_ms: float
    baseline_ms: float
    gbps: float | None = None    # the kernel's achieved GB/s, where the exercise declares its bytes
    shape: tuple = ()

    @property
    def met(self) -> bool:
        return self.ratio >= self.fraction

    def __str__(self) -> str:
        rate = f", {self.gbps:,.0f} GB/s" if self.gbps else ""
        return (f"speed: {self.kernel_ms * 1e3:.1f} us{rate}, {self.ratio:.0%} of the baseline's speed "
                f"(bar {self.bar}: {'met' if self.met else 'not met'}; optional) at shape {self.shape}")

    def to_json(self) -> dict:
        return {"bar": self.bar, "fraction": self.fraction, "ratio": self.ratio, "met": self.met,
                "kernel_ms": self.kernel_ms, "baseline_ms": self.baseline_ms, "gbps": self.gbps,
                "shape": list(self.shape)}


@dataclass(frozen=True)
class GradeResult:
    """The grader's verdict on one kernel for one exercise: passed or not, each finding with a hint, what ran."""

    exercise: str                # "01-reverse"
    title: str
    kernel: str                  # the kernel's name
    passed: bool                 # no finding in what could be checked here
    findings: tuple[Finding, ...]
    checks: tuple[Check, ...] = ()
    complete: bool = True        # False: part of the grading needs a GPU (`needs_gpu` says which)
    needs_gpu: str = ""          # what was not graded here, in one sentence
    speed: Speed | None = None   # the optional speed bar, where it was measured
    seed: int | None = None      # the inputs' seed (fresh each grading)
    notes: tuple[str, ...] = ()
    # where the grading's time went: (step, seconds) in order ("compile", "launches (GPU)", "compute-sanitizer
    # racecheck", ...), and the CPU seconds it used ("cpu: this process", "cpu: tools' processes")
    stage_s: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    # what each compute-sanitizer run cost the host: (step, kernellab.run.findings.ToolCost) in order: wall and CPU
    # seconds of the tool's processes, bytes read, its start-up to the first kernel, the kernel, its tail
    tool_costs: tuple = field(default=(), compare=False)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def verdict(self) -> str:
        """'passed', 'failed', 'passed as far as it can be graded here', or 'not run here' (the kernel could not run
        without a GPU, so nothing says it works: never 'passed')."""
        if not self.passed:
            return "not run here: it needs a GPU" if not self.findings and self.needs_gpu else "failed"
        return "passed" if self.complete else "passed as far as it can be graded without a GPU"

    def headline(self) -> str:
        verdict = self.verdict.upper() if self.complete or (not self.passed and self.findings) else self.verdict
        return f"{self.exercise} · {self.title} ({self.kernel}): {verdict}"

    def __str__(self) -> str:
        lines = [self.headline()]
        for f in self.findings:
            lines.append("  x " + str(f).replace("\n", "\n  "))
        if self.passed:
            lines += [f"  ok {c.what}" + (f": {c.detail}" if c.detail else "") for c in self.checks if c.passed]
        if self.needs_gpu:
            lines.append(f"  needs a GPU: {self.needs_gpu}")
        if self.speed is not None:
            lines.append(f"  {self.speed}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.seed is not None:
            lines.append(f"  inputs: seed={self.seed} (grade again with seed={self.seed} for the same inputs)")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#080" if self.passed and self.complete else "#a60" if self.passed else "#c00"
        mark = "&#10004;" if self.passed else "&#10008;"
        out = [f"<div style='color:{color};font-weight:bold'>{mark} {report.esc(self.headline())}</div>"]
        if self.findings:
            rows = [[f"<b>{report.esc(f.kind)}</b>",
                     _code(f.message) + (f"<br><span style='color:#666'>{report.esc(f.where)}</span>" if f.where else ""),
                     "-" if f.cell_line is None else str(f.cell_line), f"<i>{_code(f.hint)}</i>"]
                    for f in self.findings]
            out.append(_table(["finding", "what the grader saw", "cell line", "hint"], rows))
        if self.checks:
            rows = [["<span style='color:#080'>&#10004;</span>" if c.passed else "<span style='color:#c00'>&#10008;</span>",
                     report.esc(c.what), _code(c.detail)] for c in self.checks]
            out.append("<details><summary style='color:#666'>what was checked "
                       f"({sum(c.passed for c in self.checks)} of {len(self.checks)} held)</summary>"
                       + _table(["", "check", "detail"], rows) + "</details>")
        if self.needs_gpu:
            out.append(f"<div style='color:#a60'>needs a GPU: {report.esc(self.needs_gpu)}</div>")
        if self.speed is not None:
            out.append(f"<div style='color:{'#080' if self.speed.met else '#666'}'>{report.esc(str(self.speed))}</div>")
        out += [f"<div style='color:#666'>note: {report.esc(n)}</div>" for n in self.notes]
        if self.seed is not None:
            out.append(f"<div style='color:#666'>inputs: <code>seed={self.seed}</code> (grade again with "
                       f"<code>seed={self.seed}</code> for the same inputs)</div>")
        return "".join(out)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "grade", "version": 1, "title", "exercise", "kernel", "passed", "complete", "verdict",
        "needs_gpu", "findings" ([{kind, message, hint, cell_line, where}]), "checks" ([{check, passed, detail}]),
        "speed" ({bar, fraction, ratio, met, kernel_ms, baseline_ms, gbps, shape} or null), "seed", "notes"}."""
        return {"kind": "grade", "version": 1, "title": self.headline(), "exercise": self.exercise,
                "kernel": self.kernel, "passed": self.passed, "complete": self.complete, "verdict": self.verdict,
                "needs_gpu": self.needs_gpu, "findings": [f.to_json() for f in self.findings],
                "checks": [c.to_json() for c in self.checks],
                "speed": None if self.speed is None else self.speed.to_json(), "seed": self.seed,
                "notes": list(self.notes), "stage_s": dict(self.stage_s),
                "tool_costs": [[step, cost.to_json()] for step, cost in self.tool_costs]}


@dataclass(frozen=True)
class ExerciseTable:
    """The registered exercises: id, tutorial, title and what each tests."""

    rows: tuple[tuple[str, str, str, str, str], ...]    # (id, tutorial, title, tests, kind)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r[0] for r in self.rows)

    def __str__(self) -> str:
        widths = [max(len(str(r[i])) for r in (("id", "tutorial", "title", "tests", "kind"), *self.rows))
                  for i in range(5)]
        lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
                 for r in (("id", "tutorial", "title", "tests", "kind"), tuple("-" * w for w in widths), *self.rows)]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = [[f"<code>{report.esc(r[0])}</code>", *(report.esc(v) for v in r[1:])] for r in self.rows]
        caption = (f"<div style='font-weight:bold'>{len(self.rows)} exercises: "
                   f"<code>kernellab.grade(id, kernel)</code> grades one</div>")
        return caption + _table(["id", "tutorial", "title", "tests", "kind"], rows)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "exercises", "version": 1, "title", "exercises": [{id, tutorial, title, tests, kind}]}."""
        return {"kind": "exercises", "version": 1, "title": f"{len(self.rows)} exercises",
                "exercises": [dict(zip(("id", "tutorial", "title", "tests", "kind"), r)) for r in self.rows]}
