"""Nsight Compute's source page, per CUDA source line: shared-memory instructions, wavefronts and bank conflicts.

`ncu --csv --page source --print-source cuda,sass --section SourceCounters` prints, for each profiled kernel, a
"File Path" and a "Function Name" line, a header, then one row per CUDA source line each followed by the SASS
instructions compiled from it (see tests/fixtures/captured/ncu_source_sass.csv). The source rows add up every
instruction of the line, global and shared alike; the SASS rows say which instruction is which. So the per-line
counters here come from the SASS rows whose address space is shared memory, grouped by source line and by access
kind (a line such as `tile[i] = tile[j]` both loads and stores):

- instructions: warp-level shared instructions executed ("Instructions Executed" of those SASS rows);
- wavefronts: "L1 Wavefronts Shared", what `kernellab.analysis.banks` models per warp access;
- ideal_wavefronts: "L1 Wavefronts Shared Ideal", the same accesses without bank conflicts;
- excess_wavefronts = wavefronts - ideal_wavefronts: the price of the conflicts;
- ways: "L1 Conflicts Shared N-Way" as ncu reports it (for a line whose accesses all conflict alike, wavefronts per
  ideal wavefront).

Line numbers are ncu's (from `-lineinfo`), plus `line_offset`. kernellab compiles a `%%cuda` cell with
`first_line=2`, so NVRTC already numbers lines as the cell does (line 1 is `%%cuda`): offset 0. Without SASS rows
(`--print-source cuda` alone) a line's shared counters are kept whole, as kind "shared", with no instruction count.

ncu needs the GPU's performance counters. Where the driver does not let this user read them (ERR_NVGPUCTRPERM,
common in containers and shared machines) or ncu is missing, `run_ncu_banks` and `profile_banks` return a report
that says so (`measured` is False) so that a notebook can fall back to the bank model; `strict=True` raises
`NcuUnavailableError` instead.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from typing import Sequence

from kernellab.compile import toolkit
from kernellab.compile.source_view import LineProfile
from kernellab.errors import KernellabError
from kernellab.report import Raw, esc, html_table, mimebundle, text_table
from kernellab.run.launch.job import JobResult, KernelJob
from kernellab.run.nvtools.sanitize import tool_env

NO_SOURCE = "<Unable to open source file>"   # what ncu writes where it cannot read the .cu file (always, for NVRTC)

# Where one of these appears in ncu's output, the counters could not be read: fall back to the model.
_UNAVAILABLE = (
    ("ERR_NVGPUCTRPERM", "this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM); an administrator "
                         "can allow it (nvidia driver option NVreg_RestrictProfilingToAdminUsers=0) or run as root"),
    ("LibraryNotLoaded", "ncu could not load its injection library into the program (LibraryNotLoaded); check that "
                         "ncu matches the driver and that the program is not statically linked against CUDA"),
    ("Profiling is not supported on this device", "Nsight Compute does not support profiling this GPU"),
    ("does not have permission", "this user may not read the GPU's performance counters"),
)


class NcuError(KernellabError):
    """ncu ran but gave no per-line counters for the kernel: it was not launched, or the program failed."""


class NcuUnavailableError(NcuError):
    """Nsight Compute cannot measure here (no ncu, or no access to the performance counters)."""

    def __init__(self, reason: str, log: str = ""):
        self.reason = reason
        self.log = log
        super().__init__(f"Nsight Compute counters are not available here: {reason}. "
                         "Use the bank model (kernellab.analysis.banks) or a simulator trace instead.")


@dataclass(frozen=True)
class LineCounters:
    """ncu's shared-memory counters for one CUDA source line and one access kind, summed over the launch."""

    line: int                    # line number as shown (ncu's, plus line_offset)
    kind: str                    # "load", "store", "atomic" (or "shared" when no SASS rows split the line)
    instructions: int | None     # warp-level shared instructions executed (None without SASS rows)
    wavefronts: int              # L1 Wavefronts Shared
    ideal_wavefronts: int        # L1 Wavefronts Shared Ideal: the same accesses without bank conflicts
    ways: float                  # L1 Conflicts Shared N-Way, as ncu reports it (worst SASS row of the line)
    access_bytes: int | None     # bytes per lane of the line's shared instructions (None: unknown or mixed)
    source: str = ""             # the line's text, stripped ('' where unknown)
    sass: tuple[str, ...] = ()   # the line's shared-memory SASS instructions, e.g. ("LDS R9, [R6]",)
    file: str = ""               # ncu's "File Path"

    @property
    def excess_wavefronts(self) -> int:
        """Wavefronts beyond the conflict-free count."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def wavefronts_per_instruction(self) -> float | None:
        """Average wavefronts per warp access (1 for a conflict-free 4-byte access); None without instructions."""
        return self.wavefronts / self.instructions if self.instructions else None


@dataclass(frozen=True)
class NcuBankReport:
    """Shared-memory wavefronts of one kernel per source line, as Nsight Compute measured them.

    `measured` is False (and `reason` says why) where ncu could not read the counters; the report is then empty.
    """

    kernel: str                           # ncu's "Function Name"
    lines: tuple[LineCounters, ...]       # lines with shared-memory instructions, in line order
    file: str = ""                        # ncu's "File Path" of the kernel's first source block
    line_offset: int = 0                  # added to ncu's line numbers
    reason: str | None = None             # why nothing was measured (None when measured)
    command: tuple[str, ...] = ()         # the ncu argv, where this report ran it
    log: str = ""                         # ncu's messages (==PROF==, ==WARNING==, ==ERROR==)

    @property
    def measured(self) -> bool:
        """True when ncu read the counters."""
        return self.reason is None

    @property
    def instructions(self) -> int:
        """Warp-level shared instructions executed, all lines."""
        return sum(c.instructions or 0 for c in self.lines)

    @property
    def wavefronts(self) -> int:
        """Shared wavefronts, all lines."""
        return sum(c.wavefronts for c in self.lines)

    @property
    def ideal_wavefronts(self) -> int:
        """Shared wavefronts had there been no bank conflict, all lines."""
        return sum(c.ideal_wavefronts for c in self.lines)

    @property
    def excess_wavefronts(self) -> int:
        """Wavefronts spent on bank conflicts, all lines."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def ways(self) -> float:
        """The worst line's n-way conflict."""
        return max((c.ways for c in self.lines), default=0)

    def line(self, line: int, kind: str | None = None) -> LineCounters:
        """The counters of one source line (and kind, where a line both loads and stores shared memory)."""
        found = [c for c in self.lines if c.line == line and (kind is None or c.kind == kind)]
        if len(found) != 1:
            have = ", ".join(f"{c.line} ({c.kind})" for c in self.lines) or "none"
            why = f": {self.reason}" if self.reason else ""
            raise KeyError(f"{'no' if not found else 'several'} shared-memory counters for line {line}"
                           f"{'' if kind is None else f' of kind {kind!r}'} in {self.kernel}; lines measured: {have}"
                           + ("; pass kind='load' or 'store'" if len(found) > 1 else "") + why)
        return found[0]

    @property
    def title(self) -> str:
        """One line: kernel, instructions, wavefronts, excess and worst conflict."""
        if not self.measured:
            return f"{self.kernel}: not measured, Nsight Compute counters are not available here"
        return (f"{self.kernel}: {self.instructions:,} shared instructions, {self.wavefronts:,} wavefronts "
                f"(ideal {self.ideal_wavefronts:,}, {self.excess_wavefronts:,} from bank conflicts), "
                f"worst {_ways(self.ways)}-way [Nsight Compute]")

    def _rows(self):
        return [(c.line, c.kind, "-" if c.access_bytes is None else c.access_bytes,
                 "-" if c.instructions is None else c.instructions, c.wavefronts, c.ideal_wavefronts,
                 c.excess_wavefronts, "-" if c.wavefronts_per_instruction is None
                 else f"{c.wavefronts_per_instruction:.2f}", _ways(c.ways), c.source)
                for c in self.lines]

    _HEADERS = ("line", "kind", "bytes", "instructions", "wavefronts", "ideal", "excess", "per instr", "n-way",
                "source")

    def __str__(self) -> str:
        if not self.measured:
            return f"{self.title}: {self.reason}; falling back to the model"
        return self.title + "\n" + text_table(self._HEADERS, self._rows())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if not self.measured:
            return (f"<div class='kernellab-banks'><b>{esc(self.title)}</b><br>{esc(self.reason)}; "
                    f"falling back to the model.</div>")
        rows = [r[:-1] + (Raw(f"<code>{esc(r[-1])}</code>", r[-1]),) for r in self._rows()]
        return f"<div class='kernellab-banks'><b>{esc(self.title)}</b>{html_table(self._HEADERS, rows)}</div>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """`{"kind": "banks", "version": 1, "title", "source": "ncu", "kernel", "file", "measured", "reason",
        "line_offset", "instructions", "wavefronts", "ideal_wavefronts", "excess_wavefronts", "ways",
        "lines": [{"file", "line", "source", "kind", "access_bytes", "instructions", "wavefronts",
        "ideal_wavefronts", "excess_wavefronts", "ways", "sass"}], "command": [str]}`."""
        return {
            "kind": "banks", "version": 1, "title": self.title, "source": "ncu", "kernel": self.kernel,
            "file": self.file, "measured": self.measured, "reason": self.reason, "line_offset": self.line_offset,
            "instructions": self.instructions, "wavefronts": self.wavefronts,
            "ideal_wavefronts": self.ideal_wavefronts, "excess_wavefronts": self.excess_wavefronts,
            "ways": self.ways,
            "lines": [{"file": c.file, "line": c.line, "source": c.source, "kind": c.kind,
                       "access_bytes": c.access_bytes, "instructions": c.instructions, "wavefronts": c.wavefronts,
                       "ideal_wavefronts": c.ideal_wavefronts, "excess_wavefronts": c.excess_wavefronts,
                       "ways": c.ways, "sass": list(c.sass)} for c in self.lines],
            "command": list(self.command),
        }


# ---------------------------------------------------------------------------------------------------------------------
# Parsing


def parse_source_page(text: str, *, line_offset: int = 0, source: str | None = None, first_line: int = 1,
                      filename: str | None = None) -> tuple[NcuBankReport, ...]:
    """Per-line shared-memory counters, one report per profiled launch, from ncu's source-page CSV output.

    `text` is ncu's whole stdout (its ==PROF== lines and the program's own output are skipped). Shown line numbers
    are ncu's plus `line_offset`. Where `source` is given (its first line numbered `first_line`, as shown), each
    line's text comes from it (ncu itself cannot read sources compiled by NVRTC); where a kernel's lines come from
    several files (inlined headers), only the file named like `filename` takes its text from `source`.
    """
    reports = []
    for kernel, files in _launches(_blocks(text)):
        own = {f for f, _, _ in files if filename and os.path.basename(f) == os.path.basename(filename)}
        lines: list[LineCounters] = []
        for file, header, rows in files:
            text_source = source if len(files) == 1 or file in own else None
            lines += _line_counters(header, rows, file, line_offset, text_source, first_line)
        lines.sort(key=lambda c: (c.file != files[0][0], c.file, c.line, c.kind))
        reports.append(NcuBankReport(kernel=kernel, lines=tuple(lines), file=files[0][0], line_offset=line_offset))
    return tuple(reports)


def _blocks(text: str):
    """[(function name, file path, header, rows)] from the CSV lines of ncu's output."""
    csv_lines = [line for line in text.splitlines() if line.startswith('"')]
    blocks = []
    file = kernel = header = None
    for row in csv.reader(csv_lines):
        if not row:
            continue
        if row[0] == "File Path" and len(row) >= 2:
            file, header = row[1], None
        elif row[0] == "Function Name" and len(row) >= 2:
            kernel, header = row[1], None
        elif row[0] == "Line No":
            header = row
            blocks.append((kernel or "?", file or "", header, []))
        elif header is not None and len(row) == len(header):
            blocks[-1][3].append(row)
    return blocks


