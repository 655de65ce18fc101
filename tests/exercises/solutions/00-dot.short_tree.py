# exercise: 00-dot
# expect: wrong_values on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def dot(a, b, out, n):
    cache = cuda.shared.array(TPB, numba.float32)
    t = cuda.threadIdx.x
    acc = numba.float32(0)
    for i in range(t, n, TPB):
        acc += a[i] * b[i]
    cache[t] = acc
    cuda.syncthreads()
    s = TPB // 4                         # starts at 8: cache[24..31] are never added
    while s > 0:
        if t < s:
            cache[t] += cache[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[0] = cache[0]
