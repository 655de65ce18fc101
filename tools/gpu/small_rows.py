"""Issue 14's last torch.compile miss (RMSNorm bf16 4096 x 1024, 0.95-0.97x) and the small shapes' floor: what a copy
of the same bytes reaches under kernellab.bench's flush, which launch geometries and cache qualifiers move it
(tools/gpu/norm_variants/copy_probe.cu), tutorial 04's kernels and Inductor's beside them in one bench (alternating
rounds), Inductor's chosen configs, and, with --ncu, each kernel's DRAM bytes once after a flush (Nsight Compute,
no cache control of its own: the L2 as bench leaves it).

    PYTHONPATH=$PWD python3 tools/gpu/small_rows.py                     # GPU machine, repo root; about a minute
    ncu --nvtx --nvtx-include "probe/" --cache-control none --csv --log-file ncu.csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread \\
        python3 tools/gpu/small_rows.py --ncu > ncu.log       # then: small_rows.py --read-ncu ncu.csv --order ncu.log

Bytes counted: x read and y written (2 * rows * cols * 2 for bf16); w and b are left out, as for the copy.
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
PROBE = ROOT / "tools" / "gpu" / "norm_variants" / "copy_probe.cu"
EPS = 1e-5
LQ = {0: "ld", 1: "ld.nc.na", 2: "ld.nc.na+L2ef", 3: "ld.cs"}
SQ = {0: "st", 1: "st.cs", 2: "st+L2ef", 3: "st+L2el"}


STORE_HINT = """
// y's packs stored under an L2 policy (small_rows.py's variants of the cell): QUALIFIER picks it
template <typename T>
__device__ __forceinline__ void store_hint(Pack<T>* p, Pack<T> v) {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::POLICY.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                 :: "l"(p), "r"(v.u[0]), "r"(v.u[1]), "r"(v.u[2]), "r"(v.u[3]), "l"(policy) : "memory");
}
"""
STORES = {"        yp[j * stride] = from_floats<T>(out);\n": 2,
          "        *reinterpret_cast<Pack<T>*>(row + L.lead + q * VEC) = from_floats<T>(out);\n": 2}


def store_variant(cell: str, policy: str) -> str:
    """Tutorial 04's cell with every 16-byte store of y under an L2 policy (evict_last, evict_first)."""
    anchor = "// Where a row's elements are."
    assert cell.count(anchor) == 1, "norm_kernels changed: update store_variant"
    out = cell.replace(anchor, STORE_HINT.replace("POLICY", policy) + anchor)
    for text, count in STORES.items():
        assert out.count(text) == count, f"norm_kernels changed: {text.strip()} x {out.count(text)}"
        lhs, rhs = text.strip().rstrip(";").split(" = ")
        ptr = lhs[1:] if lhs.startswith("*") else "&" + lhs
        out = out.replace(text, text[:len(text) - len(text.lstrip())] + f"store_hint({ptr}, {rhs});\n")
    return out


