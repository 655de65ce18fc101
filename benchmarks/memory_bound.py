"""The memory-bound tutorials' kernels, checked and timed against PyTorch eager and torch.compile in one run.

    python benchmarks/memory_bound.py            # everything: about 3-4 minutes on an H100
    python benchmarks/memory_bound.py --quick    # 3 shapes, bf16, no ladders: about a minute

The kernels and their launchers are the tutorials' own: every named `%%cuda` cell and every `# launchers` cell of
notebooks/03-reductions-softmax.py and notebooks/04-layernorm.py, compiled and run as the notebooks run them.

Method
- Copy bandwidth: kernellab's measured ceiling (kernellab.run.measure.ceilings: a 1 GiB device-to-device copy, read +
  write bytes), the denominator of every "of copy" column.
- Each kernel is checked (kernellab.check, fresh random data, NaN-poisoned outputs, float64 reference) at the
  shape it is timed at before it is timed; a kernel that fails is reported and not timed.
- Timing: kernellab.bench (CUDA events, L2 flushed before every call, launch overhead kept out, rounds that
  alternate between our kernel and its baselines); every speed-up is a ratio measured in the same run.
- torch.compile: one compiled function per op with dynamic=False, so each shape and dtype gets its own
  specialised kernel (compiled outside the timing, at the first call).
- Bytes: what each op must move (inputs read once, outputs written once; w and b once per call).
A variant that raises prints its error and the script goes on; a CUDA error that poisons the process (an
illegal address) stops it after printing what was measured. Logs and a JSON of every number go to $OUT (or
--out) when set. The short table comes last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

SHAPES = [(4096, 1024), (4096, 4096), (4096, 32768), (1024, 262144), (1000, 1031), (3, 100003)]
QUICK_SHAPES = [(4096, 4096), (1000, 1031), (3, 100003)]
LARGE = {(4096, 1024), (4096, 4096), (4096, 32768), (1024, 262144)}     # where the 90 % target applies
SUM_N = 2**25                 # the sum ladder's vector
SUM_CHECK_SIZES = (257, 100_003, 2**20 + 3)   # checked at these sizes first (the atomic kernel at the first two)
LADDER_SHAPE = (4096, 4096)   # the softmax and LayerNorm ladders' matrix (float32)
EPS = 1e-5
DEVICE = "cuda"      # where inputs are made (a CPU test runs the table on the emulated kernels with "cpu")


class Run:
    """Where the output goes: the console, and $OUT/memory_bound.log and .json."""

    def __init__(self, out_dir):
        self.out_dir = pathlib.Path(out_dir) if out_dir else None
        self.log_file = None
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.log_file = open(self.out_dir / "memory_bound.log", "w")
        self.records: list[dict] = []
        self.poisoned = None
        self.t0 = time.time()

    def log(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def save(self, meta):
        if self.out_dir:
            (self.out_dir / "memory_bound.json").write_text(json.dumps({**meta, "records": self.records}, indent=1))


def sticky(exc) -> bool:
    """A CUDA error after which this process's context is unusable."""
    text = f"{type(exc).__name__} {exc}"
    return bool(getattr(exc, "sticky", False)) or any(
        s in text for s in ("illegal memory access", "ILLEGAL_ADDRESS", "IllegalAddress", "misaligned address",
                            "unspecified launch failure", "LAUNCH_FAILED", "device-side assert"))


