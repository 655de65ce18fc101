"""Tutorial 04's LayerNorm and RMSNorm backward, checked and timed against PyTorch's backward (eager and torch.compile)
in one run.

    python benchmarks/norm_backward.py                 # the tutorial's shapes and GPT-2's, bf16 and float32
    python benchmarks/norm_backward.py --quick         # the same with shorter timing (4 rounds of 40 ms, not 8 of 80)
    python benchmarks/norm_backward.py --shapes 8192x768 --dtypes bfloat16 --ops layernorm
    python benchmarks/norm_backward.py --host-only     # no GPU: the host time of the timed call, layer by layer

Method
- The kernels and launchers are the notebook's own (notebooks/04-layernorm.py, loaded by notebook_cells.load_tutorial).
- Each shape is checked before it is timed: dx, dw, db against float64, ours within 2x PyTorch's own error
  (backward_errors / backward_passes of the notebook); a shape that fails is reported and not timed.
- Timed as called: ours is `torch.autograd.grad(y, leaves, dy)` through kl::layernorm / kl::rmsnorm (the registered
  op's backward: its host path, the partial buffer's allocation, both kernels); the baselines the same call on the
  graph of F.layer_norm / F.rms_norm, eager and under torch.compile(dynamic=False) (Inductor compiles the backward
  too). Graphs are built once (retain_graph=True), so only the backward is timed.
- Three ways in one run (benchmarks/as_called.py): kernellab.bench (L2 flushed, host time hidden), triton's
  do_bench, and kernellab.bench(sustained=True). Every ratio comes from one method's numbers in this run.
- Bytes: 3 * rows * cols * itemsize (x and dy read, dx written: what any backward must move); "of copy" divides
  by kernellab's measured copy bandwidth.
- Prediction ("model µs", written before any GPU ran the split statistics or the 8-column finish): the bytes each
  kernel moves (x and dy read by every kernel that reads them, dx written, the partial sums of dw and db written
  and read back, dw and db) at 3 TB/s, plus a floor of 2.5 µs a kernel (3 kernels for the long rows, 2 for rows
  in registers). At the two shapes that missed the target: 3 x 100003 (statistics now by 3 x 49 column slices,
  not 3 blocks) 10.4 µs LayerNorm, 9.5 µs RMSNorm, so about 2x torch.compile's 19-20 µs; 1000 x 1031 8.5 / 7.8 µs,
  but that shape ran at 2.5x its model before (21.3 µs: rounds of rows bound by latency, not bytes), so expect
  17-19 µs there, 0.9-1.0x eager's 16.5: the 8-column finish saves its 33-block tail, not the rows kernel's two
  latency-bound rounds. --plans also times the launcher alone at 1000 x 1031 with blocks of 1024 (132 partial
  rows, not 264) beside the default plan, to pick between them.
The short table comes last; $OUT (or --out) gets norm_backward.json with every number.

--host-only (no GPU): the host side of the call timed above, layer by layer, on the CPU. The notebook's real ops,
launchers and kernels (compiled for sm_90) on CPU tensors posing as the device's, every launch handed to the
stand-in driver of benchmarks/launch_overhead.py (standin_tutorial: libcuda's launch call replaced by a C builtin),
so every Python layer above the driver is counted: autograd.grad and the engine, the op's graph node
(autograd.Function), its backward op's eager call, the launcher's allocations and plan lookup, each generated launch
(argument checks, struct pack, the no-wait record). Beside them: the same autograd.grad through a Python
autograd.Function whose backward returns ready gradients (autograd's floor for any Python node) and through
F.layer_norm / F.rms_norm's C++ node at 1 x 8 (torch's own path, its arithmetic near zero: at the benchmark's shapes
the CPU's arithmetic would be most of eager's figure). This thread's CPU µs a call, median of interleaved rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

SHAPES = [(4096, 1024), (4096, 4096), (4096, 32768), (1024, 262144), (1000, 1031), (3, 100003), (8192, 768)]
EPS = 1e-5
COPY_TBPS_MODEL = 3.0        # the prediction's bandwidth (an H100's copy: 3.0 TB/s measured)
KERNEL_FLOOR_US = 2.5        # the prediction's floor per kernel launched


def model_us(kind, rows, cols, itemsize, plan) -> float:
    """The prediction: bytes moved at COPY_TBPS_MODEL plus KERNEL_FLOOR_US a kernel, for this plan."""
    vectors = 2 if kind == "layernorm" else 1               # dw and db, or dw alone
    rows_bytes = rows * cols * itemsize
    if plan.kernel == "rows":                                 # x, dy once; dx; partial sums; finish
        moved, kernels = 3 * rows_bytes, 2
    else:                                                     # statistics (x, dy), tiles (x, dy again, dx), finish
        moved, kernels = 5 * rows_bytes + cols * itemsize, 3
    moved += cols * itemsize + 2 * plan.grid * vectors * cols * 4 + vectors * cols * itemsize
    return moved / (COPY_TBPS_MODEL * 1e12) * 1e6 + kernels * KERNEL_FLOOR_US


def plan_label(plan) -> str:
    return "split" if getattr(plan, "split", False) else plan.kernel


def inputs(torch, rows, cols, dtype):
    g = torch.Generator().manual_seed(0)
    x = 2 * torch.randn(rows, cols, generator=g)
    w = 1 + 0.5 * torch.randn(cols, generator=g)
    b = torch.randn(cols, generator=g)
    dy = torch.randn(rows, cols, generator=g)
    return tuple(t.to(dtype).cuda() for t in (dy, x, w, b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing: 4 rounds of 40 ms a method, not 8 of 80")
    ap.add_argument("--shapes", default="", help="e.g. 4096x1024,8192x768 (default: the tutorial's and GPT-2's)")
    ap.add_argument("--dtypes", default="", help="e.g. bfloat16 (default: bfloat16,float32)")
    ap.add_argument("--ops", default="layernorm,rmsnorm")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for norm_backward.json")
    ap.add_argument("--host-only", action="store_true",
                    help="no GPU: host µs of the timed call layer by layer, launches to a stand-in driver "
                         "(default shapes 4096x1024,8192x768 bf16)")
    ap.add_argument("--calls", type=int, default=20000, help="--host-only: calls a case (over --rounds rounds)")
    ap.add_argument("--rounds", type=int, default=7, help="--host-only: interleaved rounds a case")
    ap.add_argument("--plans", action="store_true",
                    help="also time the launcher alone at 1000x1031 bf16: the default plan against blocks of 1024")
    args = ap.parse_args(argv)
    if args.host_only:
        return host_only(args)

    import torch
    import torch.nn.functional as F

    import kernellab
    from as_called import METHODS, time_as_called
    from kernellab.run.measure.ceilings import device_ceilings
    from notebook_cells import load_tutorial

    t0 = time.time()
    ns = load_tutorial("04-layernorm.py")
    print(f"compiled tutorial 04's kernels in {time.time() - t0:.1f} s")
    torch._dynamo.config.recompile_limit = 256
    copy_gbps = device_ceilings().dram_gbps
    device = torch.cuda.get_device_name()
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes
              else SHAPES)
    dtypes = [getattr(torch, d) for d in (args.dtypes.split(",") if args.dtypes else ["bfloat16", "float32"])]
    records, failed = [], []
    for kind in args.ops.split(","):
        ref = ({"fn": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS), "op": ns["kl_layernorm"]}
               if kind == "layernorm" else
               {"fn": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS), "op": ns["kl_rmsnorm"]})
        compiled = torch.compile(ref["fn"], dynamic=False)
        for dtype in dtypes:
            for r, c in shapes:
                label = f"{kind} backward {str(dtype)[6:]} {r}x{c}"
                dy, x, w, b = inputs(torch, r, c, dtype)
                try:
                    errors = ns["backward_errors"](kind, dy, x, w, b, EPS)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    failed.append(f"{label}: raised {type(exc).__name__}: {exc}")
                    print(f"  ! {failed[-1]}")
                    continue
                if not ns["backward_passes"](errors, dtype):
                    failed.append(f"{label}: FAILED the check " + ", ".join(
                        f"{k} ours {o:.3g} PyTorch {t:.3g}" for k, (o, t, _) in errors.items()))
                    print(f"  ! {failed[-1]}")
                    continue
                leaves = [t.clone().requires_grad_(True) for t in ((x, w, b) if kind == "layernorm" else (x, w))]
                graphs = {"kl op": ref["op"](*leaves, EPS), "torch eager": ref["fn"](*leaves),
                          "torch.compile": compiled(*leaves)}
                fns = {name: (lambda y=y: torch.autograd.grad(y, leaves, dy, retain_graph=True))
                       for name, y in graphs.items()}
                for f in fns.values():          # Inductor compiles the backward at its first call: not timed
                    f()
                torch.cuda.synchronize()
                ms = time_as_called(fns, (), quick=args.quick)
                plan = ns["plan_backward"](r, c, dtype.itemsize)
                moved = 3 * r * c * dtype.itemsize
                rec = {"op": kind, "dtype": str(dtype)[6:], "shape": [r, c], "plan": plan_label(plan), "ms": ms,
                       "model_us": model_us(kind, r, c, dtype.itemsize, plan),
                       "errors": {k: list(v) for k, v in errors.items()},
                       "of_copy": moved / (ms["kernellab.bench"]["kl op"] * 1e-3) / 1e9 / copy_gbps}
                records.append(rec)
                print(f"{label} ({plan_label(plan)}, grid {plan.tiles} x {plan.grid}, model "
                      f"{rec['model_us']:.1f} µs): " + "; ".join(
                    f"{m}: ours {v['kl op'] * 1e3:.1f} µs, eager {v['torch eager'] * 1e3:.1f}, "
                    f"compile {v['torch.compile'] * 1e3:.1f}" for m, v in ms.items()), flush=True)
    variants = []
    if args.plans:                              # the launcher alone, two plans for 1000 x 1031 (kernellab.bench)
        for kind in args.ops.split(","):
            dy, x, w, b = inputs(torch, 1000, 1031, torch.bfloat16)
            default = ns["plan_backward"](1000, 1031, 2)
            wide = ns["plan_backward"](1000, 1031, 2, block=1024)
            launch = ns[f"{kind}_backward"]
            for plan in (default, wide):            # both must pass the check before they are timed
                got = launch(dy, x, w, EPS, plan=plan)
                want = ns["reference_backward"](kind, dy, x, w, b, EPS, torch.float64)
                theirs = ns["reference_backward"](kind, dy, x, w, b, EPS)
                errors = {n: ((o.double() - f).abs().max().item(), (t.double() - f).abs().max().item(),
                              f.abs().max().item()) for n, o, t, f in zip(("dx", "dw", "db"), got, theirs, want)}
                if not ns["backward_passes"](errors, torch.bfloat16):
                    failed.append(f"{kind} 1000x1031 plan {plan}: FAILED the check {errors}")
            fns = {f"block {p.block}, grid {p.grid}": (lambda p=p: launch(dy, x, w, EPS, plan=p))
                   for p in (default, wide)}
            res = kernellab.bench(next(iter(fns.values())), (), name=next(iter(fns)), rounds=4, rep_ms=40,
                                  baselines=dict(list(fns.items())[1:]))
            times = {next(iter(fns)): res.median_ms, **{bl.name: bl.median_ms for bl in res.baselines}}
            variants.append({"op": kind, "shape": [1000, 1031], "us": {k: v * 1e3 for k, v in times.items()},
                             "model_us": {f"block {p.block}, grid {p.grid}": model_us(kind, 1000, 1031, 2, p)
                                          for p in (default, wide)}})
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "norm_backward.json").write_text(json.dumps(
            {"device": device, "copy_gbps": copy_gbps, "records": records, "failed": failed,
             "plan_variants": variants}, indent=1))
    print(f"\nnorm backward on {device} (copy {copy_gbps / 1e3:.2f} TB/s); ratios = baseline time / ours, per method "
          f"({', '.join(m for m in METHODS if records and m in records[0]['ms'])}); target >= 1.0x eager and compile")
    print(f"{'case':38s} {'kernel':5s} {'ours µs':>8s} {'model µs':>8s} {'of copy':>7s}  {'vs eager':>20s}  "
          f"{'vs compile':>20s}")
    for rec in records:
        ms = rec["ms"]
        ratio = {b: "/".join(f"{ms[m][b] / ms[m]['kl op']:.2f}" for m in METHODS if m in ms)
                 for b in ("torch eager", "torch.compile")}
        case = f"{rec['op']} {rec['dtype']} {rec['shape'][0]}x{rec['shape'][1]}"
        print(f"{case:38s} {rec['plan']:5s} {ms['kernellab.bench']['kl op'] * 1e3:8.1f} {rec['model_us']:8.1f} "
              f"{rec['of_copy']:7.0%}  "
              f"{ratio['torch eager']:>20s}  {ratio['torch.compile']:>20s}")
    for v in variants:
        print(f"{v['op']} bf16 1000x1031, the launcher alone (kernellab.bench): " + "; ".join(
            f"{k}: {us:.1f} µs (model {v['model_us'][k]:.1f})" for k, us in v["us"].items()))
    for f in failed:
        print(f"FAILED {f}")
    return 1 if failed else 0


HOST_SHAPES = [(4096, 1024), (8192, 768)]     # --host-only's default: the register-held shapes that lose as called


def host_setup(ns, kind, rows, cols, dtype):
    """The call benchmarks this file times as called (autograd.grad(y, leaves, dy) on a graph built once) for the
    notebook's op `kind` on CPU tensors with stand-in launches, and its layers, each a function of no arguments.
    Returns [(layer, fn)], outermost first, then the references (autograd's Python-node floor, torch's C++ node,
    torch's forward + backward)."""
    import torch
    import torch.nn.functional as F

    import launch_overhead

    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(dtype).requires_grad_(True)
    w = torch.nn.Parameter((1 + 0.5 * torch.randn(cols, generator=g)).to(dtype))
    b = torch.nn.Parameter(torch.randn(cols, generator=g).to(dtype))
    dy = torch.randn(rows, cols, generator=g).to(dtype)
    layernorm = kind == "layernorm"
    leaves = [x, w, b] if layernorm else [x, w]
    op, backward_op = ns[f"kl_{kind}"], ns[f"kl_{kind}_backward"]
    launcher = ns[f"{kind}_backward"]
    xd, wd = x.detach(), w.detach()
    y = op(*leaves, EPS)
    ready = tuple(torch.empty_like(t) for t in leaves)      # the floor's gradients, made once

    class ReadyGradients(torch.autograd.Function):
        """A Python graph node that computes nothing: autograd.grad's and the engine's cost for any such node."""

        @staticmethod
        def forward(ctx, *args):
            ctx.save_for_backward(args[0], args[1])
            return torch.empty_like(args[0])

        @staticmethod
        def backward(ctx, dy):
            ctx.saved_tensors
            return (*ready, None)

    floor_y = ReadyGradients.apply(*leaves, EPS)
    x8 = torch.randn(1, 8, generator=g).requires_grad_(True)
    w8, b8 = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.zeros(8))
    dy8 = torch.randn(1, 8, generator=g)
    torch_fn = ((lambda x, w, b: F.layer_norm(x, (8,), w, b, EPS)) if layernorm else
                (lambda x, w: F.rms_norm(x, (8,), w, EPS)))
    torch_y = torch_fn(x8, w8, b8) if layernorm else torch_fn(x8, w8)
    torch_leaves = [x8, w8, b8] if layernorm else [x8, w8]
    hit = ns["_BACKWARD_LAUNCHES"]
    launcher(dy, xd, wd, EPS)                    # makes the per-shape table's entry
    _, plan, main, _, finish, lanes = hit[kind, rows, cols, dtype]
    dx, dw, db, partial = (torch.empty_like(xd), torch.empty_like(wd), torch.empty_like(wd),
                           torch.empty(plan.grid, 2, cols, dtype=torch.float32))

    deferred = launch_overhead.inside_op                # as inside the op: launches that do not wait

    def backward_op_alone():
        with torch.no_grad():                    # as the engine calls it: grad mode off
            backward_op(dy, xd, w, EPS)

    def allocations():
        dy.contiguous(), torch.empty_like(xd), torch.empty_like(wd)
        if layernorm:
            torch.empty_like(wd)
        torch.empty(plan.grid, 2, cols, dtype=torch.float32, device=xd.device)

    def fwd_bwd():                               # autograd.grad: no .grad accumulated (a CPU add at these shapes)
        torch.autograd.grad(op(*leaves, EPS), leaves, dy)

    rows_args = (dy, xd, wd, dx, partial, rows, cols, plan.row_threads, EPS)
    finish_args = (partial, plan.grid, cols, lanes, dw, db if layernorm else None)
    if plan.kernel != "rows":
        raise ValueError(f"--host-only times the rows kernel's launches; {rows}x{cols} takes {plan.kernel}")
    return [
        ("as called: autograd.grad(y, leaves, dy), the benchmark's timed call",
         lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)),
        (f"  kl::{kind}_backward op, grad mode off (what the graph's node calls)", backward_op_alone),
        (f"    {kind}_backward launcher (allocations, plan lookup, 2 launches)", deferred(
            lambda: launcher(dy, xd, wd, EPS))),
        ("      allocations alone (dy.contiguous(), dx, dw" + (", db" if layernorm else "") + ", partial sums)",
         allocations),
        ("      rows kernel's launch alone (kernel[grid, block](...))", deferred(lambda: main(*rows_args))),
        ("      finish kernel's launch alone", deferred(lambda: finish(*finish_args))),
        ("forward + backward: autograd.grad(op(*leaves), leaves, dy)", fwd_bwd),
        ("ref: autograd.grad through a Python node that computes nothing (autograd's floor)",
         lambda: torch.autograd.grad(floor_y, leaves, dy, retain_graph=True)),
        (f"ref: autograd.grad through torch's C++ node, F.{'layer_norm' if layernorm else 'rms_norm'} 1 x 8",
         lambda: torch.autograd.grad(torch_y, torch_leaves, dy8, retain_graph=True)),
        (f"ref: forward + backward, F.{'layer_norm' if layernorm else 'rms_norm'} 1 x 8",
         lambda: torch.autograd.grad(torch_fn(*torch_leaves), torch_leaves, dy8)),
    ]


