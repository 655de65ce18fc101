"""What the anti-cheating defences cost: grading time per submission with them and without (the same script run on a
kernellab without them), on the CPU path and, where there is a GPU, on it.

Method. Each row is the least (and the median) wall time of `--reps` gradings of one honest submission (the defences
cost most when nothing trips them: every trial runs to the end):
- `grade` of a Numba exercise in the simulator (00-flip's reference solution) and of a CUDA exercise without a GPU
  (01-reverse: compile, SASS and PTX checks only);
- `check` of a torch candidate on the CPU (a 1,000,003-element add and a 257 x 129 x 65 matmul), default and
  `strict=True` (strict does more work on purpose: four input distributions, a second run, the aten-op record);
- `bench` of a CPU function on a fake clock (so the figure is bench's own host-side work: the timing guard, the
  thread watch, the in-place refill check).
With a GPU (`--gpu`) the same `check` rows run on CUDA tensors, a `bench` of a 64 MiB copy on the real clock, and
`grade` of 01-reverse in full (launches, determinism run, compute-sanitizer memcheck and initcheck): the GPU figure
for the defences is the difference between this script on this kernellab and on one before them.

    PYTHONPATH=. python benchmarks/grading_cost.py               # this kernellab
    PYTHONPATH=/path/to/older python benchmarks/grading_cost.py  # before (options it lacks are left out)
    PYTHONPATH=. python benchmarks/grading_cost.py --gpu         # also the GPU rows
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import kernellab

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def timed(fn, reps: int) -> tuple[float, float]:
    """(least, median) seconds of `reps` calls, after one untimed call that compiles and caches. The least is the
    figure on a shared machine: the run least disturbed by other work."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out), statistics.median(out)


def has_option(f, name: str) -> bool:
    return name in inspect.signature(f).parameters


def rows(gpu: bool, reps: int):
    from exercises.solutions_lib import load_kernel, solution_path

    try:
        from kernellab.run.measure.bench import bench
        from kernellab.run.measure.check import check
    except ImportError:                  # a kernellab from before run/ was split
        from kernellab.run.bench import bench
        from kernellab.run.check import check
    from kernellab.teach import exercise

    strict_ok = has_option(check, "strict")
    dev = "cuda" if gpu else "cpu"

    def vec(g):
        return torch.randn(1_000_003, generator=g).to(dev), torch.randn(1_000_003, generator=g).to(dev)

    def mats(g):
        return torch.randn(257, 129, generator=g).to(dev), torch.randn(129, 65, generator=g).to(dev)

    def numpy_add(x, y):               # a "kernel": no aten op of the reference's
        return torch.from_numpy(x.cpu().numpy() + y.cpu().numpy()).to(x.device)

    def by_broadcast(a, b):
        return (a[:, :, None] * b[None]).sum(1)

    yield f"check add 1M ({dev}), default", timed(lambda: check(numpy_add, torch.add, vec), reps)
    if strict_ok:
        yield f"check add 1M ({dev}), strict", timed(lambda: check(numpy_add, torch.add, vec, strict=True), reps)
    yield f"check matmul 257x129x65 ({dev}), default", timed(lambda: check(by_broadcast, torch.matmul, mats), reps)
    if strict_ok:
        yield (f"check matmul 257x129x65 ({dev}), strict",
               timed(lambda: check(by_broadcast, torch.matmul, mats, strict=True), reps))

    if gpu:
        x = lambda g: (torch.randn(16 * 2**20, generator=g).cuda(),)  # noqa: E731
        yield "bench copy 64 MiB (GPU clock)", timed(lambda: bench(lambda t: t.clone(), x, rep_ms=50, rounds=5), reps)
        ex = exercise("01-reverse")
        k = load_kernel(ex, solution_path("01-reverse"))
        yield "grade 01-reverse (GPU, in full)", timed(lambda: kernellab.grade("01-reverse", k, speed=False), reps)
        return

    class FakeClock:
        device, flush_bytes, l2_bytes = "NVIDIA H200", 2 * 2**20, 2**20

        def check_measurable(self, *a):
            pass

        def time_calls(self, calls):
            return [float(c().reshape(-1)[0]) + 1.0 for c in calls]

        def graph(self, calls):
            raise NotImplementedError

        def describe(self):
            return "fake"

    ones = lambda g: (torch.rand(4096, generator=g),)  # noqa: E731
    yield "bench on a fake clock (host-side work)", timed(
        lambda: bench(lambda t: t * 2, ones, timer=FakeClock(), warmup_ms=2, rep_ms=200, rounds=10), reps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flip = exercise("00-flip")
        kf = load_kernel(flip, solution_path("00-flip"))
        yield "grade 00-flip (Numba, simulator)", timed(lambda: kernellab.grade("00-flip", kf, speed=False), reps)
        rev = exercise("01-reverse")
        kr = load_kernel(rev, solution_path("01-reverse"))
        yield "grade 01-reverse (CUDA, no GPU)", timed(lambda: kernellab.grade("01-reverse", kr, speed=False), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU rows (CUDA tensors, the real clock, the grader in full)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads (1: the work, not the scheduling, of "
                                                            "a machine shared with other jobs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"kernellab from {Path(kernellab.__file__).parent}; torch CPU threads {torch.get_num_threads()}")
    print(f"{'':48s} {'least':>9s}    {'median':>9s}")
    for what, (least, median) in rows(args.gpu, args.reps):
        print(f"{what:48s} {least * 1e3:9.1f} ms {median * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
