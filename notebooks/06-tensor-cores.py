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
# # 06 · Tensor cores: from WMMA to wgmma
#
# **What you will learn**
# - what a tensor core computes (a small matrix product per instruction, bf16 or fp16 in, fp32 accumulate) and why a
#   matmul on them is bound by feeding them: bytes from global memory, wavefronts from shared memory, latency;
# - four kernels for `C = A Bᵀ`, each a step: WMMA (the C++ fragment API) → `mma.sync` m16n8k16 with fragments from
#   `ldmatrix` → a `cp.async` pipeline several stages deep with a swizzled shared layout → on Hopper, `wgmma` fed
#   by the tensor memory accelerator (TMA) with `mbarrier`s, a producer warpgroup and two consumers, and a tile order
#   that keeps L2 warm;
# - which instructions each step's SASS holds (`HMMA` or `HGMMA`, `LDSM`, `LDGSTS` or `UTMALDG`), the banks of the
#   shared tiles before and after the swizzle, and what Nsight Compute says the tensor pipe does;
# - on a GPU: check every step in both dtypes on awkward shapes and time it against `torch.matmul` (cuBLAS) in the
#   same run: the `mma.sync` pipeline should reach 60 % of cuBLAS, the Hopper kernel 95 % (100 % the goal);
# - write a WMMA tile and an `mma.sync` fragment load yourself (exercises 06-wmma-tile and 06-mma-fragments).
#
# Without a GPU, Run All still reaches the end: compiling (the Hopper kernel for `sm_90a`), the cards, the SASS, the
# bank model and the tile-size arithmetic all run; each cell marked `%%gpu` says in one line that it was skipped.

# %%
# %load_ext kernellab
# %matplotlib inline

import re
from collections import Counter

import torch
import torch.nn.functional as F
from IPython.display import HTML, display
from matplotlib.figure import Figure

import kernellab
from kernellab.analysis.arch import get_arch
from kernellab.analysis.banks import analyze_access
from kernellab.analysis.roofline import datasheet_ceilings
from kernellab.compile.sass_summary import opcode_of
from kernellab.report import html_table
from kernellab.run.launch.device import device_info

GPU = kernellab.has_gpu()
DEVICE = torch.cuda.get_device_name() if GPU else "NVIDIA H100 SXM (assumed: no GPU here)"
ARCH = get_arch(device_info().arch if GPU else "sm_90")
SMS = device_info().multiprocessors if GPU else 132
SMEM_OPTIN = device_info().shared_per_block_optin_bytes if GPU else ARCH.shared_memory_per_block_optin_bytes
HOPPER = ARCH.compute_capability == (9, 0)         # wgmma and TMA: sm_90 only (the kernel is built for sm_90a)
print("GPU:", DEVICE, f"({ARCH.name}, {SMS} SMs, {SMEM_OPTIN // 1024} KiB smem per block with opt-in)")

# %% [markdown]
# ## Bytes and FLOPs, and the layout
#
# In bf16 a 4096³ product is the same 137 GFLOP as in tutorial 05, on half the bytes (2 per element): at least
# 101 MB, 1,365 FLOP per byte. The tensor cores of an H100 do about 990 TFLOP/s dense in bf16 and fp16 (15 times the
# FP32 rate), so the arithmetic floor drops to 0.14 ms while memory needs 0.03 ms: still compute-bound, but now a
# kernel has to move operands 15 times faster to keep up. Everything in this tutorial is about feeding the
# tensor cores.
#
# **Layout.** A tensor-core instruction takes A as rows of `k` and B as *columns* of `k` (the `.row.col` of
# `mma.sync`): both operands contiguous along `k`. So `B` here is stored as `[N, K]`, the layout of an `nn.Linear`
# weight, and the kernels compute `C = A Bᵀ`; the baseline is `torch.matmul(A, B.T)`, which cuBLAS runs as the same
# "TN" product. `C` is bf16 (or fp16) like the inputs, accumulated in fp32.

# %%
SIZE = 4096
PEAK = datasheet_ceilings(DEVICE) or datasheet_ceilings("H100 SXM")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mm_flops(A, B, *_):
    """FLOPs of C = A B^T: a multiply and an add per term."""
    return 2 * A.shape[0] * B.shape[0] * A.shape[1]


def mm_bytes(A, B, *_):
    """The fewest bytes: A and B read once, C written once."""
    return A.element_size() * (A.shape[0] * A.shape[1] + B.shape[0] * B.shape[1] + A.shape[0] * B.shape[0])


flops, least_bytes = 2 * SIZE**3, 2 * 3 * SIZE**2
print(f"{SIZE}^3 bf16: {flops / 1e9:.0f} GFLOP, at least {least_bytes / 1e6:.0f} MB: "
      f"{flops / least_bytes:.0f} FLOP/byte")
print(f"floors on {PEAK.device}: bf16 tensor cores {PEAK.bf16_tflops} TFLOP/s -> "
      f"{flops / PEAK.bf16_tflops / 1e9:.3f} ms; "
      f"{PEAK.dram_gbps / 1e3:.2f} TB/s -> {least_bytes / PEAK.dram_gbps / 1e6:.3f} ms; "
      f"the FP32 cores would need {flops / PEAK.fp32_tflops / 1e9:.2f} ms")

# %% [markdown]
# ## The harness
#
# Each step's cell defines a bf16 and an fp16 kernel with the signature `(A, B, C, M, N, K)`. The launcher picks
# the one for the tensors' dtype. The kernels load 16-byte chunks of 8 elements along `k`, so rows must start on
# 16 bytes: `K % 8 == 0`. For any other `K` the launcher pads `A` and `B` with zero columns (zeros add nothing to
# the dot products); `M` and `N` can be anything. `check_step` runs each dtype on shapes chosen to break it against
# a float64 reference, with the output poisoned with NaN; `bench_step` times bf16 at 4096³ against cuBLAS in the
# same run.

# %%
def cdiv(a, b):
    """Blocks needed to cover a with tiles of b."""
    return (a + b - 1) // b


def padded_k(A, B):
    """A [M, K] and B [N, K] with K padded by zero columns to a multiple of 8 (16-byte rows); the new K."""
    K = A.shape[1]
    pad = -K % 8
    if pad:
        A, B = F.pad(A, (0, pad)), F.pad(B, (0, pad))
    return A, B, K + pad


def launcher(kernels, grid, block, shared_bytes=0, args=None, cluster=None):
    """kernels: {dtype: Kernel} -> run(A, B, C) computing C = A B^T; grid(M, N) gives the grid; `args(A, B)` what the
    kernel takes for A and B (tensor maps for the Hopper kernel); `cluster` the thread-block cluster shape."""
    def run(A, B, C):
        M, N = A.shape[0], B.shape[0]
        A, B, K = padded_k(A, B)
        kernel = kernels[A.dtype]
        first = args(A, B, C) if args else (A, B)
        kernel[grid(M, N), block, shared_bytes](*first, C, M, N, K, **({"cluster": cluster} if cluster else {}))
        return C
    run.__name__ = next(iter(kernels.values())).name.rsplit("_", 1)[0]
    return run


def tc_inputs(M, N, K, dtype):
    """inputs(generator): A [M, K], B [N, K] ~ N(0, 1) and C [M, N], all in dtype on the GPU."""
    def make(g):
        return (torch.randn(M, K, generator=g, device="cuda").to(dtype),
                torch.randn(N, K, generator=g, device="cuda").to(dtype), torch.empty(M, N, device="cuda", dtype=dtype))
    return make


def cublas(A, B, C):
    """The baseline: cuBLAS through torch.matmul, on the same K-major operands."""
    return torch.matmul(A, B.T, out=C)


CHECK_SHAPES = [(1, 1, 1), (15, 17, 33), (130, 270, 40), (255, 129, 200), (4095, 4097, 1023)]
results = {}          # step name -> BenchResult (bf16, SIZE^3)


def check_step(fn, shapes=CHECK_SHAPES, isolate=False):
    """Check fn in bf16 and fp16 against a float64 reference on every shape; stop at the first failure. isolate=True
    runs the kernels in a worker process, which is killed if a launch hangs (a wrong mbarrier phase does that)."""
    for name, dtype in DTYPES.items():
        for M, N, K in shapes:
            report = kernellab.check(fn, lambda A, B, C: A @ B.T, tc_inputs(M, N, K, dtype), trials=2,
                                     generator_device="cuda", isolate=isolate)
            if not report.passed:
                print(f"{fn.__name__} FAILS in {name} at {M} x {N} x {K}")
                return report
    print(f"{fn.__name__}: correct in bf16 and fp16 on {', '.join(f'{m}x{n}x{k}' for m, n, k in shapes)}")
    return report


def bench_step(fn, dtype=torch.bfloat16, size=SIZE, keep=True):
    """Time fn at size^3 against cuBLAS in the same run."""
    r = kernellab.bench(fn, tc_inputs(size, size, size, dtype), baselines={"cuBLAS": cublas}, flops=mm_flops,
                        bytes=mm_bytes, generator_device="cuda")
    if keep:
        results[fn.__name__] = r
    print(f"{r.name} {str(dtype)[6:]} {size}^3: {r.median_ms:.3f} ms, {r.tflops:.0f} TFLOP/s = "
          f"{r.speedup('cuBLAS').ratio:.1%} of cuBLAS ({r.baselines[0].median_ms:.3f} ms, "
          f"{r.baselines[0].tflops:.0f} TFLOP/s), {r.device}")
    return r


