"""Exercises of tutorial 04 (LayerNorm and RMSNorm): RMSNorm with a block-wide sum of squares, then a LayerNorm
whose statistics survive rows with a large mean."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch

TUTORIAL = "04-layernorm"
BLOCK = 256
EPS = 1e-5


# --- 04-rmsnorm-block: one block per row, the sum of squares through shuffles, shared memory and a barrier ----------

def _rms_args(shape, rng):
    rows, cols = shape
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    if rows > 1:
        x[1] = 0.0                                   # a row of zeros: y = 0 there, thanks to eps
    w = (1 + 0.5 * rng.standard_normal(cols)).astype(np.float32)
    return x, w, np.empty((rows, cols), np.float32), rows, cols, EPS


def _rmsnorm(x, w, y, rows, cols, eps):
    z = x.astype(np.float64)
    return ((z / np.sqrt((z * z).mean(axis=1, keepdims=True) + eps) * w).astype(np.float32),)


register(Exercise(
    id="04-rmsnorm-block",
    tutorial=TUTORIAL,
    title="RMSNorm, one block per row",
    tests="a strided loop over a row, a block-wide sum (shuffles, shared memory, a barrier), rsqrt with eps",
    kind="cuda",
    kernel="rmsnorm_block",
    signature="const float* x, const float* w, float* y, int rows, int cols, float eps",
    task="y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each row r of x (rows x cols, row-major). Block r (256 "
         "threads, grid = rows, fixed by the grader) takes row r: each thread adds the squares of x[r][t], "
         "x[r][t + 256], ...; the block's sum goes through warp shuffles, shared memory and a __syncthreads(); then "
         "every thread writes its elements of y[r]. One row is all zeros: the answer there is 0, not NaN.",
    make_args=_rms_args,
    outputs=(2,),
    reference=_rmsnorm,
    launch=Launch(grid=lambda shape, block: shape[0], blocks=(BLOCK,)),
    shapes=((1, 1), (2, 7), (3, 255), (5, 257), (9, 1031), (64, 4096), (1000, 1031), (3, 100003)),
    sanitize_shape=(5, 257),
    needs_shared=True,
    needs_barrier=True,
    guards=("cols",),
    rtol=1e-4,
    atol=1e-5,
    hints={
        "wrong_values": "rstd = rsqrtf(sum of squares / cols + eps), the same for the whole row: every thread needs "
                        "the block's sum, not its own; and y = x * rstd * w[c]",
        "missing_barrier": "a `__syncthreads()` between writing the warps' sums to shared memory and reading them",
        "race": "a `__syncthreads()` is missing between the shared-memory writes of the warp sums and their reads",
        "missing_guard": "loop over the row with `for (int c = threadIdx.x; c < cols; c += blockDim.x)`",
        "out_of_bounds": "the strided loop stops at cols: `c < cols`",
        "unwritten": "every element of the row is written: the same strided loop as for the sum",
    },
))


# --- 04-layernorm-block: statistics that survive a large mean ------------------------------------------------------

def _ln_args(shape, rng):
    rows, cols = shape
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    x[1::2] += np.float32(1e4)                   # odd rows: mean 10,000, spread 1 (the sum of squares fails there)
    w = (1 + 0.5 * rng.standard_normal(cols)).astype(np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    return x, w, b, np.empty((rows, cols), np.float32), rows, cols, EPS


def _layernorm(x, w, b, y, rows, cols, eps):
    z = x.astype(np.float64)
    mean = z.mean(axis=1, keepdims=True)
    var = ((z - mean) ** 2).mean(axis=1, keepdims=True)
    return (((z - mean) / np.sqrt(var + eps) * w + b).astype(np.float32),)


register(Exercise(
    id="04-layernorm-block",
    tutorial=TUTORIAL,
    title="LayerNorm that survives a large mean",
    tests="a variance without cancellation (Welford and Chan's merge, or two passes), block-wide reductions, "
          "the affine step",
    kind="cuda",
    kernel="layernorm_block",
    signature="const float* x, const float* w, const float* b, float* y, int rows, int cols, float eps",
    task="y[r] = (x[r] - mean) / sqrt(var + eps) * w + b for each row r (mean and biased variance of the row, in "
         "float32). Block r (256 threads, grid = rows, fixed by the grader) takes row r. Half the rows have a mean "
         "of 10,000 and a spread of 1, where E[x^2] - E[x]^2 loses every digit of the variance: use Welford's update "
         "per thread and Chan's merge across threads, or two passes over the row (the mean first, then the squared "
         "deviations from it). Tolerance: 5e-3 absolute, what float32 can resolve near 10,000.",
    make_args=_ln_args,
    outputs=(3,),
    reference=_layernorm,
    launch=Launch(grid=lambda shape, block: shape[0], blocks=(BLOCK,)),
    shapes=((1, 1), (2, 1), (2, 7), (3, 256), (5, 1031), (64, 4096), (7, 100003)),
    sanitize_shape=(3, 256),
    needs_shared=True,
    needs_barrier=True,
    guards=("cols",),
    rtol=0.0,
    atol=5e-3,
    hints={
        "wrong_values": "at a mean of 10,000, E[x^2] and E[x]^2 agree to more digits than float32 keeps: compute "
                        "the mean first and then the sum of (x - mean)^2 (or Welford's (n, mean, M2) merged with "
                        "Chan's formula); the variance is biased (divide by cols); y = (x - mean) * rstd * w + b",
        "missing_barrier": "a `__syncthreads()` between writing partial results to shared memory and reading them "
                           "(and another before the shared array is reused)",
        "race": "a `__syncthreads()` is missing around the shared-memory partial results (reused for the second "
                "reduction?)",
        "missing_guard": "loop over the row with `for (int c = threadIdx.x; c < cols; c += blockDim.x)`",
        "unwritten": "every element of the row is written: the same strided loop as for the statistics",
    },
))
