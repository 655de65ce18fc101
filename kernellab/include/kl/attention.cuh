// kl/attention.cuh: a consumer warpgroup of Hopper attention (tutorial 07, steps 3 and 3b): over the K/V tiles a
// producer streams into shared memory, S = Q K^T on the tensor cores, the causal and key-range mask, the online softmax
// with lazy rescaling, P rounded to 16 bits in registers, O += P V; then O / l written out. The kernels around it (one
// block per query block, or persistent) differ only in how they feed it: which Q buffer, which K/V stages and phases.
// The producer's side is here too (kv_tiles, QKvRing, init_kv_ring, produce_q, produce_kv), shared by tutorial 07's
// steps 3 and 3b and tutorial 09's grouped-query kernel, which differ only in the head their copies read.
//
// A warpgroup (128 threads, 4 warps) owns 64 query rows; warp w of it rows 16 w .. 16 w + 15, and lane (g = lane / 4,
// t = lane % 4) rows g and g + 8 of those, as in mma.sync. Its registers:
//     float o[kD / 2];   O (64 x kD, fp32): o[4 e + 0..1] row g, o[4 e + 2..3] row g + 8, columns 8 e + 2 t, + 1
//     m0, m1             the running max of rows g and g + 8, in log2 units (scores x scale x log2 e), -inf at first
//     l0, l1             their running sums of exp2(score - m) over this lane's columns (the quad's 4 lanes add theirs
//                        up at the end)
// Shared memory holds the tiles as TMA writes them with the 128-byte swizzle: 64-column boxes of 128-byte rows.
#pragma once
#include "tma.cuh"     // mbar_init, fence_mbarrier_init, mbar_wait, mbar_arrive, sw128_desc
#include "wgmma.cuh"   // wgmma_ss, wgmma_rs_tb, wgmma_fence/commit/wait; pack2<T>
#include "attention_mma.cuh"   // exp2_approx
#ifndef CUDART_INF_F
#include <math_constants.h>   // CUDART_INF_F (the CPU emulator defines its own)
#endif

// The K/V tiles of kBN keys that a block of kBM query rows from q0 visits over seq_len keys: all ceil(seq_len / kBN),
// or with the causal mask only those up to the diagonal of its last row q0 + kBM - 1.
template <int kBM, int kBN, bool kCausal>
__device__ __forceinline__ int kv_tiles(int seq_len, int q0) {
    const int n_tiles_all = (seq_len + kBN - 1) / kBN;
    return kCausal ? min(n_tiles_all, (q0 + kBM + kBN - 1) / kBN) : n_tiles_all;
}

// The K/V ring's mbarriers (one thread, before the block's __syncthreads): per stage s, full_k + 8 s and full_v + 8 s
// (one arrival each: the producer's expect_tx) and empty + 8 s (one arrival per consumer warp: consumer_warps).
template <int kStages>
__device__ __forceinline__ void init_kv_ring(unsigned full_k, unsigned full_v, unsigned empty, int consumer_warps) {
    for (int s = 0; s < kStages; ++s) {
        mbar_init(full_k + 8 * s, 1);
        mbar_init(full_v + 8 * s, 1);
        mbar_init(empty + 8 * s, consumer_warps);
    }
}

