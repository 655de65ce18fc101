"""Attention backward: tutorial 08's kernels (dQ by atomics, dQ in a separate pass, the ladder's rungs, step 3's Hopper
backward on wgmma + TMA as variant "hopper" and step 3b's as "hopper_rows", d = 64 and 128) against SDPA's
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
    python benchmarks/attention_backward.py --quick --dims 64,128 --variants hopper,hopper_rows --ns 4096   # 3 vs 3b
    python benchmarks/attention_backward.py --profile    # Nsight Compute: atomic_w8, atomic_2d, step 3, FLASH
The table's last columns are each variant against SDPA FLASH; the best variant per (d, causal) is printed as the
line to put in the notebook's BWD_OP_VARIANT.
Logs go to --out (default $OUT or .) as attention_backward.json; the table is printed last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
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

# Step 3b ("hopper_rows": the LSE and Dv through shared memory by the producer's TMA, the dQ reductions of full tiles
# without a row test, wgmma descriptors as one add from their tile's), predicted before a GPU ran it (tutorial 08,
# benchmarks/NOTES-attention-backward.md): the whole backward's milliseconds under kernellab.bench at N = 4096
# (B*N = 16k, H*d = 2048, bf16), per (d, causal). Step 3 measured 4.56 / 2.66 ms (d = 64 full / causal) and
# 4.60 / 2.55 ms (d = 128) on an H100. The model, per 64-query tile step of a block (3,900 clocks at d = 64 by ncu,
# ~7,800 at d = 128; the tensor work 1,280 / 2,560 of them): a consumer warp's instructions a tile, counted on the
# SASS path (d = 64: 948 for the warpgroup adding the tile's dQ, 645 for the other, ncu's mean 805; d = 128: 971),
# become 660 / 532 at d = 64 and 589 at d = 128 (the 32 LDG of the LSE and Dv with their address and bounds math
# leave for 16 LDS.64; the 16 red.v2 lose a branch and 64-bit address math each; each wgmma descriptor is one add).
# On the critical path (the dQ warpgroup, ~1.6 clocks an instruction) that is 450-580 clocks a tile at d = 64, ~600
# at d = 128; the L2 latency of the LSE loads (needed after S^T's wgmma: 200-500 clocks exposed) goes too, and at
# d = 128 that of Dv (loaded after P^T, ~600-1,000 exposed). Hence 15-27 % off the main kernel at d = 64, 13-22 % at
# d = 128; the preprocessing and dQ conversion (~0.18 ms) unchanged; causal the same fractions of its tiles.
STEP3B_PREDICTED_MS = {(64, False): (3.4, 4.0), (64, True): (1.95, 2.35), (128, False): (3.65, 4.1),
                       (128, True): (2.05, 2.35)}


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


def _hopper_variants(t08) -> tuple:
    """The notebook's variants that run a Hopper kernel where HOPPER_BWD_DIMS holds d (steps 3 and 3b)."""
    return tuple(t08.get("HOPPER_VARIANTS", ("hopper",)))


def step3b_lines(bench_rows) -> list[str]:
    """Step 3b against step 3 and against STEP3B_PREDICTED_MS, one line per (d, causal, N) timed with both."""
    out = []
    for r in bench_rows:
        ms = r.get("ms") or {}
        old, new = ms.get("ours (hopper)"), ms.get("ours (hopper_rows)")
        if old is None or new is None:
            continue
        lo, hi = STEP3B_PREDICTED_MS.get((r["d"], r["causal"]), (None, None))
        where = ("-" if lo is None or r["N"] != 4096 else "inside the prediction" if lo <= new <= hi
                 else "FASTER than predicted" if new < lo else "SLOWER than predicted")
        pred = f"{lo:.2f}-{hi:.2f} ms ({old / hi:.2f}-{old / lo:.2f}x)" if lo is not None and r["N"] == 4096 else "-"
        flash = ms.get("SDPA FLASH")
        out.append(f"{r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | {old:8.3f} {new:8.3f} | {old / new:6.2f}x | "
                   f"{pred:>26s} | " + (f"{flash / new:5.2f}x" if flash else "    -") + f" | {where}")
    if out:
        out.insert(0, f"{'d':>4s} {'causal':6s} {'N':>6s} | {'step 3':>8s} {'3b':>8s} | {'3 / 3b':>7s} | "
                      f"{'predicted 3b (3 / 3b)':>26s} | FLASH / 3b | against the prediction")
    return out


def run_bench(t08, quick, log, ns, dims, variants):
    rows = []
    for d in dims:
        # "hopper" ("hopper_rows") is timed where it runs step 3's (3b's) kernel (elsewhere it is
        # HOPPER_BWD_FALLBACK, timed under its name)
        at_d = tuple(v for v in variants if v not in _hopper_variants(t08) or d in t08["HOPPER_BWD_DIMS"])
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
                       for v in variants if v not in _hopper_variants(t08) or d in t08["HOPPER_BWD_DIMS"]}
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


def rung_9_bench_lines(bench_rows: list[dict]) -> list[str]:
    """Rung 9 (atomic_2d_ilp) against its written prediction (RUNG_9_BENCH_PREDICTED), one line per timed row: its
    TFLOP/s, its ratio to SDPA FLASH and to rung 8 (atomic_2d) measured in the same run."""
    out = ["Rung 9 (atomic_2d_ilp) against its prediction (kernellab.bench, same run):"]
    for r in bench_rows:
        if "error" in r:
            continue
        tf = r["tflops"]
        ilp, two, fl = tf.get("ours (atomic_2d_ilp)"), tf.get("ours (atomic_2d)"), tf.get("SDPA FLASH")
        if ilp is None:
            continue
        pred = RUNG_9_BENCH_PREDICTED.get(r["d"])
        vs_fl = ilp / fl if fl else None
        vs_2d = ilp / two if two else None
        flo, fhi = pred["vs_flash"]
        tlo, thi = pred["vs_2d"]
        out.append(f"  d={r['d']:3d} causal={str(r['causal']):5s} N={r['N']}: {ilp:6.1f} TFLOP/s, "
                   f"{_num(vs_fl, 2)}x FLASH (predicted {flo:.2f}-{fhi:.2f}: {_inside(vs_fl, flo, fhi)}), "
                   f"{_num(vs_2d, 3)}x atomic_2d (predicted {tlo:.2f}-{thi:.2f}: {_inside(vs_2d, tlo, thi)})"
                   + ("; target 1.0x FLASH " + ("reached" if vs_fl and vs_fl >= 1.0 else
                                                f"missed by {100 * (1 - vs_fl):.0f} %" if vs_fl else "n/a")))
    return out


def rung_10_bench_lines(bench_rows: list[dict]) -> list[str]:
    """Rung 10 (atomic_fa2) against its written prediction (RUNG_10_BENCH_PREDICTED), one line per timed row: its
    TFLOP/s, its ratio to SDPA FLASH and to the rung named there (measured in the same run)."""
    out = ["Rung 10 (atomic_fa2) against its prediction (kernellab.bench, same run):"]
    for r in bench_rows:
        if "error" in r:
            continue
        tf = r["tflops"]
        pred = RUNG_10_BENCH_PREDICTED.get(r["d"])
        fa2, fl = tf.get("ours (atomic_fa2)"), tf.get("SDPA FLASH")
        if fa2 is None or pred is None:
            continue
        other = tf.get(f"ours ({pred['other']})")
        vs_fl = fa2 / fl if fl else None
        vs_other = fa2 / other if other else None
        flo, fhi = pred["vs_flash"]
        olo, ohi = pred["vs_other"]
        out.append(f"  d={r['d']:3d} causal={str(r['causal']):5s} N={r['N']}: {fa2:6.1f} TFLOP/s, "
                   f"{_num(vs_fl, 2)}x FLASH (predicted {flo:.2f}-{fhi:.2f}: {_inside(vs_fl, flo, fhi)}), "
                   f"{_num(vs_other, 2)}x {pred['other']} (predicted {olo:.2f}-{ohi:.2f}: "
                   f"{_inside(vs_other, olo, ohi)})"
                   + ("; target 1.0x FLASH " + ("reached" if vs_fl and vs_fl >= 1.0 else
                                                f"missed by {100 * (1 - vs_fl):.0f} %" if vs_fl else "n/a")))
    return out


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
    ap.add_argument("--profile", action="store_true", help="Nsight Compute on atomic_w8, atomic_2d, step 3 and SDPA "
                    "FLASH's backward kernels at N = 4096 (--ns, --dims), one launch each, beside the model of "
                    "atomic_w8's tile step; the short table and what it means last")
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)   # the program ncu watches
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile_child:
        return profile_child(tuple(int(n) for n in (args.ns or str(PROFILE_N)).split(",")),
                             tuple(int(d) for d in args.dims.split(",")))
    if args.profile:
        return run_profile(out, tuple(int(n) for n in (args.ns or str(PROFILE_N)).split(",")),
                           tuple(int(d) for d in args.dims.split(",")))
    log = open(out / "attention_backward.log", "w")
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    t08 = load_tutorial(NOTEBOOK)
    variants = tuple(args.variants.split(",")) if args.variants else t08["VARIANTS"]
    unknown = [v for v in variants if v not in t08["VARIANTS"]]
    if unknown:
        ap.error(f"unknown variants {unknown}; the notebook has {t08['VARIANTS']}")
    for v in variants:
        if v in _hopper_variants(t08):              # steps 3, 3b (HOPPER_BWD_DIMS; elsewhere HOPPER_BWD_FALLBACK)
            kind = "hbwd_rows" if v == "hopper_rows" else "hbwd"
            for name in (f"{kind}_bf16_d{d}{c}" for d in t08["HOPPER_BWD_DIMS"] for c in ("", "_causal")):
                print(f"{v:11s} {name:26s} {t08['attn_bwd_h'][name].resources}")
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
                                                        # --quick: (a), (b), step 3b and the op's choices, as called
                                                        [v for v in variants if not args.quick or v in
                                                         {"atomic", "pass", "hopper_rows",
                                                          *t08["BWD_OP_VARIANT"].values()}],
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
    if "atomic_2d_ilp" in variants:
        print("\n" + "\n".join(rung_9_bench_lines(bench_rows)))
    if "atomic_fa2" in variants:
        print("\n" + "\n".join(rung_10_bench_lines(bench_rows)))
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
    lines = step3b_lines(bench_rows)              # last: what the hopper-backward suite is run for
    if lines:
        print("\nStep 3b (hopper_rows) against step 3 (hopper), the whole backward's ms under kernellab.bench, beside "
              "the prediction written before this run (STEP3B_PREDICTED_MS). 3b faster at every (d, causal) -> set "
              "the notebook's BWD_OP_HOPPER_ROWS = True")
        print("\n".join(lines))




