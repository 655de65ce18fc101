"""kernellab.autotune and grade_many on a real GPU (H100/H200 expected): an SGEMM's tile sizes tuned here and through
Dask on one GPU, a faulting configuration isolated, the cache, and grading on a Dask worker.

The Dask tests use dask-cuda's LocalCUDACluster where it is installed (tools/gpu/wheels.sh with DASK=1 carries it),
else a distributed.LocalCluster with one worker process pinned to GPU 0 by CUDA_VISIBLE_DEVICES.
"""
import importlib.util
import os
import sys
import time
import types
from pathlib import Path

import pytest

import kernellab

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SIZE = 2048


def _load_demo():
    spec = importlib.util.spec_from_file_location("autotune_demo", ROOT / "benchmarks" / "autotune_demo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod       # cloudpickle pickles by value only modules it can find in sys.modules
    spec.loader.exec_module(mod)
    return mod


demo = _load_demo()
CONFIGS = [dict(BM=bm, BN=bn, BK=16, TM=tm, TN=tn) for bm in (64, 128) for bn in (64, 128) for tm, tn in
           ((4, 4), (8, 8))] + [dict(BM=256, BN=256, BK=8, TM=4, TN=4)]     # 4096 threads: pruned
QUICK = {"warmup_ms": 10, "rep_ms": 40, "rounds": 4}


def _artifacts() -> Path | None:
    out = os.environ.get("KERNELLAB_ARTIFACTS")
    return Path(out) if out else None


@pytest.fixture(scope="module")
def torch():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


@pytest.fixture(scope="module")
def problem(torch):
    return demo.make_problem(SIZE)


def _kw(problem):
    launch, inputs, reference, baselines = problem
    return dict(kernel="sgemm", launch=launch, inputs=inputs, reference=reference, baselines=baselines,
                bench_options=QUICK)


def test_autotune_sgemm_tiles_here(torch, problem, tmp_cache):
    r = kernellab.autotune(demo.SGEMM, CONFIGS, **_kw(problem))
    print(r)
    huge = r.rows[-1]
    assert huge.pruned.startswith("threads: a block of 4096 threads, more than the 1024")
    for row in r.rows[:-1]:
        assert row.pruned or (row.check == "passed" and row.timed), row
        if row.timed:
            assert row.device == torch.cuda.get_device_name() and row.registers and row.occupancy
            assert row.speedup("torch").ratio > 0.05 and row.spread < 0.2
    best = r.best
    assert best is not None and best.ranked_by == "median_ms" and best.row.median_ms == min(
        row.median_ms for row in r.rows if row.timed)
    # The best kernel is a real kernel: it launches and agrees with torch.
    launch, inputs, reference, _ = problem
    args = inputs(torch.Generator().manual_seed(7))
    out = launch(best.kernel, best.config, *args)
    torch.testing.assert_close(out, args[0] @ args[1], rtol=1e-4, atol=1e-3)
    assert r.parameter in CONFIGS[0]
    if _artifacts():
        kernellab.autotune_plot(r).savefig(_artifacts() / "autotune_sgemm.png", dpi=100, bbox_inches="tight")
        (_artifacts() / "autotune_sgemm.txt").write_text(str(r))

    t0 = time.perf_counter()
    again = kernellab.autotune(demo.SGEMM, CONFIGS, **_kw(problem))
    assert all(row.cached for row in again.rows) and time.perf_counter() - t0 < 1.0
    assert again.best.config == best.config


FAULTY = r"""
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i + (BAD ? 1 << 28 : 0)] = 2.0f * x[i];     // BAD=1 writes 1 GiB past the end
}
"""


def test_a_faulting_configuration_is_a_row_and_this_process_lives_on(torch, tmp_cache):
    n = 1 << 20

    def launch(k, c, x, y):
        k[(n + c["THREADS"] - 1) // c["THREADS"], c["THREADS"]](x, y, n)
        return y

    r = kernellab.autotune(FAULTY, [{"BAD": 0, "THREADS": 256}, {"BAD": 1, "THREADS": 256}, {"BAD": 0, "THREADS": 512}],
                           kernel="scale", launch=launch, bench_options=QUICK,
                           inputs=lambda g: (torch.randn(n, generator=g).cuda(), torch.empty(n, device="cuda")),
                           reference=lambda x, y: 2 * x)
    print(r)
    ok, bad, ok2 = r.rows
    assert bad.check.startswith("fault: scale faulted in the isolated worker") and not bad.timed
    assert ok.timed and ok2.timed and ok.check == ok2.check == "passed"
    x = torch.ones(4, device="cuda")
    assert float((x * 3).sum()) == 12.0                    # this process's CUDA context is fine


def _cluster():
    """A Dask cluster of one worker on GPU 0, and what it is."""
    import distributed

    try:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", threads_per_worker=1, dashboard_address=None), \
            "LocalCUDACluster"
    except ImportError:
        return distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                        env={"CUDA_VISIBLE_DEVICES": "0"}), "LocalCluster pinned to GPU 0"


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed", reason="Dask is not installed (tools/gpu/wheels.sh with DASK=1)")
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # the workers cannot import this test module
    cloudpickle.register_pickle_by_value(demo)
    cluster, what = _cluster()
    with cluster, distributed.Client(cluster) as client:
        client.what = what
        yield client


def test_autotune_sgemm_tiles_through_dask_on_one_gpu(torch, problem, dask_client, tmp_cache):
    configs = CONFIGS[:4]
    r = kernellab.autotune(demo.SGEMM, configs, **_kw(problem), executor=dask_client.get_executor(), cache=False)
    print(dask_client.what)
    print(r)
    workers = set(dask_client.scheduler_info()["workers"])
    timed = [row for row in r.rows if row.timed]
    assert timed and all(row.worker in workers and row.gpu and row.check == "passed" for row in timed)
    assert len(r.devices) == 1 and r.best is not None and r.best.ranked_by == "median_ms"
    prefixes = set(dask_client.cluster.scheduler.task_prefixes)
    assert {"compile_task", "measure"} <= prefixes
    if _artifacts():
        (_artifacts() / "autotune_sgemm_dask.txt").write_text(f"{dask_client.what}\n{r}")


def test_autotune_on_two_workers_of_one_gpu_times_on_one_lane_while_the_other_compiles(torch, problem, tmp_cache):
    """Two Dask workers on GPU 0 (as the multi-GPU benchmark has 4 per GPU): each configuration goes from its compile
    to its check-and-time at once, the checks and timings run on one worker (the GPU's lane) one at a time, and each
    row says when and where its jobs ran."""
    distributed = pytest.importorskip("distributed", reason="Dask is not installed (tools/gpu/wheels.sh with DASK=1)")
    import cloudpickle

    from kernellab.run.measure import autotune as A

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(demo)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  env={"CUDA_VISIBLE_DEVICES": "0"}) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=300)
        ex = client.get_executor()
        lanes = A._lanes(ex)
        r = kernellab.autotune(demo.SGEMM, CONFIGS, **_kw(problem), executor=ex, cache=False)
    print(r)
    print("lanes:", lanes, "stages:", dict(r.stage_s))
    timed = [row for row in r.rows if row.timed]
    assert len(lanes) == 1 and len(timed) >= 4
    assert {row.worker for row in timed} == set(lanes)                     # checked and timed on the lane only
    spans = sorted(row.measured_at[1:] for row in timed)
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:]))      # one at a time on the GPU
    compiled = [row for row in r.rows if row.compiled_at]
    assert len(compiled) == len(CONFIGS) and all(row.compile_worker for row in compiled)
    assert all(row.measured_at[0] >= row.compiled_at[1] - 1e-3 for row in timed)
    assert not any("at the same time on one GPU" in n for n in r.notes), r.notes


