# exercise: 00-tril
from numba import cuda


@cuda.jit
def lower(x, out):
    c, r = cuda.grid(2)                  # x runs along the columns, y along the rows
    rows, cols = x.shape
    if r < rows and c < cols:            # the grid is rounded up on both axes
        out[r, c] = x[r, c] if c <= r else 0.0
