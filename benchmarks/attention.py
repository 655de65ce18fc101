"""Fused attention forward: tutorial 07's kernels against PyTorch's SDPA backends, checked and timed in one run.

Method. Kernels come from the `%%cuda` cells of notebooks/07-fused-attention.py (or `--source FILE`), compiled by
kernellab as the magic does. Correctness: `kernellab.check` on awkward shapes (N = 1, 63, 65, 1000, 1031, 4097),
both dtypes, head dims 64 and 128, causal and not; the reference is SDPA computed in float64; the table gives our
max error beside SDPA's own error (SDPA run in the input dtype against the same float64 reference). Speed: the
FlashAttention-3 paper's shapes (B * N = 16k, H * d = 2048, N = 1k..16k), FLOPs counted as 4 B H N^2 d (halved
for causal), every function timed by `kernellab.bench` in the same run (CUDA events, L2 flushed, medians over
alternating rounds); ratios are against SDPA's FLASH backend (FlashAttention-2) and CUDNN backend measured there.

    python benchmarks/attention.py                   # everything (about 4 minutes on an H100)
    python benchmarks/attention.py --quick           # N = 4096 only, fewer checks
    python benchmarks/attention.py --source dev.cu   # kernels from a file instead of the notebook
    python benchmarks/attention.py --as-called       # also as registered ops: kernellab.bench, do_bench, sustained
    python benchmarks/attention.py --grid [--quick]  # the entry point (kl::attention) against its own steps and SDPA
                                                     # on N = 128..16k, d 64/128, causal or not, B*H 16..512
    python benchmarks/attention.py --profile [SHAPE ...]   # Nsight Compute on each step at short N (16x512x64c, ...)
Logs go to $OUT (if set) as attention.json (attention_grid.json with --grid); the table is printed last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))      # notebook_cells: the tutorials' cells, as the tests read them

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import kernellab  # noqa: E402
from notebook_cells import cuda_cells  # noqa: E402
from kernellab.run.nvtools.ncu import stall_metrics  # noqa: E402

NOTEBOOK = "07-fused-attention.py"
CHECK_N = (1, 63, 65, 1000, 1031, 4097)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Twice kernellab.check's elementwise tolerance for the dtype: attention rounds twice (P to 16 bits before P V, then O),
# as SDPA's own kernels do. The gate that matters is the second: our error within 2x SDPA's own error.
TOL = {"bf16": 3.2e-2, "fp16": 4e-3}


ENTRY = re.compile(r"^(?P<family>[a-z0-9]+(?:_sched)?)_(?:bf16|f16)_d\d+(?:_causal)?(?:_bm\d+)?$")   # _bm128: a
# second height; fa3p_sched: step 3b with ping-pong scheduling (its tiles are fa3p's: FA3P_ defines)
DEFINE = re.compile(r"^#define\s+(FA\d[A-Z]*_\w+)\s+(\d+)\b", re.M)     # FA3_BN64, FA3P_WG64 (a variant's family)


def load_families(source: str | None, arch: str | None, options=()) -> tuple[dict, dict]:
    """({family: {entry name: Kernel}}, {family: {define: value}}) from the notebook's `%%cuda` cells (or one file).

    Families are the entry names' prefixes (`fa2_bf16_d64_causal` is family fa2); kernels named otherwise (the
    tutorial's CUDA-core kernel) are left out. Each family's tile configuration is read from its `#define FA<n>_...`
    lines, so the launch here always matches the source.
    """
    texts = ([pathlib.Path(source).read_text()] if source else
             [c for c in cuda_cells(NOTEBOOK) if not c.lstrip().startswith("// exercise:")])
    families: dict[str, dict] = {}
    configs: dict[str, dict] = {}
    for text in texts:
        wants_90a = "wgmma" in text or "setmaxnreg" in text
        mod = kernellab.compile_cuda(text, arch=("sm_90a" if wants_90a else arch), options=tuple(options),
                                     first_line=2, filename="cell.cu")
        defines = {k: int(v) for k, v in DEFINE.findall(text)}
        defines.update({o[2:].split("=")[0]: int(o.split("=")[1]) for o in options
                        if o.startswith("-D") and "=" in o and o.split("=")[1].isdigit()})
        for k in mod.kernels:
            m = ENTRY.match(k.name)
            if m:
                families.setdefault(m["family"], {})[k.name] = k
                configs[m["family"]] = {key.split("_", 1)[1]: v for key, v in defines.items()
                                        if key.startswith(m["family"].split("_")[0].upper() + "_")}
    return families, configs


def block_m(kernel, mt: int = 1) -> int:
    """Query rows per block: the launch bounds give the warps, each owning 16 * mt rows."""
    return kernel.resources.max_threads_per_block // 32 * 16 * mt


def smem_bytes(kernel, d: int, block_n: int, mt: int = 1) -> int:
    return (block_m(kernel, mt) + 4 * block_n) * d * 2


def launcher(family: dict, config: dict):
    """attention(q, k, v, out, causal) for a family, its tiles as its `#define`s say."""
    block_n = {d: config[f"BN{d}"] for d in (64, 128)}
    if any(p.name == "work_counter" for p in next(iter(family.values())).params):
        return make_persistent_launcher(family, block_n, {d: config.get(f"ST{d}", 2) for d in (64, 128)})
    if any(p.ctype.endswith("CUtensorMap") for p in next(iter(family.values())).params):
        return make_tma_launcher(family, block_n, {d: config.get(f"ST{d}", 2) for d in (64, 128)})
    return make_launcher(family, block_n, mt=config.get("MT", 1))


def entry(family: dict, q, causal: bool, suffix: str = ""):
    """The family's kernel for q's dtype and head dim, causal or not (fa2_bf16_d64_causal, ...; suffix: _bm128)."""
    prefix = ENTRY.match(next(iter(family)))["family"]
    dt = "bf16" if q.dtype == torch.bfloat16 else "f16"
    return family[f"{prefix}_{dt}_d{q.shape[-1]}{'_causal' if causal else ''}{suffix}"]


# The persistent kernels (tutorial 07, step 3b). At d = 64 they come in two heights, 192 query rows (3 consumer
# warpgroups) and 128 (2); a launch takes the one with the smaller predicted time: the query rows x key columns the
# kernel computes at that height (padding of the last query block and whole key tiles across the causal diagonal
# included) over its relative throughput, measured where neither height wastes anything (d = 64, N = 4096, not
# causal, H100: 414.0 / 481.7 TFLOP/s = 0.86; benchmarks/NOTES-attention.md).
RELATIVE_THROUGHPUT = {192: 1.0, 128: 0.86}
L2_SECTION_BYTES = 16 << 20           # the K/V of one L2 section's heads: a third of the H100's 50 MB L2


def computed_area(N: int, block_m: int, block_n: int, causal: bool) -> int:
    """Query rows x key columns one head's items compute, tiles counted whole (what the tensor cores do)."""
    tiles_all = math.ceil(N / block_n)
    return sum(block_m * block_n * (min(tiles_all, math.ceil((q + 1) * block_m / block_n)) if causal else tiles_all)
               for q in range(math.ceil(N / block_m)))


def persistent_block_m(N: int, d: int, causal: bool, block_n: int = 128) -> int:
    """The query block height for the persistent kernel: 128 at d = 128; at d = 64 the faster by the model above."""
    if d != 64:
        return 128
    return min(RELATIVE_THROUGHPUT, key=lambda bm: computed_area(N, bm, block_n, causal) / RELATIVE_THROUGHPUT[bm])


def section_heads(N: int, d: int, bh: int, elem_bytes: int = 2) -> int:
    """Heads per L2 section: as many as have their K and V within L2_SECTION_BYTES (at least 1, at most all)."""
    return max(1, min(bh, L2_SECTION_BYTES // (2 * N * d * elem_bytes)))


MEMO_ENTRIES = 64       # launch plans and tensor-map triples kept per launcher (cleared when full)


def _memo(memo: dict, key, make):
    """memo[key], made by make() the first time (the memo is emptied when it holds MEMO_ENTRIES)."""
    value = memo.get(key)
    if value is None:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        value = memo[key] = make()
    return value


def _maps_without_tensors(q, k, v, rows_q: int, rows_kv: int) -> tuple:
    """The three [B*H, N, d] tensor maps (64-column boxes), holding no tensor: they are memoised by the tensors'
    addresses, and the 128 bytes depend on the address, not on which tensor lives there, so the memo keeps no memory
    alive."""
    B, H, N, d = q.shape
    out = []
    for x, rows in ((q, rows_q), (k, rows_kv), (v, rows_kv)):
        m = kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64))
        bare = object.__new__(type(m))
        bare.__dict__.update(m.__dict__)
        bare.__dict__["tensor"] = None
        out.append(bare)
    return tuple(out)


# Each launcher below works out a launch (kernel, grid, block, shared memory, scalars) once per shape, dtype and mask,
# and its tensor maps once per set of addresses: a call then costs a dict lookup or two and the launch itself, so
# the op's host time stays near an SDPA call's (benchmarks/launch_overhead.py --ops).

