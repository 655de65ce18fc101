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
    assert names == sorted(f"hbwd_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in DIMS for c in ("", "_causal"))
    for k in mod.kernels:
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
                    q = torch.zeros(1, 2, N, D, dtype=dtype)
                    t["attention_backward_hopper"](q, q, q, q, torch.zeros(1, 2, N), q, causal)
    names = {launch.kernel for launch in launches}
    assert names == {f"{k}_{dt}" for k in ("bwd_dq_convert",) for dt in ("bf16", "f16")} | {
        f"bwd_pre_{dt}_d{D}" for dt in ("bf16", "f16") for D in DIMS} | {
        f"hbwd_{dt}_d{D}{c}" for dt in ("bf16", "f16") for D in DIMS for c in ("", "_causal")}, names
    assert {launch.block for launch in launches if launch.kernel.startswith("hbwd_")} == {(THREADS,)}
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
    assert t["VARIANTS"][-1] == "hopper" and t["HOPPER_BWD_FALLBACK"] in t["BWD_LADDER"]
    # on since measured on an H100 (faster than atomic_w8 at both head dims): the op takes step 3 at d = 64 and 128
    assert t["BWD_OP_HOPPER"] is True
    assert {key for key, v in t["BWD_OP_VARIANT"].items() if v == "hopper"} == {(d, c) for d in DIMS for c in (False, True)}
    assert all(v in t["BWD_LADDER"] for (d, _), v in t["BWD_OP_VARIANT"].items() if d not in DIMS)
    assert t["HOPPER_BWD_DIMS"] == DIMS and t["BWD_OP_HOPPER_DIMS"] == DIMS
    for d in DIMS:
        assert t["hbwd_smem_bytes"](d) == smem_bytes(d) <= 227 * 1024, d
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
