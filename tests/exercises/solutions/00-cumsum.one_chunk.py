# exercise: 00-cumsum
# expect: unwritten on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def cumsum(x, out, n):
    tile = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    tile[t] = x[t] if t < n else 0.0     # only the first 32 elements
    cuda.syncthreads()
    step = 1
    while step < TPB:
        v = tile[t - step] if t >= step else 0.0
        cuda.syncthreads()
        tile[t] += v
        cuda.syncthreads()
        step *= 2
    if t < n:
        out[t] = tile[t]