def _launches(blocks):
    """[(function name, [(file, header, rows)])]: consecutive blocks of one function from different files are one
    launch (its code inlined from several files); a function seen again in a file it already had is a new launch."""
    out: list[tuple[str, list]] = []
    for kernel, file, header, rows in blocks:
        if out and out[-1][0] == kernel and file not in {f for f, _, _ in out[-1][1]}:
            out[-1][1].append((file, header, rows))
        else:
            out.append((kernel, [(file, header, rows)]))
    return out


def _line_counters(header, rows, file, line_offset, source, first_line) -> list[LineCounters]:
    """The shared-memory counters of one file's block of the source page, per (line, kind)."""
    col = {name: i for i, name in reversed(list(enumerate(header)))}  # first of duplicate names ("Source" twice)
    for need in ("L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"):
        if need not in col:
            raise NcuError(f"ncu's source page has no {need!r} column (columns: {', '.join(header[:12])}, ...); "
                           "run ncu with --section SourceCounters")
    sass_col = len(header) - 1 - header[::-1].index("Source") if header.count("Source") > 1 else None
    source_lines = source.splitlines() if source is not None else None

    def get(row, name):
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else ""

    per_kind: dict[tuple[int, str], dict] = {}   # (ncu line, kind) -> sums over the line's shared SASS rows
    whole: dict[int, tuple] = {}                 # ncu line -> the source row's own totals and text
    current = None
    for row in rows:
        if row[0].strip():  # a source-line row; the SASS rows below it are its instructions
            current = int(row[0])
            whole[current] = (_int(get(row, "L1 Wavefronts Shared")), _int(get(row, "L1 Wavefronts Shared Ideal")),
                              _num(get(row, "L1 Conflicts Shared N-Way")), get(row, "Source").strip())
            continue
        if current is None or sass_col is None or get(row, "Address") in ("...", ""):
            continue  # ncu's elision marker, or SASS before any line
        wavefronts = _int(get(row, "L1 Wavefronts Shared"))
        if "Shared" not in get(row, "Address Space").split(",") and wavefronts == 0:
            continue
        k = per_kind.setdefault((current, _kind(get(row, "Access Operation"))),
                                {"n": 0, "wf": 0, "ideal": 0, "ways": 0, "sizes": set(), "sass": []})
        k["n"] += _int(get(row, "Instructions Executed"))
        k["wf"] += wavefronts
        k["ideal"] += _int(get(row, "L1 Wavefronts Shared Ideal"))
        k["ways"] = max(k["ways"], _num(get(row, "L1 Conflicts Shared N-Way")))
        size = get(row, "Access Size").strip()
        k["sizes"].add(int(size) // 8 if size.isdigit() else None)   # bits per lane
        k["sass"].append(" ".join(row[sass_col].split()))

    def text_of(line: int) -> str:
        if source_lines is not None:
            i = line + line_offset - first_line
            return source_lines[i].strip() if 0 <= i < len(source_lines) else ""
        return "" if whole[line][3] == NO_SOURCE else whole[line][3]

    out = []
    for (line, kind), k in per_kind.items():
        size = next(iter(k["sizes"])) if len(k["sizes"]) == 1 else None
        out.append(LineCounters(line + line_offset, kind, k["n"], k["wf"], k["ideal"], k["ways"], size, text_of(line),
                                tuple(k["sass"]), file))
    split = {line for line, _ in per_kind}
    for line, (wf, ideal, ways, _) in whole.items():
        if line not in split and (wf or ideal):  # no SASS rows to split it: keep the line whole
            out.append(LineCounters(line + line_offset, "shared", None, wf, ideal, ways, None, text_of(line), (), file))
    return out


def _kind(operation: str) -> str:
    op = operation.strip().lower()
    if "atom" in op or "red" in op:
        return "atomic"
    return {"load": "load", "store": "store"}.get(op, op.replace(",", "+") or "shared")


def _int(text: str) -> int:
    text = text.strip().replace(",", "")
    if not text or text == "-":
        return 0
    return int(float(text))


def _num(text: str) -> float:
    text = text.strip().replace(",", "")
    if not text or text == "-":
        return 0.0
    value = float(text)
    return int(value) if value.is_integer() else value


def _ways(w: float) -> str:
    return f"{w:g}"


# ---------------------------------------------------------------------------------------------------------------------
# Running ncu


def find_ncu() -> str | None:
    """Path of the ncu binary (the CUDA wheels, CUDA_HOME, /usr/local/cuda or PATH), or None."""
    return toolkit.find_tool("ncu")


def ncu_bank_command(target: Sequence[str], symbol: str, *, ncu: str | None = None, launch_count: int = 1,
                     launch_skip: int = 0) -> list[str]:
    """The ncu argv that profiles `symbol`'s launch(es) in `target` (a program's argv) for the per-line report.

    `symbol` is the kernel's entry symbol (mangled for C++ kernels; `Kernel.symbol`), matched exactly.
    """
    if not symbol:
        raise ValueError("ncu_bank_command needs the kernel's symbol, e.g. kernel.symbol")
    cmd = [ncu or find_ncu() or "ncu",
           "--clock-control", "none",           # keep the GPU's own clocks: counters do not depend on them
           "--csv", "--page", "source", "--print-source", "cuda,sass",
           "--section", "SourceCounters",
           "--kernel-name-base", "mangled",    # -k matches the entry symbol itself, C++ kernels included
           "-k", f"regex:^{re.escape(symbol)}$",
           "--launch-count", str(launch_count)]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    return cmd + list(target)


def unavailable_reason(output: str) -> str | None:
    """Why ncu could not read counters, judging by its output; None if nothing says so."""
    for marker, reason in _UNAVAILABLE:
        if marker in output:
            return reason
    return None


def run_ncu_banks(target: Sequence[str], symbol: str, *, source: str | None = None, first_line: int = 1,
                  filename: str | None = None, line_offset: int = 0, ncu: str | None = None,
                  timeout_s: float = 600, env: dict | None = None, strict: bool = False) -> NcuBankReport:
    """Run `target` (a program's argv) under ncu and return `symbol`'s per-line shared-memory counters.

    Where ncu is missing or may not read the counters, returns an unmeasured report saying why (or raises
    `NcuUnavailableError` with `strict=True`). Raises `NcuError` if ncu ran but profiled no such kernel.
    """
    ncu = ncu or find_ncu()
    if ncu is None:
        return _unavailable(symbol, "Nsight Compute (ncu) was not found (looked in the CUDA wheels, $CUDA_HOME/bin, "
                            "/usr/local/cuda/bin and PATH); it ships with the CUDA toolkit, or pass ncu=PATH",
                            (), "", strict)
    cmd = ncu_bank_command(target, symbol, ncu=ncu)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              start_new_session=True)
    except FileNotFoundError:
        return _unavailable(symbol, f"ncu could not be started ({ncu} does not exist)", cmd, "", strict)
    except subprocess.TimeoutExpired as exc:
        raise NcuError(f"ncu did not finish in {timeout_s:g} s: {' '.join(cmd)}; profile a smaller launch or "
                       "raise timeout_s") from exc
    return report_from_output(proc.stdout, proc.stderr, proc.returncode, symbol, cmd=cmd, source=source,
                              first_line=first_line, filename=filename, line_offset=line_offset, strict=strict)


