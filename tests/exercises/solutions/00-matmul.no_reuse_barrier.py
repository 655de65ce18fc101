# exercise: 00-matmul
# expect: race on cpu
import numba
from numba import cuda

TILE = 8   # TILE x TILE threads per block, and TILE x TILE tiles


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
    for k0 in range(0, k, TILE):         # one step per tile along k; the last may be partial
        sa[ty, tx] = a[row, k0 + tx] if row < m and k0 + tx < k else 0.0
        sb[ty, tx] = b[k0 + ty, col] if k0 + ty < k and col < n else 0.0
        cuda.syncthreads()               # both tiles are loaded before anyone uses them
        for j in range(TILE):
            acc += sa[ty, j] * sb[j, tx]
    if row < m and col < n:
        c[row, col] = acc
