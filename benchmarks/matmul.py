"""The matmul ladder of tutorials 05 and 06 on one GPU: every kernel checked on awkward shapes, then timed against
PyTorch (cuBLAS) in the same run, with a small sweep of tile configurations for the key kernels.

    python3 benchmarks/matmul.py                 # everything: about 3-4 minutes on an H100
    python3 benchmarks/matmul.py --quick         # the last step of each ladder, default tiles: under 90 s
    python3 benchmarks/matmul.py --only sgemm    # one family: sgemm (05), tc (06, mma.sync), hopper (06, wgmma)
    python3 benchmarks/matmul.py --compile-only  # no GPU needed: compile every variant, print resources and SASS

Method. The kernels are the tutorials' own `%%cuda` cells, read from notebooks/05-matmul.py and 06-tensor-cores.py;
a tile configuration is the cell compiled with -D options. For each variant: compile (registers, spills, local
memory and the SASS headline are logged); a first launch in an isolated worker process (a fault or a hang is
reported there and the run goes on); `kernellab.check` against a float64 reference on awkward shapes with fresh
random inputs and NaN-poisoned outputs; then `kernellab.bench` with torch as the baseline in the same run
(alternating rounds, L2 flushed, medians: see kernellab/run/measure/bench.py). FP32 baseline: `torch.mm` with TF32 off;
bf16/fp16 baseline: `torch.matmul(A, B.T)` on the same K-major operands. Ratios are torch time / kernel time
(> 1: faster than cuBLAS). A variant that fails prints its error and the run continues.

The table is printed last. With $OUT set, `$OUT/matmul.jsonl` gets one JSON object per row (bench results in full)
and `$OUT/matmul.log` a copy of this output.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))     # notebook_cells: the tutorials' cells, as the tests read them

import kernellab  # noqa: E402
from kernellab.compile.signature import find_kernels  # noqa: E402



# --- the kernels: the notebooks' %%cuda cells ------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    source: str
    arch: str | None
    kernels: tuple[str, ...]


def cuda_cells(notebook: str) -> list[Cell]:
    """Every %%cuda cell of a jupytext notebook that is the tutorial's own (exercise stubs left out)."""
    from notebook_cells import cuda_cells_with_flags

    cells = []
    for flags, body in cuda_cells_with_flags(notebook):
        if body.lstrip().startswith("// exercise:"):
            continue
        arch = re.search(r"--arch[= ](\S+)", flags)
        cells.append(Cell(body, arch.group(1) if arch else None, tuple(k.name for k in find_kernels(body))))
    return cells


def cell_with(cells: list[Cell], kernel: str) -> Cell:
    return next(c for c in cells if kernel in c.kernels)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# --- variants --------------------------------------------------------------------------------------------------

@dataclass
class Variant:
    family: str                    # "sgemm", "tc", "hopper"
    name: str                      # the step: "sgemm_warptile", "mma_pipe", ...
    config: str                    # "default", "BK=16", ...
    kernels: dict                  # dtype name -> kernel name in the cell
    defines: dict = field(default_factory=dict)
    grid: object = None            # (M, N) -> grid
    block: object = 256
    smem: int = 0
    slow: bool = False             # seconds per call at 4096^3: few repetitions
    tensor_maps: tuple | None = None   # (box of A, box of B, box of C) for the wgmma kernel
    cluster: tuple | None = None       # thread-block cluster shape, (2, 1, 1) for the wgmma kernel's pairs

    @property
    def label(self) -> str:
        return self.name if self.config == "default" else f"{self.name} [{self.config}]"


