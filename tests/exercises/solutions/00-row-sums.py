# exercise: 00-row-sums
import numba
from numba import cuda

TPB = 32   # one warp per row


@cuda.jit
def row_sums(x, out):
    r = cuda.blockIdx.x                  # this block's row
    t = cuda.threadIdx.x                 # the lane
    acc = numba.float32(0)
    for c in range(t, x.shape[1], TPB):  # lane t: columns t, t + 32, ...
        acc += x[r, c]
    offset = TPB // 2
    while offset > 0:                    # 16, 8, 4, 2, 1: lane t adds lane t + offset's sum
        acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, offset)
        offset //= 2
    if t == 0:                           # lane 0 now holds the row's sum
        out[r] = acc
