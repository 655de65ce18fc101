"""The residual add fused with LayerNorm (kl::add_layernorm, kernellab.teach.add_norm), forward + backward as a
training step calls it, against our separate add + kl_layernorm (tutorial 04) and torch.compile of
F.layer_norm(x + r), in one run.

    python benchmarks/add_norm.py                  # GPT-2 small's 16 x 1024 tokens x 768, as autocast runs it
    python benchmarks/add_norm.py --quick --shapes 16384x768,4096x1024 --dtypes float32:bfloat16,bfloat16:bfloat16
    python benchmarks/add_norm.py --host-only [--against GITREF]   # no GPU: the op's host path, layer by layer

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

--host-only (no GPU): the host side of the calls timed above, layer by layer, on the CPU. kernellab.teach.add_norm's
real ops and launchers, its kernels compiled for sm_90, every launch handed to the stand-in driver of
benchmarks/launch_overhead.py (libcuda's launch call replaced by a C builtin) on CPU tensors posing as the device's
at the --shapes, so every Python layer above the driver is counted: the forward op recording the graph (as a training
step calls it), autograd.grad and the engine, the op's graph node, the backward op's eager call, each launcher (its
table lookup, allocations, launches) and the generated launches alone. Large CPU blocks are reused (mallopt), as
torch's CUDA caching allocator reuses them. Beside them: autograd's floor for a Python node of this signature (an
autograd.Function that computes nothing), and at 1 x cols (torch's add, casts and norm compute on this CPU) add +
kl_layernorm (tutorial 04's op, stand-in launches) and eager PyTorch. This thread's CPU µs a call, median of
interleaved rounds. --against GITREF loads add_norm.py as it was at that git ref beside the tree's (its ops
registered as klref::) and times every fused row of both, interleaved: a change to the host path measured in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
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
    ap.add_argument("--host-only", action="store_true",
                    help="no GPU: host µs of the op's calls layer by layer, launches to a stand-in driver")
    ap.add_argument("--calls", type=int, default=4000, help="--host-only: calls a case (over --rounds rounds)")
    ap.add_argument("--rounds", type=int, default=5, help="--host-only: interleaved rounds a case")
    ap.add_argument("--against", default="", metavar="GITREF",
                    help="--host-only: also kernellab/teach/add_norm.py as it was at GITREF (its ops renamed "
                         "klref::), each fused row timed interleaved with it")
    args = ap.parse_args(argv)
    if args.host_only:
        return host_only(args)

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


ARITH_ROWS = 1      # --host-only's rows for the variants whose torch ops compute on this CPU (x + r, the casts)


def standin_add_norm(an):
    """The add-norm module `an` (kernellab.teach.add_norm, or a copy of it) with its kernels compiled for sm_90 and
    launched through launch_overhead's stand-in driver: its ops run their real Python on CPU tensors posing as a
    device's, every launch a C call that does nothing."""
    import kernellab
    import launch_overhead

    module = launch_overhead.standin_module(kernellab.compile_cuda(an.SOURCE, arch="sm_90", filename="add_norm.cu"))
    an.kernels = lambda device_type="cuda", compile=None: module
    return an


def add_norm_at(ref: str):
    """kernellab/teach/add_norm.py as it was at git `ref`, loaded as a module of its own with its ops registered as
    klref::add_layernorm and klref::add_layernorm_backward (beside the current kl:: ones)."""
    import types

    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:kernellab/teach/add_norm.py"], check=True,
                          capture_output=True, text=True).stdout
    module = types.ModuleType(f"add_norm_at_{ref}")
    exec(compile(text.replace('"kl::add_layernorm', '"klref::add_layernorm'), f"<add_norm.py at {ref}>", "exec"),
         module.__dict__)
    return module


def host_inputs(torch, rows, cols, xt, rt):
    """x and r requiring grad, w and b Parameters, dh_out and dy (the CPU's inputs() without the copy to a GPU)."""
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(rows, cols, generator=g).to(t).requires_grad_(True) for t in (xt, rt))
    w, b = (torch.nn.Parameter((1 + 0.2 * torch.randn(cols, generator=g)).to(xt)) for _ in range(2))
    up, dy = torch.randn(rows, cols, generator=g).to(xt), torch.randn(rows, cols, generator=g).to(rt)
    return [x, r, w, b], up, dy


