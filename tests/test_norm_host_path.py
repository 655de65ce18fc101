"""The host path of tutorial 04's kl::layernorm as a training step calls it (a forward that records the graph, then
backward through autograd), on the CPU: the tutorial's real ops and launchers, its kernels compiled for sm_90 and
launched through the stand-in driver of benchmarks/launch_overhead.py (--cpu). Structural checks, no timings: which
path each call takes, how many Python calls a forward and backward make, that the per-shape plans and the kernel
lookups are cached. benchmarks/launch_overhead.py --cpu prints the times; these tests fail where the path regresses.
"""
import collections

import host_path
import pytest
from host_path import launch_overhead_module

from kernellab.kernel import Kernel, Module

torch = pytest.importorskip("torch")

# Python calls a forward + backward of kl::layernorm makes in kernellab, the tutorial's cells and kernellab's
# generated code (torch's own Python left out): 21, each named in KERNELLAB_CALLS below; 38 before the launchers'
# per-shape tables, the inline no-wait record and the graph forward's inline Op._impl, 119 before the eager graph
# path (the dispatcher's Autograd kernel, OpOverload.redispatch), the cached plans and the indexed kernel lookups.
# More is a change to look at: a cold CPU cache pays for every frame (launch_overhead.py --context).
KERNELLAB_CALLS_BUDGET = 21
KERNELLAB_CALLS = {           # (file, function) -> calls a forward + backward; "<launch>": kernellab's generated launch
    ("<launch>", "launch"): 3, ("kernel.py", "__call__"): 3,                 # forward; backward rows and finish
    ("<kernellab op call kl::layernorm>", "call"): 1, ("<kernellab op call kl::layernorm_backwar", "call"): 1,
    ("ops.py", "__call__"): 2, ("ops.py", "_impl"): 1, ("ops.py", "forward"): 1, ("ops.py", "backward"): 1,
    ("04-layernorm.py:launchers", "kl_layernorm"): 1, ("04-layernorm.py:launchers", "layernorm"): 1,
    ("04-layernorm.py:launchers", "_save_x_w"): 1, ("04-layernorm.py:launchers", "_layernorm_grad"): 1,
    ("04-layernorm.py:launchers", "kl_layernorm_backward"): 1, ("04-layernorm.py:launchers", "_norm_backward"): 1,
    ("04-layernorm.py:launchers", "_check_layout"): 2,
}


@pytest.fixture(scope="module")
def bench():
    """benchmarks/launch_overhead.py as a module (its stand-in driver), kernellab's stream lookups restored after."""
    yield from launch_overhead_module("launch_overhead_norm")


@pytest.fixture(scope="module")
def norm(bench):
    """launch_overhead.norm_op_setup(): x [16, 768] requiring grad, w and b Parameters, dy; the op warmed up."""
    return bench.norm_op_setup()


def python_calls(fn, repeat: int = 4) -> collections.Counter:
    """(origin, file tail, function) -> Python calls per call of fn() (tests/host_path.py)."""
    return host_path.python_calls(fn, "04-layernorm.py", repeat)


def test_a_training_steps_forward_and_backward_skip_the_dispatcher_and_torchs_autograd_kernel(norm):
    calls = python_calls(norm.ours)
    torch_files = {f for origin, f, _ in calls if origin == "torch"}
    assert not any(f in ("_ops.py", "autograd.py") for f in torch_files), torch_files   # OpOverload, _library
    assert not any(name in ("fill_defaults", "redispatch", "autograd_impl", "unwrap_dead_wrappers")
                   for _, _, name in calls), sorted(calls)
    ours = {k: v for k, v in calls.items() if k[0] in ("kernellab", "tutorial")}
    listing = "\n".join(f"{v} {k}" for k, v in sorted(ours.items()))
    assert sum(ours.values()) <= KERNELLAB_CALLS_BUDGET, listing
    by_function = collections.Counter()
    for (_, f, name), v in ours.items():
        by_function["<launch>" if f.startswith("<kernellab launch") else f, name] += v
    assert by_function == collections.Counter(KERNELLAB_CALLS), listing      # which frames, not only how many
    # three launches (forward; backward rows and finish), each by its generated launch, none by LaunchPath.run
    launches = sum(v for (origin, f, name), v in calls.items() if f.startswith("<kernellab launch"))
    assert launches == 3, sorted(calls)
    assert not any(name in ("run", "marshal_args", "plan", "fast") for _, f, name in calls if f == "launch.py")
    y = norm.op(norm.x, norm.w, norm.b, 1e-5)
    assert type(y.grad_fn).__name__ == "KernellabOp_kl_layernormBackward"


