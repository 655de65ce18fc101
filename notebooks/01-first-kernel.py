# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Your first kernel: vector add
#
# **What you will learn**
# - write a CUDA C++ kernel in a `%%cuda` cell and read its card: registers, shared memory, spills, occupancy;
# - launch it on PyTorch tensors with `kernel[grid, block](...)`, and why the grid is rounded up;
# - check it against PyTorch on awkward sizes, and what the check guards against;
# - time it against PyTorch and read the number as a fraction of the memory bandwidth;
# - write two kernels yourself (exercises 01-reverse and 01-vadd4), each checked by `kernellab.grade`.
#
# Without a GPU, Run All still reaches the end: compiling, the resource card and the occupancy analysis need only
# the compiler; the kernels run on kernellab's CPU path at small sizes (the `%%cpu` cells, and the exercises'
# grading), every access bounds-checked; each cell marked `%%gpu` (launching at full size, timing) says in one line
# that it needs a GPU and is skipped. The numbers quoted in the text were measured on an H200.

# %%
# %load_ext kernellab
import torch

import kernellab

GPU = kernellab.has_gpu()
print("GPU:", torch.cuda.get_device_name() if GPU else "none (compile and analysis only)")

# %% [markdown]
# ## Why vector add is a memory problem
#
# `c = a + b` on `n` float32 elements reads `2 * 4 * n` bytes, writes `4 * n` bytes and does `n` additions:
# 1 FLOP per 12 bytes. An H100 moves about 3 TB/s and adds at tens of TFLOP/s, so for `n = 2**24` the bytes
# take about 67 µs and the additions well under 1 µs. The kernel's only job is to keep memory busy: every
# thread loads two floats, adds, stores one, and neighbouring threads touch neighbouring addresses so that
# each warp's 32 loads merge into a few wide memory transactions (coalescing).

# %%
n = 2**24
bytes_moved = 3 * 4 * n          # two loads and one store per element
flops = n                        # one add per element
print(f"{bytes_moved / 1e6:.0f} MB moved, {flops / 1e6:.0f} MFLOP: {flops / bytes_moved:.3f} FLOP/byte")

# %% [markdown]
# ## The kernel
#
# Each thread computes one element. `blockIdx.x * blockDim.x + threadIdx.x` is the thread's global index;
# the grid is rounded *up* to whole blocks, so the last block has threads past the end: the `if (i < n)`
# guard keeps them from writing out of bounds.

# %%
# %%cuda
extern "C" __global__ void vadd(const float* __restrict__ a, const float* __restrict__ b,
                                float* __restrict__ c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // global thread index: [0, gridDim.x * blockDim.x)
    if (i < n) c[i] = a[i] + b[i];                   // threads past n do nothing
}

# %% [markdown]
# The card above is what the compiler reported: registers per thread, static shared memory, local memory
# (stack) and spills. A dozen registers and no shared memory leave the SM's warp slots as the only limit,
# so any block size from 64 up fills the SM. `vadd` is now a `kernellab.Kernel` in the namespace:

# %%
print(vadd.signature)
print(vadd.resources)
vadd.occupancy(256)

# %% [markdown]
# ## Launch it
#
# The grid is the number of blocks: `n / block` rounded *up*, so that every element has a thread.

# %%
block = 256                                  # threads per block
grid = (n + block - 1) // block              # blocks, rounded up: the last one may hang over the end
print(f"{grid:,} blocks x {block} threads = {grid * block:,} threads for n = {n:,} "
      f"({grid * block - n} past the end)")

# %% [markdown]
# `vadd[grid, block](a, b, c, n)` checks each argument against the C signature before launching: a float16
# tensor for `const float*`, a CPU tensor, a non-contiguous view or a wrong count is a clear error naming the
# argument, never silent garbage. The launch runs on PyTorch's current stream. This cell and the others marked
# `%%gpu` need a GPU; without one they say so in a line and the notebook goes on.

# %%
# %%gpu
a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")   # [n] each
c = torch.empty_like(a)                                                # [n]
vadd[grid, block](a, b, c, n)
print("max |c - (a + b)| =", (c - (a + b)).abs().max().item())

# %% [markdown]
# Without a GPU, `%%cuda` binds the kernels to kernellab's CPU path: each CUDA thread runs as a fiber on the CPU,
# every access of `a`, `b` and `c` is bounds-checked, and an access out of bounds raises with its cell line, thread
# and block. It is slow (about a million threads a second), so a `%%cpu` cell, which runs only where there is no
# GPU, launches the same kernel on CPU tensors at a small size.

