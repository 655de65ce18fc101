"""benchmarks/as_called.py without a GPU: why() on synthetic timings (a host-bound sustained time told from a
clock-bound one), the host time per call, and time_as_called's result with kernellab.bench played by a fake."""
import pathlib
import sys
import time
import types

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import as_called  # noqa: E402
from as_called import Timings, host_bound, restrict, rows_for, why  # noqa: E402

from kernellab.run.launch import launch as L  # noqa: E402

OP, EAGER, COMPILE = "kl::layernorm", "torch eager", "torch.compile"


def timings(ours, eager, host=None, loop=None):
    """ms per method for the op and eager from (bench, do_bench, sustained) µs triples; host and loop in µs."""
    return Timings({m: {OP: ours[i] / 1e3, EAGER: eager[i] / 1e3} for i, m in enumerate(as_called.METHODS)},
                   host_ms={k: v / 1e3 for k, v in (host or {}).items()},
                   loop_ms={k: v / 1e3 for k, v in (loop or {}).items()})


def ratios(ms, name=OP, base=EAGER):
    return {m: ms[m][base] / ms[m][name] for m in as_called.METHODS}


def test_a_sustained_time_the_host_covers_is_called_host_bound_with_its_figures():
    # LayerNorm 3 x 100003 as an H100 gave it: 11 µs by bench and do_bench, 65 sustained; eager 260 everywhere.
    ms = timings((11, 11, 65), (260, 258, 262), host={OP: 60, EAGER: 9})
    text = why(ratios(ms), ms, OP, EAGER)
    assert text.startswith(f"{OP} host-bound back to back: host 60 µs a call against a kernel of 11 µs "
                           f"(sustained 65 µs)")
    assert "power" not in text and EAGER not in text.split(":")[0]


def test_with_the_loops_costs_host_bound_means_the_host_cannot_keep_the_gpu_fed():
    # The flush: 33 µs of GPU, 10 µs of host with the events. 40 + 10 µs of host against 33 + 11 of GPU: bound.
    ms = timings((11, 11, 30), (260, 258, 262), host={OP: 40, EAGER: 9}, loop={"flush": 33, "host": 10})
    text = why(ratios(ms), ms, OP, EAGER)
    assert text.startswith(f"{OP} host-bound back to back: host 40 µs a call against a kernel of 11 µs (sustained "
                           f"30 µs) (50 µs of host with the flush's and events' queuing, against 44 µs of GPU")
    # LayerNorm 4096 x 4096's figures: a 29 µs kernel, 44 sustained, 31 µs of host: 41 of host against 62 of GPU.
    ms = timings((29, 29, 44), (38, 38, 38), host={OP: 31, EAGER: 9}, loop={"flush": 33, "host": 10})
    assert not host_bound(ms, ms.host_ms, OP, ms.loop_ms) and host_bound(ms, ms.host_ms, OP)   # the weaker test
    text = why(ratios(ms), ms, OP, EAGER)
    assert "host-bound" not in text and "power-capped clock" in text
    assert (f"not host time: {OP} 31 µs a call on the host (+10 µs the flush's and events' queuing) under 62 µs of "
            f"GPU a call with the flush") in text


def test_a_host_time_below_the_rise_is_not_called_host_bound():
    ms = timings((11, 11, 65), (260, 258, 262), host={OP: 20, EAGER: 9})
    text = why(ratios(ms), ms, OP, EAGER)
    assert "host-bound" not in text and "power-capped clock" in text
    assert "not host time: kl::layernorm 20 µs a call on the host, torch eager 9 µs a call" in text


def test_without_host_times_the_reason_is_the_clock_as_before():
    ms = timings((11, 11, 65), (260, 258, 262))
    text = why(ratios(ms), ms, OP, EAGER)
    assert "power-capped clock" in text and "host" not in text


def test_a_host_bound_baseline_is_named_too():
    # torch.compile's guards cost host time: its sustained time rises, ours does not.
    ms = Timings({m: {OP: 8e-3, COMPILE: v} for m, v in zip(as_called.METHODS, (8e-3, 8e-3, 45e-3))},
                 host_ms={OP: 12e-3, COMPILE: 41e-3})
    text = why(ratios(ms, base=COMPILE), ms, OP, COMPILE)
    assert text.startswith(f"{COMPILE} host-bound back to back: host 41 µs a call against a kernel of 8 µs")
    assert f"{OP} host-bound" not in text


