"""Attention backward: tutorial 08's kernels (dQ by atomics, dQ in a separate pass, the ladder's rungs, step 3's Hopper
backward on wgmma + TMA as variant "hopper", d = 64 and 128) against SDPA's
FLASH and CUDNN backward, checked and timed in one run.

Method. Kernels and launchers come from notebooks/08-attention-backward.py (its named `%%cuda` cell and `# launchers`
cells, loaded as the tests load them). Correctness: the notebook's check_backward on N = 1031 (all six awkward
N without --quick), both dtypes, head dims 64 and 128, causal and not: max |error| of dQ, dK, dV against float64,
beside SDPA's own backward error on the same inputs (bar: within 2x). Speed: the FlashAttention-3 paper's shapes
(B * N = 16k, H * d = 2048; N = 1k..16k, --quick: N = 1024 and 4096, as called only d = 64, N = 4096, not causal),
FLOPs counted as 10 B H N^2 d (halved for causal), the backward alone (the forward and SDPA's autograd graphs built
beforehand): kernellab.bench in one run, ratios against SDPA FLASH (FlashAttention-2's backward) and CUDNN measured
there. As called: the launcher as a model calls it
(its allocations and launches included) against SDPA FLASH's backward, timed by kernellab.bench, triton's do_bench and
sustained=True (benchmarks/as_called.py).

    python benchmarks/attention_backward.py              # everything
    python benchmarks/attention_backward.py --quick      # N = 1024, 4096; fewer checks (the GPU suite's mode)
    python benchmarks/attention_backward.py --variants pass,pass_w8     # some of the notebook's VARIANTS only
    python benchmarks/attention_backward.py --quick --dims 64,128 --variants hopper,atomic_w8   # step 3 against step 2
The table's last columns are each variant against SDPA FLASH; the best variant per (d, causal) is printed as the
line to put in the notebook's BWD_OP_VARIANT.
Logs go to --out (default $OUT or .) as attention_backward.json; the table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))      # notebook_cells: the tutorials' cells, as the tests read them
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from notebook_cells import load_tutorial  # noqa: E402

NOTEBOOK = "08-attention-backward.py"


def run_checks(t08, quick, log, variants):
    rows = []
    ns = (1031,) if quick else t08["CHECK_N"]          # --quick: the GPU tests check every N of every variant
    for variant in variants:
        for dname, dtype in t08["DTYPES"].items():
            for d in (64, 128):
                for causal in (False, True):
                    for N in ns:
                        try:
                            rows.append(t08["check_backward"](variant, dtype, d, causal, N))
                        except Exception as exc:
                            log.write(traceback.format_exc())
                            rows.append(dict(variant=variant, dtype=dname, d=d, causal=causal, N=N, error=None,
                                             sdpa_error=None, passed=False,
                                             message=f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def run_bench(t08, quick, log, ns, dims, variants):
    rows = []
    for d in dims:
        # "hopper" is timed where it runs step 3's kernel (elsewhere it is HOPPER_BWD_FALLBACK, timed under its name)
        at_d = tuple(v for v in variants if v != "hopper" or d in t08["HOPPER_BWD_DIMS"])
        if not at_d:
            continue
        for causal in (False, True):
            for N in ns:
                try:
                    r = t08["bench_backward"](N, d, causal, variants=at_d, rounds=4 if quick else 8,
                                             rep_ms=60, warmup_ms=20)
                except Exception as exc:
                    log.write(traceback.format_exc())
                    rows.append(dict(d=d, causal=causal, N=N, error=f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                everyone = {r.name.split(" d=")[0]: r, **{b.name: b for b in r.baselines}}
                row = dict(d=d, causal=causal, N=N, ms={k: x.median_ms for k, x in everyone.items()},
                           tflops={k: x.tflops for k, x in everyone.items()})
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                torch.cuda.empty_cache()
    return rows


def run_as_called(t08, quick, log, ns, dims, variants, masks=(False, True)):
    """The launcher as called (allocations and launches included) against SDPA FLASH's backward, three timings."""
    import as_called

    rows = []
    for d in dims:
        for causal in masks:
            for N in ns:
                B, H = max(1, 16384 // N), 2048 // d
                make = t08["backward_inputs"](B, H, N, d, causal)
                fns = {f"ours ({v})": (lambda v: lambda q, k, vv, o, lse, go, graphs:
                                       t08["attention_backward"](q, k, vv, o, lse, go, causal, v))(v)
                       for v in variants if v != "hopper" or d in t08["HOPPER_BWD_DIMS"]}
                fns["FLASH"] = t08["_sdpa_graph_backward"](0)
                try:
                    ms = as_called.time_as_called(fns, make, flops=t08["backward_flops"](B, H, N, d, causal),
                                                  quick=quick)
                except Exception as exc:
                    log.write(traceback.format_exc())
                    rows.append(dict(name="all", label=f"d={d} N={N}", error=f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                for row in as_called.rows_for(ms, "FLASH"):
                    row["label"] = f"{row['name']} bf16 d={d} N={N} {'causal' if causal else 'full'}"
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-as-called", action="store_true")
    ap.add_argument("--ns", default=None, help="sequence lengths to time, comma-separated")
    ap.add_argument("--dims", default="64,128", help="head dims to time, comma-separated")
    ap.add_argument("--variants", default=None, help="the notebook's VARIANTS to check and time, comma-separated "
                    "(default: all of them)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "attention_backward.log", "w")
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    t08 = load_tutorial(NOTEBOOK)
    variants = tuple(args.variants.split(",")) if args.variants else t08["VARIANTS"]
    unknown = [v for v in variants if v not in t08["VARIANTS"]]
    if unknown:
        ap.error(f"unknown variants {unknown}; the notebook has {t08['VARIANTS']}")
    for v in variants:
        if v == "hopper":                           # step 3 (HOPPER_BWD_DIMS; elsewhere it runs HOPPER_BWD_FALLBACK)
            for name in (f"hbwd_bf16_d{d}{c}" for d in t08["HOPPER_BWD_DIMS"] for c in ("", "_causal")):
                print(f"{v:10s} {name:24s} {t08['attn_bwd_h'][name].resources}")
            continue
        dkdv, dq, _ = t08["BWD_LADDER"][v]
        for name in (f"{dkdv}_bf16_d64", f"{dkdv}_bf16_d128") + ((f"{dq}_bf16_d64",) if dq else ()):
            print(f"{v:10s} {name:24s} {t08['attn_bwd'][name].resources}")
    ns = tuple(int(n) for n in args.ns.split(",")) if args.ns else ((1024, 4096) if args.quick
                                                                    else (1024, 2048, 4096, 8192, 16384))
    dims = tuple(int(d) for d in args.dims.split(","))
    checks = [] if args.no_check else run_checks(t08, args.quick, log, variants)
    print(f"checks done at {time.time() - t0:.0f} s", flush=True)
    bench_rows = run_bench(t08, args.quick, log, ns, dims, variants)
    print(f"timings done at {time.time() - t0:.0f} s", flush=True)
    called = [] if args.no_as_called else run_as_called(t08, args.quick, log, (4096,) if args.quick else ns,
                                                        (64,) if args.quick else dims,
                                                        # --quick: (a), (b) and the op's choices, as called
                                                        [v for v in variants if not args.quick or v in
                                                         {"atomic", "pass", *t08["BWD_OP_VARIANT"].values()}],
                                                        (False,) if args.quick else (False, True))
    (out / "attention_backward.json").write_text(json.dumps({"device": dev, "checks": checks, "bench": bench_rows,
                                                             "as_called": called}, indent=1, default=str))

    print(f"\n{dev} · {time.strftime('%Y-%m-%d')} · {time.time() - t0:.0f} s")
    if checks:
        bad = [c for c in checks if not c["passed"]]
        print(f"checks: {len(checks) - len(bad)}/{len(checks)} passed (dQ, dK, dV within 2x SDPA's own error)")
        for c in bad[:20]:
            print("  FAIL", c)
        print(t08["summarize_backward"]([c for c in checks if c.get("error") is not None]))
    ours = [f"ours ({v})" for v in variants]
    names = ours + ["SDPA FLASH", "SDPA CUDNN"]
    width = max(12, *(len(n) for n in names))
    print("\nBackward alone, kernellab.bench, bf16, B*N = 16k, H*d = 2048: TFLOP/s (10 B H N^2 d, halved causal); "
          "then each variant / SDPA FLASH, and the best variant / SDPA CUDNN")
    print(f"{'d':>4s} {'causal':6s} {'N':>6s} | " + " ".join(f"{n:>{width}s}" for n in names) + " | "
          + " ".join(f"{v:>10s}" for v in variants) + " | best/CUDNN")
    best = {}                                   # (d, causal) -> {variant: [ratio to FLASH at each N]}
    for r in bench_rows:
        if "error" in r:
            print(f"{r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | error: {r['error']}")
            continue
        tf = r["tflops"]
        cells = " ".join(f"{tf[n]:{width}.1f}" if n in tf else f"{'-':>{width}s}" for n in names)
        fl, cu = tf.get("SDPA FLASH"), tf.get("SDPA CUDNN")
        ratio = (lambda x, y: f"{x / y:9.2f}x" if x and y else f"{'-':>10s}")
        top = max((tf[n] for n in ours if n in tf), default=None)
        for v, n in zip(variants, ours):
            if n in tf and fl:
                best.setdefault((r["d"], r["causal"]), {}).setdefault(v, []).append(tf[n] / fl)
        print(f"{r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | {cells} | "
              + " ".join(ratio(tf.get(n), fl) for n in ours) + f" | {ratio(top, cu)}")
    if best:
        choice = {k: max(v, key=lambda name: sum(v[name]) / len(v[name])) for k, v in sorted(best.items())}
        print("\nFastest variant per (d, causal), by its mean ratio to FLASH over the Ns timed (the notebook's "
              "BWD_OP_VARIANT line):")
        print("BWD_OP_VARIANT = {" + ", ".join(f"({d}, {c}): {v!r}" for (d, c), v in choice.items()) + "}")
    if called:
        import as_called

        print("\nAs called: the launcher (allocations included) against SDPA FLASH's backward, each timing, same run\n")
        print(as_called.markdown([c for c in called if "ratio" in c], "variant, shape (B*N = 16k, H*d = 2048)",
                                 "FLASH"))
        for c in called:
            if "error" in c:
                print("  as-called error:", c["label"], c["error"])


if __name__ == "__main__":
    main()
