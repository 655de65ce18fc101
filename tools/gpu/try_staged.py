"""Candidate norm_staged (tools/gpu/norm_variants/norm_staged.cu): LayerNorm / RMSNorm rows brought into shared
memory by cp.async.bulk, STAGES rows a persistent block, against tutorial 04's cell, torch.compile and torch's copy,
under kernellab.bench's write flush and its read-only flush (flush_l2="clean"). Each variant is checked first
against F.layer_norm / F.rms_norm in float64 (shapes with a mean of 0 and of 1e4, rows not a multiple of the grid).

    PYTHONPATH=$PWD python3 tools/gpu/try_staged.py           # GPU machine, repo root; about two minutes
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
SOURCE = ROOT / "tools" / "gpu" / "norm_variants" / "norm_staged.cu"
EPS = 1e-5
VPT = 4
STAGES = {"bfloat16": (2, 3, 4), "float32": (2, 3)}


def staged_launcher(module, kind, dtype, stages, ctype):
    """fn(x, w, b, y) launching norm_staged for x's shape: blocks of cols / (4 packs) threads, as many as the GPU
    holds at once (the driver's count), at most one per row."""
    ln = "true" if kind == "layernorm" else "false"
    k = module[f"norm_staged<{ctype}, {VPT}, {stages}, {ln}>"]
    fit = {}

    def launch(x, w, b, y):
        rows, cols = x.shape
        vec = 16 // x.element_size()
        threads = cols // (vec * VPT)
        assert cols % (vec * VPT) == 0 and threads % 32 == 0 and threads <= 1024, f"norm_staged cannot take {cols}"
        smem = stages * cols * x.element_size()
        if cols not in fit:
            fit[cols] = k.max_active_clusters(threads, (1, 1, 1), smem)
        k[min(rows, fit[cols]), threads, smem](x, w, b, y, rows, cols, EPS)
        return y
    return launch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rep-ms", type=float, default=25.0)
    ap.add_argument("--shapes", default="bfloat16 4096x4096,bfloat16 4096x1024,float32 4096x4096,bfloat16 4096x8192,"
                                        "float32 4096x1024")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import kernellab
    from notebook_cells import load_tutorial, named_cuda_cells
    from small_rows import make_inputs, time_flushes
    from trylib import copy_ceiling

    t04 = load_tutorial("04-layernorm.py")
    cell = named_cuda_cells("04-layernorm.py")["norm_kernels"]
    module = kernellab.compile_cuda(cell + SOURCE.read_text(), first_line=2, filename="cell.cu")
    copy_gbps, device = copy_ceiling(False)
    ctypes = t04["CTYPE"]
    ln_ref = lambda x, w, b: F.layer_norm(x.double(), (x.shape[1],), w.double(), b.double(), EPS)  # noqa: E731
    rms_ref = lambda x, w: F.rms_norm(x.double(), (x.shape[1],), w.double(), EPS)  # noqa: E731

    # check every variant: aligned shapes it takes, a mean of 0 and of 1e4, more rows than blocks
    checks = []
    for dname, stages in STAGES.items():
        dtype = getattr(torch, dname)
        for rows, cols, mean in ((4096, 4096, 0.0), (1000, 1024, 1e4), (300, 2048, 0.0), (5000, 1024, 0.0)):
            g = torch.Generator().manual_seed(rows + cols)
            x = (mean + 2 * torch.randn(rows, cols, generator=g)).to(dtype).cuda()
            w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype).cuda()
            b = torch.randn(cols, generator=g).to(dtype).cuda()
            refs = {"layernorm": ln_ref(x, w, b), "rmsnorm": rms_ref(x, w)}
            error = lambda y, kind: ((y.double() - refs[kind]).abs() / (1 + refs[kind].abs())).max().item()  # noqa
            cell_err = {"layernorm": error(t04["layernorm"](x, w, b, None, EPS), "layernorm"),
                        "rmsnorm": error(t04["rmsnorm"](x, w, None, EPS), "rmsnorm")}
            for s in stages:
                for kind in refs:
                    y = torch.full_like(x, float("nan"))
                    staged_launcher(module, kind, dtype, s, ctypes[dtype])(x, w, b, y)
                    torch.cuda.synchronize()
                    err = error(y, kind)          # float32 at a mean of 1e4: the input's own rounding, as the cell's
                    ok = err == err and err <= max(2e-2 if dtype == torch.bfloat16 else 1e-4, 1.5 * cell_err[kind])
                    checks.append(ok)
                    print(f"check {kind} {dname} {rows}x{cols} mean {mean:g} stages {s}: err {err:.2e} (cell "
                          f"{cell_err[kind]:.2e}) {'ok' if ok else 'WRONG'}", flush=True)
    if not all(checks):
        print("a variant failed its check: no timing")
        return 1

    table = []
    for case in args.shapes.split(","):
        dname, shape = case.split()
        rows, cols = map(int, shape.split("x"))
        dtype = getattr(torch, dname)
        a = make_inputs(rows, cols, dtype)(torch.Generator().manual_seed(rows * 7 + cols))
        rms, ln = t04["rmsnorm"], t04["layernorm"]
        fns = {"copy-op": lambda x, w, b, y: y.copy_(x),
               "ln cell": lambda x, w, b, y: ln(x, w, b, y, EPS),
               "rms cell": lambda x, w, b, y: rms(x, w, y, EPS)}
        for s in STAGES[dname]:
            fns[f"ln staged {s}"] = staged_launcher(module, "layernorm", dtype, s, ctypes[dtype])
            fns[f"rms staged {s}"] = staged_launcher(module, "rmsnorm", dtype, s, ctypes[dtype])
        rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, EPS), dynamic=False)
        ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, EPS), dynamic=False)
        fns["ln compile"] = lambda x, w, b, y: ln_c(x, w, b)
        fns["rms compile"] = lambda x, w, b, y: rms_c(x, w)
        nbytes = 2 * rows * cols * dtype.itemsize
        us = time_flushes(fns, a, nbytes, args.rep_ms)
        for name in fns:
            line = f"{dname:8s} {shape:>10s} {name:16s}"
            for flush in us:
                t = us[flush][name]
                kind = "ln" if name.startswith("ln") else "rms"
                line += (f" | {t:8.2f} {nbytes / (t * 1e-6) / 1e9 / copy_gbps:5.0%} {us[flush]['copy-op'] / t:6.3f}"
                         f" {us[flush][kind + ' compile'] / t:6.3f}")
            table.append(line)
        table.append("")
        print(f"done {case}", flush=True)
    print(f"\n== table: {device}; bytes = x read + y written; vs copy-op and vs torch.compile (>1: faster); "
          "write flush | read flush")
    print(f"{'dtype':8s} {'shape':>10s} {'kernel':16s}" + f" | {'µs':>8s} {'copy':>5s} {'v copy':>6s} {'v comp':>6s}" * 2)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
