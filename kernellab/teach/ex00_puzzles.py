"""Exercises of tutorial 00 (puzzles): twelve short Numba kernels, from a guarded map to a tiled matmul, each graded
in full in the simulator (launches on small shapes, NaN-filled outputs, and the race detector where shared memory is
used), so that all of them can be solved with no GPU.

Inputs of the sums (dot, cumsum, row and column sums, matmul) are small whole numbers stored as float32: every partial
sum is then exact, so the comparison does not depend on the order a kernel adds in, on the simulator or on a GPU.
"""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, ceil_div

TUTORIAL = "00-puzzles"
TPB = 32          # threads per block of the puzzles that fix the block (one warp)
BINS = 16         # 00-histogram's bins
TILE = 8          # 00-matmul's tile: TILE x TILE threads and elements
ROWS = 4          # 00-col-sums' block: TPB x ROWS threads

# The Numba spelling of the grader's default hints (they speak CUDA C++).
_NUMBA_HINTS = {
    "missing_barrier": "a `cuda.syncthreads()` is missing between the shared-memory write and the read: without it a "
                       "thread may read an element before the thread that writes it has",
    "race": "a `cuda.syncthreads()` is missing between the two lines named: one thread writes a shared element that "
            "another reads (or writes) with no barrier between them",
    "barrier": "every thread of the block must reach each `cuda.syncthreads()`: keep barriers outside `if`s that only "
               "some threads take (guard the memory accesses instead)",
    "no_shared": "the task goes through shared memory: `cuda.shared.array(shape, numba.float32)`, fill it, then read "
                 "it back",
    "no_store": "the kernel never writes its output: replace the `# TODO` and `pass` with the body",
    "launch_config": "the kernel must work for every block size the grader tries: use cuda.blockDim (or "
                     "cuda.grid), not a number written into the kernel",
}


def _puzzle(**kw) -> Exercise:
    """An Exercise of this tutorial: Numba, with the Numba hints under its own."""
    return register(Exercise(tutorial=TUTORIAL, kind="numba", hints={**_NUMBA_HINTS, **kw.pop("hints", {})}, **kw))


def _randn(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _whole(rng, shape, bound: int = 4) -> np.ndarray:
    """Whole numbers in [-bound, bound] as float32: sums of them are exact."""
    return rng.integers(-bound, bound + 1, size=shape).astype(np.float32)


def _grid1(shape, block):
    return ceil_div(shape[0], block)


def _grid2(shape, block):
    rows, cols = shape
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])            # x over columns, y over rows


# --- 00-map: the global thread index and the guard -------------------------------------------------------------

_puzzle(
    id="00-map", title="Map: one thread per element",
    tests="the global thread index, the `i < n` guard, any block size",
    kernel="fahrenheit", signature="celsius, out, n",
    task="out[i] = celsius[i] * 9 / 5 + 32 for every i < n, one thread per element. The grader launches "
         "ceil(n / block) blocks of 32 or 128 threads, so the last block has threads past the end: guard them.",
    make_args=lambda shape, rng: (_randn(rng, shape[0]) * 40, np.empty(shape[0], np.float32), shape[0]),
    outputs=(1,),
    reference=lambda celsius, out, n: (celsius * 9 / 5 + 32,),
    # The + 32 rounds at the scale of 32 (a float32 ulp there is 4e-6), so results near 0 carry that absolute error
    # whichever way the kernel computes: Numba on a GPU does `* 9 / 5` in float64 (an int literal makes the product
    # float64), NumPy's reference in float32, and 27 of 100,003 elements differed by 2e-6 on an H100.
    atol=2e-5,
    launch=Launch(grid=_grid1, blocks=(32, 128)),
    shapes=(1, 31, 100, 257, 100_003), sim_shapes=(1, 31, 100, 257), sanitize_shape=100,
    hints={
        "out_of_bounds": "guard `if i < n:`: the grid is rounded up to whole blocks, so the last block has threads "
                         "past the end of the array",
        "unwritten": "each thread writes out[i] for its own i = cuda.blockIdx.x * cuda.blockDim.x + "
                     "cuda.threadIdx.x (or cuda.grid(1)): threadIdx alone repeats in every block",
        "wrong_values": "out[i] = celsius[i] * 9 / 5 + 32",
    },
)


