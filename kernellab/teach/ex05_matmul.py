"""Exercises of tutorial 05 (SGEMM on CUDA cores): shared-memory tiles of 16, then a 4 x 4 register block per thread."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SpeedBar, ceil_div

TUTORIAL = "05-matmul"
SIGNATURE = "const float* A, const float* B, float* C, int M, int N, int K"
# Shapes (M, N, K): one element, sizes one off a tile, K not a multiple of the slice, and the largest.
SHAPES = ((1, 1, 1), (15, 17, 33), (17, 15, 16), (64, 64, 64), (100, 70, 31), (300, 200, 257))


def _args(shape, rng):
    M, N, K = shape
    return (rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32),
            np.empty((M, N), np.float32), M, N, K)


def _matmul(A, B, C, M, N, K):
    """C = A B in float64, rounded to float32: the reference."""
    return ((A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32),)


def _cublas(A, B, C, M, N, K):
    """The speed baseline: cuBLAS through torch.mm (float32 in and out; TF32 off unless the process turned it on)."""
    import torch

    return torch.mm(A, B, out=C)


def _gemm_bytes(shape):
    M, N, K = shape
    return 4 * (M * K + K * N + M * N)


# float32 sums of up to 257 products of N(0, 1) values: a few units of 1e-5 relative; wrong indexing is O(1).
_TOLERANCE = dict(rtol=1e-4, atol=1e-3)
_HINTS = {
    "out_of_bounds": "the grid is rounded up: guard the loads (`row < M && k < K`, `k < K && col < N`, zero "
                     "otherwise) and the store (`row < M && col < N`)",
    "wrong_values": "a tile that hangs over the edge of A or B must read zeros there, not the next row's elements; "
                    "and each slice adds As[ty][k] * Bs[k][tx] for k < 16 to the same accumulator",
    "race": "two barriers per slice: one after filling the tiles (before reading them) and one after the compute "
            "loop (before the next slice overwrites them)",
    "missing_barrier": "put `__syncthreads()` after filling the tiles and again after the compute loop",
    "no_shared": "stage each slice in `__shared__ float As[16][16], Bs[16][16]`: that is the exercise",
    "unwritten": "thread (tx, ty) of block (bx, by) writes C[by * 16 + ty][bx * 16 + tx] when it is inside C",
}

register(Exercise(
    id="05-smem-tiles",
    tutorial=TUTORIAL,
    title="Shared-memory tiles of 16",
    tests="__shared__ tiles, two barriers per slice, zero-filled edge tiles, guards on M, N and K",
    kind="cuda",
    kernel="sgemm_tile16",
    signature=SIGNATURE,
    task="C = A B for row-major float32 A (M x K), B (K x N), C (M x N), any sizes. Blocks of 16 x 16 threads, grid "
         "(ceil(N / 16), ceil(M / 16)): thread (tx, ty) of block (bx, by) computes C[by * 16 + ty][bx * 16 + tx]. "
         "Walk K in slices of 16 through two __shared__ 16 x 16 tiles, zeros where a tile hangs over an edge, a "
         "barrier before and after the compute loop.",
    make_args=_args,
    outputs=(2,),
    reference=_matmul,
    launch=Launch(grid=lambda shape, block: (ceil_div(shape[1], 16), ceil_div(shape[0], 16)), blocks=((16, 16),)),
    shapes=SHAPES,
    sanitize_shape=(33, 31, 17),
    needs_shared=True,
    needs_barrier=True,
    guards=("M", "N", "K"),
    hints=_HINTS,
    **_TOLERANCE,
))

register(Exercise(
    id="05-register-tiles",
    tutorial=TUTORIAL,
    title="A 4 x 4 block of C per thread",
    tests="register tiling (an outer product per k), shared tiles of 64 x 16 and 16 x 64, several loads per "
          "thread, guards",
    kind="cuda",
    kernel="sgemm_4x4",
    signature=SIGNATURE,
    task="C = A B as above. Blocks of 16 x 16 threads compute a 64 x 64 tile of C, grid (ceil(N / 64), "
         "ceil(M / 64)); thread (tx, ty) computes rows by * 64 + ty * 4 + i and columns bx * 64 + tx * 4 + j, "
         "i, j < 4, in registers. K in slices of 16 through __shared__ As[64][16] and Bs[16][64] (4 elements of "
         "each per thread, zeros past the edges). Speed bar: at least 25 % of cuBLAS at 2048^3.",
    make_args=_args,
    outputs=(2,),
    reference=_matmul,
    launch=Launch(grid=lambda shape, block: (ceil_div(shape[1], 64), ceil_div(shape[0], 64)), blocks=((16, 16),)),
    shapes=SHAPES,
    sanitize_shape=(70, 65, 17),
    needs_shared=True,
    needs_barrier=True,
    guards=("M", "N", "K"),
    speed=SpeedBar(fraction=0.25, baseline="cuBLAS (torch.mm)", run_baseline=_cublas, shape=(2048, 2048, 2048),
                   bytes=_gemm_bytes),
    hints={**_HINTS,
           "unwritten": "thread (tx, ty) writes the 16 elements C[by * 64 + ty * 4 + i][bx * 64 + tx * 4 + j] that "
                        "are inside C",
           "wrong_values": "each thread loads 4 elements of the 64 x 16 A slice and 4 of the 16 x 64 B slice "
                           "(element t + 256 i of each, zeros past the edges); per k it multiplies its 4 rows of As "
                           "by its 4 columns of Bs"},
    **_TOLERANCE,
))
