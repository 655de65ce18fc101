"""Warm compute-sanitizer processes (kernellab.run.nvtools.sanitize_pool) against a stand-in tool.

tests/fixtures/fake_sanitizer.py is a hand-written stand-in for compute-sanitizer: it runs the real target
(`python -m kernellab.run.launch.job`, served or one-shot) on the stand-in cupy (fixtures/fake_cupy), and prints its
reports in the captured formats in program order, as the real tool did on an H200: a report before the CUDA call that
met it returns, racecheck reporting no failed API call, --print-limit counting over the process. The sequences check
that each job gets its own findings (clean, racy, out-of-bounds, clean) from one process without waiting for a report
that cannot come, that a fault and a hang replace the process, that the per-job print limit reads as one-shot's,
that a stand-in breaking program order (FAKE_SANITIZER_LATE=1) is caught, and that the switch gives today's
one-shot path with the same findings.
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
    """memcheck over clean, racy, clean and racecheck over clean, racy, clean, racy: one process each; the hazards on
    the racy jobs only. racecheck reports no failed API call (no end-of-job report): no job waits for one."""
    mem = pool_for(tool, "memcheck")
    reports = [mem.run(job(b), timeout_s=60) for b in ("clean", "racy", "clean")]
    assert [r.ok for r in reports] == [True, True, True] and starts(tool) == 1
    assert all(r.job_status == "ok" and r.error_count == 0 and r.exit_code == 0 for r in reports)
    assert mem.stats()["end_calls_reported"] == [0, 1] and mem.stats()["ordered"] is True
    race = pool_for(tool, "racecheck")
    reports = [race.run(job(b), timeout_s=60) for b in ("clean", "racy", "clean", "racy")]
    assert [r.ok for r in reports] == [True, False, True, False] and starts(tool) == 2
    for r in (reports[1], reports[3]):
        (f,) = r.findings
        assert f.kind == "race" and f.where.cell_line == 19 and f.other.cell_line == 20 and r.error_count == 1
        assert r.kernel == "racy" and r.job_status == "ok"
    assert "--racecheck-report" in race.command("x") and race.stats()["processes_started"] == 1
    # memcheck ends a kernel whose access it caught, not the context (the same option one-shot: test_worker's)
    kept = " --destroy-on-device-error kernel "
    assert kept in " ".join(mem.command("x")) + " " and kept not in " ".join(race.command("x"))
    st = race.stats()
    assert st["end_calls_reported"] == [] and st["ordered"] is True and st["restarts"] == {} and st["jobs"] == 4
    assert all(r.wall_ms < 4000 for r in reports[1:]), [r.wall_ms for r in reports]   # no wait for a missing report
    # every process runs without a print limit (the tool's counts over the process); each job's is applied per job
    assert all(" --print-limit 0 " in line for line in tool.log.read_text().splitlines())
    # the cost of each job: the first started the process, the others did not
    costs = [r.cost for r in reports]
    assert costs[0].process_started is True and not any(c.process_started for c in costs[1:])
    assert all(c.context_s is not None and c.kernel_s is not None for c in costs)
    race.close()
    assert race.stats()["reports_after_last_job"] == 0


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
    # read to the end of the process's output, less the tool's summary, which counts the whole process's errors (the
    # end-of-job calls' among them): the summary is the job's own
    assert "Invalid __global__ write" in bad.raw and "ERROR SUMMARY: 1 error" in bad.raw
    assert "ERROR SUMMARY: 3 errors" not in bad.raw
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


def test_racecheck_out_of_program_order_is_caught_and_then_a_process_per_job(tool, monkeypatch):
    """A stand-in that prints each report after the target's next line (its end line): racy job 1's hazards arrive
    between job 1's end line and job 2's begin line. Job 2 says so and is read to its process's end; every job after
    runs in a process of its own and gets its own findings. (Job 1 returned before its late hazards came: it is the
    job the note names, and stats() lists where the order broke.)"""
    monkeypatch.setenv("FAKE_SANITIZER_LATE", "1")
    race = pool_for(tool, "racecheck")
    reports = [race.run(job(b), timeout_s=60) for b in ("racy", "clean", "racy", "clean")]
    st = race.stats()
    assert st["ordered"] is False and st["out_of_order"] == [2], st
    assert any("out of program order" in n and "after the previous job's end line" in n for n in reports[1].notes)
    assert not reports[1].findings and reports[1].ok
    assert [len(r.findings) for r in reports[2:]] == [1, 0] and reports[2].findings[0].where.cell_line == 19
    assert st["restarts"] == {"out of order": 1, "one job per process": 2} and starts(tool) == 3


def test_memcheck_out_of_program_order_is_caught_before_the_job_returns(tool, monkeypatch):
    """memcheck reports failed API calls: a job whose end-of-job call was not reported before its end line is read to
    its process's end (exact) and says so; later jobs run a process each; the fault's finding on its own job."""
    monkeypatch.setenv("FAKE_SANITIZER_LATE", "1")
    mem = pool_for(tool, "memcheck")
    reports = [mem.run(job(b), timeout_s=60) for b in ("clean", "clean", "oob", "clean")]
    st = mem.stats()
    assert st["ordered"] is False and st["out_of_order"] == [1], st
    assert any("did not report this job's end-of-job call" in n for n in reports[0].notes), reports[0].notes
    assert [len(r.findings) for r in reports] == [0, 0, 1, 0] and reports[2].findings[0].kind == "invalid_write"
    assert [r.ok for r in reports] == [True, True, False, True]
    assert st["restarts"] == {"out of order": 1, "one job per process": 2, "fault": 1} and starts(tool) == 4


def test_a_report_outside_any_job_is_found():
    """The checks on a stream written out by hand: a report where none may be (between one job's end line and the
    next's begin line) is found; the tool's banner and summaries are not reports; an end-of-job call's report is."""
    hazard = ["========= Error: Potential RAW hazard detected at __shared__ 0x47c in block (0,0,0) :",
              "=========     Write Thread (31,0,0) at racy+0x100 in cell.cu:19",
              "=========     Read Thread (32,0,0) at racy+0x110 in cell.cu:20", "========= "]
    assert P._stray(["========= COMPUTE-SANITIZER", "========= ERROR SUMMARY: 0 errors"]) == []
    assert P._stray(["some target line"] + hazard) == hazard
    assert P._stray(['========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API '
                     'call to cudaDeviceGetAttribute.', "========= "])


def test_the_print_limit_is_applied_per_job_as_one_shot_applies_it(tool):
    """A process has no print limit; each job's is applied to its part: a job of 3 hazards with print_limit 1 reads
    as the one-shot run's (1 printed of 3, the count 3), and the next job in the same process gets its own limit."""
    race = P.SanitizerPool("racecheck", executable=str(tool), print_limit=1)
    pooled = [race.run(job(b), timeout_s=60) for b in ("racy3", "racy", "racy3")]
    one = sanitize(job("racy3"), "racecheck", executable=str(tool), timeout_s=60, print_limit=1, pool=False)
    assert race.stats()["processes_started"] == 1 and race.stats()["ordered"]

    def shape(r):
        return ([(f.kind, f.where.cell_line, f.count) for f in r.findings], r.error_count,
                [n for n in r.notes if "print limit" in n])

    assert shape(pooled[0]) == shape(one) == shape(pooled[2]), (pooled[0], one)
    assert one.error_count == 3 and any("printed 1 of 3" in n for n in one.notes), one.notes
    assert pooled[0].raw.count("Potential RAW hazard") == 1
    assert shape(pooled[1]) == ([("race", 19, 1)], 1, [])


def test_job_text_keeps_the_target_lines_and_counts_what_it_drops():
    hazard = ["========= Error: Potential RAW hazard detected at __shared__ 0x47c in block (0,0,0) :",
              "=========     Write Thread (31,0,0) at racy+0x100 in cell.cu:19",
              "=========     Read Thread (32,0,0) at racy+0x110 in cell.cu:20", "========= "]
    warn = ["========= Warning: Potential WAR hazard detected at __shared__ 0x40 in block (0,0,0) :",
            "=========     Read Thread (1,0,0) at racy+0x10 in cell.cu:3",
            "=========     Write Thread (2,0,0) at racy+0x20 in cell.cu:4", "========= "]
    lines = hazard + ["target says hello"] + warn + hazard
    out = P.job_text(lines, "racecheck", 2)
    assert out[:-2] == hazard + ["target says hello"] + warn
    assert out[-1] == "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 1 warning)"
    assert P.job_text(lines, "racecheck", 0)[-1] == \
        "========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)"
    oob = ["========= Invalid __global__ write of size 4 bytes", "=========     at oob+0xb0 in cell.cu:12",
           "=========     by thread (0,0,0) in block (0,0,0)", "========= "]
    assert P.job_text(oob + oob, "memcheck", 1)[-2:] == ["========= ERROR SUMMARY: 1 errors were not printed",
                                                         "========= ERROR SUMMARY: 2 errors"]


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
        "========= Error: Race reported between Write access at racy+0x100 in cell.cu:19",
        "=========     and Read access at racy+0x110 in cell.cu:20 [64 hazards]",
        "========= ",
        "========= ERROR SUMMARY: 9 errors"])
    assert P.count_errors(text) == 4
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