# --- 00-tril: a 2-D grid, a guard on each axis, and both branches written ------------------------------------------

_puzzle(
    id="00-tril", title="2-D indexing: the lower triangle",
    tests="2-D thread indices (x for columns, y for rows), a guard on each axis, writing every element",
    kernel="lower", signature="x, out",
    task="out = np.tril(x): out[r, c] = x[r, c] where c <= r, else 0, for x of any rows x cols. The thread at "
         "column c = blockIdx.x * blockDim.x + threadIdx.x and row r = blockIdx.y * blockDim.y + threadIdx.y "
         "(cuda.grid(2) gives both) writes out[r, c]; the grid is rounded up in x and in y, with blocks of 8 x 8 "
         "or 16 x 4 threads.",
    make_args=lambda shape, rng: (_randn(rng, shape), np.empty(shape, np.float32)),
    outputs=(1,),
    reference=lambda x, out: (np.tril(x),),
    launch=Launch(grid=_grid2, blocks=((8, 8), (16, 4))),
    shapes=((1, 1), (5, 9), (17, 6), (20, 20), (300, 500)), sim_shapes=((1, 1), (5, 9), (17, 6), (20, 20)),
    sanitize_shape=(17, 6),
    hints={
        "out_of_bounds": "guard both axes, `if r < rows and c < cols:` (rows, cols = x.shape): the grid is rounded "
                         "up in x and in y",
        "unwritten": "every element is written: x[r, c] on and below the diagonal, and 0 above it",
        "wrong_values": "on and below the diagonal (c <= r) out[r, c] = x[r, c]; above it 0. x's rows go with the "
                        "y index, its columns with x",
    },
)


# --- 00-broadcast: a matrix with a vector along each axis ---------------------------------------------------------

def _affine_args(shape, rng):
    rows, cols = shape
    return (_randn(rng, shape), _randn(rng, rows), _randn(rng, cols), np.empty(shape, np.float32))


_puzzle(
    id="00-broadcast", title="Broadcast: a scale per row, a bias per column",
    tests="which index goes with which vector, 2-D guards, shapes taken from the arrays",
    kernel="affine", signature="x, scale, bias, out",
    task="out = x * scale[:, None] + bias[None, :]: row r of x is scaled by scale[r] and column c shifted by "
         "bias[c]. One thread per element of out, as in 00-tril; blocks of 8 x 8 or 32 x 4 threads.",
    make_args=_affine_args,
    outputs=(3,),
    reference=lambda x, scale, bias, out: (x * scale[:, None] + bias[None, :],),
    launch=Launch(grid=_grid2, blocks=((8, 8), (32, 4))),
    shapes=((1, 1), (3, 11), (13, 5), (300, 500)), sim_shapes=((1, 1), (3, 11), (13, 5)),
    sanitize_shape=(13, 5),
    hints={
        "out_of_bounds": "scale has one entry per row (index it with r), bias one per column (with c); and guard "
                         "both axes",
        "wrong_values": "out[r, c] = x[r, c] * scale[r] + bias[c]",
    },
)


# --- 00-grid-stride: a grid smaller than the data ------------------------------------------------------------------

def _stride_grids(shape, block):
    """One block, two blocks, and enough blocks: the kernel must cover n elements with any of them."""
    return [1, 2, ceil_div(shape[0], block)]


