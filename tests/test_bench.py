"""bench, sweep and the roofline without a GPU: a fake clock stands in for CUDA events."""
import dataclasses
import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernellab.analysis import roofline as rl  # noqa: E402
from kernellab.errors import NoGPUError  # noqa: E402
from kernellab.notebook.bench_plots import RooflineError, roofline, sweep_plot  # noqa: E402
from kernellab.report import REPORT_MIME  # noqa: E402
from kernellab.run.measure import ceilings as ceil_mod  # noqa: E402
from kernellab.run.measure.bench import BenchError, BenchResult, SweepResult, bench, check_measurable, sweep  # noqa: E402


class FakeClock:
    """Runs each call and reports the time its return value asks for (`ms_of(returned)`)."""

    device = "NVIDIA H200"
    flush_bytes = 2 * 2**20

    def __init__(self, ms_of, l2_bytes=2**20, noise=0.0, seed=0):
        self.ms_of, self.l2_bytes, self.noise = ms_of, l2_bytes, noise
        self.rng = np.random.default_rng(seed)
        self.batches = []
        self.graphs = []

    def check_measurable(self, name, returned, args):
        pass

    def time_calls(self, calls):
        self.batches.append(len(calls))
        out = []
        for call in calls:
            ms = self.ms_of(call())
            out.append(ms * (1 + self.noise * self.rng.standard_normal()))
        return out

    def graph(self, calls):
        self.graphs.append(len(calls))

        def replay():
            return [call() for call in calls][-1]
        return replay

    def describe(self):
        return "fake clock"


def ms_from_tensor(t):
    """The fake kernel takes t[0] milliseconds."""
    return float(t.reshape(-1)[0])


def const_inputs(ms):
    return lambda g: (torch.full((4,), float(ms)),)


# --- bench ------------------------------------------------------------------------------------------------------


def test_median_quantiles_and_rates_from_the_clock():
    r = bench(lambda x: x.clone(), const_inputs(2.0), flops=4e9, bytes=lambda x: 8e9,
              timer=FakeClock(ms_from_tensor), name="k")
    assert r.name == "k" and r.median_ms == 2.0 and r.min_ms == 2.0
    assert r.quantile(0.25) == 2.0 and r.quantile(0.33) == 2.0
    assert r.tflops == pytest.approx(2.0)           # 4e9 FLOP in 2 ms
    assert r.gbps == pytest.approx(4000.0)          # 8e9 bytes in 2 ms
    assert r.intensity == pytest.approx(0.5)
    assert r.bytes_source == "declared" and r.device == "NVIDIA H200"
    assert "fake clock" in r.method and "warm-up 25 ms" in r.method


def test_repetitions_follow_rep_ms_within_limits():
    r = bench(lambda x: x.clone(), const_inputs(1.0), rep_ms=100, timer=FakeClock(ms_from_tensor), rotate=False)
    assert r.reps == 100 and r.rounds == 10
    few = bench(lambda x: x.clone(), const_inputs(50.0), rep_ms=100, timer=FakeClock(ms_from_tensor))
    assert few.reps == 20                           # min_reps
    many = bench(lambda x: x.clone(), const_inputs(0.001), rep_ms=100, max_reps=500, timer=FakeClock(ms_from_tensor))
    assert many.reps == 500                         # max_reps


def test_sustained_mode_warms_up_for_at_least_half_a_second():
    clock = FakeClock(ms_from_tensor)
    bench(lambda x: x.clone(), const_inputs(0.5), warmup_ms=25, rep_ms=10, timer=clock, sustained=True)
    assert clock.batches[1] == 1000                            # 500 ms / 0.5 ms: long enough to reach the power cap


def test_warm_up_is_by_time():
    clock = FakeClock(ms_from_tensor)
    bench(lambda x: x.clone(), const_inputs(0.5), warmup_ms=25, rep_ms=10, timer=clock)
    assert clock.batches[0] == 3 and clock.batches[1] == 50   # estimate, then 25 ms / 0.5 ms of warm-up


def test_quantiles_of_noisy_times():
    r = bench(lambda x: x.clone(), const_inputs(1.0), rep_ms=2000, max_reps=2000,
              timer=FakeClock(ms_from_tensor, noise=0.05, seed=1))
    times = np.asarray(r.times_ms)
    assert r.median_ms == pytest.approx(np.median(times))
    assert dict(r.quantiles_ms)[0.9] == pytest.approx(np.quantile(times, 0.9))
    assert r.quantile(0.9) > r.median_ms > r.quantile(0.1)
    assert 0.04 < r.spread < 0.1                    # interquartile range of N(1, 0.05) is 0.067


def test_baselines_alternate_with_the_function_in_rounds():
    log = []

    def mine(x):
        log.append("mine")
        return x.clone()

    def theirs(x):
        log.append("theirs")
        return x * 3                                # three times slower on the fake clock

    r = bench(mine, const_inputs(1.0), baselines={"theirs": theirs}, rounds=4, min_reps=8, rep_ms=8,
              timer=FakeClock(ms_from_tensor), verify=False)
    timed = log[-(8 + 8):]                          # the measured rounds come last: 2 calls each, alternating
    assert timed == ["mine", "mine", "theirs", "theirs"] * 4
    assert [b.name for b in r.baselines] == ["theirs"]
    s = r.speedup("theirs")
    assert (s.ratio, s.low, s.high, s.rounds) == (3.0, 3.0, 3.0, 4)
    assert "3x vs theirs" in str(r)


