"""Tutorial 08's step 3, the Hopper attention backward (the `attn_bwd_h` cell: wgmma fed by TMA, a producer warpgroup
and two consumer warpgroups, registers moved between them by setmaxnreg), without a GPU: it compiles for sm_90a to
HGMMA and TMA with no spills and the resources the launcher assumes, every launch the launcher makes has a block an
SM by kernellab.occupancy with the compiled registers (the check the 288-thread version, 224 registers, failed on an
H100), and in the CPU emulator (kernellab/run/sim/cuda: wgmma, TMA, mbarriers, named barriers) its
dQ, dK, dV match float64 on awkward shapes, both dtypes, with and without the causal mask, at head dims 64 (dQ computed
by the two warpgroups in turns, over both of their dS tiles) and 128 (each warpgroup dQ's 64 columns every tile)."""
import pathlib
import re
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from kernellab.run.sim.cuda.emulate import TensorMap, bf16_bits, bf16_values, compiler, emulate  # noqa: E402

from notebook_cells import named_cuda_cells  # noqa: E402

SOURCE = named_cuda_cells("08-attention-backward.py")["attn_bwd_h"]
WG, STAGES, THREADS = 2, 2, 384                     # the cell's HBWD_WG, HBWD_STAGES; 128 x (WG + 1)
DIMS = (64, 128)                                    # head dims with kernels
PRODUCER_REGS, CONSUMER_REGS = 24, 240              # the cell's setmaxnreg counts
KEYS = 64 * WG


def smem_bytes(d):
    """The launcher's hbwd_smem_bytes: alignment slack, K and V, 2 dS buffers, the Q/dO ring, the mbarriers."""
    return 1024 + 2 * KEYS * d * 2 + 2 * WG * 64 * 64 * 2 + 2 * STAGES * 64 * d * 2 + 64


needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the emulation")


def test_the_cell_defines_what_the_launcher_assumes():
    for define, value in (("HBWD_WG", WG), ("HBWD_STAGES", STAGES), ("HBWD_PRODUCER_REGS", PRODUCER_REGS),
                          ("HBWD_CONSUMER_REGS", CONSUMER_REGS)):
        assert f"#define {define} {value} " in SOURCE, define
    # the registers after setmaxnreg fit an SM: 128 producer threads, 128 WG consumer threads
    assert 128 * PRODUCER_REGS + 128 * WG * CONSUMER_REGS <= 65536


def compiled():
    """The cell compiled for sm_90a (kernellab's cache makes the second call cheap)."""
    import kernellab

    return kernellab.compile_cuda(SOURCE, arch="sm_90a")


