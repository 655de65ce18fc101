"""The fan-out over a Dask pool of worker processes, without a GPU: benchmarks/autotune_multigpu.py's phase (the
autotune compile stage and a class graded by the tutorials' graders) on a distributed.LocalCluster, and what happens
when a worker is killed mid-run or a job hangs (kernellab.run.fanout.jobs, grade_class's `rerun` rows).

The workers are real processes (processes=True): a job can kill its own worker, as an out-of-memory kill or a crashed
driver would, and the watchdog restarts a worker whose job hangs."""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

import kernellab  # noqa: E402
from kernellab.run import fanout  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The workers are spawned processes with this process's sys.path: they import this module (and the benchmark) by name.


@pytest.fixture
def pool():
    """Two worker processes of one thread each (a fresh pool per test: the kills and restarts of one test do not
    reach the next); allowed-failures 1, so a job that kills every worker ends soon."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        yield client


def _alive(client, n=2):
    client.wait_for_workers(n, timeout=300)       # a loaded CI machine starts a process slowly
    return set(client.scheduler_info()["workers"])


# --- jobs for the workers ----------------------------------------------------------------------------------------


def slow_square(x):
    time.sleep(0.2)
    return x * x


def kill_once(arg):
    """Kill this worker the first time (a marker file remembers), then answer."""
    x, marker = arg
    if marker and not os.path.exists(marker):
        Path(marker).write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return x


def grade_or_misbehave(exercise_id, submission):
    """A stand-in grader: "hang" never returns, "kill:<marker>" kills its worker once, anything else passes."""
    import types

    if submission == "hang":
        time.sleep(3600)
    if submission.startswith("hang-with-child:"):     # as a grade whose isolated launch worker runs the hung kernel
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        Path(submission.split(":", 1)[1]).write_text(str(child.pid))
        time.sleep(3600)
    if submission.startswith("kill:"):
        kill_once((0, submission[5:]))
    if submission == "always-kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return types.SimpleNamespace(passed=True, findings=(f"{exercise_id}: {submission}",))


# --- the benchmark's own fan-out ----------------------------------------------------------------------------------


def _load_script():
    """benchmarks/autotune_multigpu.py, imported by name (as the workers, which inherit this sys.path, import it)."""
    import importlib

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("benchmarks.autotune_multigpu")


def test_the_benchmark_script_imports_and_builds_its_job():
    """The script's start-up (it once raised ValueError registering a module loaded from its path with cloudpickle):
    its job is tutorial 05's warptile cell, 108 configurations and a class of 66 submissions with expected findings."""
    mod = _load_script()
    assert len(mod.sgemm_configs()) == 108 and len({tuple(c.items()) for c in mod.sgemm_configs()}) == 108
    src = mod.warptile_source()
    assert "sgemm_warptile" in src and "#ifndef BM" in src and "# %%" not in src
    work, expected = mod.build_class(22)
    assert sum(len(v) for v in work.values()) == 66 and set(work) == set(mod.EXERCISES)
    assert sum(k is None for k in expected.values()) == 33                  # half the class is right
    kinds = set().union(*(k for k in expected.values() if k))
    assert {"missing_guard", "out_of_bounds", "off_by_one", "missing_barrier", "race", "compile_error"} <= kinds
    for ex_id in mod.EXERCISES:                                              # the broken cell is broken
        r = kernellab.grade(ex_id, mod._broken(work[ex_id]["student00 (solution)"], ex_id), speed=False)
        assert [f.kind for f in r.findings] == ["compile_error"], str(r)


