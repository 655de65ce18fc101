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
# # 05 · Matrix multiplication on CUDA cores (SGEMM)
#
# **What you will learn**
# - why `C = A B` is compute-bound by its byte and FLOP counts, and why a naive kernel behaves as if it were not;
# - seven kernels, one idea each: naive → coalesced → shared-memory tiles → 1-D register tiles → 2-D register
#   tiles → 16-byte loads with a transposed A tile → warp tiles with double buffering, with a prediction before each;
# - how to read a kernel's SASS for the ratio that decides this ladder: multiply-adds (`FFMA`) per load;
# - the shared-memory banks of the tile loads, in the bank model and in Nsight Compute's per-line wavefronts;
# - the occupancy trade-off of register tiling, with the occupancy explorer;
# - on a GPU: check every step on awkward shapes (4095 x 4097 x 1023 among them) and time it against cuBLAS
#   (`torch.mm`, TF32 off) in the same run;
# - write two of the steps yourself (exercises 05-smem-tiles and 05-register-tiles), checked by `kernellab.grade`.
#
# Everything up to the first launch runs without a GPU: the counts, compiling, the cards, the SASS, the bank model
# and the occupancy analysis. Cells that launch kernels start with `%%gpu`: without a GPU they are skipped in one
# line and the notebook runs on to the end.

# %%
# %load_ext kernellab
# %matplotlib inline
import math
import re

import torch
from IPython.display import HTML, display
from matplotlib.figure import Figure

import kernellab
from kernellab.analysis.arch import get_arch
from kernellab.analysis.banks import analyze_access
from kernellab.analysis.roofline import datasheet_ceilings
from kernellab.report import html_table
from kernellab.run.launch.device import device_info

GPU = kernellab.has_gpu()
DEVICE = torch.cuda.get_device_name() if GPU else "NVIDIA H100 SXM (assumed: no GPU here)"
ARCH = get_arch(device_info().arch if GPU else "sm_90")
SMS = device_info().multiprocessors if GPU else 132
torch.backends.cuda.matmul.allow_tf32 = False          # cuBLAS's FP32 path, not TF32 tensor cores
print("GPU:", DEVICE, f"({ARCH.name}, {SMS} SMs)")

# %% [markdown]
# ## Bytes and FLOPs
#
# `C = A B` with `A` of shape `M x K`, `B` of shape `K x N` (all float32, row-major) does `2 M N K` FLOPs (a multiply
# and an add per term) and must move at least `4 (M K + K N + M N)` bytes: each input read once, the output written
# once. At 4096³ that is 137 GFLOP against 201 MB, 683 FLOP per byte, far right of any GPU's ridge point
# (FP32 peak over memory bandwidth: about 20 FLOP per byte on an H100). Every version below is, by this count,
# compute-bound: the floor is the FP32 peak. What the ladder fights is the gap between this count and what each
# kernel really asks of the memory system: a naive kernel reads `2 K` floats per output element, `2 M N K` loads in
# all, and its speed is set by how fast the caches serve them.

# %%
SIZE = 4096
PEAK = datasheet_ceilings(DEVICE) or datasheet_ceilings("H100 SXM")


def mm_flops(A, B, *_):
    """FLOPs of C = A B: a multiply and an add per term."""
    return 2 * A.shape[0] * B.shape[1] * A.shape[1]


def mm_bytes(A, B, *_):
    """The fewest bytes C = A B can move: A and B read once, C written once."""
    return A.element_size() * (A.shape[0] * A.shape[1] + B.shape[0] * B.shape[1] + A.shape[0] * B.shape[1])


flops, least_bytes = 2 * SIZE**3, 4 * 3 * SIZE**2
print(f"{SIZE}^3: {flops / 1e9:.0f} GFLOP, at least {least_bytes / 1e6:.0f} MB: {flops / least_bytes:.0f} FLOP/byte")
print(f"floors on {PEAK.device}: FP32 peak {PEAK.fp32_tflops} TFLOP/s -> {flops / PEAK.fp32_tflops / 1e9:.2f} ms; "
      f"{PEAK.dram_gbps / 1e3:.2f} TB/s -> {least_bytes / PEAK.dram_gbps / 1e6:.3f} ms; "
      f"ridge at {PEAK.ridge_point('fp32'):.0f} FLOP/byte")
print(f"a kernel that loads 2K floats per output element asks the caches for {2 * SIZE**3 * 4 / 1e9:.0f} GB")

# %% [markdown]
# ## The harness: launch, check, time
#
# Every step is a `%%cuda` cell with the same signature, `(A, B, C, M, N, K)`, and a launch geometry of its own.
# `gemm(kernel, grid, block)` turns one into a function of PyTorch tensors. `check_step` runs it on shapes chosen to
# break it (1 x 1 x 1, sizes one off a tile, K not a multiple of 4, and 4095 x 4097 x 1023) against a float64
# reference, with fresh random inputs and a NaN-poisoned `C` every trial. `bench_step` times it at 4096³ against
# cuBLAS (`torch.mm` with TF32 off) in the same run and keeps the result for the table and the roofline at the end.

# %%
def cdiv(a, b):
    """Blocks needed to cover a with tiles of b."""
    return (a + b - 1) // b


def gemm(kernel, grid, block):
    """kernel as a function (A, B, C) -> C of float32 tensors; grid(M, N) gives the launch grid."""
    def run(A, B, C):
        (M, K), N = A.shape, B.shape[1]
        kernel[grid(M, N), block](A, B, C, M, N, K)
        return C
    run.__name__ = kernel.name
    return run


def mm_inputs(M, N, K):
    """inputs(generator): A [M, K], B [K, N] ~ N(0, 1) on the GPU, and C [M, N] for the result."""
    def make(g):
        return (torch.randn(M, K, generator=g, device="cuda"), torch.randn(K, N, generator=g, device="cuda"),
                torch.empty(M, N, device="cuda"))
    return make


CHECK_SHAPES = [(1, 1, 1), (31, 33, 17), (129, 127, 65), (130, 260, 36), (4095, 4097, 1023)]
results = {}          # step name -> BenchResult at SIZE^3


def check_step(fn, shapes=CHECK_SHAPES):
    """Check fn against a float64 reference on every shape; stop at the first failure and show it."""
    for M, N, K in shapes:
        report = kernellab.check(fn, lambda A, B, C: A @ B, mm_inputs(M, N, K), trials=2, generator_device="cuda")
        if not report.passed:
            print(f"{fn.__name__} FAILS at {M} x {N} x {K}")
            return report
    print(f"{fn.__name__}: correct on {', '.join(f'{m}x{n}x{k}' for m, n, k in shapes)}")
    return report


def bench_step(fn, slow=False):
    """Time fn at SIZE^3 against cuBLAS in the same run; slow steps get fewer repetitions."""
    options = dict(rounds=3, min_reps=3, warmup_ms=0) if slow else {}
    r = kernellab.bench(fn, mm_inputs(SIZE, SIZE, SIZE), baselines={"cuBLAS": lambda A, B, C: torch.mm(A, B, out=C)},
                        flops=mm_flops, bytes=mm_bytes, generator_device="cuda", **options)
    results[fn.__name__] = r
    print(f"{r.name}: {r.median_ms:.3f} ms, {r.tflops:.2f} TFLOP/s = {r.speedup('cuBLAS').ratio:.1%} of cuBLAS "
          f"({r.baselines[0].median_ms:.3f} ms, {r.baselines[0].tflops:.1f} TFLOP/s), {r.device}")
    return r


def compare(name, previous, predicted):
    """One line: the measured step against the previous one and against the prediction (a fraction of cuBLAS)."""
    r, p = results[name], results[previous]
    ratio = r.speedup("cuBLAS").ratio
    lo, hi = predicted
    verdict = "inside" if lo <= ratio <= hi else ("above" if ratio > hi else "below")
    print(f"{name}: {p.median_ms / r.median_ms:.1f}x faster than {previous}; {ratio:.1%} of cuBLAS, "
          f"{verdict} the predicted {lo:.0%}-{hi:.0%}")


