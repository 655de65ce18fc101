# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Attention for inference: grouped-query heads and flash-decoding
#
# **What you will learn**
# - **grouped-query attention** (GQA; multi-query attention, MQA, is its one-KV-head case): `Hq` query heads share
#   `Hkv = Hq / G` key and value heads. Tutorial 07's `mma.sync` kernel needs one change of indexing to load each
#   `K`/`V` tile once for the `G` query heads that use it;
# - **decoding**: one or a few query tokens against a KV cache of thousands of positions. There is almost no work per
#   byte, so the kernel is a copy of the cache through the SMs, and the question is how to keep every SM busy when
#   `B * Hkv` is small: split the keys (**flash-decoding**), let each split write a partial `(o, lse)`, and merge the
#   partials, first in a second kernel, then in one launch whose last block to finish does the merge;
# - how each is checked (awkward lengths, a batch of different cache lengths, empty caches, both dtypes, head dims 64
#   and 128) against a float64 reference and SDPA, and timed against SDPA and the fastest PyTorch code for the same op,
#   decoding as a fraction of the copy bandwidth kernellab measures.
#
# Everything that compiles, counts or draws runs without a GPU; cells that launch are marked `%%gpu` and are skipped
# with one line where there is none. The kernels are those of `benchmarks/attention_inference.py` and of the GPU tests
# (`tests/gpu/test_attention_inference_gpu.py`): both run this notebook's `%%cuda` and `# launchers` cells.

# %%
# %load_ext kernellab
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernellab

GPU = kernellab.has_gpu()
print("GPU:", torch.cuda.get_device_name() if GPU else "none (compile and analysis only)")

# %% [markdown]
# ## Grouped-query attention: what changes, counted
#
# Llama-3-8B has 32 query heads over 8 KV heads (`G = 4`), Llama-3-70B 64 over 8 (`G = 8`); the KV cache, and the `K`,
# `V` tensors of a prefill, are `G` times smaller than with one KV head per query head. The FLOPs do not change:
# `4 B Hq N^2 d` (halved with the causal mask). The bytes a fused kernel must move are `Q` and `O` (`2 B Hq N d`
# 16-bit values) plus `K` and `V` (`2 B Hkv N d`).
#
# The common way to run GQA on a kernel made for one KV head per query head is to expand `K` and `V` first
# (`k.repeat_interleave(G, dim=1)`): a copy of `2 B Hq N d` values written and read again. The kernel below never
# expands. Because `q` is `[B, Hq, N, d]` and the `G` query heads of KV head `h` are heads `h G .. h G + G - 1`, they
# are **one contiguous `[G N, d]` matrix**: row `r` is query position `r % N` of head `h G + r / N`. Tutorial 07's
# block takes 128 rows of that matrix instead of 128 rows of one head, and walks KV head `h`'s keys: every `K` and
# `V` tile it loads feeds all its rows, whichever query head they belong to. The only other change is the causal
# mask, which compares a key with the row's *position* `r % N`; a block whose rows cross from one head into the next
# holds positions from 0 to `N - 1` and so walks every key tile (with `N >= 128` that is at most one block in
# `N / 128` per head).
#
# Where does the sharing happen? The grid's fastest axis walks the `G N / 128` row blocks of one KV head, so they run
# side by side and read the same `K`/`V` tiles: from DRAM once, then from L2. With `N < 128` (a few tokens of a
# chunked prefill, or speculative decoding's draft tokens) a block holds the rows of several query heads and loads each
# tile once for all of them, where one block per query head would load it `G` times into `G` under-filled blocks.
#
# **Predictions.** At `N >= 1024` attention is compute-bound and the packing changes nothing measurable: the kernel
# should run at tutorial 07's step-2 speed (about 1.0-1.1x SDPA FLASH at `d = 64`, see docs/RESULTS.md); against SDPA
# with `K`, `V` expanded it also saves the expansion's copy, a few percent at `N = 1024` and less beyond. Against
# SDPA with `enable_gqa=True` (no copy) it should be where step 2 is against FLASH. At `N <= 512` the launch and the
# tail of the grid dominate, as in tutorial 07, and step 2 was 1.16x FLASH at `N = 512` there.

# %%
def gqa_counts(B, Hq, Hkv, N, d, causal=False, elem_bytes=2):
    """FLOPs and the bytes a fused kernel moves (Q, K, V read once, O written once) for GQA attention."""
    flops = 4 * B * Hq * N * N * d / (2 if causal else 1)
    moved = (2 * B * Hq * N * d + 2 * B * Hkv * N * d) * elem_bytes
    expand = 2 * 2 * B * Hq * N * d * elem_bytes                  # repeat_interleave: K, V written, then read again
    return flops, moved, expand


for N in (128, 1024, 8192):
    flops, moved, expand = gqa_counts(1, 32, 8, N, 128)
    print(f"N = {N:5d}: {flops / 1e9:8.2f} GFLOP, {moved / 1e6:7.2f} MB moved fused, "
          f"{flops / moved:6.0f} FLOP/byte; expanding K, V first adds {expand / 1e6:7.2f} MB")

# %% [markdown]
# ## The GQA kernel
#
# The cell holds tutorial 07's step-2 kernel (`mma.sync` m16n8k16, `ldmatrix` with `.trans` for `V`, the XOR swizzle,
# `cp.async` double buffering, the online softmax with `exp2` and lazy rescaling, `P` fed from the score registers),
# with the packed rows. The device code comes from kernellab's headers (`kl/mma.cuh`, `kl/cp_async.cuh`, and
# `kl/attention_mma.cuh` for a tile's `S = Q K^T`, softmax and `P V`, shared with tutorial 07's step 2); what is
# specific to the kernel stays in its namespace.

# %%
# %%cuda --name gqa_kernels
#include <kl/attention_mma.cuh>  // scores_qk (S = Q K^T), softmax_pv (online softmax, P V), swz<D>, exp2_approx
#include <kl/cp_async.cuh>  // cp_async_16, cp_async_commit, cp_async_wait_all
#include <kl/mma.cuh>       // ldmatrix_x4(_trans), mma_16816<T>; pack2<T>, __half, __nv_bfloat16 (kl/convert.cuh)
#include <math_constants.h>  // CUDART_INF_F
typedef unsigned int uint32_t;

// Grouped-query attention forward on mma.sync. Q: [B, Hq, N, D]; K, V: [B, Hkv, N, D], Hq = G * Hkv; O like Q.
// The G query heads of one KV head are contiguous in Q: one [G * N, D] matrix whose row r is query position r % N
// of head r / N. A block takes BLOCK_M consecutive rows of it and walks that KV head's keys once: every K and V tile
// it loads feeds all its rows, whichever of the G heads they belong to.
#define GQA_MT 2            // m16 tiles per warp (32 rows)
#define GQA_NWARPS 4        // BLOCK_M = 16 * MT * NWARPS = 128 packed rows
#define GQA_BN 64           // keys per tile
#define GQA_RESCALE_LOG2 8.0f

namespace gqa {

constexpr float LOG2E = 1.4426950408889634f;

// Rows [row0, row0 + ROWS) of a [rows, D] matrix into a swizzled tile (swz<D>) by NTHREADS threads (first thread `tid`);
// rows past `rows` become zeros (cp.async with a source size of 0).
template <int ROWS, int D, int NTHREADS, typename T>
__device__ __forceinline__ void load_rows(uint32_t tile, const T* __restrict__ g, int row0, int rows, int tid) {
    constexpr int STEP = NTHREADS / (D / 8);
    static_assert(STEP % 8 == 0 && ROWS % STEP == 0, "every thread copies one chunk of every STEP-th row");
    const int r = tid / (D / 8), c = tid % (D / 8);
#pragma unroll
    for (int k = 0; k < ROWS / STEP; ++k) {
        const int row = row0 + r + k * STEP;
        const bool valid = row < rows;
        cp_async_16(tile + swz<D>(r + k * STEP, c), valid ? g + (size_t)row * D + c * 8 : g, valid ? 16 : 0);
    }
}

template <typename T, int D, int BLOCK_N, int NWARPS, int MT, bool CAUSAL, bool Q_IN_REGS>
__device__ __forceinline__ void gqa_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                                        T* __restrict__ O, int N, int G, float scale) {
    constexpr int WARP_M = 16 * MT, BLOCK_M = WARP_M * NWARPS, NTHREADS = 32 * NWARPS;
    constexpr int KC = D / 16, NB = BLOCK_N / 8, DB = D / 8, ROWB = D * 2;
    constexpr uint32_t KV_BYTES = BLOCK_N * D * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t q_tile = static_cast<uint32_t>(__cvta_generic_to_shared(smem));                     // [BLOCK_M, D]
    const uint32_t k_tile0 = q_tile + BLOCK_M * D * 2;             // [2][BLOCK_N, D]
    const uint32_t v_tile0 = k_tile0 + 2 * KV_BYTES;               // [2][BLOCK_N, D]

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows = G * N;                                        // packed rows of this KV head
    const int r0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BLOCK_M;   // causal: long rows first
    const int w0 = warp * WARP_M;
    Q += (size_t)blockIdx.y * rows * D; O += (size_t)blockIdx.y * rows * D;       // blockIdx.y = b * Hkv + hkv
    K += (size_t)blockIdx.y * N * D;    V += (size_t)blockIdx.y * N * D;

    // Query positions the block holds: one head's run [r0 % N, rlast % N], or (it crosses a head) all of 0 .. N - 1.
    const int rlast = min(r0 + BLOCK_M, rows) - 1;
    const bool one_head = r0 / N == rlast / N;
    const int pos_min = one_head ? r0 % N : 0, pos_max = one_head ? rlast % N : N - 1;
    const int n_tiles = ((CAUSAL ? pos_max + 1 : N) + BLOCK_N - 1) / BLOCK_N;
    int n_full = N / BLOCK_N;                                      // tiles no row of the block masks
    if (CAUSAL) n_full = min(n_full, (pos_min + 1) / BLOCK_N);

    load_rows<BLOCK_M, D, NTHREADS>(q_tile, Q, r0, rows, threadIdx.x);
    load_rows<BLOCK_N, D, NTHREADS>(k_tile0, K, 0, N, threadIdx.x);
    load_rows<BLOCK_N, D, NTHREADS>(v_tile0, V, 0, N, threadIdx.x);
    cp_async_commit();

    const float scale_log2 = scale * LOG2E;
    uint32_t qf[MT][Q_IN_REGS ? KC : 1][4];
    float o[MT][DB][4], m[MT][2], l[MT][2];
    init_oml(o, m, l);                           // O = 0, m = -inf, l = 0 (kl/attention_mma.cuh)
    // ldmatrix lane addresses, as in tutorial 07 (kl/attention_mma.cuh): the swizzled chunk depends only on the lane
    // and the loop counters.
    uint32_t k_col[KC], q_col[KC], v_col[DB / 2], k_row, qv_row;
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);

    if (Q_IN_REGS) {
        cp_async_wait_all();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[mt][kc], q_tile + (w0 + 16 * mt) * ROWB + qv_row + q_col[kc]);
    }

    auto step = [&](int j, bool MASK) {
        cp_async_wait_all();
        __syncthreads();
        if (j + 1 < n_tiles) {
            load_rows<BLOCK_N, D, NTHREADS>(k_tile0 + ((j + 1) & 1) * KV_BYTES, K, (j + 1) * BLOCK_N, N, threadIdx.x);
            load_rows<BLOCK_N, D, NTHREADS>(v_tile0 + ((j + 1) & 1) * KV_BYTES, V, (j + 1) * BLOCK_N, N, threadIdx.x);
            cp_async_commit();
        }
        const uint32_t k_base = k_tile0 + (j & 1) * KV_BYTES + k_row, v_base = v_tile0 + (j & 1) * KV_BYTES + qv_row;
        const int kv0 = j * BLOCK_N;

        float s[MT][NB][4];
        scores_qk<T, MT, NB, KC, Q_IN_REGS>(s, qf, q_tile, w0, qv_row, q_col, k_base, k_col);   // S = Q K^T
        if (MASK) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kv0 + 8 * nb + 2 * t + (e & 1);
                        const int pos = (r0 + w0 + 16 * mt + g + 8 * (e >> 1)) % N;   // the row's query position
                        if (key >= N || (CAUSAL && key > pos)) s[mt][nb][e] = -CUDART_INF_F;
                    }
        }
        // Online softmax with lazy rescaling (tutorial 07): m moves only when a score passes it by RESCALE_LOG2;
        // then O += P V through ldmatrix.trans (kl/attention_mma.cuh).
        softmax_pv<T>(s, o, m, l, MASK, scale_log2, GQA_RESCALE_LOG2, v_base, v_col);
    };
    int j = 0;
    for (; j < min(n_full, n_tiles); ++j) step(j, false);
    for (; j < n_tiles; ++j) step(j, true);

    // O / l through this warp's own rows of the Q tile, then 16-byte stores of the rows inside the matrix.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float inv = quad_sum_inv(l[mt][h]);           // 1 / l over the row's quad (kl/attention_mma.cuh)
            const int r = w0 + 16 * mt + g + 8 * h;
#pragma unroll
            for (int db = 0; db < DB; ++db)
                *reinterpret_cast<uint32_t*>(smem + swz<D>(r, db) + 4 * t) =
                    pack2<T>(o[mt][db][2 * h] * inv, o[mt][db][2 * h + 1] * inv);
        }
    __syncwarp();
    for (int i = lane; i < WARP_M * D / 8; i += 32) {
        const int r = i / (D / 8), c = i % (D / 8);
        if (r0 + w0 + r < rows)
            *reinterpret_cast<uint4*>(O + (size_t)(r0 + w0 + r) * D + c * 8) =
                *reinterpret_cast<const uint4*>(smem + swz<D>(w0 + r, c));
    }
}

}  // namespace gqa

