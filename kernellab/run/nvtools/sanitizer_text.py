"""compute-sanitizer's text, read: its reports parsed into findings (kernel, thread, block, cell line), a run's
SanitizerReport, what the run cost the host (ToolCost), and the environment of the tool's child Python. Shared by the
one-shot runs (sanitize.py) and the warm processes that serve many jobs (sanitize_pool.py)."""

from __future__ import annotations

import os
import re
import resource

from ..findings import Finding, Location, SanitizerReport, ToolCost
from ..launch.job import JobResult, KernelJob

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
DEFAULT_PRINT_LIMIT = 100
PRINT_LIMIT_NOTE = "(print limit)"      # in a report's notes when the tool stopped printing: findings may be missing
# memcheck's answer to an access it caught (a precise error): end that kernel only, not the CUDA context. The default
# ("context") destroys the context, so the target's later calls fail, it tears down through failing calls and exits,
# and a warm process must be replaced after every out-of-bounds submission; with "kernel" the target goes on
KEEP_CONTEXT = ("--destroy-on-device-error", "kernel")


def tool_args(tool: str, print_limit: int) -> list[str]:
    """compute-sanitizer's options for `tool` before the target, the same for a one-shot run and a warm process."""
    args = ["--tool", tool, "--print-limit", str(print_limit), "--show-backtrace", "no"]
    if tool == "racecheck":
        args += ["--racecheck-report", "all"]
    if tool == "memcheck":
        args += list(KEEP_CONTEXT)
    return args


PREFIX = re.compile(r"^=========(?P<rest>.*)$")
_THREAD_BLOCK = re.compile(r"by thread \((\d+),\s*(\d+),\s*(\d+)\) in block \((\d+),\s*(\d+),\s*(\d+)\)")
_ADDRESS = re.compile(r"^(?:Address|Access at|Access to)\s+(0x[0-9a-fA-F]+)(?:\s+(?:is\s+)?(?P<what>.*))?$")
_NEAREST = re.compile(r"^and is (?P<what>.*)$")
_SIZE = re.compile(r"of size (\d+) bytes?")
_HAZARD = re.compile(r"Potential (?P<type>RAW|WAR|WAW) hazard detected at (?P<space>__\w+__) (?P<addr>0x[0-9a-fA-F]+)"
                     r"(?: in block \((?P<b>[\d,\s]+)\))?", re.I)
_HAZARD_ACCESS = re.compile(r"^(?P<access>Write|Read|Atomic)\s+Thread\s+\((?P<t>[\d,\s]+)\)\s+at\s+(?P<loc>.+)$")
_RACE = re.compile(r"Race reported between (?P<a>\w+) access at (?P<loc>.+)$")
_RACE_AND = re.compile(r"^and (?P<b>\w+) access at (?P<loc>.+?)(?:\s+\[(?P<n>[\d,]+) hazards?\])?$")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+) errors?\s*$")
_NOT_PRINTED = re.compile(r"ERROR SUMMARY:\s*([\d,]+) errors? (?:was|were) not printed")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*([\d,]+) hazards? displayed \(([\d,]+) errors?, ([\d,]+) warnings?\)")
SKIP_HEAD = ("COMPUTE-SANITIZER", "LEAK SUMMARY", "Saved host backtrace", "Host Frame", "Device Frame",
              "Target application returned")
_NOTE_HEAD = ("Program hit", "Target application returned", "Cuda API error")
_PROC_ADDRESS_ERROR = re.compile(r"Program hit \S+ \(error \d+\) due to .* on CUDA API call to cuGetProcAddress\w*\.?$",
                                 re.M)

# "<func>+0x70 in <file>:<line>", "<func>+0x70", "0x70 in <file>:<line>:<func>", "0x70 in <func>"
_LOC_NEW = re.compile(r"^(?P<func>.*?)\+0x(?P<pc>[0-9a-fA-F]+)(?:\s+in\s+(?P<file>.+?):(?P<line>\d+))?\s*$")
_LOC_OLD = re.compile(r"^0x(?P<pc>[0-9a-fA-F]+)\s+in\s+(?:(?P<file>[^:]+?):(?P<line>\d+):)?(?P<func>.+?)\s*$")


