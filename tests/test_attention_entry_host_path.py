"""The host path of tutorial 07's attention entry point (`attention`, the `kl::attention` op) on the CPU: the notebook's
launcher cell with its kernels compiled (step 2 for sm_90, steps 3 and 3b for sm_90a) and launched through the stand-in
driver of benchmarks/launch_overhead.py (--entry), planned as on an H200, tensor maps stood in. Structural checks, no
timings: a warm call takes its ready call and launches, planning and configuring nothing, with the Python calls the
step's own launch makes plus the entry point's two; launch_overhead.py --entry prints the times."""
import collections

import host_path
import pytest
from host_path import launch_overhead_module

from kernellab.kernel import Kernel

torch = pytest.importorskip("torch")

NB = "07-fused-attention.py:launchers"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/launch_overhead.py as a module (its stand-in driver), kernellab's stream lookups restored after."""
    yield from launch_overhead_module("launch_overhead_entry")


@pytest.fixture(scope="module")
def entry(bench):
    s = bench.entry_setup()
    try:
        yield s
    finally:
        s.restore()


def frames(fn) -> collections.Counter:
    """(file, function) -> Python calls a call of fn() makes in kernellab, the tutorial's cells and the stand-in map."""
    calls = host_path.python_calls(fn, "07-fused-attention.py")
    return collections.Counter({(f, name): n for (origin, f, name), n in calls.items()
                                if origin in ("kernellab", "tutorial") or name == "tensor_map"})


@pytest.mark.parametrize("shape,kernel,maps", [((1, 16, 128, 64, True), "fa3p_bm64", 3),
                                               ((1, 16, 128, 128, False), "fa3", 3),
                                               ((16, 16, 128, 64, False), "fa2", 0)])
def test_a_warm_entry_call_is_its_steps_launch_and_two_calls(bench, entry, shape, kernel, maps, monkeypatch):
    kernel_chosen, cases = bench.entry_named_cases(entry, shape)
    assert kernel_chosen == kernel                      # the H200's plan at these shapes (attention_plan_h200.json)
    named = dict(cases)
    step, ours = named["the step's own call (its launch configured once)"], named["attention(q, k, v, causal=causal)"]
    configured = []
    real_getitem = Kernel.__getitem__
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, c: configured.append(c) or real_getitem(self, c))
    theirs, mine = frames(step), frames(ours)
    assert configured == []                             # no kernel configured on a warm call
    extra = mine - theirs
    listing = "\n".join(f"{v} {k}" for k, v in sorted(mine.items()))
    assert extra == collections.Counter({(NB, "attention"): 1, (NB, "call"): 1}), listing
    assert not theirs - mine, listing                   # the same launch: nothing the step's own call does is left out
    assert mine["launch_overhead.py", "tensor_map"] == maps                 # the stand-in's maps: one per tensor
    assert sum(n for (f, name), n in mine.items() if f.startswith("<kernellab launch") and name == "launch") == 1
    assert not any(name in ("attention_plan", "_attention_call", "plan_attention", "run", "marshal_args")
                   for _, name in mine), listing


def test_the_benchmark_compares_the_entry_point_with_the_step_it_picks(bench, entry):
    """--entry's cases at one shape launch the plan's kernel: the ready call's plan is the entry point's plan, and
    ENTRY_BEFORE (the old entry point) chose the same."""
    shape = (1, 16, 512, 64, False)
    kernel, cases = bench.entry_named_cases(entry, shape)
    q = torch.zeros(*shape[:4], dtype=torch.bfloat16)
    calls = entry.ns["_attention_calls"]
    ready = calls[q.shape, q.dtype, q.device, False, None, None]
    assert ready.plan == entry.ns["attention_plan"](q, False) and ready.plan.kernel == kernel
    assert calls[q.shape, q.dtype, q.device, False, kernel, None].plan.entry == ready.plan.entry
    names = [n for n, _ in cases]
    assert names[:3] == ["the step's own call (its launch configured once)", "attention(q, k, v, causal=causal)",
                         "attention, before (ENTRY_BEFORE)"] and len(names) == 7


def test_the_op_takes_the_ready_call_and_plans_a_new_shape_once(entry, monkeypatch):
    """kl::attention as a model calls it: a shape's first call goes through attention() (planned once, the plan's
    kernel launched); a warm call looks the ready call up itself (no attention() frame) and launches the same."""
    ns = entry.ns
    planned = []
    real = ns["attention_plan"]
    monkeypatch.setitem(ns, "attention_plan", lambda q, causal=False, kernel=None: planned.append(q.shape) or real(
        q, causal, kernel))
    q, k, v = (torch.randn(2, 8, 192, 64).to(torch.bfloat16) for _ in range(3))     # a shape no other test takes
    key = (q.shape, q.dtype, q.device, True, None, None)
    assert key not in ns["_attention_calls"]
    for _ in range(12):                                 # past the op's first checked calls (kernellab.ops)
        out = entry.op(q, k, v, True)
    assert planned == [q.shape] and out.shape == q.shape and out.dtype == q.dtype
    assert ns["_attention_calls"][key].plan == real(q, True)
    mine = frames(lambda: entry.op(q, k, v, True))
    listing = "\n".join(f"{v} {k}" for k, v in sorted(mine.items()))
    assert mine[NB, "kl_attention"] == 1 and mine[NB, "call"] == 1 and (NB, "attention") not in mine, listing
    assert mine["launch_overhead.py", "tensor_map"] == (0 if ns["_attention_calls"][key].plan.family == "fa2" else 3)
    assert planned == [q.shape]
