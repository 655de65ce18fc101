"""kl::add_layernorm (kernellab.teach.add_norm, kernellab/include/kl/add_norm.cuh) without a GPU: the kernels compile
for sm_90 to what was meant (no spills, 16-byte accesses, no atomics), the plans cover every row, the kernels run on
kernellab's CPU path against float64 beside PyTorch's own error on awkward shapes, the op differentiates (eager on CPU
tensors, fake tensors, aot_eager, opcheck) and a GPT with it as add_norm_op gives the loss and gradients of separate
adds and norms."""
import copy

import pytest

import kernellab
from kernellab.errors import ArgumentError
from kernellab.teach import add_norm as an

torch = pytest.importorskip("torch")
F = torch.nn.functional

from kernellab.run.sim.cuda import emulate  # noqa: E402
from sass_counts import assert_registers_only_and_deterministic, sass_ops  # noqa: E402
needs_cxx = pytest.mark.skipif(emulate.compiler() is None, reason="no host C++ compiler for the CPU path")

PAIRS = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)]
PAIR_IDS = ["fp32-fp32", "fp32-bf16", "bf16-bf16"]


@pytest.fixture(scope="module")
def module():
    return kernellab.compile_cuda(an.SOURCE, arch="sm_90", filename="add_norm.cu")


def test_the_kernels_compile_for_sm_90_without_spills_or_atomics(module):
    ct = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16"}
    want = {f"add_layernorm_rows<{ct[t]}, {ct[r]}, 1>" for t, r in PAIRS}
    want |= {f"add_layernorm_backward_rows<{ct[t]}, {ct[r]}, {c}>" for t, r in PAIRS for c in (1, 2)}
    want |= {f"add_norm_finish<{t}>" for t in ct.values()}
    assert {k.signature.display for k in module.kernels} == want
    assert_registers_only_and_deterministic(module.kernels)


def test_the_row_kernels_use_16_byte_accesses_and_fit_their_launch_bounds(module):
    for name, loads, stores in (("add_layernorm_rows<float, __nv_bfloat16, 1>", 5, 3),      # x 2, r 1, w 2 (b 2)
                                ("add_layernorm_rows<__nv_bfloat16, __nv_bfloat16, 1>", 3, 2),
                                ("add_layernorm_backward_rows<float, __nv_bfloat16, 1>", 5, 3),   # dy, h 2, w, dh_out
                                ("add_layernorm_backward_rows<float, float, 1>", 6, 2)):
        k = module[name]
        ops = sass_ops(k)
        got = ops.get("LDG.E.128.CONSTANT", 0) + ops.get("LDG.E.128", 0)
        assert got >= loads and ops.get("STG.E.128", 0) >= stores, (name, ops)
        assert k.resources.registers <= 65536 // k.resources.max_threads_per_block * (2 if "backward" in name else 1)
        if "backward" in name:                           # dh_out asked into L1 before the reductions
            assert ops.get("CCTL.E.PF1", 0) >= 1, (name, ops)
    assert module["add_layernorm_rows<float, __nv_bfloat16, 1>"].resources.max_threads_per_block == 1024
    for c, blocks in ((1, 2), (2, 1)):                  # the backward's launch bounds: 512 threads, 2 or 1 an SM
        k = module[f"add_layernorm_backward_rows<float, __nv_bfloat16, {c}>"]
        assert k.resources.max_threads_per_block == 512 and k.resources.registers <= 65536 // (512 * blocks)


# GPT-2's width, the tutorial 04 shapes that fit a block, and awkward ones: one element, odd widths, widths not a
# multiple of the chunk, several rows a block, the widest row (8192: two chunks a thread in the backward)
PLAN_SHAPES = [(16384, 768), (4096, 1024), (4096, 4096), (1000, 1031), (1, 1), (3, 7), (70, 64), (9, 8192),
               (5, 4099), (1, 768), (3, 100)]


