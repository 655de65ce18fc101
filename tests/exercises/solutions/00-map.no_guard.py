# exercise: 00-map
# expect: out_of_bounds on cpu
from numba import cuda


@cuda.jit
def fahrenheit(celsius, out, n):
    i = cuda.grid(1)
    out[i] = celsius[i] * 9 / 5 + 32