# %% [markdown]
# ## Step 1: naive
#
# One thread per element of `C`, and the obvious mapping: `threadIdx.x` walks the rows of `C`. A warp is 32
# consecutive `threadIdx.x`, so its 32 lanes compute one column of 32 rows: at each `k` they load `A[row][k]` from 32
# rows `4 K` bytes apart (32 sectors for 128 useful bytes), and all load the same `B[k][col]`.
#
# **Prediction.** Every FFMA needs two loads, and the A load of a warp touches 32 cache lines. Consecutive `k` of one
# lane hit the same 32-byte sector, so L1 serves most of them, but it serves one line per wavefront: about 33
# wavefronts per 32 multiply-adds. That puts this kernel near 2 FLOP per clock per SM, a few hundred GFLOP/s on the
# whole chip: 0.5-3 % of cuBLAS.

# %%
# %%cuda
// C[M, N] = A[M, K] B[K, N], all float32 and row-major. One thread per element of C.
extern "C" __global__ void sgemm_naive(const float* __restrict__ A, const float* __restrict__ B,
                                       float* __restrict__ C, int M, int N, int K) {
    int row = blockIdx.x * 32 + threadIdx.x;     // lanes of a warp take consecutive ROWS of C
    int col = blockIdx.y * 32 + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];   // A: 32 rows, 4 K bytes apart
        C[row * N + col] = acc;                                                 // C: 32 rows, 4 N bytes apart
    }
}

# %%
naive = gemm(sgemm_naive, lambda M, N: (cdiv(M, 32), cdiv(N, 32)), (32, 32))

# %%
# %%gpu
check_step(naive)
bench_step(naive, slow=True);

# %% [markdown]
# ## Step 2: coalesced
#
# Swap the roles: `threadIdx.x` walks the columns. Now a warp's 32 lanes share one row: at each `k` they all load the
# same `A[row][k]` (a broadcast) and 32 consecutive floats of `B`, 128 contiguous bytes, one wavefront; the store of
# `C` is 128 contiguous bytes too.
#
# **Prediction.** From about 33 wavefronts per warp-wide pair of loads to 2: the load path stops being the wall, and
# the limit becomes the load *instructions* themselves, still two per FFMA (the SASS below shows 58 loads for 29
# FFMAs in the unrolled loop). Expect 5-10x over step 1: 4-12 % of cuBLAS.

# %%
# %%cuda
extern "C" __global__ void sgemm_coalesced(const float* __restrict__ A, const float* __restrict__ B,
                                           float* __restrict__ C, int M, int N, int K) {
    int col = blockIdx.x * 32 + threadIdx.x;     // lanes of a warp take consecutive COLUMNS of C
    int row = blockIdx.y * 32 + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];   // A: one float for the warp; B: 128 B
        C[row * N + col] = acc;                                                 // C: 128 contiguous bytes
    }
}

# %%
coalesced = gemm(sgemm_coalesced, lambda M, N: (cdiv(N, 32), cdiv(M, 32)), (32, 32))
mix = sgemm_coalesced.instruction_summary          # static SASS counts by kind, from the cubin: no GPU needed
print(f"{mix['FFMA']} FFMA and {mix['LDG']} global loads in the SASS: {mix['LDG'] / mix['FFMA']:.0f} loads per FFMA")

# %%
# %%gpu
check_step(coalesced)
bench_step(coalesced, slow=True)
compare("sgemm_coalesced", "sgemm_naive", (0.04, 0.12))

# %% [markdown]
# ## Step 3: shared-memory tiles
#
# A block of 32 x 32 threads computes a 32 x 32 tile of `C`. It walks `K` in slices of 32: each thread loads one
# element of A's slice and one of B's into shared memory (coalesced, and zero past the matrix's edges), the block
# waits at `__syncthreads()`, and each thread runs 32 multiply-adds out of shared memory. Each element loaded from
# global memory is now used 32 times.
#
# **Prediction.** Global loads fall 32-fold, but every FFMA still reads two operands from shared memory: `As[ty][k]`
# (one word for the whole warp) and `Bs[k][tx]` (32 banks, one wavefront). The compiler turns four `As[ty][k]` into
# one `LDS.128` (a row of `As` is contiguous in `k`), so it is about 1.25 shared loads per FFMA instead of 2 global
# ones: a modest gain, 1.3-2x over step 2, 6-18 % of cuBLAS. The lesson of this step is that tiling alone is not
# enough: each operand must be reused from a *register*, not just from shared memory.

# %%
# %%cuda
#define TILE 32   // a block computes a TILE x TILE tile of C with one thread per element
extern "C" __global__ void sgemm_smem(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];             // As[r][k]: the block's rows of A, one k-slice
    __shared__ float Bs[TILE][TILE];             // Bs[k][c]: the same k-slice of B's columns
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;   // coalesced; zero past the edges
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();                         // the tiles are complete
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];   // As: one word per warp; Bs: 32 banks
        __syncthreads();                         // everyone is done with them before the next slice
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

# %%
smem = gemm(sgemm_smem, lambda M, N: (cdiv(N, 32), cdiv(M, 32)), (32, 32))

# %%
# %%gpu
check_step(smem)
bench_step(smem)
compare("sgemm_smem", "sgemm_coalesced", (0.06, 0.18))

# %% [markdown]
# ### Exercise 05-smem-tiles · Tiles of 16
#
# Write the shared-memory kernel yourself with 16 x 16 tiles: `sgemm_tile16(A, B, C, M, N, K)` computes
# `C = A B` (row-major float32, any `M`, `N`, `K`). The launch is fixed: blocks of 16 x 16 threads, grid
# `(ceil(N / 16), ceil(M / 16))`; thread `(tx, ty)` of block `(bx, by)` computes `C[by * 16 + ty][bx * 16 + tx]`.
# Walk `K` in slices of 16 through two `__shared__` 16 x 16 tiles, with zeros where a tile hangs over an edge and a
# barrier on each side of the compute loop. The grader checks, without a GPU, that the SASS holds shared stores,
# shared loads and a barrier and that `M`, `N` and `K` are read; on a GPU it runs shapes from 1 x 1 x 1 to
# 300 x 200 x 257 with NaN-filled outputs, memcheck, racecheck and synccheck.

# %%
# %%cuda
// exercise: 05-smem-tiles
#define T16 16
extern "C" __global__ void sgemm_tile16(const float* A, const float* B, float* C, int M, int N, int K) {
    // TODO: one 16 x 16 tile of C per block; K in slices of 16 through two __shared__ tiles, zeros past the edges
}

# %%
kernellab.grade("05-smem-tiles", sgemm_tile16)

# %% [markdown]
# ## Step 4: 1-D register tiles
#
# Give each thread `TM = 8` outputs down one column. At each `k` it loads `B[k][col]` once into a register and uses
# it for 8 multiply-adds with 8 values of `A`. Blocks compute 64 x 64 tiles with 512 threads, slices of `BK = 8`.
#
# **Prediction.** Per `k`, a thread does 8 FFMAs for one `Bs` load and eight `As` loads, which the compiler again packs
# along `k` (a row of `As` holds the 8 values of one slice: two `LDS.128`). The SASS shows 64 FFMAs against 24 shared
# loads, 2.7 FFMAs per load against 0.8 in step 3, so expect 2.5-3.5x: 20-40 % of cuBLAS.

# %%
# %%cuda
#define BM 64
#define BN 64
#define BK 8
#define TM 8                                     // each thread: TM consecutive rows of one column of C
#define NT1 (BM * BN / TM)                       // 512 threads
extern "C" __global__ void __launch_bounds__(NT1) sgemm_1d(const float* __restrict__ A, const float* __restrict__ B,
                                                          float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[BM][BK];
    __shared__ float Bs[BK][BN];
    const int t = threadIdx.x;
    const int tcol = t % BN, trow = t / BN;      // C rows trow * TM .. + TM - 1, column tcol of the block's tile
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int ar = t / BK, ac = t % BK;          // the A element this thread loads (BM * BK = 512)
    const int br = t / BN, bc = t % BN;          // the B element (BK * BN = 512)
    float acc[TM] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        As[ar][ac] = (bm + ar < M && k0 + ac < K) ? A[(bm + ar) * K + k0 + ac] : 0.0f;
        Bs[br][bc] = (k0 + br < K && bn + bc < N) ? B[(k0 + br) * N + bn + bc] : 0.0f;
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float b = Bs[k][tcol];               // one shared load feeds TM multiply-adds
            for (int i = 0; i < TM; ++i) acc[i] += As[trow * TM + i][k] * b;
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        int row = bm + trow * TM + i, col = bn + tcol;
        if (row < M && col < N) C[row * N + col] = acc[i];
    }
}