// One entry point per (dtype, head dim, causal): grid (ceil(G * N / 128), B * Hkv), 128 threads,
// dynamic shared memory (128 + 4 * 64) * D * 2 bytes (Q tile, two K and two V tiles).
#define GQA_ENTRY(name, T, D, CAUSAL, Q_IN_REGS) \
extern "C" __global__ void __launch_bounds__(GQA_NWARPS * 32, 2) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o, int n, int g, float scale) { \
    gqa::gqa_fwd<T, D, GQA_BN, GQA_NWARPS, GQA_MT, CAUSAL, Q_IN_REGS>(q, k, v, o, n, g, scale); \
}
GQA_ENTRY(gqa_bf16_d64, __nv_bfloat16, 64, false, true)
GQA_ENTRY(gqa_bf16_d64_causal, __nv_bfloat16, 64, true, true)
GQA_ENTRY(gqa_bf16_d128, __nv_bfloat16, 128, false, false)
GQA_ENTRY(gqa_bf16_d128_causal, __nv_bfloat16, 128, true, false)
GQA_ENTRY(gqa_f16_d64, __half, 64, false, true)
GQA_ENTRY(gqa_f16_d64_causal, __half, 64, true, true)
GQA_ENTRY(gqa_f16_d128, __half, 128, false, false)
GQA_ENTRY(gqa_f16_d128_causal, __half, 128, true, false)

# %% [markdown]
# ### What it costs
#
# The card's instruction line shows `HMMA.16816.F32` (the tensor cores through `mma.sync`), `LDSM` (`ldmatrix`) and
# `LDGSTS` (`cp.async`). At `d = 64` the `Q` fragments stay in registers; at `d = 128` they are re-read from shared
# memory each tile, and the non-causal kernel spills a few bytes, as tutorial 07's step 2 does with the same tiles.

# %%
GQA_SMEM = {d: (128 + 4 * 64) * d * 2 for d in (64, 128)}         # Q tile + 2 K tiles + 2 V tiles, bytes
for name in ("gqa_bf16_d64", "gqa_bf16_d128_causal"):
    k = gqa_kernels[name]
    d = 64 if "_d64" in name else 128
    print(f"{name:22s} {k.resources}")
    print(" " * 23, k.instruction_summary)
    print(" " * 23, f"{GQA_SMEM[d] // 1024} KiB of shared memory per block;", k.occupancy(128, shared_bytes=GQA_SMEM[d]).title)

# %% [markdown]
# ## GQA on Hopper: tutorial 07's wgmma step with the KV head in the TMA coordinates
#
# The `mma.sync` kernel above tops out near 370 TFLOP/s on an H100, where tutorial 07's step 3 (`wgmma` fed by TMA,
# a producer warp and two or three consumer warpgroups) runs its MHA shapes at 500 and more. That step's consumer
# warpgroup lives in `kl/attention.cuh` (`wg_attention`: `S = Q K^T`, the mask, the online softmax, `O += P V`, then
# `O / l`) and its TMA and mbarrier helpers in `kl/tma.cuh`; GQA changes only the producer's coordinates and the grid:
#
# - the producer loads `Q` (and the consumers write `O`) at head `bh = b Hq + h`, and `K`, `V` at the KV head
#   `b Hkv + h / G = bh / G`: the third TMA coordinate of the `K` and `V` tensor maps, built over `[B Hkv, N, d]`;
# - the grid is `(G, query blocks, B Hkv)`: `blockIdx.x`, the fastest-varying index in launch order, is the query head
#   inside its group, so the `G` CTAs that read the same `K`/`V` tiles are launched next to each other and the
#   second to `G`-th reads of each tile hit L2 (DRAM sees `K`, `V` about once, as with the packed `mma.sync` kernel).
#
# **Prediction.** The FLOPs are those of MHA with `Hq` heads, and the `K`/`V` bytes a `G`-th of them, so the kernel
# should run at step 3's MHA rate at the same `N` and `d` (tutorial 07 measured 1.3-1.5x SDPA FLASH at `N = 4096`),
# 1.3x or more over the `mma.sync` kernel at long `N`; at `N = 512` step 3's fixed cost per CTA (the persistent step
# 3b's subject) keeps it nearer the `mma.sync` kernel.
#
# **Measured** (H100, bf16, G = 4 and 8, `benchmarks/attention_inference.py --quick`, one run with SDPA): at `N = 4096`
# 452-455 TFLOP/s at `d = 64` and 592 at `d = 128` (384-398 and 535-539 causal), 1.33-1.59x the `mma.sync` kernel and
# 1.44-1.74x SDPA FLASH on `K`/`V` expanded beforehand, 0.84-0.95x SDPA `enable_gqa` (cuDNN's Hopper kernel); at
# `N = 512` 1.04-1.16x the `mma.sync` kernel at `d = 128` and 0.86-0.97x at `d = 64`. The prediction held at both
# ends, so `gqa_attention` takes the wgmma step on sm_90 for `d = 128` and, at `d = 64`, from `N = 1024`
# (`GQA_WGMMA_FROM_N`; the `mma.sync` kernel below that and on other GPUs).

# %%
# %%cuda --arch sm_90a --name gqa_wgmma_kernels
#include <kl/attention.cuh>   // wg_attention: a consumer warpgroup's S = Q K^T, online softmax, O += P V, then O / l
#include <kl/tma.cuh>         // mbar_init, mbar_expect_tx, mbar_wait, tma_load_3d
#include <cuda.h>             // CUtensorMap

// Tutorial 07's step-3 configuration (benchmarks/NOTES-attention.md): 128-key tiles, 2 stages; 3 consumer
// warpgroups (192 query rows) at d = 64, 2 (128 rows) at d = 128.
#define GQW_BN 128
#define GQW_WG64 3
#define GQW_WG128 2
#define GQW_STAGES 2
#define GQW_RESCALE_LOG2 8.0f

