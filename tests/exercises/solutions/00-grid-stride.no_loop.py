# exercise: 00-grid-stride
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def relu(x, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = max(x[i], 0.0)