def compare(name, previous, predicted):
    """One line: the step against the previous one and against the prediction (a fraction of cuBLAS)."""
    r, p = results[name], results.get(previous)
    ratio, (lo, hi) = r.speedup("cuBLAS").ratio, predicted
    verdict = "inside" if lo <= ratio <= hi else ("above" if ratio > hi else "below")
    step = f"{p.median_ms / r.median_ms:.2f}x faster than {previous}; " if p else ""
    print(f"{name}: {step}{ratio:.1%} of cuBLAS, {verdict} the predicted {lo:.0%}-{hi:.0%}")


def sass_line(*kernels):
    """Each kernel's SASS headline: tensor-core instructions, async copies, matrix loads, local memory."""
    for k in kernels:
        print(f"{k.name:16s} {k.resources.registers:3d} regs, {k.resources.local_bytes} B local | "
              f"{k.instruction_summary.headline()}")


# %% [markdown]
# ## Step 1: WMMA
#
# `nvcuda::wmma` is the C++ face of the tensor cores: a warp loads 16 x 16 fragments of A and B
# (`load_matrix_sync`), multiplies them into a 16 x 16 fp32 accumulator (`mma_sync`) and stores it
# (`store_matrix_sync`); which lane holds which element is not specified. The kernel is tutorial 05's step 3 with
# fragments: a block of 8 warps computes a 128 x 128 tile, walking `K` in slices of 32 staged in shared memory
# (rows padded by 16 bytes); each warp owns 32 x 64 of `C`, 2 x 4 fragments. The accumulator layout being opaque, the
# epilogue goes through a 16 x 16 fp32 staging tile per warp to convert and guard the stores.
#
# **Prediction.** Per 16 of `k` a warp loads 6 fragments and issues 8 `mma_sync`s (each two `HMMA.16816`), and the
# loads of the next slice do not start until this one is done: nothing overlaps the global-memory latency but
# other warps (two blocks per SM at most). Expect 20-40 % of cuBLAS.

# %%
# %%cuda --name wmma_cell
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <kl/tile.cuh>      // load_tile: a 16-bit tile into shared memory, zeros past the edges
using namespace nvcuda;

// C[M, N] = A[M, K] B[N, K]^T: A and B both K-major (B as nn.Linear stores its weight), fp32 accumulation.
#define BM 128
#define BN 128
#define BK 32
#define PAD 8                      // 16 bytes per smem row: 80-byte rows keep every 16-row fragment 32-byte aligned
#define NTHREADS 256               // 8 warps, 4 (M) x 2 (N), each a 32 x 64 tile = 2 x 4 WMMA 16x16 tiles

__device__ __forceinline__ __nv_bfloat16 from_float(float x, __nv_bfloat16) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ __half from_float(float x, __half) { return __float2half_rn(x); }

template <typename T>
__device__ void wmma_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(128) T As[BM][BK + PAD];         // As[m][k]
    __shared__ __align__(128) T Bs[BN][BK + PAD];         // Bs[n][k]: a col-major K x N fragment source
    __shared__ __align__(128) float Cs[NTHREADS / 32][16][16];   // one 16x16 fp32 staging tile per warp
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / 2) * 32, wn0 = (warp % 2) * 64;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += BK) {
        load_tile<BM, BK, NTHREADS>(As, A, bm, M, k0, K);
        load_tile<BN, BK, NTHREADS>(Bs, B, bn, N, k0, K);
        __syncthreads();
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[4];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[wm0 + 16 * i][kk], BK + PAD);
            for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(b[j], &Bs[wn0 + 16 * j][kk], BK + PAD);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    // The accumulator layout is opaque: store each tile to smem, then write it out converted, with guards.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wmma::store_matrix_sync(&Cs[warp][0][0], acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            int r = lane / 2, c0 = (lane % 2) * 8;             // each lane: 8 elements of one row
            int row = bm + wm0 + 16 * i + r;
            for (int c = c0; c < c0 + 8; ++c) {
                int col = bn + wn0 + 16 * j + c;
                if (row < M && col < N) C[(size_t)row * N + col] = from_float(Cs[warp][r][c], T());
            }
            __syncwarp();
        }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
wmma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K) {
    wmma_gemm(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS)
wmma_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    wmma_gemm(A, B, C, M, N, K);
}

# %%
sass_line(wmma_bf16, wmma_f16)
wmma = launcher({torch.bfloat16: wmma_bf16, torch.float16: wmma_f16}, lambda M, N: (cdiv(N, 128), cdiv(M, 128)), 256)

# %% [markdown]
# The SASS says something the source does not: for fp16 the fragments come through `LDSM` (`ldmatrix`), for bf16
# through generic 4-byte loads (`LD.E`), which cannot know the address is in shared memory. WMMA leaves the
# instruction choice to the header; the next step takes it.

# %%
# %%gpu
check_step(wmma)
bench_step(wmma)
compare("wmma", None, (0.20, 0.40))

# %% [markdown]
# ### Exercise 06-wmma-tile · One warp, one 16 x 16 tile
#
# Write `wmma_tile(A, B, C, M, N, K)`: fp16 `A` (`M x K`) and `B` (`N x K`), both row-major, and `C = A Bᵀ` in
# fp32 (`M x N`). `M`, `N` and `K` are multiples of 16. One warp per block (32 threads) computes the 16 x 16 tile of
# `C` at row `blockIdx.y * 16`, column `blockIdx.x * 16`, loading its fragments straight from global memory: a
# `matrix_a` fragment `row_major` from `A` (leading dimension `K`), a `matrix_b` fragment from `B`, whose rows are the
# columns of `Bᵀ` (so `col_major`, leading dimension `K`), `mma_sync` over `K` in steps of 16, then
# `store_matrix_sync` into `C` (leading dimension `N`). The grader checks the SASS for `HMMA` without a GPU, and on
# a GPU runs shapes from one tile (16 x 16 x 16) to 512 x 1024 x 1024.

# %%
# %%cuda
// exercise: 06-wmma-tile
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void wmma_tile(const __half* A, const __half* B, float* C, int M, int N, int K) {
    // TODO: fragments of A (row_major) and B (col_major), mma_sync over K in steps of 16, store_matrix_sync to C
}

# %%
kernellab.grade("06-wmma-tile", wmma_tile)

# %% [markdown]
# ## Step 2: `mma.sync` m16n8k16 with `ldmatrix`
#
# The same tiles, written against the instructions themselves, through one-line PTX helpers (kernellab's
# `<kl/mma.cuh>`: `ldmatrix_x4` and `mma_16816<T>`, each one instruction):
# - `ldmatrix.x4`: the warp reads four 8 x 8 matrices of 16-bit elements from shared memory; lane `l` gives the
#   address of row `l % 8` of matrix `l / 8` and receives, of each matrix, row `l / 4`, elements `2 (l % 4)` and
#   `2 (l % 4) + 1`: exactly the register layout `mma.sync` wants.
# - `mma.sync.m16n8k16`: `D (16 x 8, fp32) += A (16 x 16) B (16 x 8)`; lane `l` holds A's rows `l / 4` and `l / 4 + 8`,
#   columns `2 (l % 4)` and `+ 8` (four registers), B's column `l / 4` (two), and D's rows `l / 4` and `l / 4 + 8`,
#   columns `2 (l % 4)` and `+ 1` (four floats).
# - for B stored `[N, K]`, one `ldmatrix.x4` at rows `n0 + (l % 8) + 8 (l / 16)`, column `k0 + 8 ((l / 8) % 2)`
#   yields the two registers of two adjacent n8 tiles.
#
# 8 warps as 2 x 4, each a 64 x 32 tile: per 16 of `k`, 4 `ldmatrix.x4` for A, 2 for B and 16 `mma.sync`.
#
# **Prediction.** The bf16 path now uses `LDSM` like fp16 did, and the accumulators are plain registers (no staging
# tile in the epilogue): 1.2-1.6x over WMMA in bf16. The structure (load, barrier, compute, barrier) is unchanged,
# so it stays far from cuBLAS: 30-50 %.

# %%
# %%cuda --name mma_cell
#include <kl/mma.cuh>      // ldmatrix_x4, mma_16816<T>: the PTX this kernel needs, one instruction per helper
#include <kl/tile.cuh>     // load_tile, store2: tiles in and out, guarded at the edges

#define BM 128
#define BN 128
#define BK 32
#define PAD 8                      // 80-byte smem rows: the 8 rows one ldmatrix reads land in 8 different bank groups
#define NTHREADS 256               // 8 warps, 2 (M) x 4 (N): each warp a 64 x 32 tile = 4 x 4 mma tiles of 16 x 8
#define WM 64
#define WN 32

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

