# exercise: 00-dot
# expect: wrong_values on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def dot(a, b, out, n):
    cache = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    cache[t] = a[t] * b[t] if t < n else 0.0     # only the first 32 products
    cuda.syncthreads()
    s = TPB // 2
    while s > 0:
        if t < s:
            cache[t] += cache[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[0] = cache[0]