def parse_location(text: str, job: KernelJob | None = None) -> Location:
    """A Location from the text after 'at' in a sanitizer report."""
    text = text.strip()
    if text.startswith("at "):
        text = text[3:].strip()
    m = _LOC_OLD.match(text) or _LOC_NEW.match(text)
    if not m:
        return Location(function=text)
    line = int(m.group("line")) if m.group("line") else None
    file = m.group("file")
    cell_line = source = None
    if job is not None and file and line and os.path.basename(file) == os.path.basename(job.filename):
        cell_line, source = line, job.line(line)
    return Location(function=m.group("func").strip(), pc=int(m.group("pc"), 16), file=file, line=line,
                    cell_line=cell_line, source_line=source)


def _triple(text: str) -> tuple[int, int, int]:
    return tuple(int(v) for v in text.replace(" ", "").split(","))[:3]


def _entries(text: str):
    """(headline, [detail lines]) blocks and the top-level lines, from the '=========' lines of a report."""
    blocks, current = [], None
    for raw in text.splitlines():
        m = PREFIX.match(raw)
        if not m:
            continue
        rest = m.group("rest")
        body = rest.strip()
        if not body:
            current = None
            continue
        indent = len(rest) - len(rest.lstrip(" "))
        if indent <= 1:
            current = [body, []]
            blocks.append(current)
        elif current is not None:
            current[1].append(body)
    return blocks


def _kind(head: str, details: list[str]) -> tuple[str, int | None]:
    m = re.match(r"Invalid (__\w+__ )?(?P<op>read|write|atomic)\w* of size (?P<n>\d+)", head, re.I)
    if m:
        misaligned = any(re.search(r"is misaligned", d) for d in details)
        return ("misaligned" if misaligned else f"invalid_{m.group('op').lower()}"), int(m.group("n"))
    m = re.match(r"Uninitialized (__\w+__ )?memory read of size (?P<n>\d+)", head, re.I)
    if m:
        return "uninitialized_read", int(m.group("n"))
    if head.lower().startswith("barrier error"):
        return "barrier", None
    if re.match(r"(Warp|Lane) (Illegal|Misaligned|Out-of-range|Hardware|Invalid)", head) or "trap" in head.lower():
        return "hardware_exception", None
    slug = re.sub(r"[^a-z0-9]+", "_", head.lower()).strip("_")[:40]
    return slug or "problem", None


def parse_report(text: str, tool: str = "memcheck", job: KernelJob | None = None) -> tuple[list, int | None, list]:
    """(findings deduplicated, the tool's error count, notes) from compute-sanitizer's text output."""
    findings: dict = {}
    races: list[Finding] = []
    notes: list[str] = []
    error_count = None
    for head, details in _entries(text):
        p = _NOT_PRINTED.search(head)
        if p:
            notes.append(f"{p.group(1)} further reports were not printed {PRINT_LIMIT_NOTE}: lines past the limit "
                         f"are missing from the findings; pass a larger print_limit to see them all")
            continue
        s = _ERROR_SUMMARY.search(head)
        if s:
            error_count = int(s.group(1).replace(",", ""))
            continue
        r = _RACE_SUMMARY.search(head)
        if r:
            shown, errors, warns = (int(g.replace(",", "")) for g in r.groups())
            error_count = (error_count or 0) + errors
            if warns:
                notes.append(f"racecheck: {r.group(3)} warning(s) (hazards that may be benign, e.g. warp-synchronous)")
            if shown < errors + warns:       # hazards and the race analysis past the limit were counted, not printed
                notes.append(f"racecheck printed {shown:,} of {errors + warns:,} hazards {PRINT_LIMIT_NOTE}: line "
                             f"pairs past the limit are missing from the findings; pass a larger print_limit")
            continue
        if head.startswith(_NOTE_HEAD):
            note = head + (" " + " ".join(details) if details and head.startswith("Cuda API") else "")
            if note not in notes:
                notes.append(note)
            continue
        if head.startswith(SKIP_HEAD):
            continue
        body = re.sub(r"^(Error|WARN|Warning|INFO)\s*:\s*(\([^)]*\)\s*)?", "", head)
        f = (race_finding(body, details, tool, job) or hazard_finding(body, details, tool, job)
             or access_finding(body, details, tool, job))
        if f is None:
            continue
        if f.kind == "race":
            races.append(f)             # merged by line pair below: hazards and the analysis describe the same race
            continue
        key = (f.kind, f.message, f.where.file, f.where.line, f.where.function)
        if key in findings:
            old = findings[key]
            findings[key] = Finding(**{**old.__dict__, "count": old.count + f.count,
                                       "thread": old.thread or f.thread, "block": old.block or f.block})
        else:
            findings[key] = f
    return list(findings.values()) + _merge_races(races), error_count, notes


