"""Warm compute-sanitizer processes (kernellab.run.nvtools.sanitize_pool) with the real tool on a real GPU.

Run: tools/gpu/run.py tests-sanitizer-pool (or `pytest -m gpu -s tests/gpu/test_sanitizer_pool_gpu.py`). A job's
findings are what the tool printed between the target's begin and end lines: the program order the real tool was
seen to keep (a report before the CUDA call that met it returns). These tests check it: racecheck over clean, racy,
clean, racy and memcheck over clean, racy, clean, racy in one process each, the hazards on the racy jobs only, no
out-of-order report seen (stats()["ordered"]), memcheck's end-of-job report before each end line, the second job's
CUDA context part (ToolCost.context_s) small; an out-of-bounds access memcheck catches keeps the process (it ends the
kernel, not the context), a hang replaces it; the one-shot path agrees; the graders with KERNELLAB_SANITIZER_POOL=1
keep one process per tool. With $KERNELLAB_ARTIFACTS set, each job's raw
output is saved (pool_*.txt); the last lines printed are a table: tool, job, process started, context, wall, errors,
findings.
"""

import pytest

import kernellab
from kernellab.run.nvtools import sanitize_pool as P
from kernellab.run.nvtools.sanitize import sanitize, sanitizer_path

from faulty_kernels import compile_faulty, line_of, save

pytestmark = pytest.mark.gpu

ROWS: list = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    P.shutdown()
    print("\n# warm compute-sanitizer: each job of the sequences above")
    print(f"{'tool':10} {'job':16} {'started':>7} {'context_s':>9} {'wall_s':>7} {'errors':>6}  findings")
    for tool, label, rep in ROWS:
        c = rep.cost
        ctx = "-" if c is None or c.context_s is None else f"{c.context_s:.3f}"
        wall = "-" if c is None else f"{c.wall_s:.2f}"
        started = "-" if c is None or c.process_started is None else ("yes" if c.process_started else "no")
        what = ", ".join(f"{f.kind}@{f.where.cell_line}" for f in rep.findings) or ("TIMEOUT" if rep.timed_out
                                                                                      else "clean")
        print(f"{tool:10} {label:16} {started:>7} {ctx:>9} {wall:>7} {rep.error_count!s:>6}  {what} "
              f"[{rep.job_status}]")


@pytest.fixture(scope="module")
def mod():
    return compile_faulty()


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


def jobs(mod, torch):
    """(label, KernelJob): clean, racy, out of bounds (one element past the end), a trap (a fault that ends the
    CUDA context under every tool)."""
    x, y = torch.randn(128, device="cuda"), torch.zeros(128, device="cuda")
    z = torch.zeros(1000, device="cuda")
    return {"clean": mod.vadd.job(1, 32, z, z, torch.zeros_like(z), 32),
            "racy": mod.racy_reverse.job(2, 64, x, y),
            "oob": mod.oob_write.job(1, 32, z, 1000),
            "trap": mod.trap_now.job(1, 32, z)}


def row(tool, label, rep) -> None:
    """Keep the job for the table, and print its line now (a suite stopped at its limit still shows the jobs run)."""
    ROWS.append((tool, label, rep))
    c = rep.cost
    print(f"\n[pool] {tool} {label}: started={None if c is None else c.process_started} context_s="
          f"{None if c is None else c.context_s} errors={rep.error_count} findings={[f.kind for f in rep.findings]} "
          f"status={rep.job_status} timed_out={rep.timed_out} notes={list(rep.notes)}", flush=True)


def run(pool, label, job, **kw):
    rep = pool.run(job, timeout_s=kw.pop("timeout_s", 120))
    row(pool.tool, label, rep)
    save(f"pool_{pool.tool}_{len(ROWS)}_{label}.txt", rep.raw)
    return rep


def explain(pool, reps) -> str:
    return f"{pool.stats()}\n" + "\n---\n".join(f"{r}\n{r.raw[-1500:]}" for r in reps)