def sgemm_variants(quick: bool) -> list[Variant]:
    g32 = lambda M, N: (cdiv(N, 32), cdiv(M, 32))  # noqa: E731
    steps = [
        Variant("sgemm", "sgemm_naive", "default", {"fp32": "sgemm_naive"},
                grid=lambda M, N: (cdiv(M, 32), cdiv(N, 32)), block=(32, 32), slow=True),
        Variant("sgemm", "sgemm_coalesced", "default", {"fp32": "sgemm_coalesced"}, grid=g32, block=(32, 32),
                slow=True),
        Variant("sgemm", "sgemm_smem", "default", {"fp32": "sgemm_smem"}, grid=g32, block=(32, 32)),
        Variant("sgemm", "sgemm_1d", "default", {"fp32": "sgemm_1d"}, grid=lambda M, N: (cdiv(N, 64), cdiv(M, 64)),
                block=512),
        Variant("sgemm", "sgemm_2d", "default", {"fp32": "sgemm_2d"}, grid=lambda M, N: (cdiv(N, 128), cdiv(M, 128))),
        Variant("sgemm", "sgemm_vec", "default", {"fp32": "sgemm_vec"}, grid=lambda M, N: (cdiv(N, 128), cdiv(M, 128))),
    ]
    # sgemm_warptile: (config, -D options); threads = (BM / WM) (BN / WN) 32. The default is 128 x 128 x 16 with
    # 64 x 32 warp tiles (16 x 4 per lane, 256 threads, 128 regs, 2 blocks/SM): the fastest measured (85.9 % of torch
    # at 4096^3 on an H100; NOTES-matmul.md). Every other entry spells out BK, WM and WN. (w64x32 at BK=8 spills 52 B.)
    configs = [("default", {}), ("128x128x8 w32x64", {"BK": 8, "WM": 32, "WN": 64}),
               ("BK=16 w32x64", {"BK": 16, "WM": 32, "WN": 64}),
               ("128x256x8 w64x64 1 block/SM", {"BN": 256, "BK": 8, "WM": 64, "WN": 64, "MIN_BLOCKS": 1})]
    warptiles = []
    for config, d in configs:
        bm, bn, wm, wn = d.get("BM", 128), d.get("BN", 128), d.get("WM", 64), d.get("WN", 32)
        warptiles.append(Variant("sgemm", "sgemm_warptile", config, {"fp32": "sgemm_warptile"}, dict(d),
                                 grid=lambda M, N, bm=bm, bn=bn: (cdiv(N, bn), cdiv(M, bm)),
                                 block=(bm // wm) * (bn // wn) * 32))
    # sgemm_cp (step 8): cp.async stages, 128 x 256 x 16 x 4 stages, 8 warps of 64 x 64, one block per SM: 91.0 %
    # of torch at 4096^3 on an H100 (NOTES-matmul.md)
    bk, st = 16, 4
    cp = Variant("sgemm", "sgemm_cp", "default", {"fp32": "sgemm_cp"}, grid=lambda M, N: (cdiv(N, 256), cdiv(M, 128)),
                 block=256, smem=st * (bk * (128 + 4) + bk * 256) * 4)
    return warptiles[:1] + [cp] if quick else steps + warptiles + [cp]


def tc_variants(quick: bool) -> list[Variant]:
    both = lambda base: {"bf16": f"{base}_bf16", "fp16": f"{base}_f16"}  # noqa: E731
    g128 = lambda M, N: (cdiv(N, 128), cdiv(M, 128))  # noqa: E731
    steps = [Variant("tc", "wmma", "default", both("wmma"), grid=g128),
             Variant("tc", "mma", "default", both("mma"), grid=g128)]
    configs = [("default", {}), ("128x128 2x2 warps", {"BN": 128, "WARPS_N": 2}),
               ("BK=32 4 stages (the first default)", {"BK": 32, "STAGES": 4}), ("BK=64 4 stages", {"BK": 64, "STAGES": 4}),
               ("128x128 BK=32 4 stages", {"BN": 128, "WARPS_N": 2, "BK": 32, "STAGES": 4}),
               ("256x128 4x2 warps", {"BM": 256, "BN": 128, "WARPS_M": 4, "WARPS_N": 2})]
    pipes = []
    for config, d in configs:
        bm, bn, bk, st = d.get("BM", 128), d.get("BN", 256), d.get("BK", 64), d.get("STAGES", 3)   # the cell's
        threads = d.get("WARPS_M", 2) * d.get("WARPS_N", 4) * 32
        pipes.append(Variant("tc", "mma_pipe", config, both("mma_pipe"), dict(d),
                             grid=lambda M, N, bm=bm, bn=bn: (cdiv(N, bn), cdiv(M, bm)), block=threads,
                             smem=st * (bm + bn) * bk * 2))
    return pipes[:1] if quick else steps + pipes


def hopper_variants(quick: bool, sms: int) -> list[Variant]:
    configs = [("default", {}), ("no cluster", {"CLUSTER_M": 1}), ("3 stages", {"STAGES": 3}),
               ("GROUP_M=16", {"GROUP_M": 16}), ("GROUP_M=1 (row order)", {"GROUP_M": 1}),
               ("BN=128 6 stages", {"BN": 128, "STAGES": 6}), ("BN=128 no cluster", {"BN": 128, "STAGES": 6,
                                                                                    "CLUSTER_M": 1})]
    out = []
    for config, d in configs:
        bn, st, cm = d.get("BN", 256), d.get("STAGES", 4), d.get("CLUSTER_M", 2)

        def grid(M, N, bn=bn, cm=cm):            # persistent: at most one block per SM, whole clusters
            return cm * min(cdiv(cdiv(M, 128), cm) * cdiv(N, bn), sms // cm)
        out.append(Variant("hopper", "wgmma", config, {"bf16": "wgmma_bf16", "fp16": "wgmma_f16"}, dict(d),
                           grid=grid, block=384,
                           smem=st * (128 + bn) * 64 * 2 + 2 * 2 * 64 * 128 + 16 * st + 1024,   # + C staging boxes
                           tensor_maps=((128, 64), (bn // cm, 64), (64, 64)), cluster=(cm, 1, 1) if cm > 1 else None))
    return out[:1] if quick else out


def hopper_maps(A, B, C, boxes):
    """The wgmma kernel's tensor maps for A, B and C (boxes as the variant says). C's map only where TMA can address
    it (rows of 16-byte multiples, 16-byte aligned): otherwise the kernel stores directly and A's map stands in."""
    map_a = kernellab.tensor_map(A, boxes[0], swizzle="128B")
    by_tma = C.shape[1] % 8 == 0 and C.data_ptr() % 16 == 0
    return (map_a, kernellab.tensor_map(B, boxes[1], swizzle="128B"),
            kernellab.tensor_map(C, boxes[2], swizzle="128B") if by_tma else map_a)


# --- the variants as functions of torch tensors (also used by tests/gpu/test_matmul_gpu.py) ------------------------

def variant_function(v: Variant, module, dtype_name: str):
    """(run(A, B, C) -> C, the kernel) for one variant and dtype: the tutorials' launch geometry; for the tensor-core
    kernels K is padded with zero columns to a multiple of 8 (16-byte rows), and the wgmma kernel gets its tensor maps
    and its cluster."""
    import torch

    kernel = module[v.kernels[dtype_name]]
    F = torch.nn.functional
    cache = {}

    def run(A, B, C):
        if v.family == "sgemm":
            (M, K), N = A.shape, B.shape[1]
            kernel[v.grid(M, N), v.block, v.smem](A, B, C, M, N, K)
            return C
        M, N, K = A.shape[0], B.shape[0], A.shape[1]
        if K % 8:                                           # 16-byte rows: zero columns add nothing
            A, B = F.pad(A, (0, -K % 8)), F.pad(B, (0, -K % 8))
            K += -K % 8
        first = (A, B)
        if v.tensor_maps:
            key = (A.data_ptr(), B.data_ptr(), C.data_ptr(), tuple(A.shape), tuple(B.shape), tuple(C.shape))
            if key not in cache:
                cache.clear()
                cache[key] = hopper_maps(A, B, C, v.tensor_maps)
            first = cache[key]
        kernel[v.grid(M, N), v.block, v.smem](*first, C, M, N, K, **({"cluster": v.cluster} if v.cluster else {}))
        return C
    run.__name__ = v.label
    return run, kernel


def inputs(family: str, dtype, M: int, N: int, K: int):
    """inputs(generator): fp32 A [M, K], B [K, N] for sgemm; A [M, K], B [N, K] in dtype for the others; and C."""
    import torch

    def make(g):
        if family == "sgemm":
            return (torch.randn(M, K, generator=g, device="cuda"), torch.randn(K, N, generator=g, device="cuda"),
                    torch.empty(M, N, device="cuda"))
        return (torch.randn(M, K, generator=g, device="cuda").to(dtype),
                torch.randn(N, K, generator=g, device="cuda").to(dtype), torch.empty(M, N, device="cuda", dtype=dtype))
    return make


def reference(family: str):
    """What each family computes: A B (sgemm) or A B^T (the tensor-core kernels, both operands K-major)."""
    return (lambda A, B, C: A @ B) if family == "sgemm" else (lambda A, B, C: A @ B.T)


def baseline(family: str):
    """torch doing the same: torch.mm (TF32 off in main) or torch.matmul(A, B.T) on the same operands."""
    import torch

    if family == "sgemm":
        return lambda A, B, C: torch.mm(A, B, out=C)
    return lambda A, B, C: torch.matmul(A, B.T, out=C)


# --- running one variant ---------------------------------------------------------------------------------------

class Runner:
    def __init__(self, args, torch):
        self.args, self.torch = args, torch
        self.rows: list[dict] = []
        self.called: list[dict] = []          # --as-called rows (benchmarks/as_called.py)
        self.jsonl = None
        out = os.environ.get("OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            self.jsonl = open(Path(out) / "matmul.jsonl", "w")
        self.modules: dict = {}

    def log_row(self, row: dict, bench=None) -> None:
        self.rows.append(row)
        if self.jsonl:
            self.jsonl.write(json.dumps({**row, "bench": bench.to_json() if bench is not None else None}) + "\n")
            self.jsonl.flush()

    def compile(self, v: Variant, cell: Cell):
        key = (id(cell), tuple(sorted(v.defines.items())))
        if key not in self.modules:
            options = tuple(f"-D{k}={val}" for k, val in v.defines.items())
            arch = cell.arch or "sm_90"
            self.modules[key] = kernellab.compile_cuda(cell.source, arch=arch, options=options, first_line=2,
                                                       filename="cell.cu")
        return self.modules[key]

    def function(self, v: Variant, module, dtype_name: str):
        return variant_function(v, module, dtype_name)

    def inputs(self, family: str, dtype, M: int, N: int, K: int):
        return inputs(family, dtype, M, N, K)

    def reference(self, family: str):
        return reference(family)

    def baseline(self, family: str):
        return baseline(family)

    def check(self, v: Variant, fn, dtype_name: str, shapes, isolate=False) -> str:
        dtype = {"fp32": self.torch.float32, "bf16": self.torch.bfloat16, "fp16": self.torch.float16}[dtype_name]
        for M, N, K in shapes:
            rep = kernellab.check(fn, self.reference(v.family), self.inputs(v.family, dtype, M, N, K),
                                  trials=1 if isolate else 2, generator_device="cuda", isolate=isolate)
            if not rep.passed:
                return f"FAIL {dtype_name} {M}x{N}x{K}: {rep.message}"
        return "ok"

    def bench(self, v: Variant, fn, dtype_name: str, M: int, N: int, K: int, what: str):
        torch = self.torch
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        options = dict(rounds=3, min_reps=3, warmup_ms=0.0) if v.slow else {}
        if self.args.quick and not v.slow:
            options = dict(rep_ms=40.0, warmup_ms=10.0, rounds=5)
        itemsize = 4 if dtype_name == "fp32" else 2
        r = kernellab.bench(fn, self.inputs(v.family, dtype, M, N, K), baselines={"torch": self.baseline(v.family)},
                            flops=2 * M * N * K, bytes=itemsize * (M * K + K * N + M * N), generator_device="cuda",
                            name=v.label, **options)
        ratio = r.speedup("torch").ratio
        row = {"family": v.family, "variant": v.name, "config": v.config, "dtype": dtype_name,
               "shape": f"{M}x{N}x{K}", "check": what, "ms": r.median_ms, "tflops": r.tflops,
               "torch_ms": r.baselines[0].median_ms, "torch_tflops": r.baselines[0].tflops, "ratio": ratio,
               "spread": r.spread, "device": r.device}
        self.log_row(row, r)
        print(f"    {dtype_name} {M}x{N}x{K}: {r.median_ms:8.3f} ms {r.tflops:7.1f} TFLOP/s | torch "
              f"{r.baselines[0].median_ms:8.3f} ms {r.baselines[0].tflops:7.1f} | {ratio:6.1%} of torch", flush=True)
        if getattr(self.args, "as_called", False) and not v.slow:
            self.as_called(v, fn, dtype, dtype_name, M, N, K)
        return r

    def as_called(self, v: Variant, fn, dtype, dtype_name: str, M: int, N: int, K: int) -> None:
        """The variant as a registered op that allocates C (kernellab.op), against torch's matmul allocating its own,
        timed by kernellab.bench, do_bench and sustained=True in one run (benchmarks/as_called.py)."""
        import as_called

        torch = self.torch
        name = "klbench::mm_" + re.sub(r"\W", "_", f"{v.label}_{dtype_name}")
        sgemm = v.family == "sgemm"
        op = kernellab.op(name, "(Tensor A, Tensor B) -> Tensor", outputs=lambda A, B: kernellab.out(
            A, shape=(A.shape[0], B.shape[1] if sgemm else B.shape[0])))(
            lambda A, B: fn(A, B, A.new_empty(A.shape[0], B.shape[1] if sgemm else B.shape[0])))
        fns = {v.label: op, "torch": (lambda A, B: A @ B) if sgemm else (lambda A, B: A @ B.T)}
        make = inputs(v.family, dtype, M, N, K)
        ms = as_called.time_as_called(fns, lambda g: make(g)[:2], flops=2 * M * N * K, quick=self.args.quick,
                                      generator_device="cuda")
        for row in as_called.rows_for(ms, "torch"):
            row["label"] = f"{v.label} {dtype_name} {M}x{N}x{K}"
            self.called.append(row)
            print(f"      as called: " + ", ".join(f"{m} {x:.3f}x" for m, x in row["ratio"].items())
                  + (f" ({row['why']})" if row["why"] else ""), flush=True)

    def variant(self, v: Variant, cell: Cell, checks: dict, sizes: list, dtypes: list) -> dict:
        """Compile, probe (isolated), check, bench one variant; every failure is printed and returned, never raised."""
        print(f"\n{v.family} / {v.label}", flush=True)
        results = {}
        try:
            module = self.compile(v, cell)
        except Exception as exc:              # noqa: BLE001
            self.fail(v, "compile", exc)
            return results
        for dtype_name in dtypes:
            try:
                fn, kernel = self.function(v, module, dtype_name)
                r = kernel.resources
                if dtype_name == dtypes[0]:
                    print(f"  {kernel.name}: {r.registers} regs, {r.local_bytes} B local, spills "
                          f"{r.spill_store_bytes}/{r.spill_load_bytes} B | {kernel.instruction_summary.headline()}")
                # The first launches run in a worker: a fault or a hang (killed after 30 s) is reported there. The
                # wgmma kernel's probe includes a shape where every cluster walks several tiles (its phases wrap).
                probes = 2 if v.family == "hopper" else 1
                probe = self.check(v, fn, dtype_name, checks[:probes], isolate=True)
                status = probe if probe != "ok" else self.check(v, fn, dtype_name, checks[probes:])
                print(f"  check {dtype_name}: {status} ({', '.join(f'{m}x{n}x{k}' for m, n, k in checks)})",
                      flush=True)
                if status != "ok":
                    self.log_row({"family": v.family, "variant": v.name, "config": v.config, "dtype": dtype_name,
                                  "shape": "-", "check": status, "ms": None, "tflops": None, "torch_ms": None,
                                  "torch_tflops": None, "ratio": None})
                    continue
                for M, N, K in sizes.get(dtype_name, []) if isinstance(sizes, dict) else sizes:
                    results[(dtype_name, M, N, K)] = self.bench(v, fn, dtype_name, M, N, K, status)
            except Exception as exc:          # noqa: BLE001
                self.fail(v, f"{dtype_name}", exc)
        return results

    def fail(self, v: Variant, where: str, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}".splitlines()
        print(f"  ERROR ({where}): {text[0][:300]}", flush=True)
        if self.jsonl:
            self.jsonl.write(json.dumps({"family": v.family, "variant": v.name, "config": v.config,
                                         "error": traceback.format_exc()[-3000:]}) + "\n")
        self.log_row({"family": v.family, "variant": v.name, "config": v.config, "dtype": where, "shape": "-",
                      "check": f"ERROR {text[0][:60]}", "ms": None, "tflops": None, "torch_ms": None,
                      "torch_tflops": None, "ratio": None})


def best(results: dict, key) -> tuple:
    """(variant, ratio) of the fastest among {variant: {key: BenchResult}} at key."""
    scored = [(v, r[key].speedup("torch").ratio) for v, r in results.items() if key in r]
    return max(scored, key=lambda t: t[1]) if scored else (None, None)


def table(rows: list[dict]) -> str:
    head = ["family", "variant", "config", "dtype", "M x N x K", "check", "ms", "TFLOP/s", "torch ms", "vs torch"]
    lines = []
    for r in rows:
        fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
        lines.append([r["family"], r["variant"], r["config"][:26], r["dtype"], r["shape"], r["check"][:34],
                      fmt(r["ms"], ".3f"), fmt(r["tflops"], ".1f"), fmt(r["torch_ms"], ".3f"), fmt(r["ratio"], ".1%")])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


class Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)

    def flush(self):
        for st in self.streams:
            st.flush()


def all_variants(families, sms: int = 132) -> list[tuple[Variant, Cell]]:
    """Every variant of the full run with the cell it compiles."""
    c05, c06 = cuda_cells("05-matmul.py"), cuda_cells("06-tensor-cores.py")
    out = []
    if "sgemm" in families:
        out += [(v, cell_with(c05, v.kernels["fp32"])) for v in sgemm_variants(False)]
    if "tc" in families:
        out += [(v, cell_with(c06, v.kernels["bf16"])) for v in tc_variants(False)]
    if "hopper" in families:
        out += [(v, cell_with(c06, v.kernels["bf16"])) for v in hopper_variants(False, sms)]
    return out


def compile_only(families) -> int:
    """Compile every variant; print registers, spills, shared memory and the SASS headline; 1 if any fails."""
    failed = 0
    for v, cell in all_variants(families):
        options = tuple(f"-D{k}={val}" for k, val in v.defines.items())
        try:
            module = kernellab.compile_cuda(cell.source, arch=cell.arch or "sm_90", options=options, first_line=2,
                                            filename="cell.cu")
            for dtype_name, name in v.kernels.items():
                k, r = module[name], module[name].resources
                bad = r.spills or r.local_bytes
                failed += bool(bad)
                print(f"{'FAIL' if bad else 'ok  '} {v.label:38s} {name:16s} {r.registers:3d} regs "
                      f"{r.local_bytes:4d} B local smem {r.shared_bytes + v.smem:6d} B | "
                      f"{k.instruction_summary.headline()}")
        except Exception as exc:          # noqa: BLE001
            failed += 1
            print(f"FAIL {v.label}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    print(f"{'all variants compile' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the last step of each ladder, default tiles, fewer shapes")
    ap.add_argument("--only", choices=("sgemm", "tc", "hopper"), action="append", help="run one family (repeatable)")
    ap.add_argument("--compile-only", action="store_true", help="compile every variant (no GPU needed) and stop")
    ap.add_argument("--as-called", action="store_true", help="also time each variant as a registered op "
                    "(kernellab.op) under kernellab.bench, triton's do_bench and sustained=True, against torch")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))     # benchmarks/as_called.py
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        sys.stdout = Tee(sys.__stdout__, open(Path(out) / "matmul.log", "w"))
    if args.compile_only:
        return compile_only(args.only or ["sgemm", "tc", "hopper"])
    if not kernellab.has_gpu():
        print("benchmarks/matmul.py needs a CUDA GPU; none is usable here.")
        return 2
    import torch

    from kernellab.run.launch.device import device_info

    torch.backends.cuda.matmul.allow_tf32 = False       # cuBLAS's FP32 path for the SGEMM baseline
    kernellab.set_isolation(False, timeout_s=30.0)      # an isolated probe that runs longer than 30 s is a hang
    dev = device_info()
    t0 = time.time()
    print(f"device: {dev} | torch {torch.__version__} (CUDA {torch.version.cuda}) | kernellab {kernellab.__version__}"
          f" | {'quick' if args.quick else 'full'} run, {time.strftime('%Y-%m-%d %H:%M')}")
    families = args.only or ["sgemm", "tc", "hopper"]
    runner = Runner(args, torch)
    c05, c06 = cuda_cells("05-matmul.py"), cuda_cells("06-tensor-cores.py")
    big = [] if args.quick else [(8192, 8192, 8192)]

    if "sgemm" in families:
        checks = [(31, 33, 17), (1, 1, 1), (130, 260, 36), (4095, 4097, 1023)]
        found = {}
        for v in sgemm_variants(args.quick):
            sizes = [(4096, 4096, 4096)] if not (args.quick and v.slow) else []
            found[v.label] = runner.variant(v, cell_with(c05, v.kernels["fp32"]), checks if v.name in (
                "sgemm_cp", "sgemm_warptile", "sgemm_vec") or not args.quick else checks[:3], sizes, ["fp32"])
        warp = {k: r for k, r in found.items() if k.startswith(("sgemm_warptile", "sgemm_cp"))}
        label, _ = best(warp, ("fp32", 4096, 4096, 4096))
        if label:
            v = next(x for x in sgemm_variants(False) if x.label == label)
            print(f"\nthe fastest SGEMM here, {v.label}, across sizes:")
            sizes = ([(1024,) * 3, (2048,) * 3] if not args.quick else []) + big + [(4095, 4097, 1023)]
            runner.variant(v, cell_with(c05, v.kernels["fp32"]), checks[:1], sizes, ["fp32"])

    if "tc" in families:
        checks = [(130, 270, 40), (1, 1, 1), (15, 17, 33), (255, 129, 200), (4095, 4097, 1023)]
        found = {}
        for v in tc_variants(args.quick):
            found[v.label] = runner.variant(v, cell_with(c06, v.kernels["bf16"]), checks if v.config == "default"
                                            else checks[:1] + checks[-1:], {"bf16": [(4096,) * 3]}, ["bf16", "fp16"])
        pipes = {k: r for k, r in found.items() if k.startswith("mma_pipe")}
        label, _ = best(pipes, ("bf16", 4096, 4096, 4096))
        if label and not args.quick:
            v = next(x for x in tc_variants(False) if x.label == label)
            print(f"\nmma_pipe at its best tiles here ({v.config}) across sizes:")
            runner.variant(v, cell_with(c06, "mma_pipe_bf16"), checks[:1],
                           {"bf16": [(2048,) * 3] + big, "fp16": [(4096,) * 3]}, ["bf16", "fp16"])

    if "hopper" in families:
        if dev.arch != "sm_90":
            print(f"\nhopper: the wgmma kernel needs sm_90 (H100/H200); this GPU is {dev.arch}: skipped")
        else:
            # (2304, 2304, 264): 81 cluster tiles for at most 66 clusters, so clusters walk several tiles
            checks = [(130, 270, 40), (2304, 2304, 264), (1, 1, 1), (15, 17, 33), (255, 129, 200), (4095, 4097, 1023)]
            found = {}
            for v in hopper_variants(args.quick, dev.multiprocessors):
                sizes = {"bf16": [(4096,) * 3] + ([(8192,) * 3] if v.config == "default" or not args.quick else [])}
                found[v.label] = runner.variant(v, cell_with(c06, "wgmma_bf16"), checks if v.config == "default"
                                                else checks[:2] + checks[-1:], sizes, ["bf16", "fp16"])
            label, _ = best(found, ("bf16", 8192, 8192, 8192))
            if label:
                v = next(x for x in hopper_variants(False, dev.multiprocessors) if x.label == label)
                print(f"\nwgmma at its best tiles here ({v.config}) across sizes and in fp16:")
                sizes = {"bf16": ([(1024,) * 3, (2048,) * 3] if not args.quick else []) + [(4095, 4097, 1023)],
                         "fp16": [(4096,) * 3, (8192,) * 3]}
                runner.variant(v, cell_with(c06, "wgmma_bf16"), checks[:2], sizes, ["bf16", "fp16"])

    print(f"\n=== matmul ladder on {dev.name} ({dev.arch}, {dev.multiprocessors} SMs), "
          f"{time.time() - t0:.0f} s; vs torch = torch time / kernel time (> 100 %: faster than cuBLAS) ===")
    print("targets: the last SGEMM step (sgemm_cp) >= 90 % of torch.mm fp32 at 4096^3; mma_pipe >= 60 % of torch bf16; "
          "wgmma >= 95 % (goal 100 %) at 4096^3 and 8192^3")
    print(table(runner.rows))
    if runner.called:
        import as_called

        print("\nas called (registered ops allocating C, against torch's matmul allocating its own; speed-up by each "
              "timing method, one run):\n")
        print(as_called.markdown(runner.called, "variant, dtype, shape", "torch"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
