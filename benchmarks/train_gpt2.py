"""Training a GPT-2-small-class model with kernellab's attention and LayerNorm against PyTorch, in one run.

Method. The model is kernellab.teach.gpt.GPT (12 layers, 768 wide, 12 heads of 64, context 1024, pre-LayerNorm,
4x GELU MLP, tied embeddings, no dropout) on bytes of the Python standard library's sources (ByteCorpus.stdlib).
Every configuration trains from the same seed's initial weights (drawn on the CPU) and batches, for --steps steps:
bf16 autocast, fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices and embeddings), a linear
warm-up over 10 % of the steps then a cosine decay to 10 %, gradients clipped to norm 1.

    eager               PyTorch eager: F.scaled_dot_product_attention on the FLASH backend, F.layer_norm; seed 0
    eager-seed1         the same from seed 1 (other initial weights and batches): the run-to-run noise
    eager-efficient     seed 0 on SDPA's EFFICIENT backend (MATH on the CPU): same weights and data, another
                        correct kernel's rounding; the noise a kernel swap alone makes
    compiled            torch.compile of the PyTorch model (FLASH), seed 0
    kernellab           seed 0 with kl_flash_attention (tutorial 08) and kl_layernorm (tutorial 04), forward and
                        backward, in eager mode (where only one op is there, with PyTorch's other op, so labelled)
    kernellab-compiled  torch.compile of the model with kernellab's ops, seed 0
    kernellab-attention kl_flash_attention alone (F.layer_norm), eager, seed 0: where the step time goes
    kernellab-norm      kl_layernorm alone (SDPA FLASH), eager, seed 0
  and, asked for by --configs (the train-gpt2-fused suite), each residual add fused with the LayerNorm after it:
    kernellab-fused           kernellab's ops, and kl_add_layernorm (kernellab.teach.add_norm) as the GPT's
                              add_norm_op: the attention's add with the block's second norm, the MLP's with the next
                              block's first norm (or the final norm); the first norm stays kl_layernorm. Eager, seed 0
    kernellab-fused-compiled  torch.compile of it
  and, asked for by --configs (the train-gpt2-graphs and train-gpt2-fused suites), the whole step as one CUDA graph:
    graphs                    eager's step (SDPA FLASH, F.layer_norm) captured, seed 0
    compiled-graphs           compiled's step captured
    kernellab-graphs          kernellab's step captured
    kernellab-compiled-graphs kernellab-compiled's step captured
    kernellab-fused-graphs, kernellab-fused-compiled-graphs  kernellab-fused's and kernellab-fused-compiled's steps

CUDA graphs. The whole training step (forward, backward, clipping, the optimiser, zeroing the gradients) is captured
by hand as one torch.cuda.CUDAGraph (kernellab.teach.gpt.GraphedStep), the same way for PyTorch's model and for ours,
with torch.compile or without: the comparison stays fair, and nothing of the step stays on the host. Not
torch.compile(mode="reduce-overhead"): its CUDA graphs (cudagraph trees) cover the compiled forward and backward but
not clipping and AdamW, which stay eager launches; and they exist only for compiled models, so eager PyTorch and
kernellab's eager step would have no graphed counterpart. Not make_graphed_callables: it graphs callables, not the
optimiser, and needs autocast's cache off the same way. The recipe is PyTorch's "whole network capture": the first 3
steps train eagerly on a side stream (they compile, load kernellab's modules and plans, and create AdamW's state), the
gradients are None at capture so backward allocates them from the graph's pool, AdamW is fused and capturable with
its learning rate a device tensor filled before each step (the schedule goes on), autocast runs with its weight cache
off (a cast cached in the capture would outlive it), the batch is copied into static inputs and the loss copied out.
The warm-up steps are real training steps, so the curve is the same schedule's, tested against the same bands. The
step that captures is timed too (capture, then its first replay: "capture ms" in the table; the first step's time is
the compile's, as for the others). kernellab's ops launch inside the capture as they do outside (their launches do
not wait there); a graphed step's time is the GPU's time for it, launch costs gone.

Before they train, kernellab's ops are taken from the tutorials by their names and run forward and backward once on
a small case against float64 (errors printed beside PyTorch's). Where a name is missing, its tutorial does not load,
or the op has no backward or is wrong, the script says which and why, and runs without it: with the other op alone
(so labelled), or only PyTorch's configurations.

Noise test. Each loss curve is smoothed by a trailing 10-step mean; a curve c lies within the noise of the eager
run a when max over steps |c - a| <= max over steps |b - a|, for b = eager-seed1 (the run-to-run band the issue
asks for) and, stricter, for b = eager-efficient (the same data and weights: only rounding differs, as it does for
kernellab's kernels).
Timing. Each step (forward, backward, clipping, optimiser) between two CUDA events, no synchronisation inside the
loop, so the host queues ahead as in real training: the step time is as called, launch costs included. The median
over the steps after the first 10 (compilation and warm-up); the first step's time is reported apart. Ratios are
speed-ups (eager's or compiled's median step time over the configuration's): above 1 is faster.

    python benchmarks/train_gpt2.py --out results/            # 200 steps of batch 16 x 1024 tokens
    python benchmarks/train_gpt2.py --quick --device cpu      # a tiny model for 30 steps (a smoke run)
    python benchmarks/train_gpt2.py --configs eager,kernellab # a choice of configurations
    python benchmarks/train_gpt2.py --diagnose                # also: where each configuration's step time goes
Writes train_gpt2.json (every curve and time), train_gpt2.png (the curves) and train_gpt2.md (the table) under --out
($OUT if set); the table is printed last. Exit status 1 if a configuration that could run failed.

Diagnosis (--diagnose). After each configuration trains, DIAGNOSE_STEPS more steps, each begun on an idle GPU: the
host's time to queue the step (perf_counter, no synchronisation; by phase: forward, backward, clip + optimiser) beside
the GPU's time for it (CUDA events). Host time at or above GPU time is a host-bound step. Alongside: what kernellab's
launch path asked of the driver in those steps (LaunchCounter: launches by the generated and the checked path, waits
for the GPU, INVALID_CONTEXT retries, per thread: autograd runs backward passes on its own thread), the synchronising
calls torch made (torch.cuda.set_sync_debug_mode), the caching allocator's cudaMalloc/cudaFree calls and retries,
Python's cyclic GC in those steps (gc.callbacks: collections per generation, time, longest pause) and the same steps
again without the diagnosis's timers, as they are, after gc.freeze() and with the GC off; the launchers' host time
split into the driver's launch calls, torch allocations, kernellab.tensor_map (and its cache misses' encodes) and
their own Python, beside each op's whole eager call; each launcher replayed alone on a step's arguments, back to back
and after a 64 MiB host write before each call (cold CPU caches); the other Python threads alive; then 3 steps
under torch.profiler with CPU activity and Python stacks (the top host-side entries by self CPU time,
the driver's and runtime's synchronising calls, kernellab's ops per call) and cProfile of the main thread. Printed,
written to diagnose-CONFIG.txt, and one summary table per run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import sys
import threading
import time
import traceback
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))      # notebook_cells: the tutorials' cells, as the tests read them

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from kernellab.teach.gpt import (GRAPH_WARMUP, ByteCorpus, GPTConfig, StepParts, TrainRun, smooth, train,  # noqa: E402
                                 within_noise)

# PyTorch's configurations first: a kernel fault that spoils the CUDA context cannot take the baselines with it
DEFAULT_CONFIGS = ("eager", "eager-seed1", "eager-efficient", "compiled", "kernellab", "kernellab-compiled",
                   "kernellab-attention", "kernellab-norm")
FUSED = {"kernellab-fused": "kernellab", "kernellab-fused-compiled": "kernellab-compiled"}   # each with add_norm_op
GRAPHED = {"graphs": "eager", "compiled-graphs": "compiled", "kernellab-graphs": "kernellab",
           "kernellab-compiled-graphs": "kernellab-compiled", "kernellab-fused-graphs": "kernellab-fused",
           "kernellab-fused-compiled-graphs": "kernellab-fused-compiled"}   # each the configuration it captures
CONFIGS = DEFAULT_CONFIGS + tuple(FUSED) + tuple(GRAPHED)
OURS = {"attention": ("08-attention-backward.py", "kl_flash_attention"), "norm": ("04-layernorm.py", "kl_layernorm")}
SMOOTH = 10
DIAGNOSE_STEPS = 5           # steps timed by phase (each from an idle GPU); 3 more under each profiler


def probe_attention(op, device) -> str:
    """Forward and backward of `op` on a small causal bf16 case against float64; the errors beside SDPA's own."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 200, 64, generator=g).to(device, torch.bfloat16) for _ in range(4))

    def grads(fn, dtype):
        ins = [t.to(dtype).clone().requires_grad_(True) for t in (q, k, v)]
        o = fn(*ins)
        o.backward(do.to(dtype))
        return [o.detach()] + [t.grad for t in ins]

    want = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), torch.float64)
    ours = grads(lambda a, b, c: op(a, b, c, True), torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        theirs = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), torch.bfloat16)
    return _errors(("out", "dq", "dk", "dv"), ours, theirs, want)