# %%
reg1d = gemm(sgemm_1d, lambda M, N: (cdiv(N, 64), cdiv(M, 64)), 512)

# %%
# %%gpu
check_step(reg1d)
bench_step(reg1d)
compare("sgemm_1d", "sgemm_smem", (0.20, 0.40))

# %% [markdown]
# ## Step 5: 2-D register tiles
#
# Each thread now computes an 8 x 8 block of `C`: per `k` it loads 8 values of `A` and 8 of `B` into registers and
# does their 64 products (an outer product). Blocks compute 128 x 128 tiles with 256 threads, `BK = 8`.
#
# **Prediction.** 64 FFMAs per 16 operands. The B operand `Bs[k][tcol * 8 .. + 7]` is contiguous and becomes two
# `LDS.128`; the A operand `As[trow * 8 + i][k]` walks down a column of `As` and stays eight scalar `LDS`: 10 loads per
# 64 FFMAs in the SASS, 6.4 per load. The price is registers: 64 accumulators plus 16 operands, about 120 per thread,
# which halves occupancy (below). Expect 1.5-2.5x: 45-75 % of cuBLAS.

# %%
# %%cuda
#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8                                      // each thread: a TM x TN block of C
#define NT2 (BM * BN / (TM * TN))                 // 256 threads
extern "C" __global__ void __launch_bounds__(NT2) sgemm_2d(const float* __restrict__ A, const float* __restrict__ B,
                                                          float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[BM][BK];                  // as A is stored: As[m][k]
    __shared__ float Bs[BK][BN];
    const int t = threadIdx.x;
    const int trow = t / (BN / TN), tcol = t % (BN / TN);   // this thread's block: rows trow * TM.., cols tcol * TN..
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[TM][TN] = {};
    float a[TM], b[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = 0; i < BM * BK / NT2; ++i) {          // 4 elements of A and 4 of B per thread
            int idx = t + i * NT2, r = idx / BK, c = idx % BK;
            As[r][c] = (bm + r < M && k0 + c < K) ? A[(bm + r) * K + k0 + c] : 0.0f;
        }
        for (int i = 0; i < BK * BN / NT2; ++i) {
            int idx = t + i * NT2, r = idx / BN, c = idx % BN;
            Bs[r][c] = (k0 + r < K && bn + c < N) ? B[(k0 + r) * N + bn + c] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            for (int i = 0; i < TM; ++i) a[i] = As[trow * TM + i][k];   // TM + TN loads feed TM * TN multiply-adds
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tcol * TN + j];
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {
            int row = bm + trow * TM + i, col = bn + tcol * TN + j;
            if (row < M && col < N) C[row * N + col] = acc[i][j];
        }
}

# %%
reg2d = gemm(sgemm_2d, lambda M, N: (cdiv(N, 128), cdiv(M, 128)), 256)

# %%
# %%gpu
check_step(reg2d)
bench_step(reg2d)
compare("sgemm_2d", "sgemm_1d", (0.45, 0.75))

# %% [markdown]
# ### Exercise 05-register-tiles · A 4 x 4 block per thread
#
# Combine the shared tiles with register tiling: `sgemm_4x4(A, B, C, M, N, K)` with blocks of 16 x 16 threads
# computing a 64 x 64 tile of `C` (grid `(ceil(N / 64), ceil(M / 64))`), each thread a 4 x 4 block: rows
# `by * 64 + ty * 4 + i`, columns `bx * 64 + tx * 4 + j` for `i, j < 4`. Stage `K` in slices of 16 through
# `__shared__ float As[64][16], Bs[16][64]` (each thread loads 4 elements of each, zeros past the edges); per `k`,
# load 4 values of `A` and 4 of `B` into registers and do their 16 products. Same checks as above, and on a GPU a
# speed bar: at least 25 % of cuBLAS at 2048³ (sgemm_2d reaches about twice that with 8 x 8).

# %%
# %%cuda
// exercise: 05-register-tiles
extern "C" __global__ void sgemm_4x4(const float* A, const float* B, float* C, int M, int N, int K) {
    // TODO: a 64 x 64 tile per block of 16 x 16 threads, a 4 x 4 block of C per thread in registers
}

# %%
kernellab.grade("05-register-tiles", sgemm_4x4)

# %% [markdown]
# ## Step 6: 16-byte loads and a transposed A tile
#
# Two changes. Store A's slice *transposed* in shared memory, `As[k][m]`, so that a thread's 8 values of `A` at one
# `k` are contiguous: two `LDS.128` instead of eight `LDS`. And load both tiles from global memory as `float4`
# (`LDG.E.128`): one 16-byte load per thread per tile instead of four 4-byte ones. A `float4` needs its address to be a
# multiple of 16, so the kernel uses it only where rows start on 16 bytes (`K % 4 == 0` for A, `N % 4 == 0` for B
# and C) and the four floats lie inside the matrix; elsewhere, at the edges and for shapes like 4095 x 4097 x 1023, it
# falls back to guarded scalar loads. Correct everywhere, fast where aligned.
#
# **Prediction.** Four `LDS.128` per 64 FFMAs: 16 per shared load. The transposed stores of A cost four scalar `STS`
# per slice, a 2-way bank conflict (below), once per 512 FFMAs. Expect 1.1-1.4x: 60-85 % of cuBLAS.

# %%
# %%cuda
// load4(p, row, col, rows, cols, vec): four floats of row `row` from column `col`, one 16-byte load where aligned
// and inside, else four guarded loads (zeros past the edges).
#include <kl/tile.cuh>

#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
#define NT2 (BM * BN / (TM * TN))                 // 256 threads, as in sgemm_2d

extern "C" __global__ void __launch_bounds__(NT2) sgemm_vec(const float* __restrict__ A, const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM];    // A's slice TRANSPOSED: As[k][m], a thread's TM rows contiguous
    __shared__ __align__(16) float Bs[BK][BN];
    const int t = threadIdx.x;
    const int trow = t / (BN / TN), tcol = t % (BN / TN);
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const bool vec_a = K % 4 == 0, vec_b = N % 4 == 0;       // rows start on 16 bytes (torch allocations do)
    const int ar = t / (BK / 4), ac = (t % (BK / 4)) * 4;    // A slice: 128 rows x 2 float4s, one per thread
    const int br = t / (BN / 4), bc = (t % (BN / 4)) * 4;    // B slice: 8 rows x 32 float4s, one per thread
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 va = load4(A, bm + ar, k0 + ac, M, K, vec_a);
        As[ac + 0][ar] = va.x;                    // stored transposed: four 4-byte stores
        As[ac + 1][ar] = va.y;
        As[ac + 2][ar] = va.z;
        As[ac + 3][ar] = va.w;
        *reinterpret_cast<float4*>(&Bs[br][bc]) = load4(B, k0 + br, bn + bc, K, N, vec_b);
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            for (int i = 0; i < TM; i += 4) {     // LDS.128: four rows of A, four columns of B per load
                float4 x = *reinterpret_cast<const float4*>(&As[k][trow * TM + i]);
                a[i] = x.x, a[i + 1] = x.y, a[i + 2] = x.z, a[i + 3] = x.w;
                float4 y = *reinterpret_cast<const float4*>(&Bs[k][tcol * TN + i]);
                b[i] = y.x, b[i + 1] = y.y, b[i + 2] = y.z, b[i + 3] = y.w;
            }
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        int row = bm + trow * TM + i;
        for (int j = 0; j < TN; j += 4) {
            int col = bn + tcol * TN + j;
            if (row >= M) continue;
            if (vec_b && col + 3 < N) {
                *reinterpret_cast<float4*>(&C[row * N + col]) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2],
                                                                            acc[i][j + 3]);
            } else {
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) C[row * N + col + q] = acc[i][j + q];
            }
        }
    }
}

# %%
vec = gemm(sgemm_vec, lambda M, N: (cdiv(N, 128), cdiv(M, 128)), 256)