def attempt(run, what, fn):
    """fn(), or None after logging what failed; marks the run poisoned after a sticky CUDA error."""
    if run.poisoned:
        return None
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - report and go on
        run.log(f"  ! {what}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        if run.log_file:
            run.log_file.write(traceback.format_exc() + "\n")
        if sticky(exc):
            run.poisoned = f"{what}: {type(exc).__name__}: {exc}"
            run.log("  ! that CUDA error is sticky: the process cannot use the GPU any more; stopping here")
        return None


def load(run):
    """The two tutorials' namespaces (kernels compiled with NVRTC, launcher cells run)."""
    from notebook_cells import load_tutorial

    t = time.time()
    t03 = load_tutorial("03-reductions-softmax.py")
    t04 = load_tutorial("04-layernorm.py")
    run.log(f"compiled the tutorials' kernels in {time.time() - t:.1f} s")
    return t03, t04


def bench_opts(quick):
    return dict(warmup_ms=10, rep_ms=25 if quick else 30, max_reps=1000)


def compiled(torch, fn, name, run, *args):
    """torch.compile(fn, dynamic=False), compiled now on args; None if it fails (the reason is logged)."""
    def make():
        c = torch.compile(fn, dynamic=False)
        c(*args)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return c
    return attempt(run, f"torch.compile of {name}", make)


def record_bench(run, section, op, dtype, shape, result, bytes_moved, copy_gbps, plan="", check="passed"):
    """Keep one bench result (ours and its baselines) as a record; return it."""
    rec = {"section": section, "op": op, "dtype": dtype, "shape": list(shape), "plan": plan, "check": check,
           "bytes": bytes_moved, "device": result.device, "method": result.method,
           "ours_us": result.median_ms * 1e3, "ours_of_copy": bytes_moved / (result.median_ms * 1e-3) / 1e9 / copy_gbps,
           "baselines": {b.name: {"us": b.median_ms * 1e3,
                                  "of_copy": bytes_moved / (b.median_ms * 1e-3) / 1e9 / copy_gbps}
                         for b in result.baselines},
           "speedups": {s.baseline: {"ratio": s.ratio, "low": s.low, "high": s.high} for s in result.speedups}}
    run.records.append(rec)
    return rec


def log_ladder(run, result, bytes_moved, copy_gbps, title):
    run.log(f"\n{title} ({result.device})")
    run.log(f"  {'kernel':24s} {'median us':>10s} {'TB/s':>6s} {'of copy':>8s}")
    for r in (result, *result.baselines):
        run.log(f"  {r.name:24s} {r.median_ms * 1e3:10.1f} {bytes_moved / (r.median_ms * 1e-3) / 1e12:6.2f} "
                f"{bytes_moved / (r.median_ms * 1e-3) / 1e9 / copy_gbps:8.0%}")


# --- the ladders ------------------------------------------------------------------------------------------------


def sum_ladder(run, t03, copy_gbps, opts):
    import torch

    import kernellab

    n = SUM_N
    sums = t03["SUMS"]
    ok = {}
    for name, fn in sums.items():
        sizes = SUM_CHECK_SIZES[:2] if name == "sum_atomic" else SUM_CHECK_SIZES
        passed = True
        for size in sizes:
            rep = attempt(run, f"check {name} n={size}", lambda fn=fn, size=size: kernellab.check(
                fn, lambda x: x.sum().reshape(1), lambda g: (torch.randn(size, generator=g).to(DEVICE),), trials=1,
                atol=5e-5 * size ** 0.5, rtol=0))
            if rep is None or not rep.passed:
                passed = False
                if rep is not None:
                    run.log(f"  ! {name} FAILED its check at n={size}: {rep.message}")
        ok[name] = passed
    x = torch.randn(n, device=DEVICE)
    main = "sum_single_pass" if ok.get("sum_single_pass") else None
    if main is None:
        run.log("  ! sum_single_pass failed its check: the sum ladder is not timed")
        return
    baselines = {k: v for k, v in sums.items() if k != main and ok.get(k)}
    baselines["torch.sum"] = torch.sum
    res = attempt(run, "bench sum ladder", lambda: kernellab.bench(sums[main], (x,), bytes=4 * n, flops=n,
                                                                   baselines=baselines, **opts))
    if res is not None:
        record_bench(run, "ladder", "sum", "float32", (n,), res, 4 * n, copy_gbps)
        log_ladder(run, res, 4 * n, copy_gbps, f"sum of {n} float32 (floor {4 * n / copy_gbps / 1e3:.0f} us)")


def softmax_ladder(run, t03, copy_gbps, opts):
    import torch

    import kernellab

    r, c = LADDER_SHAPE
    x = torch.randn(r, c, device=DEVICE)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 4
    fns = dict(t03["SOFTMAXES"])
    for name, fn in list(fns.items()):
        rep = attempt(run, f"check {name}", lambda fn=fn: kernellab.check(
            fn, lambda x, y: torch.softmax(x, -1), lambda g: softmax_inputs(torch, min(r, 64), c, torch.float32, g),
            trials=1))
        if rep is None or not rep.passed:
            run.log(f"  ! {name} FAILED its check{': ' + rep.message if rep else ''}; not timed")
            fns.pop(name)
    if "softmax" not in fns:
        return
    eager = softmax_eager(torch)
    comp = compiled(torch, eager, "softmax", run, x)
    baselines = {k: v for k, v in fns.items() if k != "softmax"}
    baselines["torch eager"] = lambda x, y: eager(x)
    if comp is not None:
        baselines["torch.compile"] = lambda x, y: comp(x)
    res = attempt(run, "bench softmax ladder", lambda: kernellab.bench(
        fns["softmax"], (x, y), bytes=nbytes, baselines=baselines, name="softmax", **opts))
    if res is not None:
        record_bench(run, "ladder", "softmax", "float32", (r, c), res, nbytes, copy_gbps)
        log_ladder(run, res, nbytes, copy_gbps, f"softmax {r} x {c} float32 (floor {nbytes / copy_gbps / 1e3:.0f} us)")


def layernorm_ladder(run, t04, copy_gbps, opts):
    import torch
    import torch.nn.functional as F

    import kernellab

    r, c = LADDER_SHAPE
    x, w, b, y = layernorm_inputs(torch, r, c, torch.float32, torch.Generator().manual_seed(0))
    nbytes = (2 * r * c + 2 * c) * 4
    fns = {k: (lambda x, w, b, y, f=f: f(x, w, b, y, EPS)) for k, f in t04["LAYERNORMS"].items()}
    for name, fn in list(fns.items()):
        rep = attempt(run, f"check {name}", lambda fn=fn: kernellab.check(
            fn, lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
            lambda g: layernorm_inputs(torch, min(r, 64), c, torch.float32, g), trials=1))
        if rep is None or not rep.passed:
            run.log(f"  ! {name} FAILED its check{': ' + rep.message if rep else ''}; not timed")
            fns.pop(name)
    # The large-mean case: the sum of squares must fail it, the Welford kernels must pass.
    for name, fn in fns.items():
        rep = attempt(run, f"large-mean check {name}", lambda fn=fn: kernellab.check(
            fn, lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS),
            lambda g: layernorm_inputs(torch, min(r, 64), c, torch.float32, g, mean=1e4), trials=1, atol=5e-3,
            rtol=0))
        if rep is not None:
            expect = name != "layernorm_sumsq"
            run.log(f"  large mean (1e4): {name} {'passed' if rep.passed else 'failed'} (max abs error "
                    f"{rep.max_abs_error:.2g}){'' if rep.passed == expect else '  <-- NOT AS EXPECTED'}")
    if "layernorm" not in fns:
        return
    eager = layernorm_eager(torch)
    comp = compiled(torch, eager, "layernorm", run, x, w, b)
    baselines = {k: v for k, v in fns.items() if k != "layernorm"}
    baselines["torch eager"] = lambda x, w, b, y: eager(x, w, b)
    if comp is not None:
        baselines["torch.compile"] = lambda x, w, b, y: comp(x, w, b)
    res = attempt(run, "bench layernorm ladder", lambda: kernellab.bench(
        fns["layernorm"], (x, w, b, y), bytes=nbytes, baselines=baselines, name="layernorm", **opts))
    if res is not None:
        record_bench(run, "ladder", "layernorm", "float32", (r, c), res, nbytes, copy_gbps)
        log_ladder(run, res, nbytes, copy_gbps,
                   f"LayerNorm {r} x {c} float32 (floor {nbytes / copy_gbps / 1e3:.0f} us)")


