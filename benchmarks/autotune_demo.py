"""Autotune an SGEMM's tile sizes on one GPU with kernellab.autotune, then again through Dask.

What it shows, in order:
1. The sweep here: 48 tile configurations of a register-tiled SGEMM (BM, BN block tile; BK depth; TM x TN outputs per
   thread) compiled in a process pool, pruned before any launch, each checked once against torch.matmul (fp32, TF32
   off) with its launches isolated, and timed with kernellab.bench beside torch.matmul in the same run.
2. The table, the best configuration against torch.matmul, the parameter that matters, and a plot of time against it.
3. The same call again: every row from the cache (it should take well under a second).
4. The same sweep through Dask (rows not cached; the compiles find the compile cache of step 1): dask-cuda's LocalCUDACluster when it is installed, else a
   distributed.LocalCluster with one worker process pinned to GPU 0 (CUDA_VISIBLE_DEVICES=0). The compiles and the
   check-and-time jobs run on the worker; the best and its speed-up should match step 1 within the run-to-run spread.

Method: M = N = K = 4096 (--size), fp32, row-major; FLOPs 2 M N K per call. Speed-ups are against torch.matmul
timed in the same kernellab.bench run on the same GPU (L2 flushed before every repetition, burst mode).
Run on a GPU machine:  python benchmarks/autotune_demo.py [--size 4096] [--quick] [--no-dask]
It prints the tables and writes autotune_demo.png and autotune_demo.json to $OUT (or the current folder).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import kernellab

# One block computes a BM x BN tile of C; each of its (BM/TM)(BN/TN) threads computes TM x TN outputs from registers.
SGEMM = r"""
#ifndef PAD
#define PAD 0
#endif
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    __shared__ float As[BK][BM + PAD];                 // the A tile, transposed: As[k][m]
    __shared__ float Bs[BK][BN];                       // the B tile: Bs[k][n]
    const int tcol = threadIdx.x % (BN / TN);          // this thread's TN columns: tcol * TN ...
    const int trow = threadIdx.x / (BN / TN);          // and TM rows: trow * TM ...
    const float* Ablk = A + (size_t)blockIdx.y * BM * K;   // A is M x K
    const float* Bblk = B + (size_t)blockIdx.x * BN;       // B is K x N
    float acc[TM][TN] = {};
    float a[TM], b[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += THREADS) {     // i -> (m, k) of the A tile
            int m = i / BK, k = i % BK;
            As[k][m] = Ablk[(size_t)m * K + k0 + k];
        }
        for (int i = threadIdx.x; i < BK * BN; i += THREADS) {     // i -> (k, n) of the B tile
            int k = i / BN, n = i % BN;
            Bs[k][n] = Bblk[(size_t)(k0 + k) * N + n];
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][trow * TM + i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tcol * TN + j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j)
            C[(size_t)(blockIdx.y * BM + trow * TM + i) * N + blockIdx.x * BN + tcol * TN + j] = acc[i][j];
}
"""


def sgemm_configs(quick: bool = False) -> list[dict]:
    """BM, BN in {64, 128}, BK in {8, 16, 32}, TM, TN in {4, 8}: 48 configurations (8 with --quick)."""
    if quick:
        return [dict(BM=bm, BN=bn, BK=16, TM=tm, TN=8) for bm in (64, 128) for bn in (64, 128) for tm in (4, 8)]
    return [dict(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn)
            for bm, bn, bk, tm, tn in itertools.product((64, 128), (64, 128), (8, 16, 32), (4, 8), (4, 8))]


def make_problem(size: int):
    """(launch, inputs, reference, baselines) for C = A @ B with M = N = K = size."""
    import torch

    M = N = K = size

    def launch(k, c, a, b, out):
        threads = (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])
        k[(N // c["BN"], M // c["BM"]), threads](a, b, out, M, N, K)
        return out

    def inputs(g):
        return (torch.randn(M, K, generator=g).cuda(), torch.randn(K, N, generator=g).cuda(),
                torch.empty(M, N, device="cuda"))

    def reference(a, b, out):
        return a @ b

    baselines = {"torch": lambda a, b, out: torch.matmul(a, b, out=out)}
    return launch, inputs, reference, baselines


def tflops(ms: float, size: int) -> float:
    return 2 * size**3 / (ms * 1e-3) / 1e12


def summary(result, size: int, label: str) -> str:
    c = result.counts()
    best = result.best
    lines = [f"{label}: {len(result.rows)} configurations, {c['timed']} timed, {c['pruned']} pruned, "
             f"{c['failed']} failed, {c['not run']} not run; stages " +
             ", ".join(f"{k} {v:.1f} s" for k, v in result.stage_s)]
    if best:
        sp = best.row.speedup("torch")
        lines.append(f"  best {best.row.label}: {best.row.median_ms:.4g} ms = {tflops(best.row.median_ms, size):.1f} "
                     f"TFLOP/s, {sp.ratio:.3f}x torch.matmul ({sp.low:.3f}-{sp.high:.3f}) on {best.row.gpu}")
    if result.parameter:
        lines.append(f"  the parameter that matters: {result.parameter} "
                     f"({result.parameters()[0][1]:.0%} of the variance of log time)")
    return "\n".join(lines)


def dask_executor():
    """(client, cluster, what): a one-GPU Dask cluster, dask-cuda's where installed."""
    from distributed import Client, LocalCluster

    try:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", threads_per_worker=1, dashboard_address=None)
        what = "dask-cuda LocalCUDACluster, one worker on GPU 0"
    except ImportError:
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                               env={"CUDA_VISIBLE_DEVICES": "0"})
        what = "distributed.LocalCluster, one worker process pinned with CUDA_VISIBLE_DEVICES=0 (no dask-cuda here)"
    return Client(cluster), cluster, what


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="8 configurations instead of 48")
    ap.add_argument("--no-dask", action="store_true")
    ns = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU here: this demo times kernels; run it on a GPU machine", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    # A fresh cache for this run: the first sweep compiles and measures everything, the second reads it all back.
    os.environ["KERNELLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernellab-autotune-demo-")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    configs = sgemm_configs(ns.quick)
    launch, inputs, reference, baselines = make_problem(ns.size)
    kw = dict(kernel="sgemm", launch=launch, inputs=inputs, reference=reference, baselines=baselines)
    print(f"# autotune sgemm, M = N = K = {ns.size}, fp32, on {torch.cuda.get_device_name()} "
          f"({len(configs)} configurations)\n")

    t0 = time.perf_counter()
    here = kernellab.autotune(SGEMM, configs, **kw)
    here_s = time.perf_counter() - t0
    print(here, "\n")
    print(summary(here, ns.size, f"here, {here_s:.1f} s"))
    t0 = time.perf_counter()
    again = kernellab.autotune(SGEMM, configs, **kw)
    again_s = time.perf_counter() - t0
    print(f"re-run from the cache: {again_s * 1e3:.0f} ms, {sum(r.cached for r in again.rows)} of "
          f"{len(again.rows)} rows cached")

    fig = kernellab.autotune_plot(here)
    fig.savefig(out / "autotune_demo.png", dpi=110, bbox_inches="tight")
    report = {"size": ns.size, "device": torch.cuda.get_device_name(), "here": here.to_json(), "here_s": here_s,
              "rerun_ms": again_s * 1e3}

    if not ns.no_dask:
        try:
            client, cluster, what = dask_executor()
        except ImportError as exc:
            print(f"\nno Dask here ({exc}): pip install 'kernellab[dask]'")
        else:
            with cluster, client:
                t0 = time.perf_counter()
                far = kernellab.autotune(SGEMM, configs, **kw, executor=client.get_executor(), cache=False)
                far_s = time.perf_counter() - t0
            print(f"\n# the same sweep through Dask: {what}\n")
            print(far, "\n")
            print(summary(far, ns.size, f"through Dask, {far_s:.1f} s"))
            if here.best and far.best:
                same = here.best.config == far.best.config
                a, b = here.best.row.speedup("torch").ratio, far.best.row.speedup("torch").ratio
                print(f"  best here {here.best.row.label} ({a:.3f}x), through Dask {far.best.row.label} ({b:.3f}x): "
                      f"{'the same configuration' if same else 'a different configuration'}")
            report.update(dask=what, far=far.to_json(), far_s=far_s)
    (out / "autotune_demo.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out / 'autotune_demo.png'} and {out / 'autotune_demo.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
