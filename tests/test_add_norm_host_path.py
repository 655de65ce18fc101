"""kl::add_layernorm's per-call host path (kernellab.teach.add_norm's launchers): a warm call takes its checked plan
and configured kernels from the per-shape tables (no checks, plan, kernel name or lookup), every change of shape,
dtype, device or dh_out gets its own entry, bad input is still refused with the launchers' errors on a warm path, and
inputs of any layout or number of dimensions give what the contiguous 2-D call gives. The structure with the kernels
compiled for sm_90 and launched through benchmarks/launch_overhead.py's stand-in driver; the numbers on kernellab's
CPU path. benchmarks/add_norm.py --host-only prints the times."""
import collections
import importlib.util

import host_path
import pytest
from host_path import launch_overhead_module

import kernellab
from kernellab.errors import ArgumentError
from kernellab.kernel import Kernel, Module, _Launcher
from kernellab.teach import add_norm as an

torch = pytest.importorskip("torch")

from kernellab.run.sim.cuda import emulate  # noqa: E402
needs_cxx = pytest.mark.skipif(emulate.compiler() is None, reason="no host C++ compiler for the CPU path")

F32, BF16 = torch.float32, torch.bfloat16


@pytest.fixture(scope="module")
def standin_module():
    """kl/add_norm.cuh's kernels compiled for sm_90, launched through the stand-in driver (launches do nothing)."""
    for bench in launch_overhead_module("launch_overhead_add_norm"):
        module = bench.standin_module(kernellab.compile_cuda(an.SOURCE, arch="sm_90", filename="add_norm.cu"))
        module[module.kernels[0].symbol]                 # its index of names, made at the first lookup by name
        yield module


@pytest.fixture
def standin(standin_module, monkeypatch):
    """The launchers on the stand-in module with empty per-shape tables; every launch recorded as
    (kernel's display name, grid, block, args)."""
    monkeypatch.setattr(an, "kernels", lambda device_type="cuda", compile=None: standin_module)
    monkeypatch.setattr(an, "_FORWARD", {})
    monkeypatch.setattr(an, "_BACKWARD", {})
    launches = []
    real = _Launcher.__call__
    monkeypatch.setattr(_Launcher, "__call__", lambda self, *args, **kw: launches.append(
        (self.kernel.signature.display, self.grid, self.block, args)) or real(self, *args, **kw))
    return launches


def counting(monkeypatch, counts, owner, name):
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: counts.update([name]) or real(*a, **k))


def tensors(rows, cols, xt=F32, rt=BF16):
    """x (xt), r (rt), w, b (xt), dy (rt), dh_out (xt)."""
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(rows, cols, generator=g).to(t) if two else torch.randn(cols, generator=g).to(t)
                 for t, two in ((xt, 1), (rt, 1), (xt, 0), (xt, 0), (rt, 1), (xt, 1)))


def shifted(t):
    """t's values in a view one element past an allocation (4 or 2 bytes: not 16-byte aligned)."""
    return torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape).copy_(t)


def test_a_warm_call_makes_no_check_plan_or_kernel_lookup(standin, monkeypatch):
    counts = collections.Counter()
    for owner, name in ((an, "_check"), (an, "_check_backward"), (an, "plan_forward"), (an, "plan_backward"),
                        (an, "_sms"), (Module, "__getitem__"), (Module, "_find"), (Kernel, "__getitem__")):
        counting(monkeypatch, counts, owner, name)
    x, r, w, b, dy, up = tensors(64, 768)
    h, _ = an.add_layernorm(x, r, w, b)
    an.add_layernorm_backward(dy, up, h, w)
    # the miss: each check and plan once, three kernels named and configured (forward; backward rows and finish)
    assert counts == {"_check": 1, "_check_backward": 1, "plan_forward": 1, "plan_backward": 1, "_sms": 1,
                      "__getitem__": 6}, counts
    counts.clear()
    for _ in range(3):
        h, _ = an.add_layernorm(x, r, w, b)
        an.add_layernorm_backward(dy, up, h, w)
    assert counts == {} and len(standin) == 12
    assert len(an._FORWARD) == len(an._BACKWARD) == 1
    # the entries hold no tensor (no memory kept: one made during a CUDA graph's capture would stay in its pool)
    entries = [*an._FORWARD.items(), *an._BACKWARD.items()]
    assert not any(isinstance(v, torch.Tensor) for key, hit in entries for v in (*key, *hit))


