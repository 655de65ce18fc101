"""wgmma on the CPU runtime's fibers (kernellab/run/sim/cuda/hopper.h), through emulate(): one m64n8k16 product from
shared memory (no-swizzle descriptors) against float64, and the rules of the asynchronous accumulators: between issue
and wgmma.wait_group they read as NaN, and a write to them there is an error."""
import numpy as np
import pytest

from kernellab.run.sim.cuda.emulate import EmulationError, bf16_bits, bf16_values, compiler, emulate

pytestmark = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler for the emulation")

SOURCE = r"""
template <int N, typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Offset of element (row, k) of a K-major tile in core matrices of 8 rows x 16 bytes: K neighbours 128 bytes apart
// (LBO), the next 8 rows 256 bytes further (SBO).
__device__ unsigned core_offset(int row, int k) {
    return (row / 8) * 256 + (k / 8) * 128 + (row % 8) * 16 + (k % 8) * 2;
}
__device__ unsigned long long desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16) |
           ((unsigned long long)(256 >> 4) << 32);
}

// D (64 x 8, f32) = A (64 x 16) B^T (B: 8 x 16), bf16, by one warpgroup. mode 1: each thread reads d[0] between issue
// and wait into early[]; mode 2: it writes d[1] there.
extern "C" __global__ void one_wgmma(const unsigned short* A, const unsigned short* B, float* D, float* early,
                                     int mode) {
    extern __shared__ __align__(16) unsigned short smem[];      // (a descriptor holds 18 address bits)
    unsigned short* a_s = smem;
    unsigned short* b_s = smem + 64 * 16;
    const int t = threadIdx.x;
    for (int i = t; i < 64 * 16; i += 128) a_s[core_offset(i / 16, i % 16) / 2] = A[i];
    if (t < 8 * 16) b_s[core_offset(t / 16, t % 16) / 2] = B[t];
    __syncthreads();
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    wgmma_fence();
    wgmma_ss<8, __nv_bfloat16>(d, desc((unsigned)__cvta_generic_to_shared(a_s)),
                               desc((unsigned)__cvta_generic_to_shared(b_s)), 1);
    wgmma_commit();
    if (mode == 1) early[t] = d[0];
    if (mode == 2) d[1] = 1.0f;
    wgmma_wait<0>();
    const int warp = t / 32, lane = t % 32;
    for (int q = 0; q < 4; ++q)
        D[(16 * warp + lane / 4 + (q >= 2 ? 8 : 0)) * 8 + 2 * (lane % 4) + (q & 1)] = d[q];
}
"""


SMEM = (64 * 16 + 8 * 16) * 2


def case():
    rng = np.random.default_rng(3)
    A, B = bf16_bits(rng.standard_normal((64, 16))), bf16_bits(rng.standard_normal((8, 16)))
    ref = bf16_values(A).astype(np.float64) @ bf16_values(B).astype(np.float64).T
    return A, B, ref


def test_one_wgmma_from_shared_memory_matches_float64():
    A, B, ref = case()
    D, early = np.full((64, 8), np.nan, np.float32), np.zeros(128, np.float32)
    emulate(SOURCE, "one_wgmma", (1,), (128,), [A, B, D, early, 0], SMEM)
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-5)


def test_wgmma_accumulators_read_before_the_wait_are_nan():
    A, B, ref = case()
    D, early = np.full((64, 8), np.nan, np.float32), np.zeros(128, np.float32)
    emulate(SOURCE, "one_wgmma", (1,), (128,), [A, B, D, early, 1], SMEM)
    assert np.isnan(early).all(), f"{(~np.isnan(early)).sum()} threads read a value before wgmma.wait_group"
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-5)       # and the wait still delivers the product


def test_wgmma_accumulators_written_in_flight_are_an_error():
    A, B, _ = case()
    with pytest.raises(EmulationError, match="accumulator registers written while the wgmma was in flight"):
        emulate(SOURCE, "one_wgmma", (1,), (128,), [A, B, np.zeros((64, 8), np.float32), np.zeros(128, np.float32), 2],
                 SMEM)
