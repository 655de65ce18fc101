"""The residual add fused with LayerNorm (kl::add_layernorm, kernellab.teach.add_norm), forward + backward as a
training step calls it, against our separate add + kl_layernorm (tutorial 04) and torch.compile of
F.layer_norm(x + r), in one run.

    python benchmarks/add_norm.py                  # GPT-2 small's 16 x 1024 tokens x 768, as autocast runs it
    python benchmarks/add_norm.py --quick --shapes 16384x768,4096x1024 --dtypes float32:bfloat16,bfloat16:bfloat16

Method
- The case is a pre-norm block's stream under bf16 autocast: x (the residual stream) float32, r (a branch's output:
  its last matmul's) bf16, w and b float32; h = x + r goes on in float32, y = LayerNorm(h) feeds the next matmul in
  bf16; the backward gets y's gradient (bf16) and h's from later in the stream (float32). --dtypes x:r pairs.
- Checked first: h, y and the gradients of x, r, w, b against float64, ours within 2x PyTorch's own error (eager, the
  same dtypes) plus a rounding of the largest value; a case that fails is reported and not timed.
- Timed as called: `torch.autograd.grad([h, y], [x, r, w, b], [dh_out, dy])` after the forward, the whole
  forward + backward each call (what a training step runs for this add and norm):
    fused             h, y = kl::add_layernorm(x, r, w, b)
    add + kl_layernorm h = x + r; y = kl::layernorm(h, w, b).to(r.dtype) (tutorial 04's op; the cast is autocast's
                      before the next matmul, and its backward's cast of dy back, as the model runs it)
    torch.compile     torch.compile(dynamic=False) of x + r, F.layer_norm, the cast (Inductor fuses the three,
                      forward and backward)
    torch eager       the same in eager PyTorch
  by kernellab.bench, triton's do_bench and kernellab.bench(sustained=True) (benchmarks/as_called.py); then the fused
  forward alone and the backward op alone (kernellab.bench).
- Prediction (kernellab.teach.add_norm.model_us, written before a GPU ran it): bytes at 3 TB/s plus 2.5 µs a kernel.
  At 16384 x 768, float32 stream and bf16 branch: fused forward 52.8 µs (x, r read; h, y written: 12 bytes an
  element), backward 72.1 µs (dy, dh_out, h read; dh, dr written: 16 bytes; the finish), 124.9 µs in all; add +
  kl_layernorm 271.7 µs (the add, the norm, the casts of y, dy and dr, the norm's backward and finish, the
  backward's add: 8 kernels); torch.compile the same bytes as ours, 124.9 µs.
The short table comes last; $OUT (or --out) gets add_norm.json with every number.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

EPS = 1e-5
SHAPES = [(16384, 768)]


def inputs(torch, rows, cols, xt, rt, seed=0):
    """x (xt), r (rt), w, b (xt), dy (rt), dh_out (xt) on the GPU: x ~ N(0, 1) (a stream), r ~ N(0, 0.5)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    r = 0.5 * torch.randn(rows, cols, generator=g)
    w = 1 + 0.2 * torch.randn(cols, generator=g)
    b = 0.1 * torch.randn(cols, generator=g)
    dy = torch.randn(rows, cols, generator=g)
    up = torch.randn(rows, cols, generator=g)
    return tuple(t.to(d).cuda() for t, d in ((x, xt), (r, rt), (w, xt), (b, xt), (dy, rt), (up, xt)))