def report_from_output(stdout: str, stderr: str, returncode: int, symbol: str, *, cmd: Sequence[str] = (),
                       source: str | None = None, first_line: int = 1, filename: str | None = None,
                       line_offset: int = 0, strict: bool = False) -> NcuBankReport:
    """The report for `symbol` from one ncu run's output (see `run_ncu_banks`)."""
    log = "\n".join(line for line in (stdout + "\n" + stderr).splitlines() if line.startswith("==")).strip()
    reason = unavailable_reason(stdout + "\n" + stderr)
    if reason:
        return _unavailable(symbol, reason, cmd, log, strict)
    reports = parse_source_page(stdout, line_offset=line_offset, source=source, first_line=first_line,
                                filename=filename)
    # ncu ran with -k on this symbol, so any block is its; prefer an exact name where several kernels were profiled.
    reports = [r for r in reports if r.kernel == symbol] or list(reports)
    if not reports:
        tail = "\n".join((stdout + "\n" + stderr).strip().splitlines()[-15:])
        raise NcuError(f"ncu profiled no launch of {symbol} (exit code {returncode}); was it launched? "
                       f"command: {' '.join(cmd)}\n{tail}")
    r = reports[0]
    return NcuBankReport(r.kernel, r.lines, r.file, r.line_offset, None, tuple(cmd), log)


