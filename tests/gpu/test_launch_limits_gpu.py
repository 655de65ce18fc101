"""On a GPU: the launches kernellab refuses before the driver (make_config's register check, the CPU path's checks
against the arch table) are exactly those the driver refuses, in the driver's own words. Run on a GPU machine:
tools/gpu/run.py tests-launch-limits, or pytest -m gpu tests/gpu/test_launch_limits_gpu.py."""
import dataclasses

import numpy as np
import pytest
import torch

import kernellab
from kernellab.errors import ArgumentError, LaunchError
from kernellab.run.launch import launch as L
from kernellab.run.launch.device import device_for_arch, device_info
from kernellab.run.sim.cuda import cpu

pytestmark = pytest.mark.gpu

from launch_plans import HEAVY  # noqa: E402  (ptxas gives the kernel as many registers as NREG allows)


def heavy(nreg: int):
    return kernellab.compile_cuda(HEAVY.replace("NREG", str(nreg)), arch=None).heavy


def driver_verdict(k, threads: int, monkeypatch) -> str:
    """'' where the driver launches `threads` threads of `k`, else its error text; kernellab's own checks of the
    registers and of max_threads_per_block are switched off, so that the driver decides."""
    monkeypatch.setattr(L, "registers_do_not_fit", lambda *a: "")
    monkeypatch.setattr(k, "resources", dataclasses.replace(k.resources, max_threads_per_block=1024))
    k._path = None                               # a fresh LaunchPath: its configurations are not cached yet
    x, y = torch.rand(1000, device="cuda"), torch.zeros(1024, device="cuda")
    try:
        k.launch(1, threads, x, y, 1000, sync=True, isolate=False)
    except LaunchError as exc:
        return exc.cuda_error or str(exc)
    finally:
        monkeypatch.undo()
        k._path = None
    return ""


def driver_max_threads(k) -> int:
    """CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK of `k` as the driver loaded it."""
    from cupy.cuda import driver
    return driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k._function(device_info().index).ptr)


def test_the_driver_refuses_288_threads_at_224_registers_in_the_words_kernellab_uses(monkeypatch):
    k = heavy(224)
    regs = k.resources.registers
    assert regs > 168, k.resources
    said = driver_verdict(k, 288, monkeypatch)
    print(f"driver at 288 threads x {regs} registers: {said!r}; CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK "
          f"{driver_max_threads(k)}, kernellab's {k.resources.max_threads_per_block}")
    assert said == L.OUT_OF_RESOURCES, f"the driver said {said!r}"
    assert driver_max_threads(k) == k.resources.max_threads_per_block == 256, "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"
    x, y = torch.rand(1000, device="cuda"), torch.zeros(1024, device="cuda")
    with pytest.raises(LaunchError) as gpu:                    # kernellab's check, before the driver
        k[1, 288](x, y, 1000)
    with pytest.raises(LaunchError) as on_cpu:                 # the CPU path's, on the same image
        cpu.launch(k.image(), 1, 288, (x.cpu(), y.cpu(), 1000))
    words = str(L.as_launch_error(L.OUT_OF_RESOURCES, "heavy", L.LaunchConfig((1, 1, 1), (288, 1, 1)), "launch"))
    assert str(gpu.value) == str(on_cpu.value) and str(gpu.value).startswith(words)
    assert driver_verdict(k, 256, monkeypatch) == ""
    assert driver_verdict(heavy(168), 288, monkeypatch) == ""


@pytest.mark.parametrize("nreg", [96, 128, 168, 200, 224, 255])
def test_the_register_check_refuses_exactly_what_the_driver_refuses(nreg, monkeypatch):
    """Every block size up to 1024, in whole warps, and odd sizes either side of the kernel's max_threads_per_block:
    kernellab's verdicts (registers_do_not_fit, and max_threads_per_block: the largest that fits) against the
    driver's launches and its CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK."""
    k = heavy(nreg)
    r = k.resources
    arch = device_info().arch
    attribute = driver_max_threads(k)
    bad = [("max_threads_per_block", f"ours {r.max_threads_per_block}, the driver's {attribute}")] \
        if attribute != r.max_threads_per_block else []
    odd = [r.max_threads_per_block - 31] + ([r.max_threads_per_block + 1] if r.max_threads_per_block < 1024 else [])
    for threads in list(range(32, 1025, 32)) + odd:
        ours = bool(L.registers_do_not_fit(threads, r.registers, r.shared_bytes, arch))
        said = driver_verdict(k, threads, monkeypatch)
        if said not in ("", L.OUT_OF_RESOURCES):
            bad.append((threads, f"driver: {said}"))
        elif ours != bool(said):
            bad.append((threads, "ours refuses" if ours else "the driver refuses"))
        elif ours != (threads > r.max_threads_per_block):
            bad.append((threads, f"max_threads_per_block {r.max_threads_per_block} disagrees with the register check"))
    print(f"{r.registers} registers, max_threads_per_block {r.max_threads_per_block} (driver {attribute}): "
          f"disagreements {bad}")
    assert not bad, f"{r.registers} registers: (threads, who refuses): {bad}"


def test_the_cpu_paths_shared_memory_limit_is_this_gpus():
    dev = device_info()
    assert device_for_arch(dev.arch).shared_per_block_optin_bytes == dev.shared_per_block_optin_bytes
    assert device_for_arch(dev.arch).max_block_dims == dev.max_block_dims
    k = kernellab.compile_cuda('extern "C" __global__ void s(float* y) { extern __shared__ float d[]; '
                               'd[threadIdx.x] = 1.f; __syncthreads(); y[threadIdx.x] = d[threadIdx.x]; }',
                               arch=None).s
    y = torch.zeros(64, device="cuda")
    too_much = dev.shared_per_block_optin_bytes - k.resources.shared_bytes + 4
    with pytest.raises(ArgumentError) as gpu:
        k[1, 64, too_much](y)
    with pytest.raises(ArgumentError) as on_cpu:
        cpu.launch(k.image(), 1, 64, (y.cpu(),), shared_bytes=too_much)
    assert str(gpu.value).split("exceeds")[0] == str(on_cpu.value).split("exceeds")[0]
    k[1, 64, too_much - 4](y)                                   # the limit itself launches
    torch.cuda.synchronize()
    assert np.all(y.cpu().numpy() == 1)
