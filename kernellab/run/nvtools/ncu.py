"""Nsight Compute on one kernel job, in a separate process: a small table of the counters that explain a kernel.

`profile(job)` writes the job to a file and runs
`ncu --clock-control none --csv --kernel-name-base mangled -k regex:^<symbol>$ -c 1
 --metrics <DEFAULT_METRICS>
 python -m kernellab.run.launch.job JOBFILE`
(`--set <name>` instead of `--metrics` for `section_set=`, e.g. "full"), then parses the CSV (one row per metric:
"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value", ...); values come back in base
units (seconds, bytes) whatever scale ncu chose.
`--clock-control none` keeps the GPU at its normal clocks, so durations match what bench measures.

Where the driver does not let this user read performance counters (ERR_NVGPUCTRPERM), the report says so plainly
and points at what works without counters: the occupancy model (kernel.occupancy) and the shared-memory bank
model (kernellab.bank_wavefronts).
"""
from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ... import report
from ...compile import toolkit
from ..launch.job import JobResult, KernelJob
from .sanitize import ToolNotFoundError, decoded_text, tool_env

# The tensor pipe: the share of cycles it was busy. Seen on an H100 with ncu 2025.3 (2026-11-23): the "hmma" metrics
# count Hopper's wgmma too (a wgmma-only kernel showed 63 % active and as many "hmma" as "gmma" instructions), and the
# "gmma" cycles metric does not exist there; so the first is the tensor pipe as a whole.
TENSOR_HMMA_PCT = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_GMMA_PCT = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"

