"""kernellab.autotune and kernellab.grade_many without a GPU.

- Compiling (real NVRTC, template kernels instantiated from name expressions), resources, the launches recorded
  without running them, pruning with its reasons, and the table, with no GPU: what it says it did not run.
- Rows cached on disk: a re-run compiles and runs nothing; a change of the input shapes, the source or a config
  re-runs what it changes.
- A faulting configuration: checked through kernellab's isolated worker on the stand-in GPU
  (tests/fixtures/fake_gpu.py faults on -DFAULT=1), reported as a row; the sweep goes on, the others are timed with
  a stand-in clock.
- A Dask `distributed.LocalCluster` of CPU workers runs the compile stage and the per-configuration jobs of Numba
  kernels in the simulator (a fault, a wrong answer and a pruned block among them).
- grade_many with an injected grader, here and on the cluster.
"""
import json
import os
import pathlib
import types

import pytest
import torch
from numba import cuda

import kernellab
from kernellab.compile.nvrtc import compile_source
from kernellab.run.measure import autotune as A
from kernellab.run.launch import device as D
from kernellab.run.launch import worker as W
from kernellab.run.measure.bench import BenchResult, Speedup

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
FAKE_ENV = {"PYTHONPATH": os.pathsep.join([str(FIXTURES), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}

# A tiled SGEMM whose tile sizes are template parameters; UNROLL and PAD are -D defines.
SGEMM = r"""
#ifndef PAD
#define PAD 0
#endif
template <int BM, int BN, int TM>
__global__ void sgemm(const float* A, const float* B, float* C, int M, int N, int K) {
    static_assert(BM % TM == 0, "BM must be a multiple of TM");
    __shared__ float As[BM][8 + PAD];
    __shared__ float Bs[8][BN];
    float acc[TM] = {0.0f};
    int tx = threadIdx.x % BN, ty = threadIdx.x / BN;            // one column, TM rows per thread
    for (int k0 = 0; k0 < K; k0 += 8) {
        for (int i = threadIdx.x; i < BM * 8; i += blockDim.x)
            As[i / 8][i % 8] = A[(blockIdx.y * BM + i / 8) * K + k0 + i % 8];
        for (int i = threadIdx.x; i < 8 * BN; i += blockDim.x)
            Bs[i / BN][i % BN] = B[(k0 + i / BN) * N + blockIdx.x * BN + i % BN];
        __syncthreads();
        for (int k = 0; k < 8; ++k) {
            float b = Bs[k][tx];
            #pragma unroll
            for (int t = 0; t < TM; ++t) acc[t] += As[ty * TM + t][k] * b;
        }
        __syncthreads();
    }
    for (int t = 0; t < TM; ++t) C[(blockIdx.y * BM + ty * TM + t) * N + blockIdx.x * BN + tx] = acc[t];
}
"""

M = N = K = 64


def sgemm_launch(k, c, a, b, out):
    k[(N // c["BN"], M // c["BM"]), c["BM"] * c["BN"] // c["TM"], c.get("DYN", 0)](a, b, out, M, N, K)
    return out


def sgemm_inputs(g):
    return torch.randn(M, K, generator=g), torch.randn(K, N, generator=g), torch.empty(M, N)


def sgemm_reference(a, b, out):
    return a @ b


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(D, "gpu_status", lambda: (False, "no CUDA driver (test)"))


# --- configurations -> compile options ----------------------------------------------------------------------------


def test_template_parameters_become_name_expressions_and_the_rest_defines():
    src = "template <typename T, int BM, int BK = 8>\n__global__ void __launch_bounds__(256) k(T* x) {}\n" \
          "__global__ void plain(float* x) {}"
    params = A.template_params(src, "k")
    assert [(p.name, p.default) for p in params] == [("T", None), ("BM", None), ("BK", "8")]
    assert A.template_params(src, "plain") is None
    assert A.compile_plan("k", {"T": "float", "BM": 64, "UNROLL": 4, "FAST": True}, params) == (
        ("-DUNROLL=4", "-DFAST=1"), "k<float, 64>")             # BK takes its default
    assert A.compile_plan("k", {"T": "float", "BM": 64, "BK": 16}, params)[1] == "k<float, 64, 16>"
    assert A.compile_plan("plain", {"N": 3}, None) == (("-DN=3",), None)
    with pytest.raises(A.AutotuneError, match="parameter BM has no default"):
        A.compile_plan("k", {"T": "float"}, params)


def test_name_expression_instantiates_a_template_without_source_changes(tmp_cache):
    out = compile_source(SGEMM, "sm_90", name_expressions=("sgemm<64, 32, 4>",))
    symbol = out.lowered("sgemm<64, 32, 4>")
    assert symbol.startswith("_Z5sgemmILi64ELi32ELi4EE") and list(out.reports) == [symbol]
    m = kernellab.compile_cuda(SGEMM + "template __global__ void sgemm<64, 32, 4>(const float*, const float*, "
                               "float*, int, int, int);", arch="sm_90")
    assert m.kernels[0].symbol == symbol                     # the same entry an explicit instantiation gives


def test_autotune_and_compile_cuda_share_compile_cache_entries(tmp_cache):
    """One compile through the cache (compile.nvrtc.compile_cached, one key): autotune's compile of a configuration,
    compile_cuda and a worker's compile of the same source, options and arch are one entry, whichever comes first."""
    from kernellab.compile import cache
    from kernellab.compile.nvrtc import compile_key
    from kernellab.run.launch.job import KernelJob, job_image

    opts, expr = A.compile_plan("twice", {"FACTOR": 3}, None)
    got = A.compile_task(A.CompileTask(SCALE, opts, "sm_90", expr, "cell.cu", 2))
    assert got.error is None and got.cache_state == "miss"
    m = kernellab.compile_cuda(SCALE, arch="sm_90", options=opts, first_line=2, filename="cell.cu")
    assert m.cache_state == "memory" and m.cubin == got.output.cubin
    job = KernelJob(symbol="twice", grid=(1, 1, 1), block=(32, 1, 1), args=(), source=SCALE, arch="sm_90",
                    options=opts, first_line=2, filename="cell.cu")
    assert job_image(job) == (got.output.cubin, "cubin")       # a worker given no image compiles nothing new
    assert len(list(tmp_cache.rglob("*.pkl"))) == 1

    cache.clear_memory()                                       # a new process: the entry is on disk
    assert A.compile_task(A.CompileTask(SCALE, opts, "sm_90", expr, "cell.cu", 2)).cache_state == "disk"
    m2 = kernellab.compile_cuda(SCALE, arch="sm_90", options=("-DFACTOR=5",), first_line=2, filename="cell.cu")
    again = A.compile_task(A.CompileTask(SCALE, ("-DFACTOR=5",), "sm_90", None, "cell.cu", 2))
    assert m2.cache_state == "miss" and again.cache_state == "memory"   # the other way round
    assert A.CompileTask(SCALE, ("-DFACTOR=5",), "sm_90a", None, "cell.cu", 2).cache_key() != compile_key(
        SCALE, "sm_90", ("-DFACTOR=5",), filename="cell.cu", first_line=2)   # the arch is part of the key


def test_configs_are_validated():
    for bad, match in (({"BM": 64}, "non-empty list"), ([{"BM": [64]}], "values are numbers"),
                       ([{"B M": 1}], "C identifier"), ([{"BM": 1}, {"BM": 1}], "given twice")):
        with pytest.raises(A.AutotuneError, match=match):
            A.autotune(SGEMM, bad, kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs, build=kernellab.Module)


# --- no GPU: compile, resources, pruning, the table ----------------------------------------------------------------


CONFIGS = [
    {"BM": 32, "BN": 32, "TM": 4},                     # 256 threads
    {"BM": 64, "BN": 64, "TM": 4},                     # 1024 threads
    {"BM": 64, "BN": 32, "TM": 8},                     # 256 threads, more registers
    {"BM": 64, "BN": 64, "TM": 1},                     # 4096 threads: more than a block may have
    {"BM": 32, "BN": 32, "TM": 3},                     # the static_assert fails
    {"BM": 32, "BN": 32, "TM": 4, "DYN": 231_000},     # dynamic shared memory over sm_90's 227 KiB
    {"BM": 32, "BN": 32, "TM": 4, "PAD": 1},           # a -D define changes the smem footprint
]


def test_no_gpu_compiles_prunes_and_says_what_it_did_not_run(tmp_cache, no_gpu):
    r = kernellab.autotune(SGEMM, CONFIGS, kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs,
                           reference=sgemm_reference, progress=False, min_occupancy=None)
    assert [row.config for row in r.rows] == CONFIGS             # in the order given
    ok, big, regs8, too_many, bad, smem, pad = r.rows

    # Resources are the compiler's, for the instance the configuration names.
    inst = kernellab.compile_cuda(SGEMM + "template __global__ void sgemm<64, 32, 8>(const float*, const float*, "
                                  "float*, int, int, int);", arch="sm_90").kernels[0]
    assert (regs8.registers, regs8.shared_bytes, regs8.symbol) == (inst.resources.registers,
                                                                    inst.resources.shared_bytes, inst.symbol)
    assert ok.shared_bytes == (32 * 8 + 8 * 32) * 4 and pad.shared_bytes == (32 * 9 + 8 * 32) * 4
    # The launch was recorded without running: block and occupancy from it.
    assert ok.block == (256, 1, 1) and big.block == (1024, 1, 1)
    occ = kernellab.occupancy(256, regs8.registers, regs8.shared_bytes, "sm_90")
    assert (regs8.occupancy, regs8.limiter) == (occ.ratio, occ.limiter)

    assert too_many.pruned.startswith("threads: a block of 4096 threads, more than the 1024")
    assert bad.pruned.startswith("compile error:") and "BM must be a multiple of TM" in bad.error
    assert smem.pruned.startswith("shared memory: 233,048 B per block (2,048 static + 231,000 dynamic), more than the 232,448 B")
    for row in (ok, big, regs8, pad):
        assert row.pruned is None and row.check == "not run: no GPU" and not row.timed
    assert r.best is None and r.counts() == {"timed": 0, "pruned": 3, "failed": 0, "not run": 4, "error": 0}
    assert any("timing need a GPU" in n for n in r.notes) and any("compiled for sm_90" in n for n in r.notes)
    text = str(r)
    assert "pruned: threads: a block of 4096" in text and "not run: no GPU" in text
    assert "pruned: compile error" in r._repr_html_()
    j = json.loads(json.dumps(r.to_json()))
    assert j["kind"] == "autotune" and j["rows"][3]["status"] == "pruned" and j["best"] is None

    floor = kernellab.autotune(SGEMM, CONFIGS[:3], kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs,
                               progress=False, min_occupancy=0.99)
    low = [row for row in floor.rows if row.occupancy is not None and row.occupancy < 0.99]
    assert low and all(row.pruned.startswith(f"occupancy {row.occupancy:.0%} below min_occupancy 99%")
                       for row in low)


def test_spills_and_local_memory_prune_unless_allowed(tmp_cache, no_gpu):
    src = r"""
__global__ void stack(float* x, int n) {
    float tmp[64];                                  // indexed at run time: it lives in local memory
    for (int i = 0; i < 64; ++i) tmp[i] = x[(threadIdx.x + i) % n];
    x[threadIdx.x] = tmp[(threadIdx.x * SHIFT) % 64];
}"""
    launch = lambda k, c, x, n: k[1, 32](x, n)                                       # noqa: E731
    inputs = lambda g: (torch.zeros(64), 64)                                        # noqa: E731
    r = kernellab.autotune(src, [{"SHIFT": 3}], kernel="stack", launch=launch, inputs=inputs, progress=False)
    assert r.rows[0].local_bytes > 0 and r.rows[0].pruned.startswith("local memory:")
    kept = kernellab.autotune(src, [{"SHIFT": 3}], kernel="stack", launch=launch, inputs=inputs, progress=False,
                              prune_local_memory=False)
    assert kept.rows[0].pruned is None and kept.rows[0].check == "not run: no GPU"
    heavy = r"""
__global__ void heavy(const float* x, float* y, int n) {
    float acc[ACC];                                 // ACC values live at once: more than 24 registers hold
    #pragma unroll
    for (int j = 0; j < ACC; ++j) acc[j] = x[threadIdx.x + j];
    for (int k = 0; k < n; ++k) {
        #pragma unroll
        for (int j = 0; j < ACC; ++j) acc[j] = acc[j] * acc[(j + 1) % ACC] + x[k];
    }
    float s = 0;
    #pragma unroll
    for (int j = 0; j < ACC; ++j) s += acc[j];
    y[threadIdx.x] = s;
}"""
    spills = kernellab.autotune(heavy, [{"ACC": 32}, {"ACC": 4}], kernel="heavy", progress=False,
                                launch=lambda k, c, x, y: k[1, 32](x, y, 8),
                                inputs=lambda g: (torch.zeros(64), torch.zeros(32)), options=("--maxrregcount=24",))
    many, few = spills.rows
    assert many.spill_bytes > 0 and many.pruned.startswith("spills: ") and "(24 registers)" in many.pruned
    assert few.spill_bytes == 0 and few.pruned is None


def test_inputs_that_need_a_gpu_leave_the_launch_unrecorded_and_say_so(tmp_cache, no_gpu):
    def cuda_inputs(g):
        return torch.randn(M, K, generator=g).cuda(), torch.randn(K, N).cuda(), torch.empty(M, N, device="cuda")

    r = kernellab.autotune(SGEMM, CONFIGS[:1], kernel="sgemm", launch=sgemm_launch, inputs=cuda_inputs,
                           progress=False)
    row = r.rows[0]
    assert row.registers and row.block is None and row.occupancy is None and row.check == "not run: no GPU"
    assert any("inputs(generator) cannot run here" in n and "wait for a GPU" in n for n in r.notes)


# --- the cache --------------------------------------------------------------------------------------------------


def test_rows_are_cached_and_a_rerun_runs_nothing(tmp_cache, no_gpu, monkeypatch):
    kw = dict(kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs, progress=False)
    first = kernellab.autotune(SGEMM, CONFIGS[:3], **kw)
    assert not any(row.cached for row in first.rows)
    with monkeypatch.context() as mp:
        mp.setattr(A, "compile_task", lambda task: pytest.fail("a cached row was compiled again"))
        mp.setattr(A, "record_launches", lambda *a: pytest.fail("a cached row's launch was recorded again"))
        again = kernellab.autotune(SGEMM, CONFIGS[:3], **kw)
    assert all(row.cached for row in again.rows)
    assert [dataclass_fields(r) for r in again.rows] == [dataclass_fields(r) for r in first.rows]
    assert dict(again.stage_s)["total"] < 0.5
    # A new input shape (a global that inputs and launch read), a new source, a new configuration: run again.
    with monkeypatch.context() as mp:
        mp.setitem(globals(), "M", 128)
        assert not any(row.cached for row in kernellab.autotune(SGEMM, CONFIGS[:1], **kw).rows)
    assert not kernellab.autotune(SGEMM + "\n// edited", CONFIGS[:1], **kw).rows[0].cached
    mixed = kernellab.autotune(SGEMM, CONFIGS[:1] + [{"BM": 32, "BN": 64, "TM": 4}], **kw)
    assert [row.cached for row in mixed.rows] == [True, False]
    off = kernellab.autotune(SGEMM, CONFIGS[:1], **kw, cache=False)
    assert not off.rows[0].cached


def dataclass_fields(row):
    return {k: v for k, v in row.to_json().items() if k != "cached"}


def test_fingerprint_follows_the_numbers_a_function_reads():
    n = 4

    def make(g):
        return torch.zeros(n * SIZE)

    global SIZE
    SIZE = 8
    before = A.fingerprint(make)
    SIZE = 16
    assert A.fingerprint(make) != before                       # a global it reads
    SIZE = 8
    assert A.fingerprint(make) == before
    n = 5
    assert A.fingerprint(make) != before                       # a closure variable
    assert A.fingerprint(lambda x: x + 1) != A.fingerprint(lambda x: x + 2)
    assert A.fingerprint(torch.zeros(3, 4)) == "Tensor[torch.float32](3, 4)"
    sizes = types.SimpleNamespace(m=64)
    read = lambda g: torch.zeros(sizes.m)                       # noqa: E731
    small = A.fingerprint(read)
    sizes.m = 128
    assert A.fingerprint(read) != small                        # an attribute of a namespace it reads


# --- a faulting configuration, isolated in kernellab's worker (the stand-in GPU) ---------------------------------


SCALE = r"""
extern "C" __global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = FACTOR * x[i];
}
"""


class FakeClock:
    """Runs each call; the kernel 'takes' 1 ms, the baseline (which returns one element) 2 ms."""

    device = "Fake GPU"
    flush_bytes = 0
    l2_bytes = 1 << 10

    def check_measurable(self, name, returned, args):
        pass

    def time_calls(self, calls):
        return [2.0 if call().numel() == 1 else 1.0 for call in calls]

    def graph(self, calls):
        return lambda: [c() for c in calls][-1]

    def describe(self):
        return "fake clock"


@pytest.fixture
def fake_gpu(monkeypatch, tmp_cache):
    """A GPU that exists only to kernellab's checks; launches run isolated in the stand-in GPU worker."""
    from kernellab.run.launch.device import DeviceInfo
    from kernellab.run.launch.launch import make_config

    dev = DeviceInfo(0, "Fake GPU", "sm_90", 132)
    pool = W.WorkerPool(runner="fake_gpu:run", init="fake_gpu:init", env=FAKE_ENV, start_timeout_s=60)
    monkeypatch.setattr(D, "gpu_status", lambda: (True, "1 GPU(s)"))
    monkeypatch.setattr(D, "device_info", lambda index=None: dev)
    monkeypatch.setattr(kernellab.kernel.Kernel, "check_launch", lambda k, g, b, a, s=0, cluster=None: (make_config(
        g, b, s, max_threads_per_block=1024, static_shared_bytes=0, device=dev), dev))
    monkeypatch.setattr(W, "sync_caller", lambda: None)
    monkeypatch.setattr(W, "default_pool", lambda device=None: pool)
    monkeypatch.setattr(W.settings, "diagnose", False)
    yield pool
    pool.shutdown()


def test_a_faulting_configuration_is_a_row_and_the_sweep_goes_on(fake_gpu):
    def launch(k, c, x, n):
        k[(n + 31) // 32, 32](x, n, isolate=True)      # the stand-in GPU runs launches in its worker only
        return x

    configs = [{"FACTOR": 2, "FAULT": 0}, {"FACTOR": 2, "FAULT": 1}, {"FACTOR": 2.0, "FAULT": 0}]
    r = kernellab.autotune(
        SCALE, configs, kernel="twice", launch=launch, inputs=lambda g: (torch.randn(64, generator=g), 64),
        reference=lambda x, n: x * 2, baselines={"slow": lambda x, n: (x * 2)[:1]}, progress=False,
        bench_options={"timer": FakeClock(), "warmup_ms": 1, "rep_ms": 4, "rounds": 2, "min_reps": 2,
                       "rotate": False})
    good, bad, good2 = r.rows
    assert bad.check.startswith("fault: twice faulted in the isolated worker: cudaErrorIllegalAddress")
    assert "Your session is unaffected" in bad.error and not bad.timed
    assert fake_gpu.replaced == 1                          # the poisoned worker was replaced, the sweep went on
    for row in (good, good2):
        assert row.check == "passed" and row.median_ms == 1.0 and row.speedup("slow").ratio == 2.0
        assert row.device == "Fake GPU" and row.gpu == "Fake GPU [%s GPU 0]" % os.uname().nodename
    assert r.best.row is good and r.best.kernel.name == "twice" and r.best.ranked_by == "median_ms"
    assert r.counts()["failed"] == 1 and "fault: twice faulted" in str(r)


# --- Dask: the compile stage and Numba jobs on a LocalCluster of CPU workers ---------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        yield client


def make_numba_scale(c):
    """A Numba kernel for one configuration: T threads per block, out[i] = 2 x[i] + BIAS, SHIFT indices past n.
    (`cuda` is this module's global: the simulator swaps the module's numba.cuda for its own during a launch.)"""
    T, BIAS, SHIFT = c["T"], c.get("BIAS", 0), c.get("SHIFT", 0)

    @cuda.jit
    def scale(x, out, n):
        i = cuda.blockIdx.x * T + cuda.threadIdx.x
        if i < n + SHIFT:
            out[i] = 2 * x[i] + BIAS
    return kernellab.numba_kernel(scale, signature="float32[::1], float32[::1], int32", simulate=True)


def test_dask_cluster_runs_the_compile_stage_and_simulated_numba_jobs(dask_client, tmp_cache, no_gpu):
    ex = dask_client.get_executor()
    cuda = kernellab.autotune(SGEMM, CONFIGS[:3], kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs,
                              executor=ex, progress=False)
    workers = set(dask_client.scheduler_info()["workers"])
    assert all(row.registers for row in cuda.rows) and {row.worker for row in cuda.rows} <= workers
    assert all(row.block and row.check == "not run: no GPU" for row in cuda.rows)   # recorded on the workers
    done = {k for k in dask_client.cluster.scheduler.task_prefixes}
    assert {"compile_task", "measure", "where"} <= done

    n = 100
    configs = [{"T": 32}, {"T": 64}, {"T": 32, "SHIFT": 40}, {"T": 32, "BIAS": 1}, {"T": 2048}]
    r = kernellab.autotune(
        make_numba_scale, configs, kernel="scale", executor=ex, progress=False,
        launch=lambda k, c, x, out: (k[(n + c["T"] - 1) // c["T"], c["T"]](x, out, n), out)[1],
        inputs=lambda g: (torch.randn(n, generator=g), torch.empty(n)), reference=lambda x, out: 2 * x)
    t32, t64, shifted, biased, huge = r.rows
    assert t32.check == t64.check == "passed" and t32.registers and t32.block == (32, 1, 1)
    assert shifted.check.startswith("fault: ") and "IndexError" in shifted.check
    assert biased.check.startswith("failed: trial 0 (seed 0): 100 of 100 elements")
    assert huge.pruned.startswith("threads: a block of 2048 threads")
    assert {row.worker for row in r.rows} <= workers and not any(row.timed for row in r.rows)
    assert t32.note == "not timed: a simulated kernel" and t32.status == "not run"
    assert r.counts() == {"timed": 0, "pruned": 1, "failed": 2, "not run": 2, "error": 0}
    assert any("checked in the simulator; timing needs a GPU" in note for note in r.notes)


def test_dask_streams_each_configuration_from_its_compile_and_records_where_and_when(dask_client, tmp_cache, no_gpu):
    """On a Dask pool (the streamed sweep: tests/test_fanout_pipeline.py checks the streaming itself) every row says
    when and on which worker it compiled and when it was looked at after that, and a second sweep takes its compiles
    from the cache and still sends every configuration on to the workers."""
    ex = dask_client.get_executor()
    workers = set(dask_client.scheduler_info()["workers"])
    kw = dict(kernel="sgemm", launch=sgemm_launch, inputs=sgemm_inputs, executor=ex, progress=False, cache=False)
    r = kernellab.autotune(SGEMM, CONFIGS[:4], **kw)
    assert len(r.rows) == 4 and all(row.block for row in r.rows), str(r)
    assert [row.check for row in r.rows] == ["not run: no GPU"] * 3 + [None] and r.rows[3].pruned.startswith("threads")
    assert all(row.compile_worker in workers and row.compiled_at[0] <= row.compiled_at[1] for row in r.rows)
    assert all(row.measured_at[0] >= row.compiled_at[1] - 1e-3 and row.measured_at[1] is None for row in r.rows)
    stages = dict(r.stage_s)
    assert {"compile", "prune", "check_and_time", "total"} <= set(stages)
    assert r.to_json()["rows"][0]["compiled_at"] == list(r.rows[0].compiled_at)
    again = kernellab.autotune(SGEMM, CONFIGS[:4], **kw)              # compiles from the cache this time
    assert [row.registers for row in again.rows] == [row.registers for row in r.rows]
    assert all(row.compiled_at is None and row.compile_ms == 0.0 and row.measured_at for row in again.rows)
    assert [row.check for row in again.rows] == [row.check for row in r.rows] and all(row.block for row in again.rows)


def test_a_process_pool_cannot_take_lambdas_and_says_so(tmp_cache, no_gpu):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1) as ex:
        r = kernellab.autotune(make_numba_scale, [{"T": 32}], kernel="scale", executor=ex, progress=False,
                               launch=lambda k, c, x, out: k[1, 32](x, out, 4), inputs=lambda g: (torch.ones(4),))
    assert r.rows[0].check.startswith("error: the task failed")
    assert any("Dask's executor (cloudpickle sends lambdas" in note for note in r.notes)


# --- the result: best across GPUs, the parameter that matters, the plot ------------------------------------------


def _timed(config, ms, gpu="GPU A", base_ms=None):
    sp = (Speedup("torch", base_ms / ms, base_ms / ms, base_ms / ms, 1),) if base_ms else ()
    bench = BenchResult("k", ms, ms, ms, ((0.25, ms * 0.99), (0.5, ms), (0.75, ms * 1.01)), 10, 2, gpu, "fake")
    return A.AutotuneRow(config=config, median_ms=ms, spread=0.02, speedups=sp, device="H200", gpu=gpu,
                         check="passed", bench=bench, baseline_ms=(("torch", base_ms),) if base_ms else ())


def test_parameter_that_matters_and_best_across_gpus():
    rows = tuple(_timed({"BM": bm, "BK": bk}, ms=bm / 64 * (1 + 0.01 * bk), base_ms=1.0)
                 for bm in (64, 128, 256) for bk in (8, 16))
    r = A.AutotuneResult("sgemm", "sm_90", rows, baselines=("torch",))
    assert r.parameter == "BM" and r.parameters()[0][1] > 0.99
    assert r.best.row.config == {"BM": 64, "BK": 8} and r.best.ranked_by == "median_ms"
    # The same rows timed on two GPUs: the best is the best ratio to a baseline timed beside it, and it says so.
    split = tuple(A.AutotuneRow(**{**row.__dict__, "gpu": "GPU B"}) if i % 2 else row for i, row in enumerate(rows))
    r2 = A.AutotuneResult("sgemm", "sm_90", split, baselines=("torch",))
    assert r2.ranked_by == "speed-up vs torch" and len(r2.devices) == 2 and "GPU" in r2._columns()
    notes = A._stage_notes(split, A.Where(True, "", "H200"), object(), sgemm_reference, {})
    assert any(n.startswith("timed on 2 GPUs (all H200)") and "speed-ups, not times" in n for n in notes)


def test_overlapping_timings_on_one_gpu_are_called_out():
    a = A.AutotuneRow(config={"T": 1}, median_ms=1.0, gpu="G", timed_at=(0.0, 2.0))
    b = A.AutotuneRow(config={"T": 2}, median_ms=1.0, gpu="G", timed_at=(1.0, 3.0))
    notes = A._stage_notes((a, b), A.Where(True, ""), None, None, {})
    assert any("timed at the same time on one GPU (G)" in n for n in notes)


def test_autotune_plot_draws_time_against_the_parameter_that_matters():
    import matplotlib

    matplotlib.use("Agg")
    rows = tuple(_timed({"BM": bm, "BK": bk}, ms=bm / 64 * (1 + 0.1 * bk), base_ms=1.5)
                 for bm in (64, 128, 256) for bk in (8, 16)) + (A.AutotuneRow(config={"BM": 512, "BK": 8},
                                                                              pruned="threads"),)
    r = A.AutotuneResult("sgemm", "sm_90", rows, baselines=("torch",))
    fig = kernellab.autotune_plot(r)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "BM" and [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256"]
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"BK=8", "BK=16", "best: BM=64, BK=8"}
    assert "(1 not timed)" in ax.get_title() and any("torch 1.5 ms" in t.get_text() for t in ax.texts)
    fig2 = kernellab.autotune_plot(r, "BK", ax=fig.axes[0])
    assert fig2 is fig
    with pytest.raises(kernellab.KernellabError, match="not an entry"):
        kernellab.autotune_plot(r, "TM")


# --- grade_many ---------------------------------------------------------------------------------------------------


def grade_by_length(exercise_id, submission):
    """A stand-in grader: a submission passes when it is at least as long as the exercise id asks."""
    if submission == "crash":
        raise RuntimeError("the grader fell over")
    need = int(exercise_id.split("-")[1])
    return types.SimpleNamespace(passed=len(submission) >= need,
                                 findings=() if len(submission) >= need else (f"{len(submission)} < {need}",))


def test_grade_many_gives_one_row_per_submission_here_and_on_a_cluster(dask_client):
    subs = {"ada": "x" * 5, "bob": "xy", "cy": "crash", "dee": "x" * 9}
    here = kernellab.grade_many("ex-4", subs, grade=grade_by_length, progress=False)
    assert [r.submission for r in here.rows] == list(subs)
    assert [r.status for r in here.rows] == ["passed", "failed", "error", "passed"]
    assert here.row("bob").findings == ("2 < 4",) and "fell over" in here.row("cy").error
    assert here.passed == 2 and "ex-4: 2 of 4 passed, 1 could not be graded" in str(here)
    far = kernellab.grade_many("ex-4", list(subs.values()), grade=grade_by_length, progress=False,
                               executor=dask_client.get_executor())
    assert [r.status for r in far.rows] == [r.status for r in here.rows]
    assert {r.worker for r in far.rows} <= set(dask_client.scheduler_info()["workers"])
    assert [r.submission for r in far.rows] == ["0", "1", "2", "3"]


def test_grade_class_grades_the_exercises_with_the_most_checked_elements_first_and_reports_them_as_given():
    """The tutorials' exercises go out by the elements their checks touch (02-transpose-batched's 16 x 2048 x 2049
    before 01-reverse's 4 M before 00-flip's 100 k), an exercise kernellab does not know keeps its place after them;
    the tables come back in the order given, each with its own rows."""
    seen = []

    def record(exercise_id, submission):
        seen.append(exercise_id)
        return types.SimpleNamespace(passed=True, findings=())

    work = {"00-flip": {"a": "x"}, "ex-1": ["y"], "01-reverse": {"b": "x"}, "02-transpose-batched": {"c": "x", "d": "x"}}
    g = kernellab.grade_class(work, grade=record, progress=False)
    assert seen == ["02-transpose-batched", "02-transpose-batched", "01-reverse", "00-flip", "ex-1"], seen
    assert [t.exercise_id for t in g.tables] == list(work)
    assert [[r.submission for r in t.rows] for t in g.tables] == [["a"], ["0"], ["b"], ["c", "d"]]


def test_grade_many_finds_kernellab_teach_by_name():
    import importlib.util

    if importlib.util.find_spec("kernellab.teach") is not None:
        pytest.skip("kernellab.teach is here: its own tests grade through it")
    with pytest.raises(kernellab.KernellabError, match="kernellab.teach provides kernellab.teach.grade"):
        kernellab.grade_many("ex-1", ["a"], progress=False)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:                 # on a worker: a row that says why, not an exception
        table = kernellab.grade_many("ex-1", ["a"], progress=False, executor=ex)
    assert table.rows[0].status == "error" and "kernellab.teach" in table.rows[0].error


def test_the_threads_prune_names_what_limits_the_block(tmp_cache, no_gpu):
    src = r"""
__global__ void __launch_bounds__(BOUND) copy(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x]; }
"""
    configs = [{"BOUND": 128, "THREADS": 256}, {"BOUND": 1024, "THREADS": 2048}, {"BOUND": 256, "THREADS": 256}]
    r = kernellab.autotune(src, configs, kernel="copy", launch=lambda k, c, x, y: k[1, c["THREADS"]](x, y),
                           inputs=lambda g: (torch.zeros(2048), torch.zeros(2048)), progress=False)
    bounded, arch, fits = r.rows
    assert bounded.pruned == "threads: a block of 256 threads, more than the 128 this kernel allows " \
                             "(its __launch_bounds__)"
    assert arch.pruned.endswith("more than the 1024 this kernel allows (sm_90)")
    assert fits.pruned is None and fits.block == (256, 1, 1)


def test_prepare_imports_on_every_dask_worker_first_and_skips_other_executors(dask_client):
    """fanout.prepare runs the imports through Client.run (each worker's main thread) and reports what it did."""
    from concurrent.futures import ThreadPoolExecutor

    from kernellab.run import fanout

    assert fanout.prepare(dask_client.get_executor(), ["json", "no_such_module_for_kernellab"]) is True
    done = dask_client.run(fanout._import_modules, ["json", "no_such_module_for_kernellab"])
    assert done and all(v == ["json"] for v in done.values())          # one answer per worker, the missing one skipped
    with ThreadPoolExecutor(1) as pool:
        assert fanout.prepare(pool) is False


def test_autotune_and_grade_many_prepare_a_dask_executor_before_sending_tasks(monkeypatch):
    """The probe of autotune and grade_many call fanout.prepare on their executor before the first task."""
    from concurrent.futures import ThreadPoolExecutor

    from kernellab.run.measure import autotune as at
    from kernellab.run import fanout
    from kernellab.teach import grading

    order = []
    monkeypatch.setattr(fanout, "prepare", lambda ex, *a: order.append("prepare"))

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, *args, **kw):
            order.append("task")
            return super().submit(fn, *args, **kw)

    with Recording(1) as ex:
        at._probe(ex)
        assert order[:2] == ["prepare", "task"]
        order.clear()
        grading.grade_many("01-vector-add", [None], executor=ex, grade=lambda e, s: None, progress=False)
        assert order and order[0] == "prepare"


# --- NVRTC's own compile cache (CUDA 12.9+) ---------------------------------------------------------------------------

SPILLS = r"""
__global__ void __launch_bounds__(1024, 2) spills(const float* x, float* y, int n) {
    __shared__ float tile[1024];
    float acc[SIZE];
    #pragma unroll
    for (int i = 0; i < SIZE; ++i) acc[i] = x[threadIdx.x * SIZE + i];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    for (int j = 0; j < n; ++j) {
        #pragma unroll
        for (int i = 0; i < SIZE; ++i) acc[i] = acc[i] * tile[(j + i) & 1023] + acc[(i + 1) % SIZE];
    }
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < SIZE; ++i) s += acc[i];
    y[threadIdx.x] = s;
}
"""


@pytest.fixture
def nvrtc_own_cache(monkeypatch):
    """NVRTC as on a GPU host with CUDA 12.9+: it keeps compiled programs in a cache of its own, and a program
    compiled again with the same source and options is a hit there, whose log has no `ptxas info` lines (ptxas did
    not run), unless the compile passed --no-cache. The hits are counted."""
    import ctypes

    from cuda.bindings import nvrtc

    seen, progs, hits = set(), {}, []
    real_create, real_compile, real_log = nvrtc.nvrtcCreateProgram, nvrtc.nvrtcCompileProgram, nvrtc.nvrtcGetProgramLog

    def create(src, name, *rest):
        err, prog = real_create(src, name, *rest)
        progs[int(prog)] = [src]
        return err, prog

    def compile_(prog, n, opts):
        progs[int(prog)].append(tuple(opts))
        return real_compile(prog, n, opts)

    def get_log(prog, buf):
        out = real_log(prog, buf)
        src, opts = progs[int(prog)]
        if b"--no-cache" not in opts:
            if (src, opts) in seen:                              # a hit in NVRTC's cache: no ptxas output
                hits.append(src)
                text = b"\n".join(l for l in bytes(buf).split(b"\n") if not l.startswith(b"ptxas"))
                ctypes.memmove(ctypes.c_char_p(buf), text.ljust(len(buf), b"\0"), len(buf))
            seen.add((src, opts))
        return out

    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", create)
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", compile_)
    monkeypatch.setattr(nvrtc, "nvrtcGetProgramLog", get_log)
    return hits


def test_resources_and_the_spill_prune_are_the_same_on_a_cold_and_a_warm_cache(tmp_cache, nvrtc_own_cache,
                                                                                 monkeypatch):
    """Seen on an H200 host (CUDA 13): a second autotune of the same configurations, in new processes with
    kernellab's cache off, compiled every configuration again and NVRTC answered from its own cache, with no ptxas
    report: every row had 0 B of shared memory and no spills, and the spilling configurations were timed. kernellab
    keeps its own cache of the whole compile (log and reports) and turns NVRTC's off (--no-cache); the resources and
    the spill prune are the same each time, with kernellab's cache cold, warm on disk, or off."""
    import concurrent.futures

    from kernellab.compile import cache

    configs = [{"SIZE": 8}, {"SIZE": 96}]
    runs = []
    for state in ("cold", "disk", "off"):
        cache.clear_memory()
        if state == "off":
            monkeypatch.setenv("KERNELLAB_CACHE", "0")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:      # the compiles in this process (the stand-in)
            r = kernellab.autotune(SPILLS, configs, kernel="spills", arch="sm_90", cache=False, progress=False,
                               executor=pool, launch=lambda k, c, x, y: k[1, 256](x, y, 64), inputs=lambda g: (None, None))
        runs.append([(row.registers, row.shared_bytes, row.local_bytes, row.spill_bytes, row.pruned)
                     for row in r.rows])
    assert runs[0][0][1] == 4096 and runs[0][0][3] == 0 and runs[0][0][4] is None          # 1024 floats, no spills
    assert runs[0][1][3] > 0 and runs[0][1][4].startswith("spills:"), runs[0]               # pruned for its spills
    assert runs[1] == runs[0] and runs[2] == runs[0]
    assert not nvrtc_own_cache                                  # NVRTC was never asked for a cached program


def test_without_a_ptxas_report_the_cubin_gives_shared_memory_and_the_absence_is_explicit():
    """A compile whose log has no ptxas report for a kernel: registers and static shared memory come from the cubin
    (its .nv.shared section less the 1 KiB the system reserves on sm_80+), and the resources say the stack frame and
    spills are unknown instead of a silent 0."""
    import dataclasses

    from kernellab.compile.nvrtc import compile_source

    out = compile_source(SPILLS, "sm_90", ("-DSIZE=8",))
    full = kernellab.Module(out, SPILLS, name=None, first_line=1, filename="kernel.cu", cache_state="miss",
                            wall_ms=0.0).kernels[0].resources
    bare = dataclasses.replace(out, reports={})
    res = kernellab.Module(bare, SPILLS, name=None, first_line=1, filename="kernel.cu", cache_state="miss",
                           wall_ms=0.0).kernels[0].resources
    assert full.ptxas_report and full.shared_bytes == 4096
    assert not res.ptxas_report and res.shared_bytes == full.shared_bytes and res.registers == full.registers
    assert "unknown" in str(res) and "unknown" not in str(full)


def test_lanes_are_one_worker_per_gpu_only_where_workers_share_a_gpu():
    """autotune's timing lanes on a Dask pool: the lowest address on each GPU where some GPU has several workers;
    none where each worker has its own GPU or none has one, or where the workers cannot answer."""
    from kernellab.run.measure.autotune import Where, _lanes

    def pool(answers):
        class Client:
            def run_on_scheduler(self, *a, **k):
                return {}

            def run(self, fn):
                if isinstance(answers, Exception):
                    raise answers
                return answers
        return types.SimpleNamespace(_client=Client())

    def gpu(bus):
        return Where(True, "1 GPU(s)", "H200", "sm_90", f"H200 [host {bus}]")

    shared = {"tcp://h:5": gpu("0000:06"), "tcp://h:2": gpu("0000:06"), "tcp://h:9": gpu("0000:07"),
              "tcp://h:3": gpu("0000:07"), "tcp://h:4": Where(False, "no GPU")}
    assert _lanes(pool(shared)) == ("tcp://h:2", "tcp://h:3")
    assert _lanes(pool({"tcp://h:5": gpu("0000:06"), "tcp://h:2": gpu("0000:07")})) == ()
    assert _lanes(pool({"tcp://h:5": Where(False, "no GPU"), "tcp://h:2": Where(False, "no GPU")})) == ()
    assert _lanes(pool(OSError("a worker died"))) == ()
