"""How fast Numba's CUDA simulator runs kernels, with and without barriers: numba-cuda's own scheduler against
kernellab's (kernellab.run.sim.sched), on puzzle-sized launches.

Method: each kernel is launched through numba-cuda's simulator (`FakeCUDAKernel`: one OS thread per CUDA thread, a
block manager polling for barriers) and through kernellab's block scheduler (greenlets taking turns; and, with
--threads, its fallback of OS threads taking turns), on the same NumPy arrays; the result is checked against NumPy
each time. Wall clock (time.perf_counter), median of N runs after one warm-up; threads per second = launched threads
/ median time. No GPU needed. Usage: python benchmarks/simulator_speed.py [--runs 5] [--threads]
"""
import argparse
import os
import platform
import statistics
import time
import warnings

import numpy as np
from numba import cuda, float32

TPB = 3     # the puzzles' tiled matmul: 9 x 9 in 3 x 3 tiles, 81 threads, two barriers per tile


def vadd(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def matmul_tiled(a, b, out, size):
    a_sh = cuda.shared.array((TPB, TPB), float32)
    b_sh = cuda.shared.array((TPB, TPB), float32)
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    j = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    li, lj = cuda.threadIdx.x, cuda.threadIdx.y
    acc = 0.0
    for k0 in range(0, size, TPB):
        if i < size and k0 + lj < size:
            a_sh[li, lj] = a[i, k0 + lj]
        if j < size and k0 + li < size:
            b_sh[li, lj] = b[k0 + li, j]
        cuda.syncthreads()
        for k in range(min(TPB, size - k0)):
            acc += a_sh[li, k] * b_sh[k, lj]
        cuda.syncthreads()
    if i < size and j < size:
        out[i, j] = acc


def block_sum(x, out):
    s = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    s[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    stride = 64
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


def cases():
    """(name, function, grid, block, args, check, barriers each thread passes)."""
    rng = np.random.default_rng(0)
    n = 2048
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    c = np.zeros(n, np.float32)
    out = []
    out.append(("vadd 2,048", vadd, 16, 128, (a, b, c), lambda: np.allclose(c, a + b), 0))
    for size in (9, 18):
        ma = rng.standard_normal((size, size)).astype(np.float32)
        mb = rng.standard_normal((size, size)).astype(np.float32)
        mo = np.zeros((size, size), np.float32)
        tiles = size // TPB
        out.append((f"matmul {size}x{size} (tiles of 3)", matmul_tiled, (tiles, tiles), (TPB, TPB),
                    (ma, mb, mo, size), lambda ma=ma, mb=mb, mo=mo: np.allclose(mo, ma @ mb, atol=1e-4), 2 * tiles))
    x = rng.standard_normal(4 * 128).astype(np.float32)
    sums = np.zeros(4, np.float32)
    out.append(("block sum 4 x 128", block_sum, 4, 128, (x, sums),
                lambda: np.allclose(sums, x.reshape(4, 128).sum(1), atol=1e-3), 8))
    return out


def run_numba(fn, grid, block, args):
    from numba.cuda.simulator import kernel as sim_kernel

    sim_kernel.FakeCUDAKernel(fn, device=False)[grid, block](*args)


def run_kernellab(fn, grid, block, args):
    from kernellab.run.sim import sched as simsched

    simsched.launch(fn, grid, block, args)


def timed(launch, fn, grid, block, args, check, runs):
    launch(fn, grid, block, args)                       # warm-up (imports, first allocations)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        launch(fn, grid, block, args)
        times.append(time.perf_counter() - t0)
        assert check(), f"{fn.__name__}: wrong result"
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", action="store_true", help="also time kernellab's OS-thread fallback")
    opts = ap.parse_args()
    warnings.simplefilter("ignore")
    from kernellab.run.sim import sched as simsched

    header = ["kernel", "threads", "barriers/thread", "numba-cuda s", "kernellab s", "speed-up",
              "threads/s before", "threads/s after"]
    if opts.threads:
        header += ["fallback s"]
    rows = []
    for name, fn, grid, block, args, check, barriers in cases():
        threads = int(np.prod(grid)) * int(np.prod(block))
        before = timed(run_numba, fn, grid, block, args, check, opts.runs)
        after = timed(run_kernellab, fn, grid, block, args, check, opts.runs)
        row = [name, f"{threads:,}", barriers, f"{before:.3f}", f"{after:.4f}", f"{before / after:.0f}x",
               f"{threads / before:,.0f}", f"{threads / after:,.0f}"]
        if opts.threads:
            os.environ["KERNELLAB_SIM_THREADS"] = "1"
            try:
                row.append(f"{timed(run_kernellab, fn, grid, block, args, check, opts.runs):.3f}")
            finally:
                del os.environ["KERNELLAB_SIM_THREADS"]
        rows.append(row)
    widths = [max(len(str(r[k])) for r in rows + [header]) for k in range(len(header))]
    print(f"Numba CUDA simulator speed: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"kernellab scheduler backend: {simsched.backend()}, median of {opts.runs}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))


if __name__ == "__main__":
    main()