def functions(rows, cols, dtype, t04, probe, hinted, sms):
    """name -> fn(x, w, b, y) for one shape: copies, probes, the tutorial's kernels (and the cell with y stored
    under an L2 policy, `hinted`: policy -> module), torch eager and compiled."""
    import torch
    import torch.nn.functional as F

    n_packs = rows * cols * dtype.itemsize // 16
    fns = {"copy-op": lambda x, w, b, y: y.copy_(x),
           "copy-op, fresh y": lambda x, w, b, y: torch.empty_like(x).copy_(x)}

    def probe_fn(p, block, lq, sq, grid=None):
        k = probe[f"copy_probe<{p}, {lq}, {sq}>"]
        g = grid or -(-n_packs // (p * block))
        return lambda x, w, b, y: k[g, block](x, y, n_packs)

    small = rows * cols <= 4096 * 1024
    for p in (1, 2, 4, 8) if small else (4,):
        for block in (128, 256, 512) if small else (128,):
            fns[f"probe P{p} B{block}"] = probe_fn(p, block, 0, 0)
    pairs = ((1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3), (2, 1), (2, 2), (3, 1)) if small else ((0, 3), (0, 1))
    for lq, sq in pairs:
        fns[f"probe P4 B128 {LQ[lq]} {SQ[sq]}"] = probe_fn(4, 128, lq, sq)
    if small:
        fns["probe P4 B256 grid 8/SM"] = probe_fn(4, 256, 0, 0, sms * 8)
        fns["probe P2 B512 grid 4/SM"] = probe_fn(2, 512, 0, 0, sms * 4)
    rms, ln, plan_rows = t04["rmsnorm"], t04["layernorm"], t04["plan_rows"]
    fns["rms cell"] = lambda x, w, b, y: rms(x, w, y, EPS)
    fns["rms cell, fresh y"] = lambda x, w, b, y: rms(x, w, None, EPS)
    fns["ln cell"] = lambda x, w, b, y: ln(x, w, b, y, EPS)
    plan = plan_rows(rows, cols, dtype.itemsize, sms)
    ctype = t04["CTYPE"][dtype]
    for policy, module in hinted.items():
        def launch(kind, module=module):
            if plan.cluster > 1:
                k = module[f"{kind}_rows_cluster<{ctype}, {plan.cluster}, {plan.vpt}>"]
                return lambda *a: k[plan.grid, plan.block](*a, rows, cols, EPS)
            k = module[f"{kind}_rows<{ctype}, {plan.vpt}>"]
            return lambda *a: k[plan.grid, plan.block](*a, rows, cols, plan.row_threads, EPS)
        r, l_ = launch("rmsnorm"), launch("layernorm")
        fns[f"rms cell, y {policy}"] = lambda x, w, b, y, r=r: r(x, w, y)
        fns[f"ln cell, y {policy}"] = lambda x, w, b, y, l_=l_: l_(x, w, b, y)
    if plan.cluster == 1 and plan.row_threads == 32:          # a warp per row: blocks of one warp, as Inductor's
        k = t04["norm_kernels"][f"rmsnorm_rows<{ctype}, {plan.vpt}>"]
        fns["rms cell, 1-warp blocks"] = lambda x, w, b, y: k[rows, 32](x, w, y, rows, cols, 32, EPS)
        k2 = t04["norm_kernels"][f"layernorm_rows<{ctype}, {plan.vpt}>"]
        fns["ln cell, 1-warp blocks"] = lambda x, w, b, y: k2[rows, 32](x, w, b, y, rows, cols, 32, EPS)
    rms_c = torch.compile(lambda x, w: F.rms_norm(x, (cols,), w, EPS), dynamic=False)
    ln_c = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, EPS), dynamic=False)
    fns["rms compile"] = lambda x, w, b, y: rms_c(x, w)
    fns["ln compile"] = lambda x, w, b, y: ln_c(x, w, b)
    fns["rms eager"] = lambda x, w, b, y: F.rms_norm(x, (cols,), w, EPS)
    return fns


def make_inputs(rows, cols, dtype):
    import torch

    def make(g):
        x = (2 * torch.randn(rows, cols, generator=g)).to(dtype).cuda()
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype).cuda()
        b = torch.randn(cols, generator=g).to(dtype).cuda()
        return x, w, b, torch.empty_like(x)
    return make


def time_flushes(fns, a, nbytes, rep_ms, flushes=("write", "read")):
    """{flush: {name: µs}}: every function of `fns` (name -> fn(*a)) in one kernellab.bench per flush, "write" (bench's
    default) or "read" (flush_l2="clean": the L2 holds clean lines), in alternating rounds."""
    import kernellab
    from kernellab.run.measure.bench import CudaClock

    first, *others = fns
    us = {}
    for flush in flushes:
        clock = CudaClock(flush_l2="clean" if flush == "read" else "write")
        res = kernellab.bench(fns[first], a, bytes=nbytes, name=first, warmup_ms=5, rep_ms=rep_ms, max_reps=2000,
                              baselines={n: fns[n] for n in others}, timer=clock)
        us[flush] = {res.name: res.median_ms * 1e3, **{r.name: r.median_ms * 1e3 for r in res.baselines}}
    return us


