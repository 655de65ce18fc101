"""`Kernel.source_view()`: each source line beside the SASS (and PTX) compiled from it, with counts per class.

`Kernel.profile_lines(...)` (run/nvtools/ncu_source.py) adds what Nsight Compute measured per line to the same view.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..render.source_html import source_view_html
from ..report import REPORT_MIME, mimebundle
from .sass_lines import CLASSES, count_classes, instruction_class


@dataclass(frozen=True)
class LineProfile:
    """What Nsight Compute measured for one source line over one launch (its source page, SourceCounters)."""

    instructions_executed: int            # warp-level instructions executed
    thread_instructions_executed: int     # the same, counted per thread
    stall_samples: int                    # warp stall samples (all) at the line's instructions
    stalls: tuple[tuple[str, int], ...]   # (reason, samples), largest first: e.g. ("long_scoreboard", 120)
    global_sectors: int                   # L2 theoretical sectors of global accesses (32 bytes each)
    shared_wavefronts: int                # L1 wavefronts of shared accesses
    shared_ideal_wavefronts: int          # the same without bank conflicts
    conflict_ways: float = 0              # L1 Conflicts Shared N-Way, as ncu reports it

    @property
    def global_bytes(self) -> int:
        """Global memory traffic the line asks of L2 (sectors x 32 B)."""
        return self.global_sectors * 32

    @property
    def bank_conflict_wavefronts(self) -> int:
        """Shared wavefronts spent on bank conflicts."""
        return self.shared_wavefronts - self.shared_ideal_wavefronts

    def to_json(self) -> dict:
        return {"instructions_executed": self.instructions_executed,
                "thread_instructions_executed": self.thread_instructions_executed,
                "stall_samples": self.stall_samples, "stalls": [list(s) for s in self.stalls],
                "global_sectors": self.global_sectors, "global_bytes": self.global_bytes,
                "shared_wavefronts": self.shared_wavefronts, "shared_ideal_wavefronts": self.shared_ideal_wavefronts,
                "bank_conflict_wavefronts": self.bank_conflict_wavefronts, "conflict_ways": self.conflict_ways}


@dataclass(frozen=True)
class SourceRow:
    """One source line: its text, the SASS and PTX instructions compiled from it, and their counts by class."""

    line: int                              # as the cell numbers it (`%%cuda` is line 1)
    source: str
    sass: tuple[str, ...] = ()             # this line's SASS instructions, in address order
    counts: dict = field(default_factory=dict)   # class (sass_lines.CLASSES) -> instructions on this line
    ptx: tuple[str, ...] = ()              # this line's PTX instructions
    profile: LineProfile | None = None     # Nsight Compute's figures (Kernel.profile_lines)


@dataclass(frozen=True)
class SourceView:
    """A kernel's source with its SASS beside each line (what Nsight Compute's Source page shows, without a GPU)."""

    kernel: str
    arch: str
    filename: str
    rows: tuple[SourceRow, ...]            # every line of the source, in order
    unattributed: tuple[str, ...] = ()     # SASS with no line in this source
    profiled: bool = False                 # rows carry Nsight Compute's figures
    profile_note: str | None = None        # why they do not, where profile_lines could not measure

    classes = CLASSES                      # class -> (label, what it counts)
    classify = staticmethod(instruction_class)   # SASS text -> class or None

    @property
    def instructions(self) -> int:
        """SASS instructions of the kernel (those on a line and the unattributed)."""
        return sum(len(r.sass) for r in self.rows) + len(self.unattributed)

    @property
    def totals(self) -> dict[str, int]:
        """Counts per class over the whole kernel."""
        out = dict.fromkeys(CLASSES, 0)
        for r in self.rows:
            for k, v in r.counts.items():
                out[k] += v
        for k, v in count_classes(self.unattributed).items():
            out[k] += v
        return out

    def row(self, line: int) -> SourceRow:
        """The row of one source line."""
        for r in self.rows:
            if r.line == line:
                return r
        raise KeyError(f"no line {line} in {self.filename} (lines {self.rows[0].line}..{self.rows[-1].line})"
                       if self.rows else f"no lines in {self.filename}")

    def with_profile(self, profiles: dict[int, LineProfile]) -> "SourceView":
        """The same view with Nsight Compute's per-line figures attached."""
        rows = tuple(replace(r, profile=profiles.get(r.line)) for r in self.rows)
        return replace(self, rows=rows, profiled=True, profile_note=None)

    @property
    def title(self) -> str:
        t = self.totals
        parts = [f"{v} {CLASSES[k][0]}" for k, v in t.items() if v]
        head = f"{self.kernel} ({self.arch}): {self.instructions} SASS instructions"
        return head + (f" ({', '.join(parts)})" if parts else "") + (" · Nsight Compute per line" if self.profiled
                                                                      else "")

    def __str__(self) -> str:
        classes = [k for k, v in self.totals.items() if v]
        headers = ["SASS"] + [CLASSES[k][0] for k in classes]
        if self.profiled:
            headers += ["executed", "stall samples", "top stall", "global B", "bank excess"]
        cells = []
        for r in self.rows:
            row = [str(len(r.sass) or "")] + [str(r.counts.get(k) or "") for k in classes]
            if self.profiled:
                p = r.profile
                row += ([f"{p.instructions_executed:,}", f"{p.stall_samples:,}", p.stalls[0][0] if p.stalls else "",
                         f"{p.global_bytes:,}", f"{p.bank_conflict_wavefronts:,}"] if p else [""] * 5)
            cells.append(row)
        width = max([len(r.source.rstrip()[:72]) for r in self.rows] + [6])
        numw = max([len(str(r.line)) for r in self.rows] + [4])
        colw = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
        lines = [self.title,
                 f"{'line':>{numw}}  {'source':<{width}}  " + "  ".join(h.rjust(w) for h, w in zip(headers, colw))]
        for r, row in zip(self.rows, cells):
            lines.append(f"{r.line:>{numw}}  {r.source.rstrip()[:72]:<{width}}  "
                         + "  ".join(c.rjust(w) for c, w in zip(row, colw)))
        if self.unattributed:
            lines.append(f"{len(self.unattributed)} instructions with no line in {self.filename}")
        if self.profile_note:
            lines.append(f"not profiled: {self.profile_note}")
        return "\n".join(line.rstrip() for line in lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return source_view_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """text/plain and text/html only: the JupyterLab extension has no panel for this kind, and its generic
        one (every field) would take the place of the two-column HTML. to_json() gives the data."""
        data = mimebundle(self, include, exclude)
        data.pop(REPORT_MIME, None)
        return data

    def to_json(self) -> dict:
        """{"kind": "source", "version": 1, "title", "kernel", "arch", "filename", "classes" ({class: label}),
        "totals", "profiled", "profile_note", "unattributed" ([SASS]), "rows": [{"line", "source", "sass", "ptx",
        "counts", "profile" (LineProfile.to_json() or null)}]}."""
        return {"kind": "source", "version": 1, "title": self.title, "kernel": self.kernel, "arch": self.arch,
                "filename": self.filename, "classes": {k: v[0] for k, v in CLASSES.items()}, "totals": self.totals,
                "profiled": self.profiled, "profile_note": self.profile_note,
                "unattributed": list(self.unattributed),
                "rows": [{"line": r.line, "source": r.source, "sass": list(r.sass), "ptx": list(r.ptx),
                          "counts": dict(r.counts), "profile": r.profile.to_json() if r.profile else None}
                         for r in self.rows]}


def build_source_view(*, kernel: str, arch: str, source: str, first_line: int, filename: str, instructions,
                      ptx: dict[int, list[str]] | None = None) -> SourceView:
    """The view of `source` (its first line numbered `first_line`) from `instructions` (sass_lines.SassInstruction)."""
    by_line: dict[int, list[str]] = {}
    unattributed = []
    for ins in instructions:
        if ins.line is None:
            unattributed.append(ins.text)
        else:
            by_line.setdefault(ins.line, []).append(ins.text)
    lines = source.splitlines()
    rows = []
    for i, text in enumerate(lines):
        n = first_line + i
        sass = tuple(by_line.pop(n, ()))
        rows.append(SourceRow(line=n, source=text, sass=sass, counts=count_classes(sass),
                              ptx=tuple((ptx or {}).get(n, ()))))
    for n in sorted(by_line):                      # lines past the source's end (should not happen): keep them
        unattributed.extend(by_line[n])
    return SourceView(kernel=kernel, arch=arch, filename=filename, rows=tuple(rows), unattributed=tuple(unattributed))
