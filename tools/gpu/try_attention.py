"""One short GPU call for tutorial 07's step 3 (kernellab issue 12): the notebook's fa3 kernel beside its persistent
variant (step 3b's fa3p kernels, first written as tools/gpu/attn_variants/fa3_persistent.cu), checked against SDPA,
then timed against SDPA's FLASH and CUDNN
backends in the same run. Under 120 s on an H100.

    PYTHONPATH=$PWD python3 tools/gpu/try_attention.py            # GPU: checks, then the table
    PYTHONPATH=$PWD python3 tools/gpu/try_attention.py --plan     # no GPU: resources, and the static schedule's balance

Method. "fa3" is the `%%cuda --arch sm_90a` cell of notebooks/07-fused-attention.py, compiled and launched as
benchmarks/attention.py does (one block per query block and head). "fa3p" is the candidate: grid = the SM count, each
CTA walking (query block, head) work items in the kernel's static snake order, in L2 sections of `section_heads`
heads (the K/V of a section's heads within L2_BUDGET_BYTES); "fa3p_flat" is the same with one section (all heads:
the heaviest query blocks of every head first); "fa3p_dyn" the same with L2 sections, its CTAs drawing their next
work item from an atomic counter instead of the snake. Checks: kernellab.check against SDPA in float64 on awkward
shapes (N = 1031, 65, 4097 and a benchmark-like 1024; causal and not; both dtypes), every kernel, and the candidate
also on 7 CTAs with both schedules (every CTA walks many items, its barriers' phases wrap); our error must also be
within 2x SDPA's own. Timing: kernellab.bench, bf16, B N = 16k, H d = 2048, N = 1024, 2048, 4096, d = 64 and 128,
causal and not; FLOPs 4 B H N^2 d (halved when causal); all six functions alternate in the same run (CUDA events,
L2 flushed, medians of 6 rounds). With $OUT set, the table also goes to $OUT/try_attention.txt and the rows to
$OUT/try_attention.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

L2_BUDGET_BYTES = 16 << 20          # K/V of one section's heads: a third of the H100's 50 MB L2
CHECKS = [  # (B, H, N, d, dtype, causal)
    (2, 3, 1031, 64, "bf16", True),
    (4, 5, 65, 128, "fp16", False),
    (1, 2, 4097, 128, "bf16", True),
    (4, 32, 1024, 64, "bf16", True),     # a benchmark-like shape: 768 work items, ~6 per CTA on 132 SMs
]
NS, DIMS = (1024, 2048, 4096), (64, 128)


def section_heads(N: int, d: int, bh: int, elem_bytes: int = 2) -> int:
    """Heads per L2 section: as many as have their K and V within L2_BUDGET_BYTES (at least 1, at most all)."""
    return max(1, min(bh, L2_BUDGET_BYTES // (2 * N * d * elem_bytes)))


def schedule(n_items: int, ctas: int):
    """The kernel's static order (next_item without a counter): for each CTA, its work items, round by round (a
    snake)."""
    out = [[] for _ in range(ctas)]
    for r in range(math.ceil(n_items / ctas)):
        for b in range(ctas):
            item = r * ctas + (ctas - 1 - b if r & 1 else b)
            if item < n_items:
                out[b].append(item)
    return out


def item_coords(item: int, n_qblocks: int, bh: int, hps: int, causal: bool, alternate: bool) -> tuple[int, int]:
    """(query block, head) of a work item, as the kernel's item_coords numbers them (alternate: the static schedule)."""
    per = hps * n_qblocks
    sec, r = divmod(item, per)
    heads = min(hps, bh - sec * hps)
    level, head = divmod(r, heads)
    return (n_qblocks - 1 - level if causal and not (alternate and sec & 1) else level), sec * hps + head


def balance(N: int, d: int, causal: bool, bh: int, hps: int, ctas: int = 132, dynamic: bool = False,
            bm: int | None = None, bn: int = 128) -> float:
    """Key tiles (+ 1 per item for its fixed costs) of the busiest CTA over the mean: the schedule's predicted
    balance. Static: the snake; dynamic: greedy in item order (the atomic counter). hps=None: fa3, one block per
    item dispatched greedily in launch order (query blocks fastest, reversed when causal)."""
    import heapq

    bm = bm or (192 if d == 64 else 128)
    nqb, tiles_all = math.ceil(N / bm), math.ceil(N / bn)
    cost = (lambda q: min(tiles_all, math.ceil((q * bm + bm) / bn)) + 1) if causal else (lambda q: tiles_all + 1)
    n_items = nqb * bh
    if hps is None:
        order = [nqb - 1 - x if causal else x for _ in range(bh) for x in range(nqb)]
    else:
        order = [item_coords(i, nqb, bh, hps, causal, not dynamic)[0] for i in range(n_items)]
    if hps is not None and not dynamic:
        loads = [sum(cost(order[i]) for i in items) for items in schedule(n_items, ctas)]
    else:
        loads = [0.0] * ctas
        for q in order:
            heapq.heappush(loads, heapq.heappop(loads) + cost(q))
    return max(loads) / (sum(loads) / ctas)