def host_only(args) -> int:
    """--host-only: the table of host_setup's layers for each op and shape, CPU µs a call."""
    import statistics

    import torch

    import launch_overhead

    ns = launch_overhead.standin_tutorial("04-layernorm.py", ("norm_kernels", "norm_backward", "layernorm_simple"))
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else HOST_SHAPES)
    dtypes = [getattr(torch, d) for d in (args.dtypes.split(",") if args.dtypes else ["bfloat16"])]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # torch's C++ node's arithmetic on one thread, no pool woken
    try:
        for kind in args.ops.split(","):
            for dtype in dtypes:
                for rows, cols in shapes:
                    cases = host_setup(ns, kind, rows, cols, dtype)
                    for _, f in cases:
                        f()
                    _, cpu = launch_overhead.interleaved_us([f for _, f in cases], args.calls, args.rounds)
                    print(f"\n{kind} {str(dtype)[6:]} {rows}x{cols}: host µs a call on this CPU (thread CPU time, "
                          f"median of {args.rounds} rounds; launches to the stand-in driver)\n")
                    print("| layer | µs a call | best round |\n|---|---|---|")
                    for (name, _), us in zip(cases, cpu):
                        print(f"| {name} | {statistics.median(us):.2f} | {min(us):.2f} |")
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
