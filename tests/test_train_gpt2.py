"""kernellab.teach.gpt and benchmarks/train_gpt2.py on the CPU: the GPT's forward and backward, its pluggable
attention and norm ops (pure-torch stand-ins with their own backward, which must give PyTorch's loss and gradients),
the byte corpus's determinism, the noise-band test on synthetic curves (both verdicts), the learning-rate schedule,
the ops' probes, the script's table, JSON and plot from a small CPU run, and the graphed configurations' pieces
(the plan of warm-up and capture, the capturable optimiser's learning rate, GraphedStep's static buffers under a
stand-in graph, the table and arguments). The GPU paths, the capture itself included, are in
tests/gpu/test_train_gpt2_gpu.py."""
import contextlib
import importlib.util
import inspect
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernellab.teach.gpt import (GPT, ByteCorpus, GPTConfig, lr_at, pad_vocab, smooth, stdlib_files, train,
                                 within_noise)

ROOT = Path(__file__).resolve().parents[1]
TINY = GPTConfig.tiny()


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_gpt2", ROOT / "benchmarks" / "train_gpt2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- stand-in ops: pure torch, each with its own backward (the formulas tutorials 08 and 04 implement) ----

class _Attention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d), causal) v, saving the log-sum-exp; backward recomputes P from it:
    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        scale = q.shape[-1] ** -0.5
        s = (q @ k.transpose(-2, -1)) * scale                                     # [B, H, N, N]
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        o = torch.exp(s - lse) @ v
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        s = (q @ k.transpose(-2, -1)) * ctx.scale
        if ctx.causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        p = torch.exp(s - lse)
        dv = p.transpose(-2, -1) @ do
        dp = do @ v.transpose(-2, -1)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        return ds @ k * ctx.scale, ds.transpose(-2, -1) @ q * ctx.scale, dv, None


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the rows of [rows, d]; backward: db = sum dy, dw = sum dy * xhat,
    dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat))."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
        xhat = (x - mean) * rstd
        ctx.save_for_backward(xhat, rstd, w)
        return xhat * w + b

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, w = ctx.saved_tensors
        g = dy * w
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx, (dy * xhat).sum(0), dy.sum(0), None


class Counted:
    """A stand-in op that counts its calls and checks the contract's shapes."""

    def __init__(self, fn, check):
        self.fn, self.check, self.calls = fn, check, 0

    def __call__(self, *args):
        self.check(*args)
        self.calls += 1
        return self.fn(*args)


def _attention_contract(q, k, v, causal):
    assert q.dim() == 4 and q.shape == k.shape == v.shape and all(t.is_contiguous() for t in (q, k, v))
    assert causal is True


def _norm_contract(x, w, b, eps):
    assert x.dim() == 2 and x.shape[1] == w.shape[0] == b.shape[0] and eps == TINY.eps


def stand_ins():
    return (Counted(_Attention.apply, _attention_contract), Counted(_LayerNorm.apply, _norm_contract))


def loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# ---- the model ----

def test_default_config_is_gpt2_small_on_bytes():
    c = GPTConfig()
    assert (c.n_layers, c.d_model, c.n_heads, c.context, c.mlp_ratio) == (12, 768, 12, 1024, 4)
    assert c.vocab_size == pad_vocab(256) == 256 and pad_vocab(257) == 320 and pad_vocab(50257) == 50304
    d, L = c.d_model, c.n_layers
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    want = c.vocab_size * d + c.context * d + L * per_block + 2 * d        # the output layer is the embedding
    with torch.device("meta"):
        model = GPT(c)
    assert model.num_parameters() == want


def test_tiny_forward_backward_on_cpu():
    torch.manual_seed(0)
    model = GPT(TINY)
    x = torch.randint(0, 256, (3, 40))
    logits, loss = model(x, torch.roll(x, -1, 1))
    assert logits.shape == (3, 40, TINY.vocab_size) and model(x)[1] is None
    assert abs(loss.item() - math.log(256)) < 0.2, "GPT-2's init should start near uniform over bytes"
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"parameters without a gradient: {missing}"
    assert model.wte.weight.grad.abs().sum() > 0
    # causal: the logits at a position do not depend on later tokens
    x2 = x.clone()
    x2[:, 20:] = (x2[:, 20:] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(x2)[0][:, :20], model(x)[0][:, :20])
    with pytest.raises(ValueError, match="more than the model's context"):
        model(torch.zeros(1, TINY.context + 1, dtype=torch.long))


def test_init_is_gpt2s_and_depends_only_on_the_seed():
    torch.manual_seed(3)
    a = GPT(TINY)
    torch.manual_seed(3)
    b = GPT(TINY)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    blk = a.blocks[0]
    assert torch.equal(blk.norm1_w, torch.ones(TINY.d_model)) and torch.equal(blk.qkv.bias, torch.zeros(3 * 128))
    assert abs(blk.up.weight.std().item() - 0.02) < 0.003
    assert abs(blk.down.weight.std().item() - 0.02 / math.sqrt(2 * TINY.n_layers)) < 0.002


