# exercise: 00-tril
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def lower(x, out):
    c, r = cuda.grid(2)
    rows, cols = x.shape
    if r < rows and c < cols and c <= r:     # the zeros above the diagonal are never written
        out[r, c] = x[r, c]
