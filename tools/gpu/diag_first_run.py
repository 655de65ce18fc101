"""Why is the first kernellab.bench of a bf16 8192^3 matmul in a process ~16 % slower than the next ones?

Each mode runs in a fresh process (the effect is per process): it makes the inputs, rests, then benches five times
with rests between, and records for every bench the median, the per-round medians, the batch sizes and spins the
clock chose, its sleep calibration, the GPU state just before and just after (nvidia-smi), and in mode "profiled"
the kernel durations and names from CUPTI (torch.profiler), so events can be told apart from the kernels.

Usage on the GPU machine: python3 tools/gpu/diag_first_run.py --out $OUT/first_run.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("plain", "prewarm", "profiled", "triton_first", "copy_first")
# Clock settings tried after the first-run cause was found: name -> (CudaClock keywords, bench keywords).
VARIANTS = {
    "v0": ({"batch_gpu_ms": 0.0, "duty": 1.0}, {}),
    "v1": ({"batch_gpu_ms": 10.0, "duty": 1.0}, {}),
    "v2": ({"batch_gpu_ms": 5.0, "duty": 0.5}, {}),
    "v3": ({"batch_gpu_ms": 5.0, "duty": 1 / 3}, {}),
    "sus500": ({"spin": False}, {"sustained": True, "warmup_ms": 500.0}),
    "sus1000": ({"spin": False}, {"sustained": True, "warmup_ms": 1000.0}),
}
QUERY = "clocks.sm,clocks.mem,pstate,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def smi() -> str:
    return subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def child(mode: str, rest_s: float) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from kernellab.run.measure.bench import CudaClock, bench

    class TracingClock(CudaClock):
        """CudaClock that remembers each batch: its size, the spin queued ahead of it, the CPU time to queue it."""

        def __init__(self, *a, **k):
            self.batches = []
            super().__init__(*a, **k)

        def time_calls(self, calls):
            t = super().time_calls(calls)
            self.batches.append((len(calls), round(self._cpu_ms_per_call, 4), round(statistics.median(t), 4)))
            return t

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    out = {"mode": mode, "smi_start": smi(), "benches": []}
    if mode == "prewarm":
        for _ in range(10):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    if mode == "triton_first":
        from triton.testing import do_bench

        out["triton_ms"] = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100, return_mode="median")
    if mode == "copy_first":
        src = torch.randn(2**28, device="cuda")
        dst = torch.empty_like(src)
        out["copy_ms"] = bench(lambda s, d: torch.mul(s, 1.0, out=d), (src, dst), name="copy").median_ms
        del src, dst
    clock_kw, bench_kw = VARIANTS.get(mode, ({}, {}))
    for k in range(6 if mode in VARIANTS else 5):
        time.sleep(rest_s)
        pre = smi()
        clock = TracingClock(**clock_kw)
        t0 = time.perf_counter()
        if mode == "profiled":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                r = bench(torch.matmul, (a, b), name="mm", timer=clock)
            evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            evs.sort(key=lambda e: e.time_range.start)
            names = {}
            for e in evs:
                names.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
            kernels = {name[:90]: {"n": len(v), "median_ms": statistics.median(v), "first_ms": v[:3], "last_ms": v[-3:]}
                       for name, v in names.items()}
        else:
            r = bench(torch.matmul, (a, b), name="mm", timer=clock, **bench_kw)
            kernels = None
        wall = time.perf_counter() - t0
        post = smi()
        q = max(1, len(r.times_ms) // 4)
        out["benches"].append({
            "median_ms": r.median_ms, "reps": r.reps, "wall_s": round(wall, 3),
            "first_quarter_ms": statistics.median(r.times_ms[:q]), "last_quarter_ms": statistics.median(r.times_ms[-q:]),
            "round_medians_ms": [round(x, 4) for x in r.round_medians_ms], "first_times_ms": [round(x, 4) for x in r.times_ms[:8]],
            "cycles_per_ms": clock._cycles_per_ms, "batches": clock.batches, "waiting": bool(clock._waiting),
            "smi_pre": pre, "smi_post": post, "kernels": kernels})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--rest", type=float, default=3.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.rest)))
        return 0
    results = []
    for mode in a.modes.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--rest", str(a.rest)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode:
            print(f"{mode}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        meds = [bn["median_ms"] for bn in res["benches"]]
        print(f"== {mode} {VARIANTS.get(mode, '')}: medians {[round(m, 4) for m in meds]} spread(all) "
              f"{100 * (max(meds) - min(meds)) / statistics.median(meds):.2f} % spread(last 5) "
              f"{100 * (max(meds[-5:]) - min(meds[-5:])) / statistics.median(meds[-5:]):.2f} %")
        print(f"== {mode}: start {res['smi_start']}" + (f"  triton {res['triton_ms']:.4f}" if "triton_ms" in res else "")
              + (f"  copy {res['copy_ms']:.4f}" if "copy_ms" in res else ""))
        for i, bn in enumerate(res["benches"]):
            print(f"  bench {i}: median {bn['median_ms']:.4f} (first q {bn['first_quarter_ms']:.4f}, last q "
                  f"{bn['last_quarter_ms']:.4f}) reps {bn['reps']} wall {bn['wall_s']} s cycles/ms "
                  f"{bn['cycles_per_ms'] and round(bn['cycles_per_ms'])} waiting {bn['waiting']}")
            print(f"     rounds {bn['round_medians_ms']}")
            print(f"     first {bn['first_times_ms']}")
            print(f"     batches {bn['batches'][:6]} ... {len(bn['batches'])} in all")
            print(f"     smi pre  {bn['smi_pre']}\n     smi post {bn['smi_post']}")
            if bn["kernels"]:
                for name, kv in bn["kernels"].items():
                    print(f"     kernel {name}: n {kv['n']} median {kv['median_ms']:.4f} first {kv['first_ms']}")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
