"""Tutorial 04's LayerNorm and RMSNorm backward on a GPU: dx, dw and db against float64 beside PyTorch's own error
(F.layer_norm / F.rms_norm backward in the same dtype) on awkward shapes, three input distributions, both dtypes;
the partial sums' determinism; kl::layernorm and kl::rmsnorm under loss.backward(), opcheck and torch.compile.

The kernels and launchers are the notebook's own (its `norm_backward` %%cuda cell and `# launchers` cells, loaded by
notebook_cells.load_tutorial). Each failure names the op, dtype, distribution, shape and the errors (ours, PyTorch's,
the largest reference value) of each gradient.
"""
import pytest

from notebook_cells import load_tutorial

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

EPS = 1e-5
DTYPES = [torch.float32, torch.bfloat16]
# one element; odd widths; widths not a multiple of the pack (4099, 1031); a warp per row with several rows a block
# (37 x 768, 4096 x 64); a block per row (1024, 4096); 1024 threads a row (bf16 8192; float's column tiles); the
# long rows as statistics then column tiles (9000, 40000, 65537, 100003, 300007; few of them: the statistics by column
# slices; 300 x 9000: a block per row); one row; GPT-2's width at its batch
SHAPES = [(1, 1), (3, 7), (1, 1031), (6, 1031), (1000, 1031), (37, 768), (4096, 64), (64, 1024), (5, 4099),
          (9, 8192), (4096, 4096), (3, 9000), (300, 9000), (2, 40000), (7, 65537), (3, 100003), (1, 300007),
          (8192, 768)]
DISTS = ["normal", "mean1e3", "heavy"]


@pytest.fixture(scope="module")
def t04():
    return load_tutorial("04-layernorm.py")


def describe(errors):
    return ", ".join(f"{k}: ours {o:.3g}, PyTorch {t:.3g} (largest value {s:.3g})" for k, (o, t, s) in errors.items())


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_gradients_within_twice_pytorchs_error(t04, kind, dtype, dist):
    failed = []
    for r, c in SHAPES:
        dy, x, w, b = t04["bwd_inputs"](r, c, dtype, dist, device="cuda")
        errors = t04["backward_errors"](kind, dy, x, w, b, EPS)
        if not t04["backward_passes"](errors, dtype):
            failed.append(f"{r}x{c} ({t04['plan_backward'](r, c, dtype.itemsize)}): {describe(errors)}")
    assert not failed, f"{kind} backward {dtype} x={dist}: " + "; ".join(failed)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_partial_sums_give_the_same_bits_every_run(t04, dtype):
    for r, c in ((4096, 1024), (3, 9000), (37, 768), (3, 100003), (300, 9000)):
        dy, x, w, b = t04["bwd_inputs"](r, c, dtype, "normal", device="cuda")
        first = t04["layernorm_backward"](dy, x, w, EPS)
        for _ in range(3):
            again = t04["layernorm_backward"](dy, x, w, EPS)
            assert all(torch.equal(a, c2) for a, c2 in zip(first, again)), (r, c, "LayerNorm backward not deterministic")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_long_rows_statistics_by_slices_and_by_rows_agree(t04, kind, dtype):
    """The long rows' two ways to their statistics, forced by the plan (column slices combined by Chan's merge; a
    block per row): each within 2x PyTorch's error against float64, and (centred inputs) the two within a rounding of
    each other.
    The launcher's own choice at 3 x 100003 and 7 x 65537 is the slices (fewer than two rows an SM)."""
    import dataclasses

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for r, c in ((3, 100003), (7, 65537), (300, 9000), (2, 16392)):
        plan = t04["plan_backward"](r, c, dtype.itemsize)
        assert plan.kernel == "tiles" and plan.split == (r < 2 * sms), (r, c, plan)
        for dist in ("normal", "mean1e3"):
            dy, x, w, b = t04["bwd_inputs"](r, c, dtype, dist, device="cuda")
            want = t04["reference_backward"](kind, dy, x, w, b, EPS, torch.float64)
            theirs = t04["reference_backward"](kind, dy, x, w, b, EPS)
            got = {}
            for split in (True, False):
                ours = t04[f"{kind}_backward"](dy, x, w, EPS, plan=dataclasses.replace(plan, split=split))
                errors = {n: ((o.double() - f).abs().max().item(), (t.double() - f).abs().max().item(),
                              f.abs().max().item()) for n, o, t, f in zip(("dx", "dw", "db"), ours, theirs, want)}
                assert t04["backward_passes"](errors, dtype), \
                    f"{kind} {dtype} {dist} {r}x{c} statistics by {'slices' if split else 'rows'}: {describe(errors)}"
                got[split] = ours
            if dist != "normal":                       # at a mean of 1e3 each is held to float64 above
                continue
            for name, a, c2, f in zip(("dx", "dw", "db"), got[True], got[False], want):
                gap, scale = (a.double() - c2.double()).abs().max().item(), f.abs().max().item()
                assert gap <= (2.0 ** -7 if dtype == torch.bfloat16 else 1e-5) * max(scale, 1.0), \
                    f"{kind} {dtype} {dist} {r}x{c} {name}: slices and rows differ by {gap:.3g} (largest {scale:.3g})"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_the_ops_loss_backward_against_pytorch(t04, kind, dtype):
    """loss.backward() through the op on [batch, sequence, width] (GPT-2's 768 and an odd width), the loss's gradient
    expanded (y.sum()) and weighted; x's, w's and b's gradients within 2x PyTorch's error against float64."""
    for shape in ((4, 256, 768), (2, 33, 1031)):
        c = shape[-1]
        dy, x, w, b = t04["bwd_inputs"](shape[0] * shape[1], c, dtype, "normal", device="cuda")
        x = x.reshape(shape)
        weight = dy.reshape(shape)
        leaves = [t.clone().requires_grad_(True) for t in ((x, w, b) if kind == "layernorm" else (x, w))]
        op = t04[f"kl_{kind}"]
        y = op(*leaves, EPS)
        (y * weight).sum().backward()
        ref = [t.detach().double().requires_grad_(True) for t in leaves]
        theirs = [t.detach().clone().requires_grad_(True) for t in leaves]
        for args, dt in ((ref, torch.float64), (theirs, dtype)):
            yy = F.layer_norm(args[0], (c,), *args[1:], EPS) if kind == "layernorm" else F.rms_norm(args[0], (c,), args[1], EPS)
            (yy * weight.to(dt)).sum().backward()
        errors = {name: ((o.grad.double() - r.grad).abs().max().item(), (t.grad.double() - r.grad).abs().max().item(),
                         r.grad.abs().max().item()) for name, o, t, r in zip(("dx", "dw", "db"), leaves, theirs, ref)}
        assert t04["backward_passes"](errors, dtype), f"kl::{kind} {dtype} {shape}: {describe(errors)}"


