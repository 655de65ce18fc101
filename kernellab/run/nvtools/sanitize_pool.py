"""Warm compute-sanitizer processes: one per (thread, tool, device), each running many jobs in turn.

Every one-shot `sanitize()` starts `compute-sanitizer --tool T python -m kernellab.run.launch.job JOBFILE`: a new
process, the tool's set-up and a new CUDA context under the tool for each job, and the context is host-wide driver
work that waits on the other GPUs' (a class graded over a host's GPUs spent most of each tool run there). A
`SanitizerPool` starts `compute-sanitizer --tool T ... python -m kernellab.run.launch.job --serve REQUESTS` once and
hands it job after job through the named pipe REQUESTS; the context and the tool's set-up are made once.

Which findings belong to which job: the program order of one output stream. The target's stdout and stderr and the
tool's reports share one pipe, and compute-sanitizer prints a report from the target's side before the CUDA call that
met the event returns (seen on an H200, compute-sanitizer 2025.3.1: racecheck printed a racy launch's hazards, and
with --racecheck-report analysis its "Race reported" line, before the target's line after that launch's
synchronize, launch after launch; memcheck printed a failed API call's report before the target's next line). So:

- the target prints "@@kernellab-job begin SEQ" on stdout before it touches the job: nothing of the job comes before;
- after the job (its synchronize, its result file, a device-wide synchronize, and a CUDA call that fails on purpose,
  kernellab.run.launch.job.end_of_job_call), the target prints and flushes "@@kernellab-job end SEQ STATUS": every
  report of the job came before it. What lies between the two lines is the job's, for every tool; the pool reads to
  the end line and waits for nothing more;
- the failing call is an extra check, never required: memcheck reports failed API calls (racecheck does not report
  them at all), so where the tool has been seen to report a call (END_CALLS_SEEN, or earlier in this pool), its
  report must come before the end line. Where it does not, the
  stream is out of order; so is a report that comes between one job's end line and the next job's begin line, or
  the other job's end-of-job call (odd and even jobs make differently named calls) inside a job. A job where any of
  these is seen is read to the end of its process's output, its report says so, and from then on every job gets a
  process of its own (exact, as one-shot; `stats()["ordered"]` is False). A late report that lands inside the next
  job's span under a tool that reports no API errors cannot be told from that job's own: this is the assumption the
  real tool was seen to keep, and tests/gpu/test_sanitizer_pool_gpu.py checks it on the GPU;
- a job that leaves the context unusable (a fault: the end line says "poisoned") is the process's last: the target
  exits, and the pool reads to the end of the tool's output and starts a new process for the next job. A hang is
  killed at its timeout, as the one-shot path does, and so is a process that dies; the next job gets a new process.
  An access memcheck catches is not such a fault: memcheck runs with --destroy-on-device-error kernel
  (sanitizer_text.KEEP_CONTEXT), so it ends that kernel only and the process serves the next job (seen on an H200:
  out of bounds, clean, out of bounds, clean in one process, the same findings as one-shot).

Ahead of the jobs: `SanitizerPool.warm()` (and `sanitize.warm()` for several tools at once) starts the process before
its first job and waits until the target has made its CUDA context (the pool's device, `--device`) and opened its
requests; when a process ends (a fault, a hang, a crash), its replacement (the spare) starts at once, not at the next
job. A process that never got a job is killed at close. Either way the tool's set-up and the context are made off
the next job's clock.

A process runs with --print-limit 0 (no limit: the tool's limit counts over the process's life); each job's own
print limit is applied to its part of the output, and its count is counted there, so its SanitizerReport reads as the
one-shot one does (the error count, "printed N of M" notes). The tool's summaries at exit count the whole process and
are dropped.

The switch: `KERNELLAB_SANITIZER_POOL=1` pools the graders' sanitizer stage and every plain `sanitize()`;
unset, the graders run each tool one-shot (a process per run) until a GPU run has verified the pool
(`default_on()`), and a plain `sanitize()` pools only when asked (`pool=True`). `KERNELLAB_SANITIZER_POOL=0` turns
pooling off everywhere, `pool=True` included; `sanitize(..., pool=False)` for one call.
"""
from __future__ import annotations