_puzzle(
    id="00-grid-stride", title="Blocks: a grid-stride loop",
    tests="gridDim, a loop that strides by the whole grid, any grid and block size",
    kernel="relu", signature="x, out, n",
    task="out = np.maximum(x, 0) for n elements, with whatever grid the launch gives: the grader launches 1 block, "
         "2 blocks and ceil(n / block) blocks, of 32 or 64 threads, so each thread handles the elements i, "
         "i + stride, i + 2 * stride, ... where i is its global index and stride the number of threads in the grid "
         "(cuda.gridsize(1), or cuda.gridDim.x * cuda.blockDim.x).",
    make_args=lambda shape, rng: (_randn(rng, shape[0]), np.empty(shape[0], np.float32), shape[0]),
    outputs=(1,),
    reference=lambda x, out, n: (np.maximum(x, 0),),
    launch=Launch(grid=_stride_grids, blocks=(32, 64)),
    shapes=(1, 33, 200, 100_003), sim_shapes=(1, 33, 200), sanitize_shape=200,
    hints={
        "unwritten": "with one block of 32 threads, 200 elements need a loop: `for j in range(i, n, stride):` with "
                     "i the thread's global index and stride = cuda.gridsize(1)",
        "out_of_bounds": "the loop's bound is n: `range(i, n, stride)` stops before the end",
    },
)


# --- 00-flip: a shared array and the first barrier -----------------------------------------------------------------

def _flip_ref(x, out, n):
    return (np.concatenate([x[s:s + TPB][::-1] for s in range(0, n, TPB)]),)


_puzzle(
    id="00-flip", title="Shared memory: flip each chunk of 32",
    tests="cuda.shared.array, cuda.syncthreads() between writing and reading it, a short last chunk",
    kernel="flip", signature="x, out, n",
    task="Reverse each run of 32 elements of x (the last run may be shorter): block b handles elements "
         "32 b .. 32 b + 31, with 32 threads. Each thread loads its element into a shared array of 32 floats; after "
         "a barrier, thread t writes element t of the block's run from the shared array, counted from the run's "
         "end. The grader launches ceil(n / 32) blocks of 32 threads.",
    make_args=lambda shape, rng: (_randn(rng, shape[0]), np.empty(shape[0], np.float32), shape[0]),
    outputs=(1,),
    reference=_flip_ref,
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], TPB), blocks=(TPB,)),
    shapes=(1, 32, 45, 100, 100_003), sim_shapes=(1, 32, 45, 100), sanitize_shape=45,
    needs_shared=True, needs_barrier=True,
    hints={
        "out_of_bounds": "guard the load and the store with `i < n`: the last block runs past the end",
        "wrong_values": "the last run is shorter: its length is min(32, n - start), and thread t reads "
                        "tile[length - 1 - t]",
        "off_by_one": "thread t of a run of `length` elements reads tile[length - 1 - t]",
    },
)


# --- 00-blur: a stencil with a halo --------------------------------------------------------------------------------

def _blur_ref(x, out, n):
    p = np.pad(x, 1)                                                  # x[-1] = x[n] = 0
    return (0.25 * p[:-2] + 0.5 * p[1:-1] + 0.25 * p[2:],)


_puzzle(
    id="00-blur", title="Stencil: a three-point blur with a halo",
    tests="a shared tile with a halo element on each side, zero padding at the ends, a barrier",
    kernel="blur", signature="x, out, n",
    task="out[i] = 0.25 x[i-1] + 0.5 x[i] + 0.25 x[i+1] for every i < n, with x[-1] and x[n] taken as 0. "
         "Block b (32 threads) handles elements 32 b .. 32 b + 31: it loads them "
         "into a shared tile of 34 floats at positions 1..32, and the two neighbours outside the block (the halo) "
         "at positions 0 and 33, then after a barrier each thread reads three tile elements. The grader launches "
         "ceil(n / 32) blocks of 32 threads.",
    make_args=lambda shape, rng: (_whole(rng, shape[0]), np.empty(shape[0], np.float32), shape[0]),
    outputs=(1,),
    reference=_blur_ref,
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], TPB), blocks=(TPB,)),
    shapes=(1, 2, 33, 70, 100_003), sim_shapes=(1, 2, 33, 70), sanitize_shape=70,
    needs_shared=True, needs_barrier=True, atol=0.0, rtol=0.0,
    hints={
        "wrong_values": "the first and last thread of each block need the halo: tile[0] = x[i - 1] (0 when i == 0) "
                        "and tile[33] = x[i + 1] (0 past the end)",
        "out_of_bounds": "guard every read of x: i < n for the element, i - 1 >= 0 and i + 1 < n for the halo",
    },
)