def test_pluggable_ops_are_called_and_give_pytorchs_loss_and_gradients():
    torch.manual_seed(0)
    reference = GPT(TINY)
    attention, norm = stand_ins()
    torch.manual_seed(0)
    ours = GPT(TINY, attention_op=attention, norm_op=norm)
    ours.load_state_dict(reference.state_dict())
    with torch.no_grad():                                  # norms that are not 1 and 0, so dw and db are tested
        for m in (reference, ours):
            torch.manual_seed(1)
            for n, p in m.named_parameters():
                if "norm" in n:
                    p.add_(0.2 * torch.randn_like(p))
    x = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    want_loss, want = loss_and_grads(reference, x, y)
    got_loss, got = loss_and_grads(ours, x, y)
    assert attention.calls == TINY.n_layers and norm.calls == 2 * TINY.n_layers + 1
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    # swapping the ops back gives PyTorch's path again, same weights
    ours.set_ops()
    assert all(b.attention_op is None and b.norm_op is None for b in ours.blocks)
    loss_again, _ = loss_and_grads(ours, x, y)
    assert attention.calls == TINY.n_layers
    torch.testing.assert_close(loss_again, want_loss, rtol=1e-5, atol=1e-6)


def test_a_wrong_op_changes_the_gradients():
    """The comparison above can fail: an attention op whose backward drops the dS term is caught."""
    class Broken(_Attention):
        @staticmethod
        def backward(ctx, do):
            dq, dk, dv, _ = _Attention.backward(ctx, do)
            return dq, dk * 0, dv, None

    torch.manual_seed(0)
    reference = GPT(TINY)
    broken = GPT(TINY, attention_op=Broken.apply)
    broken.load_state_dict(reference.state_dict())
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    want_loss, want = loss_and_grads(reference, x, torch.roll(x, -1, 1))
    got_loss, got = loss_and_grads(broken, x, torch.roll(x, -1, 1))
    torch.testing.assert_close(got_loss, want_loss)                # the forward is right
    assert not torch.allclose(got["blocks.0.qkv.weight"], want["blocks.0.qkv.weight"], rtol=1e-3, atol=1e-6)


# ---- the corpus ----

def test_stdlib_corpus_is_sorted_bytes_without_site_packages(tmp_path):
    for rel, text in (("b.py", b"bb"), ("a/z.py", b"zz"), ("a.py", b"aa"), ("site-packages/x.py", b"xx"),
                      ("notes.txt", b"tt"), ("dist-packages/y.py", b"yy")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(text)
    assert [p.relative_to(tmp_path).as_posix() for p in stdlib_files(tmp_path)] == ["a/z.py", "a.py", "b.py"]
    c = ByteCorpus.stdlib(tmp_path, val_fraction=0.0)
    assert bytes(c.tokens.tolist()) == b"zzaabb" and c.name == "stdlib sources (3 files)"
    with pytest.raises(FileNotFoundError):
        ByteCorpus.stdlib(tmp_path / "a" / "none")


def test_the_real_stdlib_corpus_is_there():
    files = stdlib_files()
    assert len(files) > 500 and files == sorted(files)
    assert any(f.name == "os.py" for f in files)


def test_batches_depend_only_on_seed_and_step():
    data = bytes(range(256)) * 40
    c = ByteCorpus(data, val_fraction=0.1)
    x, y = c.batch(0, 5, 4, 32)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one byte"
    c.batch(0, 6, 4, 32)                                   # drawing another batch in between changes nothing
    assert torch.equal(c.batch(0, 5, 4, 32)[0], x)
    assert torch.equal(ByteCorpus(data, val_fraction=0.1).batch(0, 5, 4, 32)[0], x)
    assert not torch.equal(c.batch(0, 6, 4, 32)[0], x) and not torch.equal(c.batch(1, 5, 4, 32)[0], x)
    v, _ = c.batch(0, 0, 64, 16, split="val")
    assert all(bytes(row.tolist()) in data[len(c.train):] for row in v), "held-out windows come from the tail"
    assert len(c.train) + len(c.val) == len(data) and len(c.val) == len(data) // 10
    with pytest.raises(ValueError, match="too few"):
        c.batch(0, 0, 1, len(c.val), split="val")


# ---- the schedule and the noise test ----

def test_lr_schedule_warms_up_then_decays_to_its_floor():
    lrs = [lr_at(s, 100, 1e-3, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3) and lrs[10] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4) and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))


def test_smooth_is_a_trailing_mean():
    curve = [3.0, 1.0, 2.0, 6.0, 0.0]
    assert smooth(curve, 2) == [2.0, 1.5, 4.0, 3.0]
    assert smooth(curve, 1) == curve and smooth(curve, 10) == [2.4]


