"""A tutorial launcher's launch configurations, recorded on the CPU and checked against what an SM can hold.

A kernel can compile without spills and pass the CPU emulator (which does not model the register file) and still not
launch on a GPU: `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` where the block's registers or shared memory do not fit one SM.
These helpers run a launcher with stand-in kernels that record each launch instead of running it, then check every
recorded launch against the compiled kernel's resources:

    launches = []
    t = load_tutorial("08-attention-backward.py", compile=recording(launches))
    t["attention_backward_hopper"](...)                      # CPU tensors: nothing runs, each launch is recorded
    assert_every_launch_fits(launches, compiled_kernels, "sm_90")
"""
from __future__ import annotations

import math
from dataclasses import dataclass


# A kernel whose registers are set by NREG: 200 values a thread live across a barrier, so ptxas gives it as many
# registers as __maxnreg__ allows (tests/test_register_rule.py compiles it on the CPU, tests/gpu/test_launch_limits_gpu.py
# launches it).
HEAVY = r"""
extern "C" __global__ void __maxnreg__(NREG) heavy(const float* x, float* y, int n) {
    float v[200];
    #pragma unroll
    for (int j = 0; j < 200; ++j) v[j] = x[(threadIdx.x + j * blockDim.x) % n];
    __syncthreads();
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 200; ++j) s += v[j] * v[199 - j] + v[(j * 7) % 200];
    y[threadIdx.x % n] = s;
}
"""


@dataclass(frozen=True)
class Launch:
    """One launch as the launcher asked for it."""

    kernel: str
    grid: tuple
    block: tuple
    shared_bytes: int            # dynamic shared memory of the launch


def _dims(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (int(x),)


class _Kernel:
    def __init__(self, name: str, launches: list):
        self.name, self._launches = name, launches

    def __getitem__(self, config):
        """kernel[grid, block] or kernel[grid, block, shared_bytes], as kernellab's kernels take it."""
        grid, block, *rest = config
        self._launches.append(Launch(self.name, _dims(grid), _dims(block), int(rest[0]) if rest else 0))
        return lambda *args, **kwargs: None


class _Module:
    def __init__(self, launches: list):
        self._launches = launches

    def __getitem__(self, name: str) -> _Kernel:
        return _Kernel(name, self._launches)


def recording(launches: list):
    """A `compile=` for notebook_cells.load_tutorial: every %%cuda module becomes one whose kernels append a Launch
    to `launches` when launched, and run nothing."""
    return lambda source: _Module(launches)


def assert_every_launch_fits(launches, kernels, arch: str = "sm_90") -> list:
    """Every launch in `launches` fits an SM of `arch`: its block within the kernel's launch bounds and at least one
    block an SM by kernellab.occupancy, with the compiled kernel's registers and its static plus the launch's dynamic
    shared memory. `kernels` maps a kernel name to the compiled kernel. Returns the occupancies (one per distinct
    configuration) for the caller to print."""
    import kernellab

    assert launches, "the launcher launched nothing"
    seen, out = set(), []
    for launch in launches:
        key = (launch.kernel, launch.block, launch.shared_bytes)
        if key in seen:
            continue
        seen.add(key)
        assert launch.kernel in kernels, f"{launch.kernel}: launched but not among the compiled kernels"
        r = kernels[launch.kernel].resources
        threads = math.prod(launch.block)
        assert threads <= r.max_threads_per_block, (
            f"{launch.kernel}: block {launch.block} = {threads} threads, above its launch bounds' "
            f"{r.max_threads_per_block}")
        occ = kernellab.occupancy(threads, r.registers, r.shared_bytes + launch.shared_bytes, arch)
        assert occ.blocks_per_sm >= 1, (
            f"{launch.kernel}: {threads} threads x {r.registers} registers, {r.shared_bytes} + {launch.shared_bytes} "
            f"bytes of shared memory: no block fits an SM of {arch} (limited by {occ.limiter}); on a GPU this launch "
            f"fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\n{occ}")
        out.append((launch.kernel, occ))
    return out
