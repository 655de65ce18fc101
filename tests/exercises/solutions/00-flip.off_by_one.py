# exercise: 00-flip
# expect: out_of_bounds on cpu
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
    length = min(TPB, n - start)
    if t < length:
        out[i] = tile[length - t]
