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
# # 07 · Fused attention: a FlashAttention-style forward kernel
#
# **What you will learn**
# - why textbook attention (`S = Q K^T`, `P = softmax(S)`, `O = P V`) is limited by the bytes of the `N x N` matrices it
#   writes and reads, and how many of them fusing saves;
# - the **online softmax**: a running max, a running sum and a rescaled accumulator turn softmax into one pass over
#   the keys, so `S` and `P` never leave the chip;
# - a fused kernel in plain CUDA C++: one thread per query row, K and V streamed through shared memory in tiles,
#   scores and softmax in fp32 registers, causal masking as a parameter, guards for any `N`;
# - what the card says it costs (registers, occupancy) and why its shared-memory reads are broadcasts, and how a
#   16-byte broadcast still caps this kernel at half the FP32 peak;
# - on a GPU: check it against PyTorch's `scaled_dot_product_attention` on awkward shapes, time it against PyTorch's
#   FlashAttention backend and a naive PyTorch attention, and read the gap off the roofline.
#
# Everything up to the first launch runs without a GPU: the byte counts, the online-softmax demo, compiling, the
# resource card, occupancy and the bank model. The cells from the first launch on need a GPU.

# %%
# %load_ext kernellab
# %matplotlib inline
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
# So this kernel cannot beat about 30 TFLOP/s on an H200, about 9 ms at `N = 4096`. Expect the naive PyTorch
# version, with its 2 ms memory floor, to be several times faster, and PyTorch's own FlashAttention, which needs
# 0.4 ms on the tensor cores, to be more than an order of magnitude ahead. The rest of the notebook measures that.
#
# ## Launch it
#
# From here on the cells need a GPU. The wrapper takes PyTorch tensors `[B, H, N, 64]` in fp16 (`[B, H]` folds into
# the kernel's `B * H` since the tensors are contiguous) and rounds the grid up. The first launch uses `N = 1000`,
# which is a multiple of neither block size, so the guards already matter.


