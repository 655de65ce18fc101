"""Tutorial 04's LayerNorm and RMSNorm at the shapes issue 14 lists as misses: the previous kernels ("old", the
cell saved in tools/gpu/norm_variants/norm_kernels_old.cu, where it has the plan's kernel) against the notebook's
current cell ("new", same plan) and the new kernels under other launch plans (tutorial 03's plan among them),
each checked, then timed against torch eager and torch.compile in one process.

    PYTHONPATH=$PWD python3 tools/gpu/try_norms.py                  # on the GPU machine, from the repo root
    PYTHONPATH=$PWD python3 tools/gpu/try_norms.py --emulate        # CPU: checks every variant on tests/emu, no timing
    PYTHONPATH=$PWD python3 tools/gpu/try_norms.py --only "float32 4096x32768,float32 4096x1024" --variants 2read

--variants keeps, beside the notebook's plan ("new <plan>") and the baselines, only the variants whose name holds one
of its comma-separated words (e.g. "2read", "persist", "old", "new+nc", a plan such as "c4 x 256"). The session-5
candidate "pipe" (the late w/b packs through a ring) is the cell's `ring_store` now: plain plans time it.

Method: kernellab.bench, L2 flushed before every call, all variants of one case and their baselines in alternating
rounds (medians); "of copy" is bytes moved / time / kernellab's measured copy bandwidth; "vs eager" and "vs compile"
are the baseline's median over the variant's (> 1: the variant is faster). Each variant is checked first against
F.layer_norm / F.rms_norm (float64) on min(rows, 64) rows of the same width, with the same plan; a failing variant
is not timed. torch.compile: dynamic=False, one compile per case, skipped once --budget-s is near (its column then
says n/a). A plan is written rt x vpt / block (a block: rt threads per row, vpt 16-byte packs per thread, block
threads per CTA) or cC x threads x vpt (a cluster of C blocks per row).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "emu"))
sys.path.insert(0, str(ROOT / "tests"))              # test_bench's FakeClock, for --smoke
OLD_SOURCE = ROOT / "tools" / "gpu" / "norm_variants" / "norm_kernels_old.cu"
VARIANTS = ROOT / "tools" / "gpu" / "norm_variants"
PERSISTENT_SOURCE = VARIANTS / "norm_persistent.cu"   # appended to the cell, with the two below
CLUSTER_BARRIER_SOURCE = VARIANTS / "cluster_barrier.cu"     # barrier.cluster helpers, for the persistent grid
EXTRA_SOURCES = [CLUSTER_BARRIER_SOURCE, PERSISTENT_SOURCE, VARIANTS / "norm_tworead.cu",
                 VARIANTS / "norm_extra_plans.cu", VARIANTS / "norm_wide.cu", VARIANTS / "norm_resident_x.cu"]
# Instantiated template arguments of the session-5 candidate "2read": packs a thread per chunk in the two passes
# (pass 1 from DRAM, pass 2 from L2 with w and b).
TWOREAD_UNROLL = {"layernorm": (2, 1), "rmsnorm": (4, 2)}
EPS = 1e-5


@dataclass(frozen=True)
class Spec:
    """A launch plan: row_threads threads per row, vpt packs per thread, cluster blocks per row, block threads;
    family: "" (the cell's kernels), "persist" (norm_persistent.cu), "2read" (norm_tworead.cu: vpt is pass 1's
    packs per chunk; any row length), "wide", "wideb", "early" (norm_wide.cu, LayerNorm bf16 under a launch bound
    of 512: x widened to fp32 once; that and w, b read next to x; x packed as in the cell, w and b next to it),
    "resx" (norm_resident_x.cu: clusters that keep w and b in shared memory and take rows in turn)."""

    row_threads: int
    vpt: int
    cluster: int = 1
    block: int = 0          # 0: row_threads (clusters), max(row_threads, 128) (blocks)
    family: str = ""

    @property
    def persistent(self):
        return self.family == "persist"

    @property
    def rows_in_turn(self):
        """A grid of the groups that fit at once, each taking rows in turn: whole packs only."""
        return self.family in ("persist", "resx")

    def grid(self, rows):
        if self.cluster > 1:
            return rows * self.cluster
        return -(-rows // (self.threads // self.row_threads))

    @property
    def threads(self):
        return self.block or (self.row_threads if self.cluster > 1 else max(self.row_threads, 128))

    def text(self):
        p = f" {self.family}" if self.family else ""
        if self.family == "2read":                       # packs a thread: TWOREAD_UNROLL, per op
            return f"{self.row_threads} / {self.threads}{p}"
        if self.cluster > 1:
            return f"c{self.cluster} x {self.row_threads} x {self.vpt}{p}"
        return f"{self.row_threads} x {self.vpt} / {self.threads}{p}"

    def covers(self, cols, itemsize):
        vec = 16 // itemsize
        if self.family == "2read":
            return cols % vec == 0
        return (self.row_threads * self.vpt * self.cluster >= cols // vec
                and (not self.rows_in_turn or cols % vec == 0))


def P(row_threads, vpt, cluster=1, block=0):
    """A persistent plan (tools/gpu/norm_variants/norm_persistent.cu)."""
    return Spec(row_threads, vpt, cluster, block, "persist")


def W(row_threads, vpt, cluster=1, block=0):
    """LayerNorm with x widened once (tools/gpu/norm_variants/norm_wide.cu): bf16, blocks of up to 512 threads."""
    return Spec(row_threads, vpt, cluster, block, "wide")


def WB(row_threads, vpt, cluster=1, block=0):
    """As W, with w and b loaded next to x (norm_wide.cu): bf16, 4 packs a thread."""
    return Spec(row_threads, vpt, cluster, block, "wideb")


def E(row_threads, vpt, cluster=1, block=0):
    """The cell's packed x with w and b loaded next to it, under a 512-thread bound (norm_wide.cu): bf16."""
    return Spec(row_threads, vpt, cluster, block, "early")


