"""Exercises of tutorial 01 (first kernel: vector add): the global index and its guard, then four floats per thread."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SassRule, SpeedBar, ceil_div

TUTORIAL = "01-first-kernel"


def _randn(rng, n) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32)


# --- 01-reverse: one thread per element, a guard, and index arithmetic at both ends ----------------------------

def _reverse_args(shape, rng):
    (n,) = shape
    return _randn(rng, n), np.empty(n, np.float32), n                  # in [n], out [n], n


register(Exercise(
    id="01-reverse",
    tutorial=TUTORIAL,
    title="Reverse an array",
    tests="global thread index, the i < n guard, index arithmetic at both ends, any block size",
    kind="cuda",
    kernel="reverse",
    signature="const float* in, float* out, int n",
    task="out[i] = in[n - 1 - i] for every i < n, one thread per element. The grader launches "
         "ceil(n / block) blocks with several block sizes (32, 96, 256, 1024), so the kernel must use blockDim.x "
         "and guard the threads past the end.",
    make_args=_reverse_args,
    outputs=(1,),
    reference=lambda x, out, n: (x[::-1].copy(),),
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], block), blocks=(32, 96, 256, 1024)),
    shapes=(1, 31, 257, 1000, 100_003, (1 << 22) + 3),
    sanitize_shape=257,
    guards=("n",),
    hints={
        "out_of_bounds": "guard `i < n`: the grid is rounded up to whole blocks, so the last block has threads "
                         "past the end, and for those n - 1 - i is negative",
        "off_by_one": "the last element is in[n - 1]: out[i] = in[n - 1 - i]",
        "missing_guard": "guard `i < n`: the grid is rounded up to whole blocks",
        "launch_config": "compute the index with blockDim.x, not a block size written into the kernel",
        "unwritten": "each thread writes out[i] for its own i = blockIdx.x * blockDim.x + threadIdx.x",
    },
))


# --- 01-vadd4: four floats per thread through 16-byte loads, and a scalar tail ----------------------------------

def _vadd_args(shape, rng):
    (n,) = shape
    return _randn(rng, n), _randn(rng, n), np.empty(n, np.float32), n   # a [n], b [n], c [n], n


def _torch_add(a, b, c, n):
    """The baseline: PyTorch's own vectorized elementwise add, on the same tensors."""
    import torch

    return torch.add(a, b, out=c)


def _vadd4_grid(shape, block):
    return ceil_div(ceil_div(shape[0], 4), block)                       # one thread per group of four elements


register(Exercise(
    id="01-vadd4",
    tutorial=TUTORIAL,
    title="Vector add, four floats per thread",
    tests="float4 (16-byte) loads and stores, a scalar tail for n % 4, bytes in flight",
    kind="cuda",
    kernel="vadd4",
    signature="const float* a, const float* b, float* c, int n",
    task="c = a + b with thread t handling elements 4t .. 4t + 3: load a and b as float4 (one 16-byte load each), "
         "store c as float4, and handle the last n % 4 elements one float at a time. The grader launches "
         "ceil(ceil(n / 4) / block) blocks of 128 or 256 threads. Speed bar: at least 90 % of torch.add.",
    make_args=_vadd_args,
    outputs=(2,),
    reference=lambda a, b, c, n: (a + b,),
    launch=Launch(grid=_vadd4_grid, blocks=(128, 256)),
    shapes=(1, 3, 4, 5, 257, 1001, 100_003, (1 << 22) + 3),
    sanitize_shape=1001,
    guards=("n",),
    sass=(SassRule(r"LDG\.E\.128", "not_vectorized",
                   "no 16-byte global loads (LDG.E.128) in its SASS: a and b are still read one float at a time"),),
    speed=SpeedBar(fraction=0.9, baseline="torch.add", run_baseline=_torch_add,
                   shape=(1 << 24,), bytes=lambda shape: 3 * 4 * shape[0]),
    hints={
        "not_vectorized": "read through float4 pointers: reinterpret_cast<const float4*>(a)[t] loads a[4t .. 4t+3] "
                          "in one instruction",
        "missing_guard": "threads whose group of four runs past n must not use float4 accesses: guard 4t + 3 < n, "
                         "and let one thread do the n % 4 tail",
        "out_of_bounds": "a float4 access at 4t reads a[4t .. 4t + 3]: only when 4t + 3 < n; the tail takes the rest "
                         "one float at a time",
        "unwritten": "the last n % 4 elements need a scalar tail (e.g. the thread with t == n / 4 handles them)",
        "off_by_one": "the tail starts at 4 * (n / 4) and ends before n",
        "misaligned": "float4 accesses need 16-byte aligned addresses: only at element indices divisible by 4",
    },
))