namespace gqa_wgmma {

// Q, O: [B Hq, N, D] (tensor map tq over dims D, N, B Hq); K, V: [B Hkv, N, D] (tk, tv over D, N, B Hkv); boxes of
// 64 columns (the 128-byte swizzle) by BM or BN rows, rows past N read as zeros.
// grid = (G, ceil(N / BM), B Hkv); block = 128 (the producer warpgroup) + 128 per consumer warpgroup.
template <typename T, int D, int BN, int NCWG, int STAGES, bool CAUSAL>
__device__ __forceinline__ void forward(const void* tq, const void* tk, const void* tv, T* __restrict__ O, int N,
                                        float scale) {
    constexpr int BM = 64 * NCWG;               // query rows per block: 64 per consumer warpgroup
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // Q, the K/V ring and their mbarriers as tutorial 07's step 3 lays them out (<kl/attention.cuh>), 1024-byte aligned
    const QKvRing<D, BM, BN, STAGES> sm(((unsigned)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u);

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int G = gridDim.x;
    const int bkv = blockIdx.z;                  // b Hkv + KV head
    const int bh = bkv * G + blockIdx.x;         // b Hq + query head: query head h reads KV head h / G
    const int qblock = CAUSAL ? gridDim.y - 1 - blockIdx.y : blockIdx.y;   // the heaviest blocks first
    const int q0 = qblock * BM;
    const int n_tiles = kv_tiles<BM, BN, CAUSAL>(N, q0);   // tutorial 07's (<kl/attention.cuh>)

    sm.init_barriers_and_sync(4 * NCWG);         // thread 0, then the block; empty: one arrival per consumer warp

    if (wg == 0) {                              // producer: tutorial 07's (<kl/attention.cuh>), one thread
        if (tid == 0) {
            produce_q<D, BM>(tq, sm.q_s, sm.full_q, q0, bh);
            // the KV head: third coordinate bkv, not bh
            produce_kv<D, BN, STAGES>(tk, tv, sm.k_s, sm.v_s, sm.full_k, sm.full_v, sm.empty, n_tiles, bkv);
        }
        return;
    }
    // consumers: warpgroup wg - 1 owns query rows q0 + 64 (wg - 1) .. + 63 of head bh; O written at head bh
    mbar_wait(sm.full_q, 0);
    int kv = 0;
    wg_attention<T, D, BN, BM, STAGES, CAUSAL, false>(wg - 1, tid, O, bh, q0, N, n_tiles, kv, sm.q_s, sm.k_s, sm.v_s,
                                                      sm.kKvBytes, sm.full_k, sm.full_v, sm.empty, 0,
                                                      scale * 1.4426950408889634f, GQW_RESCALE_LOG2);
}
}  // namespace gqa_wgmma

// GQW_ENTRY(name, T, D, consumer warpgroups, CAUSAL): one extern "C" kernel a (dtype, head dim, causal).
#define GQW_ENTRY(name, T, D, WG, CAUSAL) \
extern "C" __global__ void __launch_bounds__(128 * (WG + 1), 1) \
name(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk, \
    const __grid_constant__ CUtensorMap tv, T* __restrict__ o, int n, float scale) { \
    gqa_wgmma::forward<T, D, GQW_BN, WG, GQW_STAGES, CAUSAL>(&tq, &tk, &tv, o, n, scale); \
}
GQW_ENTRY(gqa_wgmma_bf16_d64, __nv_bfloat16, 64, GQW_WG64, false)
GQW_ENTRY(gqa_wgmma_bf16_d64_causal, __nv_bfloat16, 64, GQW_WG64, true)
GQW_ENTRY(gqa_wgmma_bf16_d128, __nv_bfloat16, 128, GQW_WG128, false)
GQW_ENTRY(gqa_wgmma_bf16_d128_causal, __nv_bfloat16, 128, GQW_WG128, true)
GQW_ENTRY(gqa_wgmma_f16_d64, __half, 64, GQW_WG64, false)
GQW_ENTRY(gqa_wgmma_f16_d64_causal, __half, 64, GQW_WG64, true)
GQW_ENTRY(gqa_wgmma_f16_d128, __half, 128, GQW_WG128, false)
GQW_ENTRY(gqa_wgmma_f16_d128_causal, __half, 128, GQW_WG128, true)

# %% [markdown]
# The card: `HGMMA` (wgmma), `UTMALDG` (the TMA loads) and `SYNCS` (the mbarriers), no `HMMA`, no spills; one CTA an
# SM (its K/V stages and `Q` take 96 KiB at `d = 64`, 160 KiB at `d = 128`).

# %%
for name in ("gqa_wgmma_bf16_d64", "gqa_wgmma_bf16_d128_causal"):
    k = gqa_wgmma_kernels[name]
    print(f"{name:28s} {k.resources}")
    print(" " * 29, k.instruction_summary)


# %% [markdown]
# ## Decoding: a copy of the KV cache through the SMs
#
# A decode step has `nq` new tokens per sequence (1, or a few with speculative decoding) and a KV cache
# `k_cache, v_cache: [B, Hkv, Nmax, d]` of which sequence `b` uses its first `cache_seqlens[b]` positions. The new
# tokens are the cache's last `nq` positions (they were appended before the call), so token `i` sees keys
# `0 .. L_b - nq + i`, as FlashAttention's `flash_attn_with_kvcache(causal=True)` defines it; with `nq = 1` that is the
# whole cache. **A sequence whose cache is empty (`L_b = 0`), or a token that sees no key, gets an output of zeros**:
# the sum over no keys, where SDPA gives NaN (a softmax over nothing); a batch may hold finished or not-yet-started
# sequences, and zeros keep them harmless downstream.
#
# **Counted.** Each KV head's `G nq` query rows read the head's whole cache once: `2 B Hkv L d` values, 4 KB per
# position at `Hkv = 8`, `d = 128` in bf16. The FLOPs are `4 B Hq nq L d`: `G nq` FLOPs per byte of cache (4 at
# `G = 4`, `nq = 1`), against the H100's balance point of about 300 FLOP per byte. So the time is the cache's bytes
# over the bandwidth, and the yardstick is the copy bandwidth kernellab measures (`kernellab.run.measure.ceilings`,
# a device-to-device copy counting read + write bytes; about 3.0 TB/s on an H100 SXM).
#
# **Filling the GPU.** One block per `(sequence, KV head)` gives `B Hkv` blocks: 8 at `B = 1`, on 132 SMs. So the
# keys are split: each **warp** takes a contiguous run of key tiles of one sequence and KV head (its own
# double-buffered `K`/`V` tiles through `cp.async`, synchronised with `__syncwarp` only, so the four warps of a block
# never wait for each other), keeps the online softmax for its query rows, and ends with a partial output `o_s / l_s`
# (fp32) and `lse_s = m_s + log2 l_s`. The block merges its four warps' partials through shared memory (one
# `__syncthreads`, at the very end) and writes one per row; the combine kernel then merges a row's block partials:
# `o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)` with `M = max_s lse_s`. A split that saw no key has
# `lse = -inf` and weight 0. The number of splits is chosen on the host from `Nmax` (no read of `cache_seqlens`, so no
# synchronisation): enough warps for one wave of blocks, at least 64 keys a split; inside the kernel each sequence
# cuts its own `L_b` into that many splits, so short and long sequences in one batch are each spread evenly.
#
# **Bytes in flight.** Little's law: about 3 TB/s times about 1 µs of DRAM latency is 3 MB in flight, 23 KB per SM,
# more under load, when the latency grows. A warp's stage is 8 KB (`K` and `V`: 32 keys at `d = 64`, 16 at
# `d = 128`), and while it computes one stage the next is in flight. The shared memory of a block,
# `4 x (16 + 4 BLOCK_N) x d x 2` bytes (72-80 KB), lets two or three blocks share an SM: 8-12 warps, 64-96 KB in
# flight per SM, three to four times what the law asks.
#
# **Predictions.** For caches of 8k positions and more, 80-90 % of copy bandwidth. The partials add
# `2 x B Hq nq x (splits / 4) x d x 4` bytes (written, then read): about 3 % of the cache at 8k (`B = 1`, `G = 4`, 128
# splits) and under 1 % at 64k; merging the warps' partials inside the block is what keeps them that small. Below
# about 2k positions the two launches (a few µs each) dominate: a 1k cache at `B = 1` is 4 MB, about 1.4 µs of copy.
# Against PyTorch: SDPA's FLASH backend has no split-KV path for a single query and reads the cache with `B Hq` blocks
# (or takes a mask through the EFFICIENT backend), so at `B = 1` it should reach well under half the copy bandwidth.

# %%
def decode_counts(B, Hq, Hkv, nq, L, d, elem_bytes=2):
    """FLOPs and bytes of one decode step: the whole cache (K and V) read, q read, o written."""
    flops = 4 * B * Hq * nq * L * d
    moved = 2 * B * Hkv * L * d * elem_bytes + 2 * B * Hq * nq * d * elem_bytes
    return flops, moved


COPY_TBPS_H100 = 3.0                                                    # about what kernellab measures on an H100
for L in (1024, 8192, 131072):
    flops, moved = decode_counts(1, 32, 8, 1, L, 128)
    print(f"cache {L:6d}: {moved / 1e6:8.1f} MB, {flops / moved:.1f} FLOP/byte, at copy speed "
          f"{moved / (COPY_TBPS_H100 * 1e12) * 1e6:7.1f} us")

# %%
# %%cuda --name decode_kernels
#include <kl/attention_mma.cuh>  // scores_qk (S = Q K^T), softmax_pv (online softmax, P V), swz<D>, exp2_approx
#include <kl/cp_async.cuh>  // cp_async_16, cp_async_commit, cp_async_wait_all
#include <kl/mma.cuh>       // ldmatrix_x4(_trans), mma_16816<T>; pack2<T>, to_float, from_float (kl/convert.cuh)
#include <kl/pdl.cuh>       // griddepcontrol_wait, griddepcontrol_launch_dependents, prefetch_l2, load_after_wait (PDL)
#include <math_constants.h>  // CUDART_INF_F
typedef unsigned int uint32_t;

// Flash-decoding: a few query tokens (nq <= 8) per sequence against its KV cache, split along the keys.
// q: [B, Hq, nq, D]; k_cache, v_cache: [B, Hkv, Nmax, D]; cache_seqlens: [B] int32, L_b <= Nmax keys valid.
// The query tokens are the cache's last nq positions: token i sees keys 0 .. L_b - nq + i (a token with none gives 0).
// The G * nq query rows of one KV head are contiguous in q (one [G * nq, D] matrix, row r = head r / nq, token
// r % nq). Each WARP is one split: it walks tiles [s * per, (s + 1) * per) of its sequence's keys with its own
// double-buffered K and V tiles (cp.async, __syncwarp: warps never wait for each other until the end), keeping its
// rows' partial output o / l (fp32) and log2-sum-exp lse = m + log2(l) (-inf where it saw no key). At the end the
// block merges its warps' partials in shared memory and writes one (o, lse) per row. Two ways to merge the blocks':
// the combine kernel below (a second launch), or, in the fused kernels (decode_fused_*), the last block of each
// (sequence, KV head, row group) to finish, found with an atomic ticket: one launch.
#define DEC_NWARPS 4        // warps (splits) per block
#define DEC_RESCALE_LOG2 8.0f

namespace dec {

constexpr float LOG2E = 1.4426950408889634f;

// Rows [row0, row0 + ROWS) of a [rows, D] matrix into a swizzled tile (swz<D>) by one warp; rows past `rows` become zeros.
template <int ROWS, int D, typename T>
__device__ __forceinline__ void warp_load_rows(uint32_t tile, const T* __restrict__ g, int row0, int rows, int lane) {
    constexpr int CH = D / 8;                                      // 16-byte chunks per row
#pragma unroll
    for (int i = lane; i < ROWS * CH; i += 32) {
        const int r = i / CH, c = i % CH, row = row0 + r;
        const bool valid = row < rows;
        cp_async_16(tile + swz<D>(r, c), valid ? g + (size_t)row * D + c * 8 : g, valid ? 16 : 0);
    }
}

// grid (splits / NWARPS, B * Hkv, row groups of 16 * MT), NWARPS * 32 threads,
// dynamic shared memory NWARPS * (16 MT + 4 BLOCK_N) * D * 2 bytes.
// Merge the P block partials of n rows from row R0 into out (the combine kernel's formula) with the block's threads:
// first each row's weights 2^(lse_s - M) / sum_s 2^(lse_s - M) into shared memory w [n, P] (a warp a row), then each
// thread a float4 of one row's columns, LOADS partials in flight at a time (8: the op's; other values issue all
// LOADS loads before summing them). The partials are read through L2 (ld.global.cg): other blocks wrote them.
template <typename T, int D, int LOADS = 8>
__device__ __forceinline__ void merge_block_partials(const float* __restrict__ o_part,
                                                     const float* __restrict__ lse_part, T* __restrict__ out,
                                                     size_t R0, int n, int P, float* w) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < n; r += DEC_NWARPS) {
        const float* lse = lse_part + (R0 + r) * P;
        float mx = -CUDART_INF_F, sum = 0.f;
        for (int s = lane; s < P; s += 32) mx = fmaxf(mx, __ldcg(lse + s));
#pragma unroll
        for (int k = 16; k; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
        for (int s = lane; s < P; s += 32) {
            const float ws = mx == -CUDART_INF_F ? 0.f : exp2_approx(__ldcg(lse + s) - mx);   // 0: an empty split
            w[r * P + s] = ws;
            sum += ws;
        }
#pragma unroll
        for (int k = 16; k; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;                 // a row no split saw: 0
        for (int s = lane; s < P; s += 32) w[r * P + s] *= inv;       // the lane's own entries: no sync needed
    }
    __syncthreads();
    constexpr int C4 = D / 4;                                          // float4 columns a row
    for (int i = threadIdx.x; i < n * C4; i += DEC_NWARPS * 32) {
        const int r = i / C4, c = 4 * (i % C4);
        const float* src = o_part + (R0 + r) * P * D + c;
        const float* wr = w + r * P;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (LOADS == 8) {
#pragma unroll 8
            for (int s = 0; s < P; ++s) {                              // independent loads: 8 in flight a thread
                const float ws = wr[s];
                const float4 v = __ldcg(reinterpret_cast<const float4*>(src + (size_t)s * D));
                acc.x += ws * v.x;  acc.y += ws * v.y;  acc.z += ws * v.z;  acc.w += ws * v.w;
            }
        } else {                                                       // all LOADS issued, then summed in order
            for (int s0 = 0; s0 < P; s0 += LOADS) {
                float4 v[LOADS];                                       // unconditional loads (past P: partial P - 1,
#pragma unroll                                                         // weight 0), so none waits behind a sum
                for (int j = 0; j < LOADS; ++j)
                    v[j] = __ldcg(reinterpret_cast<const float4*>(src + (size_t)min(s0 + j, P - 1) * D));
#pragma unroll
                for (int j = 0; j < LOADS; ++j) {
                    const float ws = s0 + j < P ? wr[min(s0 + j, P - 1)] : 0.f;
                    acc.x += ws * v[j].x;  acc.y += ws * v[j].y;  acc.z += ws * v[j].z;  acc.w += ws * v[j].w;
                }
            }
        }
        *reinterpret_cast<uint2*>(out + (R0 + r) * D + c) = make_uint2(pack2<T>(acc.x, acc.y), pack2<T>(acc.z, acc.w));
    }
}

// The same merge in one pass (the "online" variant, decode_attention(merge="online")): each thread a float4 of one
// row's columns reads each partial's lse beside its o, LOADS partials at a time, and keeps a running max M with its
// sum and accumulator rescaled by 2^(M_old - M_new) when M grows (the online softmax over the partials). No weights in
// shared memory, no barrier, no separate pass over lse: ceil(P / LOADS) round trips to L2 instead of the two-pass
// merge's 2 ceil(P / 32) + the o loads' batches (whose rolled remainder loop waits on each load in turn).
template <typename T, int D, int LOADS>
__device__ __forceinline__ void merge_block_partials_online(const float* __restrict__ o_part,
                                                            const float* __restrict__ lse_part, T* __restrict__ out,
                                                            size_t R0, int n, int P) {
    constexpr int C4 = D / 4;                                          // float4 columns a row
    for (int i = threadIdx.x; i < n * C4; i += DEC_NWARPS * 32) {
        const int r = i / C4, c = 4 * (i % C4);
        const float* src = o_part + (R0 + r) * P * D + c;
        const float* lse = lse_part + (R0 + r) * P;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float mx = -CUDART_INF_F, sum = 0.f;
        for (int s0 = 0; s0 < P; s0 += LOADS) {
            float4 v[LOADS];
            float ls[LOADS];
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {                          // all LOADS issued before any is used; past P:
                const int s = min(s0 + j, P - 1);                      // partial P - 1 again, with lse -inf (weight 0)
                v[j] = __ldcg(reinterpret_cast<const float4*>(src + (size_t)s * D));
                ls[j] = __ldcg(lse + s);
            }
            float mb = mx;
#pragma unroll
            for (int j = 0; j < LOADS; ++j) mb = s0 + j < P ? fmaxf(mb, ls[j]) : mb;
            if (mb == -CUDART_INF_F) continue;                         // no key in any partial so far
            const float a = exp2_approx(mx - mb);                      // 0 on the first non-empty batch (mx = -inf)
            acc.x *= a;  acc.y *= a;  acc.z *= a;  acc.w *= a;  sum *= a;
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {
                const float ws = s0 + j < P ? exp2_approx(ls[j] - mb) : 0.f;   // 0: an empty split
                sum += ws;
                acc.x += ws * v[j].x;  acc.y += ws * v[j].y;  acc.z += ws * v[j].z;  acc.w += ws * v[j].w;
            }
            mx = mb;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;                 // a row no split saw: 0
        *reinterpret_cast<uint2*>(out + (R0 + r) * D + c) =
            make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
    }
}

// lse_part in a work buffer that starts with o_part: [gridDim.y * rows, gridDim.x, D] floats.
__device__ __forceinline__ float* lse_of(float* work, int D, int rows) {
    return work + (size_t)gridDim.y * rows * gridDim.x * D;
}

// FUSED: after writing its partial, each block takes a ticket from counters[(b Hkv + h) row_groups + z]; the block
// that draws the last (gridDim.x - 1) merges the gridDim.x partials of its rows into out and resets the counter to 0
// for the next call (so no memset launch; the counters start at 0 once, when the launcher allocates them).
// EARLY (decode_attention(early=True), a variant): each warp asks for Q and its first K/V tile before cache_seqlens
// arrives, on the guess that the sequence fills the cache (its split of Nmax keys); rows in [L, Nmax) of that tile
// are zeroed in V once L is known (K's are masked). Where the guess is wrong (the sequence's own split starts
// elsewhere) the warp waits for the guessed copies and asks for the right tile: one tile wasted, no error.
// PDL (decode_attention(pdl=True)): launched as a programmatic dependent launch behind the decode step's previous
// kernel (the producer: the new token's q, K/V row and cache_seqlens), the block starts while that kernel runs and
// does before griddepcontrol_wait only what cannot read the producer's output stale: its addresses, and an L2
// prefetch of the first PDL_PREFETCH_TILES tiles of its warp's split of a full cache (the EARLY guess). Everything the
// producer may write waits: q (the new token's projection), cache_seqlens (written with the new row in a step, so
// even L is not known before the wait) and every K/V load into shared memory, since without L no cache row is known
// to be older than the producer's new one. The prefetch is safe for any row: L2 is the GPU's point of coherence, a
// line there is updated by the producer's store, never stale (a cp.async into shared memory before the wait would
// be). Once its partial is written each block lets a PDL-launched next kernel be placed (launch_dependents).
// Nothing is written before the wait: not even the partials' work buffer or the output, since PyTorch's caching
// allocator may hand this kernel memory that the producer, still running, reads (a temporary it freed at launch).
#define PDL_PREFETCH_TILES 1
template <typename T, int D, int BLOCK_N, int MT, bool FUSED, int MERGE_LOADS = 8, bool ONLINE = false,
          bool EARLY = false, bool PDL = false>
__device__ __forceinline__ void decode_split(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                                             const int* __restrict__ seqlens, float* __restrict__ o_part,
                                             float* __restrict__ lse_part, T* __restrict__ out,
                                             int* __restrict__ counters, int Hkv, int G, int nq, int Nmax,
                                             float scale) {
    constexpr int ROWS = 16 * MT, KC = D / 16, NB = BLOCK_N / 8, DB = D / 8;
    constexpr uint32_t KV_BYTES = BLOCK_N * D * 2, WARP_BYTES = (ROWS + 4 * BLOCK_N) * D * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t q_tile = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * WARP_BYTES;  // [ROWS, D], this warp's own
    const uint32_t k_tile0 = q_tile + ROWS * D * 2, v_tile0 = k_tile0 + 2 * KV_BYTES;

    const int splits = gridDim.x * DEC_NWARPS, split = blockIdx.x * DEC_NWARPS + warp;
    const int bh = blockIdx.y, b = bh / Hkv, rows = G * nq, r0 = blockIdx.z * ROWS;
    Q += (size_t)bh * rows * D;
    K += (size_t)bh * Nmax * D;  V += (size_t)bh * Nmax * D;
    // EARLY: the first tile of this warp's split of a full cache, asked for before L is read
    const int tiles_full = (Nmax + BLOCK_N - 1) / BLOCK_N, j0_guess = split * ((tiles_full + splits - 1) / splits);
    const bool guessed = EARLY && j0_guess < tiles_full;
    static_assert(!(EARLY && PDL), "EARLY loads K/V into shared memory before cache_seqlens: not before a PDL wait");
    if constexpr (PDL) {                         // before the wait: L2 prefetches only (see above)
        constexpr int LINES = PDL_PREFETCH_TILES * BLOCK_N * D * 2 / 128;   // 128-byte lines of the guessed K tiles
        const int k0 = j0_guess * BLOCK_N;       // the guessed split's first key; its tiles are rows k0, k0 + 1, ...
        for (int i = lane; i < LINES; i += 32) {
            if (k0 + i * 64 / D < Nmax) {        // line i: elements [64 i, 64 i + 64) from row k0 (16-bit elements)
                prefetch_l2(K + (size_t)k0 * D + (size_t)i * 64);
                prefetch_l2(V + (size_t)k0 * D + (size_t)i * 64);
            }
        }
        griddepcontrol_wait();                   // the producer has finished and its writes are visible
    }
    if (guessed) {
        warp_load_rows<ROWS, D>(q_tile, Q, r0, rows, lane);
        warp_load_rows<BLOCK_N, D>(k_tile0, K, j0_guess * BLOCK_N, Nmax, lane);
        warp_load_rows<BLOCK_N, D>(v_tile0, V, j0_guess * BLOCK_N, Nmax, lane);
        cp_async_commit();
    }
    int L_in;                                    // PDL: load_after_wait, since seqlens[b] (a const __restrict__
    if constexpr (PDL) L_in = load_after_wait(seqlens + b);   // read) compiles to a load hoisted above the wait
    else L_in = seqlens[b];
    const int L = max(0, min(L_in, Nmax));                         // lengths past the cache read as Nmax
    const int tiles = (L + BLOCK_N - 1) / BLOCK_N, per = (tiles + splits - 1) / splits;
    const int j0 = split * per, j1 = min(j0 + per, tiles);
    const int last_key0 = L - nq;                                  // token i sees keys <= last_key0 + i
    const bool hit = guessed && j0 == j0_guess && j0 < j1;          // the guessed tile is this warp's first

    float o[MT][DB][4], m[MT][2], l[MT][2];
    init_oml(o, m, l);                           // O = 0, m = -inf, l = 0 (kl/attention_mma.cuh)
    if (j0 < j1 && !hit) {
        if (guessed) {                           // a wrong guess: its copies land before the buffers are reused
            cp_async_wait_all();
            __syncwarp();
        } else {
            warp_load_rows<ROWS, D>(q_tile, Q, r0, rows, lane);
        }
        warp_load_rows<BLOCK_N, D>(k_tile0, K, j0 * BLOCK_N, L, lane);
        warp_load_rows<BLOCK_N, D>(v_tile0, V, j0 * BLOCK_N, L, lane);
        cp_async_commit();
    }
    if (EARLY && hit && (j0 + 1) * BLOCK_N > L) {   // the guessed tile holds rows past L: once it is in, V's to 0
        cp_async_wait_all();
        __syncwarp();
        constexpr int CH = D / 8;
        unsigned char* v_buf0 = smem + warp * WARP_BYTES + ROWS * D * 2;        // v_tile0 (buffer 0), generic
        for (int i = (L - j0 * BLOCK_N) * CH + lane; i < BLOCK_N * CH; i += 32)   // rows L - j0 BLOCK_N ..
            *reinterpret_cast<uint4*>(v_buf0 + 2 * KV_BYTES + swz<D>(i / CH, i % CH)) = make_uint4(0u, 0u, 0u, 0u);
        __syncwarp();
    }
    const float scale_log2 = scale * LOG2E;
    uint32_t k_col[KC], q_col[KC], v_col[DB / 2], k_row, qv_row;   // ldmatrix lane addresses (kl/attention_mma.cuh)
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);

    auto step = [&](int j, bool MASK) {
        cp_async_wait_all();
        __syncwarp();                           // tile j is in; the warp is done with tile j - 1's buffers
        const int buf = (j - j0) & 1;
        if (j + 1 < j1) {
            warp_load_rows<BLOCK_N, D>(k_tile0 + (buf ^ 1) * KV_BYTES, K, (j + 1) * BLOCK_N, L, lane);
            warp_load_rows<BLOCK_N, D>(v_tile0 + (buf ^ 1) * KV_BYTES, V, (j + 1) * BLOCK_N, L, lane);
            cp_async_commit();
        }
        const uint32_t k_base = k_tile0 + buf * KV_BYTES + k_row, v_base = v_tile0 + buf * KV_BYTES + qv_row;
        const int kv0 = j * BLOCK_N;
        float s[MT][NB][4];
        uint32_t qf[MT][1][4];                  // Q re-read from this warp's Q tile each chunk
        scores_qk<T, MT, NB, KC, false>(s, qf, q_tile, 0, qv_row, q_col, k_base, k_col);   // S = Q K^T
        if (MASK) {                             // keys past what the row's token sees
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kv0 + 8 * nb + 2 * t + (e & 1);
                        const int token = (r0 + 16 * mt + g + 8 * (e >> 1)) % nq;
                        if (key > last_key0 + token) s[mt][nb][e] = -CUDART_INF_F;
                    }
        }
        softmax_pv<T>(s, o, m, l, MASK, scale_log2, DEC_RESCALE_LOG2, v_base, v_col);   // kl/attention_mma.cuh
    };
    // Tiles before the first key some token cannot see need no mask (keys >= L are also > last_key0 + token).
    const int j_full = min(j1, max(j0, (last_key0 + 1) / BLOCK_N));
    int j = j0;
    for (; j < j_full; ++j) step(j, false);
    for (; j < j1; ++j) step(j, true);

    // This warp's partial, o / l and lse = m + log2(l) (-inf where it saw no key), as fp32 into its own shared
    // region (its tiles are no longer read): [ROWS, D] then [ROWS].
    static_assert(ROWS * (D + 1) * 4 <= WARP_BYTES, "a warp's fp32 partial fits where its tiles were");
    if (EARLY) cp_async_wait_all();              // a guess no tile used has landed before the writes (else: none)
    __syncwarp();
    float* mine = reinterpret_cast<float*>(smem + warp * WARP_BYTES);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum;
            const float inv = quad_sum_inv(l[mt][h], sum);      // 1 / l over the row's quad, and l itself
            const int r = 16 * mt + g + 8 * h;
#pragma unroll
            for (int db = 0; db < DB; ++db)
                *reinterpret_cast<float2*>(mine + r * D + 8 * db + 2 * t) =
                    make_float2(o[mt][db][2 * h] * inv, o[mt][db][2 * h + 1] * inv);
            if (t == 0) mine[ROWS * D + r] = sum > 0.f ? m[mt][h] + log2f(sum) : -CUDART_INF_F;
        }
    __syncthreads();
    // The block's DEC_NWARPS splits merged into one partial (a quarter of the partial bytes): row R = bh * rows + r of
    // q's [B * Hq * nq] rows, block partial blockIdx.x of gridDim.x.
    for (int i = threadIdx.x; i < ROWS * D; i += DEC_NWARPS * 32) {
        const int r = i / D, c = i % D;
        if (r0 + r >= rows) continue;
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int w = 0; w < DEC_NWARPS; ++w)
            mx = fmaxf(mx, reinterpret_cast<const float*>(smem + w * WARP_BYTES)[ROWS * D + r]);
        float acc = 0.f, wsum = 0.f;
        if (mx != -CUDART_INF_F) {
#pragma unroll
            for (int w = 0; w < DEC_NWARPS; ++w) {
                const float* part = reinterpret_cast<const float*>(smem + w * WARP_BYTES);
                const float wt = exp2_approx(part[ROWS * D + r] - mx);        // 0 for a warp that saw no key
                wsum += wt;
                acc += wt * part[r * D + c];
            }
        }
        const size_t R = (size_t)bh * rows + r0 + r;
        if (FUSED && gridDim.x == 1) {          // the only block of its (sequence, KV head, group): this is the output
            out[R * D + c] = from_float<T>(wsum > 0.f ? acc / wsum : 0.f);
            continue;
        }
        o_part[(R * gridDim.x + blockIdx.x) * D + c] = wsum > 0.f ? acc / wsum : 0.f;
        if (c == 0) lse_part[R * gridDim.x + blockIdx.x] = wsum > 0.f ? mx + log2f(wsum) : -CUDART_INF_F;
    }
    // PDL: the step's next kernel, if launched with PDL behind this one, may be placed once every block is here: it
    // waits for this whole grid in its own griddepcontrol_wait, so only the last blocks' merge tail overlaps its start.
    if constexpr (PDL) griddepcontrol_launch_dependents();
    if (!FUSED || gridDim.x == 1) return;
    // The combine, fused: every thread's partial writes are made visible device-wide (__threadfence) before the
    // block takes its ticket, so the block that draws the last one reads every block's partial.
    __shared__ int last_block[1];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* counter = counters + (size_t)bh * gridDim.z + blockIdx.z;
        last_block[0] = atomicAdd(counter, 1) == (int)gridDim.x - 1;
        if (last_block[0]) *counter = 0;                                  // every other block has taken its ticket
    }
    __syncthreads();                                                   // (and the warps' partials are read)
    if (!last_block[0]) return;
    __threadfence();
    if constexpr (ONLINE)
        merge_block_partials_online<T, D, MERGE_LOADS>(o_part, lse_part, out, (size_t)bh * rows + r0,
                                                       min(ROWS, rows - r0), gridDim.x);
    else
        merge_block_partials<T, D, MERGE_LOADS>(o_part, lse_part, out, (size_t)bh * rows + r0, min(ROWS, rows - r0),
                                                gridDim.x, reinterpret_cast<float*>(smem));
}