def test_plans_and_kernel_lookups_are_made_once_per_shape(norm, monkeypatch):
    """A warm call takes its plan and configured kernels (kernel[grid, block]) from the launchers' per-shape tables:
    no plan function, no kernel name, no lookup by name; a new shape, or the kernels' cell run again, makes them."""
    ns = norm.ns
    found, configured = [], []
    real_find, real_getitem = Module._find, Kernel.__getitem__
    monkeypatch.setattr(Module, "_find", lambda self, name: found.append(name) or real_find(self, name))
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, c: configured.append(c) or real_getitem(self, c))
    rows_before, bwd_before = ns["plan_rows"].cache_info(), ns["plan_backward"].cache_info()
    for _ in range(3):
        norm.ours()
    assert ns["plan_rows"].cache_info() == rows_before and ns["plan_backward"].cache_info() == bwd_before
    assert found == [] and configured == []
    key = ("layernorm", *norm.x.shape, norm.x.dtype)
    assert ns["_LAUNCHES"][key][0] is ns["norm_kernels"] and ns["_BACKWARD_LAUNCHES"][key][0] is ns["norm_backward"]
    # the kernels' cell run again (a new module object): the next call configures its kernels, by their index
    for table, module in (("_LAUNCHES", "norm_kernels"), ("_BACKWARD_LAUNCHES", "norm_backward")):
        entry = ns[table][key]
        monkeypatch.setitem(ns[table], key, (object(), *entry[1:]))
    norm.ours()
    assert found == [] and len(configured) == 3                         # forward; backward rows and finish
    assert ns["_LAUNCHES"][key][0] is ns["norm_kernels"] and ns["_BACKWARD_LAUNCHES"][key][0] is ns["norm_backward"]
    assert ns["plan_rows"].cache_info().misses == rows_before.misses                 # the plans stay cached
    norm.x.grad = norm.w.grad = norm.b.grad = None


def test_the_backward_op_called_by_the_graph_takes_the_eager_call(norm):
    """kl::layernorm_backward from the graph's node (grad mode off, w a Parameter): straight to its implementation."""
    x, w, dy = norm.x.detach(), norm.w, norm.dy
    op = norm.ns["kl_layernorm_backward"]
    with torch.no_grad():
        calls = python_calls(lambda: op(dy, x, w, 1e-5))
    assert not any(f == "_ops.py" for _, f, _ in calls), sorted(calls)
    assert any(name == "_impl" for _, f, name in calls)


def test_module_lookups_by_name_give_what_the_scan_gives(norm):
    for module in (norm.ns["norm_kernels"], norm.ns["norm_backward"]):
        for k in module.kernels:
            for name in (k.symbol, k.signature.display):
                assert module[name] is module._find(name) is k
        with pytest.raises(KeyError, match="no kernel"):
            module["no_such_kernel<float>"]