@pytest.mark.parametrize("sustained_us, host_us, bound", [
    (65, 60, True), (65, 0.9 * 54 + 0.01, True), (65, 0.9 * 54 - 0.5, False),
    (11.5, 100, False),        # within 5 % of the kernel: nothing to explain
])
def test_host_bound_needs_a_rise_above_the_kernel_that_the_host_covers(sustained_us, host_us, bound):
    ms = {"kernellab.bench": {OP: 11e-3}, "sustained": {OP: sustained_us / 1e3}}
    assert host_bound(ms, {OP: host_us / 1e3}, OP) is bound
    assert host_bound(ms, {}, OP) is False and host_bound(ms, None, OP) is False


def test_agreeing_methods_need_no_reason():
    ms = timings((11, 11, 11.3), (260, 258, 262), host={OP: 60})
    assert why(ratios(ms), ms, OP, EAGER) == ""


def test_rows_for_takes_the_host_times_from_the_result_or_as_given():
    ms = timings((11, 11, 65), (260, 258, 262), host={OP: 60, EAGER: 9})
    row, = rows_for(ms, EAGER)
    assert row["host_ms"] == {OP: 60e-3, EAGER: 9e-3} and "host-bound" in row["why"]
    assert restrict(ms, (OP,)).host_ms == {OP: 60e-3} and set(restrict(ms, (OP,))["sustained"]) == {OP}
    plain = {m: dict(v) for m, v in ms.items()}                  # a caller's copy, without host_ms
    assert "host-bound" not in rows_for(plain, EAGER)[0]["why"]
    row, = rows_for(plain, EAGER, host_ms=ms.host_ms)
    assert "host-bound" in row["why"] and set(row["ms"]) == set(as_called.METHODS)
    row["label"] = "layernorm bf16 3x100003 vs torch eager"
    table = as_called.markdown([row], "op, dtype, shape", "baseline")
    assert "| layernorm bf16 3x100003 vs torch eager | 23.64x | 23.45x | 4.03x |" in table


def test_host_ms_per_call_times_the_calls_host_work_without_waiting_launches():
    calls, deferred = [], []

    def f(x):
        calls.append(x)
        deferred.append(L.DEFER_SYNC.get())
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-4:               # 200 µs of host work a call
            pass

    ms = as_called.host_ms_per_call(f, (7,), gpu_ms=0.25, loops=3)
    assert 0.2 <= ms < 2.0                                   # per call (a loop's 20 calls would be 4 ms and more)
    assert len(calls) == 1 + 3 * 20 and all(deferred)       # 5 ms of GPU work a loop at 0.25 ms a call
    calls.clear()
    as_called.host_ms_per_call(f, (7,), gpu_ms=1e-3, loops=1)
    assert len(calls) == 1 + 200                             # at most 200 calls a loop
    calls.clear()
    as_called.host_ms_per_call(f, (7,), gpu_ms=50.0, loops=1)
    assert len(calls) == 1 + 10                              # at least 10
    calls.clear()
    as_called.host_ms_per_call(f, (0,), gpu_ms=50.0, loops=1, arg_sets=[(1,), (2,)])
    assert calls == [0, 1, 2] + [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]    # each set warmed up, then the sets in turn


def test_time_as_called_keeps_each_functions_host_time_beside_the_methods(monkeypatch):
    seen = []

    def fake_bench(fn, inputs, baselines=None, name=None, sustained=False, **kw):
        seen.append((name, sustained, tuple(baselines)))
        res = lambda n, ms: types.SimpleNamespace(name=n, median_ms=ms)  # noqa: E731
        return types.SimpleNamespace(median_ms=0.011 if not sustained else 0.065,
                                     baselines=[res(n, 0.26) for n in baselines])

    monkeypatch.setattr(as_called.kernellab, "bench", fake_bench)
    monkeypatch.setitem(sys.modules, "triton", None)        # no triton: do_bench is left out
    fns = {OP: lambda x: time.sleep(1e-4), EAGER: lambda x: None}
    ms = as_called.time_as_called(fns, (1,), quick=True)
    assert isinstance(ms, Timings) and set(ms) == {"kernellab.bench", "sustained"}
    assert ms["sustained"] == {OP: 0.065, EAGER: 0.26} and seen[1] == (OP, True, (EAGER,))
    assert set(ms.host_ms) == {OP, EAGER} and ms.host_ms[OP] >= 0.1 > ms.host_ms[EAGER]
    assert ms.host_same_ms == ms.host_ms and ms.host_rotating_ms == {}       # no GPU: no rotating sets
    assert as_called.time_as_called(fns, (1,), quick=True, host=False).host_ms == {}
    fns["other"] = lambda x: None                           # not timed sustained: no host time needed
    ms = as_called.time_as_called(fns, (1,), quick=True, only={"sustained": (EAGER,)})
    assert set(ms.host_ms) == {OP, EAGER}