import atexit
import errno
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..findings import SanitizerReport
from ..launch.job import JOB_MARK, KernelJob
from .sanitizer_text import (PREFIX, SKIP_HEAD, access_finding, children_usage, hazard_finding, job_outcome,
                             race_finding, report_from_text, tool_args, tool_cost, tool_env)

ENV = "KERNELLAB_SANITIZER_POOL"
# The end-of-job calls (by job parity: 0 even, 1 odd) each tool was seen to report on a GPU: their report must come
# before the job's end line from the start; a call first seen reported later is checked from then on
END_CALLS_SEEN = {"memcheck": {1}}
STOP_TIMEOUT_S = 30.0                # a process told to finish (its request pipe closed) is killed after this

# The tool's report of each end-of-job call (kernellab.run.launch.job.end_of_job_call): [even job's, odd job's]
_END_CALLS = (re.compile(r"^=========\s*Program hit .* on CUDA API call to cu(?:da)?(?:GetDeviceProperties|DeviceGet"
                         r"Properties)\w*"),
              re.compile(r"^=========\s*Program hit .* on CUDA API call to cu(?:da)?DeviceGetAttribute\b"))
# What the runtime may call in the driver on the end-of-job call's behalf (cuDeviceGet for the missing device), before
# the call's own report: where the tool reports such a call too, it is the end-of-job call's, never the job's
_END_CALL_ECHO = re.compile(r"^=========\s*Program hit .* on CUDA API call to cuDevice\w*")
# CuPy clears a failed call's error with cudaGetLastError, which memcheck reports too, right after the call's report
_END_CALL_CLEAR = re.compile(r"^=========\s*Program hit .* on CUDA API call to cudaGetLastError\b")


def _without_end_calls(lines: list[str]) -> list[str]:
    """`lines` less the tool's reports of end-of-job calls (and of what the runtime and CuPy call for them)."""
    out, after_call = [], False
    for ln in lines:
        if end_call(ln) is not None or _END_CALL_ECHO.match(ln):
            after_call = True
            continue
        if after_call and _END_CALL_CLEAR.match(ln):
            continue
        if ln.startswith("=========") and ln[9:].strip() and not ln[9:].startswith("  "):
            after_call = False                  # another report's headline
        out.append(ln)
    return out


def end_call(line: str) -> int | None:
    """0 or 1 when `line` is the tool's report of an even or odd job's end-of-job call, else None."""
    for parity, rx in enumerate(_END_CALLS):
        if rx.match(line):
            return parity
    return None


_SUMMARY = re.compile(r"^=========\s*(ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY)")
_OFF = ("0", "off", "no", "false")
_ON = ("1", "on", "yes", "true")


def default_on() -> bool:
    """Whether the graders pool their tool runs: only where KERNELLAB_SANITIZER_POOL=1 asks (unset: one-shot, a
    process per tool run, until the pool has been verified on a GPU)."""
    return os.environ.get(ENV, "").strip().lower() in _ON


def wanted(pool: bool | None) -> bool:
    """Whether a sanitize() call with `pool` (True, False, None: the environment decides) runs in a warm process."""
    env = os.environ.get(ENV, "").strip().lower()
    if pool is False or env in _OFF:
        return False
    return pool is True or env in _ON


# --- the usage of a live process tree (a warm tool's CPU seconds and reads for one job) -----------------------------


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            pass
    return out


