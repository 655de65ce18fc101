"""Autotune tutorial 05's SGEMM and grade a class with the tutorials' graders over every GPU of one host with Dask,
against the same job on one GPU in the same run, with each GPU's utilisation while it runs (issue 35).

The job, the same on 1, 2 and (where the host has them) 4 GPUs:
- kernellab.autotune over 108 configurations of tutorial 05's `sgemm_warptile` (its cell's real source, read from
  notebooks/05-matmul.py): BM, BN in {64, 128, 256}, BK in {8, 16, 32}, WM, WN in {32, 64} as -D defines (--configs
  takes the first N). Each configuration is compiled on a worker (NVRTC), pruned by its resources, checked once
  against torch.matmul (fp32, TF32 off) with its launches isolated, and timed beside torch.matmul with kernellab.bench
  on that worker's GPU (short bench: --rep-ms per round, 4 rounds), at M = N = K = --size.
- kernellab.grade_class over a class of --students students x 3 exercises (01-reverse and 02-transpose-batched in
  CUDA C++, 00-flip in Numba): each submission is a cell's source text from tests/exercises/solutions/ (the reference
  solution, or one of the usual mistakes: missing guard, off-by-one, unguarded read, missing barrier, race, no
  shared tile, lost batch offset, short loop, ...) or a cell that does not compile; half the students hand in a
  correct one. Graded by kernellab.teach.grade (the tutorials' graders: compiler checks, every shape and block size
  with NaN-filled outputs, compute-sanitizer, the simulator for Numba), speed bar off. The report checks that every
  submission got the finding its file names (tests/exercises/solutions_lib: `expect: <kinds> on cpu|gpu`).
- Row and compile caches are off (KERNELLAB_CACHE=0): every phase compiles and grades everything.
- Faults (--faults, on by default with 2 or more GPUs), on the largest pool after its job: a small class of 01-reverse
  with one submission that hangs its GPU (an endless loop), graded with timeout_s, and one Dask worker killed
  (SIGKILL) while it grades. Nothing may be lost: the hung submission is an error row that says so, the killed
  worker's submissions are graded again on another worker and their rows say so (`rerun`).

Clusters: --workers-per-gpu Dask worker processes per GPU (default 4, one thread each), each pinned to its GPU with
CUDA_VISIBLE_DEVICES (a distributed.SpecCluster of Nanny workers; dask-cuda's LocalCUDACluster where
--workers-per-gpu is 1 and it is installed). Several workers per GPU let the CPU-bound stages (NVRTC, the graders'
compute-sanitizer and simulator runs) overlap. The autotune streams: each configuration's check-and-time goes out as
soon as it compiled and survived the pruning, while the other compiles run, on one worker per GPU (its lane, which
takes it ahead of the compiles queued there), and one configuration at a time per GPU (a lock per GPU,
kernellab.run.fanout.gpu_lock), so no two timings overlap on one GPU. The one-GPU phase is a pool of the same size on
GPU 0, so every phase pays the same fan-out costs (process start, pickling, result traffic). Cluster start (workers
importing torch and making their CUDA context, cuBLAS's handle and the isolated launch worker, and with
KERNELLAB_SANITIZER_POOL=1 each worker's warm compute-sanitizer of every tool, in every phase alike)
is reported apart and is not in the job's time. Each phase's log prints, per autotune stage, from the rows' records
(when and where each compile and each check-and-time ran): wall, the sum of the job times, the ideal (that sum over
the workers, or over the GPUs for the time a check-and-time held its GPU), the straggler tail, and each worker's first
job against the rest. Every
worker of every phase may use the same number of CPU threads in the libraries it calls (OMP_NUM_THREADS and kin: the
host's cores over the workers of a pool on all its GPUs, the same in every call on one host), so that more workers
do not mean smaller shares (uncapped, the sum of the submissions' grading times rose from 604 s with 4 workers to
805 s with 8 on 4 x H200: a slowdown no number of GPUs can win back). Phases run one GPU first, then the largest
pool (with the fault drill), then the others.
Warm-up: before the first phase the largest pool does a little of the job on every GPU, timed into no ratio. On a
fresh machine the first grades are slower: on two fresh 4 x H200 hosts without it, the first three 01-reverse
submissions of the 1-GPU phase took 8-17 s each (nearly all of it the kernel's runs and copies), against 1-4 s on a
host that had already worked or after the warm-up; the 1-GPU phase alone paid for it, and its 4-GPU ratios read 3.40x
and 3.05x, against 2.47x with the warm-up. It costs about 90 s on 4 GPUs; --no-warm-up leaves it out.
Utilisation: NVML (nvidia-ml-py, which dask-cuda brings), else `nvidia-smi`, sampled every 100 ms here and averaged
per GPU over each stage; kernellab.bench keeps a GPU busy about half the time while it times (burst mode).
Speed-ups against torch are ratios taken on one GPU in one bench run; the best of a multi-GPU sweep is ranked by them.

Run on a GPU host:  python benchmarks/autotune_multigpu.py [--gpus 1,2,4] [--size 2048] [--configs 108]
                    [--students 22] [--workers-per-gpu 4] [--budget-s 420] [--no-faults]
                    [--baseline-from PATH] [--plan-only] [--threads-per-worker N]
Its functions reach the workers by value (cloudpickle sends what lives in __main__), or by name where it is imported
as benchmarks.autotune_multigpu (tests/test_fanout_faults.py). The table comes last on stdout; autotune_multigpu.json and each phase's tables go to $OUT (or ./autotune-multigpu).
Sizing a call: before its first phase it prints the plan, each phase's estimated seconds by part (a pool's start,
the job, the fault drill, the shut-down) from per-item costs in one place (Costs: seconds per configuration and per
submission on one GPU's pool, measured; PRIOR before anything is measured, this run's 1-GPU phase or a stored one
after; the speed-ups in PRIOR_SPEEDUP or measured here), where each would end, which --budget-s skips and why, and
the budget every phase needs; --plan-only prints that and stops (no GPU needed). Before each phase the same estimate
is made again from what this run has measured, and a phase that would end past --budget-s is skipped (the table
says so; 1, 2 and 4 GPUs with the warm-up fit one call of the runner, SUITE_LIMIT_S, on 4 x H200). Where they do not,
run the sizes over two calls: `--gpus 1,4`, then `--gpus 2 --baseline-from <the first call's autotune_multigpu.json>`,
whose 1-GPU phase stands for this run's (refused from another GPU model or with other options); the table marks
every ratio against it [b] and names its file, device and date.
The stage report compares, per exercise and compute-sanitizer tool, each run's ToolCost (GradeResult.tool_costs:
wall and CPU seconds of the tool's processes, bytes read from the disk and by any read, the tool's start to the
kernel's launch and its own start-up within it, the kernel, the tail) between 1 GPU and each pool, and says where
the growth is: before the first kernel, on the cores, or on the disk. With KERNELLAB_SANITIZER_POOL=1 in this
script's environment (its Dask workers inherit it) the graders run each tool in their worker's warm compute-sanitizer
(kernellab.run.nvtools.sanitize_pool: a CUDA context per worker and tool, not per submission); unset, one process per
tool run, for the comparison. Each phase prints how many compute-sanitizer processes it started for how many tool
runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import multiprocessing
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE_LIMIT_S = 500          # tools/gpu/run.py stops the autotune-multigpu suite here
EXERCISES = ("02-transpose-batched", "00-flip", "01-reverse")     # the slowest to grade first: a shorter tail
HANG = r"""extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    // A spin on a volatile load from global memory, which the compiler must keep (NVVM deleted a spin on a volatile
    // local variable, a loop without side effects, and the kernel passed); in[0] never changes: it never ends.
    volatile const float* first = in;
    float seen = first[0];
    while (first[0] == seen || first[0] != seen) { }
    if (i < n) out[i] = in[n - 1 - i];
}
"""


# --- the autotune: tutorial 05's warptile SGEMM ----------------------------------------------------------------------


def warptile_source() -> str:
    """The body of tutorial 05's `%%cuda --name warptile` cell, as the notebook's jupytext source has it."""
    text = (ROOT / "notebooks" / "05-matmul.py").read_text()
    m = re.search(r"^# %%cuda --name warptile\n(.*?)^# %%", text, re.S | re.M)
    if m is None:
        raise RuntimeError("notebooks/05-matmul.py has no `# %%cuda --name warptile` cell")
    return m.group(1).rstrip() + "\n"


def sgemm_configs(n: int = 108) -> list[dict]:
    """BM, BN in {64, 128, 256}, BK in {8, 16, 32}, WM, WN in {32, 64}: 108 configurations; the first n."""
    allc = [dict(BM=bm, BN=bn, BK=bk, WM=wm, WN=wn)
            for bm, bn, bk, wm, wn in itertools.product((64, 128, 256), (64, 128, 256), (8, 16, 32), (32, 64),
                                                        (32, 64))]
    return allc[:n]


def make_problem(size: int, device: str = "cuda"):
    """(launch, inputs, reference, baselines) for C = A @ B with M = N = K = size, fp32."""
    import torch

    M = N = K = size

    def launch(k, c, a, b, out):
        threads = (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]) * 32      # one warp per warp tile (NTW in the cell)
        k[((N + c["BN"] - 1) // c["BN"], (M + c["BM"] - 1) // c["BM"]), threads](a, b, out, M, N, K)
        return out

    def inputs(g):
        return (torch.randn(M, K, generator=g).to(device), torch.randn(K, N, generator=g).to(device),
                torch.empty(M, N, device=device))

    def reference(a, b, out):
        return a @ b

    baselines = {"torch": lambda a, b, out: torch.matmul(a, b, out=out)}
    return launch, inputs, reference, baselines


# --- the class ------------------------------------------------------------------------------------------------------


def _solutions():
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from exercises import solutions_lib
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return solutions_lib


def _broken(source: str, ex_id: str) -> str:
    """The solution with a syntax error on its last statement line (a cell that does not compile)."""
    lines = source.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        code, sep, comment = lines[i].partition("#" if ex_id.startswith("00-") else "//")
        if ex_id.startswith("00-") and re.match(r"\s+\w.*\]\s*$", code):
            lines[i] = code.rstrip() + " +" + (f"  {sep}{comment}" if sep else "")   # Python: a dangling operator
            break
        if not ex_id.startswith("00-") and code.rstrip().endswith(";"):
            lines[i] = code.rstrip()[:-1] + (f"  {sep}{comment}" if sep else "")    # C++: a missing semicolon
            break
    return "\n".join(lines) + "\n"


def build_class(students: int, where: str = "gpu", exercises=EXERCISES):
    """(work, expected): work is {exercise_id: {student: cell source}}; expected is {(exercise_id, student): None
    for "passes" or the finding kinds it must get}. Even-numbered students hand in the reference solution, the others
    cycle through the exercise's wrong variants (those found `where`: "gpu" takes all of them) and a cell that does
    not compile."""
    lib = _solutions()
    work, expected = {}, {}
    for ex_id in exercises:
        solution = lib.solution_path(ex_id).read_text()
        wrong = [(v.name, v.path.read_text(), frozenset(v.kinds)) for v in lib.variants(ex_id)
                 if where == "gpu" or v.where == "cpu"]
        wrong.append(("does_not_compile", _broken(solution, ex_id), frozenset({"compile_error"})))
        subs = {}
        for s in range(students):
            name, src, kinds = ("solution", solution, None) if s % 2 == 0 else wrong[(s // 2) % len(wrong)]
            who = f"student{s:02d} ({name})"
            tag = f"\n# submitted by student{s:02d}\n" if ex_id.startswith("00-") else \
                f"\n// submitted by student{s:02d}\n"
            subs[who] = src + tag
            expected[(ex_id, who)] = kinds
        work[ex_id] = subs
    return work, expected


def check_class(grades, expected) -> list[str]:
    """What does not match the expectation: one line per submission graded otherwise than its file says."""
    bad = []
    for table in grades.tables:
        for r in table.rows:
            want = expected[(table.exercise_id, r.submission)]
            kinds = {f.kind for f in getattr(r.result, "findings", ())}      # the GradeResult travels back
            if r.passed is None:
                bad.append(f"{table.exercise_id} {r.submission}: not graded ({r.error})")
            elif want is None and not r.passed:
                bad.append(f"{table.exercise_id} {r.submission}: should pass, got {sorted(kinds)}")
            elif want is not None and (r.passed or not want <= kinds):
                bad.append(f"{table.exercise_id} {r.submission}: should get {sorted(want)}, got "
                           f"{'passed' if r.passed else sorted(kinds)}")
    return bad


def warm_job(job: dict, workers: int) -> dict:
    """The warm-up's job: a little of each kind of work on every worker of the largest pool, none of it timed into a
    ratio: one configuration a worker and each exercise's first `workers` submissions (solutions and the first of
    its wrong variants: the largest shapes, each compute-sanitizer tool and the graders' findings), no fault drill."""
    work = {ex: dict(itertools.islice(subs.items(), workers)) for ex, subs in job["work"].items()}
    return {**job, "configs": job["configs"][:workers], "work": work, "faults": False}