# norm_wide.cu's template arguments <WIDE, WB, THREADS, MINB> per family
WIDE_FLAGS = {"wide": "true, 0, 512, 1", "wideb": "true, 1, 512, 1", "early": "false, 1, 512, 1"}


def RX(cluster, threads=1024):
    """Resident clusters with the st.async exchange (norm_resident_x.cu): 4 packs a thread, w and b in shared
    memory, rows in turn, as many clusters as fit at once."""
    return Spec(threads, 4, cluster, threads, "resx")


def TWO(row_threads, block=0):
    """Two reads of x, nothing held across the reduction (tools/gpu/norm_variants/norm_tworead.cu)."""
    return Spec(row_threads, 2, 1, block, "2read")


# (op, dtype name, rows, cols) -> other plans for the new kernels, beside the notebook's own (plan_rows). Ordered
# by the size of the miss in the H100 run of 2026-11-23 (/work/helpers/run_a/mb.txt).
B = "bfloat16"
F32 = "float32"
CASES = {
    ("layernorm", B, 4096, 32768): [Spec(512, 8, 1, 512), Spec(512, 4, 2), Spec(1024, 2, 2), Spec(512, 2, 4),
                                    Spec(256, 4, 4), Spec(256, 2, 8), P(1024, 2, 2), P(512, 2, 4), W(512, 8, 1, 512),
                                    E(512, 8, 1, 512)],
    ("layernorm", B, 1024, 262144): [Spec(512, 4, 16), Spec(512, 8, 8), Spec(1024, 4, 8), Spec(1024, 8, 4),
                                     W(256, 8, 16), W(512, 8, 8), E(256, 8, 16), E(512, 8, 8), RX(8), RX(16, 512)],
    ("rmsnorm", B, 1024, 262144): [RX(8), RX(16, 512)],
    ("layernorm", F32, 1024, 262144): [RX(16)],
    ("rmsnorm", F32, 1024, 262144): [RX(16)],
    ("layernorm", B, 4096, 1024): [Spec(64, 2, 1, 128), Spec(64, 2, 1, 256), Spec(32, 4, 1, 256), Spec(128, 1),
                                   P(64, 2, 1, 256), P(128, 1, 1, 256), W(32, 4, 1, 128), WB(32, 4, 1, 128),
                                   E(32, 4, 1, 128)],
    ("layernorm", B, 4096, 4096): [Spec(64, 8, 1, 128), Spec(64, 8, 1, 256), Spec(256, 2, 1, 256),
                                   Spec(128, 4, 1, 256), Spec(512, 1, 1, 512), P(256, 2, 1, 256), P(512, 1, 1, 512),
                                   W(128, 4, 1, 128), W(128, 4, 1, 256), W(64, 8, 1, 128), WB(128, 4, 1, 128),
                                   E(128, 4, 1, 128), E(128, 4, 1, 256)],
    ("rmsnorm", B, 4096, 32768): [Spec(512, 8, 1, 512), Spec(512, 4, 2), Spec(1024, 2, 2), Spec(512, 2, 4),
                                  Spec(256, 4, 4), P(1024, 2, 2), P(512, 2, 4)],
    ("layernorm", F32, 4096, 32768): [Spec(1024, 4, 2), Spec(512, 4, 4), Spec(256, 8, 4), Spec(1024, 8, 1, 1024),
                                      P(1024, 2, 4),
                                      TWO(1024, 1024), TWO(512, 1024),
                                      TWO(512, 512)],
    ("layernorm", F32, 3, 100003): [Spec(1024, 4, 8), Spec(512, 8, 8)],
    # session 6: few rows, bf16: 8 packs a thread leave w and b late (a chain of 8 L2 round trips, no ring for bf16)
    ("layernorm", B, 3, 100003): [Spec(512, 4, 8), Spec(256, 8, 8)],
    ("rmsnorm", B, 3, 100003): [Spec(512, 4, 8), Spec(256, 8, 8)],
    ("layernorm", F32, 4096, 1024): [Spec(64, 4, 1, 128), Spec(32, 8, 1, 128), Spec(64, 4, 1, 256),
                                     Spec(128, 2, 1, 128), P(128, 2, 1, 256), Spec(32, 8, 1, 256),
                                     TWO(64, 256), TWO(128, 256)],
    ("rmsnorm", F32, 4096, 1024): [Spec(64, 4, 1, 128), Spec(32, 8, 1, 128), Spec(64, 4, 1, 256), Spec(128, 2, 1, 128),
                                   P(128, 2, 1, 256), TWO(64, 256)],
    # session 9: RMSNorm bf16 4096 x 1024 at 0.95-1.0x torch.compile (10.2 against 10.4-10.9 µs)
    ("rmsnorm", B, 4096, 1024): [Spec(64, 2, 1, 128), Spec(128, 1, 1, 128), Spec(32, 4, 1, 256), Spec(64, 2, 1, 256),
                                 Spec(32, 4, 1, 64)],
    ("rmsnorm", F32, 1000, 1031): [Spec(128, 4, 1, 128), Spec(64, 8, 1, 128), Spec(128, 4, 1, 256), Spec(64, 8, 1, 64)],
    ("rmsnorm", F32, 4096, 32768): [Spec(1024, 4, 2), Spec(512, 4, 4), P(1024, 4, 2), P(1024, 2, 4),
                                    TWO(1024, 1024), TWO(512, 512)],
}
SMS = 132


