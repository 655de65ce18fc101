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
# # 07 · Fused attention: from the online softmax to a Hopper kernel that beats FlashAttention-2
#
# **What you will learn**
# - why textbook attention (`S = Q K^T`, `P = softmax(S)`, `O = P V`) is limited by the bytes of the `N x N` matrices
#   it writes and reads, and the **online softmax** that lets one pass over the keys keep `S` and `P` on chip;
# - **step 1**, a fused kernel on the CUDA cores (one thread per query row): correct, and bound by FFMA and
#   shared-memory wavefronts, so it loses even to the unfused PyTorch code;
# - **step 2**, FlashAttention-2 on `mma.sync` tensor cores: fragments, `ldmatrix` (`.trans` for `V`), an XOR-swizzled
#   shared layout, `cp.async` double buffering, the softmax in registers with `exp2`, and `P` fed to the second product
#   straight from the score registers; then the three changes the measurements asked for (32 rows per warp, no
#   masking code on interior tiles, lazy rescaling);
# - **step 3**, the Hopper kernel: `wgmma` fed by the tensor memory accelerator (TMA) through `mbarrier`s, one
#   producer warp and two or three consumer warpgroups, as FlashAttention-3 describes;
# - **step 3b**, the same kernel made persistent: one CTA per SM drawing work items from an atomic counter, the next
#   item's loads hidden under the current one's epilogue, and the block height chosen per launch by a cost model;
# - **one entry point**, `attention` (the `kl::attention` op), that picks the kernel and its tiles per call from a
#   model of waves, tiles per item, fixed costs and host time, with a variant for short sequences (two CTAs an SM);
# - how each step is checked (awkward `N`, both dtypes, head dims 64 and 128, causal or not, against a float64
#   reference) and timed against every SDPA backend, and what limits each one.
#
# Everything that compiles, counts or draws runs without a GPU; cells that launch are marked `%%gpu` and are skipped
# with one line where there is none. The figures in the text were measured on an H100 (`benchmarks/attention.py`,
# docs/RESULTS.md).

# %%
# %load_ext kernellab
# %matplotlib inline
import math
import re

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernellab

GPU = kernellab.has_gpu()
print("GPU:", torch.cuda.get_device_name() if GPU else "none (compile and analysis only)")

# %% [markdown]
# ## Why attention is a memory problem until it is fused
#
# For each (batch, head), attention takes `Q`, `K`, `V` of shape `[N, d]` and computes `O = softmax(Q K^T / sqrt(d)) V`.
# Written the textbook way, the `N x N` scores `S` and probabilities `P` go to memory between the steps. With
# `B = 4`, `H = 16`, `N = 4096`, `d = 64` in fp16, each of those matrices is `2 * B * H * N^2` bytes, 2.1 GB, against
# 34 MB for each of `Q`, `K`, `V` and `O`. The comments give each line's memory traffic:


# %%
def naive_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v the textbook way; q, k, v: [B, H, N, d] fp16. Each line's HBM traffic beside it."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)   # [B, H, N, N]: reads Q, K; writes S (2 B H N^2 bytes)
    p = torch.softmax(s, dim=-1)                           # [B, H, N, N]: reads S, writes P (2 x 2 B H N^2 bytes)
    return p @ v                                           # [B, H, N, d]: reads P (2 B H N^2 bytes) and V; writes O


B, H, N, d = 4, 16, 4096, 64
FP16_BYTES = 2
# H200 ceilings measured with kernellab (docs/RESULTS.md): DRAM copy, cuBLAS fp16 matmul, an FFMA kernel.
DRAM_BYTES_PER_S = 4.247e12
FP16_TENSOR_FLOPS = 671e12          # bf16: 687e12
FP32_FLOPS = 59.9e12                # the CUDA cores, no tensor cores

flops = 4 * B * H * N * N * d                    # Q K^T and P V: 2 N^2 d FLOPs each, per (batch, head)
qkvo_bytes = 4 * B * H * N * d * FP16_BYTES      # Q, K, V read once and O written once: all a fused kernel needs
score_bytes = B * H * N * N * FP16_BYTES         # one [N, N] fp16 matrix per (batch, head)
naive_bytes = qkvo_bytes + 4 * score_bytes       # + S written and read, P written and read

print(f"{flops / 1e9:.1f} GFLOP per call; tensor-core floor {flops / FP16_TENSOR_FLOPS * 1e3:.3f} ms, "
      f"CUDA-core floor {flops / FP32_FLOPS * 1e3:.3f} ms")
for name, moved in (("naive (S and P in HBM)", naive_bytes), ("fused", qkvo_bytes)):
    print(f"{name:23s} {moved / 1e9:6.2f} GB: memory floor {moved / DRAM_BYTES_PER_S * 1e3:6.3f} ms, "
          f"{flops / moved:6.1f} FLOP/byte")

# %% [markdown]
# The naive version moves 65 times the bytes it needs: its floor is set by memory (about 2 ms), five times what the
# tensor cores need for the arithmetic (0.4 ms). A fused kernel's floor is the arithmetic: at 2048 FLOP per byte it
# is compute-bound on any GPU. Note the third floor too: on the CUDA cores alone the arithmetic takes 4.6 ms, more
# than the naive version's memory floor. On an H200, fusion pays only together with the tensor cores; this kernel
# fuses on the CUDA cores, and the benchmark will show what that costs. First, how to compute `softmax(S) V`
# without ever holding a full row of `S`.
#
# ## The online softmax
#
# Take one query row, with scores `s_1 .. s_N` and value rows `v_1 .. v_N`. Its output is
# `o = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)` for any constant `m`; using the row's max keeps every `exp` at
# most 1. Now walk the keys in blocks, keeping three things after each block: `m`, the max score seen so far;
# `l = sum exp(s_j - m)` over the keys seen; `a = sum exp(s_j - m) v_j` over the same keys. A new block with scores
# `s_b` gives a new max `m' = max(m, max(s_b))`, and every old term changes by the same factor
# `exp(s_j - m') = exp(s_j - m) * exp(m - m')`, so with `alpha = exp(m - m')`:
#
# - `l' = alpha * l + sum_b exp(s_b - m')`
# - `a' = alpha * a + sum_b exp(s_b - m') v_b`
#
# and after the last block `o = a / l`. Nothing is approximated: this is softmax, computed in one pass with state
# of size `d + 2` per row. Here it is on one row of ten keys in blocks of four, against the two-pass softmax:

# %%
rng = np.random.default_rng(0)
s_row = 3 * rng.standard_normal(10)              # [10] one query row's scores
v_rows = rng.standard_normal((10, 4))            # [10, 4] the matching rows of V (d = 4 here)

m, l, a = -np.inf, 0.0, np.zeros(4)              # running max, running sum, running output
for block in np.split(np.arange(10), [4, 8]):    # keys 0-3, 4-7, 8-9
    m_new = max(m, s_row[block].max())
    alpha = np.exp(m - m_new)                    # 0 on the first block: exp(-inf)
    p = np.exp(s_row[block] - m_new)             # [len(block)]
    l = alpha * l + p.sum()
    a = alpha * a + p @ v_rows[block]            # [4]
    m = m_new

softmax = np.exp(s_row - s_row.max()) / np.exp(s_row - s_row.max()).sum()
print("online :", a / l)
print("softmax:", softmax @ v_rows)
assert np.allclose(a / l, softmax @ v_rows)

# %% [markdown]
# ### Exercise 07-online-softmax: a row's `(m, l)` in one pass, one warp per row
#
# Here is that bookkeeping alone, on a `[rows, n]` fp32 matrix of scores, with the work spread the way step 2 spreads
# it: over the lanes of a warp. Write `softmax_stats` so that `m[r] = max_j x[r][j]` and
# `l[r] = sum_j exp(x[r][j] - m[r])`, reading each row once:
# - warp `threadIdx.y` of block `blockIdx.x` owns row `blockIdx.x * blockDim.y + threadIdx.y`, and lane `threadIdx.x`
#   walks keys `lane, lane + 32, ...`, keeping its own running `(m, l)` with the online update above;
# - the warp then merges its 32 states with `__shfl_xor_sync(0xffffffff, v, offset)` for offsets 16, 8, 4, 2, 1. Two
#   states merge as a new block of keys does: `m = max(m_a, m_b)`, `l = l_a exp(m_a - m) + l_b exp(m_b - m)`;
# - masked keys are `-inf`. A lane that has seen only `-inf` holds `(m, l) = (-inf, 0)` and must still hold it after
#   another `-inf` (or another such state) arrives, but `exp(-inf - (-inf))` is NaN: that case needs its own branch.
#   A fully masked row's answer is `m = -inf`, `l = 0`.
#
# Use `expf` (or `__expf`, or `exp2f` with `log2(e)` folded in). The grader launches blocks of 32 x 1, 32 x 4 and
# 32 x 8 threads, `ceil(rows / blockDim.y)` of them, on rows of 1 to 100,003 keys holding large scores (where `exp(x)`
# itself overflows), masked keys, windows of keys, fully masked rows and ties, and times a solution beside
# `torch.logsumexp` over the same rows (an optional bar: half its speed). Without a GPU it checks what the compiler
# shows: a warp shuffle, `MUFU.EX2`, and that `rows` and `n` are read.

# %%
# %%cuda
// exercise: 07-online-softmax
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void softmax_stats(const float* x, float* m, float* l, int rows, int n) {
    // TODO: each lane's running (m, l) over keys lane, lane + 32, ...; then merge the 32 states across the warp
}

# %%
kernellab.grade("07-online-softmax", softmax_stats)

# %% [markdown]
# ## The kernel
#
# **Who does what.** `blockIdx.y` picks the (batch, head); `blockIdx.x` picks `BLOCK_M = 64` query rows, and thread
# `t` of the block owns query row `blockIdx.x * 64 + t` entirely: its scaled query `q[64]` and its accumulator
# `acc[64]` stay in fp32 registers for the whole kernel, next to its `m` and `l`. The block walks over K and V in tiles
# of `BLOCK_N = 16` rows. For each tile the 64 threads copy it into shared memory (converted to fp32 once, on the way
# in), wait at `__syncthreads()`, and then each thread computes its 16 scores, updates `m`, `l` and `acc` as above,
# and waits again before the next tile overwrites the shared arrays. `S` exists only 16 scores at a time, in registers.
#
# **Two small tricks.** The query is multiplied by `scale * log2(e)` once, so that `exp(scale * q.k)` becomes
# `exp2(q'.k)`: the hardware's special-function unit computes `exp2`. And the division by `l` waits for the very end.
#
# **Correct for any `N`.** The grid is rounded up, so the last block's threads past `N` still help copy tiles (every
# thread must reach every `__syncthreads()`) but store nothing. The last tile's rows past `N` are copied as zeros and
# their scores set to `-inf`, so they add `exp2(-inf) = 0`. With `causal != 0`, keys after the thread's row get `-inf`
# too, and tiles after the block's last row are not loaded at all: the causal kernel does about half the work.
#
# `D`, `BLOCK_M` and `BLOCK_N` are compile-time constants so that `q`, `acc` and `s`, indexed only by unrolled loop
# counters, become registers rather than local memory.

# %%
# %%cuda
#include <cuda_fp16.h>        // __half, __half2 and their conversions
#include <math_constants.h>   // CUDART_INF_F

constexpr int D = 64;         // head dimension, fixed at compile time: q[], acc[] and s[] below live in registers
constexpr int BLOCK_M = 64;   // query rows per block = threads per block: thread t owns row blockIdx.x * BLOCK_M + t
constexpr int BLOCK_N = 16;   // key/value rows per tile staged in shared memory