# --- 00-dot: a reduction in shared memory, with barriers ------------------------------------------------------------

def _dot_args(shape, rng):
    """Whole numbers 1..4: every product counts (a partial sum left out always changes the total)."""
    (n,) = shape
    a, b = (rng.integers(1, 5, size=n).astype(np.float32) for _ in range(2))
    return a, b, np.empty(1, np.float32), n


_puzzle(
    id="00-dot", title="Dot product: a tree reduction",
    tests="a per-thread partial sum, a tree reduction in shared memory, a barrier after every level",
    kernel="dot", signature="a, b, out, n",
    task="out[0] = np.dot(a, b) with one block of 32 threads for any n: each thread sums a[i] * b[i] over "
         "i = t, t + 32, t + 64, ... into a register, stores it to a shared array of 32 floats, and the block adds "
         "them up in a tree (16 threads add pairs, then 8, 4, 2, 1) with a barrier after each level; thread 0 "
         "writes the total. The grader launches 1 block of 32 threads.",
    make_args=_dot_args,
    outputs=(2,),
    reference=lambda a, b, out, n: (np.array([np.dot(a.astype(np.float64), b)], np.float32),),
    launch=Launch(grid=lambda shape, block: 1, blocks=(TPB,)),
    shapes=(1, 5, 32, 100, 200_000), sim_shapes=(1, 5, 32, 100), sanitize_shape=100,
    needs_shared=True, needs_barrier=True, atol=0.0, rtol=0.0,
    hints={
        "wrong_values": "each thread sums a[i] * b[i] for i = t, t + 32, ... < n before the tree; the tree halves "
                        "from 16: `s = 16, 8, 4, 2, 1`, with thread t < s adding cache[t + s] into cache[t]",
    },
)


# --- 00-cumsum: a scan with two barriers per step, and a carry ------------------------------------------------------

_puzzle(
    id="00-cumsum", title="Prefix sum: a scan in shared memory",
    tests="the Hillis-Steele scan, a barrier between reading and writing, a carry across chunks",
    kernel="cumsum", signature="x, out, n",
    task="out = np.cumsum(x) with one block of 32 threads for any n: the block walks x in chunks of 32. For each "
         "chunk it loads the elements into a shared array, scans it (for step = 1, 2, 4, 8, 16: thread t adds "
         "tile[t - step] to tile[t], where t >= step; every thread reads before any writes), writes "
         "out[i] = carry + tile[t], and adds the chunk's total, tile[31], to the carry. The grader launches 1 block "
         "of 32 threads.",
    make_args=lambda shape, rng: (_whole(rng, shape[0]), np.empty(shape[0], np.float32), shape[0]),
    outputs=(1,),
    reference=lambda x, out, n: (np.cumsum(x, dtype=np.float64).astype(np.float32),),
    launch=Launch(grid=lambda shape, block: 1, blocks=(TPB,)),
    shapes=(1, 7, 32, 100, 100_003), sim_shapes=(1, 7, 32, 100), sanitize_shape=100,
    needs_shared=True, needs_barrier=True, atol=0.0, rtol=0.0,
    hints={
        "race": "a scan step needs two `cuda.syncthreads()`: one after every thread has read tile[t - step] "
                "(before any writes), one after the writes (before the next step reads); and one more before the "
                "next chunk's loads overwrite the tile that tile[31] was read from",
        "wrong_values": "each chunk's values add the carry: the sum of all the chunks before it",
        "unwritten": "the block walks every chunk: `for start in range(0, n, 32):`",
    },
)


