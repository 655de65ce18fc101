"""Exercises of tutorial 06 (tensor cores): a 16 x 16 tile with WMMA, then one mma.sync m16n8k16 fed by hand."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SassRule

TUTORIAL = "06-tensor-cores"
SIGNATURE = "const __half* A, const __half* B, float* C, int M, int N, int K"


def _args_in_tiles(tile_m, tile_n, tile_k):
    """make_args for shapes counted in tiles: (m, n, k) is M = tile_m m, N = tile_n n, K = tile_k k."""
    def make(shape, rng):
        m, n, k = shape
        return _args((tile_m * m, tile_n * n, tile_k * k), rng)
    return make


def _args(shape, rng):
    """fp16 A [M, K] and B [N, K] (both K-major), fp32 C [M, N] for C = A B^T."""
    M, N, K = shape
    return (rng.standard_normal((M, K), dtype=np.float32).astype(np.float16),
            rng.standard_normal((N, K), dtype=np.float32).astype(np.float16), np.empty((M, N), np.float32), M, N, K)


def _reference(A, B, C, M, N, K):
    """C = A B^T from the fp16 values, in float64, rounded to float32."""
    return ((A.astype(np.float64) @ B.astype(np.float64).T).astype(np.float32),)


_TENSOR_CORES = SassRule(r"\bHMMA\.", "no_tensor_cores",
                         "no HMMA in its SASS: the products run on the CUDA cores, not the tensor cores")
# Sums of up to 512 exact fp16 products in fp32: a few units of 1e-6 relative; a wrong fragment is O(1).
_TOLERANCE = dict(rtol=1e-3, atol=1e-3)

register(Exercise(
    id="06-wmma-tile",
    tutorial=TUTORIAL,
    title="One warp, one 16 x 16 tile with WMMA",
    tests="WMMA fragments, row_major A and col_major B for B^T, leading dimensions, the k loop, store_matrix_sync",
    kind="cuda",
    kernel="wmma_tile",
    signature=SIGNATURE,
    task="C = A B^T for fp16 A (M x K) and B (N x K), row-major, fp32 C (M x N); M, N, K multiples of 16. One warp "
         "per block computes the 16 x 16 tile of C at row blockIdx.y * 16, column blockIdx.x * 16 with WMMA: a "
         "matrix_a fragment row_major from A (ldm K), a matrix_b fragment col_major from B (ldm K), mma_sync over K "
         "in steps of 16, store_matrix_sync to C (ldm N). The grader's shapes count tiles: (m, n, k) is "
         "M = 16 m, N = 16 n, K = 16 k.",
    make_args=_args_in_tiles(16, 16, 16),
    outputs=(2,),
    reference=_reference,
    launch=Launch(grid=lambda shape, block: (shape[1], shape[0]), blocks=(32,)),
    shapes=((1, 1, 1), (2, 3, 4), (4, 1, 8), (8, 8, 16), (32, 64, 64)),      # in tiles of 16 x 16 x 16
    sanitize_shape=(2, 3, 4),
    guards=("K",),
    sass=(_TENSOR_CORES,),
    hints={
        "wrong_values": "B's rows are the columns of B^T: load the matrix_b fragment col_major from B + col0 * K + k "
                        "with leading dimension K, and add every 16-wide slice of k to one accumulator",
        "unwritten": "store the accumulator at C + row0 * N + col0 with leading dimension N, mem_row_major",
        "no_tensor_cores": "use nvcuda::wmma (load_matrix_sync, mma_sync, store_matrix_sync): that is the exercise",
    },
    **_TOLERANCE,
))

register(Exercise(
    id="06-mma-fragments",
    tutorial=TUTORIAL,
    title="mma.sync m16n8k16 with its fragments loaded by hand",
    tests="the A, B and D register layouts of mma.sync m16n8k16, packing two halves in a 32-bit register",
    kind="cuda",
    kernel="mma_fragments",
    signature=SIGNATURE,
    task="C = A B^T as above, M a multiple of 16, N of 8, K of 16. One warp per block computes the 16 x 8 tile at "
         "row blockIdx.y * 16, column blockIdx.x * 8 with one mma_16816<__half>(d, a, b) (#include <kl/mma.cuh>) "
         "per 16 of k, its registers loaded "
         "from global memory by the PTX fragment layout (g = lane / 4, t = lane % 4): a[0] = A[g][2t..2t+1], "
         "a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..], b[0] = B[g][2t..], b[1] = B[g][2t+8..] "
         "(relative to the tile and k); d[0], d[1] to C[g][2t, 2t+1], d[2], d[3] to C[g+8][2t, 2t+1]. The "
         "grader's shapes count tiles: (m, n, k) is M = 16 m, N = 8 n, K = 16 k.",
    make_args=_args_in_tiles(16, 8, 16),
    outputs=(2,),
    reference=_reference,
    launch=Launch(grid=lambda shape, block: (shape[1], shape[0]), blocks=(32,)),
    shapes=((1, 1, 1), (2, 3, 3), (4, 5, 10), (8, 16, 16), (32, 64, 64)),     # in tiles of 16 x 8 x 16
    sanitize_shape=(2, 3, 3),
    guards=("K",),
    sass=(_TENSOR_CORES,),
    hints={
        "wrong_values": "check each register against the layout: a[1] is row g + 8 (same columns as a[0]), a[2] "
                        "is columns 2t + 8, 2t + 9 of row g; d[2], d[3] go eight rows below d[0], d[1]",
        "unwritten": "each lane writes four elements: C[row0 + g][col0 + 2t, +1] and C[row0 + g + 8][col0 + 2t, +1]",
        "no_tensor_cores": "call mma_16816<__half>(d, a, b) (#include <kl/mma.cuh>) once per 16 of k: that is the "
                           "exercise",
    },
    **_TOLERANCE,
))