def _curves(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    steps = torch.arange(n, dtype=torch.float64)
    trend = 1.2 + 4.3 * torch.exp(-steps / 40)

    def noisy(sd):
        return (trend + sd * torch.randn(n, generator=g, dtype=torch.float64)).tolist()
    return trend, noisy


def test_noise_band_within_and_outside():
    trend, noisy = _curves()
    a, b = noisy(0.08), noisy(0.08)                   # two runs: the band
    close = [x + 0.002 * math.sin(i) for i, x in enumerate(a)]      # same data, rounding-sized differences
    v = within_noise(a, b, close)
    assert v.within and v.gap < v.band and v.window == 10 and "within" in str(v)
    drift = [x + (0.6 if i >= 120 else 0.0) for i, x in enumerate(a)]   # a curve that leaves after step 120
    v = within_noise(a, b, drift)
    assert not v.within and v.gap == pytest.approx(0.6) and v.gap_step >= 120 and "OUTSIDE" in str(v)
    diverged = a[:150] + [math.nan] * 50
    assert not within_noise(a, b, diverged).within
    assert within_noise(a, a, a).within and not within_noise(a, a, close).within     # a band of 0 admits only a
    with pytest.raises(ValueError, match="same"):
        within_noise(a, b, a[:-1])
    with pytest.raises(ValueError, match="not finite"):
        within_noise(a, diverged, a)


# ---- training and the script ----

def test_train_is_deterministic_on_the_cpu_and_learns():
    corpus = ByteCorpus(b"def f(x):\n    return x + 1\n" * 400)
    kw = dict(config=TINY, steps=12, batch=2, seq=32, seed=0, device="cpu", lr=3e-3)
    r1, r2 = train(corpus, **kw), train(corpus, **kw)
    assert r1.losses == r2.losses and len(r1.losses) == len(r1.step_ms) == 12
    assert r1.losses[-1] < r1.losses[0] - 1.0, "a repetitive text should be learnt within 12 steps"
    assert r1.tokens_per_step == 64 and r1.median_step_ms > 0 and r1.timed_from == 3
    assert train(corpus, **dict(kw, seed=1)).losses != r1.losses


def test_probes_accept_a_right_op_and_reject_wrong_or_gradless_ones(script):
    attention = lambda q, k, v, causal: _Attention.apply(q, k, v, causal)           # noqa: E731
    norm = lambda x, w, b, eps: _LayerNorm.apply(x, w, b, eps)                        # noqa: E731
    assert "dq" in script.probe_attention(attention, "cpu") and "dw" in script.probe_norm(norm, "cpu")
    with pytest.raises(AssertionError, match="wrong out"):
        script.probe_attention(lambda q, k, v, causal: _Attention.apply(q, k, v, False), "cpu")
    with pytest.raises(AssertionError, match="wrong dx"):
        script.probe_norm(lambda x, w, b, eps: _LayerNorm.apply(x, w, b, eps) + 0 * x.detach() ** 2
                          + (x - x.detach()) * 0.5, "cpu")
    with pytest.raises(RuntimeError, match="does not require grad"):          # a forward-only op
        script.probe_norm(lambda x, w, b, eps: F.layer_norm(x.detach(), (768,), w.detach(), b.detach(), eps), "cpu")


def test_plan_labels_missing_ops_and_skips(script):
    ours = {"attention": object(), "norm": None, "notes": []}
    runs, skipped = script.plan(["eager", "kernellab", "compiled"], ours, "cuda")
    assert [r["name"] for r in runs] == ["eager", "kernellab", "compiled"] and not skipped
    assert "kl_layernorm is missing" in runs[1]["label"] and runs[1]["norm_op"] is None
    runs, skipped = script.plan(["eager", "kernellab", "compiled"], {"attention": None, "norm": None}, "cpu")
    assert [r["name"] for r in runs] == ["eager"] and len(skipped) == 2
    runs, skipped = script.plan(["kernellab-attention", "kernellab-norm"], ours, "cuda")
    assert [r["name"] for r in runs] == ["kernellab-attention"] and skipped[0].startswith("kernellab-norm: not run")
    assert script.load_ours("cpu", print)["notes"] == [
        "kernellab's ops need a CUDA GPU: the kernellab configurations are not run"]


def test_plan_runs_the_fused_configurations_only_with_kl_add_layernorm(script):
    ours = {"attention": object(), "norm": object(), "notes": []}
    names = ["kernellab-fused", "kernellab-fused-compiled", "kernellab-fused-graphs", "kernellab-fused-compiled-graphs"]
    runs, skipped = script.plan(names, ours, "cuda")
    assert runs == [] and [s.split(":")[0] for s in skipped] == names
    fused = object()
    runs, skipped = script.plan(["kernellab"] + names, dict(ours, add_norm=fused), "cuda")
    assert [r["name"] for r in runs] == ["kernellab"] + names and not skipped
    assert runs[0].get("add_norm_op") is None                     # kernellab's own configuration is unchanged
    for r in runs[1:]:
        assert r["add_norm_op"] is fused and r["norm_op"] is ours["norm"] and r["attention_op"] is ours["attention"]
        assert "kl_add_layernorm" in r["label"]
    assert [bool(r.get("compile")) for r in runs[1:]] == [False, True, False, True]
    assert [bool(r.get("graphs")) for r in runs[1:]] == [False, False, True, True]
    runs, skipped = script.plan(names, dict(ours, add_norm=fused), "cpu")
    assert [r["name"] for r in runs] == ["kernellab-fused"] and len(skipped) == 3
    assert script.load_add_norm("cpu", lambda m: None)["add_norm"] is None


@pytest.mark.slow
def test_a_quick_cpu_run_of_the_fused_configuration_gives_the_separate_ops_curve(script, tmp_path, monkeypatch):
    """main() with kernellab-fused on the CPU: the stand-in ops and x + r with F.layer_norm as add_norm_op (the
    wiring, not the kernels) give kernellab's losses within rounding."""
    from kernellab.teach.add_norm import reference_add_layernorm
    attention, norm = stand_ins()
    monkeypatch.setattr(script, "load_ours", lambda device, log: {
        "attention": attention, "norm": norm, "notes": ["stand-ins"]})
    calls = []

    def add_norm(*args):
        calls.append(1)
        return reference_add_layernorm(*args)
    monkeypatch.setattr(script, "load_add_norm", lambda device, log: {"add_norm": add_norm, "notes": ["reference"]})
    argv = ["--quick", "--device", "cpu", "--steps", "6", "--batch", "2", "--seq", "32",
            "--configs", "kernellab,kernellab-fused", "--out", str(tmp_path)]
    assert script.main(argv) == 0
    result = json.loads((tmp_path / "train_gpt2.json").read_text())
    a, b = result["runs"]["kernellab"]["losses"], result["runs"]["kernellab-fused"]["losses"]
    assert len(a) == len(b) == 6 and abs(a[0] - b[0]) < 1e-5, (a, b)     # the same first step's loss
    assert max(abs(x - y) for x, y in zip(a, b)) < 2e-3, (a, b)           # then the norms' rounding, trained on
    assert len(calls) == (6 + 4) * 2 * TINY.n_layers          # training steps and held-out batches


def test_load_ours_says_which_name_is_missing(script, monkeypatch, tmp_path):
    import notebook_cells
    (tmp_path / "04-layernorm.py").write_text("")
    monkeypatch.setattr(notebook_cells, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(notebook_cells, "load_tutorial", lambda nb: {"kl_rmsnorm": None, "x": 1})
    notes = script.load_ours("cuda", lambda m: None)["notes"]
    assert notes == ["kl_flash_attention: notebooks/08-attention-backward.py does not exist",
                     "kl_layernorm: notebooks/04-layernorm.py defines no kl_layernorm (its launcher cells define: "
                     "kl_rmsnorm)"]


@pytest.mark.slow
def test_script_quick_cpu_run_writes_table_json_and_plot(script, tmp_path, monkeypatch, capsys):
    """main() on the CPU with the stand-in ops in kernellab's place: every configuration, the table printed last,
    the JSON, the markdown table and the plot."""
    attention, norm = stand_ins()
    monkeypatch.setattr(script, "load_ours", lambda device, log: {
        "attention": attention, "norm": norm, "notes": ["stand-ins for kl_flash_attention and kl_layernorm"]})
    argv = ["--quick", "--device", "cpu", "--steps", "12", "--batch", "2", "--seq", "32",
            "--configs", "eager,eager-seed1,eager-efficient,kernellab,compiled,kernellab-norm", "--out", str(tmp_path),
            "--profile", "1"]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "train_gpt2.json").read_text())
    assert list(result["runs"]) == ["eager", "eager-seed1", "eager-efficient", "kernellab", "kernellab-norm"]
    assert result["complete"] and result["runs"]["kernellab-norm"]["label"].startswith("kernellab: kl_layernorm alone")
    steps = 12 + 4 + 1                          # training steps, 4 held-out batches, 1 step under the profiler
    assert attention.calls == steps * TINY.n_layers and norm.calls == 2 * steps * (2 * TINY.n_layers + 1)
    assert all(len(r["losses"]) == 12 and len(r["step_ms"]) == 12 for r in result["runs"].values())
    assert result["runs"]["eager"]["losses"] != result["runs"]["eager-seed1"]["losses"]
    assert result["runs"]["kernellab"]["label"] == "kernellab: kl_flash_attention + kl_layernorm"
    assert result["skipped"] == ["compiled: not run on the CPU (torch.compile's C++ build takes minutes there)"]
    rows = {r["config"]: r for r in result["table"]}
    assert rows["eager"]["vs_eager"] == 1.0 and rows["eager"]["vs_compiled"] is None
    assert rows["kernellab"]["final_loss"] == result["runs"]["kernellab"]["losses"][-1]
    checks = {(v["config"], v["band"]): v for v in result["noise"]}
    assert set(checks) == {("eager-efficient", "eager-seed1"), ("kernellab", "eager-seed1"),
                           ("kernellab", "eager-efficient"), ("kernellab-norm", "eager-seed1"),
                           ("kernellab-norm", "eager-efficient")}
    assert checks[("kernellab", "eager-seed1")]["within"], "a correct op's curve should stay inside the seed band"
    assert (tmp_path / "train_gpt2.png").stat().st_size > 10_000
    assert "aten::" in (tmp_path / "profile-kernellab.txt").read_text() and result["runs"]["eager"]["profile"]
    last = out.strip().splitlines()
    assert last[-7].startswith("| config | final loss") and last[-1].startswith("| kernellab-norm |")
    assert (tmp_path / "train_gpt2.md").read_text().count("\n| ") == 6         # the header and 5 rows


