"""benchmarks/autotune_multigpu.py's sizing, without a GPU: the plan it prints before the first phase (each phase's
estimate from the per-item costs, what --budget-s skips and why), the phase selection as phases are measured, a
1-GPU phase stored by an earlier call (--baseline-from: accepted, refused for another GPU model or another job), and
what each compute-sanitizer run cost (ToolCost: recorded by nvtools.sanitize, kept by the grader, compared by the
report).

main() runs here on a stand-in host (torch told it has GPUs) with run_phase replaced by a fake that returns a
phase's figures and moves the script's clock on by the seconds they add up to: no pool is started."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mod():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("benchmarks.autotune_multigpu")


# --- a stand-in host and phases ---------------------------------------------------------------------------------

# The stand-in host's phases: figures measured on 2 x NVIDIA H200 (docs/RESULTS.md at 7f9f857, 2026-11-27; the file
# now holds later runs): 1 GPU start 8.1 s, autotune 53.6, grade 144.4; 2 GPUs start 8.5, autotune 30.4, grade 90.0;
# the fault drill 31 s.
H200X2 = {1: (8.1, 53.6, 144.4), 2: (8.5, 30.4, 90.0), 4: (10.5, 20.5, 104.2)}


def _fake_phase(mod, n, start_s, autotune_s, grade_s, students, tool_cost=None):
    """A phase as run_phase returns it: every submission graded as its file says, with stage_s and tool costs."""
    from kernellab.run.findings import ToolCost
    from kernellab.teach.grading import ClassGrades, GradeRow, GradeTable

    work, expected = mod.build_class(students)
    tables = []
    for ex_id, subs in work.items():
        rows = []
        for who in subs:
            want = expected[(ex_id, who)]
            kinds = tuple(sorted(want)) if want else ()
            cost = tool_cost or ToolCost(wall_s=2.0 * n, cpu_s=1.0, read_bytes=0, read_chars=4e8, tool_start_s=0.2,
                                         to_kernel_s=1.0 * n, kernel_s=0.1, after_kernel_s=0.9)
            result = types.SimpleNamespace(findings=[types.SimpleNamespace(kind=k) for k in kinds],
                                           stage_s=(("compile", 0.1), ("compute-sanitizer memcheck", cost.wall_s)),
                                           tool_costs=(("compute-sanitizer memcheck", cost),))
            rows.append(GradeRow(who, want is None, kinds=kinds, wall_ms=grade_s * 100, result=result,
                                 gpu=f"GPU {n - 1}"))
        tables.append(GradeTable(ex_id, tuple(rows), grade_s))
    autotune = types.SimpleNamespace(stage_s=(("compile", autotune_s * 0.4), ("check_and_time", autotune_s * 0.5)),
                                     headline=lambda: "fake autotune", best=None, rows=(), notes=(),
                                     to_json=lambda: {"fake": True})
    return {"gpus": n, "gpu_ids": list(range(n)), "workers": 4 * n, "cluster": "fake pool", "threads_per_worker": 4,
            "worker_gpus": {}, "start_s": start_s, "autotune_s": autotune_s, "grade_s": grade_s,
            "job_s": autotune_s + grade_s, "autotune": autotune, "grades": ClassGrades(tuple(tables), grade_s),
            "autotune_util": {0: 14.0}, "grade_util": {0: 5.0}, "util_source": "fake", "autotune_host_cpu": 0.1,
            "grade_host_cpu": 0.2, "close_s": 2.0}


@pytest.fixture
def host(mod, monkeypatch, tmp_path):
    """A stand-in host of `host.gpus` x `host.device` whose run_phase is a fake on a fake clock (see H200X2)."""
    import torch

    state = types.SimpleNamespace(gpus=2, device="NVIDIA H200", clock=[1000.0], calls=[], jobs=[],
                                  figures=dict(H200X2), out=tmp_path / "out")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.gpus)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: state.device)
    monkeypatch.setattr(mod, "_clock", lambda: state.clock[0])
    monkeypatch.setenv("OUT", str(state.out))
    monkeypatch.setenv("KERNELLAB_CACHE", "0")          # main() sets these: undone after the test
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

    def run_phase(gpus, workers_per_gpu, job, log=print):
        n = len(gpus)
        state.calls.append((n, job["faults"]))
        state.jobs.append(job)
        start, autotune, grade = state.figures[n]
        p = _fake_phase(mod, n, start, autotune, grade, students=2)
        state.clock[0] += start + autotune + grade + p["close_s"] + (31.0 if job["faults"] else 0.0)
        if job["faults"]:
            p["faults"] = {"ok": True, "problems": [], "killed": ["w"], "rows": 12, "submissions": 12, "graded": 11,
                           "others": 11, "hang": "given up", "reruns": [], "s": 31.0, "table": "drill table"}
        return p

    monkeypatch.setattr(mod, "run_phase", run_phase)
    return state


def _plan_lines(out: str) -> dict[int, str]:
    """{pool size: its line} of the plan printed before the first phase."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^#   (\d+) GPUs?: .*$", out, re.M)}