def grads(torch, fn, x, r, w, b, dy, up, dtype=None):
    """(h, y, dx, dr, dw, db) of fn(x, r, w, b) -> (h, y) with gradients (up, dy), inputs in `dtype` (None: theirs)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (x, r, w, b)]
    h, y = fn(*leaves)
    g = torch.autograd.grad([h, y], leaves, [up.to(h.dtype), dy.to(y.dtype)])
    return [h.detach(), y.detach(), *g]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing: 4 rounds of 40 ms a method, not 8 of 80")
    ap.add_argument("--shapes", default="", help="e.g. 16384x768,4096x1024 (default: 16384x768)")
    ap.add_argument("--dtypes", default="float32:bfloat16",
                    help="x:r dtype pairs, e.g. float32:bfloat16,float32:float32")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for add_norm.json")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import kernellab
    from as_called import METHODS, time_as_called
    from kernellab.teach import add_norm as an
    from notebook_cells import load_tutorial

    t0 = time.time()
    ns = load_tutorial("04-layernorm.py")
    kl_layernorm = ns.get("kl_layernorm")
    if kl_layernorm is None:                  # registered in a plain cell after the launchers (train_gpt2's way in)
        import train_gpt2
        kl_layernorm = train_gpt2.op_from_cells("04-layernorm.py", "kl_layernorm", ns)
    an.kernels("cuda")
    print(f"compiled tutorial 04's kernels and kl/add_norm.cuh in {time.time() - t0:.1f} s", flush=True)
    torch._dynamo.config.recompile_limit = 256
    device = torch.cuda.get_device_name()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    pairs = [tuple(getattr(torch, d) for d in p.split(":")) for p in args.dtypes.split(",")]

    def fused(x, r, w, b):
        return an.kl_add_layernorm(x, r, w, b, EPS)

    def separate(x, r, w, b):
        h = x + r
        return h, kl_layernorm(h, w, b, EPS).to(r.dtype)

    def pytorch(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (h.shape[-1],), w, b, EPS).to(r.dtype)

    compiled = torch.compile(pytorch, dynamic=False)
    variants = {"fused": fused, "add + kl_layernorm": separate, "torch.compile": compiled, "torch eager": pytorch}
    records, failed = [], []
    for xt, rt in pairs:
        for rows, cols in shapes:
            label = f"{str(xt)[6:]}+{str(rt)[6:]} {rows}x{cols}"
            x, r, w, b, dy, up = inputs(torch, rows, cols, xt, rt)
            try:
                ours = grads(torch, fused, x, r, w, b, dy, up)
                want = grads(torch, pytorch, x, r, w, b, dy, up, torch.float64)
                theirs = grads(torch, pytorch, x, r, w, b, dy, up)
            except Exception as exc:  # noqa: BLE001 - report and go on
                failed.append(f"{label}: raised {type(exc).__name__}: {exc}")
                print(f"  ! {failed[-1]}", flush=True)
                continue
            errors, bad = {}, []
            for n, o, t, f in zip(("h", "y", "dx", "dr", "dw", "db"), ours, theirs, want):
                eo, et, scale = (float((o.double() - f).abs().max()), float((t.double() - f).abs().max()),
                                 float(f.abs().max()))
                floor = 2.0 ** -8 if o.dtype == torch.bfloat16 else 1e-6
                errors[n] = (eo, et, scale)
                if not eo <= 2 * et + floor * max(scale, 1.0):
                    bad.append(f"{n} ours {eo:.3g} PyTorch {et:.3g} (largest {scale:.3g})")
            print(f"{label} check: " + ", ".join(f"{n} {o:.2g}/{t:.2g}" for n, (o, t, _) in errors.items()),
                  flush=True)
            if bad:
                failed.append(f"{label}: FAILED the check: {'; '.join(bad)}")
                print(f"  ! {failed[-1]}", flush=True)
                continue
            leaves = [t.detach().clone().requires_grad_(True) for t in (x, r, w, b)]

            def call(fn):
                def run():
                    h, y = fn(*leaves)
                    return torch.autograd.grad([h, y], leaves, [up, dy])
                return run
            fns = {name: call(fn) for name, fn in variants.items()}
            for f in fns.values():                # Inductor compiles forward and backward at the first call
                f()
            torch.cuda.synchronize()
            ms = time_as_called(fns, (), quick=args.quick)
            # the fused op's two halves alone, as called (the backward op with grad mode off, what the graph's
            # node calls): their predictions are separate
            with torch.no_grad():
                h, _ = an.kl_add_layernorm(x, r, w, b, EPS)
                halves = kernellab.bench(lambda: an.kl_add_layernorm(x, r, w, b, EPS), (), name="fused forward",
                                         rounds=4, rep_ms=40, baselines={
                                             "fused backward": lambda: an.kl_add_layernorm_backward(
                                                 dy, up, h, w, EPS)})
            half_ms = {halves.name: halves.median_ms, **{bl.name: bl.median_ms for bl in halves.baselines}}
            model = an.model_us(rows, cols, xt.itemsize, rt.itemsize)
            rec = {"case": label, "shape": [rows, cols], "x": str(xt), "r": str(rt), "ms": ms,
                   "halves_ms": half_ms, "model_us": model, "errors": {k: list(v) for k, v in errors.items()}}
            records.append(rec)
            print(f"{label}: " + "; ".join(f"{m}: " + ", ".join(f"{n} {v * 1e3:.1f} µs" for n, v in t.items())
                                          for m, t in ms.items()), flush=True)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "add_norm.json").write_text(json.dumps({"device": device, "records": records, "failed": failed},
                                                      indent=1, default=float))
    print(f"\nadd + LayerNorm forward + backward on {device}: µs a call by "
          f"{' / '.join(m for m in METHODS if records and m in records[0]['ms'])}, the prediction beside each; "
          f"ratio = the variant's time / fused's (kernellab.bench)")
    print(f"{'case':26s} {'variant':20s} {'µs (bench/do_bench/sustained)':>32s} {'model µs':>9s} {'vs fused':>9s}")
    for rec in records:
        ms, model = rec["ms"], rec["model_us"]
        base = ms["kernellab.bench"]["fused"]
        for name in ("fused", "add + kl_layernorm", "torch.compile", "torch eager"):
            times = "/".join(f"{ms[m][name] * 1e3:.1f}" for m in METHODS if m in ms and name in ms[m])
            pred = f"{model[name]:.1f}" if name in model else "-"
            print(f"{rec['case']:26s} {name:20s} {times:>32s} {pred:>9s} "
                  f"{ms['kernellab.bench'][name] / base:8.2f}x")
        for name, v in rec["halves_ms"].items():
            print(f"{rec['case']:26s} {name:20s} {v * 1e3:>32.1f} {model[name]:>9.1f} {'':>9s}")
    for f in failed:
        print(f"FAILED {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