// Four consecutive fp16 values as fp32; p must be 4-byte aligned (every row of 64 halves is).
__device__ float4 load_half4(const __half* p) {
    float2 lo = __half22float2(*reinterpret_cast<const __half2*>(p));
    float2 hi = __half22float2(*reinterpret_cast<const __half2*>(p + 2));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// O = softmax(scale * Q K^T) V, one query row per thread. Q, K, V, O: [B * H, N, D] fp16, contiguous.
// grid (ceil(N / BLOCK_M), B * H): blockIdx.x picks BLOCK_M query rows, blockIdx.y the (batch, head).
// causal != 0: query row i attends to keys 0..i only.
extern "C" __global__ void __launch_bounds__(BLOCK_M)
flash_attention_fwd(const __half* __restrict__ Q, const __half* __restrict__ K, const __half* __restrict__ V,
                    __half* __restrict__ O, int N, float scale, int causal) {
    __shared__ float4 Ks[BLOCK_N][D / 4];   // [BLOCK_N, D] K tile in fp32: Ks[j][c4] = K[kv0 + j, 4 c4 : 4 c4 + 4]
    __shared__ float4 Vs[BLOCK_N][D / 4];   // [BLOCK_N, D] V tile, same layout

    const size_t head = (size_t)blockIdx.y * N * D;       // this (batch, head)'s [N, D] matrices start here
    Q += head; K += head; V += head; O += head;
    const int row = blockIdx.x * BLOCK_M + threadIdx.x;   // this thread's query row, in [0, gridDim.x * BLOCK_M)
    const bool row_in_range = row < N;                    // threads past N help stage tiles, store nothing

    // The query row times scale * log2(e), so that exp(scale * q.k) = exp2(q'.k): the hardware's MUFU.EX2 is exp2.
    const float q_scale = scale * 1.4426950408889634f;
    float q[D];                                           // [D] q' = Q[row, :] * q_scale
#pragma unroll
    for (int c = 0; c < D; c += 4) {                      // q'[c : c + 4]; rows past N read nothing
        const float4 x = row_in_range ? load_half4(Q + row * D + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        q[c] = x.x * q_scale;  q[c + 1] = x.y * q_scale;  q[c + 2] = x.z * q_scale;  q[c + 3] = x.w * q_scale;
    }

    float m = -CUDART_INF_F;  // running max of this row's scores so far
    float l = 0.f;            // running sum of exp2(score - m)
    float acc[D];             // [D] running sum of exp2(score - m) * V[key, :]
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] = 0.f;

    // Causal: no row of this block attends past the block's last row, so the loop over tiles stops there.
    const int kv_end = causal ? min(N, (int)(blockIdx.x + 1) * BLOCK_M) : N;
    for (int kv0 = 0; kv0 < kv_end; kv0 += BLOCK_N) {
        // Stage K[kv0 : kv0 + BLOCK_N, :] and V[...] in shared memory as fp32, rows past N as zeros.
        // Thread t copies float4s t, t + BLOCK_M, ...: a warp reads 32 x 8 contiguous bytes (coalesced).
        for (int i = threadIdx.x; i < BLOCK_N * D / 4; i += BLOCK_M) {
            const int j = i / (D / 4), c4 = i % (D / 4);  // tile row in [0, BLOCK_N), float4 column in [0, D / 4)
            float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
            if (kv0 + j < N) {
                k4 = load_half4(K + (kv0 + j) * D + 4 * c4);   // K[kv0 + j, 4 c4 : 4 c4 + 4]
                v4 = load_half4(V + (kv0 + j) * D + 4 * c4);   // V[kv0 + j, 4 c4 : 4 c4 + 4]
            }
            Ks[j][c4] = k4;
            Vs[j][c4] = v4;
        }
        __syncthreads();                                  // the whole tile is in place before anyone reads it

        // Scores of this row against the tile's keys: s[j] = q' . K[kv0 + j, :].
        float s[BLOCK_N];                                 // [BLOCK_N]
#pragma unroll
        for (int j = 0; j < BLOCK_N; ++j) s[j] = 0.f;
#pragma unroll
        for (int c4 = 0; c4 < D / 4; ++c4) {
#pragma unroll
            for (int j = 0; j < BLOCK_N; ++j) {           // BLOCK_N independent sums keep the FMA pipe busy
                const float4 k4 = Ks[j][c4];              // K[kv0 + j, 4 c4 : 4 c4 + 4]: the same address in every lane
                s[j] += q[4 * c4] * k4.x;      s[j] += q[4 * c4 + 1] * k4.y;
                s[j] += q[4 * c4 + 2] * k4.z;  s[j] += q[4 * c4 + 3] * k4.w;
            }
        }

        // Mask keys past N (last tile) and, if causal, keys after this row; then the new running max.
        float m_new = m;
#pragma unroll
        for (int j = 0; j < BLOCK_N; ++j) {
            const int key = kv0 + j;                      // key index, in [kv0, kv0 + BLOCK_N)
            if (key >= N || (causal && key > row)) s[j] = -CUDART_INF_F;
            m_new = fmaxf(m_new, s[j]);
        }

        // Online softmax: rescale the old terms from exp2(s - m) to exp2(s - m_new), then add this tile's.
        // Key 0 is in every row's first tile, so m_new is finite from the first tile on (alpha = exp2(-inf) = 0 there).
        const float alpha = exp2f(m - m_new);
        l *= alpha;
#pragma unroll
        for (int c = 0; c < D; ++c) acc[c] *= alpha;
#pragma unroll
        for (int j = 0; j < BLOCK_N; ++j) {
            const float p = exp2f(s[j] - m_new);          // 0 for a masked key
            l += p;
#pragma unroll
            for (int c4 = 0; c4 < D / 4; ++c4) {          // acc += p * V[kv0 + j, :]
                const float4 v4 = Vs[j][c4];              // V[kv0 + j, 4 c4 : 4 c4 + 4]: a broadcast again
                acc[4 * c4] += p * v4.x;      acc[4 * c4 + 1] += p * v4.y;
                acc[4 * c4 + 2] += p * v4.z;  acc[4 * c4 + 3] += p * v4.w;
            }
        }
        m = m_new;
        __syncthreads();                                  // everyone is done with the tile before it is overwritten
    }

    if (row_in_range) {
        const float inv_l = 1.f / l;                      // l >= 1: the largest score contributes exp2(0)
#pragma unroll
        for (int c = 0; c < D; c += 2)                    // O[row, c : c + 2] = acc[c : c + 2] / l, in fp16
            *reinterpret_cast<__half2*>(O + row * D + c) = __floats2half2_rn(acc[c] * inv_l, acc[c + 1] * inv_l);
    }
}

# %% [markdown]
# ## What it costs: registers, shared memory, occupancy
#
# The card shows no local memory and no spills: every array stayed in registers. The price is the register count:
# `q` and `acc` alone are 128 fp32 registers per thread, `s` 16 more, and the compiler takes about 200 once addresses
# and loads in flight are added. Shared memory is small: two `16 x 64` fp32 tiles, 8 KiB per block.
# `__launch_bounds__(BLOCK_M)` promises blocks of at most 64 threads, which is why the card's thread limit is 64.

# %%
BLOCK_M, BLOCK_N, HEAD_DIM = 64, 16, 64          # as in the cell
print(flash_attention_fwd.resources)
occ = flash_attention_fwd.occupancy(BLOCK_M)
occ

# %% [markdown]
# Registers are the limiter. Each SM has four sub-partitions (one warp scheduler each) with 16,384 registers apiece,
# and a warp takes its registers in one sub-partition. At anything from 169 to 255 registers per thread a warp needs
# more than a third of a sub-partition's file, so each holds 2 warps: 8 warps per SM, 4 blocks of 2 warps, 12.5 %
# occupancy. Shared memory would allow 25 blocks per SM. The three graphs vary one input at a time; the middle one shows
# the steps at 168 registers (3 warps per sub-partition) and 128 (4):

# %%
kernellab.plot_occupancy(occ)

# %%
for regs in (168, 128):
    print(f"at {regs} registers/thread:",
          kernellab.occupancy(BLOCK_M, regs, flash_attention_fwd.resources.shared_bytes).title)

# %% [markdown]
# Why not squeeze into 168 registers? The 144 registers of `q`, `acc` and `s` must stay live across the whole tile
# loop; try `__launch_bounds__(BLOCK_M, 6)` (at least 6 blocks per SM) in the cell and the card shows ptxas capping
# the kernel at 168 registers and spilling to local memory. Nor does this kernel need many warps: each one has 16
# independent score sums, then 64 independent accumulator updates, to issue back to back, so its own
# instruction-level parallelism hides most of the latency that more warps would otherwise hide. What bounds it is the
# next section.
#
# ## Shared-memory banks: the K-tile read
#
# In the score loop every lane of a warp executes `Ks[j][c4]` with the same `j` and `c4`: the 32 lanes are 32 query
# rows reading the same key. Here is that access through the bank model (which reproduces Nsight Compute's wavefront
# counts on 373 measured patterns, docs/RESULTS.md), beside the tile store that fills the tile, and beside the access a
# kernel would make if it gave each lane its own key instead (lane `i` reading `Ks[i][c4]` of a 32-row tile), with
# and without one float4 of padding per row.

# %%
FLOAT4 = 16                                        # bytes per shared access: LDS.128 / STS.128
ROW_FLOAT4S = HEAD_DIM // 4                        # float4s per tile row


def tile_address(j, c4, row_float4s=ROW_FLOAT4S):
    """Byte offset of Ks[j][c4] in a tile of `row_float4s` float4s per row."""
    return FLOAT4 * (j * row_float4s + c4)


accesses = {
    "ours: score loop, Ks[j][c4], same j for all lanes": [tile_address(3, 5)] * 32,
    "ours: tile store, thread t writes float4 t": [FLOAT4 * lane for lane in range(32)],
    "lane i reads key i: Ks[i][c4]": [tile_address(lane, 5) for lane in range(32)],
    "lane i reads key i, rows padded to 17 float4s": [tile_address(lane, 5, ROW_FLOAT4S + 1) for lane in range(32)],
}
for name, addresses in accesses.items():
    access = kernellab.analyze_access(addresses, FLOAT4)
    print(f"{name:50s} {access.wavefronts:2d} wavefronts (ideal {access.ideal_wavefronts}), {access.ways}-way")

# %%
fig = Figure(figsize=(16, 6), layout="constrained")
for ax, name in zip(fig.subplots(1, 3), [n for n in accesses if "store" not in n]):
    kernellab.plot_bank_access(kernellab.analyze_access(accesses[name], FLOAT4), ax=ax)
    ax.set_title(f"{name}\n{ax.get_title()}", fontsize=9)
fig

# %% [markdown]
# Our read has no conflict: one address for all lanes is a **broadcast**, and no padding is needed. The tile store,
# consecutive float4s from consecutive lanes, takes the 4 wavefronts that 512 bytes need, the ideal. A kernel that
# spread keys over lanes would hit the classic conflict: rows of 256 bytes put every lane's `Ks[i][c4]` in the same
# four banks, 8 lanes per bank, and one float4 of padding per row would spread them out, exactly as the `[32][33]`
# tile did in tutorial 02.
#
# Still, look at the broadcast's count: a 16-byte access is served a half-warp per wavefront, so even a broadcast
# takes **2 wavefronts** to deliver 4 floats. That fixes this kernel's ceiling. Per key, each warp issues `D / 4 = 16`
# loads of `K` and 16 of `V` and `2 D = 128` FFMAs; an SM retires 4 warp-FFMAs per clock (128 FP32 lanes) but only
# 1 shared-memory wavefront per clock. The compiler's SASS for one tile holds exactly those instructions:

# %%
sass = flash_attention_fwd.sass
lds, ffma = len(re.findall(r"\bLDS\.128\b", sass)), len(re.findall(r"\bFFMA\b", sass))
print(f"SASS: {lds} LDS.128 and {ffma} FFMA; per tile of {BLOCK_N} keys we expect {BLOCK_N * 2 * HEAD_DIM // 4} "
      f"and {BLOCK_N * 2 * HEAD_DIM} (+ a few FFMAs outside the loop)")

broadcast_wavefronts = kernellab.analyze_access([tile_address(0, 0)] * 32, FLOAT4).wavefronts
clocks_fma = 2 * HEAD_DIM / 4                                 # per key per warp: 128 FFMAs at 4 per clock per SM
clocks_smem = 2 * (HEAD_DIM // 4) * broadcast_wavefronts      # 32 LDS.128 at 2 wavefronts, 1 wavefront per clock
smem_bound = min(1.0, clocks_fma / clocks_smem)
print(f"per key and warp: {clocks_fma:.0f} SM clocks of FFMA, {clocks_smem} of shared-memory wavefronts: "
      f"at most {smem_bound:.0%} of the FP32 peak, {smem_bound * FP32_FLOPS / 1e12:.0f} TFLOP/s on an H200, "
      f"{flops / (smem_bound * FP32_FLOPS) * 1e3:.2f} ms at N = {N}")

# %% [markdown]
# So this kernel cannot beat about 30 TFLOP/s, about 9 ms at `N = 4096`. Expect the naive PyTorch version, with its
# 2 ms memory floor, to be several times faster, and PyTorch's own FlashAttention, on the tensor cores, to be more
# than an order of magnitude ahead. The cells below measure that.
#
# ## The harness: inputs, references, checks and timings for every step
#
# All three steps take `q, k, v` of shape `[B, H, N, d]` (contiguous, so `[B, H]` folds into one `B * H` grid axis)
# and write `out`. The checks use `kernellab.check`: fresh random inputs each trial, `out` filled with NaN first (an
# unwritten row fails), PyTorch's `scaled_dot_product_attention` computed in **float64** as the reference, and, beside
# our error, SDPA's own error on the same inputs in the same dtype. Attention rounds twice in 16 bits (`P` before the
# second product, then `O`), as SDPA's kernels do, so the elementwise tolerance is twice `check`'s default for the
# dtype; the bar that matters is the second one: **our error at most 2x SDPA's own**. The shapes are the awkward ones:
# `N = 1` (one key), 63 and 65 (one short of a tile and one over), 1000 and 1031 (partial last tiles), 4097.
# FLOPs are `4 B H N^2 d`, halved with the causal mask.

# %%
CHECK_N = (1, 63, 65, 1000, 1031, 4097)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"bf16": 3.2e-2, "fp16": 4e-3}        # twice kernellab.check's default for the dtype (two roundings)


def attention_inputs(B, H, N, d, dtype=torch.float16):
    """inputs(generator) for check and bench: q, k, v ~ N(0, 1) and an output buffer, on the GPU."""
    def inputs(g):
        q, k, v = (torch.randn(B, H, N, d, generator=g).to(dtype).cuda() for _ in range(3))
        return q, k, v, torch.empty_like(q)
    return inputs


def sdpa(backend):
    """scaled_dot_product_attention held to one backend: FLASH (FlashAttention-2), CUDNN, EFFICIENT or MATH."""
    def run(q, k, v, out=None, causal=False):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def naive_attention(q, k, v, out=None, causal=False):
    """softmax(q k^T / sqrt(d)) v the textbook way: S and P go through memory."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)              # [B, H, N, N]
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def check_all(attention, dtypes=("bf16", "fp16"), dims=(64, 128), ns=CHECK_N, trials=2):
    """kernellab.check on every (dtype, d, causal, N); returns one row per case, our error beside SDPA's own."""
    rows = []
    for dname in dtypes:
        for d in dims:
            for causal in (False, True):
                for N in ns:
                    B, H = (1, 2) if N > 2000 else (2, 3)
                    rep = kernellab.check(lambda q, k, v, o: attention(q, k, v, o, causal),
                                          lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v,
                                                                                            is_causal=causal),
                                          attention_inputs(B, H, N, d, DTYPES[dname]), trials=trials,
                                          atol=TOLERANCE[dname], rtol=TOLERANCE[dname])
                    own = rep.reference_own_error or 0.0
                    rows.append(dict(dtype=dname, d=d, causal=causal, N=N, passed=rep.passed, error=rep.max_abs_error,
                                     sdpa_error=own, within_2x=rep.max_abs_error <= 2 * own + 1e-6, report=rep))
    return rows


def summarize_checks(rows):
    """One line per (dtype, d): cases passed, the largest error and SDPA's largest own error."""
    out = []
    for dname in DTYPES:
        for d in (64, 128):
            sel = [r for r in rows if r["dtype"] == dname and r["d"] == d]
            if sel:
                ok = sum(r["passed"] and r["within_2x"] for r in sel)
                out.append(f"{dname} d={d:3d}: {ok}/{len(sel)} cases pass; max error {max(r['error'] for r in sel):.2e}"
                           f" vs float64, SDPA's own max {max(r['sdpa_error'] for r in sel):.2e}")
    return "\n".join(out)


def attention_flops(causal):
    def flops(q, *_):
        B, H, N, d = q.shape
        return 4 * B * H * N * N * d / (2 if causal else 1)
    return flops


def attention_bytes(q, *_):
    """Q, K, V read and O written once: all a fused kernel needs."""
    return 4 * q.numel() * q.element_size()


