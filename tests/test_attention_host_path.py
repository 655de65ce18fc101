"""The host path of tutorial 08's attention op as a training step calls it (kl_flash_attention's forward, recording
the graph, then backward through autograd), on the CPU: the tutorial's real ops and launchers, its kernels compiled
(step 2 for sm_90, step 3 for sm_90a, tutorial 07's forward for sm_90) and launched through the stand-in driver of
benchmarks/launch_overhead.py (--attention), the backward on step 3 as on an H100, tensor maps stood in (CPU memory
has none). Structural checks, no timings: which Python calls a forward and backward make, that the per-shape tables
hold the configured kernels and the chosen backward. launch_overhead.py --attention prints the times.
"""
import collections

import host_path
import pytest
from host_path import launch_overhead_module

from kernellab.kernel import Kernel, Module

torch = pytest.importorskip("torch")

NB = "08-attention-backward.py:launchers"
# Python calls a forward + backward of kl_flash_attention makes in kernellab, the tutorial's cells and kernellab's
# generated code (torch's own Python and the stand-in tensor map left out): 22, each named in KERNELLAB_CALLS; 42
# before the backward's per-shape tables (step 3's kernels named and configured per call, the variant and the GPU's
# capability decided per call through attention_backward and hopper_backward_applies, generator checks).
KERNELLAB_CALLS_BUDGET = 22
KERNELLAB_CALLS = {           # (file, function) -> calls a forward + backward; "<launch>": kernellab's generated launch
    ("<launch>", "launch"): 4, ("kernel.py", "__call__"): 4,          # the forward; the preprocessing, step 3, dQ
    ("<op call>", "call"): 2, ("ops.py", "__call__"): 2, ("ops.py", "_impl"): 1,
    ("ops.py", "forward"): 1, ("ops.py", "backward"): 1,
    (NB, "kl_flash_attention"): 1, (NB, "kl_flash_attention_lse"): 1, (NB, "attention_forward"): 1,
    (NB, "_save_for_backward"): 1, (NB, "_flash_attention_backward"): 1, (NB, "kl_attention_backward"): 1,
    (NB, "attention_backward_hopper"): 1,
}


@pytest.fixture(scope="module")
def bench():
    """benchmarks/launch_overhead.py as a module (its stand-in driver), kernellab's stream lookups restored after."""
    yield from launch_overhead_module("launch_overhead_attention")


@pytest.fixture(scope="module")
def attn(bench):
    """launch_overhead.attention_op_setup(): q, k, v [1, 12, 128, 64] bf16 requiring grad, do; the op warmed up."""
    s = bench.attention_op_setup()
    try:
        yield s
    finally:
        s.restore()


def python_calls(fn, repeat: int = 4) -> collections.Counter:
    """(origin, file tail, function) -> Python calls per call of fn() (tests/host_path.py)."""
    return host_path.python_calls(fn, "08-attention-backward.py", repeat)


def _by_function(calls) -> collections.Counter:
    out = collections.Counter()
    for (origin, f, name), v in calls.items():
        if origin in ("kernellab", "tutorial"):
            f = "<launch>" if f.startswith("<kernellab launch") else "<op call>" if f.startswith(
                "<kernellab op call") else f
            out[f, name] += v
    return out


def test_a_training_steps_attention_forward_and_backward_make_the_pinned_python_calls(attn):
    calls = python_calls(attn.ours)
    ours = _by_function(calls)
    listing = "\n".join(f"{v} {k}" for k, v in sorted(ours.items()))
    assert sum(ours.values()) <= KERNELLAB_CALLS_BUDGET, listing
    assert ours == collections.Counter(KERNELLAB_CALLS), listing       # which frames, not only how many
    # the backward takes step 3 (the stand-in device is an H100), straight from the op's launcher: no dispatch by
    # attention_backward, no capability question, no per-call naming (Module lookups) or configuring
    assert not any(name in ("attention_backward", "hopper_backward_applies", "hbwd_smem_bytes", "<genexpr>",
                            "<listcomp>", "__getitem__", "_find") for origin, _, name in calls
                   if origin in ("kernellab", "tutorial")), sorted(calls)
    # four launches, each by its generated launch, none by LaunchPath.run; four tensor maps (the stand-in's)
    assert not any(name in ("run", "marshal_args", "plan", "fast") for _, f, name in calls if f == "launch.py")
    # step 3b (BWD_OP_HOPPER_ROWS, the op's backward since an H200 timed it) maps its LSE / Dv rows too
    assert calls["other", "launch_overhead.py", "tensor_map"] == 4 + attn.ns["BWD_OP_HOPPER_ROWS"]
    assert not any(f in ("_ops.py",) for _, f, _ in calls), sorted(calls)     # no OpOverload: the eager door


