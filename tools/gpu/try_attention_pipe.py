"""One short GPU call for kernellab issue 12 item 3: the persistent attention candidate with FA3's intra-warpgroup
pipelining (tools/gpu/attn_variants/fa3_pipe.cu, kernels fa3q_*) beside the one it starts from
(tutorial 07's step 3b, fa3p_*), checked against SDPA, then timed against SDPA's FLASH and CUDNN
backends in the same run. Under 120 s on an H100.

    PYTHONPATH=$PWD python3 tools/gpu/try_attention_pipe.py

Method (as tools/gpu/try_attention.py, whose launcher it uses). "fa3p_dyn": step 3b's kernels, dynamic schedule,
L2 sections, its defaults (3 consumer warpgroups at d = 64, 2 at d = 128). "fa3q_dyn": fa3_pipe.cu, the same
schedule and tiles; "fa3q_wg2": fa3_pipe.cu with 2 consumer warpgroups at d = 64 too (-DFA3Q_WG64=2
-DFA3Q_WG64C=2). Checks: kernellab.check against SDPA in float64 on try_attention's awkward shapes (N = 1031, 65, 4097,
1024; causal and not; both dtypes), each pipelined kernel on the SM count and on 7 CTAs (every CTA walks many items);
our error within 2x SDPA's own; and whether fa3q writes the very bits fa3p writes (it should: the same operations in
a different overlap). Timing: kernellab.bench, bf16, B N = 16k, H d = 2048, N = 1024, 2048, 4096, d = 64 and 128,
causal and not; FLOPs 4 B H N^2 d (halved when causal); medians of 6 rounds. With $OUT set, the table also goes to
$OUT/try_attention_pipe.txt and the rows to $OUT/try_attention_pipe.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
from try_attention import CHECKS, DIMS, NS, attention_helpers, persistent_launcher  # noqa: E402

PIPE = ROOT / "tools" / "gpu" / "attn_variants" / "fa3_pipe.cu"
WG2 = ("-DFA3Q_WG64=2", "-DFA3Q_WG64C=2")


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    import kernellab

    A = attention_helpers()
    t0 = time.time()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    p_fams, p_cfg = A.load_families(None, None)           # the notebook's cells: step 3b is family fa3p
    q_fams, q_cfg = A.load_families(str(PIPE), None)
    w_fams, w_cfg = A.load_families(str(PIPE), None, options=WG2)
    ours = {"fa3p_dyn": persistent_launcher(p_fams["fa3p"], p_cfg["fa3p"], sms, dynamic=True),
            "fa3q_dyn": persistent_launcher(q_fams["fa3q"], q_cfg["fa3q"], sms, dynamic=True),
            "fa3q_wg2": persistent_launcher(w_fams["fa3q"], w_cfg["fa3q"], sms, dynamic=True)}
    lines = [f"{dev}, {sms} SMs, {time.strftime('%Y-%m-%d')}"]
    for label, fams, fam in (("fa3p", p_fams, "fa3p"), ("fa3q", q_fams, "fa3q"), ("fa3q_wg2", w_fams, "fa3q")):
        for d in DIMS:
            k = fams[fam][f"{fam}_bf16_d{d}_causal"]
            lines.append(f"{label}: {k.name} {k.resources}")
    checked = {"fa3q_dyn": ours["fa3q_dyn"], "fa3q_wg2": ours["fa3q_wg2"],
               "fa3q_dyn@7": persistent_launcher(q_fams["fa3q"], q_cfg["fa3q"], sms, ctas=7, dynamic=True),
               "fa3q_wg2@7": persistent_launcher(w_fams["fa3q"], w_cfg["fa3q"], sms, ctas=7, dynamic=True)}
    bad = 0
    for B, H, N, d, dname, causal in CHECKS:
        row = []
        inputs = A.inputs_for(B, H, N, d, A.DTYPES[dname])
        for name, att in checked.items():
            rep = kernellab.check(lambda q, k, v, o: att(q, k, v, o, causal),
                                  lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                  inputs, trials=2, atol=A.TOL[dname], rtol=A.TOL[dname])
            own = rep.reference_own_error
            ok = rep.passed and (own is None or rep.max_abs_error <= 2 * own + 1e-6)
            bad += not ok
            row.append(f"{name} {'ok' if ok else 'FAIL'} {rep.max_abs_error:.1e}"
                       + ("" if ok else f" ({rep.message[:120]})"))
        # the same bits as the unpipelined kernel?
        q, k, v, _ = inputs(torch.Generator().manual_seed(N))
        o_p, o_q = torch.empty_like(q), torch.empty_like(q)
        ours["fa3p_dyn"](q, k, v, o_p, causal)
        ours["fa3q_dyn"](q, k, v, o_q, causal)
        torch.cuda.synchronize()
        diff = int((o_p.view(torch.int16) != o_q.view(torch.int16)).sum())
        own_s = f"{own:.1e}" if own is not None else "-"
        lines.append(f"check B={B} H={H} N={N} d={d} {dname} causal={causal}: " + "; ".join(row)
                     + f" (SDPA's own {own_s}); fa3q vs fa3p: {diff} of {o_p.numel()} elements differ")
    lines.append(f"checks: {'all passed' if not bad else f'{bad} FAILED'} ({time.time() - t0:.0f} s)")
    print("\n".join(lines), flush=True)

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
                    res = kernellab.bench(fns["fa3q_dyn"], A.inputs_for(B, H, N, d, torch.bfloat16),
                                          baselines={n: f for n, f in fns.items() if n != "fa3q_dyn"},
                                          flops=4 * B * H * N * N * d / (2 if causal else 1), name="fa3q_dyn",
                                          rounds=6, rep_ms=60, warmup_ms=20)
                    tf = {"fa3q_dyn": res.tflops, **{b.name: b.tflops for b in res.baselines}}
                    rows.append(dict(d=d, causal=causal, N=N, B=B, H=H, tflops=tf))
                except Exception as exc:
                    rows.append(dict(d=d, causal=causal, N=N, error=f"{type(exc).__name__}: {exc}"[:200]))
                torch.cuda.empty_cache()
    head = (f"{'d':>4s} {'causal':6s} {'N':>5s} | " + " ".join(f"{n:>9s}" for n in names)
            + " |  q/p   wg2/p  q/FLASH q/CUDNN wg2/CUDNN")
    table = ["", "bf16, B N = 16k, H d = 2048, TFLOP/s (medians)", head]
    for r in rows:
        if "error" in r:
            table.append(f"{r['d']:4d} {r['causal']!s:6s} {r['N']:5d} | {r['error']}")
            continue
        tf = r["tflops"]
        cells = " ".join(f"{tf[n]:9.1f}" if n in tf else f"{'-':>9s}" for n in names)
        ratio = (lambda a, b: f"{tf[a] / tf[b]:.2f}x" if a in tf and b in tf else "-")
        table.append(f"{r['d']:4d} {r['causal']!s:6s} {r['N']:5d} | {cells} | {ratio('fa3q_dyn', 'fa3p_dyn'):>6s} "
                     f"{ratio('fa3q_wg2', 'fa3p_dyn'):>6s} {ratio('fa3q_dyn', 'FLASH'):>7s} "
                     f"{ratio('fa3q_dyn', 'CUDNN'):>7s} {ratio('fa3q_wg2', 'CUDNN'):>9s}")
    table.append(f"({time.time() - t0:.0f} s)")
    print("\n".join(table))
    if out_dir:
        (out_dir / "try_attention_pipe.txt").write_text("\n".join(lines + table) + "\n")
        (out_dir / "try_attention_pipe.json").write_text(json.dumps(dict(device=dev, lines=lines, rows=rows),
                                                                    indent=1))


if __name__ == "__main__":
    main()
