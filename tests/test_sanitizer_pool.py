"""Warm compute-sanitizer processes (kernellab.run.nvtools.sanitize_pool) against a stand-in tool.

tests/fixtures/fake_sanitizer.py is a hand-written stand-in for compute-sanitizer: it runs the real target
(`python -m kernellab.run.launch.job`, served or one-shot) on the stand-in cupy (fixtures/fake_cupy), and prints its
reports from its own process 0.1 s after the event, in the captured formats, so a job's report reaches the pipe
after the target's own end line: the attribution must not rely on the order of the two. The sequences check that
each job gets its own findings (clean, racy, out-of-bounds, clean), that a fault and a hang replace the process and
that the switch gives today's one-shot path with the same findings.
"""
import os
import pathlib
import sys

import numpy as np
import pytest

from kernellab.run.launch.job import ArgSpec, KernelJob
from kernellab.run.nvtools import sanitize_pool as P
from kernellab.run.nvtools.sanitize import sanitize

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
SRC = "\n".join(f"// line {i}" for i in range(1, 30))


def job(behaviour: str) -> KernelJob:
    """A job whose "kernel" the stand-in cupy runs by name: clean, racy, oob (a fault), hang."""
    x = np.arange(8, dtype=np.float32)
    return KernelJob(symbol=behaviour, name=behaviour, grid=(1, 1, 1), block=(32, 1, 1), source=SRC,
                     filename="cell.cu", image=b"stand-in", image_format="ptx",
                     args=(ArgSpec("tensor", "x", "float32", (8,), data=x.tobytes(), writes=True),
                           ArgSpec("tensor", "y", "float32", (8,), data=x.tobytes(), writes=False),
                           ArgSpec("scalar", "n", "int32", value=8)))


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """The stand-in compute-sanitizer as an executable; its starts are logged to tool.log (one line each)."""
    exe = tmp_path / "compute-sanitizer"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(FIXTURES)!r})\nimport fake_sanitizer\n"
                   f"sys.exit(fake_sanitizer.main(sys.argv[1:]))\n")
    exe.chmod(0o755)
    log = tmp_path / "starts.log"
    monkeypatch.setenv("FAKE_SANITIZER_LOG", str(log))
    monkeypatch.setenv("FAKE_SANITIZER_DELAY_S", "0.1")       # reports come after the target's end line
    monkeypatch.delenv(P.ENV, raising=False)
    yield Tool(exe, log)
    P.shutdown()


class Tool(str):
    """The stand-in's path, with the log of its starts."""

    def __new__(cls, path, log):
        obj = super().__new__(cls, str(path))
        obj.log = log
        return obj


def starts(tool) -> int:
    return len(tool.log.read_text().splitlines()) if tool.log.exists() else 0


def pool_for(tool, name="memcheck", **kw) -> P.SanitizerPool:
    return P.SanitizerPool(name, executable=str(tool), print_limit=100, **kw)


def test_a_sequence_gets_each_jobs_own_findings_from_one_process(tool):
    """memcheck over clean, racy, clean: one process; racecheck over clean, racy, clean, racy: the hazards land on
    the racy jobs, though the tool prints each 0.1 s after the target printed its end line."""
    mem = pool_for(tool, "memcheck")
    reports = [mem.run(job(b), timeout_s=60) for b in ("clean", "racy", "clean")]
    assert [r.ok for r in reports] == [True, True, True] and starts(tool) == 1
    assert all(r.job_status == "ok" and r.error_count == 0 and r.exit_code == 0 for r in reports)
    race = pool_for(tool, "racecheck")
    reports = [race.run(job(b), timeout_s=60) for b in ("clean", "racy", "clean", "racy")]
    assert [r.ok for r in reports] == [True, False, True, False] and starts(tool) == 2
    for r in (reports[1], reports[3]):
        (f,) = r.findings
        assert f.kind == "race" and f.where.cell_line == 19 and f.other.cell_line == 20 and r.error_count == 1
        assert r.kernel == "racy" and r.job_status == "ok"
    assert "--racecheck-report" in race.command("x") and race.stats()["processes_started"] == 1
    assert race.stats()["end_call_works"] is True and race.stats()["jobs"] == 4
    # the cost of each job: the first started the process, the others did not
    costs = [r.cost for r in reports]
    assert costs[0].process_started is True and not any(c.process_started for c in costs[1:])
    assert all(c.context_s is not None and c.kernel_s is not None for c in costs)