def access_finding(head, details, tool, job) -> Finding | None:
    kind, size = _kind(head, details)
    where = thread = block = address = None
    detail = []
    for d in details:
        if d.startswith("at "):
            if where is None:
                where = parse_location(d, job)
            continue
        tb = _THREAD_BLOCK.search(d)
        if tb:
            v = [int(x) for x in tb.groups()]
            thread, block = tuple(v[:3]), tuple(v[3:])
            continue
        a = _ADDRESS.match(d)
        if a:
            address = a.group(1)
            detail.append((a.group("what") or "").strip())
            continue
        n = _NEAREST.match(d)
        if n:
            detail.append(n.group("what").strip().replace(" the nearest allocation", " the nearest allocation"))
    if where is None and thread is None:
        return None            # a banner or something this parser does not know: it stays in report.raw
    return Finding(tool=tool, kind=kind, message=head.rstrip(" :."), where=where or Location(), thread=thread,
                   block=block, address=address, size_bytes=size, detail="; ".join(x for x in detail if x))


def race_finding(head, details, tool, job) -> Finding | None:
    m = _RACE.search(head)
    if not m:
        return None
    first = parse_location(m.group("loc"), job)
    other = other_access = None
    count = 1
    for d in details:
        a = _RACE_AND.match(d)
        if a:
            other, other_access = parse_location(a.group("loc"), job), a.group("b")
            if a.group("n"):
                count = int(a.group("n").replace(",", ""))
    return Finding(tool=tool, kind="race", message="shared-memory data race", where=first, access=m.group("a"),
                   other=other, other_access=other_access, count=count,
                   detail="no __syncthreads() orders these accesses")


def hazard_finding(head, details, tool, job) -> Finding | None:
    m = _HAZARD.search(head)
    if not m:
        return None
    block = _triple(m.group("b")) if m.group("b") else None
    accesses = []
    for d in details:
        a = _HAZARD_ACCESS.match(d)
        if a:
            accesses.append((a.group("access"), _triple(a.group("t")), parse_location(a.group("loc"), job)))
    if not accesses:
        return None
    (acc1, t1, l1), rest = accesses[0], accesses[1:]
    acc2, t2, l2 = rest[0] if rest else (None, None, None)
    return Finding(tool=tool, kind="race", message=f"shared-memory data race ({m.group('type').upper()} hazard)",
                   where=l1, thread=t1, block=block, address=m.group("addr"), access=acc1, other=l2,
                   other_access=acc2, other_thread=t2, detail="no __syncthreads() orders these accesses")


def _merge_races(races: list[Finding]) -> list[Finding]:
    """One finding per racing pair of lines: the hazards give a thread and block, the analysis line the total."""
    groups: dict = {}
    for f in races:
        lines = tuple(sorted((f.where.line or 0, f.other.line if f.other else 0)))
        groups.setdefault((f.where.function, lines), []).append(f)
    out = []
    for group in groups.values():
        hazards = [f for f in group if f.thread is not None]
        analysis = [f for f in group if f.thread is None]
        first = hazards[0] if hazards else analysis[0]
        count = max(f.count for f in analysis) if analysis else len(hazards)
        where, other = (analysis[0].where, analysis[0].other) if analysis else (first.where, first.other)
        access = analysis[0].access if analysis else first.access
        other_access = analysis[0].other_access if analysis else first.other_access
        out.append(Finding(**{**first.__dict__, "where": where, "other": other, "access": access,
                              "other_access": other_access, "count": count}))
    return out