def probe_norm(op, device) -> str:
    """Forward and backward of `op` on [300, 768] float32 rows (as the fp32 residual stream meets it) against
    float64; the errors beside F.layer_norm's own."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x, dy = (torch.randn(300, 768, generator=g).to(device) for _ in range(2))
    w, b = (1 + 0.1 * torch.randn(768, generator=g)).to(device), (0.1 * torch.randn(768, generator=g)).to(device)

    def grads(fn, dtype):
        ins = [t.to(dtype).clone().requires_grad_(True) for t in (x, w, b)]
        y = fn(*ins)
        y.backward(dy.to(dtype))
        return [y.detach()] + [t.grad for t in ins]

    want = grads(lambda a, c, d: F.layer_norm(a, (768,), c, d, 1e-5), torch.float64)
    ours = grads(lambda a, c, d: op(a, c, d, 1e-5), torch.float32)
    theirs = grads(lambda a, c, d: F.layer_norm(a, (768,), c, d, 1e-5), torch.float32)
    return _errors(("y", "dx", "dw", "db"), ours, theirs, want)


def probe_add_norm(op, device) -> str:
    """Forward and backward of `op(x, r, w, b, eps) -> (h, y)` as the model meets it under autocast (x float32 [300,
    768], r bf16; h's gradient float32, y's bf16) against x + r and F.layer_norm in float64; the errors beside
    PyTorch's own (the same dtypes, y cast to r's)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x, r, dy, up = (torch.randn(300, 768, generator=g).to(device) for _ in range(4))
    r, dy = r.to(torch.bfloat16), dy.to(torch.bfloat16)
    w, b = (1 + 0.1 * torch.randn(768, generator=g)).to(device), (0.1 * torch.randn(768, generator=g)).to(device)

    def grads(fn, dtype=None):
        ins = [t.to(dtype or t.dtype).clone().requires_grad_(True) for t in (x, r, w, b)]
        h, y = fn(*ins)
        torch.autograd.backward([h, y], [up.to(h.dtype), dy.to(y.dtype)])
        return [h.detach(), y.detach()] + [t.grad for t in ins]

    def pytorch(a, c, d, e, cast=True):
        h = a + c
        y = F.layer_norm(h, (768,), d, e, 1e-5)
        return h, (y.to(c.dtype) if cast else y)

    want = grads(lambda *a: pytorch(*a, cast=False), torch.float64)
    ours = grads(lambda a, c, d, e: op(a, c, d, e, 1e-5))
    theirs = grads(pytorch)
    return _errors(("h", "y", "dx", "dr", "dw", "db"), ours, theirs, want)


def load_add_norm(device, log):
    """kl_add_layernorm (kernellab.teach.add_norm) run forward and backward once (probe_add_norm), or None with a
    note saying why: {"add_norm": op or None, "notes": [...]}."""
    if torch.device(device).type != "cuda":
        note = "kl_add_layernorm needs a CUDA GPU: the kernellab-fused configurations are not run"
        log(note)
        return {"add_norm": None, "notes": [note]}
    t0 = time.perf_counter()
    try:
        from kernellab.teach.add_norm import kl_add_layernorm
        checked = probe_add_norm(kl_add_layernorm, device)
    except Exception as exc:                                   # a compile error, a launch error, wrong numbers
        note = (f"kl_add_layernorm: its forward/backward probe failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}")
        log(note)
        return {"add_norm": None, "notes": [note]}
    note = f"kl_add_layernorm from kernellab.teach.add_norm ({time.perf_counter() - t0:.0f} s to load): {checked}"
    log(note)
    return {"add_norm": kl_add_layernorm, "notes": [note]}


def _errors(names, ours, theirs, want) -> str:
    """'name ours/PyTorch's' max errors against float64; raises if ours is more than 10x PyTorch's + 1e-2 off."""
    parts, bad = [], []
    for n, o, t, w in zip(names, ours, theirs, want):
        eo, et = float((o.double() - w).abs().max()), float((t.double() - w).abs().max())
        parts.append(f"{n} {eo:.2g}/{et:.2g}")
        if not eo <= 10 * et + 1e-2:
            bad.append(n)
    if bad:
        raise AssertionError(f"wrong {', '.join(bad)} (max |error| ours/PyTorch's: {'; '.join(parts)})")
    return "max |error| against float64, ours/PyTorch's: " + ", ".join(parts)


def op_from_cells(notebook: str, name: str, ns: dict):
    """`name` from the tutorial's plain Python cells that define it (`def name(`), run in the launchers' namespace
    `ns`, for an op registered outside the `# launchers` cells (as tutorials 04 and 07 register theirs); None if no
    cell defines it."""
    import re

    import kernellab
    from notebook_cells import _cells, compile_python
    ns.setdefault("kernellab", kernellab)               # what the notebook's first cells import
    ns.setdefault("torch", torch)
    for cell in _cells(notebook):
        if re.search(rf"^def {re.escape(name)}\(", cell, flags=re.M) and not cell.lstrip().startswith(("# %%", "%")):
            exec(compile_python(cell, notebook), ns)
    return ns.get(name)