# %%
def flash_attention(q, k, v, causal=False, out=None):
    """softmax(q k^T / sqrt(d)) v by the kernel above; q, k, v: [B, H, N, 64] fp16 CUDA tensors, contiguous."""
    B, H, N, d = q.shape
    assert d == HEAD_DIM and k.shape == q.shape and v.shape == q.shape, f"q, k, v must be [B, H, N, {HEAD_DIM}]"
    out = torch.empty_like(q) if out is None else out                 # [B, H, N, d]
    grid = ((N + BLOCK_M - 1) // BLOCK_M, B * H)                      # x: blocks of query rows, y: (batch, head)
    flash_attention_fwd[grid, BLOCK_M](q, k, v, out, N, d ** -0.5, int(causal))
    return out


q, k, v = (torch.randn(2, 3, 1000, HEAD_DIM).half() for _ in range(3))    # [B, H, N, d]
if GPU:
    q, k, v = q.cuda(), k.cuda(), v.cuda()
o = flash_attention(q, k, v)                       # needs a GPU: without one this says so and stops here
reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
print("max |o - sdpa(fp32)| =", (o.float() - reference).abs().max().item())

# %% [markdown]
# ## Check on awkward shapes
#
# `kernellab.check` draws fresh fp16 inputs each trial, fills `out` with NaN first (so a row nobody writes fails),
# computes PyTorch's `scaled_dot_product_attention` in float64 as the reference, and compares with fp16 tolerances.
# The shapes: a single query and key; one short of a block and one over (63, 65); 1000 and 1031, whose last tiles
# are partial; and a few (batch, head) pairs, so that a mix-up between heads shows. Each with and without the causal
# mask.

# %%
SHAPES = [(1, 1, 1), (1, 2, 63), (2, 1, 65), (1, 2, 1000), (2, 2, 1031)]     # (B, H, N)


def attention_inputs(B, H, N):
    """inputs(generator) for check and bench: q, k, v ~ N(0, 1) in fp16 and an output buffer, on the GPU."""
    def inputs(g):
        q, k, v = (torch.randn(B, H, N, HEAD_DIM, generator=g).half().cuda() for _ in range(3))
        return q, k, v, torch.empty_like(q)
    return inputs


for causal in (False, True):
    for shape in SHAPES:
        report = kernellab.check(
            lambda q, k, v, out, causal=causal: flash_attention(q, k, v, causal, out),
            lambda q, k, v, out, causal=causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            attention_inputs(*shape), trials=2, precision="float16")
        assert report.passed, report
    print(f"causal={causal}: passed on (B, H, N) in {SHAPES}")
report

# %% [markdown]
# ## Benchmark against PyTorch
#
# At `B = 4, H = 16, N = 4096`: our kernel against PyTorch's `scaled_dot_product_attention` held to its
# FlashAttention backend, and against `naive_attention` from the top. `kernellab.bench` flushes L2 before each
# repetition and alternates the three in rounds. FLOPs are `4 B H N^2 d` (half of that with the causal mask), and
# bytes are the fused minimum: Q, K and V read and O written once. The naive baseline is charged the same bytes
# although it moves 65 times more; that is the point of the comparison.

# %%
def attention_flops(q, *_):
    """4 B H N^2 d: Q K^T and P V."""
    B, H, N, d = q.shape
    return 4 * B * H * N * N * d


def attention_bytes(q, *_):
    """Q, K, V read and O written once, fp16."""
    return 4 * q.numel() * q.element_size()


def sdpa_flash(q, k, v, causal=False):
    """PyTorch's scaled_dot_product_attention, held to its FlashAttention backend."""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


result = kernellab.bench(lambda q, k, v, o: flash_attention(q, k, v, out=o), attention_inputs(B, H, N),
                         baselines={"torch SDPA (flash)": lambda q, k, v, o: sdpa_flash(q, k, v),
                                    "torch naive": lambda q, k, v, o: naive_attention(q, k, v)},
                         flops=attention_flops, bytes=attention_bytes, name="flash_attention_fwd")
result

# %%
causal_result = kernellab.bench(
    lambda q, k, v, o: flash_attention(q, k, v, causal=True, out=o), attention_inputs(B, H, N),
    baselines={"torch SDPA (flash), causal": lambda q, k, v, o: sdpa_flash(q, k, v, causal=True)},
    flops=lambda *args: attention_flops(*args) / 2, bytes=attention_bytes, name="flash_attention_fwd causal")
causal_result

# %%
for r in (result, *result.baselines, causal_result, *causal_result.baselines):
    print(f"{r.name:28s} {r.median_ms:7.3f} ms  {r.tflops:6.1f} TFLOP/s")
print(f"ours: {result.tflops * 1e12 / FP32_FLOPS:.0%} of the FP32 peak, "
      f"{result.tflops * 1e12 / (smem_bound * FP32_FLOPS):.0%} of its shared-memory bound; "
      f"SDPA: {result.baselines[0].tflops * 1e12 / FP16_TENSOR_FLOPS:.0%} of the fp16 tensor-core peak")

# %% [markdown]
# On the roofline every point sits at `N / 2 = 2048` FLOP per declared byte (1024 with the causal mask), far right
# of every ridge: by this count all of them are compute-bound, and what separates them is the roof they run under.
# The naive baseline is the exception in disguise: charged the 8.7 GB it really moves, it would sit at 31.5 FLOP per
# byte, where the DRAM roof caps it at about 134 TFLOP/s.

# %%
fig = Figure(figsize=(7, 5), layout="constrained")
kernellab.roofline([result, causal_result], ax=fig.subplots())
fig

# %% [markdown]
# ## How it scales with N
#
# The same three at `N` from 512 to 4096 (`B = 4`, `H = 16`). All do `O(N^2)` work; the naive one also moves
# `O(N^2)` bytes.

# %%
sweep = kernellab.sweep(lambda q, k, v, o: flash_attention(q, k, v, out=o), [512, 1024, 2048, 4096],
                        lambda n, g: attention_inputs(B, H, n)(g),
                        baselines={"torch SDPA (flash)": lambda q, k, v, o: sdpa_flash(q, k, v),
                                   "torch naive": lambda q, k, v, o: naive_attention(q, k, v)},
                        flops=attention_flops, bytes=attention_bytes, x_name="N", name="flash_attention_fwd",
                        progress=False)
sweep

# %%
fig = Figure(figsize=(6.4, 4), layout="constrained")
kernellab.sweep_plot(sweep, "tflops", ax=fig.subplots())
fig

# %% [markdown]
# ## Discussion
#
# **Where this kernel sits.** It does the right thing with memory: like PyTorch's FlashAttention it reads Q, K and V
# and writes O once, and `S` and `P` never leave the SM. It does the arithmetic on the wrong units. Every multiply
# is an fp32 FFMA on the CUDA cores, whose measured peak on the H200 is 60 TFLOP/s against 671 for fp16 on the tensor
# cores, and the 2-wavefront broadcasts halve even that. The roofline shows the consequence: our points sit under
# the FP32 roof, PyTorch's under the tensor-core roof, ten times higher, and no tuning of `BLOCK_M` or `BLOCK_N`
# changes which roof a kernel is under. The naive PyTorch attention runs its matmuls on tensor cores but pays for
# 8.7 GB of `S` and `P` traffic, so its floor is the 2 ms that memory needs; our kernel saves those bytes and pays
# in CUDA-core arithmetic instead, 4.6 ms at the very least. Both costs grow as `N^2`, so the order in the sweep
# should not change with `N`. Fusion alone is not enough; fusion *and* tensor cores are what PyTorch's kernel has.
#
# **The next step: tensor cores.** `Q K^T` for a block of queries and a tile of keys is a small matrix product, and
# so is `P V`. With `wmma` or `mma.sync` (warp-level MMA, since Volta and Ampere), one instruction has a warp multiply
# fp16 tiles (16 x 16 x 16 for `wmma`, 16 x 8 x 16 for `mma.sync`) with fp32 accumulation. The scores come back in
# registers, where the online softmax runs as it does here, and `P` is rounded to fp16 in registers and fed straight
# into the second product. That lifts the compute roof from 60 to several hundred TFLOP/s; and since an operand
# fragment loaded once from shared memory (`ldmatrix`) feeds a whole tile of products, the broadcast loads that bound
# this kernel stop mattering too. Rows per thread give way to fragments: each thread holds pieces of a few rows, and
# the row max and row sum take a few warp shuffles.
#
# **What FlashAttention 2 and 3 add.** FlashAttention 2 arranges exactly that: tensor-core tiles, one block per block
# of queries (as here), the queries split across the warps of a block so that warps never exchange partial sums, and
# the division by `l` left to the end (as here). FlashAttention 3 is built for Hopper: `wgmma` lets four warps
# (a warpgroup) issue one larger, asynchronous MMA reading its operands from shared memory; TMA copies whole K and V
# tiles from global to shared memory in the background, tracked by barriers instead of `__syncthreads()`; warp
# specialization dedicates some warps to issuing those copies and the rest to math, so loading the next tile overlaps
# computing this one; and two warpgroups alternate, so one's softmax (exponentials on the special-function unit) runs
# while the other's matmuls keep the tensor cores busy. FP8 inputs double the peak again.
#
# **Things to try.** Make `BLOCK_N` 32 (the card shows more registers and a longer compile; does the time move?);
# ask for `__launch_bounds__(BLOCK_M, 6)` and read the spills on the card; drop the `key >= N` test and watch the
# check fail at `N = 63`; delete the second `__syncthreads()` and run the first launch under
# `%launch --sanitize=racecheck`.
