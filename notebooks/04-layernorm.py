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
# # 04 · LayerNorm and RMSNorm: statistics that survive a large mean
#
# **What you will learn**
# - the bytes LayerNorm must move, and why its floor is the same as a copy's;
# - why the textbook variance `E[x^2] - E[x]^2` loses every digit when the mean is large against the spread,
#   shown on the CPU first, then on the GPU;
# - Welford's running update and Chan's formula for merging two partial results, the tool that lets threads,
#   warps and blocks each take part of a row;
# - a one-pass LayerNorm with the row in registers, 16-byte loads, fp32 statistics for fp32 and bf16 data, the
#   affine weight and bias fused; RMSNorm as its simpler sibling;
# - tutorial 03's launch plans (a warp, a block or a cluster per row), re-sized from an H100 measurement: 64 bytes
#   of the row per thread in rows up to 8 KB, 128 bytes in longer ones; checked on awkward shapes and timed against
#   PyTorch eager and `torch.compile`;
# - the backward (dx, dw, db), the norms as PyTorch ops a model calls, and the residual add fused into the norm
#   (`kl::add_layernorm`: the bytes it saves a transformer's stream, its kernels' cards, checked and timed against
#   the separate add and norm and `torch.compile`);
# - write two kernels yourself (exercises 04-rmsnorm-block and 04-layernorm-block), each checked by `kernellab.grade`.
#
# As in tutorial 03, cells that need a GPU start with `%%gpu` and are skipped in one line without one; the
# numerics, the kernels' cards and the launch plans run anywhere, and without a GPU the kernels run on kernellab's
# CPU path at small sizes (the `%%cpu` cell, and the exercises' grading).

# %%
# %load_ext kernellab
# %matplotlib inline
import math

import numpy as np
import torch
import torch.nn.functional as F
from IPython.display import HTML, display

import kernellab
from kernellab.report import html_table

GPU = kernellab.has_gpu()
print("GPU:", torch.cuda.get_device_name() if GPU else "none (compile, analysis and CPU numerics only)")
COPY_GBPS = 3000.0     # an H100's measured device-to-device copy, read + write bytes; replaced below on a GPU
EPS = 1e-5

# %%
# %%gpu
from kernellab.run.measure.ceilings import device_ceilings

COPY_GBPS = device_ceilings().dram_gbps
print(f"copy bandwidth of this GPU, as kernellab measures it: {COPY_GBPS / 1e3:.2f} TB/s")

# %% [markdown]
# ## Bytes and FLOPs
#
# `y = (x - mean) / sqrt(var + eps) * w + b` over each row of a `rows x cols` matrix (mean and biased variance
# per row, `w` and `b` per column). It must read `x` and write `y` once, and read `w` and `b` once per kernel
# (every row uses them, so after the first rows they come from L1 or L2): `(2 * rows * cols + 2 * cols) * itemsize`
# bytes, and about 8 FLOPs per element. RMSNorm, `y = x / sqrt(mean(x^2) + eps) * w`, drops the mean and `b`.
# At 4096 x 4096 in float32 that is 134 MB, 45 µs at 3 TB/s, for 134 MFLOP: the same floor as a copy of `x`.

# %%
rows_ex, cols_ex = 4096, 4096
ln_bytes = (2 * rows_ex * cols_ex + 2 * cols_ex) * 4
print(f"{ln_bytes / 1e6:.0f} MB, {8 * rows_ex * cols_ex / ln_bytes:.1f} FLOP/byte; floor at "
      f"{COPY_GBPS / 1e3:.2f} TB/s: {ln_bytes / (COPY_GBPS * 1e9) * 1e6:.0f} µs")

# %% [markdown]
# ## The variance, three ways, on the CPU
#
# One pass of sums gives `mean = S1 / n` and `var = S2 / n - mean^2` with `S1 = sum x`, `S2 = sum x^2`. In
# exact arithmetic that is the variance. In float32, with a mean of 10,000 and a standard deviation of 1, `S2 / n`
# and `mean^2` are both about 10^8, where float32's spacing is 8: their difference, the variance of about 1, is
# below the rounding of either. The same sum in a different order gives a different wrong answer, often a
# negative one.
#
# **Welford's update** keeps `(n, mean, M2)`, `M2` the sum of squared deviations from the running mean, and
# updates it per element with no large sums: `delta = x - mean; mean += delta / n; M2 += delta * (x - mean)`.
# **Chan's formula** merges two such triples `(n_a, mean_a, M2_a)` and `(n_b, mean_b, M2_b)`:
# `n = n_a + n_b`, `mean = mean_a + d * n_b / n`, `M2 = M2_a + M2_b + d^2 * n_a * n_b / n` with
# `d = mean_b - mean_a`. Below, all three in NumPy float32, the sums in the order a 256-thread kernel adds them
# (each thread its 16 strided elements, then the threads), against float64:


# %%
def sumsq_variance(x, threads=256):
    """mean, var from float32 sums of x and x^2, per thread (strided) then over threads, as layernorm_sumsq."""
    x = x.astype(np.float32)
    s = np.zeros(threads, np.float32)
    ss = np.zeros(threads, np.float32)
    for i in range(0, x.size, threads):          # thread t adds x[t], x[t + 256], ... in order
        chunk = x[i:i + threads]
        s[:chunk.size] += chunk
        ss[:chunk.size] += chunk * chunk
    mean = np.float32(s.sum(dtype=np.float32) / x.size)
    return mean, np.float32(ss.sum(dtype=np.float32) / x.size) - mean * mean


def welford_variance(x, threads=256):
    """mean, var from per-thread float32 Welford triples merged with Chan's formula, as layernorm_welford."""
    x = x.astype(np.float32)
    n = np.zeros(threads, np.float32)
    mean = np.zeros(threads, np.float32)
    m2 = np.zeros(threads, np.float32)
    for i in range(0, x.size, threads):
        v = x[i:i + threads]
        k = v.size
        n[:k] += 1
        delta = v - mean[:k]
        mean[:k] += delta / n[:k]
        m2[:k] += delta * (v - mean[:k])
    tri = list(zip(n, mean, m2))
    while len(tri) > 1:                           # a tree of Chan merges, as a warp shuffle and smem would
        merged = []
        for (na, ma, qa), (nb, mb, qb) in zip(tri[::2], tri[1::2]):
            nn = na + nb
            d = mb - ma
            merged.append((nn, ma + d * nb / nn, qa + qb + d * d * na * nb / nn))
        tri = merged
    total, mu, q = tri[0]
    return mu, q / total


rng = np.random.default_rng(0)
rows = []
for mean_value in (0.0, 1e2, 1e3, 1e4):
    row = rng.standard_normal(4096) + mean_value
    truth = row.var()
    (_, v_sumsq), (_, v_welford) = sumsq_variance(row), welford_variance(row)
    rows.append([f"{mean_value:g}", f"{truth:.6f}", f"{v_sumsq:.6f}", f"{abs(v_sumsq - truth) / truth:.1e}",
                 f"{v_welford:.6f}", f"{abs(v_welford - truth) / truth:.1e}"])
HTML(html_table(["row mean", "variance (float64)", "sum of squares (float32)", "its relative error",
                 "Welford + Chan (float32)", "its relative error"], rows,
                caption="the variance of 4096 values with standard deviation 1 and a growing mean"))

# %% [markdown]
# At a mean of 10^4 the sum of squares is wrong by more than the variance itself; Welford's stays at the
# precision of the data. (Real activations have large means more often than one would like: a residual stream
# with an outlier channel, or a layer fed unnormalised inputs.)
#
# ## Two block-per-row kernels
#
# `layernorm_sumsq` and `layernorm_welford` give each row a block of 256 threads and read it with plain loads,
# twice: once for the statistics, once for the output. They differ only in the statistics.

# %%
# %%cuda --name layernorm_simple
// LayerNorm with one block per row and plain loads, two ways to get the variance.
// y = (x - mean) / sqrt(var + eps) * w + b along each row of a rows x cols matrix; statistics in fp32.
#include <kl/convert.cuh>   // to_float, from_float<T>
#include <kl/reduce.cuh>    // warp_sum, block_sum (in every thread; safe to call back to back)

// 1 · one pass of sums: mean = E[x], var = E[x^2] - E[x]^2. Two large, nearly equal numbers are subtracted:
// when |mean| is large against the spread, fp32 loses every digit of the variance.
template <typename T>
__global__ void layernorm_sumsq(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                T* __restrict__ y, int cols, float eps) {
    const T* row = x + (size_t)blockIdx.x * cols;
    T* out = y + (size_t)blockIdx.x * cols;
    float s = 0.0f, ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = to_float(row[i]);
        s += v;
        ss += v * v;
    }
    s = block_sum(s);
    ss = block_sum(ss);
    float mean = s / cols;
    float var = fmaxf(ss / cols - mean * mean, 0.0f);           // may come out negative: clamp
    float rstd = rsqrtf(var + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[i] = from_float<T>((to_float(row[i]) - mean) * rstd * to_float(w[i]) + to_float(b[i]));
}

// 2 · Welford: each thread keeps (count, mean, M2 = sum of squared deviations from its running mean), updated
// per element with no large sums; threads' triples merge with Chan's formula.
struct Welford { float n, mean, m2; };
__device__ __forceinline__ Welford merge(Welford a, Welford b) {
    float n = a.n + b.n;
    if (n == 0.0f) return a;
    float d = b.mean - a.mean, wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}
__device__ __forceinline__ Welford warp_merge(Welford v) {
    for (int o = 16; o > 0; o /= 2)
        v = merge(v, {__shfl_xor_sync(0xffffffffu, v.n, o), __shfl_xor_sync(0xffffffffu, v.mean, o),
                      __shfl_xor_sync(0xffffffffu, v.m2, o)});
    return v;
}
__device__ __forceinline__ Welford block_merge(Welford v) {
    __shared__ Welford part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_merge(lane < blockDim.x / 32 ? part[lane] : Welford{0.0f, 0.0f, 0.0f});
}

template <typename T>
__global__ void layernorm_welford(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                  T* __restrict__ y, int cols, float eps) {
    const T* row = x + (size_t)blockIdx.x * cols;
    T* out = y + (size_t)blockIdx.x * cols;
    Welford st = {0.0f, 0.0f, 0.0f};
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = to_float(row[i]);
        st.n += 1.0f;
        float d = v - st.mean;
        st.mean += d / st.n;
        st.m2 += d * (v - st.mean);
    }
    st = block_merge(st);
    float rstd = rsqrtf(st.m2 / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[i] = from_float<T>((to_float(row[i]) - st.mean) * rstd * to_float(w[i]) + to_float(b[i]));
}

template __global__ void layernorm_sumsq<float>(const float*, const float*, const float*, float*, int, float);
template __global__ void layernorm_sumsq<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, __nv_bfloat16*, int, float);
template __global__ void layernorm_welford<float>(const float*, const float*, const float*, float*, int, float);
template __global__ void layernorm_welford<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                          const __nv_bfloat16*, __nv_bfloat16*, int, float);

# %% [markdown]
# ### Exercise 04-rmsnorm-block · RMSNorm, one block per row
#
# Write `rmsnorm_block`: `y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w`. Block `r` (256 threads; the grader launches
# `rows` blocks) takes row `r`: each thread adds the squares of `x[r][t]`, `x[r][t + 256]`, ...; the block's sum
# goes through warp shuffles, a `__shared__ float[8]` and a `__syncthreads()`, so that every thread has it; then
# each thread writes its elements of `y[r]`. One of the grader's rows is all zeros: `eps` keeps its answer 0.

# %%
# %%cuda
// exercise: 04-rmsnorm-block
extern "C" __global__ void rmsnorm_block(const float* x, const float* w, float* y, int rows, int cols, float eps) {
    // TODO: the row's sum of squares across the block, then y = x * rsqrt(mean + eps) * w
}

# %%
kernellab.grade("04-rmsnorm-block", rmsnorm_block)

# %% [markdown]
# ### Exercise 04-layernorm-block · LayerNorm that survives a large mean
#
# Write `layernorm_block`: `y[r] = (x[r] - mean) / sqrt(var + eps) * w + b`, biased variance, float32, block `r`
# (256 threads, `rows` blocks) on row `r`. Half the grader's rows have a mean of 10,000 and a spread of 1: the
# sum of squares fails there (the table above says by how much). Either keep Welford triples per thread and merge
# them with Chan's formula, or make two passes over the row: the mean first (a block-wide sum), then the sum of
# `(x - mean)^2` (another). Reusing one shared array for both sums needs a barrier between them. Tolerance:
# 5e-3 absolute, what float32 resolves near 10,000.

# %%
# %%cuda
// exercise: 04-layernorm-block
extern "C" __global__ void layernorm_block(const float* x, const float* w, const float* b, float* y, int rows,
                                           int cols, float eps) {
    // TODO: the row's mean and variance without cancellation, then y = (x - mean) * rstd * w + b
}

# %%
kernellab.grade("04-layernorm-block", layernorm_block)

# %% [markdown]
# ## One pass, the row in registers
#
# The final kernels reuse tutorial 03's machinery (kernellab's headers `<kl/rows.cuh>` and `<kl/cluster.cuh>`, which
# both tutorials include): the row cut into 16-byte packs counted from its first 16-byte
# boundary, the few edge elements outside whole packs held one per thread, one warp, one block or a cluster of
# blocks per row, and one reduction round across the warp (shuffles), the row's warps (shared memory) and the
# cluster (distributed shared memory). What changes is the statistic:
# - **LayerNorm** holds its values in registers, so it can afford the exact two-pass variance: the row's sum
#   and count first (a block-wide sum of plain floats), so its mean; then the squared deviations from that mean,
#   summed the same way. A second pass over registers costs no memory traffic, and no large numbers are added
#   up: no cancellation, whatever the mean. Across a cluster's blocks, each block's `(n, mean, M2)` triple merges
#   with Chan's formula, once.
# - **RMSNorm** needs only the sum of squares (no mean is subtracted, so nothing cancels) and merges sums.
#
# The first version merged every thread's `(n, mean, M2)` triple with Chan's formula across the warp and the
# block, as `layernorm_welford` does. It was correct, and it was the bottleneck of bf16 LayerNorm at 4096 x 4096:
# a merge costs three shuffles, a division and a branch per round where a sum costs one shuffle and one add, and
# with 32 values a thread those rounds are a large part of the work. Nsight Compute counted 35 instructions issued
# per element (RMSNorm: 14), the schedulers issuing in 72 % of cycles, the kernel at 76 % of the copy bandwidth.
# With two plain sums: 27 instructions an element and 84 % (29.7 to 26.7 µs, 1.22x `torch.compile`; in the same
# run against the cell with Chan's merges back no shape got slower by more than 1 %, and float32 1000 x 1031
# and the 3 x 100003 rows got 5-9 % faster). A per-pack branch instead
# of a select per value for the packs past the row's end keeps `d * d + M2` one FFMA (the run at the end of the
# notebook measures it).
#
# The per-thread costs came next. With 32 values a thread, whatever a thread does once is shared by only 32
# elements, and Nsight Compute's per-instruction counts put half of those 27 instructions there: four integer
# divisions by run-time values (the row and the thread from `row_threads`, the count of packs inside the row, the
# row's first warp: about 22 instructions each) and, in every loop that guards the row's end, a branch region per
# pack. The plan's thread counts are powers of two, so shifts and masks replace the divisions and compares count
# the packs; and a thread whose packs all lie inside the row, 16-byte aligned (every thread of the large aligned
# shapes), takes one guard-free path for the squared deviations and the store (`inside_store`). Predicted: +1-3 %
# and +2-4 % at bf16 4096 x 4096. Measured (H100, against the cells before each
# change, one run each): the divisions 29.4 -> 28.5 µs (+3 %; RMSNorm and softmax +2-5 %), the guard-free path
# 29.8 -> 29.3 µs there and +3-5 % at 1024 x 262144 (LayerNorm 419 -> 407 µs, RMSNorm 398 -> 378), the small
# shapes within their noise; Nsight Compute: 25.1 -> 20.5 instructions an element at 4096 x 4096, 25.7 -> 20.7
# at 1024 x 262144.
#
# Last, the bf16 threads of the long rows (8 packs a thread, in a cluster) read `w` and `b` after the reduction one
# pack at a time: a chain of 8 L2 round trips, which the ring above removes for float rows but which bf16 has no
# registers for. A `prefetch.global.L1` of those 16 packs right after x's loads costs no registers. Predicted +2-5 %
# at bf16 1024 x 262144 (the risk: 4 blocks x 64 KB of `w` and `b` is about all of L1); measured (try_norms, one
# run) LayerNorm 406.5 -> 394.3 µs (88 -> 91 % of copy), RMSNorm 376.6 -> 369.9, while float rows (ring) and the
# one-block bf16 rows of 32,768 got 1-3 % slower: so only the bf16 cluster kernels prefetch (`prefetch_fits`).
#
# Across a cluster the blocks exchange their statistics as tutorial 03's softmax does: each block pushes its
# statistic into the others' shared memory with `st.async`, counted on their mbarriers, rather than meeting at
# `barrier.cluster` (whose `MEMBAR.ALL.GPU` held 10-20 % of the stall samples at 1024 x 262144). Measured on an
# H100 in one run: LayerNorm 1024 x 262144 from 74 % of the copy bandwidth to 87 % (float32) and 82 % (bf16),
# RMSNorm from 91 % to 96-97 %.
#
# `w` and `b` are read per pack with 16-byte loads where the row's packs are 16-byte aligned in `w` too (rows
# whose start is on a boundary: `cols` a multiple of the pack); misaligned rows read them element by element.
# They come from L1 or L2 (every row reads the same `cols` values), so a load of `w` is an L2 round trip of about
# half a microsecond under load. Read after the reduction, that round trip would follow x's DRAM one and the
# reduction's barriers, with nothing else in flight for the thread; read next to `x`, it hides under x's. Two
# details make room for that in the 64 registers a 1024-thread block allows:
# - a pack stays as its four 32-bit words until each value is used: 8 bf16 values take 4 registers (an array of
#   8 `__nv_bfloat16` takes 8, one per value), widened to fp32 (a shift) where they are added or scaled;
# - `w`'s packs are loaded early when they fit beside x's (up to 4 packs a thread), `b`'s too for LayerNorm with up
#   to 2 packs; the rest are loaded after the reduction, all at once (one round trip, not one per pack).
#
# The first GPU run of the previous version, which read `w` and `b` after the reduction with bf16 values one to a
# register, left bf16 LayerNorm at 48-68 % of the copy bandwidth and 0.69-0.95x `torch.compile`, against 89-97 %
# for float32 at the same widths (benchmarks/NOTES-memory-bound.md has the table).

# %%
# %%cuda --name norm_kernels
// LayerNorm and RMSNorm with the row held in registers: one read of x and one write of y per element; w and b
// (read by every row) come from L1/L2. The row layout, packs and cluster exchange are tutorial 03's (kl/*.cuh).
#include <kl/cluster.cuh>   // exchange_open, _push, _wait: a cluster's blocks exchange their statistics
#include <kl/ptx.cuh>       // cluster_ctarank, cluster_wait, prefetch_l1
#include <kl/rows.cuh>      // the row in 16-byte packs (Pack, RowLayout, load_packs); to_float, from_float