# -- where atomic_w8's time goes, against FLASH's: a model, then Nsight Compute (issue 31) ---------------------------
# H100 SXM rates a model of the dK/dV kernel takes, per SM and clock unless said. Sources and reasoning:
# - tensor pipe, mma.sync: the H100 SXM's dense bf16 peak, 989 TFLOP/s, is 4,096 FLOP/clk/SM (132 SMs, 1.83 GHz) and
#   is reached only by wgmma; mma.sync (HMMA.16816, 4,096 FLOP each) issues at about two thirds of it on Hopper (Luo
#   et al., "Dissecting the NVIDIA Hopper Architecture through Microbenchmarking", arXiv 2402.13499 / 2501.12084:
#   mma.sync well below wgmma on H800), i.e. one HMMA.16816 per 6 clk per SM sub-partition, 660 TFLOP/s at 1.83 GHz.
#   Assumed, not measured here: the profile's tensor-pipe % and HMMA count per second test it.
# - shared memory: 128 B/clk/SM (32 banks x 4 B): one wavefront a clock; ldmatrix.x4 (512 B) takes 4.
# - issue: one warp instruction a clock per sub-partition, 4 an SM.
# - L2: about 5.5 TB/s of hits (H100 SXM, measured by microbenchmarks; not the 12 TB/s sometimes quoted), and for
#   fp32 reductions (red.global.add, read-modify-write in the L2 slice) assumed half of it, 2.75 TB/s: the profile's
#   lts__t_sectors_op_red per second measures what they reached.
# - DRAM: 3.35 TB/s (HBM3, H100 SXM).
# - clock: 1.755 GHz, the SM clock H100s under ncu --clock-control none have shown at load; the model is evaluated
#   again at the clock the profile measures.
H100_RATES = dict(sms=132, clock_hz=1.755e9, hmma_flop_per_clk_sm=4096 * 2 / 3, smem_bytes_per_clk_sm=128,
                  issue_per_clk_sm=4, l2_bytes_per_s=5.5e12, l2_red_bytes_per_s=2.75e12, dram_bytes_per_s=3.35e12)
# SDPA FLASH's backward and atomic_w8 on an H100 (docs/RESULTS.md, `notebooks 08`, 2026-11-28, N = 4096, not
# causal): TFLOP/s at 10 B H N^2 d. The model's prediction is compared with these and with the profile's durations.
H100_MEASURED_TFLOPS = {64: {"FLASH": 270.0, "atomic_w8": 203.6}, 128: {"FLASH": 289.0, "atomic_w8": 206.0}}
W8_WARPS, W8_KEYS = 8, 128                      # atomic_w8: warps a block, keys a block (16 a warp)
W8_QUERY_TILE = {64: 64, 128: 32}               # BWD_BM64, BWD_BM128: queries a tile step
# The profiled rungs' dK/dV kernels and tiles (the notebook's BWD_LADDER / BWD_DKDV_TILES): kernel prefix, warps,
# keys a block, queries a step per d, row tiles of 16 keys a warp. atomic_2d (rung 8) has its own kernel at d = 64 only.
RUNG_TILES = {"atomic_w8": ("bwd_dkdv_w8", W8_WARPS, W8_KEYS, W8_QUERY_TILE, 1),
              "atomic_2d": ("bwd_dkdv_2d", {64: 4, 128: 8}, 128, {64: 32, 128: 32}, 2),
              "atomic_fa2": ("bwd_dkdv_fa2", 8, 128, {64: 64, 128: 64}, 2)}


def loop_body(sass: str) -> dict[str, int]:
    """Opcode counts (SASS, static) inside the kernel's outermost loop: the instructions between the target of the
    backward branch that spans the most code and that branch. For the dK/dV kernel that is the tile step (both sides
    of its mask branch and the dQ k-loop once: an upper bound on one step's instructions, except the k-loop's
    repeats)."""
    addr = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*)")
    insts, best = [], None
    for line in sass.splitlines():
        m = addr.search(line)
        if not m:
            continue
        at, text = int(m.group(1), 16), m.group(2)
        insts.append((at, text))
        b = re.search(r"\bBRA\s+(?:`?\(?)0x([0-9a-f]+)", text)
        if b and int(b.group(1), 16) < at and (best is None or at - int(b.group(1), 16) > best[1] - best[0]):
            best = (int(b.group(1), 16), at)
    counts: dict[str, int] = {}
    if best is None:
        return counts
    for at, text in insts:
        if best[0] <= at <= best[1]:
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0].rstrip(";")
            if op and text.startswith("@!PT "):       # predicated on never (ptxas's `@!PT LDS` beside each zero-fill
                op += "@!PT"                          # cp.async): counted as an instruction, no shared traffic
            if op:
                counts[op] = counts.get(op, 0) + 1
    return counts


def _count(counts: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in counts.items() if k == prefix or k.startswith(prefix + "."))


