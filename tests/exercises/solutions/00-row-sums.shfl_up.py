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
    offset = TPB // 2
    while offset > 0:
        acc += cuda.shfl_up_sync(0xFFFFFFFF, acc, offset)    # lane t gets lane t - offset's: lane 0 gets its own
        offset //= 2
    if t == 0:
        out[r] = acc