def bench_against_sdpa(name, attention, N=4096, d=64, causal=False, dtype=torch.bfloat16, naive=True, math_=False):
    """Time `attention` at B * N = 16k, H * d = 2048 (the FlashAttention-3 paper's shapes) against SDPA's backends."""
    B, H = 16384 // N, 2048 // d
    baselines = {"SDPA flash": sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                 "SDPA efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    if math_:
        baselines["SDPA math"] = sdpa(SDPBackend.MATH)
    if naive:
        baselines["naive PyTorch"] = naive_attention
    return kernellab.bench(lambda q, k, v, o: attention(q, k, v, o, causal), attention_inputs(B, H, N, d, dtype),
                           baselines={n: (lambda f: lambda q, k, v, o: f(q, k, v, o, causal))(f)
                                      for n, f in baselines.items()},
                           flops=attention_flops(causal), bytes=attention_bytes, name=name)


# %% [markdown]
# ## Step 1 on the GPU: check and time the CUDA-core kernel
#
# The wrapper takes fp16 `[B, H, N, 64]` tensors and rounds the grid up. The first launch uses `N = 1000`, a multiple
# of neither block size, so the guards already matter.


# %%
def cuda_core_attention(q, k, v, out=None, causal=False):
    """Step 1: softmax(q k^T / sqrt(d)) v by flash_attention_fwd; q, k, v: [B, H, N, 64] fp16, contiguous."""
    B, H, N, d = q.shape
    assert d == HEAD_DIM and q.dtype == torch.float16, f"step 1 takes fp16 [B, H, N, {HEAD_DIM}]"
    out = torch.empty_like(q) if out is None else out
    flash_attention_fwd[(math.ceil(N / BLOCK_M), B * H), BLOCK_M](q, k, v, out, N, d ** -0.5, int(causal))
    return out


# %%
# %%gpu
step1_checks = check_all(cuda_core_attention, dtypes=("fp16",), dims=(64,))
print(summarize_checks(step1_checks))
step1 = bench_against_sdpa("step 1: CUDA cores", cuda_core_attention, d=64, dtype=torch.float16)
step1

# %% [markdown]
# As predicted: a few percent of the tensor-core kernels, and slower than the naive PyTorch code, whose two
# matrix products run on tensor cores even though it moves 65 times the bytes.
#
# ## Step 2: FlashAttention-2 on `mma.sync`
#
# **The instruction.** `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` has a warp multiply a 16 x 16 tile of
# `A` by a 16 x 8 tile of `B` and add into a 16 x 8 fp32 tile, 4,096 FLOPs per instruction. Each lane holds pieces:
# with `g = lane / 4` and `t = lane % 4`, the accumulator's four floats are rows `g` and `g + 8`, columns `2t` and
# `2t + 1`; `A`'s four registers are the same rows at columns `2t, 2t + 1` and `2t + 8, 2t + 9`; `B`'s two registers
# are column `g`, rows `2t, 2t + 1` and `2t + 8, 2t + 9`.
#
# **Who does what.** A block of 4 warps owns `BLOCK_M = 128` query rows; each warp owns 32 of them, as two 16-row
# tiles. The block walks over the keys in tiles of `BLOCK_N = 64`:
# - `S = Q K^T`: for each 16-wide slice of `d`, `ldmatrix.x4` brings a 16 x 16 piece of the `K` tile into exactly the
#   `B` fragments of two `mma`s, and each fragment feeds both of the warp's 16-row tiles;
# - the online softmax runs on the accumulator registers: a row's 16 scores in a tile sit in the 4 lanes of a quad, so
#   its max takes two `__shfl_xor_sync`; `exp2` with `scale * log2(e)` folded into one FFMA;
# - `O += P V`: the `A` fragment of `P` for 16 keys is exactly two of `S`'s accumulator tiles, repacked in registers
#   to bf16 pairs: `P` never touches shared memory. `V` is stored `[key][d]` but the product needs it as `[d][key]`
#   fragments: `ldmatrix.trans` transposes on the way.
#
# **Memory.** `K` and `V` tiles come in with `cp.async` (16 bytes, global to shared without registers), double
# buffered: tile `j + 1` streams in while tile `j` is computed, one `__syncthreads` per tile. The shared layout is
# XOR-swizzled: the 16-byte chunk `c` of row `r` is stored at chunk `c ^ (r % 8)`, so the 8 rows an `ldmatrix` phase
# reads at one column land in 8 different bank groups (next section).
#
# **Any N, causal or not.** Rows past `N` are copied as zeros (`cp.async` with a source size of 0) and their scores
# set to `-inf`; with `causal`, keys after the row too. Only tiles that reach past `N` or past the block's first row
# need that code: the kernel runs interior tiles through a copy of the tile step with the masking compiled out.
#
# **Predictions before measuring.** Per key tile and warp, the tensor work is 128 `mma`s. The first version of this
# kernel (16 rows per warp, masking on every tile, rescaling `O` on every tile) measured 235-265 TFLOP/s at `N = 4096`
# on an H100, 0.75x SDPA's FlashAttention-2, with Nsight Compute showing the tensor pipe 37-41 % busy, issue slots
# 40 % busy and 8 warps per SM: latency-bound with too few independent instructions, and its SASS held 1,142
# instructions per tile for 128 `HMMA`s. Three changes, each predicted from the SASS count:
# 1. **32 rows per warp** (two m16 tiles): every `ldmatrix` feeds twice the `mma`s and each warp has two independent
#    accumulator chains; predicted +10 %, measured 265 -> 280-291 TFLOP/s;
# 2. **interior tiles without masking code, and per-thread `ldmatrix` addresses computed once**: the loop fell from
#    1,142 to 670 instructions per tile; predicted +20-30 %, measured 281 -> 346 (d = 64) and 277 -> 348 (d = 128);
# 3. **lazy rescaling**: move the running max only when a tile's max exceeds it by more than 8 (in log2 units), so
#    `p = exp2(s - m) <= 256`, harmless in fp32 and in bf16/fp16, and skip the `O *= alpha` multiplies when no row of the
#    warp moved. The result is exact (`O` and `l` share the same stale max); predicted a few % at `d = 64` and more at
#    `d = 128`, where rescaling is `2 x 16 x 4 = 128` FMULs per tile: measured +1 % and +8 %.

# %% [markdown]
# ### Exercise 07-ldmatrix-swizzle: `A` fragments through `ldmatrix.x4` from a swizzled tile
#
# First the piece everything above rests on: one warp turning a tile of `Q` in shared memory into the `A` fragments
# of `mma.sync`. `q` holds `tiles` tiles of 16 rows x 64 bf16 values (as their 16-bit patterns, `unsigned short`,
# row-major: 2 KB a tile, one warp's m16 tile at `d = 64`). Write `ldmatrix_frags` so that warp
# `w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32` takes tile `w` and
# 1. copies it into its own `__shared__` tile (`__shared__ uint4 smem[4][128]` holds one per warp, at most 4 warps a
#    block) in the swizzled layout: 16-byte chunk `c` of row `r` at byte `r * 128 + 16 * (c ^ (r % 8))`;
# 2. after a `__syncwarp()` (lanes read what other lanes wrote), loads for each `kc = 0 .. 3` the `A` fragment of
#    columns `16 kc .. 16 kc + 15` with one `ldmatrix.x4`, and stores lane `l`'s four registers to
#    `frag[((w * 4 + kc) * 32 + l) * 4 + 0 .. 3]`;
# 3. copies its shared tile out, byte for byte, to the 2 KB of `image` at tile `w`, so that the grader sees the layout.
#
# Warps past the last tile return at once. Which value goes where: with `g = l / 4` and `t = l % 4`, lane `l`'s register
# `a0` holds row `g`, columns `2t` and `2t + 1` of the 16 x 16 piece (the lower column in the low 16 bits), `a1` row
# `g + 8` at the same columns, `a2` row `g` at columns `2t + 8` and `2t + 9`, `a3` row `g + 8` at those. `ldmatrix.x4`
# loads four 8 x 8 matrices of 16-bit values: lanes `8i .. 8i + 7` each give the shared address of one 16-byte row of
# matrix `i`, and lane `l` receives in register `i` row `l / 4`, columns `2 (l % 4)` and `2 (l % 4) + 1` of matrix `i`.
# Work out from the two which row and which chunk each lane points at, then swizzle that address exactly as the tile
# was written. The instruction, with `addr` the lane's row as a shared-memory address
# (`static_cast<unsigned>(__cvta_generic_to_shared(p))`):
#
# ```
# asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
#              : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr));
# ```
#
# The grader launches blocks of 32, 96 and 128 threads and checks every register of every lane against the PTX ISA's
# fragment table, and `image` against the swizzle. Without a GPU it checks that the compiler emitted `LDSM`, shared
# stores and loads, and that `tiles` is read.

# %%
# %%cuda
// exercise: 07-ldmatrix-swizzle
extern "C" __global__ void ldmatrix_frags(const unsigned short* q, unsigned int* frag, unsigned short* image,
                                          int tiles) {
    // TODO: tile w into a swizzled __shared__ tile; four ldmatrix.x4 into frag; the shared tile out to image
}

# %%
kernellab.grade("07-ldmatrix-swizzle", ldmatrix_frags)

# %% [markdown]
# ### The kernel
#
# Its `Q` fragments come from exactly the loads of the exercise (`qv_row` and `q_col` below); `K` uses the other lane
# order, since a `B` fragment pairs the matrices differently, and `V` goes through `ldmatrix.trans`.

# %%
# %%cuda --name fa2_cell
#include <kl/attention_mma.cuh>  // scores_qk (S = Q K^T), softmax_pv (online softmax, P V), swz<D>, exp2_approx
#include <kl/cp_async.cuh>  // cp_async_16, cp_async_commit, cp_async_wait_all
#include <kl/mma.cuh>       // ldmatrix_x4(_trans), mma_16816<T>; pack2<T>, __half, __nv_bfloat16 (kl/convert.cuh)
#include <math_constants.h>  // CUDART_INF_F
typedef unsigned int uint32_t;

// FlashAttention-2 forward on mma.sync: one warp per 16 query rows, NWARPS warps per block (BLOCK_M = 16 * NWARPS
// rows), K and V tiles of BLOCK_N rows double-buffered through cp.async, ldmatrix (.trans for V) from an XOR-swizzled
// shared layout, the online softmax in registers with exp2 and the scale folded in, P re-packed as the A operand of
// the second product straight from the score accumulators.

// The tile configuration, per head dim (chosen by measurement on an H100: see benchmarks/NOTES-attention.md).
#define FA2_MT 2            // m16 tiles per warp: 32 query rows share every K and V fragment a warp loads
#define FA2_NWARPS 4        // warps per block: BLOCK_M = 16 * MT * NWARPS = 128 query rows
#define FA2_MINB 2          // at least 2 blocks per SM: registers capped at 255, 8 warps per SM
#define FA2_BN64 64         // keys per tile at d = 64
#define FA2_BN128 64        // keys per tile at d = 128
#define FA2_QREGS64 true    // d = 64: Q fragments stay in registers for the whole kernel
#define FA2_QREGS128 false  // d = 128: Q re-read from shared memory each tile (64 registers fewer)
#define FA2_RESCALE_LOG2 8.0f

namespace fa2 {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float RESCALE_LOG2 = FA2_RESCALE_LOG2;   // lazy rescaling threshold, in log2 units (0: rescale on every new max)

// -- the instructions, one wrapper each ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// (exp2_approx, one MUFU.EX2, and swz<D>, the XOR-swizzled tile layout, come from kl/attention_mma.cuh.)

// Copy rows [row0, row0 + ROWS) of a [N, D] matrix into a swizzled tile (swz<D>: the 8 rows an ldmatrix reads at one
// logical chunk land in 8 different 16-byte bank groups); rows past N become zeros. Thread `tid`
// copies chunk tid % (D / 8) of rows tid / (D / 8) + k * STEP: its column and its swizzle (row & 7 is the same for
// every k, since STEP is a multiple of 8) are fixed, so each copy is one address increment.
template <int ROWS, int D, int NTHREADS, typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* __restrict__ g, int row0, int N) {
    constexpr int STEP = NTHREADS / (D / 8);               // rows between one thread's chunks
    static_assert(STEP % 8 == 0 && ROWS % STEP == 0, "every thread copies the same chunk of every STEP-th row");
    const int r = threadIdx.x / (D / 8), c = threadIdx.x % (D / 8);
    const uint32_t dst = tile + swz<D>(r, c);
    const T* src = g + (size_t)(row0 + r) * D + c * 8;
#pragma unroll
    for (int k = 0; k < ROWS / STEP; ++k) {
        const bool valid = row0 + r + k * STEP < N;
        cp_async_16(dst + k * STEP * D * 2, valid ? src + (size_t)k * STEP * D : g, valid ? 16 : 0);
    }
}


// O = softmax(scale * Q K^T [+ causal mask]) V; Q, K, V, O: [BH, N, D] contiguous, T = __half or __nv_bfloat16.
// LSE: [BH, N] fp32, each row's log-sum-exp of its scaled scores (natural log), what a backward pass recomputes P
// from (tutorial 08); nullptr: not stored.
// Each warp owns MT x 16 query rows (every K and V fragment it loads feeds MT mma's); NWARPS warps per block.
// grid (ceil(N / BLOCK_M), BH), NWARPS * 32 threads, dynamic smem: Q tile + 2 K tiles + 2 V tiles.
template <typename T, int D, int BLOCK_N, int NWARPS, int MT, bool CAUSAL, bool Q_IN_REGS>
__device__ __forceinline__ void attention_fwd(const T* __restrict__ Q, const T* __restrict__ K,
                                              const T* __restrict__ V, T* __restrict__ O,
                                              float* __restrict__ LSE, int N, float scale) {
    constexpr int WARP_M = 16 * MT, BLOCK_M = WARP_M * NWARPS, NTHREADS = 32 * NWARPS;
    constexpr int KC = D / 16;          // k-chunks of 16 along the head dim (first product)
    constexpr int NB = BLOCK_N / 8;     // n-blocks of 8 keys (score accumulators)
    constexpr int DB = D / 8;           // n-blocks of 8 dims (output accumulators)
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t q_tile = smem_u32(smem);                        // [BLOCK_M, D]
    const uint32_t k_tile0 = q_tile + BLOCK_M * D * 2;             // [2][BLOCK_N, D]
    const uint32_t v_tile0 = k_tile0 + 2 * BLOCK_N * D * 2;        // [2][BLOCK_N, D]
    constexpr uint32_t KV_BYTES = BLOCK_N * D * 2;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;                           // mma fragment coordinates
    // Causal: the heaviest query blocks (most keys) start first.
    const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int q0 = qblock * BLOCK_M;                                // first query row of the block
    const int w0 = warp * WARP_M;                                   // first row of this warp within the block
    const size_t head = (size_t)blockIdx.y * N * D;
    Q += head; K += head; V += head; O += head;

    const int n_tiles_all = (N + BLOCK_N - 1) / BLOCK_N;
    const int n_tiles = CAUSAL ? min(n_tiles_all, (q0 + BLOCK_M + BLOCK_N - 1) / BLOCK_N) : n_tiles_all;

    load_tile<BLOCK_M, D, NTHREADS>(q_tile, Q, q0, N);
    load_tile<BLOCK_N, D, NTHREADS>(k_tile0, K, 0, N);
    load_tile<BLOCK_N, D, NTHREADS>(v_tile0, V, 0, N);
    cp_async_commit();

    const float scale_log2 = scale * LOG2E;    // exp(scale * s) = exp2(scale_log2 * s)
    uint32_t qf[MT][Q_IN_REGS ? KC : 1][4];     // this warp's query rows as A fragments, [MT][KC] x 16x16
    float o[MT][DB][4];                         // output accumulators: [MT][DB] x (16 x 8)
    float m[MT][2], l[MT][2];                   // running max (scaled, log2 units) and this thread's running sums
    init_oml(o, m, l);                          // O = 0, m = -inf, l = 0 (kl/attention_mma.cuh)

    // Per-thread parts of the ldmatrix addresses (kl/attention_mma.cuh, as in tutorial 09's kernels): every row an
    // ldmatrix lane points at has row & 7 == lane & 7, so the swizzled chunk depends only on the lane and the loop
    // counters, and the rest is a compile-time offset. K: chunk 2 kc + (lane / 8) % 2 of key 8 nb + (lane & 7) +
    // 8 (lane / 16); Q: chunk 2 kc + lane / 16 of row w0 + 16 mt + (lane & 15); V: chunk db + lane / 16 of key
    // 16 kc + (lane & 15).
    constexpr int ROWB = D * 2;                                    // bytes per tile row
    uint32_t k_col[KC], q_col[KC], v_col[DB / 2], k_row, qv_row;
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);

    if (Q_IN_REGS) {                            // wait for the Q tile (and the first K, V tile) once, up front
        cp_async_wait_all();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kc = 0; kc < KC; ++kc)
                ldmatrix_x4(qf[mt][kc], q_tile + (w0 + 16 * mt) * ROWB + qv_row + q_col[kc]);
    }

    // One tile of keys: S = Q K^T, the online softmax, O += P V. MASK: the tile reaches keys past N or (causal)
    // after some row of the block, so scores get -inf there; every other tile skips that code.
    auto step = [&](int j, bool MASK) {

        cp_async_wait_all();
        __syncthreads();                        // tile j is in place; everyone is done with tile j - 1's buffers
        if (j + 1 < n_tiles) {                  // the next tile streams in while this one is computed
            load_tile<BLOCK_N, D, NTHREADS>(k_tile0 + ((j + 1) & 1) * KV_BYTES, K, (j + 1) * BLOCK_N, N);
            load_tile<BLOCK_N, D, NTHREADS>(v_tile0 + ((j + 1) & 1) * KV_BYTES, V, (j + 1) * BLOCK_N, N);
        }
        cp_async_commit();                      // (an empty group on the last tile keeps the waits uniform)
        const uint32_t k_base = k_tile0 + (j & 1) * KV_BYTES + k_row, v_base = v_tile0 + (j & 1) * KV_BYTES + qv_row;
        const int kv0 = j * BLOCK_N;

        // S = Q K^T: s[mt][nb] is the 16 x 8 block of rows w0 + 16 mt .., keys kv0 + 8 nb .. (Q re-read from shared
        // memory each chunk unless Q_IN_REGS: fewer registers at D = 128)
        float s[MT][NB][4];
        scores_qk<T, MT, NB, KC, Q_IN_REGS>(s, qf, q_tile, w0, qv_row, q_col, k_base, k_col);

        if (MASK) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kv0 + 8 * nb + 2 * t + (e & 1);
                        const int row = q0 + w0 + 16 * mt + g + (e >> 1) * 8;
                        if (key >= N || (CAUSAL && key > row)) s[mt][nb][e] = -CUDART_INF_F;
                    }
        }

        // Online softmax per row: rows g (s[.][.][0..1]) and g + 8 (s[.][.][2..3]) of each m-tile; a row's 4
        // threads are lanes 4 g .. 4 g + 3. Lazy rescaling: the running max m moves only when a score exceeds it by
        // more than RESCALE_LOG2 (so p = exp2(s - m) <= 2^RESCALE_LOG2, harmless in fp32 and in P's 16 bits);
        // O and l are then rescaled, and the warp skips the O *= alpha multiplies when no row of it moved.
        // P = exp2(S - m), 16 keys at a time, goes straight into O += P V as the A operand; V^T fragments come
        // through ldmatrix.trans: keys 16 kc + (lane & 15), dims chunk db + lane / 16. (kl/attention_mma.cuh,
        // shared with tutorial 09's kernels.)
        softmax_pv<T>(s, o, m, l, MASK, scale_log2, RESCALE_LOG2, v_base, v_col);
    };

    // Tiles wholly inside the sequence and (causal) wholly at or before the block's first row need no mask.
    int n_full = min(n_tiles, N / BLOCK_N);
    if (CAUSAL) n_full = min(n_full, (q0 + 1) / BLOCK_N);
    int j = 0;
    for (; j < n_full; ++j) step(j, false);
    for (; j < n_tiles; ++j) step(j, true);
    cp_async_wait_all();                        // the last (empty) group: no copy left in flight at exit

    // O / l, through this warp's own rows of the Q tile (no other warp reads them) for 16-byte coalesced stores.
    unsigned char* own = smem;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum;
            const float inv = quad_sum_inv(l[mt][h], sum);      // 1 / l over the row's quad (0: no key seen)
            const int r = w0 + 16 * mt + g + 8 * h;
            if (LSE != nullptr && t == 0 && q0 + r < N)      // log(sum) + max, back from log2 units
                LSE[(size_t)blockIdx.y * N + q0 + r] = (log2f(sum) + m[mt][h]) * 0.6931471805599453f;