def load_ours(device, log) -> dict:
    """{"attention": op or None, "norm": op or None, "notes": [why one is missing, or its probe's errors]}: the
    tutorials' ops by their contract names, each run forward and backward once before it is trusted."""
    found = {"attention": None, "norm": None, "notes": []}
    if torch.device(device).type != "cuda":
        found["notes"].append("kernellab's ops need a CUDA GPU: the kernellab configurations are not run")
        return found
    from notebook_cells import NOTEBOOKS, load_tutorial
    probes = {"attention": probe_attention, "norm": probe_norm}
    for role, (notebook, name) in OURS.items():
        t0 = time.perf_counter()
        if not (NOTEBOOKS / notebook).exists():
            found["notes"].append(f"{name}: notebooks/{notebook} does not exist")
            continue
        try:
            ns = load_tutorial(notebook)
        except Exception as exc:                               # a cell that does not compile or run
            found["notes"].append(f"{name}: loading notebooks/{notebook} failed: {type(exc).__name__}: {exc}")
            continue
        op = ns.get(name) or op_from_cells(notebook, name, ns)
        if op is None:
            found["notes"].append(f"{name}: notebooks/{notebook} defines no {name} (its launcher cells define: "
                                  f"{', '.join(sorted(k for k in ns if k.startswith('kl_'))) or 'no kl_* name'})")
            continue
        try:
            checked = probes[role](op, device)
        except Exception as exc:                               # no autograd, a launch error, wrong numbers
            found["notes"].append(f"{name}: its forward/backward probe failed: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        found[role] = op
        found["notes"].append(f"{name} from notebooks/{notebook} ({time.perf_counter() - t0:.0f} s to load): {checked}")
    for note in found["notes"]:
        log(note)
    return found


def plan(names, ours, device) -> tuple[list[dict], list[str]]:
    """The configurations to run (each a dict of train()'s arguments and a label) and a note for each left out."""
    cuda = torch.device(device).type == "cuda"
    other = SDPBackend.EFFICIENT_ATTENTION if cuda else SDPBackend.MATH
    which = [r for r in ("attention", "norm") if ours[r] is not None]
    ops = {"attention_op": ours["attention"], "norm_op": ours["norm"]}
    ours_label = " + ".join({"attention": "kl_flash_attention", "norm": "kl_layernorm"}[r] for r in which)
    if len(which) == 1:
        ours_label += " (the other op is PyTorch's: " + ("kl_layernorm" if which == ["attention"] else
                                                         "kl_flash_attention") + " is missing)"
    table = {
        "eager": dict(label="PyTorch eager, SDPA FLASH", seed=0, backend=SDPBackend.FLASH_ATTENTION),
        "eager-seed1": dict(label="PyTorch eager, SDPA FLASH, seed 1", seed=1, backend=SDPBackend.FLASH_ATTENTION),
        "eager-efficient": dict(label=f"PyTorch eager, SDPA {other.name}", seed=0, backend=other),
        # FLASH where PyTorch's attention remains (when only kl_layernorm came)
        "kernellab": dict(label=f"kernellab: {ours_label}", seed=0, backend=SDPBackend.FLASH_ATTENTION, **ops),
        "compiled": dict(label="torch.compile, SDPA FLASH", seed=0, backend=SDPBackend.FLASH_ATTENTION, compile=True),
        "kernellab-compiled": dict(label=f"torch.compile, kernellab: {ours_label}", seed=0, compile=True,
                                   backend=SDPBackend.FLASH_ATTENTION, **ops),
    }
    flash = SDPBackend.FLASH_ATTENTION
    table["kernellab-attention"] = dict(label="kernellab: kl_flash_attention alone (F.layer_norm)", seed=0,
                                        backend=flash, attention_op=ours["attention"])
    table["kernellab-norm"] = dict(label="kernellab: kl_layernorm alone (SDPA FLASH)", seed=0, backend=flash,
                                   norm_op=ours["norm"])
    for fused, base in FUSED.items():
        table[fused] = dict(table[base], add_norm_op=ours.get("add_norm"),
                            label=table[base]["label"] + " + kl_add_layernorm (each residual add with its norm)")
    for graphed, base in GRAPHED.items():
        table[graphed] = dict(table[base], graphs=True, label=table[base]["label"] + ", the step as one CUDA graph")
    needs = {"kernellab-attention": ["attention"], "kernellab-norm": ["norm"]}
    runs, skipped = [], []
    for name in names:
        required = needs.get(name, which)                 # "kernellab" and "kernellab-compiled" take what there is
        if "fused" in name:                               # and kl_add_layernorm besides
            required = required and required + ["add_norm"]
        if name.startswith("kernellab") and (not required or any(ours.get(r) is None for r in required)):
            skipped.append(f"{name}: not run (its kernellab op is not available; see above)")
            continue
        if name in GRAPHED and not cuda:
            skipped.append(f"{name}: not run on the CPU (CUDA graphs need a CUDA device)")
            continue
        if table[name].get("compile") and not cuda:
            skipped.append(f"{name}: not run on the CPU (torch.compile's C++ build takes minutes there)")
            continue
        runs.append(dict(name=name, **table[name]))
    return runs, skipped


def run_one(spec, corpus, args, config, log, diagnose=None) -> TrainRun:
    """One configuration's training under its SDPA backend; diagnose(StepParts) -> str runs after it (--diagnose)."""
    every = max(1, args.steps // 5)

    def progress(step, loss):
        if step % every == 0 or step == args.steps - 1:
            log(f"  {spec['name']} step {step:4d}: loss {float(loss):.4f}")

    backend = spec.get("backend")
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        return train(corpus, name=spec["name"], config=config, steps=args.steps, batch=args.batch, seq=args.seq,
                     seed=spec["seed"], device=args.device, attention_op=spec.get("attention_op"),
                     norm_op=spec.get("norm_op"), add_norm_op=spec.get("add_norm_op"),
                     compile=spec.get("compile", False), lr=args.lr, progress=progress,
                     profile_steps=args.profile, diagnose=diagnose, graphs=spec.get("graphs", False))


def summary_rows(runs: dict[str, TrainRun], labels: dict[str, str]) -> list[dict]:
    """One row per finished run: the losses, the step time and the speed-ups against eager and compiled."""
    base = {k: runs[k].median_step_ms for k in ("eager", "compiled") if k in runs}
    rows = []
    for name, r in runs.items():
        rows.append(dict(config=name, label=labels[name], final_loss=r.final_loss, last20_loss=r.mean_loss(20),
                         val_loss=r.val_loss, step_ms=r.median_step_ms, first_step_ms=r.step_ms[0],
                         capture_ms=r.capture_ms, replays=r.replays,
                         tokens_per_s=r.tokens_per_s,
                         vs_eager=base["eager"] / r.median_step_ms if "eager" in base else None,
                         vs_compiled=base["compiled"] / r.median_step_ms if "compiled" in base else None))
    return rows


def verdicts(runs: dict[str, TrainRun]) -> list[dict]:
    """The noise test of every other curve against eager, with each band that was measured."""
    out = []
    for band_name in ("eager-seed1", "eager-efficient"):
        if "eager" not in runs or band_name not in runs:
            continue
        for c in runs:
            if c in ("eager", "eager-seed1", band_name):      # the references are not tested against each other's band
                continue
            v = within_noise(runs["eager"].losses, runs[band_name].losses, runs[c].losses, window=SMOOTH)
            out.append(dict(config=c, band=band_name, within=v.within, gap=v.gap, band_width=v.band,
                            gap_step=v.gap_step, text=str(v)))
    return out


def format_table(rows: list[dict]) -> str:
    """The table as fixed-width text (markdown-compatible)."""
    head = ["config", "final loss", "last-20 mean", "held-out", "step ms (median)", "1st step ms", "capture ms",
            "tokens/s", "vs eager", "vs compiled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r["config"], f"{r['final_loss']:.4f}", f"{r['last20_loss']:.4f}", f"{r['val_loss']:.4f}",
                 f"{r['step_ms']:.2f}", f"{r['first_step_ms']:.0f}",
                 f"{r['capture_ms']:.0f}" if r.get("capture_ms") is not None else "-",
                 f"{r['tokens_per_s'] / 1e3:.1f}k",
                 f"{r['vs_eager']:.3f}x" if r["vs_eager"] else "-",
                 f"{r['vs_compiled']:.3f}x" if r["vs_compiled"] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, TrainRun], verdict_rows: list[dict], path: pathlib.Path, title: str) -> str | None:
    """The loss curves (raw, faint; 10-step means, solid) and each curve's smoothed distance from eager, with the
    seed band shaded; None, or why no plot was drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: {exc}"
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, (name, r) in enumerate(runs.items()):
        color = f"C{i}"
        steps = range(len(r.losses))
        ax.plot(steps, r.losses, color=color, alpha=0.25, lw=0.8)
        s = smooth(r.losses, SMOOTH)
        ax.plot(range(len(r.losses) - len(s), len(r.losses)), s, color=color, lw=1.6, label=name)
        if "eager" in runs and name != "eager":
            a = smooth(runs["eager"].losses, SMOOTH)
            ax_d.plot(range(len(r.losses) - len(s), len(r.losses)), [y - x for x, y in zip(a, s)], color=color,
                      lw=1.4, label=f"{name} - eager")
    band = next((v["band_width"] for v in verdict_rows if v["band"] == "eager-seed1"), None)
    if band is not None:
        ax_d.axhspan(-band, band, color="grey", alpha=0.15, label="seed band (max |seed1 - eager|)")
    ax.set(xlabel="step", ylabel="training loss (nats per byte)", title=title)
    ax_d.set(xlabel="step", ylabel=f"difference of {SMOOTH}-step means", title="distance from eager")
    ax.legend(fontsize=8)
    if ax_d.get_legend_handles_labels()[0]:
        ax_d.legend(fontsize=8)
    ax_d.axhline(0, color="black", lw=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ---- --diagnose: where a step's time goes ---------------------------------------------------------------------------

class LaunchCounter:
    """What kernellab's launch path asks of the CUDA driver, counted per thread ("main", or "other": autograd runs a
    backward pass on its own device thread): launches by the generated path (launch_kernel) and by LaunchPath.run
    (launch), waits for the GPU (stream_synchronize, synchronize), capture queries (made only before a wait) and
    INVALID_CONTEXT retries (make_current: a thread new to CUDA). Installed on the process's Driver before any kernel
    launches, since a generated launch binds the driver's calls when it is made; the first waits keep their stack."""

    CALLS = {"launch_kernel": "generated launches", "launch": "checked-path launches",
             "stream_synchronize": "waits", "synchronize": "waits", "stream_is_capturing": "capture queries",
             "is_capturing": "capture queries", "make_current": "context retries"}
    KEPT_STACKS = 3

    def __init__(self, driver):
        self.counts: collections.Counter = collections.Counter()     # (what, thread) -> calls
        self.seconds: collections.Counter = collections.Counter()    # (what, thread) -> time inside the calls
        self.wait_stacks: list[str] = []
        self._main = threading.main_thread().ident
        for attr, what in self.CALLS.items():
            fn = getattr(driver, attr, None)
            if fn is not None:
                setattr(driver, attr, self._counted(fn, what))

    def _counted(self, fn, what):
        counts, seconds, main, clock = self.counts, self.seconds, self._main, time.perf_counter

        def counted(*args, **kwargs):
            key = (what, "main" if threading.get_ident() == main else "other")
            counts[key] += 1
            if what == "waits" and len(self.wait_stacks) < self.KEPT_STACKS:
                self.wait_stacks.append("".join(traceback.format_stack(limit=8)[:-1]))
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[key] += clock() - t0
        return counted

    def snapshot(self) -> collections.Counter:
        return collections.Counter(self.counts)

    def seconds_snapshot(self) -> collections.Counter:
        return collections.Counter(self.seconds)

    @classmethod
    def install(cls) -> "LaunchCounter | None":
        """A counter on the process's kernellab Driver, or None where there is no CUDA driver."""
        try:
            from kernellab.run.launch import cudriver
            return cls(cudriver.driver())
        except Exception:                                      # no libcuda: no kernellab launches to count
            return None


