"""Isolation reaches every entry point: %%cuda --isolate, Kernel.launch, check(isolate=...), the magics' registration."""
import pytest
from IPython.core.interactiveshell import InteractiveShell

import kernellab
from kernellab.run.launch import worker

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1; }\n'


@pytest.fixture
def routed(monkeypatch):
    """Record launches that go to the worker instead of running them."""
    calls = []
    monkeypatch.setattr(kernellab.Kernel, "run_isolated",
                        lambda self, grid, block, *args, **kw: calls.append((self.name, grid, block)))
    return calls


def test_kernel_follows_its_own_flag_then_the_notebook_setting(routed, tmp_cache):
    k = kernellab.compile_cuda(SRC, arch="sm_90").k
    k.isolate = True
    k[1, 32](None)
    assert routed == [("k", 1, 32)]
    k.isolate = None
    with worker.isolation(True):
        k[2, 32](None)
    assert routed[-1] == ("k", 2, 32)
    if not kernellab.has_gpu():
        with pytest.raises(kernellab.NoGPUError):
            k[3, 32](None)        # isolation off: the in-process path, which needs a GPU
    assert len(routed) == 2


def test_cuda_magic_isolate_marks_the_cells_kernels(tmp_cache, routed, monkeypatch):
    from kernellab.notebook import magics

    monkeypatch.setattr(magics, "gpu_status", lambda: (True, ""))   # the cell targets a GPU, not the CPU path
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    assert ip.run_cell("%%cuda --arch sm_90 --isolate\n" + SRC).success
    assert ip.user_ns["k"].isolate is True
    ip.run_cell("k[4, 32](None)")
    assert routed == [("k", 4, 32)]
    assert ip.run_cell("%%cuda --arch sm_90\n" + SRC).success
    assert ip.user_ns["k"].isolate is None


def test_load_ext_registers_launch_magic():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    assert ip.find_line_magic("launch") is not None
    assert ip.find_cell_magic("numba") is not None


def test_check_runs_trials_under_the_requested_isolation():
    import torch

    seen = []

    def candidate(x):
        seen.append(worker.settings.isolate)
        return x * 2

    report = kernellab.check(candidate, lambda x: x * 2, lambda g: (torch.randn(7, generator=g),), trials=2,
                             isolate=True)
    assert report.passed and seen and all(seen)   # every call (trials and the output probe) ran isolated
    assert worker.settings.isolate is False


def test_set_isolation_is_public():
    kernellab.set_isolation(True)
    try:
        assert worker.settings.isolate
    finally:
        kernellab.set_isolation(False)


def test_launch_banks_goes_to_the_per_line_profile(monkeypatch, tmp_cache):
    import numpy as np

    from kernellab.kernel import Kernel

    seen = []
    monkeypatch.setattr(Kernel, "profile_banks", lambda kernel, grid, block, *args, **kw: seen.append(
        (kernel.name, grid, block, len(args), kw)) or "per-line report")
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    assert ip.run_cell("%%cuda --arch sm_90\n" + SRC).success
    ip.user_ns["x"] = np.zeros(32, np.float32)
    assert ip.run_line_magic("launch", "--banks k[1, 32](x)") == "per-line report"
    assert seen == [("k", 1, 32, 1, {"shared_bytes": 0})]
    assert "--banks" in ip.find_line_magic("launch").__doc__