def test_the_backward_is_chosen_and_configured_once_per_shape(attn, monkeypatch):
    """A warm call takes step 3's configured kernels from _HBWD_LAUNCHES and its launcher from _OP_BACKWARD: no
    kernel named or configured, no capability lookup; a new shape configures (and chooses) again, once."""
    ns = attn.ns
    found, configured, asked = [], [], []
    real_find, real_getitem = Module._find, Kernel.__getitem__
    monkeypatch.setattr(Module, "_find", lambda self, name: found.append(name) or real_find(self, name))
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, c: configured.append(c) or real_getitem(self, c))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: asked.append(index) or (9, 0))
    for _ in range(3):
        attn.ours()
    assert found == [] and configured == [] and asked == []
    q = attn.q
    key = (q.get_device(), q.dtype, q.shape, attn.causal)
    rows = ns["BWD_OP_HOPPER_ROWS"]                  # step 3b where on: step 3's launcher with rows=True
    table = ns["_HBWD_ROWS_LAUNCHES" if rows else "_HBWD_LAUNCHES"]

    def is_op_launcher(run):
        return (run.func is ns["attention_backward_hopper"] and run.keywords == {"rows": True}) if rows else \
            run is ns["attention_backward_hopper"]

    assert is_op_launcher(ns["_OP_BACKWARD"][key])
    hit = table[q.dtype, *q.shape, attn.causal]
    assert hit[0] is ns["attn_bwd_h"] and hit[1] is ns["attn_bwd"] and hit[-2] == q.shape[0] * q.shape[1] * q.shape[2]
    # a second shape: chosen and configured on its first call only (3 kernels), the first shape's entries kept
    q2, k2, v2 = (torch.randn(1, 12, 64, 64).to(torch.bfloat16).requires_grad_(True) for _ in range(3))
    for _ in range(2):
        ns["kl_flash_attention"](q2, k2, v2, attn.causal).backward(torch.ones(1, 12, 64, 64, dtype=torch.bfloat16))
    assert len([c for c in configured if c[1] == ns["HBWD_THREADS"]]) == 1 and len(configured) == 4   # + forward
    assert is_op_launcher(ns["_OP_BACKWARD"][q2.get_device(), q2.dtype, q2.shape, attn.causal])
    assert key in ns["_OP_BACKWARD"] and asked == []                  # the stand-in device's capability: known
    # the kernels' cell run again (a new module object): the next call configures step 3's kernels again
    monkeypatch.setitem(table, (q.dtype, *q.shape, attn.causal), (object(), *hit[1:]))
    attn.ours()
    assert len(configured) == 7 and table[q.dtype, *q.shape, attn.causal][0] is ns["attn_bwd_h"]