@pytest.mark.parametrize("rows, cols", PLAN_SHAPES)
def test_the_plans_cover_every_row_and_column(rows, cols):
    row_threads, block, grid = an.plan_forward(rows, cols)
    assert row_threads % 32 == 0 and row_threads * 8 >= cols and row_threads * 8 < cols + 256, (rows, cols)
    assert block % row_threads == 0 and block <= 1024 and grid * (block // row_threads) >= rows
    assert (grid - 1) * (block // row_threads) < rows                # no block of dead rows only
    chunks, bt, bblock, bgrid = an.plan_backward(rows, cols, 132)
    assert bt % 32 == 0 and bt * 8 * chunks >= cols and bt <= 512 and bblock <= 512 and bblock % bt == 0
    assert chunks == (1 if cols <= 4096 else 2)
    groups = bblock // bt
    assert groups == 1 or groups * cols <= an.STAGE_FLOATS           # the shared stage of partial sums
    assert 1 <= bgrid <= 132 * max(1, (1024 if chunks == 1 else 512) // bblock)   # one wave: few partial rows
    assert bgrid * groups >= min(rows, bgrid * groups)
    if cols == 768:                                                  # GPT-2: 96 threads a row, none idle
        assert row_threads == bt == 96


def test_rows_too_long_or_dtypes_not_instantiated_are_refused_clearly():
    h = torch.zeros(2, 8)
    with pytest.raises(ArgumentError, match="shaped like h"):
        an.add_layernorm_backward(torch.zeros(2, 9), None, h, torch.ones(8))
    with pytest.raises(ArgumentError, match="shaped like h"):
        an.add_layernorm_backward(h, h.bfloat16(), h, torch.ones(8))
    with pytest.raises(ArgumentError, match="dtypes"):
        an.add_layernorm_backward(h, None, h.bfloat16(), torch.ones(8))
    x = torch.zeros(2, 8193)
    with pytest.raises(ArgumentError, match="up to 8192 columns"):
        an.add_layernorm(x, x, torch.ones(8193), torch.zeros(8193))
    x = torch.zeros(2, 8)
    with pytest.raises(ArgumentError, match="dtypes"):
        an.add_layernorm(x.bfloat16(), x, torch.ones(8).bfloat16(), torch.zeros(8).bfloat16())
    with pytest.raises(ArgumentError, match="same shape"):
        an.add_layernorm(x, torch.zeros(2, 9), torch.ones(8), torch.zeros(8))
    with pytest.raises(ArgumentError, match="w and b"):
        an.add_layernorm(x, x, torch.ones(8).bfloat16(), torch.zeros(8))


# --- the kernels on the CPU path against float64 ------------------------------------------------------------------

inputs = an.make_inputs          # (rows, cols, x dtype, r dtype, dist, device, seed): also the GPU tests'


def torch_grads(x, r, w, b, dy, up, dtype=None):
    """PyTorch's (h, y, dx, dr, dw, db) of x + r then F.layer_norm, in `dtype` (float64: the reference) or, None,
    in the inputs' own dtypes (y cast to r's as the op returns it: PyTorch's own error)."""
    ins = [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (x, r, w, b)]
    h = ins[0] + ins[1]
    y = F.layer_norm(h, (h.shape[-1],), ins[2], ins[3], 1e-5)
    y = y if dtype else y.to(r.dtype)
    if up is None:                                      # h not used again: the norm's gradient alone
        y.backward(dy.to(y.dtype))
    else:
        torch.autograd.backward([h, y], [up.to(h.dtype), dy.to(y.dtype)])
    return [h.detach(), y.detach()] + [t.grad for t in ins]


def errors(ours, x, r, w, b, dy, up):
    """{name: (our max |error|, PyTorch's in the same dtypes, the largest |value|)} against float64."""
    want = torch_grads(x, r, w, b, dy, up, torch.float64)
    theirs = torch_grads(x, r, w, b, dy, up)
    return {n: (float((o.double() - f).abs().max()), float((t.double() - f).abs().max()), float(f.abs().max()))
            for n, o, t, f in zip(("h", "y", "dx", "dr", "dw", "db"), ours, theirs, want)}


def passes(errs, pair):
    """Ours at most 2x PyTorch's own error plus a floor of a rounding of the largest value (bf16 outputs: 2^-8)."""
    ok = True
    for n, (o, t, scale) in errs.items():
        bf16 = pair[1] == torch.bfloat16 if n in ("y", "dr") else pair[0] == torch.bfloat16
        floor = 2.0 ** -8 if bf16 else 1e-6
        ok &= o <= 2 * t + floor * max(scale, 1.0)
    return ok


def ours_all(x, r, w, b, dy, up):
    h, y = an.add_layernorm(x, r, w, b, 1e-5)
    dh, dr, dw, db = an.add_layernorm_backward(dy, up, h, w, 1e-5)
    return h, y, dh, (dr if dr.numel() or not h.numel() else dh), dw, db


# a warp per row with 32 lanes idle (100), GPT-2's 768 (3 warps, several rows a block), one value, odd widths (element
# loads), 1031 (a row of 160 threads), 8192 (two chunks a thread in the backward)
EMU_SHAPES = [(3, 100), (5, 768), (1, 1), (3, 7), (70, 64), (2, 1031), (2, 8192)]


@needs_cxx
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_the_kernels_on_the_cpu_path_within_twice_pytorchs_error(pair):
    for dist in ("normal", "mean1e3"):
        for rows, cols in EMU_SHAPES:
            args = inputs(rows, cols, *pair, dist)
            got = ours_all(*args)
            assert got[0].dtype == pair[0] and got[1].dtype == pair[1] and got[3].dtype == pair[1]
            errs = errors(got, *args)
            assert passes(errs, pair), (dist, rows, cols, errs)


@needs_cxx
def test_without_a_gradient_from_the_stream_dh_is_the_norms_alone_and_the_criterion_can_fail():
    pair = (torch.float32, torch.bfloat16)
    x, r, w, b, dy, up = inputs(5, 768, *pair)
    h, _ = an.add_layernorm(x, r, w, b, 1e-5)
    alone = an.add_layernorm_backward(dy, None, h, w, 1e-5)
    added = an.add_layernorm_backward(dy, up, h, w, 1e-5)
    torch.testing.assert_close(added[0], alone[0] + up, rtol=1e-6, atol=1e-6)     # dh = dh_out + the norm's dx
    assert torch.equal(alone[2], added[2]) and torch.equal(alone[3], added[3])     # dw, db: the norm's alone
    ours = (h, an.add_layernorm(x, r, w, b, 1e-5)[1], alone[0], alone[1], alone[2], alone[3])
    assert passes(errors(ours, x, r, w, b, dy, None), pair)
    assert not passes(errors(ours, x, r, w, b, dy, up), pair)    # dh_out dropped: far outside the criterion


@needs_cxx
def test_the_row_loop_and_the_partial_sums_are_deterministic(monkeypatch):
    """Two runs give the same bits; a grid of fewer blocks (each walking several groups of rows: the parity of the
    shared slots, the stage of several groups) gives the same dh and dw, db within rounding."""
    x, r, w, b, dy, up = inputs(70, 64, torch.float32, torch.float32)
    h, _ = an.add_layernorm(x, r, w, b)
    one = an.add_layernorm_backward(dy, up, h, w)
    two = an.add_layernorm_backward(dy, up, h, w)
    assert all(torch.equal(a, c) for a, c in zip(one, two))
    assert an.plan_backward(70, 64, 132)[3] == 5                      # 16 rows a block: 5 blocks, one round each
    monkeypatch.setattr(an, "_sms", lambda device: 1)
    monkeypatch.setattr(an, "_BACKWARD", {})                         # the launches configured for 132 SMs
    assert an.plan_backward(70, 64, 1)[3] == 2                        # 2 blocks: 3 rounds each
    few = an.add_layernorm_backward(dy, up, h, w)
    assert torch.equal(one[0], few[0])
    assert torch.allclose(one[2], few[2], atol=1e-5) and torch.allclose(one[3], few[3], atol=1e-5)


@needs_cxx
def test_no_shared_memory_race_or_barrier_fault_with_several_rows_a_block_and_a_row_loop():
    """The CPU path's racecheck and synccheck on both kernels with 8 (forward) and 16 (backward) rows a block, the
    backward's 2 blocks each walking 3 rounds of rows (the shared slots' parity, the stage of the partial sums)."""
    mod = an.kernels("cpu")
    x, r, w, b, dy, up = inputs(70, 64, torch.float32, torch.bfloat16)
    rt, block, grid = an.plan_forward(70, 64)
    assert block // rt == 8
    h, y = torch.empty_like(x), torch.empty_like(r)
    fwd = mod["add_layernorm_rows<float, __nv_bfloat16, 1>"]
    chunks, brt, bblock, _ = an.plan_backward(70, 64, 132)
    assert bblock // brt == 16
    dh, dr, partial = torch.empty_like(h), torch.empty_like(r), torch.empty(2, 2, 64)
    bwd = mod["add_layernorm_backward_rows<float, __nv_bfloat16, 1>"]
    for tool in ("racecheck", "synccheck"):
        report = fwd.sanitize(grid, block, x, r, w, b, h, y, 70, 64, rt, 1, 1e-5, tool=tool)
        assert report.ok and report.simulated, str(report)
        report = bwd.sanitize(2, bblock, dy, up, h, w, dh, dr, partial, 70, 64, brt, 1, 1e-5, tool=tool)
        assert report.ok and report.simulated, str(report)


# --- the op --------------------------------------------------------------------------------------------------------

@needs_cxx
@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[1]], ids=PAIR_IDS[:2])
def test_the_ops_backward_through_h_and_y_matches_float64(pair):
    """loss.backward() through kl::add_layernorm on [batch, sequence, width] inputs, h and y both used (the stream
    goes on, the norm feeds a branch), against x + r and F.layer_norm in float64; r's gradient in r's dtype."""
    x, r, w, b, dy, up = inputs(6, 37, *pair)
    x, r, dy, up = (t.reshape(2, 3, 37) for t in (x, r, dy, up))
    leaves = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    h, y = an.kl_add_layernorm(*leaves, 1e-5)
    assert h.shape == y.shape == (2, 3, 37) and h.dtype == pair[0] and y.dtype == pair[1]
    ((h * up).sum() + (y.float() * dy.float()).sum()).backward()
    ref = [t.detach().double().requires_grad_(True) for t in (x, r, w, b)]
    h64 = ref[0] + ref[1]
    y64 = F.layer_norm(h64, (37,), ref[2], ref[3], 1e-5)
    ((h64 * up.double()).sum() + (y64 * dy.double()).sum()).backward()
    for got, want in zip(leaves, ref):
        assert got.grad.shape == want.shape and got.grad.dtype == got.dtype
        tol = 2e-5 if got.dtype == torch.float32 else 2e-2
        assert torch.allclose(got.grad.double(), want.grad, atol=tol, rtol=tol), (got.grad.double() - want.grad).abs().max()


@needs_cxx
def test_the_op_with_h_unused_takes_no_stream_gradient():
    """A last norm: only y goes on; h's gradient is None (not a tensor of zeros) and dx = dr = the norm's."""
    x, r, w, b, dy, _ = inputs(4, 40, torch.float32, torch.float32)
    leaves = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    _, y = an.kl_add_layernorm(*leaves, 1e-5)
    (y * dy).sum().backward()
    ref = [t.detach().clone().requires_grad_(True) for t in (x, r, w, b)]
    (F.layer_norm(ref[0] + ref[1], (40,), ref[2], ref[3], 1e-5) * dy).sum().backward()
    for got, want in zip(leaves, ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)


@needs_cxx
def test_the_op_traces_on_fake_tensors_and_under_aot_eager():
    x = torch.empty(4, 8, 96, device="meta", requires_grad=True)
    r = torch.empty(4, 8, 96, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(96, device="meta", requires_grad=True)
    b = torch.empty(96, device="meta", requires_grad=True)
    h, y = an.kl_add_layernorm(x, r, w, b, 1e-5)
    assert (h.dtype, y.dtype, h.shape, y.shape) == (torch.float32, torch.bfloat16, x.shape, x.shape)
    (h.sum() + y.float().sum()).backward()
    assert r.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape and w.grad.shape == b.grad.shape == (96,)

    def f(x, r, w, b):
        h, y = an.kl_add_layernorm(x, r, w, b, 1e-5)
        return (h * h).sum() + y.sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x, r, w, b, _, _ = inputs(5, 40, torch.float32, torch.float32)
    got = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    want = [t.clone().double().requires_grad_(True) for t in (x, r, w, b)]
    compiled(*got).backward()
    h = want[0] + want[1]
    ((h * h).sum() + F.layer_norm(h, (40,), want[2], want[3], 1e-5).sum()).backward()
    for g, r_ in zip(got, want):
        assert torch.allclose(g.grad.double(), r_.grad, atol=1e-4, rtol=1e-4), (g.grad - r_.grad).abs().max()


@needs_cxx
@pytest.mark.slow
def test_the_ops_pass_opcheck_on_the_cpu():
    x, r, w, b, dy, up = inputs(3, 40, torch.float32, torch.bfloat16)
    ops = an.ops()
    ops["forward"].opcheck(x.requires_grad_(True), r.requires_grad_(True), w.requires_grad_(True),
                           b.requires_grad_(True), 1e-5)
    h = x.detach() + r.detach()
    ops["backward"].opcheck(dy, up, h, w.detach(), 1e-5)
    ops["backward"].opcheck(dy, None, h, w.detach(), 1e-5)


# --- the model -----------------------------------------------------------------------------------------------------

def _model_and_batch():
    from kernellab.teach.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    reference = GPT(GPTConfig.tiny())
    with torch.no_grad():                                  # norms that are not 1 and 0, so dw and db are tested
        for n, p in reference.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    return reference, x, torch.roll(x, -1, 1)


def loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class Counted:
    """An add_norm_op that counts its calls."""

    def __init__(self, op):
        self.op, self.calls = op, 0

    def __call__(self, *args):
        self.calls += 1
        return self.op(*args)


def test_the_gpt_with_pytorchs_add_norm_gives_the_same_loss_and_gradients():
    """The wiring alone: add_norm_op = x + r and F.layer_norm (reference_add_layernorm) through the fused path
    gives the separate path's loss and gradients exactly, one call per add that a norm follows."""
    reference, x, y = _model_and_batch()
    want_loss, want = loss_and_grads(reference, x, y)
    op = Counted(an.reference_add_layernorm)
    fused = copy.deepcopy(reference).set_ops(add_norm_op=op)
    got_loss, got = loss_and_grads(fused, x, y)
    assert set(got) == set(want) == {n for n, _ in fused.named_parameters()}
    n = fused.config.n_layers
    assert op.calls == 2 * n                               # norm2 of each block, norm1 of the next, the final norm
    assert torch.equal(got_loss, want_loss)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=lambda m, k=name: f"{k}: {m}")
    block = fused.blocks[0]                                # a block alone: forward(x) with the op = without it
    h = torch.randn(2, 5, fused.config.d_model)
    torch.testing.assert_close(block(h), reference.blocks[0](h), rtol=0, atol=0)
    fused.set_ops()
    assert fused.add_norm_op is None and all(b.add_norm_op is None for b in fused.blocks)
    assert torch.equal(loss_and_grads(fused, x, y)[0], want_loss)


def test_a_wrong_add_norm_op_changes_the_loss():
    """The comparison above can fail: an op that forgets the residual add is caught."""
    reference, x, y = _model_and_batch()
    want_loss, _ = loss_and_grads(reference, x, y)

    def no_add(x2, r2, w, b, eps):
        return x2 + r2, F.layer_norm(x2, (x2.shape[-1],), w, b, eps)
    got_loss, _ = loss_and_grads(copy.deepcopy(reference).set_ops(add_norm_op=no_add), x, y)
    assert not torch.allclose(got_loss, want_loss, rtol=1e-4)


@needs_cxx
def test_the_gpt_with_kl_add_layernorm_on_the_cpu_path_gives_pytorchs_loss_and_gradients():
    reference, x, y = _model_and_batch()
    want_loss, want = loss_and_grads(reference, x, y)
    fused = copy.deepcopy(reference).set_ops(add_norm_op=an.kl_add_layernorm)
    got_loss, got = loss_and_grads(fused, x, y)
    assert set(got) == set(want) == {n for n, _ in fused.named_parameters()}
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=lambda m, k=name: f"{k}: {m}")