def report_from_text(text: str, *, tool: str, job: KernelJob | None = None, kernel: str | None = None,
                     counted: int | None = None, **extra) -> SanitizerReport:
    """A SanitizerReport from a captured compute-sanitizer output (what `sanitize` does after running it); `counted`:
    the error count where the text has no summary (one job's part of a warm tool's output, sanitize_pool)."""
    findings, error_count, notes = parse_report(text, tool, job)
    if error_count is None and counted is not None:
        error_count = counted
    # Failed driver entry-point lookups of the host process (cuda-python asks cuGetProcAddress for symbols this driver
    # may not have, and handles the answer) are counted in the ERROR SUMMARY like kernel errors; they are not the
    # kernel's. Any other failed API call still counts.
    lookups = len(_PROC_ADDRESS_ERROR.findall(text))
    if lookups and not findings and error_count:
        error_count = max(0, error_count - lookups)
        notes = [n for n in notes if "cuGetProcAddress" not in n]
        notes.append(f"{tool} also counted {lookups} failed cuGetProcAddress call(s) of the host process (driver "
                     f"entry points looked up by name): not errors of the kernel")
    if error_count and not findings:
        notes.append(f"{tool} counted {error_count} error(s) that kernellab could not parse; see report.raw")
    return SanitizerReport(tool=tool, kernel=kernel or (job.label if job else "?"), findings=tuple(findings),
                           error_count=error_count, notes=tuple(notes + list(extra.pop("notes", ()))), raw=text,
                           **extra)


def tool_env() -> dict:
    """The environment for a tool's child Python: this kernellab importable, output unbuffered."""
    env = dict(os.environ)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the folder above kernellab/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def children_usage() -> dict:
    """What this process's finished child processes (and theirs, once reaped) have used so far: "cpu_s" (user +
    system, getrusage), "read_bytes" and "read_chars" (/proc/self/io, which adds a reaped child's I/O to its parent's;
    it holds this process's own I/O too, small while it waits on the tool). A figure it cannot read is absent. Exact
    for a tool's run where one thread of this process starts child processes at a time (a Dask worker of one
    thread)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"cpu_s": kids.ru_utime + kids.ru_stime}
    try:
        with open("/proc/self/io") as fh:
            io = dict(line.split(":", 1) for line in fh if ":" in line)
        out["read_bytes"], out["read_chars"] = int(io["read_bytes"]), int(io["rchar"])
    except (OSError, KeyError, ValueError):
        pass
    return out


def tool_cost(wall_s: float, before: dict, after: dict, spawned: float, marks: dict) -> ToolCost:
    """A ToolCost from children_usage() before and after the tool's run, the wall-clock time it was started and the
    job's marks (JobResult.marks: "process start", "job ready", "module loaded", "kernel start", "kernel end"); a part
    whose marks are missing or out of the run's span (a clock that cannot be trusted) is None."""
    def diff(key):
        return after[key] - before[key] if key in after and key in before else None

    def since_spawn(mark):
        t = marks.get(mark)
        return t - spawned if t is not None and -0.5 <= t - spawned <= wall_s + 0.5 else None

    def between(a, b):
        return b - a if a is not None and b is not None and b >= a else None

    start, kernel, end = since_spawn("process start"), since_spawn("kernel start"), since_spawn("kernel end")
    ready, loaded = since_spawn("job ready"), since_spawn("module loaded")
    return ToolCost(wall_s=wall_s, cpu_s=diff("cpu_s"), read_bytes=diff("read_bytes"), read_chars=diff("read_chars"),
                    tool_start_s=None if start is None else max(0.0, start),
                    imports_s=between(None if start is None else max(0.0, start), ready),
                    context_s=between(ready, loaded), to_kernel_s=kernel,
                    kernel_s=end - kernel if kernel is not None and end is not None else None,
                    after_kernel_s=max(0.0, wall_s - end) if end is not None else None)


def decoded_text(b) -> str:
    """A tool's captured output as text (bytes decoded, None as "")."""
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def job_outcome(resfile: str, timed_out: bool, timeout_s: float) -> tuple[JobResult | None, str | None, dict, list]:
    """What the job's result file, written by the target under the tool, says: (the result or None, its status, its
    marks, the notes a report takes from it: the launch's own failure, no result, the timeout)."""
    res, notes = None, []
    if os.path.exists(resfile):
        with open(resfile, "rb") as fh:
            res = JobResult.from_bytes(fh.read())
        if not res.ok and res.status != "fault":
            notes.append(f"the launch itself: {res.message}")
    elif not timed_out:
        notes.append("the job did not write a result; see report.raw for the process's output")
    if timed_out:
        notes.append(f"stopped after {timeout_s:g} s: the kernel may not terminate (an endless loop?)")
    return res, (res.status if res else None), (dict(res.marks) if res else {}), notes
