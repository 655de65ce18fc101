# exercise: 00-cumsum
import numba
from numba import cuda

TPB = 32   # the one block's threads, and the chunk length


@cuda.jit
def cumsum(x, out, n):
    tile = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    carry = numba.float32(0)             # the sum of the chunks before this one
    for start in range(0, n, TPB):
        i = start + t
        tile[t] = x[i] if i < n else 0.0
        cuda.syncthreads()
        step = 1
        while step < TPB:
            v = tile[t - step] if t >= step else 0.0
            cuda.syncthreads()           # every thread has read before any writes
            tile[t] += v
            cuda.syncthreads()           # every thread has written before the next step reads
            step *= 2
        if i < n:
            out[i] = carry + tile[t]
        carry += tile[TPB - 1]
        cuda.syncthreads()               # tile[31] is read before the next chunk overwrites it