# --- the table of shapes ------------------------------------------------------------------------------------------


def softmax_inputs(torch, rows, cols, dtype, g):
    """N(0, 3) rows on the GPU, with a fully masked row, a half-masked row and a row of huge values."""
    x = 3 * torch.randn(rows, cols, generator=g)
    if rows > 3:
        x[1] = float("-inf")
        x[2, ::2] = float("-inf")
        x[3] *= 1e4
    return x.to(dtype).to(DEVICE), torch.empty(rows, cols, dtype=dtype, device=DEVICE)


def layernorm_inputs(torch, rows, cols, dtype, g, mean=0.0):
    """x ~ N(mean, 2), w ~ N(1, 0.5), b ~ N(0, 1) and an output buffer, on the GPU."""
    x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
    w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
    b = torch.randn(cols, generator=g).to(dtype)
    return x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), torch.empty(rows, cols, dtype=dtype, device=DEVICE)


def drop_bias(args):
    """(x, w, b, y) -> (x, w, y): RMSNorm's arguments from LayerNorm's."""
    return args[0], args[1], args[3]


def softmax_eager(torch):
    def torch_softmax(x):
        return torch.softmax(x, -1)
    return torch_softmax


def layernorm_eager(torch):
    import torch.nn.functional as F

    def torch_layernorm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    return torch_layernorm


def rmsnorm_eager(torch):
    import torch.nn.functional as F

    def torch_rmsnorm(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, EPS)
    return torch_rmsnorm