// Merge the splits of each row: o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M = max_s lse_s; a row no split
// saw (an empty cache) is 0. One warp per row, lane l holding columns 2 l, 2 l + 1 (+ 64 at D = 128).
// grid ceil(rows / 4), 128 threads.
template <typename T, int D>
__device__ __forceinline__ void decode_combine(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                               T* __restrict__ out, int n_rows, int splits) {
    const int R = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (R >= n_rows) return;
    const float* lse = lse_part + (size_t)R * splits;
    float mx = -CUDART_INF_F;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, lse[s]);
#pragma unroll
    for (int k = 16; k; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
    float acc[D / 64][2] = {}, wsum = 0.f;
    if (mx != -CUDART_INF_F) {
        for (int s = 0; s < splits; ++s) {
            const float w = exp2_approx(lse[s] - mx);          // 0 for an empty split
            if (w == 0.f) continue;
            wsum += w;
            const float* src = o_part + ((size_t)R * splits + s) * D;
#pragma unroll
            for (int c = 0; c < D / 64; ++c) {
                const float2 v = *reinterpret_cast<const float2*>(src + 64 * c + 2 * lane);
                acc[c][0] += w * v.x;  acc[c][1] += w * v.y;
            }
        }
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
#pragma unroll
    for (int c = 0; c < D / 64; ++c)
        *reinterpret_cast<uint32_t*>(out + (size_t)R * D + 64 * c + 2 * lane) = pack2<T>(acc[c][0] * inv, acc[c][1] * inv);
}

}  // namespace dec

// Entry points per (dtype, head dim, rows per warp): BLOCK_N = 32 keys at D = 64, 16 at D = 128 (8 KB of K and V
// per stage per warp either way); 32 rows a warp only at D = 64 (at D = 128 its accumulators would spill).
// One macro a kind of entry point: DEC_SPLIT(name, T, D, BLOCK_N, M) is the split kernel with M 16-row tiles a warp,
// DEC_COMBINE(name, T, D) the combine; each invocation is one extern "C" kernel (kernellab expands the cell's own
// macros to find it and its parameter types).
#define DEC_SPLIT(name, T, D, BN, M) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ o_part, float* __restrict__ lse_part, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, false>(q, k, v, seqlens, o_part, lse_part, nullptr, nullptr, hkv, g, nq, nmax, scale); \
}
#define DEC_COMBINE(name, T, D) \
extern "C" __global__ void __launch_bounds__(128) \
name(const float* __restrict__ o_part, const float* __restrict__ lse_part, T* __restrict__ out, int n_rows, int splits) { \
    dec::decode_combine<T, D>(o_part, lse_part, out, n_rows, splits); \
}
DEC_SPLIT(decode_bf16_d64_m16, __nv_bfloat16, 64, 32, 1)
DEC_SPLIT(decode_bf16_d64_m32, __nv_bfloat16, 64, 32, 2)
DEC_COMBINE(combine_bf16_d64, __nv_bfloat16, 64)
DEC_SPLIT(decode_bf16_d128_m16, __nv_bfloat16, 128, 16, 1)
DEC_COMBINE(combine_bf16_d128, __nv_bfloat16, 128)
DEC_SPLIT(decode_f16_d64_m16, __half, 64, 32, 1)
DEC_SPLIT(decode_f16_d64_m32, __half, 64, 32, 2)
DEC_COMBINE(combine_f16_d64, __half, 64)
DEC_SPLIT(decode_f16_d128_m16, __half, 128, 16, 1)
DEC_COMBINE(combine_f16_d128, __half, 128)

