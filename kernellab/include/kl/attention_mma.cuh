// kl/attention_mma.cuh: a warp's part of attention on mma.sync (tutorial 07's step 2, tutorial 09's GQA and decoding
// kernels), one tile of keys at a time: S = Q K^T, then the online softmax with lazy rescaling, P rounded to 16 bits in
// registers and O += P V, with the Q, K and V tiles in shared memory in the XOR-swizzled layout below.
//
// A warp owns kMT m16 tiles of query rows; lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 of each, as the
// mma.sync accumulators lay them out (kl/mma.cuh). Its registers, for a tile of kNB * 8 keys and a head dim of kDB * 8:
//     float s[kMT][kNB][4]  the tile's scores (unscaled; -inf where masked): s[mt][nb][0..1] row 16 mt + g, keys
//                           8 nb + 2 t, + 1; s[mt][nb][2..3] row 16 mt + g + 8
//     float o[kMT][kDB][4]  O, fp32, in the same layout over the head dim (columns 8 db + 2 t, + 1)
//     float m[kMT][2]       the running max of rows g and g + 8 (h = 0, 1), in log2 units (score x scale x log2 e),
//                           -inf at first
//     float l[kMT][2]       their running sums of exp2(score - m) over this lane's columns (the quad's 4 lanes add
//                           theirs up at the end)
#pragma once
#include "mma.cuh"   // ldmatrix_x4_trans, mma_16816<T>; pack2<T>
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

// The output's 1 / l of a row: its lanes' sums of exp2 added up over the quad (the 4 lanes t of the row, in `sum`),
// inverted; 0 for a row that saw no key (sum 0), so that its O is written as zeros.
__device__ __forceinline__ float quad_sum_inv(float l, float& sum) {
    sum = l;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    return sum > 0.f ? 1.f / sum : 0.f;
}
__device__ __forceinline__ float quad_sum_inv(float l) {
    float sum;
    return quad_sum_inv(l, sum);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows, kD] tile of 16-bit values, XOR-swizzled (kD >= 64):
// the 8 rows an ldmatrix phase reads at one logical chunk sit in 8 different 16-byte bank groups (no conflict).
template <int kD> __device__ __forceinline__ unsigned swz(int row, int chunk) {
    return row * (kD * 2) + ((chunk ^ (row & 7)) << 4);
}

// This lane's parts of the ldmatrix addresses that scores_qk and softmax_pv take, for swizzled (swz) Q, K and V tiles
// with a head dim of kKC * 16. Every row an ldmatrix lane points at has row & 7 == lane & 7 (tiles start at multiples
// of 8 rows), so the swizzled chunk depends only on the lane and the loop counters, and the rest is a compile-time
// offset: swz<kKC * 16>(row0 + r, c) == row0 * kKC * 32 + the lane's row offset + the lane's column offset.
//   k_col[kc]  K: chunk 2 kc + (lane / 8) % 2          k_row   K: key (lane & 7) + 8 (lane / 16) (n-block 0)
//   q_col[kc]  Q: chunk 2 kc + lane / 16               qv_row  Q: row lane & 15 (m-tile 0); V: key lane & 15
//   v_col[kc]  V: chunk db + lane / 16, db = 2 kc       (byte offsets; rows kKC * 32 bytes apart)
template <int kKC>
__device__ __forceinline__ void ldmatrix_offsets(int lane, unsigned (&k_col)[kKC], unsigned (&q_col)[kKC],
                                                 unsigned (&v_col)[kKC], unsigned& k_row, unsigned& qv_row) {
    constexpr int kRowBytes = kKC * 32;
    const int x = lane & 7;
#pragma unroll
    for (int kc = 0; kc < kKC; ++kc) {
        k_col[kc] = ((2 * kc + ((lane >> 3) & 1)) ^ x) << 4;
        q_col[kc] = ((2 * kc + (lane >> 4)) ^ x) << 4;
        v_col[kc] = ((2 * kc + (lane >> 4)) ^ x) << 4;
    }
    k_row = ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes;
    qv_row = (lane & 15) * kRowBytes;
}

// S = Q K^T for one tile of keys: s (zeroed first) gets the warp's kMT m16 row tiles of Q times keys 8 nb .. 8 nb + 7
// (nb < kNB), over kKC chunks of 16 along the head dim. Tiles are swizzled [rows, kKC * 16] (swz), 16-bit. K's B
// fragments come through ldmatrix, two n8 blocks an x4; Q's A fragments are either held in registers for the whole
// kernel (kQInRegs: qf[mt][kc], loaded by the caller) or re-read from the Q tile into qf[mt][0] each chunk (fewer
// registers at a large head dim).
//   q_tile, row0  the Q tile's shared address and the warp's first row in it (m-tile mt: rows row0 + 16 mt ..)
//   qv_row        (lane & 15) * kKC * 32: this lane's ldmatrix row, as a byte offset
//   q_col[kc]     this lane's swizzled byte offset of chunk 2 kc + lane / 16
//   k_base        the K tile's shared address + ((lane & 7) + 8 (lane / 16)) * kKC * 32 (this lane's key, n-block 0)
//   k_col[kc]     this lane's swizzled byte offset of chunk 2 kc + (lane / 8) % 2
template <typename T, int kMT, int kNB, int kKC, bool kQInRegs>
__device__ __forceinline__ void scores_qk(float (&s)[kMT][kNB][4], unsigned (&qf)[kMT][kQInRegs ? kKC : 1][4],
                                          unsigned q_tile, int row0, unsigned qv_row, const unsigned (&q_col)[kKC],
                                          unsigned k_base, const unsigned (&k_col)[kKC]) {
    constexpr int kRowBytes = kKC * 32;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) s[mt][nb][0] = s[mt][nb][1] = s[mt][nb][2] = s[mt][nb][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < kKC; ++kc) {
        if (!kQInRegs) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
                ldmatrix_x4(qf[mt][0], q_tile + (row0 + 16 * mt) * kRowBytes + qv_row + q_col[kc]);
        }