def table(run, t03, t04, copy_gbps, opts, shapes, dtypes, ops):
    """Every (op, dtype, shape): check ours, then bench it against torch eager and torch.compile."""
    import torch
    import torch.nn.functional as F

    import kernellab

    for op in ops:
        eager = {"softmax": softmax_eager, "layernorm": layernorm_eager, "rmsnorm": rmsnorm_eager}[op](torch)
        for dtype in dtypes:
            dname = str(dtype).replace("torch.", "")
            for r, c in shapes:
                if run.poisoned:
                    return
                item = dtype.itemsize
                g = torch.Generator().manual_seed(r * 7919 + c)
                if op == "softmax":
                    ours = t03["softmax"]
                    _, plan = t03["softmax_kernel_for"](r, c, dtype)
                    args = softmax_inputs(torch, r, c, dtype, g)
                    nbytes = 2 * r * c * item
                    ref = lambda x, y: torch.softmax(x, -1)                      # noqa: E731
                    make = lambda g, r=r, c=c: softmax_inputs(torch, r, c, dtype, g)   # noqa: E731
                    base_args = 1
                elif op == "layernorm":
                    ours = lambda x, w, b, y: t04["layernorm"](x, w, b, y, EPS)     # noqa: E731
                    _, plan = t04["norm_kernel_for"]("layernorm", r, c, dtype)
                    args = layernorm_inputs(torch, r, c, dtype, g)
                    nbytes = (2 * r * c + 2 * c) * item
                    ref = lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS)   # noqa: E731
                    make = lambda g, r=r, c=c: layernorm_inputs(torch, r, c, dtype, g)   # noqa: E731
                    base_args = 3
                else:
                    ours = lambda x, w, y: t04["rmsnorm"](x, w, y, EPS)              # noqa: E731
                    _, plan = t04["norm_kernel_for"]("rmsnorm", r, c, dtype)
                    x, w, _, y = layernorm_inputs(torch, r, c, dtype, g)
                    args = (x, w, y)
                    nbytes = (2 * r * c + c) * item
                    ref = lambda x, w, y: F.rms_norm(x, (x.shape[1],), w, EPS)       # noqa: E731
                    make = lambda g, r=r, c=c: drop_bias(layernorm_inputs(torch, r, c, dtype, g))   # noqa: E731
                    base_args = 2
                label = f"{op} {dname} {r}x{c}"
                plan_text = plan.kind if plan is not None else "fallback (two reads)"
                rep = attempt(run, f"check {label}", lambda: kernellab.check(ours, ref, make, trials=1))
                if rep is None or not rep.passed:
                    run.log(f"  ! {label} FAILED its check{': ' + rep.message if rep else ''}; not timed")
                    run.records.append({"section": "table", "op": op, "dtype": dname, "shape": [r, c],
                                        "plan": plan_text, "check": "FAILED" if rep else "error"})
                    continue
                comp = compiled(torch, eager, label, run, *args[:base_args])
                baselines = {"torch eager": lambda *a, k=base_args: eager(*a[:k])}
                if comp is not None:
                    baselines["torch.compile"] = lambda *a, k=base_args, comp=comp: comp(*a[:k])
                if op == "softmax":
                    baselines["copy (same bytes)"] = lambda x, y: y.copy_(x)
                res = attempt(run, f"bench {label}", lambda: kernellab.bench(ours, args, bytes=nbytes, name="ours",
                                                                             baselines=baselines, **opts))
                if res is None:
                    continue
                rec = record_bench(run, "table", op, dname, (r, c), res, nbytes, copy_gbps, plan=plan_text)
                sp = rec["speedups"]
                run.log(f"  {label:28s} {plan_text:22s} ours {rec['ours_us']:8.1f} us "
                        f"({rec['ours_of_copy']:4.0%} of copy)"
                        f"  vs eager {sp['torch eager']['ratio']:5.2f}x"
                        + (f"  vs compile {sp['torch.compile']['ratio']:5.2f}x" if "torch.compile" in sp else
                           "  vs compile   n/a"))
                del args, res
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


# --- as called: the tutorials' final kernels as registered ops -----------------------------------------------------


