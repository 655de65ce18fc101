"""Tutorial 06's wgmma step (issue 13): the notebook's cell against the epilogue candidates in
tools/gpu/wgmma_variants (ping-pong consumer warpgroups; C through smem and TMA stores, now the cell's own epilogue, is
timed at its other settings), in one GPU call. Each is
checked against torch on awkward shapes (bf16, and fp16 on two of them), then timed in bf16 at 4096^3 and 8192^3
against torch.matmul (cuBLAS) in the same run. Prints one table; finishes in well under two minutes. A launch that
does not finish within 20 s (a wrong barrier phase hangs the GPU) is reported and ends the run with the table so far.

Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 tools/gpu/try_wgmma.py [--only LABEL_SUBSTRING ...]
"""
import argparse
import os
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

HERE = ROOT / "tools" / "gpu" / "wgmma_variants"
CELL = mb.cell_with(mb.cuda_cells("06-tensor-cores.py"), "wgmma_bf16").source
HELPERS_MARK = "// @cell-helpers:"


def cell_helpers(cell: str = CELL) -> str:
    """The cell's device helpers (mbarrier, TMA, wgmma, stores, stage release, tile order): what a candidate shares."""
    start = cell.index("// --- mbarrier: a shared-memory barrier")
    return cell[start:cell.index("template <typename T>\n__device__ void wgmma_gemm")].rstrip("\n") + "\n"


def variant_source(name: str) -> str:
    """tools/gpu/wgmma_variants/<name>.cu with its `// @cell-helpers:` line replaced by the cell's helpers."""
    lines = (HERE / f"{name}.cu").read_text().splitlines(keepends=True)
    return "".join(cell_helpers() if line.startswith(HELPERS_MARK) else line for line in lines)


SOURCES = {"wgmma": CELL, "pingpong": variant_source("pingpong")}

# (label, kernel family, -D options). The cell: 128 x 256 tiles, both consumers on one tile, 4 stages of 48 KiB,
# C through 64 x 64 smem boxes and TMA stores (EPI_BUFS per consumer). pingpong: each consumer its own
# WM x (16384 / WM) tile, alternating.
VARIANTS = [
    ("cell now (128x256, 4 st)", "wgmma", {}),
    ("pingpong 64x256 5 st", "pingpong", {}),
    ("pingpong 64x256 4 st", "pingpong", {"STAGES": 4}),
    ("pingpong 64x256 5 st unordered", "pingpong", {"ORDERED": 0}),
    ("pingpong 64x256 4 st TMA st", "pingpong", {"STAGES": 4, "TMA_STORE": 1}),
    ("pingpong 128x128 6 st", "pingpong", {"WM": 128, "STAGES": 6}),
    ("pingpong 128x128 5 st TMA st", "pingpong", {"WM": 128, "STAGES": 5, "TMA_STORE": 1}),
    # the tmastore candidate (C through smem boxes and TMA stores) is the cell since session 5: its other settings
    ("cell, 1 box", "wgmma", {"EPI_BUFS": 1}),
    ("cell, 3 st, 4 boxes (tile)", "wgmma", {"STAGES": 3, "EPI_BUFS": 4}),
]
CHECKS = [(4095, 4097, 1023), (2304, 2304, 264), (1000, 1000, 200), (255, 129, 200)]   # N odd: no TMA store
FP16_CHECKS = [(4095, 4097, 1023), (1000, 1000, 200)]
SIZES = [4096, 8192]
HANG_S = 20.0