def test_speedup_spread_comes_from_per_round_ratios():
    r = bench(lambda x: x.clone(), const_inputs(1.0), baselines={"b": lambda x: x * 2},
              timer=FakeClock(ms_from_tensor, noise=0.02, seed=3))
    s = r.speedups[0]
    ratios = [b / f for b, f in zip(r.baselines[0].round_medians_ms, r.round_medians_ms)]
    assert s.ratio == pytest.approx(float(np.median(ratios)))
    assert s.low == min(ratios) and s.high == max(ratios) and s.low < s.ratio < s.high
    assert s.ratio == pytest.approx(2.0, rel=0.05)


def test_small_inputs_rotate_through_enough_sets_to_exceed_l2():
    seen = set()

    def fn(x):
        seen.add(float(x[1]))
        return torch.ones(1)

    clock = FakeClock(lambda t: 1.0, l2_bytes=2**20)
    r = bench(fn, lambda g: (torch.randn(1000, generator=g),), rep_ms=300, timer=clock,   # 4000 B: fits 262 times
              verify=False)                         # (verify's refill would add a 257th value)
    assert r.input_sets == 256                      # the cap; 2 MiB / 4000 B would be 525
    assert len(seen) == 256 and "256 input sets in turn" in r.method
    big = bench(fn, lambda g: (torch.randn(300_000, generator=g),), timer=clock)
    assert big.input_sets == 1                      # 1.2 MB does not fit a 1 MiB L2
    off = bench(fn, lambda g: (torch.randn(1000, generator=g),), rotate=False, timer=clock)
    assert off.input_sets == 1


def test_a_fixed_argument_tuple_is_cloned_for_rotation():
    x = torch.zeros(100)
    ids = set()

    def fn(t):
        ids.add(t.data_ptr())
        return t

    r = bench(fn, (x,), timer=FakeClock(lambda t: 1.0, l2_bytes=4000))
    assert r.input_sets == 20 and len(ids) == 20    # ceil(2 x 4000 / 400)


def test_cuda_graph_replays_divide_time_among_calls():
    clock = FakeClock(lambda t: 0.01 if t.numel() == 1 else float("nan"))
    r = bench(lambda x: torch.ones(1), (torch.zeros(10**6),), cuda_graph=True, timer=clock)
    assert r.cuda_graph and r.calls_per_replay == 50   # 0.5 ms of 0.01 ms calls
    assert clock.graphs == [50]
    assert r.median_ms == pytest.approx(0.01 / 50)     # the fake replay reports one call's time
    assert "CUDA-graph replays" in r.method and "not between the calls inside it" in r.method


def test_flops_and_bytes_may_be_callables_of_the_arguments():
    r = bench(lambda a, b: a @ b, lambda g: (torch.ones(3, 5), torch.ones(5, 7)),
              flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1],
              bytes=lambda a, b: 4 * (a.numel() + b.numel() + a.shape[0] * b.shape[1]),
              timer=FakeClock(lambda t: 1.0))
    assert r.flops == 210 and r.bytes_moved == 4 * (15 + 35 + 21)


@pytest.mark.parametrize("kwargs,words", [
    (dict(fn=3), "fn must be callable"),
    (dict(baselines=[torch.neg]), "baselines must map"),
    (dict(baselines={"b": 3}), "baseline 'b' must be callable"),
    (dict(baselines={"fn": torch.neg}), "own name"),
    (dict(rep_ms=-1), "rep_ms"),
    (dict(rounds=0), "rounds"),
    (dict(max_reps=5), "max_reps"),
    (dict(quantiles=(0.5, 1.5)), "quantiles"),
    (dict(flops="many"), "flops must be"),
    (dict(bytes=-4), "bytes must be"),
    (dict(inputs=lambda g: "x"), "inputs must be"),
])
def test_bad_options_raise_bench_error(kwargs, words):
    args = dict(fn=lambda x: x, inputs=(torch.ones(3),), timer=FakeClock(lambda t: 1.0), name="fn")
    args.update(kwargs)
    with pytest.raises(BenchError, match=words):
        bench(args.pop("fn"), args.pop("inputs"), **args)


class CudaArrayLike:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_check_measurable_refuses_cpu_work_and_nothing_to_time():
    cpu = torch.ones(3)
    with pytest.raises(BenchError, match="runs on the CPU"):
        check_measurable("f", cpu, (cpu,))
    with pytest.raises(BenchError, match="runs on the CPU"):
        check_measurable("f", None, (cpu,))
    with pytest.raises(BenchError, match="nothing on the GPU to time"):
        check_measurable("f", None, (3, "x"))
    with pytest.raises(BenchError, match="returned a float"):
        check_measurable("f", 1.5, (CudaArrayLike(),))
    check_measurable("f", CudaArrayLike(), ())            # a CuPy/Numba device array is GPU work
    check_measurable("f", None, (CudaArrayLike(),))       # writes into a device array it was given


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_bench_without_a_gpu_says_so():
    with pytest.raises(NoGPUError, match="no CUDA GPU"):
        bench(lambda x: x, (torch.ones(3),))


# --- the result --------------------------------------------------------------------------------------------------


def _result():
    return bench(lambda x: x.clone(), const_inputs(1.0), baselines={"eager": lambda x: x * 2}, flops=1e9, bytes=2e9,
                 timer=FakeClock(ms_from_tensor), name="mine")


def test_result_is_frozen_and_serialises():
    r = _result()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.median_ms = 0.0
    data = r.to_json()
    assert data["kind"] == "bench" and data["version"] == 1 and data["name"] == "mine"
    assert data["speedups"][0]["baseline"] == "eager" and data["baselines"][0]["name"] == "eager"
    json.dumps(data, allow_nan=False)
    assert set(r._repr_mimebundle_()) == {"text/plain", "text/html", REPORT_MIME}
    page = r._repr_html_()
    assert "mine" in page and "eager" in page and "speed-up" in page
    text = str(r)
    assert text.startswith("mine: 1 ms median") and "TFLOP/s" in text and "baseline eager" in text