def test_an_op_registered_outside_the_launcher_cells_is_found(script, monkeypatch, tmp_path):
    """Tutorials 04 and 07 register their ops in plain cells after the launchers: the script runs the cell that
    defines the contract's name, in the launchers' namespace, and not a %%gpu cell."""
    import notebook_cells
    (tmp_path / "99-t.py").write_text(
        "# %%\n# launchers\ndef launch(x):\n    return x + 1\n\n"
        "# %%\n@staticmethod\ndef kl_op(x):\n    return launch(x) * 2\n\n"
        "# %%\n# %%gpu\ndef kl_gpu_only(x):\n    raise SystemExit\n")
    monkeypatch.setattr(notebook_cells, "NOTEBOOKS", tmp_path)
    ns = notebook_cells.load_tutorial("99-t.py", compile=lambda source: None)
    assert "kl_op" not in ns and script.op_from_cells("99-t.py", "kl_op", ns)(3) == 8
    assert script.op_from_cells("99-t.py", "kl_gpu_only", ns) is None
    assert script.op_from_cells("99-t.py", "kl_missing", ns) is None


@pytest.mark.slow
def test_tutorial_04s_layernorm_op_gives_pytorchs_gradients_in_the_gpt_on_the_cpu(script):
    """The real kl_layernorm, by its contract name from tutorial 04, its kernels on the CPU emulation
    (kernellab.run.sim.cuda), as the GPT's norm op: one step's loss and every gradient equal F.layer_norm's."""
    import copy

    from kernellab.run.sim.cuda import emulate
    from notebook_cells import load_tutorial
    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler for the emulation")
    ns = load_tutorial("04-layernorm.py", compile=emulate.compile_host)       # (the script put tests/gpu on the path)
    op = ns.get("kl_layernorm") or script.op_from_cells("04-layernorm.py", "kl_layernorm", ns)
    if op is None or getattr(op, "backward", None) is None or "cpu" not in getattr(op, "device_types", ()):
        pytest.skip(f"tutorial 04 here has no differentiable kl_layernorm on CPU tensors: {op!r}")
    torch.manual_seed(0)
    reference = GPT(TINY)
    with torch.no_grad():
        for n, p in reference.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    ours = copy.deepcopy(reference).set_ops(norm_op=op)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    want_loss, want = loss_and_grads(reference, x, torch.roll(x, -1, 1))
    got_loss, got = loss_and_grads(ours, x, torch.roll(x, -1, 1))
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_profile_steps_give_the_profilers_table():
    corpus = ByteCorpus(b"for i in range(10):\n    print(i)\n" * 200)
    r = train(corpus, config=TINY, steps=2, batch=2, seq=16, device="cpu", profile_steps=1)
    assert "Self CPU" in r.profile and "aten::" in r.profile and len(r.losses) == 2
    assert train(corpus, config=TINY, steps=2, batch=2, seq=16, device="cpu").profile == ""