def test_the_benchmarks_norm_table_has_every_row(bench):
    """launch_overhead.py --cpu's LayerNorm table (a few calls a case: the rows, not the times)."""
    cases = bench.norm_cpu_cases(20, 2)
    assert len(cases) == 10 and all(len(cpu) == 2 and min(cpu) > 0 for _, _, cpu in cases)
    text = bench.norm_table(cases, "t")
    assert text.count("\n| ") == 11 and "| F.layer_norm forward + backward (y.backward(dy)) |" in text
    assert "x of 12 x F.layer_norm |" in text


def test_the_benchmarks_context_table_has_every_case_and_leaves_the_gc_as_it_was(bench):
    """launch_overhead.py --context (a few calls a case: the rows, not the times): a large heap, gc.freeze(), the GC
    off and cold caches, each with the op's and the launcher's time; the collector is left as it was."""
    import gc

    cases = bench.context_cases(40, 2, heap_objects=50_000, flush_bytes=1 << 20)
    names = [name for name, *_ in cases]
    assert len(cases) == 6 and names[1].startswith("+ 50,000 live lists") and "gc.freeze()" in names[2]
    assert "GC off" in names[3] and names[4].startswith("as set up, again")         # the first case, last: drift
    assert names[5].startswith("cold CPU caches (1 MiB")
    assert all(both > alone > 0 for _, both, alone, _, _ in cases)       # the launcher is part of the forward
    assert all(theirs > 0 for *_, theirs in cases)                        # F.layer_norm's, the baseline
    assert cases[3][3] == 0                                               # GC off: no collection
    assert gc.isenabled() and gc.get_freeze_count() == 0
    text = bench.context_table(cases, "t")
    assert text.count("\n| ") == 7 and "| GC collections per 1000 calls |" in text
    assert "| kl::layernorm / F.layer_norm |" in text


def test_the_launchers_still_refuse_what_the_row_kernels_do_not_take(norm):
    """The layout checks left after the launchers stopped reading their own new outputs: a non-contiguous or
    misaligned input, or a given output that is not contiguous, is refused before anything launches."""
    ns, x, w, b, dy = norm.ns, norm.x.detach(), norm.w.detach(), norm.b.detach(), norm.dy
    rows, cols = x.shape
    misaligned = torch.randn(rows * cols + 1)[1:].view(rows, cols)               # 4 bytes past an allocation
    with pytest.raises(AssertionError, match="contiguous, 16-byte aligned"):
        ns["layernorm"](torch.randn(cols, rows).t(), w, b)
    with pytest.raises(AssertionError, match="contiguous, 16-byte aligned"):
        ns["layernorm"](misaligned, w, b)
    with pytest.raises(AssertionError, match="contiguous, 16-byte aligned"):
        ns["layernorm"](x, w, b, torch.empty(cols, rows).t())                    # a given output is still checked
    with pytest.raises(AssertionError, match="contiguous, 16-byte aligned"):
        ns["rmsnorm"](x, torch.randn(2 * cols)[::2])
    with pytest.raises(AssertionError, match="contiguous, 16-byte aligned"):
        ns["layernorm_backward"](misaligned, x, w)                                # .contiguous() keeps the offset
    y = ns["layernorm"](x, w, b)
    assert y.is_contiguous() and y.shape == x.shape


def test_the_benchmarks_cold_table_has_every_stage(bench):
    """launch_overhead.py --cold (a few calls a case: the rows, not the times): F.layer_norm's forward + backward first
    (the baseline), ours second, then each stage down to the generated launch's pieces, each with its warm and cold
    time and the Python and C calls it makes."""
    cases = bench.norm_cold_cases(40, 2, 3, flush_bytes=1 << 20)
    names = [name for name, *_ in cases]
    assert names[0].startswith("F.layer_norm forward + backward") and names[1].startswith("kl::layernorm forward +")
    assert any("struct pack_into of the 8 values" in n for n in names) and names[-1].startswith("  an empty call")
    assert all(len(warm) == 2 and cold > 0 for _, warm, cold, _, _ in cases)
    calls = {name.strip(): (py, c) for name, _, _, py, c in cases}
    ours, theirs = calls["kl::layernorm forward + backward (y.backward(dy))"], calls[names[0]]
    assert ours[0] > theirs[0] and ours[1] > theirs[1]            # our Python and its C calls on top of torch's
    assert calls["the generated launch alone"][0] == 1           # straight-line: no Python call below its own
    assert calls["layernorm launcher alone (1 launch)"][0] == 4  # layernorm, _check_layout, _Launcher, the launch
    guards = calls["the eager call's guards (the modes, tracers and transforms it reads)"]
    assert guards[0] <= 1, guards                                 # is_dynamo_compiling at most: no is_scripting frame
    text = bench.cold_table(cases, "t")
    assert text.count("\n| ") == len(cases) + 1 and "| cold vs F.layer_norm fwd + bwd cold |" in text