# --- 00-row-sums: one warp per row, and warp shuffles ------------------------------------------------------------

_puzzle(
    id="00-row-sums", title="Axis sum (rows): one warp per row, with shuffles",
    tests="blockIdx picking the row, lanes striding the columns, cuda.shfl_down_sync to add across a warp",
    kernel="row_sums", signature="x, out",
    task="out = x.sum(axis=1): block r (32 threads, one warp) sums row r. Lane t adds x[r, t], x[r, t + 32], ... "
         "into a register; then five shuffles add the 32 partial sums: for offset 16, 8, 4, 2, 1, "
         "`acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, offset)`, after which lane 0 holds the row's sum and "
         "writes it. No shared memory is needed. The grader launches one block of 32 threads per row.",
    make_args=lambda shape, rng: (_whole(rng, shape), np.empty(shape[0], np.float32)),
    outputs=(1,),
    reference=lambda x, out: (x.sum(axis=1, dtype=np.float64).astype(np.float32),),
    launch=Launch(grid=lambda shape, block: shape[0], blocks=(TPB,)),
    shapes=((1, 1), (3, 20), (3, 40), (5, 70), (1000, 1000)), sim_shapes=((1, 1), (3, 20), (3, 40), (5, 70)),
    sanitize_shape=(3, 20), atol=0.0, rtol=0.0,        # memcheck on a GPU: rows shorter than a warp
    hints={
        "wrong_values": "lane t sums x[r, t], x[r, t + 32], ... over the whole row first; then offsets 16, 8, 4, 2, "
                        "1 each halve the lanes holding a partial sum, and only lane 0 (with the total) writes",
    },
)


# --- 00-col-sums: a 2-D block, and a reduction along y in shared memory ---------------------------------------------

_puzzle(
    id="00-col-sums", title="Axis sum (columns): a 2-D block and a shared reduction",
    tests="a 2-D block, a 2-D shared array, reducing along threadIdx.y, guards that leave the barriers alone",
    kernel="col_sums", signature="x, out",
    task="out = x.sum(axis=0) with blocks of 32 x 4 threads: block b handles columns 32 b .. 32 b + 31, thread "
         "(tx, ty) sums column c = 32 b + tx over rows ty, ty + 4, ty + 8, ... into a register, stores it to a "
         "shared (4, 32) array at [ty, tx], and after a barrier the threads with ty == 0 add the four partial sums "
         "of their column and write out[c]. The grader launches ceil(cols / 32) blocks of 32 x 4 threads.",
    make_args=lambda shape, rng: (_whole(rng, shape), np.empty(shape[1], np.float32)),
    outputs=(1,),
    reference=lambda x, out: (x.sum(axis=0, dtype=np.float64).astype(np.float32),),
    launch=Launch(grid=lambda shape, block: ceil_div(shape[1], TPB), blocks=((TPB, ROWS),)),
    shapes=((1, 1), (9, 5), (6, 40), (33, 70), (1000, 1000)), sim_shapes=((1, 1), (9, 5), (6, 40), (33, 70)),
    sanitize_shape=(6, 40),
    needs_shared=True, needs_barrier=True, atol=0.0, rtol=0.0,
    hints={
        "out_of_bounds": "guard the column, `c < cols`, around the reads and the store, but not around "
                         "cuda.syncthreads(): every thread of the block must reach it",
        "wrong_values": "thread (tx, ty) sums rows ty, ty + 4, ty + 8, ... < rows of its column; then the four "
                        "partial sums of a column are added",
    },
)


# --- 00-histogram: shared atomics, and barriers around them ---------------------------------------------------------

