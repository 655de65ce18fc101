# exercise: 00-flip
# expect: wrong_values uninitialized on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def flip(x, out, n):
    tile = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB
    i = start + t
    if i < n:
        tile[t] = x[i]
    cuda.syncthreads()
    if i < n:
        out[i] = tile[TPB - 1 - t]       # as if every chunk held 32 elements
