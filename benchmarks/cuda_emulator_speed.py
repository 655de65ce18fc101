"""How fast kernellab's CPU runtime for CUDA C++ runs a kernel through its two ways in, and the tutorials' tensor-core
kernels.

kernellab.run.sim.cuda has one runtime (cuda_host.h: every CUDA thread a fiber, a block's fibers on one OS thread,
switching at barriers, shuffles and warp collectives; hopper.h for wgmma, TMA and mbarriers) and two ways in:
`compile_host` (the `%%cuda --sim` path, built in-process with its checks) and `emulate` (a kernel built as a program
of its own, shared memory as one arena, no checks: the tensor-core tutorials' tests).
Method: one kernel (warp shuffles, __syncthreads and a shared array, `rounds` times per thread) is built by each (the
build is not timed: it is cached by content) and launched `runs` times; the best wall time counts. Then tutorial
05's `mma_pipe` (ldmatrix, mma.sync, cp.async; bf16, 130 x 270 x 40) both ways, the same inputs; then tutorial 07's
wgmma kernels fed by TMA (step 3's fa3 and step 3b's persistent fa3p) as tests/test_attention_persistent.py runs them.
Run: `python benchmarks/cuda_emulator_speed.py` (CPU only, no GPU).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from kernellab.run.sim.cuda import compiler
from kernellab.run.sim.cuda.emulate import compile_host, emulate

SOURCE = r"""extern "C" __global__ void exchange(float* out, int rounds) {
    __shared__ float s[256];
    float v = float(threadIdx.x);
    for (int r = 0; r < rounds; ++r) {
        for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
        s[threadIdx.x] = v * (1.0f / 32.0f);
        __syncthreads();
        v = s[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""


def best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(runs: int = 3) -> int:
    if compiler() is None:
        print("no host C++ compiler (pip install ziglang): nothing to measure")
        return 1
    grid, block, rounds = 4, 256, 64
    events = grid * block * rounds * (5 * 2 + 2)          # per thread and round: 5 shuffles (2 meets each), 2 barriers
    rows = []
    out_f = np.zeros(grid * block, np.float32)
    out_t = np.zeros(grid * block, np.float32)
    for checks in (2, 0):
        host = compile_host(SOURCE, checks=checks)["exchange"]
        host.launch(grid, block, out_f, rounds)              # built and warm
        rows.append((f"fibers (cuda_host.h, checks {checks})", best(lambda: host.launch(grid, block, out_f, rounds),
                                                                    runs)))
    emulate(SOURCE, "exchange", (grid,), (block,), [out_t, rounds])
    rows.append(("emulate (a program, no checks)", best(lambda: emulate(SOURCE, "exchange", (grid,), (block,),
                                                                        [out_t, rounds]), runs)))
    same = np.array_equal(out_f, out_t)
    print(f"one kernel both ways in: {grid} blocks x {block} threads, {rounds} rounds of 5 shuffles and 2 "
          f"__syncthreads ({events / 1e6:.2f} M thread-barrier crossings); results equal: {same}")
    print(f"{'way in':<36} {'best s':>8} {'M crossings/s':>14}")
    for name, s in rows:
        print(f"{name:<36} {s:8.3f} {events / s / 1e6:14.2f}")
    tensor_core()
    attention()
    return 0 if same else 1


def tensor_core(runs: int = 2) -> None:
    """Tutorial 05's mma_pipe (bf16; cp.async, ldmatrix, mma.sync) both ways in, the same inputs (tests/test_matmul.py
    runs it through emulate)."""
    import torch

    sys.path.insert(0, "tests")
    import test_matmul as tm                              # the tutorial's variants and cases, as the tests use them

    v, cell = tm.pick("mma_pipe")
    M, N, K = 130, 270, 40
    A, B, C, ref = tm.tc_case(M, N, K, "bf16")
    grid = tm.grid_dims(v.grid(M, N))
    name = v.kernels["bf16"]
    C_program = C.copy()
    args = [A, B, C_program, M, N, K]
    emulate(cell.source, name, grid, (v.block,), args, v.smem)             # built
    s_program = best(lambda: emulate(cell.source, name, grid, (v.block,), args, v.smem), runs)

    def bf16(x):
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)

    tA, tB, tC = bf16(A), bf16(B), bf16(C)
    host = compile_host(cell.source)[name]
    host.launch(grid, v.block, tA, tB, tC, M, N, K, shared_bytes=v.smem)
    s_fibers = best(lambda: host.launch(grid, v.block, tA, tB, tC, M, N, K, shared_bytes=v.smem), runs)
    C_fibers = tC.view(torch.int16).numpy().view(np.uint16)
    tm.assert_close(C_fibers, ref, 8e-3)
    threads = int(np.prod(grid)) * v.block
    print(f"tensor cores: tutorial 05 mma_pipe bf16 {M} x {N} x {K} ({threads} threads, cp.async + ldmatrix + mma.sync)"
          f"; results equal: {np.array_equal(C_fibers, C_program)}")
    print(f"{'way in':<44} {'best s':>8}")
    checks = "all checks" if host.host.level == 2 and host.host.global_checks else (
        "shared-memory checks" if host.host.level == 2 else f"checks {host.host.level}")
    print(f"{'compile_host (' + checks + ')':<44} {s_fibers:8.3f}")
    print(f"{'emulate (a program, no checks)':<44} {s_program:8.3f}")


def attention(runs: int = 3) -> None:
    """Tutorial 07's wgmma kernels fed by TMA through emulate, as tests/test_attention_persistent.py runs them: step 3
    (fa3, one block per work item) and step 3b (fa3p, persistent) on the same inputs, then two of step 3b's cases."""
    sys.path.insert(0, "tests")
    import test_attention_persistent as tp

    def fa3p(BH, N, d, dtype, causal, ctas, heads_per_section):
        def run():
            arrays, _, O = tp.case(BH, N, d, dtype, seed=N)
            tp.run_persistent(arrays, O, d, dtype, causal, ctas, heads_per_section, np.zeros(1, np.int32))
        return run

    cases = [("fa3 + fa3p bf16 d128 causal, 3 x 400 (the notebook's bits test)",
              tp.test_persistent_attention_writes_the_notebooks_bits),
             ("fa3p fp16 d64 causal, 3 x 300, 2 CTAs, dynamic", fa3p(3, 300, 64, "fp16", True, 2, 2)),
             ("fa3p bf16 d128 causal, 3 x 1031, 3 CTAs, dynamic", fa3p(3, 1031, 128, "bf16", True, 3, 3))]
    print("tutorial 07 on emulate (wgmma fed by TMA, mbarriers; 3 warpgroups a block for d = 128, 4 for d = 64)")
    print(f"{'kernel':<68} {'best s':>8}")
    for name, fn in cases:
        fn()                                               # built
        print(f"{name:<68} {best(fn, runs):8.3f}")


if __name__ == "__main__":
    sys.exit(main())
