# exercise: 00-matmul
# expect: out_of_bounds on cpu
import numba
from numba import cuda

TILE = 8


@cuda.jit
def matmul(a, b, c):
    sa = cuda.shared.array((TILE, TILE), numba.float32)
    sb = cuda.shared.array((TILE, TILE), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    m, k = a.shape
    n = b.shape[1]
    acc = numba.float32(0)
    for k0 in range(0, k, TILE):
        sa[ty, tx] = a[row, k0 + tx]     # edge tiles run past a and b
        sb[ty, tx] = b[k0 + ty, col]
        cuda.syncthreads()
        for j in range(TILE):
            acc += sa[ty, j] * sb[j, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c[row, col] = acc