def test_with_bytes_replaces_declared_bytes_by_a_measurement():
    r = _result().with_bytes(4e9, "ncu dram__bytes.sum")
    assert r.bytes_moved == 4e9 and r.bytes_source == "ncu dram__bytes.sum"
    assert r.gbps == pytest.approx(4000) and r.intensity == pytest.approx(0.25)
    assert "(ncu dram__bytes.sum)" in r.summary()


# --- sweep -------------------------------------------------------------------------------------------------------


def _sweep(**kw):
    return sweep(lambda x: x.clone(), [1000, 10_000, 100_000], lambda n, g: (torch.full((n,), n / 1e4),),
                 baselines={"twice": lambda x: x * 2}, flops=lambda x: float(x.numel()),
                 bytes=lambda x: 8.0 * x.numel(), x_name="n", timer=FakeClock(ms_from_tensor), **kw)


def test_sweep_table_and_text():
    s = _sweep(progress=False)
    assert isinstance(s, SweepResult) and s.xs == (1000, 10_000, 100_000) and s.names == ("fn", "twice")
    rows = s.table()
    assert [row["n"] for row in rows] == [1000, 10_000, 100_000]
    assert rows[1]["fn ms"] == pytest.approx(1.0) and rows[1]["twice ms"] == pytest.approx(2.0)
    assert rows[2]["vs twice"] == pytest.approx(2.0)
    assert rows[0]["fn TFLOP/s"] == pytest.approx(1000 / 0.1e-3 / 1e12)
    text = str(s).splitlines()
    assert text[0].split() == ["n", "fn", "ms", "twice", "ms", "vs", "twice", "fn", "TFLOP/s", "fn", "GB/s"]
    assert s.series("twice", "ms") == pytest.approx([0.2, 2.0, 20.0])
    data = s.to_json()
    assert data["kind"] == "bench" and data["sweep"]["xs"] == [1000, 10_000, 100_000]
    json.dumps(data, allow_nan=False)


def test_sweep_progress_bar_is_optional(monkeypatch):
    assert _sweep(progress=True).xs                       # tqdm is installed here
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)   # ...and where it is not, no bar
    assert _sweep(progress=True).xs


def test_sweep_over_configurations_passes_them_as_arguments():
    s = sweep(lambda x, block: x * block, [(64, "a"), (128, "b")], lambda cfg, g: (torch.ones(2), cfg[0]),
              x_name="config", timer=FakeClock(lambda t: float(t[0]) / 64), progress=False)
    assert [r.median_ms for r in s.results] == [1.0, 2.0]
    fig = sweep_plot(s)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["(64, 'a')", "(128, 'b')"]


def test_sweep_plot_draws_every_function_and_uses_given_axes():
    import matplotlib.pyplot as plt

    s = _sweep(progress=False)
    fig = sweep_plot(s)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["fn", "twice"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    _, own = plt.subplots()
    assert sweep_plot(s, metric="tflops", ax=own) is own.figure
    assert own.get_ylabel() == "TFLOP/s"
    assert "data:image/png;base64," in s._repr_html_()
    plt.close("all")


def test_sweep_needs_a_callable_and_points():
    with pytest.raises(BenchError, match="inputs"):
        sweep(torch.neg, [1], (torch.ones(1),))
    with pytest.raises(BenchError, match="at least one"):
        sweep(torch.neg, [], lambda n, g: (torch.ones(n),))


# --- roofline math -----------------------------------------------------------------------------------------------


def test_roofline_math():
    assert rl.arithmetic_intensity(2e12, 1e12) == 2.0
    assert rl.ridge_point(67.0, 3350.0) == pytest.approx(20.0)
    assert rl.attainable_tflops(1.0, 67.0, 3350.0) == pytest.approx(3.35)
    assert rl.attainable_tflops(100.0, 67.0, 3350.0) == 67.0
    np.testing.assert_allclose(rl.attainable_tflops(np.array([1.0, 20.0, 40.0]), 67.0, 3350.0), [3.35, 67.0, 67.0])
    assert rl.bound(19.9, 67.0, 3350.0) == "memory" and rl.bound(20.0, 67.0, 3350.0) == "compute"
    assert rl.fraction_of_roof(1.0, 1.675, 67.0, 3350.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positive"):
        rl.arithmetic_intensity(1.0, 0)
    with pytest.raises(ValueError, match="positive"):
        rl.ridge_point(0.0, 100.0)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"), ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla T4", "T4"), ("Tesla V100-SXM2-16GB", "V100 SXM2"),
])
def test_datasheet_lookup_by_driver_name(name, key):
    assert rl.datasheet_ceilings(name) is rl.DATASHEETS[key]


def test_datasheet_lookup_of_an_unknown_gpu_is_none():
    assert rl.datasheet_ceilings("Radeon RX 7900") is None


def test_every_datasheet_row_is_consistent():
    for key, c in rl.DATASHEETS.items():
        assert c.source == "datasheet" and c.reference and c.dram_gbps > 0 and c.fp32_tflops > 0, key
        assert rl.datasheet_ceilings(c.device) is c, key     # the row's own name finds it
        roofs = c.roofs()
        assert [v for _, v in roofs] == sorted(v for _, v in roofs)


def test_ceilings_roundtrip_and_ridge():
    h200 = rl.DATASHEETS["H200 SXM"]
    assert rl.DeviceCeilings.from_json(json.loads(json.dumps(h200.to_json()))) == h200
    assert h200.ridge_point("bf16") == pytest.approx(989.4e12 / 4.8e12)
    assert rl.DATASHEETS["T4"].peak_tflops("bf16") is None
    with pytest.raises(ValueError, match="no bf16 roof"):
        rl.DATASHEETS["T4"].ridge_point("bf16")


