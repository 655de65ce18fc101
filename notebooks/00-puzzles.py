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
# # 00 · Puzzles: twelve small kernels, no GPU needed
#
# **What you will learn**
# - how a CUDA thread finds its data: `threadIdx`, `blockIdx`, `blockDim` and `gridDim`, in one and two
#   dimensions, and why almost every kernel needs a guard;
# - how a fixed grid covers more data than it has threads (a grid-stride loop);
# - shared memory, a block's own scratchpad, and `cuda.syncthreads()`, the barrier that makes it safe to share;
# - the patterns most kernels are built from: a stencil, a tree reduction, warp shuffles, a scan, atomics, and a
#   tiled matrix multiply;
# - how to read a race report: two lines, two threads, one shared-memory address.
#
# **How it works.** Each puzzle is a kernel you write in Python with Numba's `@cuda.jit`, in a `%%numba --sim`
# cell: `--sim` runs it in Numba's CUDA simulator, which executes every thread of the launch on the CPU, so you
# need no GPU (and where there is one, the puzzles still run and are graded in the simulator, the same for
# everyone; the last cell grades them on the GPU too). A puzzle is four things: the *spec*,
# a few lines of NumPy that say what the kernel must compute; what it teaches; a *stub* cell with the kernel's
# signature, a `# TODO` and how many lines the body takes; and a *grader* cell, `kernellab.grade("00-...", kernel)`.
#
# The grader launches your kernel in the simulator on several small shapes, the awkward ones included (a single
# element, sizes that are not a multiple of the block), with fresh random inputs every time and the outputs filled
# with NaN first, so that an element no thread writes shows up as *never written* rather than as a lucky zero. It
# compares every output with the spec. Where the puzzle uses shared memory it also runs the simulator's race
# detector, barrier check and shared-memory initcheck (`kernel.sanitize(..., tool="racecheck+synccheck+initcheck")`),
# which report a missing `cuda.syncthreads()` as a race between the two lines involved, a barrier that only some
# threads reach as a barrier error, and a read of a tile element no thread stored (say, a short last block read as if
# it were full) as uninitialized, and it compiles the kernel for a real GPU (sm_90) to check that the machine code holds
# shared-memory accesses and a barrier. A wrong kernel gets a FAILED verdict with findings and hints, never
# an exception, so Run All always reaches the end. The solutions are not in this notebook.
#
# The simulator runs some 20,000 threads a second: when you try things out yourself, keep the arrays small.

# %%
# %load_ext kernellab
import numpy as np

import kernellab

kernellab.exercises("00")

# %% [markdown]
# ## Numba on one page
#
# | | |
# |---|---|
# | `cuda.threadIdx.x`, `.y`, `.z` | this thread's index within its block |
# | `cuda.blockIdx.x`, `cuda.blockDim.x`, `cuda.gridDim.x` | this block's index, the threads per block, the blocks in the grid |
# | `cuda.grid(1)`; `x, y = cuda.grid(2)` | `blockIdx.x * blockDim.x + threadIdx.x`: the thread's index in the whole grid (per axis) |
# | `cuda.gridsize(1)` | `gridDim.x * blockDim.x`: the number of threads in the grid |
# | `cuda.shared.array(shape, numba.float32)` | an array shared by the block's threads; `shape` must be a constant (a number, or a global like `TPB`) |
# | `cuda.syncthreads()` | wait until every thread of the block gets here |
# | `cuda.atomic.add(array, index, value)` | add without losing another thread's add to the same element |
# | `cuda.shfl_down_sync(0xFFFFFFFF, value, d)` | the `value` of the lane `d` places up in the warp |
# | `rows, cols = x.shape` | arrays know their shape inside a kernel |
# | `kernel[grid, block](args)` | launch; in the simulator the arguments are NumPy arrays, written back after |
#
# A warm-up that is not a puzzle: one block of eight threads negates eight numbers, one thread per element.

# %%
# %%numba --sim
from numba import cuda


@cuda.jit
def negate(x, out):
    i = cuda.threadIdx.x          # one block: the thread's index in the block is its element
    out[i] = -x[i]