// A block's shared memory for one Q tile and a K/V ring of kStages stages (tutorial 07's step 3, tutorial 09's GQA
// kernel), from `base` (1024-byte aligned: the 128-byte swizzle repeats every 1024 bytes): q_s [kD / 64][kBM][64],
// k_s and v_s [kStages][kD / 64][kBN][64] of 16-bit values, then the mbarriers full_q, full_k[kStages],
// full_v[kStages], empty[kStages], 8 bytes each (kBytes in all, past base).
template <int kD, int kBM, int kBN, int kStages>
struct QKvRing {
    static constexpr unsigned kQBytes = kBM * kD * 2, kKvBytes = kBN * kD * 2;
    static constexpr unsigned kBytes = kQBytes + 2 * kStages * kKvBytes + 8 * (1 + 3 * kStages);
    unsigned q_s, k_s, v_s, full_q, full_k, full_v, empty;
    __device__ __forceinline__ explicit QKvRing(unsigned base)
        : q_s(base), k_s(base + kQBytes), v_s(k_s + kStages * kKvBytes), full_q(v_s + kStages * kKvBytes),
          full_k(full_q + 8), full_v(full_k + 8 * kStages), empty(full_v + 8 * kStages) {}
    // The mbarriers' initialisation, called by every thread of the block: thread 0 initialises full_q and the ring's
    // (init_kv_ring, each empty[s] expecting consumer_warps arrivals) and fences the inits (fence_mbarrier_init); then
    // the block's __syncthreads, after which any thread may use them.
    __device__ __forceinline__ void init_barriers_and_sync(int consumer_warps) const {
        if (threadIdx.x == 0) {
            mbar_init(full_q, 1);
            init_kv_ring<kStages>(full_k, full_v, empty, consumer_warps);
            fence_mbarrier_init();
        }
        __syncthreads();
    }
};

// The producer's copy of a block's Q (one thread): kD / 64 boxes of [kBM rows][64] from row q0 of head `head` (the
// tensor map's third coordinate) into q_tile, counted on full_q.
template <int kD, int kBM>
__device__ __forceinline__ void produce_q(const void* tq, unsigned q_tile, unsigned full_q, int q0, int head) {
    mbar_expect_tx(full_q, kBM * kD * 2);
    for (int b = 0; b < kD / 64; ++b) tma_load_3d(q_tile + b * kBM * 128, tq, full_q, 64 * b, q0, head);
}

// The producer's copy of K/V tile j (kBN keys from j kBN, of head `head`: the tensor maps' third coordinate, the KV head
// that GQA shares between query heads) into stage kv % kStages of the ring (kv: tiles streamed before it), once every
// consumer warp has released that stage's previous tile (empty, from the ring's second lap on); K then V as kD / 64
// boxes of [kBN keys][64], counted on full_k / full_v.
template <int kD, int kBN, int kStages>
__device__ __forceinline__ void produce_kv_tile(const void* tk, const void* tv, unsigned k_s, unsigned v_s,
                                                unsigned full_k, unsigned full_v, unsigned empty, int j, int kv,
                                                int head) {
    constexpr unsigned kv_bytes = kBN * kD * 2;
    const int s = kv % kStages;
    if (kv >= kStages) mbar_wait(empty + 8 * s, ((kv / kStages) - 1) & 1);
    mbar_expect_tx(full_k + 8 * s, kv_bytes);
    for (int b = 0; b < kD / 64; ++b)
        tma_load_3d(k_s + s * kv_bytes + b * kBN * 128, tk, full_k + 8 * s, 64 * b, j * kBN, head);
    mbar_expect_tx(full_v + 8 * s, kv_bytes);
    for (int b = 0; b < kD / 64; ++b)
        tma_load_3d(v_s + s * kv_bytes + b * kBN * 128, tv, full_v + 8 * s, 64 * b, j * kBN, head);
}
// The producer's K/V stream of one block (one thread): tiles 0 .. n_tiles - 1, tile j in stage j % kStages.
template <int kD, int kBN, int kStages>
__device__ __forceinline__ void produce_kv(const void* tk, const void* tv, unsigned k_s, unsigned v_s, unsigned full_k,
                                           unsigned full_v, unsigned empty, int n_tiles, int head) {
    for (int j = 0; j < n_tiles; ++j) produce_kv_tile<kD, kBN, kStages>(tk, tv, k_s, v_s, full_k, full_v, empty, j, j, head);
}
// produce_kv_tile with a stage's K and V freed apart (empty_k, empty_v: tutorial 07's fa3p_sched, whose turns are
// done with K a product before V): K's copy waits only for the K half of its stage.
template <int kD, int kBN, int kStages>
__device__ __forceinline__ void produce_kv_tile_apart(const void* tk, const void* tv, unsigned k_s, unsigned v_s,
                                                      unsigned full_k, unsigned full_v, unsigned empty_k,
                                                      unsigned empty_v, int j, int kv, int head) {
    constexpr unsigned kv_bytes = kBN * kD * 2;
    const int s = kv % kStages;
    const unsigned phase = ((kv / kStages) - 1) & 1;
    if (kv >= kStages) mbar_wait(empty_k + 8 * s, phase);
    mbar_expect_tx(full_k + 8 * s, kv_bytes);
    for (int b = 0; b < kD / 64; ++b)
        tma_load_3d(k_s + s * kv_bytes + b * kBN * 128, tk, full_k + 8 * s, 64 * b, j * kBN, head);
    if (kv >= kStages) mbar_wait(empty_v + 8 * s, phase);
    mbar_expect_tx(full_v + 8 * s, kv_bytes);
    for (int b = 0; b < kD / 64; ++b)
        tma_load_3d(v_s + s * kv_bytes + b * kBN * 128, tv, full_v + 8 * s, 64 * b, j * kBN, head);
}
// The same for one work item of a persistent block, whose ring runs on over its items: kv, the tiles streamed so far,
// advances by n_tiles.
template <int kD, int kBN, int kStages>
__device__ __forceinline__ void produce_kv(const void* tk, const void* tv, unsigned k_s, unsigned v_s, unsigned full_k,
                                           unsigned full_v, unsigned empty, int n_tiles, int head, int& kv) {
    for (int j = 0; j < n_tiles; ++j, ++kv)
        produce_kv_tile<kD, kBN, kStages>(tk, tv, k_s, v_s, full_k, full_v, empty, j, kv, head);
}
template <int kD, int kBN, int kStages>
__device__ __forceinline__ void produce_kv_apart(const void* tk, const void* tv, unsigned k_s, unsigned v_s,
                                                 unsigned full_k, unsigned full_v, unsigned empty_k, unsigned empty_v,
                                                 int n_tiles, int head, int& kv) {
    for (int j = 0; j < n_tiles; ++j, ++kv)
        produce_kv_tile_apart<kD, kBN, kStages>(tk, tv, k_s, v_s, full_k, full_v, empty_k, empty_v, j, kv, head);
}