def test_the_ops_pass_opcheck_with_gradients(t04):
    dy, x, w, b = t04["bwd_inputs"](37, 1031, torch.float32, "normal", device="cuda")
    t04["kl_layernorm"].opcheck(x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True), EPS)
    t04["kl_rmsnorm"].opcheck(x, w, EPS)
    t04["kl_layernorm_backward"].opcheck(dy, x.detach(), w.detach(), EPS)
    t04["kl_rmsnorm_backward"].opcheck(dy, x.detach(), w.detach(), EPS)


def test_a_compiled_model_trains_through_the_ops(t04):
    """torch.compile(fullgraph=True) of x -> layernorm -> linear -> rmsnorm: the gradients of every parameter match
    the same model with PyTorch's norms (bf16 under the op, fp32 parameters cast to it)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(768, 768, device="cuda", dtype=torch.bfloat16)
    w1, b1, w2 = (torch.randn(768, device="cuda", dtype=torch.bfloat16) * 0.1 + 1 for _ in range(3))

    def model(x, w1, b1, w2, ours):
        h = t04["kl_layernorm"](x, w1, b1, EPS) if ours else F.layer_norm(x, (768,), w1, b1, EPS)
        h = lin(h)
        return t04["kl_rmsnorm"](h, w2, EPS) if ours else F.rms_norm(h, (768,), w2, EPS)

    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(8, 128, 768, device="cuda", dtype=torch.bfloat16)
    grads = {}
    for ours in (True, False):
        params = [t.clone().requires_grad_(True) for t in (x, w1, b1, w2)]
        lin.zero_grad()
        (compiled if ours else model)(*params, ours).float().square().mean().backward()
        grads[ours] = [p.grad.float() for p in params] + [lin.weight.grad.float()]
    for name, a, b in zip(("x", "w1", "b1", "w2", "linear weight"), grads[True], grads[False]):
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= 0.03 * scale + 1e-6, (name, (a - b).abs().max().item(), scale)


def test_a_models_call_takes_the_eager_graph_path_and_gives_the_dispatchers_gradients(t04):
    """kl::layernorm as GPT-2's blocks call it: fp32 x [rows, 768], nn.Parameter w and b, under bf16 autocast. The
    eager call records the op's own graph node (KernellabOp_kl_layernormBackward: the dispatcher and torch's Python
    Autograd kernel skipped, the host path of a training step); through torch.ops (the dispatcher) the same kernels
    run, so every gradient is the same bits."""
    op = t04["kl_layernorm"]
    dy, x, w, b = t04["bwd_inputs"](4 * 1024, 768, torch.float32, "normal", device="cuda")
    w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)
    grads = {}
    for name, call in (("eager", op), ("dispatcher", op.overload)):
        xs = x.clone().requires_grad_(True)
        w.grad = b.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = call(xs, w, b, EPS)
        assert y.dtype == torch.float32
        node = type(y.grad_fn).__name__
        assert node.startswith("KernellabOp_kl_layernorm" if name == "eager" else "GeneratedBackwardFor_kl_layernorm"), \
            (name, node)
        y.backward(dy)
        grads[name] = (y.detach(), xs.grad, w.grad.clone(), b.grad.clone())
    for what, a, c in zip(("y", "dx", "dw", "db"), grads["eager"], grads["dispatcher"]):
        assert torch.equal(a, c), (what, (a - c).abs().max().item())
