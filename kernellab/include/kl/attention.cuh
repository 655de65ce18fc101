// kl/attention.cuh: one consumer warpgroup's step over one K/V tile of Hopper attention (tutorial 07, steps 3 and 3b):
// S = Q K^T on the tensor cores, the causal and key-range mask, the online softmax with lazy rescaling, P rounded to
// 16 bits in registers, and O += P V. The kernels around it (one block per query block, or persistent) differ only in
// how they feed it: which Q buffer, which K/V stage and phase.
//
// A warpgroup (128 threads, 4 warps) owns 64 query rows; warp w of it rows 16 w .. 16 w + 15, and lane (g = lane / 4,
// t = lane % 4) rows g and g + 8 of those, as in mma.sync. Its state, carried by the caller from tile to tile:
//     float o[kD / 2];   O (64 x kD, fp32): o[4 e + 0..1] row g, o[4 e + 2..3] row g + 8, columns 8 e + 2 t, + 1
//     m0, m1             the running max of rows g and g + 8, in log2 units (scores x scale x log2 e), -inf at first
//     l0, l1             their running sums of exp2(score - m) over this lane's columns (the quad adds them up at the end)
// Shared memory holds the tiles as TMA writes them with the 128-byte swizzle: 64-column boxes of 128-byte rows.
#pragma once
#include "tma.cuh"     // mbar_wait, mbar_arrive, sw128_desc
#include "wgmma.cuh"   // wgmma_ss, wgmma_rs_tb, wgmma_fence/commit/wait; pack2<T>
#ifndef CUDART_INF_F
#include <math_constants.h>   // CUDART_INF_F (the CPU emulator defines its own)
#endif

#ifdef __CUDA_ARCH__
// 2^x as one MUFU.EX2 (ex2.approx.ftz); exp2(-inf) = 0. (On the CPU the emulator's exp2_approx is std::exp2.)
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif

// One K/V tile of keys kv0 .. kv0 + kBN - 1 for the warpgroup `wg_c` (0, 1, ...) of a block of kBM query rows from q0:
//   q_tile   its block's Q in shared memory: [kD / 64 boxes][kBM rows][64], the warpgroup's rows at 64 wg_c
//   k_tile, v_tile   the stage's K and V: [kD / 64 boxes][kBN keys][64]
//   full_k, full_v   the stage's barriers the producer's copies complete (phase `phase`); empty: one arrival per warp
//                    when this warpgroup is done with the stage
//   after_scores()   called once S = Q K^T is in registers (the last read of Q and K), before the softmax
// Scores are scaled by scale_log2 (softmax scale x log2 e); m moves only when a tile's max exceeds it by rescale_log2
// (lazy rescaling: O and l are rescaled then, and only in warps where some row's max moved).
template <typename T, int kD, int kBN, int kBM, bool kCausal, typename AfterScores>
__device__ __forceinline__ void wg_attention_tile(float (&o)[kD / 2], float& m0, float& m1, float& l0, float& l1,
                                                  unsigned q_tile, unsigned k_tile, unsigned v_tile, unsigned full_k,
                                                  unsigned full_v, unsigned empty, unsigned phase, int wg_c, int q0,
                                                  int row0,
                                                  int kv0, int n_keys, float scale_log2, float rescale_log2,
                                                  AfterScores after_scores) {
    const int lane = threadIdx.x % 32, t = lane % 4, row1 = row0 + 8;

    // S = Q K^T on the tensor cores: kD / 16 wgmmas of m64 n kBN k16, both operands K-major in shared memory.
    float sacc[kBN / 2];
    mbar_wait(full_k, phase);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        const unsigned long long da = sw128_desc(q_tile + (kk / 4) * kBM * 128 + 64 * wg_c * 128 + (kk % 4) * 32, 16, 1024);
        const unsigned long long db = sw128_desc(k_tile + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
        wgmma_ss<kBN, T>(sacc, da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    after_scores();

    if (kv0 + kBN > n_keys || (kCausal && kv0 + kBN - 1 > q0 + 64 * wg_c)) {
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i) {
            const int key = kv0 + 8 * (i / 4) + 2 * t + (i & 1);
            const int row = (i & 2) ? row1 : row0;
            if (key >= n_keys || (kCausal && key > row)) sacc[i] = -CUDART_INF_F;
        }
    }
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kBN / 2; i += 4) {
        mx0 = fmaxf(mx0, fmaxf(sacc[i], sacc[i + 1]));
        mx1 = fmaxf(mx1, fmaxf(sacc[i + 2], sacc[i + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Lazy rescaling (see tutorial 07's mma.sync kernel): m moves only when the tile's max exceeds it by rescale_log2.
    mx0 *= scale_log2; mx1 *= scale_log2;
    const bool up0 = mx0 > m0 + rescale_log2, up1 = mx1 > m1 + rescale_log2;
    const float mn0 = up0 ? mx0 : m0, mn1 = up1 ? mx1 : m1;
    const float alpha0 = up0 ? exp2_approx(m0 - mn0) : 1.f, alpha1 = up1 ? exp2_approx(m1 - mn1) : 1.f;
    const float ref0 = mn0 == -CUDART_INF_F ? 0.f : mn0, ref1 = mn1 == -CUDART_INF_F ? 0.f : mn1;
    m0 = mn0; m1 = mn1;
    l0 *= alpha0; l1 *= alpha1;
    if (__any_sync(0xffffffffu, up0 || up1)) {
#pragma unroll
        for (int i = 0; i < kD / 2; i += 4) { o[i] *= alpha0; o[i + 1] *= alpha0; o[i + 2] *= alpha1; o[i + 3] *= alpha1; }
    }
    unsigned p[kBN / 16][4];                  // P as wgmma A fragments, 16 keys each (same layout as mma.sync's)
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 8 * kc + 4 * h;
            const float p0 = exp2_approx(fmaf(sacc[i], scale_log2, -ref0));
            const float p1 = exp2_approx(fmaf(sacc[i + 1], scale_log2, -ref0));
            const float p2 = exp2_approx(fmaf(sacc[i + 2], scale_log2, -ref1));
            const float p3 = exp2_approx(fmaf(sacc[i + 3], scale_log2, -ref1));
            l0 += p0 + p1; l1 += p2 + p3;
            p[kc][2 * h] = pack2<T>(p0, p1);
            p[kc][2 * h + 1] = pack2<T>(p2, p3);
        }
    }

    // O += P V: A from registers, B = V read N-major (transposed) from its [kBN keys][64 dims] boxes.
    mbar_wait(full_v, phase);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
        const unsigned long long dv = sw128_desc(v_tile + kc * 16 * 128, kBN * 128, 1024);
        wgmma_rs_tb<kD, T>(o, p[kc], dv);
    }
    wgmma_commit();
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty);
}
