# exercise: 00-map
# expect: launch_config unwritten on cpu
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    i = cuda.blockIdx.x * 32 + cuda.threadIdx.x     # assumes 32 threads per block
    if i < n:
        out[i] = celsius[i] * 9 / 5 + 32