def test_a_configured_launch_follows_the_notebook_isolation_setting_made_after_it(norm, monkeypatch):
    """_Launcher.__call__ reads the worker's settings object it keeps (kernel._WORKER_SETTINGS): set_isolation after
    a launcher's generated launches still sends its next launch to the worker, and back when it is turned off."""
    from kernellab.run.launch import worker

    routed = []
    monkeypatch.setattr(Kernel, "run_isolated", lambda self, grid, block, *args, **kw: routed.append(self.name))
    ns, x, w, b = norm.ns, norm.x.detach(), norm.w, norm.b
    ns["layernorm"](x, w, b)
    with worker.isolation(True):
        ns["layernorm"](x, w, b)
    assert len(routed) == 1 and routed[0].startswith("layernorm_rows")
    ns["layernorm"](x, w, b)
    assert len(routed) == 1


def test_the_benchmarks_timed_backward_makes_no_plan_kernel_or_launch_on_a_warm_call(norm, monkeypatch):
    """benchmarks/norm_backward.py --host-only's layers (host_setup) for both ops at a register-held shape: a warm
    autograd.grad(y, leaves, dy) (the call the benchmark times as called) runs each op's two launches through the
    generated launches the first call made: no plan, no kernel lookup or configuration, no LaunchConfig or generated
    launch built, nothing through LaunchPath.run; and every layer the table prints runs."""
    import importlib.util

    from kernellab.run.launch import launch as L

    spec = importlib.util.spec_from_file_location("norm_backward_bench", host_path.ROOT / "benchmarks" /
                                                  "norm_backward.py")
    bench_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_module)
    ns = norm.ns
    for kind in ("layernorm", "rmsnorm"):
        cases = dict(bench_module.host_setup(ns, kind, 64, 1024, torch.bfloat16))
        assert len(cases) == 10
        for f in cases.values():                            # every layer runs (the first calls make what they need)
            f()
        made = collections.Counter()
        for cls, name in ((L.LaunchPath, "config"), (L.LaunchPath, "fast"), (L.LaunchPath, "run"),
                          (Module, "_find"), (Kernel, "__getitem__")):
            real = getattr(cls, name)
            monkeypatch.setattr(cls, name, lambda *a, _real=real, _name=name, **k: made.update([_name]) or
                                _real(*a, **k))
        before = ns["plan_backward"].cache_info().misses, ns["plan_rows"].cache_info().misses
        launches = collections.Counter()
        as_called = cases["as called: autograd.grad(y, leaves, dy), the benchmark's timed call"]
        calls = python_calls(as_called, repeat=2)
        for (_, f, name), v in calls.items():
            if f.startswith("<kernellab launch"):
                launches[name] += v
        as_called()
        assert made == collections.Counter(), made
        assert (ns["plan_backward"].cache_info().misses, ns["plan_rows"].cache_info().misses) == before
        assert launches == {"launch": 2}, sorted(calls)                 # rows and finish, each a generated launch
        assert not any(name in ("_backward_launches", "norm_launch_for", "plan_backward") for _, _, name in calls)
        monkeypatch.undo()