# %%
x = np.arange(8, dtype=np.float32)
out = np.zeros_like(x)
negate[1, 8](x, out)               # grid: 1 block; block: 8 threads
out

# %% [markdown]
# `negate` has no guard: it trusts the launch to have exactly one thread per element. Launch it with 16 threads
# and threads 8 to 15 index past the end. On a GPU that silently reads and writes memory that is not the array's
# (or faults); the simulator stops at the first such access and names the thread, the block and the cell line:

# %%
try:
    negate[1, 16](x, out)
except kernellab.KernellabError as exc:
    print(exc)

# %% [markdown]
# ## 1 · Map, with a guard
#
# ```python
# out = celsius * 9 / 5 + 32          # celsius, out: float32[n]
# ```
#
# One thread per element, but now the array is longer than a block: the grader launches `ceil(n / block)` blocks of
# 32 or 128 threads, for n = 1, 31, 100 and 257. A thread's element is its index in the whole grid,
# `cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x` (`cuda.grid(1)`), and since the grid is rounded up to whole
# blocks, the threads past `n` must do nothing: that `if` is the *guard*. Use `blockDim`, not 32: the grader tries
# two block sizes and says so if your kernel works with one only.

# %%
# %%numba --sim
# exercise: 00-map
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    # TODO (3 lines): this thread's index i in the grid; a guard; out[i] = celsius[i] * 9 / 5 + 32
    pass


# %%
kernellab.grade("00-map", fahrenheit)

# %% [markdown]
# ## 2 · Two dimensions: the lower triangle
#
# ```python
# out = np.tril(x)                     # x, out: float32[rows, cols]; out[r, c] = x[r, c] if c <= r else 0
# ```
#
# A 2-D grid of 2-D blocks: the x axis runs along the columns and y along the rows (the x index varies fastest,
# as a row-major array's column index does), so `c, r = cuda.grid(2)`. The grid is rounded up on both axes,
# so guard both. Every element of `out` needs a thread that writes it, the zeros above the diagonal included.
# Blocks of 8 x 8 and 16 x 4 threads.

# %%
# %%numba --sim
# exercise: 00-tril
from numba import cuda


@cuda.jit
def lower(x, out):
    # TODO (4 lines): the thread's column c and row r; x's shape; a guard on both; out[r, c]
    pass


# %%
kernellab.grade("00-tril", lower)

# %% [markdown]
# ## 3 · Broadcast: a scale per row, a bias per column
#
# ```python
# out = x * scale[:, None] + bias[None, :]    # x, out: float32[rows, cols]; scale: [rows]; bias: [cols]
# ```
#
# NumPy stretches `scale` along the columns and `bias` along the rows; a kernel does the same by indexing
# `scale` with the row and `bias` with the column. Mixing them up is a classic: on a matrix that is not square
# one of them runs past its end. Blocks of 8 x 8 and 32 x 4 threads.

# %%
# %%numba --sim
# exercise: 00-broadcast
from numba import cuda


@cuda.jit
def affine(x, scale, bias, out):
    # TODO (4 lines): as in 00-tril, then out[r, c] from x[r, c], scale[r] and bias[c]
    pass


# %%
kernellab.grade("00-broadcast", affine)

# %% [markdown]
# ## 4 · Blocks: a grid smaller than the data
#
# ```python
# out = np.maximum(x, 0)               # x, out: float32[n]; launched with 1, 2 or ceil(n / block) blocks
# ```
#
# So far the grid had a thread per element. Often it does not: a kernel may be launched with a grid sized for
# the GPU (a few blocks per SM) rather than for the data. Then each thread handles the elements `i`,
# `i + stride`, `i + 2 * stride`, ... where `i` is its index in the grid and `stride = cuda.gridsize(1)` is the
# number of threads in the grid: a *grid-stride loop*. The grader launches one block, two blocks, and enough
# blocks, of 32 or 64 threads, on n = 1, 33 and 200: the same kernel must be right for each. No `if` is needed:
# `range` stops at `n`.

# %%
# %%numba --sim
# exercise: 00-grid-stride
from numba import cuda