# (metric, label): what a first look at a kernel needs. Names checked on sm_90 (H100/H200) with ncu 2025, except
# the tensor-pipe ones (not yet captured): a device or ncu without one of them leaves it out (see `profile`).
DEFAULT_METRICS: tuple[tuple[str, str], ...] = (
    ("gpu__time_duration.sum", "duration"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput"),
    ("dram__bytes.sum", "DRAM bytes"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput"),
    ("l1tex__t_sector_hit_rate.pct", "L1 hit rate"),
    ("lts__t_sector_hit_rate.pct", "L2 hit rate"),
    ("smsp__sass_inst_executed_op_shared_ld.sum", "shared load instructions"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "shared load wavefronts"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "shared load bank conflicts"),
    ("smsp__sass_inst_executed_op_shared_st.sum", "shared store instructions"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "shared store wavefronts"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "shared store bank conflicts"),
    ("launch__registers_per_thread", "registers per thread"),
    (TENSOR_HMMA_PCT, "tensor pipe active (mma.sync and wgmma)"),
    (TENSOR_GMMA_PCT, "tensor pipe active, GMMA (wgmma)"),
    ("sm__inst_executed_pipe_tensor_op_hmma.sum", "tensor-pipe instructions executed (HMMA and HGMMA, per warp)"),
    ("sm__inst_executed_pipe_tensor_op_gmma.sum", "GMMA instructions executed"),
)
LABELS = dict(DEFAULT_METRICS)
# Warp stall reasons (smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio: warps stalled for that
# reason per issued instruction, Nsight Compute's "Warp State" section); the profiles of benchmarks/ take these.
STALL_REASONS = ("long_scoreboard", "barrier", "wait", "math_pipe_throttle", "short_scoreboard", "mio_throttle",
                 "lg_throttle", "no_instruction", "dispatch_stall", "membar", "drain", "branch_resolving",
                 "tex_throttle", "sleeping", "not_selected", "selected")
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def stall_metrics(reasons=STALL_REASONS) -> tuple[tuple[str, str], ...]:
    """(metric, label) for each stall reason: "stall: <reason> (warps per issue)"."""
    return tuple((f"{STALL_PREFIX}{r}{STALL_SUFFIX}", f"stall: {r} (warps per issue)") for r in reasons)


def top_stalls(report: "ProfileReport", n: int = 3) -> list[tuple[str, float]]:
    """The n largest stall reasons of a report, [(reason, warps per issue)], leaving out "selected" (issuing, not a
    stall) and "not_selected" (eligible, another warp issued)."""
    found = [(m.name[len(STALL_PREFIX):-len(STALL_SUFFIX)], m.value) for m in report.metrics
             if m.name.startswith(STALL_PREFIX) and m.name.endswith(STALL_SUFFIX) and isinstance(m.value, float)]
    found = [(r, v) for r, v in found if r not in ("selected", "not_selected")]
    return sorted(found, key=lambda x: -x[1])[:n]
SECTION_SETS = ("basic", "detailed", "full", "roofline", "source", "nvlink", "pmsampling")

_PERMISSION = ("ERR_NVGPUCTRPERM", "does not have permission to access NVIDIA GPU Performance Counters")
_SCALE = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@dataclass(frozen=True)
class Metric:
    """One counter: its ncu name, a readable label, the value in base units, the unit and ncu's section."""

    name: str
    label: str
    value: float | str | None
    unit: str = ""
    section: str = ""

    def formatted(self) -> str:
        return format_value(self.value, self.unit)


@dataclass(frozen=True)
class ProfileReport:
    """Nsight Compute's counters for one launch, or why there are none."""

    kernel: str
    metrics: tuple[Metric, ...] = ()
    device: str = ""
    grid: str = ""
    block: str = ""
    section_set: str | None = None     # None: the default metric set
    permission_denied: bool = False
    error: str | None = None           # why there are no counters, in words
    timed_out: bool = False
    notes: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    wall_ms: float = 0.0
    raw: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return bool(self.metrics) and self.error is None

    def __getitem__(self, name: str) -> float | str | None:
        """A metric's value by ncu name or label."""
        for m in self.metrics:
            if name in (m.name, m.label):
                return m.value
        raise KeyError(f"no metric {name!r} in this profile; it has {', '.join(m.label for m in self.metrics)}")

    def get(self, name: str, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    @property
    def duration_ms(self) -> float | None:
        v = self.get("gpu__time_duration.sum")
        return v * 1e3 if isinstance(v, float) else None

    @property
    def tensor_pipe_pct(self) -> dict[str, float]:
        """{"hmma": %, "gmma": %}: how busy the tensor pipe was (of its peak, over the SM's active cycles), for the
        metrics this device reported."""
        out = {}
        for key, name in (("hmma", TENSOR_HMMA_PCT), ("gmma", TENSOR_GMMA_PCT)):
            v = self.get(name)
            if isinstance(v, float):
                out[key] = v
        return out

    def shared_wavefronts_per_request(self, op: str = "ld") -> float | None:
        """Shared-memory wavefronts per shared instruction (1.0: no bank conflicts; 32: a 32-way conflict)."""
        inst = self.get(f"smsp__sass_inst_executed_op_shared_{op}.sum")
        wf = self.get(f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum")
        if isinstance(inst, float) and isinstance(wf, float) and inst > 0:
            return wf / inst
        return None

    def headline(self) -> str:
        where = f" on {self.device}" if self.device else ""
        if self.permission_denied:
            return f"profile of {self.kernel}: GPU performance counters are not permitted for this user{where}"
        if self.error:
            return f"profile of {self.kernel}: no counters ({self.error})"
        what = f"section set '{self.section_set}'" if self.section_set else "default metrics"
        return f"profile of {self.kernel}{where} ({what}, ncu --clock-control none)"

    def rows(self) -> list[list[str]]:
        out = []
        for m in self.metrics:
            out.append([m.label, m.formatted()] + ([m.section] if self.section_set else []))
        for op, what in (("ld", "loads"), ("st", "stores")):
            r = self.shared_wavefronts_per_request(op)
            if r is not None:
                out.append([f"shared {what}: wavefronts per instruction", f"{r:.2f}"
                            + (" (no bank conflicts)" if r <= 1.0001 else f" ({r:.1f}-way on average)")]
                           + ([""] if self.section_set else []))
        return out

    def __str__(self) -> str:
        parts = [self.headline()]
        if self.metrics:
            heads = ["metric", "value"] + (["section"] if self.section_set else [])
            parts.append(report.text_table(heads, self.rows()))
        parts += [f"note: {n}" for n in self.notes]
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        out = [f"<div style='font-weight:bold'>{report.esc(self.headline())}</div>"]
        if self.metrics:
            heads = ["metric", "value"] + (["section"] if self.section_set else [])
            out.append(report.html_table(heads, self.rows()))
        out += [f"<div style='color:#666'>note: {report.esc(n)}</div>" for n in self.notes]
        return "".join(out)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "profile", "version": 1, "title", "kernel", "device", "grid", "block", "section_set", "ok",
        "permission_denied", "error", "timed_out", "metrics" ([{name, label, value (base units), unit, section}]),
        "duration_ms", "shared_wavefronts_per_request" ({"ld", "st"}), "tensor_pipe_pct" ({"hmma", "gmma"}), "notes",
        "command"}."""
        return {"kind": "profile", "version": 1, "title": self.headline(), "kernel": self.kernel,
                "device": self.device, "grid": self.grid, "block": self.block, "section_set": self.section_set,
                "ok": self.ok, "permission_denied": self.permission_denied, "error": self.error,
                "timed_out": self.timed_out,
                "metrics": [{"name": m.name, "label": m.label, "value": m.value, "unit": m.unit,
                             "section": m.section} for m in self.metrics],
                "duration_ms": self.duration_ms,
                "shared_wavefronts_per_request": {op: self.shared_wavefronts_per_request(op) for op in ("ld", "st")},
                "tensor_pipe_pct": self.tensor_pipe_pct,
                "notes": list(self.notes), "command": list(self.command)}


def format_value(value, unit: str) -> str:
    """A metric value in base units, written for people: '12.3 us', '4.00 MiB', '63.2 %', '1,048,576'."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if unit == "nsecond" or unit == "second":
        s = value
        return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"
    if unit == "%":
        return f"{value:.1f} %"
    if unit == "hz":
        return f"{value / 1e9:.2f} GHz"
    if unit in ("byte", "bytes"):
        for step, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= step:
                return f"{value / step:.2f} {name}"
        return f"{value:.0f} B"
    if unit.endswith("/second"):
        return f"{value / 1e9:.1f} G{unit.split('/')[0]}/s"
    suffix = f" {unit}" if unit and unit not in ("register/thread",) else ""
    if float(value).is_integer():
        return f"{int(value):,}{suffix}"
    return (f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}") + suffix


def _to_base(value: str, unit: str) -> tuple[float | str | None, str]:
    """ncu's value text and unit -> (value in base units, base unit): '5,120' 'nsecond' -> (5.12e-06, 'second')."""
    text = (value or "").strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None, unit
    try:
        v = float(text)
    except ValueError:
        return value.strip(), unit
    m = re.fullmatch(r"(?P<p>[numKMGT]?)(?P<base>second|s|byte)(?P<rest>/s(?:econd)?)?", unit or "")
    if m and not (m.group("base") == "s" and m.group("p") in "KMGT" and m.group("p")):
        if m.group("base") in ("second", "s") and not m.group("rest"):
            return v * _SCALE[m.group("p")], "second"
        v *= {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(m.group("p"), 1.0)   # ncu's Kbyte is 1000 bytes
        return v, "byte/second" if m.group("rest") else "byte"
    return v, unit


def parse_csv(text: str, labels: dict | None = None) -> tuple[list[Metric], dict]:
    """(metrics of the first profiled kernel, facts {kernel, device, grid, block, kernels}) from ncu --csv output."""
    labels = LABELS if labels is None else labels
    lines = [l for l in text.splitlines() if l.startswith('"')]
    if not lines:
        return [], {}
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if rows and "Metric Name" not in rows[0]:
        return _parse_raw_page(rows, labels)
    ids = []
    for r in rows:
        if r.get("ID") not in ids:
            ids.append(r.get("ID"))
    first = [r for r in rows if r.get("ID") == ids[0]] if ids else []
    metrics = []
    rules = []
    for r in first:
        name = r.get("Metric Name", "")
        if not name:
            if r.get("Rule Description") and r.get("Rule Type") in ("OPT", "WRN"):
                gain = r.get("Estimated Speedup", "")
                rules.append(f"ncu {r.get('Rule Name', 'rule')}"
                             + (f" (estimated speedup {gain} %)" if gain else "") + f": {r['Rule Description']}")
            continue
        value, unit = _to_base(r.get("Metric Value", ""), r.get("Metric Unit", ""))
        metrics.append(Metric(name, labels.get(name, name), value, unit, r.get("Section Name", "")))
    order = {name: i for i, name in enumerate(labels)}
    metrics.sort(key=lambda m: (order.get(m.name, len(order)),))
    head = first[0] if first else {}
    facts = {"kernel": head.get("Kernel Name", ""), "device": head.get("Device", ""),
             "grid": head.get("Grid Size", ""), "block": head.get("Block Size", ""), "kernels": len(ids),
             "rules": rules}
    return metrics, facts


def _parse_raw_page(rows, labels):
    """`--page raw` CSV: one row per kernel, one column per metric, the second row holding units."""
    units = rows[0] if rows and not rows[0].get("ID", "").strip() else {}
    data = [r for r in rows if r.get("ID", "").strip()]
    if not data:
        return [], {}
    fixed = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
             "Grid Size", "Device", "CC"}
    metrics = []
    for name, value in data[0].items():
        if name in fixed:
            continue
        v, unit = _to_base(value, units.get(name, ""))
        metrics.append(Metric(name, labels.get(name, name), v, unit, ""))
    order = {name: i for i, name in enumerate(labels)}
    metrics.sort(key=lambda m: order.get(m.name, len(order)))
    head = data[0]
    return metrics, {"kernel": head.get("Kernel Name", ""), "device": head.get("Device", ""),
                     "grid": head.get("Grid Size", ""), "block": head.get("Block Size", ""), "kernels": len(data)}


def report_from_output(text: str, *, kernel: str, section_set: str | None = None, metrics=None,
                       **extra) -> ProfileReport:
    """A ProfileReport from ncu's captured output (stdout and stderr together)."""
    labels = dict(LABELS)
    for m in metrics or ():
        labels.setdefault(m, m)
    notes = list(extra.pop("notes", ()))
    if any(p in text for p in _PERMISSION):
        return ProfileReport(kernel=kernel, section_set=section_set, permission_denied=True,
                             error="ERR_NVGPUCTRPERM: the driver restricts GPU performance counters to admin users",
                             notes=tuple(notes + [
                                 "ask the machine's admin to allow profiling for all users (the nvidia kernel module "
                                 "option NVreg_RestrictProfilingToAdminUsers=0), or run ncu as root",
                                 "without counters: kernel.occupancy(block) models achieved-occupancy limits, and "
                                 "kernellab.bank_wavefronts (or %%numba --trace) models shared-memory wavefronts "
                                 "and bank conflicts"]), raw=text, **extra)
    parsed, facts = parse_csv(text, labels)
    error = None
    if not parsed:
        if "No kernels were profiled" in text:
            error = f"no launch of {kernel} was profiled (did the job fail before launching? see report.raw)"
        elif re.search(r"==ERROR==.*(metric|Metric)", text):
            bad = re.findall(r"==ERROR==\s*(.*)", text)
            error = "ncu rejected the metric list: " + "; ".join(bad[:3])
        elif "LibraryNotLoaded" in text or "libnvperf" in text:
            error = "ncu could not load its profiling libraries (LibraryNotLoaded): counters are not available here"
        else:
            errs = re.findall(r"==ERROR==\s*(.*)", text)
            error = "ncu produced no metrics" + (": " + "; ".join(errs[:3]) if errs else " (see report.raw)")
    if facts.get("kernels", 0) > 1:
        notes.append(f"ncu profiled {facts['kernels']} launches; the table shows the first")
    for w in re.findall(r"==WARNING==\s*(.*)", text):
        quiet = ("No kernels were profiled", "unmodified GPU clocks")   # the latter is what --clock-control none asks
        if not any(q in w for q in quiet) and f"ncu: {w}" not in notes:
            notes.append(f"ncu: {w}")
    notes += facts.get("rules", [])
    device = facts.get("device", "")
    return ProfileReport(kernel=kernel, metrics=tuple(parsed), device=f"GPU {device}" if device.isdigit() else device,
                         grid=facts.get("grid", ""), block=facts.get("block", ""), section_set=section_set,
                         error=error, notes=tuple(notes), raw=text, **extra)


_UNKNOWN_METRIC = re.compile(r"Failed to find metric\s+(?:regex:\^?)?(?P<name>[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)"
                             r"(?P<family>\\\.)?")
# Metrics an ncu on a GPU did not know, per (ncu, GPU ordinal): later profiles leave them out at once.
_unknown_metrics: dict[tuple[str, int | None], set[str]] = {}


def unknown_metrics(text: str, names) -> list[str]:
    """The names in `names` that ncu's output says it does not know ("Failed to find metric NAME", or a
    "regex:^BASE\\.(sum|avg|...)$" for a name without its rollup)."""
    bad = []
    for m in _UNKNOWN_METRIC.finditer(text):
        token = m.group("name")
        for n in names:
            if n not in bad and (n == token or (m.group("family") and n.startswith(token + "."))):
                bad.append(n)
    return bad


def ncu_path() -> str:
    """ncu's path, or ToolNotFoundError."""
    path = toolkit.find_tool("ncu")
    if not path:
        raise ToolNotFoundError("Nsight Compute (ncu) was not found (looked in the CUDA wheels, $CUDA_HOME/bin, "
                                "/usr/local/cuda/bin and PATH); it ships with the CUDA toolkit")
    return path


def _run_ncu(head: list[str], tail: list[str], names: list[str], section_set: str | None, timeout_s: float,
             key, total: bool = False) -> tuple[str, bool, list[str], list[str], tuple[str, ...]]:
    """`head + (--set | --metrics) + tail` under ncu; a metric ncu does not know (it stops with "Failed to find
    metric") is left out and ncu runs again without it, remembered per `key` (ncu, GPU) for later profiles.
    timeout_s: for each run, or (total) for all of them together. (output, timed_out, names kept, names left out,
    the last command)."""
    known_bad = _unknown_metrics.setdefault(key, set())
    skipped = [n for n in names if n in known_bad]
    names = [n for n in names if n not in known_bad] or names
    deadline = time.monotonic() + timeout_s
    while True:
        cmd = head + (["--set", section_set] if section_set else ["--metrics", ",".join(names)]) + tail
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), start_new_session=True,
                                  timeout=max(1.0, deadline - time.monotonic()) if total else timeout_s)
            out, timed_out = proc.stdout + proc.stderr, False
        except subprocess.TimeoutExpired as exc:
            out, timed_out = decoded_text(exc.stdout) + decoded_text(exc.stderr), True
        bad = [] if section_set or timed_out else unknown_metrics(out, names)
        if not bad or len(bad) == len(names):
            return out, timed_out, names, skipped, tuple(cmd)
        known_bad.update(bad)
        skipped += bad
        names = [n for n in names if n not in bad]


def profile(job: KernelJob, *, metrics=None, section_set: str | None = None, timeout_s: float = 600.0,
            extra_args=(), executable: str | None = None) -> ProfileReport:
    """Run `job` under Nsight Compute: `metrics` (ncu names; default DEFAULT_METRICS) or a `section_set`.

    A metric this ncu does not know on this GPU (ncu stops with "Failed to find metric") is left out and the
    profile runs again without it, with a note; later profiles in this process leave it out at once.
    """
    if section_set is not None and section_set not in SECTION_SETS:
        raise ValueError(f"unknown ncu section set {section_set!r}; use one of {', '.join(SECTION_SETS)}")
    names = list(metrics) if metrics else [m for m, _ in DEFAULT_METRICS]
    exe = executable or ncu_path()
    with tempfile.TemporaryDirectory(prefix="kernellab-profile-") as tmp:
        jobfile = job.with_data().save(os.path.join(tmp, "job.kljob"))
        resfile = os.path.join(tmp, "result.klres")
        t0 = time.perf_counter()
        head = [exe, "--clock-control", "none", "--csv", "--kernel-name-base", "mangled",
                "-k", f"regex:^{re.escape(job.symbol)}$", "-c", "1"]
        tail = list(extra_args) + [sys.executable, "-m", "kernellab.run.launch.job", jobfile, "--out", resfile]
        out, timed_out, names, skipped, cmd = _run_ncu(head, tail, names, section_set, timeout_s, (exe, job.device))
        wall = (time.perf_counter() - t0) * 1e3
        notes = []
        if skipped:
            notes.append(f"ncu on this GPU does not know {', '.join(skipped)}: left out")
        if os.path.exists(resfile):
            with open(resfile, "rb") as fh:
                res = JobResult.from_bytes(fh.read())
            if not res.ok:
                notes.append(f"the launch itself failed under ncu: {res.message}")
        if timed_out:
            notes.append(f"stopped after {timeout_s:g} s (ncu replays the kernel once per counter pass)")
    rep = report_from_output(out, kernel=job.label, section_set=section_set, metrics=names, command=cmd,
                             wall_ms=wall, timed_out=timed_out, notes=notes)
    return rep


def split_launches(text: str) -> list[str]:
    """ncu --csv output of several launches as one text per launch (ncu's "ID" column), in launch order, each with
    the header row; lines that are not CSV rows (the program's own output, ncu's ==PROF== lines) are dropped."""
    lines = [l for l in text.splitlines() if l.startswith('"')]
    if len(lines) < 2:
        return []
    header, rows = lines[0], lines[1:]
    ids: dict[str, list[str]] = {}
    for line in rows:
        first = next(csv.reader([line]))
        ids.setdefault(first[0] if first else "", []).append(line)
    return ["\n".join([header] + group) for group in ids.values()]


def reports_from_output(text: str, *, section_set: str | None = None, metrics=None, **extra) -> list[ProfileReport]:
    """One ProfileReport per profiled launch in ncu's captured output (its kernel name from ncu's "Kernel Name"),
    in launch order; where there is none, one report saying why (as report_from_output)."""
    parts = split_launches(text)
    if not parts:
        return [report_from_output(text, kernel="(no launch)", section_set=section_set, metrics=metrics, **extra)]
    out = []
    for part in parts:
        name = next(csv.DictReader(io.StringIO(part)), {}).get("Kernel Name", "") or "(unnamed)"
        out.append(report_from_output(part, kernel=name, section_set=section_set, metrics=metrics, **extra))
    return out


def profile_command(argv, *, kernel_regex: str, launch_count: int, metrics=None, section_set: str | None = None,
                    timeout_s: float = 600.0, executable: str | None = None, device=None,
                    extra_args=()) -> list[ProfileReport]:
    """Run the program `argv` under Nsight Compute, profiling its first `launch_count` launches whose function name
    (ncu --kernel-name-base function: no template or parameter list) matches `kernel_regex`, e.g. the kernels a
    library launches for one call (SDPA's "flash_bwd"). One ProfileReport per launch, in launch order, metrics and
    the retry without unknown metrics as `profile`; timeout_s bounds all of ncu's runs together."""
    if section_set is not None and section_set not in SECTION_SETS:
        raise ValueError(f"unknown ncu section set {section_set!r}; use one of {', '.join(SECTION_SETS)}")
    names = list(metrics) if metrics else [m for m, _ in DEFAULT_METRICS]
    exe = executable or ncu_path()
    head = [exe, "--clock-control", "none", "--csv", "--kernel-name-base", "function",
            "-k", f"regex:{kernel_regex}", "-c", str(int(launch_count))]
    t0 = time.perf_counter()
    out, timed_out, names, skipped, cmd = _run_ncu(head, list(extra_args) + [str(a) for a in argv], names,
                                                   section_set, timeout_s, (exe, device), total=True)
    notes = [f"ncu on this GPU does not know {', '.join(skipped)}: left out"] if skipped else []
    if timed_out:
        notes.append(f"stopped after {timeout_s:g} s (ncu replays each kernel once per counter pass)")
    return reports_from_output(out, section_set=section_set, metrics=names, command=cmd, timed_out=timed_out,
                               wall_ms=(time.perf_counter() - t0) * 1e3, notes=notes)
