"""benchmarks/train_gpt2.py on the GPU, small: a --quick run (a 2-layer GPT for 30 steps) of the PyTorch
configurations and torch.compile, and of kernellab's attention and LayerNorm ops (tutorials 08 and 04, by their
contract names kl_flash_attention and kl_layernorm) where those tutorials provide them; and one step of the model
with kernellab's ops, its gradients against float64 beside PyTorch's own error. The training step as one CUDA graph
(tests named *graph*, the tests-train-graphs suite): a captured forward and backward replayed on new batches against
the eager step, and a --quick run of the graphed configurations. Where an op is missing, its tests skip and say which
name and why."""
import copy
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernellab.teach.gpt import GPT, ByteCorpus, GPTConfig

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_gpt2", ROOT / "benchmarks" / "train_gpt2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One --quick run of every configuration; (its JSON, its stdout)."""
    out = tmp_path_factory.mktemp("train_gpt2")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_gpt2.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=400, cwd=ROOT)
    print(p.stdout[-6000:])
    assert (out / "train_gpt2.json").exists(), f"no JSON (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads((out / "train_gpt2.json").read_text()), p


def _learnt(run):
    losses = run["losses"]
    assert all(math.isfinite(v) for v in losses), "a loss that is not finite"
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, f"30 steps should bring the loss well below {losses[0]:.2f}"


def test_pytorch_configurations_train_and_compiled_stays_in_the_noise(quick):
    result, p = quick
    for name in ("eager", "eager-seed1", "eager-efficient", "compiled"):
        assert name in result["runs"], f"{name} did not finish: {result['failed']}"
        _learnt(result["runs"][name])
    noise = {(v["config"], v["band"]): v for v in result["noise"]}
    assert noise[("compiled", "eager-seed1")]["within"], noise[("compiled", "eager-seed1")]["text"]
    assert noise[("eager-efficient", "eager-seed1")]["within"], noise[("eager-efficient", "eager-seed1")]["text"]
    rows = {r["config"]: r for r in result["table"]}
    assert rows["eager"]["vs_eager"] == 1.0 and rows["compiled"]["vs_compiled"] == 1.0
    assert all(r["step_ms"] > 0 for r in rows.values())


def test_kernellab_configurations_train_within_the_seed_band(quick):
    result, p = quick
    if "kernellab" not in result["runs"] and not result["failed"]:
        pytest.skip("kernellab's ops are not available: " + "; ".join(result["ops"] + result["skipped"]))
    assert not result["failed"], "\n".join(result["failed"])
    assert p.returncode == 0, p.stdout[-3000:]
    for name in ("kernellab", "kernellab-compiled"):
        _learnt(result["runs"][name])
        v = next(v for v in result["noise"] if v["config"] == name and v["band"] == "eager-seed1")
        assert v["within"], f"{name}: {v['text']}"


def test_one_step_with_kernellab_ops_has_pytorchs_gradient_error(script):
    """Loss and every parameter's gradient of one bf16-autocast step with kernellab's ops, and with PyTorch's, each
    against the float64 model: ours within 2x PyTorch's relative error (+1e-3)."""
    ours = script.load_ours("cuda", print)
    if ours["attention"] is None and ours["norm"] is None:
        pytest.skip("kernellab's ops are not available: " + "; ".join(ours["notes"]))
    torch.manual_seed(0)
    config = GPTConfig(n_layers=2, d_model=256, n_heads=4, context=512)
    reference = GPT(config).cuda()
    mine = copy.deepcopy(reference).set_ops(attention_op=ours["attention"], norm_op=ours["norm"])
    want_model = copy.deepcopy(reference).double()
    x, y = ByteCorpus.stdlib().batch(0, 0, 4, 500, device="cuda")         # 500: not a multiple of a tile

    def step(model, autocast):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(x, y)
        loss.backward()
        return loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}

    want_loss, want = step(want_model, False)
    loss, grads = step(mine, True)
    their_loss, theirs = step(reference, True)
    assert abs(loss - want_loss) <= 2 * abs(their_loss - want_loss) + 2e-3, \
        f"loss: ours {float(loss):.5f}, PyTorch's {float(their_loss):.5f}, float64 {float(want_loss):.5f}"
    worse = []
    for n in want:
        scale = want[n].norm()
        e_ours, e_theirs = float((grads[n] - want[n]).norm() / scale), float((theirs[n] - want[n]).norm() / scale)
        if not e_ours <= 2 * e_theirs + 1e-3:
            worse.append(f"{n}: {e_ours:.3g} against PyTorch's {e_theirs:.3g}")
    assert not worse, "relative gradient errors against float64 beyond 2x PyTorch's: " + "; ".join(worse)


