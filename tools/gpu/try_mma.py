"""Tutorial 06's mma_pipe step (issue 13) in one GPU call: the cell before the rewrite, the notebook's cell now and its
-D variants, each checked against torch on awkward shapes and then timed in bf16 at 4096^3 and 8192^3 against
torch.matmul (cuBLAS) in the same run. Prints one table; finishes in well under two minutes.

Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 tools/gpu/try_mma.py [--only LABEL_SUBSTRING ...]
"""
import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))      # trylib

import torch  # noqa: E402

from trylib import gemm_error, print_gemm_table, time_ms  # noqa: E402

import kernellab  # noqa: E402
import matmul as mb  # noqa: E402

HEAD = (ROOT / "tools" / "gpu" / "mma_variants" / "mma_pipe_head.cu").read_text()
NOW = mb.cell_with(mb.cuda_cells("06-tensor-cores.py"), "mma_pipe_bf16").source

# (label, source, -D options); the tile defaults are the cell's: BM 128, BN 256, BK 32, STAGES 4, 2 x 4 warps.
VARIANTS = [
    ("before (HEAD cell)", HEAD, {}),
    ("now: 128x256 BK=32 4 st", NOW, {}),
    ("now: BK=64 3 st", NOW, {"BK": 64, "STAGES": 3}),
    ("now: BK=64 4 st", NOW, {"BK": 64, "STAGES": 4}),
    ("now: 3 st", NOW, {"STAGES": 3}),
    ("now: 256x128 4x2 warps", NOW, {"BM": 256, "BN": 128, "WARPS_M": 4, "WARPS_N": 2}),
    ("now: 128x128 2x2 (2 blk/SM)", NOW, {"BN": 128, "WARPS_N": 2}),
    ("now: 128x128 BK=64 3 st", NOW, {"BN": 128, "WARPS_N": 2, "BK": 64, "STAGES": 3}),
]
CHECKS = [(4095, 4097, 1023), (130, 270, 40), (255, 129, 200)]
SIZES = [4096, 8192]


def geometry(d):
    """(BM, BN, threads, dynamic smem bytes) of a -D configuration."""
    bm, bn, bk, st = d.get("BM", 128), d.get("BN", 256), d.get("BK", 32), d.get("STAGES", 4)
    return bm, bn, d.get("WARPS_M", 2) * d.get("WARPS_N", 4) * 32, st * (bm + bn) * bk * 2


def loop_instructions_per_hmma(kernel):
    """Static instructions per HMMA in the SASS loop with the most HMMAs (the interior main loop), or None. (The
    cell before the rewrite has copy loops inside its main loop, so its static figure is not what it executes.)"""
    try:
        rows = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in re.finditer(
            r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[^;]*?(?:0x([0-9a-f]+))?\s*;", kernel.sass)]
        best = None
        for addr, op, target in rows:
            if op == "BRA" and target and int(target, 16) < addr:
                body = [o for a, o, _ in rows if int(target, 16) <= a <= addr]
                hmma = body.count("HMMA")
                if hmma and (best is None or (hmma, -len(body)) > (best[0], -best[1])):
                    best = (hmma, len(body))           # the unguarded copy is the shorter of two equal loops
        return best[1] / best[0] if best else None
    except Exception:  # noqa: BLE001 - a column, not a failure
        return None


def run_fn(kernel, d):
    bm, bn, threads, smem = geometry(d)

    def run(A, B, C):
        M, N, K = A.shape[0], B.shape[0], A.shape[1]
        if K % 8:                                           # 16-byte rows, as the notebook's launcher pads
            A = torch.nn.functional.pad(A, (0, -K % 8))
            B = torch.nn.functional.pad(B, (0, -K % 8))
            K += -K % 8
        kernel.launch((mb.cdiv(N, bn), mb.cdiv(M, bm)), threads, A, B, C, M, N, K, shared_bytes=smem, sync=False)
        return C
    return run


def check(run, dtype):
    """Max error relative to |ref| + rms(ref) over CHECKS, or a string saying what failed."""
    g = torch.Generator(device="cuda").manual_seed(1)
    worst = 0.0
    for M, N, K in CHECKS:
        A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
        B = torch.randn(N, K, generator=g, device="cuda").to(dtype)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        run(A, B, C)
        torch.cuda.synchronize()
        err = gemm_error(C, A, B, dtype)
        if isinstance(err, str):
            return err
        worst = max(worst, err)
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="run the variants whose label holds one of these")
    opts = ap.parse_args()
    t0 = time.time()
    dev = torch.cuda.get_device_name()
    inputs = {}
    for n in SIZES:
        g = torch.Generator(device="cuda").manual_seed(0)
        inputs[n] = (torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                     torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                     torch.empty(n, n, device="cuda", dtype=torch.bfloat16))
    torch_ms = {n: time_ms(lambda A, B, C: torch.matmul(A, B.T, out=C), inputs[n]) for n in SIZES}
    rows = []
    for label, source, d in VARIANTS:
        if opts.only and not any(s in label for s in opts.only):
            continue
        try:
            module = kernellab.compile_cuda(source, arch="sm_90", options=tuple(f"-D{k}={v}" for k, v in d.items()))
            kb = module["mma_pipe_bf16"]
            regs, ratio = kb.resources.registers, loop_instructions_per_hmma(kb)
            ok = check(run_fn(kb, d), torch.bfloat16)
            if label.startswith("now: 128x256"):                # the notebook's default, in fp16 as well
                ok16 = check(run_fn(module["mma_pipe_f16"], d), torch.float16)
                ok = ok16 if isinstance(ok16, str) else max(ok, ok16)
        except Exception as exc:  # noqa: BLE001 - one row per variant, whatever happens
            rows.append((label, "-", "-", f"FAILED: {type(exc).__name__}: {str(exc)[:120]}", {}))
            continue
        times = {}
        if not isinstance(ok, str):
            try:
                for n in SIZES:
                    if time.time() - t0 > 100:                  # stay under two minutes
                        break
                    times[n] = time_ms(run_fn(kb, d), inputs[n])
            except Exception as exc:  # noqa: BLE001
                ok = f"FAILED timing: {type(exc).__name__}: {str(exc)[:120]}"
        rows.append((label, regs, f"{ratio:.2f}" if ratio else "?", ok if isinstance(ok, str) else f"ok {ok:.1e}",
                     times))
        print(f"[{time.time() - t0:5.1f} s] {label}: {regs} regs, {rows[-1][3]}, "
              + ", ".join(f"{n}: {ms:.3f} ms" for n, ms in times.items()), flush=True)

    print_gemm_table(f"mma_pipe variants, bf16, C = A B^T (both K-major), {dev}", rows, torch_ms, SIZES,
                     "instr/HMMA")
    print(f"(loop instr/HMMA: the SASS of the interior main loop; total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
