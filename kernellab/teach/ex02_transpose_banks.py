"""Exercises of tutorial 02 (transpose and banks): a naive 2-D transpose with both guards, then a batch of matrices
through a shared-memory tile."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SpeedBar, ceil_div

TUTORIAL = "02-transpose-banks"
TILE, ROWS = 32, 8          # the tutorial's tile: TILE x TILE elements, TILE x ROWS threads


# --- 02-transpose-naive: a 2-D grid, a thread per element, a guard on each side ---------------------------------

def _naive_args(shape, rng):
    rows, cols = shape
    return rng.standard_normal((rows, cols), dtype=np.float32), np.empty((cols, rows), np.float32), rows, cols


def _naive_grid(shape, block):
    rows, cols = shape
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])      # x over in's columns, y over its rows


register(Exercise(
    id="02-transpose-naive",
    tutorial=TUTORIAL,
    title="Naive transpose, one thread per element",
    tests="2-D thread indices, a guard on each dimension, row-major index arithmetic",
    kind="cuda",
    kernel="transpose_naive",
    signature="const float* in, float* out, int rows, int cols",
    task="out = in.T for in of rows x cols (row-major) and out of cols x rows: the thread at column "
         "c = blockIdx.x * blockDim.x + threadIdx.x and row r = blockIdx.y * blockDim.y + threadIdx.y copies "
         "in[r][c] to out[c][r]. The grader launches grid (ceil(cols / blockDim.x), ceil(rows / blockDim.y)) with "
         "blocks of 32 x 8, 16 x 16 and 32 x 32 threads.",
    make_args=_naive_args,
    outputs=(1,),
    reference=lambda x, out, rows, cols: (x.T.copy(),),
    launch=Launch(grid=_naive_grid, blocks=((32, 8), (16, 16), (32, 32))),
    shapes=((1, 1), (1, 33), (33, 1), (31, 33), (33, 31), (3, 4099), (1000, 777), (4097, 4099)),
    sanitize_shape=(33, 31),
    hints={
        "out_of_bounds": "guard both dimensions, `r < rows && c < cols`: the grid is rounded up in x and in y",
        "input_copy": "out is cols x rows: element (r, c) of in goes to out[c * rows + r]",
        "wrong_values": "in[r][c] is in[r * cols + c]; out[c][r] is out[c * rows + r] (out has rows columns)",
        "unwritten": "x covers in's columns and y its rows: c from blockIdx.x and threadIdx.x, r from the y's",
        "launch_config": "use blockDim.x and blockDim.y, not the sizes of one block shape",
    },
))


# --- 02-transpose-batched: a shared tile (padded or swizzled), a barrier, guards, and blockIdx.z for the batch ----

def _batched_args(shape, rng):
    batch, rows, cols = shape
    return (rng.standard_normal((batch, rows, cols), dtype=np.float32), np.empty((batch, cols, rows), np.float32),
            batch, rows, cols)


def _batched_grid(shape, block):
    batch, rows, cols = shape
    return ceil_div(cols, TILE), ceil_div(rows, TILE), batch            # one block per tile, z over the batch


def _copy_same_bytes(x, out, batch, rows, cols):
    """The baseline: a copy of the same bytes (what a transpose at full bandwidth costs)."""
    return out.view(-1).copy_(x.view(-1))


register(Exercise(
    id="02-transpose-batched",
    tutorial=TUTORIAL,
    title="Batched transpose through a shared-memory tile",
    tests="a __shared__ tile, __syncthreads(), guards on edge tiles, a conflict-free layout, blockIdx.z",
    kind="cuda",
    kernel="transpose_batched",
    signature="const float* in, float* out, int batch, int rows, int cols",
    task="out[b] = in[b].T for each of `batch` matrices: in is batch x rows x cols, out batch x cols x rows, both "
         "contiguous. Launch (fixed by the grader): blocks of 32 x 8 threads, grid (ceil(cols / 32), "
         "ceil(rows / 32), batch): block (bx, by, bz) transposes the 32 x 32 tile of matrix bz at row by * 32 and "
         "column bx * 32 through a shared tile, as transpose_tile33 does, padded or swizzled so that the column "
         "read has no bank conflict. Speed bar: at least 70 % of a copy of the same bytes.",
    make_args=_batched_args,
    outputs=(1,),
    reference=lambda x, out, batch, rows, cols: (np.ascontiguousarray(x.transpose(0, 2, 1)),),
    launch=Launch(grid=_batched_grid, blocks=((TILE, ROWS),)),
    shapes=((1, 1, 1), (2, 31, 33), (3, 33, 31), (1, 3, 4099), (4, 100, 70), (16, 2048, 2049)),
    sanitize_shape=(2, 33, 31),
    needs_shared=True,
    needs_barrier=True,
    speed=SpeedBar(fraction=0.7, baseline="a copy of the same bytes", run_baseline=_copy_same_bytes,
                   shape=(16, 2048, 2048), bytes=lambda shape: 2 * 4 * int(np.prod(shape))),
    hints={
        "out_of_bounds": "edge tiles hang over the matrix: guard the load with `r + j < rows && c < cols` and the "
                         "store with the transposed bounds",
        "unwritten": "every matrix of the batch needs its offset: matrix blockIdx.z starts at "
                     "blockIdx.z * rows * cols in both in and out",
        "missing_barrier": "put a `__syncthreads()` between filling the tile and reading it back: a thread reads "
                           "tile elements that other threads write",
        "race": "a `__syncthreads()` is missing between the shared-memory write (filling the tile) and the read",
        "no_shared": "stage each 32 x 32 tile in a `__shared__ float tile[32][33]` (or a swizzled [32][32])",
        "off_by_one": "the tile row loop runs j = 0, 8, 16, 24: `j < 32`",
    },
))
