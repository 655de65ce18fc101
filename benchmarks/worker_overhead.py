"""What isolation costs: one vector add launched in-process vs in the warm worker process, and a cold worker start.

Method: wall clock (time.perf_counter) around each launch call as a user makes it, synchronous (the call returns
after the kernel finished and, isolated, after the outputs are back in the caller's tensors); median and 10th/90th
percentiles over --runs calls after --warmup calls. The kernel itself takes a few microseconds, so the numbers are
the overhead. Three argument sizes:
- small: n = 4,096 floats (16 KiB per tensor): copied to the worker and back;
- large, shared: n = 16M floats (64 MiB per tensor), each its own allocation: lent through CUDA IPC, no copy;
- large, copied: the same with sharing turned off (share_min_bytes above the size), for comparison.
Cold start: a new worker pool's first launch (process start, imports, CUDA context, module load), --cold times.
Usage (GPU machine): python benchmarks/worker_overhead.py [--runs 200] [--cold 3] [--out table.md]
"""
import argparse
import statistics
import time

import kernellab
from kernellab import report
from kernellab.run import worker as W

SRC = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def timed(fn, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def stats(ms: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(ms, n=10) if len(ms) >= 10 else [min(ms)] * 9 + [max(ms)]
    return statistics.median(ms), q[0], q[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    a = ap.parse_args()

    import torch

    vadd = kernellab.compile_cuda(SRC).vadd
    pool = W.WorkerPool(torch.cuda.current_device())
    rows = []

    def case(label, n, runs, share_min_bytes=W.settings.share_min_bytes):
        torch.cuda.empty_cache()
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        z = torch.empty_like(x)
        grid = (n + 255) // 256
        inproc = timed(lambda: vadd[grid, 256](x, y, z, n, isolate=False), runs, a.warmup)
        W.settings.share_min_bytes = share_min_bytes
        last = {}

        def isolated():
            last["run"] = W.run_isolated(vadd, grid, 256, (x, y, z, n), pool=pool)

        iso = timed(isolated, runs, min(a.warmup, 5))
        W.settings.share_min_bytes = W.IsolationSettings().share_min_bytes
        torch.testing.assert_close(z, x + y, rtol=0, atol=0)
        how = ("shared: " + ",".join(last["run"].shared)) if last["run"].shared else "copied"
        m_in, m_iso = stats(inproc)[0], stats(iso)[0]
        rows.append([label, f"{n:,}", how, *(f"{v:.3f}" for v in stats(inproc)), *(f"{v:.3f}" for v in stats(iso)),
                     f"{m_iso - m_in:.3f}"])

    case("small", 4096, a.runs)
    case("large, shared", 16 * 2**20, max(a.runs // 10, 10))
    case("large, copied", 16 * 2**20, max(a.runs // 20, 5), share_min_bytes=1 << 62)
    pool.shutdown()

    cold = []
    for _ in range(a.cold):
        p = W.WorkerPool(torch.cuda.current_device())
        x = torch.ones(4096, device="cuda")
        t0 = time.perf_counter()
        W.run_isolated(vadd, 16, 256, (x, x, torch.empty_like(x), 4096), pool=p)
        cold.append(((time.perf_counter() - t0) * 1e3, p.last_ready_ms))
        p.shutdown()

    heads = ["arguments", "n", "isolated args", "in-process ms", "p10", "p90", "isolated ms", "p10", "p90",
             "overhead ms"]
    table = report.text_table(heads, rows)
    name = torch.cuda.get_device_name()
    lines = [f"worker_overhead on {name} (torch {torch.__version__}), median of {a.runs} synchronous launches "
             f"(large: fewer), wall clock per call", table, "",
             "cold start (new worker: spawn, imports, CUDA context, then the first launch): " +
             ", ".join(f"{t:.0f} ms (worker ready after {r:.0f} ms)" for t, r in cold)]
    text = "\n".join(lines)
    print(text)
    if a.out:
        md = [f"worker_overhead on {name}: median (p10-p90) ms per synchronous launch", "",
              "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        md += ["", lines[-1]]
        with open(a.out, "w") as fh:
            fh.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
