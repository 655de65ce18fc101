"""Hostile submissions on a real GPU: each attack of docs/GRADING.md's threat model whose defence needs a device
(freed CUDA memory, side streams, persisting L2, library kernels, compute-sanitizer) is rejected with a finding that
names it, and the honest version beside it passes."""
import ctypes
import threading
import time

import pytest

import kernellab
from kernellab.run.measure.bench import bench
from kernellab.run.measure.check import check
from kernellab.run.measure.integrity import L2Persistence, library_kernels, profiled_kernels

pytestmark = pytest.mark.gpu

QUICK = dict(warmup_ms=5, rep_ms=30, rounds=3)

WRITES_NOTHING = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && c == nullptr) c[i] = a[i] + b[i];     // never true: c is left as torch.empty found it
}
extern "C" __global__ void vadd_ok(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void zero_input(float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { c[i] = a[i] * b[i]; a[i] = 0.0f; }
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(WRITES_NOTHING)


def vectors(torch, n=1_000_003):
    return lambda g: (torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda())


def launcher(k):
    import torch

    def run(a, b):
        c = torch.empty_like(a)
        n = a.numel()
        k[(n + 255) // 256, 256](a, b, c, n)
        return c
    return run


# --- 1, 2: stale memory and input mutation (check) --------------------------------------------------------------------


def test_a_kernel_that_writes_nothing_into_torch_empty_is_stale_output(torch, mod):
    r = check(launcher(mod["vadd"]), torch.add, vectors(torch))
    assert not r.passed and r.finding == "stale_output", str(r)
    assert r.free_memory_filled_bytes > 0
    assert check(launcher(mod["vadd_ok"]), torch.add, vectors(torch)).passed


def test_a_kernel_that_zeroes_its_input_is_input_mutated(torch, mod):
    r = check(launcher(mod["zero_input"]), torch.mul, vectors(torch))
    assert not r.passed and r.finding == "input_mutated", str(r)


# --- 3: work on another stream, or on a thread (bench) ----------------------------------------------------------------


def matrices(torch, n=2048):
    return lambda g: (torch.randn(n, n, generator=g).cuda(), torch.randn(n, n, generator=g).cuda())


def test_a_matmul_on_a_side_stream_is_other_stream(torch):
    side = torch.cuda.Stream()

    def hidden(a, b):
        with torch.cuda.stream(side):          # never joined back: the timed stream sees nothing
            return a @ b

    r = bench(hidden, matrices(torch), **QUICK)
    assert "other_stream" in [f.kind for f in r.findings], str(r)
    honest = bench(lambda a, b: a @ b, matrices(torch), **QUICK)
    assert honest.trusted, str(honest)


def test_a_kernel_launched_from_a_thread_is_background_thread(torch):
    threads = []

    def later(a, b):
        out = torch.empty_like(a)
        t = threading.Thread(target=lambda: (time.sleep(0.3), torch.matmul(a, b, out=out)), name="late-launch")
        t.start()
        threads.append(t)
        return out

    r = bench(later, matrices(torch), **QUICK)
    for t in threads:
        t.join()
    assert "background_thread" in [f.kind for f in r.findings], str(r)


# --- 5, 6: caching and patched timers (bench) -------------------------------------------------------------------------


def test_a_result_cached_by_pointer_is_cached_result(torch):
    cache = {}

    def by_pointer(a, b):
        key = (a.data_ptr(), b.data_ptr())
        if key not in cache:
            cache[key] = a @ b
        return cache[key]

    r = bench(by_pointer, matrices(torch, 1024), reference=lambda a, b: a @ b, **QUICK)
    assert "cached_result" in [f.kind for f in r.findings], str(r)


def test_patched_cuda_events_are_timer_patched_and_undone(torch):
    real = torch.cuda.Event.elapsed_time

    def patches(a, b):
        torch.cuda.Event.elapsed_time = lambda self, end: 1e-4
        return a @ b

    try:
        r = bench(patches, matrices(torch, 1024), **QUICK)
        assert "timer_patched" in [f.kind for f in r.findings], str(r)
        assert torch.cuda.Event.elapsed_time is real
    finally:
        torch.cuda.Event.elapsed_time = real


# --- 7: persisting L2 ------------------------------------------------------------------------------------------------


def test_a_persisting_l2_window_is_l2_persistence_and_reset(torch):
    from kernellab.run.measure.integrity import _StreamAttrValue

    lib = ctypes.CDLL("libcuda.so.1")
    l2 = L2Persistence()

    def persists(a, b):
        stream = torch.cuda.current_stream().cuda_stream
        lib.cuCtxSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(16 * 2**20))     # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
        value = _StreamAttrValue()
        w = value.accessPolicyWindow
        w.base_ptr, w.num_bytes, w.hitRatio, w.hitProp, w.missProp = a.data_ptr(), 16 * 2**20, 1.0, 2, 1
        lib.cuStreamSetAttribute(ctypes.c_void_p(stream), ctypes.c_int(1), ctypes.byref(value))
        return a + b

    r = bench(persists, vectors(torch, 4 * 2**20), **QUICK)
    assert "l2_persistence" in [f.kind for f in r.findings], str(r)
    assert l2.state(torch.cuda.current_stream().cuda_stream) == (0, 0)
    assert bench(lambda a, b: a + b, vectors(torch, 4 * 2**20), **QUICK).trusted


# --- 9, 10: lower precision and library calls (check, strict) ---------------------------------------------------------


def test_tf32_for_an_fp32_matmul_is_low_precision(torch):
    def tf32(a, b):
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old

    inputs = matrices(torch, 1031)
    r = check(tf32, torch.matmul, inputs, rtol=2e-2, atol=2e-2, strict=True, allowed_ops=("mm", "library"),
              distributions=("given",))
    assert not r.passed and r.finding == "low_precision", str(r)


def test_a_cublas_call_is_library_call_by_op_and_by_kernel_name(torch):
    r = check(lambda a, b: torch.matmul(a, b), torch.matmul, matrices(torch, 513), strict=True)
    assert not r.passed and r.finding == "library_call", str(r)
    a, b = matrices(torch, 513)(torch.Generator().manual_seed(0))
    assert library_kernels(profiled_kernels(lambda: a @ b)), profiled_kernels(lambda: a @ b)


def test_a_kernellab_kernel_launches_no_library_kernel(torch, mod):
    a, b = vectors(torch)(torch.Generator().manual_seed(0))
    names = profiled_kernels(lambda: launcher(mod["vadd_ok"])(a, b))
    assert not library_kernels(names), names


# --- 11: reads of memory never written (the grader) -------------------------------------------------------------------

READS_PAST_THE_END = r"""
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[n - 1 - i] + 0.0f * in[i + 64];   // reads up to 64 floats past the end
}
"""

READS_ITS_OUTPUT = r"""
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (out[i] != out[i]) ? in[n - 1 - i] : out[i];   // right only where out held NaN
}
"""


def _reverse(src):
    from kernellab.teach import exercise

    return kernellab.compile_cuda(src, arch=exercise("01-reverse").arch, first_line=2)["reverse"]


def test_reads_past_the_end_are_caught_by_a_sanitizer():
    r = kernellab.grade("01-reverse", _reverse(READS_PAST_THE_END), speed=False)
    kinds = [f.kind for f in r.findings]
    assert not r.passed and {"uninitialized", "out_of_bounds"} & set(kinds), str(r)


def test_a_kernel_right_only_on_the_nan_fill_is_nondeterministic():
    r = kernellab.grade("01-reverse", _reverse(READS_ITS_OUTPUT), speed=False)
    assert not r.passed and "nondeterministic" in [f.kind for f in r.findings], str(r)


# --- 12: impossible speed -------------------------------------------------------------------------------------------


def test_a_declared_byte_count_beyond_the_roofline_is_impossible_speed(torch):
    x = lambda g: (torch.randn(2**24, generator=g).cuda(),)  # noqa: E731
    honest = bench(lambda t: t * 2, x, bytes=2 * 4 * 2**24, **QUICK)
    assert honest.trusted and honest.roofline_floor_ms < honest.median_ms, str(honest)
    inflated = bench(lambda t: t * 2, x, bytes=100 * 4 * 2**24, **QUICK)      # claims 50x the bytes it moves
    assert "impossible_speed" in [f.kind for f in inflated.findings], str(inflated)
    assert not inflated.trusted



def test_torch_ops_on_a_side_stream_are_other_stream_in_a_strict_check(torch):
    side = torch.cuda.Stream()

    def hidden(a, b):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = (a[:, :, None] * b[None]).sum(1)
        torch.cuda.current_stream().wait_stream(side)
        return out

    r = check(hidden, torch.matmul, matrices(torch, 129), strict=True)
    assert not r.passed and r.finding == "other_stream", str(r)


# --- 5 in the grader: a kernel that computes only on its first launch at the timed size ------------------------------

FIRST_LAUNCH_ONLY = r"""
__device__ unsigned int launches;                      // kept across launches: the cheat
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= (1 << 24) && launches > 1) return;        // at the speed bar's size, skip the work after two launches
    if (t == 0) atomicAdd(&launches, 1u);
    if (4 * t + 3 < n) {
        float4 x = reinterpret_cast<const float4*>(a)[t];
        float4 y = reinterpret_cast<const float4*>(b)[t];
        reinterpret_cast<float4*>(c)[t] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else if (t == n / 4) {
        for (int i = 4 * t; i < n; ++i) c[i] = a[i] + b[i];
    }
}
"""


def test_a_kernel_that_skips_its_work_after_the_first_launches_is_never_ranked():
    from kernellab.teach import exercise

    k = kernellab.compile_cuda(FIRST_LAUNCH_ONLY, arch=exercise("01-vadd4").arch, first_line=2)["vadd4"]
    r = kernellab.grade("01-vadd4", k)
    kinds = [f.kind for f in r.findings]
    assert not r.passed and "cached_result" in kinds and r.speed is None, str(r)