def test_racecheck_sequence_in_one_warm_process(mod, torch):
    """clean, racy, clean, racy under one racecheck process: the race on the racy jobs only, no report out of program
    order (racecheck reports no failed API call: the end lines alone split the jobs); the second job's CUDA context
    part a fraction of the first's."""
    j = jobs(mod, torch)
    pool = P.SanitizerPool("racecheck", executable=sanitizer_path(), print_limit=100)
    try:
        reps = [run(pool, b, j[b]) for b in ("clean", "racy", "clean", "racy")]
    finally:
        pool.close()
    why = explain(pool, reps)
    st = pool.stats()
    assert st["ordered"] is True and st["out_of_order"] == [], f"the tool's output was out of program order:\n{why}"
    assert st["processes_started"] == 1 and st["restarts"] == {"closed": 1}, why
    assert st["reports_after_last_job"] == 0, f"reports came after the last job's end line:\n{why}"
    assert [r.ok for r in reps] == [True, False, True, False], why
    want = {line_of("tile[threadIdx.x] = x["), line_of("= tile[63 - threadIdx.x];")}
    for r in (reps[1], reps[3]):
        assert r.findings and all(f.kind == "race" for f in r.findings), why
        assert {r.findings[0].where.cell_line, r.findings[0].other.cell_line} == want, why
        assert r.error_count and r.error_count > 0, why
    first, second = reps[0].cost, reps[1].cost
    assert first.process_started and not second.process_started, why
    assert second.context_s is not None and first.context_s is not None, why
    # the second job loads its module under the tool (instrumented) but makes no context
    assert second.context_s < first.context_s / 2, \
        f"context and module under the tool: first {first.context_s:.3f} s, second {second.context_s:.3f} s\n{why}"


def test_memcheck_sequence_then_a_fault(mod, torch):
    """clean, racy, clean, racy under one memcheck process (memcheck reports each end-of-job call before the job's end
    line: the order checked on every job), then out of bounds (the invalid write on its job only) and clean: in the
    same process where the tool ended only the kernel, in a new one where the access was a fault."""
    j = jobs(mod, torch)
    pool = P.SanitizerPool("memcheck", executable=sanitizer_path(), print_limit=100)
    try:
        reps = [run(pool, b, j[b]) for b in ("clean", "racy", "clean", "racy")]
        warm = dict(pool.stats())
        reps += [run(pool, b, j[b]) for b in ("oob", "clean")]
    finally:
        pool.close()
    why = explain(pool, reps)
    print(f"\n[pool] memcheck after clean, racy, clean, racy: {warm}", flush=True)
    # ordered: memcheck reported the odd jobs' end-of-job call (cudaDeviceGetAttribute) before each of their end lines
    # (a missing one marks the output out of order); end_calls_reported says whether it reported the even jobs' too
    assert warm["ordered"] is True and warm["out_of_order"] == [] and warm["processes_started"] == 1, why
    assert all(r.ok and not r.findings and r.error_count == 0 for r in reps[:4]), why
    assert not reps[1].cost.process_started and reps[1].cost.context_s < reps[0].cost.context_s / 2, why
    assert [r.ok for r in reps[4:]] == [False, True], why
    f = reps[4].findings[0]
    assert f.kind == "invalid_write" and f.where.cell_line == line_of("x[i + n] = 1.0f;"), why
    assert not reps[5].findings and pool.stats()["ordered"] is True, why
    faulted = reps[4].job_status == "fault"
    assert pool.stats()["processes_started"] == (2 if faulted else 1), why
    assert reps[5].cost.process_started == faulted, why


