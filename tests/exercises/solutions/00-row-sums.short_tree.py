# exercise: 00-row-sums
# expect: wrong_values on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def row_sums(x, out):
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    acc = numba.float32(0)
    for c in range(t, x.shape[1], TPB):
        acc += x[r, c]
    offset = TPB // 4                    # starts at 8: lanes 16..31 are never added
    while offset > 0:
        acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, offset)
        offset //= 2
    if t == 0:
        out[r] = acc