// ---- the statistics: Welford triples (LayerNorm) or sums of squares (RMSNorm), merged like tutorial 03's pairs ----
struct Welford { float n, mean, m2; };                   // count, mean, sum of squared deviations from the mean
__device__ __forceinline__ Welford merge(Welford a, Welford b) {     // Chan et al.: no large sums, no cancellation
    float n = a.n + b.n;
    if (n == 0.0f) return a;
    float d = b.mean - a.mean, wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}
__device__ __forceinline__ float merge(float a, float b) { return a + b; }
__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ Welford shfl_xor(Welford v, int o) {
    return {shfl_xor(v.n, o), shfl_xor(v.mean, o), shfl_xor(v.m2, o)};
}

template <typename S>
__device__ __forceinline__ S warp_merge(S v) {              // every lane ends with the same value
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = merge(v, shfl_xor(v, o));
    return v;
}

// Merge the statistics of the row's threads in this block: the warp (shuffles), then the row's warps (shared
// memory; SLOT tells apart two reductions in a row, which then need no barrier between them). `zero` is the empty
// statistic. Every thread gets the result.
template <int SLOT, typename S>
__device__ __forceinline__ S block_merge(S v, S zero, int row_warps) {
    __shared__ S warp_part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (row_warps > 1) {
        if (lane == 0) warp_part[warp] = v;
        __syncthreads();
        int first = warp & -row_warps;                   // the row's first warp (row_warps: a power of two)
        v = warp_merge(lane < row_warps ? warp_part[first + lane] : zero);
    }
    return v;
}

// ...then the cluster's blocks (CLUSTER > 1), each block's statistic pushed into the others' shared memory.
template <int CLUSTER, typename S>
__device__ __forceinline__ S cluster_merge(S v, S zero) {
    if constexpr (CLUSTER > 1) {                         // every thread holds its block's v
        int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        Exchange<S, CLUSTER>& ex = exchange<S, CLUSTER>();
        unsigned me = cluster_ctarank();
        cluster_wait();                                   // every block's mbarrier is ready (exchange_open)
        if (warp == 0 && lane < CLUSTER && lane != (int)me) exchange_push(&ex.part[me], v, &ex.bar, lane);
        if (warp == 0) exchange_wait(&ex.bar, 0);         // the other blocks' statistics are here: one warp polls
        __syncthreads();                                  // the mbarrier, the others wait here without spinning
        v = warp_merge(lane < CLUSTER ? (lane == (int)me ? v : ex.part[lane]) : zero);
    }
    return v;
}

template <int CLUSTER, typename S>
__device__ __forceinline__ S row_merge(S v, S zero, int row_warps) {
    return cluster_merge<CLUSTER>(block_merge<0>(v, zero, row_warps), zero);
}

// ---- the normalisations of this thread's values ---------------------------------------------------------------
// The values stay in their 16-byte packs (bf16: 16 registers for 32 values, not 32) and are widened to fp32 where
// they are used: the registers saved are what lets w (and b) load before the reduction.
template <typename T, int VPT>
__device__ __forceinline__ float at(const Pack<T> (&pk)[VPT], int i) {
    return pk[i / (16 / sizeof(T))].get(i % (16 / sizeof(T)));
}

// w and b are read before the reduction, next to x, when the row starts on a 16-byte boundary (so its packs are
// 16-byte aligned in w and b too) and their packs fit beside x's without a spill under the 64 registers a
// 1024-thread block allows: w with up to 4 packs of x (32 registers of x and w), b too with up to 2 (LayerNorm: 3
// vectors in 24). Their L2 round trip then overlaps x's DRAM one instead of following the reduction. The others
// (8 packs a thread, LayerNorm's b beside 4, misaligned rows) are read after the reduction (load_late).
template <int VPT, int VECTORS>
struct Early { static constexpr bool value = VECTORS * VPT * 16 <= (VECTORS == 2 ? 128 : 96); };

// This thread's packs of w (or b), 16-byte loads: rows that start on a 16-byte boundary only.
template <typename T, int VPT>
__device__ __forceinline__ void load_vector(Pack<T> (&pk)[VPT], const T* __restrict__ w, RowLayout L, int first,
                                            int stride) {
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(w);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole) pk[j] = packs[q];
    }
}

// One pack of w (or b) at the store: a 16-byte load where the row's packs are 16-byte aligned in w (lead == 0),
// element loads otherwise.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* __restrict__ w, RowLayout L, int e) {
    if (L.lead == 0) return *reinterpret_cast<const Pack<T>*>(w + e);
    float f[16 / sizeof(T)];
#pragma unroll
    for (int k = 0; k < 16 / (int)sizeof(T); ++k) f[k] = to_float(w[e + k]);
    return from_floats<T>(f);
}

// LayerNorm's statistics, exact and cheap: the sum and count of the row's values in this block first, so their
// mean; then the squared deviations from that mean (a second pass over registers: no memory traffic, no large
// sums, no cancellation), summed the same way. Plain float sums cost one shuffle a round where Chan's merge of
// (n, mean, M2) triples costs three and a division: at 4096 x 4096 bf16, merging triples across threads made
// the kernel issue 35 instructions an element (Nsight Compute), against RMSNorm's 14. A cluster's blocks still
// merge their triples with Chan's formula, once. `valid` counts this thread's packs inside the row.
struct SumCount { float s, n; };
// An empty asm that "changes" the packs' words: the compiler widens them again where they are next used instead of
// keeping 32-64 widened values (or the differences x - mean) live across a merge, where they would spill.
template <typename T, int VPT>
__device__ __forceinline__ void keep_packed(const Pack<T> (&pk)[VPT]) {
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) asm volatile("" : "+r"(const_cast<Pack<T>&>(pk[j]).u[k]));
}
__device__ __forceinline__ SumCount merge(SumCount a, SumCount b) { return {a.s + b.s, a.n + b.n}; }
__device__ __forceinline__ SumCount shfl_xor(SumCount v, int o) { return {shfl_xor(v.s, o), shfl_xor(v.n, o)}; }

template <int CLUSTER, typename T, int VPT>
__device__ __forceinline__ Welford layernorm_stats(const Pack<T> (&pk)[VPT], int valid, bool edge_ok, float edge,
                                                   int row_warps) {
    constexpr int VEC = 16 / sizeof(T);
    float s = edge_ok ? edge : 0.0f;                      // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) s += at(pk, i);
    SumCount sn = block_merge<0>(SumCount{s, valid * VEC + (edge_ok ? 1.0f : 0.0f)}, SumCount{0.0f, 0.0f}, row_warps);
    float mean = sn.n > 0.0f ? sn.s / sn.n : 0.0f;
    keep_packed(pk);
    float m2 = edge_ok ? (edge - mean) * (edge - mean) : 0.0f;
    if (valid == VPT) {                                   // every pack inside the row (most threads): no guards
#pragma unroll
        for (int i = 0; i < VPT * VEC; ++i) {
            float d = at(pk, i) - mean;
            m2 = fmaf(d, d, m2);
        }
    } else {
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            if (j >= valid) continue;                     // a branch per pack, not a select per value: d * d + m2
#pragma unroll                                            // stays one FFMA
            for (int k = 0; k < VEC; ++k) {
                float d = at(pk, j * VEC + k) - mean;
                m2 = fmaf(d, d, m2);
            }
        }
    }
    keep_packed(pk);
    m2 = block_merge<1>(m2, 0.0f, row_warps);
    return cluster_merge<CLUSTER>(Welford{sn.n, mean, m2}, Welford{0.0f, 0.0f, 0.0f});
}

// The packs of w (or b) not read early: up to 4 packs all in flight together before the first is used (one L2
// round trip, not one per pack); 8 packs one at a time in the store loop, where registers allow.
template <typename T, int VPT>
__device__ __forceinline__ void load_late(Pack<T> (&wk)[VPT], bool early, const T* __restrict__ w, RowLayout L,
                                          int first, int stride, int only = -1) {
    if (early || (VPT > 4) != (only >= 0)) return;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole && (only < 0 || j == only)) wk[j] = load_pack(w, L, L.lead + q * (16 / (int)sizeof(T)));
    }
}

// y = (x - mean) * rstd * w + b for this thread's packs, then the store. early_w, early_b: w, b are already in
// wk, bk; otherwise they are loaded here first.
// A thread whose packs all lie inside the row, 16-byte aligned (lead == 0): every thread of the large aligned
// shapes. Its stores and late loads need no guards and no element-load fallback; with them, each pack was a branch
// region of its own (Nsight Compute: about 2 of bf16 LayerNorm's 25 instructions an element).
template <typename T, int VPT>
__device__ __forceinline__ bool all_inside(RowLayout L, int first, int stride) {
    return L.lead == 0 && first + (VPT - 1) * stride < L.whole;
}

// Such a thread with 8 bf16 packs in a cluster (rows over 256 KB) asks for its w and b into L1 right after x's loads
// (`prefetch.global.L1`: no registers), so that the store loop, which reads them one pack at a time after the
// reduction, finds them there instead of making 8 L2 round trips in a row. Measured in one run (H100, try_norms
// new+pf): bf16 1024 x 262144 LayerNorm 406.5 -> 394.3 µs, RMSNorm 376.6 -> 369.9; float rows (the ring already
// keeps their w and b in flight) and the one-block bf16 rows of 32,768 got 1-3 % slower, so they do without.
template <typename T, int VPT>
__device__ __forceinline__ void prefetch_w_b(const T* w, const T* b, int first, int stride) {
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w) + first;
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b) + first;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        prefetch_l1(wp + j * stride);
        if (b != nullptr) prefetch_l1(bp + j * stride);
    }
}
template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ bool prefetch_fits(RowLayout L, int first, int stride) {
    return sizeof(T) == 2 && CLUSTER > 1 && VPT > 4 && all_inside<T, VPT>(L, first, stride);
}

// y = (x - mean) * rstd * w + b for the packs of such a thread; w (b) already in wk (bk) if EARLY_W (EARLY_B).
template <bool LN, bool EARLY_W, bool EARLY_B, typename T, int VPT>
__device__ __forceinline__ void inside_store(const Pack<T> (&pk)[VPT], Pack<T> (&wk)[VPT], Pack<T> (&bk)[VPT],
                                             float mean, float rstd, const T* __restrict__ w,
                                             const T* __restrict__ b, T* __restrict__ row, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w) + first;      // this thread's pack 0; pack j: + j stride
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b) + first;
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(row) + first;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {                       // up to 4 packs: all in flight before the first is used
        if (!EARLY_W && VPT <= 4) wk[j] = wp[j * stride];
        if (LN && !EARLY_B && VPT <= 4) bk[j] = bp[j * stride];
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        if (!EARLY_W && VPT > 4) wk[j] = wp[j * stride];  // 8 packs: one at a time, as registers allow
        if (LN && !EARLY_B && VPT > 4) bk[j] = bp[j * stride];
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out[k] = LN ? fmaf((at(pk, j * VEC + k) - mean) * rstd, wk[j].get(k), bk[j].get(k))
                        : at(pk, j * VEC + k) * rstd * wk[j].get(k);
        yp[j * stride] = from_floats<T>(out);
    }
}

template <typename T, int VPT>
__device__ __forceinline__ void affine_store(const Pack<T> (&pk)[VPT], Pack<T> (&wk)[VPT], Pack<T> (&bk)[VPT],
                                             bool early_w, bool early_b, float mean, float rstd,
                                             const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ row,
                                             RowLayout L, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    if (all_inside<T, VPT>(L, first, stride))             // lead == 0: early_w, early_b are the Early rules
        return inside_store<true, Early<VPT, 2>::value, Early<VPT, 3>::value>(pk, wk, bk, mean, rstd, w, b, row,
                                                                              first, stride);
    load_late(wk, early_w, w, L, first, stride);
    load_late(bk, early_b, b, L, first, stride);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        load_late(wk, early_w, w, L, first, stride, j);
        load_late(bk, early_b, b, L, first, stride, j);
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = fmaf((at(pk, j * VEC + k) - mean) * rstd, wk[j].get(k), bk[j].get(k));
        *reinterpret_cast<Pack<T>*>(row + L.lead + q * VEC) = from_floats<T>(out);
    }
}

template <typename T, int VPT>
__device__ __forceinline__ void rms_store(const Pack<T> (&pk)[VPT], Pack<T> (&wk)[VPT], bool early, float rstd,
                                          const T* __restrict__ w, T* __restrict__ row, RowLayout L, int first,
                                          int stride) {
    constexpr int VEC = 16 / sizeof(T);
    if (VPT > 4 && all_inside<T, VPT>(L, first, stride))   // 8 packs: w late, one pack at a time, unguarded
        return inside_store<false, false, true>(pk, wk, wk, 0.0f, rstd, w, w, row, first, stride);
    load_late(wk, early, w, L, first, stride);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        load_late(wk, early, w, L, first, stride, j);
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = at(pk, j * VEC + k) * rstd * wk[j].get(k);
        *reinterpret_cast<Pack<T>*>(row + L.lead + q * VEC) = from_floats<T>(out);
    }
}

// With 8 packs a thread (rows over 8 KB, and 4 KB rows held by a warp), w and b come after the reduction, and
// one pack at a time they would make the stores a chain of 8 L2 round trips with nothing else in flight. A ring
// of DEPTH slots keeps DEPTH packs of w (and b) in flight: all DEPTH are loaded before the first store, and pack
// j + DEPTH is loaded as soon as pack j is stored, so the chain is about 8 / DEPTH round trips. It needs the row's
// packs 16-byte aligned in w and b (lead == 0) and all of this thread's VPT packs inside the row (every thread of
// the large shapes): no guards or element loads to keep registers for. x's 32 registers plus DEPTH packs of w
// and of b: DEPTH = 2 for LayerNorm (48), 4 for RMSNorm (48), under the 64 of a 1024-thread block. Float rows
// only: bf16 LayerNorm spills with it (widening 64 values of x, w and b takes more temporaries); the bf16 rows of
// 32,768 already reach 95-97 % of copy without it.
template <typename T, int VPT>
__device__ __forceinline__ bool ring_fits(RowLayout L, int first, int stride) {
    return sizeof(T) == 4 && VPT > 4 && all_inside<T, VPT>(L, first, stride);
}

template <bool LN, int DEPTH, typename T, int VPT>
__device__ __forceinline__ void ring_store(const Pack<T> (&pk)[VPT], float mean, float rstd, const T* __restrict__ w,
                                           const T* __restrict__ b, T* __restrict__ row, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w) + first;      // this thread's pack 0; pack j: + j stride
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b) + first;
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(row) + first;                // lead == 0: packs start at the row
    Pack<T> wr[DEPTH], br[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {                    // the first DEPTH packs of w and b, all in flight
        wr[j] = wp[j * stride];
        if (LN) br[j] = bp[j * stride];
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out[k] = LN ? fmaf((at(pk, j * VEC + k) - mean) * rstd, wr[j % DEPTH].get(k), br[j % DEPTH].get(k))
                        : at(pk, j * VEC + k) * rstd * wr[j % DEPTH].get(k);
        yp[j * stride] = from_floats<T>(out);
        if (j + DEPTH < VPT) {                            // slot j % DEPTH is free again: pack j + DEPTH
            wr[j % DEPTH] = wp[(j + DEPTH) * stride];
            if (LN) br[j % DEPTH] = bp[(j + DEPTH) * stride];
        }
    }
}

// One row of LayerNorm by the threads that hold it: x, y point at the row, which starts `head` elements past a
// 16-byte boundary; first, stride: this thread's packs; edge_t: its edge slot.
template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void layernorm_row(const T* __restrict__ x, const T* __restrict__ w,
                                              const T* __restrict__ b, T* __restrict__ y, int cols, bool live,
                                              int head, int first, int stride, int edge_t, int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    bool early_w = Early<VPT, 2>::value && L.lead == 0, early_b = Early<VPT, 3>::value && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT], bk[VPT];
    load_packs<Pad::zero>(pk, x, L, first, stride);
    if (prefetch_fits<T, VPT, CLUSTER>(L, first, stride)) prefetch_w_b<T, VPT>(w, b, first, stride);
    if (early_w) load_vector(wk, w, L, first, stride);  // in flight with x's loads
    if (early_b) load_vector(bk, b, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    int valid = 0;                                       // packs j with first + j*stride < whole (compares: no
#pragma unroll                                            // division by the run-time stride)
    for (int j = 0; j < VPT; ++j) valid += first + j * stride < L.whole;
    Welford st = layernorm_stats<CLUSTER>(pk, valid, e >= 0, edge, row_warps);
    float rstd = rsqrtf(st.m2 / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(fmaf((edge - st.mean) * rstd, to_float(w[e]), to_float(b[e])));
    if (ring_fits<T, VPT>(L, first, stride)) ring_store<true, 2>(pk, st.mean, rstd, w, b, y, first, stride);
    else affine_store(pk, wk, bk, early_w, early_b, st.mean, rstd, w, b, y, L, first, stride);
}

template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void rmsnorm_row(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                            int cols, bool live, int head, int first, int stride, int edge_t,
                                            int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    bool early = Early<VPT, 2>::value && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT];
    load_packs<Pad::zero>(pk, x, L, first, stride);
    if (prefetch_fits<T, VPT, CLUSTER>(L, first, stride)) prefetch_w_b<T, VPT>(w, (const T*)nullptr, first, stride);
    if (early) load_vector(wk, w, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    float ss = edge * edge;                              // packs past the row hold 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) ss += at(pk, i) * at(pk, i);
    ss = row_merge<CLUSTER>(ss, 0.0f, row_warps);
    float rstd = rsqrtf(ss / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(edge * rstd * to_float(w[e]));
    if (ring_fits<T, VPT>(L, first, stride)) ring_store<false, 4>(pk, 0.0f, rstd, w, w, y, first, stride);
    else rms_store(pk, wk, early, rstd, w, y, L, first, stride);
}

// ---- the kernels: rows that fit in a block (row_threads threads per row, blockDim.x / row_threads rows per
// block; grid = ceil(rows / rows per block)), and rows split over a cluster of CLUSTER blocks of VPT packs per
// thread (grid = rows * CLUSTER) -------------------------------------------------------------------------------
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) layernorm_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                       const T* __restrict__ b, T* __restrict__ y, int rows,
                                                       int cols, int row_threads, float eps) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> (__ffs(row_threads) - 1);   // row_threads: a power of two
    int t = threadIdx.x & (row_threads - 1);
    bool live = row < rows;                              // a last block's spare rows still meet at the barrier
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row<T, VPT, 1>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))), t, row_threads,
                             t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
layernorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                   blockDim.x, first, blockDim.x / 32, eps);
}

template <typename T, int VPT>
__global__ void __launch_bounds__(1024) rmsnorm_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                     T* __restrict__ y, int rows, int cols, int row_threads,
                                                     float eps) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> (__ffs(row_threads) - 1);   // row_threads: a power of two
    int t = threadIdx.x & (row_threads - 1);
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    rmsnorm_row<T, VPT, 1>(x + start, w, y + start, cols, live, (int)(start % (16 / sizeof(T))), t, row_threads, t,
                           row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                     float eps) {
    exchange_open<float, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    rmsnorm_row<T, VPT, CLUSTER>(x + start, w, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                 blockDim.x, first, blockDim.x / 32, eps);
}