def plan():
    """No GPU: both kernels' resources, and the predicted balance of the benchmark shapes."""
    import kernellab
    from notebook_cells import cuda_cells

    cell = next(c for c in cuda_cells("07-fused-attention.py") if "fa3_bf16_d64" in c)
    for k in kernellab.compile_cuda(cell, arch="sm_90a").kernels:      # step 3 (fa3_*) and step 3b (fa3p_*)
        if "bf16" in k.name:
            print(f"{k.name:28s} {k.resources}")
    print("\nbusiest SM / mean, key tiles + 1 per item, 132 SMs: fa3p static | fa3p_flat static | fa3p_dyn | "
          "fa3 (hardware)")
    for d in DIMS:
        for causal in (False, True):
            for N in NS:
                bh = (16384 // N) * (2048 // d)
                hps = section_heads(N, d, bh)
                print(f"d={d:3d} causal={causal!s:5s} N={N:5d} BH={bh:4d} heads/section={hps:3d}: "
                      f"{balance(N, d, causal, bh, hps):.3f} | {balance(N, d, causal, bh, bh):.3f} | "
                      f"{balance(N, d, causal, bh, hps, dynamic=True):.3f} | {balance(N, d, causal, bh, None):.3f}")


_BENCH = []


def attention_helpers():
    """benchmarks/attention.py as a module (imports torch): its loaders, launchers, inputs and SDPA wrappers."""
    if not _BENCH:
        from attention_steps import attention_benchmark

        _BENCH.append(attention_benchmark())
    return _BENCH[0]


def persistent_launcher(family: dict, config: dict, sms: int, ctas: int | None = None, flat: bool = False,
                        dynamic: bool = False):
    """attention(q, k, v, out, causal) for the fa3p kernels: grid = min(SMs or `ctas`, work items); flat: one L2
    section; dynamic: work items drawn from a counter (one zeroed int, which every launch leaves at 0)."""
    import torch

    import kernellab

    A = attention_helpers()
    counter = {}

    def attention(q, k, v, out, causal=False):
        B, H, N, d = q.shape
        kern = A.entry(family, q, causal)
        threads = kern.resources.max_threads_per_block
        bm, bn, stages = 64 * (threads // 128 - 1), config[f"BN{d}"], config.get(f"ST{d}", 2)
        maps = [kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64)) for x, rows in ((q, bm), (k, bn), (v, bn))]
        smem = 1024 + (2 * bm + 2 * stages * bn) * d * 2 + 256          # alignment slack, 2 Q, K/V stages, barriers
        items = math.ceil(N / bm) * B * H
        hps = B * H if flat else section_heads(N, d, B * H)
        if dynamic and q.device not in counter:
            counter[q.device] = torch.zeros(1, dtype=torch.int32, device=q.device)
        kern[(min(ctas or sms, items),), threads, smem](*maps, out, N, B * H, hps,
                                                        counter[q.device] if dynamic else None, d ** -0.5)
        return out
    return attention


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="no GPU: resources and the schedule's predicted balance")
    args = ap.parse_args(argv)
    if args.plan:
        return plan()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    import kernellab

    A = attention_helpers()
    t0 = time.time()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nb_fams, nb_cfg = A.load_families(None, None)
    cand_fams, cand_cfg = nb_fams, nb_cfg            # step 3b's fa3p kernels (3 consumer warpgroups at d = 64)
    # the same with 2 consumer warpgroups at d = 64 (the cell's _bm128 entries, under the plain names)
    wg2_fams = {"fa3p": {n.replace("_bm128", ""): k for n, k in nb_fams["fa3p"].items()
                         if n.endswith("_bm128") or "_d128" in n}}
    wg2_cfg = nb_cfg
    fa3 = A.launcher(nb_fams["fa3"], nb_cfg["fa3"])
    ours = {"fa3": fa3,
            "fa3p_dyn": persistent_launcher(cand_fams["fa3p"], cand_cfg["fa3p"], sms, dynamic=True),
            "dyn_wg2": persistent_launcher(wg2_fams["fa3p"], wg2_cfg["fa3p"], sms, dynamic=True)}
    lines = [f"{dev}, {sms} SMs, {time.strftime('%Y-%m-%d')}"]
    for fam, cfg in (("fa3", nb_cfg["fa3"]), ("fa3p", cand_cfg["fa3p"])):
        k = (nb_fams if fam == "fa3" else cand_fams)[fam][f"{fam}_bf16_d64"]
        lines.append(f"{fam}: {cfg}; {k.name} {k.resources}")

    # checks: each kernel on each shape, the candidate also on 7 CTAs
    checked = {**ours, "fa3p_dyn@7": persistent_launcher(cand_fams["fa3p"], cand_cfg["fa3p"], sms, ctas=7, dynamic=True),
               "dyn_wg2@7": persistent_launcher(wg2_fams["fa3p"], wg2_cfg["fa3p"], sms, ctas=7, dynamic=True)}
    bad = 0
    for B, H, N, d, dname, causal in CHECKS:
        row = []
        for name, att in checked.items():
            rep = kernellab.check(lambda q, k, v, o: att(q, k, v, o, causal),
                                  lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                  A.inputs_for(B, H, N, d, A.DTYPES[dname]), trials=2, atol=A.TOL[dname],
                                  rtol=A.TOL[dname])
            own = rep.reference_own_error
            ok = rep.passed and (own is None or rep.max_abs_error <= 2 * own + 1e-6)
            bad += not ok
            row.append(f"{name} {'ok' if ok else 'FAIL'} {rep.max_abs_error:.1e}"
                       + ("" if ok else f" ({rep.message[:120]})"))
        own_s = f"{own:.1e}" if own is not None else "-"
        lines.append(f"check B={B} H={H} N={N} d={d} {dname} causal={causal}: " + "; ".join(row)
                     + f" (SDPA's own {own_s})")
    lines.append(f"checks: {'all passed' if not bad else f'{bad} FAILED'} ({time.time() - t0:.0f} s)")
    print("\n".join(lines), flush=True)

    # timing
    base = {"FLASH": A.sdpa(SDPBackend.FLASH_ATTENTION), "CUDNN": A.sdpa(SDPBackend.CUDNN_ATTENTION)}
    names = list(ours) + list(base)
    rows = []
    for d in DIMS:
        for causal in (False, True):
            for N in NS:
                if time.time() - t0 > 105:
                    rows.append(dict(d=d, causal=causal, N=N, error="skipped: the 120 s budget"))
                    continue
                B, H = 16384 // N, 2048 // d
                fns = {n: (lambda f: (lambda q, k, v, o: f(q, k, v, o, causal)))(f)
                       for n, f in {**ours, **base}.items()}
                probe = [torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
                for bname in base:                     # a baseline that cannot run on this device or shape is dropped
                    try:
                        fns[bname](*probe)
                        torch.cuda.synchronize()
                    except Exception:
                        fns.pop(bname)
                del probe
                try:
                    res = kernellab.bench(fns["fa3p_dyn"], A.inputs_for(B, H, N, d, torch.bfloat16),
                                          baselines={n: f for n, f in fns.items() if n != "fa3p_dyn"},
                                          flops=4 * B * H * N * N * d / (2 if causal else 1), name="fa3p_dyn",
                                          rounds=6, rep_ms=60, warmup_ms=20)
                    tf = {"fa3p_dyn": res.tflops, **{b.name: b.tflops for b in res.baselines}}
                    rows.append(dict(d=d, causal=causal, N=N, B=B, H=H, tflops=tf))
                except Exception as exc:                                   # a baseline that cannot run, say
                    rows.append(dict(d=d, causal=causal, N=N, error=f"{type(exc).__name__}: {exc}"[:200]))
                torch.cuda.empty_cache()
    head = (f"{'d':>4s} {'causal':6s} {'N':>5s} | " + " ".join(f"{n:>9s}" for n in names)
            + " | fa3/FLASH dyn/FLASH wg2/FLASH dyn/CUDNN wg2/CUDNN  wg2/dyn")
    table = ["", "bf16, B N = 16k, H d = 2048, TFLOP/s (medians)", head]
    for r in rows:
        if "error" in r:
            table.append(f"{r['d']:4d} {r['causal']!s:6s} {r['N']:5d} | {r['error']}")
            continue
        tf = r["tflops"]
        cells = " ".join(f"{tf[n]:9.1f}" if n in tf else f"{'-':>9s}" for n in names)
        ratio = (lambda a, b: f"{tf[a] / tf[b]:.2f}x" if a in tf and b in tf else "-")
        table.append(f"{r['d']:4d} {r['causal']!s:6s} {r['N']:5d} | {cells} | {ratio('fa3', 'FLASH'):>9s} "
                     f"{ratio('fa3p_dyn', 'FLASH'):>9s} {ratio('dyn_wg2', 'FLASH'):>9s} "
                     f"{ratio('fa3p_dyn', 'CUDNN'):>9s} {ratio('dyn_wg2', 'CUDNN'):>9s} "
                     f"{ratio('dyn_wg2', 'fa3p_dyn'):>8s}")
    table.append(f"({time.time() - t0:.0f} s)")
    print("\n".join(table))
    if out_dir:
        (out_dir / "try_attention.txt").write_text("\n".join(lines + table) + "\n")
        (out_dir / "try_attention.json").write_text(json.dumps(dict(device=dev, lines=lines, rows=rows), indent=1))


if __name__ == "__main__":
    main()
