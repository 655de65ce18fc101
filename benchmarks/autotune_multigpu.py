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
compute-sanitizer and simulator runs) overlap; autotune checks and times one configuration at a time per GPU (a lock
per GPU, kernellab.run.fanout.gpu_lock), so no two timings overlap on one GPU. The one-GPU phase is a pool of the same
size on GPU 0, so every phase pays the same fan-out costs (process start, pickling, result traffic). Cluster start
(workers importing torch and making their CUDA context) is reported apart and is not in the job's time. Every
worker of every phase may use the same number of CPU threads in the libraries it calls (OMP_NUM_THREADS and kin: the
host's cores over the largest pool's workers), so that more workers do not mean smaller shares (uncapped, the sum
of the submissions' grading times rose from 604 s with 4 workers to 805 s with 8 on 4 x H200: a slowdown no number
of GPUs can win back). Phases run one GPU first, then the largest pool (with the fault drill), then the others.
Utilisation: NVML (nvidia-ml-py, which dask-cuda brings), else `nvidia-smi`, sampled every 100 ms here and averaged
per GPU over each stage; kernellab.bench keeps a GPU busy about half the time while it times (burst mode).
Speed-ups against torch are ratios taken on one GPU in one bench run; the best of a multi-GPU sweep is ranked by them.

Run on a GPU host:  python benchmarks/autotune_multigpu.py [--gpus 1,2,4] [--size 2048] [--configs 108]
                    [--students 22] [--workers-per-gpu 4] [--budget-s 420] [--no-faults]
Its functions reach the workers by value (cloudpickle sends what lives in __main__), or by name where it is imported
as benchmarks.autotune_multigpu (tests/test_fanout_faults.py). The table comes last on stdout; autotune_multigpu.json and each phase's tables go to $OUT (or ./autotune-multigpu).
A phase that would not fit --budget-s (estimated from the phases before it: expected_speedup) is skipped, and the
table says so: with 1, 2 and 4 GPUs under the default budget, the 2-GPU phase is skipped while grading scales as it
does (1.46x on 4 x H200).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
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


def make_cluster(gpus: list[int], workers_per_gpu: int = 4, threads_per_worker: int | None = None):
    """(cluster, what): `workers_per_gpu` Dask worker processes (one task thread each) per GPU in `gpus`, each
    allowed `threads_per_worker` CPU threads for the libraries it calls (None: no cap)."""
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
    """On a worker: import torch and kernellab, make the CUDA context (where there is a GPU); which GPU this is."""
    import torch

    from kernellab.run.measure.autotune import where

    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")
    return where().gpu or "no GPU"


def run_phase(gpus: list[int], workers_per_gpu: int, job: dict, log=print) -> dict:
    """Start a pool on `gpus`, run the job (autotune, then the class), and return what it took."""
    import distributed

    import kernellab
    from kernellab.run import fanout

    t0 = time.perf_counter()
    cluster, what = make_cluster(gpus, workers_per_gpu, job.get("threads_per_worker"))
    out = {"gpus": len(gpus), "gpu_ids": gpus, "workers": len(gpus) * workers_per_gpu, "cluster": what,
           "threads_per_worker": job.get("threads_per_worker")}
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(len(gpus) * workers_per_gpu, timeout=300)
        ex = client.get_executor()
        fanout.prepare(ex)
        out["worker_gpus"] = client.run(_warm)
        out["start_s"] = time.perf_counter() - t0
        log(f"  {len(gpus)} GPU(s): {out['workers']} workers up in {out['start_s']:.1f} s")

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
        if job.get("faults"):
            out["faults"] = fault_drill(client, ex, job.get("drill_timeout_s", 25.0), log)
    return out


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
    """The summary table: one row per phase, the speed-ups against the one-GPU phase."""
    from kernellab import report

    one = phases[0]
    head = ["GPUs", "workers", "start s", "compile s", "check+time s", "autotune s", "grade s", "job s",
            "job vs 1 GPU", "autotune vs 1", "grade vs 1", "util autotune", "util grade", "host CPU grade"]
    rows = []
    for p in phases:
        st = dict(p["autotune"].stage_s)
        rows.append([p["gpus"], p["workers"], f"{p['start_s']:.1f}", f"{st.get('compile', 0):.1f}",
                     f"{st.get('check_and_time', 0):.1f}", f"{p['autotune_s']:.1f}", f"{p['grade_s']:.1f}",
                     f"{p['job_s']:.1f}", f"{one['job_s'] / p['job_s']:.2f}x",
                     f"{one['autotune_s'] / p['autotune_s']:.2f}x", f"{one['grade_s'] / p['grade_s']:.2f}x",
                     _util_text(p["autotune_util"]), _util_text(p["grade_util"]),
                     f"{p['grade_host_cpu']:.0%}" if p.get("grade_host_cpu") is not None else "-"])
    for s in skipped:
        rows.append([s] + [""] * (len(head) - 1))
    return report.text_table(head, rows)


