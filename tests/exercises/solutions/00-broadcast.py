# exercise: 00-broadcast
from numba import cuda


@cuda.jit
def affine(x, scale, bias, out):
    c, r = cuda.grid(2)
    rows, cols = x.shape
    if r < rows and c < cols:
        out[r, c] = x[r, c] * scale[r] + bias[c]     # scale: one per row; bias: one per column