def warm_up_estimate(n: int, workers_per_gpu: int, costs: "Costs", students: int) -> "PhaseEstimate":
    """The warm-up's seconds: a pool on n GPUs running warm_job, its share of the job on the expected speed-up, the
    start and the work each WARM_UP_GROWTH times a phase's (first work on a machine is dearer)."""
    workers = n * workers_per_gpu
    submissions = len(EXERCISES) * min(workers, students)          # warm_job: each exercise's first `workers`
    e = estimate_phase(n, costs, configs=workers, submissions=submissions, drill_timeout_s=None)
    return dataclasses.replace(e, start_s=e.start_s * WARM_UP_GROWTH["start"], job_s=e.job_s * WARM_UP_GROWTH["job"])


def grade_source(exercise_id, source):
    """The grader for the class: kernellab.teach.grade on the cell's source text, speed bar off (a class is graded
    for correctness; the speed bar times each kernel, which is the autotune's job here)."""
    import kernellab.teach

    return kernellab.teach.grade(exercise_id, source, speed=False)


# --- utilisation ----------------------------------------------------------------------------------------------------


class Utilisation(threading.Thread):
    """GPU utilisation (% of time a kernel ran) of every GPU, sampled every `period_s` until stop()."""

    def __init__(self, gpus: list[int], period_s: float = 0.1):
        super().__init__(daemon=True)
        self.gpus, self.period_s = gpus, period_s
        self.samples: dict[int, list[float]] = {g: [] for g in gpus}
        self.source = "none"
        self._stop_event = threading.Event()
        self.host_busy: float | None = None          # the share of the host's CPU time that was busy, start to stop
        self._cpu0 = host_cpu_times()

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
        cpu1 = host_cpu_times()
        if self._cpu0 and cpu1 and cpu1[1] > self._cpu0[1]:
            self.host_busy = 1.0 - (cpu1[0] - self._cpu0[0]) / (cpu1[1] - self._cpu0[1])
        self.join(timeout=5)
        return {g: (sum(s) / len(s) if s else None) for g, s in self.samples.items()}


def host_cpu_times() -> tuple[float, float] | None:
    """(idle, total) CPU time of the whole host so far, in clock ticks (/proc/stat), or None where there is none."""
    try:
        with open("/proc/stat") as fh:
            fields = [float(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0.0), sum(fields[:8])   # idle + iowait; user..steal


# --- clusters and phases --------------------------------------------------------------------------------------------


def thread_env(threads: int) -> dict[str, str]:
    """The environment that caps a worker's CPU threads (OpenMP, BLAS, Numba, torch's intra-op pool) at `threads`."""
    return {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "NUMBA_NUM_THREADS")}


SANITIZER_TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")   # every tool the class's graders run on a GPU


# The scheduler hands a worker its next queued task only when it is free: Dask's default (1.1) sends a one-thread
# worker two, so near the end one waits behind a long submission on its worker while another worker idles
SATURATION = {"distributed.scheduler.worker-saturation": 1.0}


def make_cluster(gpus: list[int], workers_per_gpu: int = 4, threads_per_worker: int | None = None):
    """(cluster, what): `workers_per_gpu` Dask worker processes (one task thread each) per GPU in `gpus`, each
    allowed `threads_per_worker` CPU threads for the libraries it calls (None: no cap); the scheduler keeps the
    queued tasks until a worker is free (SATURATION)."""
    import dask

    with dask.config.set(SATURATION):            # read once, when the scheduler is made
        return _make_cluster(gpus, workers_per_gpu, threads_per_worker)


def _make_cluster(gpus: list[int], workers_per_gpu: int, threads_per_worker: int | None):
    env = thread_env(threads_per_worker) if threads_per_worker else {}
    if workers_per_gpu == 1:
        try:
            from dask_cuda import LocalCUDACluster

            os.environ.update(env)             # LocalCUDACluster's workers inherit this process's environment
            return (LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), threads_per_worker=1,
                                     dashboard_address=None), "dask-cuda LocalCUDACluster, 1 worker per GPU")
        except ImportError:
            pass
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {f"gpu{g}.{j}": {"cls": Nanny,
                               "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(g), **env}}}
               for g in gpus for j in range(workers_per_gpu)}
    return (SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}),
            f"SpecCluster of Nanny workers, {workers_per_gpu} per GPU, pinned with CUDA_VISIBLE_DEVICES")


def _warm():
    """On a worker: import torch and kernellab, make the CUDA context, cuBLAS's handle and the isolated launch
    worker's process and context (where there is a GPU); which GPU this is. Every pool, the 1-GPU one too, is warmed
    so before the clock starts: a worker's first check-and-time would otherwise pay these under its GPU's lock."""
    import torch

    from kernellab.run.launch import worker as launch_worker
    from kernellab.run.measure.autotune import where

    if torch.cuda.is_available():
        torch.cuda.init()
        a = torch.ones(64, 64, device="cuda")
        (a @ a).sum().item()                           # cuBLAS's handle and workspace
        try:
            launch_worker.default_pool(torch.cuda.current_device()).ensure()
        except Exception as exc:               # the first isolated launch starts it (and says why it cannot)
            return f"{where().gpu} (its isolated launch worker did not start: {type(exc).__name__}: {exc})"
    return where().gpu or "no GPU"


def _warm_sanitizers() -> dict:
    """On a worker's task thread (the graders' pools are per thread): start its warm compute-sanitizer of each tool
    the graders run, on its GPU, and wait until each is ready ({tool: ready}); {} where the pool is off or no GPU."""
    import torch

    from kernellab.run.nvtools import sanitize, sanitize_pool

    if not (sanitize_pool.default_on() and torch.cuda.is_available()):
        return {}
    return sanitize.warm(SANITIZER_TOOLS, device=torch.cuda.current_device())