def test_diagnose_reports_host_time_by_phase_syncs_and_top_functions(script, tmp_path, capsys):
    """--diagnose on the CPU: each configuration's host time a step by phase, torch's synchronising calls, the
    profilers' top host-side entries, written beside the table, and a summary table printed before it."""
    argv = ["--quick", "--device", "cpu", "--steps", "4", "--batch", "2", "--seq", "16", "--configs", "eager",
            "--diagnose", "--out", str(tmp_path)]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    text = (tmp_path / "diagnose-eager.txt").read_text()
    assert re.search(r"host [\d.]+ ms a step \(forward [\d.]+, backward [\d.]+, clip \+ optimiser [\d.]+", text)
    assert "torch's synchronising calls (set_sync_debug_mode): 0 a step" in text
    assert "top host-side entries by self CPU time" in text and "aten::" in text and "cProfile" in text
    d = json.loads((tmp_path / "train_gpt2.json").read_text())["diagnosis"]["eager"]
    assert d["host_ms"] > 0 and d["gpu_ms"] is None and d["kernellab_waits"] == 0
    assert min(d["forward_ms"], d["backward_ms"], d["update_ms"]) > 0 and d["launcher_ms"] == 0
    assert re.search(r"\| eager \| [\d.]+ \| - \| [\d.]+ / [\d.]+ / [\d.]+ \| 0.00 \| 0 \| 0 \| 0 \| 0 \| no GPU \|", out)
    # Python's GC a step, and the same steps as they are, with gc.freeze() and with the GC off (then no collection)
    assert "Python's GC in those steps:" in text and "each launcher alone" not in text       # no kernellab op here
    assert re.search(r"host CPU: .*; \d+ cores this process may run on; torch's CPU threads \d+", text)
    assert set(d["gc_variants"]) == {"GC on", "gc.freeze", "GC off"} and d["gc_variants"]["GC off"]["gc_ms"] == 0
    assert all(v["host_ms"] > 0 for v in d["gc_variants"].values()) and len(d["gc_collections"]) == 3
    assert re.search(r"\| eager \| [\d.]+ \([\d.]+/[\d.]+/[\d.]+\) \| [\d.]+ / [\d.]+ / [\d.]+ \| 0.00 \| "
                     r"0.00 / 0.00 / 0.00 / 0.00 \| 0.00 / 0.00 \|", out), out


@pytest.fixture
def fake_gpu_for_cpu_tensors(monkeypatch):
    """kernellab's launch path on CPU tensors: a device whose index is the CPU tensors' get_device() (-1), the raw
    stand-in driver of tests/test_launch_path.py, kernels that load nowhere. Launches are recorded, not run."""
    from test_launch_path import RawDriver

    from kernellab.kernel import Kernel
    from kernellab.run.launch import cudriver
    from kernellab.run.launch import device as D
    from kernellab.run.launch import launch as L
    from kernellab.run.launch.device import DeviceInfo
    driver = RawDriver()
    info = DeviceInfo(index=-1, name="Fake H100", arch="sm_90", multiprocessors=132,
                      shared_per_block_optin_bytes=227 * 1024, shared_per_sm_bytes=228 * 1024)
    monkeypatch.setattr(D, "gpu_status", lambda: (True, "1 GPU(s)"))
    monkeypatch.setattr(D, "device_info", lambda index=None: info)
    monkeypatch.setattr(cudriver, "driver", lambda: driver)
    monkeypatch.setattr(Kernel, "_function", lambda self, index: type("Fn", (), {"ptr": 0xF00})())
    monkeypatch.setattr(L, "torch_stream_function", lambda: (lambda index: 0x5000))
    return driver