def tree_usage(pid: int) -> dict:
    """CPU seconds (user + system) and bytes read (read_bytes, rchar) of process `pid` and its descendants, from
    /proc; the figures it cannot read are absent."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    cpu, rb, rc, ok_cpu, ok_io = 0.0, 0, 0, False, False
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            cpu += (int(f[11]) + int(f[12])) / tick          # utime, stime (fields 14, 15)
            ok_cpu = True
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{p}/io") as fh:
                io = dict(line.split(":", 1) for line in fh if ":" in line)
            rb, rc, ok_io = rb + int(io["read_bytes"]), rc + int(io["rchar"]), True
        except (OSError, KeyError, ValueError):
            pass
    out = {}
    if ok_cpu:
        out["cpu_s"] = cpu
    if ok_io:
        out["read_bytes"], out["read_chars"] = rb, rc
    return out


# --- one warm process -------------------------------------------------------------------------------------------


class _Process:
    """A running `compute-sanitizer ... --serve REQUESTS`, its output read line by line into a queue."""

    def __init__(self, cmd: list[str], requests: str, env: dict):
        self.cmd, self.requests = cmd, requests
        self.kids0 = children_usage()             # what this process's reaped children had used before it
        self.spawned = time.time()
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True, text=True, errors="replace", bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        self.fd: int | None = None
        self.jobs = 0
        self.sent = False                         # a request was written to it (a job began here)
        self.eof = False
        threading.Thread(target=self._read, daemon=True, name="kernellab-sanitizer-output").start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def alive(self) -> bool:
        return self.popen.poll() is None and not self.eof

    def open(self, deadline: float) -> bool:
        """Open this side of the requests pipe: True once the target has opened its side (it is ready for a job);
        False if it is gone, or not ready by `deadline`."""
        while self.fd is None:
            try:
                self.fd = os.open(self.requests, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:          # ENXIO: the target has not opened it for reading yet
                    return False
                if self.popen.poll() is not None or time.time() > deadline:
                    return False
                time.sleep(0.005)
        return True

    def send(self, line: str, deadline: float) -> bool:
        """Hand the target one request; False if it is gone (or never opened its pipe) before `deadline`."""
        if not self.open(deadline):
            return False
        self.sent = True
        data = line.encode()
        try:
            while data:
                try:
                    data = data[os.write(self.fd, data):]
                except BlockingIOError:
                    if time.time() > deadline:
                        return False
                    time.sleep(0.005)
        except OSError:                               # EPIPE: the target is gone
            return False
        return True

    def next_line(self, deadline: float) -> str | None | bool:
        """The next line of output; None at its end; False when `deadline` passed first."""
        if self.eof:
            return None
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.time()))
        except queue.Empty:
            return False
        if line is None:
            self.eof = True
        return line

    def finish(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Close its requests (the target then exits and the tool prints its summary); the rest of its output. A
        process that was never sent a job (a spare, a warmed one) has nothing to say: it is killed at once."""
        if not self.sent:
            self.kill()
            return self.drain()
        if self.fd is not None:
            self.close_requests()
        elif self.popen.poll() is None:               # never opened: open and close it so the target's open returns
            try:
                os.close(os.open(self.requests, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        rest, deadline = [], time.time() + timeout_s
        while True:
            line = self.next_line(deadline)
            if line is None:
                break
            if line is False:
                self.kill()
                rest += self.drain()
                break
            rest.append(line)
        try:
            self.popen.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.kill()
        return rest

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.close_requests()

    def close_requests(self) -> None:
        """Close this side of the requests pipe, if open."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def drain(self, wait_s: float = 2.0) -> list[str]:
        """What is left of its output once it is killed (the reader reaches the end soon after)."""
        out, deadline = [], time.time() + wait_s
        while True:
            line = self.next_line(deadline)
            if line is None or line is False:
                return out
            out.append(line)


# --- the pool -------------------------------------------------------------------------------------------------------


class SanitizerPool:
    """A warm compute-sanitizer process for one tool (and device, executable, options), serving jobs one at a time."""

    def __init__(self, tool: str, *, executable: str, print_limit: int, extra_args=(), env: dict | None = None,
                 device: int | None = None, spare: bool = True):
        self.tool, self.exe, self.print_limit, self.extra_args = tool, executable, int(print_limit), tuple(extra_args)
        self.device = device                          # the target makes its context here before its first job
        self.spare = spare                            # start the next process as soon as one ends, not at the next job
        self.env = env if env is not None else tool_env()
        self.end_calls = set(END_CALLS_SEEN.get(tool, ()))   # the parities whose end-of-job call the tool reports
        self.ordered = True                           # False: the output was seen out of order; a process per job
        self.out_of_order: list[int] = []             # the jobs where it was seen
        self.after_last = 0                           # report lines after a process's last end line (closed)
        self.folder = tempfile.mkdtemp(prefix=f"kernellab-sanitizer-{tool}-")
        self.proc: _Process | None = None
        self.lock = threading.Lock()
        self.seq = 0
        self.processes_started = 0
        self.jobs_run = 0
        self.restarts: dict[str, int] = {}            # why a process was replaced: "fault", "timeout", "crash", ...

    def command(self, requests: str) -> list[str]:
        cmd = [self.exe, *tool_args(self.tool, 0), *self.extra_args]
        cmd += [sys.executable, "-m", "kernellab.run.launch.job", "--serve", requests]
        return cmd + ([] if self.device is None else ["--device", str(self.device)])

    def stats(self) -> dict:
        """Processes started, jobs run, why processes were replaced, whether the output kept program order (and the
        jobs where it did not), which end-of-job calls the tool reports (0: even jobs', 1: odd jobs'), report lines
        after a last job."""
        return {"tool": self.tool, "processes_started": self.processes_started, "jobs": self.jobs_run,
                "restarts": dict(self.restarts), "ordered": self.ordered, "out_of_order": list(self.out_of_order),
                "end_calls_reported": sorted(self.end_calls), "reports_after_last_job": self.after_last}

    def _start(self) -> _Process:
        self.processes_started += 1
        requests = os.path.join(self.folder, f"requests-{self.processes_started}")
        os.mkfifo(requests)
        return _Process(self.command(requests), requests, self.env)

    def _retire(self, why: str, *, finish: bool = True) -> list[str]:
        proc, self.proc = self.proc, None
        if proc is None:
            return []
        self.restarts[why] = self.restarts.get(why, 0) + 1
        rest = proc.finish() if finish else []
        if finish and proc.jobs:      # after its last end line only the tool's summaries may come
            self.after_last += len(_stray(rest))
        try:
            os.unlink(proc.requests)
        except OSError:
            pass
        return rest

    def warm(self, timeout_s: float = 120.0, *, wait: bool = True) -> bool:
        """Start the process now, if none is running, and wait until it is ready for a job (the tool set up, the
        target's imports made and, with a device, its CUDA context): True when it is, False if it died or was not
        ready in `timeout_s` (the next job then starts a process of its own, as without warming). wait=False: start
        it and return at once (True)."""
        with self.lock:
            if not os.path.isdir(self.folder):
                self.folder = tempfile.mkdtemp(prefix=f"kernellab-sanitizer-{self.tool}-")
            if self.proc is not None and not self.proc.alive():
                self._retire("gone")
            if self.proc is None:
                self.proc = self._start()
            return True if not wait else self.proc.open(time.time() + timeout_s)

    def close(self) -> None:
        """End the warm process (it starts again on the next job)."""
        with self.lock:
            if self.proc is not None:
                self._retire("closed")
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, job: KernelJob, *, timeout_s: float = 300.0) -> SanitizerReport:
        """`job` under the warm tool: the same SanitizerReport as sanitize()'s one-shot path."""
        with self.lock:
            if not os.path.isdir(self.folder):
                self.folder = tempfile.mkdtemp(prefix=f"kernellab-sanitizer-{self.tool}-")
            return self._run(job, timeout_s)

    def _run(self, job: KernelJob, timeout_s: float) -> SanitizerReport:
        self.seq += 1
        seq = self.seq
        jobfile = job.with_data().save(os.path.join(self.folder, f"job-{seq}.kljob"))
        resfile = os.path.join(self.folder, f"result-{seq}.klres")
        t0 = time.perf_counter()
        proc = self.proc
        if proc is not None and not proc.alive():
            self._retire("gone")
            proc = None
        if proc is None:             # started for this job: its start is part of the job's cost
            proc = self.proc = self._start()
            spawned, before = proc.spawned, {"cpu_s": 0.0, "read_bytes": 0, "read_chars": 0}
        else:                        # warm, or started ahead (warm(), a spare): the job's cost starts now
            spawned, before = time.time(), tree_usage(proc.popen.pid)
        started = proc.jobs == 0
        deadline = time.time() + timeout_s
        lines, pre, end, called, other_call, poisoned, timed_out, gone = [], [], None, False, 0, False, False, False
        began, mine = False, seq % 2
        if not proc.send(f"{seq}\t{jobfile}\t{resfile}\n", deadline):
            if time.time() < deadline:                      # its pipe closed: the target is gone or going
                try:
                    proc.popen.wait(timeout=min(STOP_TIMEOUT_S, max(0.0, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    pass
            gone = proc.popen.poll() is not None
            timed_out = not gone
        while not (gone or timed_out):
            line = proc.next_line(deadline)
            if line is None:
                gone = True
                break
            if line is False:
                timed_out = True
                break
            if not began:      # before the begin line: the tool's banner and start-up, or what came after the last job
                began = line.startswith(f"{JOB_MARK} begin {seq}")
                if not began:
                    pre.append(line)
                continue
            if line.startswith(f"{JOB_MARK} end {seq}"):
                end = line                                  # program order: all of the job's reports came before
                poisoned = line.rstrip().endswith(" poisoned")
                break
            parity = end_call(line)
            if parity is not None:                          # never a finding of the job
                if parity == mine:
                    called = True
                else:
                    other_call += 1
                continue
            if called or _END_CALL_ECHO.match(line):
                # the end-of-job call is the job's last CUDA call: what the tool reports after its report is the call's
                # own (memcheck also reports the cudaGetLastError that CuPy makes to clear the call's error)
                continue
            lines.append(line)
        if called:
            self.end_calls.add(mine)
        # what says the stream is out of order (the module docstring): none of it is needed to end the job. Once seen,
        # every job is read to its own process's end (exact), and nothing more is looked for
        late = []
        stray = _stray(pre) if proc.jobs and self.ordered else []   # a process's first job: its start-up comes first
        if stray:
            late.append(f"{len(stray)} report line(s) came after the previous job's end line")
        if other_call and self.ordered:
            late.append("the previous job's end-of-job call was reported inside this job")
        if end is not None and not poisoned and mine in self.end_calls and not called and self.ordered:
            late.append(f"{self.tool} did not report this job's end-of-job call before its end line")
        rest: list[str] = []
        if timed_out:
            proc.kill()
            rest = proc.drain()
            self._retire("timeout", finish=False)
        elif gone or poisoned:
            rest = proc.finish()
            self._retire("fault" if poisoned else "crash", finish=False)
        elif late or not self.ordered:                      # read to the end of its process's output: exact
            rest = proc.finish()
            self._retire("out of order" if late else "one job per process", finish=False)
        if late:
            self.ordered = False
            self.out_of_order.append(seq)
        if self.proc is None and self.spare:
            # the next job's process starts now, while this job's findings are read and the grader goes on: the
            # tool's set-up and the CUDA context are not paid again on the next job's clock
            try:
                self.proc = self._start()
            except OSError:                                  # this job's report stands; the next job starts one
                self.proc = None
        if not began:        # the target never reached the job (it failed to start, or hung before): all it said
            lines = pre + lines
        lines += [ln for ln in _without_end_calls(rest) if not ln.startswith(JOB_MARK) and not _SUMMARY.match(ln)]
        wall = (time.perf_counter() - t0) * 1e3
        if proc.popen.poll() is None:
            after = tree_usage(proc.popen.pid)
        else:                # ended and reaped: its whole life is in this process's children's usage since it started
            kids = children_usage()
            after = {k: kids[k] - proc.kids0[k] for k in kids if k in proc.kids0}
        exit_code = proc.popen.returncode if proc.popen.poll() is not None and (gone or timed_out) else None
        self.jobs_run += 1
        proc.jobs += 1
        text = "\n".join(job_text(lines, self.tool, self.print_limit))
        res, status, marks, notes = job_outcome(resfile, timed_out, timeout_s)
        if res is not None and exit_code is None:
            exit_code = 0 if res.ok else 1                  # what the one-shot command returns for this job
        if late:
            notes.append(f"{self.tool}'s output was out of program order ({'; '.join(late)}): this job was read to the "
                         f"end of its process's output, and every job from now on runs in a process of its own; the "
                         f"job before it may have missed reports that came late")
        for path in (jobfile, resfile):
            try:
                os.unlink(path)
            except OSError:
                pass
        cost = tool_cost(wall / 1e3, before, after, spawned, marks)
        cost = type(cost)(**{**cost.__dict__, "process_started": started})
        return report_from_text(text, tool=self.tool, job=job, timed_out=timed_out, exit_code=exit_code,
                                  job_status=status, command=tuple(proc.cmd), wall_ms=wall, notes=notes, cost=cost)


def _blocks(lines: list[str]) -> list[tuple[str, list[str], list[int]]]:
    """The tool's entries in `lines` as (headline, detail lines, indices of their lines, the closing blank included),
    as sanitize._entries groups them; lines that are not the tool's (the target's own) belong to none."""
    out, current = [], None
    for i, raw in enumerate(lines):
        m = PREFIX.match(raw)
        if not m:
            continue
        rest = m.group("rest")
        if not rest.strip():
            if current is not None:
                current[2].append(i)
            current = None
            continue
        if len(rest) - len(rest.lstrip(" ")) <= 1:
            current = (rest.strip(), [], [i])
            out.append(current)
        elif current is not None:
            current[1].append(rest.strip())
            current[2].append(i)
    return out


def _report_kind(head: str, details: list[str]) -> str | None:
    """"error" or "warning" for a report the tool counts (and its print limit counts), None for anything else."""
    if head.startswith(SKIP_HEAD) or "SUMMARY" in head:
        return None
    if head.startswith("Program hit"):
        return "error"
    warn = re.match(r"(WARN|Warning)\b", head) is not None
    body = re.sub(r"^(Error|WARN|Warning|INFO)\s*:\s*(\([^)]*\)\s*)?", "", head)
    if race_finding(body, details, "", None) or hazard_finding(body, details, "", None):
        return "warning" if warn else "error"
    if not warn and access_finding(body, details, "", None):
        return "error"
    return None


def job_text(lines: list[str], tool: str, print_limit: int) -> list[str]:
    """A job's part of a warm tool's output as the one-shot command would have printed it with `--print-limit
    print_limit`: reports past the limit dropped, and the tool's summary for the job's own reports last."""
    errors = warnings = shown = shown_errors = 0
    drop: set[int] = set()
    for head, details, where in _blocks(lines):
        kind = _report_kind(head, details)
        if kind is None:
            continue
        errors, warnings = errors + (kind == "error"), warnings + (kind == "warning")
        if print_limit > 0 and shown >= print_limit:
            drop.update(where)
            continue
        shown, shown_errors = shown + 1, shown_errors + (kind == "error")
    out = [ln for i, ln in enumerate(lines) if i not in drop]
    out.append("kernellab: this job's part of a warm compute-sanitizer's output; the summary below counts it")
    if tool == "racecheck":
        out.append(f"========= RACECHECK SUMMARY: {shown} hazard{'s' if shown != 1 else ''} displayed ({errors} "
                   f"error{'s' if errors != 1 else ''}, {warnings} warning{'s' if warnings != 1 else ''})")
    else:
        if errors > shown_errors:
            out.append(f"========= ERROR SUMMARY: {errors - shown_errors} errors were not printed")
        out.append(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}")
    return out


def _stray(lines: list[str]) -> list[str]:
    """The lines of `lines` that are the tool's reports (not its banner, notes or summaries): where none may be."""
    out = []
    for head, details, where in _blocks(lines):
        if _report_kind(head, details) is not None or end_call("========= " + head) is not None \
                or _END_CALL_ECHO.match("========= " + head):
            out.extend(lines[i] for i in where)
    return out


def count_errors(text: str) -> int:
    """The errors compute-sanitizer reported in `text` (a job's part of its output), counted as its ERROR SUMMARY
    counts them: each access, hazard, race, barrier or exception report and each failed API call; warnings not."""
    lines = text.splitlines()
    return sum(_report_kind(head, details) == "error" for head, details, _ in _blocks(lines))


# --- the pools of this process ------------------------------------------------------------------------------------

_pools: dict = {}
_pools_lock = threading.Lock()


def get_pool(tool: str, *, executable: str, print_limit: int, extra_args=(), device: int | None = None
             ) -> SanitizerPool:
    """This thread's warm pool for (tool, device, executable, options), made on first use. One per thread: a pool
    runs one job at a time, and threads that sanitize at once (a multi-threaded worker) must not wait on each other;
    a Dask worker of one thread keeps one per tool and GPU across its submissions."""
    key = (tool, device, executable, int(print_limit), tuple(extra_args), threading.get_ident())
    orphans = []
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            alive = {t.ident for t in threading.enumerate()}
            for k in [k for k in _pools if k[-1] not in alive]:     # threads that have ended: their processes go
                orphans.append(_pools.pop(k))
            pool = _pools[key] = SanitizerPool(tool, executable=executable, print_limit=print_limit,
                                               extra_args=extra_args, device=device)
    for old in orphans:
        old.close()
    return pool


def stats() -> list[dict]:
    """Each pool's stats() (processes started, jobs, replacements), in this process."""
    with _pools_lock:
        return [p.stats() for p in _pools.values()]


def shutdown() -> None:
    """End every warm compute-sanitizer process of this process (also at exit)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.close()


def _forget_in_child() -> None:
    """A forked child shares no warm process with its parent (their pipes are the parent's)."""
    _pools.clear()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