def make_persistent_launcher(family: dict, block_n: dict, stages: dict, ctas: int | None = None):
    """attention(q, k, v, out, causal) for the persistent kernels: grid = min(SMs or `ctas`, work items), work items
    drawn from one zeroed int32 counter per device (each launch leaves it at 0)."""
    plans, maps = {}, {}

    def plan(q, causal):
        B, H, N, d = q.shape
        bm = persistent_block_m(N, d, causal, block_n[d])
        if bm == 128 and d == 64 and not any(n.endswith("_bm128") for n in family):
            bm = 192                          # a family with one height (fa3p_sched)
        kern = entry(family, q, causal, "_bm128" if d == 64 and bm == 128 else "")
        assert kern.resources.max_threads_per_block == 128 * (bm // 64 + 1), kern.name
        counter = torch.zeros(1, dtype=torch.int32, device=q.device)
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        smem = 1024 + (2 * bm + 2 * stages[d] * block_n[d]) * d * 2 + 256     # slack, 2 Q buffers, K/V stages, barriers
        items = math.ceil(N / bm) * B * H
        launch = kern[(min(ctas or sms, items),), 128 * (bm // 64 + 1), smem]
        return launch, bm, (N, B * H, section_heads(N, d, B * H), counter, d ** -0.5)

    def attention(q, k, v, out, causal=False):
        key = (q.shape, q.dtype, q.device, causal)
        launch, bm, tail = _memo(plans, key, lambda: plan(q, causal))
        bn = block_n[q.shape[3]]
        tm = _memo(maps, (q.data_ptr(), k.data_ptr(), v.data_ptr(), key),
                   lambda: _maps_without_tensors(q, k, v, bm, bn))
        launch(*tm, out, *tail)
        return out
    return attention


def make_launcher(family: dict, block_n: dict, mt: int = 1):
    """attention(q, k, v, out, causal) for kernels taking pointers: Q tile, two K and two V tiles in shared memory."""
    plans = {}

    def plan(q, causal):
        B, H, N, d = q.shape
        kern = entry(family, q, causal)
        grid = (math.ceil(N / block_m(kern, mt)), B * H)
        lse = (None,) if any(p.name == "lse" for p in kern.params) else ()     # step 2's log-sum-exp: not stored
        return kern[grid, kern.resources.max_threads_per_block, smem_bytes(kern, d, block_n[d], mt)], lse + (N, d ** -0.5)

    def attention(q, k, v, out, causal=False):
        launch, tail = _memo(plans, (q.shape, q.dtype, q.device, causal), lambda: plan(q, causal))
        launch(q, k, v, out, *tail)
        return out
    return attention


def make_tma_launcher(family: dict, block_n: dict, stages: dict):
    """attention(q, k, v, out, causal) for kernels that read Q, K, V through tensor maps ([BH, N, d], 64-column boxes)."""
    plans, maps = {}, {}

    def plan(q, causal):
        B, H, N, d = q.shape
        kern = entry(family, q, causal)
        threads = kern.resources.max_threads_per_block          # one producer + consumer warpgroups of 64 rows
        bm, bn = 64 * (threads // 128 - 1), block_n[d]
        smem = 1024 + (bm + 2 * stages[d] * bn) * d * 2 + 256
        return kern[(math.ceil(N / bm), B * H), threads, smem], bm, bn, (N, d ** -0.5)

    def attention(q, k, v, out, causal=False):
        key = (q.shape, q.dtype, q.device, causal)
        launch, bm, bn, tail = _memo(plans, key, lambda: plan(q, causal))
        tm = _memo(maps, (q.data_ptr(), k.data_ptr(), v.data_ptr(), key), lambda: _maps_without_tensors(q, k, v, bm, bn))
        launch(*tm, out, *tail)
        return out
    return attention


def sdpa(backend):
    def f(q, k, v, out, causal=False):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


def naive(q, k, v, out, causal=False):
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)                 # [B, H, N, N]
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def inputs_for(B, H, N, d, dtype):
    def make(g):
        q, k, v = (torch.randn(B, H, N, d, generator=g).to(dtype).cuda() for _ in range(3))
        return q, k, v, torch.empty_like(q)
    return make


def run_checks(name, attention, quick, log=None, dtypes=tuple(DTYPES), dims=(64, 128), masks=(False, True)):
    """kernellab.check on each (dtype, d, causal, N); one row each, our error beside SDPA's own."""
    rows = []
    ns = (1, 65, 1031) if quick else CHECK_N
    for dname in dtypes:
        dtype = DTYPES[dname]
        for d in dims:
            for causal in masks:
                for N in ns:
                    B, H = (1, 2) if N > 2000 else (2, 3)
                    try:
                        rep = kernellab.check(lambda q, k, v, o: attention(q, k, v, o, causal),
                                              lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v,
                                                                                                is_causal=causal),
                                              inputs_for(B, H, N, d, dtype), trials=2, atol=TOL[dname],
                                              rtol=TOL[dname])
                        own = rep.reference_own_error
                        ok = rep.passed and (own is None or rep.max_abs_error <= 2 * own + 1e-6)
                        rows.append(dict(kernel=name, dtype=dname, d=d, causal=causal, N=N, passed=rep.passed,
                                         err=rep.max_abs_error, sdpa_err=own, within_2x=ok, message=rep.message))
                    except Exception as exc:
                        rows.append(dict(kernel=name, dtype=dname, d=d, causal=causal, N=N, passed=False,
                                         err=None, sdpa_err=None, within_2x=False,
                                         message=f"{type(exc).__name__}: {exc}"[:300]))
                        if log is not None:
                            log.write(traceback.format_exc())
    return rows


def run_bench(ours: dict, quick, log, dtypes=("bf16",), ns=None, dims=(64, 128), slow_baselines=True):
    """Each family against SDPA's backends (slow_baselines: also EFFICIENT, and MATH and naive at N <= 4096)."""
    rows = []
    ns = ns or ((4096,) if quick else (1024, 2048, 4096, 8192, 16384))
    baselines_all = {"FLASH": sdpa(SDPBackend.FLASH_ATTENTION), "CUDNN": sdpa(SDPBackend.CUDNN_ATTENTION)}
    if slow_baselines:
        baselines_all["EFFICIENT"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for d in dims:
            for causal in (False, True):
                for N in ns:
                    B, H = 16384 // N, 2048 // d
                    flops = 4 * B * H * N * N * d / (2 if causal else 1)
                    fns = {f"{k}": (lambda f: (lambda q, kk, v, o: f(q, kk, v, o, causal)))(f) for k, f in ours.items()}
                    base = {k: (lambda f: (lambda q, kk, v, o: f(q, kk, v, o, causal)))(f)
                            for k, f in baselines_all.items()}
                    if N <= 4096 and not quick and slow_baselines:
                        base["MATH"] = lambda q, kk, v, o: sdpa(SDPBackend.MATH)(q, kk, v, o, causal)
                        base["naive"] = lambda q, kk, v, o: naive(q, kk, v, o, causal)
                    # baselines that cannot run on this device/shape are dropped, and the row says so
                    probe = inputs_for(B, H, N, d, dtype)(torch.Generator().manual_seed(0))
                    dropped = []
                    for bname in list(base):
                        try:
                            base[bname](*probe)
                            torch.cuda.synchronize()
                        except Exception as exc:
                            dropped.append(f"{bname}: {type(exc).__name__}")
                            base.pop(bname)
                    del probe
                    first, *rest = fns
                    try:
                        res = kernellab.bench(fns[first], inputs_for(B, H, N, d, dtype),
                                              baselines={**{r: fns[r] for r in rest}, **base}, flops=flops,
                                              name=first, rounds=6 if quick else 8, rep_ms=60, warmup_ms=20)
                    except Exception as exc:
                        log.write(traceback.format_exc())
                        rows.append(dict(dtype=dname, d=d, causal=causal, N=N, B=B, H=H, error=str(exc)[:300]))
                        continue
                    all_res = {first: res, **{b.name: b for b in res.baselines}}
                    row = dict(dtype=dname, d=d, causal=causal, N=N, B=B, H=H, dropped=dropped,
                               ms={k: r.median_ms for k, r in all_res.items()},
                               tflops={k: r.tflops for k, r in all_res.items()})
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    torch.cuda.empty_cache()
    return rows


def register_ops(ours: dict) -> dict:
    """Each family's launcher as a registered op (kernellab.op), called as a model calls it: attention(q, k, v, causal)
    allocates its output, its launches do not wait."""
    def as_op(fam, att):
        @kernellab.op(f"klbench::attention_{fam}", "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor",
                      outputs=lambda q, k, v, causal: q)
        def attention(q, k, v, causal):
            return att(q, k, v, torch.empty_like(q), causal)
        return attention
    return {fam: as_op(fam, att) for fam, att in ours.items()}


def run_as_called(ours: dict, quick, log, ns=None, dims=(64, 128)) -> list[dict]:
    """The families as registered ops against SDPA FLASH, timed by kernellab.bench, do_bench and sustained=True in one
    run (benchmarks/as_called.py), on the FlashAttention-3 shapes."""
    import as_called

    ops = register_ops(ours)
    rows = []
    for d in dims:
        for causal in (False, True):
            for N in ns or ((4096,) if quick else (1024, 4096, 16384)):
                B, H = 16384 // N, 2048 // d
                fns = {fam: (lambda op: lambda q, k, v: op(q, k, v, causal))(op) for fam, op in ops.items()}
                fns["FLASH"] = lambda q, k, v: sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, None, causal)
                make = inputs_for(B, H, N, d, torch.bfloat16)
                ms = as_called.time_as_called(fns, lambda g: make(g)[:3],
                                              flops=4 * B * H * N * N * d / (2 if causal else 1), quick=quick)
                for row in as_called.rows_for(ms, "FLASH"):
                    row["label"] = f"{row['name']} bf16 d={d} N={N} {'causal' if causal else 'full'}"
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                torch.cuda.empty_cache()
    return rows


# -- the grid: tutorial 07's entry point against its own steps and SDPA on the shapes models use --------------------
GRID_N = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
GRID_BH = (16, 64, 256, 512)
GRID_TOKENS = 1 << 21          # B*H*N at most 2M (N = 16k with B*H <= 128): one call stays under ~20 ms
QUICK_N, QUICK_BH = (128, 512, 2048, 8192), (16, 256)
STEPS = {64: ("fa2", "fa3", "fa3p", "fa3p_bm128", "fa3p_bm64"), 128: ("fa2", "fa3", "fa3p")}


def grid_shapes(quick: bool) -> list[tuple[int, int, int, int, bool]]:
    """(B, H, N, d, causal) of the grid: H = 16 heads (B*H = 16 is one sequence), B*H*N <= GRID_TOKENS."""
    ns, bhs = (QUICK_N, QUICK_BH) if quick else (GRID_N, GRID_BH)
    shapes = [(max(1, bh // 16), min(bh, 16), N, d, causal) for d in (64, 128) for causal in (False, True)
              for N in ns for bh in bhs if bh * N <= GRID_TOKENS]
    # cheapest first, so that a time budget leaves out the longest calls
    return sorted(shapes, key=lambda s: (s[0] * s[1] * s[2] * s[2] * s[3] / (2 if s[4] else 1), s))


IN_THE_RUNNING = 1.3      # steps predicted within this factor of the plan's time are timed (the fit's worst: 15 %)
GRID_MIN_REPS, GRID_MAX_REPS = 8, 400   # per function: 8 calls of 10-40 ms are enough; 400 of 10 µs take 0.1 s


def steps_in_the_running(plan, all_steps: bool = False) -> list[str]:
    """The steps the grid times at one shape: every one with `all_steps`, else those the model predicts within
    IN_THE_RUNNING of its choice (the choice included): a step predicted 1.3x slower than the plan's is out of the
    running, and timing it three ways is most of a long shape's time."""
    best = plan.estimate.predicted_us
    return [e.kernel for e in plan.alternatives if all_steps or e.predicted_us <= IN_THE_RUNNING * best]


# The grid's wall time, predicted from the plan's own GPU times before anything runs (what --grid prints first, and
# what tests/test_attention_dispatch.py holds the quick grid to). Per function and method: kernellab.bench's warm-up
# (3 calls, then 20 ms of calls) and repetitions (40 ms of calls, 8 to GRID_MAX_REPS), each call at least the L2
# flush (2 x 50 MB written: ~35 µs) or its host path (~100 µs with the flush's and the events' launches), the GPU idle
# as long again between batches (below the power cap); sustained: 500 ms of warm-up calls; do_bench: 25 + 50 ms and
# five estimate calls. SDPA FLASH is taken at step 2's time x 1.15 and CUDNN at step 3b's (the FlashAttention-3
# shapes' ratios); a shape costs SHAPE_OVERHEAD_S more (inputs, first calls, the clock's set-up, integrity checks).
SHAPE_OVERHEAD_S = 1.0
START_S = 25.0                     # CUDA context, tutorial 07 compiled and loaded, the ops registered

# The paired timing (time_paired): the entry point and the step it chose, just timed and warm, again by one
# kernellab.bench call on the sequence entry, step, step, entry (four functions to bench; rounds repeat the sequence):
# 2 ms of warm-up and 10 ms of repetitions a position in 4 rounds, 4 to 100 a position (each kernel 8 to 200 in all:
# 8 where a call takes milliseconds, whose calls spread far less than the 3 % in question), without the integrity
# re-check that the shape's main timing already made of the same functions on the same inputs.
# The call costs PAIR_BENCH_OVERHEAD_S more: each position's first call, the input sets (up to twice the L2 of
# them), the other-stream probe.
PAIR_POSITIONS = 4
PAIR_OPTIONS = dict(rounds=4, warmup_ms=2.0, rep_ms=10.0, min_reps=4, max_reps=100)
PAIR_BENCH_OVERHEAD_S = 0.25


def _method_s(ms: float, warmup_ms: float, rep_ms: float, idle: bool, min_reps: int, max_reps: int) -> float:
    """Seconds kernellab.bench spends on one function of `ms` a call (see above)."""
    per_call = max(ms, 0.035) + 0.1 if ms < 0.1 else ms + 0.035
    calls = 3 + min(max_reps, math.ceil(warmup_ms / ms)) + min(max_reps, max(min_reps, round(rep_ms / ms)))
    gpu_share = min(1.0, ms / per_call)
    return calls * per_call * (1 + gpu_share if idle else 1) / 1e3


def grid_seconds(shapes, all_steps: bool = False, sms: int = 132, every_method: bool = False,
                 min_reps: int = GRID_MIN_REPS, max_reps: int = GRID_MAX_REPS, paired: bool = True) -> float:
    """Predicted wall time of run_grid on `shapes` (see above): the budget check for the quick and full grids.
    every_method, min_reps=20, max_reps=10_000, all_steps, paired=False: how the grid was timed before (every function
    by all three methods), which the first H100 run measured: 16 shapes in 224 s. paired: each shape's entry point and
    its chosen step timed again in both orders (time_paired: PAIR_POSITIONS functions to bench, PAIR_OPTIONS, and
    PAIR_BENCH_OVERHEAD_S; a third kernel, the fastest other step where it led, is rare and not counted)."""
    from kernellab.teach.attention_plan import plan_attention

    total = START_S
    for B, H, N, d, causal in shapes:
        plan = plan_attention(B, H, N, d, causal, "bf16", sms)
        us = {e.kernel: e.predicted_us for e in plan.alternatives}
        steps = steps_in_the_running(plan, all_steps)
        flash, cudnn = us["fa2"] * 1.15 / 1e3, us["fa3p"] / 1e3
        entry = plan.estimate.predicted_us / 1e3
        bench = [entry, flash, cudnn] + [us[s] / 1e3 for s in steps]
        others = bench if every_method else [entry, flash, cudnn]
        total += SHAPE_OVERHEAD_S + sum(_method_s(ms, 20, 40, True, min_reps, max_reps) for ms in bench)
        total += sum(_method_s(ms, 500, 40, False, min_reps, max_reps) for ms in others)
        total += sum(0.075 + 5 * (ms + 0.1) / 1e3 for ms in others)
        if paired:
            o = PAIR_OPTIONS
            total += PAIR_BENCH_OVERHEAD_S + PAIR_POSITIONS * _method_s(
                entry, o["warmup_ms"], o["rep_ms"], True, o["min_reps"], o["max_reps"])
    return total


def gpu_inputs_for(B, H, N, d, dtype):
    """inputs(generator) -> (q, k, v), made on the GPU by a CUDA generator (a CPU randn of 800 M values at the grid's
    largest shapes takes seconds, made four times a shape)."""
    def make(g):
        return tuple(torch.randn(B, H, N, d, generator=g, device=g.device, dtype=dtype) for _ in range(3))
    return make


# -- the entry point against the step it chose, timed again in both orders --------------------------------------------
# The shape's main timing runs the entry point first in every round (kernellab.bench alternates its function and its
# baselines in one fixed order), and at a few small shapes the entry point's call of the step it chose, the same
# kernel, timed a few per cent above the step's own. So each shape times that pair again, in both orders, and the
# verdict compares the two on that: the gap is the geometric mean over the orders of entry / step (an order effect
# that favours whichever runs first or second cancels), the spread is how far the repeated measurements of the same
# kernel moved between the orders (the larger of the entry point's and the step's), and a gap inside the spread is
# noise, not a loss. The steps are timed by kernellab.bench alone in the grid (do_bench and sustained time only the
# entry point and SDPA), so the pair is too.


def paired_names(bench_ms: dict, choice: str) -> list[str]:
    """The functions one shape times again in both orders, from its main kernellab.bench times (name -> ms): the entry
    point and the step it chose (the same kernel), and the fastest other step where that timed below the entry point
    (then the plan chose a slower step, or seemed to); [] where the entry point or its choice was not timed."""
    if "entry" not in bench_ms or choice not in bench_ms:
        return []
    others = {s: v for s, v in bench_ms.items() if s not in ("entry", "FLASH", "CUDNN", choice)}
    best = min(others, key=others.get) if others else None
    return ["entry", choice] + ([best] if best and others[best] < bench_ms["entry"] else [])


def time_paired(timer, names: list[str]) -> dict:
    """The paired timing of `names` (the entry point first): one timer call on the sequence A B ... B A (the names,
    then the same reversed: each function timed once before the others and once after them, in one run whose rounds
    repeat that sequence); timer(sequence) -> [ms at each position]. Returns {"method", "orders": [the names, the
    names reversed], "ms": {name: [ms in the first order, ms in the second]}} (JSON, kept in the grid's row)."""
    orders = [list(names), list(reversed(names))]
    sequence = orders[0] + orders[1]
    got = [float(x) for x in timer(sequence)]
    if len(got) != len(sequence):
        raise ValueError(f"the paired timer gave {len(got)} times for the {len(sequence)} positions of {sequence}")
    half = len(names)
    return {"method": "kernellab.bench", "orders": orders,
            "ms": {n: [got[orders[0].index(n)], got[half + orders[1].index(n)]] for n in names}}


def position_labels(sequence: list[str]) -> list[str]:
    """A name per position of a paired sequence, unique as kernellab.bench needs them: a name's second position
    'NAME again' ('entry', 'fa3p', 'fa3p again', 'entry again')."""
    return [n if n not in sequence[:i] else f"{n} again" for i, n in enumerate(sequence)]


def bench_timer(fns: dict, inputs, *, flops=None, generator_device: str = "cuda", clock=None, **options):
    """timer(sequence) -> [median ms at each position] for time_paired: one kernellab.bench call whose functions are
    the sequence's, in that order (the first as bench's function, the rest as its baselines, position_labels naming
    them: warmed up in that order, and every round times them in that order, so A B B A runs A B B A A B B A ...),
    PAIR_OPTIONS unless `options` say otherwise; `clock` replaces the CUDA clock (tests)."""
    def timer(sequence):
        labels = position_labels(sequence)
        r = kernellab.bench(fns[sequence[0]], inputs, baselines={x: fns[n] for x, n in zip(labels[1:], sequence[1:])},
                            name=labels[0], flops=flops, generator_device=generator_device, timer=clock,
                            verify=False, **{**PAIR_OPTIONS, **options})
        got = {r.name: r.median_ms, **{b.name: b.median_ms for b in r.baselines}}
        return [got[x] for x in labels]
    return timer


def paired_gap(paired: dict, step: str, tolerance: float = 0.03) -> dict:
    """The entry point against `step` on the paired timing: {"step", "gap" (the geometric mean over the orders of
    entry / step, minus 1: > 0 the entry point slower), "spread" (the spread of the repeated measurements of the same
    kernel: the largest max / min - 1 of the entry point's and of the step's times across the orders), "ratios"
    (entry / step in each order), "entry_first" (which orders had the entry point before the step), "finding"}.
    finding: "faster" (gap <= 0), "noise" (a gap inside the spread), "order" (noise whose sign follows the order: the
    entry point slower only in the orders where it ran first, or only where it ran second), "within tolerance" (beyond
    the spread, not beyond `tolerance`), "loss" (beyond both)."""
    e, s = paired["ms"]["entry"], paired["ms"][step]
    ratios = [a / b for a, b in zip(e, s)]
    gap = math.exp(statistics.fmean(math.log(r) for r in ratios)) - 1
    spread = max(max(t) / min(t) - 1 for t in (e, s))
    entry_first = [o.index("entry") < o.index(step) for o in paired["orders"]]
    slower_at = {f for f, x in zip(entry_first, ratios) if x > 1}       # the positions where the entry was slower
    not_at = {f for f, x in zip(entry_first, ratios) if x <= 1}
    if gap <= 0:
        finding = "faster"
    elif gap <= spread:
        finding = "order" if len(slower_at) == 1 and not slower_at & not_at and not_at else "noise"
    elif gap <= tolerance:
        finding = "within tolerance"
    else:
        finding = "loss"
    return {"step": step, "gap": gap, "spread": spread, "ratios": ratios, "entry_first": entry_first,
            "finding": finding}


def paired_judgement(r: dict, tolerance: float = 0.03) -> dict | None:
    """A grid row's paired finding: paired_gap against each step of its pair, the one the entry point trails most
    (the largest gap); None where the row has no paired timing."""
    paired = r.get("paired")
    if not paired:
        return None
    gaps = [paired_gap(paired, s, tolerance) for s in paired["ms"] if s != "entry"]
    return max(gaps, key=lambda g: g["gap"]) if gaps else None


def paired_words(g: dict) -> str:
    """One paired finding in words: 'entry +2.5% over fa3p (spread 4.9%; entry / step by order 1.050 / 1.000): order
    (inside the spread: slower only with the entry point timed first)'."""
    said = {"faster": "as fast or faster", "noise": "noise (inside the spread)", "within tolerance":
            "beyond the spread, within the tolerance", "loss": "LOSS (beyond the spread and the tolerance)"}
    if g["finding"] == "order":
        where = "first" if next(f for f, r in zip(g["entry_first"], g["ratios"]) if r > 1) else "second"
        word = f"order (inside the spread: slower only with the entry point timed {where})"
    else:
        word = said[g["finding"]]
    each = " / ".join(f"{r:.3f}" for r in g["ratios"])
    return f"entry {g['gap']:+.1%} over {g['step']} (spread {g['spread']:.1%}; entry / step by order {each}): {word}"


def run_grid(quick: bool, log, budget_s: float, dtype=torch.bfloat16, all_steps: bool = False
             ) -> tuple[list[dict], list[str]]:
    """Every grid shape timed as called (benchmarks/as_called.py): the entry point as the `kl::attention` op a model
    calls, each step of 07 in the running (steps_in_the_running; all with `all_steps`) forced through the entry
    point's launch path (a registered op taking the step's name), SDPA FLASH and CUDNN, under kernellab.bench; the
    entry point, FLASH and CUDNN also under do_bench and sustained=True (their ratios are the columns; the steps are
    judged by kernellab.bench, the GPU's time, which is what the plan predicts); then the entry point and the step it
    chose (with the fastest other step where that led) timed again by kernellab.bench in both orders, the row's
    `paired` (time_paired), which the verdict judges them by. Returns (rows, shapes left out past the time budget)."""
    import as_called
    from notebook_cells import load_tutorial

    t0 = time.time()
    ns = load_tutorial(NOTEBOOK)
    attention, plan_for, entry_op = ns["attention"], ns["attention_plan"], ns["kl_attention"]
    print(f"tutorial 07 compiled and loaded in {time.time() - t0:.0f} s", flush=True)

    @kernellab.op("klgrid::attention_step", "(Tensor q, Tensor k, Tensor v, bool causal, str kernel) -> Tensor",
                  outputs=lambda q, k, v, causal, kernel: q)
    def step_op(q, k, v, causal, kernel):
        return attention(q, k, v, causal=causal, kernel=kernel)

    rows, skipped, golden = [], [], golden_grid(device=torch.cuda.get_device_name())
    for B, H, N, d, causal in grid_shapes(quick):
        label = f"B*H={B * H} N={N} d={d} {'causal' if causal else 'full'}"
        if time.time() - t0 > budget_s:
            skipped.append(label)
            continue
        flops = 4 * B * H * N * N * d / (2 if causal else 1)
        make = gpu_inputs_for(B, H, N, d, dtype)
        probe = make(torch.Generator("cuda").manual_seed(0))
        plan = plan_for(probe[0], causal)
        fns = {"entry": lambda q, k, v: entry_op(q, k, v, causal)}
        steps = steps_in_the_running(plan, all_steps)
        old = golden_choice((B, H, N, d, causal), golden, plan.kernel)   # where the choice moved, time both
        steps += [old] if old and old not in steps else []
        fns.update({s: (lambda s: lambda q, k, v: step_op(q, k, v, causal, s))(s) for s in steps})
        fns["FLASH"] = lambda q, k, v: sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, None, causal)
        fns["CUDNN"] = lambda q, k, v: sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, None, causal)
        dropped = []
        for name in list(fns):                  # a backend that cannot run this shape here is dropped, and said so
            try:
                fns[name](*probe)
                torch.cuda.synchronize()
            except Exception as exc:
                dropped.append(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
                fns.pop(name)
        del probe
        row = dict(B=B, H=H, N=N, d=d, causal=causal, label=label, choice=plan.kernel, entry=plan.entry,
                   predicted_us={e.kernel: e.predicted_us for e in plan.alternatives},
                   predicted_gpu_us={e.kernel: e.gpu_us for e in plan.alternatives},
                   host_bound=plan.estimate.host_bound, constants=plan.constants,
                   sms=torch.cuda.get_device_properties(0).multi_processor_count, dropped=dropped)
        if "entry" not in fns:
            row["error"] = "; ".join(dropped)
        else:
            try:
                row["ms"] = as_called.time_as_called(fns, make, flops=flops, quick=True, generator_device="cuda",
                                                     only={"sustained": ("FLASH", "CUDNN"),
                                                           "do_bench": ("FLASH", "CUDNN")},
                                                     min_reps=GRID_MIN_REPS, max_reps=GRID_MAX_REPS)
                row["left_out"] = sorted(set(STEPS[d]) - set(fns))
            except Exception as exc:
                log.write(traceback.format_exc())
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        names = paired_names(row["ms"]["kernellab.bench"], plan.kernel) if "ms" in row else []
        if names:                               # the entry point and its step again, in both orders (time_paired)
            try:
                row["paired"] = time_paired(bench_timer({n: fns[n] for n in names}, make, flops=flops), names)
            except Exception as exc:
                log.write(traceback.format_exc())
                row["paired_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
        log.write(json.dumps(row, default=str) + "\n")
        log.flush()
        print_grid_row(row, flush=True)
        torch.cuda.empty_cache()
    return rows, skipped


def golden_grid(table: str = "quick_grid", device: str | None = None) -> dict[tuple, dict]:
    """{(B, H, N, d, causal): row} of the golden run that kernellab.teach.attention_plan's constants for `device` (a
    driver name; None: the H100's) are fitted to (attention_plan_h100.json or _h200.json: the quick grid on that GPU):
    its `entry_chose` is the plan's choice of that day, its `us` the times then."""
    from kernellab.teach.attention_plan import constants_for

    path = constants_for(device).golden
    data = json.loads(path.read_text())[table]
    return {(r["B"], r["H"], r["N"], r["d"], r["causal"]): dict(r, device=data["device"], date=data["date"],
                                                                file=path.name) for r in data["rows"]}


def golden_table(device: str, date: str, rows: list[dict], skipped: list[str]) -> dict:
    """A grid run as a golden table's "quick_grid" (kernellab/teach/attention_plan_<gpu>.json, which
    attention_plan.fit_golden refits that GPU's constants to): each row's times in µs to 2 decimals, the step its
    entry point ran as `entry_chose`; failed rows left out."""
    timed = [r for r in rows if "ms" in r]
    return {"source": f"benchmarks/attention.py --grid --quick (`python3 tools/gpu/run.py bench-attention-grid`), "
                      f"{len(timed)} shapes ({len(skipped)} left out past the budget): its attention_grid.json, ms "
                      f"turned into µs",
            "device": device, "date": date, "dtype": "bf16",
            "timing": "median µs a call as called (benchmarks/as_called.py), kernellab.bench: the entry point "
                      "('entry', the kernel in entry_chose) and each step the model of that day predicted within "
                      "1.3x of its choice (benchmarks/attention.py steps_in_the_running), forced through the entry "
                      "point's launch path; do_bench and sustained: the entry, FLASH and CUDNN only",
            "rows": [dict(B=r["B"], H=r["H"], N=r["N"], d=r["d"], causal=r["causal"],
                          us={m: {k: round(v * 1e3, 2) for k, v in t.items()} for m, t in r["ms"].items()},
                          entry_chose=r["choice"]) for r in timed]}


def golden_json(tables: dict) -> str:
    """A golden table file's text, laid out as kernellab/teach/attention_plan_*.json are kept: one row a line."""
    parts = []
    for name, t in tables.items():
        if not isinstance(t, dict):
            parts.append(f" {json.dumps(name)}: {json.dumps(t, ensure_ascii=False)}")
            continue
        head = "".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n"
                       for k, v in t.items() if k != "rows")
        rows = ",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in t["rows"])
        parts.append(f' {json.dumps(name)}: {{\n{head}  "rows": [\n{rows}\n   ]\n }}')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def golden_choice(shape: tuple, golden: dict[tuple, dict], chosen: str) -> str | None:
    """The golden run's choice at a shape where the plan now picks another step, `chosen` (the grid times the old
    choice too, so that the run confirms the change or not); None where they agree or the golden run has no such
    shape."""
    old = golden.get(shape, {}).get("entry_chose")
    return old if old and old != chosen else None


def plan_change_lines(rows: list[dict], golden: dict[tuple, dict]) -> list[str]:
    """Per shape where this run's plan differs from the golden run's choice: the old and the new choice, each step's
    time in this run and in the golden run (kernellab.bench, µs; the entry point's own time beside the step's where
    it ran that step: the new choice here, the old one in the golden run), and whether the change paid here."""
    if not golden:
        return ["plan against the golden run: no golden run to compare with"]
    changed = [(r, golden[k]) for r in rows if (k := (r["B"], r["H"], r["N"], r["d"], r["causal"])) in golden
               and golden_choice(k, golden, r["choice"])]
    g0 = next(iter(golden.values()))
    lines = [f"plan changed from the golden run's choice ({g0['device']}, {g0['date']}, "
             f"kernellab/teach/{g0.get('file', 'attention_plan_h100.json')}): {len(changed)} shape(s)"]
    for r, g in changed:
        old, new = g["entry_chose"], r["choice"]
        now = {s: v * 1e3 for s, v in r.get("ms", {}).get("kernellab.bench", {}).items()}
        then = g["us"]["kernellab.bench"]

        def us(times, s, ran):
            entry = f" (entry {times['entry']:.1f})" if s == ran and "entry" in times else ""
            return (f"{times[s]:.1f}" if s in times else "not timed") + entry

        if old in now and new in now:
            verdict = (f"the new choice {now[old] / now[new]:.2f}x the old's speed here: "
                       + ("confirmed" if now[new] <= now[old] * 1.03 else "NOT confirmed (slower by over 3 %)"))
        else:
            verdict = "not confirmed: " + ("the shape failed" if "error" in r else "a step was not timed")
        lines.append(f"  {r['label']}: {old} -> {new}: this run {old} {us(now, old, new)} µs, {new} "
                     f"{us(now, new, new)} µs; golden run {old} {us(then, old, old)} µs, {new} {us(then, new, old)} "
                     f"µs; {verdict}")
    return lines


GRID_HEAD = (f"{'B*H':>4s} {'N':>6s} {'d':>4s} {'mask':6s} | {'choice':10s} {'entry µs':>9s} | {'best step':>16s} | "
             f"{'FLASH':>8s} {'CUDNN':>8s} | entry vs FLASH: bench / do_bench / sustained | vs CUDNN | vs best step"
             f" | {'paired: entry vs step, spread':>30s} | every step, µs")


def paired_cell(r: dict) -> str:
    """The table's paired column: the entry point's gap over the step it trails most on the paired timing, the
    spread, the finding and that step ('+2.5% ±5.0% order (fa3p)'); 'failed' where the paired timing raised, '-' where
    there was none."""
    g = paired_judgement(r)
    if g is None:
        return "failed" if "paired_error" in r else "-"
    return f"{g['gap']:+.1%} ±{g['spread']:.1%} {g['finding']} ({g['step']})"


def print_grid_row(r: dict, flush: bool = False) -> None:
    """One grid row: times under kernellab.bench (µs), ratios by each method."""
    head = f"{r['B'] * r['H']:4d} {r['N']:6d} {r['d']:4d} {'causal' if r['causal'] else 'full':6s} | "
    if "error" in r:
        print(head + f"error: {r['error']}", flush=flush)
        return
    ms = r["ms"]
    b = ms["kernellab.bench"]
    steps = {s: v for s, v in b.items() if s not in ("entry", "FLASH", "CUDNN")}
    best = min(steps, key=steps.get) if steps else None
    ratio = {m: (ms[m]["FLASH"] / ms[m]["entry"] if "FLASH" in ms[m] else float("nan")) for m in ms}
    cells = " / ".join(f"{ratio[m]:.2f}x" if m in ratio else "-" for m in ("kernellab.bench", "do_bench", "sustained"))
    cudnn = f"{b['CUDNN'] / b['entry']:.2f}x" if "CUDNN" in b else "-"
    vs_best = f"{steps[best] / b['entry']:.2f}x" if best else "-"
    best_us = steps[best] * 1e3 if best else 0.0
    print(head + f"{r['choice']:10s} {b['entry'] * 1e3:9.1f} | {best or '-':>10s} {best_us:5.0f} | "
          f"{b.get('FLASH', float('nan')) * 1e3:8.1f} {b.get('CUDNN', float('nan')) * 1e3:8.1f} | {cells:>40s} | "
          f"{cudnn:>8s} | {vs_best:>12s} | {paired_cell(r):>30s} | "
          + ", ".join(f"{s} {v * 1e3:.1f}" for s, v in steps.items()), flush=flush)


def refit_lines(rows: list[dict], least: int = 3, device: str | None = None) -> list[str]:
    """kernellab.teach.attention_plan.refit of every kernel timed on at least `least` shapes (kernellab.bench times),
    beside the constants of `device`'s table (None: the H100's): what fit_golden makes of the run once its
    attention_plan_golden.json is that GPU's golden table."""
    from kernellab.teach.attention_plan import constants_for, refit

    candidates = constants_for(device).candidates

    samples: dict = {}
    for r in rows:
        if "ms" in r:
            for s, v in r["ms"]["kernellab.bench"].items():
                if s not in ("entry", "FLASH", "CUDNN"):
                    samples.setdefault((s, r["d"], r.get("sms", 132)), []).append(
                        (r["B"], r["H"], r["N"], r["causal"], v * 1e3))
    lines = []
    for (name, d, sms), got in sorted(samples.items()):
        model = next((m for m in candidates if m.name == name and m.d == d), None)
        if model is None or len(got) < least:
            continue
        fitted, rms = refit(model, got, sms)
        lines.append(f"refit {name} d={d}: tflops {fitted.tflops:.0f} (model {model.tflops:.0f}), fixed cost "
                     f"{fitted.item_fixed_tiles:.2f} tiles (model {model.item_fixed_tiles:.2f}), launch "
                     f"{fitted.launch_us:.2f} µs (model {model.launch_us:.2f}), RMS error "
                     f"{rms:.0%} over {len(got)} shapes")
    return lines


# The L2 flush before each call is a 2 x 50 MB write on an H100: about 33 µs of GPU time. Under sustained=True calls
# are queued back to back behind it, with no spin ahead of them: a call whose host path (Python to launch) takes longer
# than the flush leaves the GPU idle between the flush and the kernel, and that idle time falls between the call's
# events. The grid's SDPA baselines set their backend per call (`with sdpa_kernel([backend])`), a Python context
# manager in front of SDPA's own dispatch.
SUSTAINED_LEGEND = ("sustained: calls back to back behind the L2 flush (about 33 µs of GPU time on an H100); a call "
                    "whose host path takes longer is timed at that host path, not at its kernel. At the smallest "
                    "shapes SDPA as called here (its backend set per call by `with sdpa_kernel(...)`) is host-bound "
                    "this way, so the sustained column compares host paths: read kernellab.bench or do_bench for the "
                    "kernels. The verdict names each row where sustained differs by more than 5 % and why")


HOST_BOUND_BELOW_MS = 0.03   # a host path (20-60 µs with the flush's and events' launches) can outlast the flush
                             # plus a kernel only where the kernel takes less than about this


def sustained_why(r: dict, tolerance: float = 0.05) -> str:
    """Why the sustained ratio (entry vs FLASH) differs from kernellab.bench's by more than `tolerance` at one grid row,
    from its own numbers: which side the back-to-back calls slowed 1.5x or more, and whether host time can be why
    (its kernel under HOST_BOUND_BELOW_MS); empty where they agree."""
    ms = r.get("ms", {})
    b, s = ms.get("kernellab.bench", {}), ms.get("sustained", {})
    if not all(k in b and k in s for k in ("entry", "FLASH")):
        return ""
    bench_ratio, sus_ratio = b["FLASH"] / b["entry"], s["FLASH"] / s["entry"]
    if abs(sus_ratio / bench_ratio - 1) <= tolerance:
        return ""
    slowed = {k: s[k] / b[k] for k in ("entry", "FLASH", "CUDNN") if k in s and k in b}
    said = ", ".join(f"{k} {s[k] * 1e3:.1f} µs against {b[k] * 1e3:.1f}" for k in slowed)
    host = [k for k, x in slowed.items() if x > 1.5 and b[k] < HOST_BOUND_BELOW_MS]
    if host:
        return (f"host-bound under back-to-back calls: {' and '.join(host)} (sustained {said}): the host path outlasts "
                f"the L2 flush ahead of each call, so the sustained ratio {sus_ratio:.2f}x compares host paths, not "
                f"kernels ({bench_ratio:.2f}x by kernellab.bench)")
    if any(x > 1.5 for x in slowed.values()):
        return (f"not host time (kernels of {min(b[k] for k in slowed) * 1e3:.0f} µs and more, sustained {said}): "
                f"back to back the calls slowed unevenly, {sus_ratio:.2f}x against {bench_ratio:.2f}x; the "
                f"power-capped clock and the flush's write-back under continuous load are the suspects, unmeasured")
    return (f"the power-capped clock and the flush's dirty lines weigh differently on the two ({said}): "
            f"{sus_ratio:.2f}x sustained against {bench_ratio:.2f}x")


GRID_LEGEND = ("times: kernellab.bench (host hidden: the GPU's time), µs; every step: those the model predicts within "
               f"{IN_THE_RUNNING}x of its choice (--all-steps: every step); vs best step: the best step's time over "
               "the entry point's (< 1: the plan lost), one timing each with the entry point first in every round; "
               "paired: the entry point and the step it chose (the same kernel; with the fastest other step where "
               "that led) timed again by one kernellab.bench call on the sequence entry, step, step, entry (both "
               "orders, every round): the entry "
               "point's gap over the step (the geometric mean of entry / step over the orders), ± the spread of the "
               "repeated measurements of the same kernel (the larger of the two kernels' max / min - 1 across the "
               "orders), and the finding: faster, noise or order (a gap inside the spread; order: slower only in the "
               "order where the entry point ran first, or only second), within tolerance (beyond the spread, within "
               "3 %), loss (beyond both); the verdict counts a loss by the paired timing where a shape has one; "
               + SUSTAINED_LEGEND)


def grid_verdict(rows: list[dict], skipped: list[str], tolerance: float = 0.03, device: str | None = None
                 ) -> tuple[list[str], int]:
    """(the final lines, the number of shapes where the entry point lost to a step).

    The entry point against the best of its own steps, judged by the timing its model predicts: kernellab.bench (host
    time hidden: the GPU's time). First by the shape's main timing (one timing each, the entry point first in every
    round): a loss by any margin and by more than `tolerance`. Then by the paired timing where the shape has one
    (paired_judgement: the entry point and the step it chose timed again in both orders): a loss is a gap beyond
    both the spread of the repeated measurements of the same kernel and `tolerance`; a gap inside the spread is noise
    (or order, where it follows which ran first). The count returned is the paired losses plus the main timing's
    losses at shapes without a paired timing. Then the shapes below 1.0x FLASH by each timing method, why the methods
    disagree (sustained_why), and per kernel the median of measured over predicted GPU time (kernellab.bench): what a
    refit of kernellab.teach.attention_plan's constants starts from (refit_lines, beside `device`'s table)."""
    slower, slower_tol, lost_labels, below, fit, same, pairs = [], [], [], {}, {}, [], {}
    for r in rows:
        if "ms" not in r:
            continue
        judged = paired_judgement(r, tolerance)
        if judged:
            pairs[r["label"]] = judged
        for method, ms in r["ms"].items():
            steps = {s: v for s, v in ms.items() if s not in ("entry", "FLASH", "CUDNN")}
            if method == "kernellab.bench" and steps:
                best = min(steps, key=steps.get)
                if ms["entry"] > steps[best]:
                    slower.append(f"{r['label']} [{method}] ({r['choice']} {ms['entry'] * 1e3:.1f} µs, {best} "
                                  f"{steps[best] * 1e3:.1f} µs)")
                    if ms["entry"] > steps[best] * (1 + tolerance):
                        slower_tol.append(slower[-1])
                        lost_labels.append(r["label"])
                        if best == r["choice"]:
                            same.append(r["label"])
                for s, v in steps.items():
                    if r.get("predicted_gpu_us", {}).get(s):
                        fit.setdefault(s, []).append(v * 1e3 / r["predicted_gpu_us"][s])
            if "FLASH" in ms and ms["FLASH"] < ms["entry"]:
                below.setdefault(method, []).append(f"{r['label']} {ms['FLASH'] / ms['entry']:.2f}x")
    lines = [f"entry point slower than the best of its own steps (main timing: one timing each, the entry point "
             f"first in every round), by more than {tolerance:.0%}: "
             f"{len(slower_tol)} shape(s){': ' + '; '.join(slower_tol) if slower_tol else ''}",
             f"  (slower by any margin: {len(slower)}{': ' + '; '.join(slower) if slower else ''})"]
    if slower_tol:
        lines.append(f"  of those, the plan chose a slower step at {len(slower_tol) - len(same)}; at {len(same)} it chose "
                     f"the fastest step and the entry point's call of it timed slower than the step's own"
                     f"{': ' + '; '.join(same) if same else ''}")
    unpaired = [x for x in lost_labels if x not in pairs]
    if pairs:
        lines += paired_lines(pairs, lost_labels, tolerance)
        timed = [r for r in rows if "ms" in r and r["label"] not in pairs]
        if timed:
            lines.append(f"  not paired: {len(timed)} shape(s), judged by the main timing alone"
                         f" ({len(unpaired)} loss(es) there): " + "; ".join(
                             r["label"] + (f" (paired timing failed: {r['paired_error']})" if "paired_error" in r
                                           else "") for r in timed))
    lost = len(unpaired) + sum(g["finding"] == "loss" for g in pairs.values())
    for method in ("kernellab.bench", "do_bench", "sustained"):
        got = below.get(method, [])
        lines.append(f"entry point below 1.0x SDPA FLASH ({method}): {len(got)} shape(s)"
                     f"{': ' + '; '.join(got) if got else ''}")
    whys = [f"{r['label']}: {w}" for r in rows if (w := sustained_why(r))]
    if whys:
        lines.append(f"why sustained differs from kernellab.bench by more than 5 % (entry vs FLASH): {len(whys)} "
                     f"shape(s): " + "; ".join(whys))
    if fit:
        lines.append("measured / predicted GPU time, median over the shapes (1.00: the model's constants hold): "
                     + ", ".join(f"{s} {statistics.median(v):.2f} ({len(v)})" for s, v in sorted(fit.items())))
        lines += refit_lines(rows, device=device)
    errors = [r["label"] + ": " + r["error"] for r in rows if "error" in r]
    if errors:
        lines.append(f"shapes that failed: {len(errors)}: " + "; ".join(errors))
    if skipped:
        lines.append(f"left out past the time budget: {len(skipped)} shape(s): " + "; ".join(skipped))
    return lines, lost


def paired_lines(pairs: dict[str, dict], lost_labels: list[str], tolerance: float = 0.03) -> list[str]:
    """grid_verdict's lines on the paired timing ({label: paired_judgement}; lost_labels: the shapes the main timing
    counted as losses): the losses, then the shapes per other finding, then what became of the main timing's."""
    by = {f: [x for x, g in pairs.items() if g["finding"] == f]
          for f in ("loss", "within tolerance", "noise", "order", "faster")}

    def named(labels):
        return ": " + "; ".join(f"{x}: {paired_words(pairs[x])}" for x in labels) if labels else ""

    lines = [f"entry point against its own steps, paired (at each shape the entry point and the step it chose, the "
             f"same kernel, with the fastest other step where that led, timed again in both orders by one "
             f"kernellab.bench call on entry, step, step, entry; gap: the geometric mean of entry / step over the "
             f"orders; a loss only beyond the spread of the repeated measurements of the same kernel and beyond "
             f"{tolerance:.0%}): "
             f"{len(by['loss'])} loss(es) of {len(pairs)} shape(s) paired{named(by['loss'])}",
             f"  order (a gap inside the spread, the entry point slower only in one order): {len(by['order'])} "
             f"shape(s){named(by['order'])}",
             f"  noise (a gap inside the spread): {len(by['noise'])} shape(s){named(by['noise'])}",
             f"  beyond the spread, within {tolerance:.0%}: {len(by['within tolerance'])} shape(s)"
             f"{named(by['within tolerance'])}",
             f"  as fast as its step or faster: {len(by['faster'])} shape(s)"]
    main = [x for x in lost_labels if x in pairs]
    if main:
        cleared = [x for x in main if pairs[x]["finding"] != "loss"]
        lines.append(f"  of the main timing's {len(main)} loss(es) past {tolerance:.0%}, the paired timing found "
                     f"{len(main) - len(cleared)} a loss and {len(cleared)} not"
                     + (": " + "; ".join(f"{x} {pairs[x]['finding']}" for x in cleared) if cleared else ""))
    return lines


# -- Nsight Compute on the steps at one shape: why step 3b loses at short N (issue 32) --------------------------------
PROFILE_SHAPES = ("16x512x64", "16x512x64c", "256x512x64c", "16x512x128", "16x4096x64")   # the last: a long contrast
PROFILE_METRICS = (
    ("gpu__time_duration.sum", "duration"),
    ("sm__cycles_elapsed.avg.per_second", "SM clock"),
    ("sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "SMs active (share of the kernel's time)"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active (of active cycles)"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput"),
    ("dram__bytes.sum", "DRAM bytes"),
    ("launch__grid_size", "CTAs"),
    ("launch__registers_per_thread", "registers per thread"),
) + stall_metrics()
PROFILE_READING = """What each outcome would mean (step 3b = fa3p, against fa2 / fa3p_bm64 at the same shape):
- SMs active well under 100 % while the tensor pipe is busy when active: the call is launch- and tail-bound; the time
  is the fixed cost per call the model fits as launch_us (5-6 us for the Hopper kernels against 0-4 for step 2).
  Fix there: less start-up per CTA (barrier init, tensor-map prefetch, the producer's first loads issued before the
  consumers' setmaxnreg), programmatic dependent launch to overlap it with the previous kernel, or fewer CTAs.
- SMs active near 100 %, tensor pipe low, stalls led by long_scoreboard / barrier (consumers waiting on the mbarrier
  of a TMA load): each item's first K/V tile is not hidden, as an item of 1-4 tiles leaves nothing to overlap it
  with; per item time well above (tiles + item_fixed_tiles) tile times. Fix: two CTAs an SM (fa3p_bm64) or the
  producer running further ahead across items (Q and first K/V of item i+1 during item i: more stages).
- Stalls led by wait / math_pipe_throttle with the tensor pipe busy: compute-bound; the loss is the smaller tile's
  rate (64-row items: m64 wgmma), i.e. the variant's steady rate, not latency.
- Achieved occupancy far under one CTA's warps an SM: fewer items than SMs (under one wave); a shape where
  splitting the keys (flash-decoding style) or smaller items would fill the GPU.
- DRAM throughput high (> 60 %) at short N: the call streams Q, K, V and O (B*H in the hundreds): memory-bound, the
  model's floor; the kernel that launches soonest wins (step 2).
Per item: duration x CTAs / items is the time one CTA spends on one item, beside the model's (tiles + fixed) tile
times for the same kernel (kernellab.teach.attention_plan)."""


def parse_profile_shape(text: str) -> tuple[int, int, int, int, bool]:
    """'16x512x64c' (B*H x N x d, 'c' for causal) as (B, H, N, d, causal) with H = min(16, B*H)."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(c?)", text.strip())
    if not m:
        raise ValueError(f"a profile shape is B*HxNxd with 'c' for causal, e.g. 16x512x64c; got {text!r}")
    bh, N, d = int(m[1]), int(m[2]), int(m[3])
    return max(1, bh // 16), min(bh, 16), N, d, bool(m[4])


def sched_plan(plan, d: int, causal: bool):
    """Step 3b's plan (fa3p) as its ping-pong variant launches (07's fa3p_attention(sched=True)): the fa3p_sched
    entry, 192-row items at d = 64, its threads and shared memory; the same CTAs and tensor-map boxes."""
    import dataclasses

    block_m = 192 if d == 64 else 128
    dt = plan.entry.split("_")[1]                                     # bf16 / f16
    return dataclasses.replace(plan, entry=f"fa3p_sched_{dt}_d{d}{'_causal' if causal else ''}", block_m=block_m,
                               threads=128 * (block_m // 64 + 1),
                               shared_bytes=1024 + (2 * block_m + 2 * plan.stages * plan.block_n) * d * 2 + 256)


def run_profile(shapes: list[str], steps: list[str] | None, out: pathlib.Path, device: str = "cuda") -> int:
    """Each step of 07 at each shape under Nsight Compute (kernellab's ncu wrapper, Kernel.profile: one launch in a
    new process, normal clocks), the launch the entry point would make for that step; a table per shape, then
    PROFILE_READING. Reports in $OUT/attention_profile.json."""
    from notebook_cells import load_tutorial

    from kernellab.teach.attention_plan import constants_for, estimate, model_for

    ns = load_tutorial(NOTEBOOK)
    candidates = constants_for(torch.cuda.get_device_name() if torch.cuda.is_available() else None).candidates
    metrics = [m for m, _ in PROFILE_METRICS]
    labels = dict(PROFILE_METRICS)
    results = []
    for text in shapes:
        B, H, N, d, causal = parse_profile_shape(text)
        g = torch.Generator(device).manual_seed(0)
        q, k, v = (torch.randn(B, H, N, d, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        table = {}
        for step in steps or STEPS[d]:
            call = ns["_attention_call"](q, causal, "fa3p" if step == "fa3p_sched" else step, None)   # its ready call
            plan, scalars = call.plan, call.scalars
            if step == "fa3p_sched":                  # not a plan candidate: fa3p's launch, the ping-pong entry
                plan = sched_plan(plan, d, causal)
            kern = ns["ATTENTION_KERNELS"][plan.entry]
            grid = (plan.ctas,) if plan.persistent else (math.ceil(N / plan.block_m), B * H)
            # the arguments as 07's attention() passes them: step 2 takes pointers and a null log-sum-exp
            args = ((q, k, v, o, None) if plan.family == "fa2" else
                    (*(kernellab.tensor_map(x.view(B * H, N, d), (1, rows, 64))
                       for x, rows in ((q, plan.block_m), (k, plan.block_n), (v, plan.block_n))), o))
            try:
                rep = kern.profile(grid, plan.threads, *args, *scalars, shared_bytes=plan.shared_bytes,
                                   metrics=metrics)
            except Exception as exc:                       # no ncu, no counters: say so, go on
                table[step] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            row = {labels.get(m.name, m.name): m.formatted() for m in rep.metrics}
            row["error"] = rep.error or ""
            est = estimate(model_for(plan, d, candidates), B, H, N, causal)
            dur_us = (rep.duration_ms or 0.0) * 1e3
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
            resident = min(est.items, plan.ctas_per_sm * sms)
            row["per item, measured (duration x resident CTAs / items)"] = f"{dur_us * resident / est.items:.2f} us"
            row["model: predicted GPU time"] = f"{est.gpu_us:.1f} us ({est.items} items, {est.waves:.2f} waves, " \
                                               f"{est.tiles_per_item:.1f} tiles an item)"
            table[step] = row
        results.append({"shape": text, "B": B, "H": H, "N": N, "d": d, "causal": causal, "steps": table})
        keys = list(dict.fromkeys(k for r in table.values() for k in r))
        print(f"\n{text}: B={B} H={H} N={N} d={d} {'causal' if causal else 'full'}, bf16, one launch each (ncu)")
        print(f"{'':48s} " + " ".join(f"{s:>22s}" for s in table))
        for key in keys:
            print(f"{key[:48]:48s} " + " ".join(f"{str(table[s].get(key, '-'))[:22]:>22s}" for s in table))
        del q, k, v, o
    (out / "attention_profile.json").write_text(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda"
                                                            else device,
                                                            "results": results}, indent=1, default=str))
    print("\n" + PROFILE_READING)
    return 0 if all("error" not in r or not r["error"] for x in results for r in x["steps"].values()) else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--source", default=None, help="a .cu file instead of the notebook's %%cuda cells")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--fp16-bench", action="store_true", help="time fp16 as well as bf16")
    ap.add_argument("--ns", default=None, help="sequence lengths to time, comma-separated (default 1k-16k)")
    ap.add_argument("--dims", default="64,128", help="head dims to time, comma-separated")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="-D NAME=VALUE for the source")
    ap.add_argument("--as-called", action="store_true", help="also time the kernels as registered ops (kernellab.op) "
                    "under kernellab.bench, triton's do_bench and sustained=True, against SDPA FLASH")
    ap.add_argument("--families", default=None, help="only these kernel families, comma-separated")
    ap.add_argument("--sched", action="store_true", help="step 3b with and without ping-pong scheduling: families "
                    "fa3p,fa3p_sched against FLASH and CUDNN only, N = 2048, 4096, 8192 unless --ns says")
    ap.add_argument("--grid", action="store_true", help="the entry point (kl::attention) against each of its steps "
                    "and SDPA FLASH/CUDNN on N = 128..16k, d 64/128, causal or not, B*H 16..512, timed as called "
                    "(--quick: a subset that fits 300 s)")
    ap.add_argument("--budget-s", type=float, default=None, help="--grid: start no new shape after this many seconds "
                    "(default: 230 with --quick, 540 without)")
    ap.add_argument("--all-steps", action="store_true", help="--grid: time every step at every shape, not only those "
                    "the model predicts within 1.3x of its choice")
    ap.add_argument("--profile", nargs="*", default=None, metavar="SHAPE", help="Nsight Compute on each step at "
                    "these shapes (B*HxNxd, c for causal, e.g. 16x512x64c; none given: " + ", ".join(PROFILE_SHAPES)
                    + "): tensor pipe, SMs active, occupancy, stall reasons, time per item; what each outcome means")
    ap.add_argument("--steps", default=None, help="--profile: these steps only, comma-separated (default: all); "
                    "fa3p_sched: step 3b's ping-pong variant on fa3p's launch")
    args = ap.parse_args(argv)
    out = pathlib.Path(os.environ.get("OUT", "."))
    if args.profile is not None:
        return run_profile(args.profile or list(PROFILE_SHAPES), args.steps.split(",") if args.steps else None, out)
    if args.grid:
        return main_grid(args, out)
    log = open(out / "attention.log", "w")
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    families, configs = load_families(args.source, None, [f"-D{d}" for d in args.defines])
    for fam, ks in families.items():
        for k in ks.values():
            print(f"{k.name:24s} {k.resources}")
    if args.sched:
        args.families = args.families or "fa3p,fa3p_sched"
        args.ns = args.ns or "2048,4096,8192"
    if args.families:
        families = {f: families[f] for f in args.families.split(",")}
    ours = {fam: launcher(ks, configs[fam]) for fam, ks in families.items()}
    checks = []
    if not args.no_check:
        for fam, att in ours.items():
            checks += run_checks(fam, att, args.quick, log)
    ns = tuple(int(n) for n in args.ns.split(",")) if args.ns else None
    bench_rows = [] if args.no_bench else run_bench(ours, args.quick, log,
                                                    ("bf16", "fp16") if args.fp16_bench else ("bf16",), ns=ns,
                                                    dims=tuple(int(d) for d in args.dims.split(",")),
                                                    slow_baselines=not args.sched)
    called = run_as_called(ours, args.quick, log, ns=ns, dims=tuple(int(d) for d in args.dims.split(","))) \
        if args.as_called else []
    (out / "attention.json").write_text(json.dumps({"device": dev, "checks": checks, "bench": bench_rows,
                                                    "as_called": called}, indent=1, default=str))
    print(f"\n{dev} · {time.strftime('%Y-%m-%d')} · {time.time() - t0:.0f} s")
    if checks:
        bad = [c for c in checks if not (c["passed"] and c["within_2x"])]
        print(f"checks: {len(checks) - len(bad)}/{len(checks)} passed (error within 2x SDPA's own)")
        for c in bad[:20]:
            print("  FAIL", c)
        worst = {}
        for c in checks:
            key = (c["kernel"], c["dtype"])
            if c["err"] is not None and c["err"] > worst.get(key, (0,))[0]:
                worst[key] = (c["err"], c["sdpa_err"])
        for (fam, dt), (e, s) in worst.items():
            print(f"  {fam} {dt}: max |err| {e:.2e} vs float64 (SDPA's own: {s if s is None else f'{s:.2e}'})")
    names = list(ours) + ["FLASH", "CUDNN", "EFFICIENT", "MATH", "naive"]
    print(f"\n{'dtype':5s} {'d':>4s} {'causal':6s} {'N':>6s} | " + " ".join(f"{n:>9s}" for n in names)
          + " | TFLOP/s; " + " ".join(f"{o}/FLASH {o}/CUDNN" for o in ours))
    for r in bench_rows:
        if "error" in r:
            print(f"{r['dtype']:5s} {r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | error: {r['error']}")
            continue
        tf = r["tflops"]
        cells = " ".join(f"{tf[n]:9.1f}" if n in tf else f"{'-':>9s}" for n in names)
        ratios = " ".join(f"{tf[o] / tf['FLASH']:8.2f}x {tf[o] / tf['CUDNN']:8.2f}x" if "FLASH" in tf and "CUDNN" in tf
                          else f"{tf[o] / tf['FLASH']:8.2f}x {'-':>9s}" if "FLASH" in tf else "-" for o in ours)
        print(f"{r['dtype']:5s} {r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | {cells} | {ratios}")
    if args.sched and "fa3p" in ours and "fa3p_sched" in ours:
        print("\nfa3p_sched / fa3p (predicted: +3-8 % at d = 128, N >= 2048; neutral or worse at d = 64 and short N):")
        for r in bench_rows:
            if "error" not in r:
                tf = r["tflops"]
                vs_cudnn = f" | fa3p_sched / CUDNN {tf['fa3p_sched'] / tf['CUDNN']:.2f}x" if "CUDNN" in tf else ""
                print(f"{r['dtype']:5s} {r['d']:4d} {str(r['causal']):6s} {r['N']:6d} | "
                      f"{tf['fa3p_sched'] / tf['fa3p']:6.3f}x{vs_cudnn}")
    if called:
        import as_called

        print("\nAs called: registered ops (kernellab.op), speed-up over SDPA FLASH by each timing method, same run\n")
        print(as_called.markdown(called, "op, shape (B*N = 16k, H*d = 2048)", "FLASH"))


def main_grid(args, out: pathlib.Path) -> int:
    """--grid: the table, then the verdict lines; exit status 1 where the entry point lost to one of its own steps by
    more than the noise."""
    from kernellab.teach.attention_plan import constants_for

    log = open(out / "attention_grid.log", "w")
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    budget = args.budget_s if args.budget_s is not None else (230.0 if args.quick else 540.0)
    shapes = grid_shapes(args.quick)
    print(f"{len(shapes)} shapes, bf16; every time in µs as called (benchmarks/as_called.py); ratios > 1: ours faster;"
          " "
          f"predicted {grid_seconds(shapes, args.all_steps):.0f} s (budget {budget:.0f} s)", flush=True)
    print(GRID_HEAD, flush=True)
    rows, skipped = run_grid(args.quick, log, budget, all_steps=args.all_steps)
    (out / "attention_grid.json").write_text(json.dumps({"device": dev, "rows": rows, "skipped": skipped}, indent=1,
                                                        default=str))
    (out / "attention_plan_golden.json").write_text(golden_json({"quick_grid": golden_table(
        dev, time.strftime("%Y-%m-%d"), rows, skipped)}))
    print(f"\n{dev} · {time.strftime('%Y-%m-%d')} · {time.time() - t0:.0f} s · bf16 · "
          f"`python3 benchmarks/attention.py --grid{' --quick' if args.quick else ''}`")
    print(GRID_HEAD)
    for r in rows:
        print_grid_row(r)
    print(GRID_LEGEND)
    verdict, lost = grid_verdict(rows, skipped, device=dev)
    print()
    print("\n".join(verdict + [f"plan constants: {constants_for(dev).note}"]
                    + plan_change_lines(rows, golden_grid(device=dev))))
    return 1 if lost or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