def register_ops(t03, t04):
    """softmax, layernorm and rmsnorm as registered ops (kernellab.op) that allocate their output, as a model calls
    them: the launch path, the allocation and the dispatcher included."""
    import torch

    import kernellab

    return {
        "softmax": kernellab.op("klbench::softmax", "(Tensor x) -> Tensor", outputs=lambda x: x)(
            lambda x: t03["softmax"](x)),
        "layernorm": kernellab.op("klbench::layernorm", "(Tensor x, Tensor w, Tensor b) -> Tensor",
                                  outputs=lambda x, w, b: x)(lambda x, w, b: t04["layernorm"](x, w, b, None, EPS)),
        "rmsnorm": kernellab.op("klbench::rmsnorm", "(Tensor x, Tensor w) -> Tensor", outputs=lambda x, w: x)(
            lambda x, w: t04["rmsnorm"](x, w, None, EPS)),
    }, torch


def as_called_table(run, t03, t04, shapes, dtypes, ops, quick):
    """Every (op, dtype, shape) as a registered op against torch eager and torch.compile, timed by kernellab.bench,
    triton.testing.do_bench and sustained=True in one run (benchmarks/as_called.py)."""
    import as_called

    registered, torch = register_ops(t03, t04)
    rows = []
    for op in ops:
        eager = {"softmax": softmax_eager, "layernorm": layernorm_eager, "rmsnorm": rmsnorm_eager}[op](torch)
        n_args = {"softmax": 1, "layernorm": 3, "rmsnorm": 2}[op]
        for dtype in dtypes:
            for r, c in shapes:
                g = torch.Generator().manual_seed(r * 7919 + c)
                args = layernorm_inputs(torch, r, c, dtype, g)
                args = (args[0],) if op == "softmax" else args[:n_args]
                comp = compiled(torch, eager, f"{op} as called", run, *args)
                fns = {f"kl::{op}": registered[op], "torch eager": eager}
                if comp is not None:
                    fns["torch.compile"] = comp
                ms = attempt(run, f"as called {op} {r}x{c}", lambda: as_called.time_as_called(fns, args, quick=quick))
                if ms is None:
                    continue
                if getattr(ms, "host_ms", None):     # what a sustained time above the kernel is compared with
                    loop = ms.loop_ms
                    run.log(f"as called {op} {str(dtype)[6:]} {r}x{c}, host µs per call (a loop, GPU synchronised "
                            f"at its ends; same arguments / bench's rotating input sets): "
                            + ", ".join(f"{k} {ms.host_same_ms.get(k, v) * 1e3:.1f} / "
                                        f"{ms.host_rotating_ms.get(k, float('nan')) * 1e3:.1f}"
                                        for k, v in ms.host_ms.items())
                            + (f"; sustained's flush: {loop['flush'] * 1e3:.1f} µs of GPU and, with the events, "
                               f"{loop['host'] * 1e3:.1f} µs of host a call" if loop else ""))
                for base in [b for b in ("torch eager", "torch.compile") if b in fns]:
                    for row in as_called.rows_for(as_called.restrict(ms, (f"kl::{op}", base)), base):
                        row["label"] = f"{op} {str(dtype)[6:]} {r}x{c} vs {base}"
                        row["baseline"] = base
                        rows.append(row)
                        run.records.append({"section": "as_called", **row})
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    run.log("\nas called (registered ops; speed-up over the baseline by each timing method, one run):\n")
    run.log(as_called.markdown(rows, "op, dtype, shape", "baseline"))


# --- the summary -------------------------------------------------------------------------------------------------