def test_the_launches_get_the_plans_rows_columns_and_16_byte_flag(standin):
    x, r, w, b, dy, up = tensors(64, 768)
    h, y = an.add_layernorm(x, r, w, b, 1e-5)
    dh, dr, dw, db = an.add_layernorm_backward(dy, up, h, w, 1e-5)
    row_threads, block, grid = an.plan_forward(64, 768)
    chunks, brow_threads, bblock, bgrid = an.plan_backward(64, 768, 132)
    (fname, fgrid, fblock, fargs), (mname, mgrid, mblock, margs), (sname, sgrid, sblock, sargs) = standin
    assert (fname, fgrid, fblock) == ("add_layernorm_rows<float, __nv_bfloat16, 1>", grid, block)
    assert all(a is t for a, t in zip(fargs, (x, r, w, b, h, y))) and fargs[6:] == (64, 768, row_threads, 1, 1e-5)
    assert (mname, mgrid, mblock) == (f"add_layernorm_backward_rows<float, __nv_bfloat16, {chunks}>", bgrid, bblock)
    assert all(a is t for a, t in zip(margs, (dy, up, h, w, dh, dr))) and margs[7:] == (64, 768, brow_threads, 1,
                                                                                        1e-5)
    partial = margs[6]
    assert partial.shape == (bgrid, 2, 768) and partial.dtype == F32 and partial.is_contiguous()
    assert (sname, sgrid, sblock) == ("add_norm_finish<float>", 768 // an.FINISH_COLS, 256)
    assert sargs[0] is partial and sargs[1:3] == (bgrid, 768) and sargs[3] is dw and sargs[4] is db
    assert h.shape == dh.shape == (64, 768) and (y.dtype, dr.dtype, dw.dtype) == (BF16, BF16, F32)
    # any input an element past an allocation: element loads (flag 0); the contiguous copy of a strided input goes in
    for launcher, given, flag in ((an.add_layernorm, [x, r, w, b], 9), (an.add_layernorm_backward, [dy, up, h, w], 10)):
        for i in range(4):
            standin.clear()
            args = list(given)
            args[i] = shifted(args[i])
            launcher(*args)
            assert standin[0][3][flag] == 0, (launcher.__name__, i)
    standin.clear()
    strided = torch.randn(768, 64).t()
    an.add_layernorm(x, r, w, b)
    an.add_layernorm(strided, r, w, b)
    an.add_layernorm_backward(dy, None, h, w)
    assert standin[0][3][9] == 1 and standin[1][3][9] == 1 and standin[2][3][10] == 1
    assert standin[1][3][0].is_contiguous() and torch.equal(standin[1][3][0], strided)
    assert standin[2][3][1] is None
    assert len(an._FORWARD) == 1                      # layout is checked each call, not part of the key
    x9, r9, w9, b9 = tensors(4, 9)[:4]                # rows of 9 columns: chunks of 8 never on 16 bytes
    an.add_layernorm(x9, r9, w9, b9)
    assert standin[-1][3][9] == 0


@pytest.mark.parametrize("change", ["rows", "3-d", "x dtype", "r dtype", "dh_out"])
def test_each_shape_dtype_pair_and_dh_out_gets_its_own_plan(standin, change):
    x, r, w, b, dy, up = tensors(64, 768)
    h, _ = an.add_layernorm(x, r, w, b)
    an.add_layernorm_backward(dy, up, h, w)
    before_f, before_b = dict(an._FORWARD), dict(an._BACKWARD)
    if change == "rows":
        x, r, w, b, dy, up = tensors(1000, 768)
    elif change == "3-d":
        x, r, dy, up = (t.view(4, 16, 768) for t in (x, r, dy, up))
    elif change == "x dtype":
        x, r, w, b, dy, up = tensors(64, 768, BF16, BF16)
    elif change == "r dtype":
        x, r, w, b, dy, up = tensors(64, 768, F32, F32)
    else:
        up = None
    standin.clear()
    h, y = an.add_layernorm(x, r, w, b)
    an.add_layernorm_backward(dy, up, h, w)
    assert h.shape == y.shape == x.shape and y.dtype == r.dtype
    new_f = [v for k, v in an._FORWARD.items() if k not in before_f]
    new_b = [v for k, v in an._BACKWARD.items() if k not in before_b]
    assert len(new_b) == 1 and len(new_f) == (0 if change == "dh_out" else 1)
    assert an._FORWARD.keys() >= before_f.keys() and an._BACKWARD.keys() >= before_b.keys()   # the old ones kept
    rows = x.numel() // 768
    ct = an.CTYPE
    if new_f:
        assert new_f[0][1:3] == (rows, 768)
        assert standin[0][0] == f"add_layernorm_rows<{ct[x.dtype]}, {ct[r.dtype]}, 1>"
        assert standin[0][1:3] == an.plan_forward(rows, 768)[:0:-1] and standin[0][3][6:8] == (rows, 768)
    chunks, _, block, grid = an.plan_backward(rows, 768, 132)
    assert standin[-2][:3] == (f"add_layernorm_backward_rows<{ct[x.dtype]}, {ct[r.dtype]}, {chunks}>", grid, block)
    assert standin[-2][3][1] is up and standin[-2][3][7:9] == (rows, 768)
    assert standin[-1][3][1:3] == (grid, 768) and standin[-1][0] == f"add_norm_finish<{ct[x.dtype]}>"


def test_a_warm_call_still_refuses_bad_input_with_the_launchers_errors(standin):
    x, r, w, b, dy, up = tensors(2, 8)
    h, _ = an.add_layernorm(x, r, w, b)
    an.add_layernorm_backward(dy, up, h, w)
    standin.clear()
    with pytest.raises(ArgumentError, match="same shape"):
        an.add_layernorm(x, r[:1], w, b)
    with pytest.raises(ArgumentError, match="w and b must be"):
        an.add_layernorm(x, r, w.bfloat16(), b)
    with pytest.raises(ArgumentError, match="w and b must be"):
        an.add_layernorm(x, r, w, torch.zeros(9))
    with pytest.raises(ArgumentError, match="dtypes"):
        an.add_layernorm(x.bfloat16(), r.float(), w.bfloat16(), b.bfloat16())
    with pytest.raises(ArgumentError, match="one device"):               # the devices are part of the key
        an.add_layernorm(x, r, w, b.to("meta"))
    with pytest.raises(ArgumentError, match="shaped like h"):
        an.add_layernorm_backward(dy, up.bfloat16(), h, w)
    with pytest.raises(ArgumentError, match="shaped like h"):
        an.add_layernorm_backward(dy[:1], up, h, w)
    with pytest.raises(ArgumentError, match="dtypes"):
        an.add_layernorm_backward(dy, up, h, w.bfloat16())
    assert standin == []                                                  # nothing launched
    x2, r2, w2, b2 = tensors(2, 8193)[:4]
    with pytest.raises(ArgumentError, match="up to 8192 columns"):
        an.add_layernorm(x2, r2, w2, b2)
    assert len(an._FORWARD) == 1 and len(an._BACKWARD) == 1               # no entry for what was refused


def test_no_rows_or_no_columns_launch_nothing_and_give_empty_or_zero_results(standin):
    for rows, cols in ((0, 768), (3, 0)):
        x, r, w, b, dy, up = tensors(rows, cols)
        h, y = an.add_layernorm(x, r, w, b)
        assert h.shape == y.shape == (rows, cols) and y.dtype == BF16
        dh, dr, dw, db = an.add_layernorm_backward(dy, up, h, w)
        assert torch.equal(dh, up) and dr.shape == (rows, cols) and dw.shape == (cols,)
        assert not dw.any() and not db.any()
    assert standin == []


@needs_cxx
def test_strided_misaligned_and_3d_inputs_give_the_2d_contiguous_calls_bits():
    """On kernellab's CPU path: a transposed view (copied), views 4 or 2 bytes past an allocation (element loads, not
    16-byte ones) and [2, 3, cols] inputs (the kernels' rows x cols) give the same h, y and gradients."""
    for xt, rt in ((F32, BF16), (BF16, BF16)):
        x, r, w, b, dy, up = tensors(6, 64, xt, rt)
        want = (*an.add_layernorm(x, r, w, b), *an.add_layernorm_backward(dy, up, an.add_layernorm(x, r, w, b)[0],
                                                                            w))
        for how, f in (("strided", lambda t: t.t().contiguous().t() if t.dim() == 2 else t),
                       ("misaligned", shifted), ("3-d", lambda t: t.reshape(2, 3, 64) if t.dim() == 2 else t)):
            xs, rs, ws, bs, dys, ups = (f(t) for t in (x, r, w, b, dy, up))
            if how == "misaligned":
                assert xs.data_ptr() % 16 and ws.data_ptr() % 16
            h, y = an.add_layernorm(xs, rs, ws, bs)
            got = (h, y, *an.add_layernorm_backward(dys, ups, h, ws))
            for name, g, e in zip(("h", "y", "dh", "dr", "dw", "db"), got, want):
                assert g.shape == (e.shape if how != "3-d" or name in ("dw", "db") or not e.numel() else xs.shape)
                assert torch.equal(g.reshape(e.shape), e), (xt, rt, how, name)


def test_the_benchmarks_host_rows_run_and_a_warm_call_makes_three_launches(standin, monkeypatch):
    """benchmarks/add_norm.py --host-only's rows (fused_host_cases, reference_host_cases) at a small shape: every row
    runs, and the timed forward + backward makes its three launches through the configured kernels the first call
    made: no check, plan or kernel lookup."""
    spec = importlib.util.spec_from_file_location("add_norm_bench", host_path.ROOT / "benchmarks" / "add_norm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fused = bench.fused_host_cases(torch, an, 64, 768, F32, BF16)
    refs = bench.reference_host_cases(torch, lambda h, w, b, eps: torch.nn.functional.layer_norm(h, (768,), w, b, eps),
                                      64, 768, F32, BF16)
    assert len(fused) == 7 and len(refs) == 4
    for _, f in fused + refs:
        f()
    counts = collections.Counter()
    for owner, name in ((an, "_check"), (an, "_check_backward"), (an, "plan_forward"), (an, "plan_backward"),
                        (Kernel, "__getitem__"), (Module, "__getitem__")):
        counting(monkeypatch, counts, owner, name)
    standin.clear()
    fused[0][1]()
    assert counts == {} and [name.split("<")[0] for name, *_ in standin] == [
        "add_layernorm_rows", "add_layernorm_backward_rows", "add_norm_finish"]


BEFORE_THE_CUT = "cbb02e8"      # main before the launchers' per-call tables were keyed on every shape and dtype


def _has_commit(ref: str) -> bool:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(host_path.ROOT), "cat-file", "-e", f"{ref}^{{commit}}"],
                              capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not _has_commit(BEFORE_THE_CUT),
                    reason=f"no git history with {BEFORE_THE_CUT} (--against reads it)")
