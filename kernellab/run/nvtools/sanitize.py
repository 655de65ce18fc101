"""compute-sanitizer on one kernel job, in a separate process: findings with kernel, thread, block and cell line.

`sanitize(job, tool)` writes the job to a file, runs
`compute-sanitizer --tool <tool> --print-limit N --show-backtrace no ... python -m kernellab.run.launch.job JOBFILE`
and parses the text report. Each finding keeps the tool's headline ("Invalid __global__ write of size 4 bytes"),
the function, the source file and line (cell lines for %%cuda cells: kernellab always compiles with -lineinfo and
numbers lines as the editor does), the first thread and block that hit it, the address, and how many times the
same finding was reported (deduplicated by kind and location). The job runs with CuPy's memory pool off, so every
argument is its own allocation and memcheck knows each tensor's exact bounds.

The parser reads the formats compute-sanitizer has printed since CUDA 11 ("at kernel+0x70 in cell.cu:4" and the
older "at 0x70 in cell.cu:4:kernel"), and keeps the raw text in the report for anything it does not recognise.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time

from ...compile import toolkit
from ...errors import KernellabError
from ..findings import SanitizerReport, combine
from ..launch import worker
from ..launch.job import KernelJob
from . import sanitize_pool
from .sanitizer_text import (DEFAULT_PRINT_LIMIT, PRINT_LIMIT_NOTE, TOOLS, children_usage, decoded_text,  # noqa: F401
                             job_outcome, parse_location, parse_report, report_from_text, tool_args, tool_cost,
                             tool_env)
# (parse_location, parse_report, PRINT_LIMIT_NOTE: this module's public names since before the split, kept)



class ToolNotFoundError(KernellabError):
    """An NVIDIA command-line tool (compute-sanitizer, ncu) is not installed where kernellab looks."""


# --- running ------------------------------------------------------------------------------------------------


def sanitizer_path() -> str:
    """compute-sanitizer's path, or ToolNotFoundError saying where it was looked for."""
    path = toolkit.find_tool("compute-sanitizer")
    if not path:
        raise ToolNotFoundError("compute-sanitizer was not found (looked in the CUDA wheels, $CUDA_HOME/bin, "
                                "/usr/local/cuda/bin and PATH); it ships with the CUDA toolkit")
    return path


def warm(tools=TOOLS, *, device: int | None, timeout_s: float = 120.0, print_limit: int = DEFAULT_PRINT_LIMIT,
         extra_args=(), executable: str | None = None) -> dict[str, bool]:
    """Start this thread's warm compute-sanitizer of each tool now, all at once, and wait until each is ready for a job
    (its CUDA context made on `device`: the device the jobs will name, KernelJob.device): sanitize(..., pool=True)
    from this thread then finds them ready instead of paying the tool's set-up and the context on its first job.
    {tool: ready}; a tool whose process died or was not ready in `timeout_s` is False (its first job starts one)."""
    exe = executable or sanitizer_path()
    pools = [sanitize_pool.get_pool(t, executable=exe, print_limit=print_limit, extra_args=extra_args, device=device)
             for t in tools]
    deadline = time.time() + timeout_s
    for p in pools:
        p.warm(wait=False)
    return {p.tool: p.warm(timeout_s=max(0.0, deadline - time.time())) for p in pools}


def sanitize(job: KernelJob, tool: str = "memcheck", *, timeout_s: float = 300.0,
             print_limit: int = DEFAULT_PRINT_LIMIT, extra_args=(), executable: str | None = None,
             pool: bool | None = None) -> SanitizerReport:
    """Run `job` under compute-sanitizer `tool` ('memcheck', 'racecheck', 'synccheck', 'initcheck' or 'all').

    pool=True runs it in this process's warm compute-sanitizer of that tool (kernellab.run.nvtools.sanitize_pool: one
    CUDA context and tool set-up for many jobs); None: as $KERNELLAB_SANITIZER_POOL says (1: pooled; unset: a new
    process per job); False, or KERNELLAB_SANITIZER_POOL=0: a new process for this job."""
    tools = TOOLS if tool == "all" else tuple(t.strip() for t in str(tool).split("+"))
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        raise ValueError(f"unknown compute-sanitizer tool {bad[0]!r}; use one of {', '.join(TOOLS)} or 'all'")
    if len(tools) > 1:
        reports = [sanitize(job, t, timeout_s=timeout_s, print_limit=print_limit, extra_args=extra_args,
                            executable=executable, pool=pool) for t in tools]
        return combine(reports)
    tool = tools[0]
    exe = executable or sanitizer_path()
    fallback = None
    if sanitize_pool.wanted(pool):
        warm = sanitize_pool.get_pool(tool, executable=exe, print_limit=print_limit, extra_args=extra_args,
                                      device=job.device)
        try:
            return warm.run(job, timeout_s=timeout_s)
        except (OSError, ValueError, RuntimeError) as exc:     # the pool's own plumbing: this job runs one-shot
            warm.close()
            fallback = (f"the warm compute-sanitizer failed ({type(exc).__name__}: {exc}); this run used a process "
                        f"of its own")
    with tempfile.TemporaryDirectory(prefix="kernellab-sanitize-") as tmp:
        jobfile = job.with_data().save(os.path.join(tmp, "job.kljob"))
        resfile = os.path.join(tmp, "result.klres")
        cmd = [exe, *tool_args(tool, print_limit), *extra_args]
        cmd += [sys.executable, "-m", "kernellab.run.launch.job", jobfile, "--out", resfile]
        used0, spawned = children_usage(), time.time()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=tool_env(),
                                  start_new_session=True)
            out, code, timed_out = proc.stdout + proc.stderr, proc.returncode, False
        except subprocess.TimeoutExpired as exc:
            out = decoded_text(exc.stdout) + decoded_text(exc.stderr)
            code, timed_out = None, True
        wall = (time.perf_counter() - t0) * 1e3
        used1 = children_usage()
        _, status, marks, notes = job_outcome(resfile, timed_out, timeout_s)
        if fallback:
            notes.append(fallback)
    return report_from_text(out, tool=tool, job=job, timed_out=timed_out, exit_code=code, job_status=status,
                            command=tuple(cmd), wall_ms=wall, notes=notes,
                            cost=dataclasses.replace(tool_cost(wall / 1e3, used0, used1, spawned, marks),
                                                     process_started=True))


def sanitize_last(tool: str = "memcheck", error: BaseException | None = None, **kw) -> SanitizerReport:
    """Re-run the launch behind the last LaunchError (sys.last_value) under compute-sanitizer, in a new process.

    Works after a sticky fault too: the job keeps the arguments' shapes and dtypes (filled with zeros where
    their data sat on the lost context) and its scalars, and the tool runs in a process with a fresh context.
    """
    exc = error or getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    job = getattr(exc, "job", None)
    if job is None:
        raise KernellabError("no failed launch to re-run: sanitize_last() uses the job attached to the last "
                             "LaunchError; use kernel.sanitize(grid, block, *args) instead")
    return sanitize(job, tool, **kw)


def memcheck(job: KernelJob, timeout_s: float) -> SanitizerReport:
    """The job under memcheck: how an isolated worker diagnoses a fault (installed as worker.fault_sanitizer)."""
    return sanitize(job, tool="memcheck", timeout_s=timeout_s)


worker.fault_sanitizer = memcheck