# %%
# %%gpu
check_step(vec)
bench_step(vec)
compare("sgemm_vec", "sgemm_2d", (0.60, 0.85))

# %% [markdown]
# ## Step 7: warp tiles, double buffering, 16-wide slices
#
# Four changes, each aimed at what is left.
# - **Warp tiles.** In step 6 the 16 lanes of a half-warp read B at addresses 32 bytes apart: 256 bytes spread over
#   512. Here each warp owns a 64 x 32 tile of `C` and its lanes form a 4 x 8 grid; a lane's 16 x 4 outputs are four
#   4 x 4 blocks stacked 16 rows apart. At each `k` the warp's four A loads each ask for 4 distinct `float4` (64
#   contiguous bytes) and its one B load for 8 (128 contiguous bytes): no bank conflict, and the B read takes half the
#   wavefronts of step 6's (the bank table below).
# - **A padded tile.** `As[k][BM + 4]`: one `float4` of padding per row moves the `k`-quarters of the transposed
#   stores into different banks (below).
# - **Double buffering.** Two shared stages: while the FFMAs run on slice `t`, the loads of slice `t + 1` are in
#   flight into registers and are stored to the other stage afterwards; one `__syncthreads()` per slice instead of two.
# - **Slices 16 wide.** `BK = 16`: one barrier, one round of global loads and one round of stores per 16 values of
#   `k` instead of 8, for 16 more registers of staging per thread.
#
# `__launch_bounds__(256, 2)` asks ptxas to fit two blocks (16 warps) per SM, capping registers at 128 per thread.
# The tile sizes are macros, so the benchmark can try others with `-D` options; the next section derives these from
# the device's limits, and the discussion says which other shapes were measured.
#
# **Prediction.** The FFMA-to-load ratio drops from step 6's 16 to 12.8 (64 FFMAs per 5 `LDS.128`), so the gain must
# come from fewer wavefronts, half the barriers and the global-load latency hidden: 1.1-1.3x, 85-100 % of cuBLAS.
# The target is 90 %.

# %%
# %%cuda --name warptile
#include <kl/tile.cuh>        // load4: four floats, one 16-byte load where aligned and inside
// Tile sizes: the defaults below; compile with -DBM=... to try others (benchmarks/matmul.py sweeps them).
#ifndef BM
#define BM 128            // block tile: BM x BN of C ...
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 16             // ... built from k-slices BK wide
#endif
#ifndef WM
#define WM 64             // warp tile: WM x WN of C; a lane holds (WM / 4) x (WN / 8) of it
#endif
#ifndef WN
#define WN 32
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2      // __launch_bounds__: blocks that must fit on one SM (caps registers at 64K / (2 x 256))
#endif
#define NTW ((BM / WM) * (BN / WN) * 32)   // threads per block: one warp per warp tile
#define WMITER (WM / 16)                   // a lane's 4 x 4 blocks down the warp tile (4 lanes x 4 rows = 16 rows)
#define WNITER (WN / 32)                   // and across it (8 lanes x 4 columns = 32 columns)
#define APAD 4                             // As rows padded by one float4: the transposed stores miss each other
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiles must tile the block tile");
static_assert(BK % 4 == 0 && (BM * BK / 4) % NTW == 0 && (BK * BN / 4) % NTW == 0, "whole float4s per thread");

extern "C" __global__ void __launch_bounds__(NTW, MIN_BLOCKS)
sgemm_warptile(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[2][BK][BM + APAD];   // two stages; A transposed: As[s][k][m]
    __shared__ __align__(16) float Bs[2][BK][BN];          // Bs[s][k][n]
    constexpr int A4 = BM * BK / 4 / NTW, B4 = BK * BN / 4 / NTW;   // float4s each thread loads per k-slice
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;   // the warp's tile in the block's
    const int lr = lane / 8, lc = lane % 8;                                    // the lane's place in a 4 x 8 grid
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const bool vec_a = K % 4 == 0, vec_b = N % 4 == 0;
    float4 ra[A4], rb[B4];                         // the next k-slice, on its way from global memory
    float acc[4 * WMITER][4 * WNITER] = {};

    auto load_slice = [&](int k0) {                // global -> registers
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            ra[i] = load4(A, bm + r, k0 + c, M, K, vec_a);
        }
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            rb[i] = load4(B, k0 + r, bn + c, K, N, vec_b);
        }
    };
    auto store_slice = [&](int s) {                // registers -> shared stage s
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            As[s][c + 0][r] = ra[i].x;
            As[s][c + 1][r] = ra[i].y;
            As[s][c + 2][r] = ra[i].z;
            As[s][c + 3][r] = ra[i].w;
        }
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[s][r][c]) = rb[i];
        }
    };

    const int slices = (K + BK - 1) / BK;
    load_slice(0);
    store_slice(0);
    __syncthreads();
    for (int t = 0; t < slices; ++t) {
        const int s = t & 1;
        if (t + 1 < slices) load_slice((t + 1) * BK);   // in flight while the FFMAs below run
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[4 * WMITER], b[4 * WNITER];
#pragma unroll
            for (int mi = 0; mi < WMITER; ++mi) {      // 4 distinct float4s across the warp: one wavefront
                float4 x = *reinterpret_cast<const float4*>(&As[s][k][wm0 + mi * 16 + lr * 4]);
                a[4 * mi] = x.x, a[4 * mi + 1] = x.y, a[4 * mi + 2] = x.z, a[4 * mi + 3] = x.w;
            }
#pragma unroll
            for (int ni = 0; ni < WNITER; ++ni) {      // 8 distinct float4s, 128 contiguous bytes: one wavefront
                float4 y = *reinterpret_cast<const float4*>(&Bs[s][k][wn0 + ni * 32 + lc * 4]);
                b[4 * ni] = y.x, b[4 * ni + 1] = y.y, b[4 * ni + 2] = y.z, b[4 * ni + 3] = y.w;
            }
#pragma unroll
            for (int i = 0; i < 4 * WMITER; ++i)
#pragma unroll
                for (int j = 0; j < 4 * WNITER; ++j) acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < slices) store_slice(s ^ 1);        // the other stage: nobody reads it during this slice
        __syncthreads();
    }

    for (int i = 0; i < 4 * WMITER; ++i) {
        int row = bm + wm0 + (i / 4) * 16 + lr * 4 + i % 4;
        if (row >= M) continue;
        for (int j = 0; j < 4 * WNITER; j += 4) {
            int col = bn + wn0 + (j / 4) * 32 + lc * 4;
            if (vec_b && col + 3 < N) {
                *reinterpret_cast<float4*>(&C[row * N + col]) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2],
                                                                            acc[i][j + 3]);
            } else {
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) C[row * N + col + q] = acc[i][j + q];
            }
        }
    }
}

# %% [markdown]
# ### The tile sizes, from the device's limits
#
# The defaults were not picked by hand; they follow from three budgets of one SM, read off the architecture table
# (`kernellab.analysis.arch`, checked against the driver on an H200):
# - **Registers.** A lane holds `TM x TN` accumulators, `TM + TN` operands, its share of the next slice
#   (`(BM + BN) BK / threads` floats: 16 at 128 x 128 x 16 and 256 threads) and some 20 addresses and counters.
#   16 x 4 or 8 x 8 needs about 120; at 256 threads and two blocks per SM the cap is `65536 / (2 x 256) = 128`.
#   16 x 8 would need about 170: one block per SM, or 128 threads per block.
# - **Shared memory.** Two stages of `(BM + 4 + BN) x BK` floats per block: 33 KiB at 128 x 128 x 16, inside the
#   SM's budget even at two blocks; shared memory is not what limits this kernel.
# - **Loads per FFMA.** Per `k`, a warp issues `TM x TN` FFMAs and `(TM + TN) / 4` `LDS.128`. An SM retires 4
#   warp-wide FFMAs per clock (one per scheduler) but serves one shared wavefront, so shared memory keeps up while
#   the FFMAs per wavefront stay above 4. 8 x 8 gives 16 FFMAs per `LDS.128`, 16 x 4 gives 12.8: what the margin
#   buys is issue slots, since every `LDS.128` is an instruction the scheduler could have spent on an FFMA.
# - **Waves.** At 4096², 128 x 128 tiles make 1,024 blocks; with two per SM the GPU runs them in
#   `1024 / (2 x SMs)` waves, and a last partial wave idles part of the chip.

