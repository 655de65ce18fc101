"""Where tutorials 03/04's row kernels lose time at the shapes issue 14 still misses: Nsight Compute's warp states,
DRAM / L2 / L1 throughput and the SASS instructions warps stall at, one launch of the notebook's own plan each.

    PYTHONPATH=$PWD python3 tools/gpu/norm_stalls.py OUTDIR [CASE ...]    # GPU machine, repo root; ~30 s a case

A CASE is "op dtype RxC" with op layernorm, rmsnorm or softmax (default: tutorial 04's misses at the time and two
cases that meet the target, for contrast), or add_norm_bwd with dtype "stream:branch" (the fused add + LayerNorm's
backward rows kernel on kernellab.teach.add_norm's plan). Writes OUTDIR/<case>.csv (ncu --page details),
<case>.ncu-rep and <case>.source.csv (per-SASS-instruction stall samples), and prints one table of the metrics side
by side, then each
case's ten SASS instructions with the most stall samples.
"""
from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
from ncu_details import parse_details, side_by_side, stall_metrics  # noqa: E402

SECTIONS = ("SpeedOfLight", "WarpStateStats", "SchedulerStats", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis",
            "SourceCounters")
METRICS = ["dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum", "lts__t_sector_hit_rate.pct",
           "l1tex__t_sector_hit_rate.pct", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
           "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
           "sm__warps_active.avg.pct_of_peak_sustained_active"]
SHOWN = ("stalled", "dram__", "lts__", "l1tex__t_sector_hit", "gpu__time", "cycles_elapsed.avg.per_second",
         "warps_active", "Issue Slots Busy", "Eligible Warps", "Achieved Occupancy", "Registers Per Thread",
         "Duration", "Memory Throughput")
DEFAULT = ("layernorm float32 1024x262144", "layernorm bfloat16 1024x262144", "rmsnorm float32 1024x262144",
           "softmax bfloat16 1024x262144", "layernorm bfloat16 4096x4096", "rmsnorm bfloat16 4096x4096",
           "layernorm float32 4096x32768")


def child(case: str) -> None:
    """Run the notebook's op on the case twice (ncu profiles the second launch of the row kernel)."""
    import torch

    import kernellab
    from notebook_cells import load_tutorial

    kernellab.set_isolation(False)
    op, dname, shape = case.split()
    rows, cols = (int(v) for v in shape.split("x"))
    if op == "add_norm_bwd":
        add_norm_child(op, dname, rows, cols)
        return
    dtype = getattr(torch, dname)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(cols, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(cols, device="cuda", dtype=dtype, generator=g)
    if op == "softmax":
        ns = load_tutorial("03-reductions-softmax.py")
        fn = lambda: ns["softmax"](x)                                          # noqa: E731
    else:
        ns = load_tutorial("04-layernorm.py")
        fn = (lambda: ns["layernorm"](x, w, b)) if op == "layernorm" else (lambda: ns["rmsnorm"](x, w))   # noqa
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    plan = ns["plan_rows"](rows, cols, dtype.itemsize)
    print(f"plan {plan}", file=sys.stderr)


def add_norm_child(op: str, dname: str, rows: int, cols: int) -> None:
    """The fused add + LayerNorm's backward rows kernel, launched twice on the op's plan."""
    import torch

    from kernellab.teach import add_norm as an

    xt, rt = (getattr(torch, n) for n in dname.split(":"))
    x, r, w, b, dy, up = an.make_inputs(rows, cols, xt, rt, device="cuda")
    h, _ = an.add_layernorm(x, r, w, b)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunks, row_threads, block, grid = an.plan_backward(rows, cols, sms)
    kernel = an.kernels("cuda")[f"add_layernorm_backward_rows<{an.CTYPE[xt]}, {an.CTYPE[rt]}, {chunks}>"]
    dh, partial = torch.empty_like(h), torch.empty(grid, 2, cols, device="cuda")
    dr = None if xt == rt else torch.empty_like(dy)
    for _ in range(2):
        kernel[grid, block](dy, up, h, w, dh, dr, partial, rows, cols, row_threads, int(cols % an.CHUNK == 0), 1e-5)
    torch.cuda.synchronize()
    print(f"plan {(chunks, row_threads, block, grid)}", file=sys.stderr)


def slug(case: str) -> str:
    return case.replace(" ", "_")


def top_instructions(source_csv: str, n: int = 10) -> list[str]:
    """The n SASS lines with the most warp stall samples, with their share of all samples."""
    lines = [l for l in source_csv.splitlines() if l.startswith('"')]
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)   # after the kernel's name
    if start is None:
        return ["(no source page)"]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    col, src, addr = "Warp Stall Sampling (All Samples)", "Source", "Address"
    if not rows or col not in rows[0]:
        return [f"(columns: {', '.join(list(rows[0])[:12]) if rows else 'none'})"]
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(num(r[col]) for r in rows) or 1.0
    best = sorted(rows, key=lambda r: -num(r[col]))[:n]

    def why(r):
        top = sorted(reasons, key=lambda c: -num(r[c]))[:2]
        return " ".join(f"{c[6:]} {num(r[c]) / max(num(r[col]), 1):.0%}" for c in top if num(r[c]) > 0)
    return [f"  {num(r[col]) / total:6.1%}  {r[addr]:>6s}  {r[src].strip()[:60]:60s}  {why(r)}" for r in best]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    results, tops = {}, {}
    for case in sys.argv[2:] or DEFAULT:
        rep = out / f"{slug(case)}.ncu-rep"
        cmd = ["ncu", "--clock-control", "none", "--launch-skip", "1", "--launch-count", "1", "-f", "-o", str(rep),
               "--import-source", "no"]
        for s in SECTIONS:
            cmd += ["--section", s]
        cmd += ["--metrics", ",".join(stall_metrics() + METRICS)]
        kernels = "add_layernorm_backward_rows" if case.startswith("add_norm") else "(layernorm|rmsnorm|softmax)_rows"
        cmd += ["-k", f"regex:{kernels}", sys.executable, __file__, "--child", case]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        (out / f"{slug(case)}.log").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
        d = subprocess.run(["ncu", "-i", str(rep), "--csv", "--page", "details"], capture_output=True, text=True)
        (out / f"{slug(case)}.csv").write_text(d.stdout + "\n--- stderr\n" + d.stderr)
        s = subprocess.run(["ncu", "-i", str(rep), "--csv", "--page", "source", "--print-source", "sass"],
                           capture_output=True, text=True)
        (out / f"{slug(case)}.source.csv").write_text(s.stdout + "\n--- stderr\n" + s.stderr)
        vals = parse_details(d.stdout, name_width=40)
        plan = [l for l in p.stderr.splitlines() if l.startswith("plan ")]
        vals[("kernel", "plan")] = (plan[-1][5:] if plan else "?", "")
        results[case] = vals
        tops[case] = top_instructions(s.stdout)
        print(f"profiled {case}: {len(vals)} metrics (rc {p.returncode})", flush=True)
    keys = sorted(k for k in {k for v in results.values() for k in v}
                  if k[0] == "kernel" or any(t in k[1] for t in SHOWN))
    short = {c.replace("layernorm", "LN").replace("rmsnorm", "RMS"): v for c, v in results.items()}
    print("\n" + side_by_side(short, keys, 64, 22))
    for case, top in tops.items():
        print(f"\n{case}: SASS with the most stall samples")
        print("\n".join(top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
