# exercise: 00-grid-stride
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def relu(x, out, n):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n - 1, stride):
        out[i] = max(x[i], 0.0)