// Instantiated: what plan_rows launches. In a block: 1, 2 or 4 packs per thread (rows up to 8 KB: 64 bytes a
// thread) and 8 (longer rows: 128 bytes, 32 float or 64 bf16 values); in clusters of 2, 4, 8 blocks (few rows
// over 256 KB) and 16 (many): 8, and 4 for few bf16 rows up to 512 KB.
#define NORM_ROWS(T, VPT)                                                                                    \
    template __global__ void layernorm_rows<T, VPT>(const T*, const T*, const T*, T*, int, int, int, float); \
    template __global__ void rmsnorm_rows<T, VPT>(const T*, const T*, T*, int, int, int, float);
#define NORM_CLUSTER(T, C, VPT)                                                                                   \
    template __global__ void layernorm_rows_cluster<T, C, VPT>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void rmsnorm_rows_cluster<T, C, VPT>(const T*, const T*, T*, int, int, float);
#define NORMS(T)                                                                                              \
    NORM_ROWS(T, 1) NORM_ROWS(T, 2) NORM_ROWS(T, 4) NORM_ROWS(T, 8)                                           \
    NORM_CLUSTER(T, 2, 8) NORM_CLUSTER(T, 4, 8) NORM_CLUSTER(T, 8, 8) NORM_CLUSTER(T, 16, 8)
NORMS(float)
NORMS(__nv_bfloat16)
NORM_CLUSTER(__nv_bfloat16, 2, 4) NORM_CLUSTER(__nv_bfloat16, 4, 4) NORM_CLUSTER(__nv_bfloat16, 8, 4)   // few rows

# %% [markdown]
# ## The launchers, and a plan of their own
#
# The plan started as tutorial 03's `plan_rows`: a warp, a block or a cluster of blocks per row, each thread holding
# 32 values (8 float packs, 4 bf16 packs). With it, bf16 trailed float32 at the same widths, 48-68 % of the copy
# bandwidth against 89-97 %: a bf16 thread moves 64 bytes of its row for the same fixed costs per row (the DRAM
# round trip, the reduction, the barriers) as a float thread's 128. So the question was how much of a row a thread
# should hold, and how many threads share a row.
#
# **Prediction** (written before the run, in benchmarks/NOTES-memory-bound.md): 64 bf16 values a thread (8 packs)
# helps most where it takes a row out of a cluster or halves the cluster's blocks: 4096 x 32768 as one 512-thread
# block per row at 85-92 % of copy [63 % as clusters of 2 x 512 x 4 packs], 1024 x 262144 as clusters of 8 blocks
# of 512 (two blocks an SM, where 8 x 1024 left one) at 70-85 % [48 %]; splits with more threads and fewer packs,
# so that `w` and `b` load with `x`, for the short rows; x read past L1 (`ld.global.nc.L1::no_allocate`, so that L1
# keeps `w` and `b`) +0-5 % on the wide rows.
#
# **Measurement** (a sweep of the plans on an H100, 2026-11-23; every plan tried, and the persistent and no-L1
# variants, are in benchmarks/NOTES-memory-bound.md). This cell's kernels; a plan is `threads per row x packs per
# thread / threads per block`, or `cC x threads x packs` for a cluster of C blocks per row:
#
# | case | tutorial 03's plan | µs | fastest plan | µs | of copy | vs `torch.compile` |
# |---|---|---|---|---|---|---|
# | LayerNorm bf16 4096 x 32768 | c2 x 512 x 4 | 277.5 | 512 x 8 / 512 | 188.4 | 95 % | 1.03x |
# | RMSNorm bf16 4096 x 32768 | c2 x 512 x 4 | 200.6 | 512 x 8 / 512 | 185.5 | 96 % | 1.01x |
# | LayerNorm bf16 1024 x 262144 | c8 x 1024 x 4 | 778.8 | c8 x 512 x 8 | 480.7 | 74 % | 1.25x |
# | LayerNorm bf16 4096 x 4096 | 128 x 4 / 128 | 29.9 | the same (64 x 8 / 128: 30.9) | 29.9 | 75 % | 1.10x |
# | LayerNorm bf16 4096 x 1024 | 32 x 4 / 128 | 11.0 | the same (64 x 2 / 128: 14.8) | 11.0 | 51 % | 0.99x |
# | RMSNorm fp32 1000 x 1031 | 64 x 8 / 128 | 8.8 | 128 x 4 / 128 | 8.0 | 34 % | 1.08x |
# | RMSNorm fp32 4096 x 1024 | 32 x 8 / 128 | 17.6 | 64 x 4 / 128 | 16.5 | 68 % | 0.96x |
# | LayerNorm fp32 4096 x 1024 | 32 x 8 / 128 | 18.1 | the same (64 x 4 / 128: 18.4) | 18.1 | 62 % | 0.94x |
# | LayerNorm fp32 4096 x 32768 | c2 x 512 x 8 | 409.0 | the same (c4 x 256 x 8: 411.3) | 409.0 | 87 % | 0.91x |
# | RMSNorm fp32 4096 x 32768 | c2 x 512 x 8 | 370.4 | the same (c4 x 512 x 4: 403.7) | 370.4 | 97 % | 0.97x |
#
# The first prediction held and then some (95 %, not 85-92 %); the second landed inside its range (74 %).
#
# **The rule** `plan_rows` below follows (with the two float and few-rows amendments of the next section), by row
# bytes: each thread holds **64 bytes** of its row (4 packs) in rows
# up to **8 KB**, and **128 bytes** (8 packs: 32 float or 64 bf16 values) in longer rows; a row takes the power of two
# of threads that covers it so: a warp up to 2 KB (with fewer packs where fewer suffice), a block of 64-512 threads
# up to 64 KB, beyond that clusters of 2-8 blocks of 512 threads (up to 512 KB), and blocks of 1024 only for rows up
# to 1 MB; longer rows fall back to two reads (LayerNorm) or are refused (RMSNorm). As in tutorial 03, few rows
# (rows x cluster under half the SMs) are spread over more, smaller blocks. Why two sizes:
# - in short rows there are many rows to an SM, and more threads a row with fewer packs each put more warps' loads
#   in flight and keep `w` next to `x` (it loads early up to 4 packs): 128 x 4 beat 64 x 8 at bf16 4096 (8 KB rows)
#   and at fp32 1031 (4 KB, misaligned);
# - in long rows the fixed costs per row dominate (the reduction's rounds, the block's barrier, a cluster's two
#   barriers and distributed shared memory), and 128 bytes a thread halves the threads a row needs: a 64 KB row
#   fits one 512-thread block, no cluster; a 512 KB row runs as 8 blocks of 512, two to an SM.
#
# The rule gave every measured winner but one: float LayerNorm at 4096 x 1024 (4 KB rows) got 64 x 4 / 128,
# 18.4 µs against a warp with 8 packs' 18.1, while RMSNorm at the same shape gained (16.5 against 17.6). Tutorial
# 03's softmax has since taken the 128 bytes a thread in rows over 8 KB; in shorter rows it keeps 32 values a
# thread. A CPU test checks that each plan covers every row and that every kernel a plan names is instantiated in
# its cell. The GPU tests and `benchmarks/memory_bound.py` run this same cell.
#
# **The last fp32 misses, and the ring.** After that, fp32 LayerNorm at 4096 x 32768 still sat at 87 % of copy and
# 0.91x `torch.compile`, where RMSNorm at the same plan reached 97 %. The SASS says why: with 8 packs a thread, w
# and b are loaded after the reduction, one pack at a time, each load waited for before its store: 8 L2 round trips
# in a row (0.6-0.8 µs each under load), during which the thread writes 16 bytes per trip and reads nothing. A
# block's 128 KB slice of w and b does not stay in L1 with x streaming through (RMSNorm's 64 KB of w mostly does,
# which is its 10 points). The fix keeps a **ring** of DEPTH packs of w and b in flight: DEPTH loads before the
# first store, and the load of pack j + DEPTH as soon as pack j is stored (`ring_store` in the cell; DEPTH 2 for
# LayerNorm, 4 for RMSNorm: 16 registers of w and b beside x's 32). Predicted beforehand: 91-95 % of copy at
# 4096 x 32768; measured as a candidate (H100, the same run as `torch.compile`):
#
# | case | plan | without the ring µs | with it µs | vs `torch.compile` |
# |---|---|---|---|---|
# | LayerNorm fp32 4096 x 32768 | c2 x 512 x 8 | 409.2 (87 %) | 400.2 (89 %) | 0.93x |
# | RMSNorm fp32 4096 x 32768 | c2 x 512 x 8 | 370.2 (97 %) | 364.1 (98 %) | 0.99x |
# | LayerNorm fp32 4096 x 1024 | 64 x 4 / 128, then 32 x 8 / 128 | 18.5 (61 %) | 15.5 (72 %) | 1.11x |
# | RMSNorm fp32 4096 x 1024 | 64 x 4 / 128, then 32 x 8 / 128 | 16.2 (69 %) | 15.7 (71 %) | 0.99x |
#
# So float rows up to 4 KB now go to a warp with 8 packs a lane (the ring needs 8), and the ring runs wherever a
# float thread's 8 packs are whole and aligned. With the ring in the cell, a second try_norms run (H100, 2026-11-24,
# every row in the same run as `torch.compile`) settled the plan's last two questions:
#
# | case | plan before | µs | better plan | µs | of copy | vs `torch.compile` |
# |---|---|---|---|---|---|---|
# | LayerNorm fp32 4096 x 32768 | c2 x 512 x 8 (ring) | 402.4 | 1024 x 8 / 1024 | 366.2 | 98 % | 1.01x |
# | LayerNorm bf16 3 x 100003 | c8 x 256 x 8 | 15.3 | c8 x 512 x 4 | 13.0 | 4 % | 1.01x |
# | RMSNorm bf16 3 x 100003 | c8 x 256 x 8 | 10.8 | c8 x 512 x 4 | 8.6 | 5 % | 1.49x |
# | LayerNorm fp32 3 x 100003 | c8 x 512 x 8 (ring) | 13.8 | the same (c8 x 1024 x 4: 14.9) | 13.8 | 8 % | 1.05x |
#
# - a float row of 128 KB is best held by **one block of 1024 threads**: no cluster barriers and no distributed
#   shared memory, and with the ring its w/b stores no longer need a second block on the SM to overlap them;
# - **few bf16 rows** go back to 4 packs a thread: with 3 rows there is no other block to overlap the late w/b
#   chain of an 8-pack bf16 thread (bf16 has no ring), while with 4 packs w loads next to x.
#
# A third question came after the exchange above: with it, 1 MB float rows in clusters of 8 blocks of 1024
# threads (one block an SM: nothing overlaps a block's reduction and its w/b stores) reached 88 % of copy, and
# 512 KB bf16 rows in 8 blocks of 512 (two an SM) 84 %. sm_90 allows clusters of up to 16 blocks where the kernel
# opts in (kernellab reads `__cluster_dims__` from the cubin and sets the attribute): 16 blocks of half the
# threads put two to four blocks on an SM. Measured with try_norms (H100, 2026-11-27, same run as `torch.compile`):
#
# | case | plan before | µs | 16 blocks | µs | of copy | vs `torch.compile` |
# |---|---|---|---|---|---|---|
# | LayerNorm fp32 1024 x 262144 | c8 x 1024 x 8 | 814.2 | c16 x 512 x 8 | 789.0 | 91 % | 1.42x |
# | LayerNorm bf16 1024 x 262144 | c8 x 512 x 8 | 424.7 | c16 x 256 x 8 | 404.8 | 88 % | 1.48x |
# | RMSNorm fp32 1024 x 262144 | c8 x 1024 x 8 | 734.2 | c16 x 512 x 8 | 737.1 | 97 % | 1.51x |
#
# (c16 x 1024 x 4 was far slower, 1181.9 µs: one block an SM again, and only 7 clusters of 16 fit the GPU at
# once.) Later runs on other machines kept the float32 gain (776.7-789.0 µs against 814) but not the bf16 one: 16
# blocks 419.8-425.7 µs, 8 blocks 418.6-424.7, a tie inside the 5 % that separates one H100 from another on these
# shapes. So many rows over 256 KB take 16 blocks (a gain in float32, no loss in bf16); few rows keep clusters of
# up to 8, which spread them further.
#
# All of these are in `plan_rows` below; the table at the end of the notebook measures them again.

# %%
# launchers: layernorm, rmsnorm (tests/gpu/test_memory_bound_gpu.py and benchmarks/memory_bound.py run this cell too)
import functools
import math

import torch

from kernellab.teach.rows import RowPlan   # the plan's shape, shared with tutorial 03

SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
CTYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}


@functools.cache          # a model calls the op with the same shapes every step: each shape's plan is made once
def plan_rows(rows, cols, itemsize, sms=SMS):
    """The launch of a row kernel: 64 bytes of the row per thread in rows up to 8 KB, 128 bytes in longer rows;
    None when a row is longer than a cluster's registers hold (8 blocks x 1024 threads x 128 bytes, 1 MB)."""
    vec = 16 // itemsize                     # elements per 16-byte pack
    packs = cols // vec                      # the most whole packs a row can have
    ring = itemsize == 4                     # float threads with 8 whole packs stream w and b through the ring
    few = rows < sms // 2                    # too few rows to fill the GPU: they get spread over more SMs
    # packs per thread: 4 up to 8 KB rows, 8 beyond; 4 for few bf16 rows that 8 x 1024 threads can hold so
    per_thread = 4 if packs <= 512 or (few and not ring and packs <= 8 * 1024 * 4) else 8
    for vpt in (1, 2, 4, 8) if ring else (1, 2, 4):   # one warp per row while 32 lanes hold it: rows up to 2 KB,
        if 32 * vpt >= packs:                         # float rows up to 4 KB (8 packs: the ring)
            return RowPlan(32, vpt, 1, 128, -(-rows // 4))
    threads = 1 << max(6, math.ceil(math.log2(-(-packs // per_thread))))   # a power of two, 64 or more
    cluster = 1
    if threads > (1024 if ring else 512):    # float rows up to 128 KB: one block of 1024; else, past 512 threads
        while threads > 512 and cluster < 8:  # (64 KB rows) a row goes to a cluster of blocks of 512
            threads //= 2
            cluster *= 2
    if threads > 1024:
        return None                          # longer than 8 blocks x 1024 threads x 8 packs
    if cluster == 8 and packs * 16 > 256 * 1024 and not few:
        threads //= 2                        # many rows over 256 KB: 16 blocks (sm_90's non-portable cluster size)
        cluster = 16                         # of half the threads, so that an SM holds 2-4 of them, not 1-2
    while rows * cluster < sms // 2 and cluster < 8 and threads >= 256:
        threads //= 2                        # few rows: spread each over more SMs
        cluster *= 2
    if cluster > 1:
        return RowPlan(threads, per_thread, cluster, threads, rows * cluster)
    block = max(threads, 128)
    return RowPlan(threads, per_thread, 1, block, -(-rows // (block // threads)))


def _check_layout(*tensors):
    """Contiguous and 16-byte aligned; None stands for an output the launcher made with empty_like of a checked
    tensor (laid out as that one: not read again, as each check costs host time on every call)."""
    for t in tensors:
        assert t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0), \
            "the row kernels need contiguous, 16-byte aligned tensors (torch's allocations are)"


def norm_kernel_for(kind, rows, cols, dtype):
    """The kernel ("layernorm" or "rmsnorm") and plan for a rows x cols input; None, None where rows are too long."""
    plan = plan_rows(rows, cols, dtype.itemsize)
    if plan is None:
        return None, None
    name = (f"{kind}_rows<{CTYPE[dtype]}, {plan.vpt}>" if plan.cluster == 1
            else f"{kind}_rows_cluster<{CTYPE[dtype]}, {plan.cluster}, {plan.vpt}>")
    return norm_kernels[name], plan


_LAUNCHES = {}            # (kind, rows, cols, dtype) -> (norm_kernels, kernel[grid, block] or None, plan)


def norm_launch_for(kind, rows, cols, dtype):
    """norm_kernel_for's kernel, configured as kernel[plan.grid, plan.block], and plan: looked up once per shape
    (again after the kernels' cell is run again), so that a model's call makes no kernel name and no lookup."""
    kernel, plan = norm_kernel_for(kind, rows, cols, dtype)
    hit = _LAUNCHES[kind, rows, cols, dtype] = (norm_kernels, None if kernel is None else kernel[plan.grid, plan.block],
                                                plan)
    return hit


def layernorm(x, w, b, y=None, eps=1e-5):
    """F.layer_norm(x, (cols,), w, b, eps) for 2-D float32/bf16 CUDA x; fp32 statistics, one read of x."""
    given = y
    y = torch.empty_like(x) if y is None else y
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return y
    _check_layout(x, w, b, given)
    hit = _LAUNCHES.get(("layernorm", rows, cols, x.dtype))
    if hit is None or hit[0] is not norm_kernels:
        hit = norm_launch_for("layernorm", rows, cols, x.dtype)
    _, launch, plan = hit
    if launch is None:                       # rows too long for registers: two reads
        return layernorm_welford(x, w, b, y, eps)
    if plan.cluster == 1:
        launch(x, w, b, y, rows, cols, plan.row_threads, eps)
    else:
        launch(x, w, b, y, rows, cols, eps)
    return y


def rmsnorm(x, w, y=None, eps=1e-5):
    """F.rms_norm(x, (cols,), w, eps) for 2-D float32/bf16 CUDA x; fp32 statistics, one read of x."""
    given = y
    y = torch.empty_like(x) if y is None else y
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return y
    _check_layout(x, w, given)
    hit = _LAUNCHES.get(("rmsnorm", rows, cols, x.dtype))
    if hit is None or hit[0] is not norm_kernels:
        hit = norm_launch_for("rmsnorm", rows, cols, x.dtype)
    _, launch, plan = hit
    if launch is None:
        raise ValueError(f"rmsnorm: rows of {cols} elements are longer than the registers of a cluster hold")
    if plan.cluster == 1:
        launch(x, w, y, rows, cols, plan.row_threads, eps)
    else:
        launch(x, w, y, rows, cols, eps)
    return y


def layernorm_sumsq(x, w, b, y=None, eps=1e-5):
    """LayerNorm with E[x^2] - E[x]^2: a block of 256 threads per row, two passes. Wrong for large means."""
    y = torch.empty_like(x) if y is None else y
    if x.numel():
        layernorm_simple[f"layernorm_sumsq<{CTYPE[x.dtype]}>"][x.shape[0], 256](x, w, b, y, x.shape[1], eps)
    return y


def layernorm_welford(x, w, b, y=None, eps=1e-5):
    """LayerNorm with Welford statistics: a block of 256 threads per row, two passes."""
    y = torch.empty_like(x) if y is None else y
    if x.numel():
        layernorm_simple[f"layernorm_welford<{CTYPE[x.dtype]}>"][x.shape[0], 256](x, w, b, y, x.shape[1], eps)
    return y


LAYERNORMS = {"layernorm_sumsq": layernorm_sumsq, "layernorm_welford": layernorm_welford, "layernorm": layernorm}

# %% [markdown]
# The plans for the shapes timed below, with each kernel's registers and occupancy. LayerNorm's kernels carry
# the `(n, mean, M2)` triple and the affine step's `w` and `b` packs, and still fit the 64 registers a
# 1024-thread block allows, without spilling; with 8 bf16 packs a thread, 64 values sit in 32 registers:

# %%
SHAPES = [(4096, 1024), (4096, 4096), (4096, 32768), (1024, 262144), (1000, 1031), (3, 100003)]
rows = []
for kind in ("layernorm", "rmsnorm"):
    for dtype in (torch.float32, torch.bfloat16):
        for r, c in SHAPES:
            kernel, plan = norm_kernel_for(kind, r, c, dtype)
            occ = kernel.occupancy(plan.block)
            rows.append([kind, f"{r} x {c}", str(dtype).replace("torch.", ""), plan.kind, kernel.signature.display,
                         plan.block, plan.grid, kernel.resources.registers, kernel.resources.local_bytes,
                         f"{occ.ratio:.0%}"])
HTML(html_table(["op", "shape", "dtype", "plan", "kernel", "block", "grid", "registers", "local bytes",
                 "occupancy"], rows, caption="launch plans"))

# %% [markdown]
# ## Check on awkward shapes, and on a large mean
#
# Against `F.layer_norm` and `F.rms_norm` in float64, on fresh random data each trial, with random `w` and `b`.
# First the shapes (every plan: a warp, a block, clusters of 2 and 8, misaligned rows, the fallback), at a mean
# of 0, for the kernels that should pass everywhere:

# %%
# %%gpu
def ln_inputs(rows, cols, dtype, mean=0.0):
    """x ~ N(mean, 2), w ~ N(1, 0.5), b ~ N(0, 1) and an output buffer, on the GPU."""
    def make(g):
        x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
        b = torch.randn(cols, generator=g).to(dtype)
        return x.cuda(), w.cuda(), b.cuda(), torch.empty(rows, cols, dtype=dtype, device="cuda")
    return make


CHECK_SHAPES = [(1, 1), (3, 7), (6, 1031), (1000, 1031), (5, 4099), (9, 6001), (7, 20000), (40, 20000),
                (3, 100003), (2, 300007)]
for name, fn in {"layernorm_welford": layernorm_welford, "layernorm": layernorm}.items():
    for dtype in (torch.float32, torch.bfloat16):
        for r, c in CHECK_SHAPES:
            report = kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, EPS),
                                     lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
                                     ln_inputs(r, c, dtype), trials=2)
            assert report.passed, (name, dtype, r, c, report)
    print(f"{name:18s} passed: float32 and bfloat16 at {', '.join(f'{r}x{c}' for r, c in CHECK_SHAPES)}")
for dtype in (torch.float32, torch.bfloat16):
    for r, c in CHECK_SHAPES[:-1]:
        report = kernellab.check(lambda x, w, b, y: rmsnorm(x, w, y, EPS),
                                 lambda x, w, b, y: F.rms_norm(x, (x.shape[1],), w, EPS),
                                 ln_inputs(r, c, dtype, mean=1.0), trials=2)
        assert report.passed, ("rmsnorm", dtype, r, c, report)
print("rmsnorm            passed: float32 and bfloat16 at the same shapes (but the last)")

# %%
# %%cpu
def ln_inputs_cpu(rows, cols, dtype, mean=0.0):
    """x ~ N(mean, 2), w ~ N(1, 0.5), b ~ N(0, 1) and an output buffer, in CPU memory (the CPU path)."""
    def make(g):
        x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
        b = torch.randn(cols, generator=g).to(dtype)
        return x, w, b, torch.empty(rows, cols, dtype=dtype)
    return make


CHECK_SHAPES_CPU = [(1, 1), (3, 7), (6, 1031), (5, 4099)]      # a warp, a block, misaligned rows: small for the CPU
for name, fn in {"layernorm_welford": layernorm_welford, "layernorm": layernorm}.items():
    for dtype in (torch.float32, torch.bfloat16):
        for r, c in CHECK_SHAPES_CPU:
            report = kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, EPS),
                                     lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
                                     ln_inputs_cpu(r, c, dtype), trials=1)
            assert report.passed, (name, dtype, r, c, report)
    print(f"{name:18s} passed on the CPU: float32 and bfloat16 at {', '.join(f'{r}x{c}' for r, c in CHECK_SHAPES_CPU)}")
large_mean_cpu = {name: kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, EPS),
                                        lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
                                        ln_inputs_cpu(4, 1031, torch.float32, mean=1e4), trials=1, atol=5e-3, rtol=0)
                  for name, fn in LAYERNORMS.items()}
print({name: r.passed for name, r in large_mean_cpu.items()}, "(a mean of 10,000: the sum of squares fails)")

# %% [markdown]
# Then the large mean: rows of mean 10,000 and standard deviation 2, in float32. float32 itself can only say
# 10,000 to within 0.001 (its spacing there is 2^-10), so no float32 kernel can be closer than about that to the
# float64 answer, and PyTorch's own float32 `layer_norm` is not (the report shows how far it is, as "the
# reference run in the inputs' dtypes"). The tolerance is set to that: 5e-3 absolute. The sum-of-squares kernel
# misses it by orders of magnitude; the two Welford kernels pass.

# %%
# %%gpu
large_mean = {}
for name, fn in LAYERNORMS.items():
    large_mean[name] = kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, EPS),
                                       lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
                                       ln_inputs(256, 4096, torch.float32, mean=1e4), trials=2, atol=5e-3, rtol=0)
    print(f"{name:18s} {'passed' if large_mean[name].passed else 'FAILED'}: max abs error "
          f"{large_mean[name].max_abs_error:.2g}")