def warm_sanitizers(client) -> str:
    """With the graders' warm compute-sanitizers on (KERNELLAB_SANITIZER_POOL=1), start each worker's before the
    clock, as its CUDA context and launch worker are: a fresh pool's first job per tool would otherwise make a process
    and a CUDA context under the tool on the job's clock (on 4 x H200 this grew from 0.3 to 3-4 s a run with 16
    workers making them at once). What was warmed, in words; "" when nothing was (the pool off, no GPU)."""
    futures = {addr: client.submit(_warm_sanitizers, workers=[addr], allow_other_workers=False, pure=False)
               for addr in client.scheduler_info()["workers"]}
    got = {addr: f.result() for addr, f in futures.items()}
    if not any(got.values()):
        return ""
    ready = sum(v for tools in got.values() for v in tools.values())
    total = sum(len(tools) for tools in got.values())
    return f"{ready} of {total} warm compute-sanitizers ({', '.join(SANITIZER_TOOLS)})"


def _sanitizer_pools():
    """On a worker: its warm compute-sanitizers' stats (kernellab.run.nvtools.sanitize_pool.stats())."""
    from kernellab.run.nvtools import sanitize_pool

    return sanitize_pool.stats()


def pools_text(per_worker: dict) -> str:
    """One line over the workers' warm compute-sanitizers: processes, jobs, why processes were replaced, and the
    workers where a tool's output was seen out of program order."""
    pools = [s for stats in per_worker.values() for s in stats]
    if not pools:
        return "no warm compute-sanitizer ran"
    restarts: dict = {}
    for s in pools:
        for why, n in s.get("restarts", {}).items():
            restarts[why] = restarts.get(why, 0) + n
    bad = sorted({f"{w} ({s['tool']})" for w, stats in per_worker.items() for s in stats if not s.get("ordered", True)})
    return (f"{sum(s['processes_started'] for s in pools)} processes for {sum(s['jobs'] for s in pools)} jobs in "
            f"{len(pools)} pools; replaced: {restarts or 'none'}; out of program order: {', '.join(bad) or 'never'}")


def run_phase(gpus: list[int], workers_per_gpu: int, job: dict, log=print) -> dict:
    """Start a pool on `gpus`, run the job (autotune, then the class), and return what it took."""
    import distributed

    import kernellab
    from kernellab.run import fanout

    t0 = time.perf_counter()
    before = set(multiprocessing.active_children())
    cluster, what = make_cluster(gpus, workers_per_gpu, job.get("threads_per_worker"))
    out = {"gpus": len(gpus), "gpu_ids": gpus, "workers": len(gpus) * workers_per_gpu, "cluster": what,
           "threads_per_worker": job.get("threads_per_worker"),
           "worker_saturation": getattr(getattr(cluster, "scheduler", None), "WORKER_SATURATION", None)}
    client = distributed.Client(cluster)
    try:
        client.wait_for_workers(len(gpus) * workers_per_gpu, timeout=300)
        ex = client.get_executor()
        fanout.prepare(ex)
        out["worker_gpus"] = client.run(_warm)
        out["sanitizers_warmed"] = warm_sanitizers(client)
        out["start_s"] = time.perf_counter() - t0
        log(f"  {len(gpus)} GPU(s): {out['workers']} workers up in {out['start_s']:.1f} s (warmed: CUDA context, "
            f"cuBLAS, the isolated launch worker{', ' + out['sanitizers_warmed'] if out['sanitizers_warmed'] else ''})")
        for addr, what in out["worker_gpus"].items():
            if "did not start" in str(what):
                log(f"  WARNING {addr}: {what}")

        util = Utilisation(gpus)
        util.start()
        t1 = time.perf_counter()
        launch, inputs, reference, baselines = job["problem"]
        r = kernellab.autotune(job["source"], job["configs"], kernel="sgemm_warptile", launch=launch, inputs=inputs,
                               reference=reference, baselines=baselines, executor=ex, cache=False, progress=False,
                               bench_options=job["bench_options"], first_line=2, filename="cell.cu")
        out["autotune_s"] = time.perf_counter() - t1
        out["autotune_util"] = util.stop()
        out["autotune_host_cpu"] = util.host_busy
        out["util_source"] = util.source
        out["autotune"] = r
        log(f"  autotune: {out['autotune_s']:.1f} s ({r.headline()})")
        out["autotune_jobs"] = autotune_jobs(r.rows, out["workers"], len(gpus), out["autotune_s"])
        for line in autotune_jobs_text(out["autotune_jobs"]):
            log(f"  autotune jobs: {line}")

        util = Utilisation(gpus)
        util.start()
        t2 = time.perf_counter()
        g = kernellab.grade_class(job["work"], executor=ex, grade=grade_source, progress=False,
                                  timeout_s=job["grade_timeout_s"])
        out["grade_s"] = time.perf_counter() - t2
        out["grade_util"] = util.stop()
        out["grade_host_cpu"] = util.host_busy
        out["grades"] = g
        out["job_s"] = out["autotune_s"] + out["grade_s"]
        log(f"  grade_class: {out['grade_s']:.1f} s ({g.headline()})")
        try:
            out["sanitizer_pools"] = client.run(_sanitizer_pools)
            log(f"  warm compute-sanitizers: {pools_text(out['sanitizer_pools'])}")
        except Exception as exc:              # a lost worker must not cost the phase its report
            log(f"  warm compute-sanitizers: not read ({type(exc).__name__}: {exc})")
        if job.get("faults"):
            out["faults"] = fault_drill(client, ex, job.get("drill_timeout_s", 25.0), log)
    finally:
        t3 = time.perf_counter()
        out["close"] = close_pool(client, cluster, keep=before)
        out["close_s"] = time.perf_counter() - t3           # the pool's shut-down
        if out["close"] != "closed":
            log(f"  pool shut-down: {out['close']} ({out['close_s']:.1f} s); the phase's results are kept")
    return out


def _shutdown_helpers() -> str:
    """On a worker: end its warm compute-sanitizers and isolated launch workers, so that the worker process can exit
    at once when its nanny asks (left to atexit they can outlast the nanny's few seconds)."""
    from kernellab.run.launch import worker as launch_worker
    from kernellab.run.nvtools import sanitize_pool

    sanitize_pool.shutdown()
    launch_worker.shutdown()
    return "ok"


def close_pool(client, cluster, keep=frozenset(), timeout_s: float = 60.0) -> str:
    """Shut a phase's pool down without letting a slow or failed shut-down cost the phase its results: the workers'
    helper processes first, then the client and the cluster; the pool's processes (this process's children not in
    `keep`) still alive after that are killed. "closed", or what went wrong and what was killed."""
    problems = []
    ended = threading.Thread(target=lambda: client.run(_shutdown_helpers), daemon=True)
    ended.start()
    ended.join(timeout_s)                    # a hung worker cannot hold the shut-down: the cluster's close ends it
    if ended.is_alive():
        problems.append(f"workers' helpers not ended in {timeout_s:g} s")
    for what, close in (("client", lambda: client.close(timeout=timeout_s)),
                        ("cluster", lambda: cluster.close(timeout=timeout_s))):
        try:
            close()
        except Exception as exc:
            problems.append(f"{what} close failed ({type(exc).__name__}: {str(exc) or 'no message'})")
    left = [p for p in multiprocessing.active_children() if p not in keep and p.is_alive()]
    for p in left:
        p.kill()
    if left:
        problems.append(f"{len(left)} worker process(es) still alive, killed")
    return "; ".join(problems) or "closed"


def fault_drill(client, ex, timeout_s: float, log=print) -> dict:
    """A small class with one hanging submission, graded while one busy worker is killed: what came back.
    `timeout_s` is under the grader's own isolation timeout (30 s), so that the fan-out's watchdog is what ends the
    hang: the worker process with the hung kernel is ended and a fresh one takes its place."""
    import kernellab

    lib = _solutions()
    solution = lib.solution_path("01-reverse").read_text()
    subs = {f"drill{s:02d}": solution + f"\n// drill {s}\n" for s in range(11)}
    subs["drill-hang"] = HANG
    killed: list[str] = []

    def kill_one():
        time.sleep(3.0)                           # the grading is under way
        for addr, keys in client.processing().items():
            if keys:
                pid = client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{addr} (pid {pid})")
                return

    t0 = time.perf_counter()
    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    g = kernellab.grade_class({"01-reverse": subs}, executor=ex, grade=grade_source, progress=False,
                              timeout_s=timeout_s)
    killer.join()
    t = g.tables[0]
    hang = t.row("drill-hang")
    others = [r for r in t.rows if r.submission != "drill-hang"]
    res = {"s": time.perf_counter() - t0, "killed": killed, "rows": len(t.rows), "submissions": len(subs),
           "hang": hang.error or f"{hang.status} in {(hang.wall_ms or 0) / 1e3:.1f} s",
           "reruns": [f"{r.submission}: {r.rerun}" for r in t.rows if r.rerun],
           "graded": sum(r.passed is True for r in others), "others": len(others),
           "problems": drill_problems(t, subs, killed), "table": str(t)}
    res["ok"] = not res["problems"]
    log(f"  faults: killed {killed or 'nothing'}; {res['graded']} of {len(others)} others passed, "
        f"{len(res['reruns'])} graded again; the hung one: {res['hang']}")
    return res


def drill_problems(t, subs: dict, killed: list) -> list[str]:
    """What the fault drill got wrong, one line each (empty: nothing lost): a row missing, the hanging submission not
    given up by the timeout (it passed: its kernel did not hang), a correct submission not passed, no worker killed."""
    problems = []
    if len(t.rows) != len(subs) or [r.submission for r in t.rows] != list(subs):
        problems.append(f"{len(t.rows)} rows for {len(subs)} submissions")
    hang = next((r for r in t.rows if r.submission == "drill-hang"), None)
    if hang is None:
        problems.append("no row for drill-hang")
    elif hang.passed is False and "timeout" in hang.kinds:
        pass                  # the grader's own launch timeout (30 s) ended it first: a failed grade that says so
    elif hang.passed is not None or "timeout_s" not in (hang.error or ""):
        problems.append(f"drill-hang was not given up by the timeout: it {hang.status}"
                        + (f" in {hang.wall_ms / 1e3:.1f} s (its kernel did not hang)" if hang.passed is not None
                           and hang.wall_ms else "") + (f" ({hang.error})" if hang.error else ""))
    bad = [f"{r.submission} {r.status}" + (f" ({r.error})" if r.error else "")
           for r in t.rows if r.submission != "drill-hang" and r.passed is not True]
    if bad:
        problems.append("correct submissions not passed: " + "; ".join(bad))
    if not killed:
        problems.append("no worker was killed (none was busy 3 s in)")
    return problems


