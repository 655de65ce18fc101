# exercise: 00-blur
import numba
from numba import cuda

TPB = 32          # threads per block
HALO = TPB + 2    # the tile: one neighbour, the block's 32 elements, one neighbour


@cuda.jit
def blur(x, out, n):
    tile = cuda.shared.array(HALO, numba.float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    tile[t + 1] = x[i] if i < n else 0.0
    if t == 0:                           # the left neighbour of the block
        tile[0] = x[i - 1] if i > 0 else 0.0
    if t == TPB - 1:                     # the right neighbour
        tile[TPB + 1] = x[i + 1] if i + 1 < n else 0.0
    cuda.syncthreads()
    if i < n:
        out[i] = 0.25 * tile[t] + 0.5 * tile[t + 1] + 0.25 * tile[t + 2]