STREAM_LOAD = """
// x read with ld.global.nc.L1::no_allocate: x streams past L1, which then keeps w and b from one row to the next
template <typename T>
__device__ __forceinline__ Pack<T> load_stream(const Pack<T>* p) {
    Pack<T> r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p));
    return r;
}
"""


# x read past L1 and marked first to go from L2 (what Inductor's generated reductions do for a tensor read once,
# eviction_policy='evict_first'): the lines x brings into L2 replace each other rather than lines someone else will
# read, or dirty lines that would have to be written back first
STREAM_LOAD_EF = """
template <typename T>
__device__ __forceinline__ Pack<T> load_stream(const Pack<T>* p) {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    Pack<T> r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(policy));
    return r;
}
"""


def stream_variant(source, load_text=STREAM_LOAD):
    """The notebook's cell with x's 16-byte loads (load_packs only) made L1::no_allocate (load_text: STREAM_LOAD),
    or that and L2::evict_first (STREAM_LOAD_EF)."""
    anchor = "// Packs first, first + stride, ... of the row"
    load = "            pk[j] = packs[q];\n"
    assert source.count(anchor) == 1 and source.count(load) == 1, "norm_kernels changed: update stream_variant"
    return source.replace(anchor, load_text + anchor).replace(load, "            pk[j] = load_stream(&packs[q]);\n")