# --- the report -----------------------------------------------------------------------------------------------------


def _util_text(util: dict) -> str:
    return " ".join(f"{g}:{u:.0f}%" if u is not None else f"{g}:-" for g, u in util.items())


def table(phases: list[dict], skipped: list[str]) -> str:
    """The summary table: one row per phase, the speed-ups against the one-GPU phase (marked [b] where that phase is
    stored from an earlier call: see baseline_text); none where no 1-GPU phase is there to compare with."""
    from kernellab import report

    one = phases[0] if phases[0]["gpus"] == 1 else None
    mark = " [b]" if one is not None and one.get("stored") else ""
    head = ["GPUs", "workers", "start s", "compile s", "check+time s", "autotune s", "grade s", "job s",
            "job vs 1 GPU", "autotune vs 1", "grade vs 1", "util autotune", "util grade", "host CPU grade",
            "sanitizer procs / runs"]

    def ratio(key, p):
        return f"{one[key] / p[key]:.2f}x" + (mark if p is not one else "") if one is not None else "-"

    rows = []
    for p in phases:
        st = p["autotune_stage_s"]
        rows.append([f"{p['gpus']}" + (mark if p.get("stored") else ""), p["workers"], f"{p['start_s']:.1f}",
                     f"{st.get('compile', 0):.1f}", f"{st.get('check_and_time', 0):.1f}", f"{p['autotune_s']:.1f}",
                     f"{p['grade_s']:.1f}", f"{p['job_s']:.1f}", ratio("job_s", p), ratio("autotune_s", p),
                     ratio("grade_s", p), _util_text(p["autotune_util"]), _util_text(p["grade_util"]),
                     f"{p['grade_host_cpu']:.0%}" if p.get("grade_host_cpu") is not None else "-",
                     _procs_text(p.get("tool_processes"))])
    for s in skipped:
        rows.append([s] + [""] * (len(head) - 1))
    return report.text_table(head, rows)


def _procs_text(tp: dict | None) -> str:
    """'12 / 264': compute-sanitizer processes the phase's graders started / their tool runs ('-' where unknown)."""
    if not tp or not tp.get("runs") or tp.get("unknown") == tp.get("runs"):
        return "-"
    return f"{tp['started']} / {tp['runs']}"


def busy_share(p: dict) -> float:
    """The share of the grading's wall time x workers that the workers spent grading (sum of the rows' times)."""
    graded_s = sum((r.wall_ms or 0) for r in p["grades"].rows) / 1e3
    return graded_s / (p["workers"] * p["grade_s"]) if p["grade_s"] else 0.0


def summarize(p: dict, configs: int, submissions: int) -> dict:
    """Add to a phase what the report reads, as plain data (kept in the JSON, so a stored phase has it too): the
    job's size, the autotune's stages, the grading's busy share, its longest submission and each exercise's steps."""
    p["configs"], p["submissions"] = configs, submissions
    p["autotune_stage_s"] = dict(p["autotune"].stage_s)
    p["grade_busy"] = busy_share(p)
    p["slowest"] = slowest_submissions(p)
    p["longest"] = [p["slowest"][0]["submission"], p["slowest"][0]["wall_s"]] if p["slowest"] else None
    p["grade_stages"] = grade_stages(p)
    p["tool_costs"] = tool_costs(p)
    p["tool_processes"] = tool_processes(p)
    if "autotune_jobs" not in p:
        p["autotune_jobs"] = autotune_jobs(p["autotune"].rows, p["workers"], p["gpus"], p["autotune_s"])
    return p


