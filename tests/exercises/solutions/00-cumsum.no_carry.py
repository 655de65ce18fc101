# exercise: 00-cumsum
# expect: wrong_values on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def cumsum(x, out, n):
    tile = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    for start in range(0, n, TPB):       # each chunk scanned on its own: no carry from the chunks before
        i = start + t
        tile[t] = x[i] if i < n else 0.0
        cuda.syncthreads()
        step = 1
        while step < TPB:
            v = tile[t - step] if t >= step else 0.0
            cuda.syncthreads()
            tile[t] += v
            cuda.syncthreads()
            step *= 2
        if i < n:
            out[i] = tile[t]
        cuda.syncthreads()
