"""benchmarks/as_called.py's host figures on a real GPU: sustained's own costs a call and a function's host time."""
import pathlib
import sys

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_sustained_loops_flush_costs_the_gpu_more_than_it_costs_the_host():
    import torch

    import as_called

    loop = as_called.sustained_loop_ms()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    # The flush writes twice the L2 (100 MB on an H100): 10-200 µs of GPU at 1-10 TB/s; queuing it and two events
    # costs the host a few µs.
    assert 2 * l2 / 10e12 * 1e3 <= loop["flush"] <= 2 * l2 / 0.5e12 * 1e3, loop
    assert 0 < loop["host"] < loop["flush"], loop


def test_host_time_per_call_is_the_hosts_not_the_gpus():
    import torch

    import as_called

    x = torch.randn(8192, 8192, device="cuda")             # a 0.2-0.3 ms kernel per call on an H100
    gpu_ms = as_called.host_ms_per_call(lambda a: torch.cuda.synchronize() or a.mul(2.0), (x,), gpu_ms=0.3)
    host_ms = as_called.host_ms_per_call(lambda a: a.mul(2.0), (x,), gpu_ms=0.3)
    assert host_ms < 0.05 < gpu_ms, (host_ms, gpu_ms)      # queued calls: µs of host; waiting calls: the kernel's


def test_the_rotating_sets_are_benchs_distinct_copies():
    import torch

    import as_called

    x = torch.randn(1000, 1031, device="cuda", dtype=torch.bfloat16)
    sets = as_called.rotating_sets((x,))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert len(sets) * x.numel() * 2 >= 2 * l2 and sets[0][0] is x
    assert len({s[0].data_ptr() for s in sets}) == len(sets) and all(torch.equal(s[0], x) for s in sets)