def test_memcheck_keeps_its_process_after_an_access_it_caught(mod, torch):
    """memcheck runs with --destroy-on-device-error kernel (sanitizer_text.KEEP_CONTEXT): an out-of-bounds write ends
    its kernel, not the CUDA context, so out of bounds, clean, out of bounds, clean run in one process; each
    out-of-bounds job has its invalid write (and only it), each clean job is clean."""
    j = jobs(mod, torch)
    pool = P.SanitizerPool("memcheck", executable=sanitizer_path(), print_limit=100)
    try:
        reps = [run(pool, b, j[b]) for b in ("oob", "clean", "oob", "clean")]
        st = dict(pool.stats())
    finally:
        pool.close()
    why = explain(pool, reps)
    print(f"\n[pool] memcheck over oob, clean, oob, clean: {st}; statuses {[r.job_status for r in reps]}", flush=True)
    assert "--destroy-on-device-error" in reps[0].command, why
    assert st["processes_started"] == 1 and st["restarts"] == {} and st["ordered"] is True, why
    assert [r.ok for r in reps] == [False, True, False, True], why
    for r in (reps[0], reps[2]):
        assert [f.kind for f in r.findings] == ["invalid_write"], why
        assert r.findings[0].where.cell_line == line_of("x[i + n] = 1.0f;"), why
    assert not any(r.cost.process_started for r in reps[1:]), why
    assert all(r.error_count == 0 for r in (reps[1], reps[3])), why


def test_a_hang_is_given_up_at_its_timeout(mod, torch):
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    j = jobs(mod, torch)
    pool = P.SanitizerPool("memcheck", executable=sanitizer_path(), print_limit=100)
    try:
        assert run(pool, "clean", j["clean"]).ok
        hung = run(pool, "spin", mod.spin.job(1, 1, flag), timeout_s=8)
        after = run(pool, "clean", j["clean"])
    finally:
        pool.close()
    why = explain(pool, [hung, after])
    assert hung.timed_out and hung.wall_ms < 30_000, why
    assert after.ok and after.cost.process_started and pool.stats()["restarts"].get("timeout") == 1, why


def test_the_one_shot_path_agrees(mod, torch, monkeypatch):
    """The same racy and out-of-bounds jobs one-shot (KERNELLAB_SANITIZER_POOL=0) and pooled: the same findings."""
    j = jobs(mod, torch)

    def shape(r):
        return sorted((f.tool, f.kind, f.where.cell_line) for f in r.findings), r.ok

    pooled = [sanitize(j[b], t, pool=True) for b, t in (("racy", "racecheck"), ("oob", "memcheck"))]
    monkeypatch.setenv(P.ENV, "0")
    once = [sanitize(j[b], t, pool=True) for b, t in (("racy", "racecheck"), ("oob", "memcheck"))]
    for label, r in zip(("racy pooled", "oob pooled", "racy one-shot", "oob one-shot"), pooled + once):
        row(r.tool, label, r)
    # the error counts are printed, not compared: a pooled job counts the reports printed in its part, the one-shot
    # tool's summary may count reports it did not print (racecheck's race analysis under --racecheck-report all)
    print(f"\n[pool] error counts pooled {[r.error_count for r in pooled]} one-shot {[r.error_count for r in once]}",
          flush=True)
    assert all("--serve" not in r.command for r in once) and all("--serve" in r.command for r in pooled)
    assert [shape(r) for r in pooled] == [shape(r) for r in once], \
        "\n---\n".join(f"{r}\n{r.raw[-1500:]}" for r in pooled + once)


