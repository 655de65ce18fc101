"""Warm compute-sanitizer processes: one per (thread, tool, device), each running many jobs in turn.

Every one-shot `sanitize()` starts `compute-sanitizer --tool T python -m kernellab.run.launch.job JOBFILE`: a new
process, the tool's set-up and a new CUDA context under the tool for each job, and the context is host-wide driver
work that waits on the other GPUs' (a class graded over a host's GPUs spent most of each tool run there). A
`SanitizerPool` starts `compute-sanitizer --tool T ... python -m kernellab.run.launch.job --serve REQUESTS` once and
hands it job after job through the named pipe REQUESTS; the context and the tool's set-up are made once.

Which findings belong to which job, by construction:

- the target prints "@@kernellab-job begin SEQ" on stdout before it touches the job, so nothing of the job can be
  reported before that line (the tool's output and the target's share the pipe the pool reads);
- after the job (its synchronize, its result file, a device-wide synchronize), the target makes a CUDA call that
  fails on purpose (kernellab.run.launch.job.end_of_job_call: cudaDeviceGetAttribute with an attribute no device
  has for an odd job, cudaGetDeviceProperties of a device that does not exist for an even one), then prints
  "@@kernellab-job end SEQ STATUS". compute-sanitizer reports the failed call ("Program hit ... on CUDA API call to
  cudaDeviceGetAttribute") in its own output stream, after what it reported for the job's kernels (they finished
  before the call was made), wherever and however late it prints them (the front-end or the injected library). The
  pool reads until it has both the end line and that report, so the job's part is complete whether the tool prints
  before or after the target's line. Consecutive jobs end with differently named calls, so a late second report of
  one job's call (the runtime's own driver call, where the tool reports it) cannot end the next job early;
- a job that leaves the context unusable (a fault: the end line says "poisoned") is the process's last: the target
  exits, and the pool reads to the end of the tool's output (the tool has then printed everything) and starts a new
  process for the next job. A hang is killed at its timeout, as the one-shot path does, and so is a process that
  dies; the next job gets a new process;
- where the tool does not report the failed call within END_CALL_GRACE_S of the end line, that job is read to the
  end of its process's output (exact). The tool may hold its reports until exit where its stdout is a pipe, so the
  next process writes to a terminal (a pty); where that shows no report either, the pool ends the process after
  every job (one process per job, as one-shot, still exact), and says so in its `stats()`.

A job's error count is counted from its own part of the output (the tool's ERROR SUMMARY is only printed at exit,
for the whole process). The tool's --print-limit counts over the process's life, so a process is given
`print_limit * PROCESS_PRINT_JOBS` and replaced before a job could find less than `print_limit` of it left.

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
from ..launch.job import JOB_MARK, JobResult, KernelJob

ENV = "KERNELLAB_SANITIZER_POOL"
END_CALL_GRACE_S = 5.0              # how long after the end line the tool's report of the end-of-job call may take
PROCESS_PRINT_JOBS = 50              # a process's --print-limit, in jobs' print limits
STOP_TIMEOUT_S = 30.0                # a process told to finish (its request pipe closed) is killed after this

# The tool's report of each end-of-job call (kernellab.run.launch.job.end_of_job_call): [even job's, odd job's]
_END_CALLS = (re.compile(r"^=========\s*Program hit .* on CUDA API call to cu(?:da)?(?:GetDeviceProperties|DeviceGet"
                         r"Properties)\w*"),
              re.compile(r"^=========\s*Program hit .* on CUDA API call to cu(?:da)?DeviceGetAttribute\b"))


# What the runtime may call in the driver on the end-of-job call's behalf (cuDeviceGet for the missing device): where
# the tool reports such a call too, it is the end-of-job call's, never the job's
_END_CALL_ECHO = re.compile(r"^=========\s*Program hit .* on CUDA API call to cuDevice\w*")


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

    def __init__(self, cmd: list[str], requests: str, env: dict, tty: bool = False):
        from .sanitize import children_usage

        self.cmd, self.requests = cmd, requests
        self.kids0 = children_usage()             # what this process's reaped children had used before it
        self.spawned = time.time()
        self.master = None
        if tty:        # a terminal for its output: a program that buffers its stdout on a pipe writes each line
            import pty

            self.master, slave = pty.openpty()
            try:
                self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
                                              start_new_session=True)
            finally:
                os.close(slave)
        else:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True,
                                          errors="replace", bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        self.fd: int | None = None
        self.jobs = 0
        self.printed = 0                      # reports the tool has printed so far (against its --print-limit)
        self.eof = False
        threading.Thread(target=self._read, daemon=True, name="kernellab-sanitizer-output").start()

    def _read(self) -> None:
        if self.master is None:
            for line in self.popen.stdout:
                self.lines.put(line.rstrip("\n"))
        else:
            pending = b""
            while True:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:                   # EIO: every holder of the terminal's other end has exited
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for raw in whole:
                    self.lines.put(raw.decode(errors="replace").rstrip("\r"))
            if pending:
                self.lines.put(pending.decode(errors="replace").rstrip("\r"))
            try:
                os.close(self.master)
            except OSError:
                pass
        self.lines.put(None)

    def alive(self) -> bool:
        return self.popen.poll() is None and not self.eof

    def send(self, line: str, deadline: float) -> bool:
        """Hand the target one request; False if it is gone (or never opened its pipe) before `deadline`."""
        while self.fd is None:
            try:
                self.fd = os.open(self.requests, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:          # ENXIO: the target has not opened it for reading yet
                    return False
                if self.popen.poll() is not None or time.time() > deadline:
                    return False
                time.sleep(0.005)
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
        """Close its requests (the target then exits and the tool prints its summary); the rest of its output."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
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
                 end_call_grace_s: float = END_CALL_GRACE_S, process_print_jobs: int = PROCESS_PRINT_JOBS):
        from . import sanitize as S

        self.tool, self.exe, self.print_limit, self.extra_args = tool, executable, int(print_limit), tuple(extra_args)
        self.env = env if env is not None else S.tool_env()
        self.end_call_grace_s = end_call_grace_s
        self.process_limit = max(1, int(print_limit)) * max(1, int(process_print_jobs))
        self.end_call_works: bool | None = None       # None: not seen yet; False: one job per process from now on
        self.tty = False                              # its output on a terminal (tried where a pipe showed no report)
        self.folder = tempfile.mkdtemp(prefix=f"kernellab-sanitizer-{tool}-")
        self.proc: _Process | None = None
        self.lock = threading.Lock()
        self.seq = 0
        self.processes_started = 0
        self.jobs_run = 0
        self.restarts: dict[str, int] = {}            # why a process was replaced: "fault", "timeout", "crash", ...

    def command(self, requests: str) -> list[str]:
        cmd = [self.exe, "--tool", self.tool, "--print-limit", str(self.process_limit), "--show-backtrace", "no"]
        if self.tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        return cmd + list(self.extra_args) + [sys.executable, "-m", "kernellab.run.launch.job", "--serve", requests]

    def stats(self) -> dict:
        """Processes started, jobs run, why processes were replaced, and whether the end-of-job report was seen."""
        return {"tool": self.tool, "processes_started": self.processes_started, "jobs": self.jobs_run,
                "restarts": dict(self.restarts), "end_call_works": self.end_call_works, "tty": self.tty}

    def _start(self) -> _Process:
        self.processes_started += 1
        requests = os.path.join(self.folder, f"requests-{self.processes_started}")
        os.mkfifo(requests)
        return _Process(self.command(requests), requests, self.env, tty=self.tty)

    def _retire(self, why: str, *, finish: bool = True) -> list[str]:
        proc, self.proc = self.proc, None
        if proc is None:
            return []
        self.restarts[why] = self.restarts.get(why, 0) + 1
        rest = proc.finish() if finish else []
        try:
            os.unlink(proc.requests)
        except OSError:
            pass
        return rest

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
        from . import sanitize as S

        self.seq += 1
        seq = self.seq
        jobfile = job.with_data().save(os.path.join(self.folder, f"job-{seq}.kljob"))
        resfile = os.path.join(self.folder, f"result-{seq}.klres")
        t0 = time.perf_counter()
        proc = self.proc
        if proc is not None and (not proc.alive() or proc.printed + self.print_limit + 1 > self.process_limit):
            self._retire("print limit" if proc.alive() else "gone")
            proc = None
        started = proc is None
        if started:
            proc = self.proc = self._start()
            spawned, before = proc.spawned, {"cpu_s": 0.0, "read_bytes": 0, "read_chars": 0}
        else:
            spawned, before = time.time(), tree_usage(proc.popen.pid)
        deadline = time.time() + timeout_s
        lines, end, called, poisoned, timed_out, gone = [], None, False, False, False, False
        began, grace, mine, pre = False, None, seq % 2, []
        if not proc.send(f"{seq}\t{jobfile}\t{resfile}\n", deadline):
            if time.time() < deadline:                      # its pipe closed: the target is gone or going
                try:
                    proc.popen.wait(timeout=min(STOP_TIMEOUT_S, max(0.0, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    pass
            gone = proc.popen.poll() is not None
            timed_out = not gone
        while not (gone or timed_out):
            line = proc.next_line(deadline if grace is None else min(deadline, grace))
            if line is None:
                gone = True
                break
            if line is False:
                if grace is None or time.time() >= deadline:
                    timed_out = True
                break                                       # the end line came, the end-of-job report did not
            if not began:      # before the begin line: the tool's banner, the end of the last job's report
                began = line.startswith(f"{JOB_MARK} begin {seq}")
                if not began:
                    pre.append(line)
                continue
            if line.startswith(f"{JOB_MARK} end {seq}"):
                end = line
                poisoned = line.rstrip().endswith(" poisoned")
                if poisoned or called or self.end_call_works is False:
                    break                                   # poisoned: the target exits; read to the end below
                grace = time.time() + self.end_call_grace_s
                continue
            parity = end_call(line)
            if parity is not None:
                if parity == mine and not called:
                    called = True
                    if end is not None:
                        break
                continue                                    # never a finding of the job
            if _END_CALL_ECHO.match(line):
                continue
            lines.append(line)
        rest: list[str] = []
        # the tool stops printing at its --print-limit, the end-of-job report included
        limit_hit = proc.printed + count_errors("\n".join(lines)) + 1 > self.process_limit
        if timed_out:
            proc.kill()
            rest = proc.drain()
            self._retire("timeout", finish=False)
        elif gone or poisoned:
            rest = proc.finish()
            self._retire("fault" if poisoned else "crash", finish=False)
        elif not called and limit_hit:
            rest = proc.finish()                            # exact to the limit; the note below says so
            self._retire("print limit", finish=False)
        elif not called and self.end_call_works is not False:
            # the tool did not report the call in time: read to the end (exact). Where its output was a pipe, it may
            # hold its reports until exit (a buffered stdout): the next process gets a terminal; where that did not
            # help either, every job gets a process of its own from now on
            rest = proc.finish()
            self._retire("no end-of-job report" + (" (terminal)" if self.tty else " (pipe)"), finish=False)
            if self.end_call_works:
                pass                                        # it was seen before: a late one, this process replaced
            elif self.tty:
                self.end_call_works = False
            else:
                self.tty = True
        else:
            if self.end_call_works is None:
                self.end_call_works = True
            if self.end_call_works is False:                # one job per process: its whole output is the job's
                rest = proc.finish()
                self._retire("one job per process", finish=False)
        # the tool's summaries at exit count the whole process's jobs: the job's own count is counted from its part
        if not began:        # the target never reached the job (it failed to start, or hung before): all it said
            lines = pre + lines
        lines += [ln for ln in rest if not ln.startswith(JOB_MARK) and end_call(ln) is None
                  and not _END_CALL_ECHO.match(ln) and not _SUMMARY.match(ln)]
        wall = (time.perf_counter() - t0) * 1e3
        if proc.popen.poll() is None:
            after = tree_usage(proc.popen.pid)
        else:                # ended and reaped: its whole life is in this process's children's usage since it started
            kids = S.children_usage()
            after = {k: kids[k] - proc.kids0[k] for k in kids if k in proc.kids0}
        exit_code = proc.popen.returncode if proc.popen.poll() is not None and (gone or timed_out) else None
        self.jobs_run += 1
        proc.jobs += 1
        text = "\n".join(lines)
        count = count_errors(text)
        proc.printed += count + 1
        notes, status, marks = [], None, {}
        if os.path.exists(resfile):
            with open(resfile, "rb") as fh:
                res = JobResult.from_bytes(fh.read())
            status, marks = res.status, dict(res.marks)
            if not res.ok and res.status != "fault":
                notes.append(f"the launch itself: {res.message}")
            if exit_code is None:
                exit_code = 0 if res.ok else 1              # what the one-shot command returns for this job
        elif not timed_out:
            notes.append("the job did not write a result; see report.raw for the process's output")
        if timed_out:
            notes.append(f"stopped after {timeout_s:g} s: the kernel may not terminate (an endless loop?)")
        if proc.printed >= self.process_limit or limit_hit:
            notes.append(f"{self.tool} reached the process's print limit during this job {S.PRINT_LIMIT_NOTE}: "
                         f"reports past it are missing from the findings and the count")
            if self.proc is proc:
                self._retire("print limit")
        for path in (jobfile, resfile):
            try:
                os.unlink(path)
            except OSError:
                pass
        cost = S.tool_cost(wall / 1e3, before, after, spawned, marks)
        cost = type(cost)(**{**cost.__dict__, "process_started": started})
        return S.report_from_text(text, tool=self.tool, job=job, timed_out=timed_out, exit_code=exit_code,
                                  job_status=status, command=tuple(proc.cmd), wall_ms=wall, notes=notes, cost=cost,
                                  counted=count)


def count_errors(text: str) -> int:
    """The errors compute-sanitizer reported in `text` (a job's part of its output), counted as its ERROR SUMMARY
    counts them: each access, hazard, barrier or exception report and each failed API call; warnings not."""
    from .sanitize import _SKIP_HEAD, _access, _entries, _hazard

    n = 0
    for head, details in _entries(text):
        if head.startswith(_SKIP_HEAD) or "SUMMARY" in head:
            continue
        if re.match(r"(WARN|Warning)\b", head):
            continue
        if head.startswith("Program hit"):
            n += 1
            continue
        body = re.sub(r"^(Error|INFO)\s*:\s*(\([^)]*\)\s*)?", "", head)
        if _hazard(body, details, "", None) or _access(body, details, "", None):
            n += 1
    return n


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
                                               extra_args=extra_args)
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
