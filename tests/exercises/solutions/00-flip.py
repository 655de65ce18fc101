# exercise: 00-flip
import numba
from numba import cuda

TPB = 32   # threads per block, and elements per chunk


@cuda.jit
def flip(x, out, n):
    tile = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB        # this block's chunk: x[start : start + TPB]
    i = start + t
    if i < n:
        tile[t] = x[i]
    cuda.syncthreads()                   # the whole chunk is in the tile before anyone reads it
    length = min(TPB, n - start)         # the last chunk may be shorter
    if t < length:
        out[i] = tile[length - 1 - t]