def _args(*extra):
    return ["--students", "2", "--no-warm-up", *extra]


# --- the plan -----------------------------------------------------------------------------------------------------


def test_the_plan_prints_each_phase_its_parts_and_the_total_before_anything_runs(mod, monkeypatch, capsys):
    """--plan-only, with no GPU: the warm-up on the largest pool, then each phase's estimate by part (start + job +
    drill + close, from the per-item costs in PRIOR and PRIOR_SPEEDUP), where it would end (after the warm-up), the
    2-GPU phase SKIPPED under 200 s with how far past it would end, and the budget every phase needs; the same
    numbers as estimate_phase's."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mod.main(["--gpus", "1,2", "--plan-only", "--budget-s", "200"]) == 0
    out = capsys.readouterr().out
    lines = _plan_lines(out)
    one = mod.estimate_phase(1, mod.Costs.prior(), 108, 66, None)
    two = mod.estimate_phase(2, mod.Costs.prior(), 108, 66, 25.0)          # the largest pool carries the drill
    warm = mod.warm_up_estimate(2, 4, mod.Costs.prior(), 22)
    plain = mod.estimate_phase(2, mod.Costs.prior(), 8, 3 * 8, None)       # 8 workers: a configuration, 3 grades each
    assert warm.gpus == 2 and warm.drill_s == 0 and warm.start_s == plain.start_s * mod.WARM_UP_GROWTH["start"]
    assert warm.job_s == pytest.approx(plain.job_s * mod.WARM_UP_GROWTH["job"]) and warm.job_s < two.job_s
    assert two.drill_s == 25.0 + mod.DRILL_EXTRA_S and one.drill_s == 0
    assert two.speedup == mod.PRIOR_SPEEDUP[2] and abs(two.job_s * two.speedup - one.job_s) < 1e-6
    assert f"#   warm-up on 2 GPUs (in no ratio): {warm.text()}" in out
    before = mod.PRIOR["setup_s"] + warm.total_s                            # the phases start after the warm-up
    assert lines[1].endswith(f"= {one.total_s:.0f} s, ends near {before + one.total_s:.0f} s: runs"), lines
    assert f"fault drill {two.drill_s:.0f}" in lines[2] and f"{mod.PRIOR_SPEEDUP[2]:.2f}x, earlier runs" in lines[2]
    past = before + one.total_s + two.total_s - 200
    assert lines[2].endswith(f"SKIPPED: would end near {before + one.total_s + two.total_s:.0f} s, {past:.0f} s "
                             f"past --budget-s 200"), lines[2]
    every = before + one.total_s + two.total_s + mod.REPORT_S
    assert f"1 of 2 phases; every phase needs about {every:.0f} s (--budget-s {every:.0f})" in out
    assert "(no GPU here: a plan only)" in out and "# phase:" not in out          # nothing ran

    # the default budget: both run, and the plan says so before the first phase
    assert mod.main(["--gpus", "1,2", "--plan-only"]) == 0
    lines = _plan_lines(capsys.readouterr().out)
    assert lines[1].endswith(": runs") and lines[2].endswith(": runs"), lines

    # without the warm-up the phases start at once
    assert mod.main(["--gpus", "1,2", "--plan-only", "--no-warm-up"]) == 0
    out = capsys.readouterr().out
    assert "#   warm-up" not in out
    assert _plan_lines(out)[1].endswith(f"ends near {mod.PRIOR['setup_s'] + one.total_s:.0f} s: runs")


def test_a_plan_past_the_runners_limit_says_how_to_split_it_over_two_calls(mod, monkeypatch, capsys):
    """On the measured per-item costs, 1, 2 and 4 GPUs and the warm-up fit one call of the suite (SUITE_LIMIT_S, the
    runner's own limit); with grading 2.5 times as dear they do not, and the plan says to run `--gpus 1,N` then the
    rest with --baseline-from; the middle size is the one the budget skips."""
    import torch

    spec = importlib.util.spec_from_file_location("gpu_runner", ROOT / "tools" / "gpu" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_runner", runner)
    spec.loader.exec_module(runner)
    assert runner.SUITES["autotune-multigpu"].limit_s == mod.SUITE_LIMIT_S       # one figure, in both places
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mod.main(["--gpus", "1,2,4", "--plan-only"]) == 0
    out = capsys.readouterr().out
    lines = _plan_lines(out)
    assert list(lines) == [1, 4, 2] and all(line.endswith(": runs") for line in lines.values()), lines
    assert "do not fit one call" not in out

    monkeypatch.setitem(mod.PRIOR, "s_per_submission", 2.5 * mod.PRIOR["s_per_submission"])
    assert mod.main(["--gpus", "1,2,4", "--plan-only"]) == 0
    out = capsys.readouterr().out
    lines = _plan_lines(out)
    assert list(lines) == [1, 4, 2] and "SKIPPED" in lines[2] and lines[4].endswith(": runs"), lines
    assert "fault drill" in lines[4] and "fault drill" not in lines[2]
    assert "do not fit one call" in out and "--baseline-from" in out


def test_expected_speedup_takes_this_runs_measurements_over_earlier_ones(mod):
    """Measured here wins; else the earlier runs' figure for n; between known sizes interpolated; past the largest,
    flat; never above n."""
    assert mod.expected_speedup(1) == (1.0, "earlier runs")
    assert mod.expected_speedup(2) == (mod.PRIOR_SPEEDUP[2], "earlier runs")
    assert mod.expected_speedup(2, {2: 1.9}) == (1.9, "measured")
    s3, why = mod.expected_speedup(3, {4: 1.2})
    assert s3 == pytest.approx((mod.PRIOR_SPEEDUP[2] + 1.2) / 2) and why == "between 2 and 4 GPUs"
    assert mod.expected_speedup(8) == (mod.PRIOR_SPEEDUP[4], "as on 4 GPUs")
    assert mod.expected_speedup(8, {8: 7.5})[0] == 7.5


# --- phase selection as the run goes ------------------------------------------------------------------------------


def test_the_budget_skips_the_two_gpu_phase_at_340_s_and_runs_it_at_400_on_the_measured_one_gpu_phase(
        mod, host, capsys):
    """2 x H200's figures: after the measured 1-GPU phase (206 s + close), the 2-GPU phase with its drill is
    estimated from it and skipped under 340 s, with the reason in the table; under 400 s it runs, and the report
    says how long it took against its estimate."""
    assert mod.main(_args("--budget-s", "340")) == 0
    out = capsys.readouterr().out
    assert host.calls == [(1, False)]
    assert re.search(r"^# 2 GPUs: skipped \(estimate \d+ s: would end near \d+ s, \d+ s past --budget-s 340\)$",
                     out, re.M), out
    assert "2 GPUs: skipped" in out.splitlines()[-1]                            # the table's last row says so
    took = re.search(r"^#   1 GPU\(s\) took (\d+) s \(estimate (\d+) s\)$", out, re.M)
    assert took and int(took.group(1)) == round(8.1 + 53.6 + 144.4 + 2.0), out

    host.calls.clear()
    host.clock[0] = 1000.0
    assert mod.main(_args("--budget-s", "400")) == 0
    out = capsys.readouterr().out
    assert host.calls == [(1, False), (2, True)]                        # the largest pool carries the fault drill
    table = out.splitlines()[-2:]
    assert table[0].startswith("1 ") and table[1].startswith("2 ") and "1.00x" in table[0]
    job_ratio = (53.6 + 144.4) / (30.4 + 90.0)
    assert f"{job_ratio:.2f}x" in table[1] and "[b]" not in out
    report = json.loads((host.out / "autotune_multigpu.json").read_text())
    assert report["device"] == "NVIDIA H200" and report["date"] and report["job"]["submissions"] == 6
    assert [p["gpus"] for p in report["phases"]] == [1, 2] and report["phases"][1]["estimate_s"] > 0


def test_a_one_gpu_phase_faster_than_the_plan_lets_a_skipped_phase_run(mod, host, capsys):
    """The plan (from PRIOR's per-item costs: 108 configurations, 6 submissions) skips the 2-GPU phase under 120 s;
    the 1-GPU phase measured faster (32 s), and the estimate made from it before the 2-GPU phase fits: it runs, from
    this run's own costs."""
    host.figures = {1: (2.0, 20.0, 8.0), 2: (2.2, 12.0, 5.0)}
    assert mod.main(_args("--budget-s", "120")) == 0
    out = capsys.readouterr().out
    assert "SKIPPED" in _plan_lines(out)[2]
    assert host.calls == [(1, False), (2, True)], out
    assert re.search(r"^# phase: 2 GPU\(s\), estimate .*\(this run's 1-GPU phase\)", out, re.M), out


def test_a_warm_up_on_every_gpu_comes_first_and_enters_no_ratio(mod, host, capsys):
    """Before the 1-GPU phase, the largest pool does a little of the job (one configuration a worker, each exercise's
    first submissions up to one a worker, no fault drill); the report records it, the table says it ran, and the
    ratios are the phases' own: the same as without it."""
    assert mod.main(["--students", "4", "--gpus", "1,2", "--budget-s", "1000"]) == 0   # the fake: a whole phase
    out = capsys.readouterr().out
    assert host.calls == [(2, False), (1, False), (2, True)], host.calls
    warm, one = host.jobs[0], host.jobs[1]
    assert warm["configs"] == one["configs"][:8] and len(one["configs"]) == 108
    assert {ex: len(subs) for ex, subs in warm["work"].items()} == {ex: 4 for ex in mod.EXERCISES}
    assert all(list(warm["work"][ex]) == list(one["work"][ex])[:4] for ex in mod.EXERCISES)
    assert out.index("# warm-up: 2 GPU(s)") < out.index("# phase: 1 GPU(s)")
    ratio = (53.6 + 144.4) / (30.4 + 90.0)
    assert f"{ratio:.2f}x" in out.splitlines()[-1]
    assert re.search(r"^# before the first phase, an untimed warm-up on 2 GPU\(s\) \(\d+ s\)$", out, re.M), out
    report = json.loads((host.out / "autotune_multigpu.json").read_text())
    assert report["warm_up"]["gpus"] == 2 and report["warm_up"]["took_s"] > 0
    assert [p["gpus"] for p in report["phases"]] == [1, 2]


def test_a_failed_warm_up_is_reported_and_the_phases_still_run(mod, host, monkeypatch, capsys):
    """A warm-up that raises (a pool that would not start) costs no phase: its error is in the log, the report and
    the table's note, which says the first phase paid for the machine's first work (as it does without a warm-up)."""
    fake = mod.run_phase

    def failing_first(gpus, workers_per_gpu, job, log=print):
        if not host.calls:
            host.calls.append(("warm-up", False))
            raise RuntimeError("workers did not start")
        return fake(gpus, workers_per_gpu, job, log)

    monkeypatch.setattr(mod, "run_phase", failing_first)
    assert mod.main(["--students", "2", "--gpus", "1,2"]) == 0
    out = capsys.readouterr().out
    assert host.calls == [("warm-up", False), (1, False), (2, True)]
    assert "warm-up took 0 s (RuntimeError: workers did not start)" in out
    report = json.loads((host.out / "autotune_multigpu.json").read_text())
    assert report["warm_up"]["error"] == "RuntimeError: workers did not start"
    assert "# the warm-up failed (RuntimeError: workers did not start): the first phase also paid" in out
    assert mod.main(["--students", "2", "--gpus", "1,2", "--no-warm-up"]) == 0
    assert "# no warm-up (--no-warm-up)" in capsys.readouterr().out


# --- a stored baseline --------------------------------------------------------------------------------------------


def test_a_stored_one_gpu_phase_stands_in_for_this_runs_and_its_ratios_say_so(mod, host, capsys, tmp_path):
    """Call 1: `--gpus 1` writes its phase with device, date and job. Call 2 on a 4-GPU host of the same model:
    `--gpus 4 --baseline-from` runs only the 4-GPU phase (estimated from the stored costs), and the table marks the
    stored row and every ratio against it [b], with a footnote naming the file, the device and the date."""
    assert mod.main(_args("--gpus", "1")) == 0
    capsys.readouterr()
    stored = tmp_path / "one_gpu.json"
    stored.write_text((host.out / "autotune_multigpu.json").read_text())
    report = json.loads(stored.read_text())

    host.gpus, host.calls = 4, []
    assert mod.main(_args("--gpus", "4", "--baseline-from", str(stored), "--threads-per-worker",
                          str(report["job"]["threads_per_worker"]))) == 0
    out = capsys.readouterr().out
    assert host.calls == [(4, True)]                                      # the 1-GPU phase was not run again
    assert f"per-item costs from the 1-GPU phase stored in {stored}" in out
    assert list(_plan_lines(out)) == [4]
    foot = f"# [b]: against the 1-GPU phase stored in {stored} (NVIDIA H200, {report['date']}, this host), not " \
           f"measured in this run"
    assert foot in out, out
    rows = out.splitlines()[-2:]
    assert rows[0].startswith("1 [b] ") and rows[1].startswith("4 ")
    assert f"{(53.6 + 144.4) / (20.5 + 104.2):.2f}x [b]" in rows[1], rows[1]
    assert "where the time goes (1 GPU [b] -> 4)" in out and "tools: verdict:" in out
    written = json.loads((host.out / "autotune_multigpu.json").read_text())
    assert written["baseline_from"]["path"] == str(stored) and [p["gpus"] for p in written["phases"]] == [4]


def test_a_baseline_from_another_gpu_model_or_another_job_is_refused(mod, host, capsys, tmp_path):
    """A stored phase from an H100 on an H200 host: refused before anything runs, naming both models; so is one of
    another class size, one without a 1-GPU phase, and --gpus with 1 beside --baseline-from."""
    assert mod.main(_args("--gpus", "1")) == 0
    capsys.readouterr()
    stored = tmp_path / "one_gpu.json"
    report = json.loads((host.out / "autotune_multigpu.json").read_text())
    stored.write_text(json.dumps(dict(report, device="NVIDIA H100 80GB HBM3")))
    host.calls = []
    assert mod.main(_args("--gpus", "2", "--baseline-from", str(stored))) == 2
    err = capsys.readouterr().err
    assert "ran on NVIDIA H100 80GB HBM3, this host has NVIDIA H200" in err and host.calls == []

    stored.write_text(json.dumps(report))
    assert mod.main(["--students", "4", "--gpus", "2", "--baseline-from", str(stored)]) == 2
    assert "a different job (submissions 6 there, 12 here)" in capsys.readouterr().err

    stored.write_text(json.dumps(dict(report, phases=[dict(report["phases"][0], gpus=2)])))
    assert mod.main(_args("--gpus", "2", "--baseline-from", str(stored))) == 2
    assert "holds no 1-GPU phase" in capsys.readouterr().err

    assert mod.main(_args("--gpus", "1,2", "--baseline-from", str(stored))) == 2
    assert "leave 1 out of --gpus" in capsys.readouterr().err
    assert host.calls == []


# --- what each compute-sanitizer run cost ------------------------------------------------------------------------

FAKE_TOOL = r'''
import os, sys, time
sys.path.insert(0, {root!r})
from kernellab.run.launch.job import JobResult
args = sys.argv[1:]
out = args[args.index("--out") + 1]
time.sleep(0.3)                                     # the tool's own start-up
started = time.time()                               # "the target process starts"
time.sleep(0.1)
ready = time.time()                                 # its imports done
with open({big!r}, "rb") as fh:                     # reads (the page cache's, here)
    while fh.read(1 << 20):
        pass
t = time.process_time()
while time.process_time() - t < 0.4:                # CPU work ("the context")
    pass
loaded = time.time()
k0 = time.time()
time.sleep(0.2)                                     # "the kernel"
k1 = time.time()
time.sleep(0.3)                                     # the tail
with open(out, "wb") as fh:
    fh.write(JobResult("ok", marks=(("process start", started), ("job ready", ready), ("module loaded", loaded),
                                    ("kernel start", k0), ("kernel end", k1))).to_bytes())
print("========= ERROR SUMMARY: 0 errors")
'''


def test_sanitize_records_the_cost_of_the_tools_run_by_part(tmp_path):
    """nvtools.sanitize around a stand-in compute-sanitizer (a process that waits 0.3 s, reads 8 MB, burns 0.4 s of
    CPU, runs a 0.2 s "kernel" and waits 0.3 s): its ToolCost has the CPU seconds, the bytes read, the start-up to
    the first kernel, the kernel and the tail, each within what the stand-in did."""
    from kernellab.run.launch.job import KernelJob
    from kernellab.run.nvtools import sanitize

    big = tmp_path / "lib.so"
    big.write_bytes(os.urandom(8 << 20))
    tool = tmp_path / "fake-sanitizer"
    tool.write_text(f"#!{sys.executable}\n" + FAKE_TOOL.format(root=str(ROOT), big=str(big)))
    tool.chmod(0o755)
    job = KernelJob("k", (1, 1, 1), (32, 1, 1), ())
    rep = sanitize.sanitize(job, "memcheck", executable=str(tool), timeout_s=60)
    c = rep.cost
    assert rep.ok and c is not None, rep.raw
    assert c.wall_s >= 1.2 and c.cpu_s >= 0.35, c
    assert c.read_chars is None or c.read_chars >= 8 << 20, c         # /proc/self/io holds the reaped child's reads
    assert c.read_bytes is None or c.read_bytes >= 0
    assert c.tool_start_s is not None and 0.3 <= c.tool_start_s <= c.to_kernel_s - 0.45, c   # then 0.5 s more
    assert 0.09 <= c.imports_s <= 1.0 and 0.35 <= c.context_s <= c.to_kernel_s - c.tool_start_s - c.imports_s, c
    assert c.to_kernel_s <= c.wall_s - 0.45, c                          # the kernel and the tail come after
    assert 0.19 <= c.kernel_s <= 2.0 and 0.28 <= c.after_kernel_s <= c.wall_s - c.to_kernel_s - c.kernel_s + 1e-6, c
    assert c.to_json()["to_kernel_s"] == c.to_kernel_s


def test_tool_cost_drops_marks_outside_the_run_and_figures_it_cannot_read(tmp_path):
    from kernellab.run.nvtools.sanitize import children_usage, tool_cost

    c = tool_cost(2.0, {"cpu_s": 1.0}, {"cpu_s": 1.5}, 100.0,
                  {"process start": 40.0, "job ready": 100.5, "module loaded": 100.75, "kernel start": 101.0,
                   "kernel end": 101.5})
    assert c.cpu_s == 0.5 and c.read_bytes is None and c.read_chars is None
    assert c.tool_start_s is None and c.imports_s is None    # 60 s before the spawn: a clock that cannot be trusted
    assert c.context_s == 0.25
    assert c.to_kernel_s == 1.0 and c.kernel_s == 0.5 and c.after_kernel_s == pytest.approx(0.5)
    assert tool_cost(1.0, {}, {}, 0.0, {}).to_kernel_s is None
    now = children_usage()
    assert now["cpu_s"] >= 0 and set(now) <= {"cpu_s", "read_bytes", "read_chars"}


def test_the_job_command_line_marks_when_its_process_started(tmp_path):
    """`python -m kernellab.run.launch.job` (what runs under the tool) puts its process's start in its result's
    marks, between the spawn and the end, even where the job cannot run (no GPU here); the marks round-trip."""
    from kernellab.run.launch.job import JobResult, KernelJob

    path = KernelJob("k", (1, 1, 1), (32, 1, 1), ()).save(tmp_path / "j.kljob")
    out = tmp_path / "r.klres"
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "kernellab.run.launch.job", str(path), "--out", str(out)],
                   capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    t1 = time.time()
    res = JobResult.from_bytes(out.read_bytes())
    marks = dict(res.marks)
    assert t0 - 0.05 <= marks["process start"] <= marks["job ready"] <= t1, (t0, marks, t1)
    assert "module loaded" not in marks                   # no GPU: the kernel's module was never loaded
    r = JobResult("ok", marks=(("kernel start", 1.5), ("kernel end", 2.25)))
    assert JobResult.from_bytes(r.to_bytes()).marks == r.marks


def test_the_grader_keeps_each_sanitizer_runs_cost(monkeypatch):
    """_Grading.sanitizers on a stand-in kernel whose tool runs report a ToolCost: the GradeResult carries one
    (step, cost) per tool run, in order, and its JSON has them."""
    from kernellab.run.findings import SanitizerReport, ToolCost
    from kernellab.teach import exercise, grader

    monkeypatch.setattr(grader, "_to_device", lambda args: args)
    ran = []

    class Kernel:
        def sanitize(self, grid, block, *args, tool, **kw):
            ran.append(tool)
            return SanitizerReport(tool=tool, kernel="transpose", findings=(),
                                   cost=ToolCost(wall_s=len(ran), cpu_s=0.5, to_kernel_s=0.25 * len(ran)))

    g = grader._Grading(exercise("02-transpose-batched"), seed=1)
    g.sanitizers(Kernel())
    r = g.result()
    assert [s for s, _ in r.tool_costs] == [f"compute-sanitizer {t}" for t in ran] and len(ran) >= 3, r.tool_costs
    assert [c.wall_s for _, c in r.tool_costs] == list(range(1, len(ran) + 1))
    assert r.to_json()["tool_costs"][1] == [f"compute-sanitizer {ran[1]}", r.tool_costs[1][1].to_json()]


def test_the_tools_report_says_which_part_grew_and_what_it_points_at(mod):
    """where_tools_go from phases' tool_costs: per exercise and tool the figures 1 GPU -> N, then the verdict: a wait
    before the first kernel where only that grew; the cores where CPU seconds grew with the wall; the disk where the
    runs read much more from storage."""
    from kernellab.run.findings import ToolCost

    def phase(n, **kw):
        base = dict(wall_s=2.0, cpu_s=1.0, read_bytes=0, read_chars=4e8, tool_start_s=0.2, imports_s=0.3,
                    context_s=0.4, to_kernel_s=1.0, kernel_s=0.1, after_kernel_s=0.9)
        p = _fake_phase(mod, n, 8.0, 50.0, 140.0, students=2, tool_cost=ToolCost(**{**base, **kw}))
        return mod.summarize(p, 108, 6)

    one = phase(1)
    assert set(one["tool_costs"]) == set(mod.EXERCISES)
    assert one["tool_costs"]["00-flip"]["compute-sanitizer memcheck"]["to_kernel_s"] == 1.0

    waited = mod.where_tools_go(phase(2, wall_s=3.0, to_kernel_s=2.0, context_s=1.3), one)
    assert waited[0].startswith(f"{mod.EXERCISES[0]} compute-sanitizer memcheck: wall 2.00 -> 3.00 s, CPU 1.00 -> "
                                f"1.00 s; to the first kernel 1.00 -> 2.00 s (the tool's start-up 0.20 -> 0.20 s, "
                                f"Python and imports 0.30 -> 0.30 s, CUDA context and module 0.40 -> 1.30 s)")
    assert "read from disk 0.0 -> 0.0 MB (any read 400 -> 400 MB)" in waited[0]
    assert waited[-1].startswith("verdict: one submission of each exercise, its tools' runs summed, grew +3.00 s of "
                                 "wall time: before the first kernel +3.00 s, the kernel under the tool +0.00 s, "
                                 "after the kernel +0.00 s; CPU +0.00 s"), waited[-1]
    assert "points at a wait, before the first kernel (most in the CUDA context and module load under the tool " \
           "(the driver's process-wide work), +2.70 s)" in waited[-1], waited[-1]

    busy = mod.where_tools_go(phase(2, wall_s=3.0, cpu_s=2.0, kernel_s=1.1), one)[-1]
    assert "points at the cores" in busy and "the kernel under the tool +3.00 s" in busy
    disk = mod.where_tools_go(phase(2, wall_s=3.0, read_bytes=80e6, after_kernel_s=1.9), one)[-1]
    assert "points at the disk" in disk and "read from disk 0.0 -> 240.0 MB" in disk
    assert mod.where_tools_go(phase(2), one)[-1].endswith("the tools' runs did not grow")


def test_each_phase_counts_the_compute_sanitizer_processes_it_started(mod):
    """tool_processes from the graders' ToolCosts: one-shot runs each start a process; warm ones only their first."""
    from kernellab.run.findings import ToolCost

    def phase(started):
        p = _fake_phase(mod, 1, 8.0, 50.0, 140.0, students=2,
                        tool_cost=ToolCost(wall_s=1.0, process_started=started))
        return mod.summarize(p, 108, 6)

    runs = sum(len(t.rows) for t in phase(True)["grades"].tables)
    assert phase(True)["tool_processes"] == {"started": runs, "runs": runs, "unknown": 0}
    assert phase(False)["tool_processes"] == {"started": 0, "runs": runs, "unknown": 0}
    assert phase(None)["tool_processes"] == {"started": 0, "runs": runs, "unknown": runs}
    text = mod.table([phase(True), phase(False)], [])
    assert "sanitizer procs / runs" in text and f"{runs} / {runs}" in text and f"0 / {runs}" in text


def test_the_workers_warm_sanitizers_are_summed_in_one_line(mod):
    """pools_text over the workers' sanitize_pool.stats(): processes, jobs, replacements summed; the workers whose
    tool's output was out of program order named."""
    ok = {"tool": "racecheck", "processes_started": 1, "jobs": 9, "restarts": {}, "ordered": True}
    bad = {"tool": "memcheck", "processes_started": 4, "jobs": 9, "restarts": {"fault": 1, "out of order": 1},
           "ordered": False}
    text = mod.pools_text({"tcp://a": [ok, bad], "tcp://b": [ok]})
    assert text.startswith("6 processes for 27 jobs in 3 pools")
    assert "'fault': 1" in text and "'out of order': 1" in text and text.endswith("tcp://a (memcheck)")
    assert mod.pools_text({"tcp://b": [ok]}).endswith("out of program order: never")
    assert mod.pools_text({"tcp://a": []}) == "no warm compute-sanitizer ran"


def test_the_autotune_log_gives_each_stage_its_wall_sum_ideal_and_straggler_tail(mod):
    """autotune_jobs from the rows' records: 2 workers compile 4 configurations (the first job on each slow: a cold
    worker), 2 survive and are timed on 1 GPU; every figure is the arithmetic of those spans."""
    R = types.SimpleNamespace
    rows = [R(compiled_at=(100.0, 103.0), compile_worker="w0", measured_at=(103.0, 103.5, 104.5), gpu="G0"),
            R(compiled_at=(100.0, 102.0), compile_worker="w1", measured_at=None, gpu=None),
            R(compiled_at=(102.0, 103.0), compile_worker="w1", measured_at=(103.0, 104.5, 105.0), gpu="G0"),
            R(compiled_at=(103.0, 104.0), compile_worker="w0", measured_at=None, gpu=None)]
    j = mod.autotune_jobs(rows, workers=2, gpus=1, wall_s=6.0)
    c, g = j["compile"], j["gpu_held"]
    assert (c["wall_s"], c["sum_s"], c["ideal_s"], c["jobs"], c["used"]) == (4.0, 7.0, 3.5, 4, 2)
    assert c["tail_s"] == 1.0                       # w1 ran out of work at 103, the stage ended at 104
    assert c["first_s"] == 2.5 and c["rest_s"] == 1.0 and c["longest_s"] == 3.0
    assert (g["wall_s"], g["sum_s"], g["ideal_s"], g["tail_s"]) == (1.5, 1.5, 1.5, 0.0)
    assert j["lock_wait_s"] == 2.0 and j["held_before_last_compile_s"] == 0.5 and j["ideal_s"] == 3.5
    text = "\n".join(mod.autotune_jobs_text(j))
    assert "compile: wall 4.0 s (0.0 -> 4.0 s), sum of job times 7.0 s over 4 jobs, ideal 3.5 s (sum / 2 " \
           "workers; 2 used), straggler tail 1.0 s" in text
    assert "sweep: wall 6.0 s, ideal 3.5 s" in text
    # more slots than jobs: the unused slot ran out of work at the start, the whole stage is tail
    one = mod.autotune_jobs(rows[:1], workers=4, gpus=2, wall_s=5.0)
    assert one["compile"]["tail_s"] == 3.0 and one["gpu_held"]["tail_s"] == 1.0
    assert "no jobs recorded" in mod.autotune_jobs_text(mod.autotune_jobs([], 2, 1, 1.0))[0]


def test_where_the_time_goes_compares_the_autotunes_summed_job_times(mod):
    """The same jobs on 1 GPU and on 4: summed job time x1.5 is contention, the wall past the ideal is the schedule."""
    a = {"compile": {"sum_s": 100.0}, "gpu_held": {"sum_s": 20.0}, "wall_s": 40.0, "ideal_s": 30.0}
    b = {"compile": {"sum_s": 150.0}, "gpu_held": {"sum_s": 20.0}, "wall_s": 12.0, "ideal_s": 9.4}
    text = mod.autotune_jobs_growth(a, b)
    assert text == ("autotune: compile jobs summed 100.0 -> 150.0 s (x1.50), GPU held by check-and-time summed "
                    "20.0 -> 20.0 s (x1.00), autotune past its ideal 10.0 -> 2.6 s")
    assert mod.autotune_jobs_growth(None, b) == ""          # a stored 1-GPU phase from before the records