// The fused kernels: the same split, the combine done by the last block of each (sequence, KV head, row group).
// work: one fp32 buffer, the block partials o_part [B Hq nq, gridDim.x, D] then lse_part [B Hq nq, gridDim.x].
#define DEC_FUSED(name, T, D, BN, M) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ work, T* __restrict__ out, int* __restrict__ counters, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, true>(q, k, v, seqlens, work, dec::lse_of(work, D, g * nq), out, counters, hkv, g, nq, nmax, scale); \
}
DEC_FUSED(decode_fused_bf16_d64_m16, __nv_bfloat16, 64, 32, 1)
DEC_FUSED(decode_fused_bf16_d64_m32, __nv_bfloat16, 64, 32, 2)
DEC_FUSED(decode_fused_bf16_d128_m16, __nv_bfloat16, 128, 16, 1)
DEC_FUSED(decode_fused_f16_d64_m16, __half, 64, 32, 1)
DEC_FUSED(decode_fused_f16_d64_m32, __half, 64, 32, 2)
DEC_FUSED(decode_fused_f16_d128_m16, __half, 128, 16, 1)
// A variant for the profile (benchmarks/decode_profile.py), not the op's default: the last block's merge with 16 of a
// thread's partial loads in flight, not 8: two L2 round trips instead of four at 32 block partials (32 spill).
#define DEC_FUSED_LOADS(name, T, D, BN, M, LOADS) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ work, T* __restrict__ out, int* __restrict__ counters, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, true, LOADS>(q, k, v, seqlens, work, dec::lse_of(work, D, g * nq), out, counters, hkv, g, nq, nmax, scale); \
}
DEC_FUSED_LOADS(decode_fused_bf16_d128_m16_l16, __nv_bfloat16, 128, 16, 1, 16)
DEC_FUSED_LOADS(decode_fused_f16_d128_m16_l16, __half, 128, 16, 1, 16)
// A variant for the profile, not the op's default until the GPU measures it faster: the last block's merge in one
// pass (merge_block_partials_online, 16 partials in flight), decode_attention(merge="online").
#define DEC_FUSED_ONLINE(name, T, D, BN, M) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ work, T* __restrict__ out, int* __restrict__ counters, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, true, 16, true>(q, k, v, seqlens, work, dec::lse_of(work, D, g * nq), out, counters, hkv, g, nq, nmax, scale); \
}
DEC_FUSED_ONLINE(decode_fused_bf16_d128_m16_online, __nv_bfloat16, 128, 16, 1)
DEC_FUSED_ONLINE(decode_fused_f16_d128_m16_online, __half, 128, 16, 1)
// Variants for the profile: the first tile asked for before cache_seqlens arrives (EARLY, decode_attention(early=
// True)), with the op's merge or the online one (MERGE_LOADS 8 / 16, ONLINE false / true).
#define DEC_FUSED_EARLY(name, T, D, BN, M, LOADS, ON) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ work, T* __restrict__ out, int* __restrict__ counters, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, true, LOADS, ON, true>(q, k, v, seqlens, work, dec::lse_of(work, D, g * nq), out, counters, hkv, g, nq, nmax, scale); \
}
DEC_FUSED_EARLY(decode_fused_bf16_d128_m16_early, __nv_bfloat16, 128, 16, 1, 8, false)
DEC_FUSED_EARLY(decode_fused_f16_d128_m16_early, __half, 128, 16, 1, 8, false)
DEC_FUSED_EARLY(decode_fused_bf16_d128_m16_online_early, __nv_bfloat16, 128, 16, 1, 16, true)
DEC_FUSED_EARLY(decode_fused_f16_d128_m16_online_early, __half, 128, 16, 1, 16, true)
// The op's fused kernels as programmatic dependent launches (decode_attention(pdl=True)): PDL above says what each
// block does before its griddepcontrol_wait (L2 prefetches) and what waits (everything else).
#define DEC_FUSED_PDL(name, T, D, BN, M) \
extern "C" __global__ void __launch_bounds__(DEC_NWARPS * 32) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens, \
     float* __restrict__ work, T* __restrict__ out, int* __restrict__ counters, int hkv, int g, int nq, int nmax, float scale) { \
    dec::decode_split<T, D, BN, M, true, 8, false, false, true>(q, k, v, seqlens, work, dec::lse_of(work, D, g * nq), out, counters, hkv, g, nq, nmax, scale); \
}
DEC_FUSED_PDL(decode_fused_bf16_d64_m16_pdl, __nv_bfloat16, 64, 32, 1)
DEC_FUSED_PDL(decode_fused_bf16_d64_m32_pdl, __nv_bfloat16, 64, 32, 2)
DEC_FUSED_PDL(decode_fused_bf16_d128_m16_pdl, __nv_bfloat16, 128, 16, 1)
DEC_FUSED_PDL(decode_fused_f16_d64_m16_pdl, __half, 64, 32, 1)
DEC_FUSED_PDL(decode_fused_f16_d64_m32_pdl, __half, 64, 32, 2)
DEC_FUSED_PDL(decode_fused_f16_d128_m16_pdl, __half, 128, 16, 1)

// A decode step's kernel before attention (decode_append: the producer of the PDL step): the new tokens' q, k, v
// from the QKV projection's output qkv [B, Hq + 2 Hkv, nq, D] go to q [B, Hq, nq, D] and to cache positions
// L_b .. L_b + nq - 1 of k_cache, v_cache [B, Hkv, Nmax, D] (L_b = seqlens_in[b]; rows past Nmax dropped), and
// cache_seqlens[b] = min(L_b + nq, Nmax): everything the decode behind it reads, but the older cache rows. First
// thing it lets that decode start (griddepcontrol_launch_dependents: the decode's griddepcontrol_wait still waits for
// all of this kernel and its writes). spin: cycles each block waits before it writes (0 in a step; the GPU test's
// large value makes a decode that read anything of the producer's before its wait see stale data).
// grid (Hq + 2 Hkv, B), 128 threads; D a multiple of 8.
template <typename T>
__device__ __forceinline__ void append_kv(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k_cache,
                                          T* __restrict__ v_cache, const int* __restrict__ seqlens_in,
                                          int* __restrict__ seqlens, int Hq, int Hkv, int nq, int Nmax, int D,
                                          long long spin) {
    griddepcontrol_launch_dependents();
    const int h = blockIdx.x, b = blockIdx.y, H = Hq + 2 * Hkv, L = max(0, seqlens_in[b]);
    if (spin) {
        const long long t0 = clock64();
        while (clock64() - t0 < spin) {}
    }
    const int C = D / 8;                                           // 16-byte chunks a row
    const uint4* src = reinterpret_cast<const uint4*>(qkv + ((size_t)b * H + h) * nq * D);
    for (int i = threadIdx.x; i < nq * C; i += blockDim.x) {
        const int tok = i / C, c = i % C;
        const uint4 x = src[i];
        if (h < Hq) {
            reinterpret_cast<uint4*>(q + (((size_t)b * Hq + h) * nq + tok) * D)[c] = x;
        } else if (L + tok < Nmax) {                               // K heads, then V heads
            T* cache = h < Hq + Hkv ? k_cache : v_cache;
            const size_t row = ((size_t)b * Hkv + (h - Hq) % Hkv) * Nmax + L + tok;
            reinterpret_cast<uint4*>(cache + row * D)[c] = x;
        }
    }
    if (h == 0 && threadIdx.x == 0) seqlens[b] = min(L + nq, Nmax);
}
#define DEC_APPEND(name, T) \
extern "C" __global__ void __launch_bounds__(128) \
name(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k_cache, T* __restrict__ v_cache, \
     const int* __restrict__ seqlens_in, int* __restrict__ seqlens, int hq, int hkv, int nq, int nmax, int d, long long spin) { \
    append_kv<T>(qkv, q, k_cache, v_cache, seqlens_in, seqlens, hq, hkv, nq, nmax, d, spin); \
}
DEC_APPEND(decode_append_bf16, __nv_bfloat16)
DEC_APPEND(decode_append_f16, __half)

# %% [markdown]
# The decode cards: `HMMA` for both products (a warp pads its `G nq` rows to 16, wasted tensor work that costs nothing
# here), `LDGSTS` for the cache, no spills; the combine kernel is a few dozen registers of plain loads. The fused
# kernels (`decode_fused_*`, the section "One launch" below) add a `MEMBAR.SC.GPU` (the `__threadfence`), one
# `ATOMG.E.ADD` (the ticket) and the merge's `LDG.E.128.STRONG.GPU` (partials read through L2).

# %%
for name in ("decode_bf16_d64_m16", "decode_bf16_d64_m32", "decode_bf16_d128_m16", "combine_bf16_d128",
             "decode_fused_bf16_d128_m16"):
    k = decode_kernels[name]
    print(f"{name:22s} {k.resources}")
    print(" " * 23, k.instruction_summary)

# %% [markdown]
# ### The launchers
#
# This cell holds everything the host does for both kernels: the checks of the arguments, the grid, the split plan,
# the partials. The GPU tests and `benchmarks/attention_inference.py` run this same cell (the CPU tests run it on the
# emulated kernels), so what is checked and timed there is what you read here.

# %%
# launchers: gqa_attention (gqa_attention_mma, gqa_attention_wgmma), decode_attention (tests/gpu/test_attention_inference_gpu.py and benchmarks/attention_inference.py run this cell too)
import functools
import math
from dataclasses import dataclass

import torch

import kernellab

GQA_BLOCK_M, GQA_BLOCK_N, GQA_THREADS = 128, 64, 128       # GQA_MT * 16 * GQA_NWARPS rows, GQA_BN keys (the cell)
DEC_WARPS = 4                                              # DEC_NWARPS: one split per warp
DEC_BLOCK_N = {64: 32, 128: 16}                            # keys per tile: 8 KB of K and V a stage at either d
DEC_MIN_KEYS = 64                                          # the split floor where one wave is full anyway
DEC_MIN_KEYS_SHORT = 16                                    # the lowest floor: one 16-key tile a warp at d = 128
DEC_FLOOR_WARPS = 256                                      # short caches: all keys over about this many warps
SM_SHARED_BYTES = 228 * 1024                               # shared memory per SM (sm_90), 1 KB of it per block reserved
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def _check(q, k, v, what):
    """bf16/fp16, d 64 or 128, contiguous [B, H, N, d] tensors on one device, Hq a multiple of Hkv."""
    if q.dtype not in DTYPE_NAMES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{what} takes bf16 or fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[-1] not in (64, 128) or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{what} takes q [B, Hq, N, d] and k, v [B, Hkv, N, d] with d = 64 or 128, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(f"{what}: the batch must match and Hq ({q.shape[1]}) be a multiple of Hkv ({k.shape[1]})")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise ValueError(f"{what} takes contiguous tensors (call .contiguous() first)")


def _check_gqa(q, k, v, what, hint=""):
    """_check, and k, v as long as q (prefill: N positions each); returns q's (B, Hq, N, d)."""
    _check(q, k, v, what)
    B, Hq, N, d = q.shape
    if k.shape[2] != N:
        raise ValueError(f"{what}: q has {N} positions and k, v {k.shape[2]}{hint}")
    return B, Hq, N, d


# From which N the wgmma step replaces the mma.sync kernel on sm_90, per head dim: measured on an H100
# (benchmarks/NOTES-attention-inference.md): at N = 512 the wgmma step is 0.86-0.97x the mma.sync kernel at d = 64 and
# 1.04-1.16x at d = 128; at N = 4096 1.33-1.59x at both.
GQA_WGMMA_FROM_N = {64: 1024, 128: 1}


def gqa_step(q, N, d):
    """"wgmma" or "mma.sync": the kernel gqa_attention launches for these inputs."""
    hopper = q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0)
    return "wgmma" if hopper and N >= GQA_WGMMA_FROM_N[d] else "mma.sync"