assert not large_mean["layernorm_sumsq"].passed
assert large_mean["layernorm_welford"].passed and large_mean["layernorm"].passed
large_mean["layernorm_sumsq"]

# %% [markdown]
# ## Predictions, then the ladder at 4096 x 4096 (float32)
#
# | kernel | prediction |
# |---|---|
# | `layernorm_sumsq` | 1.5-2x the floor: two passes of plain 4-byte loads (the second mostly from L1/L2), and wrong for large means |
# | `layernorm_welford` | as `layernorm_sumsq`, plus a division per element: within 10 % of it (memory, not arithmetic, sets the pace) |
# | `layernorm` (registers) | 1.05-1.15x the floor: one read, 16-byte loads, one reduction round; `w` and `b` from L1 |
# | torch eager (`F.layer_norm`) | 1.2-1.5x |
# | `torch.compile` | 1.1-1.2x |

# %%
# %%gpu
import torch._dynamo

torch._dynamo.config.recompile_limit = 64          # one compile per shape and dtype below (dynamic=False)


def torch_layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def torch_rmsnorm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


torch_layernorm_compiled = torch.compile(torch_layernorm, dynamic=False)
torch_rmsnorm_compiled = torch.compile(torch_rmsnorm, dynamic=False)
x_ln, w_ln, b_ln, y_ln = ln_inputs(rows_ex, cols_ex, torch.float32)(torch.Generator().manual_seed(0))
ln_result = kernellab.bench(lambda x, w, b, y: layernorm(x, w, b, y, EPS), (x_ln, w_ln, b_ln, y_ln),
                            bytes=ln_bytes, flops=8 * x_ln.numel(), rep_ms=50, name="layernorm",
                            baselines={"layernorm_sumsq": lambda x, w, b, y: layernorm_sumsq(x, w, b, y, EPS),
                                       "layernorm_welford": lambda x, w, b, y: layernorm_welford(x, w, b, y, EPS),
                                       "torch eager": lambda x, w, b, y: torch_layernorm(x, w, b),
                                       "torch.compile": lambda x, w, b, y: torch_layernorm_compiled(x, w, b)})
timed = [ln_result, *ln_result.baselines]
HTML(html_table(["kernel", "median µs", "TB/s", "of copy bandwidth", "x the floor"],
                [[r.name, f"{r.median_ms * 1e3:.1f}", f"{r.gbps / 1e3:.2f}", f"{r.gbps / COPY_GBPS:.0%}",
                  f"{r.median_ms * 1e-3 / (ln_bytes / (COPY_GBPS * 1e9)):.2f}"] for r in timed],
                caption=f"LayerNorm 4096 x 4096 float32, {ln_result.device}"))

# %% [markdown]
# ## Against PyTorch at every shape (bf16, then float32)
#
# Predictions for this version (H100): what the sweep of plans measured for these kernels and plans (above;
# tutorial 03's plan in brackets), within the few per cent two runs differ by. LayerNorm: 4096 x 32768 about 95 % of
# the copy bandwidth [64 %] and 1.0-1.05x `torch.compile` [0.70x]; 1024 x 262144 about 74 % [46 %], 1.2-1.25x
# [0.77x]; 4096 x 4096 about 75 %, 1.1x (plan unchanged); 4096 x 1024 about 51 %, 1.0x (unchanged; torch's own copy
# of the same bytes reaches 53 % there: at 11 µs fixed costs are half the time). RMSNorm: 4096 x 32768 about 96 %
# [89 %], 1.0x [0.93x]. Not timed by try_norms: 1000 x 1031 (a warp per row, as before: 8.2 µs and 1.24x compile
# for LayerNorm in the previous run) and 3 x 100003, clusters of 8 x 512 threads x 4 packs (a later try_norms run:
# 13.0 µs, 1.01x compile for LayerNorm, 8.6 µs and 1.49x for RMSNorm; with 8 packs a thread 15.3 and 10.8).
#
# Added with the ring (above), the same table in float32. Predictions from the try_norms runs: LayerNorm 4096 x
# 32768 about 98 % of copy, 1.0x `torch.compile` (one block of 1024 a row: 1.01x, so either side of 1.0 in a given
# run); RMSNorm 4096 x 32768 (now one block of 1024 too, not measured so) 97-99 %, 0.98-1.02x;
# 4096 x 1024 about 72 % (LayerNorm, 1.1x compile) and 71 % (RMSNorm, about 1.0x); 4096 x 4096 about 91 % (the
# ladder above); 1000 x 1031 RMSNorm about 1.08x compile; LayerNorm 3 x 100003 about 1.0x compile (14.6 µs, 7 %
# of copy: latency).

# %%
# %%gpu
from kernellab.teach.rows import sweep_table   # the table tutorial 03's sweep shows too


def sweep_norm(ours, torch_fn, compiled_fn, with_bias, dtype=torch.bfloat16):
    """bench ours against torch eager and torch.compile at each of SHAPES; {shape: BenchResult}."""
    results = {}
    for r, c in SHAPES:
        x, w, b, y = ln_inputs(r, c, dtype)(torch.Generator().manual_seed(1))
        args = (x, w, b, y) if with_bias else (x, w, y)
        item = x.element_size()
        results[(r, c)] = kernellab.bench(
            ours, args, bytes=(2 * r * c + (2 if with_bias else 1) * c) * item, rep_ms=30, warmup_ms=10,
            baselines={"torch eager": lambda *a: torch_fn(*a[:-1]), "torch.compile": lambda *a: compiled_fn(*a[:-1])})
    return results


DTYPES = (torch.bfloat16, torch.float32)
ln_sweep = {dt: sweep_norm(lambda x, w, b, y: layernorm(x, w, b, y, EPS), torch_layernorm, torch_layernorm_compiled,
                           True, dt) for dt in DTYPES}
display(*[HTML(sweep_table(ln_sweep[dt], f"LayerNorm, {str(dt)[6:]}, {ln_result.device}", COPY_GBPS))
          for dt in DTYPES])

# %%
# %%gpu
rms_sweep = {dt: sweep_norm(lambda x, w, y: rmsnorm(x, w, y, EPS), torch_rmsnorm, torch_rmsnorm_compiled, False, dt)
             for dt in DTYPES}
display(*[HTML(sweep_table(rms_sweep[dt], f"RMSNorm, {str(dt)[6:]}, {ln_result.device}", COPY_GBPS))
          for dt in DTYPES])

# %%
# %%gpu
kernellab.roofline([ln_result], title=f"LayerNorm 4096 x 4096 float32 on {ln_result.device}")

# %% [markdown]
# ## Discussion
#
# Numerics first: the sum of squares is not a slightly worse variance, it is a wrong one as soon as the mean is
# a few hundred times the spread, and a kernel that fails only on such data passes every test drawn from
# N(0, 1). Welford's update and Chan's merge cost a few instructions and nothing in memory traffic when values stream
# by once; with the row in registers, the exact two-pass variance is cheaper still (two plain sums across the
# threads, where merging triples cost a third of bf16 LayerNorm's instructions).
#
# Speed: LayerNorm and RMSNorm are softmax's memory pattern with a different statistic, but not quite the same
# plans: with `w` (and `b`) to read, the wide bf16 rows wanted twice softmax's bytes per thread, the short rows
# half its packs, and many rows over 256 KB clusters of 16 blocks. The cell below compares this run with the predictions.

# %%
# %%gpu
floor_us = ln_bytes / (COPY_GBPS * 1e9) * 1e6
for r in timed:
    print(f"{r.name:18s} {r.median_ms * 1e3:7.1f} µs = {r.median_ms * 1e3 / floor_us:.2f}x the floor of "
          f"{floor_us:.0f} µs")
for label, sweeps in (("LayerNorm", ln_sweep), ("RMSNorm", rms_sweep)):
    for dt, sweep in sweeps.items():
        worst_eager = min(res.speedup("torch eager").ratio for res in sweep.values())
        worst_compile = min(res.speedup("torch.compile").ratio for res in sweep.values())
        large = [res.gbps / COPY_GBPS for (r, c), res in sweep.items() if r * c >= 4096 * 1024]
        print(f"{label} {str(dt)[6:]}: at worst {worst_eager:.2f}x torch eager and {worst_compile:.2f}x "
              f"torch.compile; {min(large):.0%}-{max(large):.0%} of the copy bandwidth on the large shapes "
              "(target: 90 %)")

# %% [markdown]
# LayerNorm reads two more vectors than softmax, `w` and `b`. They cost no DRAM bandwidth after the first rows,
# but every row reads them again from L1 or L2: for rows of 32,768 and more, a block's share of `w` and `b` is
# larger than L1 keeps, and the L2 serves twice the bytes DRAM does; and a block has nothing in flight while it
# reduces. Reading `w` and `b` next to `x` (above) hides their round trip; it removes neither the re-reads nor
# the idle reduction. Two further ideas were measured in the same try_norms run (H100, 2026-11-23) and left out:
# - **a persistent grid** (measured and deleted; git keeps it): each block keeps its columns' `w` and `b`
#   in registers for every row it takes and loads its next row's `x` before reducing the current one. At equal
#   packs per thread it helped (bf16 LayerNorm 4096 x 32768 as clusters of 2 x 1024 x 2 packs: 340 µs against
#   452), but it needs spare registers for `w` and `b`, so it ran with 2 packs a thread, and the 8-pack block above
#   is far ahead (188 µs). It did not win at any shape.
# - **x read past L1** (`ld.global.nc.L1::no_allocate`, so that L1 keeps `w` and `b`): within 1 % either way at
#   bf16 4096 x 4096 and 4096 x 1024 (29.7 against 29.9 µs, 10.9 against 11.0), 3 % faster with a warp per float
#   row of 1024 (17.5 against 18.1 µs), but 2-5 % slower on the wide rows (c8 x 512 x 8 at 1024 x 262144: 488 against
#   481 µs; float 4096 x 32768: 423 against 409) and at 1000 x 1031 (8.4 against 8.0). Mixed, small, and it would
#   need a second copy of each kernel picked per shape: not adopted.
# - **resident clusters** (measured later and deleted): for many long rows, a cluster keeps
#   its slice of `w` and `b` in shared memory and takes rows in turn, loading the next row's `x` while it reduces
#   this one, the blocks exchanging statistics as above with no cluster barrier in the loop. At 1024 x 262144 it
#   lost to the one-row-a-cluster plan (bf16 LayerNorm 483-526 µs against 407; RMSNorm a tie): a resident block of
#   1024 threads stops all its warps at each of a row's three barriers, where two to four independent blocks an SM
#   overlap one another's.
#
# What was left after that run, and what came of it: float32 at 4096 x 32768 (0.91x `torch.compile` then; one
# block of 1024 a row and the ring brought it to 98 % of copy and about 1.0x), and LayerNorm at 1024 x 262144 at
# 74 % of copy (the cluster exchange and 16-block clusters: 92 % in float32; in bf16 88 %, then 91 % with `w` and
# `b` prefetched into L1). bf16 LayerNorm still issues 21 instructions per element against RMSNorm's 12, after the
# divisions and guards went (the second pass and the affine store widen every bf16 value again). Keeping the values
# widened, or loading `w` and `b` next to `x`, needs more registers than a 1024-thread bound allows; with a
# 512-thread bound both were slower at every shape (fewer blocks an SM cost more than the instructions saved), a
# tighter bound for more blocks spilled and was slower still, and copying b into shared memory with cp.async made it
# worse too (65 %; benchmarks/NOTES-memory-bound.md). At 4096 x 4096 (64 MB moved) the result depends on what the
# L2 holds when the kernel starts: 26-29 µs under `kernellab.bench`'s flush, which leaves the L2 full of dirty lines
# that the kernel writes back (torch's copy of the same bytes: 25-28 µs, 80-90 % of the copy bandwidth depending on
# the machine), 21 µs under Nsight Compute's flushed-and-invalidated L2, where part of `y` is still in L2 when the
# kernel ends.
# The small shapes are fixed costs, where torch's own copy of the same bytes reaches only 26-68 %; about a fifth of
# such a kernel's time under `kernellab.bench` is the L2 flush's dirty lines being written back
# (measured against the clean flush below). No copy of bf16 4096 x 1024's 16 MB does better: 13 copy kernels (1 to 8 packs a
# thread, blocks of 128 to 512, `.nc`, `.cs` and L2 eviction policies on the loads or the stores, persistent grids)
# reached at most 54 % of the copy bandwidth, and 66 % with `kernellab.bench(..., flush_l2="clean")`, which reads
# the flush buffer instead of writing it so that the L2 holds clean lines (benchmarks/NOTES-memory-bound.md). At that size
# the flush also decides who wins: RMSNorm bf16 4096 x 1024 measured 0.97x `torch.compile` under the default flush
# and 1.06x under the clean one, in the same run (10.62 against 10.30 µs; 8.70 against 9.22). One more design was
# measured and left out (benchmarks/NOTES-memory-bound.md): persistent blocks with two to four rows of `x`
# brought into shared memory by the bulk-copy engine (`cp.async.bulk`), so that the next rows' loads stay in flight
# while a block reduces and stores. bf16 LayerNorm 4096 x 4096 gained 4 % with it under the default flush (85 to
# 89 % of copy) and lost 2 % under the clean one; it tied or lost elsewhere: a change that helps under one flush
# only changes how the kernel meets the benchmark, not what it costs.
#
# Things to try: time the final kernels at 4096 x 1024 with `flush_l2="clean"` beside the default and watch the
# ratios against `torch.compile` move; give `layernorm_rows` the sum of squares instead of the two-pass sums and run the large-mean
# check; put back Chan's merge across the threads and count the instructions per element in Nsight Compute; plan a
# warp per row with 8 packs for float rows of 1024 and compare LayerNorm with RMSNorm (try_norms found they
# disagree); print the SASS of `layernorm_rows<__nv_bfloat16, 8>` and count its registers: 64 bf16 values in 32.

