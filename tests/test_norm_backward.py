"""Tutorial 04's LayerNorm and RMSNorm backward without a GPU: the norm_backward cell compiles for sm_90 to what was
meant (registers, no spills, 16-byte accesses, no atomics), the plans cover every row, the kernels run on the CPU
emulation (kernellab.run.sim.cuda) against float64 beside PyTorch's own error on awkward shapes and three input
distributions, and kl::layernorm / kl::rmsnorm differentiate (eager on CPU tensors, fake tensors, aot_eager)."""
import math
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from notebook_cells import launcher_cells, load_tutorial, named_cuda_cells  # noqa: E402

import kernellab  # noqa: E402
from sass_counts import assert_registers_only_and_deterministic, sass_ops  # noqa: E402

torch = pytest.importorskip("torch")
F = torch.nn.functional

T04 = "04-layernorm.py"
CT = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}
# the tutorial's shapes, and awkward ones: one element, odd widths, widths not a multiple of the pack, several rows a
# block, one row of 1024 threads (bf16 8192), the long rows (column tiles)
SHAPES = [(4096, 1024), (4096, 4096), (4096, 32768), (1024, 262144), (1000, 1031), (3, 100003), (1, 1), (3, 7),
          (70, 64), (9, 8192), (5, 4099), (2, 9000), (1, 768)]


@pytest.fixture(scope="module")
def module():
    return kernellab.compile_cuda(named_cuda_cells(T04)["norm_backward"], arch="sm_90", first_line=2,
                                  filename="cell.cu")


def plans_ns():
    """The backward launcher cell (with the forward's, for SMS, CTYPE, _check_layout) run without kernels."""
    ns: dict = {}
    for cell in launcher_cells(T04):
        if cell.startswith(("# launchers: layernorm, rmsnorm (", "# launchers: layernorm backward")):
            exec(compile(cell, T04, "exec"), ns)
    return ns


def test_the_backward_kernels_compile_without_spills(module):
    names = {k.signature.display for k in module.kernels}
    assert names == {f"norm_backward_{kind}<{t}, {rms}>" for kind in ("rows", "stats", "split_stats", "tiles",
                                                                                  "split_tiles")
                     for t in CT.values()
                     for rms in ("false", "true")} | {f"norm_backward_finish<{t}>" for t in CT.values()}
    assert_registers_only_and_deterministic(module.kernels)


def test_the_row_kernels_hold_their_rows_in_registers_with_16_byte_accesses(module):
    for t, max_threads in (("float", 512), ("__nv_bfloat16", 1024)):
        for rms in ("false", "true"):
            k = module[f"norm_backward_rows<{t}, {rms}>"]
            assert k.resources.max_threads_per_block == max_threads, k.resources
            assert k.resources.registers <= 65536 // max_threads, k.resources
            ops = sass_ops(k)
            assert ops.get("LDG.E.128.CONSTANT", 0) + ops.get("LDG.E.128", 0) >= 3, ops      # x, dy, w
            assert ops.get("STG.E.128", 0) >= 1, ops                                         # dx


