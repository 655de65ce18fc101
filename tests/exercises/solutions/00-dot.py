# exercise: 00-dot
import numba
from numba import cuda

TPB = 32   # the one block's threads


@cuda.jit
def dot(a, b, out, n):
    cache = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    acc = numba.float32(0)
    for i in range(t, n, TPB):           # each thread's share of the products
        acc += a[i] * b[i]
    cache[t] = acc
    cuda.syncthreads()
    s = TPB // 2
    while s > 0:                         # 16 threads add pairs, then 8, 4, 2, 1
        if t < s:
            cache[t] += cache[t + s]
        cuda.syncthreads()               # this level is done before the next one reads it
        s //= 2
    if t == 0:
        out[0] = cache[0]