def geometry(family, d):
    """(A box rows, B tile rows, C box rows, cluster, stages, dynamic smem bytes) of a configuration."""
    cm = d.get("CLUSTER_M", 2)
    if family == "pingpong":
        wm = d.get("WM", 64)
        st = d.get("STAGES", 5)
        smem = st * (wm + 16384 // wm) * 128 + (2 * d.get("EPI_BUFS", 2) * wm * 128 if d.get("TMA_STORE") else 0)
        return wm, 16384 // wm, wm, cm, st, smem + 16 * st + 1024
    st = d.get("STAGES", 4)
    smem = st * (128 + 256) * 128 + 2 * d.get("EPI_BUFS", 2) * 64 * 128       # the cell: stages + C staging
    return 128, 256, 64, cm, st, smem + 16 * st + 1024


def run_fn(kernel, family, d, sms):
    rows, cols, c_rows, cm, _, smem = geometry(family, d)
    cache = {}

    def run(A, B, C):
        M, N, K = A.shape[0], B.shape[0], A.shape[1]
        if K % 8:                                           # 16-byte rows for TMA, as the notebook's launcher pads
            A = torch.nn.functional.pad(A, (0, -K % 8))
            B = torch.nn.functional.pad(B, (0, -K % 8))
            K += -K % 8
        key = (A.data_ptr(), B.data_ptr(), C.data_ptr(), tuple(A.shape), tuple(B.shape), tuple(C.shape))
        if key not in cache:
            cache.clear()
            tmA = kernellab.tensor_map(A, (rows, 64), swizzle="128B")
            tmB = kernellab.tensor_map(B, (cols // cm, 64), swizzle="128B")
            if family == "wgmma":                           # the cell (tmastore's epilogue since session 5):
                by_tma = N % 8 == 0 and C.data_ptr() % 16 == 0      # (tmA, tmB, tmC, C, M, N, K)
                cache[key] = ((tmA, tmB, kernellab.tensor_map(C, (c_rows, 64), swizzle="128B") if by_tma else tmA),
                              ())
            else:                                           # (tmA, tmB, tmC, C, M, N, K, c_by_tma)
                by_tma = N % 8 == 0 and C.data_ptr() % 16 == 0      # C's rows 16-byte multiples: a map exists
                tmC = kernellab.tensor_map(C, (c_rows, 64), swizzle="128B") if by_tma else tmA   # else unused
                cache[key] = ((tmA, tmB, tmC), (int(by_tma),))
        maps, flag = cache[key]
        grid = cm * min(mb.cdiv(mb.cdiv(M, rows), cm) * mb.cdiv(N, cols), sms // cm)   # persistent, whole clusters
        kernel.launch(grid, 384, *maps, C, M, N, K, *flag, shared_bytes=smem, cluster=(cm, 1, 1), sync=False)
        return C
    return run


def finish(what, rows, torch_ms, dev, t0):
    """Wait for the GPU, at most HANG_S; on a hang print the table so far and leave (the driver ends the kernel)."""
    ev = torch.cuda.Event()
    ev.record()
    start = time.time()
    while not ev.query():
        if time.time() - start > HANG_S:
            print(f"HANG: {what} did not finish within {HANG_S:.0f} s; the table so far:", flush=True)
            table(rows, torch_ms, dev, t0)
            os._exit(2)
        time.sleep(0.001)


def check(run, dtype, shapes, rows, torch_ms, dev, t0, label):
    """Max error relative to |ref| + rms(ref) over shapes, or a string saying what failed."""
    g = torch.Generator(device="cuda").manual_seed(1)
    worst = 0.0
    for M, N, K in shapes:
        A = torch.randn(M, K, generator=g, device="cuda").to(dtype)
        B = torch.randn(N, K, generator=g, device="cuda").to(dtype)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        run(A, B, C)
        finish(f"{label} at {M}x{N}x{K}", rows, torch_ms, dev, t0)
        err = gemm_error(C, A, B, dtype)
        if isinstance(err, str):
            return err
        worst = max(worst, err)
    return worst


def table(rows, torch_ms, dev, t0):
    print_gemm_table(f"wgmma epilogue candidates, bf16, C = A B^T (both K-major), {dev}", rows, torch_ms, SIZES,
                     "smem KiB")
    print(f"(regs: the compile's static count; setmaxnreg gives the consumers 232 at run time. Checked on "
          f"{', '.join(f'{m}x{n}x{k}' for m, n, k in CHECKS)} in bf16 and {len(FP16_CHECKS)} of them in fp16; "
          f"total {time.time() - t0:.0f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="run the variants whose label holds one of these")
    opts = ap.parse_args()
    t0 = time.time()
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"the wgmma kernels need sm_90 (H100/H200); this is {dev}")
        return 1
    inputs = {}
    for n in SIZES:
        g = torch.Generator(device="cuda").manual_seed(0)
        inputs[n] = (torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                     torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                     torch.empty(n, n, device="cuda", dtype=torch.bfloat16))
    torch_ms = {n: time_ms(lambda A, B, C: torch.matmul(A, B.T, out=C), inputs[n]) for n in SIZES}
    rows = []
    for label, family, d in VARIANTS:
        if opts.only and not any(s in label for s in opts.only):
            continue
        smem = f"{geometry(family, d)[5] / 1024:.1f}"
        try:
            module = kernellab.compile_cuda(SOURCES[family], arch="sm_90a",
                                            options=tuple(f"-D{k}={v}" for k, v in d.items()))
            kb, kh = module[f"{family}_bf16"], module[f"{family}_f16"]
            regs = kb.resources.registers
            ok = check(run_fn(kb, family, d, sms), torch.bfloat16, CHECKS, rows, torch_ms, dev, t0, label)
            if not isinstance(ok, str):
                ok16 = check(run_fn(kh, family, d, sms), torch.float16, FP16_CHECKS, rows, torch_ms, dev, t0, label)
                ok = ok16 if isinstance(ok16, str) else max(ok, ok16)
        except Exception as exc:  # noqa: BLE001 - one row per variant, whatever happens
            rows.append((label, "-", smem, f"FAILED: {type(exc).__name__}: {str(exc)[:160]}", {}))
            continue
        times = {}
        if not isinstance(ok, str):
            try:
                for n in SIZES:
                    if time.time() - t0 > 100:                  # stay under two minutes
                        break
                    run = run_fn(kb, family, d, sms)
                    run(*inputs[n])
                    finish(f"{label} at {n}^3", rows, torch_ms, dev, t0)
                    times[n] = time_ms(run, inputs[n])
            except Exception as exc:  # noqa: BLE001
                ok = f"FAILED timing: {type(exc).__name__}: {str(exc)[:160]}"
        rows.append((label, regs, smem, ok if isinstance(ok, str) else f"ok {ok:.1e}", times))
        print(f"[{time.time() - t0:5.1f} s] {label}: {regs} regs, {smem} KiB, {rows[-1][3]}, "
              + ", ".join(f"{n}: {ms:.3f} ms" for n, ms in times.items()), flush=True)
    table(rows, torch_ms, dev, t0)
    if not opts.only and time.time() - t0 < 95:
        fit_cell(rows, torch_ms, dev, t0, sms)
    return 0


FIT_SIZES = [2048, 3072, 4096, 6144, 8192]


def fit_cell(rows, torch_ms, dev, t0, sms):
    """The cell at five sizes, fitted as t = F + r (n / 64) s + r e (r: tiles per CTA, n / 64: k-slices per tile):
    F a per-launch cost, s the time of a k-slice, e a per-tile cost (epilogue, tile start). Two sizes cannot tell F
    from e; five can. Where e is most of the gap, overlapping the epilogue is the fix; where F is, it is not."""
    _, family, d = VARIANTS[0]
    kb = kernellab.compile_cuda(SOURCES[family], arch="sm_90a")[f"{family}_bf16"]
    run = run_fn(kb, family, d, sms)
    pts = []
    for n in FIT_SIZES:
        g = torch.Generator(device="cuda").manual_seed(0)
        args = (torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                torch.randn(n, n, generator=g, device="cuda").to(torch.bfloat16),
                torch.empty(n, n, device="cuda", dtype=torch.bfloat16))
        run(*args)
        finish(f"the cell at {n}^3", rows, torch_ms, dev, t0)
        ms, tms = time_ms(run, args), time_ms(lambda A, B, C: torch.matmul(A, B.T, out=C), args)
        cluster_tiles = mb.cdiv(mb.cdiv(n, 128), 2) * mb.cdiv(n, 256)
        r = mb.cdiv(cluster_tiles, min(cluster_tiles, sms // 2))
        pts.append((n, r, ms, tms))
    X = torch.tensor([[1.0, r * n / 64, r] for n, r, _, _ in pts], dtype=torch.float64)
    y = torch.tensor([ms for _, _, ms, _ in pts], dtype=torch.float64)
    F, s, e = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1).tolist()
    print("\nthe cell across sizes (bf16), fitted as t = F + r (n/64) s + r e:")
    print(f"{'n':>5s} {'tiles/CTA':>9s} {'cell ms':>8s} {'torch ms':>8s} {'% torch':>7s} {'fit ms':>7s}")
    for n, r, ms, tms in pts:
        print(f"{n:5d} {r:9d} {ms:8.3f} {tms:8.3f} {tms / ms:7.1%} {F + r * n / 64 * s + r * e:7.3f}")
    print(f"F = {F * 1e3:.1f} us per launch, s = {s * 1e3:.3f} us per k-slice, e = {e * 1e3:.1f} us per tile "
          f"(= {e / s:.1f} k-slices); at 4096^3 the tiles' e is {4 * e / pts[2][2]:.1%} of the time, F "
          f"{F / pts[2][2]:.1%} (total {time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
