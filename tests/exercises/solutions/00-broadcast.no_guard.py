# exercise: 00-broadcast
# expect: out_of_bounds on cpu
from numba import cuda


@cuda.jit
def affine(x, scale, bias, out):
    c, r = cuda.grid(2)
    out[r, c] = x[r, c] * scale[r] + bias[c]