def test_launch_counter_sees_the_norm_ops_launches_and_any_wait(script, fake_gpu_for_cpu_tensors, monkeypatch):
    """The real kl_layernorm of tutorial 04, forward and backward under autograd, through the launch path with a
    stand-in driver: --diagnose's LaunchCounter counts its 3 launches a step (forward; backward rows and finish), none
    waiting inside the op; with launch blocking on, all 3 wait, and the counter keeps where the first wait came from."""
    import kernellab
    from notebook_cells import load_tutorial
    counter = script.LaunchCounter(fake_gpu_for_cpu_tensors)              # before the first launch, as main() does
    ns = load_tutorial("04-layernorm.py")
    op = ns.get("kl_layernorm") or script.op_from_cells("04-layernorm.py", "kl_layernorm", ns)
    for name in ("norm_kernels", "norm_backward"):                       # kernels launched by an earlier test's path
        for k in ns[name]:
            monkeypatch.setattr(k, "_path", None)
            monkeypatch.setattr(k, "_launchers", {})
    x = torch.randn(64, 768, requires_grad=True)
    w, b = torch.ones(768, requires_grad=True), torch.zeros(768, requires_grad=True)

    def step():
        op(x, w, b, 1e-5).sum().backward()

    step()                                                                 # first calls: plans, generated launches
    before = counter.snapshot()
    for _ in range(4):
        step()
    counts = counter.snapshot() - before
    assert counts == {("generated launches", "main"): 12}, counts
    driver = fake_gpu_for_cpu_tensors                                     # the first step's 3 took the checked path
    assert len(driver.launches) == 3 and len(driver.raw) == 12 and driver.syncs == []
    old = kernellab.set_launch_blocking(True)
    try:
        before = counter.snapshot()
        step()
    finally:
        kernellab.set_launch_blocking(old)
    counts = counter.snapshot() - before
    assert counts[("waits", "main")] == 3 and counts[("capture queries", "main")] == 3
    assert "_norm_backward" in "".join(counter.wait_stacks) or "layernorm" in "".join(counter.wait_stacks)
    # the same op as a tiny GPT's LayerNorm, diagnosed: 2 x 2 + 1 norms a step, each 1 launch forward and 2 backward
    corpus = ByteCorpus(b"while True:\n    pass\n" * 100)
    run = train(corpus, config=TINY, steps=2, batch=2, seq=16, device="cpu", norm_op=op,
                diagnose=lambda parts: script.diagnose_step(parts, counter, steps=2, profile_steps=1)[0])
    assert "kernellab's launch path, per step: generated launches 15 on the main thread" in run.diagnosis
    assert re.search(r"kl::layernorm 5 calls on the main thread, \d+ us a call; kl::layernorm_backward 5 calls",
                     run.diagnosis), run.diagnosis
    assert "waits" not in run.diagnosis.split("kernellab's launch path, per step:")[1].splitlines()[0]
    print(run.diagnosis)
    # where the launchers' time goes: the torch allocations inside them (the forward's output, mean and rstd; the
    # backward's dx and partial sums), their own Python; each launcher alone; Python's GC and the steps without it
    split = re.search(r"the launchers' host time split, ms a step: all ([\d.]+) = driver launch calls ([\d.]+) \+ "
                      r"torch allocations ([\d.]+) \((\d+) calls, [\d.]+ us a call\) \+ the launchers' own Python "
                      r"([\d.]+)", run.diagnosis)
    assert split, run.diagnosis
    total, driver_ms, alloc_ms, allocs, own = (float(v) for v in split.groups())
    assert allocs >= 5 and 0 < alloc_ms < total and abs(driver_ms + alloc_ms + own - total) < 0.02
    assert "tensor maps" not in split.group(0)                            # the norm op makes none
    assert re.search(r"kl::layernorm 5 calls on the main thread, \d+ us a call; kl::layernorm_backward 5 calls",
                     run.diagnosis.split("whole eager calls")[1]), run.diagnosis
    alone = re.search(r"each launcher alone .*: kl::layernorm (\d+) us back to back, (\d+) us after a 64 MiB host "
                      r"write \(in the step (\d+) us\); kl::layernorm_backward", run.diagnosis)
    assert alone and min(int(v) for v in alone.groups()) > 0, run.diagnosis
    assert re.search(r"Python's GC in those steps: [\d.]+ ms a step in [\d.]+ collections a step \(generation "
                     r"0/1/2: [\d.]+/[\d.]+/[\d.]+; .*objects the collector tracks: [\d,]+", run.diagnosis)
    assert re.search(r"GC on: host [\d.]+ ms, GC [\d.]+ ms .*; gc.freeze: host [\d.]+ ms.*; GC off: host [\d.]+ "
                     r"ms, GC 0.00 ms a step in 0 collections", run.diagnosis), run.diagnosis
    import gc
    assert gc.isenabled() and gc.get_freeze_count() == 0                  # the collector is as it was
    assert kernellab.tensor_map.__name__ == "tensor_map" and torch.empty.__module__ != script.__name__


