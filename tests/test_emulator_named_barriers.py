"""Two features of the CPU emulator (kernellab/run/sim/cuda/hopper.h) that Hopper epilogues need: named barriers (bar.sync /
bar.arrive with a thread count) and TMA stores (cp.async.bulk.tensor from shared to global memory); and the mistakes
they invite that the emulator reports: a bar.arrive nobody waits for, a staging box rewritten before its store read
it, a store never waited for."""
import numpy as np
import pytest

from kernellab.run.sim.cuda.emulate import EmulationError, TensorMap, emulate

# --- the emulator's named barriers and TMA stores -------------------------------------------------------------------

EXT = r"""
#include <cuda.h>
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Warp 0 hands `rounds` values to warp 1 through one smem word: barrier 1 says "written", barrier 2 "read".
extern "C" __global__ void handoff(int* out, int rounds, int unmatched) {
    __shared__ int box[1];
    const int warp = threadIdx.x / 32;
    for (int r = 0; r < rounds; ++r) {
        if (warp == 0) {
            if (r > 0) named_bar_sync(2, 64);
            for (volatile int spin = 0; spin < 20000; ++spin) {}      // late: a consumer that does not wait reads early
            if (threadIdx.x == 0) box[0] = 100 + r;
            named_bar_arrive(1, 64);
        } else {
            named_bar_sync(1, 64);
            if (threadIdx.x == 32) out[r] = box[0];
            if (r + 1 < rounds || unmatched) named_bar_arrive(2, 64);
        }
    }
}

// Thread t writes box element (r, e) = 64 r + e at its 128-byte-swizzled place; thread 0 stores the 64 x 64 box at
// column c0, row c1 of C. rewrite: thread 0 changes the box before waiting; exit_early: it never waits.
extern "C" __global__ void box_store(const __grid_constant__ CUtensorMap tm, unsigned short* C, int c0, int c1,
                                     int rewrite, int exit_early) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(smem), base = (smem0 + 1023) & ~1023u;
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
        const int r = i / 64, e = i % 64;
        const unsigned a = base + r * 128 + e * 2, sw = a ^ (((a >> 7) & 7) << 4);
        *reinterpret_cast<unsigned short*>(smem + (sw - smem0)) = (unsigned short)(64 * r + e);
    }
    fence_proxy_async();
    __syncthreads();
    if (threadIdx.x == 0) {
        tma_store_2d(&tm, base, c0, c1);
        tma_store_commit();
        if (exit_early) return;
        if (rewrite) *reinterpret_cast<unsigned short*>(smem + (base - smem0)) = 7;
        tma_store_wait_read<0>();
    }
}
"""


def test_named_barriers_order_two_warps_in_the_emulator():
    out = np.zeros(5, np.int32)
    emulate(EXT, "handoff", (1,), (64,), [out, 5, 0])
    assert out.tolist() == [100, 101, 102, 103, 104]


def test_an_unmatched_bar_arrive_is_reported():
    with pytest.raises(EmulationError, match="named barrier 2 .* still holds 32 of 64 arrivals"):
        emulate(EXT, "handoff", (1,), (64,), [np.zeros(2, np.int32), 2, 1])


def test_tma_store_writes_the_swizzled_box_clipped_at_the_edges():
    C = np.zeros((70, 90), np.uint16)
    emulate(EXT, "box_store", (1,), (128,), [TensorMap(C, 64, 64), C, 32, 40, 0, 0], 64 * 128 + 1024)
    want = np.zeros_like(C)
    r, e = np.meshgrid(np.arange(30), np.arange(58), indexing="ij")    # rows 40-69, columns 32-89 lie inside C
    want[40:, 32:] = 64 * r + e
    assert np.array_equal(C, want)


@pytest.mark.parametrize("rewrite,exit_early,message", [
    (1, 0, "smem source changed between the store's issue and its wait_group.read"),
    (0, 1, "TMA stores never waited for")])
def test_tma_store_races_are_reported(rewrite, exit_early, message):
    C = np.zeros((64, 64), np.uint16)
    with pytest.raises(EmulationError, match=message):
        emulate(EXT, "box_store", (1,), (128,), [TensorMap(C, 64, 64), C, 0, 0, rewrite, exit_early],
                64 * 128 + 1024)