def autotune_jobs(rows, workers: int, gpus: int, wall_s: float) -> dict:
    """The autotune's jobs as the rows recorded them (when and where each compile and each check-and-time ran), per
    stage: wall (first start to last end), the sum of the job times, the ideal (that sum over the slots: the pool's
    workers for the compiles, its GPUs for the GPU-held part of the checks and timings), the straggler tail (from
    the moment the first slot ran out of work to the stage's end), each slot's first job against the rest (a cold
    worker), and for the whole sweep the bound a perfect schedule meets: the larger of the two ideals."""
    out: dict = {"workers": workers, "gpus": gpus, "wall_s": wall_s}
    comp = [(r.compiled_at, r.compile_worker) for r in rows if getattr(r, "compiled_at", None)]
    meas = [(r.measured_at, r.gpu or r.worker) for r in rows if getattr(r, "measured_at", None)
            and r.measured_at[1] is not None]
    t0 = min([c[0][0] for c in comp] + [m[0][0] for m in meas], default=None)

    def stage(spans: list[tuple[float, float, str]], slots: int) -> dict | None:
        if not spans:
            return None
        start, end = min(s[0] for s in spans), max(s[1] for s in spans)
        busy = sum(b - a for a, b, _ in spans)
        last: dict[str, float] = {}
        firsts: dict[str, tuple[float, float]] = {}
        for a, b, slot in spans:
            last[slot] = max(last.get(slot, 0.0), b)
            if slot not in firsts or a < firsts[slot][0]:
                firsts[slot] = (a, b - a)
        first_s = [d for _, d in firsts.values()]
        rest = sorted(b - a for a, b, slot in spans if (a, b - a) != firsts[slot])
        # a slot never used (fewer jobs than slots) ran out of work at the start
        idle_from = min(last.values()) if len(last) >= slots else start
        return {"jobs": len(spans), "slots": slots, "used": len(last), "start_s": start - t0, "end_s": end - t0,
                "wall_s": end - start, "sum_s": busy, "ideal_s": busy / slots, "tail_s": end - idle_from,
                "longest_s": max(b - a for a, b, _ in spans),
                "first_s": sum(first_s) / len(first_s), "rest_s": rest[len(rest) // 2] if rest else None}

    out["compile"] = stage([(a, b, w or "?") for (a, b), w in comp], workers)
    out["gpu_held"] = stage([(held, end, g) for (_, held, end), g in meas], gpus)
    if meas:
        out["lock_wait_s"] = sum(held - start for (start, held, _), _ in meas)
        task = stage([(start, end, g) for (start, _, end), g in meas], gpus)
        out["measure_task_wall_s"] = task["wall_s"]
        if comp:
            last_compile = max(b for (_, b), _ in comp)
            out["held_before_last_compile_s"] = sum(max(0.0, min(end, last_compile) - held)
                                                    for (_, held, end), _ in meas)
    ideals = [x["ideal_s"] for x in (out["compile"], out["gpu_held"]) if x]
    out["ideal_s"] = max(ideals) if ideals else None
    return out


def autotune_jobs_text(j: dict) -> list[str]:
    """The lines the log prints from autotune_jobs: one per stage and one for the sweep."""
    lines = []
    for key, what, slot in (("compile", "compile", "workers"), ("gpu_held", "check-and-time, GPU held", "GPUs")):
        x = j.get(key)
        if not x:
            lines.append(f"{what}: no jobs recorded")
            continue
        lines.append(f"{what}: wall {x['wall_s']:.1f} s ({x['start_s']:.1f} -> {x['end_s']:.1f} s), sum of job times "
                     f"{x['sum_s']:.1f} s over {x['jobs']} jobs, ideal {x['ideal_s']:.1f} s (sum / {x['slots']} "
                     f"{slot}; {x['used']} used), straggler tail {x['tail_s']:.1f} s, longest job {x['longest_s']:.2f} "
                     f"s, first job per {slot[:-1]} {x['first_s']:.2f} s vs the rest's median "
                     + (f"{x['rest_s']:.2f} s" if x["rest_s"] is not None else "-"))
    if j.get("gpu_held"):
        lines.append(f"check-and-time tasks: waited for their GPU {j['lock_wait_s']:.1f} s in all; GPU held "
                     f"{j.get('held_before_last_compile_s', 0):.1f} s of {j['gpu_held']['sum_s']:.1f} s before the "
                     f"last compile ended (streamed: the timing overlaps the compiles)")
    if j.get("ideal_s"):
        lines.append(f"sweep: wall {j['wall_s']:.1f} s, ideal {j['ideal_s']:.1f} s (the larger stage ideal), "
                     f"{j['wall_s'] - j['ideal_s']:.1f} s over it")
    return lines


def autotune_jobs_growth(a: dict | None, b: dict | None) -> str:
    """The autotune's jobs 1 GPU -> this pool: the same work, so a summed job time that grows is each job slowed by
    the others (contention), and what the wall loses past the ideal is the schedule's (tails, cold workers)."""
    if not a or not b:
        return ""
    parts = []
    for key, what in (("compile", "compile jobs"), ("gpu_held", "GPU held by check-and-time")):
        x, y = a.get(key), b.get(key)
        if x and y and x["sum_s"] > 0:
            parts.append(f"{what} summed {x['sum_s']:.1f} -> {y['sum_s']:.1f} s (x{y['sum_s'] / x['sum_s']:.2f})")
    if a.get("ideal_s") and b.get("ideal_s"):
        parts.append(f"autotune past its ideal {a['wall_s'] - a['ideal_s']:.1f} -> {b['wall_s'] - b['ideal_s']:.1f} s")
    return "autotune: " + ", ".join(parts) if parts else ""


def where_time_goes(p: dict, one: dict) -> str:
    """Which stage kept a phase from scaling: each stage's speed-up against one GPU."""
    st, st1 = p["autotune_stage_s"], one["autotune_stage_s"]
    parts = []
    for name, a, b in (("compile", st1.get("compile", 0), st.get("compile", 0)),
                       ("check-and-time", st1.get("check_and_time", 0), st.get("check_and_time", 0)),
                       ("probe + prune (here)", st1.get("probe", 0) + st1.get("prune", 0),
                        st.get("probe", 0) + st.get("prune", 0)),
                       ("grading", one["grade_s"], p["grade_s"])):
        if b > 0:
            parts.append(f"{name} {a:.1f} -> {b:.1f} s ({a / b:.2f}x)")
    parts.append(autotune_jobs_growth(one.get("autotune_jobs"), p.get("autotune_jobs")))
    parts.append(f"workers busy grading {p['grade_busy']:.0%} of its wall time (1 GPU: {one['grade_busy']:.0%}; the "
                 f"rest is scheduling, result traffic and the last submissions' tail)")
    if p.get("longest"):
        parts.append(f"longest submission {p['longest'][1]:.1f} s ({p['longest'][0]})")
    return "; ".join(x for x in parts if x)


def grade_stages(p: dict) -> dict[str, dict[str, float]]:
    """{exercise: {step: mean seconds per submission}} from the GradeResults' stage_s, over the submissions that
    compiled, with "wall" (the row's own time) beside the steps; {} where no result travelled back."""
    out = {}
    for t in p["grades"].tables:
        rows = [r for r in t.rows if r.result is not None and getattr(r.result, "stage_s", ())
                and "compile_error" not in r.kinds]
        if not rows:
            continue
        sums: dict[str, float] = {"wall": sum((r.wall_ms or 0) for r in rows) / 1e3}
        for r in rows:
            for step, sec in r.result.stage_s:
                sums[step] = sums.get(step, 0.0) + sec
        out[t.exercise_id] = {k: v / len(rows) for k, v in sums.items()}
    return out


def slowest_submissions(p: dict, n: int = 3, steps: int = 5) -> list[dict]:
    """The `n` longest grades: exercise, submission, wall seconds and their `steps` largest steps (GradeResult.stage_s,
    seconds; CPU-time entries left out): what bounds a pool's last wave, where a mean per exercise cannot say."""
    rows = [(t.exercise_id, r) for t in p["grades"].tables for r in t.rows if r.wall_ms]
    out = []
    for ex, r in sorted(rows, key=lambda x: -x[1].wall_ms)[:n]:
        stage = [(k, float(v)) for k, v in (getattr(r.result, "stage_s", ()) or ()) if not k.startswith("cpu:")]
        out.append({"exercise": ex, "submission": r.submission, "wall_s": r.wall_ms / 1e3,
                    "steps": sorted(stage, key=lambda kv: -kv[1])[:steps]})
    return out


def slowest_text(p: dict) -> list[str]:
    """A line per slowest_submissions entry."""
    return [f"{x['exercise']} {x['submission']} {x['wall_s']:.1f} s: "
            + (", ".join(f"{k} {v:.1f} s" for k, v in x["steps"]) or "no steps travelled back")
            for x in p.get("slowest") or ()]


def tool_costs(p: dict) -> dict[str, dict[str, dict[str, float]]]:
    """{exercise: {tool step: {figure: mean per submission}}} from the GradeResults' tool_costs (each
    compute-sanitizer run's wall and CPU seconds, bytes read, its start-up to the first kernel, ...: ToolCost), over
    the submissions that compiled; a figure's mean is over the runs that measured it. {} where none travelled back."""
    out = {}
    for t in p["grades"].tables:
        sums: dict[str, dict[str, list[float]]] = {}
        for r in t.rows:
            if r.result is None or "compile_error" in r.kinds:
                continue
            for step, cost in getattr(r.result, "tool_costs", ()) or ():
                for k, v in cost.to_json().items():
                    if v is not None:
                        sums.setdefault(step, {}).setdefault(k, []).append(float(v))
        if sums:
            out[t.exercise_id] = {step: {k: sum(v) / len(v) for k, v in d.items()} for step, d in sums.items()}
    return out


def _sanitize_pool_on() -> bool:
    """Whether the graders of this run pool their compute-sanitizer runs (KERNELLAB_SANITIZER_POOL=1)."""
    from kernellab.run.nvtools.sanitize_pool import default_on

    return default_on()


def tool_processes(p: dict) -> dict[str, int]:
    """{"started": compute-sanitizer processes the graders started, "runs": tool runs, "unknown": runs whose cost did
    not say} over the phase's submissions (ToolCost.process_started: True for every one-shot run, for the first job
    of each warm process of kernellab.run.nvtools.sanitize_pool)."""
    out = {"started": 0, "runs": 0, "unknown": 0}
    for t in p["grades"].tables:
        for r in t.rows:
            for _, cost in (getattr(r.result, "tool_costs", ()) or ()) if r.result is not None else ():
                out["runs"] += 1
                started = getattr(cost, "process_started", None)
                if started is None:
                    out["unknown"] += 1
                elif started:
                    out["started"] += 1
    return out


def where_grading_goes(p: dict, one: dict) -> list[str]:
    """Per exercise, a submission's mean seconds by step, 1 GPU -> this pool (largest first), its CPU seconds, and
    what the numbers say: the host's cores saturated, or submissions waiting on something the host's GPUs share."""
    a, b = one["grade_stages"], p["grade_stages"]
    lines = []
    cpu_1 = cpu_n = wall_1 = wall_n = 0.0
    for ex_id, steps in b.items():
        base = a.get(ex_id, {})
        cpu = ("cpu: this process", "cpu: tools' processes")
        system = "cpu: this process, in the kernel (system)"
        parts = [f"{k} {base.get(k, 0):.1f} -> {v:.1f} s" for k, v in sorted(steps.items(), key=lambda kv: -kv[1])
                 if k not in (*cpu, system) and (v >= 0.05 or base.get(k, 0) >= 0.05)]
        c1, cn = sum(base.get(k, 0) for k in cpu), sum(steps.get(k, 0) for k in cpu)
        parts.append(f"CPU {c1:.1f} -> {cn:.1f} s (this process {base.get(cpu[0], 0):.1f} -> "
                     f"{steps.get(cpu[0], 0):.1f}, of it in the OS kernel {base.get(system, 0):.1f} -> "
                     f"{steps.get(system, 0):.1f}; tools {base.get(cpu[1], 0):.1f} -> {steps.get(cpu[1], 0):.1f})")
        lines.append(f"{ex_id}, mean per submission: " + "; ".join(parts))
        n = sum(1 for t in p["grades"].tables if t.exercise_id == ex_id for _ in t.rows)
        cpu_1, cpu_n, wall_1, wall_n = cpu_1 + c1 * n, cpu_n + cn * n, wall_1 + base.get("wall", 0) * n, \
            wall_n + steps.get("wall", 0) * n
    busy = p.get("grade_host_cpu")
    if wall_1 and wall_n and cpu_1:
        w, c = wall_n / wall_1, cpu_n / cpu_1
        host = f"the host's CPUs {busy:.0%} busy while it graded" if busy is not None else "host CPU not read"
        if busy is not None and busy >= 0.85:
            why = "CPU-bound: the host's cores are saturated; more workers cannot help, less CPU per submission can"
        elif c >= 0.7 * w:
            why = ("each submission's CPU seconds grow with the pool as its wall time does: its processes contend "
                   "for what the cores share (memory bandwidth, caches) or spin while they wait")
        else:
            why = ("wall time grows but CPU seconds do not: submissions wait on something the host's GPUs share "
                   "(the driver, a host-wide lock), not on the cores")
        lines.append(f"verdict: a submission's wall time x{w:.2f} and its CPU seconds x{c:.2f} against 1 GPU, {host}:"
                     f" {why}")
    return lines


def where_tools_go(p: dict, one: dict) -> list[str]:
    """Per exercise and compute-sanitizer tool, a run's mean figures 1 GPU -> this pool (tool_costs): wall and CPU
    seconds of the tool's processes, its start-up to the first kernel (the tool's own start-up inside it), the kernel,
    the tail after it, bytes read from the disk and by any read; then which part the growth is in, and what that
    points at: the cores, the disk, or a wait before the first kernel (the tool's and the target's start-up, the CUDA
    context made under the tool) or after it."""
    a, b = one.get("tool_costs") or {}, p.get("tool_costs") or {}
    lines = []
    grew = {"wall_s": 0.0, "cpu_s": 0.0, "to_kernel_s": 0.0, "kernel_s": 0.0, "after_kernel_s": 0.0,
            "tool_start_s": 0.0, "imports_s": 0.0, "context_s": 0.0}
    disk = [0.0, 0.0]
    for ex_id, tools in b.items():
        for step, c in sorted(tools.items()):
            c1 = a.get(ex_id, {}).get(step)
            if c1 is None:
                continue

            def pair(key, scale=1.0, unit=" s", fmt=".2f"):
                x, y = c1.get(key), c.get(key)
                return "-" if x is None or y is None else f"{x / scale:{fmt}} -> {y / scale:{fmt}}{unit}"

            lines.append(f"{ex_id} {step}: wall {pair('wall_s')}, CPU {pair('cpu_s')}; to the first kernel "
                         f"{pair('to_kernel_s')} (the tool's start-up {pair('tool_start_s')}, Python and imports "
                         f"{pair('imports_s')}, CUDA context and module {pair('context_s')}), kernel "
                         f"{pair('kernel_s')}, after it {pair('after_kernel_s')}; read from disk "
                         f"{pair('read_bytes', 1e6, ' MB', '.1f')} (any read {pair('read_chars', 1e6, ' MB', '.0f')})")
            for key in grew:
                if c1.get(key) is not None and c.get(key) is not None:
                    grew[key] += c[key] - c1[key]
            if c1.get("read_bytes") is not None and c.get("read_bytes") is not None:
                disk[0], disk[1] = disk[0] + c1["read_bytes"], disk[1] + c["read_bytes"]
    if not lines:
        return lines
    parts = {"before the first kernel": grew["to_kernel_s"], "the kernel under the tool": grew["kernel_s"],
             "after the kernel": grew["after_kernel_s"]}
    where, most = max(parts.items(), key=lambda kv: kv[1])
    if grew["wall_s"] <= 0.05:
        why = "the tools' runs did not grow"
    elif disk[1] > max(2 * disk[0], disk[0] + 50e6):
        why = "the disk: the runs read more from storage with more of them at once (cold files, evicted cache)"
    elif grew["cpu_s"] >= 0.7 * grew["wall_s"]:
        why = "the cores: CPU seconds grew with the wall time (contention for what the cores share)"
    else:
        before = {"the tool's start-up": grew["tool_start_s"], "Python and imports": grew["imports_s"],
                  "the CUDA context and module load under the tool (the driver's process-wide work)":
                  grew["context_s"]}
        first = max(before.items(), key=lambda kv: kv[1])
        why = (f"a wait, {where} (" + {"before the first kernel": f"most in {first[0]}, {first[1]:+.2f} s",
                                       "the kernel under the tool": "the GPU or the tool's instrumented kernel",
                                       "after the kernel": "the tool's report and teardown"}[where]
               + "): neither CPU seconds nor disk reads grew with it")
    rest = grew["wall_s"] - sum(parts.values())
    lines.append(f"verdict: one submission of each exercise, its tools' runs summed, grew {grew['wall_s']:+.2f} s of "
                 f"wall time: " + ", ".join(f"{k} {v:+.2f} s" for k, v in parts.items())
                 + (f", outside the job's marks {rest:+.2f} s" if abs(rest) >= 0.05 else "")
                 + f"; CPU {grew['cpu_s']:+.2f} s; read from disk {disk[0] / 1e6:.1f} -> {disk[1] / 1e6:.1f} MB; "
                 f"points at {why}")
    return lines


# --- the estimate: what each phase will take, from per-item costs, in one place ---------------------------------------

# Before anything is measured here: the figures of the 1-GPU phase on 4 x NVIDIA H200 (64 cores), 2026-11-28
# (docs/RESULTS.md; 108 configurations at 2048, 66 submissions, 4 workers per GPU), as costs per item.
PRIOR = {"source": "the 1-GPU phase on 4 x NVIDIA H200 after the warm-up, 2026-11-28 (docs/RESULTS.md)",
         "setup_s": 5.0, "start_s": 15.3, "s_per_config": 40.4 / 108, "s_per_submission": 37.1 / 66, "close_s": 3.0,
         "workers_per_gpu": 4}
# The job's speed-up on n GPUs against one, the lower of those measured on 4 x H200 hosts (2 GPUs: 1.59x and 1.83x;
# 4: 2.47x with the warm-up). Sizes between or past these: interpolated, or the largest's, flat.
PRIOR_SPEEDUP = {2: 1.59, 4: 2.47}
START_GROWTH = (33.2 / 15.3 - 1) / 3  # a pool's start grows with its workers: 15.3 -> 33.2 s for 1 -> 4 GPUs
# The warm-up against a phase's estimate, measured on 4 x H200: its start 49.6 s (the 4-GPU phase's 33.2) and its
# work 34.3 s (13.3 estimated from the phases' per-item costs: each worker's first configuration and grades)
WARM_UP_GROWTH = {"start": 49.6 / 33.2, "job": 34.3 / 13.3}
DRILL_EXTRA_S = 10.0                  # the fault drill: its timeout_s plus this (31 s at timeout_s=25 on 2 x H200)
REPORT_S = 5.0                        # after the last phase: the report and its files


@dataclass(frozen=True)
class Costs:
    """What the job costs on one GPU's pool, per item, and the speed-ups known: what every estimate is made from."""

    source: str                 # where the figures come from
    start_s: float              # a pool's start on one GPU (workers import torch and make their CUDA context)
    s_per_config: float         # autotune's wall seconds per configuration on one GPU's pool
    s_per_submission: float     # grade_class's wall seconds per submission on one GPU's pool
    close_s: float              # a pool's shut-down
    speedup: tuple[tuple[int, float], ...] = ()   # (n, the job's speed-up on n GPUs against one) measured here

    @classmethod
    def prior(cls) -> "Costs":
        return cls(PRIOR["source"], PRIOR["start_s"], PRIOR["s_per_config"], PRIOR["s_per_submission"],
                   PRIOR["close_s"])

    @classmethod
    def from_phase(cls, p: dict, source: str) -> "Costs":
        """The costs a 1-GPU phase measured (a phase of this run, or one stored by an earlier run)."""
        return cls(source, p["start_s"], p["autotune_s"] / max(1, p["configs"]),
                   p["grade_s"] / max(1, p["submissions"]), p.get("close_s") or PRIOR["close_s"])

    def with_speedup(self, n: int, s: float) -> "Costs":
        return dataclasses.replace(self, speedup=tuple(sorted({**dict(self.speedup), n: s}.items())))


def expected_speedup(n: int, measured: dict[int, float] | None = None) -> tuple[float, str]:
    """(the job's speed-up on n GPUs against one, where it comes from): measured in this run for n, else
    interpolated over 1 GPU (1.0), PRIOR_SPEEDUP and what this run measured (which wins), flat past the largest."""
    measured = measured or {}
    if n in measured:
        return measured[n], "measured"
    known = {1: 1.0, **PRIOR_SPEEDUP, **measured}
    if n in known:
        return known[n], "measured here" if n in measured else "earlier runs"
    lo = max((k for k in known if k < n), default=1)
    hi = min((k for k in known if k > n), default=None)
    if hi is None:
        return min(float(n), known[lo]), f"as on {lo} GPUs"
    s = known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
    return min(float(n), s), f"between {lo} and {hi} GPUs"


@dataclass(frozen=True)
class PhaseEstimate:
    """One phase's estimated seconds, by part."""

    gpus: int
    start_s: float
    job_s: float               # autotune + grade_class
    speedup: float             # the job's against one GPU, the estimate's
    speedup_from: str
    drill_s: float             # the fault drill (0: none on this phase)
    close_s: float

    @property
    def total_s(self) -> float:
        return self.start_s + self.job_s + self.drill_s + self.close_s

    def text(self) -> str:
        parts = [f"start {self.start_s:.0f}", f"job {self.job_s:.0f}"
                 + (f" ({self.speedup:.2f}x, {self.speedup_from})" if self.gpus > 1 else "")]
        if self.drill_s:
            parts.append(f"fault drill {self.drill_s:.0f}")
        parts.append(f"close {self.close_s:.0f}")
        return " + ".join(parts) + f" = {self.total_s:.0f} s"


def estimate_phase(n: int, costs: Costs, configs: int, submissions: int, drill_timeout_s: float | None) -> \
        PhaseEstimate:
    """Phase n's seconds from the per-item costs: the one-GPU job (configurations x s_per_config + submissions x
    s_per_submission) over its expected speed-up, the pool's start, the fault drill where it runs, the shut-down."""
    one_job = configs * costs.s_per_config + submissions * costs.s_per_submission
    s, why = expected_speedup(n, dict(costs.speedup))
    return PhaseEstimate(n, costs.start_s * (1 + START_GROWTH * (n - 1)), one_job / s, s, why,
                         (drill_timeout_s + DRILL_EXTRA_S) if drill_timeout_s is not None else 0.0, costs.close_s)


def plan_phases(sizes: list[int], costs: Costs, *, elapsed_s: float, budget_s: float, configs: int,
                submissions: int, drill_timeout_s: dict[int, float]) -> list[dict]:
    """Each phase in `sizes`' order: {"estimate", "ends_s" (seconds since start where it would end), "runs", "why"};
    a phase runs where it would end within budget_s, counting only the phases before it that run."""
    out, t = [], elapsed_s
    for n in sizes:
        e = estimate_phase(n, costs, configs, submissions, drill_timeout_s.get(n))
        ends = t + e.total_s
        runs = ends <= budget_s
        why = "fits" if runs else f"would end near {ends:.0f} s, {ends - budget_s:.0f} s past --budget-s {budget_s:.0f}"
        out.append({"estimate": e, "ends_s": ends, "runs": runs, "why": why})
        if runs:
            t = ends
    return out


def plan_text(plan: list[dict], costs: Costs, *, elapsed_s: float, setup_measured: bool, budget_s: float,
              suite_limit_s: float = SUITE_LIMIT_S, warm: PhaseEstimate | None = None) -> list[str]:
    """The plan as printed before the first phase: the warm-up where there is one, each phase's estimate and whether
    it runs, the total, and the budget that would run every phase (or, past the runner's limit, how to split the job
    over two calls)."""
    lines = [f"# plan under --budget-s {budget_s:.0f} (seconds; per-item costs from {costs.source}):",
             f"#   set-up{'' if setup_measured else ' (estimate)'}: {elapsed_s:.0f} s"]
    if warm is not None:
        lines.append(f"#   warm-up on {warm.gpus} GPU{'s' if warm.gpus > 1 else ''} (in no ratio): {warm.text()}")
        elapsed_s += warm.total_s
    for q in plan:
        e = q["estimate"]
        verdict = f"ends near {q['ends_s']:.0f} s: runs" if q["runs"] else f"SKIPPED: {q['why']}"
        lines.append(f"#   {e.gpus} GPU{'s' if e.gpus > 1 else ''}: {e.text()}, {verdict}")
    runs = [q for q in plan if q["runs"]]
    total = (max(q["ends_s"] for q in runs) if runs else elapsed_s) + REPORT_S
    every = elapsed_s + sum(q["estimate"].total_s for q in plan) + REPORT_S
    lines.append(f"#   total: about {total:.0f} s with the report, {len(runs)} of {len(plan)} phases; every phase "
                 f"needs about {every:.0f} s" + ("" if every <= budget_s else f" (--budget-s {every:.0f})"))
    if every > suite_limit_s - 30:
        lines.append(f"#   the phases together do not fit one call (the runner stops this suite at "
                     f"{suite_limit_s:.0f} s): run `--gpus 1,N` in one call and the other sizes with `--baseline-from "
                     f"<that call's autotune_multigpu.json>` in the next, on a host with the same GPU model")
    return lines


# --- a stored baseline: the 1-GPU phase of an earlier call ------------------------------------------------------------


class BaselineError(Exception):
    """A --baseline-from file that cannot stand for this run's 1-GPU phase: what differs, and what to do."""


def job_facts(ns, configs: int, submissions: int, threads_per_worker: int) -> dict:
    """What a stored 1-GPU phase must share with this run for a ratio against it to mean anything."""
    return {"configs": configs, "submissions": submissions, "size": ns.size, "workers_per_gpu": ns.workers_per_gpu,
            "threads_per_worker": threads_per_worker, "rep_ms": ns.rep_ms}


def load_baseline(path: str | Path, device: str | None, facts: dict) -> dict:
    """The 1-GPU phase stored in `path` (an earlier call's autotune_multigpu.json), as a phase of this run with
    "stored" = {path, device, date, host}; BaselineError where its GPU model or its job differs from this run's."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"--baseline-from {path}: cannot read it ({exc})") from None
    one = next((p for p in report.get("phases", ()) if p.get("gpus") == 1 and not p.get("stored")), None)
    if one is None:
        raise BaselineError(f"--baseline-from {path}: it holds no 1-GPU phase (phases: "
                            f"{[p.get('gpus') for p in report.get('phases', ())]}); run `--gpus 1` first")
    stored_device = report.get("device")
    if device is not None and stored_device != device:
        raise BaselineError(f"--baseline-from {path}: its 1-GPU phase ran on {stored_device}, this host has {device}: "
                            f"a ratio across GPU models is no speed-up; run the 1-GPU phase on this kind of host")
    job = report.get("job")
    if job is None:
        raise BaselineError(f"--baseline-from {path}: written without its job's facts (an older script); run the "
                            f"1-GPU phase again")
    differ = [f"{k} {job.get(k)} there, {v} here" for k, v in facts.items() if job.get(k) != v]
    if differ:
        raise BaselineError(f"--baseline-from {path}: a different job (" + "; ".join(differ) + "); run with the "
                            "same options (--configs, --students, --size, --workers-per-gpu, --threads-per-worker, "
                            "--rep-ms)")
    return dict(one, stored={"path": str(path), "device": stored_device, "date": report.get("date", "?"),
                             "host": report.get("host", "?")})


def baseline_text(stored: dict, host: str) -> str:
    """Where a stored baseline came from, for the table's footnote."""
    where = "this host" if stored["host"] == host else f"host {stored['host']}"
    return f"the 1-GPU phase stored in {stored['path']} ({stored['device']}, {stored['date']}, {where})"


_clock = time.perf_counter          # the script's clock (tests drive main() on a clock of their own)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default=None, help="pool sizes to run, e.g. 1,2 (default: 1, 2 and 4 where there)")
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--configs", type=int, default=108)
    ap.add_argument("--students", type=int, default=22, help="students; each hands in all 3 exercises")
    ap.add_argument("--workers-per-gpu", type=int, default=4)
    ap.add_argument("--threads-per-worker", type=int, default=None,
                    help="CPU threads each worker's libraries may use (default: the host's cores over the workers of "
                         "a pool on all its GPUs: the same in every phase and every call on one host)")
    ap.add_argument("--rep-ms", type=float, default=20.0, help="kernellab.bench's rep_ms for each configuration")
    ap.add_argument("--grade-timeout-s", type=float, default=90.0,
                    help="a submission still being graded this long after it started is given up")
    ap.add_argument("--drill-timeout-s", type=float, default=25.0,
                    help="the fault drill's timeout_s: above its honest submissions' grading time, and under the "
                         "grader's own launch timeout (30 s) on a GPU, so that the fan-out's watchdog ends the hang")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help=f"skip a phase that would end after this (the runner stops the suite at {SUITE_LIMIT_S} s); "
                         f"the plan printed first says what runs")
    ap.add_argument("--baseline-from", default=None, metavar="PATH",
                    help="an earlier call's autotune_multigpu.json whose 1-GPU phase stands for this run's (same GPU "
                         "model and options, else refused): --gpus then leaves 1 out, and every ratio is marked as "
                         "against the stored phase")
    ap.add_argument("--plan-only", action="store_true",
                    help="print the plan (each phase's estimate, what --budget-s skips) and stop; no GPU needed")
    ap.add_argument("--no-faults", dest="faults", action="store_false")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="leave out the untimed pass over every GPU before the first phase (a fresh machine's first "
                         "grades are slower: the 1-GPU phase would pay for them alone and flatter every ratio)")
    ns = ap.parse_args(argv)
    t_start = _clock()
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and not ns.plan_only:
        print("no GPU here: run this on a GPU host (or pass --plan-only for the plan alone)", file=sys.stderr)
        return 2
    if not ns.plan_only:
        try:
            import distributed  # noqa: F401
        except ImportError:
            print("needs Dask: pip install 'kernellab[dask]' (and dask-cuda on GPU hosts)", file=sys.stderr)
            return 2
        # Workers inherit these: CUDA numbers GPUs as NVML does, and nothing is served from a cache.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        os.environ["KERNELLAB_CACHE"] = "0"
        torch.backends.cuda.matmul.allow_tf32 = False
    asked = [int(s) for s in ns.gpus.split(",")] if ns.gpus else None
    count = torch.cuda.device_count() if gpu else max(asked or [4])
    device = torch.cuda.get_device_name() if gpu else None
    if ns.baseline_from and asked and 1 in asked:
        print("--baseline-from stands for the 1-GPU phase: leave 1 out of --gpus", file=sys.stderr)
        return 2
    asked = asked or [n for n in (1, 2, 4) if n <= count and not (ns.baseline_from and n == 1)]
    skipped = [f"{n} GPUs: not run (this host has {count})" for n in asked if n > count]
    sizes = sorted({n for n in asked if n <= count})
    if not sizes:
        print(f"no pool size to run: --gpus {ns.gpus} on a host with {count} GPU(s)", file=sys.stderr)
        return 2
    # One GPU first (every ratio's base), then the largest pool (it carries the fault drill), then the rest, largest
    # first: a budget that runs out skips a middle size, not the one the drill needs.
    sizes = ([1] if 1 in sizes else []) + [n for n in sizes[::-1] if n != 1]
    largest = max(sizes)
    work, expected = build_class(ns.students)
    configs = sgemm_configs(ns.configs)
    subs = sum(len(v) for v in work.values())
    # every worker of every phase (and of every call on this host) gets the same share of the host's cores, so a
    # phase with more workers is not slowed by library thread pools fighting over the cores
    threads = ns.threads_per_worker or max(1, (os.cpu_count() or 1) // (count * ns.workers_per_gpu))
    facts = job_facts(ns, len(configs), subs, threads)
    host = platform.node()
    baseline = None
    if ns.baseline_from:
        try:
            baseline = load_baseline(ns.baseline_from, device, facts)
        except BaselineError as exc:
            print(exc, file=sys.stderr)
            return 2
    costs = Costs.from_phase(baseline, f"the 1-GPU phase stored in {ns.baseline_from}") if baseline else Costs.prior()
    drill = {largest: ns.drill_timeout_s} if ns.faults and largest > 1 else {}
    print(f"# {len(configs)} configurations of tutorial 05's sgemm_warptile (M = N = K = {ns.size}) and "
          f"{subs} submissions over {len(work)} exercises, on {', '.join(map(str, sizes))} of {count} x "
          f"{device or '(no GPU here: a plan only)'}, {ns.workers_per_gpu} workers per GPU, "
          f"{threads} CPU threads per worker{'' if gpu else ' (on this machine)'}"
          + (f"; the 1-GPU phase from {baseline_text(baseline['stored'], host)}" if baseline else ""), flush=True)
    measured_setup = not ns.plan_only
    elapsed = _clock() - t_start if measured_setup else PRIOR["setup_s"]
    warm = warm_up_estimate(largest, ns.workers_per_gpu, costs, ns.students) if ns.warm_up else None
    plan = plan_phases(sizes, costs, elapsed_s=elapsed + (warm.total_s if warm else 0.0), budget_s=ns.budget_s,
                       configs=len(configs), submissions=subs, drill_timeout_s=drill)
    for line in plan_text(plan, costs, elapsed_s=elapsed, setup_measured=measured_setup, budget_s=ns.budget_s,
                          warm=warm):
        print(line)
    if not baseline and ns.workers_per_gpu != PRIOR["workers_per_gpu"]:
        print(f"#   (the figures are for {PRIOR['workers_per_gpu']} workers per GPU; with {ns.workers_per_gpu} the "
              f"1-GPU phase's own figures correct the later phases' estimates)")
    print(flush=True)
    if ns.plan_only:
        return 0
    job = {"source": warptile_source(), "configs": configs, "problem": make_problem(ns.size),
           "bench_options": {"rep_ms": ns.rep_ms, "rounds": 4, "warmup_ms": 10.0}, "work": work,
           "grade_timeout_s": ns.grade_timeout_s, "drill_timeout_s": ns.drill_timeout_s, "threads_per_worker": threads}
    out_dir = Path(os.environ.get("OUT", "autotune-multigpu"))
    out_dir.mkdir(parents=True, exist_ok=True)

    phases, mismatches, warmed = ([baseline] if baseline else []), {}, None
    if ns.warm_up:
        # A fresh machine's first grades are slower (see Warm-up above): every GPU of the largest pool does a little
        # of the job first, so that no phase pays for it alone.
        print(f"# warm-up: {largest} GPU(s), estimate {warm.text()}; in no ratio", flush=True)
        t_warm = _clock()
        try:
            w = run_phase(list(range(largest)), ns.workers_per_gpu, warm_job(job, largest * ns.workers_per_gpu),
                          log=lambda s: print(f"  [warm-up] {s.strip()}", flush=True))
            warmed = {"gpus": largest, "took_s": _clock() - t_warm, "start_s": w["start_s"],
                      "job_s": w["job_s"], "configs": len(w["autotune"].rows) if w.get("autotune") else 0,
                      "submissions": len(w["grades"].rows) if w.get("grades") else 0}
        except (Exception, KeyboardInterrupt) as exc:
            traceback.print_exc()
            if isinstance(exc, KeyboardInterrupt):
                return 1
            warmed = {"gpus": largest, "took_s": _clock() - t_warm, "error": f"{type(exc).__name__}: {exc}"}
        print(f"#   warm-up took {warmed['took_s']:.0f} s" + (f" ({warmed['error']})" if "error" in warmed else ""),
              flush=True)
    for n in sizes:
        # the same estimate as the plan's, from what this run has measured so far (its 1-GPU phase's costs, the
        # speed-ups of its pools)
        q = plan_phases([n], costs, elapsed_s=_clock() - t_start, budget_s=ns.budget_s, configs=len(configs),
                        submissions=subs, drill_timeout_s=drill)[0]
        if not q["runs"]:
            skipped.append(f"{n} GPUs: skipped (estimate {q['estimate'].total_s:.0f} s: {q['why']})")
            print(f"# {skipped[-1]}", flush=True)
            continue
        print(f"# phase: {n} GPU(s), estimate {q['estimate'].text()} ({costs.source}), ends near {q['ends_s']:.0f} s",
              flush=True)
        job["faults"] = n in drill
        t_phase = _clock()
        try:
            p = run_phase(list(range(n)), ns.workers_per_gpu, job, log=lambda s: print(s, flush=True))
        except (Exception, KeyboardInterrupt) as exc:     # timeout -s INT: still print what the others measured
            traceback.print_exc()
            skipped.append(f"{n} GPUs: stopped by {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            if isinstance(exc, KeyboardInterrupt) or not phases:
                break
            continue
        p["took_s"], p["estimate_s"] = _clock() - t_phase, q["estimate"].total_s
        print(f"#   {n} GPU(s) took {p['took_s']:.0f} s (estimate {p['estimate_s']:.0f} s)", flush=True)
        summarize(p, len(configs), subs)
        phases.append(p)
        if n == 1:
            costs = dataclasses.replace(Costs.from_phase(p, "this run's 1-GPU phase"), speedup=costs.speedup)
        elif phases[0]["gpus"] == 1:
            costs = costs.with_speedup(n, phases[0]["job_s"] / p["job_s"])
        mismatches[n] = check_class(p["grades"], expected)
        (out_dir / f"autotune_{n}gpu.txt").write_text(str(p["autotune"]))
        (out_dir / f"grades_{n}gpu.txt").write_text(str(p["grades"]))
        if p.get("faults"):
            (out_dir / "faults.txt").write_text(p["faults"]["table"])

    live = [p for p in phases if not p.get("stored")]
    if not live:
        print("no phase finished: see the traceback above", file=sys.stderr)
        return 1
    phases.sort(key=lambda p: p["gpus"])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report = {"size": ns.size, "device": device, "date": date, "host": host, "cores": os.cpu_count(),
              "gpu_count": count, "workers_per_gpu": ns.workers_per_gpu, "job": facts,
              "baseline_from": baseline["stored"] if baseline else None, "warm_up": warmed, "skipped": skipped,
              "phases": []}
    print()
    one = phases[0] if phases[0]["gpus"] == 1 else None
    for p in phases:
        if p.get("stored"):
            print(f"1 GPU [b]: {baseline_text(p['stored'], host)}: start {p['start_s']:.1f} s, autotune "
                  f"{p['autotune_s']:.1f} s, grade {p['grade_s']:.1f} s, job {p['job_s']:.1f} s")
            continue
        r, g = p["autotune"], p["grades"]
        best = r.best
        print(f"{p['gpus']} GPU(s), {p['cluster']}:")
        print(f"  autotune: {r.headline()}; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in r.stage_s))
        for line in autotune_jobs_text(p.get("autotune_jobs") or {}):
            print(f"  autotune jobs: {line}")
        if best:
            sp = best.row.speedup("torch")
            print(f"  best {best.row.label}: {best.row.median_ms:.4g} ms, {sp.ratio:.3f}x torch.matmul on "
                  f"{best.row.gpu} (ranked by {best.ranked_by})")
        per_gpu: dict = {}
        for row in r.rows:
            if row.timed:
                per_gpu[row.gpu] = per_gpu.get(row.gpu, 0) + 1
        print("  configurations timed per GPU: " + "; ".join(f"{k}: {v}" for k, v in per_gpu.items()))
        graded: dict = {}
        for row in g.rows:
            graded[row.gpu] = graded.get(row.gpu, 0) + 1
        print("  submissions graded per GPU: " + "; ".join(f"{k}: {v}" for k, v in graded.items()))
        tp = p.get("tool_processes") or {}
        if tp.get("runs"):
            pooled = "on (KERNELLAB_SANITIZER_POOL=1)" if _sanitize_pool_on() else "off"
            print(f"  compute-sanitizer: {tp['started']} tool processes started for {tp['runs']} tool runs "
                  f"(warm processes {pooled}" + (f"; {tp['unknown']} runs did not say" if tp["unknown"] else "")
                  + ")")
        bad = mismatches[p["gpus"]]
        print(f"  grade_class: {g.headline()}; {len(g.rows) - len(bad)} of {len(g.rows)} got the finding their "
              f"file names" + ("" if not bad else ":\n    " + "\n    ".join(bad)))
        for line in slowest_text(p):
            print(f"  slowest submission: {line}")
        reruns = [f"{row.submission}: {row.rerun}" for row in g.rows if row.rerun] + \
            [f"{row.label}: {row.rerun}" for row in r.rows if row.rerun]
        if reruns:
            print("  re-run after a lost worker: " + "; ".join(reruns))
        if one is not None and p is not one:
            base = "1 GPU [b]" if one.get("stored") else "1 GPU"
            print(f"  where the time goes ({base} -> {p['gpus']}): {where_time_goes(p, one)}")
            for line in where_grading_goes(p, one):
                print(f"  grading: {line}")
            for line in where_tools_go(p, one):
                print(f"  tools: {line}")
        for note in r.notes:
            print(f"  note: {note}")
        if p.get("faults"):
            f = p["faults"]
            print(f"  faults: {'nothing lost' if f['ok'] else 'WRONG: ' + '; '.join(f['problems'])}: killed "
                  f"{f['killed']}; {f['rows']} rows for {f['submissions']} submissions, {f['graded']} of "
                  f"{f['others']} correct ones passed; the hung one: {f['hang']}; graded again: "
                  f"{f['reruns'] or 'none'} ({f['s']:.0f} s)")
        report["phases"].append({k: v for k, v in p.items() if k not in ("autotune", "grades")}
                                | {"autotune": r.to_json(), "grades": g.to_json(), "mismatches": bad})
    (out_dir / "autotune_multigpu.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out_dir}/autotune_multigpu.json and the tables; {_clock() - t_start:.0f} s in all")
    print(f"\n# {device}, {date}: the job = autotune ({len(configs)} configurations) + grade_class ({subs} "
          f"submissions); targets 1.85x on 2 GPUs, 3.5x on 4 (job vs 1 GPU); compile s = to the last compile, "
          f"check+time s = after it (streamed: the rest overlaps the compiles); util = mean GPU utilisation per GPU "
          f"({live[0]['util_source']}); host CPU = share of the host's CPU time busy while grading"
          + (f"\n# before the first phase, an untimed warm-up on {warmed['gpus']} GPU(s) ({warmed['took_s']:.0f} s)"
             if warmed and "error" not in warmed else
             f"\n# the warm-up failed ({warmed['error']}): the first phase also paid for the machine's first work"
             if warmed else "\n# no warm-up (--no-warm-up): the first phase also paid for the machine's first work")
          + (f"\n# [b]: against {baseline_text(baseline['stored'], host)}, not measured in this run" if baseline
             else "") + ("" if one is not None else "\n# no 1-GPU phase (and no --baseline-from): no speed-ups"))
    print(table(phases, skipped))
    ok = all(not m for m in mismatches.values()) and all(p.get("faults", {}).get("ok", True) for p in live)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
