"""What isolation costs: one vector add launched in-process vs in the warm worker process, and a cold worker start.

Method: wall clock (time.perf_counter) around each launch call as a user makes it, synchronous (the call returns
after the kernel finished and, isolated, after the outputs are back in the caller's tensors); median and 10th/90th
percentiles over up to --runs calls after a few warm-up calls, each case stopping early once it has used its share
of --budget seconds (at least 3 timed calls). The kernel itself takes microseconds, so the numbers are the overhead.
Five cases, each path a tensor can take to the worker (the "tensors" column says which one it took):
- small, staged: n = 4,096 floats (16 KiB per tensor, from torch's caching allocator): copied on the GPU into the
  worker's staging buffers and back (the default for CUDA tensors, settings.stage_min_bytes = 0);
- small, copied: the same with staging turned off (stage_min_bytes above the size): bytes through the pipe;
- large, lent: n = 16M floats (64 MiB per tensor), each its own allocation: lent through CUDA IPC, no copy;
- large, staged: 64 MiB views carved from the inside of one segment, as a notebook's tensors usually are (after
  any matmul cuBLAS's workspace pins a segment): kernellab does not lend them, it stages them;
- large, copied: the same carved views with staging turned off, for comparison (what they cost before staging).
Where CUDA IPC is unavailable, lent and staged tensors are copied, and the notes say why.
Cold start: a new worker pool's first launch (process start, imports, CUDA context, module load), --cold times.
Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 benchmarks/worker_overhead.py [--runs 200] [--cold 2]
[--budget 40] [--out table.md]. About a minute on an H200 (most of it the large, copied case).
"""
import argparse
import contextlib
import statistics
import time

import kernellab
from kernellab import report
from kernellab.run.launch import worker as W

SRC = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def timed(fn, runs: int, warmup: int, budget_s: float) -> list[float]:
    """Wall-clock ms of up to `runs` calls after `warmup` calls; stops after `budget_s` (at least 3 calls)."""
    for _ in range(warmup):
        fn()
    out, t_end = [], time.perf_counter() + budget_s
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        if len(out) >= 3 and t0 > t_end:
            break
    return out


def stats(ms: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(ms, n=10) if len(ms) >= 10 else [min(ms)] * 9 + [max(ms)]
    return statistics.median(ms), q[0], q[-1]


def cell(ms: list[float]) -> str:
    med, p10, p90 = stats(ms)
    return f"{med:.3f} [{p10:.3f}-{p90:.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="timed calls per case at most (large cases: a tenth)")
    ap.add_argument("--cold", type=int, default=2, help="cold worker starts to time")
    ap.add_argument("--budget", type=float, default=40.0, help="seconds of timed calls in all (cold starts aside)")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    a = ap.parse_args()
    t_start = time.perf_counter()

    import cupy
    import torch

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    device = (f"{props.name} (sm_{props.major}{props.minor}, driver {cupy.cuda.runtime.driverGetVersion()}, "
              f"torch {torch.__version__}, cupy {cupy.__version__})")
    vadd = kernellab.compile_cuda(SRC).vadd
    pool = W.WorkerPool(dev)
    pool.ensure()                                     # the warm worker: its start is timed below, not here
    rows, notes = [], []
    pools = []                                        # private pools live as long as their tensors

    def own_segments():
        """Each allocation its own segment (a private pool): lendable, whatever the caching allocator holds."""
        if hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"):
            pools.append(torch.cuda.MemPool())
            return torch.cuda.use_mem_pool(pools[-1])
        torch.cuda.empty_cache()
        return contextlib.nullcontext()

    def tensors(n, carve):
        """x, y, z of n floats: each its own allocation, or views from the inside of one segment (carve)."""
        with own_segments():
            if not carve:
                x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
                return x, y, torch.empty_like(x)
            seg = torch.randn(5 * n, device="cuda")
        return seg[n:2 * n], seg[2 * n:3 * n], seg[3 * n:4 * n]

    def case(label, n, runs, budget_s, carve=False, warmup=2, **overrides):
        x, y, z = tensors(n, carve)
        grid = (n + 255) // 256
        inproc = timed(lambda: vadd[grid, 256](x, y, z, n, isolate=False), runs, 10, budget_s / 3)
        before = W.settings
        W.settings = W.IsolationSettings(**overrides)
        last = {}

        def isolated():
            last["run"] = vadd.run_isolated(grid, 256, x, y, z, n, pool=pool)

        try:
            iso = timed(isolated, runs, warmup, budget_s * 2 / 3)
        finally:
            W.settings = before
        torch.testing.assert_close(z, x + y, rtol=0, atol=0)
        run = last["run"]
        how = "; ".join(f"{path}: {', '.join(names)}" for path, names in
                        (("lent (CUDA IPC)", run.shared), ("staged", run.staged), ("copied", run.copied)) if names)
        notes.extend(f"{label}: {note}" for note in run.notes)
        size = f"{n * 4 / 2**20:g} MiB" if n * 4 >= 2**20 else f"{n * 4 / 1024:g} KiB"
        rows.append([label, f"{n:,}", size, cell(inproc), cell(iso), f"{stats(iso)[0] - stats(inproc)[0]:.3f}", how,
                     f"{len(inproc)}/{len(iso)}"])

    big, off = 16 * 2**20, 1 << 62
    case("small, staged", 4096, a.runs, a.budget * 0.15)
    case("small, copied", 4096, a.runs, a.budget * 0.15, stage_min_bytes=off)
    case("large, lent", big, max(a.runs // 10, 5), a.budget * 0.2)
    case("large, staged", big, max(a.runs // 10, 5), a.budget * 0.2, carve=True)
    case("large, copied", big, max(a.runs // 20, 3), a.budget * 0.3, carve=True, warmup=1, stage_min_bytes=off)
    worker_device = pool.worker.info.get("device", "?") if pool.worker else "?"
    pool.shutdown()

    cold = []
    for _ in range(a.cold):
        p = W.WorkerPool(dev)
        x = torch.ones(4096, device="cuda")
        t0 = time.perf_counter()
        vadd.run_isolated(16, 256, x, x, torch.empty_like(x), 4096, pool=p)
        cold.append(((time.perf_counter() - t0) * 1e3, p.last_ready_ms or float("nan")))
        p.shutdown()

    heads = ["vadd arguments", "n", "per tensor", "in-process ms", "warm worker ms", "overhead ms", "tensors",
             "calls"]
    title = (f"worker_overhead on {device}; worker on {worker_device}. Wall clock per synchronous launch, "
             f"median [p10-p90] ms")
    cold_line = ("cold start (a new worker: spawn, imports, CUDA context, module load, then the launch): " +
                 "; ".join(f"{t:,.0f} ms, worker ready after {r:,.0f} ms" for t, r in cold))
    lines = [title, report.text_table(heads, rows), "", cold_line]
    lines += [f"note: {n}" for n in notes]
    lines.append(f"({time.perf_counter() - t_start:.0f} s in all)")
    print("\n".join(lines))
    if a.out:
        md = [title, "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        md += ["", cold_line] + [f"- note: {n}" for n in notes]
        with open(a.out, "w") as fh:
            fh.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
