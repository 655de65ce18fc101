"""The attention grid's paired timing without a GPU (benchmarks/attention.py time_paired, paired_gap, grid_verdict): at
each shape the entry point and the step it chose (the same kernel) are timed again in both orders, entry, step, step,
entry, and the verdict calls a gap inside the spread of the repeated measurements of the same kernel noise (or order),
a gap beyond it and beyond 3 % a loss. Fake timers stand in for the GPU: one by position in the sequence, and a fake
clock under kernellab.bench itself."""
import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attention_steps import attention_benchmark  # noqa: E402

LABEL = "B*H=16 N=128 d=64 full"


@pytest.fixture(scope="module")
def grid():
    return attention_benchmark()


def position_timer(ms_at, log=None):
    """timer(sequence) -> ms_at(name, k) at each position, k = 0 at a name's first position and 1 at its second."""
    def timer(sequence):
        if log is not None:
            log.append(list(sequence))
        return [ms_at(n, sequence[:i].count(n)) for i, n in enumerate(sequence)]
    return timer


def grid_row(entry_ms, steps_ms, paired=None, choice="fa3p_bm64", label=LABEL):
    """A grid row as run_grid makes it: main kernellab.bench times (ms) and, where given, the paired timing."""
    bench = {"entry": entry_ms, **steps_ms, "FLASH": 0.02, "CUDNN": 0.02}
    r = dict(B=1, H=16, N=128, d=64, causal=False, label=label, choice=choice,
             ms={"kernellab.bench": bench, "do_bench": dict(bench), "sustained": dict(bench)})
    if paired is not None:
        r["paired"] = paired
    return r


def test_the_pair_is_timed_entry_step_step_entry_in_one_call(grid):
    log = []
    paired = grid.time_paired(position_timer(lambda n, k: {"entry": 8.0, "fa3p_bm64": 7.5}[n] + k, log),
                              ["entry", "fa3p_bm64"])
    assert log == [["entry", "fa3p_bm64", "fa3p_bm64", "entry"]]
    assert paired["orders"] == [["entry", "fa3p_bm64"], ["fa3p_bm64", "entry"]]
    assert paired["ms"] == {"entry": [8.0, 9.0], "fa3p_bm64": [7.5, 8.5]}   # each name's first, then second timing
    three = []
    grid.time_paired(position_timer(lambda n, k: 1.0, three), ["entry", "fa3", "fa2"])
    assert three == [["entry", "fa3", "fa2", "fa2", "fa3", "entry"]]
    assert grid.position_labels(three[0]) == ["entry", "fa3", "fa2", "fa2 again", "fa3 again", "entry again"]
    with pytest.raises(ValueError, match="gave 3 times for the 4 positions"):
        grid.time_paired(lambda seq: [1.0, 1.0, 1.0], ["entry", "fa3"])


def test_an_entry_slower_only_on_its_first_timing_is_order_not_a_loss(grid):
    """The H200 quick grid's case: the entry point's call of the step it chose, the same kernel, 5 % slower where it
    ran first (its first timing), as fast as the step where it ran after it. The main timing (entry first) counts it a
    loss; the pair finds the gap (2.5 %, the geometric mean over the orders) inside the entry point's own spread
    (5 %, its two timings of the same kernel) and calls it order."""
    paired = grid.time_paired(position_timer(lambda n, k: 7.875e-3 if (n, k) == ("entry", 0) else 7.5e-3),
                              ["entry", "fa3p_bm64"])
    g = grid.paired_gap(paired, "fa3p_bm64")
    assert g["finding"] == "order"
    assert g["gap"] == pytest.approx(math.sqrt(1.05) - 1) and g["spread"] == pytest.approx(0.05)
    assert g["entry_first"] == [True, False] and g["ratios"] == pytest.approx([1.05, 1.0])
    words = grid.paired_words(g)
    assert words.startswith("entry +2.5% over fa3p_bm64 (spread 5.0%; entry / step by order 1.050 / 1.000): order")
    assert "slower only with the entry point timed first" in words

    row = grid_row(7.875e-3, {"fa3p_bm64": 7.5e-3, "fa2": 8.3e-3}, paired)
    lines, lost = grid.grid_verdict([row], [])
    assert lost == 0, lines
    assert lines[0].endswith(f"by more than 3%: 1 shape(s): {LABEL} [kernellab.bench] (fa3p_bm64 7.9 µs, "
                             "fa3p_bm64 7.5 µs)"), lines[0]
    paired_head = next(x for x in lines if x.startswith("entry point against its own steps, paired"))
    assert paired_head.endswith("0 loss(es) of 1 shape(s) paired"), paired_head
    assert any(x.startswith("  order (") and f": 1 shape(s): {LABEL}: entry +2.5% over fa3p_bm64" in x for x in lines)
    assert (f"  of the main timing's 1 loss(es) past 3%, the paired timing found 0 a loss and 1 not: {LABEL} order"
            in lines), lines
    # the same main timing without a pair is still judged by it: a loss
    assert grid.grid_verdict([grid_row(7.875e-3, {"fa3p_bm64": 7.5e-3})], [])[1] == 1


