# exercise: 00-grid-stride
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def relu(x, out, n):
    stride = cuda.gridsize(1)
    for i in range(cuda.threadIdx.x, n, stride):     # every block starts at the same elements
        out[i] = max(x[i], 0.0)