def read_ncu(path, order=None):
    """The --ncu run's Nsight Compute CSV as a table: per function (three calls each, in the order the run's log
    names them, `order`), the mean µs and DRAM MB read and written, and the kernel's registers and launch."""
    per_id = {}
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for rec in csv.DictReader(lines):
        m = per_id.setdefault(int(rec["ID"]), {"kernel": rec["Kernel Name"].split("(")[0]})
        m[rec["Metric Name"]] = (rec["Metric Value"].replace(",", ""), rec["Metric Unit"])
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3, "B": 1e-6, "byte": 1e-6,
             "KB": 1e-3, "Kbyte": 1e-3, "MB": 1, "Mbyte": 1, "GB": 1e3, "Gbyte": 1e3}

    def num(m, metric):
        v, unit = m.get(metric, ("nan", ""))
        return float(v) * scale.get(unit, 1)
    names = []
    if order:
        names = [ln.split(": ", 1)[1].strip() for ln in open(order) if ln.startswith("ncu order")]
    ids = sorted(per_id)
    out = [f"{'function':36s} {'kernel':40s} {'µs':>6s} {'rd MB':>6s} {'wr MB':>6s} {'regs':>4s} {'grid x block':>13s}"]
    for g in range(0, len(ids), 3):
        group = [per_id[i] for i in ids[g:g + 3]]
        mean = lambda metric: sum(num(m, metric) for m in group) / len(group)  # noqa: E731
        first = group[0]
        name = names[g // 3] if g // 3 < len(names) else "?"
        launch = f"{first.get('launch__grid_size', ('?',))[0]} x {first.get('launch__block_size', ('?',))[0]}"
        out.append(f"{name:36s} {first['kernel'][:40]:40s} {mean('gpu__time_duration.sum'):6.2f} "
                   f"{mean('dram__bytes_read.sum'):6.2f} {mean('dram__bytes_write.sum'):6.2f} "
                   f"{first.get('launch__registers_per_thread', ('?',))[0]:>4s} {launch:>13s}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ncu", action="store_true", help="each kernel once after a flush, in NVTX ranges 'probe'")
    ap.add_argument("--read-ncu", metavar="CSV", help="print the --ncu run's table from Nsight Compute's CSV")
    ap.add_argument("--order", metavar="LOG", help="with --read-ncu: the --ncu run's log, which names the functions")
    ap.add_argument("--rep-ms", type=float, default=20.0)
    ap.add_argument("--shapes", default="4096x1024,4096x4096,4096x32768")
    ap.add_argument("--flush", default="write,read", help="bench's write flush, and/or a flush that reads "
                    "(bench's flush_l2=\"clean\": untimed write-back of the dirty lines, the L2 then holds clean lines)")
    args = ap.parse_args(argv)
    if args.read_ncu:
        print(read_ncu(args.read_ncu, args.order))
        return
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(pathlib.Path(os.environ.get("OUT", "/tmp")) / "inductor"))
    import torch

    import kernellab
    from kernellab.run.measure.bench import CudaClock
    from notebook_cells import load_tutorial, named_cuda_cells
    from trylib import copy_ceiling

    t04 = load_tutorial("04-layernorm.py")
    probe = kernellab.compile_cuda(PROBE.read_text(), filename="copy_probe.cu")
    cell = named_cuda_cells("04-layernorm.py")["norm_kernels"]
    hinted = {policy: kernellab.compile_cuda(store_variant(cell, policy), first_line=2, filename="cell.cu")
              for policy in ("evict_last", "evict_first")}
    copy_gbps, device = copy_ceiling(False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dtype = torch.bfloat16
    summary = []
    for shape in args.shapes.split(","):
        rows, cols = map(int, shape.split("x"))
        fns = functions(rows, cols, dtype, t04, probe, hinted, sms)
        a = make_inputs(rows, cols, dtype)(torch.Generator().manual_seed(rows + cols))
        x, w, b, y = a
        refs = {"probe": x.clone(), "rms cell": t04["rmsnorm"](x, w, None, EPS),
                "ln cell": t04["layernorm"](x, w, b, None, EPS)}
        for name, f in fns.items():                       # first calls: compile, autotune, and check the variants
            f(*a)                                         # (bit for bit against the copy and the cells)
            kind = next((k for k in refs if name.startswith(k)), None)
            if kind and "fresh" not in name:
                torch.cuda.synchronize()
                assert torch.equal(y, refs[kind]), f"{name} differs from {kind}"
                y.zero_()
        torch.cuda.synchronize()
        nbytes = 2 * rows * cols * dtype.itemsize
        if args.ncu:
            clock = CudaClock()
            for name, f in fns.items():
                if "fresh" in name or name in ("rms eager", "copy-op"):   # copy-op: cudaMemcpyAsync, no kernel
                    continue
                for _ in range(3):
                    clock.flush()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_push("probe")
                    f(*a)
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
                print(f"ncu order {shape}: {name}", flush=True)
            continue
        us = time_flushes(fns, a, nbytes, args.rep_ms, args.flush.split(","))
        for name in fns:
            line = f"{shape:>10s} {name:36s}"
            for flush in us:
                t = us[flush][name]
                line += f" | {t:8.2f} {nbytes / (t * 1e-6) / 1e9 / copy_gbps:7.0%} {us[flush]['copy-op'] / t:8.3f}"
            summary.append(line)
        summary.append("")
        print(f"done {shape}", flush=True)
    for path in sorted(glob.glob(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "**", "*.best_config"),
                              recursive=True)):
        src = next(pathlib.Path(path).parent.glob("*.py"), None)     # the kernel's source, beside its config
        defs = [ln.split("(")[0][4:] for ln in src.read_text().splitlines() if ln.startswith("def triton")] \
            if src else []
        name = defs[0] if defs else "?"
        print(f"inductor best config {name}: {pathlib.Path(path).read_text().strip()}")
    if summary:
        print(f"\n== table: {device}; bf16; bytes = x read + y written; ratio = copy-op's time over this one; "
              f"flushes: {args.flush}")
        print(f"{'shape':>10s} {'kernel':36s}" + f" | {'µs':>8s} {'of copy':>7s} {'vs copy':>8s}" * len(us))
        print("\n".join(summary))


if __name__ == "__main__":
    main()