# %% [markdown]
# ## Backward: dx, dw and db
#
# Training needs the gradients. With `xhat = (x - mean) * rstd`, `rstd = 1 / sqrt(var + eps)`, `y = xhat * w + b`
# and `dy` the gradient of the loss with respect to `y`, per row of `n = cols` values, and with `g = dy * w`:
#
# - LayerNorm: `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` (the mean and the variance depend on every value
#   of the row, which is where the two means come from);
# - RMSNorm (`xhat = x * rstd`, `rstd = 1 / sqrt(mean(x^2) + eps)`, no mean subtracted): `dx = rstd * (g - xhat *
#   mean(g * xhat))`;
# - `dw = sum over rows of dy * xhat`, `db = sum over rows of dy`: a column sum over every row.
#
# **Bytes and FLOPs.** The backward must read `x` and `dy` and write `dx`: `3 * rows * cols * itemsize`, half as
# much again as the forward. `w` is read once per block (L1 after that), and `dw`, `db` are `cols` values each. The
# column sums cross rows, so blocks that take different rows each produce a partial sum per column: with `P`
# blocks, `2 * P * cols` fp32 values written and read once more by a second small kernel (`8 * P * cols * 2`
# bytes; with P about one per SM and 4096 rows, 4-9 % of the total). About 16 FLOPs per element (the two row sums,
# the squared deviations, `g`, `g * (x - mean)`, `dx`, `dw`, `db`): 2.7 FLOP per byte in bf16, far under the
# ridge of any GPU. Memory-bound, so the target is the copy bandwidth again.
#
# **Save the statistics, or recompute them?** PyTorch's forward saves `mean` and `rstd` per row (8 bytes a row) and
# its backward reads them. Ours recomputes them: the backward reads the whole of `x` anyway (for `xhat`), so with
# the row in registers the mean and the variance cost two more sums across the row's threads and no memory traffic,
# and the forward keeps its hot path and its single output (the `kl::layernorm` op's schema stays as it is). The
# price is one more reduction round per row in the backward (LayerNorm: the sum for the mean, then the sums of
# `(x - mean)^2`, `g`, `g * (x - mean)` and `x - mean` together in one round; RMSNorm: `x^2` and `g * x` in one
# round). The last of those sums is there for `dw`: in float32 the sum of a row of values near 1,000 rounds the
# mean by about 1e-4, which moves every `xhat` by that much, and `dw = sum dy * xhat` adds those errors up (the
# CPU test of a mean of 1,000 caught it: `dw` 3x PyTorch's error). `sum (x - mean) / n` measures the rounding on
# small numbers, and the kernels correct the mean and the other sums by it.
#
# **The kernels.**
# - `norm_backward_rows<T, RMS>`: each thread holds 8 values of its row (one bf16 pack, two float packs) of `x`,
#   `dy` and `w`, so a row takes up to 1024 threads (8192 columns; float rows up to 4096 in 512 threads, the
#   registers of two packs of each of three vectors). Blocks stay resident and take rows in turn (a block of 512
#   holds 512 / row_threads rows at a time); every thread keeps the same columns for every row, so it adds up
#   `dy * xhat` and `dy` for its columns in fp32 registers, and writes them once at the end: one row of partial sums
#   per block, the block's rows added up in shared memory in a fixed order.
# - rows over 8192 columns (4096 in float) do not fit a block's registers, so they take two kernels:
#   `norm_backward_stats<T, RMS>` (a block per row: the row's `mean`, `rstd`, `mean(g)` and `mean(g * xhat)`,
#   16 bytes a row, reading `x` and `dy` once more), then `norm_backward_tiles<T, RMS>` (column tiles of 256 threads
#   x 8 values, each block walking rows with the statistics given, so its sums of `dw` and `db` stay in registers as
#   above). That reads `x` and `dy` twice, 10 bytes an element in bf16 where the rows kernel needs 6: as much as
#   PyTorch's eager backward, which also reads them once for `dx` and once for `dw`, `db`. (A first version added
#   each row's `dw` and `db` into its block's partial row in L2 instead: 16 more bytes of L2 traffic an element,
#   replaced before any GPU timed it.)
# - few long rows (fewer than two a streaming multiprocessor: 3 x 100003) would give `norm_backward_stats` three
#   blocks for the whole GPU, each walking 100003 columns (the first version measured 0.19x `torch.compile` there).
#   Their statistics come from column slices instead: `norm_backward_split_stats<T, RMS>` runs a block per slice of
#   2048 columns and row (3 x 49 blocks), each writing its slice's sums (LayerNorm: the slice's mean, its sum of
#   squared deviations, `sum g`, `sum g * (x - slice mean)`; RMSNorm: `sum x^2`, `sum g * x`), and
#   `norm_backward_split_tiles<T, RMS>` (the tiles kernel with one step more: its first warp combines a row's slices
#   by Chan's merge in a fixed order before the tile) makes dx, dw and db from them (deviations moved
#   to the merged mean, so no `sum x^2` at a mean of 1,000 is subtracted from anything). `plan_backward` names the
#   choice (`split`), and a CPU test pins the rule shape by shape.
# - `norm_backward_finish<T>`: `dw` and `db` from the partial rows, 32 columns a block (8 where 32 would leave SMs
#   without a block: 1031 columns in 129 blocks, not 33), the partial rows added up in 16 (64) slices and then the
#   slices in a fixed tree: deterministic, the same bits every run.
#
# **Prediction** (before any GPU ran it, H100): `norm_backward_rows` at 75-85 % of the copy bandwidth at 4096 x 1024
# and 4096 x 4096 in bf16 (the forward's 51-91 %, less the partial sums' 4-9 % and the finish kernel's launch), so
# 1.3-1.6x torch eager (whose backward reads `x` and `dy` twice: once for `dx`, again in the kernel for `dw` and
# `db`) and 1.1-1.5x `torch.compile` (Inductor's backward also reduces `dw` and `db` in a separate pass over
# `x` and `dy`); float32 the same ratios at 4096 x 1024. The long rows (statistics, then tiles: 4096 x 32768,
# 1024 x 262144, 3 x 100003) move 10 bytes an element against the floor's 6: 50-60 % of copy counted on the
# floor's bytes, 0.9-1.1x eager and `torch.compile` (the same bytes as theirs), the weak spot of this version.
#
# **Prediction for the split statistics and the narrow finish** (written before a GPU ran them; bytes moved at 3 TB/s
# plus 2.5 µs a kernel, `model_us` in benchmarks/norm_backward.py, which prints it beside each measurement):
# 3 x 100003 bf16 10.4 µs LayerNorm, 9.5 µs RMSNorm (three kernels' floors and 6-9 MB, most of it the partial rows
# of `dw` and `db`), about 2x `torch.compile`'s 19-20 µs where the per-row statistics ran 64-105 µs; 1000 x 1031
# 8.5 / 7.8 µs by the model, but the rows kernel ran 2.5x its model there (21.3 µs: two rounds of rows bound by
# latency, not bytes), so 17-19 µs expected, 0.9-1.0x eager's 16.5 µs: still short of the target unless blocks of
# 1024 (132 partial rows, not 264; timed beside the default by `benchmarks/norm_backward.py --plans`) close it.

# %%
# %%cuda --name norm_backward
// LayerNorm and RMSNorm backward. dx per row (the row's statistics recomputed from x, which the backward reads
// anyway), and dw, db as fp32 partial sums per block, added up across the blocks by norm_backward_finish.
#include <kl/reduce.cuh>    // block_sum (every thread; safe back to back), warp_sum
#include <kl/rows.cuh>      // Pack<T>: 16 bytes as four words; from_floats; to_float, from_float (kl/convert.cuh)

constexpr int kValues = 8;  // values of a row per thread in norm_backward_rows: one bf16 pack, two float packs
// A row's threads in norm_backward_rows, at most: 1024 bf16 (rows up to 8192), 512 float (rows up to 4096: with
// two packs each of x, dy and w, a float thread needs more than the 64 registers of a 1024-thread block).
template <typename T> constexpr int kMaxRowThreads = sizeof(T) == 4 ? 512 : 1024;

// Sums of N values over the row's threads (row_threads: a power of two, whole warps), in every thread: the warp
// (shuffles), then the row's warps (shared memory). SLOT and `parity` (the row loop's iteration, mod 2) keep the
// shared slots of consecutive reductions apart, so that none needs a second barrier.
template <int SLOT, int N>
__device__ __forceinline__ void row_sum(float (&v)[N], int row_warps, int parity) {
    __shared__ float part[2][N][32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
    if (row_warps > 1) {
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < N; ++i) part[parity][i][warp] = v[i];
        __syncthreads();
        int first = warp & -row_warps;                   // the row's first warp
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = warp_sum(lane < row_warps ? part[parity][i][first + lane] : 0.0f);
    }
}

// A thread's kValues values of a row: pack j holds columns (t + j * row_threads) * VEC ... + VEC - 1. Rows whose
// width is a multiple of VEC start on a 16-byte boundary (16-byte loads); others load element by element. Values
// past the row, and every value of a row past the last (`live` false), read as 0.
template <typename T, int PACKS>
__device__ __forceinline__ void load_row(Pack<T> (&pk)[PACKS], const T* __restrict__ row, int cols, int t,
                                         int row_threads, bool live, bool aligned) {
    constexpr int VEC = 16 / sizeof(T);
#pragma unroll
    for (int j = 0; j < PACKS; ++j) {
        int c = (t + j * row_threads) * VEC;             // first column of pack j
        if (live && aligned && c < cols) {
            pk[j] = *reinterpret_cast<const Pack<T>*>(row + c);
        } else {
            float f[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) f[k] = live && c + k < cols ? to_float(row[c + k]) : 0.0f;
            pk[j] = from_floats<T>(f);                   // exact: the values are T's already
        }
    }
}

template <typename T, int PACKS>
__device__ __forceinline__ float at(const Pack<T> (&pk)[PACKS], int i) {
    return pk[i / (16 / sizeof(T))].get(i % (16 / sizeof(T)));
}

// A block's sums of one vector (dw or db) for its columns into `dst`: one group writes its registers; several add
// theirs up in shared memory in group order (the same sums every run).
template <int VEC>
__device__ __forceinline__ void write_partial(const float (&acc)[kValues], float* __restrict__ dst, float* stage,
                                              int cols, int t, int group, int groups, int row_threads) {
    if (groups == 1) {
#pragma unroll
        for (int i = 0; i < kValues; ++i) {
            int c = (t + (i / VEC) * row_threads) * VEC + i % VEC;
            if (c < cols) dst[c] = acc[i];
        }
        return;
    }
    int span = row_threads * kValues;                    // columns a group covers (cols or more)
    __syncthreads();                                     // stage is free (its last reader is done)
#pragma unroll
    for (int i = 0; i < kValues; ++i) stage[group * span + (t + (i / VEC) * row_threads) * VEC + i % VEC] = acc[i];
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float s = 0.0f;
        for (int g = 0; g < groups; ++g) s += stage[g * span + c];
        dst[c] = s;
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd (LayerNorm);
// dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd (RMSNorm, RMS true). Each block takes rows
// blockIdx.x * groups + group, then gridDim.x * groups further, ... (groups = blockDim.x / row_threads rows at a
// time); every thread keeps the same columns for every row, so it adds up dy * xhat (dw) and dy (db) for them in
// registers, and the block writes one row of partial sums at the end: partial[blockIdx.x] = [dw (cols), db (cols)].
template <typename T, bool RMS>
__global__ void __launch_bounds__(kMaxRowThreads<T>, 1) norm_backward_rows(const T* __restrict__ dy, const T* __restrict__ x,
                                                           const T* __restrict__ w, T* __restrict__ dx,
                                                           float* __restrict__ partial, int rows, int cols,
                                                           int row_threads, float eps) {
    constexpr int VEC = 16 / sizeof(T), PACKS = kValues / VEC;
    __shared__ float stage[8192];                        // the groups' partial sums, at the end (8 a thread)
    int shift = __ffs(row_threads) - 1;                  // row_threads: a power of two, 32 or more
    int t = threadIdx.x & (row_threads - 1), group = threadIdx.x >> shift, groups = blockDim.x >> shift;
    int row_warps = row_threads / 32;
    bool aligned = cols % VEC == 0;
    float n = (float)cols;
    float dw[kValues], db[kValues];
#pragma unroll
    for (int i = 0; i < kValues; ++i) dw[i] = db[i] = 0.0f;
    int parity = 0;
    for (int first = blockIdx.x * groups; first < rows; first += gridDim.x * groups, parity ^= 1) {
        int row = first + group;                         // every group takes part in the block's barriers
        bool live = row < rows;
        size_t start = (size_t)(live ? row : 0) * cols;
        Pack<T> xk[PACKS], gk[PACKS], wk[PACKS];       // w: the same columns every row, from L1 after the first
        load_row(xk, x + start, cols, t, row_threads, live, aligned);
        load_row(gk, dy + start, cols, t, row_threads, live, aligned);
        load_row(wk, w, cols, t, row_threads, true, aligned);
        float mean = 0.0f, rstd, mean_g = 0.0f, mean_gx;
        if constexpr (RMS) {
            float s[2] = {0.0f, 0.0f};                   // sum x^2, sum g x
#pragma unroll
            for (int i = 0; i < kValues; ++i) {
                float xv = at(xk, i), g = at(gk, i) * at(wk, i);
                s[0] = fmaf(xv, xv, s[0]);
                s[1] = fmaf(g, xv, s[1]);
            }
            row_sum<0>(s, row_warps, parity);
            rstd = rsqrtf(s[0] / n + eps);
            mean_gx = s[1] * rstd / n;
        } else {
            float s[1] = {0.0f};                         // sum x: the mean first, then deviations from it
#pragma unroll
            for (int i = 0; i < kValues; ++i) s[0] += at(xk, i);
            row_sum<0>(s, row_warps, parity);
            mean = s[0] / n;
            float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};       // sum (x - mean)^2, sum g, sum g (x - mean), sum (x - mean)
#pragma unroll
            for (int i = 0; i < kValues; ++i) {
                int c = (t + (i / VEC) * row_threads) * VEC + i % VEC;
                float d = c < cols ? at(xk, i) - mean : 0.0f, g = at(gk, i) * at(wk, i);
                m[0] = fmaf(d, d, m[0]);
                m[1] += g;
                m[2] = fmaf(g, d, m[2]);
                m[3] += d;
            }
            row_sum<1>(m, row_warps, parity);
            float shift = m[3] / n;                      // the first mean's rounding (sum x of a mean of 1e3 in
            mean += shift;                               // float32: 1e-4), measured on small deviations and undone
            rstd = rsqrtf(fmaxf(m[0] / n - shift * shift, 0.0f) + eps);
            mean_g = m[1] / n;
            mean_gx = (m[2] - shift * m[1]) * rstd / n;
        }
#pragma unroll
        for (int j = 0; j < PACKS; ++j) {                // dx one pack at a time, stored as it is made
            int c = (t + j * row_threads) * VEC;
            float f[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                int i = j * VEC + k;
                float xhat = (at(xk, i) - mean) * rstd, dyv = at(gk, i), g = dyv * at(wk, i);
                f[k] = rstd * (g - mean_g - xhat * mean_gx);
                dw[i] = fmaf(dyv, xhat, dw[i]);          // dy is 0 past the row and in rows past the last
                db[i] += dyv;
            }
            if (!live) continue;
            if (aligned) {
                if (c < cols) *reinterpret_cast<Pack<T>*>(dx + start + c) = from_floats<T>(f);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    if (c + k < cols) dx[start + c + k] = from_float<T>(f[k]);
            }
        }
    }
    // The block's partial sums: partial[blockIdx.x] = [dw (cols), db (cols)].
    float* mine = partial + (size_t)blockIdx.x * 2 * cols;
    write_partial<VEC>(dw, mine, stage, cols, t, group, groups, row_threads);
    if (!RMS) write_partial<VEC>(db, mine + cols, stage, cols, t, group, groups, row_threads);   // RMSNorm: no b
}