_INSIDE = threading.local()       # .depth: inside a kernellab op's launcher on this thread (timed_launchers)


@contextlib.contextmanager
def timed_launchers(ops):
    """Each kernellab op's launcher (what Op._impl calls: the op's own Python and its launches) timed per call and
    thread while inside: yields ({(op name, thread): [calls, seconds]}, {op name: (the launcher, the last arguments
    it was called with)}: what replay_launchers runs alone)."""
    times: dict = collections.defaultdict(lambda: [0, 0.0])
    last: dict = {}
    main, clock, saved = threading.main_thread().ident, time.perf_counter, []
    for name, op in ops.items():
        launcher = op.launcher

        def timed(*args, _launcher=launcher, _name=name):
            _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
            t0 = clock()
            try:
                return _launcher(*args)
            finally:
                entry = times[_name, "main" if threading.get_ident() == main else "other"]
                entry[0] += 1
                entry[1] += clock() - t0
                _INSIDE.depth -= 1
                last[_name] = (_launcher, args)
        saved.append((op, launcher))
        op.launcher = timed
    try:
        yield times, last
    finally:
        for op, launcher in saved:
            op.launcher = launcher


@contextlib.contextmanager
def timed_op_calls(ops):
    """Each kernellab op's whole eager call (Op._call: the autograd.Function or dispatcher around the launcher, the
    outputs' graph node, the launcher) timed per call and thread while inside: {(op name, thread): [calls, s]}."""
    times: dict = collections.defaultdict(lambda: [0, 0.0])
    main, clock, saved = threading.main_thread().ident, time.perf_counter, []
    for name, op in ops.items():
        call = op.__dict__.get("_call")
        if call is None:
            continue

        def timed(*args, _call=call, _name=name):
            t0 = clock()
            try:
                return _call(*args)
            finally:
                entry = times[_name, "main" if threading.get_ident() == main else "other"]
                entry[0] += 1
                entry[1] += clock() - t0
        saved.append((op, call))
        op._call = timed
    try:
        yield times
    finally:
        for op, call in saved:
            op._call = call


# Python-level calls a launcher makes that may cost host time of their own: the output and scratch allocations and
# kernellab.tensor_map (its cache's misses call tensor_map.encode, the driver's cuTensorMapEncodeTiled, or, for a
# layout mapped before, tensor_map.replace_address, the driver's cuTensorMapReplaceAddress).
ALLOCATIONS = ("empty", "empty_like", "zeros", "zeros_like")