@pytest.mark.parametrize("itemsize", [4, 2])
def test_the_plans_cover_every_row_and_keep_the_partial_rows_to_a_wave(itemsize):
    ns = plans_ns()
    for r, c in SHAPES + [(4096, 768), (8192, 2048), (2, 4097), (1, 8193)]:
        p = ns["plan_backward"](r, c, itemsize, sms=132)
        fits = c <= (4096 if itemsize == 4 else 8192)
        assert p.kernel == ("rows" if fits else "tiles"), (r, c, p)
        assert p.block <= 1024 and p.block % p.row_threads == 0 and p.grid >= 1, (r, c, p)
        if p.kernel == "rows":
            assert p.row_threads * ns["BACKWARD_VALUES"] >= c and p.row_threads >= 32, (r, c, p)
            assert p.row_threads == 32 or p.row_threads * ns["BACKWARD_VALUES"] < 2 * c, (r, c, p)   # the fewest
            groups = p.block // p.row_threads
            assert p.grid * groups >= min(r, p.grid * groups) and p.grid <= math.ceil(r / groups), (r, c, p)
            assert p.grid <= 132 * 4, (r, c, p)                 # one wave of resident blocks: few partial rows
            assert groups == 1 or groups * p.row_threads * ns["BACKWARD_VALUES"] <= 8192    # the shared stage
            wide = ns["plan_backward"](r, c, itemsize, sms=132, block=1024)       # blocks of 1024: --plans
            assert wide.block == (1024 if itemsize == 2 else 512) and wide.grid <= 132, (r, c, wide)   # a block an SM
        else:                                                   # column tiles of 256 x 8, about 4 an SM
            assert p.tiles == math.ceil(c / (256 * 8)) and p.block == p.row_threads == 256, (r, c, p)
            assert p.grid == max(1, min(r, 4 * 132 // p.tiles)), (r, c, p)
            assert p.split == (r < 2 * 132), (r, c, p)        # fewer than two rows an SM: statistics by slices


# The launcher's rule, shape by shape: which kernels run (rows in registers; long rows' statistics by a block per row
# or by column slices, then column tiles), on an H100's 132 SMs.
PLAN_RULE = [((1000, 1031, 2), "rows", False), ((1, 1, 2), "rows", False), ((9, 8192, 2), "rows", False),
             ((3, 100003, 2), "tiles", True), ((7, 65537, 2), "tiles", True), ((7, 65537, 4), "tiles", True),
             ((1, 8193, 2), "tiles", True), ((263, 9000, 2), "tiles", True), ((264, 9000, 2), "tiles", False),
             ((4096, 32768, 2), "tiles", False), ((1024, 262144, 2), "tiles", False), ((2, 4097, 4), "tiles", True)]


@pytest.mark.parametrize("shape, kernel, split", PLAN_RULE, ids=[f"{r}x{c}x{i}" for (r, c, i), _, _ in PLAN_RULE])
def test_the_plan_rule_picks_the_kernels_for_each_shape(shape, kernel, split):
    ns = plans_ns()
    p = ns["plan_backward"](*shape, sms=132)
    assert (p.kernel, p.split) == (kernel, split), p
    if kernel == "tiles":                               # 3 x 100003: 3 x 49 blocks for the statistics, not 3
        assert p.tiles == math.ceil(shape[1] / 2048) >= 2, p


def test_the_finish_takes_narrow_rows_in_blocks_of_8_columns():
    """norm_backward_finish's columns a block: 32 while that gives every SM a block, else 8 (1031 columns: 129
    blocks, not 33); both powers of two that divide its 512 threads (the slices' tree)."""
    ns = plans_ns()
    got = {c: ns["finish_columns"](c, sms=132) for c in (1, 768, 1031, 4096, 4192, 4193, 8192, 100003)}
    assert got == {1: 8, 768: 8, 1031: 8, 4096: 8, 4192: 8, 4193: 32, 8192: 32, 100003: 32}, got
    assert ns["finish_columns"](1031, sms=16) == 32


# --- the kernels, run on the CPU --------------------------------------------------------------------------------

from kernellab.run.sim.cuda import emulate  # noqa: E402
needs_cxx = pytest.mark.skipif(emulate.compiler() is None, reason="no host C++ compiler for the emulation")


@pytest.fixture(scope="module")
def t04():
    return load_tutorial(T04, compile=emulate.compile_host)


# a warp per row, several rows a block (shared-memory sums of the partials), one row of 256 threads with element
# loads (1031), 128 with packs (1024), the rows over 8192 (float over 4096: 4100) as statistics then column tiles,
# with packs (9000) and element loads (8999)
EMU_SHAPES = [(1, 1), (3, 7), (70, 64), (2, 1031), (3, 1024), (2, 4100), (2, 9000), (1, 8999)]


# One (dtype, kind) pair in `make test-fast`; the other three (each a ~17 s emulation) in `make test`.
@needs_cxx
@pytest.mark.parametrize("kind", ["layernorm", pytest.param("rmsnorm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16], ids=str)
def test_gradients_on_the_emulator_within_twice_pytorchs_error(t04, kind, dtype):
    for dist in ("normal", "mean1e3", "heavy"):
        for r, c in EMU_SHAPES:
            dy, x, w, b = t04["bwd_inputs"](r, c, dtype, dist, device="cpu")
            errors = t04["backward_errors"](kind, dy, x, w, b, 1e-5)
            assert t04["backward_passes"](errors, dtype), (dist, r, c, errors)
            assert set(errors) == ({"dx", "dw", "db"} if kind == "layernorm" else {"dx", "dw"})


# Long rows (over 8192 bf16 columns, 4096 float) by both ways to their statistics, forced by the plan: a block per
# row (norm_backward_stats) and column slices (norm_backward_split_stats, combined by the tiles kernel), on stand-ins
# for 3 x 100003 and 7 x 65537 (odd widths: element loads; 16392: packs, a last slice of 8 columns).
LONG_SHAPES = [(3, 20003), (7, 16385), (2, 16392)]


@needs_cxx
@pytest.mark.parametrize("kind", ["layernorm", pytest.param("rmsnorm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("split", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["slices", "per-row"])
def test_long_rows_statistics_by_slices_or_rows_within_twice_pytorchs_error(t04, kind, split):
    import dataclasses

    dtypes = (torch.bfloat16, torch.float32) if split else (torch.bfloat16,)
    for dtype in dtypes:
        for dist in ("normal", "mean1e3"):
            for r, c in LONG_SHAPES[:2] if dist == "mean1e3" else LONG_SHAPES:
                plan = dataclasses.replace(t04["plan_backward"](r, c, dtype.itemsize), split=split)
                assert plan.kernel == "tiles"
                dy, x, w, b = t04["bwd_inputs"](r, c, dtype, dist, device="cpu")
                ours = t04[f"{kind}_backward"](dy, x, w, 1e-5, plan=plan)
                want = t04["reference_backward"](kind, dy, x, w, b, 1e-5, torch.float64)
                theirs = t04["reference_backward"](kind, dy, x, w, b, 1e-5)
                errors = {n: ((o.double() - f).abs().max().item(), (t.double() - f).abs().max().item(),
                              f.abs().max().item()) for n, o, t, f in zip(("dx", "dw", "db"), ours, theirs, want)}
                assert t04["backward_passes"](errors, dtype), (split, dtype, dist, r, c, errors)


@needs_cxx
def test_a_wrong_gradient_fails_the_criterion(t04):
    """The criterion can fail: dx off by one part in a thousand (float32) is far outside 2x PyTorch's error."""
    dy, x, w, b = t04["bwd_inputs"](3, 1031, torch.float32, "normal", device="cpu")
    errors = t04["backward_errors"]("layernorm", dy, x, w, b, 1e-5)
    ours, theirs, scale = errors["dx"]
    assert t04["backward_passes"](errors, torch.float32)
    assert not t04["backward_passes"]({"dx": (ours + 1e-3 * scale, theirs, scale)}, torch.float32)


@needs_cxx
def test_partial_sums_are_deterministic_and_cover_each_block(t04):
    """Two runs give the same bits; a plan with more blocks (more partial rows) gives the same dw within rounding."""
    dy, x, w, b = t04["bwd_inputs"](70, 64, torch.float32, "normal", device="cpu")
    one = t04["layernorm_backward"](dy, x, w, 1e-5)
    two = t04["layernorm_backward"](dy, x, w, 1e-5)
    assert all(torch.equal(a, c) for a, c in zip(one, two))
    plan = t04["BackwardPlan"]("rows", 32, 64, 35)               # 2 rows at a time, 35 blocks: one round each
    three = t04["layernorm_backward"](dy, x, w, 1e-5, plan=plan)
    assert torch.equal(one[0], three[0])
    assert torch.allclose(one[1], three[1], atol=1e-5) and torch.allclose(one[2], three[2], atol=1e-5)
    dy, x, w, b = t04["bwd_inputs"](9, 1031, torch.bfloat16, "normal", device="cpu")
    one = t04["layernorm_backward"](dy, x, w, 1e-5)
    wide = t04["plan_backward"](9, 1031, 2, block=1024)           # 4 rows of 256 threads a block: the whole stage
    assert (wide.block, wide.row_threads) == (1024, 256), wide
    four = t04["layernorm_backward"](dy, x, w, 1e-5, plan=wide)
    assert torch.equal(one[0], four[0])
    assert torch.allclose(one[1].float(), four[1].float(), rtol=2 ** -7, atol=1e-2)
    assert torch.allclose(one[2].float(), four[2].float(), rtol=2 ** -7, atol=1e-2)


# --- the ops' autograd, on CPU tensors (the emulated kernels) and on fake tensors -----------------------------------

@needs_cxx
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_the_ops_loss_backward_matches_float64(t04, kind):
    """loss.backward() through kl::layernorm / kl::rmsnorm on a [batch, sequence, width] input, with the expanded
    gradient y.sum() hands back, against F.layer_norm / F.rms_norm in float64."""
    dy, x, w, b = t04["bwd_inputs"](6, 37, torch.float32, "normal", device="cpu")
    x = x.reshape(2, 3, 37).requires_grad_(True)
    w, b = w.requires_grad_(True), b.requires_grad_(True)
    leaves = (x, w, b) if kind == "layernorm" else (x, w)
    op = t04[f"kl_{kind}"]
    y = op(x, w, b, 1e-5) if kind == "layernorm" else op(x, w, 1e-5)
    (y * 1.0).sum().backward()
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    y64 = (F.layer_norm(ref[0], (37,), ref[1], ref[2], 1e-5) if kind == "layernorm"
           else F.rms_norm(ref[0], (37,), ref[1], 1e-5))
    y64.sum().backward()
    for got, want in zip(leaves, ref):
        assert got.grad.shape == want.shape and got.grad.dtype == torch.float32
        assert torch.allclose(got.grad.double(), want.grad, atol=2e-5, rtol=1e-5), (got.grad - want.grad).abs().max()


@needs_cxx
def test_the_ops_backward_traces_on_fake_tensors(t04):
    """Meta tensors through forward and backward (the fake implementations of both ops), and aot_eager's trace of
    the backward graph, which runs the registered backward ops on real CPU tensors."""
    x = torch.empty(4, 8, 96, device="meta", requires_grad=True)
    w = torch.empty(96, device="meta", requires_grad=True)
    b = torch.empty(96, device="meta", requires_grad=True)
    t04["kl_layernorm"](x, w, b, 1e-5).sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == (96,) and b.grad.shape == (96,) and x.grad.device.type == "meta"
    t04["kl_rmsnorm"](x, w, 1e-5).sum().backward()

    def f(x, w, b):
        return (t04["kl_layernorm"](x, w, b, 1e-5) * t04["kl_rmsnorm"](x, w, 1e-5)).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    dy, xr, wr, br = t04["bwd_inputs"](5, 40, torch.float32, "normal", device="cpu")
    got = [t.clone().requires_grad_(True) for t in (xr, wr, br)]
    want = [t.clone().double().requires_grad_(True) for t in (xr, wr, br)]
    compiled(*got).backward()
    (F.layer_norm(want[0], (40,), want[1], want[2], 1e-5) * F.rms_norm(want[0], (40,), want[1], 1e-5)).sum().backward()
    for g, r in zip(got, want):
        assert torch.allclose(g.grad.double(), r.grad, atol=1e-4, rtol=1e-4), (g.grad - r.grad).abs().max()


@needs_cxx
@pytest.mark.slow
def test_the_ops_pass_opcheck_on_the_cpu(t04):
    dy, x, w, b = t04["bwd_inputs"](3, 40, torch.float32, "normal", device="cpu")
    t04["kl_layernorm"].opcheck(x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True), 1e-5)
    t04["kl_rmsnorm"].opcheck(x, w, 1e-5)
    t04["kl_layernorm_backward"].opcheck(dy, x.detach(), w.detach(), 1e-5)


def test_the_benchmarks_prediction_is_the_one_its_docstring_states():
    """benchmarks/norm_backward.py prints model_us beside each measurement: at the two shapes that missed the target,
    the numbers its docstring wrote down before a GPU ran them (3 x 100003 by the split plan; 1000 x 1031 by rows)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("norm_backward_bench", HERE.parent / "benchmarks" / "norm_backward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ns = plans_ns()
    got = {}
    for r, c in ((3, 100003), (1000, 1031)):
        plan = ns["plan_backward"](r, c, 2, sms=132)
        for kind in ("layernorm", "rmsnorm"):
            got[kind, r] = round(bench.model_us(kind, r, c, 2, plan), 1)
            assert f"{got[kind, r]:.1f}" in bench.__doc__, (kind, r, c, got[kind, r])
        assert bench.plan_label(plan) == ("split" if r == 3 else "rows")
    assert got == {("layernorm", 3): 10.4, ("rmsnorm", 3): 9.5, ("layernorm", 1000): 8.5, ("rmsnorm", 1000): 7.8}, got