def _unavailable(symbol: str, reason: str, cmd, log: str, strict: bool) -> NcuBankReport:
    if strict:
        raise NcuUnavailableError(reason, log)
    return NcuBankReport(symbol, (), reason=reason, command=tuple(cmd), log=log)


# ---------------------------------------------------------------------------------------------------------------------
# Profiling one launch of a kernellab Kernel


def profile_banks(job: KernelJob, *, strict: bool = False, timeout_s: float = 600,
                  ncu: str | None = None) -> NcuBankReport:
    """Run one launch (a KernelJob: Kernel.profile_banks builds it) under Nsight Compute and return its per-line
    shared counters.

    The launch runs in a child process (`python -m kernellab.run.launch.job JOBFILE`, the arguments copied
    into the job; `args` are not modified), so the profiler never attaches to this one. Line numbers and source text
    are the kernel module's: a `%%cuda` cell's own. Where ncu cannot read counters the report says why (`measured`
    is False); `strict=True` raises `NcuUnavailableError` instead.
    """
    def measure(target):
        return run_ncu_banks(target, job.symbol, source=job.source, first_line=job.first_line,
                             filename=job.filename, ncu=ncu, timeout_s=timeout_s, env=_tool_env(), strict=strict)

    return _under_ncu(job, measure)