def make_launcher(module, kind, ctype, spec, cluster_names_vpt, max_groups=None):
    """fn(x, w, b, y) (LayerNorm) or fn(x, w, y) (RMSNorm) launching `module`'s kernel with `spec`."""
    if spec.family == "resx":
        kernel = module[f"norm_resident_x<{'true' if kind == 'layernorm' else 'false'}, {ctype}, {spec.cluster}>"]
        smem = (2 if kind == "layernorm" else 1) * 4 * spec.threads * 16
        fit = {}

        def launch(x, *rest):
            rows, cols = x.shape
            if not fit:                                  # the clusters this GPU holds at once (1 on the emulator)
                fit[0] = 1 if max_groups == 1 else kernel.max_active_clusters(spec.threads, (spec.cluster, 1, 1),
                                                                               smem)
            w, b = (rest[0], rest[1]) if kind == "layernorm" else (rest[0], rest[0])
            kernel.launch(min(rows, fit[0]) * spec.cluster, spec.threads, x, w, b, rest[-1], rows, cols, EPS,
                          shared_bytes=smem)
            return rest[-1]
        return launch
    if spec.persistent:
        kernel = module[f"{kind}_persistent<{ctype}, {spec.vpt}, {spec.cluster}>"]
        per_group = 1 if spec.cluster > 1 else spec.threads // spec.row_threads

        def launch(x, *rest):
            rows, cols = x.shape
            groups = min(-(-rows // per_group), max_groups or SMS * max(1, 1024 // spec.threads) // spec.cluster)
            kernel[groups * spec.cluster, spec.threads](x, *rest, rows, cols, spec.row_threads, EPS)
            return rest[-1]
        return launch
    if spec.family in WIDE_FLAGS:
        flags = WIDE_FLAGS[spec.family]
        kernel = module[f"{kind}_rows_x<{ctype}, {spec.vpt}, {flags}>" if spec.cluster == 1
                        else f"{kind}_rows_cluster_x<{ctype}, {spec.cluster}, {spec.vpt}, {flags}>"]
    elif spec.family == "2read":
        u1, u2 = TWOREAD_UNROLL[kind]
        kernel = module[f"{kind}_tworead<{ctype}, {u1}, {u2}>"]
    elif spec.cluster == 1:
        kernel = module[f"{kind}_rows<{ctype}, {spec.vpt}>"]
    elif cluster_names_vpt:
        kernel = module[f"{kind}_rows_cluster<{ctype}, {spec.cluster}, {spec.vpt}>"]
    else:                                   # the old cell: VPT fixed at 32 values per thread
        kernel = module[f"{kind}_rows_cluster<{ctype}, {spec.cluster}>"]

    def launch(x, *rest):
        rows, cols = x.shape
        extra = (spec.row_threads,) if spec.cluster == 1 else ()
        kernel[spec.grid(rows), spec.threads](x, *rest, rows, cols, *extra, EPS)
        return rest[-1]
    return launch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emulate", action="store_true", help="check every variant on the CPU emulation; no timing")
    ap.add_argument("--smoke", action="store_true", help="with --emulate: the table too, on a fake clock, 3 rows")
    ap.add_argument("--rep-ms", type=float, default=15.0, help="kernellab.bench rep_ms per function")
    ap.add_argument("--budget-s", type=float, default=100.0, help="no new torch.compile past this many seconds")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--only", default="", help="substring filter on 'op dtype RxC', e.g. 'bfloat16'; several "
                    "comma-separated: any of them")
    ap.add_argument("--variants", default="", help="comma-separated words: time only the variants whose name holds "
                    "one (beside the notebook's plan and the baselines), e.g. 'persist,2read'")
    args = ap.parse_args(argv)
    t0 = time.time()
    words = [w for w in args.variants.split(",") if w]

    def wanted(name):
        return not words or any(w in name for w in words)

    import torch
    import torch.nn.functional as F

    import kernellab
    from trylib import copy_ceiling
    from notebook_cells import load_tutorial

    dev = "cpu" if args.emulate else "cuda"
    if args.emulate:
        import emulate
        compile_new = emulate.compile_host

        def compile_old(src):
            return emulate.compile_host(src, first_line=1, filename="norm_kernels_old.cu")
    else:
        def compile_new(src):
            return kernellab.compile_cuda(src, first_line=2, filename="cell.cu")

        def compile_old(src):
            return kernellab.compile_cuda(src, first_line=1, filename="norm_kernels_old.cu")
    from concurrent.futures import ThreadPoolExecutor

    from notebook_cells import named_cuda_cells
    cell = named_cuda_cells("04-layernorm.py")["norm_kernels"]
    with ThreadPoolExecutor(4) as pool:                   # NVRTC compiles side by side
        futures = [pool.submit(compile_old, OLD_SOURCE.read_text()),
                   pool.submit(compile_new, cell + "".join(p.read_text() for p in EXTRA_SOURCES)),
                   None if args.emulate or not wanted("new+nc") else pool.submit(compile_new, stream_variant(cell)),
                   None if args.emulate or not wanted("new+ef") else pool.submit(compile_new,
                                                                                 stream_variant(cell, STREAM_LOAD_EF))]
        t04 = load_tutorial("04-layernorm.py", compile=compile_new)
        old, extra, stream, stream_ef = (f.result() if f else None for f in futures)
    new = t04["norm_kernels"]
    if not args.emulate:
        global SMS
        SMS = torch.cuda.get_device_properties(0).multi_processor_count
    plan_rows, ctypes = t04["plan_rows"], t04["CTYPE"]
    print(f"compiled old and new kernels in {time.time() - t0:.1f} s", flush=True)

    copy_gbps, device = copy_ceiling(args.emulate)

    def ln(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)

    def rms(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, EPS)

    def inputs(kind, rows, cols, dtype):
        def make(g):
            x = (2 * torch.randn(rows, cols, generator=g)).to(dtype)
            w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
            b = torch.randn(cols, generator=g).to(dtype)
            y = torch.empty(rows, cols, dtype=dtype)
            t = (x, w, b, y) if kind == "layernorm" else (x, w, y)
            return tuple(a.to(dev) for a in t)
        return make

    table, best = [], []
    for (kind, dname, rows, cols), alts in CASES.items():
        label = f"{kind} {dname} {rows}x{cols}"
        if args.only and not any(o in label for o in args.only.split(",") if o):
            continue
        dtype = getattr(torch, dname)
        ctype, item = ctypes[dtype], dtype.itemsize
        base = plan_rows(rows, cols, item)
        base_spec = Spec(base.row_threads, base.vpt, base.cluster, base.block)
        variants = {}
        if wanted("old") and (base_spec.cluster == 1 or base_spec.vpt * (16 // item) == 32):   # the old cell: 32
            try:
                variants[f"old   {base_spec.text()}"] = make_launcher(old, kind, ctype, base_spec, False)
            except KeyError:                         # the old cell lacks this plan's kernel (bf16, 8 packs)
                pass
        variants[f"new   {base_spec.text()}"] = make_launcher(new, kind, ctype, base_spec, True)
        if stream is not None:
            variants[f"new+nc {base_spec.text()}"] = make_launcher(stream, kind, ctype, base_spec, True)
        if stream_ef is not None:
            variants[f"new+ef {base_spec.text()}"] = make_launcher(stream_ef, kind, ctype, base_spec, True)
        for s in alts:
            if not wanted(f"new   {s.text()}"):
                continue
            if s.rows_in_turn and s.covers(cols, item):   # emulated: one group takes every row
                variants[f"new   {s.text()}"] = make_launcher(extra, kind, ctype, s, True,
                                                              1 if args.emulate else None)
            elif s.covers(cols, item) and s != base_spec:          # the cell's kernels, and a few more
                variants[f"new   {s.text()}"] = make_launcher(extra, kind, ctype, s, True)
                if stream is not None and s is alts[0] and wanted(f"new+nc {s.text()}"):
                    try:                                 # the no-L1 module instantiates the cell's kernels only
                        variants[f"new+nc {s.text()}"] = make_launcher(stream, kind, ctype, s, True)
                    except KeyError:
                        pass
        ref = ((lambda x, w, b, y: ln(x, w, b)) if kind == "layernorm" else (lambda x, w, y: rms(x, w)))
        check_rows = min(rows, 3 if args.emulate else 64)
        passed = {}
        for name, fn in variants.items():
            n = check_rows if not (args.emulate and "persist" in name) else min(rows, 9)   # several loop turns
            try:
                rep = kernellab.check(fn, ref, inputs(kind, n, cols, dtype), trials=1)
            except Exception as exc:                     # a launch error: report it, go on (unless sticky)
                print(f"  ! {label} {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                passed[name] = False
                if sticky(exc):
                    return finish(table, best, t0, device, f"stopped: {label} {name} poisoned the context")
                continue
            passed[name] = rep.passed
            if not rep.passed:
                print(f"  ! {label} {name}: check FAILED ({rep.max_abs_error:.3g}); not timed", flush=True)
        timing = {}
        if args.emulate:
            print(f"{label}: " + ", ".join(f"{n.split()[0]} {' '.join(n.split()[1:])} "
                                           f"{'passed' if ok else 'FAILED'}" for n, ok in passed.items()), flush=True)
            if not args.smoke:
                continue
            from test_bench import FakeClock
            rows, timing = check_rows, dict(timer=FakeClock(lambda out: 1.0), rounds=2, min_reps=2)

        nbytes = (2 * rows * cols + (2 if kind == "layernorm" else 1) * cols) * item
        a = inputs(kind, rows, cols, dtype)(torch.Generator().manual_seed(rows * 7919 + cols))
        nin = len(a) - 1
        eager = ln if kind == "layernorm" else rms
        baselines = {"torch eager": lambda *t: eager(*t[:nin])}
        if not args.no_compile and not args.emulate and time.time() - t0 < args.budget_s:
            try:
                comp = torch.compile(eager, dynamic=False)
                comp(*a[:nin])
                torch.cuda.synchronize()
                baselines["torch.compile"] = lambda *t, comp=comp: comp(*t[:nin])
            except Exception as exc:
                print(f"  ! torch.compile of {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        baselines["copy-op"] = lambda *t: t[-1].copy_(t[0])
        timed = {n: f for n, f in variants.items() if passed[n]}
        if not timed:
            continue
        first, *others = timed
        try:
            res = kernellab.bench(timed[first], a, bytes=nbytes, name=first, warmup_ms=5, rep_ms=args.rep_ms,
                                  max_reps=400, baselines={**{n: timed[n] for n in others}, **baselines},
                                  **timing)
        except Exception as exc:
            print(f"  ! bench {label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            if sticky(exc):
                return finish(table, best, t0, device, f"stopped: bench of {label} poisoned the context")
            continue
        us = {res.name: res.median_ms * 1e3, **{r.name: r.median_ms * 1e3 for r in res.baselines}}
        e_us, c_us = us["torch eager"], us.get("torch.compile")
        print(f"[{time.time() - t0:5.1f} s] {label}: eager {e_us:.1f} us, "
              f"compile {'n/a' if c_us is None else f'{c_us:.1f} us'}, "
              f"copy-op {us['copy-op']:.1f} us ({nbytes / (us['copy-op'] * 1e-6) / 1e9 / copy_gbps:.0%} of copy)",
              flush=True)
        for name in timed:
            t = us[name]
            table.append(f"{kind:9s} {dname:8s} {f'{rows}x{cols}':>13s} {name:28s} {t:8.1f} "
                         f"{nbytes / (t * 1e-6) / 1e9 / copy_gbps:7.0%} {e_us / t:7.2f}x "
                         + (f"{c_us / t:9.2f}x" if c_us else f"{'n/a':>10s}"))
        for name in ("torch eager", "torch.compile", "copy-op"):
            if name in us:
                table.append(f"{kind:9s} {dname:8s} {f'{rows}x{cols}':>13s} {name:28s} {us[name]:8.1f} "
                             f"{nbytes / (us[name] * 1e-6) / 1e9 / copy_gbps:7.0%}")
        table.append("")
        win = min(timed, key=lambda n: us[n])
        t = us[win]
        of_copy = nbytes / (t * 1e-6) / 1e9 / copy_gbps
        met = (e_us / t >= 1.0 and (c_us is None or c_us / t >= 1.0)
               and (of_copy >= 0.9 or rows * cols < 4096 * 1024))
        best.append(f"{label:32s} {win:28s} {t:8.1f} us {of_copy:5.0%} {e_us / t:6.2f}x eager "
                    + (f"{c_us / t:5.2f}x compile" if c_us else "  n/a compile")
                    + f"  ({first.split()[0]} {us[first]:.1f} us)  targets {'met' if met else 'MISSED'}")
        del a, res
        if not args.emulate:
            torch.cuda.empty_cache()
    finish(table, best, t0, device)


def sticky(exc) -> bool:
    """A CUDA error after which this process's context is unusable."""
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in ("illegal memory access", "ILLEGAL_ADDRESS", "misaligned address",
                                   "unspecified launch failure", "LAUNCH_FAILED"))


def finish(table, best, t0, device, note=""):
    """The table, then the fastest variant of each case against the targets."""
    header = (f"{'op':9s} {'dtype':8s} {'shape':>13s} {'variant':28s} {'us':>8s} {'of copy':>7s} "
              f"{'vs eager':>8s} {'vs compile':>10s}")
    if table:
        print("\n" + header)
        print("\n".join(table))
    if best:
        print("fastest variant per case (targets: >= 1.0x eager and compile; >= 90 % of copy from 4096x1024 up):")
        print("\n".join(best))
    if note:
        print(note)
    print(f"done in {time.time() - t0:.0f} s ({device})")


if __name__ == "__main__":
    main()
