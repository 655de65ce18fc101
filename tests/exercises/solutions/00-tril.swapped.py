# exercise: 00-tril
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def lower(x, out):
    r, c = cuda.grid(2)                  # rows from x: the grid's x axis covers the columns, not the rows
    rows, cols = x.shape
    if r < rows and c < cols:
        out[r, c] = x[r, c] if c <= r else 0.0