def _tool_env():
    return tool_env()


def _under_ncu(job: KernelJob, measure):
    """Write the job to a file and call measure(target argv) with a child process that runs it; where ncu profiled
    nothing because the launch itself failed, say that instead."""
    with tempfile.TemporaryDirectory(prefix="kernellab-ncu-") as tmp:
        jobfile = job.with_data().save(os.path.join(tmp, "job.kljob"))
        resfile = os.path.join(tmp, "result.klres")
        target = [sys.executable, "-m", "kernellab.run.launch.job", jobfile, "--out", resfile]
        try:
            return measure(target)
        except NcuError as exc:
            if isinstance(exc, NcuUnavailableError) or not os.path.exists(resfile):
                raise
            with open(resfile, "rb") as fh:
                result = JobResult.from_bytes(fh.read())
            if result.ok:
                raise
            raise NcuError(f"{job.label}'s launch failed under ncu ({result.status}): {result.message}") from exc


# ---------------------------------------------------------------------------------------------------------------------
# Every source line: Kernel.profile_lines

# ncu's stall columns (stall_<name>), as its Source page names the reasons.
STALL_NAMES = {"long_sb": "long scoreboard", "short_sb": "short scoreboard", "lg": "LG throttle",
               "mio": "MIO throttle", "tex": "tex throttle", "imc": "IMC miss", "no_inst": "no instruction",
               "branch_resolving": "branch resolving", "not_selected": "not selected", "sleeping": "sleeping"}


