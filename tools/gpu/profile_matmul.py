"""Nsight Compute on the matmul ladder's last steps at 4096^3 (one launch each, `--set full`): what limits them.

Usage on the GPU machine (repo root): python3 tools/gpu/profile_matmul.py OUTDIR [variant label ...]
Writes OUTDIR/<label>.txt (the ProfileResult's text) and prints a short table of the headline metrics.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import torch  # noqa: E402

import matmul as mb  # noqa: E402

WANT = {"sgemm_warptile", "mma_pipe", "wgmma", "wgmma [no cluster]"}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    want = set(sys.argv[2:]) or WANT
    cells = {"sgemm": mb.cuda_cells("05-matmul.py")}
    cells["tc"] = cells["hopper"] = mb.cuda_cells("06-tensor-cores.py")
    runner = mb.Runner(type("A", (), {"quick": False})(), torch)
    variants = mb.sgemm_variants(False) + mb.tc_variants(False) + mb.hopper_variants(False, 132)
    n = 4096
    for v in variants:
        if v.label not in want:
            continue
        cell = mb.cell_with(cells[v.family], next(iter(v.kernels.values())))
        module = runner.compile(v, cell)
        dtype_name = "fp32" if v.family == "sgemm" else "bf16"
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        A, B, C = mb.inputs(v.family, dtype, n, n, n)(torch.Generator(device="cuda").manual_seed(0))
        kernel = module[v.kernels[dtype_name]]
        if v.family == "sgemm":
            args = (A, B, C, n, n, n)
        elif v.tensor_maps:
            import kernellab
            args = (kernellab.tensor_map(A, v.tensor_maps[0], swizzle="128B"),
                    kernellab.tensor_map(B, v.tensor_maps[1], swizzle="128B"), C, n, n, n)
        else:
            args = (A, B, C, n, n, n)
        kw = {"cluster": v.cluster} if v.cluster else {}
        try:
            prof = kernel.profile(v.grid(n, n), v.block, *args, shared_bytes=v.smem, full=True, **kw)
            text = str(prof)
        except Exception as exc:  # noqa: BLE001 - a report per variant, whatever happens
            text = f"profile failed: {type(exc).__name__}: {exc}"
        (out / f"{v.label.replace(' ', '_').replace('[', '').replace(']', '')}.txt").write_text(text)
        print(f"==== {v.label}\n{text[:3000]}\n", flush=True)


if __name__ == "__main__":
    main()