@contextlib.contextmanager
def launcher_parts():
    """The host time inside kernellab's launchers split by what it calls, while inside: torch allocations
    (ALLOCATIONS, called from inside a launcher), kernellab.tensor_map calls and, of those, cache misses (encodes).
    Yields {part: [calls, seconds]}; the driver's launch calls are LaunchCounter's."""
    import kernellab
    from kernellab.run.launch import tensor_map as tensor_map_module
    parts: dict = collections.defaultdict(lambda: [0, 0.0])
    clock, saved = time.perf_counter, []

    def wrap(owner, attr, part, only_inside):
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            if only_inside and not getattr(_INSIDE, "depth", 0):
                return fn(*args, **kwargs)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = parts[part]
                entry[0] += 1
                entry[1] += clock() - t0
        saved.append((owner, attr, fn))
        setattr(owner, attr, timed)
    for attr in ALLOCATIONS:
        wrap(torch, attr, "torch allocations", True)
    wrap(kernellab, "tensor_map", "tensor maps", False)
    wrap(tensor_map_module, "encode", "tensor-map encodes (cache misses)", False)
    wrap(tensor_map_module, "replace_address", "tensor-map address replacements (cache misses)", False)
    try:
        yield parts
    finally:
        for owner, attr, fn in reversed(saved):
            setattr(owner, attr, fn)


@contextlib.contextmanager
def gc_watch():
    """Python's cyclic garbage collector while inside (gc.callbacks): yields {"collections": [gen 0, 1, 2],
    "seconds": [gen 0, 1, 2], "longest_s": the longest pause, "threads": {"main"/"other": collections}}."""
    import gc
    stats = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "longest_s": 0.0,
             "threads": collections.Counter()}
    started: dict = {}
    main, clock = threading.main_thread().ident, time.perf_counter

    def callback(phase, info):
        me = threading.get_ident()
        if phase == "start":
            started[me] = clock()
        elif me in started:
            took = clock() - started.pop(me)
            gen = min(int(info.get("generation", 0)), 2)
            stats["collections"][gen] += 1
            stats["seconds"][gen] += took
            stats["longest_s"] = max(stats["longest_s"], took)
            stats["threads"]["main" if me == main else "other"] += 1
    gc.callbacks.append(callback)
    try:
        yield stats
    finally:
        gc.callbacks.remove(callback)