def test_add_norm_op_needs_layernorm():
    from kernellab.teach.block import TransformerBlock
    with pytest.raises(ValueError, match="needs norm='layernorm'"):
        TransformerBlock(64, 2, norm="rmsnorm", add_norm_op=an.reference_add_layernorm)


def test_the_predictions_written_down_are_the_models():
    """benchmarks/add_norm.py's docstring and NOTES-memory-bound.md state the model's µs at 16384 x 768 (float32
    stream, bf16 branch) before a GPU ran the kernels: the same numbers as kernellab.teach.add_norm.model_us."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    got = {k: f"{v:.1f}" for k, v in an.model_us(16384, 768).items()}
    assert got == {"fused": "124.9", "fused forward": "52.8", "fused backward": "72.1", "add + kl_layernorm": "271.7",
                   "torch.compile": "124.9"}, got
    doc = (root / "benchmarks" / "add_norm.py").read_text()
    notes = (root / "benchmarks" / "NOTES-memory-bound.md").read_text()
    notes = notes[notes.index("## Residual add fused with LayerNorm"):]
    for text in (doc, notes):
        for v in got.values():
            assert f"{v} µs" in text, v


# --- tutorial 04's section on the fused op ------------------------------------------------------------------------

def _tutorial_04_cell(marker: str) -> str:
    """The Python cell of notebooks/04-layernorm.py that holds `marker`."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "04-layernorm.py").read_text()
    found = [c for c in re.split(r"^# %%(?: .*)?\n", text, flags=re.M) if marker in c and not c.startswith("# %%")]
    assert len(found) == 1, f"{len(found)} cells of tutorial 04 hold {marker!r}"
    return found[0]