// This thread's columns of a row, f(c, x, dy, w) for each: 16-byte packs where the row starts on a 16-byte boundary
// (cols a multiple of the pack: the same columns every row), one element at a time otherwise. G false: x only.
template <bool G, typename T, typename Fn>
__device__ __forceinline__ void each_column(const T* __restrict__ xr, const T* __restrict__ gr,
                                            const T* __restrict__ w, int cols, Fn f) {
    constexpr int VEC = 16 / sizeof(T);
    if (cols % VEC == 0) {
        for (int q = threadIdx.x; q < cols / VEC; q += blockDim.x) {
            Pack<T> xp = reinterpret_cast<const Pack<T>*>(xr)[q], gp, wp;
            if (G) {
                gp = reinterpret_cast<const Pack<T>*>(gr)[q];
                wp = reinterpret_cast<const Pack<T>*>(w)[q];
            }
#pragma unroll
            for (int k = 0; k < VEC; ++k) f(q * VEC + k, xp.get(k), G ? gp.get(k) : 0.0f, G ? wp.get(k) : 0.0f);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            f(c, to_float(xr[c]), G ? to_float(gr[c]) : 0.0f, G ? to_float(w[c]) : 0.0f);
    }
}

// Rows longer than a block's registers hold (over 8192 columns; float over 4096) take two kernels. First each row's
// statistics, a block of threads per row reading x (twice: the mean, then the deviations, the second read mostly
// from L1) and dy: stats[row] = {mean, rstd, mean(g), mean(g * xhat)}.
template <typename T, bool RMS>
__global__ void __launch_bounds__(1024) norm_backward_stats(const T* __restrict__ dy, const T* __restrict__ x,
                                                            const T* __restrict__ w, float4* __restrict__ stats,
                                                            int cols, float eps) {
    int row = blockIdx.x;
    const T* xr = x + (size_t)row * cols;
    const T* gr = dy + (size_t)row * cols;
    float n = (float)cols, mean = 0.0f, rstd, mean_g = 0.0f, mean_gx;
    if constexpr (RMS) {
        float ss = 0.0f, sgx = 0.0f;
        each_column<true>(xr, gr, w, cols, [&](int, float xv, float gv, float wv) {
            ss = fmaf(xv, xv, ss);
            sgx = fmaf(gv * wv, xv, sgx);
        });
        rstd = rsqrtf(block_sum(ss) / n + eps);
        mean_gx = block_sum(sgx) * rstd / n;
    } else {
        float s = 0.0f;
        each_column<false>(xr, gr, w, cols, [&](int, float xv, float, float) { s += xv; });
        mean = block_sum(s) / n;
        float m2 = 0.0f, sg = 0.0f, sgd = 0.0f, sd = 0.0f;
        each_column<true>(xr, gr, w, cols, [&](int, float xv, float gv, float wv) {
            float d = xv - mean, g = gv * wv;
            m2 = fmaf(d, d, m2);
            sg += g;
            sgd = fmaf(g, d, sgd);
            sd += d;
        });
        float shift = block_sum(sd) / n;                  // the first mean's rounding, undone (as in the rows kernel)
        mean += shift;
        sg = block_sum(sg);
        rstd = rsqrtf(fmaxf(block_sum(m2) / n - shift * shift, 0.0f) + eps);
        mean_g = sg / n;
        mean_gx = (block_sum(sgd) - shift * sg) * rstd / n;
    }
    if (threadIdx.x == 0) stats[row] = make_float4(mean, rstd, mean_g, mean_gx);
}

// Few long rows (3 x 100003: three blocks of the kernel above, each walking 100003 columns) take their statistics in
// column slices instead: block (blockIdx.x, blockIdx.y) holds the slice of columns blockIdx.x * blockDim.x *
// kValues ... of row blockIdx.y in registers (8 values a thread, as the tiles kernel below) and writes the slice's
// sums, parts[row * gridDim.x + slice]: LayerNorm {the slice's mean, sum (x - that mean)^2, sum g, sum g (x - that
// mean)} (deviations from the slice's own mean, so that Chan's merge in norm_backward_tiles combines them without
// the cancellation of sum x^2 at a mean of 1e3); RMSNorm {sum x^2, sum g x, 0, 0}.
template <typename T, bool RMS>
__global__ void __launch_bounds__(256) norm_backward_split_stats(const T* __restrict__ dy, const T* __restrict__ x,
                                                                 const T* __restrict__ w, float4* __restrict__ parts,
                                                                 int cols) {
    constexpr int VEC = 16 / sizeof(T), PACKS = kValues / VEC;
    int span = blockDim.x * kValues, col0 = blockIdx.x * span;         // this slice's columns: col0 ...
    int width = min(span, cols - col0), t = threadIdx.x, threads = blockDim.x;
    bool aligned = cols % VEC == 0;                       // col0 is a multiple of the pack: rows stay aligned
    size_t start = (size_t)blockIdx.y * cols + col0;
    Pack<T> xk[PACKS], gk[PACKS], wk[PACKS];
    load_row(xk, x + start, width, t, threads, true, aligned);     // 0 past the slice's end
    load_row(gk, dy + start, width, t, threads, true, aligned);
    load_row(wk, w + col0, width, t, threads, true, aligned);
    float4 out;
    if constexpr (RMS) {
        float s[2] = {0.0f, 0.0f};                        // sum x^2, sum g x
#pragma unroll
        for (int i = 0; i < kValues; ++i) {
            float xv = at(xk, i);
            s[0] = fmaf(xv, xv, s[0]);
            s[1] = fmaf(at(gk, i) * at(wk, i), xv, s[1]);
        }
        row_sum<0>(s, threads / 32, 0);
        out = make_float4(s[0], s[1], 0.0f, 0.0f);
    } else {
        float n = (float)width, s[1] = {0.0f};
#pragma unroll
        for (int i = 0; i < kValues; ++i) s[0] += at(xk, i);
        row_sum<0>(s, threads / 32, 0);
        float mean = s[0] / n;
        float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};            // sum d^2, sum g, sum g d, sum d; d = x - mean
#pragma unroll
        for (int i = 0; i < kValues; ++i) {
            int c = (t + (i / VEC) * threads) * VEC + i % VEC;
            float d = c < width ? at(xk, i) - mean : 0.0f, g = at(gk, i) * at(wk, i);
            m[0] = fmaf(d, d, m[0]);
            m[1] += g;
            m[2] = fmaf(g, d, m[2]);
            m[3] += d;
        }
        row_sum<1>(m, threads / 32, 0);
        float shift = m[3] / n;                           // the first mean's rounding, undone (as in the rows kernel)
        out = make_float4(mean + shift, fmaxf(m[0] - shift * m[3], 0.0f), m[1], m[2] - shift * m[1]);
    }
    if (threadIdx.x == 0) parts[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = out;
}

// Chan's merge of two slices' LayerNorm sums (count n, mean, sum of squared deviations m2, sum g, sum g (x - mean)):
// the deviations of each side moved to the merged mean, no large numbers subtracted.
struct SliceSums { float n, mean, m2, sg, sgd; };
__device__ __forceinline__ SliceSums merge(SliceSums a, SliceSums b) {
    float n = a.n + b.n;
    if (n == 0.0f) return a;
    float delta = b.mean - a.mean, fb = b.n / n, mean = a.mean + delta * fb;
    return {n, mean, a.m2 + b.m2 + delta * delta * a.n * fb, a.sg + b.sg,
            a.sgd + b.sgd + a.sg * (a.mean - mean) + b.sg * (b.mean - mean)};
}

// A row's statistics {mean, rstd, mean(g), mean(g * xhat)} from its `slices` slices' sums (norm_backward_split_stats,
// slices of `span` columns), in lane 0 of the calling warp: each lane merges slices lane, lane + 32, ... in order,
// then the lanes in a fixed tree (the same bits every run).
template <bool RMS>
__device__ __forceinline__ float4 combine_slices(const float4* __restrict__ parts, int slices, int cols, int span,
                                                 float eps) {
    int lane = threadIdx.x % 32;
    SliceSums acc = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};      // RMSNorm: m2 = sum x^2, sgd = sum g x
    for (int k = lane; k < slices; k += 32) {
        float4 q = parts[k];
        SliceSums b = {(float)min(span, cols - k * span), q.x, q.y, q.z, q.w};
        if constexpr (RMS) acc = {acc.n + b.n, 0.0f, acc.m2 + q.x, 0.0f, acc.sgd + q.y};
        else acc = merge(acc, b);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        SliceSums b = {__shfl_down_sync(0xffffffffu, acc.n, o), __shfl_down_sync(0xffffffffu, acc.mean, o),
                       __shfl_down_sync(0xffffffffu, acc.m2, o), __shfl_down_sync(0xffffffffu, acc.sg, o),
                       __shfl_down_sync(0xffffffffu, acc.sgd, o)};
        if (lane + o < 32) {
            if constexpr (RMS) acc = {acc.n + b.n, 0.0f, acc.m2 + b.m2, 0.0f, acc.sgd + b.sgd};
            else acc = merge(acc, b);
        }
    }
    float n = (float)cols, rstd = rsqrtf(acc.m2 / n + eps);
    return make_float4(acc.mean, rstd, acc.sg / n, acc.sgd * rstd / n);
}

// Then dx, and dw/db's partial sums, by column tiles: block (blockIdx.x, blockIdx.y) holds columns
// blockIdx.x * blockDim.x * kValues ... of rows blockIdx.y, + gridDim.y, ..., 8 values a thread as in
// norm_backward_rows, so its sums stay in registers; partial[blockIdx.y] gets them at the end. SPLIT false:
// stats[row] are the row's statistics (norm_backward_stats); true: stats[row * slices ...] are its slices' sums
// (norm_backward_split_stats, slices of this tile's width), which the block's first warp combines for each row (a
// template flag, so that the kernel of the per-row statistics keeps its registers: 48, not 64, in bf16).
template <typename T, bool RMS, bool SPLIT>
__device__ __forceinline__ void tiles_body(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                           T* __restrict__ dx, const float4* __restrict__ stats,
                                           float* __restrict__ partial, int rows, int cols, int slices, float eps) {
    __shared__ float4 row_stats;
    constexpr int VEC = 16 / sizeof(T), PACKS = kValues / VEC;
    int col0 = blockIdx.x * blockDim.x * kValues, width = cols - col0;   // this tile's columns: col0 ...
    int t = threadIdx.x, threads = blockDim.x;
    bool aligned = cols % VEC == 0;                       // col0 is a multiple of the pack: rows stay aligned
    Pack<T> wk[PACKS];
    load_row(wk, w + col0, width, t, threads, true, aligned);
    float dw[kValues], db[kValues];
#pragma unroll
    for (int i = 0; i < kValues; ++i) dw[i] = db[i] = 0.0f;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        size_t start = (size_t)row * cols + col0;
        if (SPLIT) {                                      // the row's statistics from its slices' sums
            __syncthreads();                              // row_stats: the last row's readers are done
            if (threadIdx.x < 32) {
                float4 r = combine_slices<RMS>(stats + (size_t)row * slices, slices, cols, threads * kValues, eps);
                if (threadIdx.x == 0) row_stats = r;
            }
            __syncthreads();
        }
        Pack<T> xk[PACKS], gk[PACKS];
        load_row(xk, x + start, width, t, threads, true, aligned);
        load_row(gk, dy + start, width, t, threads, true, aligned);
        float4 st = SPLIT ? row_stats : stats[row];       // mean, rstd, mean(g), mean(g * xhat)
#pragma unroll
        for (int j = 0; j < PACKS; ++j) {
            int c = (t + j * threads) * VEC;
            float f[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                int i = j * VEC + k;
                float xhat = (at(xk, i) - st.x) * st.y, dyv = at(gk, i);
                f[k] = st.y * (dyv * at(wk, i) - st.z - xhat * st.w);
                dw[i] = fmaf(dyv, xhat, dw[i]);           // dy is 0 past the row's end
                db[i] += dyv;
            }
            if (aligned) {
                if (c < width) *reinterpret_cast<Pack<T>*>(dx + start + c) = from_floats<T>(f);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    if (c + k < width) dx[start + c + k] = from_float<T>(f[k]);
            }
        }
    }
    float* mine = partial + (size_t)blockIdx.y * 2 * cols + col0;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
        int c = (t + (i / VEC) * threads) * VEC + i % VEC;
        if (c < width) {
            mine[c] = dw[i];
            if (!RMS) mine[cols + c] = db[i];
        }
    }
}

template <typename T, bool RMS>
__global__ void __launch_bounds__(256) norm_backward_tiles(const T* __restrict__ dy, const T* __restrict__ x,
                                                           const T* __restrict__ w, T* __restrict__ dx,
                                                           const float4* __restrict__ stats,
                                                           float* __restrict__ partial, int rows, int cols) {
    tiles_body<T, RMS, false>(dy, x, w, dx, stats, partial, rows, cols, 0, 0.0f);
}

template <typename T, bool RMS>
__global__ void __launch_bounds__(256) norm_backward_split_tiles(const T* __restrict__ dy, const T* __restrict__ x,
                                                                 const T* __restrict__ w, T* __restrict__ dx,
                                                                 const float4* __restrict__ parts,
                                                                 float* __restrict__ partial, int rows, int cols,
                                                                 int slices, float eps) {
    tiles_body<T, RMS, true>(dy, x, w, dx, parts, partial, rows, cols, slices, eps);
}

// dw[c] = sum over the partial rows of partial[p][0][c], db likewise (db null: RMSNorm, its half never read): 512
// threads, `lanes` columns (8 or 32: a power of two) x 512 / lanes slices of the partial rows; each slice's sum, then
// the slices in a fixed tree (the same sums every run). Narrow rows take 8 columns a block: 1031 columns are 129
// blocks of 64 slices (264 partial rows: 4 loads a thread), not 33 blocks of 16 slices (17 loads a thread).
template <typename T>
__global__ void __launch_bounds__(512) norm_backward_finish(const float* __restrict__ partial, int parts, int cols,
                                                            int lanes, T* __restrict__ dw, T* __restrict__ db) {
    __shared__ float sums[2][512];
    int lane = threadIdx.x % lanes, slice = threadIdx.x / lanes, slices = blockDim.x / lanes;
    int c = blockIdx.x * lanes + lane;
    int vectors = db == nullptr ? 1 : 2;
    for (int v = 0; v < vectors; ++v) {
        float s = 0.0f;
        if (c < cols)
#pragma unroll 8                                          // 8 loads in flight, not one round trip per partial row
            for (int p = slice; p < parts; p += slices) s += partial[((size_t)p * 2 + v) * cols + c];
        sums[v][threadIdx.x] = s;
    }
    for (int half = slices / 2; half > 0; half /= 2) {   // slice i += slice i + half, for the slices below half
        __syncthreads();
        if (slice < half)
            for (int v = 0; v < vectors; ++v) sums[v][threadIdx.x] += sums[v][threadIdx.x + half * lanes];
    }
    __syncthreads();
    if (slice < vectors && c < cols) (slice == 0 ? dw : db)[c] = from_float<T>(sums[slice][lane]);
}

#define NORM_BACKWARD(T)                                                                                          \
    template __global__ void norm_backward_rows<T, false>(const T*, const T*, const T*, T*, float*, int, int, int,  \
                                                          float);                                                 \
    template __global__ void norm_backward_rows<T, true>(const T*, const T*, const T*, T*, float*, int, int, int,   \
                                                         float);                                                  \
    template __global__ void norm_backward_stats<T, false>(const T*, const T*, const T*, float4*, int, float);      \
    template __global__ void norm_backward_stats<T, true>(const T*, const T*, const T*, float4*, int, float);       \
    template __global__ void norm_backward_split_stats<T, false>(const T*, const T*, const T*, float4*, int);       \
    template __global__ void norm_backward_split_stats<T, true>(const T*, const T*, const T*, float4*, int);        \
    template __global__ void norm_backward_tiles<T, false>(const T*, const T*, const T*, T*, const float4*, float*, \
                                                           int, int);                                             \
    template __global__ void norm_backward_tiles<T, true>(const T*, const T*, const T*, T*, const float4*, float*,  \
                                                          int, int);                                              \
    template __global__ void norm_backward_split_tiles<T, false>(const T*, const T*, const T*, T*, const float4*,   \
                                                                 float*, int, int, int, float);                   \
    template __global__ void norm_backward_split_tiles<T, true>(const T*, const T*, const T*, T*, const float4*,    \
                                                                float*, int, int, int, float);                    \
    template __global__ void norm_backward_finish<T>(const float*, int, int, int, T*, T*);
NORM_BACKWARD(float)
NORM_BACKWARD(__nv_bfloat16)

# %%
# launchers: layernorm backward, rmsnorm backward
from dataclasses import dataclass

import torch.nn.functional as F

BACKWARD_VALUES = 8          # values of a row per thread in norm_backward_rows (kValues in the cell)


@dataclass(frozen=True)
class BackwardPlan:
    """How the backward covers a rows x cols matrix: the kernel ("rows": a row in registers; "tiles": the row's
    statistics first, then column tiles), a row's (a tile's) threads, the block, the grid's rows of blocks (= the
    rows of partial sums of dw and db), the column tiles, and (tiles only) whether the rows' statistics come from
    column slices (split: a block per slice and row, combined by the tiles kernel) or a block per row."""

    kernel: str
    row_threads: int
    block: int
    grid: int
    tiles: int = 1
    split: bool = False


TILE_THREADS = 256           # threads of a column tile in norm_backward_tiles (its __launch_bounds__)
SPLIT_ROWS_PER_SM = 2        # long rows fewer than this many per SM: their statistics by column slices (split)