#pragma unroll
            for (int db = 0; db < DB; ++db)
                *reinterpret_cast<uint32_t*>(own + swz<D>(r, db) + 4 * t) =
                    pack2<T>(o[mt][db][2 * h] * inv, o[mt][db][2 * h + 1] * inv);
        }
    }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < WARP_M * D / 8; i += 32) {   // WARP_M rows x D / 8 chunks of this warp
        const int r = i / (D / 8), c = i % (D / 8);
        const int row = q0 + w0 + r;
        if (row < N)
            *reinterpret_cast<uint4*>(O + (size_t)row * D + c * 8) =
                *reinterpret_cast<const uint4*>(own + swz<D>(w0 + r, c));
    }
}

}  // namespace fa2

// One entry point per (dtype, head dim, causal). Tile shapes: BLOCK_N keys per tile, NWARPS x 16 query rows.
// FA2_ENTRY(name, T, D, CAUSAL) is one extern "C" kernel with D's tiles (FA2_BN##D, FA2_QREGS##D above); kernellab
// expands the cell's own macros to find each kernel and its parameter types.
#define FA2_ENTRY(name, T, D, CAUSAL) \
extern "C" __global__ void __launch_bounds__(FA2_NWARPS * 32, FA2_MINB) \
name(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o, \
     float* __restrict__ lse, int n, float scale) { \
    fa2::attention_fwd<T, D, FA2_BN##D, FA2_NWARPS, FA2_MT, CAUSAL, FA2_QREGS##D>(q, k, v, o, lse, n, scale); \
}
FA2_ENTRY(fa2_bf16_d64, __nv_bfloat16, 64, false)
FA2_ENTRY(fa2_bf16_d64_causal, __nv_bfloat16, 64, true)
FA2_ENTRY(fa2_bf16_d128, __nv_bfloat16, 128, false)
FA2_ENTRY(fa2_bf16_d128_causal, __nv_bfloat16, 128, true)
FA2_ENTRY(fa2_f16_d64, __half, 64, false)
FA2_ENTRY(fa2_f16_d64_causal, __half, 64, true)
FA2_ENTRY(fa2_f16_d128, __half, 128, false)
FA2_ENTRY(fa2_f16_d128_causal, __half, 128, true)

# %% [markdown]
# ### What it costs
#
# The card's instruction line says which path the compiler took: `HMMA.16816.F32.BF16` (the tensor cores through
# `mma.sync`), `LDSM` (`ldmatrix`), `LDGSTS` (`cp.async`). Each entry point instantiates the template twice (interior
# and edge tiles), hence twice the `HMMA`s of one tile step. `__launch_bounds__(128, 2)` caps registers at 255 so that
# two blocks (8 warps) fit per SM; at `d = 128` the compiler spills a few bytes (the `O` accumulators alone are
# `2 x 16 x 4 = 128` registers per thread), which measured faster than the spill-free 32-key tiles.

# %%
for k in (fa2_bf16_d64, fa2_bf16_d128):
    print(f"{k.name:16s} {k.resources}")
    print(" " * 17, k.instruction_summary)
FA2 = {d: dict(block_n=bn, rows_per_warp=16 * 2, block_m=16 * 2 * 4) for d, bn in ((64, 64), (128, 64))}   # as in the cell
for d, cfg in FA2.items():
    smem = (cfg["block_m"] + 4 * cfg["block_n"]) * d * 2                 # Q tile + 2 K tiles + 2 V tiles
    k = fa2_bf16_d64 if d == 64 else fa2_bf16_d128
    print(f"d = {d}: {smem // 1024} KiB of shared memory per block;", k.occupancy(128, shared_bytes=smem).title)

# %% [markdown]
# ### Banks: why the swizzle
#
# An `ldmatrix.x4` is four 8 x 8 matrices; lanes `8i .. 8i + 7` give the row addresses of matrix `i`, and each matrix
# (8 rows of 16 bytes) is one phase of the access. Here are the addresses one warp gives when it loads `K`'s first 16 x 16
# piece, in a plain row-major `[BLOCK_N][64]` bf16 tile (rows are 128 bytes apart, so all 8 rows of a phase start in
# the same four banks) and in the swizzled tile the kernel uses, through kernellab's bank model:

# %%
ROW_BYTES = 64 * 2                                       # one K row at d = 64, bf16


def plain(row, chunk):
    return row * ROW_BYTES + 16 * chunk


def swizzled(row, chunk):
    return row * ROW_BYTES + 16 * (chunk ^ (row % 8))   # the kernel's swz<64>


# lane l: key (l & 7) + 8 (l / 16), 16-byte chunk (l / 8) % 2, as the kernel's K ldmatrix
lanes = [((l & 7) + ((l >> 4) << 3), (l >> 3) & 1) for l in range(32)]
fig = Figure(figsize=(12, 3.6), layout="constrained")
for ax, (name, layout) in zip(fig.subplots(1, 2), (("row-major tile", plain), ("XOR-swizzled tile", swizzled))):
    access = kernellab.analyze_access([layout(r, c) for r, c in lanes], 16)
    kernellab.plot_bank_access(access, ax=ax)
    ax.set_title(f"{name}: {access.wavefronts} wavefronts (ideal {access.ideal_wavefronts})", fontsize=10)
    print(f"{name:18s}: {access.wavefronts} wavefronts, {access.ways}-way")
fig

# %% [markdown]
# The row-major tile takes 8 wavefronts per phase where 1 suffices: every `ldmatrix` would be an 8-way conflict.
# The swizzle makes it conflict-free, and the same function placed the `cp.async` writes, so the tile is written and
# read through one mapping. On the GPU, Nsight Compute counts the kernel's shared-memory wavefronts and conflicts
# per source line (`Kernel.profile_banks`):

