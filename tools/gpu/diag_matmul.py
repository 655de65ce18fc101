"""Why do triton's do_bench and kernellab.bench disagree on a bf16 8192^3 matmul? Kernel durations from CUPTI
(torch.profiler, no serialization) under each harness, and in long back-to-back runs, with SM clocks.

Usage on the GPU machine: python3 tools/gpu/diag_matmul.py
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_ms(prof, needle="nvjet"):
    """Durations (ms) of the matmul kernels in a profile, in launch order."""
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and needle in e.name]
    evs.sort(key=lambda e: e.time_range.start)
    return [e.time_range.elapsed_us() / 1e3 for e in evs]


def clocks():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    return out


def summary(name, ks):
    if not ks:
        print(f"{name:46s} no kernels seen")
        return
    q = len(ks) // 4 or 1
    print(f"{name:46s} n={len(ks):4d} median {statistics.median(ks):.3f} ms  first quarter {statistics.median(ks[:q]):.3f}"
          f"  last quarter {statistics.median(ks[-q:]):.3f}  min {min(ks):.3f} max {max(ks):.3f}")


def main():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch.matmul(a, b)
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    print("idle:", clocks())

    from triton.testing import do_bench

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        t = do_bench(fn, warmup=25, rep=100, return_mode="median")
    summary(f"triton do_bench (events say {t:.3f} ms)", kernel_ms(p))
    print("after:", clocks())
    time.sleep(2)

    from kernellab.run.measure.bench import bench

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        r = bench(torch.matmul, (a, b), name="mm")
    summary(f"kernellab.bench (events say {r.median_ms:.3f} ms)", kernel_ms(p))
    print("after:", clocks())
    time.sleep(2)

    for label, flush in (("back-to-back x300, no flush", None),
                         ("back-to-back x300, 256 MB zero_ flush", torch.empty(256 << 20, dtype=torch.int8, device="cuda"))):
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(300):
                if flush is not None:
                    flush.zero_()
                fn()
            torch.cuda.synchronize()
        summary(label, kernel_ms(p))
        print("after:", clocks())
        time.sleep(2)

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(60):
            fn()
            torch.cuda.synchronize()
            time.sleep(0.003)
    summary("one at a time, 3 ms idle between", kernel_ms(p))


if __name__ == "__main__":
    main()