def gqa_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(d) [+ causal mask]) v with query head h reading KV head h // (Hq / Hkv), K/V never
    expanded; q: [B, Hq, N, d], k, v: [B, Hkv, N, d], bf16 or fp16, d = 64 or 128, contiguous. On sm_90 the wgmma
    step where it is the faster (gqa_step), else the mma.sync kernel."""
    _check(q, k, v, "gqa_attention")
    if gqa_step(q, q.shape[2], q.shape[3]) == "wgmma":
        return gqa_attention_wgmma(q, k, v, causal)
    return gqa_attention_mma(q, k, v, causal)


def gqa_attention_mma(q, k, v, causal=False):
    """gqa_attention on the mma.sync kernel (any GPU from sm_80): the G query heads of a KV head as one [G N, d]
    matrix; same arguments."""
    B, Hq, N, d = _check_gqa(q, k, v, "gqa_attention", "; for a KV cache use decode_attention")
    Hkv = k.shape[1]
    out = torch.empty_like(q)
    if N == 0 or B == 0:
        return out
    G = Hq // Hkv
    name = f"gqa_{DTYPE_NAMES[q.dtype]}_d{d}{'_causal' if causal else ''}"
    smem = (GQA_BLOCK_M + 4 * GQA_BLOCK_N) * d * 2
    gqa_kernels[name][(math.ceil(G * N / GQA_BLOCK_M), B * Hkv), GQA_THREADS, smem](q, k, v, out, N, G, d ** -0.5)
    return out


GQA_WGMMA = {64: dict(block_n=128, consumers=3, stages=2), 128: dict(block_n=128, consumers=2, stages=2)}  # the cell


def gqa_attention_wgmma(q, k, v, causal=False):
    """gqa_attention on Hopper (sm_90): tutorial 07's wgmma step with K/V read at KV head h / G through the TMA
    coordinates, the G query heads of a KV head launched next to each other; same arguments as gqa_attention."""
    B, Hq, N, d = _check_gqa(q, k, v, "gqa_attention_wgmma")
    Hkv = k.shape[1]
    out = torch.empty_like(q)
    if N == 0 or B == 0:
        return out
    cfg = GQA_WGMMA[d]
    block_m, block_n = 64 * cfg["consumers"], cfg["block_n"]
    # [B H, N, d] views; boxes of 64 columns (the 128-byte swizzle's span) by block_m or block_n rows
    maps = [kernellab.tensor_map(x.view(-1, N, d), (1, rows, 64)) for x, rows in ((q, block_m), (k, block_n),
                                                                                 (v, block_n))]
    smem = 1024 + (block_m + 2 * cfg["stages"] * block_n) * d * 2 + 256      # alignment slack, tiles, barriers
    name = f"gqa_wgmma_{DTYPE_NAMES[q.dtype]}_d{d}{'_causal' if causal else ''}"
    gqa_wgmma_kernels[name][(Hq // Hkv, math.ceil(N / block_m), B * Hkv), 128 * (cfg["consumers"] + 1), smem](
        *maps, out, N, d ** -0.5)
    return out


@dataclass(frozen=True)
class DecodePlan:
    """How decode_attention launches: rows per warp, row groups (grid z), splits per (sequence, KV head)."""
    rows_per_warp: int
    row_groups: int
    block_n: int
    splits: int
    shared_bytes: int
    blocks_per_sm: int

    @property
    def grid(self):
        return lambda B, Hkv: (self.splits // DEC_WARPS, B * Hkv, self.row_groups)


def decode_floor(B, Hkv, groups, Nmax, block_n=DEC_BLOCK_N[128]):
    """The plan's default split floor (keys a warp walks at least): every key of the B * Hkv * groups triples' Nmax
    caches spread over about DEC_FLOOR_WARPS warps (64 blocks), between DEC_MIN_KEYS_SHORT (and one tile of block_n
    keys: a shorter split would leave warps without a tile) and DEC_MIN_KEYS. Chosen
    with benchmarks/decode_profile.py's latency model (benchmarks/NOTES-attention-inference.md, "the split floor"): at
    Hq 32 / Hkv 8, d = 128 it gives 16 at B = 1 with 512 positions, 32 at 1k and 64 from 2k, and 64 from B = 4;
    short caches get shorter chains of tiles, long ones no more block partials to merge than the wave needs."""
    return min(DEC_MIN_KEYS, max(DEC_MIN_KEYS_SHORT, block_n, B * Hkv * groups * Nmax // DEC_FLOOR_WARPS))


@functools.lru_cache(maxsize=1024)
def decode_plan(B, Hkv, G, nq, Nmax, d, sms=SMS, min_keys=None):
    """Rows per warp (32 only at d = 64, where it does not spill), the row groups that cover G * nq rows, and the
    splits: as many blocks as one wave holds (blocks_per_sm a SM, from shared memory and registers, times the SMs),
    shared evenly by the B * Hkv * row_groups (sequence, KV head, row group) triples, each warp at least min_keys
    keys of an Nmax cache (None: decode_floor's), a multiple of DEC_WARPS. Planned once per shape (cached): the
    call's host path is a lookup."""
    rows = G * nq
    rows_per_warp = 32 if d == 64 and rows > 16 else 16
    groups = -(-rows // rows_per_warp)
    block_n = DEC_BLOCK_N[d]
    if min_keys is None:
        min_keys = decode_floor(B, Hkv, groups, Nmax, block_n)
    shared = DEC_WARPS * (rows_per_warp + 4 * block_n) * d * 2
    per_sm = min(3, SM_SHARED_BYTES // (shared + 1024))             # blocks an SM holds (registers allow 3, or 2
    per_sm = min(per_sm, 2 if rows_per_warp == 32 else 3)           # with 32 rows a warp)
    wave = sms * per_sm * DEC_WARPS // max(1, B * Hkv * groups)     # warps of one wave per (sequence, head, group)
    splits = max(1, min(wave, -(-Nmax // min_keys)))
    splits = max(DEC_WARPS, splits // DEC_WARPS * DEC_WARPS)        # whole blocks, rounded down (one wave, not two)
    # the fused kernel's last block keeps one weight per (row, block partial) in its shared memory
    assert rows_per_warp * (splits // DEC_WARPS) * 4 <= shared, (rows_per_warp, splits, shared)
    return DecodePlan(rows_per_warp, groups, block_n, splits, shared, per_sm)


def _raw_stream(index):
    """The current CUDA stream's handle on device `index` (torch's C call, as inductor's generated code uses)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


_DEC_COUNTERS = {}                                          # (device, stream) -> int32 zeros: the fused kernel's tickets


def decode_counters(device, n):
    """n int32 zeros on `device`: the fused kernel's ticket counters, one per (sequence, KV head, row group). Made once
    per (device, stream) and reused by every call, since the kernel's last block of each triple resets its counter
    to 0 (calls on one stream run in order; another stream gets its own). Inside a CUDA graph's capture a missing or
    too small buffer is made (and zeroed) in the graph, not kept."""
    key = (device, _raw_stream(device.index) if device.type == "cuda" else 0)
    counters = _DEC_COUNTERS.get(key)
    if counters is None or counters.numel() < n:
        counters = torch.zeros(max(n, 256), dtype=torch.int32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _DEC_COUNTERS[key] = counters
    return counters


def _decode_args(q, k_cache, v_cache, cache_seqlens, what):
    _check(q, k_cache, v_cache, what)
    B, nq = q.shape[0], q.shape[2]
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (B,) or cache_seqlens.device != q.device:
        raise ValueError(f"{what}: cache_seqlens is an int32 [B] = [{B}] tensor on {q.device}, got "
                         f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)} on {cache_seqlens.device}")


def decode_attention(q, k_cache, v_cache, cache_seqlens, min_keys=None, merge_loads=8, merge="shared",
                     early=False, pdl=False):
    """Attention of nq new tokens per sequence against its KV cache, split along the keys (flash-decoding), in one
    launch: the last block of each (sequence, KV head, row group) merges the splits' partials.
    q: [B, Hq, nq, d]; k_cache, v_cache: [B, Hkv, Nmax, d]; cache_seqlens: [B] int32 (values above Nmax read as
    Nmax). Token i of sequence b sees keys 0 .. cache_seqlens[b] - nq + i; a token that sees none gets zeros.
    min_keys: the fewest keys a split walks (None: the plan's default, decode_floor). merge_loads: partials a thread of the last block keeps
    in flight (8; 16, a variant the decode profile times, at d = 128). merge: how the last block merges, "shared"
    (weights through shared memory, then the o loads) or "online" (one pass, 16 partials' lse and o in flight; a
    variant the decode profile times, at d = 128 with 16 rows a warp). early: each warp asks for its first tile before
    cache_seqlens arrives, guessing a full cache (a variant the decode profile times, at d = 128). pdl: a programmatic
    dependent launch behind the previous kernel on the stream (the step's producer, e.g. decode_append): the blocks
    start while it runs, prefetch their first tile into L2 and wait (griddepcontrol.wait) before they read q,
    cache_seqlens or any K/V row (the kernel's PDL says why); sm_90 on, elsewhere a plain launch with the same result.
    The op's kernel otherwise (merge "shared", 8 loads, not early)."""
    _decode_args(q, k_cache, v_cache, cache_seqlens, "decode_attention")
    B, Hq, nq, d = q.shape
    if merge_loads not in (8, 16) or (merge_loads == 16 and d != 128):
        raise ValueError(f"decode_attention: merge_loads is 8, or 16 at d = 128; got {merge_loads} at d = {d}")
    if merge not in ("shared", "online") or (merge == "online" and (d != 128 or merge_loads != 8)):
        raise ValueError(f"decode_attention: merge is 'shared', or 'online' at d = 128 (its own 16 loads in flight, "
                         f"merge_loads left at 8); got merge={merge!r}, merge_loads={merge_loads} at d = {d}")
    if early and (d != 128 or merge_loads != 8):
        raise ValueError(f"decode_attention: early=True is a variant at d = 128 with merge_loads 8; got d = {d}, "
                         f"merge_loads={merge_loads}")
    if pdl and (early or merge != "shared" or merge_loads != 8):
        raise ValueError(f"decode_attention: pdl=True launches the op's kernel (merge 'shared', merge_loads 8, not "
                         f"early: early's loads would come before the wait); got merge={merge!r}, "
                         f"merge_loads={merge_loads}, early={early}")
    Hkv, Nmax = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if B == 0 or nq == 0:
        return out
    G = Hq // Hkv
    plan = decode_plan(B, Hkv, G, nq, Nmax, d, SMS, min_keys)
    rows, parts = B * Hq * nq, plan.splits // DEC_WARPS           # one partial per block: its warps merged
    work = torch.empty(rows * parts * (d + 1), dtype=torch.float32, device=q.device)     # o_part, then lse_part
    counters = decode_counters(q.device, B * Hkv * plan.row_groups)
    name = (f"decode_fused_{DTYPE_NAMES[q.dtype]}_d{d}_m{plan.rows_per_warp}" + ("_l16" if merge_loads == 16 else "")
            + ("_online" if merge == "online" else "") + ("_early" if early else "") + ("_pdl" if pdl else ""))
    decode_kernels[name][plan.grid(B, Hkv), 32 * DEC_WARPS, plan.shared_bytes](
        q, k_cache, v_cache, cache_seqlens, work, out, counters, Hkv, G, nq, Nmax, d ** -0.5, **DEC_PDL[pdl])
    return out


DEC_PDL = {False: {}, True: {"pdl": True}}                 # the launch's keyword: none for the plain launch


def decode_append(qkv, k_cache, v_cache, seqlens_in, seqlens=None, spin=0, q=None):
    """The kernel before attention in a decode step (a model's: after the QKV projection, before decode_attention):
    qkv [B, Hq + 2 Hkv, nq, d] (bf16 or fp16; heads q, then k, then v) goes to a new q [B, Hq, nq, d] and to cache
    positions seqlens_in[b] .. + nq - 1 of k_cache, v_cache [B, Hkv, Nmax, d] (in place; rows past Nmax dropped);
    seqlens[b] = min(seqlens_in[b] + nq, Nmax) (a new int32 [B], and q a new tensor, unless given). Returns (q, seqlens). It lets a decode
    launched behind it with pdl=True start at once (griddepcontrol.launch_dependents). spin: clock cycles each block
    waits before writing (tests: a decode that read the producer's output before its wait would see it stale)."""
    B, H, nq, d = qkv.shape
    Hkv, Nmax = k_cache.shape[1], k_cache.shape[2]
    if (qkv.dtype not in DTYPE_NAMES or k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype or H <= 2 * Hkv
            or k_cache.shape != v_cache.shape or k_cache.shape[0] != B or k_cache.shape[3] != d or d % 8
            or not (qkv.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous())):
        raise ValueError(f"decode_append takes contiguous bf16/fp16 qkv [B, Hq + 2 Hkv, nq, d] and k_cache, v_cache "
                         f"[B, Hkv, Nmax, d] of its dtype, got {qkv.dtype} {tuple(qkv.shape)}, {k_cache.dtype} "
                         f"{tuple(k_cache.shape)}, {v_cache.dtype} {tuple(v_cache.shape)}")
    q = torch.empty(B, H - 2 * Hkv, nq, d, dtype=qkv.dtype, device=qkv.device) if q is None else q
    seqlens = torch.empty_like(seqlens_in) if seqlens is None else seqlens
    if B and nq:
        decode_kernels[f"decode_append_{DTYPE_NAMES[qkv.dtype]}"][(H, B), 128](
            qkv, q, k_cache, v_cache, seqlens_in, seqlens, H - 2 * Hkv, Hkv, nq, Nmax, d, spin)
    return q, seqlens


def decode_attention_two_kernels(q, k_cache, v_cache, cache_seqlens, min_keys=None):
    """decode_attention as the split kernel and a separate combine kernel (two launches): the tutorial's first
    decoding step, kept to measure the fused one against; same arguments and result."""
    _decode_args(q, k_cache, v_cache, cache_seqlens, "decode_attention")
    B, Hq, nq, d = q.shape
    Hkv, Nmax = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if B == 0 or nq == 0:
        return out
    G = Hq // Hkv
    plan = decode_plan(B, Hkv, G, nq, Nmax, d, SMS, min_keys)
    rows, parts = B * Hq * nq, plan.splits // DEC_WARPS
    o_part = torch.empty(rows, parts, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(rows, parts, dtype=torch.float32, device=q.device)
    dt = DTYPE_NAMES[q.dtype]
    decode_kernels[f"decode_{dt}_d{d}_m{plan.rows_per_warp}"][plan.grid(B, Hkv), 32 * DEC_WARPS, plan.shared_bytes](
        q, k_cache, v_cache, cache_seqlens, o_part, lse_part, Hkv, G, nq, Nmax, d ** -0.5)
    decode_kernels[f"combine_{dt}_d{d}"][-(-rows // 4), 128](o_part, lse_part, out, rows, parts)
    return out


def gqa_reference(q, k, v, causal=False):
    """GQA attention in float64 (K, V expanded), the reference of the checks."""
    G = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = qd @ kd.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vd


def decode_mask(cache_seqlens, nq, Nmax):
    """[B, 1, nq, Nmax] bool: token i of sequence b sees key j iff j <= cache_seqlens[b] - nq + i."""
    last = cache_seqlens.long().clamp(max=Nmax)[:, None] - nq + torch.arange(nq, device=cache_seqlens.device)
    return (torch.arange(Nmax, device=cache_seqlens.device)[None, None, :] <= last[:, :, None])[:, None]


def decode_reference(q, k_cache, v_cache, cache_seqlens):
    """decode_attention in float64; a token that sees no key gives zeros, as the kernel defines."""
    G = q.shape[1] // k_cache.shape[1]
    mask = decode_mask(cache_seqlens, q.shape[2], k_cache.shape[2])
    s = q.double() @ k_cache.double().repeat_interleave(G, 1).transpose(-2, -1) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)                       # a fully masked row: NaN -> 0
    return p @ v_cache.double().repeat_interleave(G, 1)


def decode_torch(q, k_cache, v_cache, cache_seqlens):
    """decode_attention in PyTorch without expanding K/V: [B, Hkv, G nq, d] rows against the cache, masked softmax."""
    B, Hq, nq, d = q.shape
    Hkv, Nmax = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    qr = q.reshape(B, Hkv, G * nq, d)
    s = (qr @ k_cache.transpose(-2, -1)).float() * d ** -0.5                  # [B, Hkv, G nq, Nmax]
    last = cache_seqlens.long()[:, None] - nq + torch.arange(nq, device=q.device)          # [B, nq]
    mask = torch.arange(Nmax, device=q.device)[None, None, :] <= last[:, :, None]          # [B, nq, Nmax]
    s = s.masked_fill(~mask.repeat(1, G, 1)[:, None], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0).to(q.dtype)
    return (p @ v_cache).reshape(B, Hq, nq, d)


# %% [markdown]
# ### As PyTorch operators
#
# `kernellab.op` registers both launchers as operators (`torch.ops.kl.gqa_attention`, `torch.ops.kl.decode_attention`):
# eager calls, `torch.compile(fullgraph=True)` and CUDA graphs see one op each; the fake implementations say the output
# is shaped like `q`.

# %%
# launchers: ops
import kernellab


@kernellab.op("kl::gqa_attention", "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor",
              outputs=lambda q, k, v, causal: q)
def kl_gqa_attention(q, k, v, causal):
    return gqa_attention(q, k, v, causal)


@kernellab.op("kl::decode_attention", "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens) -> Tensor",
              outputs=lambda q, k_cache, v_cache, cache_seqlens: q)
def kl_decode_attention(q, k_cache, v_cache, cache_seqlens):
    return decode_attention(q, k_cache, v_cache, cache_seqlens)


@kernellab.op("kl::decode_attention_pdl",
              "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens) -> Tensor",
              outputs=lambda q, k_cache, v_cache, cache_seqlens: q)
def kl_decode_attention_pdl(q, k_cache, v_cache, cache_seqlens):
    """decode_attention(pdl=True): behind the decode step's previous kernel (programmatic dependent launch)."""
    return decode_attention(q, k_cache, v_cache, cache_seqlens, pdl=True)


# %%
for B, Hkv, G, nq, Nmax, d in ((1, 8, 4, 1, 131072, 128), (1, 8, 4, 1, 1024, 128), (32, 8, 4, 1, 8192, 128),
                               (4, 8, 8, 4, 8192, 64), (2, 1, 32, 1, 4096, 128)):
    p = decode_plan(B, Hkv, G, nq, Nmax, d)
    blocks = p.splits // DEC_WARPS * B * Hkv * p.row_groups
    print(f"B={B:2d} Hkv={Hkv} G={G:2d} nq={nq} Nmax={Nmax:6d} d={d:3d}: {p.splits:3d} splits x {p.row_groups} row "
          f"group(s) of {p.rows_per_warp} rows, {blocks:4d} blocks ({blocks / (SMS * p.blocks_per_sm):.2f} waves of "
          f"{p.blocks_per_sm} a SM), {p.shared_bytes // 1024} KiB shared")

# %% [markdown]
# ### One launch: the combine in the last block
#
# Measured on an H100 (benchmarks/NOTES-attention-inference.md), the two-kernel step reaches 90-97 % of the copy
# bandwidth on caches of 32 MB and more, but at `B = 1` with an 8k cache only 37 % (30 µs as called, where the split
# kernel takes 9.8 µs and the combine 5.5 µs in the profiler): with so little to read, the second launch, its ramp and
# the gap between the two kernels are half the time. cuDNN's split-KV path has the same two kernels, 8.8 + 2.8 µs.
#
# The combine does not need a kernel of its own. Each block, after writing its partial, makes its writes visible to
# the whole GPU (`__threadfence`) and takes a **ticket**: `atomicAdd` on one counter per (sequence, KV head, row
# group). The block that draws the last ticket (`gridDim.x - 1`) knows every other block of its triple has written its
# partial, so it merges them: one weight per partial into shared memory (a warp a row: `M = max lse`, `2^(lse - M)`,
# their sum), then each thread a `float4` of a row's columns, 8 partials in flight at a time, read with `ld.global.cg`
# (through L2, where the other SMs' writes are). It also sets the counter back to 0, so the next call finds zeros
# without a `memset` launch: the launcher makes the counters once per device and stream (`decode_counters`). Where a
# triple has a single block (`B Hkv` fills the wave by itself) that block writes the output directly, no ticket.
# This is tutorial 03's single-pass reduction (the last block finishes the sum) applied to the softmax merge.
#
# The plan (`decode_plan`) is the two-kernel step's: as many blocks as one wave holds (two per SM at `d = 128`: 80 KB
# of shared memory each), shared by the `B Hkv` triples, each warp walking at least a floor of keys; at `B = 1`, 8k
# that is 32 blocks a head, 256 in all for 264 places. It is cached per shape, and the two partial buffers are one
# allocation. The floor (`decode_floor`, a function of `Nmax`) is `DEC_MIN_KEYS = 64` where the wave is full anyway;
# a short cache's keys are spread over about `DEC_FLOOR_WARPS = 256` warps, down to 16 (one tile a warp), so each
# warp's chain of dependent tile loads is shorter without more block partials than the merge can take cheaply. The
# rule is the latency model's choice (`benchmarks/decode_profile.py`, `floor_table`): at `B = 1` it gives 16 keys at
# 512 positions, 32 at 1k (two tiles a warp instead of four: predicted 8.9 µs against 11.5 under Nsight Compute on an
# H100) and 64 from 2k, where the cache's stream, not the chain, sets the time; from `B = 4`, 64 at every cache.
# `decode_attention(..., min_keys=64)` keeps the old floor.
#
# **Predictions** (H100, `B = 1`, `Hq = 32`, `Hkv = 8`, `d = 128`, kernellab.bench): the split kernel's 9.8-11 µs,
# plus a tail of about 1.5 µs (the last block's fence, ticket and a 64 KB merge from L2), no second launch: about
# 13 µs at 8k, **80-85 % of copy** (from 37 %), about 2.3x the two-kernel step, >= 1.0x cuDNN (its two kernels and the
# gap between them). At 128k the gain is the combine's 5.9 µs less the tail, 2-3 %. At 1k (4 MB, 16 warps a head, 32
# blocks on 132 SMs at the floor of 64 then) the launch still dominates: about 6 µs, 25 % of copy, 2x the two-kernel step. Back to back
# (`sustained`) the call is host-bound: one launch and one allocation fewer and the plan a lookup should take about
# 40 % off the 115 µs measured at 8k.

# %%
# %%gpu
def decode_vs_two_kernels(B, L, Hq=32, Hkv=8, d=128):
    """kernellab.bench of the one-launch decode against the two-kernel step, all caches full."""
    def inputs(g):
        q = torch.randn(B, Hq, 1, d, generator=g).to(torch.bfloat16).cuda()
        kc, vc = (torch.randn(B, Hkv, L, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        return q, kc, vc, torch.full((B,), L, dtype=torch.int32, device="cuda")
    return kernellab.bench(decode_attention, inputs, baselines={"two-kernel step": decode_attention_two_kernels},
                           bytes=lambda *a: decode_counts(B, Hq, Hkv, 1, L, d)[1], name="decode_attention (one launch)")


from kernellab.run.measure.ceilings import device_ceilings

copy_gbps = device_ceilings().dram_gbps
for B, L in ((1, 1024), (1, 8192), (1, 131072), (32, 8192)):
    r = decode_vs_two_kernels(B, L)
    moved = decode_counts(B, 32, 8, 1, L, 128)[1]
    two = r.baselines[0]
    print(f"B={B:2d} cache {L:6d}: one launch {r.median_ms * 1e3:7.1f} us ({moved / r.median_ms / 1e6 / copy_gbps:4.0%} "
          f"of copy), two kernels {two.median_ms * 1e3:7.1f} us ({moved / two.median_ms / 1e6 / copy_gbps:4.0%}): "
          f"{r.speedups[0].ratio:.2f}x")

# %% [markdown]
# ### Behind the producer: programmatic dependent launch
#
# A model never calls the decode alone: before it, in the same step, a kernel writes the new token's `q`, its `K`/`V`
# row into the cache and the new `cache_seqlens` (here `decode_append`, the kernel after the QKV projection). On one
# stream the decode's blocks are placed only once that kernel has finished, so the fixed part measured above (the
# grid's start, the dispatch of a wave of 80 KB blocks, `cache_seqlens`' trip to DRAM: about 5 µs of the 9 at 8k) is
# paid after it, on the step's critical path. **Programmatic dependent launch** (PDL, sm_90) lets the decode start
# while the producer runs: launched with `pdl=True` (kernellab's `k[grid, block](..., pdl=True)`: `cuLaunchKernelEx`
# with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`), its blocks become resident as soon as every producer
# block has executed `griddepcontrol.launch_dependents` (the producer's first instruction), and each waits in
# `griddepcontrol.wait` (`kl/pdl.cuh`'s `griddepcontrol_wait`) until the producer has finished and its writes are
# visible.
#
# **What may come before the wait** is the whole design, and the answer is conservative. Not `q` (the producer writes
# it). Not `cache_seqlens`: in a step it is written with the new row, so the decode does not know `L` before the wait,
# and without `L` it cannot tell which cache rows are older than the new one: the cache positions before the newest
# are read-only in a decode step, but *which* positions those are is the producer's output. So no load into shared
# memory (`cp.async`) or registers happens before the wait: a `K`/`V` row the producer may be writing would be read
# stale. What is left is safe for any address: each warp's addresses, and an **L2 prefetch** (`prefetch.global.L2`) of
# its first tile on the guess that the cache is full (the `early` variant's guess). L2 is where every SM's loads and
# stores meet, so a line prefetched there is updated by the producer's store, never stale; a wrong guess costs a wasted
# prefetch, no error. *Where* the source puts a load is not where the compiler puts it: `seqlens[b]` through a
# `const int* __restrict__` compiles to a read-only load the compiler may issue before the wait (the SASS had it
# first thing, before `ACQBULK`), so the PDL kernel reads it with `kl/pdl.cuh`'s `load_after_wait`, which stays after
# it; `tests/test_attention_inference.py` checks the SASS. Nothing is written before the wait, not even the decode's
# own buffers: PyTorch's caching allocator may give them memory the producer, still running, reads (a temporary freed
# when it was launched, such as the projection's output). Below sm_90, and in the CPU emulator (launches there run one after the other, so the wait
# is a no-op), `pdl=True` is a plain launch with the same result.
#
# **Predictions** (H100, `B = 1`, 8k, kernellab.bench, from the latency model in
# `benchmarks/NOTES-attention-inference.md`, `benchmarks/decode_pdl.py`'s `prediction`): alone the decode is 23.3 µs as
# called, 48 % of copy. In a step, measured as the step's time minus the producer's alone, 21.8 µs plain (51 %: its
# launch overlaps the producer) and 19.3 µs with PDL (58 %): up to 4.8 µs of start, ramp, the gap between the kernels,
# `cache_seqlens` (now an L2 hit) and the first tile could leave the critical path, but no more than the producer lasts
# (about 2.5 µs for `decode_append`). **Not 80 %**: the last block's merge tail (3.6 µs) and the stream's own DRAM
# latency stay. At 1k 14 % -> 19 %, at 32k 81 % -> 84 %. `benchmarks/attention_inference.py --part decode --pdl` measures the step at
# 1k-128k (and with a QKV projection before the producer), by kernellab.bench, do_bench, sustained and in a CUDA graph.

# %%
# %%gpu
def decode_step_pdl(L, B=1, Hq=32, Hkv=8, d=128):
    """kernellab.bench of a decode step (decode_append, then decode_attention) with the decode launched as a PDL
    launch, against the plain step and the producer alone; the new token's row is the cache's last."""
    def inputs(g):
        kc, vc = (torch.randn(B, Hkv, L, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        qkv = torch.randn(B, Hq + 2 * Hkv, 1, d, generator=g).to(torch.bfloat16).cuda()
        return qkv, kc, vc, torch.full((B,), L - 1, dtype=torch.int32, device="cuda")

    def step(qkv, kc, vc, old, pdl=True):
        q, sl = decode_append(qkv, kc, vc, old)
        return decode_attention(q, kc, vc, sl, pdl=pdl)

    return kernellab.bench(step, inputs, name="step with PDL", baselines={
        "plain step": lambda *a: step(*a, pdl=False), "producer alone": lambda *a: decode_append(*a)})


for L in (1024, 8192, 131072):
    r = decode_step_pdl(L)
    plain, producer = (b.median_ms for b in r.baselines)
    moved = decode_counts(1, 32, 8, 1, L, 128)[1]
    share = lambda ms: moved / ((ms - producer) * 1e-3) / 1e9 / copy_gbps        # noqa: E731
    print(f"cache {L:6d}: step {plain * 1e3:6.1f} us, with PDL {r.median_ms * 1e3:6.1f} us ({plain / r.median_ms:.2f}x);"
          f" decode in the step {share(plain):4.0%} of copy, with PDL {share(r.median_ms):4.0%}")

# %% [markdown]
# **Measured** (NVIDIA H200, 2026-11-28, `python3 tools/gpu/run.py bench-decode-pdl` and the cell above): by
# kernellab.bench the step is 1.13x faster with PDL at 1k, 1.07x at 8k, 1.05x at 32k and 1.01x at 128k (1.8-2.6 µs
# a step; predicted up to 2.5 µs, the producer's length), and at 8k the decode's share of copy in the step goes
# 39 % -> 43 % (predicted 36 % -> 41 %). The control shows the mechanism: a consumer launched with PDL but without
# `griddepcontrol.wait` read the producer's flag stale every time, its first block starting 20 ms before a 20 ms
# producer ended, on the default stream and on a side stream; launched plainly it started 1.6 µs after. The PDL op
# gives the plain op's result bit for bit, fresh and on poisoned buffers, in a CUDA graph too (10 GPU tests). In a CUDA
# graph PDL gains the same 1.03-1.08x. **As called from Python the timings disagree**: by do_bench the PDL step is
# 1.30x faster at 1k and 0.93x at 8k, in the sustained loop 0.50x at 1k (64.6 µs against 32.2), 0.76x at 8k, 0.94x at
# 32k and 1.02x at 128k. The launch itself is not the difference (one cuLaunchKernelEx with one attribute in place of
# cuLaunchKernel); what makes back-to-back PDL steps slower is not known yet. So `pdl=True` stays an option, off by
# default: use it where the step is captured in a CUDA graph.

# %% [markdown]
# ## Check on awkward shapes
#
# `N = 1, 63, 65, 1000, 1031, 4097` for GQA at ratios 1, 4 and 8 (and MQA), both dtypes, `d = 64` and 128, causal
# and not; for decoding, a batch whose cache lengths are 0, 1, one short of a tile, one over, and long ones, with
# `nq = 1` and 4. Each against the float64 reference, with SDPA's own error in the same dtype beside ours (SDPA with
# `enable_gqa=True`, and for decoding a boolean mask; rows SDPA leaves NaN, those with no key, are compared with our
# zeros only against the reference). The bar: our error at most twice SDPA's plus the dtype's rounding of the output.

# %%
CHECK_N = (1, 63, 65, 1000, 1031, 4097)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sdpa_gqa(q, k, v, causal=False, mask=None):
    """SDPA with enable_gqa=True (no K/V expansion), PyTorch choosing the backend."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, enable_gqa=True)


def check_gqa(dtypes=DTYPES, dims=(64, 128), ns=CHECK_N, ratios=((8, 8), (32, 8), (32, 4), (8, 1))):
    rows = []
    g = torch.Generator().manual_seed(0)
    for dname, dtype in dtypes.items():
        for d in dims:
            for Hq, Hkv in ratios:
                for causal in (False, True):
                    for N in ns:
                        B = 1 if N > 2000 else 2
                        q = torch.randn(B, Hq, N, d, generator=g).to(dtype).cuda()
                        k, v = (torch.randn(B, Hkv, N, d, generator=g).to(dtype).cuda() for _ in range(2))
                        ref = gqa_reference(q, k, v, causal)
                        ours = (gqa_attention(q, k, v, causal).double() - ref).abs().max().item()
                        theirs = (sdpa_gqa(q, k, v, causal).double() - ref).abs().max().item()
                        rows.append((dname, d, Hq, Hkv, causal, N, ours, theirs))
    return rows


def check_decode(dtypes=DTYPES, dims=(64, 128), lens=(0, 1, 31, 33, 1000, 4097, 8191, 20000), nqs=(1, 4),
                 heads=((32, 8), (64, 8), (8, 8), (16, 1))):
    rows = []
    g = torch.Generator().manual_seed(1)
    for dname, dtype in dtypes.items():
        for d in dims:
            for Hq, Hkv in heads:
                for nq in nqs:
                    B, Nmax = len(lens), max(lens) + 5
                    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype).cuda()
                    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype).cuda() for _ in range(2))
                    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
                    ref = decode_reference(q, kc, vc, sl)
                    ours = decode_attention(q, kc, vc, sl).double()
                    mask = decode_mask(sl, nq, Nmax)
                    seen = mask.any(-1, keepdim=True).expand_as(ref)        # rows with at least one key
                    sd = sdpa_gqa(q, kc, vc, mask=mask).double()
                    rows.append((dname, d, Hq, Hkv, nq, (ours - ref).abs().max().item(),
                                 (sd - ref)[seen].abs().max().item(), bool((ours[~seen] == 0).all())))
    return rows


# %%
# %%gpu
gqa_rows = check_gqa()
bad = [r for r in gqa_rows if not r[6] <= 2 * r[7] + (8e-3 if r[0] == "bf16" else 1e-3)]
print(f"GQA: {len(gqa_rows) - len(bad)}/{len(gqa_rows)} cases within 2x SDPA's error; largest error "
      f"{max(r[6] for r in gqa_rows):.2e}, SDPA's {max(r[7] for r in gqa_rows):.2e}")
for r in bad[:10]:
    print("  outside:", r)
dec_rows = check_decode()
bad = [r for r in dec_rows if not (r[5] <= 2 * r[6] + (8e-3 if r[0] == "bf16" else 1e-3) and r[7])]
print(f"decode: {len(dec_rows) - len(bad)}/{len(dec_rows)} cases within 2x SDPA's error, empty rows zero; largest "
      f"error {max(r[5] for r in dec_rows):.2e}, SDPA's {max(r[6] for r in dec_rows):.2e}")
for r in bad[:10]:
    print("  outside:", r)

# %% [markdown]
# ## Timing against PyTorch
#
# GQA against SDPA's FLASH backend on `K`, `V` expanded to `Hq` heads beforehand (the expansion outside the timing, so
# the FLASH kernel alone) and SDPA with `enable_gqa=True` as PyTorch dispatches it (on an H100 with torch 2.11 that is
# cuDNN's Hopper kernel, `cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_*`, found with the profiler); decoding against every PyTorch path that computes the same thing: SDPA with `enable_gqa` under
# each backend that accepts it, and a `torch.compile`d reshape-and-matmul version (the `G nq` query rows of a KV head
# as one matrix, exactly the kernel's packing, so nothing is expanded). Decoding is also reported as a fraction of the
# copy bandwidth. `benchmarks/attention_inference.py` runs the whole grid, timed as called three ways.

# %%
def decode_bench(B=1, Hq=32, Hkv=8, L=32768, d=128, nq=1):
    """kernellab.bench of decode_attention against the PyTorch paths, all caches full (L = Nmax)."""
    def inputs(g):
        q = torch.randn(B, Hq, nq, d, generator=g).to(torch.bfloat16).cuda()
        kc, vc = (torch.randn(B, Hkv, L, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        return q, kc, vc, torch.full((B,), L, dtype=torch.int32, device="cuda")

    compiled = torch.compile(decode_torch, dynamic=False)
    baselines = {"torch.compile grouped matmul": compiled}
    for name, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("SDPA cudnn", SDPBackend.CUDNN_ATTENTION), ("SDPA math", SDPBackend.MATH)):
        def run(q, kc, vc, sl, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        try:
            run(*inputs(torch.Generator().manual_seed(0)))
            baselines[name] = run
        except RuntimeError:
            pass                                                              # this backend does not take the case
    return kernellab.bench(decode_attention, inputs, baselines=baselines,
                           bytes=lambda q, kc, vc, sl: decode_counts(B, Hq, Hkv, nq, L, d)[1], name="decode_attention")


# %%
# %%gpu
from kernellab.run.measure.ceilings import device_ceilings

copy_gbps = device_ceilings().dram_gbps
for B, L in ((1, 8192), (1, 131072), (16, 8192)):
    r = decode_bench(B=B, L=L)
    moved = decode_counts(B, 32, 8, 1, L, 128)[1]
    print(f"B={B:2d} cache {L:6d}: {r.median_ms * 1e3:8.1f} us, {moved / r.median_ms / 1e6 / copy_gbps:.0%} of copy; "
          + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))
r

# %%
# %%gpu
def gqa_inputs(B, Hq, Hkv, N, d):
    """q, k, v and K, V expanded to Hq heads (made here, outside the timing)."""
    def inputs(g):
        q = torch.randn(B, Hq, N, d, generator=g).to(torch.bfloat16).cuda()
        k, v = (torch.randn(B, Hkv, N, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        return q, k, v, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    return inputs


def flash_expanded(q, k_expanded, v_expanded, causal=False):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k_expanded, v_expanded, is_causal=causal)


for N, d, causal in ((4096, 128, False), (4096, 128, True), (512, 64, True)):
    B = 16384 // N
    r = kernellab.bench(lambda q, k, v, ke, ve: gqa_attention(q, k, v, causal), gqa_inputs(B, 32, 8, N, d),
                        baselines={"SDPA flash, K/V expanded beforehand": lambda q, k, v, ke, ve: flash_expanded(
                                       q, ke, ve, causal),
                                   "SDPA enable_gqa": lambda q, k, v, ke, ve: sdpa_gqa(q, k, v, causal),
                                   "mma.sync kernel": lambda q, k, v, ke, ve: gqa_attention_mma(q, k, v, causal)},
                        flops=lambda q, *_: gqa_counts(*q.shape[:2], 8, q.shape[2], q.shape[3], causal)[0],
                        name=f"gqa N={N} d={d}{' causal' if causal else ''} ({gqa_step(torch.empty(0, device='cuda'), N, d)})")
    print(f"N={N:5d} d={d:3d} causal={causal!s:5s}: {r.tflops:6.1f} TFLOP/s; "
          + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))

# %% [markdown]
# ## Exercises
#
# ### Exercise 09-split-combine: merge flash-decoding's split partials
#
# The second kernel of the decode, on the CUDA cores in fp32. Row `r` has `splits` partial results:
# `o_part[r][s][0 .. d-1]` (`[rows, splits, d]`, row-major) and `lse[r][s]` (log2 units, `-inf` for a split that saw
# no key). Write `out[r][c] = sum_s w_s o_part[r][s][c] / sum_s w_s` with `w_s = exp2f(lse[r][s] - M)` and
# `M = max_s lse[r][s]`; a row whose splits are all `-inf` gets 0, never NaN. `lse` reaches +-200, so subtract `M`
# before `exp2f`. Block `blockIdx.x` takes row `blockIdx.x`; its threads take columns `threadIdx.x`,
# `threadIdx.x + blockDim.x`, ... below `d`. The grader launches blocks of 32, 128 and 256 threads, grid = rows, on up
# to 64 splits and `d` up to 128, against a float64 merge; the optional speed bar is half the speed of the same merge
# in PyTorch.

# %%
# %%cuda
// exercise: 09-split-combine
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void combine_splits(const float* o_part, const float* lse, float* out, int rows, int splits,
                                          int d) {
    // TODO: M over the row's splits; each of this thread's columns as the weighted mean of the splits; 0 if all empty
}

# %%
kernellab.grade("09-split-combine", combine_splits)

# %% [markdown]
# ### Exercise 09-gqa-scores: decode scores with grouped-query heads and per-sequence cache lengths
#
# The first product of a decode step, on the CUDA cores: one query token per sequence, `q` is `[B, Hq, d]`, the key
# cache `k` is `[B, Hkv, nmax, d]` (fp32, row-major), and sequence `b` uses its first `seqlens[b]` keys. Query head `h`
# reads KV head `h / (Hq / Hkv)`. Write `s[b][h][j] = scale * q[b][h] . k[b][h / (Hq / Hkv)][j]` for
# `j < seqlens[b]` and `-INFINITY` for `seqlens[b] <= j < nmax`. Thread `threadIdx.x` of block
# `(blockIdx.x, blockIdx.y)` takes key `j = blockIdx.x * blockDim.x + threadIdx.x` of row `blockIdx.y = b * Hq + h`.
# The grader launches blocks of 32, 128 and 256 threads, grid `(ceil(nmax / blockDim.x), B * Hq)`, with 1 to 32 query
# heads per KV head and caches of length 0 up to `nmax`.

# %%
# %%cuda
// exercise: 09-gqa-scores
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void gqa_scores(const float* q, const float* k, const int* seqlens, float* s, int B, int Hq,
                                      int Hkv, int nmax, int d, float scale) {
    // TODO: this thread's key j of row b * Hq + h: its score against KV head h / (Hq / Hkv), or -inf past the cache
}

# %%
kernellab.grade("09-gqa-scores", gqa_scores)

# %% [markdown]
# ## Discussion
#
# - **GQA is an indexing change.** Because the `G` query heads of a KV head are contiguous in `q`, packing them as one
#   matrix costs nothing and lets a block's `K`/`V` tiles serve every query head that needs them; the tensor-core
#   schedule is tutorial 07's step 2 unchanged. The gain over expanding `K`/`V` is the expansion's copy; the gain
#   over one block per query head appears at short `N`. On Hopper the same idea costs even less: tutorial 07's wgmma
#   step reads `K`, `V` at KV head `h / G` through its TMA coordinates, and launching the `G` query heads of a KV head
#   next to each other lets L2, rather than one block, share the tiles.
# - **Decoding is a copy.** Its speed is the fraction of the copy bandwidth it reaches, and the whole design is about
#   parallelism: `B Hkv` is far too few blocks, so the keys are split until one wave of warps covers the GPU, and the
#   partials (a few percent of the bytes) are merged by a second, tiny kernel. Splitting per warp rather than per block
#   keeps each split's loads independent (no `__syncthreads` until the block merges its warps' partials at the end)
#   at the price of a little more shared memory; that merge cuts the partial bytes by four.
# - **Variable lengths without a host sync.** The split count comes from `Nmax`, each sequence divides its own length
#   inside the kernel; empty caches and tokens that see no key give zeros by definition, rows SDPA leaves NaN.
# - **One launch.** The merge needs every split's partial, which is a reason for a second kernel only until the
#   blocks can tell which of them finishes last: a fence, an atomic ticket and a counter that the last block resets
#   make the combine the tail of the split kernel, and small caches stop paying for a launch and its ramp.
# - **What is left.** The split floor's rule (`decode_floor`, from the latency model) confirmed by the GPU's sweep
#   (`benchmarks/attention_inference.py --part decode --floor`: 16, 32, 64 at 512 to 8k), a paged KV cache (a block
#   table per sequence), and the cache in fp8 (half the bytes: twice the speed of a memory-bound step). At `B = 1` a call still carries a fixed part of about 9 µs under
#   Nsight Compute (the launch with empty caches): the grid's start, its dispatch, `cache_seqlens` read before any
#   tile is asked for, and the last block's eight serial round trips to L2 (fence, ticket, `lse` twice, the `o` loads).
#   Two variants of the fused kernel aim at it, `decode_attention(merge="online")` (the merge in one pass: a running
#   max over the partials, 16 of them in flight) and `early=True` (each warp's first tile asked for before
#   `cache_seqlens` arrives, on the guess that the cache is full); `benchmarks/decode_profile.py` holds their
#   predictions and times them beside the default.
# - **Hiding the fixed part instead of cutting it.** One launch cannot reach 80 % of copy at 8k: its floor and ramp
#   alone are most of the gap. Behind the step's producer with programmatic dependent launch (`pdl=True`) the decode's
#   start overlaps the producer; what may run before `griddepcontrol.wait` is only what cannot read the producer's
#   output stale (addresses and L2 prefetches: `q`, `cache_seqlens` and every `K`/`V` load wait). The gain is bounded
#   by how long the producer lasts and leaves the merge tail in place. The PDL decode already lets the step's next
#   kernel be placed once every block has written its partial (`griddepcontrol_launch_dependents`), so that kernel
#   (the output projection), launched with PDL in turn, could start during the last blocks' merge: the next piece.