def test_step3_is_wgmma_fed_by_tma_without_spills():
    import kernellab

    mod = compiled()
    names = sorted(k.name for k in mod.kernels)
    step3 = sorted(f"hbwd_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in DIMS for c in ("", "_causal"))
    step3b = sorted(f"hbwd_rows_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in DIMS for c in ("", "_causal"))
    assert names == sorted(step3 + step3b + [f"hbwd_pre_{dt}_d{d}" for dt in ("bf16", "f16") for d in DIMS])
    for k in (mod[name] for name in step3):          # step 3b's kernels: test_step3b_reads_the_rows_from_shared_...
        r = k.resources
        assert not r.spills and r.local_bytes == 0, (k.name, r)
        # __launch_bounds__(384, 1): launched at 65,536 / 384 = 168 registers a thread at most, one block an SM
        assert r.registers <= 168 and r.max_threads_per_block >= THREADS, (k.name, r)
        d = 128 if "_d128" in k.name else 64
        occ = kernellab.occupancy(THREADS, r.registers, r.shared_bytes + smem_bytes(d), "sm_90")
        assert occ.blocks_per_sm >= 1, (k.name, str(occ))
        # the registers move: the producer warpgroup gives them back, the consumers take them (SASS beyond R167)
        sass = str(k.sass)
        assert re.search(rf"USETMAXREG\.DEALLOC\.CTAPOOL[^;]*\b{hex(PRODUCER_REGS)}\b", sass), k.name
        assert re.search(rf"USETMAXREG\.TRY_ALLOC\.CTAPOOL[^;]*\b{hex(CONSUMER_REGS)}\b", sass), k.name
        assert [p.name for p in k.params] == ["tq", "tk", "tv", "tdo", "lse", "dv_rows", "dq_accum", "dk", "dv", "n",
                                              "scale"]
    assert "C7520" not in mod.log, "ptxas serialises the wgmmas (a branch it cannot prove warp-uniform)"
    text = str(mod["hbwd_bf16_d64_causal"].instruction_summary)
    assert "HGMMA.64x64x16.F32.BF16" in text and "UTMALDG" in text and "REDG" in text, text
    assert "HMMA" not in text and "LDSM" not in text and "local memory       none" in text, text
    # d = 128: dV, dK over 128 columns (64x128x16 from registers), S^T, dP^T and each warpgroup's dQ half 64x64x16
    for name in ("hbwd_bf16_d128", "hbwd_bf16_d128_causal", "hbwd_f16_d128"):
        text = str(mod[name].instruction_summary)
        assert "HGMMA.64x128x16.F32" in text and "HGMMA.64x64x16.F32" in text and "REDG" in text, (name, text)
        assert "HMMA" not in text and "local memory       none" in text, (name, text)


def reference(vals, causal):
    """(lse, Dv, dQ, dK, dV) in float64 for q, k, v, dO [BH, N, D]."""
    q, k, v, do = vals
    N, scale = q.shape[1], q.shape[2] ** -0.5
    s = q @ k.transpose(0, 2, 1) * scale
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / l
    dvr = (do * (p @ v)).sum(-1)
    ds = p * (do @ v.transpose(0, 2, 1) - dvr[..., None])
    return (m + np.log(l))[..., 0], dvr, ds @ k * scale, ds.transpose(0, 2, 1) @ q * scale, p.transpose(0, 2, 1) @ do


def run_step3(BH, N, dtype, causal, seed, D=64):
    """The kernel in the emulator on N(0, 1) inputs; returns its (dQ, dK, dV) as float64 and the reference's."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((BH, N, D)).astype(np.float32) for _ in range(4)]
    if dtype == "bf16":
        arrays = [bf16_bits(a) for a in x]
        vals = [bf16_values(a).astype(np.float64) for a in arrays]
        dk, dv = (np.full((BH, N, D), 0x7FC0, np.uint16) for _ in range(2))     # NaN: a row nothing writes shows
    else:
        arrays = [a.astype(np.float16) for a in x]
        vals = [a.astype(np.float64) for a in arrays]
        dk, dv = (np.full((BH, N, D), np.nan, np.float16) for _ in range(2))
    lse, dvr, *want = reference(vals, causal)
    dq = np.zeros((BH, N, D), np.float32)                                      # the preprocessing kernel zeroes it
    name = f"hbwd_{'bf16' if dtype == 'bf16' else 'f16'}_d{D}{'_causal' if causal else ''}"
    maps = [TensorMap(a, 64, 64) for a in arrays]                              # q, k, v, dO: boxes of 64 x 64
    emulate(SOURCE, name, (-(-N // KEYS), BH), (THREADS,),
            maps + [lse.astype(np.float32), dvr.astype(np.float32), dq, dk, dv, N, D ** -0.5], smem_bytes(D))
    as64 = (lambda a: bf16_values(a).astype(np.float64)) if dtype == "bf16" else (lambda a: a.astype(np.float64))
    return (dq.astype(np.float64), as64(dk), as64(dv)), want


# (BH, N, dtype, causal): one row; one short tile; a tile and a row (the second warpgroup's keys past N); two key
# blocks and three query tiles (the Q/dO ring wraps); five query tiles, two blocks (slow)
# (slow: the other two entry points, each a build of its own for the emulator)
# d = 128 (each warpgroup's dQ columns, Dv loaded late, the epilogue's rows re-read): one row; one short tile, not
# causal; two key blocks, three query tiles, causal (the ring wraps, both warpgroups' dQ halves add into each row)
SHAPES = [(2, 1, "bf16", True, 64), (2, 63, "fp16", False, 64), (2, 65, "bf16", True, 64), (1, 130, "bf16", True, 64),
          pytest.param(1, 130, "fp16", True, 64, marks=pytest.mark.slow),
          pytest.param(1, 130, "bf16", False, 64, marks=pytest.mark.slow),
          pytest.param(1, 300, "bf16", True, 64, marks=pytest.mark.slow),
          (2, 1, "bf16", True, 128), (1, 63, "fp16", False, 128), (1, 130, "bf16", True, 128),
          pytest.param(1, 130, "fp16", True, 128, marks=pytest.mark.slow),
          pytest.param(1, 193, "bf16", False, 128, marks=pytest.mark.slow),
          pytest.param(2, 65, "fp16", False, 128, marks=pytest.mark.slow)]


@needs_cxx
@pytest.mark.parametrize("BH,N,dtype,causal,D", SHAPES)
def test_step3_gradients_match_float64_in_the_emulator(BH, N, dtype, causal, D):
    got, want = run_step3(BH, N, dtype, causal, seed=N, D=D)
    rel = 1.2e-2 if dtype == "bf16" else 2e-3          # about 3 units in the last place of the 16-bit outputs
    for name, a, w in zip(("dQ", "dK", "dV"), got, want):
        assert np.isfinite(a).all(), f"{name}: rows left unwritten (NaN)"
        err, top = np.abs(a - w).max(), np.abs(w).max()
        assert err <= rel * max(top, 1e-3), f"{name}: max |error| {err:.3e}, max |reference| {top:.3e}"


def test_every_launch_of_step3_has_a_block_an_sm(monkeypatch):
    """The launcher's launches for step 3 (the preprocessing, the Hopper kernel, dQ's conversion; both dtypes, both
    masks, short and long N), recorded on the CPU, each fit an SM by kernellab.occupancy with the compiled kernels'
    registers and shared memory: a block that does not fit fails on a GPU with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES."""
    torch = pytest.importorskip("torch")
    import kernellab
    from launch_plans import assert_every_launch_fits, recording
    from notebook_cells import load_tutorial, named_cuda_cells_with_arch

    launches = []
    t = load_tutorial("08-attention-backward.py", compile=recording(launches))
    monkeypatch.setattr(kernellab, "tensor_map", lambda *args, **kwargs: None)     # no tensor maps on the CPU
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for N in (1, 65, 4096):
                for D in DIMS:
                    for rows in (False, True):             # step 3, step 3b
                        q = torch.zeros(1, 2, N, D, dtype=dtype)
                        t["attention_backward_hopper"](q, q, q, q, torch.zeros(1, 2, N), q, causal, rows=rows)
    names = {launch.kernel for launch in launches}
    assert names == {f"{k}_{dt}" for k in ("bwd_dq_convert",) for dt in ("bf16", "f16")} | {
        f"{pre}_{dt}_d{D}" for pre in ("bwd_pre", "hbwd_pre") for dt in ("bf16", "f16") for D in DIMS} | {
        f"hbwd{r}_{dt}_d{D}{c}" for r in ("", "_rows") for dt in ("bf16", "f16") for D in DIMS
        for c in ("", "_causal")}, names
    assert {launch.block for launch in launches
            if launch.kernel.startswith("hbwd_") and not launch.kernel.startswith("hbwd_pre")} == {(THREADS,)}
    # step 3b's preprocessing: a warp for each of the B H = 2 heads' rows padded to 64 (4 warps a block)
    assert {launch.grid for launch in launches if launch.kernel.startswith("hbwd_pre")} == {
        (2 * -(-N // 64) * 64 // 4,) for N in (1, 65, 4096)}
    arch, step2_source = named_cuda_cells_with_arch("08-attention-backward.py")["attn_bwd"]
    step2 = kernellab.compile_cuda(step2_source, first_line=2, filename="cell.cu",      # as load_tutorial compiles
                                   **({"arch": arch} if arch else {}))
    kernels = {k.name: k for mod in (compiled(), step2) for k in mod.kernels if k.name in names}
    for name, occ in assert_every_launch_fits(launches, kernels, "sm_90"):
        print(f"{name:24s} {occ.blocks_per_sm} block(s) an SM, {occ.registers} registers, {occ.block_size} threads")


def test_the_launcher_joins_step2s_variants_and_the_op():
    """The launcher cell: "hopper" is a variant of attention_backward (step 3 where hopper_backward_applies, the
    atomic_w8 rung elsewhere), the op's choice at d = 64 and 128 (BWD_OP_HOPPER, on since an H100 checked and timed
    both), its shared-memory plan is the kernel's, and it refuses the
    head dims it has no kernel for."""
    torch = pytest.importorskip("torch")
    from notebook_cells import load_tutorial

    t = load_tutorial("08-attention-backward.py", compile=lambda source: None)   # launchers only, no kernel runs
    assert t["VARIANTS"][-2:] == ("hopper", "hopper_rows") and t["HOPPER_BWD_FALLBACK"] in t["BWD_LADDER"]
    # on since measured on an H100 (faster than atomic_w8 at both head dims): the op takes step 3 at d = 64 and 128
    assert t["BWD_OP_HOPPER"] is True
    assert {key for key, v in t["BWD_OP_VARIANT"].items() if v == "hopper"} == {(d, c) for d in DIMS for c in (False, True)}
    assert all(v in t["BWD_LADDER"] for (d, _), v in t["BWD_OP_VARIANT"].items() if d not in DIMS)
    assert t["HOPPER_BWD_DIMS"] == DIMS and t["BWD_OP_HOPPER_DIMS"] == DIMS
    for d in DIMS:
        assert t["hbwd_smem_bytes"](d) == smem_bytes(d) <= 227 * 1024, d
        assert t["hbwd_smem_bytes"](d, rows=True) == rows_smem_bytes(d) <= 227 * 1024, d
    # step 3b takes the op's "hopper" behind BWD_OP_HOPPER_ROWS (on since an H200 timed it 1.16-1.26x step 3)
    assert t["BWD_OP_HOPPER_ROWS"] is True
    applies, t["hopper_backward_applies"] = t["hopper_backward_applies"], lambda q: True      # as on an H100
    q = torch.empty(1, 1, 8, 64, dtype=torch.bfloat16)
    run = t["_op_backward_launcher"](q, True)
    assert run.func is t["attention_backward_hopper"] and run.keywords == {"rows": True}
    t["BWD_OP_HOPPER_ROWS"] = False
    assert t["_op_backward_launcher"](q, False) is t["attention_backward_hopper"]
    t["BWD_OP_HOPPER_ROWS"], t["hopper_backward_applies"] = True, applies
    assert (t["HBWD_WG"], t["HBWD_STAGES"], t["HBWD_THREADS"]) == (WG, STAGES, THREADS)
    assert not t["hopper_backward_applies"](torch.empty(1, 1, 8, 64))              # a CPU tensor: the fallback
    q = torch.empty(1, 1, 8, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="atomic_w8"):
        t["attention_backward_hopper"](q, q, q, q, torch.empty(1, 1, 8), q)
    with pytest.raises(ValueError, match="variant"):                           # step 2's refusals stand
        q = torch.empty(1, 1, 8, 128, dtype=torch.bfloat16)
        t["attention_backward"](q, q, q, q, torch.empty(1, 1, 8), q, False, "fast")


def test_the_benchmark_times_hopper_only_where_it_runs_step3():
    """benchmarks/attention_backward.py's timing loop: "hopper" beside the other variants at d = 64, left out at
    d = 128 (where it would time the fallback rung under step 3's name)."""
    import importlib.util
    import io

    pytest.importorskip("torch")
    path = HERE.parent / "benchmarks" / "attention_backward.py"
    spec = importlib.util.spec_from_file_location("bench_attention_backward", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []

    class Result:
        name, baselines, median_ms, tflops = "ours (hopper) d=64 N=1024", [], 1.0, 1.0

    def fake_bench(N, d, causal, variants, **opts):
        calls.append((d, causal, variants))
        return Result()
    t08 = {"HOPPER_BWD_DIMS": (64,), "bench_backward": fake_bench}
    rows = bench.run_bench(t08, True, io.StringIO(), (1024,), (64, 128), ("hopper", "atomic_w8"))
    assert calls == [(64, False, ("hopper", "atomic_w8")), (64, True, ("hopper", "atomic_w8")),
                     (128, False, ("atomic_w8",)), (128, True, ("atomic_w8",))]
    assert len(rows) == 4 and all("error" not in r for r in rows)
    calls.clear()
    assert bench.run_bench(t08, True, io.StringIO(), (1024,), (128,), ("hopper",)) == [] and calls == []


# ---- step 3b (hbwd_pre_*, hbwd_rows_*): the LSE and Dv through shared memory, copied by the producer's TMA ----------

def rows_smem_bytes(d):
    """The launcher's hbwd_smem_bytes(d, rows=True): step 3's plan and each stage's [2][64] fp32 rows."""
    return smem_bytes(d) + STAGES * 2 * 64 * 4


def run_step3b(BH, N, dtype, causal, seed, D=64):
    """Step 3b in the emulator, both of its kernels: hbwd_pre_* (Dv from O and dO, the LSE times log2 e, padded rows
    [BH][2][N up to 64], dq_accum zeroed: NaN before, so a row it misses shows) then hbwd_rows_* (the rows by TMA).
    Returns its (dQ, dK, dV) as float64 and the float64 reference's, whose Dv is rowsum(dO o O) of the O rounded to
    the dtype, as the kernels see it."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((BH, N, D)).astype(np.float32) for _ in range(4)]
    if dtype == "bf16":
        arrays = [bf16_bits(a) for a in x]
        vals = [bf16_values(a).astype(np.float64) for a in arrays]
        to_t, from_t = bf16_bits, (lambda a: bf16_values(a).astype(np.float64))
        nan16 = lambda: np.full((BH, N, D), 0x7FC0, np.uint16)                    # noqa: E731
    else:
        arrays = [a.astype(np.float16) for a in x]
        vals = [a.astype(np.float64) for a in arrays]
        to_t, from_t = (lambda a: a.astype(np.float16)), (lambda a: a.astype(np.float64))
        nan16 = lambda: np.full((BH, N, D), np.nan, np.float16)                   # noqa: E731
    q, k, v, do = vals
    lse, _, *_ = reference(vals, causal)
    s = q @ k.transpose(0, 2, 1) * D ** -0.5
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    p = np.exp(s - lse[..., None])
    o = to_t((p @ v).astype(np.float32))                                     # the forward's O, rounded
    dvr = (do * from_t(o)).sum(-1)
    ds = p * (do @ v.transpose(0, 2, 1) - dvr[..., None])
    want = (ds @ k * D ** -0.5, ds.transpose(0, 2, 1) @ q * D ** -0.5, p.transpose(0, 2, 1) @ do)
    n_pad = -(-N // 64) * 64
    rows = np.full((BH, 2, n_pad), np.nan, np.float32)
    dq = np.full((BH, N, D), np.nan, np.float32)
    dk, dv = nan16(), nan16()
    dt = "bf16" if dtype == "bf16" else "f16"
    emulate(SOURCE, f"hbwd_pre_{dt}_d{D}", (-(-BH * n_pad // 4),), (128,),
            [o, arrays[3], lse.astype(np.float32), rows, dq, N, n_pad, BH])
    assert np.isfinite(dq).all() and (dq == 0).all(), "hbwd_pre: dq_accum not zeroed everywhere"
    assert np.allclose(rows[:, 0, :N], lse * np.log2(np.e), rtol=1e-6, atol=1e-5), "hbwd_pre: LSE log2 e"
    assert np.allclose(rows[:, 1, :N], dvr, rtol=1e-4, atol=1e-4), "hbwd_pre: Dv"
    assert (rows[:, 0, N:] == np.inf).all() and (rows[:, 1, N:] == 0).all(), "hbwd_pre: the padding past N"
    maps = [TensorMap(a, 64, 64) for a in arrays] + [TensorMap(rows, 64, 2, swizzle_bytes=0)]
    emulate(SOURCE, f"hbwd_rows_{dt}_d{D}{'_causal' if causal else ''}", (-(-N // KEYS), BH), (THREADS,),
            maps + [dq, dk, dv, N, D ** -0.5], rows_smem_bytes(D))
    return (dq.astype(np.float64), from_t(dk), from_t(dv)), want


# one row; a short tile (its rows past N read +inf and 0 from the padding); two key blocks and three query tiles, the
# ring wrapping (full tiles take the reductions without a row test, the last tile with it); d = 128 the same
SHAPES_3B = [(2, 1, "bf16", True, 64), (2, 63, "fp16", False, 64), (1, 130, "bf16", True, 64),
             pytest.param(1, 192, "fp16", False, 64, marks=pytest.mark.slow),
             (1, 63, "fp16", False, 128), (1, 130, "bf16", True, 128),
             pytest.param(1, 193, "bf16", False, 128, marks=pytest.mark.slow)]


@needs_cxx
@pytest.mark.parametrize("BH,N,dtype,causal,D", SHAPES_3B)
def test_step3b_gradients_match_float64_in_the_emulator(BH, N, dtype, causal, D):
    got, want = run_step3b(BH, N, dtype, causal, seed=N + 1, D=D)
    rel = 1.2e-2 if dtype == "bf16" else 2e-3
    for name, a, w in zip(("dQ", "dK", "dV"), got, want):
        assert np.isfinite(a).all(), f"{name}: rows left unwritten (NaN)"
        err, top = np.abs(a - w).max(), np.abs(w).max()
        assert err <= rel * max(top, 1e-3), f"{name}: max |error| {err:.3e}, max |reference| {top:.3e}"


def test_step3b_reads_the_rows_from_shared_memory_without_spills():
    """Step 3b's kernels: no global load in the consumers (the LSE and Dv come as LDS from the stage the producer's
    TMA filled: one UTMALDG more than step 3), no spills, the same 168 registers and setmaxnreg, a block an SM with
    its shared memory; step 3's kernels keep their global loads."""
    import kernellab

    mod = compiled()
    for dt in ("bf16", "f16"):
        for d in DIMS:
            for c in ("", "_causal"):
                k3, k3b = mod[f"hbwd_{dt}_d{d}{c}"], mod[f"hbwd_rows_{dt}_d{d}{c}"]
                r = k3b.resources
                assert not r.spills and r.local_bytes == 0 and r.registers <= 168, (k3b.name, r)
                occ = kernellab.occupancy(THREADS, r.registers, r.shared_bytes + rows_smem_bytes(d), "sm_90")
                assert occ.blocks_per_sm >= 1 and rows_smem_bytes(d) <= 227 * 1024, (k3b.name, str(occ))
                sass, old = str(k3b.sass), str(k3.sass)
                global_load = re.compile(r"(?<![A-Z])LDG\b")     # LDG, not UTMALDG (the TMA's)
                assert not global_load.search(sass) and global_load.search(old), k3b.name
                assert "LDS.64" in sass and sass.count("UTMALDG") == old.count("UTMALDG") + 1, k3b.name
                assert re.search(rf"USETMAXREG\.TRY_ALLOC\.CTAPOOL[^;]*\b{hex(CONSUMER_REGS)}\b", sass), k3b.name
                assert [p.name for p in k3b.params] == ["tq", "tk", "tv", "tdo", "trows", "dq_accum", "dk", "dv",
                                                        "n", "scale"]
        for d in DIMS:
            r = mod[f"hbwd_pre_{dt}_d{d}"].resources
            assert not r.spills and r.max_threads_per_block >= 128, r


def _benchmark_module():
    import importlib.util

    path = HERE.parent / "benchmarks" / "attention_backward.py"
    spec = importlib.util.spec_from_file_location("bench_attention_backward", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_benchmark_sets_step3b_beside_step3_and_its_prediction():
    """benchmarks/attention_backward.py (the hopper-backward suite): "hopper_rows" is timed beside "hopper" only at the
    head dims with Hopper kernels, and the table printed last puts each (d, causal)'s measured step 3 and 3b beside
    the prediction written before the GPU ran it (STEP3B_PREDICTED_MS, every (d, causal) at N = 4096 predicted),
    saying where the measurement fell."""
    import io

    pytest.importorskip("torch")
    bench = _benchmark_module()
    assert set(bench.STEP3B_PREDICTED_MS) == {(d, c) for d in DIMS for c in (False, True)}
    assert all(0 < lo < hi for lo, hi in bench.STEP3B_PREDICTED_MS.values())
    calls = []

    class Result:
        name, baselines, median_ms, tflops = "ours (hopper) d=64 N=4096", [], 4.5, 300.0

    def fake_bench(N, d, causal, variants, **opts):
        calls.append((d, variants))
        return Result()
    t08 = {"HOPPER_BWD_DIMS": (64,), "HOPPER_VARIANTS": ("hopper", "hopper_rows"), "bench_backward": fake_bench}
    bench.run_bench(t08, True, io.StringIO(), (4096,), (64, 128), ("hopper", "hopper_rows", "atomic_w8"))
    assert calls == [(64, ("hopper", "hopper_rows", "atomic_w8"))] * 2 + [(128, ("atomic_w8",))] * 2
    lo, hi = bench.STEP3B_PREDICTED_MS[64, False]
    rows = [dict(d=64, causal=False, N=4096, ms={"ours (hopper)": 4.56, "ours (hopper_rows)": (lo + hi) / 2,
                                                  "SDPA FLASH": 5.1}),
            dict(d=128, causal=True, N=4096, ms={"ours (hopper)": 2.55, "ours (hopper_rows)": 3.0}),
            dict(d=64, causal=True, N=4096, ms={"ours (hopper)": 2.66})]             # 3b not timed: no line
    lines = bench.step3b_lines(rows)
    assert len(lines) == 3 and "predicted" in lines[0]
    assert "inside the prediction" in lines[1] and f"{lo:.2f}-{hi:.2f} ms" in lines[1] and "4.560" in lines[1]
    assert "SLOWER than predicted" in lines[2] and "0.85x" in lines[2]
    assert bench.step3b_lines(rows[2:]) == []
