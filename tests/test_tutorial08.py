"""Tutorial 08 (attention backward) without a GPU: every kernel of step 2 compiles for sm_90 with the instructions
its text promises, within 255 registers and without spills; in the CPU emulator (kernellab/run/sim/cuda)
both variants' dQ, dK and dV, and the LSE of tutorial 07's forward, match the float64 reference on awkward shapes;
the launchers' shared-memory plans are what the kernels address; and the autograd op traces on fake (meta) tensors,
its backward included."""
import pathlib
import re
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from kernellab.run.sim.cuda.emulate import compiler  # noqa: E402
from kernellab.run.sim.cuda.emulate import bf16_bits, bf16_values, emulate  # noqa: E402

from notebook_cells import launcher_cells, load_tutorial, named_cuda_cells  # noqa: E402

NB = "08-attention-backward.py"
SOURCE = named_cuda_cells(NB)["attn_bwd"]
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the emulation")
SUFFIXES = [f"{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in (64, 128) for c in ("", "_causal")]


@pytest.fixture(scope="module")
def module():
    import kernellab

    return kernellab.compile_cuda(SOURCE, arch="sm_90", first_line=2, filename="cell.cu")


@pytest.fixture(scope="module")
def tutorial(module):
    """The notebook's launcher cells, its named cell bound to the module compiled above (no second compile)."""
    return load_tutorial(NB, compile=lambda source: module)


def test_every_step_compiles_for_sm90_without_spills(module):
    names = sorted(k.name for k in module.kernels)
    want = sorted([f"bwd_{kind}_{s}" for s in SUFFIXES
                   for kind in ("dkdv", "dkv", "dq", "dkdv_v2", "dkv_w8", "dq_w8", "dkdv_w8", "dkv_lean", "dq_lean",
                                "dkdv_lean", "dkv_2d")]
                  + [f"bwd_dkdv_2d_{s}" for s in SUFFIXES] + [f"bwd_dkdv_ilp_{s}" for s in SUFFIXES]
                  + [f"bwd_dkdv_fa2_{s}" for s in SUFFIXES]
                  + [f"bwd_pre_{dt}_d{d}" for dt in ("bf16", "f16") for d in (64, 128)]
                  + ["bwd_dq_convert_bf16", "bwd_dq_convert_f16"])
    assert names == want
    for k in module.kernels:
        # each entry point is a macro invocation: found in the cell at its line, its parameters' types known
        assert k.signature.line is not None and k.params and all(p.dtype for p in k.params), (k.name, k.signature)
        if not k.name.startswith("bwd_dq_convert"):
            assert k.params[0].dtype == ("bfloat16" if "_bf16_" in k.name else "float16"), (k.name, k.signature)
        r = k.resources
        assert not r.spills and r.local_bytes == 0 and r.spill_store_bytes == 0, (k.name, r)
        assert r.registers <= 255, (k.name, r)
        if k.name.startswith(("bwd_dkdv", "bwd_dkv", "bwd_dq_")) and "convert" not in k.name:
            eight = ("_w8_" in k.name or k.name.startswith("bwd_dkdv_fa2_")
                     or (k.name.startswith(("bwd_dkdv_2d_", "bwd_dkdv_ilp_")) and "_d128" in k.name))
            assert r.max_threads_per_block == (256 if eight else 128), (k.name, r)


def test_the_ladder_keeps_step_2s_kernels_and_its_own_promises(module):
    """Rungs 3, 5 and 6 (a) use the vector reduction where they say (RED.F32x2, no scalar RED); rung 7 reads fewer
    ldmatrix fragments per mma than (b) at d = 64; adding them left variants (a) and (b) as they were (the 4-warp
    kernels' registers as recorded before the ladder)."""
    per_mma = (lambda sass: len(re.findall(r"\bLDSM\b", sass)) / len(re.findall(r"\bHMMA\b", sass)))
    for s in ("bf16_d64", "f16_d64_causal"):
        assert per_mma(module[f"bwd_dkv_2d_{s}"].sass) <= 0.4 < 0.5 <= per_mma(module[f"bwd_dkv_{s}"].sass), s
    for s in SUFFIXES:
        # rung 8: the 2-D warp tile with dQ by reductions: 72 ldmatrix.x4 a 160 mma a warp step against atomic_w8's
        # 96 / 104 (static: 60 / 144 against 78 / 136 and 86 / 136, the dQ k-loops unrolled by 4 and 2); at d = 64
        # two blocks of 4 warps an SM, at d = 128 8 warps in pairs with a pair barrier (bar.sync 1-4, 64) between
        k2d, w8 = module[f"bwd_dkdv_2d_{s}"], module[f"bwd_dkdv_w8_{s}"]
        assert per_mma(k2d.sass) <= 0.45 < 0.55 <= per_mma(w8.sass), (s, per_mma(k2d.sass), per_mma(w8.sass))
        assert k2d.resources.max_threads_per_block == (128 if "_d64" in s else 256), k2d.resources
        assert len(re.findall(r"\bBAR\.SYNC", k2d.sass)) == (2 if "_d64" in s else 3), s
    for s in SUFFIXES:
        for kind in ("dkdv_v2", "dkdv_w8", "dkdv_lean", "dkdv_2d"):
            sass = module[f"bwd_{kind}_{s}"].sass
            assert re.search(r"\bREDG?\.E\.ADD\.F32x2\b", sass), (kind, s)
            assert not re.search(r"\bREDG?\.E\.ADD\.F32\.", sass), (kind, s)
        assert not re.search(r"\bREDG?\.E\.ADD\.F32x2\b", module[f"bwd_dkdv_{s}"].sass), s
    # recorded by NVRTC/ptxas for sm_90 before rungs 3-6 were added (the benchmark log of the first H100 run agrees)
    assert [module[n].resources.registers for n in ("bwd_dkdv_bf16_d64", "bwd_dkv_bf16_d64", "bwd_dq_bf16_d64",
                                                    "bwd_dkdv_bf16_d128")] == [212, 207, 170, 255]


@pytest.mark.parametrize("name", ["bwd_dkdv_bf16_d64", "bwd_dkdv_f16_d128_causal", "bwd_dkv_bf16_d128",
                                  "bwd_dq_f16_d64_causal"])
def test_the_tile_kernels_are_mma_sync_with_ldmatrix_and_cp_async(module, name):
    text = str(module[name].instruction_summary)
    assert "HMMA.16816.F32" in text and "LDSM" in text and "LDGSTS" in text, text
    reductions = re.findall(r"\b(?:REDG?|ATOMG)\.E\.ADD\.F32\S*", module[name].sass)
    if name.startswith("bwd_dkdv"):                   # variant (a): dQ shares added into fp32 in global memory
        assert reductions, text
    else:
        assert not reductions, reductions


def test_the_launch_plans_fit_an_sm_and_two_blocks(tutorial):
    """Shared memory per block as the launchers compute it: within the H100's 227 KiB per block, two blocks per SM."""
    for d in (64, 128):
        for atomic in (False, True):
            smem = tutorial["bwd_dkdv_smem_bytes"](d, atomic)
            assert 2 * smem <= 228 * 1024, (d, atomic, smem)
            assert tutorial["bwd_dkdv_smem_bytes"](d, atomic, 8) <= 227 * 1024       # the 8-warp rungs: one block
        assert 2 * tutorial["bwd_dq_smem_bytes"](d) <= 228 * 1024
        assert tutorial["bwd_dq_smem_bytes"](d, 8) <= 227 * 1024
    assert tutorial["VARIANTS"][:2] == ("atomic", "pass")
    assert set(tutorial["VARIANTS"]) == set(tutorial["BWD_LADDER"]) | {"hopper", "hopper_rows"}   # steps 3, 3b
    assert tutorial["BWD_LADDER"] == {k: tuple(v) for k, v in LADDER.items()} and tutorial["BWD_DKDV_TILES"] == TILES
    assert tutorial["BWD_PAIRS"] == PAIRS and tutorial["BWD_P_TILE"] == P_TILE
    # atomic_2d at d = 64: 128 keys, 32-query tiles, the dS^T tile: two blocks an SM by shared memory
    assert 2 * tutorial["bwd_dkdv_smem_bytes"](64, True, 4, 128, 32) <= 228 * 1024
    assert tutorial["bwd_dkdv_smem_bytes"](64, False, 4, 128, 32) == 2 * 128 * 64 * 2 + 4 * 32 * 64 * 2 + 4 * 32 * 4
    assert set(tutorial["BWD_OP_VARIANT"].values()) <= set(tutorial["VARIANTS"])
    assert set(tutorial["BWD_OP_VARIANT"]) == {(d, c) for d in (64, 128) for c in (False, True)}
    assert tutorial["bwd_dkdv_smem_bytes"](64, True) == 2 * 64 * 64 * 2 + 4 * 64 * 64 * 2 + 4 * 64 * 4 + 64 * 64 * 2


def test_every_launch_of_atomic_2d_fits_two_blocks_an_sm(module):
    """Rung 8's launches (preprocess, the 2-D dK/dV kernel, dQ's conversion; both dtypes and masks, N = 1, 65, 4096),
    recorded on the CPU, fit an SM by kernellab.occupancy with the compiled kernels' registers and the launch's
    shared memory; its dK/dV kernel at d = 64 two blocks of 4 warps an SM (255 registers, 66,048 B), at d = 128 one
    of 8 warps (131,584 B: the P^T tile of the warp pairs added)."""
    from launch_plans import assert_every_launch_fits, recording

    launches = []
    t = load_tutorial(NB, compile=recording(launches))
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for N in (1, 65, 4096):
                for d in (64, 128):
                    q = torch.zeros(1, 2, N, d, dtype=dtype)
                    t["attention_backward"](q, q, q, q, torch.zeros(1, 2, N), q, causal, "atomic_2d")
    main = {(launch.kernel, launch.block, launch.shared_bytes) for launch in launches
            if launch.kernel.startswith("bwd_dkdv")}
    assert main == {(f"bwd_dkdv_2d_{dt}_d64{c}", (128,), 66_048) for dt in ("bf16", "f16") for c in ("", "_causal")} | {
        (f"bwd_dkdv_2d_{dt}_d128{c}", (256,), 131_584) for dt in ("bf16", "f16") for c in ("", "_causal")}, main
    grids = {launch.grid for launch in launches if launch.kernel == "bwd_dkdv_2d_bf16_d64"}
    assert grids == {(1, 2), (32, 2)}                                     # 128 keys a block
    kernels = {k.name: k for k in module.kernels}
    for name, occ in assert_every_launch_fits(launches, kernels, "sm_90"):
        if name.startswith("bwd_dkdv_2d"):
            assert occ.blocks_per_sm == (2 if "_d64" in name else 1), (name, occ)


def test_the_launchers_refuse_what_the_kernels_do_not_take(tutorial):
    q = torch.empty(1, 1, 8, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="d = 64 or 128"):
        tutorial["attention_backward"](q, q, q, q, torch.empty(1, 1, 8), q)
    q = torch.empty(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="variant"):
        tutorial["attention_backward"](q, q, q, q, torch.empty(1, 1, 8), q, False, "fast")



def test_the_launchers_configure_their_kernels_once_per_shape(tutorial, monkeypatch):
    """attention_backward (step 2's variants) and attention_forward name and configure their kernels on a shape's
    first call only; a new module (the %%cuda cell run again) is configured again; the launches are the same."""
    configured, launched = [], []

    class Recorded:                                     # a module whose kernels record configurations and launches
        def __getitem__(self, name):
            def configure(config):
                configured.append((name, config))
                return lambda *args: launched.append((name, config, len(args), args[-1]))
            return type("K", (), {"__getitem__": lambda self, c: configure(c)})()

    monkeypatch.setitem(tutorial, "attn_bwd", Recorded())
    monkeypatch.setitem(tutorial, "_BWD_LAUNCHES", {})
    monkeypatch.setitem(tutorial["_fa2_forward"], "module", Recorded())
    for key in [k for k in tutorial["_fa2_forward"] if k != "module"]:
        monkeypatch.delitem(tutorial["_fa2_forward"], key)
    q = torch.zeros(1, 2, 65, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 65)
    for variant in ("atomic", "pass"):
        for _ in range(3):
            tutorial["attention_backward"](q, q, q, q, lse, q, True, variant)
    assert [c for c, _ in configured] == ["bwd_pre_bf16_d64", "bwd_dkdv_bf16_d64_causal", "bwd_dq_convert_bf16",
                                          "bwd_pre_bf16_d64", "bwd_dkv_bf16_d64_causal", "bwd_dq_bf16_d64_causal"]
    assert len(launched) == 18 and launched[:3] == launched[3:6] == launched[6:9]
    assert launched[2][3] == q.numel()                                  # the dQ conversion's n
    monkeypatch.setitem(tutorial, "attn_bwd", Recorded())               # the cell run again: configured again
    tutorial["attention_backward"](q, q, q, q, lse, q, True, "atomic")
    assert len(configured) == 9 and launched[-3:] == launched[:3]
    for _ in range(3):
        o, lse_out = tutorial["attention_forward"](q, q, q, False)
    assert [c for c, _ in configured[9:]] == ["fa2_bf16_d64"] and o.shape == q.shape and lse_out.shape == (1, 2, 65)
    assert len(launched) == 24

def test_the_reference_matches_autograd_in_float64(tutorial):
    ref = tutorial["attention_backward_reference"]
    F = torch.nn.functional
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, 19, 8, generator=g, dtype=torch.float64) for _ in range(4))
    for causal in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        o.backward(do)
        o_ref, lse, *grads = ref(q, k, v, do, causal)
        torch.testing.assert_close(o_ref, o.detach(), rtol=1e-12, atol=1e-12)
        for a, x in zip(grads, leaves):
            torch.testing.assert_close(a, x.grad, rtol=1e-10, atol=1e-12)


