"""Autotune 108 SGEMM configurations and grade 32 submissions over every GPU of one host with Dask, against the same
work on one GPU, with each GPU's utilisation while it runs (issue 19).

Method:
- Clusters: one Dask worker per GPU with one thread (dask-cuda's LocalCUDACluster where it is installed, else a
  distributed.SpecCluster of Nanny workers, each pinned with CUDA_VISIBLE_DEVICES=i). The one-GPU run is a cluster of
  one worker on GPU 0, so both runs pay the same fan-out costs (process start, pickling, result traffic).
- Work, the same in both runs:
  - kernellab.autotune over the configurations of benchmarks/autotune_demo.py's register-tiled SGEMM
    (BM, BN in {32, 64, 128}, BK in {8, 16, 32}, TM, TN in {4, 8}: 108; --configs takes the first N), M = N = K =
    --size, fp32 with TF32 off: each configuration compiled on a worker, pruned, checked once against torch.matmul
    and timed beside it with kernellab.bench on that worker's GPU. Row and compile caches are off
    (KERNELLAB_CACHE=0), so every run compiles and measures everything.
  - kernellab.grade_many over --submissions (32) vector-add submissions: correct variants and the usual mistakes
    (an off-by-one guard, a wrong operator, a read past the end, a kernel that faults, one that does not compile),
    graded by a stand-in grader (compile, kernellab.check on an awkward size with the launches isolated, then
    kernellab.bench against torch.add); --grader teach uses kernellab.teach.grade where it exists.
- Utilisation: NVML (nvidia-ml-py, which dask-cuda brings), else `nvidia-smi`, sampled every 100 ms in this process
  and averaged per GPU over each phase. kernellab.bench keeps a GPU busy at most half the time while it times (burst
  mode, to stay below the power cap), so a GPU that is timing all the time reads about 50 %.
Speed-ups against torch are ratios taken on one GPU in one bench run; the best of the multi-GPU sweep is ranked by
them (its rows come from several GPUs), the best of the one-GPU sweep by time (they agree when the GPUs do).

Run on a GPU host:  python benchmarks/autotune_multigpu.py [--gpus N] [--size 4096] [--configs 108] [--submissions 32]
It runs on one GPU too (the multi-GPU phase is then skipped and the table says so). Results: a table on stdout, and
autotune_multigpu.json in $OUT (or the current folder).
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent

VADD = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""
# Each submission: (what it is, its source). Correct ones first; graded "passed" only if right on 1,000,003 elements.
VARIANTS = [
    ("plain", VADD),
    ("restrict", VADD.replace("const float* a, const float* b, float* c",
                              "const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c")),
    ("grid-stride", VADD.replace("if (i < n) c[i] = a[i] + b[i];",
                                 "for (; i < n; i += gridDim.x * blockDim.x) c[i] = a[i] + b[i];")),
    ("size_t index", VADD.replace("int i = blockIdx.x * blockDim.x + threadIdx.x;",
                                  "size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;")),
    ("off-by-one guard", VADD.replace("i < n", "i < n - 1")),
    ("wrong operator", VADD.replace("a[i] + b[i]", "a[i] - b[i]")),
    ("reads past the end", VADD.replace("b[i];", "b[i + 1];")),
    ("faults", VADD.replace("c[i] =", "c[i + (1 << 28)] =")),
    ("does not compile", VADD.replace("b[i];", "b[i]")),
]


def _demo():
    spec = importlib.util.spec_from_file_location("autotune_demo", HERE / "autotune_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sgemm_configs(n: int) -> list[dict]:
    """BM, BN in {32, 64, 128}, BK in {8, 16, 32}, TM, TN in {4, 8}: 108 configurations; the first n."""
    allc = [dict(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn)
            for bm, bn, bk, tm, tn in itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32), (4, 8), (4, 8))]
    return allc[:n]


def submissions(n: int) -> dict[str, str]:
    """n submissions named student00, student01, ... cycling through VARIANTS."""
    return {f"student{i:02d} ({VARIANTS[i % len(VARIANTS)][0]})": VARIANTS[i % len(VARIANTS)][1] for i in range(n)}


def grade_vadd(exercise_id, source):
    """A stand-in for kernellab.teach.grade: compile, check on an awkward size (isolated), time against torch.add."""
    import torch

    import kernellab

    n = 1_000_003
    try:
        k = kernellab.compile_cuda(source, arch=None).vadd
    except kernellab.CompileError as exc:
        return types.SimpleNamespace(passed=False, findings=(f"does not compile: {str(exc).splitlines()[1]}",))

    def run(a, b, c):
        k[(n + 255) // 256, 256](a, b, c, n)
        return c

    def inputs(g):
        return (torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda(), torch.empty(n, device="cuda"))

    rep = kernellab.check(run, lambda a, b, c: a + b, inputs, trials=2, isolate=True)
    if not rep.passed:
        return types.SimpleNamespace(passed=False, findings=(rep.message,) + ((rep.exception,) if rep.exception
                                                                              else ()))
    t = kernellab.bench(run, inputs, baselines={"torch": lambda a, b, c: torch.add(a, b, out=c)},
                        rep_ms=40, rounds=4)
    return types.SimpleNamespace(passed=True, findings=(f"{t.median_ms * 1e3:.1f} us, "
                                                        f"{t.speedup('torch').ratio:.2f}x torch.add",))


class Utilisation(threading.Thread):
    """GPU utilisation (% of time a kernel ran) of every GPU, sampled every `period_s` until stop()."""

    def __init__(self, gpus: list[int], period_s: float = 0.1):
        super().__init__(daemon=True)
        self.gpus, self.period_s = gpus, period_s
        self.samples: dict[int, list[float]] = {g: [] for g in gpus}
        self.source = "none"
        self._stop_event = threading.Event()

    def run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
            self.source = "NVML"
            while not self._stop_event.wait(self.period_s):
                for g, h in handles.items():
                    self.samples[g].append(float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            return
        except Exception:            # no pynvml: nvidia-smi
            pass
        smi = shutil.which("nvidia-smi")
        if not smi:
            return
        self.source = "nvidia-smi"
        proc = subprocess.Popen([smi, "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits",
                                 f"-lms={int(self.period_s * 1000)}"], stdout=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                if self._stop_event.is_set():
                    break
                idx, util = (s.strip() for s in line.split(","))
                if int(idx) in self.samples:
                    self.samples[int(idx)].append(float(util))
        finally:
            proc.kill()
            proc.wait()

    def stop(self) -> dict[int, float | None]:
        self._stop_event.set()
        self.join(timeout=5)
        return {g: (sum(s) / len(s) if s else None) for g, s in self.samples.items()}


def make_cluster(gpus: list[int]):
    """(cluster, what): one Dask worker with one thread per GPU in `gpus`."""
    try:
        from dask_cuda import LocalCUDACluster

        return (LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), threads_per_worker=1,
                                 dashboard_address=None), "dask-cuda LocalCUDACluster")
    except ImportError:
        from distributed import Nanny, Scheduler, SpecCluster

        workers = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(g)}}}
                   for g in gpus}
        return (SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}),
                "distributed SpecCluster of Nanny workers pinned with CUDA_VISIBLE_DEVICES")


def run_phase(gpus: list[int], configs, subs, problem, demo, grader) -> dict:
    import distributed

    import kernellab

    cluster, what = make_cluster(gpus)
    out = {"gpus": len(gpus), "cluster": what}
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(len(gpus), timeout=300)
        ex = client.get_executor()
        from kernellab.run.measure.autotune import where

        # Every worker imports torch and kernellab and makes its CUDA context before the clock starts.
        warm = client.run(lambda: (__import__("torch").cuda.init(), where())[1])
        out["workers"] = {w: f"{v.gpu}" for w, v in warm.items()}
        launch, inputs, reference, baselines = problem
        util = Utilisation(gpus)
        util.start()
        t0 = time.perf_counter()
        r = kernellab.autotune(demo.SGEMM, configs, kernel="sgemm", launch=launch, inputs=inputs, reference=reference,
                               baselines=baselines, executor=ex, cache=False)
        out["autotune_s"] = time.perf_counter() - t0
        out["autotune_util"] = util.stop()
        out["util_source"] = util.source
        out["autotune"] = r
        util = Utilisation(gpus)
        util.start()
        t0 = time.perf_counter()
        g = kernellab.grade_many("vadd", subs, executor=ex, grade=grader)
        out["grade_s"] = time.perf_counter() - t0
        out["grade_util"] = util.stop()
        out["grades"] = g
    return out


def _util_text(util: dict) -> str:
    return ", ".join(f"{g}: {u:.0f}%" if u is not None else f"{g}: -" for g, u in util.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all)")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--configs", type=int, default=108)
    ap.add_argument("--submissions", type=int, default=32)
    ap.add_argument("--grader", choices=("stand-in", "teach"), default="stand-in")
    ns = ap.parse_args(argv)
    # Workers inherit these: CUDA numbers GPUs as NVML does, and nothing is served from a cache.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ["KERNELLAB_CACHE"] = "0"
    import torch

    if not torch.cuda.is_available():
        print("no GPU here: run this on a GPU host", file=sys.stderr)
        return 2
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("needs Dask: pip install 'kernellab[dask]' (and dask-cuda on GPU hosts)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    import cloudpickle

    demo = _demo()
    cloudpickle.register_pickle_by_value(demo)          # the workers cannot import a module loaded from a path
    n_gpus = ns.gpus or torch.cuda.device_count()
    configs, subs = sgemm_configs(ns.configs), submissions(ns.submissions)
    grader = None if ns.grader == "teach" else grade_vadd
    problem = demo.make_problem(ns.size)
    print(f"# {len(configs)} SGEMM configurations (M = N = K = {ns.size}) and {len(subs)} submissions, on 1 and "
          f"{n_gpus} of {torch.cuda.device_count()} x {torch.cuda.get_device_name()}\n")

    phases = [run_phase([0], configs, subs, problem, demo, grader)]
    if n_gpus > 1:
        phases.append(run_phase(list(range(n_gpus)), configs, subs, problem, demo, grader))
    one = phases[0]
    rows = []
    for p in phases:
        for what, key in (("autotune", "autotune"), ("grade_many", "grade")):
            rows.append((f"{what} ({len(configs) if key == 'autotune' else len(subs)})", p["gpus"],
                         f"{p[key + '_s']:.1f}", f"{one[key + '_s'] / p[key + '_s']:.2f}x",
                         _util_text(p[key + "_util"])))
    widths = [max(len(str(r[i])) for r in rows + [("work", "GPUs", "wall s", "vs 1 GPU", "")]) for i in range(5)]
    head = ("work", "GPUs", "wall s", "vs 1 GPU", f"mean utilisation per GPU ({one['util_source']})")
    print("  ".join(str(h).ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if n_gpus == 1:
        print("\none GPU here: the multi-GPU phase did not run (run on a host with several GPUs for issue 19)")
    print()
    report = {"size": ns.size, "device": torch.cuda.get_device_name(), "phases": []}
    for p in phases:
        r, g = p["autotune"], p["grades"]
        best = r.best
        sp = best.row.speedup("torch") if best else None
        print(f"{p['gpus']} GPU(s), {p['cluster']}:")
        print(f"  autotune: {r.headline()}; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in r.stage_s))
        if best:
            print(f"  best {best.row.label}: {best.row.median_ms:.4g} ms, {sp.ratio:.3f}x torch.matmul on "
                  f"{best.row.gpu} (ranked by {best.ranked_by})")
        per_gpu = {}
        for row in r.rows:
            if row.timed:
                per_gpu[row.gpu] = per_gpu.get(row.gpu, 0) + 1
        print(f"  configurations timed per GPU: " + ", ".join(f"{k}: {v}" for k, v in per_gpu.items()))
        print(f"  grade_many: {g.headline()}")
        for note in r.notes:
            print(f"  note: {note}")
        report["phases"].append({k: v for k, v in p.items() if k not in ("autotune", "grades")}
                                | {"autotune": r.to_json(), "grades": g.to_json()})
    print("\n" + str(phases[-1]["grades"]))
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "autotune_multigpu.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out / 'autotune_multigpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