def test_the_fault_drills_hanging_submission_keeps_its_endless_loop_in_sass():
    """The drill's hanging submission once passed on 4 x H200 in 11 s: NVVM deleted its spin on a volatile local (a
    loop without side effects). Compiled for sm_90 as the grader compiles it, its SASS must keep a loop (a branch back
    to an earlier instruction) around a volatile global load, ahead of the guarded store the grader's checks want."""
    import re

    import kernellab.teach

    mod = _load_script()
    ex = kernellab.teach.exercise("01-reverse")
    k = kernellab.teach.kernel_from_cell(ex, mod.HANG)
    assert not isinstance(k, kernellab.teach.GradeResult), str(k)
    sass = k["reverse"].sass
    code = [(int(a, 16), ins.strip()) for a, ins in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    back = [(a, ins) for a, ins in code if (m := re.search(r"\bBRA\s+0x([0-9a-f]+)", ins)) and int(m.group(1), 16) < a]
    assert back, sass
    top = min(int(re.search(r"0x([0-9a-f]+)", ins).group(1), 16) for _, ins in back)
    loop = [ins for a, ins in code if top <= a <= max(a for a, _ in back)]
    assert any(ins.startswith("LDG") and ".STRONG" in ins for ins in loop), loop      # re-reads in[0] each time
    assert any("STG" in ins for a, ins in code if a > max(a for a, _ in back))        # the store comes after


def test_a_kernel_that_times_out_on_the_gpu_is_not_run_under_the_tools_after(monkeypatch):
    """The drill's hanging kernel on a (stand-in) GPU whose isolated launch times out: a failed grade with the timeout
    finding, and no compute-sanitizer runs after it (each would hang 120 s), so the grade ends at the launch timeout."""
    import kernellab.teach
    from kernellab.teach import grader

    mod = _load_script()
    k = kernellab.teach.kernel_from_cell(kernellab.teach.exercise("01-reverse"), mod.HANG)["reverse"]
    launches, tools = [], []

    def hung(self, k, args, grid, block):
        launches.append((grid, block))
        raise grader._RunFailed("timeout", "reverse did not finish within 30 s")

    monkeypatch.setattr(grader._device, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(grader._Grading, "_launch_gpu", hung)
    monkeypatch.setattr(grader._Grading, "sanitizers", lambda self, k: tools.append(k))
    r = kernellab.grade("01-reverse", k, speed=False)
    assert not r.passed and [f.kind for f in r.findings] == ["timeout"], str(r)
    assert len(launches) == 1 and tools == []                 # stopped at the first launch, no tool after it
    assert any("compute-sanitizer and the simulator were not run" in n for n in r.notes), r.notes
    steps = [s for s, _ in r.stage_s if not s.startswith("of the launches: ")]   # the parts of "launches (GPU)"
    assert steps[:3] == ["compiler checks", "launches (GPU)", "cpu: this process"], r.stage_s
    assert [s for s, _ in r.stage_s][2:4] == ["of the launches: inputs and reference (host)",
                                              "of the launches: the kernel's runs and copies"], r.stage_s


def test_the_fault_drill_names_what_went_wrong():
    """The drill's verdict on the rows seen on 4 x H200 (the hanging submission passed, a killed worker's submission
    graded again): one problem, that drill-hang was not given up by the timeout; none for the rows it should give."""
    from kernellab.teach.grading import GradeRow, GradeTable

    mod = _load_script()
    subs = {f"drill{i:02d}": "src" for i in range(3)} | {"drill-hang": "src"}
    graded = [GradeRow("drill00", True, wall_ms=8e3), GradeRow("drill01", True, wall_ms=8e3, rerun="died once"),
              GradeRow("drill02", True, wall_ms=8e3)]
    seen = GradeTable("01-reverse", tuple(graded + [GradeRow("drill-hang", True, wall_ms=11129.0)]))
    problems = mod.drill_problems(seen, subs, ["tcp://w:1 (pid 1)"])
    assert problems == ["drill-hang was not given up by the timeout: it passed in 11.1 s (its kernel did not hang)"]
    hung = GradeRow("drill-hang", None, error="no grade: no result 21 s after it started on tcp://w:2 (timeout_s=20)")
    assert mod.drill_problems(GradeTable("01-reverse", tuple(graded + [hung])), subs, ["tcp://w:1 (pid 1)"]) == []
    timed_out = GradeRow("drill-hang", False, findings=("the kernel did not finish",), kinds=("timeout",))
    assert mod.drill_problems(GradeTable("01-reverse", tuple(graded + [timed_out])), subs, ["w"]) == []
    lost = GradeTable("01-reverse", (graded[0], GradeRow("drill01", None, error="KilledWorker"), hung))
    problems = mod.drill_problems(lost, subs, [])
    assert problems[0] == "3 rows for 4 submissions" and "drill01 error (KilledWorker)" in problems[1]
    assert problems[2].startswith("no worker was killed")


def _phase(gpus, rows_by_exercise, grade_s, host_busy):
    """A phase as run_phase returns it, with only what the grading report reads."""
    import types

    from kernellab.teach.grading import ClassGrades, GradeRow, GradeTable

    tables = []
    for ex_id, rows in rows_by_exercise.items():
        tables.append(GradeTable(ex_id, tuple(
            GradeRow(f"s{i}", True, wall_ms=wall * 1e3, result=types.SimpleNamespace(stage_s=tuple(steps.items())))
            for i, (wall, steps) in enumerate(rows)), grade_s))
    return {"gpus": gpus, "workers": 4 * gpus, "grades": ClassGrades(tuple(tables), grade_s), "grade_s": grade_s,
            "grade_host_cpu": host_busy}


def test_the_grading_report_says_which_step_grew_and_whether_the_cores_or_a_wait_are_why():
    """Per exercise, each step's mean seconds 1 GPU -> N from the GradeResults' stage_s, and a verdict: CPU seconds
    flat while wall time grows is a wait on something shared (the driver, a lock); a busy host is CPU-bound."""
    mod = _load_script()
    one_steps = {"compile": 0.1, "compute-sanitizer racecheck": 3.0, "launches (GPU)": 1.0,
                 "cpu: this process": 1.0, "cpu: this process, in the kernel (system)": 0.4,
                 "cpu: tools' processes": 3.0}
    slow_steps = dict(one_steps, **{"compute-sanitizer racecheck": 9.0})
    one = _phase(1, {"02-transpose-batched": [(4.1, one_steps)] * 2}, 10.0, 0.2)
    waited = _phase(4, {"02-transpose-batched": [(10.1, slow_steps)] * 2}, 8.0, 0.3)
    for p in (one, waited):
        p["grade_stages"] = mod.grade_stages(p)
    lines = mod.where_grading_goes(waited, one)
    assert lines[0].startswith("02-transpose-batched, mean per submission: wall 4.1 -> 10.1 s; "
                               "compute-sanitizer racecheck 3.0 -> 9.0 s"), lines
    assert "CPU 4.0 -> 4.0 s (this process 1.0 -> 1.0, of it in the OS kernel 0.4 -> 0.4; tools 3.0 -> 3.0)" \
        in lines[0], lines[0]
    assert "x2.46 and its CPU seconds x1.00" in lines[1] and "wait on something the host's GPUs share" in lines[1]
    busy = _phase(4, {"02-transpose-batched": [(10.1, dict(slow_steps, **{"cpu: tools' processes": 9.0}))] * 2},
                  8.0, 0.97)
    busy["grade_stages"] = mod.grade_stages(busy)
    assert "CPU-bound" in mod.where_grading_goes(busy, one)[-1]
    idle, total = mod.host_cpu_times()
    assert 0 <= idle <= total


def test_the_budget_skips_the_two_gpu_phase_that_would_not_fit_after_one_and_four():
    """With 4 x H200's figures (one GPU: 7 s start + 199 s job; four: 125 s job), the largest pool's estimate includes
    its fault drill and fits 420 s; the 2-GPU phase, estimated after both (tests/test_autotune_multigpu_plan.py has
    the plan and main's choices), does not."""
    mod = _load_script()
    one = {"gpus": 1, "start_s": 7.0, "autotune_s": 47.2, "grade_s": 151.6, "job_s": 198.8, "configs": 108,
           "submissions": 66, "close_s": 3.0}
    costs = mod.Costs.from_phase(one, "1 GPU")
    four = mod.estimate_phase(4, costs, 108, 66, 25.0)
    assert four.job_s == pytest.approx(198.8 / mod.PRIOR_SPEEDUP[4]) and four.drill_s == 35.0
    elapsed = 7.0 + 198.8 + 3.0
    assert mod.plan_phases([4], costs, elapsed_s=elapsed, budget_s=420, configs=108, submissions=66,
                           drill_timeout_s={4: 25.0})[0]["runs"]
    elapsed += 10.5 + 124.7 + 27 + 3.0
    costs = costs.with_speedup(4, 198.8 / 124.7)
    two = mod.plan_phases([2], costs, elapsed_s=elapsed, budget_s=420, configs=108, submissions=66,
                          drill_timeout_s={4: 25.0})[0]
    assert not two["runs"] and two["estimate"].drill_s == 0 and "past --budget-s 420" in two["why"]


@pytest.mark.slow
def test_the_benchmark_phase_runs_on_a_local_cluster_of_processes(tmp_path, monkeypatch):
    """run_phase as on a GPU host, on two CPU worker processes: the warptile SGEMM's compile stage (compiled,
    pruned and recorded on the workers; "not run: no GPU") and a class graded by kernellab.teach, each submission
    with the finding its file names (Numba in the simulator, CUDA C++ as far as the compiler allows)."""
    monkeypatch.setenv("KERNELLAB_CACHE", "0")
    mod = _load_script()
    work, expected = mod.build_class(6, where="cpu", exercises=("01-reverse", "00-flip"))
    job = {"source": mod.warptile_source(), "configs": mod.sgemm_configs(3),
           "problem": mod.make_problem(64, device="cpu"), "bench_options": {"rep_ms": 5}, "work": work,
           "grade_timeout_s": 300}
    p = mod.summarize(mod.run_phase([0], 2, job, log=lambda s: None), 3, 12)
    workers = set(p["worker_gpus"])
    assert len(workers) == 2 and p["gpus"] == 1 and p["workers"] == 2
    assert p["worker_saturation"] == 1.0          # a queued task goes to a free worker, none waits behind another
    r = p["autotune"]
    assert len(r.rows) == 3 and all(row.registers for row in r.rows)
    assert {row.worker for row in r.rows} <= workers
    assert all(row.check == "not run: no GPU" and row.block for row in r.rows), str(r)
    g = p["grades"]
    assert len(g.rows) == 12 and {row.worker for row in g.rows} <= workers
    assert len({row.worker for row in g.rows}) == 2                        # both workers graded
    assert mod.check_class(g, expected) == [], str(g)
    slow = p["slowest"]                          # the longest grades, each with its largest steps
    assert len(slow) == 3 and slow[0]["wall_s"] >= slow[1]["wall_s"] >= slow[2]["wall_s"] > 0, slow
    assert all(x["steps"] and sum(v for k, v in x["steps"] if not k.startswith("of the")) <= x["wall_s"] * 1.05
               for x in slow), slow                 # "of the launches: ..." are parts of "launches (...)"
    assert len(mod.slowest_text(p)) == 3 and slow[0]["submission"] in mod.slowest_text(p)[0]
    stages = mod.grade_stages(p)                 # each grade's steps travel back with its result
    assert set(stages) == {"01-reverse", "00-flip"}, stages
    assert stages["00-flip"]["launches (simulator)"] > 0 and stages["01-reverse"]["launches (CPU path)"] > 0
    assert all(s["compile"] > 0 and "cpu: tools' processes" in s for s in stages.values())
    assert p["grade_host_cpu"] is None or 0 <= p["grade_host_cpu"] <= 1
    assert any(row.passed is False for row in g.rows) and any(row.passed for row in g.rows)
    assert "1.00x" in mod.table([p], [])
    # each worker's warm compute-sanitizers were read back (none ran here: no GPU)
    assert set(p["sanitizer_pools"]) == workers
    assert mod.pools_text(p["sanitizer_pools"]) == "no warm compute-sanitizer ran"
    assert p["close"] == "closed", p["close"]              # the workers' helpers ended first: a clean shut-down


def test_a_pool_that_will_not_close_costs_the_phase_nothing_and_its_processes_are_killed():
    """On 4 x H200 the cluster's close after the fault drill raised TimeoutError, and the phase's rows went with it:
    close_pool reports what failed, kills the pool's processes still alive (not this process's other children), and
    never raises."""
    import multiprocessing

    mod = _load_script()
    other = multiprocessing.Process(target=time.sleep, args=(30,))
    other.start()
    keep = set(multiprocessing.active_children())
    stuck = multiprocessing.Process(target=time.sleep, args=(30,))
    stuck.start()

    class Client:
        def run(self, fn):
            time.sleep(5)                       # a hung worker: the helpers' shut-down does not return

        def close(self, timeout):
            pass

    class Cluster:
        def close(self, timeout):
            raise TimeoutError

    try:
        t0 = time.perf_counter()
        said = mod.close_pool(Client(), Cluster(), keep=keep, timeout_s=0.5)
        assert time.perf_counter() - t0 < 3
        assert said == ("workers' helpers not ended in 0.5 s; cluster close failed (TimeoutError: no message); "
                        "1 worker process(es) still alive, killed"), said
        stuck.join(5)
        assert not stuck.is_alive() and other.is_alive()
    finally:
        other.kill()
        stuck.kill()


# --- faults -------------------------------------------------------------------------------------------------------


def test_jobs_rerun_a_killed_workers_jobs_elsewhere_and_say_so(pool, tmp_path):
    _alive(pool)
    marker = str(tmp_path / "killed")
    items = [(i, marker if i == 3 else "") for i in range(8)]
    done = {d.index: d for d in fanout.jobs(pool.get_executor(), kill_once, items)}
    assert sorted(done) == list(range(8)) and [done[i].value for i in range(8)] == list(range(8))
    assert Path(marker).exists()                                      # the worker was killed
    assert done[3].reruns >= 1 and "died" in done[3].rerun and done[3].worker in _alive(pool)
    assert all(d.rerun is None or "died" in d.rerun for d in done.values())


def test_jobs_give_up_a_hung_job_and_restart_its_worker(pool):
    before = _alive(pool)
    t0 = time.perf_counter()
    done = {d.index: d for d in fanout.jobs(pool.get_executor(), grade_or_misbehave_job,
                                            [("ex", "hang")] + [("ex", str(i)) for i in range(5)], timeout_s=2)}
    assert time.perf_counter() - t0 < 120
    assert sorted(done) == list(range(6))
    assert isinstance(done[0].value, fanout.JobTimeout) and "timeout_s=2" in str(done[0].value)
    assert all(done[i].value.passed for i in range(1, 6))
    assert all(d.rerun is None or "restarted" in d.rerun or "died" in d.rerun for d in done.values())
    assert done[0].worker in before
    deadline = time.monotonic() + 120
    while done[0].worker in _alive(pool) and time.monotonic() < deadline:   # the scheduler notices the exit
        time.sleep(0.5)
    assert done[0].worker not in _alive(pool)                               # that worker process was replaced


def grade_or_misbehave_job(arg):
    return grade_or_misbehave(*arg)


@pytest.mark.slow
def test_grade_class_loses_nothing_when_a_worker_is_killed_or_a_submission_hangs(pool, tmp_path):
    _alive(pool)
    marker = tmp_path / "killed"
    work = {"ex-a": {"ana": "fine", "ben": f"kill:{marker}", "cy": "fine"},
            "ex-b": {"dee": "hang", "eve": "fine", "fay": "fine"}}
    g = kernellab.grade_class(work, executor=pool.get_executor(), grade=grade_or_misbehave, progress=False,
                              timeout_s=3)
    a, b = g.table("ex-a"), g.table("ex-b")
    assert [r.submission for r in a.rows] == ["ana", "ben", "cy"]
    assert [r.submission for r in b.rows] == ["dee", "eve", "fay"]
    ben = a.row("ben")
    assert ben.passed is True and ben.rerun and "died" in ben.rerun, str(g)
    assert ben.findings == (f"ex-a: kill:{marker}",)
    dee = b.row("dee")
    assert dee.passed is None and "timeout_s=3" in dee.error and "restarted" in dee.error, str(g)
    assert all(r.passed for r in (a.row("ana"), a.row("cy"), b.row("eve"), b.row("fay"))), str(g)
    assert "graded again after a lost worker" in g.headline() and "re-run" in str(a)
    assert a.to_json()["rows"][1]["rerun"] == ben.rerun


@pytest.mark.slow
def test_a_hung_grade_ends_its_workers_children_too(pool, tmp_path):
    """The worker of a hung grade is ended, and so is its child process (on a GPU: the isolated launch worker that
    runs the hung kernel and holds its context), not left running without a parent."""
    _alive(pool)
    pid_file = tmp_path / "child.pid"
    t = kernellab.grade_many("ex-d", {"hal": f"hang-with-child:{pid_file}", "ida": "fine"},
                             executor=pool.get_executor(), grade=grade_or_misbehave, progress=False, timeout_s=3)
    assert t.row("hal").passed is None and "timeout_s=3" in t.row("hal").error, str(t)
    assert t.row("ida").passed is True, str(t)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break                                       # killed, waiting to be reaped
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the hung grade's child process {pid} outlived its worker")


@pytest.mark.slow
def test_a_submission_that_kills_every_worker_is_an_error_row_and_the_others_are_graded(pool):
    _alive(pool)
    subs = {"gus": "always-kill", **{f"s{i}": "fine" for i in range(4)}}
    t = kernellab.grade_many("ex-c", subs, executor=pool.get_executor(), grade=grade_or_misbehave, progress=False)
    assert [r.submission for r in t.rows] == list(subs)
    gus = t.row("gus")
    assert gus.passed is None and "KilledWorker" in gus.error and "died" in gus.rerun, str(t)
    assert all(r.passed for r in t.rows[1:]), str(t)


@pytest.mark.slow
def test_submissions_queued_on_the_killers_only_worker_are_graded_alone_afterwards():
    """One worker: every honest submission waits on the worker the killer takes down, so Dask fails them with it
    (KilledWorker); each is graded again alone once nothing else runs and passes, the killer's row is the error."""
    # worker-saturation inf: every job is assigned to the worker at once (none waits on the scheduler)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1,
                          "distributed.scheduler.worker-saturation": float("inf")}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        _alive(client, 1)
        subs = {"gus": "always-kill", **{f"s{i}": "fine" for i in range(6)}}
        t = kernellab.grade_many("ex-c", subs, executor=client.get_executor(), grade=grade_or_misbehave,
                                 progress=False)
    gus = t.row("gus")
    assert gus.passed is None and "KilledWorker" in gus.error, str(t)
    honest = [r for r in t.rows if r.submission != "gus"]
    assert all(r.passed for r in honest), str(t)
    assert any(r.rerun and "died" in r.rerun for r in honest), str(t)    # some waited behind the killer


def test_gpu_lock_lets_one_process_at_a_time_use_a_gpu():
    held = threading.Event()
    spans = []

    def hold(name, wait_first):
        if wait_first:
            held.wait(5)
        with fanout.gpu_lock("NVIDIA Test GPU [host 0000:01:00.0]"):
            t0 = time.perf_counter()
            held.set()
            time.sleep(0.3)
            spans.append((name, t0, time.perf_counter()))

    a = threading.Thread(target=hold, args=("a", False))
    b = threading.Thread(target=hold, args=("b", True))
    a.start(), b.start()
    a.join(), b.join()
    (_, a0, a1), (_, b0, b1) = sorted(spans, key=lambda s: s[1])
    assert b0 >= a1 - 1e-3                                 # the second waited for the first
    with fanout.gpu_lock(None):                            # no GPU: nothing to hold
        pass


@pytest.mark.slow
def test_the_benchmark_main_prints_its_table_last_on_a_stand_in_two_gpu_host(tmp_path, monkeypatch, capsys):
    """main() end to end on two CPU "GPUs" (torch told it has two): both phases, the fault drill, the report and the
    JSON, the table last. The CUDA C++ submissions are graded on the CPU path here, which finds every expected
    finding too (exit 0)."""
    import json

    import torch

    mod = _load_script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("KERNELLAB_CACHE", "0")       # main() turns the caches off: undone after this test
    rc = mod.main(["--configs", "2", "--students", "2", "--workers-per-gpu", "1", "--size", "64",
                   "--budget-s", "3000", "--drill-timeout-s", "90"])    # the CPU path on a loaded 2-core machine
    out = capsys.readouterr().out
    assert rc == 0, out                                      # every submission got the finding its file names
    lines = out.rstrip().splitlines()
    assert lines[-4].startswith("GPUs") and lines[-2].startswith("1 ") and lines[-1].startswith("2 "), out
    assert "1.00x" in lines[-2] and "where the time goes (1 GPU -> 2)" in out and "faults:" in out
    report = json.loads((tmp_path / "autotune_multigpu.json").read_text())
    assert [p["gpus"] for p in report["phases"]] == [1, 2]
    assert len(report["phases"][1]["grades"]["tables"]) == 3 and report["phases"][1]["faults"]["killed"]
    assert report["phases"][1]["faults"]["problems"] == [] and "timeout_s=90" in report["phases"][1]["faults"]["hang"]
    assert set(report["phases"][1]["grade_stages"]) == set(mod.EXERCISES)
    assert "grading: 01-reverse, mean per submission: wall" in out and "grading: verdict: " in out
    assert (tmp_path / "grades_2gpu.txt").exists() and (tmp_path / "faults.txt").exists()