def _bytes_cell_ns() -> dict:
    """The tutorial's bytes cell run (with the names its notebook gives it: math, torch, HTML, html_table)."""
    import math

    from kernellab.report import html_table
    ns = {"math": math, "torch": torch, "HTML": lambda html: html, "html_table": html_table}
    exec(compile(_tutorial_04_cell("def add_norm_bytes("), "04-layernorm.py", "exec"), ns)
    return ns


@pytest.mark.parametrize("rows, cols", [(16384, 768), (4096, 1024), (1, 1), (1000, 1031)])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_the_tutorials_bytes_and_prediction_are_the_models(rows, cols, pair):
    """Tutorial 04 counts the bytes of the separate add and norm and of the fused op itself; at 3 TB/s + 2.5 µs a
    kernel they give kernellab.teach.add_norm.model_us, the prediction the benchmark prints beside each result."""
    ns = _bytes_cell_ns()
    x_bytes, r_bytes = pair[0].itemsize, pair[1].itemsize
    got = ns["add_norm_prediction_us"](rows, cols, x_bytes, r_bytes)
    want = an.model_us(rows, cols, x_bytes, r_bytes)
    assert set(got) == {"fused", "add + kl_layernorm"}
    for name, us in got.items():
        assert us == pytest.approx(want[name], rel=1e-12), (name, us, want[name])
    counted = ns["add_norm_bytes"](rows, cols, x_bytes, r_bytes)
    fused_fwd, fused_bwd, _ = counted["fused"]
    assert fused_fwd / 3e6 + 2.5 == pytest.approx(want["fused forward"])
    assert fused_bwd / 3e6 + 5.0 == pytest.approx(want["fused backward"])


