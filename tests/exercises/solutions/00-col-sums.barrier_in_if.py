# exercise: 00-col-sums
# expect: barrier on cpu
import numba
from numba import cuda

TPB = 32   # columns per block, along threadIdx.x
ROWS = 4   # threads per column, along threadIdx.y


@cuda.jit
def col_sums(x, out):
    part = cuda.shared.array((ROWS, TPB), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = cuda.blockIdx.x * TPB + tx
    rows, cols = x.shape
    acc = numba.float32(0)
    if c < cols:
        for r in range(ty, rows, ROWS):  # rows ty, ty + 4, ...
            acc += x[r, c]
    part[ty, tx] = acc
    if c < cols:
        cuda.syncthreads()               # threads past the last column skip it and return after it
    if ty == 0 and c < cols:
        out[c] = part[0, tx] + part[1, tx] + part[2, tx] + part[3, tx]