# --- roofline chart ----------------------------------------------------------------------------------------------


def _point(name, flops, nbytes, ms, device="NVIDIA H200"):
    r = bench(lambda x: x.clone(), const_inputs(ms), flops=flops, bytes=nbytes, name=name,
              timer=FakeClock(ms_from_tensor))
    return dataclasses.replace(r, device=device)


def test_roofline_places_results_at_intensity_and_rate():
    copy = _point("copy", 1e6, 2e9, 0.5)                # intensity 5e-4, 0.002 TFLOP/s
    gemm = _point("gemm", 2 * 4096**3, 3 * 2 * 4096**2, 0.2)
    fig = roofline([copy, gemm], ceilings="datasheet")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    offsets = {c.get_label(): tuple(c.get_offsets()[0]) for c in ax.collections if not c.get_label().startswith("_")}
    assert offsets["copy"] == pytest.approx((copy.intensity, copy.tflops))
    assert offsets["gemm"] == pytest.approx((gemm.intensity, gemm.tflops))
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "DRAM 4,800 GB/s" in texts and "ridge" in texts and "bf16/fp16 tensor core 989.4/989.4 TFLOP/s" in texts
    assert "datasheet ceilings" in ax.get_title() and "hollow: declared bytes" in ax.get_title()


def test_roofline_with_measured_ceilings_adds_dashed_datasheet_lines_and_filled_measured_points():
    measured = dataclasses.replace(rl.DATASHEETS["H200 SXM"], device="NVIDIA H200", dram_gbps=4300.0,
                                   source="measured", reference="test")
    r = _point("k", 1e9, 1e9, 1.0).with_bytes(5e8, "ncu dram__bytes.sum")
    fig = roofline(r, measured)
    ax = fig.axes[0]
    assert any(line.get_linestyle() == "--" for line in ax.get_lines())
    assert "DRAM 4,300 GB/s" in " ".join(t.get_text() for t in ax.texts)
    dot = next(c for c in ax.collections if c.get_label() == "k")
    assert dot.get_facecolors()[0][3] > 0             # filled: bytes were measured
    assert "filled: measured DRAM bytes" in ax.get_title()


def test_roofline_takes_sweeps_and_baselines_and_given_axes():
    import matplotlib.pyplot as plt

    s = _sweep(progress=False)
    s = dataclasses.replace(s, results=tuple(dataclasses.replace(r, device="NVIDIA H200") for r in s.results))
    _, ax = plt.subplots()
    fig = roofline(s, ceilings=rl.DATASHEETS["H200 SXM"], ax=ax)
    assert fig is ax.figure
    labels = [c.get_label() for c in ax.collections if not c.get_label().startswith("_")]
    assert "fn n=1000" in labels and "twice (fn n=1000)" in labels and len(labels) == 6
    only_mine = roofline(s, ceilings="datasheet", include_baselines=False)
    assert len([c for c in only_mine.axes[0].collections if not c.get_label().startswith("_")]) == 3
    plt.close("all")


def test_roofline_refuses_results_without_flops_or_bytes():
    r = bench(lambda x: x.clone(), const_inputs(1.0), timer=FakeClock(ms_from_tensor), name="bare")
    with pytest.raises(RooflineError, match="bare: no flops or bytes"):
        roofline(r, ceilings="datasheet")


def test_roofline_without_a_gpu_falls_back_to_the_datasheet_of_the_results_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fig = roofline(_point("k", 1e9, 1e9, 1.0))
    assert "NVIDIA H200 SXM" in fig.axes[0].get_title()
    with pytest.raises(RooflineError, match="no datasheet ceilings"):
        roofline(_point("k", 1e9, 1e9, 1.0, device="Mystery GPU"))


def _h200_measured():
    return rl.DeviceCeilings(device="NVIDIA H200", dram_gbps=4247.0, fp32_tflops=59.9, tf32_tflops=371.0,
                             bf16_tflops=687.0, fp16_tflops=671.0, source="measured", reference="test")


def _h200_case(clone_flops=None):
    """A bf16 matmul (8192^3 in 1.43 ms), a vadd at 1/12 FLOP/byte, and a 1 GiB copy with bytes but no FLOPs."""
    n, vadd_n = 8192, 2**26
    return [_point("bf16 matmul", 2 * n**3, 3 * 2 * n * n, 1.43),
            _point("vadd", vadd_n, 12 * vadd_n, 12 * vadd_n / 3.9e9),
            _point("clone", clone_flops, 2 * 2**30, 2 * 2**30 / 4.235e9)]


def _placed(ax):
    return {c.get_label(): tuple(c.get_offsets()[0]) for c in ax.collections if not c.get_label().startswith("_")}


def _boxes(fig, texts):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts]


@pytest.mark.parametrize("clone_flops", [None, 0, 2.0])    # 2 FLOP per 2 GiB: intensity 1e-9, as good as none
def test_roofline_limits_hold_the_placed_points_and_leave_out_a_copy_without_flops(clone_flops):
    import matplotlib.pyplot as plt

    fig = roofline(_h200_case(clone_flops), _h200_measured())
    ax = fig.axes[0]
    placed = _placed(ax)
    assert set(placed) == {"bf16 matmul", "vadd"}
    (x_lo, x_hi), (y_lo, y_hi) = ax.get_xlim(), ax.get_ylim()
    assert x_lo == pytest.approx(1 / 16)                      # the vadd at 1/12 needs nothing further left
    ridge = _h200_measured().ridge_point("bf16")
    assert max(x for x, _ in placed.values()) < x_hi <= 8 * max(ridge, max(x for x, _ in placed.values()))
    assert all(y_lo < y < y_hi for _, y in placed.values())
    assert y_lo > 0.05 and y_hi < 10 * 989.4                 # not the 1e-9 TFLOP/s of the copy
    assert y_hi > 989.4                                      # the dashed datasheet roof is in view
    reason = {None: "no FLOPs declared", 0: "0 FLOPs", 2.0: "9.3e-10 FLOP/byte, as good as none"}[clone_flops]
    assert any(f"clone: 4,235 GB/s, 100% of DRAM ({reason}; not placed)" in t.get_text() for t in ax.texts)
    plt.close(fig)