_puzzle(
    id="00-histogram", title="Histogram: shared-memory atomics",
    tests="cuda.atomic.add on a shared array, zeroing it first, barriers before and after the atomics",
    kernel="histogram", signature="x, counts, n",
    task="counts = np.bincount(x, minlength=16): x holds n values in 0..15 (int32), counts 16 int32. One block of "
         "32 threads: threads 0..15 zero a shared array of 16 counters; after a barrier every thread adds 1 to "
         "the counter of each of its values x[t], x[t + 32], ... with cuda.atomic.add (two threads may add to the "
         "same counter at once); after another barrier threads 0..15 copy the counters to counts. The grader "
         "launches 1 block of 32 threads.",
    make_args=lambda shape, rng: (rng.integers(0, BINS, size=shape[0]).astype(np.int32), np.empty(BINS, np.int32),
                                  shape[0]),
    outputs=(1,),
    reference=lambda x, counts, n: (np.bincount(x, minlength=BINS).astype(np.int32),),
    launch=Launch(grid=lambda shape, block: 1, blocks=(TPB,)),
    shapes=(1, 20, 100, 200_000), sim_shapes=(1, 20, 100), sanitize_shape=100,
    needs_shared=True, needs_barrier=True,
    hints={
        "race": "counters are added to with cuda.atomic.add(h, x[i], 1), never h[x[i]] += 1 (a read, then a "
                "write: two threads can both read the old count); and a `cuda.syncthreads()` separates zeroing, "
                "adding and copying out",
        "wrong_values": "zero the 16 shared counters first; then every value adds 1 to its counter; then copy the "
                        "counters out",
    },
)


# --- 00-matmul: shared tiles, two barriers per step, edge tiles ----------------------------------------------------

def _matmul_args(shape, rng):
    m, k, n = shape
    return _whole(rng, (m, k), 3), _whole(rng, (k, n), 3), np.empty((m, n), np.float32)


_puzzle(
    id="00-matmul", title="Tiled matmul",
    tests="two shared tiles, a barrier after loading and one after using them, zero-filled edge tiles",
    kernel="matmul", signature="a, b, c",
    task="c = a @ b for a of m x k and b of k x n, with blocks of 8 x 8 threads: block (bx, by) computes the 8 x 8 "
         "tile of c at rows 8 by .. and columns 8 bx ..; thread (tx, ty) computes c[row, col] with row = 8 by + ty "
         "and col = 8 bx + tx. For each step of 8 along k, the block loads an 8 x 8 tile of a and one of b into "
         "shared arrays (0 where the tile runs past the matrix), waits, adds the 8 products of its row of a's tile "
         "and column of b's tile, and waits again before the next load. The grader launches "
         "(ceil(n / 8), ceil(m / 8)) blocks of 8 x 8 threads.",
    make_args=_matmul_args,
    outputs=(2,),
    reference=lambda a, b, c: ((a.astype(np.float64) @ b).astype(np.float32),),
    launch=Launch(grid=lambda shape, block: (ceil_div(shape[2], TILE), ceil_div(shape[0], TILE)),
                  blocks=((TILE, TILE),)),
    shapes=((1, 1, 1), (5, 9, 3), (9, 17, 10), (16, 8, 16), (300, 200, 400)),
    sim_shapes=((1, 1, 1), (5, 9, 3), (9, 17, 10), (16, 8, 16)), sanitize_shape=(9, 17, 10),
    needs_shared=True, needs_barrier=True, atol=0.0, rtol=0.0,
    hints={
        "race": "two `cuda.syncthreads()` per step along k: after loading the tiles (before any thread uses "
                "them), and after using them (before the next step's loads overwrite them)",
        "out_of_bounds": "edge tiles run past the matrices: load 0 where the row, the column or the k index is "
                         "outside, and store only where row < m and col < n",
        "wrong_values": "the last step along k is partial when k is not a multiple of 8: zero-fill it rather than "
                        "skipping it",
    },
)
