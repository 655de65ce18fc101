# exercise: 00-tril
# expect: off_by_one on cpu
from numba import cuda


@cuda.jit
def lower(x, out):
    c, r = cuda.grid(2)
    rows, cols = x.shape
    if r < rows and c < cols:
        out[r, c] = x[r, c] if c < r else 0.0    # the diagonal is part of the lower triangle