def test_a_fault_is_reported_and_replaces_the_process(tool):
    """clean, racy, out-of-bounds, clean under memcheck: the fault's finding on its job only, and a new process for
    the clean job after it."""
    mem = pool_for(tool, "memcheck")
    reports = [mem.run(job(b), timeout_s=60) for b in ("clean", "racy", "oob", "clean")]
    assert [r.ok for r in reports] == [True, True, False, True]
    bad = reports[2]
    (f,) = bad.findings
    assert f.kind == "invalid_write" and f.where.cell_line == 12 and f.thread == (0, 0, 0)
    assert bad.job_status == "fault" and bad.error_count == 1 and bad.exit_code is not None and bad.exit_code != 0
    # the report came 0.1 s after the target's end line and exit: read to the end of the process's output, less the
    # tool's summary, which counts the whole process's errors (the end-of-job calls' among them)
    assert "Invalid __global__ write" in bad.raw and "ERROR SUMMARY" not in bad.raw
    assert not reports[3].findings and reports[3].job_status == "ok" and reports[3].cost.process_started
    assert all(r.cost.cpu_s is not None and r.cost.cpu_s >= 0 for r in reports), [r.cost for r in reports]
    assert bad.cost.cpu_s > 0                                     # the ended process's share, from its reaped usage
    assert starts(tool) == 2 and mem.stats()["restarts"] == {"fault": 1}


def test_a_context_broken_after_the_job_ends_its_process(tool):
    """A job that finished as its stream saw it, but whose context fails the served target's device-wide
    synchronize after it: the process ends after it, and the next job gets a new one."""
    mem = pool_for(tool, "memcheck")
    late = mem.run(job("late"), timeout_s=60)
    after = mem.run(job("clean"), timeout_s=60)
    assert late.job_status == "ok" and after.ok and after.cost.process_started
    assert mem.stats()["restarts"] == {"fault": 1} and starts(tool) == 2


def test_a_hang_is_given_up_at_its_timeout_and_the_next_job_runs(tool):
    mem = pool_for(tool, "memcheck")
    assert mem.run(job("clean"), timeout_s=60).ok
    hung = mem.run(job("hang"), timeout_s=3)
    assert hung.timed_out and not hung.ok and "did not finish" in hung.headline()
    assert any("stopped after 3 s" in n for n in hung.notes)
    assert hung.wall_ms < 10_000
    after = mem.run(job("clean"), timeout_s=60)
    assert after.ok and after.cost.process_started and starts(tool) == 2
    assert mem.stats()["restarts"] == {"timeout": 1}


def test_a_tool_that_does_not_report_the_end_call_falls_back_to_one_process_per_job(tool, monkeypatch):
    """Where the end-of-job call is not reported, the job is read to the end of its own process's output: still
    exact, one process per job."""
    monkeypatch.setenv("FAKE_SANITIZER_NO_API_ERRORS", "1")
    race = pool_for(tool, "racecheck", end_call_grace_s=1.0)
    reports = [race.run(job(b), timeout_s=60) for b in ("racy", "clean", "racy", "clean")]
    assert [r.ok for r in reports] == [False, True, False, True]
    assert [len(r.findings) for r in reports] == [1, 0, 1, 0]
    # the first on a pipe, the second on a terminal, then a process per job
    assert race.stats()["end_call_works"] is False and race.stats()["tty"] and starts(tool) == 4
    assert race.stats()["restarts"] == {"no end-of-job report (pipe)": 1, "no end-of-job report (terminal)": 1,
                                        "one job per process": 2}


def test_a_tool_that_buffers_its_reports_on_a_pipe_gets_a_terminal(tool, monkeypatch):
    """The stand-in holds its reports until exit where its stdout is not a terminal (as C stdio does on a pipe):
    the first job is read to the process's end, the next process writes to a pty and stays warm."""
    monkeypatch.setenv("FAKE_SANITIZER_BUFFER_ON_PIPE", "1")
    race = pool_for(tool, "racecheck", end_call_grace_s=1.0)
    reports = [race.run(job(b), timeout_s=60) for b in ("racy", "clean", "racy", "clean", "clean")]
    assert [len(r.findings) for r in reports] == [1, 0, 1, 0, 0]
    assert race.stats()["tty"] and race.stats()["end_call_works"] is True and starts(tool) == 2
    assert reports[2].findings[0].where.cell_line == 19 and not reports[3].cost.process_started