#pragma unroll
        for (int nb = 0; nb < kNB; nb += 2) {
            unsigned b[4];
            ldmatrix_x4(b, k_base + 8 * nb * kRowBytes + k_col[kc]);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<T>(s[mt][nb], qf[mt][kQInRegs ? kc : 0], b[0], b[1]);
                mma_16816<T>(s[mt][nb + 1], qf[mt][kQInRegs ? kc : 0], b[2], b[3]);
            }
        }
    }
}

// A warp's registers before its first tile: O = 0, m = -inf (no key seen), l = 0.
template <int kMT, int kDB>
__device__ __forceinline__ void init_oml(float (&o)[kMT][kDB][4], float (&m)[kMT][2], float (&l)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int e = 0; e < kDB; ++e) o[mt][e][0] = o[mt][e][1] = o[mt][e][2] = o[mt][e][3] = 0.f;
        m[mt][0] = m[mt][1] = -CUDART_INF_F, l[mt][0] = l[mt][1] = 0.f;
    }
}

// One tile of keys after S = Q K^T: the online softmax of the scores s, then O += P V (registers as above).
// Lazy rescaling: a row's running max m moves only when a score exceeds it by more than rescale_log2 (so
// p = exp2(s - m) <= 2^rescale_log2, harmless in fp32 and in P's 16 bits); O and l are then rescaled, and the warp
// skips the O *= alpha multiplies when no row of it moved. masked: some scores may be -inf, so a row may have seen no
// key yet (m = -inf: exp2 then subtracts 0, and its p are 0).
// P = exp2(s scale_log2 - m) goes 16 keys at a time straight into O += P V as the A operand (keys 16 kc + 0..7 are
// a0 (row g) / a1 (row g + 8), keys 16 kc + 8..15 a2 / a3); V^T's B fragments come through ldmatrix.trans from the
// swizzled [kNB * 8 keys, kDB * 8] V tile:
//   v_base        the tile's shared address + (lane & 15) * kDB * 16 (this lane's ldmatrix row, key 16 kc + lane & 15)
//   v_col[db/2]   this lane's swizzled byte offset of chunk db + lane / 16 (db = 0, 2, ...) in that row
template <typename T, int kMT, int kNB, int kDB>
__device__ __forceinline__ void softmax_pv(const float (&s)[kMT][kNB][4], float (&o)[kMT][kDB][4], float (&m)[kMT][2],
                                           float (&l)[kMT][2], bool masked, float scale_log2, float rescale_log2,
                                           unsigned v_base, const unsigned (&v_col)[kDB / 2]) {
    float ref[kMT][2];                      // what exp2 subtracts: the running max, or 0 for a row with no key yet
    float alpha[kMT][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -CUDART_INF_F;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx *= scale_log2;
            const bool up = mx > m[mt][h] + rescale_log2;         // false for -inf > -inf: masked rows stay put
            const float mn = up ? mx : m[mt][h];
            alpha[mt][h] = up ? exp2_approx(m[mt][h] - mn) : 1.f;  // exp2(-inf) = 0 on a row's first keys
            moved |= up;
            m[mt][h] = mn;
            ref[mt][h] = (!masked || mn != -CUDART_INF_F) ? mn : 0.f;
            l[mt][h] *= alpha[mt][h];
        }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int e = 0; e < kDB; ++e) {
                o[mt][e][0] *= alpha[mt][0]; o[mt][e][1] *= alpha[mt][0];
                o[mt][e][2] *= alpha[mt][1]; o[mt][e][3] *= alpha[mt][1];
            }
    }
#pragma unroll
    for (int kc = 0; kc < kNB / 2; ++kc) {
        unsigned pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int nb = 2 * kc + h;
                const float p0 = exp2_approx(fmaf(s[mt][nb][0], scale_log2, -ref[mt][0]));
                const float p1 = exp2_approx(fmaf(s[mt][nb][1], scale_log2, -ref[mt][0]));
                const float p2 = exp2_approx(fmaf(s[mt][nb][2], scale_log2, -ref[mt][1]));
                const float p3 = exp2_approx(fmaf(s[mt][nb][3], scale_log2, -ref[mt][1]));
                l[mt][0] += p0 + p1;  l[mt][1] += p2 + p3;
                pa[mt][2 * h] = pack2<T>(p0, p1);
                pa[mt][2 * h + 1] = pack2<T>(p2, p3);
            }
#pragma unroll
        for (int db = 0; db < kDB; db += 2) {
            unsigned b[4];
            ldmatrix_x4_trans(b, v_base + 16 * kc * (kDB * 16) + v_col[db / 2]);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<T>(o[mt][db], pa[mt], b[0], b[1]);
                mma_16816<T>(o[mt][db + 1], pa[mt], b[2], b[3]);
            }
        }
    }
}