@cuda.jit
def relu(x, out, n):
    # TODO (3 lines): the first element and the stride; a loop from one to n by the other; out[i]
    pass


# %%
kernellab.grade("00-grid-stride", relu)

# %% [markdown]
# ## Shared memory and the barrier
#
# Each block has a small, fast memory of its own, visible to its threads and to no other block: shared memory,
# `cuda.shared.array(shape, dtype)` (up to 48 KB per block declared this way; an H100 has 228 KB per SM). Threads
# use it to hand data to each other, and that needs an order: a thread may read an element only after the thread
# that writes it has written it. Nothing orders two threads by itself. `cuda.syncthreads()` is the *barrier*: no thread of the block goes past it until
# every thread has reached it.
#
# Here is a kernel that gets this wrong. Each of 32 threads stores its element in a shared tile and reads its
# neighbour's:

# %%
# %%numba --sim
import numba
from numba import cuda

W = 32   # one warp


@cuda.jit
def rotate_racy(x, out):
    tile = cuda.shared.array(W, numba.float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    out[t] = tile[(t + 1) % W]           # thread t + 1's element: has thread t + 1 written it yet?


@cuda.jit
def rotate(x, out):
    tile = cuda.shared.array(W, numba.float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    cuda.syncthreads()                   # every element is in the tile before anyone reads one
    out[t] = tile[(t + 1) % W]


# %%
x = np.arange(W, dtype=np.float32)
out = np.zeros_like(x)
rotate_racy[1, W](x, out)
print("racy: ", out[:8], "...")
rotate[1, W](x, out)
print("fixed:", out[:8], "...")

# %% [markdown]
# The simulator runs each thread until it reaches a barrier (or ends) before the next one starts, so in
# `rotate_racy` thread 0 reads `tile[1]` before thread 1 has stored anything: whatever the memory held. On a GPU
# the 32 threads of one warp usually execute the store together before any of them loads, and the same kernel
# often prints the right answer, which is exactly why such a bug survives testing. A race detector does not
# depend on luck: it records every shared-memory access with its thread, its line and the barriers the thread has
# passed, and reports each pair of accesses to one address, by different threads, with no barrier between them and
# at least one of them a write, as compute-sanitizer's racecheck does on a GPU:

# %%
rotate_racy.sanitize(1, W, x, out, tool="racecheck")

# %% [markdown]
# Read it as: a *read-after-write* hazard on `tile[0]`, between the write on one cell line and the read on the
# other, by threads 0 and 31 (thread 31 reads `tile[0]`, which thread 0 writes). With the barrier it is clean:

# %%
rotate.sanitize(1, W, x, out, tool="racecheck")

# %% [markdown]
# The simulator can also trace a launch's shared-memory accesses and model how the hardware serves each warp's
# access: shared memory is split into 32 banks of 4-byte words, and a warp's access takes one pass (*wavefront*)
# per distinct word it needs from the busiest bank. Thread `t` touching word `t` (or `t + 1`) hits 32 different
# banks: one wavefront, no conflict. (Tutorial 02 is about the layouts where this goes wrong.)

# %%
rotate.trace_banks(1, W, x, out)

# %% [markdown]
# The grader runs the race detector (and the barrier check) on every shared-memory puzzle from here on.
#
# ## 5 · Shared memory: flip each chunk of 32
#
# ```python
# out = np.concatenate([x[s:s + 32][::-1] for s in range(0, n, 32)])   # x, out: float32[n]
# ```
#
# Block `b` (32 threads) owns the chunk `x[32 b : 32 b + 32]`. Each thread loads its element into a shared tile;
# after a barrier, thread `t` writes element `t` of the chunk from the tile, counted from the chunk's end. The last
# chunk may be shorter than 32 (n = 45 and 100 are among the shapes), and its reversal starts at its own last
# element. The grader launches `ceil(n / 32)` blocks of 32 threads. (The task could be done without shared memory;
# do it through the tile, which is the point, and the grader checks that the kernel uses one.)

# %%
# %%numba --sim
# exercise: 00-flip
import numba
from numba import cuda

TPB = 32   # threads per block, and elements per chunk


@cuda.jit
def flip(x, out, n):
    # TODO (9 lines): a shared tile of TPB floats; load your element (guarded); a barrier;
    #      the chunk's length; write out[i] from the tile
    pass


# %%
kernellab.grade("00-flip", flip)

# %% [markdown]
# ## 6 · Stencil: a three-point blur with a halo
#
# ```python
# p = np.pad(x, 1)                                    # a zero before x[0] and one after x[n - 1]
# out = 0.25 * p[:-2] + 0.5 * p[1:-1] + 0.25 * p[2:]  # out[i] = (x[i-1] + 2 x[i] + x[i+1]) / 4
# ```
#
# Each output needs its element and both neighbours, and each input is read by three threads: a block loads its
# 32 elements into shared memory once and reads them from there. The threads at a block's edges need one element
# beyond it on each side, the *halo*: the tile holds 34 floats, the block's elements at positions 1..32, the left
# neighbour at 0 and the right one at 33, loaded by the first and the last thread. At the ends of the array the
# neighbours are zeros. The grader launches `ceil(n / 32)` blocks of 32 threads, with n = 1, 2, 33 and 70.

# %%
# %%numba --sim
# exercise: 00-blur
import numba
from numba import cuda

TPB = 32          # threads per block
HALO = TPB + 2    # the tile: one neighbour, the block's 32 elements, one neighbour


@cuda.jit
def blur(x, out, n):
    # TODO (11 lines): a shared tile of HALO floats; each thread loads x[i] into tile[t + 1] (0 past the end);
    #      thread 0 loads the left neighbour, thread TPB - 1 the right one; a barrier; out[i] from three tile elements
    pass


# %%
kernellab.grade("00-blur", blur)

# %% [markdown]
# ## 7 · Dot product: a tree reduction
#
# ```python
# out[0] = a @ b                       # a, b: float32[n]; out: float32[1]
# ```
#
# One block of 32 threads, any `n`. First each thread adds up its share of the products, `a[i] * b[i]` for
# `i = t, t + 32, t + 64, ...`, in a register. Then the block adds the 32 partial sums in a *tree*: in a shared
# array `cache`, the threads `t < 16` add `cache[t + 16]` into `cache[t]`, then `t < 8` add `cache[t + 8]`, and so
# on down to 1, after which `cache[0]` holds the total and thread 0 writes it. Each level reads what the previous
# level wrote, so a barrier goes after every level (outside the `if t < s`, where every thread reaches it), and
# one before the first. Inputs are whole numbers, so the sum is exact in any order.

# %%
# %%numba --sim
# exercise: 00-dot
import numba
from numba import cuda

TPB = 32   # the one block's threads


@cuda.jit
def dot(a, b, out, n):
    # TODO (13 lines): a shared cache of TPB floats; a partial sum over i = t, t + TPB, ...; store it; a barrier;
    #      the tree: s = 16, 8, 4, 2, 1 with a barrier after each level; thread 0 writes out[0]
    pass


# %%
kernellab.grade("00-dot", dot)

# %% [markdown]
# ## 8 · Prefix sum: a scan
#
# ```python
# out = np.cumsum(x)                   # x, out: float32[n]; out[i] = x[0] + ... + x[i]
# ```
#
# One block of 32 threads walks `x` in chunks of 32. Within a chunk it runs the Hillis-Steele scan: for
# `step = 1, 2, 4, 8, 16`, thread `t` adds `tile[t - step]` to `tile[t]` (if `t >= step`); after five steps
# `tile[t]` is the sum of the chunk's first `t + 1` elements. The catch: in one step thread `t` *reads*
# `tile[t - step]` while thread `t - step` *writes* it. Every thread must read before any thread writes, so each
# step has two barriers: one between the read (into a register) and the write, one after the write. Then
# `out[i] = carry + tile[t]`, where `carry` is the total of the chunks before, and `tile[31]`, this chunk's total,
# is added to the carry, all before the next chunk's loads overwrite the tile (one more barrier). Leave a barrier
# out and the race report names the two lines it should have separated.

# %%
# %%numba --sim
# exercise: 00-cumsum
import numba
from numba import cuda

TPB = 32   # the one block's threads, and the chunk length


@cuda.jit
def cumsum(x, out, n):
    # TODO (17 lines): a shared tile; a carry; for each chunk: load (0 past the end), a barrier; the five steps,
    #      each read / barrier / write / barrier; write out[i] (guarded); add tile[TPB - 1] to the carry; a barrier
    pass


# %%
kernellab.grade("00-cumsum", cumsum)

# %% [markdown]
# ## 9 · Axis sum over rows: one warp per row, with shuffles
#
# ```python
# out = x.sum(axis=1)                  # x: float32[rows, cols]; out: float32[rows]
# ```
#
# A block of 32 threads is exactly one *warp*, the group of threads the hardware runs together, and the threads of
# a warp can read each other's registers without shared memory: `cuda.shfl_down_sync(0xFFFFFFFF, v, d)` returns
# the `v` of the lane `d` places up (the mask says that all 32 lanes take part). Block `r` sums row `r`: lane `t`
# adds `x[r, t]`, `x[r, t + 32]`, ... into `acc`; then for `d = 16, 8, 4, 2, 1`, `acc += shfl_down_sync(..., acc,
# d)` is the tree of puzzle 7 in registers, and lane 0 ends with the row's sum. No barrier is needed: a shuffle
# is itself a meeting of the warp's lanes. The grader launches one block of 32 threads per row.

# %%
# %%numba --sim
# exercise: 00-row-sums
import numba
from numba import cuda

TPB = 32   # one warp per row


@cuda.jit
def row_sums(x, out):
    # TODO (10 lines): the row from blockIdx, the lane from threadIdx; a partial sum over columns t, t + 32, ...;
    #      five shuffles (offset 16 down to 1); lane 0 writes out[r]
    pass


# %%
kernellab.grade("00-row-sums", row_sums)

# %% [markdown]
# ## 10 · Axis sum over columns: a 2-D block
#
# ```python
# out = x.sum(axis=0)                  # x: float32[rows, cols]; out: float32[cols]
# ```
#
# Now consecutive threads take consecutive *columns*, so that a warp reads 32 neighbouring floats of a row at a
# time (on a GPU that is one wide memory transaction: coalesced). Blocks of 32 x 4 threads: block `b` owns columns
# `32 b .. 32 b + 31`, and the four threads of a column, `ty = 0..3`, split its rows: `ty, ty + 4, ty + 8, ...`.
# Each stores its partial sum at `part[ty, tx]` of a shared `(4, 32)` array; after a barrier, the threads with
# `ty == 0` add their column's four partial sums and write `out[c]`. Guard the column `c < cols` around the reads
# and the write, but not around the barrier: every thread of a block must reach each `cuda.syncthreads()`. A
# barrier that some threads of a warp wait at while the others have gone past it is undefined behaviour on a GPU
# (it may hang, or release too early); the grader's barrier check (synccheck) reports it with the line.

# %%
# %%numba --sim
# exercise: 00-col-sums
import numba
from numba import cuda

TPB = 32   # columns per block, along threadIdx.x
ROWS = 4   # threads per column, along threadIdx.y


@cuda.jit
def col_sums(x, out):
    # TODO (12 lines): a shared (ROWS, TPB) array; the column c; x's shape; a partial sum over rows ty, ty + ROWS, ...
    #      (only where c < cols); store it at [ty, tx]; a barrier; threads with ty == 0 add four and write out[c]
    pass


# %%
kernellab.grade("00-col-sums", col_sums)

# %% [markdown]
# ## 11 · Histogram: atomics in shared memory
#
# ```python
# counts = np.bincount(x, minlength=16)    # x: int32[n], values 0..15; counts: int32[16]
# ```
#
# Many threads add to the same counter. `h[v] += 1` is a read and then a write, and two threads doing it at once
# both read the old count: one add is lost. `cuda.atomic.add(h, v, 1)` does the read, the add and the write as one
# indivisible step. One block of 32 threads: threads 0..15 zero a shared array of 16 counters, every thread counts
# its values `x[t], x[t + 32], ...` with atomic adds, and threads 0..15 copy the counters to `counts`. Two barriers
# keep the three phases apart (the race detector treats two atomics on one address as safe, and an atomic next to
# a plain read or write as a race).

# %%
# %%numba --sim
# exercise: 00-histogram
import numba
from numba import cuda

TPB = 32    # the one block's threads
BINS = 16   # counters: values are 0 .. 15


@cuda.jit
def histogram(x, counts, n):
    # TODO (10 lines): a shared array of BINS int32 (numba.int32); zero it; a barrier; atomic adds over
    #      x[t], x[t + TPB], ...; a barrier; copy the counters out
    pass


# %%
kernellab.grade("00-histogram", histogram)

# %% [markdown]
# ## 12 · Tiled matrix multiply
#
# ```python
# c = a @ b                            # a: float32[m, k]; b: float32[k, n]; c: float32[m, n]
# ```
#
# Thread `(tx, ty)` of block `(bx, by)` computes `c[row, col]` with `row = 8 by + ty` and `col = 8 bx + tx`. Read
# straight from `a` and `b`, every element of `a` would be loaded by all `n` threads of its row of `c`. Tiling
# loads it once per block instead: for each step of 8 along `k`, the block's 64 threads load one 8 x 8 tile of `a`
# and one of `b` into shared memory (one element each), wait, multiply and add the 8 products of the thread's row
# of `a`'s tile and column of `b`'s tile, and wait again before the next step overwrites the tiles. Where a tile
# hangs over the edge of a matrix (m, k and n need not be multiples of 8), load zeros: they add nothing. The grader
# launches `(ceil(n / 8), ceil(m / 8))` blocks of 8 x 8 threads on shapes such as m, k, n = 9, 17, 10.

# %%
# %%numba --sim
# exercise: 00-matmul
import numba
from numba import cuda

TILE = 8   # TILE x TILE threads per block, and TILE x TILE tiles


@cuda.jit
def matmul(a, b, c):
    # TODO (17 lines): two shared (TILE, TILE) tiles; row and col; the shapes; a float32 accumulator;
    #      for each k0 in range(0, k, TILE): load both tiles (0 outside), a barrier, TILE products, a barrier;
    #      store c[row, col] (guarded)
    pass


# %%
kernellab.grade("00-matmul", matmul)

# %% [markdown]
# ## On a GPU
#
# Everything above ran in the simulator. Where there is a GPU, the next cell grades the same twelve kernels again
# on it: launched on larger shapes as well (up to hundreds of thousands of elements), under compute-sanitizer's
# memcheck, racecheck and synccheck instead of the simulator's race detector, and compiled for the GPU at hand.
# A kernel that passed in the simulator should pass here too.

# %%
# %%gpu --skip-note "Solve the puzzles in the simulator; this cell re-grades them where a GPU is available."
puzzles = {"00-map": fahrenheit, "00-tril": lower, "00-broadcast": affine, "00-grid-stride": relu, "00-flip": flip,
           "00-blur": blur, "00-dot": dot, "00-cumsum": cumsum, "00-row-sums": row_sums, "00-col-sums": col_sums,
           "00-histogram": histogram, "00-matmul": matmul}
for ex_id, k in puzzles.items():
    on_gpu = k.with_signature(k.numba_signature)      # the same kernel, launched on the GPU this time
    on_gpu.simulate = False
    r = kernellab.grade(ex_id, on_gpu, speed=False)
    print(f"{ex_id:15s} {r.verdict}" + "".join(f"\n    {f.kind}: {f.message}" for f in r.findings))

# %% [markdown]
# ## Where next
#
# Tutorial 01 writes kernels in CUDA C++ (`%%cuda`) and times them on a GPU against PyTorch; tutorial 02 is about
# shared-memory banks, the reason a tile is often declared 32 x 33. Things to try here: give `rotate_racy` a
# `cuda.syncwarp()` where `rotate` has its barrier (one warp: that is enough) and run its racecheck again; launch
# your `dot` as `dot[1, 64](...)` and read what the simulator says about a kernel written for 32 threads; put the
# barrier of your `col_sums` inside `if c < cols:` and grade it again.
