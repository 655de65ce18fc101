# exercise: 00-broadcast
# expect: launch_config on cpu
from numba import cuda


@cuda.jit
def affine(x, scale, bias, out):
    c = cuda.blockIdx.x * 8 + cuda.threadIdx.x       # assumes 8 x 8 blocks
    r = cuda.blockIdx.y * 8 + cuda.threadIdx.y
    rows, cols = x.shape
    if r < rows and c < cols:
        out[r, c] = x[r, c] * scale[r] + bias[c]