def _timed_steps(parts: StepParts, batches, sync, cuda) -> tuple[list, list]:
    """(host ms by phase, GPU ms) of each step in `batches`, each begun on an idle GPU."""
    host, gpu = [], []
    for x, y in batches:
        sync()                                      # each step starts on an idle GPU: host time is its own
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        loss = parts.forward(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        parts.update()
        t3 = time.perf_counter()
        if cuda:
            e1.record()
            sync()
            gpu.append(e0.elapsed_time(e1))
        host.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
    return host, gpu


def _step_medians(host, gpu) -> tuple[float, float | None]:
    """(host ms, GPU ms) a step: medians past the first step (which may still warm something up)."""
    timed = host[1:] or host
    return _median([sum(h) for h in timed]), (_median(gpu[1:] or gpu) if gpu else None)


def gc_variants(parts: StepParts, batches, sync, cuda) -> dict:
    """The same steps again, twice over, without the diagnosis's own timers: as they are ("GC on"), with gc.freeze()
    (every object alive now moved out of the collector's reach: its collections walk only what the steps allocate)
    and with the collector off (gc.disable()): {variant: (host ms, GPU ms, GC stats)}. Where a step costs the same
    in all three, Python's GC is not where the host time goes."""
    import gc
    out = {}
    enabled = gc.isenabled()
    batches = list(batches) * 2                     # twice the steps: three medians to compare, not one to report
    with gc_watch() as stats:
        host, gpu = _timed_steps(parts, batches, sync, cuda)
    out["GC on"] = (*_step_medians(host, gpu), stats)
    gc.collect()
    gc.freeze()
    try:
        with gc_watch() as stats:
            host, gpu = _timed_steps(parts, batches, sync, cuda)
        out["gc.freeze"] = (*_step_medians(host, gpu), stats)
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with gc_watch() as stats:
            host, gpu = _timed_steps(parts, batches, sync, cuda)
        out["GC off"] = (*_step_medians(host, gpu), stats)
    finally:
        if enabled:
            gc.enable()
    return out


def replay_launchers(last: dict, sync, calls: int = 20, flush_bytes: int = 64 << 20) -> dict:
    """Each op's launcher alone on the main thread, on the last arguments a step gave it, `calls` times: the median
    host time a call back to back (the CPU's caches warm with it), and after writing `flush_bytes` of host memory
    before each call (caches cold, as inside a step where torch's own code runs between our launches):
    {op name: (hot us, cold us)}. Beside the in-step time it says whether the launcher's Python is slow on this host
    by itself, or only inside a training step."""
    import numpy as np

    import kernellab.ops
    flush = np.zeros(flush_bytes // 8)
    token = kernellab.ops.DEFER_SYNC.set(True)      # launches do not wait, as inside the op (Op._impl)
    try:
        return {name: (_replayed(launcher, args, sync, calls, None), _replayed(launcher, args, sync, calls, flush))
                for name, (launcher, args) in sorted(last.items())}
    finally:
        kernellab.ops.DEFER_SYNC.reset(token)


def _replayed(launcher, args, sync, calls: int, flush) -> float:
    """The median host us a call of launcher(*args), `flush` (an array) written before each call unless None."""
    took = []
    sync()
    for i in range(calls):
        if flush is not None:
            flush.fill(i)
        t0 = time.perf_counter()
        launcher(*args)
        took.append(time.perf_counter() - t0)
        if i % 8 == 7:
            sync()                                  # keep the GPU's queue short: the launches stay asynchronous
    sync()
    return _median(took) * 1e6


ALLOCATOR_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def host_cpu() -> str:
    """The host's CPU as a step's host time depends on it: model, clock now (the mean of /proc/cpuinfo's "cpu MHz"),
    the cores this process may run on, torch's CPU threads."""
    model, mhz = "", []
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "cpu MHz":
                mhz.append(float(value))
    except (OSError, ValueError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    clock = f", {sum(mhz) / len(mhz):.0f} MHz now (mean of {len(mhz)})" if mhz else ""
    return (f"{model or 'unknown model'}{clock}; {cores} cores this process may run on; torch's CPU threads "
            f"{torch.get_num_threads()}")


def _tracked_objects() -> int:
    """How many objects Python's cyclic collector tracks now (what a full, generation-2, collection walks)."""
    import gc
    return len(gc.get_objects())


def _median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def diagnose_step(parts: StepParts, counter: LaunchCounter | None, steps: int = DIAGNOSE_STEPS,
                  profile_steps: int = 3) -> tuple[str, dict]:
    """(the text, a summary row) of where a training step's time goes: see the module's docstring, Diagnosis."""
    cuda = parts.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(parts.device)) if cuda else (lambda: None)
    batches = [parts.batches[i % len(parts.batches)] for i in range(steps)]
    before = counter.snapshot() if counter else collections.Counter()
    seconds0 = counter.seconds_snapshot() if counter else collections.Counter()
    mem0 = torch.cuda.memory_stats(parts.device) if cuda else {}
    import kernellab.ops
    ops = kernellab.ops.registered()
    with warnings.catch_warnings(record=True) as caught, timed_launchers(ops) as (op_times, last_args), \
            timed_op_calls(ops) as call_times, launcher_parts() as split, gc_watch() as gc_stats:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")          # a warning at every synchronising call torch makes
        try:
            host, gpu = _timed_steps(parts, batches, sync, cuda)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    after = counter.snapshot() if counter else collections.Counter()
    in_driver = (counter.seconds_snapshot() if counter else collections.Counter()) - seconds0
    mem1 = torch.cuda.memory_stats(parts.device) if cuda else {}
    timed = host[1:] or host                                 # the first step may still warm something up
    phases = [_median([h[i] for h in timed]) for i in range(3)]
    host_ms, gpu_ms = _step_medians(host, gpu)
    variants = gc_variants(parts, batches, sync, cuda)
    alone = replay_launchers(last_args, sync)
    del last_args
    per_step = {k: (after[k] - before[k]) / steps for k in set(after) | set(before) if after[k] != before[k]}
    waits = sum(v for (what, _), v in per_step.items() if what == "waits")
    alloc = {k: (mem1.get(k, 0) - mem0.get(k, 0)) / steps for k in ALLOCATOR_KEYS if k in mem1}
    if waits or syncs or alloc.get("num_device_free", 0) or alloc.get("num_alloc_retries", 0):
        verdict = "the host waits for the GPU inside a step (see the waits and synchronising calls)"
    elif gpu_ms is not None and host_ms >= 0.9 * gpu_ms:
        verdict = "host-bound: queuing the step takes the host as long as the GPU takes to run it, or longer"
    elif gpu_ms is not None:
        verdict = "GPU-bound: the host queues the step faster than the GPU runs it"
    else:
        verdict = "no GPU: host time only"
    lines = [f"host {host_ms:.2f} ms a step (forward {phases[0]:.2f}, backward {phases[1]:.2f}, clip + optimiser "
             f"{phases[2]:.2f}; perf_counter, no synchronisation), GPU "
             + (f"{gpu_ms:.2f} ms a step (CUDA events)" if gpu_ms is not None else "- (no GPU)")
             + f"; median of steps 2-{steps}: {verdict}"]
    if counter is None:
        lines.append("kernellab's launch path: not counted (no CUDA driver in this process)")
    else:
        kinds = sorted({what for what, _ in per_step})
        text = "; ".join(f"{what} " + ", ".join(f"{per_step[what, t]:g} on the {t} thread"
                                               for t in ("main", "other") if (what, t) in per_step) for what in kinds)
        lines.append(f"kernellab's launch path, per step: {text or 'nothing (no kernellab op in this model)'}")
        if in_driver:
            lines.append("  host time inside those driver calls, a call: " + "; ".join(
                f"{what} on the {t} thread {secs / max(after[what, t] - before[what, t], 1) * 1e6:.1f} us"
                for (what, t), secs in sorted(in_driver.items())))
        if waits and counter.wait_stacks:
            lines.append("  the first launch that waited, from:\n" + counter.wait_stacks[0].rstrip())
    if op_times:
        lines.append("kernellab ops' launchers (their Python and launches; not the dispatcher or autograd around "
                     "them), per step: " + "; ".join(
                         f"{name} {n / steps:g} calls on the {t} thread, {secs / max(n, 1) * 1e6:.0f} us a call"
                         for (name, t), (n, secs) in sorted(op_times.items())))
    if call_times:
        lines.append("kernellab ops' whole eager calls (the launcher and the autograd.Function or dispatcher around "
                     "it), per step: " + "; ".join(
                         f"{name} {n / steps:g} calls on the {t} thread, {secs / max(n, 1) * 1e6:.0f} us a call"
                         for (name, t), (n, secs) in sorted(call_times.items())))
    launcher_s = sum(secs for n, secs in op_times.values())
    launches_s = sum(secs for (what, _), secs in in_driver.items() if what.endswith("launches"))
    parts_s = {part: secs for part, (n, secs) in split.items()}
    inside_s = launches_s + parts_s.get("torch allocations", 0.0) + parts_s.get("tensor maps", 0.0)
    if op_times:
        lines.append(
            f"the launchers' host time split, ms a step: all {launcher_s * 1e3 / steps:.2f} = driver launch calls "
            f"{launches_s * 1e3 / steps:.2f} + " + " + ".join(
                f"{part} {secs * 1e3 / steps:.2f} ({split[part][0] / steps:g} calls, "
                f"{secs / max(split[part][0], 1) * 1e6:.1f} us a call)"
                for part, secs in sorted(parts_s.items()) if not part.startswith("tensor-map "))
            + f" + the launchers' own Python {max(launcher_s - inside_s, 0.0) * 1e3 / steps:.2f}"
            + "".join(f"; of the tensor maps, {n / steps:g} a step missed the cache and encoded "
                      f"({secs / max(n, 1) * 1e6:.0f} us an encode)"
                      for part, (n, secs) in split.items() if part.startswith("tensor-map encodes"))
            + "".join(f"; {n / steps:g} a step missed the cache and had their address replaced in a map of the "
                      f"same layout ({secs / max(n, 1) * 1e6:.1f} us a replacement)"
                      for part, (n, secs) in split.items() if part.startswith("tensor-map address"))
            + ("; every tensor map hit the cache" if "tensor maps" in split
               and not any(part.startswith("tensor-map ") and part != "tensor maps" for part in split) else ""))
    if alone:
        in_step = {name: secs / max(n, 1) * 1e6 for (name, _), (n, secs) in op_times.items()}
        lines.append("each launcher alone on the main thread, on a step's last arguments (20 calls, median): "
                     + "; ".join(f"{name} {hot:.0f} us back to back, {cold:.0f} us after a 64 MiB host write "
                                 f"(in the step {in_step.get(name, 0):.0f} us)"
                                 for name, (hot, cold) in alone.items()))
    gc_s = sum(gc_stats["seconds"])
    lines.append(f"Python's GC in those steps: {gc_s * 1e3 / steps:.2f} ms a step in "
                 f"{sum(gc_stats['collections']) / steps:g} collections a step (generation 0/1/2: "
                 + "/".join(f"{c / steps:g}" for c in gc_stats["collections"]) + "; ms a step "
                 + "/".join(f"{t * 1e3 / steps:.2f}" for t in gc_stats["seconds"])
                 + f"), longest pause {gc_stats['longest_s'] * 1e3:.2f} ms; "
                 + ", ".join(f"{n} on the {t} thread" for t, n in sorted(gc_stats["threads"].items()))
                 + f"; objects the collector tracks: {_tracked_objects():,}")
    lines.append("the same steps twice over with Python's GC as it is, frozen and off: " + "; ".join(
        f"{name}: host {h:.2f} ms" + (f", GPU {g:.2f} ms" if g is not None else "")
        + f", GC {sum(st['seconds']) * 1e3 / (2 * steps):.2f} ms a step in "
          f"{sum(st['collections']) / (2 * steps):g} collections"
        for name, (h, g, st) in variants.items())
        + f" (the diagnosis's timers off; with them: host {host_ms:.2f} ms)")
    lines.append(f"host CPU: {host_cpu()}")
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    lines.append(f"other Python threads alive (they compete for the GIL when busy): {', '.join(others) or 'none'}")
    lines.append(f"torch's synchronising calls (set_sync_debug_mode): {len(syncs) / steps:g} a step"
                 + "".join(f"\n  {w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:160]}"
                           for w in syncs[:3]))
    if alloc:
        lines.append("caching allocator, per step: " + ", ".join(f"{k} {v:g}" for k, v in alloc.items()))
    lines += _profiled(parts, batches[:profile_steps], sync, cuda)
    summary = dict(host_ms=host_ms, gpu_ms=gpu_ms, forward_ms=phases[0], backward_ms=phases[1], update_ms=phases[2],
                   kernellab_launches=sum(v for (w, _), v in per_step.items() if w.endswith("launches")),
                   kernellab_waits=waits, context_retries=sum(v for (w, _), v in per_step.items()
                                                              if w == "context retries"),
                   torch_syncs=len(syncs) / steps, allocator=alloc, verdict=verdict,
                   launcher_ms=launcher_s * 1e3 / steps,
                   op_call_ms=sum(secs for n, secs in call_times.values()) * 1e3 / steps,
                   launcher_split_ms={"driver launch calls": launches_s * 1e3 / steps,
                                      **{part: secs * 1e3 / steps for part, secs in parts_s.items()},
                                      "own Python": max(launcher_s - inside_s, 0.0) * 1e3 / steps},
                   launcher_alone_ms={"back to back": sum(alone[name][0] * n for (name, _), (n, _s) in
                                                          op_times.items() if name in alone) / 1e3 / steps,
                                      "caches cold": sum(alone[name][1] * n for (name, _), (n, _s) in
                                                         op_times.items() if name in alone) / 1e3 / steps},
                   gc_ms=gc_s * 1e3 / steps, gc_collections=[c / steps for c in gc_stats["collections"]],
                   gc_longest_ms=gc_stats["longest_s"] * 1e3,
                   gc_variants={name: {"host_ms": h, "gpu_ms": g, "gc_ms": sum(st["seconds"]) * 1e3 / (2 * steps)}
                                for name, (h, g, st) in variants.items()})
    return "\n".join(lines), summary


SYNC_NAMES = re.compile(r"Synchronize|Memcpy|cudaFree|cudaMalloc|cuMemAlloc|cuMemFree|cuCtx|cuModule|cudaEventQuery",
                        re.IGNORECASE)


def _profiled(parts: StepParts, batches, sync, cuda) -> list[str]:
    """torch.profiler (CPU activity with Python stacks, and CUDA) and cProfile of the main thread over `batches`."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile
    lines = []
    try:
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, with_stack=True) as prof:
            for x, y in batches:
                parts.one_step(x, y)
            sync()
        events = prof.key_averages()
        n = max(1, len(batches))
        blocking = [e for e in events if SYNC_NAMES.search(e.key)]
        lines.append(f"driver and runtime calls that can wait, in {n} profiled steps: "
                     + ("; ".join(f"{e.key} x{e.count} ({e.cpu_time_total / 1e3:.2f} ms)" for e in blocking)
                        or "none"))
        ops = [e for e in events if e.key.startswith("kl::")]
        if ops:
            lines.append("kernellab ops, host time a call (CPU total): " + "; ".join(
                f"{e.key} {e.cpu_time_total / max(e.count, 1):.0f} us x{e.count / n:g} a step" for e in ops))
        if cuda:
            lines.append(gpu_gaps(prof.events()))
        lines.append(f"torch.profiler, {n} steps, the top host-side entries by self CPU time:\n"
                     + events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=90))
    except Exception as exc:                                   # the profiler is a view, not the measurement
        lines.append(f"torch.profiler failed: {type(exc).__name__}: {exc}")
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for x, y in batches:
        parts.one_step(x, y)
    sync()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    body = out.getvalue()
    lines.append(f"cProfile of the main thread (autograd's backward thread is not in it), {len(batches)} steps, by "
                 f"own time:\n" + body[body.find("   ncalls"):].rstrip())
    ours = io.StringIO()              # kernellab's and the tutorials' functions alone: where an op's Python goes
    pstats.Stats(prof, stream=ours).sort_stats("cumulative").print_stats(r"kernellab|launchers|<kernellab", 25)
    body = ours.getvalue()
    if "   ncalls" in body:
        lines.append("cProfile, kernellab's and the tutorials' functions (ops, launchers, generated calls and "
                     "launches) by cumulative time:\n" + body[body.find("   ncalls"):].rstrip())
    return lines


def gpu_gaps(events, top: int = 6, min_gap_us: float = 20.0) -> str:
    """Where the GPU sat idle between kernels in a profile: the idle share of the kernels' span and the longest gaps,
    each with the kernels before and after it and the host-side op that launched the one after (the host was late
    there)."""
    from torch.autograd import DeviceType
    kernels = sorted((e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if len(kernels) < 2:
        return "GPU idle time: no kernels in the profile"
    gaps, busy_end = [], kernels[0].time_range.end
    for prev, e in zip(kernels, kernels[1:]):
        if e.time_range.start - busy_end >= min_gap_us:
            gaps.append((e.time_range.start - busy_end, prev, e))
        busy_end = max(busy_end, e.time_range.end)
    span = busy_end - kernels[0].time_range.start
    idle = sum(g for g, _, _ in gaps)

    def launcher(e):
        parent = getattr(e, "cpu_parent", None)
        while parent is not None and getattr(parent, "cpu_parent", None) is not None and \
                not parent.name.startswith(("kl::", "aten::", "autograd::", "Optimizer")):
            parent = parent.cpu_parent
        return parent.name if parent is not None else "?"
    lines = [f"GPU idle between kernels (gaps of {min_gap_us:.0f} us or more): {idle / 1e3:.2f} of {span / 1e3:.2f} "
             f"ms ({100 * idle / max(span, 1):.0f} %), in {len(gaps)} gaps; the longest:"]
    for g, prev, e in sorted(gaps, key=lambda t: -t[0])[:top]:
        lines.append(f"  {g:8.0f} us before {e.name[:60]} (launched under {launcher(e)[:50]}), after {prev.name[:50]}")
    return "\n".join(lines)


def diagnosis_table(summaries: dict[str, dict]) -> str:
    """One row per diagnosed configuration: host and GPU time a step, kernellab's launches and waits, torch's
    synchronising calls and the verdict; then, per configuration, Python's GC and the same steps with it frozen or
    off, and the launchers' host time: their parts, and the same launchers alone (hot and cold caches)."""
    head = ["config", "host ms", "GPU ms", "fwd / bwd / update host ms", "kl launcher host ms", "kl launches",
            "kl waits", "ctx retries", "torch syncs", "verdict"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, d in summaries.items():
        gpu = f"{d['gpu_ms']:.2f}" if d["gpu_ms"] is not None else "-"
        rows.append(f"| {name} | {d['host_ms']:.2f} | {gpu} | {d['forward_ms']:.1f} / {d['backward_ms']:.1f} / "
                    f"{d['update_ms']:.1f} | {d['launcher_ms']:.2f} | {d['kernellab_launches']:g} | {d['kernellab_waits']:g} | "
                    f"{d['context_retries']:g} | {d['torch_syncs']:g} | {d['verdict'].split(':')[0]} |")
    head = ["config", "GC ms a step (collections gen 0/1/2)", "host ms: GC on / gc.freeze / GC off",
            "kl op calls ms", "kl launchers ms: driver / allocations / tensor maps / own Python",
            "kl launchers ms alone: hot / cold caches"]
    rows += ["", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, d in summaries.items():
        if "gc_ms" not in d:
            continue
        v, split, alone = d["gc_variants"], d["launcher_split_ms"], d["launcher_alone_ms"]
        rows.append(f"| {name} | {d['gc_ms']:.2f} ({'/'.join(f'{c:g}' for c in d['gc_collections'])}) | "
                    + " / ".join(f"{v[k]['host_ms']:.2f}" for k in ("GC on", "gc.freeze", "GC off")) + " | "
                    f"{d['op_call_ms']:.2f} | {split['driver launch calls']:.2f} / "
                    f"{split.get('torch allocations', 0.0):.2f} / {split.get('tensor maps', 0.0):.2f} / "
                    f"{split['own Python']:.2f} | {alone['back to back']:.2f} / {alone['caches cold']:.2f} |")
    return "\n".join(rows)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, help="training steps per configuration (default 200; --quick 30)")
    ap.add_argument("--batch", type=int, help="sequences per step (default 16; --quick 8)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default 1024, the context; --quick 128)")
    ap.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default 6e-4)")
    ap.add_argument("--quick", action="store_true", help="a tiny model (2 layers of 128) for 30 steps: a smoke run")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"comma-separated, of {', '.join(CONFIGS)} (default: all but the graphed ones)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for the JSON, PNG and table")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="after each configuration, STEPS more steps under torch.profiler: the top kernels by GPU "
                         "time, printed and written to profile-CONFIG.txt under --out")
    ap.add_argument("--diagnose", action="store_true",
                    help="after each configuration, where its step time goes: host against GPU time a step, "
                         "kernellab's launches and waits, torch's synchronising calls, the top host-side functions "
                         "(printed, and diagnose-CONFIG.txt under --out)")
    args = ap.parse_args(argv)
    quick = args.quick
    args.steps = args.steps or (30 if quick else 200)
    args.batch = args.batch or (8 if quick else 16)
    config = GPTConfig.tiny() if quick else GPTConfig()
    args.seq = args.seq or config.context
    if args.seq > config.context:
        ap.error(f"--seq {args.seq} is longer than the model's context of {config.context}")
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or not names:
        ap.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    if any(c in GRAPHED for c in names) and args.steps < GRAPH_WARMUP + 2:
        ap.error(f"--steps {args.steps}: a graphed configuration needs at least {GRAPH_WARMUP + 2} steps "
                 f"({GRAPH_WARMUP} eager warm-up steps, the capture, a timed replay)")
    args.configs = names
    return args, config