# %%
# %%cpu
n_cpu = 1000
a_cpu, b_cpu = torch.randn(n_cpu), torch.randn(n_cpu)                  # [n_cpu] each, in CPU memory
c_cpu = torch.empty_like(a_cpu)
vadd[(n_cpu + block - 1) // block, block](a_cpu, b_cpu, c_cpu, n_cpu)
print(f"on the CPU, n = {n_cpu}: max |c - (a + b)| =", (c_cpu - (a_cpu + b_cpu)).abs().max().item())

# %% [markdown]
# ### Exercise 01-reverse · Reverse an array
#
# Your turn. Write `reverse` so that `out[i] = in[n - 1 - i]` for every `i < n`, one thread per element. The
# grader launches `ceil(n / block)` blocks of 32, 96, 256 and 1024 threads (so use `blockDim.x`, not 256) on
# sizes 1, 31, 257, 1000, 100,003 and 4,194,307, with fresh random inputs and `out` filled with NaN first (an
# element no thread writes shows), and runs compute-sanitizer's memcheck: a thread past the end that reads or
# writes is named with its line. Both ends of the index matter: `out[0]` is `in[n - 1]`. Without a GPU the grader
# runs the kernel on the CPU path on the sizes up to 1000, every access bounds-checked, so a missing guard fails
# with "out of bounds at cell line N", and says that the two largest sizes need a GPU. The solution is not in this
# notebook.

# %%
# %%cuda
// exercise: 01-reverse
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    // TODO: one thread per element: out[i] = in[n - 1 - i]; threads past n do nothing
}

# %%
kernellab.grade("01-reverse", reverse)

# %% [markdown]
# ## Check it on awkward shapes
#
# One size proves little: sizes that are not multiples of the block size catch a missing guard, and fresh
# random data every trial catches luck. `kernellab.check` fills the output with NaN before each trial (so an
# element the kernel never writes fails), compares against PyTorch with tolerances for the dtype, and reports
# the worst elements if anything is off.


# %%
def vadd_torch(a, b, c):
    """Launch `vadd` on 1-D float32 tensors; returns c."""
    vadd[(a.numel() + block - 1) // block, block](a, b, c, a.numel())
    return c


# %%
# %%gpu
for size in (1, 255, 257, 100_003):
    report = kernellab.check(vadd_torch, lambda a, b, c: a + b,
                             lambda g, size=size: tuple(torch.randn(size, generator=g).cuda() for _ in range(3)),
                             trials=3)
    print(size, report.passed, f"max abs error {report.max_abs_error:.2g}")
report

# %%
# %%cpu
for size in (1, 255, 257, 1000):                  # the same check on the CPU path, at sizes it runs in moments
    report = kernellab.check(vadd_torch, lambda a, b, c: a + b,
                             lambda g, size=size: tuple(torch.randn(size, generator=g) for _ in range(3)), trials=3)
    print(size, report.passed, f"max abs error {report.max_abs_error:.2g}")
report

# %% [markdown]
# ## Benchmark against PyTorch
#
# `kernellab.bench` times with CUDA events after a warm-up, flushes the L2 cache before every repetition (so
# that the 200 MB of inputs really come from memory) and reports the median with its spread. PyTorch's own
# `a + b` is measured in the same run as the baseline.

# %%
# %%gpu --skip-note "On an H200 (2026-11-22): vadd 65.5 us = 3.07 TB/s, torch.add 52.7 us = 3.82 TB/s, a speed-up of 0.80x."
result = kernellab.bench(lambda a, b, c: vadd_torch(a, b, c), (a, b, c),
                         baselines={"torch a + b": lambda a, b, c: torch.add(a, b, out=c)},
                         bytes=bytes_moved, flops=flops, name="vadd")
result

# %% [markdown]
# ## Discussion
#
# At 1 FLOP per 12 bytes there is nothing to gain from arithmetic, only from moving bytes efficiently, and here
# PyTorch moves them faster: on an H200 this kernel reaches about 3.1 TB/s and `torch.add` about 3.8 TB/s (0.8x).
# The difference is bytes in flight (Little's law). Keeping the H200's 4.8 TB/s busy against a memory latency of
# roughly 0.6 µs takes about 2.9 MB of loads outstanding, some 22 KB for each of its 132 SMs. Our threads each
# load two 4-byte floats, so even a full SM (2,048 threads) has only 16 KB in flight; PyTorch's elementwise
# kernel (`vectorized_elementwise_kernel<4, ...>` in Nsight Compute) loads four floats per 16-byte access.
#
# ### Exercise 01-vadd4 · Vector add, four floats per thread
#
# Put four times the bytes in flight per thread: write `vadd4`, in which thread `t` handles elements `4t .. 4t + 3`.
# Load `a[4t .. 4t + 3]` and `b[4t .. 4t + 3]` as one `float4` each (`reinterpret_cast<const float4*>(a)[t]`:
# one 16-byte load, `LDG.E.128` in the SASS), store `c` the same way, and let one thread add the last `n % 4`
# elements one float at a time. A `float4` access is only legal where all four elements exist, so guard it with
# `4t + 3 < n`. The grader launches `ceil(ceil(n / 4) / block)` blocks of 128 and 256 threads on sizes 1, 3, 4, 5,
# 257, 1001, 100,003 and 4,194,307; without a GPU it checks that the SASS has the 16-byte loads and that the
# kernel reads `n`. On a GPU it also times your kernel beside `torch.add` (the bar: 90 % of its speed; reported,
# not required).

# %%
# %%cuda
// exercise: 01-vadd4
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    // TODO: thread t adds elements 4t .. 4t + 3 through float4 loads and a float4 store; one thread does the n % 4 tail
}

# %%
kernellab.grade("01-vadd4", vadd4)

# %% [markdown]
# Things to try: change `block` to 32 or 1024 (occupancy changes, and with it the bytes in flight); drop the
# `if (i < n)` guard of `vadd` and watch the check on size 257 fail; make `a` a float16 tensor and read the error.