def test_a_spare_process_starts_when_one_ends_and_the_next_job_finds_it_ready(tool):
    """A fault ends the process: its replacement starts at once (before the next job asks), and the next job runs on
    it; a spare never sent a job is killed at close, not waited on for the stop timeout."""
    import time

    mem = pool_for(tool, "memcheck")
    assert mem.run(job("clean"), timeout_s=60).ok
    assert not mem.run(job("oob"), timeout_s=60).ok
    assert mem.proc is not None and mem.proc.jobs == 0                              # the spare, before any job
    assert mem.proc.open(time.time() + 30) and starts(tool) == 2                    # it started and is ready
    after = mem.run(job("clean"), timeout_s=60)
    assert after.ok and after.cost.process_started and starts(tool) == 2           # no third process
    assert not mem.run(job("oob"), timeout_s=60).ok
    assert mem.proc.open(time.time() + 30) and starts(tool) == 3                    # the next spare, ready
    t0 = time.perf_counter()
    mem.close()
    assert time.perf_counter() - t0 < 5 and mem.proc is None
    assert mem.stats()["restarts"] == {"fault": 2, "closed": 1}
    without = pool_for(tool, "memcheck", spare=False)
    assert not without.run(job("oob"), timeout_s=60).ok and without.proc is None and starts(tool) == 4


