# exercise: 00-tril
# expect: out_of_bounds on cpu
from numba import cuda


@cuda.jit
def lower(x, out):
    c, r = cuda.grid(2)
    rows, cols = x.shape
    if r < rows:
        out[r, c] = x[r, c] if c <= r else 0.0