def test_gpu_gaps_names_the_longest_idle_gaps_and_who_launched_the_next_kernel(script):
    import types

    from torch.autograd import DeviceType

    def kernel(name, start, end, parent=None):
        return types.SimpleNamespace(name=name, time_range=types.SimpleNamespace(start=start, end=end),
                                     device_type=DeviceType.CUDA, cpu_parent=parent)
    op = types.SimpleNamespace(name="kl::layernorm_backward", cpu_parent=None)
    launch = types.SimpleNamespace(name="cuLaunchKernel", cpu_parent=op)
    host = types.SimpleNamespace(name="aten::mm", device_type=DeviceType.CPU, time_range=None)
    text = script.gpu_gaps([kernel("a", 0, 100), host, kernel("b", 50, 200), kernel("norm_backward_rows", 700, 800,
                                                                                    launch), kernel("c", 810, 900)])
    assert text.splitlines()[0].startswith("GPU idle between kernels (gaps of 20 us or more): 0.50 of 0.90 ms (56 %), "
                                           "in 1 gaps")
    assert "500 us before norm_backward_rows (launched under kl::layernorm_backward), after b" in text
    assert script.gpu_gaps([host]) == "GPU idle time: no kernels in the profile"


def test_the_launch_counter_installs_from_the_class_and_is_none_without_a_cuda_driver(script):
    """main() calls LaunchCounter.install() on a GPU host: a class method (a counter on kernellab's Driver), None
    where libcuda cannot be loaded, as here."""
    assert isinstance(inspect.getattr_static(script.LaunchCounter, "install"), classmethod)
    try:
        from kernellab.run.launch import cudriver
        cudriver.driver()
        has_driver = True
    except Exception:
        has_driver = False
    counter = script.LaunchCounter.install()
    assert (counter is None) == (not has_driver)


def test_the_launchers_split_counts_allocations_and_tensor_maps_inside_them_only(script, monkeypatch):
    """--diagnose's launcher split: torch allocations are counted inside a launcher only, kernellab.tensor_map's calls
    and its cache misses (encodes) apart; every patched function is restored after; the last arguments are kept."""
    import contextlib
    import types

    from test_tensor_map import FakeTorchCuda

    import kernellab
    from kernellab.run.launch import tensor_map as T
    monkeypatch.setattr(T, "encode_tiled", lambda **kw: bytes(range(128)))
    monkeypatch.setattr(T, "_context_for", lambda device: contextlib.nullcontext())
    from kernellab.run.launch import cudriver
    monkeypatch.setattr(cudriver, "replace_tensor_map_address", lambda encoded, address: encoded)
    T.tensor_map_cache_clear()
    empty, tensor_map, encode, replace = torch.empty, kernellab.tensor_map, T.encode, T.replace_address
    x = FakeTorchCuda((128, 64))
    moved = FakeTorchCuda((128, 64), ptr=0x7F0000090000)                  # the same layout at a new address

    def launcher(a):
        torch.empty(4)
        kernellab.tensor_map(a, (64, 64))
        return torch.empty_like(torch.ones(2))
    ops = {"kl::fake": types.SimpleNamespace(launcher=launcher)}
    with script.timed_launchers(ops) as (times, last), script.launcher_parts() as split:
        torch.empty(3)                                                    # outside a launcher: not counted
        for _ in range(3):
            ops["kl::fake"].launcher(x)
        ops["kl::fake"].launcher(moved)
    assert split["torch allocations"][0] == 8 and split["tensor maps"][0] == 4
    assert split["tensor-map encodes (cache misses)"][0] == 1                # the first map; the next two hit
    assert split["tensor-map address replacements (cache misses)"][0] == 1   # the moved tensor's
    assert times["kl::fake", "main"][0] == 4 and last["kl::fake"] == (launcher, (moved,))
    assert (torch.empty, kernellab.tensor_map, T.encode, T.replace_address) == (empty, tensor_map, encode, replace)
    assert ops["kl::fake"].launcher is launcher and script._INSIDE.depth == 0
    T.tensor_map_cache_clear()


# ---- the whole step as a CUDA graph: the pieces that run without a GPU ----

def test_graph_plan_warms_up_captures_then_times_replays_only():
    from kernellab.teach.gpt import GRAPH_WARMUP, graph_plan
    assert graph_plan(200, 10) == graph_plan(200, 10, GRAPH_WARMUP)
    p = graph_plan(200, 10)
    assert p.warmup == GRAPH_WARMUP == 3 and p.timed_from == 10           # the capturing step 3 is not timed
    assert graph_plan(12, 3).timed_from == 4                               # past the capture, whatever asked
    assert graph_plan(5, 1).timed_from == 4                                # one replay timed, the last step
    with pytest.raises(ValueError, match="at least 5 steps"):
        graph_plan(4, 1)


def test_capturable_optimiser_takes_its_learning_rate_as_a_tensor_filled_in_place():
    from kernellab.teach.gpt import optimizer_options, set_lr
    assert optimizer_options(6e-4, torch.device("cpu"), graphs=False) == {"lr": 6e-4}
    assert optimizer_options(6e-4, torch.device("cpu"), graphs=True) == {"lr": 6e-4}   # train() refuses it first
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([{"params": [w]}], lr=torch.tensor(1e-3))
    lr = opt.param_groups[0]["lr"]
    set_lr(opt, 0.25)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == 0.25          # the same tensor: a graph reads it
    plain = torch.optim.AdamW([w], lr=1e-3)
    set_lr(plain, 0.5)
    assert plain.param_groups[0]["lr"] == 0.5


def test_graphs_need_a_cuda_device():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        train(ByteCorpus(bytes(range(256)) * 40), config=TINY, steps=8, batch=2, seq=16, device="cpu", graphs=True)


def _stand_in_graph(step):
    """torch.cuda.CUDAGraph's part GraphedStep uses, on the CPU, for `step`: capture records nothing; replay re-runs
    the step on its static inputs and writes the loss into the captured loss tensor in place, as a real replay does."""
    class StandInGraph:
        def __init__(self):
            self.replays = 0

        def replay(self):
            self.replays += 1
            with torch.no_grad():
                step.static_loss.copy_(step.one_step(step.static_x, step.static_y))
    return StandInGraph


