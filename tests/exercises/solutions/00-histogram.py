# exercise: 00-histogram
import numba
from numba import cuda

TPB = 32    # the one block's threads
BINS = 16   # counters: values are 0 .. 15


@cuda.jit
def histogram(x, counts, n):
    h = cuda.shared.array(BINS, numba.int32)
    t = cuda.threadIdx.x
    if t < BINS:
        h[t] = 0
    cuda.syncthreads()                   # all counters are zero before any is added to
    for i in range(t, n, TPB):
        cuda.atomic.add(h, x[i], 1)      # two threads may add to one counter at once
    cuda.syncthreads()                   # all values are counted before the counters are read
    if t < BINS:
        counts[t] = h[t]
