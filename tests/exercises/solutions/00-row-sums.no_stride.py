# exercise: 00-row-sums
# expect: out_of_bounds on cpu
import numba
from numba import cuda

TPB = 32


@cuda.jit
def row_sums(x, out):
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    acc = x[r, t]                        # one column per lane: rows are not always 32 long
    offset = TPB // 2
    while offset > 0:
        acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, offset)
        offset //= 2
    if t == 0:
        out[r] = acc
