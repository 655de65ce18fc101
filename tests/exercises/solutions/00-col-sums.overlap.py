# exercise: 00-col-sums
# expect: wrong_values on cpu
import numba
from numba import cuda

TPB = 32
ROWS = 4


@cuda.jit
def col_sums(x, out):
    part = cuda.shared.array((ROWS, TPB), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = cuda.blockIdx.x * TPB + tx
    rows, cols = x.shape
    acc = numba.float32(0)
    if c < cols:
        for r in range(ty, rows):        # steps by 1: the four threads of a column add the same rows
            acc += x[r, c]
    part[ty, tx] = acc
    cuda.syncthreads()
    if ty == 0 and c < cols:
        out[c] = part[0, tx] + part[1, tx] + part[2, tx] + part[3, tx]