def test_roofline_goes_left_of_one_sixteenth_only_for_a_point_there():
    import matplotlib.pyplot as plt

    fig = roofline([_point("scan", 1e6, 2e9, 0.5), _point("k", 1e9, 1e9, 1.0)], ceilings="datasheet")
    x_lo = fig.axes[0].get_xlim()[0]
    assert 5e-4 / 4 < x_lo < 5e-4
    plt.close(fig)


def test_roofline_notes_results_without_flops_by_their_bandwidth():
    import matplotlib.pyplot as plt

    case = _h200_case() + [_point("memset", 0, 2**30, 2**30 / 3.0e9)]
    fig = roofline(case, _h200_measured())
    ax = fig.axes[0]
    assert "clone" not in _placed(ax) and "memset" not in _placed(ax)
    note = next(t.get_text() for t in ax.texts if "not placed" in t.get_text())
    assert "clone: 4,235 GB/s, 100% of DRAM (no FLOPs declared; not placed)" in note
    assert "memset: 3,000 GB/s, 71% of DRAM (0 FLOPs; not placed)" in note
    frame = ax.get_window_extent()
    (box,) = _boxes(fig, [next(t for t in ax.texts if "not placed" in t.get_text())])
    assert frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
    only = roofline(case[2], _h200_measured())               # nothing to place: the roofs and the note
    assert not _placed(only.axes[0]) and any("clone: 4,235 GB/s" in t.get_text() for t in only.axes[0].texts)
    plt.close("all")


def test_roofline_still_refuses_flops_without_bytes():
    r = bench(lambda x: x.clone(), const_inputs(1.0), timer=FakeClock(ms_from_tensor), name="k", flops=1e9)
    with pytest.raises(RooflineError, match="k: flops but no bytes"):
        roofline(r, ceilings="datasheet")


def test_roofline_labels_neither_overlap_nor_leave_the_axes():
    import matplotlib.pyplot as plt

    fig = roofline(_h200_case(), _h200_measured())
    ax = fig.axes[0]
    texts = list(ax.texts)
    words = [t.get_text() for t in texts]
    # bf16 and fp16 are within 5 %: one label; tf32 and fp32 have their own.
    roof_labels = [w for w in words if "TFLOP/s, ridge" in w]
    assert len(roof_labels) == 3
    assert any(w.startswith("bf16/fp16 tensor core 687/671 TFLOP/s") for w in roof_labels)
    assert any(w.startswith("tf32 tensor core 371 TFLOP/s") for w in roof_labels)
    assert any("bf16 matmul (769 TFLOP/s)" in w for w in words) and any(w.startswith("vadd (") for w in words)
    boxes = _boxes(fig, texts)
    frame = ax.get_window_extent()
    for word, box in zip(words, boxes):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, word
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if words[i].startswith("DRAM") or words[j].startswith("DRAM"):
                continue                                     # rotated: its bounding box is not its outline
            assert not boxes[i].overlaps(boxes[j]), (words[i], words[j])
    # The bf16/fp16 and tf32 labels, 0.27 decades apart, sit at least a text height apart on screen.
    tops = sorted(box.y0 for w, box in zip(words, boxes) if "TFLOP/s, ridge" in w)
    assert min(b - a for a, b in zip(tops, tops[1:])) >= min(box.height for box in boxes)
    plt.close(fig)


def test_roofline_writes_dram_along_its_slope_near_the_left():
    import matplotlib.pyplot as plt

    ceil = _h200_measured()
    fig = roofline(_h200_case(), ceil)
    ax = fig.axes[0]
    dram = next(t for t in ax.texts if t.get_text().startswith("DRAM 4,247 GB/s"))
    assert "datasheet 4,800" in dram.get_text()
    x, y = dram.xy
    assert y == pytest.approx(x * ceil.dram_gbps / 1e3)      # anchored on the slope
    assert x < ceil.ridge_point("fp32")                      # left of the first ridge
    (x0, y0), (x1, y1) = ax.transData.transform([(0.1, 0.1 * 4.247), (10, 10 * 4.247)])
    assert dram.get_rotation() == pytest.approx(math.degrees(math.atan2(y1 - y0, x1 - x0)), abs=0.5)
    plt.close(fig)


def test_roofline_keeps_ridge_ticks_and_dashed_datasheet_roofs():
    import matplotlib.pyplot as plt

    ceil = _h200_measured()
    fig = roofline(_h200_case(), ceil)
    ax = fig.axes[0]
    ticks = {tuple(np.round(c.get_offsets()[0], 6)) for c in ax.collections if c.get_label().startswith("_")}
    for precision, peak in ceil.roofs():
        assert (round(ceil.ridge_point(precision), 6), round(peak, 6)) in ticks
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert {line.get_ydata()[-1] for line in dashed} >= {67.0, 494.7, 989.4}
    plt.close(fig)