def test_the_print_limit_of_a_process_replaces_it_before_a_job_could_run_out(tool):
    race = pool_for(tool, "racecheck", process_print_jobs=1)   # a process may print 100 reports
    race.print_limit, race.process_limit = 2, 4                 # 2 per job, 4 per process
    reports = [race.run(job("racy"), timeout_s=60) for _ in range(4)]
    assert all(len(r.findings) == 1 for r in reports)
    assert race.stats()["processes_started"] >= 2 and race.stats()["restarts"].get("print limit", 0) >= 1


def test_a_job_that_runs_into_the_process_print_limit_is_read_to_the_end(tool):
    """A job whose reports reach the process's --print-limit (the tool then prints no more, its end-of-job report
    neither): read to the process's end, a note says the count stops at the limit, and the next process is warm as
    before (not taken for a tool that holds its output)."""
    race = pool_for(tool, "racecheck", end_call_grace_s=1.0)
    race.print_limit, race.process_limit = 1, 3
    first = race.run(job("racy3"), timeout_s=60)                # 3 hazards: the limit; the end-of-job call unprinted
    assert [f.kind for f in first.findings] == ["race"] and first.findings[0].count == 3
    assert any("print limit" in n for n in first.notes), first.notes
    after = [race.run(job(b), timeout_s=60) for b in ("clean", "racy")]
    assert [len(r.findings) for r in after] == [0, 1] and not race.stats()["tty"]
    assert race.stats()["restarts"]["print limit"] >= 1 and race.stats()["end_call_works"] is True


def test_sanitize_pools_when_asked_and_the_switch_gives_the_one_shot_path(tool, monkeypatch):
    """sanitize(pool=True) and KERNELLAB_SANITIZER_POOL=1 pool; KERNELLAB_SANITIZER_POOL=0 (or pool=False) runs
    today's command, one process per job, with the same findings."""
    seq = ("clean", "racy", "oob", "clean")
    pooled = [sanitize(job(b), "racecheck+memcheck", executable=str(tool), timeout_s=60, pool=True) for b in seq]
    n_pooled = starts(tool)
    P.shutdown()
    monkeypatch.setenv(P.ENV, "0")
    assert not P.wanted(True) and not P.default_on()
    one_shot = [sanitize(job(b), "racecheck+memcheck", executable=str(tool), timeout_s=60, pool=True) for b in seq]
    assert starts(tool) - n_pooled == 2 * len(seq)              # a process per job and tool
    assert all("--serve" not in r.command for r in one_shot) and "--serve" in pooled[0].command
    assert all(r.cost is None for r in one_shot)                # combined reports carry no single tool's cost

    def shape(r):
        return [(f.tool, f.kind, f.where.cell_line) for f in r.findings], r.ok, r.job_status

    assert [shape(r) for r in pooled] == [shape(r) for r in one_shot]
    assert [r.ok for r in pooled] == [True, False, False, True]
    # racecheck: 2 processes (clean, racy, oob [fault] | clean); memcheck: 2 (clean, racy, oob [fault] | clean)
    assert n_pooled == 4
    monkeypatch.setenv(P.ENV, "1")
    assert P.wanted(None) and not P.wanted(False) and P.default_on()
    monkeypatch.delenv(P.ENV)
    # unset: a plain sanitize() pools only when asked, and the graders run one-shot
    assert not P.wanted(None) and P.wanted(True) and not P.default_on()


def test_count_errors_counts_reports_not_warnings_or_summaries():
    text = "\n".join([
        "========= COMPUTE-SANITIZER",
        "========= Error: Potential RAW hazard detected at __shared__ 0x47c in block (0,0,0) :",
        "=========     Write Thread (31,0,0) at racy+0x100 in cell.cu:19",
        "=========     Read Thread (32,0,0) at racy+0x110 in cell.cu:20",
        "========= ",
        "========= Warning: Potential WAR hazard detected at __shared__ 0x40 in block (0,0,0) :",
        "=========     Read Thread (1,0,0) at racy+0x10 in cell.cu:3",
        "=========     Write Thread (2,0,0) at racy+0x20 in cell.cu:4",
        "========= ",
        '========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMalloc.',
        "========= ",
        "========= Invalid __global__ write of size 4 bytes",
        "=========     at oob+0xb0 in cell.cu:12",
        "=========     by thread (0,0,0) in block (0,0,0)",
        "========= ",
        "========= ERROR SUMMARY: 9 errors"])
    assert P.count_errors(text) == 3
    assert P.end_call('========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API '
                      'call to cudaDeviceGetAttribute.') == 1
    assert P.end_call('========= Program hit cudaErrorInvalidDevice (error 101) due to "invalid device ordinal" on '
                      'CUDA API call to cudaGetDeviceProperties_v2.') == 0
    assert P.end_call("========= Program hit ... on CUDA API call to cudaMalloc.") is None
    assert P._END_CALL_ECHO.match('========= Program hit CUDA_ERROR_INVALID_DEVICE (error 101) due to "invalid device '
                                  'ordinal" on CUDA API call to cuDeviceGet.')