def busy_share(p: dict) -> float:
    """The share of the grading's wall time x workers that the workers spent grading (sum of the rows' times)."""
    graded_s = sum((r.wall_ms or 0) for r in p["grades"].rows) / 1e3
    return graded_s / (p["workers"] * p["grade_s"]) if p["grade_s"] else 0.0


def where_time_goes(p: dict, one: dict) -> str:
    """Which stage kept a phase from scaling: each stage's speed-up against one GPU."""
    st, st1 = dict(p["autotune"].stage_s), dict(one["autotune"].stage_s)
    parts = []
    for name, a, b in (("compile", st1.get("compile", 0), st.get("compile", 0)),
                       ("check-and-time", st1.get("check_and_time", 0), st.get("check_and_time", 0)),
                       ("probe + prune (here)", st1.get("probe", 0) + st1.get("prune", 0),
                        st.get("probe", 0) + st.get("prune", 0)),
                       ("grading", one["grade_s"], p["grade_s"])):
        if b > 0:
            parts.append(f"{name} {a:.1f} -> {b:.1f} s ({a / b:.2f}x)")
    parts.append(f"workers busy grading {busy_share(p):.0%} of its wall time (1 GPU: {busy_share(one):.0%}; the rest "
                 f"is scheduling, result traffic and the last submissions' tail)")
    busiest = max(p["grades"].rows, key=lambda r: r.wall_ms or 0)
    parts.append(f"longest submission {busiest.wall_ms / 1e3:.1f} s ({busiest.submission})"
                 if busiest.wall_ms else "")
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


def where_grading_goes(p: dict, one: dict) -> list[str]:
    """Per exercise, a submission's mean seconds by step, 1 GPU -> this pool (largest first), its CPU seconds, and
    what the numbers say: the host's cores saturated, or submissions waiting on something the host's GPUs share."""
    a, b = grade_stages(one), grade_stages(p)
    lines = []
    cpu_1 = cpu_n = wall_1 = wall_n = 0.0
    for ex_id, steps in b.items():
        base = a.get(ex_id, {})
        cpu = ("cpu: this process", "cpu: tools' processes")
        parts = [f"{k} {base.get(k, 0):.1f} -> {v:.1f} s" for k, v in sorted(steps.items(), key=lambda kv: -kv[1])
                 if k not in cpu and (v >= 0.05 or base.get(k, 0) >= 0.05)]
        c1, cn = sum(base.get(k, 0) for k in cpu), sum(steps.get(k, 0) for k in cpu)
        parts.append(f"CPU {c1:.1f} -> {cn:.1f} s (this process {base.get(cpu[0], 0):.1f} -> "
                     f"{steps.get(cpu[0], 0):.1f}, tools {base.get(cpu[1], 0):.1f} -> {steps.get(cpu[1], 0):.1f})")
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


