# exercise: 00-blur
# expect: race missing_barrier on cpu
import numba
from numba import cuda

TPB = 32
HALO = TPB + 2


@cuda.jit
def blur(x, out, n):
    tile = cuda.shared.array(HALO, numba.float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    tile[t + 1] = x[i] if i < n else 0.0
    if t == 0:
        tile[0] = x[i - 1] if i > 0 else 0.0
    if t == TPB - 1:
        tile[TPB + 1] = x[i + 1] if i + 1 < n else 0.0
    if i < n:
        out[i] = 0.25 * tile[t] + 0.5 * tile[t + 1] + 0.25 * tile[t + 2]