template <typename T>
__device__ void mma_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(128) T As[BM][BK + PAD];
    __shared__ __align__(128) T Bs[BN][BK + PAD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[WM / 16][WN / 8][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        load_tile<BM, BK, NTHREADS>(As, A, bm, M, k0, K);
        load_tile<BN, BK, NTHREADS>(Bs, B, bn, N, k0, K);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)      // rows 0-15 and k 0-7 | 8-15 of a 16 x 16 tile: a0..a3
                ldmatrix_x4(a[i], smem_u32(&As[wm0 + 16 * i + lane % 16][kk + (lane / 16) * 8]));
#pragma unroll
            for (int j = 0; j < WN / 16; ++j) {    // two n8 tiles per ldmatrix: b0, b1 of tile 2j, then of 2j + 1
                unsigned r[4];
                ldmatrix_x4(r, smem_u32(&Bs[wn0 + 16 * j + lane % 8 + (lane / 16) * 8][kk + ((lane / 8) % 2) * 8]));
                b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)
#pragma unroll
                for (int j = 0; j < WN / 8; ++j) mma_16816<T>(acc[i][j], a[i], b[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {        // c0, c1 at (lane / 4, 2 (lane % 4) + 0, 1); c2, c3 eight rows down
            int row = bm + wm0 + 16 * i + lane / 4, col = bn + wn0 + 8 * j + 2 * (lane % 4);
            store2(C, row, col, M, N, acc[i][j][0], acc[i][j][1]);
            store2(C, row + 8, col, M, N, acc[i][j][2], acc[i][j][3]);
        }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K) {
    mma_gemm(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    mma_gemm(A, B, C, M, N, K);
}

# %%
sass_line(mma_bf16, mma_f16)
mma = launcher({torch.bfloat16: mma_bf16, torch.float16: mma_f16}, lambda M, N: (cdiv(N, 128), cdiv(M, 128)), 256)

# %%
# %%gpu
check_step(mma)
bench_step(mma)
compare("mma", "wmma", (0.30, 0.50))

# %% [markdown]
# ### Exercise 06-mma-fragments · Fragments by hand
#
# Write `mma_fragments(A, B, C, M, N, K)`: fp16 `A` (`M x K`), `B` (`N x K`), fp32 `C = A Bᵀ` (`M x N`), `M` a
# multiple of 16, `N` of 8, `K` of 16. One warp per block computes the 16 x 8 tile of `C` at row
# `blockIdx.y * 16`, column `blockIdx.x * 8`, with one `mma.sync.m16n8k16` per 16 of `k` (`mma_16816<__half>` of
# `<kl/mma.cuh>`), loading its registers straight from global memory by the layout above: with `g = lane / 4`,
# `t = lane % 4`, `a[0]` holds `A[g][2t, 2t + 1]`, `a[1]` `A[g + 8][2t, 2t + 1]`, `a[2]` `A[g][2t + 8, 2t + 9]`,
# `a[3]` `A[g + 8][2t + 8, 2t + 9]` (two halves in one 32-bit register, the lower column in the low half: one
# 4-byte load), `b[0]` holds `B[g][2t, 2t + 1]` and `b[1]` `B[g][2t + 8, 2t + 9]` (rows of `B` are columns of
# `Bᵀ`), all relative to the tile's corner and `k`; `d[0], d[1]` go to `C[g][2t, 2t + 1]` and `d[2], d[3]` to
# `C[g + 8][2t, 2t + 1]`. The grader checks the SASS for `HMMA` without a GPU; on a GPU it runs shapes from one
# tile (16 x 8 x 16) to 512 x 512 x 1024.

# %%
# %%cuda
// exercise: 06-mma-fragments
#include <kl/mma.cuh>     // mma_16816<__half>(d, a, b): one mma.sync.m16n8k16, fp16 in, fp32 accumulate
extern "C" __global__ void mma_fragments(const __half* A, const __half* B, float* C, int M, int N, int K) {
    // TODO: unsigned a[4], b[2] loaded by the fragment layout per 16 of k; mma_16816<__half>(d, a, b); d[0..3] into C
}

# %%
kernellab.grade("06-mma-fragments", mma_fragments)

# %% [markdown]
# ## Step 3: a `cp.async` pipeline and a swizzled layout
#
# Three changes, all about keeping the tensor cores busy.
# - **`cp.async`** copies 16 bytes from global to shared memory without passing through registers and without
#   waiting: a thread issues the copies of a later slice, commits them as a group, and computes on an earlier one;
#   `cp.async.wait_group n` waits until at most `n` groups are still in flight. With `STAGES` buffers, `STAGES - 1`
#   slices are always on their way, and one barrier per slice orders it all (the stage refilled at slice `t` is the one
#   computed at `t - 1`, and every thread has passed that barrier).
# - **A swizzled layout** instead of padding: the 16-byte chunk `c` of smem row `r` is stored at chunk
#   `c ^ s(r)`. Padding (80-byte rows) would also avoid conflicts, but swizzling keeps rows dense and
#   power-of-two sized, which is what the hardware's own swizzle on Hopper (next step) is, and costs no memory.
# - **A tight main loop.** Each of an SM's four schedulers issues one instruction per cycle, and `mma.sync` takes
#   one instruction per m16n8k16 product, so every address computation, bounds check and branch in the loop takes
#   an issue slot an `HMMA` could have had. Everything that does not change from slice to slice is computed once: each thread's swizzled smem
#   offsets (a stage or a k-step moves them by a constant), its global pointers (advanced by `BK` per slice, not
#   recomputed), and whether its block is an interior tile (then no copy is checked at all; only the edge tiles run
#   the guarded copy of the loop). The fragments of the next 16 of `k` are loaded (`ldmatrix`) before the
#   `mma.sync` of the current ones, so the loads' latency hides behind 32 products.
#
# The tile grows to 128 x 256 with 8 warps of 64 x 64 (128 fp32 accumulators per thread): per 16 of `k`, 4 + 4
# `ldmatrix.x4` feed 32 `mma.sync` (4 per `ldmatrix`, against 2.7 in step 2). The result goes out through shared
# memory: each warp writes its tile there, then copies it to `C` 16 bytes per lane, whole 32-byte sectors.

# %% [markdown]
# **The banks, before and after.** An `ldmatrix` reads 8 rows of 16 bytes per matrix, a quarter-warp's worth of
# 16-byte reads, so the bank model's `LDS.128` rules apply. With 64-byte rows (`BK = 32` halves) and no padding,
# the 8 rows of a matrix are 64 bytes apart: rows `r` and `r + 2` land on the same four banks.

# %%
CHUNKS = 4                                   # BK = 32 halves = 64-byte rows = 4 chunks of 16 bytes


def ldmatrix_rows(offset):
    """Byte addresses of one ldmatrix.x4 of the A tile at (row 0, k 0): lane l reads row l % 16, chunk l // 16."""
    return [offset(lane % 16, lane // 16) for lane in range(32)]


LAYOUTS = {
    "dense 64-byte rows": lambda r, c: r * 64 + c * 16,
    "padded to 80 bytes (step 2)": lambda r, c: r * 80 + c * 16,
    "swizzled: chunk c ^ (r / 2) % 4": lambda r, c: r * 64 + (c ^ ((r // 2) % CHUNKS)) * 16,
}
rows = []
for name, offset in LAYOUTS.items():
    access = analyze_access(ldmatrix_rows(offset), 16)
    cp_async = analyze_access([offset(i // CHUNKS, i % CHUNKS) for i in range(32)], 16)   # a warp's 32 copies
    rows.append([name, access.wavefronts, cp_async.wavefronts, "yes" if "padded" in name else "no"])
HTML(html_table(["layout", "ldmatrix.x4 wavefronts (ideal 4)", "cp.async stores (ideal 4)", "extra memory"], rows,
                caption="one warp's shared accesses in the bank model"))

# %% [markdown]
# The kernel below uses slices 64 of `k` deep: 128-byte rows of 8 chunks, swizzled as chunk `c ^ (r % 8)`, which is the
# pattern of Hopper's own 128-byte swizzle (step 4). The same bank model for those rows:

# %%
swz128 = lambda r, c: r * 128 + (c ^ (r % 8)) * 16       # noqa: E731  BK = 64: 8 chunks of 16 bytes per row
dense128 = lambda r, c: r * 128 + c * 16                  # noqa: E731
for name, offset in (("dense 128-byte rows", dense128), ("swizzled: chunk c ^ r % 8", swz128)):
    print(f"{name:28s} ldmatrix.x4 {analyze_access(ldmatrix_rows(offset), 16).wavefronts} wavefronts, a warp's 32 "
          f"cp.async stores {analyze_access([offset(i // 8, i % 8) for i in range(32)], 16).wavefronts} (ideal 4 / 4)")

# %% [markdown]
# Dense rows put the rows of a matrix four to a bank group: 16 wavefronts where 4 would do. Padding to 80 bytes fixes
# the reads but not the writes: a warp's 32 `cp.async` chunks (8 rows of 4) now straddle bank groups and take twice
# the wavefronts. The swizzle permutes chunks *within* a row, so writes of whole rows stay dense and reads of
# 8 rows spread over all 8 bank groups: ideal on both sides.

# %% [markdown]
# The tile sizes from the device's limits: a stage is `(BM + BN) x BK` halves; the stages must fit the per-block
# shared memory with opt-in, the 128 accumulators of a 64 x 64 warp tile plus fragments must fit the 255-register
# limit at 256 threads (one block per SM: `65536 / 256 = 256` registers each), and the slices in flight must hide a
# global-memory latency of about a microsecond at the rate one SM consumes them. The slice is 64 of `k` deep (128-byte
# rows): one barrier and one `cp.async` group per 64 of `k` instead of per 32, and three stages of 48 KiB (two slices
# loading while one is computed) cover the same latency as four of 24 KiB. On an H100, 64-deep slices with three
# stages measured 62.1 % of cuBLAS at 4096³ where 32-deep slices with four measured 58-61 % (benchmarks/NOTES-matmul.md).

# %%
BM3, BN3, BK3, STAGES3 = 128, 256, 64, 3
stage_bytes = (BM3 + BN3) * BK3 * 2
print(f"a stage: {stage_bytes // 1024} KiB; the opt-in limit fits {SMEM_OPTIN // stage_bytes} stages; using "
      f"{STAGES3} ({STAGES3 * stage_bytes // 1024} KiB)")
flops_per_slice = 2 * BM3 * BN3 * BK3
sm_rate = PEAK.bf16_tflops * 1e12 / 132                        # FLOP/s of one SM at the datasheet rate
print(f"one slice is {flops_per_slice / sm_rate * 1e9:.0f} ns of tensor-core work per SM: {STAGES3 - 1} slices in "
      f"flight cover {(STAGES3 - 1) * flops_per_slice / sm_rate * 1e6:.2f} us of latency")
print(f"registers: 64 x 64 warp tile = {64 * 64 // 32} fp32 accumulators per thread + 2 x 32 for two k-steps' "
      f"fragments; {ARCH.registers_per_sm // 256} available per thread at 256 threads")
ldsm_bytes = (BM3 // 64) * (BN3 // 64) * 8 * 512    # per 16 of k: 8 warps x (4 + 4) ldmatrix.x4 of 512 bytes
copy_bytes = (BM3 + BN3) * 16 * 2                     # ... and the cp.async writes of that 16 of k
tc_cycles = 2 * BM3 * BN3 * 16 / 4096                # Hopper: 4096 bf16 FLOP/cycle/SM (989 TFLOP/s, 132 SMs, 1.83 GHz)
print(f"shared memory per 16 of k: {ldsm_bytes // 1024} KiB of ldmatrix + {copy_bytes // 1024} KiB of cp.async = "
      f"{(ldsm_bytes + copy_bytes) / 128:.0f} cycles at 128 B/cycle, against {tc_cycles:.0f} cycles of tensor work at "
      f"the datasheet rate")

# %% [markdown]
# **Prediction.** Loads overlap compute, each slice needs half the shared-memory reads per MMA of step 2, and the
# `ldmatrix` reads are conflict-free. Shared memory caps this tiling at about three quarters of the datasheet rate
# (the line above), and on an H100 `mma.sync` itself tops out well under `wgmma`'s rate (the Hopper tensor cores are
# fed at full speed only by the asynchronous warpgroup instructions), so expect 55-75 % of cuBLAS; the target is 60 %.
#
# **How tight is tight?** A first version of this step computed each copy's row, chunk, swizzle and bounds inside
# the loop, and the fragment addresses per `ldmatrix`: on an H100 it ran at 28 % of cuBLAS, and Nsight Compute
# counted 5.8 instructions executed per `HMMA`, the issue slots 32 % busy, and "fixed latency execution dependency"
# (waiting on integer arithmetic) as the top stall. The loop below issues under 2 per `HMMA` (`main_loop` counts it
# in the SASS after the cell); a good `mma.sync` GEMM is at 1.5-2.5.

# %%
# %%cuda --name mma_pipe_cell
#include <kl/cp_async.cuh>  // cp_async_16, cp_async_commit, cp_async_wait<N>
#include <kl/mma.cuh>       // ldmatrix_x4, mma_16816<T>; pack2<T> (kl/convert.cuh)

// Tile sizes: defaults below; benchmarks/matmul.py sweeps others with -D options.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 64                      // 128-byte rows: 8 chunks of 16 bytes; 32 or 64
#endif
#ifndef STAGES
#define STAGES 3                   // k-slices in flight: STAGES - 1 loading while one is computed
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#define NTHREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)          // warp tile: WM x WN, (WM / 16) x (WN / 8) mma tiles
#define WN (BN / WARPS_N)
#define CHUNKS (BK / 8)            // 16-byte chunks per smem row
#define LD_ROWS (NTHREADS / CHUNKS)                   // rows one pass of the block's cp.async covers
#define A_STAGE (BM * BK * 2)                         // bytes of one stage's A tile [BM][BK], then B's [BN][BK]
#define B_STAGE (BN * BK * 2)
static_assert(WM % 16 == 0 && WN % 16 == 0 && (BK == 32 || BK == 64), "tile shapes: an even number of k-steps");
static_assert(BM % LD_ROWS == 0 && BN % LD_ROWS == 0 && LD_ROWS % 8 == 0, "whole passes; the swizzle repeats");
static_assert(BM * BN <= STAGES * (BM + BN) * BK, "the C tile fits in the stages' smem for the epilogue");

// C[row][col, col + 1] = x, y, for the edge tiles: each element guarded, a 4-byte store where the pair is aligned.
template <typename T>
__device__ __forceinline__ void store2(T* C, int row, int col, int M, int N, float x, float y) {
    if (row >= M) return;
    if (col + 1 < N && N % 2 == 0) {
        *reinterpret_cast<unsigned*>(&C[(size_t)row * N + col]) = pack2<T>(x, y);
    } else {
        unsigned p = pack2<T>(x, y);
        if (col < N) reinterpret_cast<unsigned short*>(C)[(size_t)row * N + col] = p & 0xFFFF;
        if (col + 1 < N) reinterpret_cast<unsigned short*>(C)[(size_t)row * N + col + 1] = p >> 16;
    }
}

// The swizzle: 16-byte chunk c of smem row r is stored at chunk c ^ s(r). s(r) takes every value 0..CHUNKS-1 on
// any 8 consecutive rows that share their position in a 128-byte line, so the 8 rows of an ldmatrix (and a warp's
// cp.async stores) hit 8 different 16-byte bank groups. s has period 8 in r.
__device__ __forceinline__ int swz(int r, int c) { return c ^ ((r / (8 / CHUNKS)) % CHUNKS); }
// Byte offset of element (r, k) of a [rows][BK] swizzled tile (k a multiple of 8: the start of a chunk).
__device__ __forceinline__ unsigned tile_off(int r, int k) { return (r * BK + swz(r, k / 8) * 8) * 2; }

// Issue one k-slice of ROWS rows of a [rows, K] matrix: this thread's chunks are rows row + i LD_ROWS, read at
// g + i LD_ROWS K, written at tile + i LD_ROWS BK 2 (the swizzle repeats every 8 rows). Only edge tiles (GUARD) check.
template <int ROWS, bool GUARD, typename T>
__device__ __forceinline__ void load_slice(unsigned tile, const T* g, const T* base, int row, int rows, int k, int K) {
#pragma unroll
    for (int i = 0; i < ROWS / LD_ROWS; ++i) {
        const T* p = g + (size_t)i * LD_ROWS * K;
        if (!GUARD) {
            cp_async_16(tile + i * LD_ROWS * BK * 2, p, 16);
        } else {                                       // K % 8 == 0: a chunk is all in or all out
            bool in = row + i * LD_ROWS < rows && k < K;
            cp_async_16(tile + i * LD_ROWS * BK * 2, in ? p : base, in ? 16 : 0);
        }
    }
}

// One k-step's fragments from the tiles at tA, tB (the k-step's offset already added): mma tile i of A is rows +16 i,
// a pair of n-tiles of B rows +16 j; both are whole swizzle periods away, so they are immediate offsets.
__device__ __forceinline__ void load_fragments(unsigned (&a)[WM / 16][4], unsigned (&b)[WN / 8][2], unsigned tA,
                                               unsigned tB) {
#pragma unroll
    for (int i = 0; i < WM / 16; ++i) ldmatrix_x4(a[i], tA + i * 16 * BK * 2);
#pragma unroll
    for (int j = 0; j < WN / 16; ++j) {
        unsigned r[4];
        ldmatrix_x4(r, tB + j * 16 * BK * 2);
        b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
    }
}

// GUARD: an edge tile (past M or N, or K not a multiple of BK): every copy and store checks its bounds.
template <typename T, bool GUARD>
__device__ __forceinline__ void mma_pipe_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                              int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sA = (unsigned)__cvta_generic_to_shared(smem);        // STAGES tiles [BM][BK], then
    const unsigned sB = sA + STAGES * A_STAGE;                            // STAGES tiles [BN][BK]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int slices = (K + BK - 1) / BK;

    // cp.async: this thread copies chunk ld_c of rows ld_row + i LD_ROWS; its pointers advance by BK per slice.
    const int ld_row = threadIdx.x / CHUNKS, ld_c = threadIdx.x % CHUNKS;
    const unsigned ld_off = tile_off(ld_row, ld_c * 8);
    const T* gA = A + (size_t)(bm + ld_row) * K + ld_c * 8;             // [M, K]: row bm + ld_row, column 8 ld_c
    const T* gB = B + (size_t)(bn + ld_row) * K + ld_c * 8;             // [N, K]
    // ldmatrix: lane reads row lane % 16 (A) or lane % 8 + (lane / 16) 8 (B) at chunk lane / 16 (A), (lane / 8) % 2
    // (B). The chunk of k-step kk is c + kk / 8 = c ^ kk / 8 (c < 2, kk / 8 even): byte offset ^ 2 kk.
    const unsigned a_off = tile_off(wm0 + lane % 16, (lane / 16) * 8);
    const unsigned b_off = tile_off(wn0 + lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8);

    float acc[WM / 16][WN / 8][4] = {};
    unsigned a[2][WM / 16][4], b[2][WN / 8][2];      // two k-steps' fragments: one loads while the other computes

    // Prologue: the first STAGES - 1 slices in flight, one commit group each (empty groups keep the count).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices) {
            load_slice<BM, GUARD>(sA + s * A_STAGE + ld_off, gA, A, bm + ld_row, M, s * BK + ld_c * 8, K);
            load_slice<BN, GUARD>(sB + s * B_STAGE + ld_off, gB, B, bn + ld_row, N, s * BK + ld_c * 8, K);
        }
        gA += BK, gB += BK;
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int rd = 0, wr = STAGES - 1;                      // the stage computed, the stage refilled
    load_fragments(a[0], b[0], sA + a_off, sB + b_off);

    for (int t = 0; t < slices; ++t) {
#pragma unroll
        for (int s = 0; s < BK / 16; ++s) {           // k-step s of slice t: k = t BK + 16 s
            if (s == 0) {                             // refill the stage slice t - 1 used with slice t + STAGES - 1
                const int next = t + STAGES - 1;
                if (next < slices) {
                    int k = next * BK + ld_c * 8;
                    load_slice<BM, GUARD>(sA + wr * A_STAGE + ld_off, gA, A, bm + ld_row, M, k, K);
                    load_slice<BN, GUARD>(sB + wr * B_STAGE + ld_off, gB, B, bn + ld_row, N, k, K);
                }
                gA += BK, gB += BK;
                cp_async_commit();
                wr = wr + 1 == STAGES ? 0 : wr + 1;
            }
            if (s == BK / 16 - 1) {                   // the next k-step is slice t + 1's first:
                cp_async_wait<STAGES - 2>();          // its copies have landed, this thread's ...
                __syncthreads();                      // ... and everyone's; everyone is done reading slice t
                rd = rd + 1 == STAGES ? 0 : rd + 1;
            }
            const int kn = (s + 1) % (BK / 16) * 16;  // the next k-step's k within its slice
            load_fragments(a[(s + 1) % 2], b[(s + 1) % 2], sA + rd * A_STAGE + (a_off ^ (2 * kn)),
                           sB + rd * B_STAGE + (b_off ^ (2 * kn)));
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)
#pragma unroll
                for (int j = 0; j < WN / 8; ++j) mma_16816<T>(acc[i][j], a[s % 2][i], b[s % 2][j]);
        }
    }
    cp_async_wait<0>();                   // nothing may be left in flight when the block exits
    __syncthreads();                      // everyone is done with the stages: they hold C now

    if (!GUARD && N % 8 == 0) {
        // Through smem: each warp writes its WM x WN tile as [WM][WN] halves, 16-byte chunk c of row r at c ^ r % 8
        // (the 8 rows of a fragment store hit 8 bank groups), then copies it out 16 bytes per lane: whole sectors.
        unsigned char* tile = smem + warp * WM * WN * 2;
#pragma unroll
        for (int i = 0; i < WM / 16; ++i)
#pragma unroll
            for (int j = 0; j < WN / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {         // rows 16 i + lane / 4 (+ 8), columns 8 j + 2 (lane % 4)
                    int r = 16 * i + lane / 4 + 8 * h;
                    *reinterpret_cast<unsigned*>(tile + r * WN * 2 + ((j ^ (r % 8)) * 16) + (lane % 4) * 4) =
                        pack2<T>(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
        __syncwarp();
#pragma unroll
        for (int q0 = 0; q0 < WM * WN / 8; q0 += 32) {        // chunk q of the tile: row q / (WN / 8), q % (WN / 8)
            int q = q0 + lane, r = q / (WN / 8), c = q % (WN / 8);
            uint4 v = *reinterpret_cast<const uint4*>(tile + r * WN * 2 + ((c ^ (r % 8)) * 16));
            *reinterpret_cast<uint4*>(&C[(size_t)(bm + wm0 + r) * N + bn + wn0 + c * 8]) = v;
        }
    } else {
#pragma unroll
        for (int i = 0; i < WM / 16; ++i)
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) {
                int row = bm + wm0 + 16 * i + lane / 4, col = bn + wn0 + 8 * j + 2 * (lane % 4);
                store2(C, row, col, M, N, acc[i][j][0], acc[i][j][1]);
                store2(C, row + 8, col, M, N, acc[i][j][2], acc[i][j][3]);
            }
    }
}

// Interior tiles run the loop without a single bounds check; the edge tiles run the guarded copy of it.
template <typename T>
__device__ __forceinline__ void mma_pipe(const T* A, const T* B, T* C, int M, int N, int K) {
    if ((blockIdx.y + 1) * BM <= M && (blockIdx.x + 1) * BN <= N && K % BK == 0)
        mma_pipe_gemm<T, false>(A, B, C, M, N, K);
    else
        mma_pipe_gemm<T, true>(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_pipe_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K) {
    mma_pipe(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_pipe_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    mma_pipe(A, B, C, M, N, K);
}

# %%
PIPE_SMEM = STAGES3 * (BM3 + BN3) * BK3 * 2
sass_line(mma_pipe_bf16, mma_pipe_f16)


def main_loop(kernel):
    """Opcode counts of one trip of the kernel's main loop: the SASS loop (a branch back to a lower address) with
    the most HMMAs, the shortest of equals (the unguarded copy)."""
    code = []                                      # (address, opcode without modifiers, branch target or None)
    for line in kernel.sass.splitlines():
        if op := opcode_of(line):
            target = re.search(r"\bBRA\b[^;]*0x([0-9a-f]+)", line)
            code.append((int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16), op.split(".")[0],
                         int(target.group(1), 16) if target else None))
    best = Counter()
    for end, op, start in code:
        if start is not None and start < end:
            body = Counter(o for a, o, _ in code if start <= a <= end)
            if (body["HMMA"], -sum(body.values())) > (best["HMMA"], -sum(best.values())):
                best = body
    return best


loop = main_loop(mma_pipe_bf16)
n = sum(loop.values())
print(f"main loop, one {BK3}-wide slice per warp: {n} instructions = {loop['HMMA']} HMMA + {loop['LDSM']} LDSM + "
      f"{loop['LDGSTS']} LDGSTS + {loop['BAR']} BAR + {n - loop['HMMA'] - loop['LDSM'] - loop['LDGSTS'] - loop['BAR']} "
      f"other: {n / loop['HMMA']:.2f} per HMMA")
mma_pipe = launcher({torch.bfloat16: mma_pipe_bf16, torch.float16: mma_pipe_f16},
                    lambda M, N: (cdiv(N, BN3), cdiv(M, BM3)), 256, PIPE_SMEM)

# %%
# %%gpu
check_step(mma_pipe)
bench_step(mma_pipe)
compare("mma_pipe", "mma", (0.55, 0.75))

# %% [markdown]
# ## Step 4 (Hopper, sm_90): `wgmma`, TMA, warp specialisation
#
# Hopper's tensor cores are fastest through `wgmma.mma_async`: a *warpgroup* (4 warps) issues one 64 x N x 16
# product whose operands are read straight from shared memory, described by 64-bit matrix descriptors, and which
# runs asynchronously until `wgmma.wait_group`. The operands get there by TMA: one thread issues
# `cp.async.bulk.tensor` with a tensor map (`kernellab.tensor_map`), the copy engine moves a whole 2-D box, writes it
# with the 128-byte swizzle that `wgmma`'s descriptors expect, and counts the bytes on an `mbarrier`.
#
# The block is three warpgroups:
# - **the producer** (warpgroup 0) gives back registers (`setmaxnreg.dec` to 40) and one of its threads loops over
#   the tiles and slices: wait until a stage is free (`empty` barrier), announce its bytes on the stage's `full`
#   barrier, issue the TMA copies;
# - **two consumers** take the registers (`setmaxnreg.inc` to 232); each owns 64 rows of the 128 x 256 tile and per
#   slice waits on `full`, issues four `wgmma m64n256k16` (128 fp32 accumulators per thread), and frees the
#   *previous* stage once its products are done (`wgmma.wait_group 1`), so one slice of products is always in
#   flight behind the next one's issue;
# - the grid is **persistent**, one block per SM, each walking tiles `blockIdx.x, + gridDim.x, ...`, in an order that
#   sweeps `GROUP_M = 8` tile rows column by column: the tiles running at once share a few row panels of A and
#   column panels of B, so most loads hit L2. While the consumers write a tile's `C`, the producer already fills
#   the stages of the next;
# - blocks come in **clusters of two** along M (`CLUSTER_M = 2`, launched with `cluster=(2, 1, 1)`). The two CTAs
#   compute vertically adjacent tiles, so they need the same B tile: each loads its own A and *half* of B, and TMA
#   *multicasts* that half into the shared memory of both. Why it matters: at 128 x 256 x 64 per slice an SM pulls
#   48 KiB from L2 for 4.2 MFLOP, about 11 TB/s across the chip at the full tensor rate, more than L2 delivers;
#   sharing B cuts that by a third. The price: a stage is free only when the consumers of *both* CTAs have released
#   it, so each consumer warp arrives on the `empty` barrier of every CTA in its cluster (`mapa` gives the other
#   CTA's address), and the two CTAs meet at a cluster barrier before they start and before they leave.
#
# The descriptor of a K-major tile with the 128-byte swizzle: start address (advanced by 32 bytes per 16 of `k`),
# stride byte offset 1024 (8 rows of 128 bytes), swizzle mode 1; the tiles start on 1 KiB boundaries.
#
# **The epilogue through shared memory and TMA stores.** When a tile's last slice is done, each consumer holds its
# 64 x 256 half of `C` in 128 fp32 registers per thread. Written straight from registers, that is 64 four-byte stores
# per thread, each warp instruction touching 8 rows, and the consumer cannot start the next tile's products until
# they have left the SM; every SM reaches that point at about the same time. Here each consumer converts its half to
# bf16/fp16 into a 64 x 64 *staging box* in shared memory (rows of 128 bytes with the same 128-byte swizzle TMA uses,
# so the 4-byte writes are conflict-free), makes those writes visible to the copy engine (`fence.proxy.async`), and
# one thread issues `cp.async.bulk.tensor` *global <- shared* for the box: TMA clips it at `C`'s edges, so no
# per-element guards. Two boxes per consumer alternate: before refilling one, `cp.async.bulk.wait_group.read` waits
# only until the store issued two boxes ago has *read* its box. The consumer is back at the next tile's `wgmma`s as
# soon as its last box is in shared memory. (Where `C`'s rows are not a multiple of 16 bytes, TMA cannot address it:
# the kernel tests `N % 8` and `C`'s alignment and falls back to direct stores.)

# %%
BM4, BN4, BK4 = 128, 256, 64
stage4 = (BM4 + BN4) * BK4 * 2
EPI_BUFS, C_BOX = 2, 64 * 64 * 2                              # C staging: 2 boxes of 64 x 64 per consumer
STAGES4 = min(4, (SMEM_OPTIN - 1024 - 128 - 2 * EPI_BUFS * C_BOX) // stage4)
WG_SMEM = STAGES4 * stage4 + 2 * EPI_BUFS * C_BOX + 16 * STAGES4 + 1024
print(f"a stage: {stage4 // 1024} KiB (A {BM4}x{BK4}, B {BN4}x{BK4} bf16); {STAGES4} stages = {WG_SMEM / 1024:.1f} KiB "
      f"of {SMEM_OPTIN / 1024:.0f}")
print(f"registers: 384 threads start with {ARCH.registers_per_sm // 384 // 8 * 8}; the producer keeps 40, so each "
      f"consumer thread can have {(ARCH.registers_per_sm - 128 * 40) // 256 // 8 * 8}: 128 accumulators + descriptors "
      f"and addresses (setmaxnreg 232)")
CLUSTER = 2                                                    # CTAs per cluster along M (the cell's CLUSTER_M)
tiles = cdiv(SIZE, BM4) * cdiv(SIZE, BN4)
print(f"{SIZE}^2: {tiles} tiles over {SMS} persistent blocks = {tiles / SMS:.2f} waves")
flop_per_slice, bytes_per_slice = 2 * BM4 * BN4 * BK4, stage4
for c in (1, CLUSTER):
    from_l2 = BM4 * BK4 * 2 + BN4 * BK4 * 2 / c                # A alone, B shared by the cluster's c CTAs
    print(f"cluster of {c}: {from_l2 / 1024:.0f} KiB from L2 per slice per SM; at {PEAK.bf16_tflops:.0f} TFLOP/s that "
          f"is {PEAK.bf16_tflops * 1e12 / flop_per_slice * from_l2 / 1e12:.1f} TB/s of L2 reads")

# %% [markdown]
# **Prediction.** `wgmma` lifts the tensor-core ceiling from `mma.sync`'s to the full rate, and TMA takes the copy
# work and its address arithmetic off the threads. With four stages, a producer running ahead, the epilogue of one
# tile overlapping the loads of the next, B multicast across the cluster and the epilogue stored by TMA, expect
# 90-105 % of cuBLAS at 4096³ and 8192³ (target 95 %). The same kernel with direct stores from registers measured
# 89.5 % / 97.4 % on an H100, this epilogue 99.5 % / 103.3 % in the same run (benchmarks/NOTES-matmul.md): at 4096³,
# where each SM does only 3.9 tiles, the epilogue was a tenth of the time.

# %%
# %%cuda --arch sm_90a --name wgmma_cell
#include <kl/tile.cuh>            // store2: two results into C, guarded
#include <kl/wgmma.cuh>           // wgmma_ss<N, T>, wgmma_fence/commit/wait<N>, fence_acc: the warpgroup MMA

#include <cuda.h>                 // CUtensorMap: the 128-byte tensor map kernellab.tensor_map encodes

#ifndef BN
#define BN 256                    // block tile BM x BN; each consumer warpgroup: 64 x BN with one wgmma m64nBNk16
#endif
#ifndef STAGES
#define STAGES 4                  // smem stages of (A: BM x 64, B: BN x 64) bf16: 48 KiB each at BN = 256;
                                  // 4 x 48 KiB + 2 x EPI_BUFS x 8 KiB of staging fit 227 KiB at EPI_BUFS 2
#endif
#ifndef GROUP_M
#define GROUP_M 8                 // tile order: GROUP_M rows of tiles are swept together (L2 reuse)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2               // CTAs per cluster along M: each loads its own A and half of the shared B tile,
#endif                            // which TMA multicasts to both (half the L2 traffic for B); 1: no cluster
#define BM 128                    // 2 consumer warpgroups x 64 rows
#define BK 64                     // 128-byte rows: what the 128-byte swizzle of TMA and wgmma expects
#define CONSUMERS 2
#define NTHREADS (128 * (CONSUMERS + 1))    // warpgroup 0 produces (TMA), 1 and 2 consume (wgmma)
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define B_PART_BYTES (B_BYTES / CLUSTER_M)     // the part of a B tile each CTA of a cluster loads and multicasts
static_assert(BN == 128 || BN == 256, "one wgmma m64nBNk16 per consumer per 16 of k");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");

#ifndef EPI_BUFS
#define EPI_BUFS 2                // staging boxes of 64 x 64 per consumer (one being stored, one filling)
#endif
#define C_BOX_BYTES (64 * 128)    // one staging box: 64 rows x 64 columns of C (128-byte rows)
#define EPI_BAR 1                 // named barriers 1, 2: consumer warpgroup (wg - 1)'s staging boxes
static_assert(EPI_BUFS >= 1 && EPI_BUFS <= 4, "1 to 4 staging boxes per consumer");

// --- mbarrier: a shared-memory barrier that counts arrivals and, for TMA, bytes ------------------------------------
__device__ __forceinline__ void mbarrier_init(unsigned bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void fence_barrier_init() {      // make the inits visible to the TMA unit
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with this parity has completed (a fresh barrier's "previous" phase, parity 1, has).
__device__ __forceinline__ void mbarrier_wait(unsigned bar, int parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// --- TMA: one instruction copies a whole box of a 2-D tensor into smem and counts its bytes on an mbarrier --------
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// --- clusters: CTAs that see each other's shared memory -----------------------------------------------------------
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {            // every thread of every CTA of the cluster
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ unsigned mapa_shared(unsigned smem_addr, unsigned cta) {   // the same offset in CTA `cta`
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr), "r"(cta));
    return out;
}
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned cluster_bar) {      // an mbarrier of any CTA
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// TMA into the same smem offset of every CTA in `mask`, counting the bytes on each one's mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1,
                                                      unsigned bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }

// The smem matrix descriptor of a K-major tile written by TMA with the 128-byte swizzle: rows of 128 bytes, 8-row
// groups 1024 bytes apart (the stride byte offset). Advancing the start address by 32 bytes moves 16 elements along k.
__device__ __forceinline__ unsigned long long make_desc(unsigned smem_addr) {
    return (unsigned long long)((smem_addr & 0x3FFFF) >> 4)   // bits 0-13: start address / 16
           | (1ull << 16)                                     // bits 16-29: leading byte offset (unused when swizzled)
           | ((unsigned long long)(1024 >> 4) << 32)          // bits 32-45: stride byte offset / 16
           | (1ull << 62);                                    // bits 62-63: 1 = 128-byte swizzle
}

// A consumer warp frees a stage: one arrival on that stage's `empty` barrier in every CTA of the cluster (each CTA's
// producer writes into all of them).
__device__ __forceinline__ void release(unsigned empty_bar) {
    if (CLUSTER_M == 1) {
        mbarrier_arrive(empty_bar);
    } else {
#pragma unroll
        for (unsigned cta = 0; cta < CLUSTER_M; ++cta) mbarrier_arrive_cluster(mapa_shared(empty_bar, cta));
    }
}

// Tile t of the persistent loop -> (tile row m, tile column n): GROUP_M tile rows at a time, column by column, so
// the blocks running at once share A's row panels and B's column panels in L2.
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& m, int& n) {
    int group = t / (GROUP_M * tiles_n), first_m = group * GROUP_M;
    int rows = min(tiles_m - first_m, GROUP_M), in_group = t % (GROUP_M * tiles_n);
    m = first_m + in_group % rows;
    n = in_group / rows;
}

// --- named barriers: bar.sync / bar.arrive on hardware barrier `id` (1-15; 0 is __syncthreads) for `threads` threads
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {      // arrive and go on: no wait
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// --- TMA store: one instruction copies a box of smem into the tensor (clipped at its edges), in bulk groups ----------
__device__ __forceinline__ void fence_proxy_async() {      // this thread's smem writes, visible to TMA (async proxy)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {    // at most N groups still reading their smem
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void tma_store_wait() {         // at most N groups not yet complete
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Two results as a packed bf16x2 / fp16x2 word into (generic-addressed) shared memory.
__device__ __forceinline__ void put2(unsigned char* p, float x, float y, __nv_bfloat16) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void put2(unsigned char* p, float x, float y, __half) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
// The 128-byte swizzle of TMA: 16-byte chunk (address bits 4-6) XOR 128-byte row within 1 KiB (bits 7-9).
__device__ __forceinline__ unsigned swizzle128(unsigned addr) { return addr ^ (((addr >> 7) & 7) << 4); }

template <typename T>
__device__ void wgmma_gemm(const CUtensorMap* tmA, const CUtensorMap* tmB, const CUtensorMap* tmC,
                           T* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem[];
    // C through TMA stores when its rows are 16-byte multiples (the launcher then encoded tmC); else direct stores
    const int c_by_tma = N % 8 == 0 && (reinterpret_cast<unsigned long long>(C) & 15) == 0;
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned base = (smem0 + 1023) & ~1023u;                                     // swizzle atoms: 1 KiB
    const unsigned sA = base, sB = base + STAGES * A_BYTES, sC = sB + STAGES * B_BYTES;  // sC: staging boxes
    const unsigned full = sC + CONSUMERS * EPI_BUFS * C_BOX_BYTES, empty = full + 8 * STAGES;   // STAGES mbarriers each
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const unsigned rank = CLUSTER_M > 1 ? cluster_ctarank() : 0;                       // this CTA in its cluster
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, slices = (K + BK - 1) / BK;
    // The persistent loop walks cluster tiles: CLUSTER_M tile rows (one per CTA) by one tile column.
    const int cluster_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M, cluster_tiles = cluster_rows * tiles_n;
    const int first = blockIdx.x / CLUSTER_M, stride = gridDim.x / CLUSTER_M;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + 8 * s, 1);                            // this CTA's producer (plus TMA's bytes)
            mbarrier_init(empty + 8 * s, CONSUMERS * 4 * CLUSTER_M);   // every consumer warp of the cluster
        }
        fence_barrier_init();
    }
    if (CLUSTER_M > 1) cluster_sync(); else __syncthreads();     // the barriers exist before anyone uses them

    if (wg == 0) {                                            // producer: one thread issues every TMA load
        setmaxnreg_dec<40>();
        if (t == 0) {
            int it = 0;                                       // k-slices issued so far, over all tiles
            for (int ct = first; ct < cluster_tiles; ct += stride) {
                int mc, n;
                tile_coords(ct, cluster_rows, tiles_n, mc, n);
                const int m = mc * CLUSTER_M + rank;          // this CTA's tile row (may lie past M: TMA reads zeros)
                for (int k = 0; k < slices; ++k, ++it) {
                    const int s = it % STAGES, phase = (it / STAGES) & 1;
                    mbarrier_wait(empty + 8 * s, phase ^ 1);  // every CTA's consumers have released this stage
                    mbarrier_arrive_expect_tx(full + 8 * s, A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, tmA, k * BK, m * BM, full + 8 * s);   // coordinates: {k, row}
                    if (CLUSTER_M == 1)
                        tma_load_2d(sB + s * B_BYTES, tmB, k * BK, n * BN, full + 8 * s);
                    else                                      // my part of B, into every CTA of the cluster
                        tma_load_2d_multicast(sB + s * B_BYTES + rank * B_PART_BYTES, tmB, k * BK,
                                              n * BN + rank * (BN / CLUSTER_M), full + 8 * s, (1 << CLUSTER_M) - 1);
                }
            }
        }
    } else {                                                  // consumers: warpgroup wg - 1 owns rows 64 (wg - 1)..
        setmaxnreg_inc<232>();
        const int half = wg - 1, warp = t / 32, lane = t % 32;
        float acc[BN / 2];
        int it = 0, chunk = 0;                                // chunk: boxes staged so far (buffer chunk % EPI_BUFS)
        const unsigned bufs = sC + half * EPI_BUFS * C_BOX_BYTES;
        for (int ct = first; ct < cluster_tiles; ct += stride) {
            int mc, n;
            tile_coords(ct, cluster_rows, tiles_n, mc, n);
            const int m = mc * CLUSTER_M + rank;
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
            for (int k = 0; k < slices; ++k, ++it) {
                const int s = it % STAGES, phase = (it / STAGES) & 1;
                mbarrier_wait(full + 8 * s, phase);           // TMA has delivered this stage's bytes
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {        // 4 x (64 x BN x 16), 32 bytes further along k each
                    unsigned long long da = make_desc(sA + s * A_BYTES + half * 64 * 128 + kk * 32);
                    unsigned long long db = make_desc(sB + s * B_BYTES + kk * 32);
                    wgmma_ss<BN, T>(acc, da, db, 1);          // acc += A B
                }
                wgmma_commit();
                wgmma_wait<1>();                              // the previous slice's products are done ...
                if (k > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));   // ... free its stage
            }
            wgmma_wait<0>();
            fence_acc(acc);
            if (slices > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));
            // acc[4 j + q]: row 16 warp + lane / 4 (+ 8 for q >= 2), column 8 j + 2 (lane % 4) (+ 1 for odd q)
            if (c_by_tma) {
#pragma unroll
                for (int b = 0; b < BN / 64; ++b, ++chunk) {  // one 64 x 64 box per pass
                    const unsigned buf = bufs + (chunk % EPI_BUFS) * C_BOX_BYTES;
                    // The store that last read buf has read it. Only thread 0 has bulk groups; the others pass at
                    // once, and no branch precedes the bar.sync (.aligned: the whole warp executes it together).
                    tma_store_wait_read<EPI_BUFS - 1>();
                    named_bar_sync(EPI_BAR + half, 128);
#pragma unroll
                    for (int jj = 0; jj < 8; ++jj) {
                        const int j = 8 * b + jj, r = 16 * warp + lane / 4, col = 8 * jj + 2 * (lane % 4);
                        put2(smem + (swizzle128(buf + r * 128 + col * 2) - smem0), acc[4 * j], acc[4 * j + 1], T());
                        put2(smem + (swizzle128(buf + (r + 8) * 128 + col * 2) - smem0), acc[4 * j + 2],
                             acc[4 * j + 3], T());
                    }
                    fence_proxy_async();                      // my writes, visible to the TMA store
                    named_bar_sync(EPI_BAR + half, 128);      // the whole box is in smem
                    if (t == 0) {
                        tma_store_2d(tmC, buf, n * BN + 64 * b, m * BM + 64 * half);
                        tma_store_commit();
                    }
                }
            } else {
                const int row = m * BM + half * 64 + 16 * warp + lane / 4, col0 = n * BN + 2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    store2(C, row, col0 + 8 * j, M, N, acc[4 * j], acc[4 * j + 1]);
                    store2(C, row + 8, col0 + 8 * j, M, N, acc[4 * j + 2], acc[4 * j + 3]);
                }
            }
        }
        if (t == 0) tma_store_wait<0>();                      // smem read and C written before the CTA leaves
    }
    if (CLUSTER_M > 1) cluster_sync();       // no CTA leaves while another may still write its smem or barriers
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
wgmma_bf16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
              const __grid_constant__ CUtensorMap tmC, __nv_bfloat16* C, int M, int N, int K) {
    wgmma_gemm(&tmA, &tmB, &tmC, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
wgmma_f16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
             const __grid_constant__ CUtensorMap tmC, __half* C, int M, int N, int K) {
    wgmma_gemm(&tmA, &tmB, &tmC, C, M, N, K);
}
# %%
sass_line(wgmma_bf16, wgmma_f16)
_maps = {}


def tensor_maps(A, B, C):
    """TMA maps for A (boxes of 128 x 64), B (each CTA of a cluster loads 256 / CLUSTER rows of the 256 x 64 B
    tile) and C (64 x 64 staging boxes; where C's rows are not 16-byte multiples TMA cannot address it, the kernel
    stores directly and the map passed is A's, unused), cached per tensor (encoding is a host call)."""
    key = (A.data_ptr(), tuple(A.shape), B.data_ptr(), tuple(B.shape), C.data_ptr(), tuple(C.shape))
    if key not in _maps:
        _maps.clear()
        map_a = kernellab.tensor_map(A, (BM4, BK4), swizzle="128B")
        by_tma = C.shape[1] % 8 == 0 and C.data_ptr() % 16 == 0       # the kernel's own test, c_by_tma
        _maps[key] = (map_a, kernellab.tensor_map(B, (BN4 // CLUSTER, BK4), swizzle="128B"),
                      kernellab.tensor_map(C, (64, 64), swizzle="128B") if by_tma else map_a)
    return _maps[key]


def wgmma_grid(M, N):
    """Persistent: as many clusters as there are cluster tiles, at most one block per SM."""
    cluster_tiles = cdiv(cdiv(M, BM4), CLUSTER) * cdiv(N, BN4)
    return CLUSTER * min(cluster_tiles, SMS // CLUSTER)


wgmma = launcher({torch.bfloat16: wgmma_bf16, torch.float16: wgmma_f16}, wgmma_grid, 384, WG_SMEM, args=tensor_maps,
                 cluster=(CLUSTER, 1, 1))

# %%
# %%gpu
if not HOPPER:
    print(f"step 4 needs an sm_90 GPU (H100/H200): this is {ARCH.name}; skipped")
else:
    check_step(wgmma, CHECK_SHAPES + [(2304, 2304, 264)], isolate=True)   # 81 cluster tiles: clusters walk several
    bench_step(wgmma)
    compare("wgmma", "mma_pipe", (0.90, 1.05))

# %% [markdown]
# ## What the SASS holds, step by step
#
# From the compiler's output alone: the tensor-core instruction each step uses, how operands reach shared memory
# (plain stores, `LDGSTS` for `cp.async`, `UTMALDG` for TMA) and how they leave it for the tensor cores (`LDSM` for
# `ldmatrix`, generic loads, or nothing: `wgmma` reads shared memory itself).

# %%
STEPS = [wmma_bf16, mma_bf16, mma_pipe_bf16, wgmma_bf16]
KEYS = ["LDG.128", "STS.128", "LDGSTS", "UTMALDG", "LDSM", "LDS"]


def generic_loads(kernel):
    """Generic-address loads (LD, not LDG or LDS): the compiler could not tell which memory they read."""
    return sum(1 for line in kernel.sass.splitlines() if (opcode_of(line) or "").split(".")[0] == "LD")


rows = []
for k in STEPS:
    mix = k.instruction_summary
    tc = ", ".join(f"{n} {op}" for op, n in mix.variants.items())
    rows.append([k.name, k.resources.registers, k.resources.local_bytes, tc, *(mix[key] for key in KEYS),
                 generic_loads(k)])
HTML(html_table(["kernel", "regs", "local B", "tensor-core instructions", *KEYS, "LD (generic)"], rows,
                caption="static SASS counts (bf16 kernels), from Kernel.instruction_summary"))

# %% [markdown]
# ## What Nsight Compute says
#
# The profile's tensor-pipe utilisation (the share of cycles the HMMA or GMMA pipe was busy) at 4096³ in bf16 tells
# the story of the ladder in one number per step: the first steps keep the tensor cores idle most of the time, the
# Hopper kernel keeps them near full.

# %%
# %%gpu
n = 4096
A, B = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
C = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
profiles = {
    "wmma": wmma_bf16.profile((cdiv(n, 128), cdiv(n, 128)), 256, A, B, C, n, n, n),
    "mma": mma_bf16.profile((cdiv(n, 128), cdiv(n, 128)), 256, A, B, C, n, n, n),
    "mma_pipe": mma_pipe_bf16.profile((cdiv(n, BN3), cdiv(n, BM3)), 256, A, B, C, n, n, n, shared_bytes=PIPE_SMEM),
}
if HOPPER:
    profiles["wgmma"] = wgmma_bf16.profile(wgmma_grid(n, n), 384, *tensor_maps(A, B, C), C, n, n, n,
                                           shared_bytes=WG_SMEM, cluster=(CLUSTER, 1, 1))
for name, p in profiles.items():
    pipes = p.tensor_pipe_pct if p.ok else {}          # {"hmma": % of peak, "gmma": % of peak}, as ncu reported them
    busy = ", ".join(f"{pipe.upper()} {pct:.0f} %" for pipe, pct in pipes.items()) or "-"
    print(f"{name:9s} tensor pipe busy: {busy}" + ("" if p.ok else f" ({p.error})"))

# %% [markdown]
# ## Across sizes, both dtypes, and the roofline
#
# The Hopper kernel (or, on another GPU, the `mma.sync` pipeline) against cuBLAS from 1024³ to 8192³ in bf16, and
# at the target sizes in fp16.

# %%
# %%gpu
final = wgmma if HOPPER else mma_pipe
sweep = kernellab.sweep(final, [1024, 2048, 4096, 8192], lambda n, g: tc_inputs(n, n, n, torch.bfloat16)(g),
                        baselines={"cuBLAS": cublas}, flops=mm_flops, bytes=mm_bytes, x_name="M = N = K",
                        generator_device="cuda", progress=False)
for n, r in zip(sweep.xs, sweep.results):
    print(f"bf16 {n:5d}: {r.median_ms:7.3f} ms {r.tflops:5.0f} TFLOP/s, cuBLAS {r.baselines[0].tflops:5.0f}: "
          f"{r.speedup('cuBLAS').ratio:.1%}")
for n in (4096, 8192):
    bench_step(final, torch.float16, n, keep=False)
targets = {n: r.speedup("cuBLAS").ratio for n, r in zip(sweep.xs, sweep.results) if n in (4096, 8192)}
for n, ratio in targets.items():
    print(f"{final.__name__} at {n}^3: {ratio:.1%} of cuBLAS; target 95 %: "
          + ("met" if ratio >= 0.95 else f"missed by {0.95 - ratio:.1%}") + ("; goal 100 % met" if ratio >= 1 else ""))
sweep

# %%
# %%gpu
fig = Figure(figsize=(7.5, 5), layout="constrained")
kernellab.roofline(list(results.values()), ax=fig.subplots(), include_baselines=False)
table = [[name, f"{r.median_ms:.3f}", f"{r.tflops:.0f}", f"{r.speedup('cuBLAS').ratio:.1%}"]
         for name, r in results.items()]
display(HTML(html_table(["step", "ms", "TFLOP/s", "of cuBLAS"], table,
                        caption=f"{SIZE}^3 bf16 on {next(iter(results.values())).device}; cuBLAS = torch.matmul")))
mma_ratio = results["mma_pipe"].speedup("cuBLAS").ratio
print(f"mma.sync pipeline: {mma_ratio:.1%} of cuBLAS; target 60 %: "
      + ("met" if mma_ratio >= 0.6 else f"missed by {0.6 - mma_ratio:.1%}"))
fig

# %% [markdown]
# ## Discussion
#
# The ladder's steps are the same questions as tutorial 05's, one level up. WMMA and the first `mma.sync` kernel do
# the arithmetic on tensor cores but feed them like a CUDA-core kernel: a synchronous load, a barrier, a burst of
# MMAs, a barrier. The pipeline keeps slices in flight and the swizzle keeps `ldmatrix` conflict-free; on Hopper the
# remaining gap is the instruction itself, which is why the last step changes almost everything: `wgmma` reads its
# operands from shared memory asynchronously, TMA moves whole tiles with one instruction, and the warps specialise
# so that loading and computing never wait for each other.
#
# One line of this kernel is worth a second look: the consumers free a stage on both CTAs of the cluster with
# `mbarrier.arrive.shared::cluster`, without the `.release.cluster` qualifier. With the qualifier, ptxas puts
# `MEMBAR.ALL.GPU` (a GPU-wide memory fence) before every such arrive, once per warp per k-slice; the first version
# of this kernel did that and ran at 40 % of cuBLAS on an H100, the same kernel without it at 89 % (4096³) and 96 %
# (8192³). The fence was not needed: the stage's bytes were read by `wgmma`, which `wgmma.wait_group` has already
# waited for, and the next writer is TMA, which waits on the barrier itself. `wgmma_bf16.sass` shows the difference
# (search for `MEMBAR`): read the SASS of the synchronisation, not only of the arithmetic.
#
# The epilogue was the other large term: written straight from registers, `C` kept the tensor cores idle at the end
# of every tile (89.5 % of cuBLAS at 4096³); through shared memory and TMA stores it overlaps the next tile, and the
# kernel runs at cuBLAS's speed (the lines above give this run's figures). What remains: the last partial wave (3.9
# waves at 4096²) and L2 bandwidth, which the cluster only halves for B. `benchmarks/matmul.py` sweeps the cluster (1 or 2), stages, tile widths and the tile
# order, and says which configuration was fastest on the GPU it ran on.
#
# Things to try: set `CLUSTER_M` to 1 (no multicast; launch without a cluster and with full-height B boxes) and
# compare at 8192³; set `GROUP_M` to 1 (plain row-major tile order); replace `wgmma_wait<1>` with
# `wgmma_wait<0>` (release each stage at once) and watch the time; in step 3, swap the swizzle for padding and read
# the wavefronts in Nsight Compute (`profile_banks`).
