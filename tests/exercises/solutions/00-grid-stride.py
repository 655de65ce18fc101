# exercise: 00-grid-stride
from numba import cuda


@cuda.jit
def relu(x, out, n):
    start = cuda.grid(1)                 # this thread's first element
    stride = cuda.gridsize(1)            # cuda.gridDim.x * cuda.blockDim.x: every thread of the grid
    for i in range(start, n, stride):
        out[i] = max(x[i], 0.0)