def atomic_w8_model(d: int, N: int, registers: int, shared_bytes: int, loop: dict[str, int] | None = None,
                    rates: dict | None = None, instructions_per_warp_step: float | None = None,
                    warps: int = W8_WARPS, keys: int = W8_KEYS, bm: int | None = None, mt: int = 1,
                    pair: bool = False, fa2: bool = False) -> dict:
    """What one tile step of atomic_w8's dK/dV kernel (8 warps, 128 keys, BM queries a step) asks of each unit of an
    SM, at FlashAttention-3's shape (B N = 16k, H d = 2048), and how long the kernel would take if each alone bound it.

    Counts per warp and step follow the kernel's loops (tutorial 08, bwd::dkdv with W = 8): S^T = K Q^T and
    dP^T = V dO^T (16 keys x BM queries, d deep: BM/8 n-blocks x d/16 k-steps HMMA.16816 each; ldmatrix.x4: d/16 A +
    BM/16 x d/16 B), dV += P^T dO and dK += dS^T Q (A from registers; d/8 n-blocks x BM/16 k-steps; BM/16 x d/16
    ldmatrix.x4.trans), dQ = dS K (the block's [BM, d] shared by 8 warps: BM/16 row groups, d/8 / (8 / (BM/16))
    n-blocks a warp, 128/16 k-steps; 1 + n-blocks/2 ldmatrix.x4.trans a k-step) and its red.global.add.v2.f32 (2 a
    n-block a thread). Other shared traffic (LSE, Dv, dS stores) from `loop` (loop_body of the SASS: an upper bound);
    cp.async writes Q, dO, LSE, Dv tiles into shared memory (one wavefront per 128 B).
    warps, keys, bm, mt: another rung of the same family (atomic_2d: 4 warps, 128 keys, 32 queries a step, mt = 2
    row tiles of 16 keys a warp: S^T and dP^T take MT A fragments a k-step, the B fragments and the dV/dK products'
    ldmatrix.trans feed MT mma's each); pair: atomic_2d at d = 128 (8 warps in pairs, below). Other shared traffic
    from the loop body counts both of a pair's branches (P^T's float2 stores and loads, dS^T's): a bound.
    fa2: rung 10 (atomic_fa2, bwd::dkdv_fa2: 8 warps, 128 keys, 64 queries a step, mt = 2): S and dP with warps 2
    (queries) x 4 (keys), a warp 32 x 32 over d (MT = 2 A fragments, NB / 2 = 2 B fragments a k-step); dV, dK with
    warps 4 (keys) x 2 (columns), a warp 32 keys x d/2 over the 64 queries (per 16 queries 2 A fragments of P^T or
    dS^T by ldmatrix.trans, d/32 B fragments); dQ with warps 2 (queries) x 4 (columns), a warp 32 queries x d/4 over
    the 128 keys (2 A, d/64 B a k-step), 2 MT d/32 red.v2 a thread.
    Returns {"rows": [{resource, per_block_step, per_64_queries, unit, alone_ms}], "bound", "predicted_ms",
    "blocks_per_sm", "waves", ...}."""
    from kernellab import occupancy

    r = dict(H100_RATES, **(rates or {}))
    loop = loop or {}
    W, KT, BM, MT = warps, keys, bm or W8_QUERY_TILE[d], mt
    B, H = max(1, 16384 // N), 2048 // d
    NB, DB, RG = BM // 8, d // 8, BM // 16
    DBW = DB // (W // RG)
    hmma_warp = MT * (2 * NB * (d // 16) + 2 * DB * (BM // 16)) + DBW * (KT // 16)
    ldsm_warp = 2 * (d // 16) * (MT + NB // 2) + 2 * (BM // 16) * (DB // 2) + (KT // 16) * (1 + DBW // 2)
    if pair:         # atomic_2d at d = 128: a warp pair shares MT row tiles; one warp S^T, the other dP^T (each over
        # d), each half of dV and dK's columns for the MT row tiles: the same HMMA as MT = 1 over 16 MT keys a warp
        # pair, A fragments of S^T / dP^T MT a k-step, the dV / dK B fragments (.trans, d/2 wide) feeding MT HMMA
        hmma_warp = MT * NB * (d // 16) + 2 * MT * (DB // 2) * (BM // 16) + DBW * (KT // 16)
        ldsm_warp = (d // 16) * (MT + NB // 2) + 2 * (BM // 16) * (DB // 4) + (KT // 16) * (1 + DBW // 2)
    red_warp = 2 * DBW                                      # red.v2 a thread (rows g and g + 8, DBW n-blocks)
    if fa2:
        SNB, DH, DQ = 4, d // 2, d // 4                     # a warp's S: 32 x 8 SNB; dV, dK d/2 wide; dQ d/4 wide
        hmma_warp = 2 * MT * SNB * (d // 16) + 2 * MT * (DH // 8) * (BM // 16) + MT * (DQ // 8) * (KT // 16)
        ldsm_warp = (2 * (d // 16) * (MT + SNB // 2) + 2 * (BM // 16) * (MT + DH // 16)
                     + (KT // 16) * (MT + DQ // 16))
        red_warp = MT * 2 * (DQ // 8)
    other_smem_warp = _count(loop, "LDS") + _count(loop, "STS")
    cp_async_bytes = 2 * BM * d * 2 + 2 * BM * 4           # Q, dO tiles; LSE, Dv rows
    wavefronts = W * (4 * ldsm_warp + other_smem_warp) + cp_async_bytes / 128
    red_bytes = BM * d * 4                                  # the block's dQ share a step, fp32
    if instructions_per_warp_step is None:     # the static loop body: both sides of the mask branch, inner loops
        instructions_per_warp_step = float(sum(loop.values())) or None   # once (ncu's count replaces it)
    occ = occupancy(32 * W, registers, shared_bytes, "sm_90")
    bps = max(1, occ.blocks_per_sm)
    blocks = math.ceil(N / KT) * B * H
    steps = math.ceil(N / BM)
    waves = math.ceil(blocks / (r["sms"] * bps))
    # SM-side resources: cycles a block step, times the steps and blocks an SM runs in turn (waves x blocks an SM)
    per_sm_steps = waves * bps * steps
    sm_ms = lambda cycles: per_sm_steps * cycles / r["clock_hz"] * 1e3    # noqa: E731
    gpu_ms = lambda total_bytes, rate: total_bytes / rate * 1e3           # noqa: E731
    scale64 = 64 / BM
    rows = [
        dict(resource="tensor pipe (HMMA.16816)", per_block_step=W * hmma_warp, unit="HMMA",
             alone_ms=sm_ms(W * hmma_warp * 4096 / r["hmma_flop_per_clk_sm"])),
        dict(resource="shared memory (wavefronts)", per_block_step=wavefronts, unit="wavefronts",
             alone_ms=sm_ms(wavefronts * 128 / r["smem_bytes_per_clk_sm"]),
             detail=f"{W * ldsm_warp} ldmatrix.x4, {W * other_smem_warp} LDS/STS (bound), "
                    f"{cp_async_bytes / 128:.0f} from cp.async"),
        dict(resource="issue (warp instructions)", per_block_step=(W * instructions_per_warp_step
                                                                   if instructions_per_warp_step else None),
             unit="instr", alone_ms=(sm_ms(W * instructions_per_warp_step / r["issue_per_clk_sm"])
                                     if instructions_per_warp_step else None)),
        dict(resource="L2 -> SM loads (Q, dO, LSE, Dv)", per_block_step=cp_async_bytes, unit="B",
             alone_ms=gpu_ms(blocks * steps * cp_async_bytes, r["l2_bytes_per_s"])),
        dict(resource="dQ reductions (red.v2 to L2)", per_block_step=red_bytes, unit="B",
             alone_ms=gpu_ms(blocks * steps * red_bytes, r["l2_red_bytes_per_s"]),
             detail=f"{W * red_warp} warp REDs a step ({W * red_warp * 8} sectors), "
                    f"{blocks * steps * red_bytes / 1e9:.2f} GB a backward"),
        dict(resource="DRAM (Q K V O dO in, dK dV out, dq_accum once)", unit="B",
             per_block_step=None,
             alone_ms=gpu_ms(B * H * N * d * (7 * 2 + 4) + 2 * B * H * N * 4, r["dram_bytes_per_s"])),
    ]
    for row in rows:
        v = row["per_block_step"]
        row["per_64_queries"] = None if v is None else v * scale64
    timed = [x for x in rows if x["alone_ms"] is not None]
    bound = max(timed, key=lambda x: x["alone_ms"])
    flops = 10 * B * H * N * N * d
    elems = B * H * N * d
    pre_us = (elems * (2 + 2 + 4) + B * H * N * 4) / r["dram_bytes_per_s"] * 1e6   # O, dO in; dq_accum zeroed; Dv
    convert_us = elems * (4 + 2) / r["dram_bytes_per_s"] * 1e6                    # dq_accum in, dQ out
    return dict(pre_us=pre_us, convert_us=convert_us, d=d, N=N, B=B, H=H, BM=BM, warps=W, keys=KT, mt=MT,
                registers=registers, shared_bytes=shared_bytes, blocks_per_sm=bps,
                occupancy=str(occ), blocks=blocks, steps=steps, waves=waves, rows=rows, bound=bound["resource"],
                predicted_ms=bound["alone_ms"], predicted_tflops=flops / (bound["alone_ms"] * 1e-3) / 1e12,
                hmma_per_warp_step=hmma_warp, ldsm_x4_per_warp_step=ldsm_warp,
                ldsm_per_hmma=ldsm_warp / hmma_warp, red_v2_per_thread_step=red_warp,
                instructions_per_warp_step=instructions_per_warp_step, flops=flops, clock_hz=r["clock_hz"])


def _swz(row: int, chunk: int, cols: int) -> int:
    """The kernels' bwd::swz<COLS>: byte offset of 16-byte chunk `chunk` of row `row`, XOR-swizzled by row % 8."""
    return row * cols * 2 + ((chunk ^ (row & 7)) << 4)


def rung8_shared_accesses(d: int = 64, bm: int = 32, mt: int = 2, warps: int = 4, keys: int = 128) -> list[dict]:
    """Every shared-memory access of one query step of rung 8's dK/dV kernel (bwd::dkv_mt with DQ_ATOMIC, the 2-D warp
    tile; rung 9's are the same but for its LSE and Dv copies, 16 bytes by 16 threads), each warp's 32 lane
    addresses as the kernel computes them, through the bank model
    (kernellab.analysis.banks). One row per access site: its name, per warp step its instructions and wavefronts,
    and the conflict-free count. ldmatrix.x4 is four 8-lane phases of 16-byte rows (the model's 16-byte access);
    ncu counts 4 wavefronts for a conflict-free one. The shared layout is the launcher's: K, V [keys, d]; 2 x (Q, dO)
    [bm, d]; 2 x (LSE, Dv) [bm] fp32; dS^T [keys, 64] T (step buffer 0 here: buffer 1 is bm * d * 2 bytes on, a
    multiple of 128 bytes, so its banks are the same)."""
    from kernellab.analysis.banks import analyze_access

    KT, BM, MT, W, D = keys, bm, mt, warps, d
    NB, DB, RG = BM // 8, D // 8, BM // 16
    DBW = DB // (W // RG)
    TB, QB = KT * D * 2, BM * D * 2
    k_tile, v_tile = 0, TB
    q_tile, do_tile = 2 * TB, 2 * TB + 2 * QB
    lse0 = 2 * TB + 4 * QB
    dv0 = lse0 + 2 * BM * 4
    ds_tile = dv0 + 2 * BM * 4
    lanes = range(32)
    sites: dict[str, dict] = {}

    def add(name, what, addresses, nbytes):
        a = analyze_access(list(addresses), nbytes)
        row = sites.setdefault(name, dict(site=name, what=what, access_bytes=nbytes, instructions=0, wavefronts=0,
                                          ideal_wavefronts=0, ways=1))
        row["instructions"] += 1
        row["wavefronts"] += a.wavefronts
        row["ideal_wavefronts"] += a.ideal_wavefronts
        row["ways"] = max(row["ways"], a.ways)

    for warp in range(W):
        kw = 16 * MT * warp
        rw, db0 = 16 * (warp % RG), (warp // RG) * DBW
        for tile, b, name in ((k_tile, q_tile, "S^T = K Q^T"), (v_tile, do_tile, "dP^T = V dO^T")):
            for kc in range(D // 16):
                for m in range(MT):          # A: the warp's key rows (ldmatrix.x4)
                    add(f"{name}: A ({'K' if tile == k_tile else 'V'})", "ldmatrix.x4", (
                        tile + _swz(kw + 16 * m + (ln & 15), 2 * kc + (ln >> 4), D) for ln in lanes), 16)
                for nb in range(0, NB, 2):   # B: the step's query rows (ldmatrix.x4)
                    add(f"{name}: B ({'Q' if b == q_tile else 'dO'})", "ldmatrix.x4", (
                        b + _swz(8 * nb + (ln & 7) + ((ln >> 4) << 3), 2 * kc + ((ln >> 3) & 1), D)
                        for ln in lanes), 16)
        for nb in range(NB):                 # P^T's LSE and dS^T's Dv: queries 8 nb + 2t, + 1 (LDS.64 in the SASS)
            add("LSE (probs_t_each)", "LDS.64", (lse0 + 4 * (8 * nb + 2 * (ln % 4)) for ln in lanes), 8)
            add("Dv (ds_t)", "LDS.64", (dv0 + 4 * (8 * nb + 2 * (ln % 4)) for ln in lanes), 8)
        for b, name in ((do_tile, "dV += P^T dO: B (dO)"), (q_tile, "dK += dS^T Q: B (Q)")):
            for kc in range(NB // 2):
                for db in range(0, DB, 2):
                    add(name, "ldmatrix.x4.trans", (
                        b + _swz(16 * kc + (ln & 15), db + (ln >> 4), D) for ln in lanes), 16)
        for m in range(MT):                  # dS^T to shared memory: key rows kw + 16 m + g (+ 8), queries 16 kc + 8 h
            for kc in range(NB // 2):
                for h in range(2):
                    for r in range(2):
                        add("dS^T store", "STS.32", (ds_tile + _swz(kw + 16 * m + ln // 4 + 8 * r, 2 * kc + h, 64)
                                                     + 4 * (ln % 4) for ln in lanes), 4)
        for kc in range(KT // 16):           # dQ = dS K: dS (transposed) and K fragments
            add("dQ: A (dS)", "ldmatrix.x4.trans", (
                ds_tile + _swz(16 * kc + (ln & 7) + ((ln >> 4) << 3), rw // 8 + ((ln >> 3) & 1), 64)
                for ln in lanes), 16)
            for db in range(0, DBW, 2):
                add("dQ: B (K)", "ldmatrix.x4.trans", (
                    k_tile + _swz(16 * kc + (ln & 15), db0 + db + (ln >> 4), D) for ln in lanes), 16)
    # cp.async of the next step's Q and dO (16 bytes a thread, BM * D / 8 chunks a tile over the block's threads) and
    # its LSE and Dv rows (4 bytes a thread, the first BM threads)
    for tile, name in ((q_tile, "cp.async Q"), (do_tile, "cp.async dO")):
        for i0 in range(0, BM * D // 8, 32):
            add(name, "LDGSTS.128", (tile + _swz((i0 + ln) // (D // 8), (i0 + ln) % (D // 8), D)
                                     for ln in lanes), 16)
    for base, name in ((lse0, "cp.async LSE"), (dv0, "cp.async Dv")):
        for i0 in range(0, BM, 32):
            add(name, "LDGSTS.32", (base + 4 * (i0 + ln) if i0 + ln < BM else None for ln in lanes), 4)
    rows = list(sites.values())
    for row in rows:                          # per warp and step
        per = 1 / W
        row.update(instructions=row["instructions"] * per, wavefronts=row["wavefronts"] * per,
                   ideal_wavefronts=row["ideal_wavefronts"] * per)
        row["excess_wavefronts"] = row["wavefronts"] - row["ideal_wavefronts"]
    return rows


def rung8_bank_summary(d: int = 64) -> dict:
    """rung8_shared_accesses summed: wavefronts and conflicts a warp step, HMMA a warp step (the model's count),
    wavefronts per HMMA."""
    rows = rung8_shared_accesses(d)
    NB, DB, MT, KT, BM, W = 4, d // 8, 2, 128, 32, 4
    DBW = DB // (W // (BM // 16))
    hmma = MT * (2 * NB * (d // 16) + 2 * DB * (BM // 16)) + DBW * (KT // 16)
    wf = sum(r["wavefronts"] for r in rows)
    return dict(rows=rows, wavefronts=wf, excess_wavefronts=sum(r["excess_wavefronts"] for r in rows),
                hmma=hmma, wavefronts_per_hmma=wf / hmma)


def rung8_bank_table(d: int = 64) -> str:
    """rung8_shared_accesses as a text table, its totals last."""
    s = rung8_bank_summary(d)
    lines = [f"rung 8's shared accesses at d = {d}, one warp and query step, by kernellab.analysis.banks:",
             "site | instruction | instr. | wavefronts | ideal | excess | worst",
             "--- | --- | --- | --- | --- | --- | ---"]
    for r in s["rows"]:
        lines.append(f"{r['site']} | {r['what']} | {r['instructions']:g} | {r['wavefronts']:g} | "
                     f"{r['ideal_wavefronts']:g} | {r['excess_wavefronts']:g} | {r['ways']}-way")
    lines.append(f"total: {s['wavefronts']:g} wavefronts a warp step ({s['excess_wavefronts']:g} from bank "
                 f"conflicts) for {s['hmma']} HMMA: {s['wavefronts_per_hmma']:.2f} a HMMA")
    return "\n".join(lines)


def _lane_off(lr: int, lc: int, cfold: int, cols: int) -> int:
    """The kernel's bwd::lane_off<COLS>: a lane's part of a swizzled address (row lr, chunk lc, XOR cfold)."""
    return lr * 2 * cols | (((lc ^ (lr & 7)) ^ cfold) << 4)


def fa2_shared_accesses(d: int = 128) -> list[dict]:
    """Every shared-memory access of one query step of rung 10's dK/dV kernel (bwd::dkdv_fa2: 8 warps, 128 keys, 64
    queries a step), each warp's 32 lane addresses as the kernel computes them (lane_off and a constant XOR / add a
    fragment), through kernellab.analysis.banks; rows as rung8_shared_accesses's, per warp and step. Layout: K, V
    [128, d]; 2 x (Q, dO) [64, d]; 2 x (LSE, Dv) [64] fp32; dS, P [64 queries, 128 keys] T (step buffer 0)."""
    from kernellab.analysis.banks import analyze_access

    KT, BM, MT, SNB, W, D = 128, 64, 2, 4, 8, d
    DH, DQ = D // 2, D // 4
    TB, QB, PB = KT * D * 2, BM * D * 2, BM * KT * 2
    k_tile, v_tile = 0, TB
    q_tile, do_tile = 2 * TB, 2 * TB + 2 * QB
    lse0 = 2 * TB + 4 * QB
    dv0 = lse0 + 2 * BM * 4
    ds_tile = dv0 + 2 * BM * 4
    p_tile = ds_tile + PB
    lanes = range(32)
    sites: dict[str, dict] = {}

    def add(name, what, addresses, nbytes):
        a = analyze_access(list(addresses), nbytes)
        row = sites.setdefault(name, dict(site=name, what=what, access_bytes=nbytes, instructions=0, wavefronts=0,
                                          ideal_wavefronts=0, ways=1))
        row["instructions"] += 1
        row["wavefronts"] += a.wavefronts
        row["ideal_wavefronts"] += a.ideal_wavefronts
        row["ways"] = max(row["ways"], a.ways)

    for warp in range(W):
        sq, sk = 32 * (warp // 4), 32 * (warp % 4)
        kr, kc0 = 32 * (warp // 2), (warp % 2) * (DH // 8)
        qr, qc0 = 32 * (warp // 4), (warp % 4) * (DQ // 8)
        for a, b, name in ((q_tile, k_tile, "S = Q K^T"), (do_tile, v_tile, "dP = dO V^T")):   # gemm_abt_fa2
            a_base, b_base = a + sq * 2 * D, b + sk * 2 * D
            for kc in range(D // 16):
                for m in range(MT):
                    add(f"{name}: A ({'Q' if a == q_tile else 'dO'})", "ldmatrix.x4", (
                        a_base + 16 * m * 2 * D + (_lane_off(ln & 15, ln >> 4, 0, D) ^ (kc << 5)) for ln in lanes), 16)
                for nb in range(0, SNB, 2):
                    add(f"{name}: B ({'K' if b == k_tile else 'V'})", "ldmatrix.x4", (
                        b_base + 8 * nb * 2 * D + (_lane_off((ln & 7) + ((ln >> 4) << 3), (ln >> 3) & 1, 0, D)
                                                   ^ (kc << 5)) for ln in lanes), 16)
        for m in range(MT):                  # the LSE and Dv of the thread's rows sq + 16 m + g + 8 h (LDS.32)
            for h in range(2):
                add("LSE", "LDS.32", (lse0 + 4 * (sq + 16 * m + ln // 4 + 8 * h) for ln in lanes), 4)
                add("Dv", "LDS.32", (dv0 + 4 * (sq + 16 * m + ln // 4 + 8 * h) for ln in lanes), 4)
        # rows sq + 16 m + 8 h + g, keys sk + 8 nb + 2t
        for tile, name in ((p_tile, "P store"), (ds_tile, "dS store")):
            for m in range(MT):
                for h in range(2):
                    for nb in range(SNB):
                        add(name, "STS.32", (tile + (sq + 16 * m + 8 * h) * 2 * KT
                                             + ((_lane_off(ln // 4, 0, sk // 8, KT) | 4 * (ln % 4)) ^ (nb << 4))
                                             for ln in lanes), 4)
        for a, b, name in ((p_tile, do_tile, "dV += P^T dO"), (ds_tile, q_tile, "dK += dS^T Q")):   # gemm_at_b
            for kc in range(BM // 16):
                for m in range(MT):
                    add(f"{name}: A ({'P^T' if a == p_tile else 'dS^T'})", "ldmatrix.x4.trans", (
                        a + 16 * kc * 2 * KT + (_lane_off((ln & 7) + ((ln >> 4) << 3), (ln >> 3) & 1, kr // 8, KT)
                                                ^ (m << 5)) for ln in lanes), 16)
                for db in range(0, DH // 8, 2):
                    add(f"{name}: B ({'dO' if b == do_tile else 'Q'})", "ldmatrix.x4.trans", (
                        b + 16 * kc * 2 * D + (_lane_off(ln & 15, ln >> 4, kc0, D) ^ (db << 4)) for ln in lanes), 16)
        for kc in range(KT // 16):           # dQ = dS K (gemm_a_b)
            for m in range(MT):
                add("dQ: A (dS)", "ldmatrix.x4", (ds_tile + qr * 2 * KT + 16 * m * 2 * KT
                                                   + (_lane_off(ln & 15, ln >> 4, 0, KT) ^ (kc << 5))
                                                   for ln in lanes), 16)
            for db in range(0, DQ // 8, 2):
                add("dQ: B (K)", "ldmatrix.x4.trans", (
                    k_tile + 16 * kc * 2 * D + (_lane_off(ln & 15, ln >> 4, qc0, D) ^ (db << 4)) for ln in lanes), 16)
    for tile, name in ((q_tile, "cp.async Q"), (do_tile, "cp.async dO")):   # load_tile: 16 bytes a thread
        for i0 in range(0, BM * D // 8, 32):
            add(name, "LDGSTS.128", (tile + _swz((i0 + ln) // (D // 8), (i0 + ln) % (D // 8), D)
                                     for ln in lanes), 16)
    for base, name in ((lse0, "cp.async LSE"), (dv0, "cp.async Dv")):      # load_row_values: 4 bytes a thread
        for i0 in range(0, BM, 32):
            add(name, "LDGSTS.32", (base + 4 * (i0 + ln) for ln in lanes), 4)
    rows = list(sites.values())
    for row in rows:
        row.update(instructions=row["instructions"] / W, wavefronts=row["wavefronts"] / W,
                   ideal_wavefronts=row["ideal_wavefronts"] / W)
        row["excess_wavefronts"] = row["wavefronts"] - row["ideal_wavefronts"]
    return rows


def rung10_bank_table(d: int = 128) -> str:
    """fa2_shared_accesses as a text table, its totals last (HMMA a warp step: 5 d / 2)."""
    rows = fa2_shared_accesses(d)
    hmma = 5 * d // 2
    wf = sum(r["wavefronts"] for r in rows)
    excess = sum(r["excess_wavefronts"] for r in rows)
    lines = [f"rung 10's shared accesses at d = {d}, one warp and query step, by kernellab.analysis.banks:",
             "site | instruction | instr. | wavefronts | ideal | excess | worst",
             "--- | --- | --- | --- | --- | --- | ---"]
    for r in rows:
        lines.append(f"{r['site']} | {r['what']} | {r['instructions']:g} | {r['wavefronts']:g} | "
                     f"{r['ideal_wavefronts']:g} | {r['excess_wavefronts']:g} | {r['ways']}-way")
    lines.append(f"total: {wf:g} wavefronts a warp step ({excess:g} from bank conflicts) for {hmma} HMMA: "
                 f"{wf / hmma:.2f} a HMMA")
    return "\n".join(lines)


def model_table(m: dict, flash_ms: float | None = None) -> str:
    """The model as a text table: each resource's demand a block step and per 64 queries, its time alone."""
    head = (f"atomic_w8 dK/dV kernel, d = {m['d']}, N = {m['N']} (B = {m['B']}, H = {m['H']}, {m['BM']} queries a "
            f"step): {m['registers']} registers, {m['shared_bytes']:,} B shared -> {m['blocks_per_sm']} block(s) "
            "an SM, "
            f"{m['blocks']} blocks in {m['waves']} waves, {m['steps']} steps a block; "
            f"{m['hmma_per_warp_step']} HMMA and {m['ldsm_x4_per_warp_step']} ldmatrix.x4 a warp a step "
            f"({m['ldsm_per_hmma']:.2f} per HMMA)")
    lines = [head, f"{'resource':48s} {'a block step':>14s} {'per 64 queries':>15s} {'alone (ms)':>11s}  detail"]
    for row in m["rows"]:
        f = (lambda v: f"{v:,.0f}" if v is not None else "-")
        ms = f"{row['alone_ms']:.2f}" if row["alone_ms"] is not None else "-"
        lines.append(f"{row['resource']:48s} {f(row['per_block_step']):>14s} {f(row['per_64_queries']):>15s} "
                     f"{ms:>11s}  {row.get('detail', '')}")
    lines.append(f"bound: {m['bound']}: {m['predicted_ms']:.2f} ms ({m['predicted_tflops']:.0f} TFLOP/s for the kernel "
                 f"alone at {m['clock_hz'] / 1e9:.3f} GHz)"
                 + (f"; SDPA FLASH's whole backward measured {flash_ms:.2f} ms" if flash_ms else ""))
    lines.append(f"preprocess and dQ convert (DRAM-bound): {m['pre_us']:.0f} + {m['convert_us']:.0f} us")
    return "\n".join(lines)


# Nsight Compute: what each kernel of one backward spent its time on (benchmarks/attention.py --profile's metrics
# where they overlap, stall reasons from kernellab's ncu module).
BWD_PROFILE_METRICS = (
    ("gpu__time_duration.sum", "duration"),
    ("sm__cycles_elapsed.avg.per_second", "SM clock"),
    ("sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "SMs active"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active"),
    ("sm__inst_executed_pipe_tensor_op_hmma.sum", "tensor instructions (HMMA, per warp)"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue slots busy"),
    ("smsp__inst_executed.sum", "warp instructions"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "shared wavefronts"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed", "shared pipe busy"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "shared bank conflicts"),
    ("smsp__inst_executed_op_ldsm.sum", "ldmatrix instructions"),
    ("smsp__inst_executed_op_global_red.sum", "global reductions (RED, per warp)"),
    ("lts__t_sectors_op_red.sum", "L2 reduction sectors"),
    ("lts__t_sectors_op_atom.sum", "L2 atomic sectors"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 throughput"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput"),
    ("dram__bytes.sum", "DRAM bytes"),
    ("launch__registers_per_thread", "registers per thread"),
    ("launch__grid_size", "CTAs"),
    ("launch__block_size", "threads a CTA"),
)
PROFILE_N = 4096
PROFILE_KERNELS = "bwd"          # ncu -k regex: ours (bwd_pre_*, bwd_dkdv_w8_*, hbwd_*, bwd_dq_convert_*), flash_bwd_*


def profile_metrics() -> tuple[tuple[str, str], ...]:
    from kernellab.run.nvtools.ncu import stall_metrics

    return BWD_PROFILE_METRICS + stall_metrics()


def profile_child(ns, dims) -> None:
    """The program ncu watches: at each (d, N), one backward each of atomic_w8, atomic_2d, atomic_2d_ilp, atomic_fa2
    and step 3
    (where they run) and SDPA FLASH, in that order, on the same inputs (the forwards' kernels do not match
    PROFILE_KERNELS)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t08 = load_tutorial(NOTEBOOK)
    for d in dims:
        for N in ns:
            B, H = max(1, 16384 // N), 2048 // d
            g = torch.Generator().manual_seed(0)
            q, k, v, do = (torch.randn(B, H, N, d, generator=g).to(torch.bfloat16).cuda() for _ in range(4))
            o, lse = t08["attention_forward"](q, k, v, False)
            t08["attention_backward"](q, k, v, o, lse, do, False, "atomic_w8")
            t08["attention_backward"](q, k, v, o, lse, do, False, "atomic_2d")
            if "atomic_2d_ilp" in t08["VARIANTS"]:
                t08["attention_backward"](q, k, v, o, lse, do, False, "atomic_2d_ilp")
            if "atomic_fa2" in t08["VARIANTS"]:
                t08["attention_backward"](q, k, v, o, lse, do, False, "atomic_fa2")
            if d in t08["BWD_OP_HOPPER_DIMS"] and t08["hopper_backward_applies"](q):
                t08["attention_backward"](q, k, v, o, lse, do, False, "hopper")
                if "hopper_rows" in t08["VARIANTS"]:        # step 3b beside step 3
                    t08["attention_backward"](q, k, v, o, lse, do, False, "hopper_rows")
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(*leaves)
            torch.autograd.grad(out, leaves, do)
            torch.cuda.synchronize()
            print(f"profile child: d={d} N={N} done", flush=True)


def label_launches(names: list[str], flash_keys: list[tuple[int, int]]) -> list[tuple[str, int | None, int | None,
                                                                                       str]]:
    """(who, d, N, role) for each profiled launch, in order: ours by name (bwd_pre_* belongs to the main kernel after
    it, bwd_dq_convert_* to the one before; the head dim from the name, N from the order of flash_keys), SDPA's
    flash_bwd_* by their place: the k-th run of consecutive flash_bwd launches is flash_keys[k] = (d, N)."""
    out: list[list] = []
    pending: list[int] = []
    last = None
    run = -1
    prev_flash = False
    for n in names:
        if "flash_bwd" in n:
            if not prev_flash:
                run += 1
            prev_flash = True
            d, N = flash_keys[run] if run < len(flash_keys) else (None, None)
            role = ("preprocess" if "dot_do_o" in n else "dQ convert" if "convert" in n else "dK/dV/dQ")
            out.append(["FLASH", d, N, role])
            continue
        prev_flash = False
        if n.startswith("bwd_pre") or n.startswith("hbwd_pre"):
            pending.append(len(out))
            out.append([None, None, None, "preprocess"])
            continue
        if n.startswith("bwd_dq_convert"):
            out.append([last[0], last[1], last[2], "dQ convert"] if last else ["?", None, None, "dQ convert"])
            continue
        m = re.search(r"_d(\d+)", n)
        d = int(m.group(1)) if m else None
        who = ("hopper_rows" if n.startswith("hbwd_rows") else "hopper" if n.startswith("hbwd")
               else "atomic_w8" if "_w8_" in n else "atomic_2d" if n.startswith("bwd_dkdv_2d_")
               else "atomic_2d_ilp" if n.startswith("bwd_dkdv_ilp_")
               else "atomic_fa2" if n.startswith("bwd_dkdv_fa2_") else n)
        N = next((key[1] for key in flash_keys[max(run + 1, 0):] if key[0] == d), None)
        last = (who, d, N)
        out.append([who, d, N, "dK/dV/dQ" if who.startswith("hopper") else "dK/dV (+dQ red)"])
        for i in pending:
            out[i][:3] = [who, d, N]
        pending = []
    return [tuple(x) for x in out]


def _value(rep, name):
    v = rep.get(name) if rep is not None else None
    return v if isinstance(v, float) else None


_PER_SECOND = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0, "cycle/usecond": 1e6,
               "cycle/nsecond": 1e9}


def _clock_hz(rep) -> float | None:
    """The SM clock in Hz from sm__cycles_elapsed.avg.per_second, whatever unit ncu printed it in."""
    m = next((x for x in (rep.metrics if rep is not None else ()) if x.name == "sm__cycles_elapsed.avg.per_second"),
             None)
    if m is None or not isinstance(m.value, float):
        return None
    scale = _PER_SECOND.get((m.unit or "").lower())
    if scale is None:                                   # no unit: guess the scale from the magnitude
        scale = 1e9 if m.value < 100 else 1e6 if m.value < 1e5 else 1.0
    return m.value * scale


def summarize_kernel(rep, flops: float | None = None) -> dict:
    """The numbers the verdict reads from one kernel's ProfileReport (None where the metric is missing). flops: the
    kernel's matmul FLOPs, for a wgmma kernel: ncu's HMMA-pipe count there is of HGMMA warp instructions (a warp's
    share of an HGMMA.64x64x16 is 8 HMMA.16816's work), so wavefronts and TFLOP/s are per 4,096-FLOP HMMA.16816
    equivalent from the FLOPs instead (step 3: 7.73 wavefronts an HGMMA warp instruction, 1.01 an equivalent)."""
    from kernellab.run.nvtools.ncu import top_stalls

    dur = _value(rep, "gpu__time_duration.sum")
    hmma = _value(rep, "sm__inst_executed_pipe_tensor_op_hmma.sum")
    wf = _value(rep, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum")
    red = _value(rep, "lts__t_sectors_op_red.sum")
    if flops:
        hmma = flops / 4096
    return dict(
        us=dur * 1e6 if dur else None,
        clock_hz=_clock_hz(rep),
        tensor_pct=_value(rep, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
        issue_pct=_value(rep, "smsp__issue_active.avg.pct_of_peak_sustained_active"),
        shared_pct=_value(rep, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"),
        occupancy_pct=_value(rep, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        bank_conflicts=_value(rep, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
        wavefronts_per_hmma=wf / hmma if wf and hmma else None,
        hmma_tflops=hmma * 4096 / dur / 1e12 if hmma and dur else None,
        red_gb_per_s=red * 32 / dur / 1e9 if red and dur else None,
        l2_pct=_value(rep, "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_pct=_value(rep, "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        instructions=_value(rep, "smsp__inst_executed.sum"),
        stalls=top_stalls(rep, 3) if rep is not None else [],
    )


def model_beside(m: dict) -> dict:
    """The model's figures in summarize_kernel's keys: duration, and each unit's share of the predicted time."""
    by = {row["resource"].split(" (")[0]: row for row in m["rows"]}
    share = (lambda key: 100 * by[key]["alone_ms"] / m["predicted_ms"] if by[key]["alone_ms"] else None)
    return dict(us=m["predicted_ms"] * 1e3, tensor_pct=share("tensor pipe"), issue_pct=share("issue"),
                shared_pct=share("shared memory"), occupancy_pct=100 * m["blocks_per_sm"] * m["warps"] / 64,
                wavefronts_per_hmma=by["shared memory"]["per_block_step"] / by["tensor pipe"]["per_block_step"],
                red_gb_per_s=(m["blocks"] * m["steps"] * by["dQ reductions"]["per_block_step"]
                              / (m["predicted_ms"] * 1e-3) / 1e9),
                bank_conflicts=0.0, stalls=[(m["bound"].split(" (")[0], None)])


def verdict(ours: dict, flash: dict | None, model: dict | None) -> list[str]:
    """One line per hypothesis: what the dK/dV kernel's numbers (summarize_kernel) say about it, SUPPORTED or not
    shown, and what to change if it holds."""
    stalls = [r for r, _ in ours.get("stalls") or []]
    said = ", ".join(stalls) or "-"
    pct = (lambda k: ours.get(k) if ours.get(k) is not None else -1.0)      # noqa: E731
    mark = (lambda flag: "SUPPORTED " if flag else "not shown ")            # noqa: E731
    smem = pct("shared_pct") >= 70 or (pct("tensor_pct") < 50
                                       and any(r in stalls for r in ("short_scoreboard", "mio_throttle")))
    red_rate = ours.get("red_gb_per_s") or 0
    red = "lg_throttle" in stalls or red_rate >= 0.7 * H100_RATES["l2_red_bytes_per_s"] / 1e9
    lat = (bool(stalls) and stalls[0] in ("barrier", "long_scoreboard", "wait") and pct("occupancy_pct") <= 15
           and pct("tensor_pct") < 50)                  # the first stall is waiting, with one block of 8 warps
    lines = [
        mark(smem) + f"shared-memory bound: shared pipe {_pc(ours.get('shared_pct'))}, tensor "
        f"{_pc(ours.get('tensor_pct'))}, stalls {said} -> fewer ldmatrix per HMMA: 2-D warp tiling (a warp 32-64 "
        "keys, each Q/dO fragment feeding 2-4 HMMA; K/V fragments kept in registers across the query tiles)",
        mark(red) + f"dQ reductions bound: lg_throttle {'in' if 'lg_throttle' in stalls else 'not in'} the top 3, "
        f"{_num(ours.get('red_gb_per_s'))} GB/s of fp32 reductions reaching L2 -> dQ in its own pass, or fewer, "
        "larger reductions (TMA cp.reduce.async.bulk of a block's dQ share)",
        mark(lat) + f"too little overlap: occupancy {_pc(ours.get('occupancy_pct'))} (1 block of 8 warps = 12.5 %), "
        f"stalls {said} -> two blocks an SM (under 128 registers) or a deeper Q/dO pipeline, barriers per warp group",
        mark(pct("issue_pct") >= 80) + f"issue bound: issue slots {_pc(ours.get('issue_pct'))} -> fewer "
        "instructions per HMMA (the lean rung's address math, masks only on edge tiles)",
        mark(pct("tensor_pct") >= 80) + f"tensor bound: tensor pipe {_pc(ours.get('tensor_pct'))} -> mma.sync is "
        "at its ceiling here; only wgmma (step 3) goes faster",
    ]
    if flash:
        lines.append(f"beside FLASH's dK/dV/dQ kernel: shared wavefronts per HMMA "
                     f"{_num(ours.get('wavefronts_per_hmma'), 2)} (FLASH {_num(flash.get('wavefronts_per_hmma'), 2)}), "
                     f"tensor {_pc(ours.get('tensor_pct'))} (FLASH {_pc(flash.get('tensor_pct'))}), issue "
                     f"{_pc(ours.get('issue_pct'))} (FLASH {_pc(flash.get('issue_pct'))}), occupancy "
                     f"{_pc(ours.get('occupancy_pct'))} (FLASH {_pc(flash.get('occupancy_pct'))})")
    if model and ours.get("us"):
        ratio = ours["us"] / (model["predicted_ms"] * 1e3)
        lines.append(f"model: {model['bound']} predicted {model['predicted_ms'] * 1e3:,.0f} us, measured "
                     f"{ours['us']:,.0f} us ({ratio:.2f}x the bound: "
                     + ("near it: the model's unit is the limit)" if ratio <= 1.2
                        else "well above it: latency and overlap, not one unit's throughput)"))
    return lines


# Rung 8's prediction (tutorial 08, NOTES-attention-backward.md), written before a GPU ran it: wavefronts a HMMA
# per head dim (the model's 2.08 at d = 64, where it gives atomic_w8 2.75, measured 2.81; at d = 128 2.46 with both
# of a warp pair's branches counted, ~2.25 with each warp's own) and its dK/dV kernel's time (1.4-1.8x the model's
# bound: 3.10 ms at d = 64, ~3.4 at d = 128; atomic_w8 ran 1.62x / 1.55x and FLASH 1.52x theirs).
RUNG_2D_PREDICTED = {64: dict(wavefronts_per_hmma=(2.0, 2.2), kernel_us=(4_500, 5_600)),
                     128: dict(wavefronts_per_hmma=(2.1, 2.4), kernel_us=(4_700, 5_700))}


def rung_2d_lines(two: dict, w8: dict, flash: dict | None, model: dict) -> list[str]:
    """What rung 8's profile says against its prediction, atomic_w8 and FLASH: its wavefronts a HMMA and its time."""
    wf, us = two.get("wavefronts_per_hmma"), two.get("us")
    lo, hi = RUNG_2D_PREDICTED[model["d"]]["wavefronts_per_hmma"]
    ulo, uhi = RUNG_2D_PREDICTED[model["d"]]["kernel_us"]
    inside = (lambda v, a, b: "n/a" if v is None else "as predicted" if a <= v <= b      # noqa: E731
              else "below the prediction" if v < a else "ABOVE the prediction")
    out = [f"atomic_2d: shared wavefronts per HMMA {_num(wf, 2)} (predicted {lo}-{hi}: {inside(wf, lo, hi)}; "
           f"atomic_w8 {_num(w8.get('wavefronts_per_hmma'), 2)}, FLASH "
           f"{_num((flash or {}).get('wavefronts_per_hmma'), 2)}), dK/dV kernel {_num(us)} us (predicted {ulo:,}-"
           f"{uhi:,}: {inside(us, ulo, uhi)}; atomic_w8 {_num(w8.get('us'))} us, FLASH {_num((flash or {}).get('us'))}"
           f" us), tensor {_pc(two.get('tensor_pct'))}, occupancy {_pc(two.get('occupancy_pct'))} ("
           + ("2 blocks of 4" if model["d"] == 64 else "1 block of 8") + " warps = 12.5 %)"]
    out += ["atomic_2d: " + line for line in verdict(two, flash, model)]
    return out


# Rung 9's prediction (tutorial 08, written before a GPU ran it; notebook's rung 9 and NOTES-attention-backward.md).
# The bank model (rung8_bank_table) finds every shared access of rungs 8 and 9 conflict-free, 2.10 wavefronts a HMMA;
# the hypothesis: rung 8's 30.8 million counted conflicts are L1 hits of the LSE / Dv rows' 4-byte cp.async.ca (two
# blocks of a head an SM), which rung 9 copies with 16-byte cp.async.cg. If it holds: conflicts below 3 million and
# 2.10-2.14 wavefronts a HMMA at d = 64; if not, about rung 8's. Time: P^T's 32 exponentials a thread interleaved
# with dP^T's mma's (rung 8 runs them apart, in its mask branch: about 256 cycles of MUFU a warp step with the tensor
# pipe idle for the warp) and dQ's k-loop in two accumulator sets: the dK/dV kernel 1.03-1.08x rung 8's speed at
# d = 64; at d = 128 (warp pairs: the dQ and row-copy changes only) 0.97-1.03x.
RUNG_9_PREDICTED = {64: dict(wavefronts_per_hmma=(2.10, 2.14), bank_conflicts_below=3e6, speed_vs_2d=(1.03, 1.08)),
                    128: dict(wavefronts_per_hmma=None, bank_conflicts_below=None, speed_vs_2d=(0.97, 1.03))}
# ... and its backward against SDPA FLASH's in the benchmark (rung 8 measured 0.91 / 0.92 at d = 64, 0.68 / 0.69 at
# d = 128 on an H200), full and causal alike
RUNG_9_BENCH_PREDICTED = {64: dict(vs_flash=(0.93, 0.98), vs_2d=(1.03, 1.08)),
                          128: dict(vs_flash=(0.68, 0.71), vs_2d=(0.97, 1.03))}
# Rung 10 (atomic_fa2), written before a GPU ran it (NOTES-attention-backward.md): the whole backward against SDPA
# FLASH and against the rung it is timed beside (atomic_2d_ilp at d = 64, atomic_w8 at d = 128), causal the same
# within 5 %. From the model (atomic_w8_model(fa2=True)): shared-memory bound 3.81 / 3.03 ms (d = 64 / 128, H100),
# the kernel 1.5-1.8x its bound as FLASH (1.52x) and rungs 5-9 (1.55-2.0x) ran theirs.
RUNG_10_BENCH_PREDICTED = {64: dict(vs_flash=(0.73, 0.87), other="atomic_2d_ilp", vs_other=(0.78, 0.93)),
                           128: dict(vs_flash=(0.85, 1.00), other="atomic_w8", vs_other=(1.20, 1.45))}


def _inside(v, lo, hi) -> str:
    return ("n/a" if v is None else "as predicted" if lo <= v <= hi
            else "below the prediction" if v < lo else "ABOVE the prediction")


def rung_9_lines(ilp: dict, two: dict, d: int) -> list[str]:
    """What rung 9's profile says against its prediction and rung 8 (same run): wavefronts a HMMA, bank conflicts (the
    L1-hit hypothesis), the dK/dV kernel's speed against rung 8's, and the stalls it meant to shorten."""
    pred = RUNG_9_PREDICTED[d]
    wf, conf, us = ilp.get("wavefronts_per_hmma"), ilp.get("bank_conflicts"), ilp.get("us")
    speed = two["us"] / us if us and two.get("us") else None
    out = []
    if pred["wavefronts_per_hmma"]:
        lo, hi = pred["wavefronts_per_hmma"]
        out.append(f"atomic_2d_ilp: shared wavefronts per HMMA {_num(wf, 2)} (predicted {lo:.2f}-{hi:.2f}: "
                   f"{_inside(wf, lo, hi)}; atomic_2d {_num(two.get('wavefronts_per_hmma'), 2)}; bank model 2.10 "
                   "for both)")
    if pred["bank_conflicts_below"] and conf is not None:
        held = conf < pred["bank_conflicts_below"]
        out.append(f"atomic_2d_ilp: bank conflicts {conf:,.0f} (atomic_2d {_num(two.get('bank_conflicts'))}; "
                   f"predicted below {pred['bank_conflicts_below']:,.0f} if they were L1 hits of the LSE / Dv "
                   f"4-byte cp.async.ca): hypothesis {'SUPPORTED' if held else 'REJECTED: look at the per-line table'}")
    lo, hi = pred["speed_vs_2d"]
    stalls = lambda s: ", ".join(f"{r} {v:.2f}" for r, v in (s.get("stalls") or []) if v is not None) or "n/a"  # noqa
    out.append(f"atomic_2d_ilp: dK/dV kernel {_num(us)} us, {_num(speed, 3)}x atomic_2d's speed ({_num(two.get('us'))}"
               f" us; predicted {lo:.2f}-{hi:.2f}x: {_inside(speed, lo, hi)}), tensor {_pc(ilp.get('tensor_pct'))} "
               f"(atomic_2d {_pc(two.get('tensor_pct'))}); stalls {stalls(ilp)} (atomic_2d {stalls(two)})")
    return out


# Rung 10's prediction as written before a GPU ran it (NOTES-attention-backward): the bank model's wavefronts a HMMA,
# and the dK/dV kernel at 1.5-1.8x the model's shared-memory bound.
RUNG_10_PREDICTED = {64: dict(wavefronts_per_hmma=2.55, over_bound=(1.5, 1.8)),
                     128: dict(wavefronts_per_hmma=2.03, over_bound=(1.5, 1.8))}


def rung_10_lines(fa2: dict, flash: dict | None, model: dict, d: int) -> list[str]:
    """What rung 10's profile says against its prediction and FLASH's kernel (same run): wavefronts a HMMA against
    the bank model's count, its time over the model's bound, tensor pipe, occupancy and the stalls."""
    pred = RUNG_10_PREDICTED[d]
    wf, us = fa2.get("wavefronts_per_hmma"), fa2.get("us")
    bound_us = model_beside(model).get("us")
    over = us / bound_us if us and bound_us else None
    lo, hi = pred["over_bound"]
    stalls = lambda s: ", ".join(f"{r} {v:.2f}" for r, v in (s.get("stalls") or []) if v is not None) or "n/a"  # noqa
    flash = flash or {}
    return [f"atomic_fa2: shared wavefronts per HMMA {_num(wf, 2)} (bank model {pred['wavefronts_per_hmma']:.2f}; "
            f"FLASH {_num(flash.get('wavefronts_per_hmma'), 2)}); bank conflicts {_num(fa2.get('bank_conflicts'))}",
            f"atomic_fa2: dK/dV kernel {_num(us)} us, {_num(over, 2)}x the model's bound ({_num(bound_us)} us; "
            f"predicted {lo:.1f}-{hi:.1f}x: {_inside(over, lo, hi)}); FLASH's dK/dV/dQ {_num(flash.get('us'))} us; "
            f"tensor {_pc(fa2.get('tensor_pct'))} (FLASH {_pc(flash.get('tensor_pct'))}), occupancy "
            f"{_pc(fa2.get('occupancy_pct'))}; stalls {stalls(fa2)} (FLASH {stalls(flash)})"]


def bank_lines(label: str, rep, counted: float | None = None, top: int = 8) -> list[str]:
    """ncu's per-source-line shared counters (kernellab.run.nvtools.ncu_source) of one kernel: its total excess
    wavefronts against the conflicts the launch's counter gave (`counted`), by instruction kind, and the lines with
    the most excess."""
    if rep is None:
        return [f"{label}: no per-line counters"]
    if not rep.measured:
        return [f"{label}: per-line counters not measured: {rep.reason}"]
    excess = rep.excess_wavefronts
    out = [f"{label}: ncu source counters: {rep.wavefronts:,} shared wavefronts, {rep.ideal_wavefronts:,} ideal, "
           f"{excess:,} excess on its instructions" + (f" (the launch's bank-conflict counter: {counted:,.0f}; the "
                                                       f"difference {counted - excess:,.0f} is on no instruction's "
                                                       "addresses)" if counted is not None else "")]
    by_op: dict[str, int] = {}
    for c in rep.lines:
        ops = sorted({x.split(" ")[0] for x in c.sass}) or [c.kind]
        key = "/".join(ops)
        by_op[key] = by_op.get(key, 0) + c.excess_wavefronts
    out.append(f"{label}: excess by instruction: " + (", ".join(f"{k} {v:,}" for k, v in
                                                               sorted(by_op.items(), key=lambda kv: -kv[1])) or "none"))
    for c in sorted(rep.lines, key=lambda c: -c.excess_wavefronts)[:top]:
        if c.excess_wavefronts <= 0:
            break
        out.append(f"  line {c.line} ({c.kind}, {'/'.join(sorted({x.split(' ')[0] for x in c.sass})) or '-'}): "
                   f"{c.excess_wavefronts:,} excess of {c.wavefronts:,} wavefronts; {c.source[:70]}")
    return out


def ncu_banks_of(argv: list[str], symbol: str):
    """ncu's per-line shared counters of `symbol`'s first launch in the program `argv` (SourceCounters section)."""
    from kernellab.run.nvtools import ncu_source
    from kernellab.run.nvtools.sanitize import tool_env
    from notebook_cells import named_cuda_cells

    try:
        return ncu_source.run_ncu_banks(argv, symbol, source=named_cuda_cells(NOTEBOOK)["attn_bwd"], first_line=2,
                                        timeout_s=90, env=tool_env())
    except Exception as exc:              # ncu's failure here must not cost the profile above it
        print(f"  per-line counters of {symbol}: {type(exc).__name__}: {exc}")
        return None


def _pc(v):
    return f"{v:.0f} %" if v is not None else "n/a"


def _num(v, digits=0):
    return f"{v:,.{digits}f}" if v is not None else "n/a"


PROFILE_COLUMNS = ("us", "tensor_pct", "issue_pct", "shared_pct", "wavefronts_per_hmma", "bank_conflicts",
                   "occupancy_pct", "red_gb_per_s", "l2_pct", "dram_pct")


def summary_table(rows: list[tuple[str, dict]]) -> str:
    """The short table: one row per kernel (or the model), the figures the verdict reads, top 3 stalls last."""
    head = ["kernel", "µs", "tensor", "issue", "shared", "wf/HMMA", "bank confl.", "occupancy", "RED GB/s", "L2",
            "DRAM", "top stalls"]
    fmt = {"us": lambda v: f"{v:,.0f}", "wavefronts_per_hmma": lambda v: f"{v:.2f}",
           "bank_conflicts": lambda v: f"{v:,.0f}", "red_gb_per_s": lambda v: f"{v:,.0f}"}
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name, s in rows:
        cells = [name] + [("-" if s.get(k) is None else fmt.get(k, lambda v: f"{v:.0f} %")(s[k]))
                          for k in PROFILE_COLUMNS]
        cells.append(", ".join(r if v is None else f"{r} {v:.2f}" for r, v in s.get("stalls") or []) or "-")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def static_model(t08_bwd, d: int, N: int, clock_hz: float | None = None, instructions: float | None = None,
                 variant: str = "atomic_w8") -> dict:
    """atomic_w8_model from the compiled kernel (registers, its SASS loop body) at the launcher's shared memory, for
    atomic_w8 or another rung of RUNG_TILES; instructions: ncu's warp instructions for the kernel (replaces the static
    loop body's count)."""
    prefix, W, KT, bms, MT = RUNG_TILES[variant]
    W = W[d] if isinstance(W, dict) else W
    k = t08_bwd[f"{prefix}_bf16_d{d}"]
    BM = bms[d]
    pair = variant == "atomic_2d" and d == 128                              # the notebook's BWD_PAIRS
    fa2 = variant == "atomic_fa2"                                           # the notebook's BWD_P_TILE
    smem = (2 * KT * d * 2 + 4 * BM * d * 2 + 4 * BM * 4 + KT * 64 * 2     # bwd_dkdv_smem_bytes(d, True, W, KT, BM)
            + (KT * BM * 4 if pair else 0) + (KT * BM * 2 if fa2 else 0))   # + the pairs' P^T tile, rung 10's P tile
    B, H = max(1, 16384 // N), 2048 // d
    per_warp_step = (instructions / (math.ceil(N / KT) * B * H * math.ceil(N / BM) * W)
                     if instructions else None)
    return atomic_w8_model(d, N, k.resources.registers, smem, loop_body(str(k.sass)),
                           rates={"clock_hz": clock_hz} if clock_hz else None,
                           instructions_per_warp_step=per_warp_step, warps=W, keys=KT, bm=BM, mt=MT, pair=pair,
                           fa2=fa2)


def _main_kernel(reports, tags, who: str, d: int, N: int):
    """The longest of `who`'s launches at (d, N) other than its preprocess and dQ convert (FLASH's backward may add a
    small kernel, e.g. one clearing its accumulators), or None."""
    found = [rep for rep, t in zip(reports, tags) if t[:3] == (who, d, N) and t[3] not in ("preprocess", "dQ convert")]
    return max(found, key=lambda rep: rep.duration_ms or 0.0, default=None)


def run_profile(out: pathlib.Path, ns=(PROFILE_N,), dims=(64, 128), timeout_s: float = 200.0,
                profile=None, banks=None) -> int:
    """atomic_w8, step 3 (d = 64) and SDPA FLASH's backward under Nsight Compute (one launch of each kernel, one
    ncu process: kernellab.run.nvtools.ncu.profile_command), each dK/dV kernel beside the model, the short table
    and the verdict last. Reports in $OUT/attention_backward_profile.json. `profile`: profile_command (tests pass a
    fake). Then, at d = 64, ncu's per-line shared counters of rungs 8 and 9's dK/dV kernels (`banks(argv, symbol)`:
    ncu_banks_of where `profile` is the real one; tests pass a fake or nothing): which instructions the bank
    conflicts are counted on."""
    from kernellab.run.nvtools import ncu

    t0 = time.time()
    flash_keys = [(d, N) for d in dims for N in ns]
    argv = [sys.executable, str(pathlib.Path(__file__).resolve()), "--profile-child",
            "--ns", ",".join(map(str, ns)), "--dims", ",".join(map(str, dims))]
    metrics = [m for m, _ in profile_metrics()]
    per_key = 7 * 4     # atomic_w8, atomic_2d, atomic_2d_ilp, atomic_fa2, hopper, hopper_rows, FLASH: 3 kernels each
    #                     (1 spare)
    reports = (profile or ncu.profile_command)(argv, kernel_regex=PROFILE_KERNELS,
                                               launch_count=per_key * len(flash_keys), metrics=metrics,
                                               timeout_s=timeout_s, extra_args=("--print-units", "base"))
    t08 = load_tutorial(NOTEBOOK)         # after the child: its compiles are in kernellab's disk cache now
    labels = dict(profile_metrics())
    names = [r.kernel for r in reports]
    tags = label_launches(names, flash_keys)
    print(f"Nsight Compute: {len(reports)} launches profiled in {time.time() - t0:.0f} s "
          f"({', '.join(names) if len(names) < 20 else len(names)})")
    for r in reports:
        if r.error:
            print(f"  {r.kernel}: {r.error}")
        for note in r.notes:
            print(f"  {r.kernel}: note: {note}")
    if not reports or not all(r.ok for r in reports):     # what ncu and the program said, for the log
        raw = reports[0].raw if reports else ""
        print("ncu's output (last 40 lines):\n" + "\n".join(raw.splitlines()[-40:]))
        print("command: " + " ".join(reports[0].command if reports else argv))
    results, verdicts, short = [], [], []
    for d, N in flash_keys:
        cols = [(f"{who} {role}", rep) for rep, (who, dd, nn, role) in zip(reports, tags) if dd == d and nn == N]
        ours, flash, hop, hop_b = (_main_kernel(reports, tags, who, d, N)
                                   for who in ("atomic_w8", "FLASH", "hopper", "hopper_rows"))
        flops = 10 * max(1, 16384 // N) * (2048 // d) * N * N * d     # the backward's matmuls, not causal
        s_ours = summarize_kernel(ours) if ours is not None else {}
        model = static_model(t08["attn_bwd"], d, N, s_ours.get("clock_hz"), s_ours.get("instructions"))
        total = lambda who: sum((summarize_kernel(rep)["us"] or 0) for rep, t in zip(reports, tags)   # noqa: E731
                                if t[:3] == (who, d, N))
        print(f"\n== d = {d}, N = {N}, bf16, not causal (B = {max(1, 16384 // N)}, H = {2048 // d}), "
              "one launch each ==")
        print(model_table(model))
        keys = list(dict.fromkeys(m.name for _, rep in cols for m in rep.metrics))
        pred = model_beside(model)
        width = 16
        print(f"\n{'metric':52s} " + " ".join(f"{c[:width]:>{width}s}" for c, _ in cols)
              + f" {'model (dK/dV)':>{width}s}")
        pred_by_metric = {"gpu__time_duration.sum": f"{pred['us']:.0f} us",
                          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active":
                              _pc(pred["tensor_pct"]),
                          "smsp__issue_active.avg.pct_of_peak_sustained_active": _pc(pred["issue_pct"]),
                          "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed":
                              _pc(pred["shared_pct"]),
                          "sm__warps_active.avg.pct_of_peak_sustained_active": _pc(pred["occupancy_pct"]),
                          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "0",
                          "sm__inst_executed_pipe_tensor_op_hmma.sum":
                              f"{model['blocks'] * model['steps'] * model['rows'][0]['per_block_step']:,.0f}",
                          "lts__t_sectors_op_red.sum": f"{model['blocks'] * model['steps'] * 512:,.0f}"}
        for key in keys:
            cells = []
            for _, rep in cols:
                m = next((x for x in rep.metrics if x.name == key), None)
                cells.append(m.formatted() if m else "-")
            print(f"{labels.get(key, key)[:52]:52s} " + " ".join(f"{c[:width]:>{width}s}" for c in cells)
                  + f" {pred_by_metric.get(key, ''):>{width}s}")
        s_flash = summarize_kernel(flash) if flash is not None else None
        lines = (verdict(s_ours, s_flash, model) if ours is not None
                 else [f"no profile of atomic_w8's dK/dV kernel at d = {d}"])
        rows = [(f"atomic_w8 dK/dV d{d}", s_ours), (f"model d{d} ({model['bound'].split(' (')[0]})", pred)]
        if hop is not None:                           # wgmma: per HMMA.16816 equivalent (summarize_kernel)
            rows.append((f"hopper d{d}", summarize_kernel(hop, flops)))
        if hop_b is not None:
            rows.append((f"hopper_rows d{d}", summarize_kernel(hop_b, flops)))
        if s_flash:
            rows.append((f"FLASH dK/dV/dQ d{d}", s_flash))
        two = _main_kernel(reports, tags, "atomic_2d", d, N)
        if two is not None:                           # rung 8: its kernel, its model, what the two say
            s_two = summarize_kernel(two)
            model2 = static_model(t08["attn_bwd"], d, N, s_two.get("clock_hz"), s_two.get("instructions"),
                                  variant="atomic_2d")
            rows[2:2] = [(f"atomic_2d dK/dV d{d}", s_two),
                         (f"model 2d d{d} ({model2['bound'].split(' (')[0]})", model_beside(model2))]
            lines = lines + rung_2d_lines(s_two, s_ours, s_flash, model2)
            ilp = _main_kernel(reports, tags, "atomic_2d_ilp", d, N)
            if ilp is not None:                       # rung 9: beside rung 8, against its prediction
                s_ilp = summarize_kernel(ilp)
                rows[4:4] = [(f"atomic_2d_ilp dK/dV d{d}", s_ilp)]
                lines = lines + rung_9_lines(s_ilp, s_two, d)
        fa2 = _main_kernel(reports, tags, "atomic_fa2", d, N)
        if fa2 is not None:                           # rung 10: its kernel, its model, against its prediction
            s_fa2 = summarize_kernel(fa2)
            model10 = static_model(t08["attn_bwd"], d, N, s_fa2.get("clock_hz"), s_fa2.get("instructions"),
                                   variant="atomic_fa2")
            rows += [(f"atomic_fa2 dK/dV d{d}", s_fa2),
                     (f"model fa2 d{d} ({model10['bound'].split(' (')[0]})", model_beside(model10))]
            lines = lines + rung_10_lines(s_fa2, s_flash, model10, d)
        ours_us, flash_us, hop_us, hop_b_us = total("atomic_w8"), total("FLASH"), total("hopper"), total("hopper_rows")
        two_us, ilp_us, fa2_us = total("atomic_2d"), total("atomic_2d_ilp"), total("atomic_fa2")
        whole = (f"whole backward d{d} (ncu durations summed): atomic_w8 {ours_us:,.0f} us, FLASH {flash_us:,.0f} us"
                 + (f" ({flash_us / ours_us:.2f}x FLASH's speed)" if ours_us and flash_us else "")
                 + (f", hopper {hop_us:,.0f} us" if hop_us else "")
                 + (f", hopper_rows {hop_b_us:,.0f} us" if hop_b_us else "")
                 + (f", atomic_2d {two_us:,.0f} us" + (f" ({flash_us / two_us:.2f}x FLASH's speed)" if flash_us else "")
                    if two_us else "")
                 + (f", atomic_2d_ilp {ilp_us:,.0f} us" + (f" ({flash_us / ilp_us:.2f}x FLASH's speed)" if flash_us
                                                            else "") if ilp_us else "")
                 + (f", atomic_fa2 {fa2_us:,.0f} us" + (f" ({flash_us / fa2_us:.2f}x FLASH's speed)" if flash_us
                                                         else "") if fa2_us else ""))
        short.append((d, N, rows, whole, lines))
        results.append(dict(d=d, N=N, model=model, summary=dict(rows), whole_us=dict(atomic_w8=ours_us, FLASH=flash_us,
                                                                                       hopper=hop_us, atomic_2d=two_us,
                                                                                       hopper_rows=hop_b_us,
                                                                                       atomic_2d_ilp=ilp_us,
                                                                                       atomic_fa2=fa2_us),
                            verdict=lines, kernels=[dict(label=c, **rep.to_json()) for c, rep in cols]))
    bank_fn = banks if banks is not None else (ncu_banks_of if profile is None else None)
    if bank_fn is not None and 64 in dims:     # which instructions rung 8's (and 9's) bank conflicts are counted on
        child = [sys.executable, str(pathlib.Path(__file__).resolve()), "--profile-child", "--ns", str(ns[0]),
                 "--dims", "64"]
        counted = {t[0]: summarize_kernel(rep).get("bank_conflicts") for rep, t in zip(reports, tags)
                   if t[1:] == (64, ns[0], "dK/dV (+dQ red)")}
        print(f"\n== Shared wavefronts per source line (ncu SourceCounters), d = 64, N = {ns[0]}: where the bank "
              "conflicts are counted ==")
        for who, symbol in (("atomic_2d", "bwd_dkdv_2d_bf16_d64"), ("atomic_2d_ilp", "bwd_dkdv_ilp_bf16_d64")):
            t1 = time.time()
            for line in bank_lines(who, bank_fn(child, symbol), counted.get(who)):
                print(line)
            print(f"  ({time.time() - t1:.0f} s)")
    (out / "attention_backward_profile.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none", "results": results},
        indent=1, default=str))
    print("\n== Where the time goes: atomic_w8's dK/dV kernel against the model, step 3 and FLASH (N = "
          f"{', '.join(map(str, ns))}, not causal) ==")
    for d, N, rows, whole, lines in short:
        print(f"\nd = {d}, N = {N}: {whole}")
        print(summary_table(rows))
        for line in lines:
            print("  " + line)
    ok = bool(reports) and all(r.ok for r in reports) and len(reports) >= 6 * len(flash_keys)
    print(f"\n{'profile complete' if ok else 'profile INCOMPLETE (see the errors above)'}: {len(reports)} launches")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