def test_against_loads_the_launchers_of_a_git_ref_and_they_launch_what_the_trees_launch(standin):
    """add_norm.py --against: the module as it was at a ref, its ops registered under klref:: (the tree's kl:: ops
    stay), its launchers on the stand-in beside the tree's. The launchers before the cut and the tree's launch the
    same kernels, grids, blocks and scalar arguments, for 2-D and 3-D inputs, with and without dh_out."""
    spec = importlib.util.spec_from_file_location("add_norm_bench", host_path.ROOT / "benchmarks" / "add_norm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    old = bench.standin_add_norm(bench.add_norm_at(BEFORE_THE_CUT))
    assert old is not an and old.kl_add_layernorm.qualname == "klref::add_layernorm"
    assert an.kl_add_layernorm.qualname == "kl::add_layernorm" and old._FORWARD is not an._FORWARD
    x, r, w, b, dy, up = tensors(64, 768)
    cases = [(x, r, dy, up), (x.view(4, 16, 768), r.view(4, 16, 768), dy.view(4, 16, 768), None)]
    launched = []
    for module in (old, an):
        standin.clear()
        for xs, rs, dys, ups in cases:
            h, _ = module.add_layernorm(xs, rs, w, b)
            module.add_layernorm_backward(dys, ups, h, w)
        launched.append([(name, g, blk, [a for a in args if not isinstance(a, torch.Tensor)])
                         for name, g, blk, args in standin])
    assert len(launched[0]) == 6 and launched[0] == launched[1]
