"""kl::add_layernorm (kernellab.teach.add_norm) on a GPU: h, y and the gradients of x, r, w, b against float64 beside
PyTorch's own error (x + r then F.layer_norm, the same dtypes) on awkward shapes, two input distributions and the
three (x, r) dtype pairs; determinism; the op under loss.backward() against F.layer_norm(x + r), with h unused,
opcheck, torch.compile(fullgraph=True), a CUDA graph; a GPT under bf16 autocast with it as add_norm_op, one step and
30 steps of training (eager and graphed) inside eager PyTorch's seed band.

Each failure names the dtypes, distribution, shape and the errors (ours, PyTorch's, the largest reference value) of
each output and gradient.
"""
import copy
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))      # tests/: the CPU tests' helpers
from test_add_norm import PAIR_IDS, PAIRS, errors, inputs, passes  # noqa: E402

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

from kernellab.teach import add_norm as an  # noqa: E402

# one element; odd widths (element loads); a warp per row with lanes idle (100); GPT-2's width, few rows and at its
# batch (16 x 1024 tokens); 1031 (160 threads a row); a block of 512 a row (4096); the widest (8192: two chunks a
# thread in the backward); many rows of 64 (16 rows a block)
SHAPES = [(1, 1), (3, 7), (3, 100), (5, 768), (37, 768), (16384, 768), (1000, 1031), (5, 4099), (64, 4096),
          (9, 8192), (4096, 64)]
DISTS = ["normal", "mean1e3"]


def cuda(ts):
    return tuple(t.cuda() for t in ts)


def describe(errs):
    return ", ".join(f"{k}: ours {o:.3g}, PyTorch {t:.3g} (largest {s:.3g})" for k, (o, t, s) in errs.items())


def ours_all(x, r, w, b, dy, up):
    h, y = an.add_layernorm(x, r, w, b, 1e-5)
    dh, dr, dw, db = an.add_layernorm_backward(dy, up, h, w, 1e-5)
    return h, y, dh, (dr if dr.numel() or not h.numel() else dh), dw, db


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_the_kernels_within_twice_pytorchs_error(pair, dist):
    bad = []
    for rows, cols in SHAPES:
        args = cuda(inputs(rows, cols, *pair, dist))
        got = ours_all(*args)
        assert got[0].dtype == pair[0] and got[1].dtype == pair[1] and got[3].dtype == pair[1]
        errs = errors(got, *args)
        if not passes(errs, pair):
            bad.append(f"{rows}x{cols}: {describe(errs)}")
    assert not bad, f"{PAIR_IDS[PAIRS.index(pair)]} {dist}: " + "; ".join(bad)


def test_without_the_streams_gradient_and_deterministic():
    x, r, w, b, dy, up = cuda(inputs(16384, 768, torch.float32, torch.bfloat16))
    h, _ = an.add_layernorm(x, r, w, b)
    one = an.add_layernorm_backward(dy, up, h, w)
    two = an.add_layernorm_backward(dy, up, h, w)
    assert all(torch.equal(a, c) for a, c in zip(one, two)), "two runs of the backward differ"
    alone = an.add_layernorm_backward(dy, None, h, w)
    torch.testing.assert_close(one[0], alone[0] + up, rtol=1e-6, atol=1e-5)
    assert torch.equal(one[2], alone[2]) and torch.equal(one[3], alone[3])


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_the_ops_gradients_against_f_layer_norm_of_x_plus_r(pair):
    """loss.backward() through the op on [batch, tokens, width] (h and y both used) against x + r and F.layer_norm
    in float64 and in the inputs' dtypes: ours within 2x PyTorch's error."""
    x, r, w, b, dy, up = cuda(inputs(2 * 333, 768, *pair, "normal", seed=1))
    shape = (2, 333, 768)

    def run(fn, dtype=None):
        leaves = [t.detach().to(dtype or t.dtype).reshape(shape if t.dim() == 2 else t.shape).requires_grad_(True)
                  for t in (x, r, w, b)]
        h, y = fn(*leaves)
        ((h * up.reshape(shape).to(h.dtype)).sum() + (y * dy.reshape(shape).to(y.dtype)).sum()).backward()
        return [h.detach(), y.detach()] + [t.grad for t in leaves]

    def pytorch(x, r, w, b, cast=True):
        h = x + r
        y = F.layer_norm(h, (768,), w, b, 1e-5)
        return h, (y.to(r.dtype) if cast else y)

    ours = run(lambda *a: an.kl_add_layernorm(*a, 1e-5))
    want = run(lambda *a: pytorch(*a, cast=False), torch.float64)
    theirs = run(pytorch)
    errs = {n: (float((o.double() - f).abs().max()), float((t.double() - f).abs().max()), float(f.abs().max()))
            for n, o, t, f in zip(("h", "y", "dx", "dr", "dw", "db"), ours, theirs, want)}
    assert ours[3].dtype == pair[1] and ours[2].dtype == pair[0]
    assert passes(errs, pair), describe(errs)