def test_the_served_target_marks_each_job_and_writes_its_result(tmp_path, monkeypatch):
    """kernellab.run.launch.job.serve in this process, on the stand-in cupy: begin and end lines, result files, the
    end-of-job calls (odd: cudaDeviceGetAttribute, even: cudaGetDeviceProperties) fail as they must."""
    import io
    import threading

    import kernellab.run.launch.job as J

    sys.path.insert(0, str(FIXTURES / "fake_cupy"))
    saved = sys.modules.pop("cupy", None)
    try:
        import cupy  # the stand-in
        assert "stand-in" in (cupy.__doc__ or "").lower()
        fifo = tmp_path / "requests"
        os.mkfifo(fifo)
        out = io.StringIO()
        files = []
        for i, b in enumerate(("clean", "clean"), start=1):
            jf = J.KernelJob.save(job(b), str(tmp_path / f"j{i}.kljob"))
            files.append((i, jf, str(tmp_path / f"r{i}.klres")))
        t = threading.Thread(target=lambda: J.serve(str(fifo), stream=out))
        t.start()
        with open(fifo, "w") as fh:
            for i, jf, rf in files:
                fh.write(f"{i}\t{jf}\t{rf}\n")
        t.join(30)
        lines = out.getvalue().splitlines()
        assert lines == ["@@kernellab-job begin 1", "@@kernellab-job end 1 ok", "@@kernellab-job begin 2",
                         "@@kernellab-job end 2 ok"]
        res = J.JobResult.from_bytes(open(files[1][2], "rb").read())
        assert res.ok and [m for m, _ in res.marks][:3] == ["process start", "job ready", "module loaded"]
        assert "cudaErrorInvalidValue" in J.end_of_job_call(1) and "cudaErrorInvalidDevice" in J.end_of_job_call(2)
    finally:
        sys.path.remove(str(FIXTURES / "fake_cupy"))
        sys.modules.pop("cupy", None)
        if saved is not None:
            sys.modules["cupy"] = saved


def test_a_target_that_cannot_start_says_so_in_the_report(tool):
    """The served target exits before it opens its requests: the report keeps what the process printed, says that
    the job wrote no result, and has the process's exit code."""
    pool = pool_for(tool, "memcheck")
    pool.command = lambda requests: [str(tool), "--tool", "memcheck", sys.executable, "-c",
                                     "print('the target cannot start'); raise SystemExit(3)"]
    rep = pool.run(job("clean"), timeout_s=60)
    assert rep.job_status is None and any("did not write a result" in n for n in rep.notes), rep
    assert "the target cannot start" in rep.raw and rep.exit_code == 3 and pool.stats()["restarts"] == {"crash": 1}


def test_each_thread_gets_its_own_warm_process(tool):
    """Two threads sanitizing at once do not queue behind one process: get_pool gives each thread its own."""
    import threading

    got = {}

    def work(name):
        got[name] = P.get_pool("racecheck", executable=str(tool), print_limit=100)
        got[name + " report"] = sanitize(job("racy"), "racecheck", executable=str(tool), timeout_s=60, pool=True)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got["a"] is not got["b"] and starts(tool) == 2
    assert all(len(got[n + " report"].findings) == 1 for n in ("a", "b"))
    assert sorted(s["jobs"] for s in P.stats()) == [1, 1]
    # the threads have ended: the next pool made here ends their processes
    mine = P.get_pool("racecheck", executable=str(tool), print_limit=100)
    assert P.stats() == [mine.stats()] and got["a"].proc is None and got["b"].proc is None


def test_a_failing_pool_falls_back_to_the_one_shot_path(tool, monkeypatch):
    """Where the pool's own plumbing fails (here: no named pipe can be made), the job runs one-shot and says so."""
    def no_fifo(path, *a, **k):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(P.os, "mkfifo", no_fifo)
    rep = sanitize(job("racy"), "racecheck", executable=str(tool), timeout_s=60, pool=True)
    assert len(rep.findings) == 1 and "--serve" not in rep.command and rep.cost.process_started
    assert any("the warm compute-sanitizer failed (OSError" in n for n in rep.notes), rep.notes
