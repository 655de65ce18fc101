"""Tutorials 03 and 04's row kernels as the notebooks have them ("now") against the same cells with one of session
8's changes taken back out ("before"), timed in one run at the notebooks' own plans beside torch eager,
torch.compile and torch's copy of the same bytes. The "before" cells are made from the notebooks' by a text
change (each asserts that it found what it replaces):
--baseline barrier: the cluster's blocks meet at barrier.cluster (arrive.release / wait.acquire) and read each
other's statistics through mapa (helpers: norm_variants/cluster_barrier.cu), instead of the st.async exchange;
--baseline chan: tutorial 04's LayerNorm merges every thread's (n, mean, M2) triple with Chan's formula, instead of
the two plain-sum reductions; --baseline spin: every thread polls the exchange's mbarrier, not one warp;
--baseline DIR: the notebooks 03 and 04 found in DIR (e.g. `git show REV:notebooks/04-layernorm.py > DIR/...`), for
a change no text edit takes back.
(Runs B and C of session 8 compared against whole saved copies of the earlier cells, which also differed in
what came later; they are in the git history at commit 4acab87, tools/gpu/norm_variants/.)

    PYTHONPATH=$PWD python3 tools/gpu/try_exchange.py            # GPU machine, repo root; about 2 minutes
    PYTHONPATH=$PWD python3 tools/gpu/try_exchange.py --baseline chan --ops layernorm --shapes 4096x4096,1024x262144
    PYTHONPATH=$PWD python3 tools/gpu/try_exchange.py --emulate  # CPU: both variants checked on tests/emu, no timing

Method as tools/gpu/try_norms.py: each variant checked against torch (float64) on min(rows, 64) rows first, then
kernellab.bench with the L2 flushed before every call, variants and baselines in alternating rounds (medians).
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "emu"))
VARIANTS = ROOT / "tools" / "gpu" / "norm_variants"
EPS = 1e-5
# every case runs a cluster plan: rows over 64 KB (bf16) / 128 KB (fp32), or few long rows
CASES = [(op, dt, r, c) for r, c in ((1024, 262144), (3, 100003), (48, 65536))
         for op in ("layernorm", "rmsnorm", "softmax") for dt in ("float32", "bfloat16")]


def _sub(pattern, repl, source, count=1, flags=0):
    """re.subn that insists on `count` matches: the cell changed otherwise, and the baseline must be updated."""
    out, n = re.subn(pattern, repl, source, flags=flags)
    assert n == count, f"the cell changed ({n} matches of {pattern[:60]!r}, {count} expected): update try_exchange"
    return out


def barrier_variant(source):
    """The cell with its cluster's blocks meeting at barrier.cluster, as before session 8: thread 0 writes the
    block's statistic to shared memory, a cluster barrier, every block reads the others' through mapa, a second
    arrive, and each cluster kernel waits on it before it exits."""
    merge = (r"        Exchange<(\w+), CLUSTER>& ex = exchange<\w+, CLUSTER>\(\);\n(?:.*\n)*?"
             r"        v = warp_merge\(lane < CLUSTER \? \(lane == \(int\)me \? v : ex\.part\[lane\]\) : (.*)\);\n")
    source = _sub(merge, lambda m: (
        f"        __shared__ {m.group(1)} block_part;\n"
        "        if (threadIdx.x == 0) block_part = v;\n"
        "        cluster_arrive();\n"
        "        cluster_wait();\n"
        f"        {m.group(1)} other = lane < CLUSTER ? *cluster_map(&block_part, lane) : {m.group(2)};\n"
        "        cluster_arrive();                                 // done reading (waited on at exit)\n"
        "        v = warp_merge(other);\n"), source)
    kernels = source.count("    exchange_open<")
    source = _sub(r"    exchange_open<[^\n]*\n((?:.*\n)*?)}\n", "\\1    cluster_wait();\n}\n", source, count=kernels)
    anchor = source.index("// ---- clusters:")
    return source[:anchor] + (VARIANTS / "cluster_barrier.cu").read_text() + "\n" + source[anchor:]


def chan_variant(source):
    """Tutorial 04's cell with every thread's (n, mean, M2) merged by Chan's formula across the warp and the block,
    as before session 8 (each thread's own mean, then its squared deviations from it)."""
    body = r"    float s = edge_ok \? edge : 0\.0f;(?:.*\n)*?    return cluster_merge<CLUSTER>\(Welford\{sn\.n, mean, m2\}[^\n]*\n"
    return _sub(body, lambda m: """    float s = edge_ok ? edge : 0.0f;                      // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) s += at(pk, i);
    float n = valid * VEC + (edge_ok ? 1.0f : 0.0f);
    float mean = n > 0.0f ? s / n : 0.0f;
    float m2 = edge_ok ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float d = at(pk, j * VEC + k) - mean;
            m2 += j < valid ? d * d : 0.0f;
        }
    return row_merge<CLUSTER>(Welford{n, mean, m2}, Welford{0.0f, 0.0f, 0.0f}, row_warps);
""", source)


def spin_variant(source):
    """The cell with every thread polling the exchange's mbarrier (session 8's first version), not one warp."""
    return _sub(r"        if \(warp == 0\) exchange_wait\(&ex.bar, 0\);[^\n]*\n        __syncthreads\(\);[^\n]*\n",
                "        exchange_wait(&ex.bar, 0);\n", source)


# --baseline: what "before" does to each named cell (a cell not named keeps the notebook's)
BASELINES = {"barrier": {"softmax_kernels": barrier_variant, "norm_kernels": barrier_variant},
             "chan": {"norm_kernels": chan_variant},
             "spin": {"softmax_kernels": spin_variant, "norm_kernels": spin_variant}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--rep-ms", type=float, default=15.0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--baseline", default="barrier",
                    help="barrier: the cells before session 8's st.async exchange; chan: tutorial 04's cell before "
                         "LayerNorm's statistics became plain sums (Chan's merge across threads); spin: the cells "
                         "with every thread polling the exchange's mbarrier; a directory: its copies of notebooks "
                         "03 and 04 (the notebook files as committed at some earlier revision)")
    ap.add_argument("--shapes", default="", help="comma-separated RxC (default: the cluster shapes)")
    ap.add_argument("--ops", default="layernorm,rmsnorm,softmax")
    args = ap.parse_args(argv)
    t0 = time.time()

    import torch
    import torch.nn.functional as F

    import kernellab
    from trylib import copy_ceiling
    from notebook_cells import load_tutorial, named_cuda_cells

    dev = "cpu" if args.emulate else "cuda"
    if args.emulate:
        import emulate
        base = emulate.compile_host
        cases = [(op, dt, r, min(c, 20000)) for op, dt, r, c in CASES if r < 100]
    else:
        def base(src):
            return kernellab.compile_cuda(src, first_line=2, filename="cell.cu")
        cases = CASES
    before_dir = pathlib.Path(args.baseline) if args.baseline not in BASELINES else None
    if before_dir is not None and not before_dir.is_dir():
        ap.error(f"--baseline {args.baseline!r}: neither one of {sorted(BASELINES)} nor a directory")
    OLD = BASELINES.get(args.baseline, {})
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        cases = [(op, dt, r, c) for r, c in shapes for op in ("layernorm", "rmsnorm", "softmax")
                 for dt in ("float32", "bfloat16")]
    cases = [c for c in cases if c[0] in args.ops.split(",")]
    current = {name: src for nb in ("03-reductions-softmax.py", "04-layernorm.py")
               for name, src in named_cuda_cells(nb).items() if name in OLD}

    def old_compile(src):
        for name, cur in current.items():
            if src == cur:
                return base(OLD[name](src))
        return base(src)

    def before(notebook):
        if before_dir is not None:                        # load_tutorial reads an absolute path as it is
            return load_tutorial(str((before_dir / notebook).resolve()), compile=base)
        return load_tutorial(notebook, compile=old_compile)

    ns = {"now": (load_tutorial("03-reductions-softmax.py", compile=base), load_tutorial("04-layernorm.py", compile=base)),
          "before": (before("03-reductions-softmax.py"), before("04-layernorm.py"))}
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    copy_gbps, device = copy_ceiling(args.emulate)

    def fn_of(variant, op):
        t03, t04 = ns[variant]
        if op == "softmax":
            return lambda x, w, b, y: t03["softmax"](x, y)
        if op == "layernorm":
            return lambda x, w, b, y: t04["layernorm"](x, w, b, y, EPS)
        return lambda x, w, b, y: t04["rmsnorm"](x, w, y, EPS)

    def ref_of(op):
        if op == "softmax":
            return lambda x, w, b, y: torch.softmax(x, -1)
        if op == "layernorm":
            return lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, EPS)
        return lambda x, w, b, y: F.rms_norm(x, (x.shape[1],), w, EPS)

    def inputs(rows, cols, dtype):
        def make(g):
            x = (2 * torch.randn(rows, cols, generator=g) + 1.0).to(dtype)
            w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
            b = torch.randn(cols, generator=g).to(dtype)
            return tuple(a.to(dev) for a in (x, w, b, torch.empty(rows, cols, dtype=dtype)))
        return make

    table = []
    for op, dname, rows, cols in cases:
        label = f"{op} {dname} {rows}x{cols}"
        if args.only and not any(o in label for o in args.only.split(",") if o):
            continue
        dtype = getattr(torch, dname)
        plan = (ns["now"][0]["plan_rows"] if op == "softmax" else ns["now"][1]["plan_rows"])(rows, cols,
                                                                                              dtype.itemsize)
        ok = {}
        for v in ns:
            rep = kernellab.check(fn_of(v, op), ref_of(op), inputs(min(rows, 64), cols, dtype), trials=1)
            ok[v] = rep.passed
            if not rep.passed:
                print(f"  ! {label} {v}: check FAILED ({rep.max_abs_error:.3g})", flush=True)
        print(f"{label}: plan {plan}: " + ", ".join(f"{v} {'passed' if p else 'FAILED'}" for v, p in ok.items()),
              flush=True)
        if args.emulate or not all(ok.values()):
            continue
        item = dtype.itemsize
        nbytes = (2 * rows * cols + {"layernorm": 2, "rmsnorm": 1, "softmax": 0}[op] * cols) * item
        a = inputs(rows, cols, dtype)(torch.Generator().manual_seed(rows + cols))
        eager = {"softmax": lambda x, w, b, y: torch.softmax(x, -1),
                 "layernorm": lambda x, w, b, y: F.layer_norm(x, (cols,), w, b, EPS),
                 "rmsnorm": lambda x, w, b, y: F.rms_norm(x, (cols,), w, EPS)}[op]
        baselines = {"before": fn_of("before", op), "torch eager": eager}
        if not args.no_compile:
            comp = torch.compile(eager, dynamic=False)
            comp(*a)
            baselines["torch.compile"] = comp
        baselines["copy-op"] = lambda x, w, b, y: y.copy_(x)
        res = kernellab.bench(fn_of("now", op), a, bytes=nbytes, name="now", warmup_ms=5, rep_ms=args.rep_ms,
                              max_reps=400, baselines=baselines)
        us = {res.name: res.median_ms * 1e3, **{r.name: r.median_ms * 1e3 for r in res.baselines}}
        for name, t in us.items():
            table.append(f"{op:9s} {dname:8s} {f'{rows}x{cols}':>12s} {name:13s} {t:8.1f} "
                         f"{nbytes / (t * 1e-6) / 1e9 / copy_gbps:7.0%} {us['before'] / t:8.2f}x "
                         f"{us['torch eager'] / t:8.2f}x " + (f"{us['torch.compile'] / t:8.2f}x"
                                                              if "torch.compile" in us else f"{'n/a':>9s}"))
        table.append("")
        print(f"[{time.time() - t0:5.0f} s] {label}: now {us['now']:.1f} us, before {us['before']:.1f} us",
              flush=True)
        del a
        torch.cuda.empty_cache()
    if table:
        print(f"\n{'op':9s} {'dtype':8s} {'shape':>12s} {'variant':13s} {'us':>8s} {'of copy':>7s} {'vs before':>9s} "
              f"{'vs eager':>9s} {'vs compile':>9s}")
        print("\n".join(table))
    print(f"done in {time.time() - t0:.0f} s ({device})")


if __name__ == "__main__":
    main()
