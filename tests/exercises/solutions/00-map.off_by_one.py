# exercise: 00-map
# expect: off_by_one on cpu
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = celsius[i - 1] * 9 / 5 + 32
