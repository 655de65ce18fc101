"""The findings the sanitizer and the simulator's checks share: a Location, a Finding, a SanitizerReport.

compute-sanitizer's reports (run/nvtools/sanitize.py) and the Numba simulator's racecheck, synccheck and initcheck
(run/sim/race.py) build the same values, so notebooks, graders and the extension read one shape whichever found it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .. import report


@dataclass(frozen=True)
class Location:
    """Where an access happened: function, PC offset, source file and line (and the cell's text of that line)."""

    function: str = ""
    pc: int | None = None
    file: str | None = None
    line: int | None = None
    cell_line: int | None = None       # the line in the user's cell/source, when the file is the job's source
    source_line: str | None = None

    def __str__(self) -> str:
        if self.cell_line is not None:
            text = f"line {self.cell_line}"
            if self.source_line:
                text += f": {self.source_line.strip()}"
            return text
        if self.file and self.line:
            return f"{os.path.basename(self.file)}:{self.line}"
        return f"{self.function}+{self.pc:#x}" if self.pc is not None else (self.function or "?")


@dataclass(frozen=True)
class Finding:
    """One distinct problem the sanitizer reported (its first occurrence, and how many times it was reported)."""

    tool: str
    kind: str                          # "invalid_write", "invalid_read", "misaligned", "race", "uninitialized_read",
                                       # "barrier", "hardware_exception", or the headline as a slug
    message: str                       # the tool's headline, e.g. "Invalid __global__ write of size 4 bytes"
    where: Location
    thread: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    address: str | None = None
    size_bytes: int | None = None
    detail: str = ""                   # e.g. "out of bounds; 4 bytes after the nearest allocation ... of size 4096"
    other: Location | None = None      # races: the other access
    other_access: str | None = None    # races: "Read", "Write"
    access: str | None = None          # races: the first access's kind
    other_thread: tuple[int, int, int] | None = None  # races: the thread of the other access
    count: int = 1

    @property
    def function(self) -> str:
        return self.where.function

    @property
    def hazard(self) -> str | None:
        """A race's hazard type: 'RAW', 'WAR' or 'WAW' (None for other findings, or a race the tool did not type)."""
        m = re.search(r"\b(RAW|WAR|WAW) hazard", self.message)
        return m.group(1) if m else None

    @property
    def lines(self) -> tuple:
        """The source line(s) of the finding: (line,) or, for a race, (line, other line); cell lines where known."""
        def line(loc):
            return loc.cell_line if loc.cell_line is not None else loc.line

        return (line(self.where),) if self.other is None else (line(self.where), line(self.other))

    def describe(self) -> str:
        """Two lines: what and where, then who (thread, block) and the details.

        'Invalid __global__ write of size 4 bytes at line 4: x[i + n] = 1.0f;'
        '    by thread (0,0,0) in block (4,0,0); out of bounds; 1 bytes after ... [reported 20 times]'
        """
        head = f"{self.message} at {self.where}"
        if self.other is not None:
            head = (f"{self.message}: {self.access or 'access'} at {self.where}\n    and {self.other_access or 'access'}"
                    f" at {self.other}")
        who = []
        if self.thread is not None:
            threads = f"threads {_dim(self.thread)} and {_dim(self.other_thread)}" if self.other_thread else \
                f"thread {_dim(self.thread)}"
            who.append(f"by {threads}" + (f" in block {_dim(self.block)}" if self.block else ""))
        elif self.block is not None:
            who.append(f"in block {_dim(self.block)}")
        if self.detail:
            who.append(self.detail)
        if self.count > 1:
            who.append(f"reported {self.count:,} times")
        return head + ("\n    " + "; ".join(who) if who else "")

    def to_json(self) -> dict:
        def loc(l):
            return None if l is None else {"function": l.function, "pc": l.pc, "file": l.file, "line": l.line,
                                           "cell_line": l.cell_line, "source_line": l.source_line}

        return {"tool": self.tool, "kind": self.kind, "message": self.message, "where": loc(self.where),
                "thread": list(self.thread) if self.thread else None, "block": list(self.block) if self.block else None,
                "address": self.address, "size_bytes": self.size_bytes, "detail": self.detail,
                "other": loc(self.other), "access": self.access, "other_access": self.other_access,
                "other_thread": list(self.other_thread) if self.other_thread else None, "count": self.count}


def _dim(t) -> str:
    return "(" + ",".join(map(str, t)) + ")"


@dataclass(frozen=True)
class ToolCost:
    """What one compute-sanitizer run cost the host, by part, to tell apart where its time goes: the cores (CPU
    seconds against wall), the disk (bytes read from storage), its start-up before the kernel, the kernel under the
    tool, its tail after. None: not measured here (no /proc, no result file from the job)."""

    wall_s: float                          # the tool's process, spawn to exit (a warm one: the job sent -> its report)
    cpu_s: float | None = None             # user + system CPU seconds of the tool's processes (the target included)
    read_bytes: int | None = None          # bytes they read from storage (/proc/<pid>/io read_bytes): the disk
    read_chars: int | None = None          # bytes they read by any read() (rchar: the page cache included)
    tool_start_s: float | None = None      # spawn -> the target process started: the tool's own start-up
    imports_s: float | None = None         # the target's start -> its job ready (Python, kernellab, the job file)
    context_s: float | None = None         # job ready -> module loaded: the CUDA context and the module, under the tool
    to_kernel_s: float | None = None       # spawn -> the kernel's launch: all of the above and the arguments' uploads
    kernel_s: float | None = None          # the launch under the tool, to its synchronize
    after_kernel_s: float | None = None    # the kernel's end -> the tool's exit (outputs, its report, teardown)
    process_started: bool | None = None    # this run started a compute-sanitizer process (always, one-shot; the
                                           # first job of a warm process, kernellab.run.nvtools.sanitize_pool)

    def to_json(self) -> dict:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "read_bytes": self.read_bytes,
                "read_chars": self.read_chars, "tool_start_s": self.tool_start_s, "imports_s": self.imports_s,
                "context_s": self.context_s, "to_kernel_s": self.to_kernel_s,
                "kernel_s": self.kernel_s, "after_kernel_s": self.after_kernel_s,
                "process_started": self.process_started}