def test_roofline_with_many_points_uses_a_legend_outside_the_axes():
    import matplotlib.pyplot as plt

    many = [_point(f"k{i}", 1e9 * 2**i, 1e9, 1.0) for i in range(10)]
    fig = roofline(many, _h200_measured())
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 10
    assert not any(t.get_text().startswith("k0 (") for t in ax.texts)
    fig.canvas.draw()
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
    plt.close(fig)


# --- ceilings cache ----------------------------------------------------------------------------------------------


def test_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    calls = []

    def fake_measure(device=None):
        calls.append(device)
        return dataclasses.replace(rl.DATASHEETS["H200 SXM"], device="NVIDIA H200", source="measured",
                                   dram_gbps=4000.0 + len(calls), measured_on="2026-11-22")

    monkeypatch.setattr(ceil_mod, "measure_ceilings", fake_measure)
    path = ceil_mod.cache_path("NVIDIA H200")
    assert path == tmp_path / "ceilings" / "NVIDIA_H200.json"
    first = ceil_mod.device_ceilings()
    assert path.exists() and first.dram_gbps == 4001.0
    assert ceil_mod.device_ceilings() == first and len(calls) == 1           # from the cache
    assert ceil_mod.device_ceilings(remeasure=True).dram_gbps == 4002.0
    path.write_text("{not json")
    assert ceil_mod.device_ceilings().dram_gbps == 4003.0                    # a damaged cache is measured again


def test_ceilings_cache_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ceil_mod.cache_dir() == tmp_path / "kernellab" / "ceilings"
    assert math.isfinite(rl.DATASHEETS["H100 SXM"].ridge_point())


# --- the validation script's ncu parsing ---------------------------------------------------------------------------