def test_the_tutorials_table_of_bytes_per_element_is_what_the_cell_counts():
    """The markdown's bytes an element (60 against 28 with a float32 stream, 22 against 16 in bf16) match the cell."""
    ns = _bytes_cell_ns()
    per_element = {pair: {k: (f + b) // 1000 for k, (f, b, _) in ns["add_norm_bytes"](10, 100, *pair).items()}
                   for pair in ((4, 2), (2, 2))}
    assert per_element == {(4, 2): {"add + kl_layernorm": 60, "fused": 28}, (2, 2): {"add + kl_layernorm": 22,
                                                                                   "fused": 16}}
    text = _tutorial_04_cell("### Bytes, separately and fused")
    assert "`5X + 2R` = 24" in text and "`8X + 2R` = 36" in text and "`2X + 2R` = 12" in text
    assert "`3X + 2R` = 16" in text
    for pair, words in (((4, 2), "{} bytes an element against {}"), ((2, 2), "{} against {} bytes an element")):
        said = words.format(per_element[pair]["add + kl_layernorm"], per_element[pair]["fused"])
        assert said in text, (pair, said)


def test_the_tutorials_written_prediction_states_the_models_numbers():
    text = _tutorial_04_cell("### Prediction")
    for x_bytes in (4, 2):
        model = an.model_us(16384, 768, x_bytes, 2)
        for name in ("fused", "fused forward", "fused backward", "add + kl_layernorm"):
            assert f"{model[name]:.1f}" in text, (x_bytes, name, model[name])


def test_the_tutorial_shows_each_kernel_the_op_launches_whole_from_the_header(capsys):
    """The cell that prints the device code takes it from <kl/add_norm.cuh> (not a copy): each printed definition is
    a whole function (its braces balance only at its last line), with the comment above it, of a kernel the op's
    module compiles."""
    ns: dict = {}
    exec(compile(_tutorial_04_cell("def device_function("), "04-layernorm.py", "exec"), ns)
    printed = capsys.readouterr().out
    module = kernellab.compile_cuda(an.SOURCE, arch="sm_90", filename="add_norm.cu")
    for name in ("add_layernorm_rows", "add_layernorm_backward_rows"):
        assert name in {k.name for k in module.kernels}
        text = ns["device_function"]("add_norm.cuh", name)
        assert text in printed and text.startswith("//") and text.endswith("}") and f"{name}(" in text
        body = text[text.index("{"):]
        depth = [0]
        for ch in body:
            depth.append(depth[-1] + (ch == "{") - (ch == "}"))
        assert depth[-1] == 0 and min(depth[1:-1]) > 0, name