def test_the_op_traces_on_meta_tensors_backward_included(tutorial):
    """The fakes of kl::flash_attention_lse and kl::attention_backward (what torch.compile traces): shapes, dtypes,
    and a backward through the autograd registration that reaches q, k and v."""
    f = tutorial["kl_flash_attention"]
    q, k, v = (torch.empty(2, 12, 1024, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    o = f(q, k, v, True)
    assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.grad_fn is not None
    o2, lse = tutorial["kl_flash_attention_lse"](q, k, v, False)
    assert lse.shape == (2, 12, 1024) and lse.dtype == torch.float32
    o.sum().backward()
    assert all(x.grad is not None and x.grad.shape == x.shape for x in (q, k, v))


def test_the_launcher_cells_are_the_ones_the_training_script_loads():
    heads = [c.splitlines()[0] for c in launcher_cells(NB)]
    assert [h.split()[2] for h in heads] == ["reference", "forward", "backward", "harness", "Hopper", "ops"]


# --- the emulator: both variants against float64 -----------------------------------------------------------------

def reference(q, k, v, do, causal):
    """(o, lse, dq, dk, dv) in float64 from [BH, N, d] arrays."""
    q, k, v, do = (a.astype(np.float64) for a in (q, k, v, do))
    N, d = q.shape[1:]
    s = q @ k.transpose(0, 2, 1) * d ** -0.5
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    mx = s.max(-1, keepdims=True)
    l = np.exp(s - mx).sum(-1, keepdims=True)
    p = np.exp(s - mx) / l
    o = p @ v
    ds = p * (do @ v.transpose(0, 2, 1) - (do * o).sum(-1, keepdims=True))
    return o, (np.log(l) + mx)[..., 0], ds @ k * d ** -0.5, ds.transpose(0, 2, 1) @ q * d ** -0.5, \
        p.transpose(0, 2, 1) @ do


# variant -> (dK/dV kernel, dQ kernel or None, warps), written out here as the notebook's BWD_LADDER is (the test
# test_the_launch_plans_fit_an_sm_and_two_blocks checks the two agree)
LADDER = {"atomic": ("bwd_dkdv", None, 4), "pass": ("bwd_dkv", "bwd_dq", 4), "atomic_v2": ("bwd_dkdv_v2", None, 4),
          "pass_w8": ("bwd_dkv_w8", "bwd_dq_w8", 8), "atomic_w8": ("bwd_dkdv_w8", None, 8),
          "pass_lean": ("bwd_dkv_lean", "bwd_dq_lean", 4), "atomic_lean": ("bwd_dkdv_lean", None, 4),
          "pass_2d": ("bwd_dkv_2d", "bwd_dq", 4), "atomic_2d": ("bwd_dkdv_2d", None, 4),
          "atomic_2d_ilp": ("bwd_dkdv_ilp", None, 4), "atomic_fa2": ("bwd_dkdv_fa2", None, 8)}
TILES = {("pass_2d", 64): (128, 32), ("atomic_2d", 64): (128, 32),    # the notebook's BWD_DKDV_TILES
         ("atomic_2d", 128): (128, 32, 8), ("atomic_2d_ilp", 64): (128, 32), ("atomic_2d_ilp", 128): (128, 32, 8),
         ("atomic_fa2", 64): (128, 64, 8), ("atomic_fa2", 128): (128, 64, 8)}
PAIRS = {("atomic_2d", 128), ("atomic_2d_ilp", 128)}                    # the notebook's BWD_PAIRS
P_TILE = {("atomic_fa2", 64), ("atomic_fa2", 128)}                      # the notebook's BWD_P_TILE


def emulated_backward(BH, N, d, causal, variant, seed, module, dtype="bf16"):
    """The launchers' sequence of kernels (bwd_pre, then variant a or b) in the emulator, bf16 (or "f16"); returns
    our and the reference's (dq, dk, dv). Shared-memory sizes from the notebook's own plan functions. Each launch is
    checked against its sm_90 compile (registers, shared memory, threads) as a GPU launch is, before it runs."""
    def run(source, name, *launch):
        return emulate(source, name, *launch, image=module[name].image())

    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(4)]
    if dtype == "bf16":
        to_bits, values = (lambda a: bf16_bits(a.astype(np.float32))), bf16_values
        nan_outs = lambda: np.full((BH, N, d), 0x7FC0, np.uint16)          # noqa: E731  (bf16 NaN bits)
    else:
        to_bits, values = (lambda a: a.astype(np.float16)), (lambda a: a.astype(np.float32))
        nan_outs = lambda: np.full((BH, N, d), np.nan, np.float16)          # noqa: E731
    bits = [to_bits(a) for a in x]
    q, k, v, do = (values(b) for b in bits)
    o, lse, *want = reference(q, k, v, do, causal)
    o_bits = to_bits(o)
    delta = np.full((BH, N), np.nan, np.float32)
    acc = np.full((BH, N, d), np.nan, np.float32)             # zeroed by bwd_pre in variant (a)
    outs = [nan_outs() for _ in range(3)]                     # NaN: an unwritten element shows
    dq, dk, dv = outs
    c = "_causal" if causal else ""
    dkdv_kernel, dq_kernel, warps = LADDER[variant]
    keys, bm, *w = TILES.get((variant, d), (16 * warps, {64: 64, 128: 32}[d]))
    warps = w[0] if w else warps
    threads = 32 * warps
    dkdv_smem = (2 * keys * d * 2 + 4 * bm * d * 2 + 4 * bm * 4 + (keys * bm * 4 if (variant, d) in PAIRS else 0)
                 + (keys * bm * 2 if (variant, d) in P_TILE else 0))
    atomic = dq_kernel is None
    run(SOURCE, f"bwd_pre_{dtype}_d{d}", (-(-BH * N // 4),), (128,),
            [o_bits, bits[3], delta, acc if atomic else None, BH * N])
    grid = (-(-N // keys), BH)
    if atomic:
        run(SOURCE, f"{dkdv_kernel}_{dtype}_d{d}{c}", grid, (threads,),
                bits + [lse.astype(np.float32), delta, acc, dk, dv, N, d ** -0.5], dkdv_smem + keys * 64 * 2)
        run(SOURCE, f"bwd_dq_convert_{dtype}", (3,), (128,), [acc, dq, BH * N * d])
    else:
        run(SOURCE, f"{dkdv_kernel}_{dtype}_d{d}{c}", grid, (threads,),
                bits + [lse.astype(np.float32), delta, None, dk, dv, N, d ** -0.5], dkdv_smem)
        run(SOURCE, f"{dq_kernel}_{dtype}_d{d}{c}", (-(-N // (16 * warps)), BH), (threads,),
                bits + [lse.astype(np.float32), delta, dq, N, d ** -0.5], 2 * 16 * warps * d * 2 + 4 * 64 * d * 2)
    np.testing.assert_allclose(delta, (values(o_bits).astype(np.float64) * do).sum(-1), rtol=1e-5, atol=1e-5)
    return [values(x) for x in outs], want


# (BH, N, d, causal, variant): N = 1 (one key), 63 and 65 (one short of a tile and one over), two heads
SHAPES = [
    (1, 65, 64, False, "atomic"),
    (1, 63, 64, True, "pass"),
    pytest.param(1, 1, 64, True, "atomic", marks=pytest.mark.slow),
    pytest.param(1, 1, 64, False, "pass", marks=pytest.mark.slow),
    pytest.param(1, 63, 64, False, "atomic", marks=pytest.mark.slow),
    pytest.param(1, 65, 64, True, "pass", marks=pytest.mark.slow),
    pytest.param(1, 65, 128, True, "atomic", marks=pytest.mark.slow),      # 32-row query tiles, dQ column halves
    pytest.param(2, 130, 128, False, "pass", marks=pytest.mark.slow),
    # the ladder: 128 keys a block (N = 65: one block, half its keys past N; N = 130: two blocks, the second short)
    (1, 65, 64, True, "atomic_v2"),
    (1, 130, 64, True, "pass_w8"),
    (1, 130, 64, False, "atomic_w8"),
    pytest.param(1, 63, 128, False, "atomic_v2", marks=pytest.mark.slow),
    pytest.param(1, 65, 128, True, "pass_w8", marks=pytest.mark.slow),
    pytest.param(1, 130, 128, True, "atomic_w8", marks=pytest.mark.slow),
    # the lean step: N = 130 has unmasked interior tiles (causal: below the diagonal) and masked ones
    (1, 130, 64, True, "pass_lean"),
    (2, 130, 64, False, "atomic_lean"),
    pytest.param(1, 130, 128, True, "atomic_lean", marks=pytest.mark.slow),
    pytest.param(1, 200, 128, False, "pass_lean", marks=pytest.mark.slow),
    # 32 keys a warp, 128 a block, 32-query tiles: N = 130 has two key blocks, the second 2 keys long
    (1, 130, 64, True, "pass_2d"),
    pytest.param(2, 65, 64, False, "pass_2d", marks=pytest.mark.slow),
]


# rung 8 (atomic_2d): the 2-D warp tile with dQ by reductions, both dtypes; N = 1 (one key, one query), 63 and 65
# (one block, most of its 128 keys past N, a short last query tile), 130 (two key blocks, the second 2 keys long;
# causal: unmasked tiles below the diagonal); d = 128: warp pairs sharing 32 keys (bwd::dkdv_pair)
SHAPES_2D = [
    (1, 130, 64, True, "bf16"),
    (2, 65, 64, False, "f16"),
    pytest.param(1, 1, 64, True, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 1, 64, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 63, 64, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 63, 64, False, "bf16", marks=pytest.mark.slow),
    pytest.param(2, 65, 64, True, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 130, 64, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 130, 64, True, "f16", marks=pytest.mark.slow),
    (1, 130, 128, True, "bf16"),
    (2, 65, 128, False, "f16"),
    pytest.param(1, 1, 128, False, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 1, 128, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 63, 128, True, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 63, 128, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 65, 128, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 130, 128, False, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 130, 128, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 193, 128, True, "bf16", marks=pytest.mark.slow),
]


def _assert_emulated_rung_matches_float64(variant, BH, N, d, causal, dtype, seed, module):
    ours, want = emulated_backward(BH, N, d, causal, variant, seed=seed, module=module, dtype=dtype)
    for name, got, ref in zip(("dq", "dk", "dv"), ours, want):
        assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} elements never written (or NaN)"
        err = np.abs(got - ref).max()
        # as below: bf16 P, dS and results, a few bf16 ulps; fp16 carries 3 more mantissa bits
        assert err <= (2 ** -6 if dtype == "bf16" else 2 ** -8) * max(1.0, np.abs(ref).max()), \
            f"{name}: max |err| {err:.3g}"


@needs_cxx
@pytest.mark.parametrize("BH,N,d,causal,dtype", SHAPES_2D)
def test_atomic_2d_in_the_emulator_matches_float64(BH, N, d, causal, dtype, module):
    _assert_emulated_rung_matches_float64("atomic_2d", BH, N, d, causal, dtype, N + d + 1, module)


# rung 9 (atomic_2d_ilp): rung 8 with two dQ accumulator sets and the LSE / Dv rows by 16-byte copies, which need
# N % 4 == 0 (the launcher runs rung 8 elsewhere): N = 4 (one short query tile, zeros past N), 128 (whole tiles, two
# heads: the second head's rows 512 bytes on), 132 (a second key block 4 keys long, a last query tile of 4: chunk by
# chunk zero-filled), 256
SHAPES_ILP = [
    (1, 132, 64, True, "bf16"),
    (2, 128, 64, False, "f16"),
    (1, 132, 128, True, "bf16"),
    pytest.param(1, 4, 64, False, "bf16", marks=pytest.mark.slow),
    pytest.param(2, 132, 64, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 256, 64, True, "f16", marks=pytest.mark.slow),
    pytest.param(2, 128, 128, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 4, 128, True, "f16", marks=pytest.mark.slow),
]


@needs_cxx
@pytest.mark.parametrize("BH,N,d,causal,dtype", SHAPES_ILP)
def test_atomic_2d_ilp_in_the_emulator_matches_float64(BH, N, d, causal, dtype, module):
    _assert_emulated_rung_matches_float64("atomic_2d_ilp", BH, N, d, causal, dtype, N + d + 2, module)


# rung 10 (atomic_fa2): FlashAttention-2's tile, 8 warps, 128 keys, 64-query steps, P and dS through shared memory;
# N = 1 (one key, one query), 63 and 65 (one block, most of its keys past N; 65: a second query step of 1), 130 (two
# key blocks, the second 2 keys long; causal: a block's first step on the diagonal), 193 (a last step of 1 query)
SHAPES_FA2 = [
    (1, 130, 64, True, "bf16"),
    (2, 65, 64, False, "f16"),
    (1, 130, 128, False, "bf16"),
    (1, 193, 128, True, "f16"),
    pytest.param(1, 1, 64, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 63, 64, False, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 65, 64, True, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 193, 64, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 130, 64, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 1, 128, False, "bf16", marks=pytest.mark.slow),
    pytest.param(1, 63, 128, True, "bf16", marks=pytest.mark.slow),
    pytest.param(2, 65, 128, False, "f16", marks=pytest.mark.slow),
    pytest.param(1, 130, 128, True, "f16", marks=pytest.mark.slow),
    pytest.param(1, 193, 128, False, "bf16", marks=pytest.mark.slow),
]


@needs_cxx
@pytest.mark.parametrize("BH,N,d,causal,dtype", SHAPES_FA2)
def test_atomic_fa2_in_the_emulator_matches_float64(BH, N, d, causal, dtype, module):
    _assert_emulated_rung_matches_float64("atomic_fa2", BH, N, d, causal, dtype, N + d + 3, module)


def test_atomic_fa2_compiles_to_flashattention_2s_tile_step(module):
    """Rung 10's dK/dV kernel: a warp's step of 5 d / 2 HMMA (S, dP, dV, dK, dQ: d / 2 each at 2 x 32 x 32, d / 2 x
    2 x ..., all unrolled in the SASS: 160 at d = 64, 320 at d = 128) and 88 / 144 LDSM (0.55 / 0.45 an HMMA; rung 8
    0.45 at both), P and dS stored by 32 STS a thread, 2 barriers a step, dQ by 8 / 16 RED.F32x2; within 255
    registers without spills or local memory, 256 threads, one block an SM with the launcher's shared memory."""
    from kernellab import occupancy

    for s in SUFFIXES:
        k = module[f"bwd_dkdv_fa2_{s}"]
        sass, d = str(k.sass), (64 if "_d64" in s else 128)
        count = lambda op: len(re.findall(rf"\b{op}\b", sass))            # noqa: E731
        assert count("HMMA") == 5 * d // 2 and count("LDSM") == {64: 88, 128: 144}[d], (s, count("HMMA"))
        assert count("STS") == 32 and len(re.findall(r"\bBAR\.SYNC", sass)) == 2, s
        assert len(re.findall(r"\bREDG?\.E\.ADD\.F32x2\b", sass)) == d // 8, s
        assert not re.search(r"\bREDG?\.E\.ADD\.F32\.", sass), s
        r = k.resources
        assert not r.spills and r.local_bytes == 0 and r.registers <= 255 and r.max_threads_per_block == 256, (s, r)
        smem = {64: 99_328, 128: 164_864}[d]
        assert occupancy(256, r.registers, smem, "sm_90").blocks_per_sm == 1, (s, r)


def test_every_launch_of_atomic_fa2_fits_an_sm(module):
    """Rung 10's launches (preprocess, its dK/dV kernel, dQ's conversion; both dtypes and masks, N = 1, 65, 4096),
    recorded on the CPU, fit an SM by kernellab.occupancy: its dK/dV kernel one block of 8 warps, 128 keys a block,
    99,328 B (d = 64) or 164,864 B (d = 128) of shared memory (K, V; 2 x Q, dO; the rows; dS and P [64 x 128])."""
    from launch_plans import assert_every_launch_fits, recording

    launches = []
    t = load_tutorial(NB, compile=recording(launches))
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for N in (1, 65, 4096):
                for d in (64, 128):
                    q = torch.zeros(1, 2, N, d, dtype=dtype)
                    t["attention_backward"](q, q, q, q, torch.zeros(1, 2, N), q, causal, "atomic_fa2")
    main = {(launch.kernel, launch.block, launch.shared_bytes) for launch in launches
            if launch.kernel.startswith("bwd_dkdv")}
    assert main == {(f"bwd_dkdv_fa2_{dt}_d{d}{c}", (256,), {64: 99_328, 128: 164_864}[d])
                    for dt in ("bf16", "f16") for c in ("", "_causal") for d in (64, 128)}, main
    assert {launch.grid for launch in launches if launch.kernel == "bwd_dkdv_fa2_bf16_d128"} == {(1, 2), (32, 2)}
    kernels = {k.name: k for k in module.kernels}
    for name, occ in assert_every_launch_fits(launches, kernels, "sm_90"):
        if name.startswith("bwd_dkdv_fa2"):
            assert occ.blocks_per_sm == 1, (name, occ)


def _dq_loop_chain(sass: str) -> tuple[int, int]:
    """(HMMA, the fewest HMMA from one to the next writing the same accumulator) in the dK/dV kernel's dQ k-loop: the
    instructions after the loop's last BAR.SYNC up to the first REDG (dS K's mma's and ldmatrix)."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
    last_bar = max(i for i, ln in enumerate(lines) if "BAR.SYNC" in ln)
    end = next(i for i in range(last_bar, len(lines)) if "REDG" in lines[i])
    dests = [re.search(r"HMMA\.\S+\s+(R\d+)", ln).group(1) for ln in lines[last_bar:end] if "HMMA" in ln]
    gaps = [j - i for i in range(len(dests)) for j in range(i + 1, len(dests)) if dests[j] == dests[i]
            and dests[i] not in dests[i + 1:j]]
    return len(dests), min(gaps)


def _hmma_among_exponentials(sass: str) -> int:
    """HMMA between the first and the last MUFU.EX2 of the dK/dV kernel's tile step (its first BAR.SYNC to the
    next): 0 where the exponentials run apart from the mma's, as in rung 8's mask branches."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
    bars = [i for i, ln in enumerate(lines) if "BAR.SYNC" in ln]
    step = lines[bars[0]:bars[1]]
    ex2 = [i for i, ln in enumerate(step) if "MUFU.EX2" in ln]
    return sum("HMMA" in ln for ln in step[ex2[0]:ex2[-1]])


def test_atomic_2d_ilp_keeps_rung_8s_step_and_widens_dqs_mma_chains(module):
    """Rung 9 compiles to rung 8's tile step (the same HMMA and LDSM, 2 blocks of 4 warps an SM at d = 64, no spills)
    with the dQ k-loop's accumulators in two sets: in its SASS an HMMA of the dQ loop writes the accumulator that the
    one 8 HMMA before it wrote (rung 8: 4); at d = 64 the exponentials of P^T share a basic block with dP^T's mma's
    (at least 16 HMMA among the MUFU.EX2, rung 8 none); and its LSE and Dv rows come by 16-byte cp.async
    (LDGSTS.E.BYPASS.128) only: no 4-byte LDGSTS.E (cache-all, through L1) is left, where rung 8 has them."""
    from kernellab import occupancy

    for s in SUFFIXES:
        two, ilp = module[f"bwd_dkdv_2d_{s}"], module[f"bwd_dkdv_ilp_{s}"]
        count = lambda k, op: len(re.findall(rf"\b{op}\b", str(k.sass)))            # noqa: E731
        assert count(ilp, "HMMA") == count(two, "HMMA") and count(ilp, "LDSM") == count(two, "LDSM"), s
        r = ilp.resources
        assert not r.spills and r.local_bytes == 0 and r.registers <= 255, (s, r)
        if "_d64" in s:
            assert occupancy(128, r.registers, 66_048, "sm_90").blocks_per_sm == 2, (s, r)
            n2, gap2 = _dq_loop_chain(str(two.sass))
            n9, gap9 = _dq_loop_chain(str(ilp.sass))
            assert gap2 == 4 and gap9 == 8 and n9 >= 16, (s, n2, gap2, n9, gap9)
            assert _hmma_among_exponentials(str(two.sass)) == 0, s
            assert _hmma_among_exponentials(str(ilp.sass)) >= 16, (s, _hmma_among_exponentials(str(ilp.sass)))
        bypass = lambda k: len(re.findall(r"LDGSTS\.E\.BYPASS\.128\b", str(k.sass)))   # noqa: E731
        assert bypass(ilp) > bypass(two), s
        assert not re.search(r"LDGSTS\.E\s", str(ilp.sass)) and re.search(r"LDGSTS\.E\s", str(two.sass)), s


def test_atomic_2d_ilp_runs_where_its_row_copies_apply_and_rung_8_elsewhere(module):
    """The launcher takes rung 9's kernel where N % 4 == 0 and the LSE is 16-byte aligned (N = 4, 1000, 4096), rung
    8's where not (N = 1, 65, 4097; an LSE 4 bytes into its storage), with rung 8's launch plan (grid, block, shared
    memory) either way; recorded on the CPU."""
    from launch_plans import recording

    launches = []
    t = load_tutorial(NB, compile=recording(launches))
    for N, shifted, want in ((4, False, "ilp"), (1000, False, "ilp"), (4096, False, "ilp"), (1, False, "2d"),
                             (65, False, "2d"), (4097, False, "2d"), (4096, True, "2d")):
        for d in (64, 128):
            launches.clear()
            q = torch.zeros(1, 2, N, d, dtype=torch.bfloat16)
            lse = torch.zeros(2 * N + 1)[1:].view(1, 2, N) if shifted else torch.zeros(1, 2, N)
            assert (lse.data_ptr() % 16 != 0) == shifted
            t["attention_backward"](q, q, q, q, lse, q, False, "atomic_2d_ilp")
            main = [x for x in launches if x.kernel.startswith("bwd_dkdv")]
            assert [x.kernel for x in main] == [f"bwd_dkdv_{want}_bf16_d{d}"], (N, shifted, d, main)
            assert (main[0].grid, main[0].block, main[0].shared_bytes) == (
                (-(-N // 128), 2), (128,) if d == 64 else (256,), 66_048 if d == 64 else 131_584), (N, d, main[0])


@needs_cxx
@pytest.mark.parametrize("BH,N,d,causal,variant", SHAPES)
def test_backward_in_the_emulator_matches_float64(BH, N, d, causal, variant, module):
    ours, want = emulated_backward(BH, N, d, causal, variant, seed=N + d, module=module)
    for name, got, ref in zip(("dq", "dk", "dv"), ours, want):
        assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} elements never written (or NaN)"
        err = np.abs(got - ref).max()
        # P and dS rounded to bf16 before their products, the result rounded to bf16: a few bf16 ulps of the
        # gradients' size (measured 3e-3 .. 9e-3 here, values up to 4); a wrong mask or a missing tile gives O(1)
        assert err <= 2 ** -6 * max(1.0, np.abs(ref).max()), f"{name}: max |err| {err:.3g}"


# --- step 1: tutorial 07's step-2 forward stores the LSE ------------------------------------------------------------

FORWARD = named_cuda_cells("07-fused-attention.py")["fa2_cell"]   # 07's step-2 cell (fa2_bf16_d64 ...)


@needs_cxx
@pytest.mark.parametrize("BH,N,d,dtype,causal", [
    (1, 65, 64, "bf16", True),
    pytest.param(2, 1, 64, "bf16", False, marks=pytest.mark.slow),
    pytest.param(1, 130, 128, "fp16", False, marks=pytest.mark.slow),
])
def test_forward_lse_in_the_emulator_matches_float64(BH, N, d, dtype, causal):
    """The LSE of every row (natural log of the scaled scores' sum of exps) within fp32 rounding, O as before."""
    rng = np.random.default_rng(N)
    x = [rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3)]
    if dtype == "bf16":
        arrays = [bf16_bits(a) for a in x]
        vals, O = [bf16_values(a) for a in arrays], np.full((BH, N, d), 0x7FC0, np.uint16)
    else:
        arrays = [a.astype(np.float16) for a in x]
        vals, O = [a.astype(np.float32) for a in arrays], np.full((BH, N, d), np.nan, np.float16)
    lse = np.full((BH, N), np.nan, np.float32)
    name = f"fa2_{'bf16' if dtype == 'bf16' else 'f16'}_d{d}{'_causal' if causal else ''}"
    emulate(FORWARD, name, (-(-N // 128), BH), (128,), arrays + [O, lse, N, d ** -0.5], (128 + 4 * 64) * d * 2)
    o_ref, lse_ref, *_ = reference(*vals, np.zeros_like(vals[0]), causal)
    assert not np.isnan(lse).any()
    assert np.abs(lse - lse_ref).max() < 1e-5 * max(1.0, np.abs(lse_ref).max())
    out = bf16_values(O) if dtype == "bf16" else O.astype(np.float32)
    assert np.abs(out - o_ref).max() < (2e-2 if dtype == "bf16" else 3e-3)