# %%
# %%gpu --skip-note "Measured on an H100 (the first version of this kernel, same layout): 80,429 conflicts in 269.6 million shared-load wavefronts, 0.03 %."
q, k, v = (torch.randn(1, 16, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
banks = fa2_bf16_d64.profile_banks((4096 // 128, 16), 128, q, k, v, torch.empty_like(q), None, 4096, 0.125,
                                   shared_bytes=(128 + 4 * 64) * 64 * 2)
banks


# %% [markdown]
# ### Check, then time


# %%
def fa2_attention(q, k, v, out=None, causal=False):
    """Step 2: FlashAttention-2 on mma.sync; q, k, v: [B, H, N, d] bf16 or fp16, d = 64 or 128, contiguous."""
    B, H, N, d = q.shape
    assert d in FA2 and q.dtype in (torch.bfloat16, torch.float16), "step 2 takes bf16/fp16 with d = 64 or 128"
    dt = "bf16" if q.dtype == torch.bfloat16 else "f16"
    kernel = globals()[f"fa2_{dt}_d{d}{'_causal' if causal else ''}"]
    cfg = FA2[d]
    out = torch.empty_like(q) if out is None else out
    smem = (cfg["block_m"] + 4 * cfg["block_n"]) * d * 2
    kernel[(math.ceil(N / cfg["block_m"]), B * H), 128, smem](q, k, v, out, None, N, d ** -0.5)   # None: no LSE
    return out


# %%
# %%gpu
step2_checks = check_all(fa2_attention)
print(summarize_checks(step2_checks))

# %%
# %%gpu
step2 = {(d, causal): bench_against_sdpa(f"step 2: mma.sync d={d}{' causal' if causal else ''}", fa2_attention, d=d,
                                         causal=causal, naive=False)
         for d in (64, 128) for causal in (False, True)}
for (d, causal), r in step2.items():
    print(f"d={d:3d} causal={causal!s:5s}: {r.tflops:6.1f} TFLOP/s; "
          + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))
step2[64, False]

# %% [markdown]
# ## Step 3: the Hopper kernel, `wgmma` fed by TMA
#
# Step 2 runs at FlashAttention-2's speed, and so stops where FlashAttention-2 stops: `mma.sync` is a warp-wide,
# synchronous instruction, and on an H100 the tensor cores can do much more than warps issuing one 16 x 8 x 16 product
# at a time can ask of them. Hopper adds three things, and this step uses all three:
# - **`wgmma.mma_async`**: a *warpgroup* (4 consecutive warps, 128 threads) issues one `m64nNk16` product, up to
#   64 x 256 x 16, with `B` (and optionally `A`) read by the tensor cores straight from shared memory through a
#   64-bit *matrix descriptor* (address, the strides between 8-row groups, the swizzle mode). It runs asynchronously:
#   `wgmma.commit_group` / `wgmma.wait_group` fence it. In SASS it is `HGMMA`.
# - **the tensor memory accelerator (TMA)**: `cp.async.bulk.tensor` copies a whole box (here 64 columns x up to 192 rows)
#   from global to shared memory, swizzled, with out-of-range rows filled with zeros, issued by one thread. The copy is
#   described by a `CUtensorMap` built on the host (`kernellab.tensor_map(tensor, box)`, through the driver's
#   `cuTensorMapEncodeTiled`) and passed by value as a `const __grid_constant__ CUtensorMap` parameter.
# - **`mbarrier`**: a shared-memory barrier that also counts bytes. The producer arrives on it saying how many bytes
#   to expect (`mbarrier.arrive.expect_tx`); the copy engine's completion counts them down; consumers wait on its phase.
#
# **Roles (warp specialisation).** Warpgroup 0 is the producer: one of its threads loads `Q` once and then streams `K`
# and `V` tiles of 128 keys into a 2-stage ring, waiting on an *empty* barrier before reusing a stage. The other
# warpgroups are consumers, 64 query rows each (3 of them at `d = 64`, 2 at `d = 128`, where the accumulators need more
# registers). Per tile a consumer waits on the stage's *full* barrier, issues `d / 16` `wgmma`s for `S = Q K^T` (both
# operands from shared memory, K-major), runs the same register softmax as step 2 on the accumulators (the layout
# of a `wgmma` accumulator is, warp by warp, the layout of `mma.sync`'s), and issues `BLOCK_N / 16` `wgmma`s for
# `O += P V` with `P` from registers and `V` read N-major (the descriptor's transpose bit). Then it arrives on the
# stage's *empty* barrier. The consumer warpgroups drift apart, so one's softmax overlaps another's products.
#
# **Shared-memory layouts.** With the 128-byte swizzle, TMA writes each 64-column box as rows of 128 bytes whose
# 16-byte chunks are XOR-permuted by `row % 8`, the same pattern as step 2's, and it is one of the layouts `wgmma`
# reads natively. A K-major operand's descriptor then has a stride of 1,024 bytes between 8-row groups, and the 16
# columns of each `k16` step start 32 bytes further in. `V`, read N-major, steps 2,048 bytes (16 keys) per product,
# and its second 64-column box (at `d = 128`) sits `BLOCK_N x 128` bytes further (the leading-byte offset).
#
# **Prediction.** The tensor work is the same as step 2's; what changes is how much of it the SM can keep in flight.
# FlashAttention-3's paper reports about 1.5-2x FlashAttention-2 on H100 for these shapes; a first version without
# its ping-pong scheduling or intra-warpgroup pipelining should land between: about 1.3-1.6x SDPA's flash backend.
# Measured on an H100 at `N = 4096`: 410 / 581 TFLOP/s (d = 64 / 128) for the first version with two consumer
# warpgroups, 459 at `d = 64` with three, and with lazy rescaling 464 / 587 (1.53x / 1.65x flash).

# %%
# %%cuda --arch sm_90a --name fa3_cell
#include <kl/attention.cuh>   // wg_attention: a consumer warpgroup's S = Q K^T, online softmax, O += P V, then O / l
#include <kl/tma.cuh>         // mbar_init, mbar_expect_tx, mbar_arrive, mbar_wait, tma_load_3d, sw128_desc
#include <math_constants.h>
#include <cuda.h>   // CUtensorMap
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;

// The configuration, per head dim (chosen by measurement on an H100: see benchmarks/NOTES-attention.md).
#define FA3_BN64 128        // keys per tile at d = 64
#define FA3_BN128 128       // keys per tile at d = 128
#define FA3_WG64 3          // consumer warpgroups at d = 64: BLOCK_M = 192 query rows (registers allow 3 x 128 + 128)
#define FA3_WG128 2         // consumer warpgroups at d = 128: BLOCK_M = 128 (its accumulators need ~160 registers)
#define FA3_ST64 2          // K/V stages in flight
#define FA3_ST128 2
#define FA3_RESCALE_LOG2 8.0f
#define FA3P_BN64 128       // step 3b (persistent): keys per tile, as FA3_BN64
#define FA3P_BN128 128
#define FA3P_ST64 3        // 3 K/V stages at d = 64 (measured: +6 % at causal N = 1024, neutral at 4096)
#define FA3P_ST128 2
#define FA3P_SCHED_BAR 8   // fa3p_sched: the consumer warpgroups' named barriers 8, 9 (, 10)
// Hopper attention forward: wgmma fed by TMA, one producer warp and two consumer warpgroups.
// Q, K, V: [BH, N, D] reached through 3-D tensor maps (dims D, N, BH; box 64 x rows x 1; 128-byte swizzle), so rows
// past N come in as zeros; O: [BH, N, D] written from registers.
namespace fa3 {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float RESCALE_LOG2 = FA3_RESCALE_LOG2;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarriers, TMA loads and wgmma's swizzled descriptors (mbar_*, tma_load_3d, sw128_desc) come from <kl/tma.cuh>;
// the consumer warpgroups' work (wgmma_ss, the softmax, wgmma_rs_tb, the output) from <kl/attention.cuh>.

template <typename T, int D, int BN, int NCWG, int STAGES, bool CAUSAL>
__device__ __forceinline__ void attention_fwd(const void* tq, const void* tk, const void* tv, T* __restrict__ O, int N,
                                              float scale) {
    constexpr int BM = 64 * NCWG;               // query rows per block: 64 per consumer warpgroup
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // Q, the K/V ring and their mbarriers (<kl/attention.cuh>), 1024-byte aligned: the 128-byte swizzle repeats
    // every 1024 bytes.
    const QKvRing<D, BM, BN, STAGES> sm((smem_u32(smem_raw) + 1023) & ~1023u);

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int q0 = qblock * BM, bh = blockIdx.y;
    const int n_tiles = kv_tiles<BM, BN, CAUSAL>(N, q0);   // causal: up to the diagonal of the block's last row

    sm.init_barriers_and_sync(4 * NCWG);         // thread 0, then the block; empty: one arrival per consumer warp

    if (wg == 0) {                              // producer: one thread issues every copy (<kl/attention.cuh>)
        if (tid == 0) {
            produce_q<D, BM>(tq, sm.q_s, sm.full_q, q0, bh);
            produce_kv<D, BN, STAGES>(tk, tv, sm.k_s, sm.v_s, sm.full_k, sm.full_v, sm.empty, n_tiles, bh);
        }
        return;
    }

    // consumers: warpgroup c = wg - 1 owns query rows q0 + 64 c .. + 63; warp w of it rows 16 w .., as in mma.sync.
    // Each waits for Q, then for each K/V tile: S = Q K^T (wgmma), the mask, the online softmax, O += P V (wgmma, P
    // from registers), and releases the stage; at the end it writes O / l.
    const float scale_log2 = scale * LOG2E;
    mbar_wait(sm.full_q, 0);
    int kv = 0;                                  // K/V tiles consumed: stage kv % STAGES
    wg_attention<T, D, BN, BM, STAGES, CAUSAL, false>(wg - 1, tid, O, bh, q0, N, n_tiles, kv, sm.q_s, sm.k_s, sm.v_s,
                                                      sm.kKvBytes, sm.full_k, sm.full_v, sm.empty, 0, scale_log2,
                                                      RESCALE_LOG2);
}


// ---- Step 3b: the same tiles, roles and softmax in a persistent kernel ------------------------------------------------
// grid = the SM count. A work item is one (query block, batch*head); items are numbered in L2 sections of
// `heads_per_section` heads (the CTAs running at once share those heads' K/V in L2), query blocks outermost inside a
// section (heaviest first with the causal mask), heads innermost. CTA b's first item is b; then the producer draws the
// next from an atomic counter (whichever CTA is ready first takes it) and tells the consumers through shared memory.
// Two Q buffers: the producer loads item i+1's Q, then its first K/V stages, while the consumers finish item i.
// Every barrier's phase is counted across items.
// Work item -> (query block, batch*head). Sections of `hps` heads (the last may have fewer); inside one, query
// blocks outermost (heaviest first when causal), heads innermost.
template <bool CAUSAL>
__device__ __forceinline__ void item_coords(int item, int n_qblocks, int BH, int hps, bool alternate, int& qblock,
                                            int& bh) {
    const int per_section = hps * n_qblocks;
    const int sec = item / per_section;
    const int r = item - sec * per_section;
    const int heads = min(hps, BH - sec * hps);
    const int level = r / heads;
    bh = sec * hps + (r - level * heads);
    qblock = (CAUSAL && !(alternate && (sec & 1))) ? n_qblocks - 1 - level : level;
}

// The producer's next work item after item number `it` of this CTA (-1: no more). Static: round it + 1 of the snake.
// Dynamic: a draw from *counter; the draws of a launch number n_items in all (the successful ones, then one failing
// draw per CTA), so the one that returns n_items - 1 is the launch's last and puts the counter back to 0.
__device__ __forceinline__ int next_item(int it, int n_items, int* counter) {
    if (counter == nullptr) {
        const int round = it + 1;
        const int item = round * gridDim.x + ((round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
        return item < n_items ? item : -1;
    }
    const int drawn = atomicAdd(counter, 1);
    if (drawn == n_items - 1) atomicExch(counter, 0);
    const int item = gridDim.x + drawn;
    return item < n_items ? item : -1;
}

// ---- Step 3b with ping-pong scheduling (the fa3p_sched_* entries) --------------------------------------------------
// The consumer warpgroups take turns on the tensor cores (wg_attention_pingpong, <kl/attention.cuh>): a turn of
// warpgroup c is O += P V of its tile j - 1 and S = Q K^T of its tile j, issued back to back; its softmax of tile j
// runs during the next warpgroup's turn. Turns pass round the ring 0, 1, .., NCWG - 1, 0, .. through named barriers:
// warpgroup c waits on barrier FA3P_SCHED_BAR + c (bar.sync, 256 threads: its 128 and the 128 of the one before it,
// which bar.arrive there once its products are issued). __syncthreads is barrier 0; nothing else uses named barriers.
// P of tile j - 1, O and S of tile j are live together (160 registers of them at d = 128, 128 at d = 64); under the
// launch's 168 (128 at d = 64) ptxas spills 12-32 bytes, so the producer gives its registers back (setmaxnreg.dec)
// and the consumers take them (setmaxnreg.inc): no spills.
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
// Registers a thread after setmaxnreg: the producer 24, the consumers what is left of 65,536 in multiples of 8 (at most
// 240): 240 with 2 consumer warpgroups, 160 with 3 (24 x 128 + 3 x 160 x 128 = 64,512).
template <int NCWG>
struct SchedRegs {
    static constexpr int kProducer = 24;
    static constexpr int kLeft = (65536 - 128 * kProducer) / (128 * NCWG) / 8 * 8;
    static constexpr int kConsumer = kLeft < 240 ? kLeft : 240;
};

template <typename T, int D, int BN, int NCWG, int STAGES, bool CAUSAL, bool SCHED = false>
__device__ __forceinline__ void attention_fwd_persistent(const void* tq, const void* tk, const void* tv,
                                                         T* __restrict__ O, int N, int BH, int heads_per_section,
                                                         int* __restrict__ work_counter, float scale) {
    constexpr int BM = 64 * NCWG;               // query rows per work item: 64 per consumer warpgroup
    constexpr int DB = D / 64;                  // 64-column blocks of the head dim (one TMA box each)
    constexpr uint32_t Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    const uint32_t q_s = base;                                   // [2][DB][BM][64]: two Q buffers
    const uint32_t k_s = q_s + 2 * Q_BYTES;                      // [STAGES][DB][BN][64]
    const uint32_t v_s = k_s + STAGES * KV_BYTES;                // [STAGES][DB][BN][64]
    const uint32_t bars = v_s + STAGES * KV_BYTES;               // full_q[2], empty_q[2], full_k[S], full_v[S], empty[S]
    const uint32_t full_q = bars, empty_q = bars + 16, full_k = bars + 32, full_v = full_k + 8 * STAGES,
                   empty = full_v + 8 * STAGES;
    // SCHED: a stage's K and V are freed apart (K after S = Q K^T, V after P V, a turn later): empty[S] is K's and
    // empty_v[S] after it V's
    const uint32_t empty_v = empty + 8 * STAGES, slots = SCHED ? empty_v + 8 * STAGES : empty + 8 * STAGES;
    // the work item whose Q is in buffer b (-1: none left), written by the producer before it arrives on full_q[b]
    volatile int* item_slot = reinterpret_cast<volatile int*>(smem_raw + (slots - smem_u32(smem_raw)));

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int n_qblocks = (N + BM - 1) / BM;
    const int n_items = n_qblocks * BH;
    const int n_tiles_all = (N + BN - 1) / BN;
    const int hps = max(1, min(heads_per_section, BH));

    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b) {
            mbar_init(full_q + 8 * b, 1);
            mbar_init(empty_q + 8 * b, 4 * NCWG);   // one arrival per consumer warp
        }
        init_kv_ring<STAGES>(full_k, full_v, empty, 4 * NCWG);
        if constexpr (SCHED)
            for (int s = 0; s < STAGES; ++s) mbar_init(empty_v + 8 * s, 4 * NCWG);
        fence_mbarrier_init();
    }
    __syncthreads();
    if constexpr (SCHED) {                      // the producer's registers to the consumers (see SchedRegs)
        if (wg == 0) setmaxnreg_dec<SchedRegs<NCWG>::kProducer>();
        else setmaxnreg_inc<SchedRegs<NCWG>::kConsumer>();
    }

    if (wg == 0) {                              // producer: one thread issues every copy, item after item
        if (tid == 0) {
            int kv = 0;                         // K/V tiles loaded so far, over all items: stage kv % STAGES
            int item = blockIdx.x < n_items ? (int)blockIdx.x : -1;
            for (int it = 0;; ++it) {           // it: items so far, Q buffer it % 2
                const int qb = it & 1;
                // the buffer held item it - 2's Q: wait until every consumer warp has done its last S = Q K^T
                if (it >= 2) mbar_wait(empty_q + 8 * qb, ((it >> 1) - 1) & 1);
                item_slot[qb] = item;
                if (item < 0) {                 // no more work: release the consumers with an empty phase
                    mbar_arrive(full_q + 8 * qb);
                    break;
                }
                int qblock, bh;
                item_coords<CAUSAL>(item, n_qblocks, BH, hps, work_counter == nullptr, qblock, bh);
                const int q0 = qblock * BM;
                const int n_tiles = CAUSAL ? min(n_tiles_all, (q0 + BM + BN - 1) / BN) : n_tiles_all;
                produce_q<D, BM>(tq, q_s + qb * Q_BYTES, full_q + 8 * qb, q0, bh);
                if constexpr (SCHED)
                    produce_kv_apart<D, BN, STAGES>(tk, tv, k_s, v_s, full_k, full_v, empty, empty_v, n_tiles, bh, kv);
                else
                    produce_kv<D, BN, STAGES>(tk, tv, k_s, v_s, full_k, full_v, empty, n_tiles, bh, kv);
                item = next_item(it, n_items, work_counter);
            }
        }
        return;
    }

    // consumers: warpgroup c = wg - 1 owns query rows q0 + 64 c .. + 63 of each item: step 3's work, item after item,
    // and one thing more: after an item's last S = Q K^T each warp releases the Q buffer (empty_q) for the producer
    const float scale_log2 = scale * LOG2E;
    int kv = 0;                                  // K/V tiles consumed, over all items: stage kv % STAGES
    if constexpr (SCHED) {                       // the last consumer warpgroup gives the first its first turn
        if (wg == NCWG) named_barrier_arrive(FA3P_SCHED_BAR, 128 * 2);
    }
    for (int it = 0;; ++it) {
        const int qb = it & 1;
        mbar_wait(full_q + 8 * qb, (it >> 1) & 1);
        const int item = item_slot[qb];
        if (item < 0) break;
        int qblock, bh;
        item_coords<CAUSAL>(item, n_qblocks, BH, hps, work_counter == nullptr, qblock, bh);
        const int q0 = qblock * BM;
        const int n_tiles = CAUSAL ? min(n_tiles_all, (q0 + BM + BN - 1) / BN) : n_tiles_all;
        // (the producer is already loading the next item's Q and K/V while this one's last tiles and output run)
        if constexpr (SCHED)
            wg_attention_pingpong<T, D, BN, BM, STAGES, CAUSAL, NCWG, FA3P_SCHED_BAR>(
                wg - 1, tid, O, bh, q0, N, n_tiles, kv, q_s + qb * Q_BYTES, k_s, v_s, KV_BYTES, full_k, full_v, empty,
                empty_v, empty_q + 8 * qb, scale_log2, RESCALE_LOG2);
        else
            wg_attention<T, D, BN, BM, STAGES, CAUSAL, true>(wg - 1, tid, O, bh, q0, N, n_tiles, kv,
                                                             q_s + qb * Q_BYTES, k_s, v_s, KV_BYTES, full_k, full_v,
                                                             empty, empty_q + 8 * qb, scale_log2, RESCALE_LOG2);
    }
    if constexpr (SCHED) {                       // the last turn's arrive (the last warpgroup's, to the first)
        if (wg == 1) named_barrier_sync(FA3P_SCHED_BAR, 128 * 2);
    }
}
}  // namespace fa3

// One entry point per (dtype, head dim, causal): FA3_ENTRY(name, T, D, CAUSAL) is one extern "C" kernel with D's
// tiles (FA3_BN##D keys, FA3_WG##D consumer warpgroups, FA3_ST##D stages, above); FA3P_ENTRY(name, T, D, BN, WG,
// ST, CAUSAL, MINB) one of step 3b's persistent kernels, its template arguments in attention_fwd_persistent's order
// and MINB CTAs an SM. kernellab expands the cell's own macros to find each kernel and its parameter types.
#define FA3_ENTRY(name, T, D, CAUSAL) \
extern "C" __global__ void __launch_bounds__(128 * (FA3_WG##D + 1), 1) \
name(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk, \
     const __grid_constant__ CUtensorMap tv, T* __restrict__ o, int n, float scale) { \
    fa3::attention_fwd<T, D, FA3_BN##D, FA3_WG##D, FA3_ST##D, CAUSAL>(&tq, &tk, &tv, o, n, scale); \
}
#define FA3P_ENTRY(name, T, D, BN, WG, ST, CAUSAL, MINB) \
extern "C" __global__ void __launch_bounds__(128 * (WG + 1), MINB) \
name(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk, \
     const __grid_constant__ CUtensorMap tv, T* __restrict__ o, int n, int bh, int heads_per_section, \
     int* __restrict__ work_counter, float scale) { \
    fa3::attention_fwd_persistent<T, D, BN, WG, ST, CAUSAL>(&tq, &tk, &tv, o, n, bh, heads_per_section, \
                                                            work_counter, scale); \
}
FA3_ENTRY(fa3_bf16_d64, __nv_bfloat16, 64, false)
FA3_ENTRY(fa3_bf16_d64_causal, __nv_bfloat16, 64, true)
FA3_ENTRY(fa3_bf16_d128, __nv_bfloat16, 128, false)
FA3_ENTRY(fa3_bf16_d128_causal, __nv_bfloat16, 128, true)
FA3_ENTRY(fa3_f16_d64, __half, 64, false)
FA3_ENTRY(fa3_f16_d64_causal, __half, 64, true)
FA3_ENTRY(fa3_f16_d128, __half, 128, false)
FA3_ENTRY(fa3_f16_d128_causal, __half, 128, true)
// step 3b: 3 consumer warpgroups (BLOCK_M = 192) or 2 (_bm128) at d = 64; 2 at d = 128
FA3P_ENTRY(fa3p_bf16_d64, __nv_bfloat16, 64, FA3P_BN64, 3, FA3P_ST64, false, 1)
FA3P_ENTRY(fa3p_bf16_d64_bm128, __nv_bfloat16, 64, FA3P_BN64, 2, FA3P_ST64, false, 1)
FA3P_ENTRY(fa3p_bf16_d64_causal, __nv_bfloat16, 64, FA3P_BN64, 3, FA3P_ST64, true, 1)
FA3P_ENTRY(fa3p_bf16_d64_causal_bm128, __nv_bfloat16, 64, FA3P_BN64, 2, FA3P_ST64, true, 1)
FA3P_ENTRY(fa3p_bf16_d128, __nv_bfloat16, 128, FA3P_BN128, 2, FA3P_ST128, false, 1)
FA3P_ENTRY(fa3p_bf16_d128_causal, __nv_bfloat16, 128, FA3P_BN128, 2, FA3P_ST128, true, 1)
FA3P_ENTRY(fa3p_f16_d64, __half, 64, FA3P_BN64, 3, FA3P_ST64, false, 1)
FA3P_ENTRY(fa3p_f16_d64_bm128, __half, 64, FA3P_BN64, 2, FA3P_ST64, false, 1)
FA3P_ENTRY(fa3p_f16_d64_causal, __half, 64, FA3P_BN64, 3, FA3P_ST64, true, 1)
FA3P_ENTRY(fa3p_f16_d64_causal_bm128, __half, 64, FA3P_BN64, 2, FA3P_ST64, true, 1)
FA3P_ENTRY(fa3p_f16_d128, __half, 128, FA3P_BN128, 2, FA3P_ST128, false, 1)
FA3P_ENTRY(fa3p_f16_d128_causal, __half, 128, FA3P_BN128, 2, FA3P_ST128, true, 1)
// step 3b with ping-pong scheduling between the consumer warpgroups (3 at d = 64, 2 at d = 128), same tiles
#define FA3P_SCHED_ENTRY(name, T, D, BN, WG, ST, CAUSAL) \
extern "C" __global__ void __launch_bounds__(128 * (WG + 1), 1) \
name(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk, \
     const __grid_constant__ CUtensorMap tv, T* __restrict__ o, int n, int bh, int heads_per_section, \
     int* __restrict__ work_counter, float scale) { \
    fa3::attention_fwd_persistent<T, D, BN, WG, ST, CAUSAL, true>(&tq, &tk, &tv, o, n, bh, heads_per_section, \
                                                                  work_counter, scale); \
}
FA3P_SCHED_ENTRY(fa3p_sched_bf16_d64, __nv_bfloat16, 64, FA3P_BN64, 3, FA3P_ST64, false)
FA3P_SCHED_ENTRY(fa3p_sched_bf16_d64_causal, __nv_bfloat16, 64, FA3P_BN64, 3, FA3P_ST64, true)
FA3P_SCHED_ENTRY(fa3p_sched_bf16_d128, __nv_bfloat16, 128, FA3P_BN128, 2, FA3P_ST128, false)
FA3P_SCHED_ENTRY(fa3p_sched_bf16_d128_causal, __nv_bfloat16, 128, FA3P_BN128, 2, FA3P_ST128, true)
FA3P_SCHED_ENTRY(fa3p_sched_f16_d64, __half, 64, FA3P_BN64, 3, FA3P_ST64, false)
FA3P_SCHED_ENTRY(fa3p_sched_f16_d64_causal, __half, 64, FA3P_BN64, 3, FA3P_ST64, true)
FA3P_SCHED_ENTRY(fa3p_sched_f16_d128, __half, 128, FA3P_BN128, 2, FA3P_ST128, false)
FA3P_SCHED_ENTRY(fa3p_sched_f16_d128_causal, __half, 128, FA3P_BN128, 2, FA3P_ST128, true)
// step 3b for short sequences (_bm64): one consumer warpgroup (64 query rows), 64-key tiles, two CTAs per SM, so one
// CTA's pipeline fill and epilogue run under the other's products (see "One entry point" below)
#define FA3P_BM64_BN 64     // keys per tile (the 64-wide accumulators fit two CTAs' registers)
#define FA3P_BM64_ST64 3    // K/V stages (66 KB of shared memory a CTA)
// (at d = 128 the 64-row CTA needs more than the 128 registers two CTAs an SM leave it: it spills, so d = 128 has none)
FA3P_ENTRY(fa3p_bf16_d64_bm64, __nv_bfloat16, 64, FA3P_BM64_BN, 1, FA3P_BM64_ST64, false, 2)
FA3P_ENTRY(fa3p_bf16_d64_causal_bm64, __nv_bfloat16, 64, FA3P_BM64_BN, 1, FA3P_BM64_ST64, true, 2)
FA3P_ENTRY(fa3p_f16_d64_bm64, __half, 64, FA3P_BM64_BN, 1, FA3P_BM64_ST64, false, 2)
FA3P_ENTRY(fa3p_f16_d64_causal_bm64, __half, 64, FA3P_BM64_BN, 1, FA3P_BM64_ST64, true, 2)

# %% [markdown]
# The card shows the Hopper path: `HGMMA.64x128x16.F32.BF16` for both products (with `.tnspB` on the second), `UTMALDG`
# (the TMA loads) and `SYNCS` (the `mbarrier` operations); no `HMMA`, no `LDGSTS`, no `LDSM`. Compiled for plain
# `sm_90`, the same source fails with a clear error: `wgmma` exists only on `sm_90a`:

# %%
for k in (fa3_bf16_d64, fa3_bf16_d128):
    print(f"{k.name:16s} {k.resources}")
    print(" " * 17, k.instruction_summary)
try:
    kernellab.compile_cuda(re.sub(r"#define FA3_ENTRY[\s\S]*", "", fa3_bf16_d64.module.source) +
                           'extern "C" __global__ void probe(float* out) { float d[64] = {}; '
                           "fa3::wgmma_fence(); fa3::wgmma_ss<128, __nv_bfloat16>(d, 0, 0, 0); out[0] = d[0]; }",
                           arch="sm_90")
except kernellab.CompileError as exc:
    print(str(exc).splitlines()[-1])

# %%
FA3 = {64: dict(block_n=128, consumers=3, stages=2), 128: dict(block_n=128, consumers=2, stages=2)}   # as in the cell


def fa3_attention(q, k, v, out=None, causal=False):
    """Step 3: wgmma + TMA; q, k, v: [B, H, N, d] bf16 or fp16, d = 64 or 128, contiguous (sm_90)."""
    B, H, N, d = q.shape
    assert d in FA3 and q.dtype in (torch.bfloat16, torch.float16), "step 3 takes bf16/fp16 with d = 64 or 128"
    dt = "bf16" if q.dtype == torch.bfloat16 else "f16"
    kernel = globals()[f"fa3_{dt}_d{d}{'_causal' if causal else ''}"]
    cfg = FA3[d]
    block_m, block_n = 64 * cfg["consumers"], cfg["block_n"]
    # [B * H, N, d] views, boxes of 64 columns (128 bytes: the 128-byte swizzle's span) by block_m / block_n rows
    maps = [kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64)) for x, rows in ((q, block_m), (k, block_n),
                                                                                    (v, block_n))]
    out = torch.empty_like(q) if out is None else out
    smem = 1024 + (block_m + 2 * cfg["stages"] * block_n) * d * 2 + 256      # alignment slack, tiles, barriers
    kernel[(math.ceil(N / block_m), B * H), 128 * (cfg["consumers"] + 1), smem](*maps, out, N, d ** -0.5)
    return out


# %%
# %%gpu
step3_checks = check_all(fa3_attention)
print(summarize_checks(step3_checks))

# %%
# %%gpu
step3 = {(d, causal): bench_against_sdpa(f"step 3: wgmma d={d}{' causal' if causal else ''}", fa3_attention, d=d,
                                         causal=causal, naive=False)
         for d in (64, 128) for causal in (False, True)}
for (d, causal), r in step3.items():
    print(f"d={d:3d} causal={causal!s:5s}: {r.tflops:6.1f} TFLOP/s; "
          + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))
step3[128, False]

# %% [markdown]
# ## Step 3b: one CTA per SM, walking work items
#
# Step 3 launches one CTA per (query block, head): at `N = 1024`, `d = 64` that is 6 x 512 = 3,072 CTAs of 512
# threads, one resident per SM, each paying the same fixed costs before its first product and after its last one:
# barrier set-up, the `Q` load, two K/V stages filling while the consumers wait, then the epilogue with the tensor
# cores idle. With only 8 key tiles per item (5.3 on average with the causal mask), those costs are a large share, and
# step 3 is 1.21x flash at `N = 1024` against 1.49x at `N = 4096` (benchmarks/attention.py on an H100,
# 2026-11-23). With the causal mask the items also differ in length (2 to 8 tiles), and the last wave is ragged.
#
# The second half of step 3's cell holds `attention_fwd_persistent`, the same tiles, roles, softmax and products in a
# **persistent** kernel:
# - the grid is the SM count; a *work item* is one (query block, head). CTA `b` starts with item `b`; after that the
#   producer thread draws the next item number from an `atomicAdd` on a counter in global memory: whichever CTA is ready
#   first takes the next item, so long and short items even out by themselves. The draw that returns the launch's last
#   number puts the counter back to 0, so one zeroed `int` serves every launch.
# - items are numbered heaviest first (the causal mask's last query blocks have the most key tiles) and in *L2
#   sections* of as many heads as have their K and V within 16 MB, so the CTAs running at once read the same K/V from L2.
# - two `Q` buffers: while the consumers finish item `i` (its last tiles and its epilogue), the producer already loads
#   item `i + 1`'s `Q` and its first K/V stages; the consumers learn the item number through shared memory, published
#   by the `Q` buffer's full barrier. Every barrier's phase now counts across items.
#
# **Block height at d = 64.** 192 query rows (3 consumer warpgroups) is the faster height when nothing is wasted (it
# keeps more products in flight per SM: 1.16x the 128-row kernel at `N = 4096`). But tiles are computed whole: at
# `N = 1024` with the causal mask, 192-row blocks compute 786k (row, key) pairs per head for the 525k the mask keeps,
# 128-row blocks 590k. The launcher takes the height with the smaller predicted time, pairs computed / relative
# throughput (1.0 and 0.86, measured at `N = 4096`): 128 rows for the causal mask up to `N = 1024`, 192 elsewhere.
#
# **Stages.** At `d = 64` the kernel keeps 3 K/V stages in flight (step 3 has 2): an item there is 4.5 key tiles long
# on average with the causal mask at `N = 1024`, and a third stage lets the producer run one more tile ahead through an
# item's start. Measured beside 2 stages (H100, one run): +6.3 % at causal `N = 1024`, +2 % at
# `N = 1024` without the mask, within 1 % at 2048 and 4096. (At `d = 128` a third stage does not fit in shared memory.)
#
# **Prediction.** The static balance model (the busiest SM's work over the mean, counted in key tiles) and the hidden prologue predict
# +10-15 % over step 3 at `N = 1024`, a few percent at `N = 4096` (where each item has 32 tiles to amortise its fixed
# costs). Measured on an H100 (2026-11-23, in the same run as SDPA): `d = 64`,
# `N = 1024`: 389.6 TFLOP/s against step 3's 347.7 (1.12x; 1.35x flash), causal 263.1 against 225.4 with 192-row
# blocks and 278.2 with 128-row blocks (1.30x flash); `N = 4096`: +3-4 %; `d = 128`: +2-9 %. The check and the
# benchmark below are this run's (with 3 stages at `d = 64`): +8-31 % over step 3 at `N = 1024`, +1-9 % at
# `N = 4096`, so the prediction held at `N = 4096` and, at `N = 1024`, within 2 points but for the causal `d = 64` row,
# which gained more than predicted (+31 %: the third stage).

# %%
FA3P = {64: dict(block_n=128, stages=3), 128: dict(block_n=128, stages=2)}       # as the cell's FA3P_ defines
THROUGHPUT = {192: 1.0, 128: 0.86}       # relative speed of the two heights at d = 64 when neither wastes work
work_counter = {}                         # one zeroed int32 per device; every launch leaves it at 0


def pairs_computed(N, block_m, block_n, causal):
    """(query row, key) pairs one head's work items compute: whole tiles, up to the diagonal with the mask."""
    tiles = math.ceil(N / block_n)
    per_block = [min(tiles, math.ceil((qb + 1) * block_m / block_n)) if causal else tiles
                 for qb in range(math.ceil(N / block_m))]
    return block_m * block_n * sum(per_block)


def fa3p_block_m(N, d, causal):
    """192 or 128 query rows per item at d = 64 (the smaller predicted time); 128 at d = 128."""
    if d == 128:
        return 128
    return min(THROUGHPUT, key=lambda bm: pairs_computed(N, bm, FA3P[d]["block_n"], causal) / THROUGHPUT[bm])


def fa3p_attention(q, k, v, out=None, causal=False, ctas=None, sched=False):
    """Step 3b: the persistent wgmma + TMA kernel; q, k, v: [B, H, N, d] bf16 or fp16, d = 64 or 128 (sm_90).
    sched: the fa3p_sched_* entries (ping-pong scheduling between the consumer warpgroups; 192 rows at d = 64)."""
    B, H, N, d = q.shape
    assert d in FA3P and q.dtype in (torch.bfloat16, torch.float16), "step 3b takes bf16/fp16 with d = 64 or 128"
    block_m, block_n = (192 if d == 64 else 128) if sched else fa3p_block_m(N, d, causal), FA3P[d]["block_n"]
    dt = "bf16" if q.dtype == torch.bfloat16 else "f16"
    kernel = globals()[f"fa3p{'_sched' if sched else ''}_{dt}_d{d}{'_causal' if causal else ''}"
                       f"{'_bm128' if d == 64 and block_m == 128 else ''}"]
    if q.device not in work_counter:
        work_counter[q.device] = torch.zeros(1, dtype=torch.int32, device=q.device)
    maps = [kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64)) for x, rows in ((q, block_m), (k, block_n),
                                                                                    (v, block_n))]
    heads_per_section = max(1, min(B * H, (16 << 20) // (2 * N * d * q.element_size())))   # K/V within 16 MB of L2
    items = math.ceil(N / block_m) * B * H
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    out = torch.empty_like(q) if out is None else out
    smem = 1024 + (2 * block_m + 2 * FA3P[d]["stages"] * block_n) * d * 2 + 256      # 2 Q buffers, K/V stages
    kernel[(min(ctas or sms, items),), 128 * (block_m // 64 + 1), smem](*maps, out, N, B * H, heads_per_section,
                                                                        work_counter[q.device], d ** -0.5)
    return out


print({(N, causal): fa3p_block_m(N, 64, causal) for N in (1024, 2048, 4096) for causal in (False, True)})

# %%
# %%gpu
step3b_checks = check_all(fa3p_attention)
print(summarize_checks(step3b_checks))
# 7 CTAs: each walks dozens of items, so every barrier's phase wraps many times
few = check_all(lambda q, k, v, o, causal: fa3p_attention(q, k, v, o, causal, ctas=7), ns=(1031, 4097), trials=1)
print("on 7 CTAs:", sum(r["passed"] and r["within_2x"] for r in few), "of", len(few), "cases pass")

# %%
# %%gpu
step3b = {}
for N in (1024, 4096):
    for d in (64, 128):
        for causal in (False, True):
            step3b[N, d, causal] = bench_against_sdpa(f"step 3b: persistent d={d}{' causal' if causal else ''} N={N}",
                                                      fa3p_attention, N=N, d=d, causal=causal, naive=False)
            step3_n = step3[d, causal] if N == 4096 else bench_against_sdpa(
                "step 3", fa3_attention, N=N, d=d, causal=causal, naive=False)
            r = step3b[N, d, causal]
            print(f"N={N:5d} d={d:3d} causal={causal!s:5s}: {r.tflops:6.1f} TFLOP/s ({r.tflops / step3_n.tflops:.2f}x "
                  f"step 3); " + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))
step3b[1024, 64, True]

# %% [markdown]
# ### A variant: ping-pong scheduling between the consumer warpgroups (`fa3p_sched_*`)
#
# Step 3b's consumer warpgroups issue their `wgmma`s whenever they are ready, and overlap one warpgroup's softmax with
# another's products only as far as they happen to drift apart. FlashAttention-3's paper orders them on purpose: with
# named barriers, each warpgroup waits for its *turn*, issues two products back to back, O += P V of its previous
# tile and S = Q K^T of its next, passes the turn on, and runs that tile's softmax while the next warpgroup's products
# keep the tensor cores busy. The `fa3p_sched_*` entries at the end of step 3's cell are step 3b with those turns
# (`attention_fwd_persistent<..., SCHED = true>`, the consumer `wg_attention_pingpong`):
# - **the ring.** Consumer warpgroup `c` waits at named barrier `8 + c` (`bar.sync 8 + c, 256`: its 128 threads and
#   the 128 of the warpgroup before it), and after issuing its products arrives at the next one's barrier
#   (`bar.arrive 8 + (c + 1) % n, 256`). The last warpgroup arrives once at barrier 8 before anything else, so
#   warpgroup 0 goes first; at `d = 64` three warpgroups take turns round robin. (`__syncthreads` is barrier 0, and the
#   kernel has no other named barrier.)
# - **items and the last tile.** An item of `n` key tiles is `n + 1` turns (the first has only S = Q K^T, the last
#   only P V; both peeled off the loop: with the products under a branch, ptxas serialised the `wgmma`s at `d = 64`).
#   The warpgroups of a CTA share each item, so they take the same number of turns, and the ring runs on across items,
#   causal ones of different lengths included; at the end warpgroup 0 waits once more at barrier 8, which takes the
#   last warpgroup's last arrive, so every `bar.arrive` has its `bar.sync` before the kernel exits.
# - **registers.** P of the previous tile, O and the new S are live at once: 160 registers of them at `d = 128` (128
#   at `d = 64`). Under the 168 registers a thread of 384 gets at launch (128 of 512 at `d = 64`) ptxas spills 12-32
#   bytes; so the producer gives registers back (`setmaxnreg.dec` to 24) and the consumers take them (`setmaxnreg.inc`
#   to 240 with two consumer warpgroups, 160 with three): no spills.
#
# The arithmetic of each warpgroup is step 3b's, in the same order: in the CPU emulator `fa3p_sched` writes the very bits
# `fa3p` writes, and the emulator fails a kernel whose ring deadlocks or leaves an arrive without its sync
# (tests/test_attention_persistent.py). Step 3b's own entries compile to the same SASS as without the variant.
#
# **Prediction.** +3-8 % over `fa3p` at `d = 128`, `N >= 2048` (FlashAttention-3's paper credits this overlap and its
# intra-warpgroup pipelining together with ~570 -> ~620-660 TFLOP/s at `d = 128`), which would bring `d = 128` within
# a few percent of cuDNN; neutral or worse at `d = 64` (three warpgroups already overlap well, and each waits up to two
# turns) and at short `N` (two turns an item with one product each). The cell below checks it and times it at
# `N = 4096` beside step 3b's timings above; `python3 tools/gpu/run.py bench-attention-sched` times it beside `fa3p`,
# FLASH and CUDNN at `N = 2048` to 8192.

# %%
# %%gpu
sched_checks = check_all(lambda q, k, v, o, causal: fa3p_attention(q, k, v, o, causal, sched=True), ns=(65, 1031, 4097),
                         trials=1)
print(summarize_checks(sched_checks))
for d in (64, 128):
    for causal in (False, True):
        r = bench_against_sdpa(f"step 3b, ping-pong d={d}{' causal' if causal else ''}",
                               lambda q, k, v, o, causal: fa3p_attention(q, k, v, o, causal, sched=True), N=4096, d=d,
                               causal=causal, naive=False)
        print(f"N= 4096 d={d:3d} causal={causal!s:5s}: {r.tflops:6.1f} TFLOP/s "
              f"({r.tflops / step3b[4096, d, causal].tflops:.3f}x step 3b); "
              + ", ".join(f"{s.ratio:.2f}x {s.baseline}" for s in r.speedups))

# %% [markdown]
# **Measured** (NVIDIA H200, bf16, `B N = 16k`, `H d = 2048`, `kernellab.bench`; every check passes with step 3b's
# error). The first version freed a stage whole, after the P V that reads its V: **wrong in sign at `d = 128`**,
# 0.919-0.958x step 3b at `N = 2048`-8192, neutral at `d = 64`. Nsight Compute (`python3 tools/gpu/run.py
# profile-attention-short 64x4096x128 64x4096x128c --steps fa3p,fa3p_sched`, one launch each) said why: the tensor
# pipe at 62.1 % of active cycles against step 3b's 65.9 % (causal 56.4 against 62.3), and the stall that grew most
# was `long_scoreboard`, the consumers waiting on a K/V stage's `mbarrier` (1.38 warps an issue against 0.75). A turn
# issues S of tile j a product after the P V of tile j - 1, so a whole stage came free a product later than in step
# 3b, and with two stages at `d = 128` (three do not fit beside the two Q buffers) the producer waited for it. So the
# stages' K and V are now freed apart: each turn frees tile j's K as soon as S is done and tile j - 1's V after its
# P V (`empty` and `empty_v`, a barrier each), and the producer refills a K half a turn before its V half
# (`produce_kv_apart`). Measured again (the cell above, and `bench-attention-sched` beside it): **1.039-1.052x step
# 3b at `d = 128`** (`N = 2048`-8192, causal or not), inside the +3-8 % predicted, and **1.00-1.03x cuDNN with the
# causal mask** (0.92-0.95x without); at `d = 64` 0.989-1.007x, neutral. The profile at `d = 128`, `N = 4096`: tensor
# pipe 70.1 % against 65.8 %, `long_scoreboard` 0.53 against 0.75 (causal: 65.5 against 62.4 %, 0.62 against 0.79).
# Step 3b keeps its place in the entry point until the plan's model has the variant's rate (it is not a candidate
# yet); at `d = 128` it is the fastest kernel of this tutorial.

# %% [markdown]
# ## Discussion: every step against every backend
#
# The table times every step and SDPA's backends at the FlashAttention-3 paper's shapes (`B N = 16k`,
# `H d = 2048`), bf16 (step 1 in fp16, at `d = 64` only), with and without the causal mask. Ratios are against SDPA's
# flash backend (FlashAttention-2) measured in the same run. Where there is no GPU, the table and plot show the
# figures recorded on an H100 on 2026-11-23 (`benchmarks/attention.py` prints the same table at every `N` from 1k
# to 16k).

# %%
RECORDED_H100 = {   # TFLOP/s at N = 4096, bf16, B N = 16k, H d = 2048; NVIDIA H100 80GB HBM3, 2026-11-23 (step 3b: the newest run;
    # the other columns: an earlier run the same day; docs/RESULTS.md)
    (64, False): {"step 2": 349.3, "step 3": 463.9, "step 3b": 481.0, "SDPA flash": 303.3, "SDPA cudnn": 489.7},
    (64, True): {"step 2": 311.1, "step 3": 386.2, "step 3b": 422.9, "SDPA flash": 281.4, "SDPA cudnn": 433.5},
    (128, False): {"step 2": 386.8, "step 3": 587.4, "step 3b": 604.4, "SDPA flash": 356.6, "SDPA cudnn": 670.5},
    (128, True): {"step 2": 335.3, "step 3": 511.3, "step 3b": 565.4, "SDPA flash": 306.8, "SDPA cudnn": 572.5},
}
try:
    measured = {key: {"step 2": step2[key].tflops, "step 3": step3[key].tflops,
                      "step 3b": step3b[(4096, *key)].tflops,
                      **{b.name: b.tflops for b in step3[key].baselines}} for key in step3}
    source = torch.cuda.get_device_name()
except NameError:                                    # no GPU: the recorded figures
    measured, source = RECORDED_H100, "NVIDIA H100 80GB HBM3 (recorded 2026-11-23)"
names = ["step 2", "step 3", "step 3b", "SDPA flash", "SDPA cudnn", "SDPA efficient"]
print(f"TFLOP/s on {source}, N = 4096")
print(f"{'d':>4s} {'causal':7s}" + "".join(f"{n:>15s}" for n in names)
      + "  step 2/flash step 3/flash 3b/flash 3b/cudnn")
for (d, causal), row in measured.items():
    print(f"{d:4d} {causal!s:7s}" + "".join(f"{row.get(n, float('nan')):15.1f}" for n in names)
          + f"  {row['step 2'] / row['SDPA flash']:11.2f}x {row['step 3'] / row['SDPA flash']:11.2f}x"
          f" {row['step 3b'] / row['SDPA flash']:7.2f}x {row['step 3b'] / row['SDPA cudnn']:7.2f}x")

fig = Figure(figsize=(9, 3.8), layout="constrained")
ax = fig.subplots()
xs = np.arange(len(measured))
for i, n in enumerate(["step 2", "step 3", "step 3b", "SDPA flash", "SDPA cudnn"]):
    ax.bar(xs + 0.16 * i - 0.32, [row[n] for row in measured.values()], 0.16, label=n)
ax.set_xticks(xs, [f"d={d}{', causal' if c else ''}" for d, c in measured])
ax.set_ylabel("TFLOP/s")
ax.set_title(f"Fused attention, N = 4096, bf16 ({source})", fontsize=10)
ax.legend(ncols=5, fontsize=8)
fig

# %% [markdown]
# **Where each step stands.**
# - **Step 1** (CUDA cores) is bound by FFMA and by the 2-wavefront 16-byte broadcasts that feed it: a few percent of
#   the tensor-core kernels, slower than the naive code.
# - **Step 2** (`mma.sync`) reaches and passes SDPA's flash backend (FlashAttention-2) at every shape of the table:
#   1.08-1.15x on the H100. Nsight Compute on its first version showed the tensor pipe under half busy with 8 warps
#   per SM and every other issue slot idle; the SASS count (now 670 instructions per tile for 128 `HMMA`, of which
#   about 400 are the softmax itself: max, FFMA, `MUFU.EX2`, FADD, packing) is what remains: with two warps per
#   scheduler, the softmax of one warp and the products of the other cannot overlap more than that.
# - **Step 3** (`wgmma` + TMA) runs at 1.37-1.67x flash at `N = 4096`, FlashAttention-3's class, but only 1.21x at
#   `N = 1024` (1.05x with the causal mask): every CTA pays its set-up, pipeline fill and epilogue alone.
# - **Step 3b** (persistent, work items from a counter, the next item's loads under the current one's epilogue, 3 K/V
#   stages at `d = 64`) is the tutorial's final kernel: on the H100, 1.35-1.94x flash at every shape of
#   `benchmarks/attention.py` (N = 1k to 16k, d = 64 and 128, causal or not; the lowest, 1.35x, at `d = 128`,
#   `N = 1024` with the mask, and 1.38x at `d = 64`, `N = 1024`). Against SDPA's cuDNN backend it is 0.84-1.03x: ahead
#   at `d = 64` from `N = 8192`, 0.89-0.99x at `d = 128`, furthest behind at `N = 1024` (0.84-0.91x).
#   FlashAttention-3 also overlaps the softmax of one tile with the products of the next *inside* each warpgroup and
#   schedules its warpgroups in ping-pong with named barriers. The second is the variant above (1.04-1.05x step 3b
#   at `d = 128` on an H200 once a stage's K and V are freed apart; 0.92-0.96x before). We tried the first too (a
#   variant of step 3b: `S` of tile j+1 issued before the softmax of tile j, `wgmma.wait_group 1`): same results bit
#   for bit, but 0.69-0.85x
#   the speed of step 3b on the H100 (benchmarks/NOTES-attention.md), so it is not a step here. Ours waits for each
#   `wgmma` group before its softmax, and the tensor pipe idles during every softmax that the other warpgroups do not
#   happen to cover: the profile below is where to look (tensor-pipe activity, and the warp stall reasons).

# %%
# %%gpu --skip-note "Recorded on an H100: tensor pipe active 61.5 % (step 2) and 63.1 % (step 3) at d = 128, N = 4096."
B_, H_, N_ = 4, 16, 4096
q, k, v = (torch.randn(B_, H_, N_, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
prof2 = fa2_bf16_d128.profile((N_ // 128, B_ * H_), 128, q, k, v, o, None, N_, 128 ** -0.5,
                              shared_bytes=(128 + 4 * 64) * 128 * 2)
maps = [kernellab.tensor_map(x.view(B_ * H_, N_, 128), (1, rows, 64)) for x, rows in ((q, 128), (k, 128), (v, 128))]
prof3 = fa3_bf16_d128.profile((N_ // 128, B_ * H_), 384, *maps, o, N_, 128 ** -0.5,
                              shared_bytes=1024 + (128 + 4 * 128) * 128 * 2 + 256)
for name, p in (("step 2", prof2), ("step 3", prof3)):
    print(name, "tensor pipe % active:", p.tensor_pipe_pct)
prof3

# %% [markdown]
# **Reading the profile** (H100, `d = 128`, `N = 4096`). Nsight Compute's tensor-pipe metric counts `mma.sync` and
# `wgmma` alike on this GPU. Step 2 keeps the pipe 61.5 % busy (the first version of step 2: 37-41 %), so the three
# changes of step 2 were all about feeding it. Step 3 keeps it 63 % busy, hardly more, yet delivers 1.5x the FLOPs:
# a busy `wgmma` cycle does more work than a busy `mma.sync` cycle. The remaining 37 % is the softmax that no other
# warpgroup covers, which is what FlashAttention-3's intra-warpgroup pipelining and ping-pong scheduling remove.

# %% [markdown]
# ## One entry point: the kernel and its tiles per shape
#
# The steps above were timed on the FlashAttention-3 paper's shapes, where `N` is 1k to 16k. Models also call
# attention with short sequences and many heads, and there the ranking changes. Measured on an H100 (issue 32's
# figures): at `N = 256-512` with `B H` in the hundreds, step 3b runs at 0.36-0.45x SDPA FLASH launched as a
# notebook launches (waiting for each kernel) and 0.78x (`N = 512`) launched asynchronously, below step 2's 1.16x.
#
# **Why, with numbers (the hypotheses the grid below tests).**
# 1. *Host time.* A call of the op costs the host 30-33 µs with step 3b (three tensor maps, from kernellab's cache)
#    and about 22 µs with a pointer-only kernel like step 2 (docs/RESULTS.md, launch overhead); a tensor map encoded
#    afresh costs 45 µs more each (issue 30). The GPU's work at `N = 512`, `B H = 256`, `d = 64` is 17.2 GFLOP, about
#    35 µs at step 3b's 500 TFLOP/s; at `N = 256`, 9 µs. A launch that waits for its kernel (issue 30 measured 480 µs
#    a call) makes every short call host-bound: 0.36-0.45x is what a host path several times the kernel gives.
#    Asynchronously, a call can go no faster than its host: below about 30 µs of GPU work the cheapest host path wins.
# 2. *Fixed cost per work item.* Fitting `rate x T / (T + f)` to step 3b's measured TFLOP/s at `N = 1024` and 16384
#    (T = 8 and 128 key tiles an item, padded rows removed) gives `f = 1.4` tile times (about 2.2 µs at `d = 64`) that
#    an item pays outside its products: the Q load and pipeline fill, the epilogue. At `N = 4096` that is 4 % of an
#    item, at `N = 512` (4 tiles of 128 keys) 26 %, at `N = 256` 41 %. Step 2 runs two CTAs an SM, so one CTA's fill
#    and epilogue run under the other's products; step 3b has one CTA an SM, and its consumers idle through their own
#    epilogue.
# 3. *Few waves.* With `B H = 16` and `N = 512`, 128-row items number 64 for 132 SMs: half the GPU idles, whatever
#    the kernel. Smaller items double the CTAs.
# 4. *Padding.* 192-row items at `N = 256` compute 384 rows for 256 (step 3b's launcher already takes 128 rows there).
#
# **A variant for short sequences** (the `fa3p_*_d64*_bm64` entries at the end of step 3's cell): step 3b's code with
# one consumer warpgroup (64 query rows an item), 64-key tiles and 3 stages: 66 KB of shared memory and 96 registers,
# so **two CTAs share an SM**, and one's fill and epilogue run under the other's products (hypothesis 2), with twice
# the items of the 128-row kernel (hypothesis 3). Prediction: 0.75x step 3b's steady rate (two consumer warpgroups'
# products in flight an SM rather than three, and `m64n64` products half as wide), a fixed cost of one 64-key tile;
# so it should win where items are short and few (causal, `N <= 1024`), and lose at long `N`. At `d = 128` the same
# CTA needs more than the 128 registers two CTAs an SM leave it (it spills), so there is none.
#
# **The selection model** (`kernellab.teach.attention_plan`, unit-tested on the CPU with the H100's 132 SMs). For each
# candidate (step 2; step 3; step 3b at 192 or 128 rows; the variant) it counts the work items (query blocks x
# heads) and each one's key tiles (up to the diagonal with the mask), the slots (SMs x CTAs an SM), the time of a key
# tile at the kernel's fitted steady rate, the fixed cost per item, and schedules the items greedily on the slots
# (the hardware's CTA dispatch, or the work counter): that is the GPU time, with its waves and tail. The prediction is
# the largest of the GPU time, the memory floor (Q, K, V read and O written once) and the host time, and the entry
# point launches the candidate with the least. Its constants are fitted to the H100 tables above; the variant's are a
# prediction, so it must win by 10 % to be chosen; `benchmarks/attention.py --grid` prints every shape's measured times
# beside the model's choice, which is what refits them. They are a GPU model's: on an H200 the entry point (which
# passes the device's name) plans with constants fitted the same way to the H200's grid, and every plan names its table.
#
# **Measured, and what changed** (H100, the grid's 16 shortest shapes, B H 16 and 256, N 128 to 2048; docs/RESULTS.md).
# The entry point beat SDPA FLASH at all 16 (1.02-2.44x), but lost to one of its own steps by more than 3 % at 8:
# hypothesis 1 was wrong as a rule for choosing. Step 2's cheaper host path decided every shape under 30 µs, yet under
# do_bench (calls one at a time) the variant took 8.4 µs at `N = 128` where step 2 took 8.7: the host time hides behind
# the GPU work queued before a call. The model now predicts GPU time and only reports the host's. Hypothesis 2 held
# in kind but not in form: the refit (`fit_golden`, on the grid and the FlashAttention-3 shapes) puts the Hopper
# kernels' fixed cost mostly per call, 4-6 µs whatever the size (launch, CTA start-up, the first loads), and little per
# item (1-2 tiles); step 2 pays about 1-4 µs. Hypotheses 3 and 4 held: the variant is the fastest step for one
# sequence at `N <= 512` (1.18-1.51x FLASH), and the 128-row height wins causal `N = 512-2048`. Two things the model
# lacked: at `B H = 256`, `N = 128` every kernel sits at the memory floor (17-34 MB at about 1.5 TB/s, the L2 a call
# meets being full of dirty lines), where step 2, launched soonest, wins; and step 2 masks its diagonal tiles at a
# tile's cost. With these, the plan picks the fastest step at all 16 shapes. The whole quick grid (32 shapes) showed
# the floor's limit: the dirty lines are paid once, up to the L2's 50 MB, and beyond it bytes move at the copy
# ceiling. At `B H = 256`, `N = 512`, `d = 128` causal (134 MB) a floor at 1.5 TB/s sat above both Hopper kernels'
# GPU time, so step 3's lighter launch won the plan (83.8 µs measured) over step 3b (74.7); with the floor paying the
# L2 once, and the constants refit to all 32 shapes, the plan is within 3 % of the fastest step at each.

# %%
from kernellab.teach.attention_plan import plan_attention

for shape in ((16, 32, 1024, 64, False), (4, 16, 4096, 128, True), (16, 32, 1024, 64, True), (32, 16, 512, 64, True),
              (1, 16, 512, 64, False), (16, 16, 128, 64, False)):
    p = plan_attention(*shape)
    print(f"B, H, N, d = {shape[:4]}, causal={shape[4]!s:5s} -> {p}")
print()
print("every candidate at B = 1, H = 16, N = 512, d = 64, causal:")
for e in plan_attention(1, 16, 512, 64, True).alternatives:
    print("  ", e)

# %% [markdown]
# ## From the notebook into a model: the entry point as a PyTorch op
#
# `attention(q, k, v, out=None, causal=False)` below, with the steps' launchers' arguments, is the tutorial's one entry
# point: on a shape's first call (per dtype, device and mask) it asks the model for a plan and makes a *ready call* for
# it, the chosen kernel from the step 2 and step 3 cells (`fa2_cell`, `fa3_cell`) with its grid, block, shared memory
# and scalars configured; every later call is one dictionary lookup, the inputs' checks and that launch, so the entry
# point costs the host what a call of its step does, plus the lookup and the checks of q, k and v
# (`benchmarks/launch_overhead.py --entry` times both). `kernellab.op` registers it as a PyTorch operator through
# `torch.library`: a schema, the launcher as the CUDA implementation, and a fake implementation made from `outputs=`
# (the output is shaped like `q`), which `torch.compile(fullgraph=True)` and `torch.export` trace instead of running the
# kernel. Launches inside an op do not wait for their kernel, and the tensor maps of a call come from kernellab's cache
# (keyed by address, shape, strides, box and swizzle) once made, so a call costs the host little more than an SDPA call
# (`benchmarks/launch_overhead.py --ops` measures both). The cell is also what tests and benchmarks run
# (`tests/gpu/notebook_cells.py`'s `load_tutorial`), so they time the very function a model calls.

# %%
# launchers: kl::attention (tests/gpu/test_attention_dispatch_gpu.py and benchmarks/attention.py --grid run it too)
import math

import torch

import kernellab
from kernellab.teach.attention_plan import plan_attention

ATTENTION_KERNELS = {k.name: k for cell in (fa2_cell, fa3_cell) for k in cell.kernels}   # steps 2, 3, 3b, variant
_attention_calls = {}               # (shape, dtype, device, causal, kernel, ctas) -> its ready call (_attention_call)
_attention_sms = {}                 # device -> SM count
_attention_gpus = {}                # device -> its name, which picks the plan's constants (the H200's on an H200)
_attention_counters = {}            # device -> the persistent kernels' zeroed int32 work counter


def attention_plan(q, causal=False, kernel=None):
    """The plan (kernel, tiles, grid) the entry point uses for q's shape; kernel: a candidate's name to force it."""
    B, H, N, d = q.shape
    if q.device not in _attention_sms:
        props = torch.cuda.get_device_properties(q.device)
        _attention_sms[q.device], _attention_gpus[q.device] = props.multi_processor_count, props.name
    dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    return plan_attention(B, H, N, d, bool(causal), dtype, _attention_sms[q.device], kernel=kernel,
                          device=_attention_gpus.get(q.device))


def _attention_call(q, causal, kernel, ctas):
    """The ready call for q's shape, dtype, device and mask, made once: call(q, k, v, out) checks k and v against q
    and launches the kernel the plan names (call.plan), its grid, block, shared memory and the scalars after its
    tensors (call.scalars) configured here."""
    B, H, N, d = shape = q.shape
    plan = attention_plan(q, causal, kernel)
    grid = (min(ctas or plan.ctas, plan.ctas),) if plan.persistent else (math.ceil(N / plan.block_m), B * H)
    launch = ATTENTION_KERNELS[plan.entry][grid, plan.threads, plan.shared_bytes]
    empty_like, scale = torch.empty_like, d ** -0.5

    def refuse():
        raise ValueError("attention takes contiguous q, k, v of one shape [B, H, N, d]")

    if plan.family == "fa2":
        def call(q, k, v, out):
            if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and k.shape == shape
                    and v.shape == shape):
                refuse()
            if out is None:
                out = empty_like(q)
            launch(q, k, v, out, None, N, scale)      # None: step 2's log-sum-exp is not stored
            return out
        scalars = (N, scale)
    else:
        if plan.persistent:
            if q.device not in _attention_counters:
                _attention_counters[q.device] = torch.zeros(1, dtype=torch.int32, device=q.device)
            sections = max(1, min(B * H, (16 << 20) // (2 * N * d * q.element_size())))   # K/V within 16 MB of L2
            scalars = (N, B * H, sections, _attention_counters[q.device], scale)
        else:
            scalars = (N, scale)
        tensor_map, heads = kernellab.tensor_map, B * H
        box_q, box_kv = (1, plan.block_m, 64), (1, plan.block_n, 64)    # [B * H, N, d] views, 64-column boxes

        def call(q, k, v, out):
            if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and k.shape == shape
                    and v.shape == shape):
                refuse()
            if out is None:
                out = empty_like(q)
            launch(tensor_map(q.view(heads, N, d), box_q), tensor_map(k.view(heads, N, d), box_kv),
                   tensor_map(v.view(heads, N, d), box_kv), out, *scalars)
            return out
    call.plan, call.scalars = plan, scalars
    return call


def attention(q, k, v, out=None, causal=False, kernel=None, ctas=None):
    """softmax(q k^T / sqrt(d), causal) v for contiguous [B, H, N, d] bf16/fp16 CUDA tensors, d = 64 or 128, by the
    kernel attention_plan picks for the shape. kernel: a candidate's name, e.g. 'fa3p_bm64', to force one; ctas: at
    most this many CTAs for a persistent kernel (each then walks more work items)."""
    call = _attention_calls.get((q.shape, q.dtype, q.device, causal, kernel, ctas))
    if call is None:
        if q.dtype not in (torch.bfloat16, torch.float16) or q.dim() != 4 or q.shape[-1] not in (64, 128):
            raise ValueError(f"attention takes [B, H, N, d] bf16 or fp16 tensors with d = 64 or 128; got "
                             f"{tuple(q.shape)} {q.dtype}")
        call = _attention_calls[q.shape, q.dtype, q.device, causal, kernel, ctas] = _attention_call(
            q, causal, kernel, ctas)
    return call(q, k, v, out)


@kernellab.op("kl::attention", "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor",
              outputs=lambda q, k, v, causal: q)
def kl_attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d), causal) v for contiguous [B, H, N, d] bf16/fp16 CUDA tensors: the entry point."""
    call = _attention_calls.get((q.shape, q.dtype, q.device, causal, None, None))     # attention()'s ready call
    return attention(q, k, v, causal=causal) if call is None else call(q, k, v, None)

# %%
# The fake implementation needs no GPU: meta tensors carry shapes and dtypes, no values.
meta_q = torch.empty(2, 16, 8192, 64, device="meta", dtype=torch.bfloat16)
print(kl_attention, "->", kl_attention(meta_q, meta_q, meta_q, True).shape)

# %% [markdown]
# **Check, then time.** On the GPU: the variant on the awkward shapes (both dtypes, causal or not), the entry point's
# output equal bit for bit to the kernel its plan names, and the short shapes timed: each candidate through the
# entry point's own launch path, the entry point itself, and SDPA's backends, in one run.

# %%
# %%gpu
variant_checks = check_all(lambda q, k, v, o, causal: attention(q, k, v, o, causal, kernel="fa3p_bm64"), dims=(64,))
print("the variant:", summarize_checks(variant_checks))
# 7 CTAs: each walks dozens of items, so every barrier's phase wraps many times
few = check_all(lambda q, k, v, o, causal: attention(q, k, v, o, causal, kernel="fa3p_bm64", ctas=7), dims=(64,),
                ns=(1031, 4097), trials=1)
print("the variant on 7 CTAs:", sum(r["passed"] and r["within_2x"] for r in few), "of", len(few), "cases pass")
for shape in ((2, 3, 1031, 64, True), (4, 64, 512, 64, True), (1, 16, 128, 128, False)):
    q, k, v = (torch.randn(*shape[:4], device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = attention_plan(q, shape[4])
    same = torch.equal(attention(q, k, v, causal=shape[4]), attention(q, k, v, causal=shape[4], kernel=plan.kernel))
    print(f"{shape}: {plan.entry}; the entry point's output equals its kernel's: {same}")

# %%
# %%gpu
short = {}
for B, H, N in ((16, 16, 256), (16, 16, 512), (32, 16, 512), (1, 16, 512)):
    for causal in (False, True):
        q = torch.empty(B, H, N, 64, device="cuda", dtype=torch.bfloat16)
        chosen = attention_plan(q, causal).kernel
        steps = {name: (lambda name: lambda q, k, v, o: attention(q, k, v, o, causal, kernel=name))(name)
                 for name in ("fa2", "fa3", "fa3p", "fa3p_bm128", "fa3p_bm64")}
        r = kernellab.bench(lambda q, k, v, o: attention(q, k, v, o, causal),
                            attention_inputs(B, H, N, 64, torch.bfloat16),
                            baselines={**steps, "SDPA flash": lambda q, k, v, o: sdpa(SDPBackend.FLASH_ATTENTION)(
                                q, k, v, o, causal)}, flops=attention_flops(causal), name="entry point")
        short[B, H, N, causal] = r
        ms = {b.name: b.median_ms for b in r.baselines}
        best = min(steps, key=lambda s: ms[s])
        print(f"B H = {B * H:4d}, N = {N:4d}, causal={causal!s:5s}: entry ({chosen}) {r.median_ms * 1e3:7.1f} µs, "
              f"best step {best} {ms[best] * 1e3:7.1f} µs, SDPA flash {ms['SDPA flash'] * 1e3:7.1f} µs: "
              f"{ms['SDPA flash'] / r.median_ms:.2f}x flash")

# %% [markdown]
# The op goes into a small transformer block (`kernellab.teach.block.TransformerBlock`: LayerNorm, causal
# attention, a residual, LayerNorm, a 4x GELU MLP, a residual) with d_model = 1024, 16 heads of 64, 2 x 8192
# tokens in bf16, one of the FlashAttention-3 paper's shapes (B N = 16k, here H d = 1024). The reference is the
# same block with `F.scaled_dot_product_attention` (FlashAttention-2 on an H100), eager and under `torch.compile`.
#
# **Prediction.** The causal attention is 4 B H N^2 d / 2 = 275 GFLOP, the linear layers 412 GFLOP. At the
# rates measured above (step 3b about 1.35x FLASH at N = 8192, causal; the matmuls near 600 TFLOP/s), attention is
# about 55 % of the reference block's time, so the block should run 1.12-1.18x faster than the eager reference,
# and about the same against the compiled one (`torch.compile` keeps SDPA's kernel and fuses only the pointwise
# work around it, a few percent of the block).

# %%
# %%gpu
import copy

from kernellab.teach.block import TransformerBlock, max_errors

torch.manual_seed(0)
block_cfg = dict(d_model=1024, n_heads=16, norm="layernorm", device="cuda", dtype=torch.bfloat16)
reference = TransformerBlock(**block_cfg).requires_grad_(False)
ours = TransformerBlock(**block_cfg, attention_op=kl_attention).requires_grad_(False)
ours.load_state_dict(reference.state_dict())
x_block = torch.randn(2, 8192, 1024, device="cuda", dtype=torch.bfloat16)

ours_compiled = torch.compile(ours, fullgraph=True)          # one graph, or an error: no graph breaks
reference_compiled = torch.compile(reference, fullgraph=True)
small = x_block[:, :2048]                                      # float64 attention at N = 8192 would take minutes
want = copy.deepcopy(reference).double()(small.double())
err, torch_err = max_errors(ours_compiled(small), reference(small), want)
print(f"max |error| against float64 (N = 2048): ours {err:.3g}, PyTorch's block {torch_err:.3g}")
assert err <= 2 * torch_err + 1e-2, "the block with kl::attention is off"
del want

block_result = kernellab.bench(ours_compiled, (x_block,), name="block with kl::attention, torch.compile",
                               baselines={"PyTorch block": reference, "PyTorch block, torch.compile": reference_compiled})
block_result

# %% [markdown]
# The same three, timed the way most people time a function (`triton.testing.do_bench`: no queue, L2 cleared
# before each call), in the same run. Where the two ratios differ by more than 5 %, the difference is host time
# per call (do_bench does not hide it) or the cold L2.

# %%
# %%gpu
from kernellab.teach.block import do_bench_ratios

# the block with kl::attention against the eager and the compiled PyTorch block: do_bench beside kernellab.bench
print(do_bench_ratios(block_result, x_block, ours_compiled, reference, reference_compiled))