def _validate_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_bench.py"
    spec = importlib.util.spec_from_file_location("validate_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NCU_CSV = '''==PROF== Connected to process 7 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"1","7","python3.12","h","gemm_reduce","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","2.50"
"0","7","python3.12","h","sm90_gemm","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.40"
"2","7","python3.12","h","sm90_gemm","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,410,000"
"3","7","python3.12","h","gemm_reduce","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","2,600"
==PROF== Disconnected from process 7
'''


def test_ncu_csv_is_parsed_in_launch_order_with_units_and_grouped_per_call():
    v = _validate_module()
    kernels = v.parse_ncu_csv(NCU_CSV)
    assert [k for k, _ in kernels] == ["sm90_gemm", "gemm_reduce", "sm90_gemm", "gemm_reduce"]
    assert [ms for _, ms in kernels] == pytest.approx([1.4, 0.0025, 1.41, 0.0026])
    assert v.per_call_ms(kernels, 2) == pytest.approx([1.4025, 1.4126])
    with pytest.raises(ValueError, match="evenly"):
        v.per_call_ms(kernels, 3)


def test_ncu_csv_captured_on_the_gpu_machine_parses():
    from pathlib import Path

    captured = Path(__file__).resolve().parent / "fixtures" / "captured" / "ncu_metrics_details.csv"
    if not captured.exists():
        pytest.skip("tests/fixtures/captured/ncu_metrics_details.csv is not in this checkout")
    kernels = _validate_module().parse_ncu_csv(captured.read_text())
    assert kernels and all(ms > 0 for _, ms in kernels)
    assert ("transpose_naive", pytest.approx(9568e-6)) in [(k, ms) for k, ms in kernels]


# --- CudaClock's batching against a simulated GPU timeline ----------------------------------------------------------


class SimulatedGPU:
    """One in-order stream: an op starts when queued and when the one before it ends. Times in ms."""

    def __init__(self):
        self.cpu = 0.0          # the CPU's clock (advanced by the Python work the calls model)
        self.free = 0.0         # when the stream finishes what is queued
        self.spins = 0          # torch.cuda._sleep calls: one per batch
        self.flushes = []       # "write" (zero_ of the flush buffer) or "read" (amax over it), in order

    def enqueue(self, ms, busy=True):
        self.cpu += 0.004                                   # a launch costs the CPU 4 us
        start = max(self.cpu, self.free)
        self.free = start + self.duration(start, ms, busy)
        return self.free

    def duration(self, start, ms, busy):
        return ms

    def sleep(self, seconds):
        """time.sleep on the CPU: the simulated clock moves on."""
        self.cpu += seconds * 1e3

    def torch(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.enqueue(0.0)

            def query(self):
                return self.t <= gpu.cpu

            def synchronize(self):
                gpu.cpu = max(gpu.cpu, self.t)

            def elapsed_time(self, end):
                return end.t - self.t

        class Cuda:
            @staticmethod
            def device(dev):
                import contextlib
                return contextlib.nullcontext()

            @staticmethod
            def _sleep(cycles):
                gpu.spins += 1
                gpu.enqueue(cycles / 1e6, busy=False)

        Cuda.Event = Event
        return type("FakeTorch", (), {"cuda": Cuda})

    def _flush_op(self, method: str, kind: str):
        """A stand-in for the flush buffer whose `method` (zero_ or amax) queues 30 us and records `kind`."""
        gpu = self

        def op(buf):
            gpu.flushes.append(kind)
            gpu.enqueue(0.03)
        return type("Flush", (), {method: op})()

    def flush_buffer(self):
        return self._flush_op("zero_", "write")

    def flush_words(self):
        return self._flush_op("amax", "read")

    def call(self, python_ms, kernel_ms, waits=False, first_python_ms=None):
        state = {"first": True}

        def run():
            self.cpu += first_python_ms if state["first"] and first_python_ms is not None else python_ms
            state["first"] = False
            self.enqueue(kernel_ms)
            if waits:                                       # e.g. .item(): the CPU waits for the stream
                self.cpu = max(self.cpu, self.free)
        return run


def _simulated_clock(gpu, spin=True, batch_gpu_ms=0.0, duty=1.0):
    from kernellab.run.measure.bench import CudaClock

    clock = object.__new__(CudaClock)   # what __init__ would set up on a real device
    clock.torch, clock.dev, clock.device = gpu.torch(), None, "simulated"
    clock.l2_bytes, clock.flush_bytes, clock._flush_buffer = 2**20, 2**21, gpu.flush_buffer()
    clock.flush_kind, clock._flush_words = "write", gpu.flush_words()
    clock._init_state(True, batch_gpu_ms, duty)
    clock._cycles_per_ms = 1e6 if spin else None            # spin=False: a torch without _sleep
    return clock


def test_the_spin_keeps_launch_overhead_out(monkeypatch):
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu)
    call = gpu.call(python_ms=0.2, kernel_ms=0.002)         # 200 us of Python before a 2 us kernel
    clock.time_calls([call] * 3)                            # the first batch learns the CPU's pace
    times = clock.time_calls([call] * 500)
    assert max(times) == pytest.approx(0.002)               # the kernel alone: no Python, no launch
    assert clock._cpu_ms_per_call == pytest.approx(0.2 + 4 * 0.004)
    assert "launch overhead stays out" in clock.describe()


def test_without_the_spin_python_time_leaks_into_the_events(monkeypatch):
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu, spin=False)
    times = clock.time_calls([gpu.call(python_ms=0.2, kernel_ms=0.002)] * 50)
    assert min(times) > 0.15              # what a plain event timer reports: most of the Python time
    assert "launch overhead may be included" in clock.describe()


def test_calls_that_wait_for_the_gpu_are_not_spun_for(monkeypatch):
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu)
    waiting = gpu.call(python_ms=0.01, kernel_ms=0.5, waits=True)
    clock.time_calls([waiting] * 3)
    assert id(waiting) not in clock._waiting                # one late batch may be a one-off
    clock.time_calls([waiting] * 3)
    assert id(waiting) in clock._waiting                    # two in a row: it waits for the GPU itself
    before = gpu.cpu
    times = clock.time_calls([waiting] * 200)
    assert gpu.cpu - before < 200 * 0.6                     # no 5-20 ms spin per batch any more
    assert min(times) == pytest.approx(0.5 + 0.004, abs=0.01)
    assert "except for calls that wait" in clock.describe()


def test_a_one_off_slow_call_keeps_the_spin(monkeypatch):
    """A first call slow once on the CPU (a module loading) must not take the spin away for the whole run: that
    made the first bench of every process time back-to-back calls (an H200 matmul 16 % slow)."""
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu)
    call = gpu.call(python_ms=0.2, kernel_ms=0.002, first_python_ms=8.0)   # 8 ms > the 5 ms spin, once
    clock.time_calls([call] * 3)
    times = clock.time_calls([call] * 200)
    assert id(call) not in clock._waiting
    assert max(times) == pytest.approx(0.002)


class PoweredGPU(SimulatedGPU):
    """A GPU with a power cap: a kernel runs 15 % slower when the GPU was busy (spins do not count) more than 60 %
    of the last 50 ms, as an H200 does under back-to-back bf16 matmuls."""

    def __init__(self):
        super().__init__()
        self.busy = []          # (start, end) of kernels

    def duration(self, start, ms, busy):
        if not busy:
            return ms
        window = sum(max(0.0, min(e, start) - max(s, start - 50.0)) for s, e in self.busy[-200:])
        if window > 0.6 * 50.0:
            ms *= 1.15
        self.busy.append((start, start + ms))
        return ms


@pytest.mark.parametrize("batch_gpu_ms, duty, capped", [(0.0, 1.0, True), (5.0, 0.5, False)])
def test_batches_and_idle_time_keep_the_gpu_below_its_power_cap(monkeypatch, batch_gpu_ms, duty, capped):
    from kernellab.run.measure import bench as bench_mod

    gpu = PoweredGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    monkeypatch.setattr(bench_mod.time, "sleep", gpu.sleep)
    clock = _simulated_clock(gpu, batch_gpu_ms=batch_gpu_ms, duty=duty)
    matmul = gpu.call(python_ms=0.03, kernel_ms=1.4)
    clock.time_calls([matmul] * 3)
    spins = gpu.spins
    times = clock.time_calls([matmul] * 60)
    if capped:      # batches as long as the CPU can queue: the power cap is reached within the run
        assert max(times) == pytest.approx(1.4 * 1.15)
        assert gpu.spins - spins == 1
    else:           # 3 calls (4.2 ms) per batch, each behind a 5 ms spin: every call at full speed
        assert max(times) == pytest.approx(1.4)
        assert gpu.spins - spins == 20
        assert "busy at most 50 %" in clock.describe()


def test_idle_time_is_added_where_the_spin_is_too_short_for_the_duty(monkeypatch):
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    slept = []
    monkeypatch.setattr(bench_mod.time, "sleep", lambda s: (slept.append(s * 1e3), gpu.sleep(s)))
    clock = _simulated_clock(gpu, batch_gpu_ms=5.0, duty=0.25)
    call = gpu.call(python_ms=0.03, kernel_ms=4.0)          # one call per batch: 4 ms busy, 12 ms idle wanted
    clock.time_calls([call] * 4)
    assert slept and all(ms == pytest.approx(4.0 * 3 - 5.0) for ms in slept)   # the 5 ms spin counts as idle


# --- kernels do not wait for themselves while bench times them ------------------------------------------------------


def test_launches_wait_for_their_kernel_except_while_bench_times_them():
    """A kernellab launch synchronizes by default (a fault is reported at its line), but inside bench's timing that
    would add launch overhead to every repetition: a vector add once measured 0.6x of torch.add on an H200."""
    from kernellab.run.launch.launch import deferred_sync, resolve_sync

    assert resolve_sync(None) is True and resolve_sync(False) is False
    with deferred_sync():
        assert resolve_sync(None) is False and resolve_sync(True) is True
    assert resolve_sync(None) is True

    seen = []

    def fn(x):
        seen.append(resolve_sync(None))
        return x.clone()

    bench(fn, const_inputs(1.0), timer=FakeClock(ms_from_tensor), verify=False)   # (verify's untimed calls wait)
    assert seen[0] is True                  # the first call waits: a fault is caught there, with its line
    assert len(seen) > 20 and not any(seen[1:])
    assert resolve_sync(None) is True       # and the default is back after the bench


def test_a_fault_in_a_later_repetition_is_named_not_a_bare_cuda_error():
    from kernellab.errors import LaunchError

    class FaultingClock(FakeClock):
        def time_calls(self, calls):
            if len(self.batches) == 2:
                raise RuntimeError("CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)")
            return super().time_calls(calls)

    with pytest.raises(LaunchError) as info:
        bench(lambda x: x.clone(), const_inputs(1.0), timer=FaultingClock(ms_from_tensor), name="scatter")
    assert info.value.sticky and "cudaErrorIllegalAddress" in info.value.cuda_error
    assert "while bench timed scatter" in str(info.value) and "first call of each ran clean" in str(info.value)


def test_other_errors_in_the_timed_calls_pass_through():
    class Broken(FakeClock):
        def time_calls(self, calls):
            raise ValueError("not a CUDA fault")

    with pytest.raises(ValueError, match="not a CUDA fault"):
        bench(lambda x: x.clone(), const_inputs(1.0), timer=Broken(ms_from_tensor))


def test_validate_table_shows_triton_s_own_spread():
    """The reference harness's run-to-run spread goes beside kernellab's: a ~15 % spread in triton's matmul medians
    is why one figure cannot agree with triton and ncu at once."""
    row = {"workload": "matmul", "kernellab_median_ms": 1.381, "spread_pct": 0.04, "triton_median_ms": 1.509,
           "triton_spread_pct": 13.8, "ncu_median_ms": 1.383, "vs_triton_pct": -8.5, "vs_ncu_pct": -0.11,
           "pass": False}
    lines = _validate_module().table([row]).splitlines()
    assert lines[0].split("|")[5].strip() == "triton's spread"
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells == ["matmul", "1.381 ms", "0.04 %", "1.509 ms", "13.8 %", "1.383 ms", "-8.5 %", "-0.11 %", "NO"]
    assert len(lines[1].split("|")) == len(lines[0].split("|"))


def test_sleep_calibration_waits_for_the_clock_to_ramp_up(monkeypatch):
    """A GPU idling at 345 MHz that reaches 2 GHz after 5 ms of work: calibrated at the idle clock, every spin would
    be ~6x shorter than intended and the CPU would fall behind the GPU."""
    from kernellab.run.measure import bench as bench_mod

    class RampGPU(SimulatedGPU):
        def duration(self, start, ms, busy):
            if busy:
                return ms
            cycles = ms * 1e6                       # SimulatedGPU queues a spin of n cycles as n / 1e6 ms
            return cycles / (0.345e6 if start < 5.0 else 2.0e6)

    gpu = RampGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu)
    assert clock._calibrate_sleep() == pytest.approx(2.0e6, rel=0.01)


def test_flush_l2_takes_write_clean_or_none_and_names_the_others():
    from kernellab.run.measure.bench import BenchError, flush_kind

    assert [flush_kind(v) for v in (True, "write", "clean", False, None, "none")] == \
        ["write", "write", "clean", "none", "none", "none"]
    for bad in ("dirty", "read", 2.5, ["clean"]):
        with pytest.raises(BenchError, match='"clean"'):
            flush_kind(bad)
    with pytest.raises(BenchError, match="flush_l2='invalidate'"):     # refused before anything runs
        bench(lambda: None, (), flush_l2="invalidate", timer=FakeClock(lambda r: 1.0))


def test_a_clean_flush_reads_the_buffer_before_every_call(monkeypatch):
    """flush_l2="clean": each repetition is preceded by a read of the flush buffer (amax), never a write, and the
    method line says so; the default writes it."""
    from kernellab.run.measure import bench as bench_mod

    gpu = SimulatedGPU()
    monkeypatch.setattr(bench_mod.time, "perf_counter", lambda: gpu.cpu / 1e3)
    clock = _simulated_clock(gpu)
    call = gpu.call(python_ms=0.01, kernel_ms=0.002)
    clock.time_calls([call] * 4)
    assert gpu.flushes == ["write"] * 4 and "flushed by writing" in clock.describe()
    gpu.flushes.clear()
    clock.flush_kind = "clean"
    clock.time_calls([call] * 5)
    assert gpu.flushes == ["read"] * 5
    assert "flushed by reading" in clock.describe() and "clean lines" in clock.describe()


def test_results_say_which_flush_timed_them():
    r = bench(lambda: 2.0, (), timer=FakeClock(lambda ms: ms), rep_ms=1, warmup_ms=0)
    assert r.l2_flush == "write" and r.to_json()["l2_flush"] == "write"     # a clock that does not say: it wrote

    class CleanClock(FakeClock):
        flush_kind = "clean"
    r = bench(lambda: 2.0, (), timer=CleanClock(lambda ms: ms), rep_ms=1, warmup_ms=0)
    assert r.l2_flush == "clean" and r.to_json()["l2_flush"] == "clean"

    class NoFlush(FakeClock):
        flush_bytes = 0
    assert bench(lambda: 2.0, (), timer=NoFlush(lambda ms: ms), rep_ms=1, warmup_ms=0).l2_flush == "none"