def test_diagnose_kernellab_ops_queue_without_waiting_for_the_gpu(tmp_path):
    """--diagnose on a --quick run: every configuration has host and GPU time a step; the LayerNorm op's launches are
    counted (3 a norm: forward, backward rows and finish; 2 x 2 + 1 norms) and none waits for the GPU inside a
    training step, on the main thread or autograd's; no INVALID_CONTEXT retry after the first; eager makes no
    synchronising call. A failure prints the diagnosis: where the step's host time went."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_gpt2.py"), "--quick", "--steps", "12",
                        "--configs", "eager,kernellab-norm", "--diagnose", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert (tmp_path / "train_gpt2.json").exists(), f"rc {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    result = json.loads((tmp_path / "train_gpt2.json").read_text())
    d = result["diagnosis"]
    assert d["eager"]["host_ms"] > 0 and d["eager"]["gpu_ms"] > 0 and d["eager"]["torch_syncs"] == 0, d["eager"]
    if "kernellab-norm" not in d:
        pytest.skip("kl_layernorm is not available: " + "; ".join(result["ops"] + result["skipped"] + result["failed"]))
    text = (tmp_path / "diagnose-kernellab-norm.txt").read_text()
    norm = d["kernellab-norm"]
    assert norm["kernellab_launches"] == 3 * (2 * GPTConfig.tiny().n_layers + 1), text
    assert norm["kernellab_waits"] == 0 and norm["torch_syncs"] == 0, text
    assert norm["context_retries"] == 0, text


@pytest.mark.parametrize("ops", ["pytorch", "kernellab"])
def test_a_graphed_step_replays_the_eager_step_on_new_batches(script, ops):
    """Forward and backward of the 2-layer GPT captured once as a CUDA graph (GraphedStep, after two warm-up steps
    on a side stream, gradients None at capture) and replayed on three new batches: each replay's loss and gradients
    match the eager step's on the same batch and weights (kernellab's ops: tutorials 08's and 04's, launched inside
    the capture, the backward from autograd's thread)."""
    from kernellab.teach.gpt import GraphedStep
    kw = {}
    if ops == "kernellab":
        ours = script.load_ours("cuda", print)
        if ours["attention"] is None and ours["norm"] is None:
            pytest.skip("kernellab's ops are not available: " + "; ".join(ours["notes"]))
        kw = dict(attention_op=ours["attention"], norm_op=ours["norm"])
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(), **kw).cuda()
    corpus = ByteCorpus.stdlib()
    batches = [corpus.batch(0, s, 4, 128, device="cuda") for s in range(5)]

    def forward_backward(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            _, loss = model(x, y)
        loss.backward()
        return loss

    def eager(x, y):
        model.zero_grad(set_to_none=True)
        loss = forward_backward(x, y).detach()
        return loss, [p.grad.clone() for p in model.parameters()]

    want = [eager(x, y) for x, y in batches[2:]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, y in batches[:2]:
            model.zero_grad(set_to_none=True)
            forward_backward(x, y)
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    step = GraphedStep(forward_backward)
    step(*batches[0])                                       # captures (and replays once on a warm-up batch)
    for i, ((x, y), (want_loss, want_grads)) in enumerate(zip(batches[2:], want)):
        loss = step(x, y)
        grads = [p.grad.clone() for p in model.parameters()]
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5, msg=lambda m: f"replay {i}: loss: {m}")
        for (name, _), g, w in zip(model.named_parameters(), grads, want_grads):
            err = float((g.double() - w.double()).norm() / w.double().norm().clamp_min(1e-30))
            assert err <= 5e-3, f"replay {i} ({ops}): {name}'s gradient is {err:.3g} off the eager step's"
    assert step.replays == 4


def test_graphed_configurations_train_in_the_noise_band_and_replay(tmp_path):
    """A --quick run (30 steps) of eager, its seeds and kernellab's eager step beside the same steps captured as one
    CUDA graph: the graphed curves lie inside the seed band (eager's graph also inside the rounding band of SDPA's
    other backend: the same kernels, only AdamW's learning rate is a tensor), every
    step after the 3 warm-up steps is a replay of the one captured graph, and the capturing step's time is
    reported."""
    configs = "eager,eager-seed1,eager-efficient,graphs,kernellab,kernellab-graphs"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_gpt2.py"), "--quick", "--configs", configs,
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=380, cwd=ROOT)
    print(p.stdout[-6000:])
    assert (tmp_path / "train_gpt2.json").exists(), f"rc {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    result = json.loads((tmp_path / "train_gpt2.json").read_text())
    assert not result["failed"], "\n".join(result["failed"])
    graphed = ["graphs"] + (["kernellab-graphs"] if "kernellab" in result["runs"] else [])
    rows = {r["config"]: r for r in result["table"]}
    for name in graphed:
        run = result["runs"][name]
        _learnt(run)
        assert run["captured_at"] == 3 and run["replays"] == 30 - 3, (run["captured_at"], run["replays"])
        assert run["timed_from"] > run["captured_at"] and rows[name]["capture_ms"] > 0
        assert len(set(run["losses"][3:])) == 27, "a replay's loss repeated: is the batch copied in?"
        for band in ("eager-seed1", "eager-efficient") if name == "graphs" else ("eager-seed1",):
            v = next(v for v in result["noise"] if v["config"] == name and v["band"] == band)
            assert v["within"], f"{name} against eager, band {band}: {v['text']}"
    assert rows["graphs"]["capture_ms"] is not None and rows["eager"]["capture_ms"] is None
    if "kernellab-graphs" not in graphed:
        pytest.skip("kernellab's ops are not available (graphs alone checked): " + "; ".join(result["ops"]))
