"""Why the SGEMM stops at ~86 % of cuBLAS: Nsight Compute's warp states, issue activity and SM clock for tutorial 05's
step 7 (the default and the one-block 128x256 tiles) beside cuBLAS's own FP32 kernel, one launch each at 4096^3.

    PYTHONPATH=$PWD python3 tools/gpu/sgemm_stalls.py OUTDIR        # GPU machine, repo root; under 2 minutes

Writes OUTDIR/<name>.csv (ncu --page details --csv) and prints a table: SM frequency, issue slots busy, eligible
warps, and the stall reasons (cycles per issued instruction) that add up to the gap.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from ncu_details import parse_details, side_by_side, stall_metrics  # noqa: E402

SECTIONS = ("SpeedOfLight", "WarpStateStats", "SchedulerStats", "Occupancy", "LaunchStats", "InstructionStats",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")


def child(name: str) -> None:
    """Launch one kernel at 4096^3 twice (ncu profiles the second)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    n = 4096
    A, B = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    C = torch.empty(n, n, device="cuda")
    if name == "cublas":
        for _ in range(2):
            torch.mm(A, B, out=C)
    else:
        import re

        import kernellab
        from notebook_cells import cuda_cells_with_flags

        kernellab.set_isolation(False)
        d = {"default": {}, "w64x64_128x256": {"BN": 256, "BK": 8, "WM": 64, "WN": 64, "MIN_BLOCKS": 1}}[name]
        src = next(body for _, body in cuda_cells_with_flags("05-matmul.py") if "sgemm_warptile(" in body)
        k = kernellab.compile_cuda(src, arch="sm_90", options=tuple(f"-D{k}={v}" for k, v in d.items()),
                                   filename="sgemm_warptile.cu")["sgemm_warptile"]
        wm, wn = (d.get(w, int(re.search(rf"#define {w} (\d+)", src).group(1))) for w in ("WM", "WN"))
        bm, bn = d.get("BM", 128), d.get("BN", 128)
        for _ in range(2):
            k[(n // bn, n // bm), (bm // wm) * (bn // wn) * 32](A, B, C, n, n, n)
    torch.cuda.synchronize()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in (sys.argv[2:] or ("default", "w64x64_128x256", "cublas")):
        cmd = ["ncu", "--clock-control", "none", "--launch-skip", "1", "--launch-count", "1", "--csv",
               "--page", "details"]
        for s in SECTIONS:
            cmd += ["--section", s]
        cmd += ["--metrics", ",".join(stall_metrics() + ["sm__cycles_elapsed.avg.per_second",
                                                          "smsp__inst_executed_pipe_fma.sum", "smsp__inst_executed.sum"])]
        cmd += ["-k", "regex:sgemm_warptile" if name != "cublas" else "regex:(gemm|cutlass|xmma|sm90)"]
        cmd += [sys.executable, __file__, "--child", name]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
        (out / f"{name}.csv").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
        rows[name] = parse_details(p.stdout)
    print(side_by_side(rows, sorted({k for v in rows.values() for k in v}), 70, 18, section_width=24))
    return 0


if __name__ == "__main__":
    sys.exit(main())