def test_warm_starts_each_tool_ahead_and_the_first_job_pays_no_start(tool):
    """sanitize.warm starts this thread's pool of each tool at once, on the device the jobs name (the target makes
    its context there first: --device), and waits for each to be ready; sanitize(..., pool=True) from this thread
    then uses them: no further process, and the first job's cost starts at its request, not at the process's spawn."""
    import time

    from kernellab.run.nvtools.sanitize import warm

    ready = warm(("memcheck", "racecheck"), device=0, executable=str(tool), timeout_s=60)
    assert ready == {"memcheck": True, "racecheck": True} and starts(tool) == 2
    assert all(s["processes_started"] == 1 and s["jobs"] == 0 for s in P.stats())
    cmd = P.get_pool("memcheck", executable=str(tool), print_limit=100, device=0)
    assert cmd.command("REQ")[-4:] == ["--serve", "REQ", "--device", "0"]
    j = job("racy")
    t0 = time.time()
    rep = sanitize(KernelJob(**{**j.__dict__, "device": 0}), "racecheck", executable=str(tool), timeout_s=60,
                   pool=True)
    assert len(rep.findings) == 1 and starts(tool) == 2
    assert rep.cost.process_started                       # the process's first job (started ahead of it)
    assert rep.cost.tool_start_s is None or rep.cost.tool_start_s <= time.time() - t0


def test_a_spare_that_cannot_start_leaves_the_jobs_report_standing(tool, tmp_path):
    """The tool disappears after a fault: the faulting job's report stands (no exception, no second run) and no spare
    is left, so the next job starts a process of its own as a pool without spares would."""
    mem = pool_for(tool, "memcheck")
    mem.run(job("clean"), timeout_s=60)
    mem.exe = str(tmp_path / "gone" / "compute-sanitizer")
    bad = mem.run(job("oob"), timeout_s=60)
    assert not bad.ok and bad.findings[0].kind == "invalid_write" and mem.proc is None
    assert starts(tool) == 1