def parse_line_profiles(text: str, *, symbol: str | None = None, filename: str | None = None,
                        line_offset: int = 0) -> dict:
    """{line: LineProfile} for the first profiled launch (of `symbol`, where given) in ncu's source-page CSV.

    Each source row of the page sums its SASS rows; with `--print-source cuda` alone there are no SASS rows, and the
    source rows are all there is. Only the block of the file named like `filename` counts (the cell's own lines;
    code inlined from headers is in other blocks), or the only block. Lines are ncu's plus `line_offset`.
    """
    launches = _launches(_blocks(text))
    chosen = [launch for launch in launches if symbol is None or launch[0] == symbol] or launches
    if not chosen:
        return {}
    files = chosen[0][1]
    own = [f for f in files if filename and os.path.basename(f[0]) == os.path.basename(filename)]
    out: dict = {}
    for file, header, rows in (own or files[:1]):
        col = {name: i for i, name in reversed(list(enumerate(header)))}

        def get(row, name):
            i = col.get(name)
            return row[i] if i is not None and i < len(row) else ""

        stall_cols = [(name[len("stall_"):], i) for i, name in enumerate(header)
                      if name.startswith("stall_") and not name.endswith("(Not Issued)")]
        for row in rows:
            if not row[0].strip():
                continue                                  # a SASS row: its source row already sums it
            stalls = sorted(((STALL_NAMES.get(n, n.replace("_", " ")), _int(row[i])) for n, i in stall_cols
                             if _int(row[i])), key=lambda s: -s[1])
            out[int(row[0]) + line_offset] = LineProfile(
                instructions_executed=_int(get(row, "Instructions Executed")),
                thread_instructions_executed=_int(get(row, "Thread Instructions Executed")),
                stall_samples=_int(get(row, "Warp Stall Sampling (All Samples)")),
                stalls=tuple(stalls),
                global_sectors=_int(get(row, "L2 Theoretical Sectors Global")),
                shared_wavefronts=_int(get(row, "L1 Wavefronts Shared")),
                shared_ideal_wavefronts=_int(get(row, "L1 Wavefronts Shared Ideal")),
                conflict_ways=_num(get(row, "L1 Conflicts Shared N-Way")))
    return out