def test_an_entry_consistently_slower_is_a_loss(grid, capsys):
    """5 % slower in both orders, each kernel's two timings within 0.2 %: a gap beyond the spread and beyond 3 %."""
    paired = grid.time_paired(position_timer(lambda n, k: 7.875e-3 if n == "entry" else 7.5e-3 * (1 + 0.002 * k)),
                              ["entry", "fa3p_bm64"])
    g = grid.paired_gap(paired, "fa3p_bm64")
    assert g["finding"] == "loss" and g["gap"] == pytest.approx(0.049, abs=1e-3)
    assert g["spread"] == pytest.approx(0.002)
    lines, lost = grid.grid_verdict([grid_row(7.875e-3, {"fa3p_bm64": 7.5e-3}, paired)], [])
    assert lost == 1
    head = next(x for x in lines if x.startswith("entry point against its own steps, paired"))
    assert head.split("): ", 1)[1].startswith(f"1 loss(es) of 1 shape(s) paired: {LABEL}: entry +4.9% over "
                                              "fa3p_bm64 (spread 0.2%"), head
    assert "LOSS (beyond the spread and the tolerance)" in head
    assert "paired timing found 1 a loss and 0 not" in lines[lines.index(head) + 5]
    grid.print_grid_row(grid_row(7.875e-3, {"fa3p_bm64": 7.5e-3}, paired))
    assert "+4.9% ±0.2% loss (fa3p_bm64)" in capsys.readouterr().out


@pytest.mark.parametrize("entry, step, finding", [
    ((1.04, 1.01), (1.00, 1.00), "noise"),              # slower in both orders, by less than its own spread (3 %)
    ((1.00, 1.06), (1.00, 1.00), "order"),              # slower only where it ran second
    ((1.02, 1.02), (1.00, 1.00), "within tolerance"),   # beyond a spread of 0, not beyond 3 %
    ((1.00, 0.99), (1.00, 1.00), "faster"),
    ((1.10, 1.03), (1.00, 1.00), "noise"),              # 6.4 %, past 3 % but inside its 6.8 % spread
    ((1.08, 1.06), (1.00, 1.01), "loss"),               # 6.5 % beyond a 1.9 % spread
])
def test_each_finding(grid, entry, step, finding):
    paired = {"method": "kernellab.bench", "orders": [["entry", "fa3"], ["fa3", "entry"]],
              "ms": {"entry": list(entry), "fa3": list(step)}}
    g = grid.paired_gap(paired, "fa3")
    gap = math.sqrt(entry[0] / step[0] * entry[1] / step[1]) - 1
    spread = max(max(entry) / min(entry), max(step) / min(step)) - 1
    assert g["gap"] == pytest.approx(gap) and g["spread"] == pytest.approx(spread)
    assert g["finding"] == finding
    if finding == "order":
        assert "slower only with the entry point timed second" in grid.paired_words(g)


def test_the_pair_is_the_entry_its_choice_and_a_faster_other_step(grid):
    bench = {"entry": 8.0, "fa2": 8.3, "fa3p_bm64": 7.6, "fa3": 9.0, "FLASH": 7.0, "CUDNN": 6.0}
    assert grid.paired_names(bench, "fa3p_bm64") == ["entry", "fa3p_bm64"]      # SDPA is never a step
    assert grid.paired_names(dict(bench, fa3=7.9), "fa3p_bm64") == ["entry", "fa3p_bm64", "fa3"]
    assert grid.paired_names(dict(bench, fa3=8.0), "fa3p_bm64") == ["entry", "fa3p_bm64"]   # a tie did not lead
    assert grid.paired_names({k: v for k, v in bench.items() if k != "fa3p_bm64"}, "fa3p_bm64") == []
    assert grid.paired_names({"fa3p_bm64": 7.6}, "fa3p_bm64") == []


def test_a_plan_that_chose_a_slower_step_is_judged_against_that_step_on_the_pair(grid):
    """The pair holds the fastest other step where it led: the entry point (its choice fa3) against fa3p, 12 % slower
    in both orders, is a loss; the gap against its own step (noise) is not the one judged."""
    times = {"entry": (84.0, 83.0), "fa3": (83.0, 84.0), "fa3p": (75.0, 74.8)}
    paired = grid.time_paired(position_timer(lambda n, k: times[n][k] / 1e3), ["entry", "fa3", "fa3p"])
    g = grid.paired_judgement(grid_row(83.9e-3, {"fa3": 83.8e-3, "fa3p": 74.7e-3}, paired, choice="fa3"))
    assert g["step"] == "fa3p" and g["finding"] == "loss" and g["gap"] == pytest.approx(0.114, abs=1e-3)
    assert grid.paired_gap(paired, "fa3")["finding"] in ("noise", "order", "faster")