def finish_columns(cols, sms=SMS):
    """Columns a block of norm_backward_finish adds up: 32 (16 slices of the partial rows) where that still gives an
    SM a block, else 8 (64 slices): 1031 columns in 129 blocks, not 33."""
    return 32 if -(-cols // 32) >= sms else 8


@functools.cache          # once per shape, as plan_rows
def plan_backward(rows, cols, itemsize, sms=SMS, block=None):
    """The backward's launch: rows up to 8192 values (float: 4096) in registers, 8 a thread, resident blocks of
    512 (float: 256) threads or one row's threads, one wave of them; longer rows in column tiles of 256 x 8 values,
    about four tiles an SM in all. The long rows' statistics: a block of 1024 threads per row while there are at
    least SPLIT_ROWS_PER_SM rows an SM (two such blocks fill an SM); fewer rows (3 x 100003: three blocks for the
    whole GPU, each walking 100003 columns) split each row into the tiles' column slices, a block per slice and row
    (3 x 49 blocks), whose sums the tiles kernel combines."""
    max_row_threads = 512 if itemsize == 4 else 1024
    row_threads = max(32, 1 << math.ceil(math.log2(max(1, -(-cols // BACKWARD_VALUES)))))
    if row_threads > max_row_threads:
        tiles = -(-cols // (TILE_THREADS * BACKWARD_VALUES))
        return BackwardPlan("tiles", TILE_THREADS, TILE_THREADS, max(1, min(rows, 4 * sms // tiles)), tiles,
                            split=rows < SPLIT_ROWS_PER_SM * sms)
    block = min(max(row_threads, block or (256 if itemsize == 4 else 512)), max_row_threads)   # its launch bounds
    resident = (768 if itemsize == 4 else 1024) // block or 1     # blocks an SM holds (registers: 80 / 64 a thread)
    return BackwardPlan("rows", row_threads, block, max(1, min(-(-rows // (block // row_threads)), sms * resident)))


def _norm_backward(kind, dy, x, w, eps, with_bias, plan=None):
    """dx, dw and (with_bias) db of LayerNorm or RMSNorm over the rows of 2-D x, by the kernels above."""
    rows, cols = x.shape
    dy = dy.contiguous()                     # autograd may hand an expanded gradient (loss = y.sum())
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    db = torch.empty_like(w) if with_bias else None
    if rows == 0 or cols == 0:
        dw.zero_()
        return (dx, dw, db.zero_()) if with_bias else (dx, dw)
    _check_layout(dy, x, w)                  # dx, dw: empty_like of x and w
    if plan is None:                         # a model's call: the plan and the configured kernels, once per shape
        hit = _BACKWARD_LAUNCHES.get((kind, rows, cols, x.dtype))
        if hit is None or hit[0] is not norm_backward:
            hit = _backward_launches(kind, rows, cols, x.dtype, plan_backward(rows, cols, x.element_size()))
            _BACKWARD_LAUNCHES[kind, rows, cols, x.dtype] = hit
    else:
        hit = _backward_launches(kind, rows, cols, x.dtype, plan)
    _, plan, main, stats_launch, finish, lanes = hit
    partial = torch.empty(plan.grid, 2, cols, dtype=torch.float32, device=x.device)
    if plan.kernel == "rows":
        main(dy, x, w, dx, partial, rows, cols, plan.row_threads, eps)
    else:                                    # split: each slice's sums, rows x tiles of them
        stats = torch.empty(rows, plan.tiles if plan.split else 1, 4, dtype=torch.float32, device=x.device)
        if plan.split:
            stats_launch(dy, x, w, stats, cols)
            main(dy, x, w, dx, stats, partial, rows, cols, plan.tiles, eps)
        else:
            stats_launch(dy, x, w, stats, cols, eps)
            main(dy, x, w, dx, stats, partial, rows, cols)
    finish(partial, plan.grid, cols, lanes, dw, db)
    return (dx, dw, db) if with_bias else (dx, dw)


_BACKWARD_LAUNCHES = {}   # (kind, rows, cols, dtype) -> _backward_launches(...) for the plan of plan_backward


def _backward_launches(kind, rows, cols, dtype, plan):
    """(norm_backward, plan, the rows or tiles kernel, the stats kernel or None, the finish kernel, its columns a
    block), each kernel configured as kernel[grid, block] for this plan."""
    ct, rms = CTYPE[dtype], "true" if kind == "rmsnorm" else "false"
    if plan.kernel == "rows":
        main = norm_backward[f"norm_backward_rows<{ct}, {rms}>"][plan.grid, plan.block]
        stats = None
    elif plan.split:
        stats = norm_backward[f"norm_backward_split_stats<{ct}, {rms}>"][(plan.tiles, rows), plan.block]
        main = norm_backward[f"norm_backward_split_tiles<{ct}, {rms}>"][(plan.tiles, plan.grid), plan.block]
    else:
        stats = norm_backward[f"norm_backward_stats<{ct}, {rms}>"][rows, 1024]
        main = norm_backward[f"norm_backward_tiles<{ct}, {rms}>"][(plan.tiles, plan.grid), plan.block]
    lanes = finish_columns(cols)
    finish = norm_backward[f"norm_backward_finish<{ct}>"][-(-cols // lanes), 512]
    return norm_backward, plan, main, stats, finish, lanes


def layernorm_backward(dy, x, w, eps=1e-5, plan=None):
    """(dx, dw, db) of F.layer_norm(x, (cols,), w, b, eps) for 2-D float32/bf16 x and its output's gradient dy."""
    return _norm_backward("layernorm", dy, x, w, eps, True, plan)


def rmsnorm_backward(dy, x, w, eps=1e-5, plan=None):
    """(dx, dw) of F.rms_norm(x, (cols,), w, eps) for 2-D float32/bf16 x and its output's gradient dy."""
    return _norm_backward("rmsnorm", dy, x, w, eps, False, plan)


def reference_backward(kind, dy, x, w, b=None, eps=1e-5, dtype=None):
    """PyTorch's gradients (dx, dw[, db]) of F.layer_norm / F.rms_norm, computed in `dtype` (float64: the
    reference; None: the inputs' own dtype, PyTorch's own error), returned in that dtype."""
    dtype = dtype or x.dtype
    xs = x.detach().to(dtype).requires_grad_(True)
    ws = w.detach().to(dtype).requires_grad_(True)
    if kind == "layernorm":
        bs = b.detach().to(dtype).requires_grad_(True)
        y = F.layer_norm(xs, (x.shape[-1],), ws, bs, eps)
        return torch.autograd.grad(y, (xs, ws, bs), dy.to(dtype))
    y = F.rms_norm(xs, (x.shape[-1],), ws, eps)
    return torch.autograd.grad(y, (xs, ws), dy.to(dtype))


def backward_errors(kind, dy, x, w, b=None, eps=1e-5):
    """{gradient: (our max abs error, PyTorch's in the same dtype)} against float64, on these inputs."""
    ours = (layernorm_backward(dy, x, w, eps) if kind == "layernorm" else rmsnorm_backward(dy, x, w, eps))
    want = reference_backward(kind, dy, x, w, b, eps, torch.float64)
    theirs = reference_backward(kind, dy, x, w, b, eps)
    return {name: ((o.double() - r).abs().max().item(), (t.double() - r).abs().max().item(), r.abs().max().item())
            for name, o, t, r in zip(("dx", "dw", "db"), ours, theirs, want)}


def backward_passes(errors, dtype):
    """Ours at most 2x PyTorch's own error, plus a floor of a rounding of the largest value (bf16: 2^-8)."""
    floor = 2.0 ** -8 if dtype == torch.bfloat16 else 1e-6
    return all(ours <= 2 * theirs + floor * max(scale, 1.0) for ours, theirs, scale in errors.values())


def bwd_inputs(rows, cols, dtype, dist="normal", device="cuda", seed=0):
    """dy, x, w, b for the backward: x from `dist` ("normal", "mean1e3": N(1000, 1), "heavy": Student's t with 3
    degrees of freedom), w ~ N(1, 0.5), b and dy ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    if dist == "mean1e3":
        x = x + 1e3
    elif dist == "heavy":                             # t(3) = N(0, 1) / sqrt(chi2(3) / 3)
        chi2 = sum(torch.randn(rows, cols, generator=g, dtype=torch.float64) ** 2 for _ in range(3))
        x = x / (chi2 / 3).sqrt()
    w = 1 + 0.5 * torch.randn(cols, generator=g, dtype=torch.float64)
    b = torch.randn(cols, generator=g, dtype=torch.float64)
    dy = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    return tuple(t.to(dtype).to(device) for t in (dy, x, w, b))

# %% [markdown]
# The plans at the tutorial's shapes, and the kernels' registers (no spills: a CPU test checks it):

# %%
rows = []
for dtype in (torch.float32, torch.bfloat16):
    for r, c in SHAPES:
        plan = plan_backward(r, c, dtype.itemsize)
        k = norm_backward[f"norm_backward_{'split_' if plan.split else ''}{plan.kernel}<{CTYPE[dtype]}, false>"]
        rows.append([f"{r} x {c}", str(dtype).replace("torch.", ""),
                     plan.kernel + (", statistics by slices" if plan.split else ""), plan.row_threads, plan.block,
                     f"{plan.tiles} x {plan.grid}" if plan.tiles > 1 else plan.grid, k.resources.registers,
                     k.resources.local_bytes, f"{k.occupancy(plan.block).ratio:.0%}"])
HTML(html_table(["shape", "dtype", "kernel", "row (tile) threads", "block", "grid (tiles x partial rows)",
                 "registers", "local bytes", "occupancy"], rows, caption="LayerNorm backward: launch plans"))

# %% [markdown]
# ### Check on awkward shapes and several distributions
#
# Against PyTorch's own backward in float64, beside PyTorch's backward in the inputs' dtype (the error PyTorch
# itself makes): ours must stay within 2x PyTorch's error plus a rounding of the largest value. Widths that are not
# a multiple of the 16-byte pack (element loads), one row, one column, every plan (a warp, a block of several rows,
# a block of 1024 threads, the long rows in column tiles), and inputs centred at 0, at a mean of 1,000, and heavy-tailed
# (Student's t with 3 degrees of freedom, whose largest values are many times the spread).

# %%
def check_backward(shapes, device, seeds=(0,)):
    """Every op, dtype and distribution at `shapes`: asserts ours within 2x PyTorch's error (backward_passes);
    a table of the largest errors, ours / PyTorch's."""
    out = []
    for kind in ("layernorm", "rmsnorm"):
        for dtype in (torch.float32, torch.bfloat16):
            for dist in ("normal", "mean1e3", "heavy"):
                worst = {}
                for (r, c), seed in ((s, k) for s in shapes for k in seeds):
                    dy, x, w, b = bwd_inputs(r, c, dtype, dist, device, seed)
                    errors = backward_errors(kind, dy, x, w, b, EPS)
                    assert backward_passes(errors, dtype), (kind, dtype, dist, r, c, errors)
                    for name, (ours, theirs, _) in errors.items():
                        o, t = worst.get(name, (0.0, 0.0))
                        worst[name] = (max(o, ours), max(t, theirs))
                out.append([kind, str(dtype)[6:], dist] + [f"{o:.2g} / {t:.2g}" for o, t in worst.values()]
                           + ([""] if kind == "rmsnorm" else []))
    return HTML(html_table(["op", "dtype", "x", "dx: ours / PyTorch's", "dw", "db"], out,
                           caption="largest |error| against float64 at " + ", ".join(f"{r}x{c}" for r, c in shapes)))


# %%
# %%gpu
BWD_SHAPES = [(1, 1), (3, 7), (1, 1031), (6, 1031), (37, 768), (64, 1024), (5, 4099), (9, 8192), (3, 9000),
              (2, 40000), (1000, 1031)]
check_backward(BWD_SHAPES, "cuda", seeds=(0, 1))

# %%
# %%cpu
check_backward([(1, 1), (3, 7), (2, 1031), (3, 1024)], "cpu")     # small for the CPU path: element and pack loads

# %% [markdown]
# ### Against PyTorch's backward, eager and `torch.compile`
#
# Each timed as called: ours the launcher `layernorm_backward(dy, x, w)` (both kernels and the partial buffer's
# allocation); PyTorch's the backward alone, `torch.autograd.grad(y, (x, w, b), dy)` on a graph built once, eager
# and compiled (`torch.compile` of the forward, whose backward Inductor compiles too). The bytes are the
# `3 * rows * cols * itemsize` the backward cannot avoid.

# %%
# %%gpu
def bench_backward(kind, dtype, shapes=SHAPES, rep_ms=30):
    """{shape: BenchResult} of ours against PyTorch's backward, eager and compiled, at each shape."""
    results = {}
    for r, c in shapes:
        dy, x, w, b = bwd_inputs(r, c, dtype)
        leaves = [t.detach().requires_grad_(True) for t in ((x, w, b) if kind == "layernorm" else (x, w))]
        fwd = torch_layernorm if kind == "layernorm" else torch_rmsnorm
        fwd_c = torch_layernorm_compiled if kind == "layernorm" else torch_rmsnorm_compiled
        y_eager, y_compiled = fwd(*leaves), fwd_c(*leaves)
        ours = (lambda: layernorm_backward(dy, x, w, EPS)) if kind == "layernorm" else \
            (lambda: rmsnorm_backward(dy, x, w, EPS))
        results[(r, c)] = kernellab.bench(
            ours, (), bytes=3 * r * c * x.element_size(), rep_ms=rep_ms, warmup_ms=10, rotate=False,
            name=f"{kind} backward",
            baselines={"torch eager": lambda: torch.autograd.grad(y_eager, leaves, dy, retain_graph=True),
                       "torch.compile": lambda: torch.autograd.grad(y_compiled, leaves, dy, retain_graph=True)})
    return results


bwd_sweep = {(kind, dt): bench_backward(kind, dt) for kind in ("layernorm", "rmsnorm") for dt in DTYPES}
display(*[HTML(sweep_table(res, f"{kind} backward, {str(dt)[6:]}, {ln_result.device}", COPY_GBPS))
          for (kind, dt), res in bwd_sweep.items()])

# %% [markdown]
# Against the prediction: the cell below prints, per op and dtype, the worst ratios and the fraction of the copy
# bandwidth at the register-held shapes and at the long rows (column tiles).

# %%
# %%gpu
for (kind, dt), sweep in bwd_sweep.items():
    held = [res for (r, c), res in sweep.items() if plan_backward(r, c, dt.itemsize).kernel == "rows"]
    long = [res for (r, c), res in sweep.items() if plan_backward(r, c, dt.itemsize).kernel == "tiles"]
    for label, part in (("rows in registers", held), ("long rows, column tiles", long)):
        if part:
            print(f"{kind} backward {str(dt)[6:]}, {label}: "
                  f"{min(r.speedup('torch eager').ratio for r in part):.2f}-"
                  f"{max(r.speedup('torch eager').ratio for r in part):.2f}x eager, "
                  f"{min(r.speedup('torch.compile').ratio for r in part):.2f}-"
                  f"{max(r.speedup('torch.compile').ratio for r in part):.2f}x torch.compile, "
                  f"{min(r.gbps for r in part) / COPY_GBPS:.0%}-{max(r.gbps for r in part) / COPY_GBPS:.0%} of copy")

# %% [markdown]
# ## From the notebook into a model: LayerNorm and RMSNorm as PyTorch ops
#
# `kernellab.op` registers each launcher as a PyTorch operator through `torch.library`: a schema, the launcher as
# the CUDA implementation, and a fake implementation made from `outputs=` (the output is shaped like `x`), which
# `torch.compile(fullgraph=True)` and `torch.export` trace instead of running the kernel. Launches inside an op
# do not wait for their kernel (`kernellab.set_launch_blocking(True)` makes them wait, to find a fault).
#
# With `backward=` an op is differentiable: `setup_context` saves `x` and `w` (the statistics are recomputed, as
# above), and the backward calls two more ops, `kl::layernorm_backward` and `kl::rmsnorm_backward`, the launchers
# of the backward section (an op's backward is traced like its forward, so it calls ops, not launchers). The ops take
# any number of leading dimensions (`[batch, sequence, d_model]` as a model has them), folded into rows, and run on
# CPU tensors too, through kernellab's CPU path, so that the notebook and the tests run them without a GPU.

# %%
# launchers: ops (kl::layernorm, kl::rmsnorm and their backward ops; other scripts take them from load_tutorial)
import kernellab
import torch


def _rows2d(x):
    """x as rows x cols (cols its last dimension): the kernels' 2-D view (x itself when it is 2-D)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _shaped_like(y, x):
    """The kernels' 2-D result y in x's shape (y itself when x is 2-D)."""
    return y if x.dim() == 2 else y.reshape(x.shape)


@kernellab.op("kl::layernorm_backward", "(Tensor dy, Tensor x, Tensor w, float eps) -> (Tensor, Tensor, Tensor)",
              outputs=lambda dy, x, w, eps: (x, w, w), device_types=("cuda", "cpu"))
def kl_layernorm_backward(dy, x, w, eps):
    """(dx, dw, db) of LayerNorm over the last dimension, by the backward kernels above."""
    if x.dim() == 2:                         # a call per layer and step: no helper calls for the 2-D case
        return _norm_backward("layernorm", dy, x, w, eps, True)
    dx, dw, db = layernorm_backward(_rows2d(dy), _rows2d(x), w, eps)
    return _shaped_like(dx, x), dw, db


@kernellab.op("kl::rmsnorm_backward", "(Tensor dy, Tensor x, Tensor w, float eps) -> (Tensor, Tensor)",
              outputs=lambda dy, x, w, eps: (x, w), device_types=("cuda", "cpu"))
def kl_rmsnorm_backward(dy, x, w, eps):
    """(dx, dw) of RMSNorm over the last dimension, by the backward kernels above."""
    if x.dim() == 2:
        return _norm_backward("rmsnorm", dy, x, w, eps, False)
    dx, dw = rmsnorm_backward(_rows2d(dy), _rows2d(x), w, eps)
    return _shaped_like(dx, x), dw


def _save_x_w(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])          # x and w; the statistics are recomputed from x
    ctx.eps = inputs[-1]


def _layernorm_grad(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw, db = kl_layernorm_backward(dy, x, w, ctx.eps)
    return dx, dw, db, None


def _rmsnorm_grad(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw = kl_rmsnorm_backward(dy, x, w, ctx.eps)
    return dx, dw, None


@kernellab.op("kl::layernorm", "(Tensor x, Tensor w, Tensor b, float eps) -> Tensor", outputs=lambda x, w, b, eps: x,
              backward=_layernorm_grad, setup_context=_save_x_w, device_types=("cuda", "cpu"))
def kl_layernorm(x, w, b, eps):
    """F.layer_norm over the last dimension, by the kernels above; differentiable."""
    if x.dim() == 2:
        return layernorm(x, w, b, eps=eps)
    return _shaped_like(layernorm(_rows2d(x), w, b, eps=eps), x)


@kernellab.op("kl::rmsnorm", "(Tensor x, Tensor w, float eps) -> Tensor", outputs=lambda x, w, eps: x,
              backward=_rmsnorm_grad, setup_context=_save_x_w, device_types=("cuda", "cpu"))
def kl_rmsnorm(x, w, eps):
    """F.rms_norm over the last dimension, by the kernels above; differentiable."""
    if x.dim() == 2:
        return rmsnorm(x, w, eps=eps)
    return _shaped_like(rmsnorm(_rows2d(x), w, eps=eps), x)


# %%
# The fake implementations need no GPU: meta tensors carry shapes and dtypes, no values.
meta_x, meta_w = (torch.empty(s, device="meta", dtype=torch.bfloat16) for s in ((8, 4096), (4096,)))
print(kl_layernorm(meta_x, meta_w, meta_w, 1e-5).shape, kl_rmsnorm(meta_x, meta_w, 1e-5).shape)

# %% [markdown]
# Each op goes into a small transformer block (`kernellab.teach.block.TransformerBlock`: norm, causal SDPA
# attention, a residual, norm, a 4x GELU MLP, a residual), d_model = 4096, 32 heads, 4 x 512 tokens in bf16:
# one block with LayerNorm, one with RMSNorm, each against the same block with PyTorch's norm, eager and under
# `torch.compile`.
#
# **Prediction.** Each norm reads and writes [2048, 4096] bf16, 32 MB for the two of a block, about 10 µs
# at 3.3 TB/s, next to some 820 GFLOP of matmuls (about 1.3 ms on an H100): whatever our norms gain, the block
# moves by less than 1 %, so 0.99-1.01x the eager block. `torch.compile` fuses the reference's residual add into
# its norm, which our op cannot join: the compiled reference may be a few µs ahead, still within 1 %.

# %%
# %%gpu
import copy

from kernellab.teach.block import TransformerBlock, max_errors

torch.manual_seed(0)
x_block = torch.randn(4, 512, 4096, device="cuda", dtype=torch.bfloat16)
block_results = {}
for norm, op in (("layernorm", kl_layernorm), ("rmsnorm", kl_rmsnorm)):
    cfg = dict(d_model=4096, n_heads=32, norm=norm, device="cuda", dtype=torch.bfloat16)
    reference = TransformerBlock(**cfg).requires_grad_(False)
    with torch.no_grad():                          # weights and biases of the norms that are not 1 and 0
        for name, p in reference.named_parameters():
            if name.startswith("norm"):
                p.add_(0.1 * torch.randn_like(p))
    ours = TransformerBlock(**cfg, norm_op=op).requires_grad_(False)
    ours.load_state_dict(reference.state_dict())
    ours_compiled = torch.compile(ours, fullgraph=True)       # one graph, or an error: no graph breaks
    reference_compiled = torch.compile(reference, fullgraph=True)
    want = copy.deepcopy(reference).double()(x_block.double())
    err, torch_err = max_errors(ours_compiled(x_block), reference(x_block), want)
    print(f"{norm}: max |error| against float64: ours {err:.3g}, PyTorch's block {torch_err:.3g}")
    assert err <= 2 * torch_err + 1e-2, f"the block with kl::{norm} is off"
    block_results[norm] = kernellab.bench(
        ours_compiled, (x_block,), name=f"block with kl::{norm}, torch.compile",
        baselines={"PyTorch block": reference, "PyTorch block, torch.compile": reference_compiled})
    del want
for norm, r in block_results.items():
    print(f"{norm}: " + ", ".join(f"{s.ratio:.3f}x {s.baseline}" for s in r.speedups) + " (kernellab.bench)")
block_results["rmsnorm"]

# %% [markdown]
# ## The residual add fused into the norm
#
# In a pre-norm transformer block every LayerNorm but the model's first reads the residual stream just after an
# add: `h = x + attn(ln_1(x))`, then `ln_2(h)` feeds the MLP, and `h + mlp(ln_2(h))` goes on to the next block's
# `ln_1`. Under bf16 autocast the stream `x` is float32 and the branch's output `r` (its last matmul's) bf16:
# `h = x + r` goes on in float32 and `y = LayerNorm(h)` feeds the next matmul in bf16. `torch.compile` sees the add,
# `F.layer_norm` and autocast's cast as one graph and fuses them into one kernel forward and one backward.
# `kl::layernorm` is an op whose inside Inductor cannot see: around it the add, the cast of `y`, and in the backward
# the cast of `dy`, the add of the stream's gradient and the cast of the branch's gradient stay kernels of their own,
# each a round trip of the rows through DRAM. In tutorial 08's GPT-2 training step that is what kept kernellab's
# compiled, graphed step below `torch.compile`'s. The remedy is an op of the whole pattern:
#
#     h, y = kl::add_layernorm(x, r, w, b, eps)    # h = x + r in x's dtype, y = LayerNorm(h) * w + b in r's dtype
#
# kernellab ships it: `kernellab.teach.add_norm` registers the op (and `kl::add_layernorm_backward`), its device code
# is `<kl/add_norm.cuh>`, and `kernellab.teach.gpt.GPT` takes it as `add_norm_op=`. This section counts what it saves,
# shows its kernels and their cards, checks it on awkward shapes and times it against the separate add and
# `kl_layernorm`, and against `torch.compile`.
#
# ### Bytes, separately and fused
#
# Per element of a `rows x cols` stream, with `X` bytes an element of the stream (4: float32) and `R` of the branch
# (2: bf16); `w`, `b` and the partial sums of `dw`, `db` are `cols` values, left out:
#
# | | separately: x + r, kl_layernorm, autocast's casts | bytes | fused: kl::add_layernorm | bytes |
# |---|---|---|---|---|
# | forward | add (read x, r; write h); norm (read h; write y in X); cast y to R | `5X + 2R` = 24 | read x, r; write h, y | `2X + 2R` = 12 |
# | backward | cast dy to X; norm backward (read dy, h; write dx) and its finish; dh_out + dx; cast dh to R for dr | `8X + 2R` = 36 | read dy, dh_out, h; write dh, dr | `3X + 2R` = 16 |
# | kernels | 3 forward, 5 backward | | 1 forward, 2 backward (the finish of `dw`, `db`) | |
#
# 60 bytes an element against 28: the fused op moves 2.1x fewer. Where the branch has the stream's dtype (bf16 and
# bf16) the casts go, and `dh` serves as `dr`: 22 against 16 bytes an element (1.4x), 5 kernels against 3. The
# prediction is these bytes at 3 TB/s plus 2.5 µs a kernel launch (`kernellab.teach.add_norm.model_us`, written
# before any GPU ran the op); the cell below counts them and checks the count against that model.

# %%
# bytes: add + LayerNorm forward and backward, separately and fused, and the prediction from them
def add_norm_bytes(rows, cols, x_bytes=4, r_bytes=2):
    """{variant: (forward bytes, backward bytes, kernels)} of x + r then LayerNorm over rows x cols: "add +
    kl_layernorm" (the add, kl_layernorm, autocast's casts where r's dtype is not x's) and "fused" (kl::add_layernorm;
    torch.compile's fused kernels move the same bytes)."""
    n, X, R = rows * cols, x_bytes, r_bytes
    casts = int(R != X)
    cast = casts * (X + R)                         # read one dtype, write the other
    separate_fwd = (X + R + X) + (X + X) + cast    # add; kl_layernorm (y in x's dtype); y cast to r's dtype
    separate_bwd = cast + 3 * X + 3 * X + cast     # dy cast back; norm backward (dy, h -> dx); dh_out + dx; dr cast
    fused_fwd = X + R + X + R                      # read x, r; write h, y
    fused_bwd = R + X + X + X + casts * R          # read dy, dh_out, h; write dh (and dr where R is not X)
    return {"add + kl_layernorm": (n * separate_fwd, n * separate_bwd, 5 + 3 * casts),
            "fused": (n * fused_fwd, n * fused_bwd, 3)}


def add_norm_prediction_us(rows, cols, x_bytes=4, r_bytes=2, tbps=3.0, launch_us=2.5):
    """{variant: µs} of a forward + backward: the bytes at `tbps` TB/s plus `launch_us` a kernel."""
    return {name: (fwd + bwd) / (tbps * 1e6) + launch_us * kernels
            for name, (fwd, bwd, kernels) in add_norm_bytes(rows, cols, x_bytes, r_bytes).items()}


from kernellab.teach import add_norm as an

rows_gpt, cols_gpt = 16384, 768                    # GPT-2 small's batch: 16 x 1024 tokens of 768
add_norm_rows = []
for xt, rt in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)):
    counted = add_norm_bytes(rows_gpt, cols_gpt, xt.itemsize, rt.itemsize)
    predicted = add_norm_prediction_us(rows_gpt, cols_gpt, xt.itemsize, rt.itemsize)
    model = an.model_us(rows_gpt, cols_gpt, xt.itemsize, rt.itemsize)
    assert all(math.isclose(predicted[k], model[k]) for k in predicted), (predicted, model)
    for name, (fwd, bwd, kernels) in counted.items():
        add_norm_rows.append([f"{str(xt)[6:]} + {str(rt)[6:]}", name, f"{fwd / 1e6:.0f}", f"{bwd / 1e6:.0f}",
                              kernels, f"{predicted[name]:.1f}"])
HTML(html_table(["stream + branch", "variant", "forward MB", "backward MB", "kernels", "predicted µs"],
                add_norm_rows, caption=f"add + LayerNorm at {rows_gpt} x {cols_gpt}: bytes, and the prediction at "
                                       f"3 TB/s + 2.5 µs a kernel (equal to kernellab.teach.add_norm.model_us)"))

# %% [markdown]
# ### The kernels
#
# The fused op is two row kernels built like this tutorial's own, kept in `<kl/add_norm.cuh>` because the GPT model
# and the training script share them:
#
# - `add_layernorm_rows<T, R, 1>`: 8 columns a thread, a row's threads a multiple of 32 (not only a power of two: 768
#   columns are 96 threads, 3 warps, none idle), up to 256 threads a block (2 rows of 768). Each thread loads its 8
#   values of `x` and `r` (16-byte loads where the row is aligned), with `w` and `b` in flight beside them, stores
#   `h = x + r` rounded to `T`, and keeps that rounded `h` in registers: the statistics are those of `h` as stored, so
#   the backward, which reads `h` back, recomputes the same ones. The mean, then the squared deviations from it in a
#   second pass over the registers; the sum of the deviations measures the first mean's rounding and corrects it
#   (the backward section's remedy for a mean of 1,000).
# - `add_layernorm_backward_rows<T, R, Chunks>`: the backward section's `norm_backward_rows` scheme (the statistics
#   recomputed from `h`, `dw` and `db` added up in registers over a loop of rows, one partial row a block, one wave
#   of resident blocks), with `dh_out` asked into L1 (`prefetch_l1`) before the row's two reductions, so that its
#   load is in flight while they run, and `dh = dh_out + dx` stored once as `T` and once rounded to `R` for the
#   branch. `add_norm_finish<T>` adds up the partial rows in a fixed order: the same bits every run.
#
# The forward and the backward's main kernel as the header has them:

# %%
import pathlib
import re

from kernellab.compile.toolkit import KL_INCLUDE


def device_function(header, name):
    """`name`'s definition in kernellab's <kl/header>: the comment above its template line, up to its closing brace."""
    lines = pathlib.Path(KL_INCLUDE, "kl", header).read_text().splitlines()
    at = next(i for i, line in enumerate(lines)
              if re.search(rf"\b{name}\(", line) and not line.lstrip().startswith("//"))
    start = next(i for i in range(at, -1, -1) if lines[i].startswith("template"))
    while start > 0 and lines[start - 1].startswith("//"):
        start -= 1
    end = next(i for i in range(at, len(lines)) if lines[i] == "}")
    return "\n".join(lines[start:end + 1])


print(device_function("add_norm.cuh", "add_layernorm_rows"))
print()
print(device_function("add_norm.cuh", "add_layernorm_backward_rows"))

# %% [markdown]
# Compiled through kernellab like a `%%cuda` cell (`kernellab.teach.add_norm.SOURCE`: the header and an
# instantiation for each pair of dtypes), the card of every kernel: registers, spills, occupancy. Then the launch
# plans at GPT-2's shape and at this tutorial's widths, with the registers and occupancy of the kernel each plan
# launches (a CPU test checks there are no spills and that the row kernels use 16-byte accesses).

# %%
add_norm_module = kernellab.compile_cuda(an.SOURCE, filename="add_norm.cu", name="kl/add_norm.cuh")
display(add_norm_module)
add_norm_plans = []
for n_rows, n_cols in ((16384, 768), (4096, 1024), (4096, 4096), (1000, 1031), (9, 8192)):
    row_threads, block, grid = an.plan_forward(n_rows, n_cols)
    chunks, b_row_threads, b_block, b_grid = an.plan_backward(n_rows, n_cols, SMS)
    fwd = add_norm_module["add_layernorm_rows<float, __nv_bfloat16, 1>"]
    bwd = add_norm_module[f"add_layernorm_backward_rows<float, __nv_bfloat16, {chunks}>"]
    add_norm_plans.append([f"{n_rows} x {n_cols}", f"{row_threads} / {block} / {grid}", fwd.resources.registers,
                           f"{fwd.occupancy(block).ratio:.0%}", f"{chunks} / {b_row_threads} / {b_block} / {b_grid}",
                           bwd.resources.registers, f"{bwd.occupancy(b_block).ratio:.0%}"])
HTML(html_table(["shape", "forward: row threads / block / grid", "registers", "occupancy",
                 "backward: chunks / row threads / block / grid", "registers", "occupancy"], add_norm_plans,
                caption="kl::add_layernorm, float32 stream + bf16 branch: launch plans"))

# %% [markdown]
# ### Prediction
#
# Written before a GPU ran the op, from the bytes above at 3 TB/s plus 2.5 µs a kernel, at 16384 x 768, forward and
# backward of one add and norm as a training step calls it:
#
# - float32 stream and bf16 branch: fused 124.9 µs (forward 52.8, backward 72.1) against 271.7 µs for the add and
#   `kl_layernorm` with autocast's casts: 2.2x. `torch.compile` fuses the same pattern and moves the same bytes, so
#   par with it, 1.0x.
# - bf16 and bf16: fused 74.6 µs (forward 36.1, backward 38.6) against 104.8 µs, 1.4x; par with `torch.compile`.
#
# ### Check on awkward shapes
#
# Forward and backward through autograd, as a model calls the op: `h`, `y` and the gradients of `x`, `r`, `w`, `b`
# (with a gradient of `h` from later in the stream, as every block but the last has) against PyTorch's `x + r` and
# `F.layer_norm` in float64, beside PyTorch's own error in the inputs' dtypes; ours must stay within 2x PyTorch's
# error plus a rounding of the largest value. Every pair of dtypes the op takes, widths that are not a multiple of
# the 8-column chunk (element loads), one element, several rows a block, the widest row (8192: two chunks a thread in
# the backward), and the stream centred at 0 and at 1,000.

# %%
ADD_NORM_PAIRS = ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32))


def add_norm_inputs(rows, cols, xt, rt, dist="normal", device="cuda", seed=0):
    """x (xt), r (rt), w, b (xt), dy (rt), dh_out (xt): x ~ N(0, 1) or N(1000, 1) ("mean1e3"), r, dy, dh_out ~ N(0, 1),
    w ~ N(1, 0.5), b ~ N(0, 1) (the tests' inputs, kernellab.teach.add_norm.make_inputs)."""
    return an.make_inputs(rows, cols, xt, rt, dist, device, seed)


def add_norm_torch(x, r, w, b):
    """PyTorch's add and norm: (x + r, F.layer_norm(x + r) in r's dtype), autocast's cast included."""
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, EPS).to(r.dtype)


def add_norm_fused(x, r, w, b):
    return an.kl_add_layernorm(x, r, w, b, EPS)


def add_norm_grads(fn, x, r, w, b, dy, up, dtype=None):
    """(h, y, dx, dr, dw, db) of fn(x, r, w, b) -> (h, y) with gradients (up, dy), in `dtype` (None: the inputs')."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (x, r, w, b)]
    h, y = fn(*leaves)
    return [h.detach(), y.detach(), *torch.autograd.grad([h, y], leaves, [up.to(h.dtype), dy.to(y.dtype)])]


def check_add_norm(shapes, device):
    """Every dtype pair and stream at `shapes`: asserts ours within 2x PyTorch's error (plus a rounding of the
    largest value); a table of the largest errors, ours / PyTorch's."""
    out = []
    for xt, rt in ADD_NORM_PAIRS:
        for dist in ("normal", "mean1e3"):
            worst = {}
            for r, c in shapes:
                args = add_norm_inputs(r, c, xt, rt, dist, device)
                ours = add_norm_grads(add_norm_fused, *args)
                want = add_norm_grads(add_norm_torch, *args, dtype=torch.float64)
                theirs = add_norm_grads(add_norm_torch, *args)
                for name, o, t, f in zip(("h", "y", "dx", "dr", "dw", "db"), ours, theirs, want):
                    err, torch_err, scale = ((o.double() - f).abs().max().item(), (t.double() - f).abs().max().item(),
                                             f.abs().max().item())
                    floor = 2.0 ** -8 if o.dtype == torch.bfloat16 else 1e-6
                    assert err <= 2 * torch_err + floor * max(scale, 1.0), (xt, rt, dist, r, c, name, err, torch_err)
                    e, t_e = worst.get(name, (0.0, 0.0))
                    worst[name] = (max(e, err), max(t_e, torch_err))
            out.append([f"{str(xt)[6:]} + {str(rt)[6:]}", dist] + [f"{e:.2g} / {t:.2g}" for e, t in worst.values()])
    return HTML(html_table(["stream + branch", "x", "h: ours / PyTorch's", "y", "dx", "dr", "dw", "db"], out,
                           caption="kl::add_layernorm: largest |error| against float64 at "
                                   + ", ".join(f"{r}x{c}" for r, c in shapes)))


# %%
# %%gpu
check_add_norm([(1, 1), (3, 7), (1, 1031), (6, 1031), (37, 768), (64, 1024), (5, 4099), (9, 8192), (1000, 1031),
                (16384, 768)], "cuda")

# %%
# %%cpu
check_add_norm([(1, 1), (3, 7), (2, 1031), (5, 768)], "cpu")     # small for the CPU path: element and 16-byte loads

# %% [markdown]
# ### Against the add and `kl_layernorm`, and `torch.compile`
#
# Each timed as called by `kernellab.bench`: the forward and then `torch.autograd.grad([h, y], [x, r, w, b],
# [dh_out, dy])`, what a training step runs for one add and norm. `add + kl_layernorm` is `x + r`, this tutorial's
# `kl_layernorm` and the cast to the branch's dtype; `torch.compile` compiles `add_norm_torch` (Inductor fuses the
# add, the norm and the cast, forward and backward); `torch eager` runs it as it is. The bytes are the fused op's
# (the least any of them must move); then the fused op's forward alone and its backward op alone, each beside its
# prediction.

# %%
# %%gpu
def bench_add_norm(xt, rt, rows=rows_gpt, cols=cols_gpt, rep_ms=30):
    """(BenchResult of the fused forward + backward against the others, BenchResult of its forward and backward)."""
    x, r, w, b, dy, up = add_norm_inputs(rows, cols, xt, rt)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, r, w, b)]

    def separate(x, r, w, b):
        h = x + r
        return h, kl_layernorm(h, w, b, EPS).to(r.dtype)

    def step(fn):
        def run():
            h, y = fn(*leaves)
            return torch.autograd.grad([h, y], leaves, [up, dy])
        return run
    compiled = torch.compile(add_norm_torch, dynamic=False)
    calls = {name: step(fn) for name, fn in (("add + kl_layernorm", separate), ("torch.compile", compiled),
                                             ("torch eager", add_norm_torch))}
    calls["torch.compile"]()                       # Inductor compiles the forward and the backward here
    fused_fwd, fused_bwd, _ = add_norm_bytes(rows, cols, xt.itemsize, rt.itemsize)["fused"]
    both = kernellab.bench(step(add_norm_fused), (), bytes=fused_fwd + fused_bwd, rep_ms=rep_ms, warmup_ms=10,
                           rotate=False, name="fused", baselines=calls)
    with torch.no_grad():
        h, _ = an.kl_add_layernorm(x, r, w, b, EPS)
        halves = kernellab.bench(lambda: an.kl_add_layernorm(x, r, w, b, EPS), (), bytes=fused_fwd, rep_ms=rep_ms,
                                 warmup_ms=10, rotate=False, name="fused forward",
                                 baselines={"fused backward": lambda: an.kl_add_layernorm_backward(dy, up, h, w, EPS)})
    return both, halves


add_norm_results = {(xt, rt): bench_add_norm(xt, rt) for xt, rt in ADD_NORM_PAIRS[:2]}
table = []
for (xt, rt), (both, halves) in add_norm_results.items():
    model = an.model_us(rows_gpt, cols_gpt, xt.itemsize, rt.itemsize)
    fused_us = both.median_ms * 1e3
    measured = {"fused": fused_us, **{bl.name: bl.median_ms * 1e3 for bl in both.baselines},
                "fused forward": halves.median_ms * 1e3, **{bl.name: bl.median_ms * 1e3 for bl in halves.baselines}}
    for name, us in measured.items():
        table.append([f"{str(xt)[6:]} + {str(rt)[6:]}", name, f"{us:.1f}", f"{model[name]:.1f}" if name in model
                      else "-", f"{us / fused_us:.2f}x" if "ward" not in name else ""])
HTML(html_table(["stream + branch", "variant", "µs (kernellab.bench)", "predicted µs", "time / fused's"], table,
                caption=f"add + LayerNorm forward + backward at {rows_gpt} x {cols_gpt}, {both.device}"))

# %% [markdown]
# ### Discussion
#
# Measured on an NVIDIA H200 (`python3 benchmarks/add_norm.py --quick --dtypes float32:bfloat16,bfloat16:bfloat16`,
# the same calls as the cell above), every figure kernellab.bench's median a forward and backward; in brackets each
# variant's time / the fused op's:
#
# | stream + branch | fused | add + kl_layernorm | torch.compile | torch eager | prediction (fused) |
# |---|---|---|---|---|---|
# | float32 + bf16 | **114.8 µs** | 264.4 µs (2.30x) | 126.7 µs (1.10x) | 335.1 µs (2.92x) | 124.9 µs |
# | bf16 + bf16 | **104.9 µs** | 120.3 µs (1.15x) | 86.4 µs (0.82x) | 188.5 µs (1.80x) | 74.6 µs |
#
# With a float32 stream, the case a bf16-autocast model runs, the prediction held: the fused op ran 114.8 µs against
# 124.9 predicted (forward 46.1 against 52.8, backward 72.8 against 72.1), 2.30x the separate add and `kl_layernorm`
# (264.4 µs against 271.7 predicted: the bytes count was right for both), and 1.10x `torch.compile`, which moves the
# same bytes. In bf16 and bf16 it misses: 104.9 µs against 74.6 predicted, 1.15x the separate ops but 0.82x
# `torch.compile` (86.4 µs). The forward is near its prediction (42.8 against 36.1 µs); the backward is not (65.6
# against 38.6 µs). With 2-byte `h`, `dy` and `dh_out` a row of 768 is 1.5 KB a tensor, and each row still pays two
# reductions across 3 warps with their barriers: at half the float32 stream's bytes the backward takes 90 % of its
# time, which points at those rounds rather than at DRAM. It is not profiled yet; a row kernel that overlaps one
# row's reductions with the next row's loads is the step to measure.
#
# Timed as called by `triton.testing.do_bench` instead, the fused op and `torch.compile` are host-bound: 424.3 and
# 432.8 µs a forward and backward (sustained, back to back: 387.0 and 644.2 µs), the CPU's time for the Python of
# the calls and autograd's nodes, against 114.8 and 126.7 µs of GPU work; the separate ops' 8 kernels keep the GPU
# busy longer than the host needs (263.9 µs by do_bench, their kernellab.bench time). So the gain shows in a
# training step when its launches are captured. The GPT-2 small training run (`benchmarks/train_gpt2.py`, 200 steps
# of 16 x 1024 tokens on an H200, each step time the median after the first 10 steps) measured
# `kernellab-fused-compiled-graphs` (`torch.compile`, our attention and norms with every residual add fused into its
# norm, the step as one CUDA graph) at **27.50 ms** a step: 1.055x `torch.compile` (29.00 ms) and 1.047x
# `compiled-graphs` (28.80 ms, PyTorch's model compiled and graphed), where `kernellab-compiled-graphs`, the same
# without the fused op, ran 29.65 ms (0.978x `torch.compile`). Its loss curve stays inside eager PyTorch's seed band
# (its largest distance from `eager`, 10-step means, 0.0022 against 0.1285 between seeds 0 and 1). Without graphs
# (`kernellab-fused`, 42.42 ms, 0.859x eager) the host's Python sets the step's pace, as above.
#
# Things to try: time the fused op at 4096 x 4096, where a float32 row is 16 KB and the reductions' rounds weigh
# less; give the bf16 backward more rows a block (`plan_backward`'s groups) and watch whether it closes on its
# 38.6 µs; put `kl::add_layernorm` in `kernellab.teach.block.TransformerBlock` above (its `add_norm_op=`) and
# compare the block against `torch.compile`'s.