def lines_from_output(view, stdout: str, stderr: str, returncode: int, symbol: str, *, cmd: Sequence[str] = (),
                      strict: bool = False):
    """`view` (a SourceView) with the per-line figures of one ncu run, or saying why there are none."""
    reason = unavailable_reason(stdout + "\n" + stderr)
    if reason:
        if strict:
            raise NcuUnavailableError(reason, stderr)
        return replace(view, profile_note=reason)
    profiles = parse_line_profiles(stdout, symbol=symbol, filename=view.filename)
    if not profiles:
        tail = "\n".join((stdout + "\n" + stderr).strip().splitlines()[-15:])
        raise NcuError(f"ncu profiled no launch of {symbol} (exit code {returncode}); was it launched? "
                       f"command: {' '.join(cmd)}\n{tail}")
    return view.with_profile(profiles)


def without_ncu(view, strict: bool = False):
    """The source view saying that ncu was not found (strict=True raises NcuUnavailableError instead)."""
    reason = ("Nsight Compute (ncu) was not found (looked in the CUDA wheels, $CUDA_HOME/bin, /usr/local/cuda/bin "
              "and PATH); it ships with the CUDA toolkit, or pass ncu=PATH")
    if strict:
        raise NcuUnavailableError(reason)
    return replace(view, profile_note=reason)


def profile_lines(job: KernelJob, view, *, strict: bool = False, timeout_s: float = 600, ncu: str | None = None):
    """`view` (the kernel's source_view()) with Nsight Compute's per-line figures for one launch, `job`: instructions
    executed, warp stall samples by reason, global traffic (L2 sectors), shared wavefronts and bank conflicts. The
    launch runs in a child process (see profile_banks); where ncu cannot read counters, the view's `profile_note`
    says why (strict=True raises NcuUnavailableError)."""
    ncu = ncu or find_ncu()
    if ncu is None:
        return without_ncu(view, strict)

    def measure(target):
        cmd = ncu_bank_command(target, job.symbol, ncu=ncu)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_tool_env(),
                                  start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu did not finish in {timeout_s:g} s: {' '.join(cmd)}; profile a smaller launch or "
                           "raise timeout_s") from exc
        return lines_from_output(view, proc.stdout, proc.stderr, proc.returncode, job.symbol, cmd=cmd,
                                 strict=strict)

    return _under_ncu(job, measure)
