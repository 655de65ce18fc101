"""How long a %%cuda cell takes to turn around: cold NVRTC compile, warm (memory and disk cache), and nvcc.

Method: the same small kernel (vector add + a 32x32 shared-memory transpose) each way, median of N runs
(wall clock, time.perf_counter). "cold" compiles with the cache off; "warm (disk)" clears the in-memory cache
first; "nvcc -cubin" and "nvcc executable" run nvcc as a subprocess per cell, as nvcc4jupyter does (it builds
and runs an executable). No GPU needed. Usage: python benchmarks/compile_latency.py [--runs 9]
"""
import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import tempfile
import time

import kernellab
from kernellab.compile import cache, toolkit

SRC = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void transpose(const float* in, float* out, int n) {
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    if (x < n && y < n) tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    if (x < n && y < n) out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
"""
MAIN = "\nint main() { return 0; }\n"


def median_ms(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KERNELLAB_CACHE_DIR"] = tmp
        counter = iter(range(10**9))

        def cold():
            os.environ["KERNELLAB_CACHE"] = "0"
            kernellab.compile_cuda(SRC + f"// {next(counter)}\n", arch="sm_90")
            os.environ["KERNELLAB_CACHE"] = "1"

        rows.append(("cold (NVRTC, cache off)",) + median_ms(cold, a.runs))
        kernellab.compile_cuda(SRC, arch="sm_90")
        rows.append(("warm (memory cache)",) + median_ms(lambda: kernellab.compile_cuda(SRC, arch="sm_90"), a.runs))

        def disk():
            cache.clear_memory()
            kernellab.compile_cuda(SRC, arch="sm_90")

        rows.append(("warm (disk cache)",) + median_ms(disk, a.runs))
        try:
            from IPython.core.interactiveshell import InteractiveShell
        except ImportError:
            InteractiveShell = None
        if InteractiveShell is not None:
            ip = InteractiveShell.instance()
            ip.run_line_magic("load_ext", "kernellab")
            cell = "%%cuda --arch sm_90\n" + SRC
            ip.run_cell(cell, silent=True)

            def magic():
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    r = ip.run_cell(cell, store_history=False)  # the displayhook formats the card
                assert r.success, r.error_in_exec

            rows.append(("warm %%cuda cell (IPython, card built)",) + median_ms(magic, a.runs))
        nvcc = toolkit.find_tool("nvcc")
        if nvcc:
            cu = os.path.join(tmp, "cell.cu")
            with open(cu, "w") as fh:
                fh.write(SRC + MAIN)
            inc = [f"-I{d}" for d in toolkit.include_dirs()]
            cubin = [nvcc, "-cubin", "-arch=sm_90", *inc, "-o", os.path.join(tmp, "cell.cubin"), cu]
            libdir = os.path.join(os.path.dirname(os.path.dirname(nvcc)), "lib")
            exe = [nvcc, "-arch=sm_90", *inc, f"-L{libdir}", "-o", os.path.join(tmp, "cell"), cu]
            for label, cmd in (("nvcc -cubin (subprocess)", cubin), ("nvcc executable (subprocess)", exe)):
                ok = subprocess.run(cmd, capture_output=True).returncode == 0
                if ok:
                    rows.append((label,) + median_ms(lambda: subprocess.run(cmd, check=True, capture_output=True), a.runs))
                else:
                    rows.append((label + ": failed here", float("nan"), float("nan"), float("nan")))
    base = rows[0][1]
    print(f"compile latency on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs), median of {a.runs} runs")
    print(f"{'path':34s} {'median ms':>10s} {'min':>8s} {'max':>8s} {'vs cold':>8s}")
    for label, med, lo, hi in rows:
        print(f"{label:34s} {med:10.2f} {lo:8.2f} {hi:8.2f} {med / base:8.2f}x")


if __name__ == "__main__":
    main()