// One consumer warpgroup's whole part in a block of kBM query rows from q0 of head bh (O: [heads][seq_len][kD]): its
// 64 rows q0 + 64 c .. + 63 against the first n_tiles K/V tiles of kBN keys, as the producer lands them; then
// O[bh, row, :] = O / l for its rows below seq_len. The caller has waited for the block's Q.
//   c, tid           the consumer warpgroup (0, 1, ...) and this thread's index in it (0 .. 127)
//   q_tile           the block's Q in shared memory: kD / 64 boxes of [kBM rows][64]
//   k_s, v_s         the K/V ring: kStages stages of kv_bytes bytes, each kD / 64 boxes of [kBN keys][64]
//   full_k, full_v, empty   the stages' mbarriers, 8 bytes apart: the producer's copies complete full_k and full_v;
//                    each warp arrives on empty once it is done with a stage
//   kv               K/V tiles consumed so far (its stage kv % kStages, phase (kv / kStages) & 1); advanced by n_tiles
//   q_release        with kReleaseQ, each warp arrives on this mbarrier after its last S = Q K^T (Q may be replaced)
// Scores are scaled by scale_log2 (the softmax scale x log2 e); m moves only when a tile's max exceeds it by
// rescale_log2 (lazy rescaling: then O and l are rescaled, and only in warps where some row's max moved).
template <typename T, int kD, int kBN, int kBM, int kStages, bool kCausal, bool kReleaseQ>
__device__ __forceinline__ void wg_attention(int c, int tid, T* __restrict__ O, int bh, int q0, int seq_len,
                                             int n_tiles, int& kv, unsigned q_tile, unsigned k_s, unsigned v_s,
                                             unsigned kv_bytes, unsigned full_k, unsigned full_v, unsigned empty,
                                             unsigned q_release, float scale_log2, float rescale_log2) {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int row0 = q0 + 64 * c + 16 * warp + g, row1 = row0 + 8;
    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.f, l1 = 0.f;

    for (int j = 0; j < n_tiles; ++j, ++kv) {
        const int s = kv % kStages;
        const unsigned phase = (kv / kStages) & 1;
        const unsigned k_tile = k_s + s * kv_bytes, v_tile = v_s + s * kv_bytes;
        const int kv0 = j * kBN;

        // S = Q K^T on the tensor cores: kD / 16 wgmmas of m64 n kBN k16, both operands K-major in shared memory.
        float sacc[kBN / 2];
        mbar_wait(full_k + 8 * s, phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
            const unsigned long long da = sw128_desc(q_tile + (kk / 4) * kBM * 128 + 64 * c * 128 + (kk % 4) * 32, 16, 1024);
            const unsigned long long db = sw128_desc(k_tile + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
            wgmma_ss<kBN, T>(sacc, da, db, kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (kReleaseQ && j == n_tiles - 1 && lane == 0) mbar_arrive(q_release);   // this warp is done with Q

        if (kv0 + kBN > seq_len || (kCausal && kv0 + kBN - 1 > q0 + 64 * c)) {
#pragma unroll
            for (int i = 0; i < kBN / 2; ++i) {
                const int key = kv0 + 8 * (i / 4) + 2 * t + (i & 1);
                const int row = (i & 2) ? row1 : row0;
                if (key >= seq_len || (kCausal && key > row)) sacc[i] = -CUDART_INF_F;
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
        unsigned p[kBN / 16][4];              // P as wgmma A fragments, 16 keys each (same layout as mma.sync's)
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
        mbar_wait(full_v + 8 * s, phase);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < kBN / 16; ++kc) {
            const unsigned long long dv = sw128_desc(v_tile + kc * 16 * 128, kBN * 128, 1024);
            wgmma_rs_tb<kD, T>(o, p[kc], dv);
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(empty + 8 * s);
    }

    // O / l, rounded to T (the quad of lanes sharing a row adds up its partial sums first)
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    T* out = O + (size_t)bh * seq_len * kD;
#pragma unroll
    for (int i = 0; i < kD / 2; i += 4) {
        const int col = 8 * (i / 4) + 2 * t;
        if (row0 < seq_len) *reinterpret_cast<unsigned*>(out + (size_t)row0 * kD + col) = pack2<T>(o[i] * inv0, o[i + 1] * inv0);
        if (row1 < seq_len) *reinterpret_cast<unsigned*>(out + (size_t)row1 * kD + col) = pack2<T>(o[i + 2] * inv1, o[i + 3] * inv1);
    }
}

// wg_attention's steps as functions, for consumers that order their products differently (tutorial 07's
// fa3p_sched_*: ping-pong between warpgroups). wg_attention keeps its own inline copy: moved into these calls it
// compiles to other register assignments, and its SASS stays as measured.
// One K/V tile's softmax in a consumer warpgroup, on S = Q K^T's accumulators sacc (keys kv0 .. kv0 + kBN - 1; the
// warpgroup's rows from wg_row0, this lane's rows row0 and row1, t = lane % 4): the causal and key-range mask, the
// row max, lazy rescaling of m, l and O (o *= alpha: O's products must have completed), and P = exp2(S scale - m)
// rounded to T as wgmma A fragments (p), its sums added to l.
template <typename T, int kD, int kBN, bool kCausal>
__device__ __forceinline__ void wg_softmax_tile(float (&sacc)[kBN / 2], unsigned (&p)[kBN / 16][4], float (&o)[kD / 2],
                                                float& m0, float& m1, float& l0, float& l1, int kv0, int wg_row0,
                                                int row0, int row1, int t, int seq_len, float scale_log2,
                                                float rescale_log2) {
    if (kv0 + kBN > seq_len || (kCausal && kv0 + kBN - 1 > wg_row0)) {
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i) {
            const int key = kv0 + 8 * (i / 4) + 2 * t + (i & 1);
            const int row = (i & 2) ? row1 : row0;
            if (key >= seq_len || (kCausal && key > row)) sacc[i] = -CUDART_INF_F;
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
}

// O / l of this lane's rows row0 and row1 (below seq_len) into O[bh, row, :], rounded to T (the quad of lanes sharing a
// row adds up its partial sums of l first).
template <typename T, int kD>
__device__ __forceinline__ void wg_store_o(const float (&o)[kD / 2], float l0, float l1, T* __restrict__ O, int bh,
                                           int row0, int row1, int t, int seq_len) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    T* out = O + (size_t)bh * seq_len * kD;
#pragma unroll
    for (int i = 0; i < kD / 2; i += 4) {
        const int col = 8 * (i / 4) + 2 * t;
        if (row0 < seq_len) *reinterpret_cast<unsigned*>(out + (size_t)row0 * kD + col) = pack2<T>(o[i] * inv0, o[i + 1] * inv0);
        if (row1 < seq_len) *reinterpret_cast<unsigned*>(out + (size_t)row1 * kD + col) = pack2<T>(o[i + 2] * inv1, o[i + 3] * inv1);
    }
}

// Named barrier `id` (1-15; 0 is __syncthreads) counting `threads` threads, a multiple of 32: wait there until that many
// have arrived (bar.sync), or arrive without waiting (bar.arrive). On the CPU, the emulator's (hopper.h).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
    named_bar_sync(id, threads);
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
    named_bar_arrive(id, threads);
#endif
}

// wg_attention with ping-pong scheduling (tutorial 07's fa3p_sched_*, after FlashAttention-3): the kWarpgroups
// consumer warpgroups of a block take turns on the tensor cores. A turn of warpgroup c issues O += P V of its tile
// j - 1, then S = Q K^T of its tile j, back to back; it then passes the turn on and runs tile j's softmax while the
// next warpgroup's products run. Warpgroup c waits for its turn at named barrier kBar0 + c (bar.sync, 256 threads)
// and passes it with bar.arrive at kBar0 + (c + 1) % kWarpgroups, so each barrier has one waiting warpgroup and one
// arriving. An item of n_tiles tiles is n_tiles + 1 turns (the first only S, the last only P V): the same number in
// every warpgroup of the block, since they share the item. The caller starts the ring (the last warpgroup arrives
// once at kBar0 before the first turn) and ends it (warpgroup 0 waits once at kBar0 after its last: the last arrive's
// sync). After its products a turn frees tile j's K (empty) and tile j - 1's V (empty_v) apart, so the producer
// (produce_kv_apart) refills a K half a turn before its V half. The same arithmetic as wg_attention, in the same
// order per warpgroup: the same bits. Registers: P of tile
// j - 1, O and S of tile j are live at once (tutorial 07's caller raises the consumers' registers with setmaxnreg).
// One consumer warpgroup's state in wg_attention_pingpong (below) and its turns.
template <typename T, int kD, int kBN, int kBM, int kStages, bool kCausal, int kWarpgroups, int kBar0>
struct PingPongWarpgroup {
    int c, lane, t, row0, row1, q0, seq_len, n_tiles;
    unsigned q_tile, k_s, v_s, kv_bytes, full_k, full_v, empty, empty_v, q_release;   // empty: the stages' K halves
    float scale_log2, rescale_log2;
    float o[kD / 2];                             // O, as in wg_attention
    float m0, m1, l0, l1;
    unsigned p[kBN / 16][4];                     // P of the tile before, for the next turn's P V
    float sacc[kBN / 2];

    // Turn j: O += P V of tile j - 1 (kPV), then S = Q K^T of tile j (kQK), then tile j's softmax (kQK). Templated so
    // that no wgmma sits under a branch (ptxas serialises wgmmas it cannot prove warp-uniform). kv: tiles consumed.
    template <bool kPV, bool kQK>
    __device__ __forceinline__ void turn(int j, int& kv) {
        const int s = kv % kStages, sp = (kv + kStages - 1) % kStages;        // tile j's stage, tile j - 1's
        if (kQK) mbar_wait(full_k + 8 * s, (kv / kStages) & 1);
        if (kPV) mbar_wait(full_v + 8 * sp, ((kv - 1) / kStages) & 1);
        named_barrier_sync(kBar0 + c, 128 * 2);                               // this warpgroup's turn
        wgmma_fence();
        if (kPV) {
#pragma unroll
            for (int kc = 0; kc < kBN / 16; ++kc)
                wgmma_rs_tb<kD, T>(o, p[kc], sw128_desc(v_s + sp * kv_bytes + kc * 16 * 128, kBN * 128, 1024));
        }
        if (kQK) {
#pragma unroll
            for (int kk = 0; kk < kD / 16; ++kk) {
                const unsigned long long da = sw128_desc(q_tile + (kk / 4) * kBM * 128 + 64 * c * 128 + (kk % 4) * 32, 16, 1024);
                const unsigned long long db = sw128_desc(k_s + s * kv_bytes + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
                wgmma_ss<kBN, T>(sacc, da, db, kk > 0);
            }
        }
        wgmma_commit();
        named_barrier_arrive(kBar0 + (c + 1) % kWarpgroups, 128 * 2);         // the next warpgroup's turn
        wgmma_wait<0>();
        if (kPV && lane == 0) mbar_arrive(empty_v + 8 * sp);                  // tile j - 1's V is free
        if (kQK && lane == 0) mbar_arrive(empty + 8 * s);                     // tile j's K is free
        if (kQK) {
            if (j == n_tiles - 1 && lane == 0) mbar_arrive(q_release);        // this warp is done with Q
            wg_softmax_tile<T, kD, kBN, kCausal>(sacc, p, o, m0, m1, l0, l1, j * kBN, q0 + 64 * c, row0, row1, t,
                                                 seq_len, scale_log2, rescale_log2);
            ++kv;
        }
    }
};

template <typename T, int kD, int kBN, int kBM, int kStages, bool kCausal, int kWarpgroups, int kBar0>
__device__ __forceinline__ void wg_attention_pingpong(int c, int tid, T* __restrict__ O, int bh, int q0, int seq_len,
                                                      int n_tiles, int& kv, unsigned q_tile, unsigned k_s,
                                                      unsigned v_s, unsigned kv_bytes, unsigned full_k,
                                                      unsigned full_v, unsigned empty, unsigned empty_v,
                                                      unsigned q_release, float scale_log2, float rescale_log2) {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    PingPongWarpgroup<T, kD, kBN, kBM, kStages, kCausal, kWarpgroups, kBar0> w;
    w.c = c; w.lane = lane; w.t = t; w.row0 = q0 + 64 * c + 16 * warp + g; w.row1 = w.row0 + 8; w.q0 = q0;
    w.seq_len = seq_len; w.n_tiles = n_tiles; w.q_tile = q_tile; w.k_s = k_s; w.v_s = v_s; w.kv_bytes = kv_bytes;
    w.full_k = full_k; w.full_v = full_v; w.empty = empty; w.empty_v = empty_v; w.q_release = q_release;
    w.scale_log2 = scale_log2;
    w.rescale_log2 = rescale_log2;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) w.o[i] = 0.f;
    w.m0 = -CUDART_INF_F; w.m1 = -CUDART_INF_F; w.l0 = 0.f; w.l1 = 0.f;
    if (n_tiles > 0) {                           // the first and last turns peeled off: one product each
        w.template turn<false, true>(0, kv);
        for (int j = 1; j < n_tiles; ++j) w.template turn<true, true>(j, kv);
        w.template turn<true, false>(n_tiles, kv);
    }
    wg_store_o<T, kD>(w.o, w.l0, w.l1, O, bh, w.row0, w.row1, t, seq_len);
}
