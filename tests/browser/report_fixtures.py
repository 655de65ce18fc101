"""Real kernellab reports (no GPU needed) for the extension's tests: the jest fixtures and the browser test's cells.

`python tests/browser/report_fixtures.py --write` regenerates extension/test/fixtures/reports.json from the Python
side; tests/browser/test_report_contract.py fails when the Python side's fields drift from that file.
"""
from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "extension" / "test" / "fixtures" / "reports.json"

VADD = """\
__global__ void vadd(const float* __restrict__ a, const float* __restrict__ b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

__global__ void __launch_bounds__(256) tile_sum(const float* x, float* out) {
    __shared__ float tile[32][33];
    float acc[48];
    for (int k = 0; k < 48; ++k) acc[k] = x[k * blockDim.x + threadIdx.x];
    tile[threadIdx.y][threadIdx.x] = acc[threadIdx.x % 48];
    __syncthreads();
    out[blockIdx.x] = tile[threadIdx.x][threadIdx.y];
}
"""

BROKEN = """\
__global__ void scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * factor;
    int unused = 3;
}
"""

# Python source run both here and in the browser test's kernel: a fake clock stands in for CUDA events.
BENCH_SETUP = '''\
import random as _random

class FakeClock:
    """A stand-in for CUDA events: fixed, slightly noisy times, so a report can be made without a GPU."""
    device = "NVIDIA H200 (fake clock)"
    l2_bytes = 1 << 20
    flush_bytes = 0

    def __init__(self, ms):
        self.ms, self.rng, self.last = ms, _random.Random(0), None

    def timed(self, name, fn):
        """`fn`, telling the clock whose time to report while it runs."""
        def call(*args):
            self.last = name
            return fn(*args)
        call.__name__ = name
        return call

    def check_measurable(self, name, returned, args):
        pass

    def time_calls(self, calls):
        times = []
        for c in calls:
            c()
            times.append(self.ms[self.last] * (1 + 0.05 * self.rng.random()))
        return times

    def graph(self, calls):
        return calls[0]

    def describe(self):
        return "fake clock (no GPU): fixed times with 5% noise"
'''


def reports() -> dict[str, dict]:
    """One real report of each kind the extension designs a panel for, keyed by a fixture name."""
    import torch

    import kernellab
    from kernellab.errors import CompileError
    from kernellab.run.measure import bench as bench_mod

    out = {}
    module = kernellab.compile_cuda(VADD, arch="sm_90", name="vadd_demo", first_line=2, filename="cell.cu")
    out["compile"] = module.to_json()
    try:
        kernellab.compile_cuda(BROKEN, arch="sm_90", first_line=2, filename="cell.cu")
    except CompileError as exc:
        out["compile_failed"] = exc.to_json()
    out["occupancy"] = kernellab.occupancy(block_size=256, registers=72, shared_bytes=12288, arch="sm_90").to_json()

    def inputs(g):
        x = torch.randn(1000, generator=g)
        return (x, torch.empty_like(x))

    def good(x, out_):
        return torch.mul(x, 2, out=out_)

    def bad(x, out_):
        torch.mul(x, 2, out=out_)
        out_[17] += 0.5
        out_[400] -= 1e-3
        return out_

    def ref(x, out_):
        return x * 2

    out["check_passed"] = kernellab.check(good, ref, inputs, trials=3).to_json()
    failed = kernellab.check(bad, ref, inputs, trials=3).to_json()
    out["check_failed"] = failed

    scope: dict = {}
    exec(BENCH_SETUP, scope)
    clock = scope["FakeClock"]({"saxpy": 0.21, "torch": 0.34})
    b = bench_mod.bench(clock.timed("saxpy", good), inputs, baselines={"torch": clock.timed("torch", good)},
                        bytes=12_000, flops=2_000, name="saxpy", timer=clock, rounds=4, min_reps=5, max_reps=20,
                        warmup_ms=0.1, rep_ms=0.5)
    out["bench"] = b.to_json()
    return json.loads(json.dumps(out, default=str))


def main(argv: list[str]) -> int:
    data = reports()
    if "--write" in argv:
        FIXTURES.parent.mkdir(parents=True, exist_ok=True)
        FIXTURES.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {FIXTURES.relative_to(ROOT)}: {', '.join(data)}")
    else:
        print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