def test_the_graders_keep_one_process_per_tool_across_submissions(monkeypatch):
    """kernellab.grade of tutorial 02's batched transpose: the reference, the variant without its barrier, the one
    without its bounds guard, the reference again, with the pool on (KERNELLAB_SANITIZER_POOL=1; the graders run
    one-shot without it). The race and the out-of-bounds read are their variants' only; the reference graded after
    them is clean; no grade after the first starts a compute-sanitizer process (memcheck's caught access ends the
    kernel, not the process)."""
    from exercises.solutions_lib import load_kernel, solution_path, variants
    from kernellab.teach import exercise

    monkeypatch.setenv(P.ENV, "1")
    P.shutdown()
    ex = exercise("02-transpose-batched")
    [racy] = [v for v in variants(ex.id) if v.name == "no_barrier"]
    [oob] = [v for v in variants(ex.id) if v.name == "no_guard"]
    good, bad, wild = (load_kernel(ex, p) for p in (solution_path(ex.id), racy.path, oob.path))
    grades = [kernellab.grade(ex.id, k, speed=False) for k in (good, bad, wild, good)]
    for label, g in zip(("reference", "no_barrier", "no_guard", "reference again"), grades):
        for step, cost in g.tool_costs:
            print(f"\n[pool] grade {label} {step}: started={cost.process_started} context_s={cost.context_s} "
                  f"wall_s={cost.wall_s:.2f}", flush=True)
    why = "\n".join(str(g) for g in grades) + f"\n{P.stats()}"
    assert grades[0].passed and grades[3].passed, why
    assert not grades[1].passed and "race" in [f.kind for f in grades[1].findings], why
    assert not grades[2].passed and "out_of_bounds" in [f.kind for f in grades[2].findings], why
    assert grades[0].tool_costs and all(c.process_started for _, c in grades[0].tool_costs), why
    later = [c for g in grades[1:] for _, c in g.tool_costs]
    assert later and not any(c.process_started for c in later), why
    assert all(s["processes_started"] == 1 and s["ordered"] for s in P.stats()), why


def test_a_warmed_pool_has_its_context_before_the_first_job_and_a_fault_leaves_a_ready_spare(mod, torch):
    """sanitize.warm on the jobs' device: the target makes its CUDA context before it opens its requests (--device),
    so the first job's context part is a module load, as a warm process's second job's is, and under a fraction of a
    cold process's first; the race is still found. An out-of-bounds job keeps the process; then a trap, a fault that
    ends the context: the spare process starts at once and the job after it runs on it with its context made."""
    from kernellab.run.nvtools.sanitize import warm

    j = jobs(mod, torch)
    cold = P.SanitizerPool("racecheck", executable=sanitizer_path(), print_limit=100)
    try:
        first_cold = run(cold, "racy cold", j["racy"])
    finally:
        cold.close()
    P.shutdown()
    device = j["racy"].device
    assert warm(("racecheck", "memcheck"), device=device, timeout_s=120) == {"racecheck": True, "memcheck": True}
    racy = sanitize(j["racy"], "racecheck", pool=True)
    row("racecheck", "racy warmed", racy)
    oob = sanitize(j["oob"], "memcheck", pool=True)
    row("memcheck", "oob warmed", oob)
    trap = sanitize(j["trap"], "memcheck", pool=True)
    row("memcheck", "trap", trap)
    after = sanitize(j["clean"], "memcheck", pool=True)
    row("memcheck", "clean on spare", after)
    why = "\n---\n".join(f"{r}\n{r.raw[-1500:]}" for r in (first_cold, racy, oob, trap, after)) + f"\n{P.stats()}"
    assert racy.findings and all(f.kind == "race" for f in racy.findings), why
    c, w = first_cold.cost, racy.cost
    assert w.process_started and c.process_started, why
    assert w.context_s is not None and c.context_s is not None and w.context_s < c.context_s / 2, \
        f"context and module: cold first job {c.context_s:.3f} s, warmed first job {w.context_s:.3f} s\n{why}"
    assert w.wall_s < c.wall_s, why
    assert not oob.ok and oob.findings[0].kind == "invalid_write" and not trap.cost.process_started, why
    assert not trap.ok and trap.job_status == "fault", why
    assert after.ok and not after.findings, why
    # the trap ended its process: the spare, started at once, took the next job with its context already made
    assert after.cost.process_started and after.cost.context_s < c.context_s / 2, why