@dataclass(frozen=True)
class SanitizerReport:
    """What compute-sanitizer found in one launch: deduplicated findings, its error count and notes."""

    tool: str                          # "memcheck", ... or several joined by "+"
    kernel: str
    findings: tuple[Finding, ...]
    error_count: int | None = None     # the tool's own summary (before deduplication and print limits)
    notes: tuple[str, ...] = ()        # API errors, the job's own status, timeouts
    timed_out: bool = False
    exit_code: int | None = None
    job_status: str | None = None      # how the job itself ended under the tool ("ok", "fault", ...)
    command: tuple[str, ...] = ()
    wall_ms: float = 0.0
    raw: str = field(default="", repr=False)
    simulated: bool = False            # found in the Numba simulator (kernellab.run.sim.race), not by compute-sanitizer
    cost: ToolCost | None = field(default=None, compare=False)   # what the tool's run cost the host (one tool)

    @property
    def ok(self) -> bool:
        """No findings, no errors counted, and the run finished."""
        return not self.findings and not self.error_count and not self.timed_out

    def __bool__(self) -> bool:
        return self.ok

    def headline(self) -> str:
        tool = f"{self.tool} (simulator)" if self.simulated else self.tool
        if self.timed_out:
            return f"{tool}: {self.kernel} did not finish under compute-sanitizer (timed out)"
        if self.ok:
            return f"{tool}: no problems found in {self.kernel}"
        n = len(self.findings)
        errs = f" ({self.error_count:,} reported)" if self.error_count is not None else ""
        return f"{tool}: {n} distinct problem{'s' if n != 1 else ''} in {self.kernel}{errs}"

    def summary(self, limit: int | None = None) -> str:
        """The findings, one per line (at most `limit`)."""
        shown = self.findings if limit is None else self.findings[:limit]
        lines = ["  " + f.describe().replace("\n", "\n  ") for f in shown]
        if limit is not None and len(self.findings) > limit:
            lines.append(f"  ... and {len(self.findings) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [self.headline()]
        if self.findings:
            parts.append(self.summary())
        parts += [f"  note: {n}" for n in self.notes]
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#080" if self.ok else "#c00"
        out = [f"<div style='color:{color};font-weight:bold'>{report.esc(self.headline())}</div>"]
        if self.findings:
            rows = []
            for f in self.findings:
                where = str(f.where) if f.other is None else f"{f.access} {f.where} / {f.other_access} {f.other}"
                rows.append([f.message, report.Raw(f"<code>{report.esc(where)}</code>", where),
                             _dim(f.thread) if f.thread else "-", _dim(f.block) if f.block else "-",
                             f.detail or "-", f.count])
            out.append(report.html_table(["problem", "where", "thread", "block", "detail", "times"], rows))
        out += [f"<div style='color:#666'>note: {report.esc(n)}</div>" for n in self.notes]
        return "".join(out)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "sanitize", "version": 1, "title", "tool", "kernel", "ok", "error_count", "timed_out",
        "exit_code", "job_status", "findings" (Finding.to_json each: tool, kind, message, where {function, pc,
        file, line, cell_line, source_line}, thread, block, address, size_bytes, detail, other, access,
        other_access, other_thread, count), "notes", "command", "simulated"}."""
        return {"kind": "sanitize", "version": 1, "title": self.headline(), "tool": self.tool, "kernel": self.kernel,
                "ok": self.ok, "error_count": self.error_count, "timed_out": self.timed_out,
                "exit_code": self.exit_code, "job_status": self.job_status,
                "findings": [f.to_json() for f in self.findings], "notes": list(self.notes),
                "command": list(self.command), "simulated": self.simulated}


def combine(reports: list[SanitizerReport]) -> SanitizerReport:
    """Several tools' reports as one."""
    counts = [r.error_count for r in reports if r.error_count is not None]
    return SanitizerReport(tool="+".join(r.tool for r in reports), kernel=reports[0].kernel,
                           findings=tuple(f for r in reports for f in r.findings),
                           error_count=sum(counts) if counts else None,
                           notes=tuple(f"{r.tool}: {n}" for r in reports for n in r.notes),
                           timed_out=any(r.timed_out for r in reports),
                           exit_code=max((r.exit_code or 0) for r in reports),
                           job_status=reports[-1].job_status,
                           command=reports[0].command, wall_ms=sum(r.wall_ms for r in reports),
                           raw="\n".join(r.raw for r in reports), simulated=all(r.simulated for r in reports))