def test_the_op_with_h_unused_opcheck_compile_and_a_cuda_graph():
    x, r, w, b, dy, _ = cuda(inputs(1024, 768, torch.float32, torch.bfloat16))
    leaves = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    _, y = an.kl_add_layernorm(*leaves, 1e-5)
    y.backward(dy)
    ref = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    F.layer_norm(ref[0] + ref[1], (768,), ref[2], ref[3], 1e-5).to(torch.bfloat16).backward(dy)
    for n, g, want in zip("xrwb", leaves, ref):
        torch.testing.assert_close(g.grad.float(), want.grad.float(), rtol=2e-2, atol=2e-2, msg=lambda m, n=n: f"d{n}: {m}")
    an.kl_add_layernorm.opcheck(*(t.clone().requires_grad_(True) for t in (x[:37], r[:37], w, b)), 1e-5)

    def f(x, r, w, b):
        h, y = an.kl_add_layernorm(x, r, w, b, 1e-5)
        return (h * h).sum() + y.float().sum()

    eager = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    f(*eager).backward()
    torch._dynamo.reset()
    compiled = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    torch.compile(f, fullgraph=True)(*compiled).backward()
    for n, a, c in zip("xrwb", eager, compiled):
        torch.testing.assert_close(c.grad, a.grad, rtol=1e-5, atol=1e-5, msg=lambda m, n=n: f"compiled d{n}: {m}")
    # forward and backward captured as one CUDA graph, replayed on new values of the same buffers
    static = [t.clone().requires_grad_(True) for t in (x, r, w, b)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            gs = torch.autograd.grad(f(*static), static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gs = torch.autograd.grad(f(*static), static)
    with torch.no_grad():
        for s, t in zip(static, inputs(1024, 768, torch.float32, torch.bfloat16, seed=5)):
            s.copy_(t)
    graph.replay()
    fresh = [t.detach().clone().requires_grad_(True) for t in static]
    want = torch.autograd.grad(f(*fresh), fresh)
    for n, a, c in zip("xrwb", want, gs):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5, msg=lambda m, n=n: f"graphed d{n}: {m}")


def test_a_gpt_under_autocast_with_the_fused_op_matches_the_separate_adds():
    """GPT-2's layout at a tiny size under bf16 autocast, one step's loss and gradients: the fused op's against
    x + r and F.layer_norm's (the same bf16 matmuls; only the norms' rounding differs)."""
    from kernellab.teach.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    reference = GPT(GPTConfig.tiny()).cuda()
    fused = copy.deepcopy(reference).set_ops(add_norm_op=an.kl_add_layernorm)
    x = torch.randint(0, 256, (4, 128), generator=torch.Generator().manual_seed(0)).cuda()
    out = []
    for model in (reference, fused):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        out.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (want_loss, want), (got_loss, got) = out
    torch.testing.assert_close(got_loss, want_loss, rtol=2e-3, atol=2e-3)
    for n in want:
        scale = float(want[n].abs().max()) or 1.0
        assert float((got[n] - want[n]).abs().max()) <= 0.05 * scale, n


def test_a_tiny_gpt_trains_with_the_fused_op_eager_and_graphed_inside_the_seed_band():
    """30 steps of the 2-layer GPT (bf16 autocast, AdamW) with kl_add_layernorm as add_norm_op, eager and as one CUDA
    graph a step: both curves inside the band of eager PyTorch's two seeds; every step after the warm-up a replay."""
    from kernellab.teach.gpt import ByteCorpus, GPTConfig, train, within_noise
    corpus = ByteCorpus.stdlib()
    kw = dict(config=GPTConfig.tiny(), steps=30, batch=8, seq=128, device="cuda")
    eager = train(corpus, name="eager", seed=0, **kw)
    seed1 = train(corpus, name="eager-seed1", seed=1, **kw)
    fused = train(corpus, name="fused", seed=0, add_norm_op=an.kl_add_layernorm, **kw)
    graphed = train(corpus, name="fused-graphs", seed=0, add_norm_op=an.kl_add_layernorm, graphs=True, **kw)
    for run in (fused, graphed):
        assert sum(run.losses[-5:]) / 5 < run.losses[0] - 1.0, f"{run.name}: it did not learn: {run.losses}"
        v = within_noise(eager.losses, seed1.losses, run.losses, window=10)
        assert v.within, f"{run.name} against eager, seed band: {v}"
    assert graphed.replays == 30 - graphed.captured_at, (graphed.captured_at, graphed.replays)