def fused_host_cases(torch, an, rows, cols, xt, rt):
    """[(layer, fn)] of kl::add_layernorm's host path as a training step calls it, outermost first: the forward +
    backward the GPU benchmark times, the forward op (recording the graph), the backward through a graph built once,
    the backward op as its graph node calls it, each launcher alone and the three generated launches alone."""
    import launch_overhead

    leaves, up, dy = host_inputs(torch, rows, cols, xt, rt)
    x, r, w, b = (t.detach() for t in leaves)
    op, backward_op = an.kl_add_layernorm, an.kl_add_layernorm_backward
    h, y = op(*leaves, EPS)                              # the graph the backward rows walk (retain_graph)
    hd = h.detach()

    deferred = launch_overhead.inside_op                # as inside the op: launches that do not wait

    def backward_op_alone():
        with torch.no_grad():                            # as the engine calls it: grad mode off
            backward_op(dy, up, hd, w, EPS)

    plan_f, plan_b = an.plan_forward(rows, cols), an.plan_backward(rows, cols, 132)
    mod, ct = an.kernels("cuda"), an.CTYPE
    fwd = mod[f"add_layernorm_rows<{ct[xt]}, {ct[rt]}, 1>"][plan_f[2], plan_f[1]]
    bwd = mod[f"add_layernorm_backward_rows<{ct[xt]}, {ct[rt]}, {plan_b[0]}>"][plan_b[3], plan_b[2]]
    finish = mod[f"add_norm_finish<{ct[xt]}>"][-(-cols // an.FINISH_COLS), 256]
    hh, yy, dh = torch.empty_like(x), torch.empty_like(r), torch.empty_like(x)
    dr = torch.empty(0, dtype=rt) if xt == rt else torch.empty_like(r)
    dw, db, partial = torch.empty_like(w), torch.empty_like(w), torch.empty(plan_b[3], 2, cols)

    def launches():
        fwd(x, r, w, b, hh, yy, rows, cols, plan_f[0], 1, EPS)
        bwd(dy, up, hd, w, dh, None if xt == rt else dr, partial, rows, cols, plan_b[1], 1, EPS)
        finish(partial, plan_b[3], cols, dw, db)

    return [
        ("forward + backward: autograd.grad([h, y], [x, r, w, b], [dh_out, dy]) after the op's forward",
         lambda: torch.autograd.grad(op(*leaves, EPS), leaves, [up, dy])),
        ("  forward op call, recording the graph (kl_add_layernorm(x, r, w, b, eps))", lambda: op(*leaves, EPS)),
        ("    add_layernorm launcher alone (checks, allocations, 1 launch)",
         deferred(lambda: an.add_layernorm(x, r, w, b, EPS))),
        ("  backward: autograd.grad through a graph built once (retain_graph)",
         lambda: torch.autograd.grad([h, y], leaves, [up, dy], retain_graph=True)),
        ("    kl::add_layernorm_backward op, grad mode off (what the graph's node calls)", backward_op_alone),
        ("      add_layernorm_backward launcher alone (checks, allocations, 2 launches)",
         deferred(lambda: an.add_layernorm_backward(dy, up, hd, w, EPS))),
        ("  the 3 generated launches alone (forward; backward rows and finish)", deferred(launches)),
    ]


def reference_host_cases(torch, kl_layernorm, rows, cols, xt, rt):
    """[(layer, fn)]: autograd's floor for a Python node of this signature at rows x cols (forward + backward, and the
    backward alone), then at ARITH_ROWS x cols (the torch ops compute there) add + kl_layernorm and eager PyTorch,
    forward + backward."""
    import torch.nn.functional as F

    leaves, up, dy = host_inputs(torch, rows, cols, xt, rt)
    ready = tuple(torch.empty_like(t) for t in leaves)   # the floor's gradients, made once

    class ReadyGradients(torch.autograd.Function):
        """A Python graph node that computes nothing: autograd's cost for any such node with 4 inputs, 2 outputs."""

        @staticmethod
        def forward(ctx, x, r, w, b, eps):
            ctx.save_for_backward(x, w)
            return torch.empty_like(x), torch.empty_like(r)

        @staticmethod
        def backward(ctx, dh, dy):
            ctx.saved_tensors
            return (*ready, None)

    floor_h, floor_y = ReadyGradients.apply(*leaves, EPS)
    small, sup, sdy = host_inputs(torch, ARITH_ROWS, cols, xt, rt)

    def separate():
        h = small[0] + small[1]
        y = kl_layernorm(h, small[2], small[3], EPS).to(rt)
        torch.autograd.grad([h, y], small, [sup, sdy])

    def pytorch():
        h = small[0] + small[1]
        y = F.layer_norm(h, (cols,), small[2], small[3], EPS).to(rt)
        torch.autograd.grad([h, y], small, [sup, sdy])

    return [
        ("floor: forward + backward through a Python autograd.Function that computes nothing",
         lambda: torch.autograd.grad(ReadyGradients.apply(*leaves, EPS), leaves, [up, dy])),
        ("floor: backward alone through that node, a graph built once (retain_graph)",
         lambda: torch.autograd.grad([floor_h, floor_y], leaves, [up, dy], retain_graph=True)),
        (f"add + kl_layernorm forward + backward at {ARITH_ROWS} x {cols} (x + r, kl::layernorm, cast)", separate),
        (f"torch eager forward + backward at {ARITH_ROWS} x {cols} (x + r, F.layer_norm, cast)", pytorch),
    ]


def host_only(args) -> int:
    """--host-only: fused_host_cases and reference_host_cases for each shape and dtype pair, CPU µs a call; with
    --against, every fused row beside the same row of add_norm.py at that git ref, interleaved."""
    import ctypes
    import platform
    import statistics

    import torch

    import launch_overhead
    from kernellab.teach import add_norm as an

    libc = ctypes.CDLL(None)          # large blocks reused, as torch's CUDA caching allocator reuses them: without
    libc.mallopt(-3, 1 << 30)         # this every 48 MiB CPU allocation is an mmap and a munmap (about 10 µs)
    libc.mallopt(-1, 1 << 30)         # (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)
    t0 = time.time()
    ns = launch_overhead.standin_tutorial("04-layernorm.py", ("norm_kernels", "norm_backward", "layernorm_simple"))
    kl_layernorm = ns.get("kl_layernorm")
    if kl_layernorm is None:
        import train_gpt2
        kl_layernorm = train_gpt2.op_from_cells("04-layernorm.py", "kl_layernorm", ns)
    modules = [standin_add_norm(an)]
    if args.against:
        try:
            modules.insert(0, standin_add_norm(add_norm_at(args.against)))
        except (OSError, subprocess.CalledProcessError) as exc:      # a copy of the tree without git's history
            print(f"! --against {args.against}: could not read kernellab/teach/add_norm.py at that ref "
                  f"({type(exc).__name__}: {str(getattr(exc, 'stderr', '') or exc).strip()}); timing this tree alone",
                  flush=True)
            args.against = ""
    print(f"tutorial 04's kernels and kl/add_norm.cuh for the stand-in in {time.time() - t0:.1f} s", flush=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    pairs = [tuple(getattr(torch, d) for d in p.split(":")) for p in args.dtypes.split(",")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # torch's CPU arithmetic on one thread, no pool woken
    tables = []
    try:
        for xt, rt in pairs:
            for rows, cols in shapes:
                fused = [fused_host_cases(torch, m, rows, cols, xt, rt) for m in modules]
                refs = reference_host_cases(torch, kl_layernorm, rows, cols, xt, rt)
                fns = [f for group in zip(*fused) for _, f in group] + [f for _, f in refs]
                for f in fns:          # the first calls make the plans, the generated launches, the checks
                    for _ in range(12):
                        f()
                _, cpu = launch_overhead.interleaved_us(fns, args.calls, args.rounds)
                med = [statistics.median(c) for c in cpu]
                n = len(modules)
                rows_out = [(name, med[i * n:(i + 1) * n]) for i, (name, _) in enumerate(fused[-1])]
                rows_out += [(name, [med[len(fused[-1]) * n + i]]) for i, (name, _) in enumerate(refs)]
                tables.append((f"{str(xt)[6:]}+{str(rt)[6:]} {rows}x{cols}", rows_out))
    finally:
        torch.set_num_threads(threads)
    head = f"| layer | {args.against} µs | this tree µs | ratio |" if args.against else "| layer | µs a call |"
    for case, rows_out in tables:
        print(f"\nkl::add_layernorm host path, {case} on this CPU ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores): thread CPU µs a call, median of {args.rounds} interleaved rounds of "
              f"{args.calls // args.rounds} calls; launches to the stand-in driver\n")
        print(head + "\n" + "|---" * head.count(" | ") + "|---|")
        for name, us in rows_out:
            if args.against:
                cells = (f"{us[0]:.1f} | {us[1]:.1f} | {us[1] / us[0]:.2f}" if len(us) == 2
                         else f" | {us[0]:.1f} | ")
            else:
                cells = f"{us[0]:.1f}"
            print(f"| {name} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
