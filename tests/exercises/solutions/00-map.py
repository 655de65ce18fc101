# exercise: 00-map
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    i = cuda.grid(1)              # cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < n:                     # the last block runs past the end of the array
        out[i] = celsius[i] * 9 / 5 + 32