def test_graphed_step_copies_the_batch_in_and_the_loss_out(monkeypatch):
    """The first call captures on copies of the batch; later calls copy each batch into those static buffers; every
    call returns a loss of its own batch that the next replay does not overwrite."""
    from kernellab.teach.gpt import GraphedStep
    seen = []

    def one_step(x, y):
        seen.append((x.data_ptr(), y.data_ptr()))
        return (x.float() * y.float()).sum()

    step = GraphedStep(one_step)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _stand_in_graph(step))
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    x1, y1 = torch.arange(4), torch.ones(4, dtype=torch.long)
    x2, y2 = torch.arange(4) * 10, torch.full((4,), 2)
    first = step(x1, y1)
    graph = step.graph
    assert float(first) == 6 and step.static_x is not x1 and torch.equal(step.static_x, x1)
    second = step(x2, y2)
    assert float(second) == 120 and float(first) == 6                    # a copy out, not the graph's tensor
    assert second is not step.static_loss and step.graph is graph         # captured once
    assert step.replays == graph.replays == 2 and torch.equal(step.static_x, x2) and torch.equal(step.static_y, y2)
    assert len(set(seen)) == 1                                            # always the static buffers


def test_plan_graphed_configs_capture_their_base_config_and_skip_on_the_cpu(script):
    ours = {"attention": object(), "norm": object(), "add_norm": object(), "notes": []}
    runs, skipped = script.plan(list(script.GRAPHED), ours, "cuda")
    assert [r["name"] for r in runs] == ["graphs", "compiled-graphs", "kernellab-graphs", "kernellab-compiled-graphs",
                                         "kernellab-fused-graphs", "kernellab-fused-compiled-graphs"]
    assert all(r["graphs"] for r in runs) and not skipped
    base, _ = script.plan(list(script.GRAPHED.values()), ours, "cuda")
    for g, b in zip(runs, base):
        assert {k: v for k, v in g.items() if k not in ("name", "label", "graphs")} == \
            {k: v for k, v in b.items() if k not in ("name", "label")}
        assert g["label"] == b["label"] + ", the step as one CUDA graph"
    runs, skipped = script.plan(["eager", "graphs", "kernellab-graphs"], {"attention": None, "norm": None}, "cpu")
    assert [r["name"] for r in runs] == ["eager"]
    assert skipped == ["graphs: not run on the CPU (CUDA graphs need a CUDA device)",
                       "kernellab-graphs: not run (its kernellab op is not available; see above)"]


def test_graphed_configs_are_asked_for_and_need_room_for_a_capture(script):
    args, _ = script.parse([])
    assert tuple(args.configs) == script.DEFAULT_CONFIGS and not set(args.configs) & set(script.GRAPHED)
    args, _ = script.parse(["--quick", "--configs", "eager,graphs,kernellab-compiled-graphs"])
    assert args.configs == ["eager", "graphs", "kernellab-compiled-graphs"]
    with pytest.raises(SystemExit):
        script.parse(["--configs", "graphs", "--steps", "4"])
    script.parse(["--configs", "eager", "--steps", "4"])                  # eager alone: any length


def test_the_table_shows_the_capturing_steps_time_for_graphed_runs_only(script):
    from kernellab.teach.gpt import TrainRun
    kw = dict(seed=0, losses=(5.0, 4.0, 3.5, 3.0, 2.9, 2.8), tokens_per_step=64, timed_from=4, val_loss=3.0,
              wall_s=1.0)
    runs = {"eager": TrainRun(name="eager", step_ms=(900.0, 40, 40, 40, 40, 40), **kw),
            "graphs": TrainRun(name="graphs", step_ms=(800.0, 41, 42, 1234.0, 30, 31), captured_at=3, replays=3,
                               **kw)}
    assert runs["graphs"].capture_ms == 1234.0 and runs["eager"].capture_ms is None
    rows = script.summary_rows(runs, {"eager": "e", "graphs": "g"})
    assert rows[1]["capture_ms"] == 1234.0 and rows[1]["step_ms"] == 30.5 and rows[1]["replays"] == 3
    lines = script.format_table(rows).splitlines()
    assert "| capture ms |" in lines[0]
    assert lines[2].split(" | ")[6] == "-" and lines[3].split(" | ")[6] == "1234"


def test_warm_up_steps_run_on_one_side_stream_joined_once_after_the_last(monkeypatch):
    """PyTorch's recipe: the eager warm-up on a side stream that first waits for the current one, the current stream
    waiting for it after the last warm-up step; the capture and the replays on the current stream."""
    from kernellab.teach.gpt import GraphedStep, graph_plan
    log = []

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits for {other.name}")

    current = Stream("current")

    @contextlib.contextmanager
    def stream(s):
        log.append(f"enter {s.name}")
        yield
        log.append(f"leave {s.name}")
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    step, plan = GraphedStep(lambda x, y: None), graph_plan(8, 2)
    for i in range(5):
        with step.stream_for(i, plan):
            log.append(f"step {i}")
    assert log == ["side waits for current",
                   "enter side", "step 0", "leave side", "enter side", "step 1", "leave side",
                   "enter side", "step 2", "leave side", "current waits for side",
                   "step 3", "step 4"]