# %%
def define(kernel, name):
    """The default of `#define name <int>` in the kernel's cell (what it compiles without -D options)."""
    return int(re.search(rf"#define {name} (\d+)", kernel.module.source).group(1))


WT = {name: define(sgemm_warptile, name) for name in ("BM", "BN", "BK", "WM", "WN")}
WT_THREADS = (WT["BM"] // WT["WM"]) * (WT["BN"] // WT["WN"]) * 32   # one warp per warp tile: NTW in the cell


def warptile_budget(BM=128, BN=128, BK=16, WM=64, WN=32, blocks_per_sm=2, size=SIZE):
    """Registers, shared memory, FFMA per LDS.128 and waves of one warptile configuration on this device."""
    threads = (BM // WM) * (BN // WN) * 32
    tm, tn = 4 * (WM // 16), 4 * (WN // 32)
    regs_needed = tm * tn + tm + tn + (BM + BN) * BK // threads + 20
    reg_cap = min(ARCH.max_registers_per_thread, ARCH.registers_per_sm // (blocks_per_sm * threads) // 8 * 8)
    smem = 2 * (BM + 4 + BN) * BK * 4
    tiles = cdiv(size, BM) * cdiv(size, BN)
    waves = tiles / (blocks_per_sm * SMS)
    return {"config": f"{BM}x{BN}x{BK}, warp {WM}x{WN}", "threads": threads, "thread tile": f"{tm}x{tn}",
            "registers needed ~": regs_needed, "register cap": reg_cap, "smem KiB/block": round(smem / 1024, 1),
            "smem KiB/SM": round(blocks_per_sm * (smem + ARCH.reserved_shared_memory_per_block_bytes) / 1024, 1),
            "FFMA per LDS.128": tm * tn / ((tm + tn) / 4), "waves": round(waves, 2)}


configs = [warptile_budget(**WT), warptile_budget(BK=8), warptile_budget(BK=8, WM=32, WN=64),
           warptile_budget(WM=32, WN=64), warptile_budget(BN=256, BK=8, WM=64, WN=64, blocks_per_sm=1)]
print(f"{ARCH.name}: {ARCH.registers_per_sm} registers, {ARCH.shared_memory_per_sm_bytes // 1024} KiB smem per SM")
HTML(html_table(list(configs[0]), [list(c.values()) for c in configs],
                caption="warptile configurations against this device's budgets"))

# %% [markdown]
# The first row is what the cell above compiles (read from its `#define`s). The budgets alone do not pick it: the
# third row, 8 x 8 per lane with 8-wide slices, has more FFMAs per load and was this step's first default. The
# others are the benchmark's sweep, and the first row is the fastest of them measured on an H100 (the discussion has
# the numbers): `BK = 16` halves the barriers and the load rounds per FLOP, which is worth more than the loads per
# FFMA the 16 x 4 lane tile gives up; 128 x 256 trades occupancy for a 16 x 8 thread tile and comes within a point.
# The estimate is rough: ptxas spills 52 bytes for the second row (`-DBK=8`), which it puts under the cap, so that
# row is not in the benchmark's sweep.

# %%
warp = gemm(sgemm_warptile, lambda M, N: (cdiv(N, WT["BN"]), cdiv(M, WT["BM"])), WT_THREADS)

# %%
# %%gpu
check_step(warp)
bench_step(warp)
compare("sgemm_warptile", "sgemm_vec", (0.85, 1.00))

# %% [markdown]
# ## Step 8: cp.async stages, and what cuBLAS does
#
# Step 7 stopped at 86 % of cuBLAS, and its static mix (77 % FFMA) did not say why. Nsight Compute did
# (`tools/gpu/sgemm_stalls.py`, one launch each at 4096³ on an H100, `benchmarks/NOTES-matmul.md`):
#
# | | step 7 | step 7 at 128 x 256, 1 block/SM | cuBLAS's FP32 kernel |
# |---|---|---|---|
# | FFMA share of executed instructions | 85.9 % | 90.8 % | 88.5 % |
# | issue slots busy | 78.0 % | 73.8 % | 87.2 % |
# | warps per scheduler | 3.9 | 2.0 | 2.0 |
# | stalls per issued instruction: dispatch, short scoreboard, barrier, wait | 0.48, 0.49, 0.31, 0.23 | 0.24, 0.16, 0.07, 0.19 | 0.10, 0.20, 0.10, 0.01 |
#
# cuBLAS (`sm80_xmma_gemm_f32f32_..._tilesize256x128x8_stage3_warpsize4x2x1_ffma`) keeps the FFMA pipe busy with
# only two warps per scheduler: its instruction stream has almost no fixed-latency waits. The kernel's name is its
# recipe: 256 x 128 x 8 tiles, 8 warps of 64 x 64, **3 stages**. The stages are `cp.async` copies (`LDGSTS` in the
# SASS): global memory goes straight to shared memory, so the loop has no register staging, no `STS` and no
# instruction waiting for a global load; `cp.async.wait_group` and one barrier per slice order the ring.
#
# This step follows that recipe: A is transposed on its way in by 4-byte copies (`As[k][m]`, as in steps 6-7),
# B comes in 16-byte copies; copies outside A or B read 0 bytes (cp.async zero-fills), so the edges need no scalar
# path; each `k`'s operands come from shared memory one `k` ahead into a second register set.
#
# **Prediction** (`benchmarks/NOTES-matmul.md`, before the run): 3 stages of 128 x 256 x 8: 88-94 % of cuBLAS
# (central 91 %): its loop is 89 % FFMA and almost every instruction carries a stall count of 1
# (`tools/gpu/sass_schedule.py` reads them from the SASS control bits); 4 stages 0-2 points below 3; `BK = 16`
# within a point of `BK = 8`.
#
# **Measurement** (a sweep of the candidates, H100, torch.mm in the same run; all
# checked on awkward shapes first):
#
# | configuration | regs | of cuBLAS, 4096³ | 8192³ |
# |---|---|---|---|
# | 128 x 256 x 8, 3 stages | 255 | 86.2 % | 86.5 % |
# | 128 x 256 x 8, 4 stages | 255 | 88.9 % (88.9 % again) | 89.3 % |
# | 128 x 256 x 8, 5 / 6 / 8 stages | 255 | 88.9 / 88.6 / 89.1 % | 89.6 % (8) |
# | 256 x 128 x 8, 3 / 4 stages | 255 | 85.3 / 85.1 % | |
# | 128 x 256 x 8, 4 stages, blocks in strips of 8 (L2 order) | 255 | 88.7 % | |
# | **128 x 256 x 16, 4 stages (this cell)** | 255 | **91.0 %** | **91.6 %** |
#
# The prediction was wrong in its details: 3 stages gained nothing over step 7, a fourth stage gained 3 points (a
# slice of 8 takes about 1 µs of FFMAs, short beside a loaded DRAM round trip: two slices in flight do not cover
# it), and 16-deep slices another 2 (half the barriers and `wait_group`s per FLOP, as in step 7). The target, 90 %,
# is met by a point; the run's own numbers follow.
#
# **The sizes against the device's budgets** (the budget table of step 7, one block per SM): 16 x 8 accumulators,
# two sets of 16 + 8 operands and the copy addresses take the 255 registers a thread can have, so 256 threads fill
# the register file once; 4 stages of `(BM + 4 + BN) x BK` floats are 97 KiB of shared memory, over the 48 KiB a
# static array may take (the cell switches to dynamic shared memory and the launch passes the bytes) and inside the
# 227 KiB an sm_90 block may have (sm_80 and sm_86 allow 163 and 99 KiB: the defaults fit; older GPUs lack
# cp.async). The grid is `(N / 256) x (M / 128)`: 512 blocks at 4096², under 4 waves of 132.

# %%
# %%cuda --name cpasync
// Step 8: the slices come in by cp.async (LDGSTS), global -> shared with no registers in between, STAGES of them in
// flight; 128 x 256 block tiles, 8 warps of 64 x 64 (16 x 8 per lane), one block per SM; each k's operands loaded
// from shared memory one k ahead. Tile sizes are macros as in step 7. Launch: grid (ceil(N / BN), ceil(M / BM)),
// NTW threads, SMEM_BYTES of dynamic shared memory (97 KiB at the defaults).
#include <kl/cp_async.cuh>   // cp_async_4, cp_async_16, cp_async_commit, cp_async_wait<N>

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 16
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#define NTW ((BM / WM) * (BN / WN) * 32)   // threads per block: one warp per warp tile
#define TM (WM / 4)                        // a lane's rows: WM / 16 blocks of 4, 16 apart (4 lanes x 4 rows)
#define TN (WN / 8)                        // a lane's columns: WN / 32 blocks of 4, 32 apart (8 lanes x 4 columns)
#define APAD 4                             // As rows padded by 4 floats: the 4-byte copies of a warp (4 m x 8 k)
                                           // land on 32 different banks at BK = 8 (2 wavefronts at 16)
#define A_STAGE (BK * (BM + APAD))         // floats
#define B_STAGE (BK * BN)
#define SMEM_BYTES (STAGES * (A_STAGE + B_STAGE) * 4)
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiles must tile the block tile");
static_assert((BM * BK) % NTW == 0 && (BK * BN / 4) % NTW == 0, "whole copies per thread");
static_assert(STAGES >= 3, "the slice after next is refilled once the current one is read: 3 stages at least");

template <bool VECB>
__device__ __forceinline__ void cp_block(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K, int bm, int bn, float* smem) {
    constexpr int A1 = BM * BK / NTW;                 // 4-byte copies of A per thread per slice
    constexpr int B4 = BK * BN / 4 / NTW;             // 16-byte copies of B per thread per slice
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int lr = lane / 8, lc = lane % 8;          // the lane's place in the warp's 4 x 8 grid
    const unsigned s_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    // Stage s at smem + s (A_STAGE + B_STAGE): As[BK][BM + APAD] (A transposed), then Bs[BK][BN].

    // This thread's copies, idx = tid + i NTW. A: element (row a_r0 + i NTW / BK, column k0 + a_c): BK consecutive
    // threads read one row's slice (32 bytes at BK = 8). B: float4 (row k0 + b_r0 + i NTW / (BN / 4), column b_c).
    // The pointers advance by one slice per load while the next slice starts inside A and B; a copy outside them
    // reads 0 bytes (zero-fill) from an address kept inside (rows clamped to M - 1, columns to K - 1). Shared
    // offsets are in bytes; a stage is STAGE_B bytes.
    constexpr int A_ROWS = NTW / BK, B_ROWS = NTW / (BN / 4);        // rows apart of a thread's successive copies
    constexpr unsigned STAGE_B = 4u * (A_STAGE + B_STAGE);
    const int a_c = tid % BK, a_r0 = tid / BK, b_c = (tid % (BN / 4)) * 4, b_r0 = tid / (BN / 4);
    const float* a_src = A + (size_t)min(bm + a_r0, M - 1) * K + min(a_c, K - 1);
    const size_t a_step = (size_t)A_ROWS * K;                         // elements between a thread's A copies
    const float* b_src = B + (size_t)min(b_r0, K - 1) * N + (bn + b_c < N ? bn + b_c : 0);   // col 0: aligned
    const size_t b_step = (size_t)B_ROWS * N;
    const int a_rows_left = M - bm - a_r0;                            // copy i is inside A's rows: i A_ROWS < this
    const int b_bytes = VECB ? max(0, min(16, 4 * (N - bn - b_c))) : 0;   // B's row tail past N zero-filled
    const unsigned a_dst = s_base + 4u * (a_c * (BM + APAD) + a_r0);
    const unsigned b_dst = s_base + 4u * (A_STAGE + b_r0 * BN + b_c);
    unsigned ld_off = 0;                                              // stage being filled, in bytes
    int k_left = K - a_c;                                             // this thread's A column: inside while > 0
    int kb_left = K - b_r0;                                           // this thread's first B row: likewise
    auto load_slice = [&]() {                         // the next slice -> stage ld_off (cp.async, one group)
#pragma unroll
        for (int i = 0; i < A1; ++i) {
            const bool ok = k_left > 0 && i * A_ROWS < a_rows_left;
            cp_async_4(a_dst + ld_off + 4u * i * A_ROWS, a_src + (ok ? i * a_step : 0), ok ? 4 : 0);
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            const unsigned dst = b_dst + ld_off + 4u * i * B_ROWS * BN;
            const bool kb = i * B_ROWS < kb_left;
            if (VECB) {                               // rows on 16 bytes: one copy, its tail zero-filled at N
                cp_async_16(dst, b_src + (kb ? i * b_step : 0), kb ? b_bytes : 0);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const bool ok = kb && bn + b_c + q < N;
                    cp_async_4(dst + 4u * q, b_src + (ok ? i * b_step + q : 0), ok ? 4 : 0);
                }
            }
        }
        cp_async_commit();
        if (k_left > BK) a_src += BK;                 // the pointers stay inside A and B (a copy of 0 bytes
        if (kb_left > BK) b_src += (size_t)BK * N;    // reads nothing, but its address stays a legal one)
        k_left -= BK, kb_left -= BK;
        ld_off = ld_off + STAGE_B == STAGES * STAGE_B ? 0 : ld_off + STAGE_B;
    };

    float a[2][TM], b[2][TN];                         // operands of k (one half) and of k + 1 (the other)
    float acc[TM][TN] = {};
    const float* frag_a = smem + wm0 + lr * 4;        // this lane's operands in stage 0, k = 0
    const float* frag_b = smem + A_STAGE + wn0 + lc * 4;
    auto load_frag = [&](int buf, int rd, int k) {    // shared -> registers: TM / 4 + TN / 4 LDS.128 (rd: floats)
        const float* as = frag_a + rd + k * (BM + APAD);
        const float* bs = frag_b + rd + k * BN;
#pragma unroll
        for (int mi = 0; mi < TM / 4; ++mi) {
            const float4 x = *reinterpret_cast<const float4*>(as + mi * 16);
            a[buf][4 * mi] = x.x, a[buf][4 * mi + 1] = x.y, a[buf][4 * mi + 2] = x.z, a[buf][4 * mi + 3] = x.w;
        }
#pragma unroll
        for (int ni = 0; ni < TN / 4; ++ni) {
            const float4 y = *reinterpret_cast<const float4*>(bs + ni * 32);
            b[buf][4 * ni] = y.x, b[buf][4 * ni + 1] = y.y, b[buf][4 * ni + 2] = y.z, b[buf][4 * ni + 3] = y.w;
        }
    };

    const int slices = (K + BK - 1) / BK;
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) load_slice();   // prologue: STAGES - 1 slices in flight (past K: zeros)
    cp_async_wait<STAGES - 2>();                      // slice 0 has landed (this thread's copies) ...
    __syncthreads();                                  // ... and everyone's
    constexpr int STAGE_F = A_STAGE + B_STAGE;
    int rd = 0;                                       // the stage being read, in floats
    load_frag(0, rd, 0);
    for (int t = 0; t < slices; ++t) {
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k == BK - 1) {
                // Slice t + 1 must be in shared memory before its first operands are read below. Groups committed
                // so far: slices 0 .. t + STAGES - 2; slices 0 .. t + 1 complete leaves STAGES - 3 in flight.
                cp_async_wait<STAGES - 3>();
                __syncthreads();                      // also: every warp has read stage (t - 1) % STAGES ...
                load_slice();                         // ... so it takes slice t + STAGES - 1 now (zeros past K)
                rd = rd + STAGE_F == STAGES * STAGE_F ? 0 : rd + STAGE_F;
                load_frag((k + 1) & 1, rd, 0);        // past the last slice: reads a stage nobody writes, unused
            } else {
                load_frag((k + 1) & 1, rd, k + 1);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[k & 1][i] * b[k & 1][j];
        }
    }
    cp_async_wait<0>();                               // only empty groups are left; none may outlive the thread

    for (int i = 0; i < TM; ++i) {
        const int row = bm + wm0 + (i / 4) * 16 + lr * 4 + i % 4;
        if (row >= M) continue;
        for (int j = 0; j < TN; j += 4) {
            const int col = bn + wn0 + (j / 4) * 32 + lc * 4;
            if (VECB && col + 3 < N) {
                *reinterpret_cast<float4*>(&C[(size_t)row * N + col]) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
            } else {
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) C[(size_t)row * N + col + q] = acc[i][j + q];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTW, 1)
sgemm_cp(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
#if SMEM_BYTES > 48 * 1024
    extern __shared__ __align__(16) float smem[];    // launch with SMEM_BYTES of dynamic shared memory
#else
    __shared__ __align__(16) float smem[SMEM_BYTES / 4];
#endif
    if (N % 4 == 0) cp_block<true>(A, B, C, M, N, K, blockIdx.y * BM, blockIdx.x * BN, smem);
    else cp_block<false>(A, B, C, M, N, K, blockIdx.y * BM, blockIdx.x * BN, smem);
}

# %%
CP = {name: define(sgemm_cp, name) for name in ("BM", "BN", "BK", "STAGES")}
CP_THREADS = 256                                   # 8 warps of 64 x 64: NTW in the cell
CP_SMEM = CP["STAGES"] * (CP["BK"] * (CP["BM"] + 4) + CP["BK"] * CP["BN"]) * 4   # SMEM_BYTES in the cell


def gemm_cp(A, B, C):
    """sgemm_cp as a function (A, B, C) -> C, with its dynamic shared memory."""
    (M, K), N = A.shape, B.shape[1]
    sgemm_cp[(cdiv(N, CP["BN"]), cdiv(M, CP["BM"])), CP_THREADS, CP_SMEM](A, B, C, M, N, K)
    return C


gemm_cp.__name__ = "sgemm_cp"
cp = gemm_cp
print(f"sgemm_cp: {CP}, {CP_THREADS} threads, {CP_SMEM / 1024:.1f} KiB of shared memory a block, "
      f"{sgemm_cp.resources.registers} registers")

# %%
# %%gpu
check_step(cp)
bench_step(cp)
compare("sgemm_cp", "sgemm_warptile", (0.88, 0.94))

# %% [markdown]
# ## What the SASS holds
#
# The ladder in one table, from the compiler's output alone: the static count of each instruction in each kernel
# (the loops are unrolled, so these are the inner loop's proportions), registers, and local memory (none anywhere:
# no array spilled). Read down the FFMA-per-load column: every step that paid off raised it.

# %%
STEPS = [sgemm_naive, sgemm_coalesced, sgemm_smem, sgemm_1d, sgemm_2d, sgemm_vec, sgemm_warptile, sgemm_cp]
KEYS = ["FFMA", "LDG.32", "LDG.128", "LDS.32", "LDS.128", "STS.32", "STS.128", "LDGSTS"]
rows = []
for k in STEPS:
    mix = k.instruction_summary
    operand_loads = mix["LDS"] or mix["LDG"]      # the loads that feed the FFMAs: shared ones once there are any
    rows.append([k.name, k.resources.registers, k.resources.local_bytes, *(mix[key] for key in KEYS),
                 f"{mix['FFMA'] / operand_loads:.1f}"])
HTML(html_table(["kernel", "regs", "local B", *KEYS, "FFMA per operand load"], rows,
                caption=f"static SASS instruction counts ({sgemm_naive.arch}), from Kernel.instruction_summary"))

# %% [markdown]
# ## The banks of the tile loads
#
# Each shared access of a warp costs as many wavefronts as the most distinct words it asks of one bank (tutorial
# 02). Write down the byte address each lane asks for, one access per row below, and the bank model
# (`kernellab.analysis.banks`, which reproduces Nsight Compute's counts on 373 measured patterns) gives the
# wavefronts; "ideal" is the fewest any layout could take for that many bytes.
# - step 5, `As[trow * 8 + i][k]`: the 32 lanes have two values of `trow`, two words 256 bytes apart: same bank.
# - step 5 and 6, `Bs[k][tcol * 8 ..+3]`: 16 `float4`s 32 bytes apart; each quarter-warp's 8 lanes span 256 bytes.
# - step 6, the transposed store `As[ac + q][ar]`: lanes `2i` and `2i + 1` write row `i` at `k` and `k + 4`,
#   512 floats apart: same bank.
# - step 7: the warp-tile reads, and the transposed store of a 16-wide slice: lanes `4i` to `4i + 3` write row `i`
#   at `k`, `k + 4`, `k + 8` and `k + 12`, without and with the row padding.

# %%
ACCESSES = [  # (kernel, access, bytes per lane, byte address of lane l)
    ("sgemm_2d", "As[trow*8+i][k]  (LDS)", 4, lambda l: 4 * ((l // 16) * 8 * 8)),
    ("sgemm_2d", "Bs[k][tcol*8..+3]  (LDS.128)", 16, lambda l: 4 * ((l % 16) * 8)),
    ("sgemm_vec", "As[k][trow*8..+3]  (LDS.128)", 16, lambda l: 4 * ((l // 16) * 8)),
    ("sgemm_vec", "Bs[k][tcol*8..+3]  (LDS.128)", 16, lambda l: 4 * ((l % 16) * 8)),
    ("sgemm_vec", "As[ac+q][ar] = ...  (STS)", 4, lambda l: 4 * ((l % 2) * 4 * 128 + l // 2)),
    ("sgemm_warptile", "As[s][k][wm0+lr*4..+3]  (LDS.128)", 16, lambda l: 4 * ((l // 8) * 4)),
    ("sgemm_warptile", "Bs[s][k][wn0+lc*4..+3]  (LDS.128)", 16, lambda l: 4 * ((l % 8) * 4)),
    ("sgemm_warptile", "As[s][c+q][r] = ...  (STS, unpadded)", 4,
     lambda l, q=WT["BK"] // 4: 4 * ((l % q) * 4 * WT["BM"] + l // q)),
    ("sgemm_warptile", "As[s][c+q][r] = ...  (STS, padded)", 4,
     lambda l, q=WT["BK"] // 4: 4 * ((l % q) * 4 * (WT["BM"] + 4) + l // q)),
]
bank_rows = []
for kernel, what, width, address in ACCESSES:
    access = analyze_access([address(lane) for lane in range(32)], width)
    ideal = math.ceil(len({address(lane) for lane in range(32)}) * width / 128)
    bank_rows.append([kernel, what, access.wavefronts, max(ideal, 1)])
HTML(html_table(["kernel", "access", "wavefronts", "ideal"], bank_rows, caption="bank model: one warp's access"))

# %% [markdown]
# Step 6's transposed store takes 2 wavefronts where 1 would do. With 16-wide slices the step 7 store is worse
# unpadded, 4 wavefronts (four rows of `As` 512 floats apart); padding each row by 16 bytes moves the rows 16 banks
# apart, which separates neighbours but brings the first and third together again: 2 wavefronts. A thread makes 8
# such stores per slice against 80 `LDS.128` reads, so the kernel leaves it there. Step 5's column read of `As` is a
# 2-way conflict *and* a scalar load; step 6 trades it for one `LDS.128` that two addresses serve. The warp tile's B
# read needs half the wavefronts of step 6's.
#
# On a GPU, Nsight Compute measures the same thing per source line: shared instructions executed, wavefronts, and
# the wavefronts those accesses would take without conflicts. The line numbers are the `%%cuda` cells' own.

# %%
# %%gpu

n_prof = 1024                                     # ncu replays the launch: a mid-sized problem is plenty
A, B, C = (torch.randn(n_prof, n_prof, device="cuda") for _ in range(3))
measured = {k.name: k.profile_banks((cdiv(n_prof, bn), cdiv(n_prof, bm)), block, A, B, C, n_prof, n_prof, n_prof)
            for k, bm, bn, block in ((sgemm_2d, 128, 128, 256), (sgemm_vec, 128, 128, 256),
                                     (sgemm_warptile, WT["BM"], WT["BN"], WT_THREADS))}
for name, report in measured.items():
    print(report)

# %% [markdown]
# ## Occupancy: what register tiling costs
#
# Register tiling buys reuse with registers, and registers are what limit how many warps an SM holds. The card of
# each step says it; the table puts them side by side at each kernel's block size. The naive kernels keep the SM
# full (64 warps); the warp-tiled one holds 16, a quarter, and step 8 holds 8 (one block of 255 registers a
# thread), and they are the fastest: 64 or 128 independent accumulators give each warp enough work between loads
# that two to four warps per scheduler keep the FFMA pipe busy. Occupancy is a means (enough independent
# instructions in flight), not a goal.

# %%
occ_rows = []
for k, block in zip(STEPS, (1024, 1024, 1024, 512, 256, 256, WT_THREADS, CP_THREADS)):
    occ = k.occupancy(block, CP_SMEM if k is sgemm_cp else 0)
    occ_rows.append([k.name, block, k.resources.registers, k.resources.shared_bytes, occ.blocks_per_sm,
                     occ.warps_per_sm,
                     f"{occ.ratio:.0%}", occ.limiter])
HTML(html_table(["kernel", "threads/block", "regs", "smem B", "blocks/SM", "warps/SM", "occupancy", "limited by"],
                occ_rows, caption=f"theoretical occupancy on {ARCH.name}"))

# %% [markdown]
# The explorer starts from step 7's registers and shared memory; move the sliders to see the trade-off:
# at 128 registers two blocks of 256 fit, at 129 one (registers are granted per warp in units of 256), which is why
# the kernel asks for `__launch_bounds__(256, 2)`. Without a running kernel (a static page) the sliders do not move.

# %%
kernellab.occupancy_explorer(sgemm_warptile)

# %% [markdown]
# ## Across sizes, and the awkward shape
#
# The final kernel (step 8) against cuBLAS from 1024³ to 8192³, then on 4095 x 4097 x 1023 (where `N` is not a
# multiple of 4, so B comes in 4-byte copies, and `K` is not a multiple of the slice) for correctness and speed.
# At 1024³ its 128 x 256 tiles make 32 blocks for 132 SMs, a quarter of the GPU: cuBLAS picks another tile shape
# (or splits `K`) per size, which is the next thing to add; from 2048³ on the tiles fill the GPU.

# %%
# %%gpu
sweep = kernellab.sweep(cp, [1024, 2048, 4096, 8192], lambda n, g: mm_inputs(n, n, n)(g),
                        baselines={"cuBLAS": lambda A, B, C: torch.mm(A, B, out=C)}, flops=mm_flops, bytes=mm_bytes,
                        x_name="M = N = K", generator_device="cuda", progress=False)
for n, r in zip(sweep.xs, sweep.results):
    print(f"{n:5d}: {r.median_ms:8.3f} ms {r.tflops:6.1f} TFLOP/s, cuBLAS {r.baselines[0].tflops:6.1f}: "
          f"{r.speedup('cuBLAS').ratio:.1%}")
awkward = kernellab.bench(cp, mm_inputs(4095, 4097, 1023),
                          baselines={"cuBLAS": lambda A, B, C: torch.mm(A, B, out=C)}, flops=mm_flops,
                          bytes=mm_bytes, generator_device="cuda", name="sgemm_cp 4095x4097x1023")
print(f"4095 x 4097 x 1023: {awkward.median_ms:.3f} ms, {awkward.speedup('cuBLAS').ratio:.1%} of cuBLAS "
      f"(N is not a multiple of 4: B comes in 4-byte copies)")
sweep

# %% [markdown]
# ## The ladder on the roofline, and the discussion
#
# Every point sits at the same arithmetic intensity (the declared minimum bytes), so the roofline reads as a
# vertical ladder under the FP32 roof; the table gives each step's time and ratio.

# %%
# %%gpu
fig = Figure(figsize=(7.5, 5), layout="constrained")
kernellab.roofline([results[k.name] for k in STEPS if k.name in results], ax=fig.subplots(), include_baselines=False)
table = [[name, f"{r.median_ms:.3f}", f"{r.tflops:.2f}", f"{r.speedup('cuBLAS').ratio:.1%}"]
         for name, r in results.items()]
device = next(iter(results.values())).device
display(HTML(html_table(["step", "ms", "TFLOP/s", "of cuBLAS"], table,
                        caption=f"{SIZE}^3 float32 on {device}; cuBLAS = torch.mm, TF32 off")))
final = results["sgemm_cp"].speedup("cuBLAS").ratio
print(f"final kernel: {final:.1%} of cuBLAS at {SIZE}^3; target 90 %: "
      + ("met" if final >= 0.9 else f"missed by {0.9 - final:.1%}"))
fig

# %% [markdown]
# What the ladder shows, step by step (the lines printed by `compare` above hold this run's numbers):
# - Steps 1 to 3 change *where* operands come from and are worth little on their own: each FFMA still waits for two
#   loads. Coalescing is the largest single factor because it fixes what the memory system sees (wavefronts per
#   request); shared-memory tiles cut global traffic 32-fold but not the load instructions.
# - Steps 4 and 5 change *how often* an operand is reused from a register, and each multiplies the speed: the
#   FFMA-per-load column of the SASS table is the best single predictor on this ladder.
# - Step 6 and 7 remove what the profile would show next: scalar loads, bank conflicts, twice the wavefronts the
#   bytes need, and global-load latency without enough independent work to hide it.
# - Step 7 is also where the FFMA-per-load predictor stops working: its configuration was chosen by measurement.
#
# **What was measured for step 7** (a sweep of the tile shapes on an H100 SXM, 2026-11-23, two runs that agree within
# 0.1 point; torch.mm at 4096³ took 2.66 ms; `benchmarks/NOTES-matmul.md` has the whole table):
#
# | configuration | regs | blocks/SM | of cuBLAS, 4096³ | 8192³ |
# |---|---|---|---|---|
# | 128 x 128 x 8, warps 32 x 64 (8 x 8 per lane; this step's first version) | 128 | 2 | 78.4 % | |
# | 128 x 128 x 16, warps 32 x 64 | 128 | 2 | 84.4 % | 84.9 % |
# | **128 x 128 x 16, warps 64 x 32 (16 x 4 per lane; this notebook's kernel)** | 128 | 2 | **85.9 %** | **86.5 %** |
# | 128 x 256 x 8, warps 64 x 64 (16 x 8 per lane), `MIN_BLOCKS=1` | 219 | 1 | 86.0 % | 86.3 % |
# | 256 x 128 x 8, warps 64 x 64, `MIN_BLOCKS=1` | 219 | 1 | 84.3 % | |
# | 128 x 128 x 8, warps 64 x 64 (16 x 8 per lane), 128 threads, register double buffering | 240 | 2 | 84.0 % | |
#
# `BK = 16` is most of the gain over the first version (6 points): half the barriers and load rounds per FLOP. The
# 64 x 32 warp shape adds 1.5 points over 32 x 64 with the same wavefronts per `k` and one more `LDS.128`; we did not
# profile why. The rewrite in the last row (deleted after this measurement; git keeps it) loads each `k`'s
# operands from shared memory a whole `k` ahead into a second register set, and its main loop is 88.8 % FFMA against
# 76.9 % here (static SASS). It is still slower. The likely reason, not profiled: at 128 threads and 240 registers
# an SM holds 8 warps, 2 per scheduler, too few to hide the FFMAs' dependency stalls and the barriers. A higher FFMA
# share in the SASS did not translate into speed.
#
# Step 7 stopped about 4 points short of the target, 90 % of cuBLAS at 4096³. The profile named the cause (the
# table in step 8: issue slots lost to fixed-latency waits and dispatch stalls, not the FFMA share), and step 8's
# cp.async ring with 4 stages of 16-deep slices closed it: 91 % at 4096³ and 8192³ in its measurement (the line
# printed under the roofline says what this run measured). cuBLAS's FP32 kernels use the same ideas with more tile
# shapes and a per-shape choice, and a hand-scheduled instruction stream: its loop issues on 87 % of cycles with
# two warps per scheduler, against 80-83 % here.
#
# Things to try: swap `lr` and `lc` (lanes as 8 x 4 instead of 4 x 8) and predict the wavefronts before measuring;
# set `APAD` to 0 and read the change in Nsight Compute's store wavefronts; compile the warp-tiled cell with
# `-DBK=8` or with `-DBN=256 -DWM=64 -DWN=64 -DMIN_BLOCKS=1` (and launch it with the threads and grid those imply)
# and compare the registers on the card and the time.