def test_a_failed_pair_falls_back_on_the_main_timing_and_says_so(grid, capsys):
    ok = grid.time_paired(position_timer(lambda n, k: 1e-2), ["entry", "fa2"])
    rows = [grid_row(1e-2, {"fa2": 1e-2}, ok, choice="fa2", label="a"),
            dict(grid_row(1.05e-2, {"fa2": 1e-2}, choice="fa2", label="b"), paired_error="RuntimeError: boom")]
    lines, lost = grid.grid_verdict(rows, [])
    assert lost == 1                                          # b: 5 % by the main timing, unpaired
    assert any(x.startswith("  not paired: 1 shape(s), judged by the main timing alone (1 loss(es) there): b "
                            "(paired timing failed: RuntimeError: boom)") for x in lines), lines
    assert any(x == "  as fast as its step or faster: 1 shape(s)" for x in lines), lines
    for r in rows:
        grid.print_grid_row(r)
    out = capsys.readouterr().out.splitlines()
    assert "+0.0% ±0.0% faster (fa2)" in out[0] and " failed | " in out[1]
    assert "paired: entry vs step, spread" in grid.GRID_HEAD and "both orders" in grid.GRID_LEGEND


class KernelClock:
    """A fake CUDA clock for kernellab.bench: each call returns a tensor naming its function (0: the entry point, 1:
    its step); a batch takes that function's ms a call, `switch` more where the batch before it was the other
    function's. Records the function of every batch."""

    device = "NVIDIA H200"
    flush_bytes = 2 * 2**20
    l2_bytes = 2**20

    def __init__(self, ms, switch=0.0):
        self.ms, self.switch, self.batches = ms, switch, []

    def check_measurable(self, name, returned, args):
        pass

    def time_calls(self, calls):
        who = [int(call()[0]) for call in calls]
        extra = self.switch if self.batches and self.batches[-1] != who[0] else 0.0
        self.batches.append(who[0])
        return [self.ms[w] * (1 + extra) for w in who]

    def graph(self, calls):
        raise AssertionError("the pair does not use CUDA graphs")

    def describe(self):
        return "fake kernel clock"


def kernel_fns():
    return {"entry": lambda x: torch.zeros(1) + 0 * x[:1], "fa3p": lambda x: torch.ones(1) + 0 * x[:1]}


def test_the_pair_through_kernellab_bench_runs_entry_step_step_entry_every_round(grid):
    """bench_timer on a fake clock: one kernellab.bench call whose rounds repeat entry, step, step, entry; the entry
    point 5 % slower in every call is a loss."""
    clock = KernelClock({0: 1.05, 1: 1.0})
    timer = grid.bench_timer(kernel_fns(), lambda g: (torch.zeros(4),), generator_device="cpu", clock=clock)
    paired = grid.time_paired(timer, ["entry", "fa3p"])
    assert paired["ms"] == {"entry": [1.05, 1.05], "fa3p": [1.0, 1.0]}
    rounds = grid.PAIR_OPTIONS["rounds"]
    assert clock.batches[-4 * rounds:] == [0, 1, 1, 0] * rounds          # the timed rounds, after the warm-ups
    assert grid.paired_gap(paired, "fa3p")["finding"] == "loss"


def test_a_penalty_for_following_the_other_function_cancels_over_the_two_orders(grid):
    """The same kernel behind two launch paths, 5 % slower in any batch that follows the other function's (the kind of
    order effect a fixed order turns into a gap): in entry, step, step, entry each side follows the other once, so the
    gap is nil, inside a 5 % spread: never a loss."""
    clock = KernelClock({0: 1.0, 1: 1.0}, switch=0.05)
    timer = grid.bench_timer(kernel_fns(), lambda g: (torch.zeros(4),), generator_device="cpu", clock=clock)
    g = grid.paired_gap(grid.time_paired(timer, ["entry", "fa3p"]), "fa3p")
    assert g["gap"] == pytest.approx(0.0, abs=1e-12) and g["spread"] == pytest.approx(0.05)
    assert g["finding"] != "loss"


def test_the_pair_costs_the_quick_grid_seconds_not_minutes(grid):
    """grid_seconds counts the pair (one kernellab.bench call of four positions a shape): on the quick grid's 32
    shapes more than their 32 call overheads, less than 30 s, the whole still inside the suite's budget
    (test_attention_dispatch holds the bounds)."""
    quick = grid.grid_shapes(True)
    extra = grid.grid_seconds(quick) - grid.grid_seconds(quick, paired=False)
    assert 32 * grid.PAIR_BENCH_OVERHEAD_S < extra < 30