def main(argv=None) -> int:
    args, config = parse(argv)
    out = pathlib.Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    device_name = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "CPU"
    # before any kernellab kernel launches: a generated launch binds the driver's calls when it is made
    counter = LaunchCounter.install() if args.diagnose and torch.device(args.device).type == "cuda" else None
    diagnosed: dict[str, dict] = {}
    corpus = ByteCorpus.stdlib()
    log(f"{device_name}, torch {torch.__version__}; corpus: {corpus.name}, {len(corpus) / 1e6:.1f} MB, sha256 "
        f"{corpus.sha256[:12]}; model: {config}; {args.steps} steps of {args.batch} x {args.seq} tokens")
    ours = load_ours(args.device, log) if any(c.startswith("kernellab") for c in args.configs) else \
        {"attention": None, "norm": None, "notes": []}
    if any("fused" in c for c in args.configs):
        fused = load_add_norm(args.device, log)
        ours = dict(ours, add_norm=fused["add_norm"], notes=ours["notes"] + fused["notes"])
    specs, skipped = plan(args.configs, ours, args.device)
    runs, labels, failed = {}, {}, []
    title = f"{'tiny GPT' if args.quick else 'GPT-2 small'} on stdlib bytes, {device_name}"

    def save(final: bool):
        """The JSON, the markdown table and the plot of the runs so far (after each configuration, so that a run
        stopped by a time limit leaves what it finished)."""
        rows, checks = summary_rows(runs, labels), verdicts(runs)
        result = dict(device=device_name, torch=torch.__version__, date=time.strftime("%Y-%m-%d", time.gmtime()),
                      command="python benchmarks/train_gpt2.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      complete=final, model=dataclasses.asdict(config),
                      corpus=dict(name=corpus.name, bytes=len(corpus), sha256=corpus.sha256),
                      steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr, smooth_window=SMOOTH,
                      diagnosis=diagnosed,
                      ops=ours["notes"], skipped=skipped, failed=failed, table=rows, noise=checks,
                      runs={n: dict(label=labels[n], seed=r.seed, losses=r.losses, step_ms=r.step_ms,
                                    timed_from=r.timed_from, val_loss=r.val_loss, wall_s=r.wall_s,
                                    captured_at=r.captured_at, replays=r.replays,
                                    profile=r.profile, diagnosis=r.diagnosis)
                            for n, r in runs.items()})
        table = format_table(rows)
        if out:
            (out / "train_gpt2.json").write_text(json.dumps(result, indent=1))
            (out / "train_gpt2.md").write_text(f"{title}, {result['date']}, `{result['command']}`\n\n{table}\n")
            why = plot(runs, checks, out / "train_gpt2.png", title) if runs else "no plot: no run finished"
            if final:
                log(why or f"wrote {out / 'train_gpt2.json'}, {out / 'train_gpt2.png'}, {out / 'train_gpt2.md'}")
        return rows, checks, table

    for spec in specs:
        log(f"{spec['name']}: {spec['label']}")
        t0 = time.perf_counter()
        def diagnose(parts, name=spec["name"]):
            text, diagnosed[name] = diagnose_step(parts, counter)
            return text

        try:
            runs[spec["name"]] = run_one(spec, corpus, args, config, log, diagnose if args.diagnose else None)
            labels[spec["name"]] = spec["label"]
            log(f"  {runs[spec['name']]} ({time.perf_counter() - t0:.0f} s)")
            if runs[spec["name"]].profile:
                log(runs[spec["name"]].profile)
                if out:
                    (out / f"profile-{spec['name']}.txt").write_text(runs[spec["name"]].profile)
            if runs[spec["name"]].diagnosis:
                log(f"  diagnosis of {spec['name']}:\n" + runs[spec["name"]].diagnosis)
                if out:
                    (out / f"diagnose-{spec['name']}.txt").write_text(runs[spec["name"]].diagnosis + "\n")
        except Exception as exc:                                # one configuration's failure does not stop the others
            tb = traceback.format_exc(limit=-4)
            first = str(exc).splitlines()[0] if str(exc) else ""
            failed.append(f"{spec['name']}: FAILED: {type(exc).__name__}: {first}")
            log(failed[-1] + "\n" + tb)
        finally:
            if spec.get("compile"):
                torch.compiler.reset()
            if torch.device(args.device).type == "cuda":
                torch.cuda.empty_cache()
        save(final=False)
    rows, checks, table = save(final=True)
    log("")
    for note in ours["notes"] + skipped + failed:
        log(note)
    for v in checks:
        log(f"{v['config']} against eager, band {v['band']}: {v['text']}")
    log(f"\n{title}: {args.steps} steps of {args.batch} x {args.seq} tokens; speed-ups are step-time ratios "
        f"(above 1: faster), the step time a median after the first {min(10, args.steps // 4)} steps (graphed: "
        f"after the capturing step, step {GRAPH_WARMUP}; its time is 'capture ms')")
    for r in rows:
        log(f"  {r['config']}: {r['label']}")
    if diagnosed:
        log(f"\nwhere the step time goes ({DIAGNOSE_STEPS} steps each from an idle GPU, medians; per step: "
            f"kernellab's launches and waits for the GPU, INVALID_CONTEXT retries, torch's synchronising calls):\n"
            + diagnosis_table(diagnosed) + "\n")
    log(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