def expected_speedup(n: int, phases: list[dict]) -> float:
    """The job's speed-up on n GPUs against the first phase (one GPU), to skip a phase that would not fit the budget:
    interpolated from the largest pool measured so far, else at most 1.6x (4 x H200 gave 1.59x: grading is bound by
    what the host's GPUs share, not by their number)."""
    one = phases[0]
    big = max(phases, key=lambda p: p["gpus"])
    if big["gpus"] > one["gpus"] and big["job_s"] > 0:
        s = one["job_s"] / big["job_s"]
        return max(1.0, 1.0 + (s - 1.0) * (n - one["gpus"]) / (big["gpus"] - one["gpus"]))
    return min(float(n), 1.6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default=None, help="pool sizes to run, e.g. 1,2 (default: 1, 2 and 4 where there)")
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--configs", type=int, default=108)
    ap.add_argument("--students", type=int, default=22, help="students; each hands in all 3 exercises")
    ap.add_argument("--workers-per-gpu", type=int, default=4)
    ap.add_argument("--rep-ms", type=float, default=20.0, help="kernellab.bench's rep_ms for each configuration")
    ap.add_argument("--grade-timeout-s", type=float, default=90.0,
                    help="a submission still being graded this long after it started is given up")
    ap.add_argument("--drill-timeout-s", type=float, default=25.0,
                    help="the fault drill's timeout_s: above its honest submissions' grading time, and under the "
                         "grader's own launch timeout (30 s) on a GPU, so that the fan-out's watchdog ends the hang")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip a phase that would end after this (the suite's limit is 500 s)")
    ap.add_argument("--no-faults", dest="faults", action="store_false")
    ns = ap.parse_args(argv)
    t_start = time.perf_counter()
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
    count = torch.cuda.device_count()
    sizes = [int(s) for s in ns.gpus.split(",")] if ns.gpus else [n for n in (1, 2, 4) if n <= count]
    sizes = sorted({n for n in sizes if n <= count}) or [1]
    # One GPU first (every ratio's base), then the largest pool (it carries the fault drill), then the rest, largest
    # first: a budget that runs out skips a middle size, not the one the drill needs.
    sizes = sizes[:1] + sizes[1:][::-1]
    largest = max(sizes)
    work, expected = build_class(ns.students)
    job = {"source": warptile_source(), "configs": sgemm_configs(ns.configs), "problem": make_problem(ns.size),
           "bench_options": {"rep_ms": ns.rep_ms, "rounds": 4, "warmup_ms": 10.0}, "work": work,
           "grade_timeout_s": ns.grade_timeout_s, "drill_timeout_s": ns.drill_timeout_s,
           # every worker of every phase gets the same share of the host's cores (that of the largest pool), so a
           # phase with more workers is not slowed by library thread pools fighting over the cores
           "threads_per_worker": max(1, (os.cpu_count() or 1) // (largest * ns.workers_per_gpu))}
    subs = sum(len(v) for v in work.values())
    print(f"# {len(job['configs'])} configurations of tutorial 05's sgemm_warptile (M = N = K = {ns.size}) and "
          f"{subs} submissions over {len(work)} exercises, on {', '.join(map(str, sizes))} of {count} x "
          f"{torch.cuda.get_device_name()}, {ns.workers_per_gpu} workers per GPU, "
          f"{job['threads_per_worker']} CPU threads per worker\n", flush=True)
    out_dir = Path(os.environ.get("OUT", "autotune-multigpu"))
    out_dir.mkdir(parents=True, exist_ok=True)

    phases, skipped, mismatches = [], [], {}
    for n in sizes:
        elapsed = time.perf_counter() - t_start
        if phases:
            one = phases[0]
            guess = one["start_s"] + one["job_s"] / expected_speedup(n, phases) + \
                (45 if ns.faults and n == largest else 0)
            if elapsed + guess > ns.budget_s:
                skipped.append(f"{n} GPUs: skipped (would end near {elapsed + guess:.0f} s, past --budget-s)")
                print(f"# {skipped[-1]}", flush=True)
                continue
        print(f"# phase: {n} GPU(s)", flush=True)
        job["faults"] = ns.faults and n == largest and n > 1
        try:
            p = run_phase(list(range(n)), ns.workers_per_gpu, job, log=lambda s: print(s, flush=True))
        except (Exception, KeyboardInterrupt) as exc:     # timeout -s INT: still print what the others measured
            traceback.print_exc()
            skipped.append(f"{n} GPUs: stopped by {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            if isinstance(exc, KeyboardInterrupt) or not phases:
                break
            continue
        phases.append(p)
        mismatches[n] = check_class(p["grades"], expected)
        (out_dir / f"autotune_{n}gpu.txt").write_text(str(p["autotune"]))
        (out_dir / f"grades_{n}gpu.txt").write_text(str(p["grades"]))
        if p.get("faults"):
            (out_dir / "faults.txt").write_text(p["faults"]["table"])

    if not phases:
        print("no phase finished: see the traceback above", file=sys.stderr)
        return 1
    phases.sort(key=lambda p: p["gpus"])
    report = {"size": ns.size, "device": torch.cuda.get_device_name(), "workers_per_gpu": ns.workers_per_gpu,
              "skipped": skipped, "phases": []}
    print()
    for p in phases:
        r, g = p["autotune"], p["grades"]
        best = r.best
        print(f"{p['gpus']} GPU(s), {p['cluster']}:")
        print(f"  autotune: {r.headline()}; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in r.stage_s))
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
        bad = mismatches[p["gpus"]]
        print(f"  grade_class: {g.headline()}; {len(g.rows) - len(bad)} of {len(g.rows)} got the finding their "
              f"file names" + ("" if not bad else ":\n    " + "\n    ".join(bad)))
        reruns = [f"{row.submission}: {row.rerun}" for row in g.rows if row.rerun] + \
            [f"{row.label}: {row.rerun}" for row in r.rows if row.rerun]
        if reruns:
            print("  re-run after a lost worker: " + "; ".join(reruns))
        if p is not phases[0]:
            print(f"  where the time goes (1 GPU -> {p['gpus']}): {where_time_goes(p, phases[0])}")
            for line in where_grading_goes(p, phases[0]):
                print(f"  grading: {line}")
        for note in r.notes:
            print(f"  note: {note}")
        if p.get("faults"):
            f = p["faults"]
            print(f"  faults: {'nothing lost' if f['ok'] else 'WRONG: ' + '; '.join(f['problems'])}: killed "
                  f"{f['killed']}; {f['rows']} rows for {f['submissions']} submissions, {f['graded']} of "
                  f"{f['others']} correct ones passed; the hung one: {f['hang']}; graded again: "
                  f"{f['reruns'] or 'none'} ({f['s']:.0f} s)")
        report["phases"].append({k: v for k, v in p.items() if k not in ("autotune", "grades")}
                                | {"autotune": r.to_json(), "grades": g.to_json(), "mismatches": bad,
                                   "grade_stages": grade_stages(p)})
    (out_dir / "autotune_multigpu.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out_dir}/autotune_multigpu.json and the tables; {time.perf_counter() - t_start:.0f} s in all")
    print(f"\n# {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}: the job = autotune "
          f"({len(job['configs'])} configurations) + grade_class ({subs} submissions); targets 1.85x on 2 GPUs, "
          f"3.5x on 4 (job vs 1 GPU); util = mean GPU utilisation per GPU ({phases[0]['util_source']}); host CPU = "
          f"share of the host's CPU time busy while grading")
    print(table(phases, skipped))
    ok = all(not m for m in mismatches.values()) and all(p.get("faults", {}).get("ok", True) for p in phases)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
