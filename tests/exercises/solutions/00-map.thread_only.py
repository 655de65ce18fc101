# exercise: 00-map
# expect: unwritten on cpu
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    i = cuda.threadIdx.x          # the same i in every block: only the first block's elements are written
    if i < n:
        out[i] = celsius[i] * 9 / 5 + 32