def summary(run, copy_gbps, device):
    rows = [r for r in run.records if r["section"] == "table"]
    run.log("\n" + "=" * 118)
    run.log(f"memory-bound kernels vs PyTorch on {device}; copy bandwidth {copy_gbps / 1e3:.2f} TB/s; "
            f"{datetime.date.today().isoformat()}; {time.time() - run.t0:.0f} s")
    run.log(f"{'op':10s} {'dtype':9s} {'shape':>14s} {'plan':22s} {'ours us':>9s} {'eager us':>9s} "
            f"{'compile us':>10s} {'vs eager':>8s} {'vs comp':>8s} {'of copy':>8s} {'copy-op':>8s}")
    misses = []
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        if r["check"] != "passed":
            run.log(f"{r['op']:10s} {r['dtype']:9s} {shape:>14s} {r['plan']:22s} check {r['check']}")
            misses.append(f"{r['op']} {r['dtype']} {shape}: check {r['check']}")
            continue
        b, sp = r["baselines"], r["speedups"]
        comp_us = f"{b['torch.compile']['us']:10.1f}" if "torch.compile" in b else f"{'n/a':>10s}"
        comp_x = f"{sp['torch.compile']['ratio']:7.2f}x" if "torch.compile" in sp else f"{'n/a':>8s}"
        copy_op = f"{b['copy (same bytes)']['of_copy']:8.0%}" if "copy (same bytes)" in b else f"{'':8s}"
        run.log(f"{r['op']:10s} {r['dtype']:9s} {shape:>14s} {r['plan']:22s} {r['ours_us']:9.1f} "
                f"{b['torch eager']['us']:9.1f} {comp_us} {sp['torch eager']['ratio']:7.2f}x {comp_x} "
                f"{r['ours_of_copy']:8.0%} {copy_op}")
        if sp["torch eager"]["ratio"] < 1.0:
            misses.append(f"{r['op']} {r['dtype']} {shape}: {sp['torch eager']['ratio']:.2f}x eager")
        if "torch.compile" in sp and sp["torch.compile"]["ratio"] < 1.0:
            misses.append(f"{r['op']} {r['dtype']} {shape}: {sp['torch.compile']['ratio']:.2f}x torch.compile")
        if tuple(r["shape"]) in LARGE and r["ours_of_copy"] < 0.9:
            misses.append(f"{r['op']} {r['dtype']} {shape}: {r['ours_of_copy']:.0%} of copy bandwidth (< 90 %)")
    run.log("columns: medians of kernellab.bench (L2 flushed each call); vs eager / vs comp: median per-round "
            "speed-up in the same run (> 1: ours faster); of copy: bytes moved / time / copy bandwidth; copy-op: "
            "torch's own copy of the same bytes, the practical ceiling at that size")
    targets = "targets (>= 1.0x eager and torch.compile everywhere, >= 90 % of copy on the large shapes): "
    run.log(targets + ("all met" if not misses else f"{len(misses)} missed"))
    for m in misses:
        run.log(f"  missed: {m}")
    if run.poisoned:
        run.log(f"stopped early: {run.poisoned}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes, bf16 only, no ladders (about a minute)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for memory_bound.log and .json")
    ap.add_argument("--ops", default="softmax,layernorm,rmsnorm", help="ops of the table, comma-separated")
    ap.add_argument("--shapes", default="", help="the table's shapes instead of the issue's, e.g. 1024x262144,300x40000")
    ap.add_argument("--dtypes", default="", help="the table's dtypes, e.g. bfloat16 (default: float32,bfloat16)")
    ap.add_argument("--no-ladders", action="store_true", help="the table only")
    ap.add_argument("--as-called", action="store_true", help="also time the kernels as registered ops (kernellab.op) "
                    "under kernellab.bench, triton's do_bench and sustained=True")
    ap.add_argument("--no-table", action="store_true", help="skip the kernellab.bench table (with --as-called)")
    args = ap.parse_args(argv)
    run = Run(args.out)

    import torch

    if not torch.cuda.is_available():
        run.log("no CUDA GPU: this script times kernels and needs one (the tutorials compile and check on the CPU)")
        return 2
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 256          # one specialisation per shape and dtype, all kept
    from kernellab.run.measure.ceilings import device_ceilings

    device = torch.cuda.get_device_name()
    run.log(f"{device}, torch {torch.__version__}, {'--quick' if args.quick else 'full run'}")
    ceil = device_ceilings()
    copy_gbps = ceil.dram_gbps
    run.log(f"copy bandwidth (kernellab ceilings, {ceil.source}): {copy_gbps / 1e3:.2f} TB/s")
    t03, t04 = load(run)
    opts = bench_opts(args.quick)
    if not args.quick and not args.no_ladders:
        for name, fn, ns in (("sum ladder", sum_ladder, t03), ("softmax ladder", softmax_ladder, t03),
                             ("layernorm ladder", layernorm_ladder, t04)):
            attempt(run, name, lambda fn=fn, ns=ns: fn(run, ns, copy_gbps, opts))
            run.save({"device": device, "copy_gbps": copy_gbps})
    run.log("\nthe table (check, then bench against torch eager and torch.compile):")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    dtypes = (torch.bfloat16,) if args.quick else (torch.float32, torch.bfloat16)
    if args.dtypes:
        dtypes = tuple(getattr(torch, d) for d in args.dtypes.split(","))
    if not args.no_table:
        attempt(run, "table", lambda: table(run, t03, t04, copy_gbps, opts, shapes, dtypes, args.ops.split(",")))
    if args.as_called:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        attempt(run, "as called", lambda: as_called_table(run, t03, t04, shapes, dtypes, args.ops.split(","),
                                                           args.quick))
    run.save({"device": device, "copy_gbps": copy_gbps, "quick": args.quick})
    summary(run, copy_gbps, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