VADD_GOOD = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""
VADD_SUBMISSIONS = {"ok": VADD_GOOD, "faults": VADD_GOOD.replace("c[i] =", "c[i + (1 << 28)] ="),
                    "off_by_one": VADD_GOOD.replace("i < n", "i < n - 1"), "typo": VADD_GOOD.replace("b[i]", "b[i")}


def grade_vadd(exercise_id, source):
    """A stand-in for kernellab.teach.grade: compile, check on an awkward size, report findings."""
    import torch

    n = 1_000_003
    try:
        k = kernellab.compile_cuda(source, arch=None).vadd
    except kernellab.CompileError as exc:
        return types.SimpleNamespace(passed=False, findings=(f"does not compile: {str(exc).splitlines()[1]}",))
    rep = kernellab.check(lambda a, b, c: (k[(n + 255) // 256, 256](a, b, c, n), c)[1], lambda a, b, c: a + b,
                          lambda g: (torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda(),
                                     torch.empty(n, device="cuda")), isolate=True, trials=2)
    return types.SimpleNamespace(passed=rep.passed, findings=() if rep.passed else
                                 (rep.message,) + ((rep.exception,) if rep.exception else ()))


def test_grade_many_on_a_dask_gpu_worker(dask_client):
    table = kernellab.grade_many("vadd", VADD_SUBMISSIONS, grade=grade_vadd, executor=dask_client.get_executor())
    print(table)
    status = {row.submission: row.status for row in table.rows}
    assert status == {"ok": "passed", "faults": "failed", "off_by_one": "failed", "typo": "failed"}
    assert any("faulted in the isolated worker" in f for f in table.row("faults").findings)
    assert table.row("typo").findings[0].startswith("does not compile")
    assert all(row.gpu for row in table.rows) and len(table.devices) == 1


def test_grade_class_of_cell_sources_with_the_tutorials_graders_on_a_dask_gpu_worker(dask_client):
    """kernellab.grade_class with the default grader (kernellab.teach.grade on each cell's text) on the GPU worker:
    the reference solutions pass in full, the wrong variants get the finding their files name, a broken cell is a
    compile_error; every row names the GPU."""
    sys.path.insert(0, str(ROOT / "tests"))
    from exercises.solutions_lib import solution_path, variants

    work, want = {}, {}
    for ex_id in ("01-reverse", "00-flip"):
        subs = {"solution": solution_path(ex_id).read_text()}
        for v in variants(ex_id)[:2]:
            subs[v.name] = v.path.read_text()
            want[(ex_id, v.name)] = set(v.kinds)
        work[ex_id] = subs
    work["01-reverse"]["broken"] = work["01-reverse"]["solution"].replace("];", "]")
    want[("01-reverse", "broken")] = {"compile_error"}
    g = kernellab.grade_class(work, executor=dask_client.get_executor(), timeout_s=300)
    print(g)
    for t in g.tables:
        assert t.row("solution").passed is True and t.row("solution").result.complete, str(t)
        for r in t.rows:
            assert r.gpu and r.rerun is None, str(t)
            if r.submission != "solution":
                kinds = {f.kind for f in r.result.findings}
                assert r.passed is False and want[(t.exercise_id, r.submission)] <= kinds, str(t)
