"""Exercises of tutorial 03 (reductions and softmax): a block's sum through warp shuffles, then a softmax with one
warp per row, numerically safe."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SassRule, ceil_div

TUTORIAL = "03-reductions-softmax"
SHUFFLE = SassRule(r"SHFL\.(BFLY|DOWN|UP|IDX)", "no_shuffle",
                   "no warp shuffles (SHFL) in its SASS: a warp's 32 values are meant to be added in registers "
                   "with __shfl_xor_sync")


# --- 03-block-sum: warp shuffles, then the warps' sums through shared memory and a barrier -------------------------

BLOCK = 256


def _block_sum_args(shape, rng):
    (n,) = shape
    return rng.standard_normal(n, dtype=np.float32), np.empty(ceil_div(n, BLOCK), np.float32), n   # x, partial, n


def _block_sums(x, partial, n):
    """partial[b] = x[256 b] + ... + x[256 b + 255] (the missing elements past n count 0), in float64."""
    padded = np.zeros(partial.size * BLOCK, np.float64)
    padded[:n] = x
    return (padded.reshape(-1, BLOCK).sum(axis=1).astype(np.float32),)


register(Exercise(
    id="03-block-sum",
    tutorial=TUTORIAL,
    title="A block's sum with warp shuffles",
    tests="__shfl_xor_sync, warp sums through shared memory, a barrier, the i < n guard",
    kind="cuda",
    kernel="block_sum",
    signature="const float* x, float* partial, int n",
    task="partial[b] = the sum of x[256 b .. 256 b + 255] (elements past n count 0). Blocks of 256 threads "
         "(fixed by the grader), grid ceil(n / 256): thread i = blockIdx.x * 256 + threadIdx.x loads x[i] (0 past "
         "n); each warp adds its 32 values with __shfl_xor_sync (five steps, no shared memory); lane 0 of each warp "
         "puts its warp's sum in a __shared__ float[8]; after a __syncthreads() warp 0 adds the 8 and thread 0 "
         "writes partial[blockIdx.x].",
    make_args=_block_sum_args,
    outputs=(1,),
    reference=_block_sums,
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], BLOCK), blocks=(BLOCK,)),
    shapes=(1, 31, 255, 256, 257, 1000, 100_003, (1 << 22) + 3),
    sanitize_shape=1000,
    needs_shared=True,
    needs_barrier=True,
    guards=("n",),
    sass=(SHUFFLE,),
    rtol=1e-5,
    atol=1e-4,                               # sums of 256 N(0, 1) values: float32 rounding in any order is ~1e-5
    hints={
        "missing_guard": "threads past n load 0 instead of x[i]: `float v = i < n ? x[i] : 0.0f;`",
        "out_of_bounds": "threads past n must not read x[i]: `float v = i < n ? x[i] : 0.0f;`",
        "missing_barrier": "the warp sums are written by lane 0 of each warp and read by warp 0: a `__syncthreads()` "
                           "between the two",
        "race": "a `__syncthreads()` is missing between writing the warp sums to shared memory and reading them",
        "no_shuffle": "add a warp's values with `for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, "
                      "o);`",
        "wrong_values": "after the shuffles every lane holds its warp's sum; the block's sum adds all 8 warps' sums",
        "unwritten": "thread 0 of each block writes partial[blockIdx.x]",
    },
))


# --- 03-softmax-warp: one warp per row, the row in registers, max and sum by shuffles --------------------------------

ROWS_PER_BLOCK = 4


def _softmax_args(shape, rng):
    rows, cols = shape
    x = (40 * rng.standard_normal((rows, cols))).astype(np.float32)   # exp(x) alone overflows float32 past 88
    if rows > 2:
        x[1] = -np.inf                                              # a fully masked row: NaN, as torch.softmax
        x[2, ::2] = -np.inf                                         # a half-masked row
    return x, np.empty((rows, cols), np.float32), rows, cols


def _softmax(x, y, rows, cols):
    """softmax along each row in float64 (a row of -inf gives NaN, as in torch)."""
    z = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return ((e / e.sum(axis=1, keepdims=True)).astype(np.float32),)


register(Exercise(
    id="03-softmax-warp",
    tutorial=TUTORIAL,
    title="Softmax with one warp per row",
    tests="a row in registers, the max subtracted before exp, warp-shuffle max and sum, guards on rows and columns",
    kind="cuda",
    kernel="softmax_warp",
    signature="const float* x, float* y, int rows, int cols",
    task="y = softmax(x, dim=-1) for x of rows x cols (row-major, cols <= 1024), one warp per row: blocks of 128 "
         "threads (fixed by the grader) take 4 rows each, grid ceil(rows / 4); warp w of block b takes row "
         "4b + w (if it exists). Lane l holds x[row][l + 32 k] for k = 0..31 in registers (-inf past cols), finds "
         "the row's max with __shfl_xor_sync, then the sum of exp(x - max), and writes exp(x - max) / sum. The "
         "inputs are N(0, 40) (exp(x) alone overflows) with a fully masked row (-inf everywhere: the answer is NaN, "
         "as torch gives) and a half-masked one.",
    make_args=_softmax_args,
    outputs=(1,),
    reference=_softmax,
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], ROWS_PER_BLOCK), blocks=(32 * ROWS_PER_BLOCK,)),
    shapes=((1, 1), (3, 5), (5, 32), (7, 33), (9, 1000), (2, 1024), (1000, 1024), (4097, 129)),
    sanitize_shape=(7, 33),
    guards=("rows", "cols"),
    sass=(SHUFFLE,),
    rtol=1e-4,
    atol=1e-6,
    hints={
        "wrong_values": "subtract the row's max before exp (exp(x) overflows float32 past x = 88), and divide by "
                        "the whole row's sum: every lane needs the warp's max and sum, which __shfl_xor_sync gives",
        "missing_guard": "guard both: rows (the last block's warps may have no row) and cols (lanes past the row "
                         "hold -inf and write nothing)",
        "out_of_bounds": "warps whose row is >= rows must not read or write; lanes read x[row][c] only for c < cols",
        "no_shuffle": "reduce across the warp with `v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o))` (and + for "
                      "the sum), o = 16, 8, 4, 2, 1",
        "unwritten": "each lane writes y[row][l + 32 k] for every k with l + 32 k < cols",
        "local_memory": "index the register array with compile-time constants only (a fully unrolled loop)",
    },
))