def test_the_scratch_buffer_holds_delta_then_the_dq_sums_at_aligned_offsets(attn, monkeypatch):
    """One fp32 allocation for Dv and dQ's sums: delta the whole buffer (Dv its first B H N values), dq_accum from
    B H N rounded up to 64 (256 bytes) to the end, so the kernels see two pointers as before: dq_accum aligned and last
    in its allocation (as when it had its own), Dv before it, no overlap."""
    ns = attn.ns
    seen = []
    key = (attn.q.dtype, *attn.q.shape, attn.causal)
    q, k, v, do = (x.detach() for x in (attn.q, attn.k, attn.v, attn.do))
    o, lse = ns["attention_forward"](q, k, v, attn.causal)
    ns["attention_backward_hopper"](q, k, v, o, lse, do, attn.causal)      # step 3's entry (the op may take 3b's)
    _, _, pre, main, convert, rows, pad = ns["_HBWD_LAUNCHES"][key]
    monkeypatch.setitem(ns["_HBWD_LAUNCHES"], key, (ns["attn_bwd_h"], ns["attn_bwd"],
                                                      lambda *a: seen.append(a), main, convert, rows, pad))
    ns["attention_backward_hopper"](q, k, v, o, lse, do, attn.causal)
    _, _, delta, dq_accum, n = seen[0]
    d = q.shape[-1]
    assert n == rows and dq_accum.dtype == delta.dtype == torch.float32
    assert delta.numel() == pad + rows * d and dq_accum.numel() == rows * d and pad >= rows and pad % 64 == 0
    storage = delta.untyped_storage()
    assert delta.data_ptr() == storage.data_ptr() and dq_accum.data_ptr() == delta.data_ptr() + 4 * pad
    assert storage.nbytes() == 4 * (pad + rows * d) and dq_accum.is_contiguous() and delta.is_contiguous()
    # step 2's atomic rungs share the layout; at 65 rows Dv takes 128 floats (the "pass" rungs: Dv alone)
    q65, lse65 = torch.zeros(1, 1, 65, 64, dtype=torch.bfloat16), torch.zeros(1, 1, 65)
    ns["attention_backward"](q65, q65, q65, q65, lse65, q65, True, "atomic_w8")
    key2 = ("atomic_w8", torch.bfloat16, 1, 1, 65, 64, True)
    entry = ns["_BWD_LAUNCHES"][key2]
    monkeypatch.setitem(ns["_BWD_LAUNCHES"], key2, (entry[0], lambda *a: seen.append(a), *entry[2:]))
    ns["attention_backward"](q65, q65, q65, q65, lse65, q65, True, "atomic_w8")
    _, _, delta, dq_accum, n = seen[1]
    assert n == 65 and delta.numel() == 128 + 65 * 64 and dq_accum.numel() == 65 * 64
    assert dq_accum.data_ptr() - delta.data_ptr() == 4 * 128 and delta.untyped_storage().nbytes() == 4 * (128 + 65 * 64)


def test_the_launchers_still_refuse_what_the_kernels_do_not_take(attn):
    """The checks moved to a shape's first call still fire there; the per-call contiguity check fires every call."""
    ns = attn.ns
    q = torch.empty(1, 1, 8, 96, dtype=torch.bfloat16)
    for f in (ns["attention_forward"], lambda *a: ns["attention_backward"](*a, q, torch.empty(1, 1, 8), q)):
        with pytest.raises(ValueError, match="d = 64 or 128"):
            f(q, q, q)
    with pytest.raises(ValueError, match="atomic_w8"):
        ns["attention_backward_hopper"](q, q, q, q, torch.empty(1, 1, 8), q)
    q, k, v, do = (x.detach() for x in (attn.q, attn.k, attn.v, attn.do))
    o, lse = ns["attention_forward"](q, k, v, attn.causal)
    strided = do.transpose(-1, -2).contiguous().transpose(-1, -2)
    for f in (ns["attention_backward_hopper"], lambda *a: ns["attention_backward"](*a, attn.causal, "atomic_w8")):
        with pytest.raises(ValueError, match="contiguous"):
            f(q, k, v, o, lse, strided)
    with pytest.raises(ValueError, match="one shape and dtype"):
        ns["attention_forward"](q, k[:, :, :64], v, attn.causal)


def test_the_benchmarks_attention_table_has_every_row(bench):
    """launch_overhead.py --attention's table (a few calls a case: the rows, not the times)."""
    cases = bench.attention_cpu_cases(28, 2, cold_calls=2, flush_bytes=1 << 20)
    assert len(cases) == 14 and all(len(cpu) == 2 and min(cpu) > 0 and cold > 0 for _, _, cpu, cold in cases)
    text = bench.attention_table(cases, "t")
    assert text.count("\n| ") == 15 and "stood in" in text and "| kl_flash_attention forward + backward" in text
