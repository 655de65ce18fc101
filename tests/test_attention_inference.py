"""Tutorial 09 (grouped-query attention and flash-decoding) without a GPU: every kernel of its two `%%cuda` cells
compiles for sm_90 to mma.sync fed by cp.async, within its registers; the split plan fills one wave; and the
tutorial's own launchers, run on the CPU emulation of the kernels (kernellab.run.sim.cuda's emulate: ldmatrix,
mma.sync, cp.async), match attention in float64 on awkward shapes, GQA ratios, a batch of different cache lengths
(0, 1, partial tiles) and several query tokens."""
import pathlib
import re
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from notebook_cells import load_tutorial, named_cuda_cells  # noqa: E402

import kernellab  # noqa: E402
from kernellab.run.sim.cuda.emulate import compiler  # noqa: E402
from kernellab.run.sim.cuda.emulate import emulate  # noqa: E402

torch = pytest.importorskip("torch")
T09 = "09-attention-inference.py"
CELLS = named_cuda_cells(T09)
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler for the emulation")


@pytest.fixture(scope="module")
def modules():
    """Each cell compiled for sm_90, or for the cell's own --arch (sm_90a for wgmma)."""
    from notebook_cells import named_cuda_cells_with_arch

    return {name: kernellab.compile_cuda(src, arch=arch or "sm_90", first_line=2, filename="cell.cu")
            for name, (arch, src) in named_cuda_cells_with_arch(T09).items()}


def test_the_mma_sync_cells_take_the_softmax_and_p_v_from_the_header():
    """The GQA and decode kernels' S = Q K^T, online softmax and O += P V are tutorial 07's step-2 code, written once
    in kernellab/include/kl/attention_mma.cuh (with exp2_approx and swz): neither cell holds a copy."""
    for name in ("gqa_kernels", "decode_kernels"):
        src = CELLS[name]
        assert "#include <kl/attention_mma.cuh>" in src and src.count("softmax_pv<") == 1, (name, src[:400])
        assert src.count("scores_qk<") == 1 and "mma_16816<T>(" not in src, name
        assert not any(s in src for s in ("asm(", "__any_sync", "ldmatrix_x4_trans(", "uint32_t swz(")), name
        # the registers' start and the output's 1 / l, tutorial 07's too
        assert src.count("init_oml(") == 1 and src.count("quad_sum_inv(") == 1, name
        assert "__shfl_xor_sync(0xffffffffu, sum, 1)" not in src, name


def test_the_gqa_kernels_are_mma_sync_for_both_dtypes_head_dims_and_masks(modules):
    kernels = {k.name: k for k in modules["gqa_kernels"].kernels}
    assert sorted(kernels) == sorted(f"gqa_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in (64, 128)
                                     for c in ("", "_causal"))
    for name, k in kernels.items():
        text = str(k.instruction_summary)
        assert "HMMA.16816.F32" in text and "LDSM" in text and "LDGSTS" in text, (name, text)
        assert k.resources.max_threads_per_block == 128
        assert [p.name for p in k.params] == ["q", "k", "v", "o", "n", "g", "scale"]
        if name.endswith("_d128"):        # the non-causal d = 128 step spills a few bytes, as tutorial 07's step 2
            assert k.resources.spill_store_bytes <= 64, (name, k.resources)
        else:
            assert not k.resources.spills and k.resources.local_bytes == 0, (name, k.resources)


def test_the_decode_kernels_compile_without_spills(modules):
    kernels = {k.name: k for k in modules["decode_kernels"].kernels}
    splits = {f"{dt}_d64_m16" for dt in ("bf16", "f16")} | {f"{dt}_d64_m32" for dt in ("bf16", "f16")}
    splits |= {f"{dt}_d128_m16" for dt in ("bf16", "f16")}
    want = {f"decode_{x}" for x in splits} | {f"decode_fused_{x}" for x in splits}
    want |= {f"decode_fused_{dt}_d128_m16_l16" for dt in ("bf16", "f16")}        # the merge variant (16 loads)
    want |= {f"decode_fused_{dt}_d128_m16_online" for dt in ("bf16", "f16")}     # the one-pass merge variant
    want |= {f"decode_fused_{dt}_d128_m16{m}_early" for dt in ("bf16", "f16") for m in ("", "_online")}  # early tile
    want |= {f"decode_fused_{x}_pdl" for x in splits}                             # the op's kernels behind PDL
    want |= {f"decode_append_{dt}" for dt in ("bf16", "f16")}                     # the PDL step's producer
    want |= {f"combine_{dt}_d{d}" for dt in ("bf16", "f16") for d in (64, 128)}
    assert set(kernels) == want
    for name, k in kernels.items():
        assert not k.resources.spills and k.resources.local_bytes == 0, (name, k.resources)
        assert k.resources.max_threads_per_block == 128
        # griddepcontrol.wait (ACQBULK) in the PDL kernels only; launch_dependents (PREEXIT) in the producer and,
        # for the step's next kernel, in the PDL decode
        assert ("ACQBULK" in k.sass) == name.endswith("_pdl"), name
        assert ("PREEXIT" in k.sass) == (name.startswith("decode_append_") or name.endswith("_pdl")), name
        if name.startswith("decode_append_"):
            assert [p.name for p in k.params] == ["qkv", "q", "k_cache", "v_cache", "seqlens_in", "seqlens", "hq",
                                                  "hkv", "nq", "nmax", "d", "spin"]
            continue
        if name.startswith("decode_"):
            text = str(k.instruction_summary)
            assert "HMMA.16816.F32" in text and "LDSM" in text and "LDGSTS" in text, (name, text)
        if name.startswith("decode_") and not name.startswith("decode_fused_"):
            assert k.sass.count("BAR.SYNC") == 1, name     # warps are independent splits until the block's merge
            assert [p.name for p in k.params] == ["q", "k", "v", "seqlens", "o_part", "lse_part", "hkv", "g", "nq",
                                                  "nmax", "scale"]
        if name.startswith("decode_fused_"):
            # the same split; then a fence, the ticket (one atomic add on the counter) and the last block's merge
            assert [p.name for p in k.params] == ["q", "k", "v", "seqlens", "work", "out", "counters", "hkv", "g",
                                                  "nq", "nmax", "scale"]
            assert "MEMBAR.SC.GPU" in k.sass and k.sass.count("ATOMG.E.ADD") == 1, name
            assert "LDG.E.128.STRONG.GPU" in k.sass, name         # the partials as float4 through L2 (ld.global.cg)
    for dt in ("bf16", "f16"):                   # the last block's partial loads a thread has issued at the first use
        base, wide = (max(_loads_in_flight(kernels[f"decode_fused_{dt}_d128_m16{x}"].sass)) for x in ("", "_l16"))
        assert (base, wide) == (8, 16), dt
        # the one-pass merge: 16 partials (o and lse) in flight, and one barrier fewer (no weights in shared memory)
        online = kernels[f"decode_fused_{dt}_d128_m16_online"].sass
        assert max(_loads_in_flight(online)) == 16, dt
        assert online.count("BAR.SYNC") == kernels[f"decode_fused_{dt}_d128_m16"].sass.count("BAR.SYNC") - 1, dt


def test_the_pdl_decode_kernels_load_nothing_before_griddepcontrol_wait(modules):
    """Before its ACQBULK (griddepcontrol.wait) a PDL decode kernel issues L2 prefetches (CCTL) and parameter reads
    only: no global load, not even cache_seqlens (through a const __restrict__ pointer the compiler hoisted its load
    above the wait; load_after_wait keeps it after)."""
    for k in modules["decode_kernels"].kernels:
        if k.name.endswith("_pdl"):
            ops = [x.split(";")[0].strip() for x in k.sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", x)]
            wait = next(i for i, op in enumerate(ops) if "ACQBULK" in op)
            assert not [op for op in ops[:wait] if re.search(r"\b(LDG|LDGSTS|LD|ATOMG|STG|ST)\b", op)], k.name
            assert any("CCTL.E.PF2" in op for op in ops[:wait]), k.name      # the L2 prefetches do come first


def _loads_in_flight(sass):
    """For each `LDG.E.128.STRONG.GPU` (a partial read through L2), how many such loads are issued before an
    instruction reads its destination registers: the loads a thread has in flight when it first waits."""
    lines = [x.split(";")[0] for x in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", x)]
    counts = []
    for i, line in enumerate(lines):
        m = re.search(r"LDG\.E\.128\.STRONG\.GPU\s+R(\d+)", line)
        if not m:
            continue
        regs, n = {f"R{int(m[1]) + k}" for k in range(4)}, 1
        for later in lines[i + 1:]:
            if "LDG.E.128.STRONG.GPU" in later:
                n += 1
            elif regs & set(re.findall(r"\bR\d+\b", later.split(",", 1)[1] if "," in later else "")):
                break
        counts.append(n)
    return counts


# --- the launchers on the emulated kernels -------------------------------------------------------------------------

def _array(t):
    """A CPU tensor as a numpy array sharing its memory (bf16 as its uint16 bits), so the emulator writes into it."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class EmulatedModule:
    """A %%cuda cell's kernels run by emulate(): `mod[name][grid, block, shared_bytes](*args)` on CPU tensors."""

    def __init__(self, source):
        self.source, self.launches = source, []

    def __getitem__(self, name):
        def config(cfg):
            grid, block = cfg[0], cfg[1]
            shared = cfg[2] if len(cfg) > 2 else 0

            def launch(*args, **kw):
                assert all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))
                assert set(kw) <= {"pdl"}, kw               # pdl=True: a plain launch here (launches run in turn)
                self.launches.append((name, grid, block, shared) + ((("pdl", kw["pdl"]),) if kw else ()))
                emulate(self.source, name, grid if isinstance(grid, tuple) else (grid,), (block,),
                        [_array(a) if isinstance(a, torch.Tensor) else a for a in args], shared)
            return launch
        return type("EmulatedKernel", (), {"__getitem__": lambda _, cfg: config(cfg)})()


@pytest.fixture(scope="module")
def t09():
    return load_tutorial(T09, compile=EmulatedModule)


def tol(dtype):
    return 1.2e-2 if dtype == torch.bfloat16 else 2e-3


@needs_cxx
@pytest.mark.parametrize("dtype, d, Hq, Hkv, N, causal", [
    (torch.bfloat16, 64, 4, 2, 65, False),
    pytest.param(torch.float16, 64, 4, 1, 63, True, marks=pytest.mark.slow),
    pytest.param(torch.bfloat16, 128, 2, 1, 100, True, marks=pytest.mark.slow),
    pytest.param(torch.float16, 128, 8, 1, 1, False, marks=pytest.mark.slow),
])
def test_gqa_on_the_emulator(t09, dtype, d, Hq, Hkv, N, causal):
    g = torch.Generator().manual_seed(N)
    q = torch.randn(1, Hq, N, d, generator=g).to(dtype)
    k, v = (torch.randn(1, Hkv, N, d, generator=g).to(dtype) for _ in range(2))
    out = t09["gqa_attention"](q, k, v, causal)
    ref = t09["gqa_reference"](q, k, v, causal)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    # the reference itself agrees with SDPA (enable_gqa) in float64
    sd = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                          enable_gqa=True)
    assert torch.allclose(sd, ref, atol=1e-10)


@needs_cxx
@pytest.mark.parametrize("dtype, d, Hq, Hkv, nq, lens", [
    (torch.bfloat16, 64, 8, 2, 1, (0, 1, 63, 200)),             # empty, one key, one short of a tile, several tiles
    (torch.float16, 128, 4, 1, 3, (150, 2, 33)),               # three tokens; the second sequence's first sees none
    pytest.param(torch.bfloat16, 64, 16, 2, 4, (130, 77), marks=pytest.mark.slow),   # 64 rows: 32 a warp, 2 groups
])
def test_decode_on_the_emulator(t09, dtype, d, Hq, Hkv, nq, lens):
    g = torch.Generator().manual_seed(sum(lens))
    B, Nmax = len(lens), max(lens) + 3
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    out = t09["decode_attention"](q, kc, vc, sl)
    ref = t09["decode_reference"](q, kc, vc, sl)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    empty = ~t09["decode_mask"](sl, nq, Nmax).any(-1)                       # [B, 1, nq]: tokens with no key
    assert empty.any() == (min(lens) < nq)
    assert (out.double()[empty.expand(B, Hq, nq)] == 0).all()
    # where a token sees keys, the reference is SDPA with the mask, in float64
    mask = t09["decode_mask"](sl, nq, Nmax)
    sd = torch.nn.functional.scaled_dot_product_attention(q.double(), kc.double(), vc.double(), attn_mask=mask,
                                                          enable_gqa=True)
    seen = (~empty).expand(B, Hq, nq)
    assert torch.allclose(sd[seen], ref[seen], atol=1e-10)


@needs_cxx
@pytest.mark.parametrize("dtype, d, Hq, Hkv, nq, lens, min_keys", [
    (torch.bfloat16, 128, 4, 1, 1, (0, 17, 300, 129), 8),      # 9 block partials a head, lengths off the tile
    pytest.param(torch.float16, 64, 8, 2, 2, (97, 250), 16, marks=pytest.mark.slow),   # 4 partials, 2 KV heads
])
def test_the_fused_decode_merges_many_block_partials_on_the_emulator(t09, dtype, d, Hq, Hkv, nq, lens, min_keys):
    """decode_attention is one launch whose last block of each (sequence, KV head) merges the blocks' partials: with
    a small min_keys the plan gives several blocks a head even on short caches. Against float64 and the two-kernel
    step; a second call gives the same output (the last block reset the counters to 0, checked too)."""
    g = torch.Generator().manual_seed(sum(lens) + d)
    B, Nmax = len(lens), max(lens) + 7
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    plan = t09["decode_plan"](B, Hkv, Hq // Hkv, nq, Nmax, d, 132, min_keys)
    assert plan.splits // 4 >= 4, plan                                  # several blocks to merge per head
    launches = t09["decode_kernels"].launches
    before = len(launches)
    out = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys)
    assert [x[0] for x in launches[before:]] == [f"decode_fused_{t09['DTYPE_NAMES'][dtype]}_d{d}_m16"]   # one launch
    ref = t09["decode_reference"](q, kc, vc, sl)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())  # reset by the last blocks
    assert torch.equal(t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys), out)
    two = t09["decode_attention_two_kernels"](q, kc, vc, sl, min_keys=min_keys)
    assert (two.double() - out.double()).abs().max().item() <= 2 * tol(dtype) / 3   # the same merge, other order


@needs_cxx
@pytest.mark.parametrize("dtype, Hq, Hkv, lens", [
    (torch.bfloat16, 4, 1, (1, 63, 65, 1000, 1031)),            # GQA 4, a batch of awkward lengths: floor 20
    (torch.float16, 2, 2, (63, 1031)),                          # MHA (GQA 1), two KV heads: floor 16
    (torch.bfloat16, 8, 1, (4097,)),                            # GQA 8, 4097 keys: floor 16, 64 blocks a head
])
def test_the_decode_at_the_plans_default_floor_on_the_emulator(t09, dtype, Hq, Hkv, lens):
    """decode_attention as called (no min_keys): on short caches decode_floor gives fewer keys a warp than the old
    64, so more splits and block partials; the kernels are the same, the grid and splits not. Against float64, and
    against the same call at min_keys=64."""
    g = torch.Generator().manual_seed(sum(lens) + Hq)
    B, d, Nmax = len(lens), 128, max(lens) + 5
    q = torch.randn(B, Hq, 1, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    floor = t09["decode_floor"](B, Hkv, 1, Nmax)
    plan, old = (t09["decode_plan"](B, Hkv, Hq // Hkv, 1, Nmax, d, 132, mk) for mk in (None, 64))
    assert floor < 64 and plan == t09["decode_plan"](B, Hkv, Hq // Hkv, 1, Nmax, d, 132, floor)
    assert plan.splits > old.splits and plan.splits // 4 > 1, (plan, old)
    out = t09["decode_attention"](q, kc, vc, sl)
    ref = t09["decode_reference"](q, kc, vc, sl)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    at64 = t09["decode_attention"](q, kc, vc, sl, min_keys=64)
    assert (at64.double() - out.double()).abs().max().item() <= 2 * tol(dtype) / 3   # the same merge, other splits


@needs_cxx
@pytest.mark.parametrize("dtype, lens", [(torch.bfloat16, (1031, 333)), (torch.float16, (1000, 0))])
def test_the_merge_with_16_loads_in_flight_on_the_emulator(t09, dtype, lens):
    """decode_attention(merge_loads=16), the decode profile's variant: the last block keeps 16 partials in flight. At
    63-65 block partials a head (four batches of 16 and a short one, lengths off the tile, splits with no key, an
    empty cache) it gives the float64 reference, and the default's output up to rounding (the same sums in order)."""
    g = torch.Generator().manual_seed(sum(lens))
    B, Hq, Hkv, d, Nmax, min_keys = len(lens), 4, 1, 128, max(lens) + 7, 4
    q = torch.randn(B, Hq, 1, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    assert t09["decode_plan"](B, Hkv, Hq // Hkv, 1, Nmax, d, 132, min_keys).splits // 4 in (63, 65)
    launches = t09["decode_kernels"].launches
    before = len(launches)
    out = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys, merge_loads=16)
    assert [x[0] for x in launches[before:]] == [f"decode_fused_{t09['DTYPE_NAMES'][dtype]}_d128_m16_l16"]
    ref = t09["decode_reference"](q, kc, vc, sl)
    assert (out.double() - ref).abs().max().item() < tol(dtype)
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())  # reset by the last blocks
    default = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys)
    assert (default.double() - out.double()).abs().max().item() <= tol(dtype) / 4
    with pytest.raises(ValueError, match="merge_loads"):
        t09["decode_attention"](q[..., :64].contiguous(), kc[..., :64].contiguous(), vc[..., :64].contiguous(), sl,
                                merge_loads=16)


@needs_cxx
@pytest.mark.parametrize("dtype, Hq, Hkv, nq, lens, min_keys", [
    (torch.bfloat16, 4, 1, 1, (1, 63, 65, 1000), 4),       # G = 4: 63 partials a head (batches of 16 and 15), empty
    (torch.float16, 2, 2, 2, (1031, 0, 1), 16),              # G = 1, two tokens: an empty cache, a token with no key
    pytest.param(torch.bfloat16, 8, 1, 1, (4097,), 64, marks=pytest.mark.slow),       # G = 8, 4097 keys
])
def test_the_online_merge_on_the_emulator(t09, dtype, Hq, Hkv, nq, lens, min_keys):
    """decode_attention(merge="online"), the decode profile's variant: the last block merges the block partials in
    one pass (running max, rescaled sums, 16 partials' lse and o in flight). Against float64 on awkward cache lengths
    and a batch of different lengths, GQA ratios 1, 4 and 8; zeros where a token sees no key; the counters reset; the
    default merge's output up to rounding."""
    g = torch.Generator().manual_seed(sum(lens) + Hq)
    B, d, Nmax = len(lens), 128, max(lens) + 7
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    parts = t09["decode_plan"](B, Hkv, Hq // Hkv, nq, Nmax, d, 132, min_keys).splits // 4
    assert parts > 1, parts                                             # a last block merges
    launches = t09["decode_kernels"].launches
    before = len(launches)
    out = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys, merge="online")
    assert [x[0] for x in launches[before:]] == [f"decode_fused_{t09['DTYPE_NAMES'][dtype]}_d128_m16_online"]
    ref = t09["decode_reference"](q, kc, vc, sl)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    empty = ~t09["decode_mask"](sl, nq, Nmax).any(-1)
    assert (out.double()[empty.expand(B, Hq, nq)] == 0).all() and empty.any() == (min(lens) < nq)
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())  # reset by the last blocks
    default = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys)
    assert (default.double() - out.double()).abs().max().item() <= tol(dtype) / 4
    with pytest.raises(ValueError, match="merge"):
        t09["decode_attention"](q[..., :64].contiguous(), kc[..., :64].contiguous(), vc[..., :64].contiguous(), sl,
                                merge="online")
    with pytest.raises(ValueError, match="merge"):
        t09["decode_attention"](q, kc, vc, sl, merge="last block")


@needs_cxx
@pytest.mark.parametrize("dtype, Hq, Hkv, nq, lens, nmax_extra, merge", [
    (torch.bfloat16, 4, 1, 1, (1000, 63, 1, 0), 0, "shared"),     # full cache (every guess right), short ones wrong
    (torch.float16, 8, 8, 2, (1031, 65), 3, "online"),            # L = Nmax - 3: right guesses with rows past L
    pytest.param(torch.bfloat16, 8, 1, 1, (4097, 1000), 0, "online", marks=pytest.mark.slow),    # G = 8
])
def test_the_early_first_tile_on_the_emulator(t09, dtype, Hq, Hkv, nq, lens, nmax_extra, merge):
    """decode_attention(early=True), the decode profile's variant: each warp asks for its first tile before
    cache_seqlens arrives, guessing a full cache. The cache holds NaN past each sequence's length, so a guessed tile's
    rows past L must be zeroed (V) or masked (K): against float64 on the cleaned cache, with the guess right (full
    caches, L just under Nmax) and wrong (short sequences in the batch), GQA ratios 1, 4, 8, both merges."""
    g = torch.Generator().manual_seed(sum(lens) + nq)
    B, d, Nmax, min_keys = len(lens), 128, max(lens) + nmax_extra, 16
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype)
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32)
    ref = t09["decode_reference"](q, kc, vc, sl)                 # before the NaN: the reference reads no key past L
    for b, n in enumerate(lens):
        kc[b, :, n:], vc[b, :, n:] = float("nan"), float("nan")
    assert t09["decode_plan"](B, Hkv, Hq // Hkv, nq, Nmax, d, 132, min_keys).splits // 4 > 1
    launches = t09["decode_kernels"].launches
    before = len(launches)
    out = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys, merge=merge, early=True)
    suffix = "_online" if merge == "online" else ""
    assert [x[0] for x in launches[before:]] == [f"decode_fused_{t09['DTYPE_NAMES'][dtype]}_d128_m16{suffix}_early"]
    assert not out.isnan().any()
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())  # reset by the last blocks
    default = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys, merge=merge)     # zero-filled past L
    assert torch.equal(default, out)                                      # the same tiles, the same sums
    with pytest.raises(ValueError, match="early"):
        t09["decode_attention"](q, kc, vc, sl, merge_loads=16, early=True)


@needs_cxx
@pytest.mark.parametrize("dtype, d, Hq, Hkv, nq, old_lens, nmax_extra", [
    (torch.bfloat16, 128, 4, 1, 1, (999, 62, 0), 1),       # G = 4; the new row makes 1000, 63, 1; one cache now full
    pytest.param(torch.float16, 64, 4, 2, 2, (1029, 3), 0, marks=pytest.mark.slow),   # d = 64, two new tokens
])
def test_a_decode_step_behind_its_producer_with_pdl_on_the_emulator(t09, dtype, d, Hq, Hkv, nq, old_lens, nmax_extra):
    """The PDL step: decode_append (the producer: q, the new K/V rows and cache_seqlens from qkv) then
    decode_attention(pdl=True), whose kernel prefetches into L2 and waits before its first load. On the emulator
    (griddepcontrol a no-op, launches in turn) it must give the default kernel's output bit for bit and match float64
    on the cache the producer wrote; the producer's rows and lengths are checked too."""
    g = torch.Generator().manual_seed(sum(old_lens) + d)
    B, Nmax = len(old_lens), max(old_lens) + nq + nmax_extra - 1
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype) for _ in range(2))
    qkv = torch.randn(B, Hq + 2 * Hkv, nq, d, generator=g).to(dtype)
    old = torch.tensor(old_lens, dtype=torch.int32)
    launches = t09["decode_kernels"].launches
    before = len(launches)
    q, sl = t09["decode_append"](qkv, kc, vc, old)
    out = t09["decode_attention"](q, kc, vc, sl, min_keys=16, pdl=True)
    dt = t09["DTYPE_NAMES"][dtype]
    assert [x[0] for x in launches[before:]] == [f"decode_append_{dt}", f"decode_fused_{dt}_d{d}_m16_pdl"]
    assert launches[-1][-1] == ("pdl", True) and len(launches[-2]) == 4          # only the decode asks for PDL
    assert sl.tolist() == [min(n + nq, Nmax) for n in old_lens] and torch.equal(q, qkv[:, :Hq])
    for b, n in enumerate(old_lens):                                              # the new rows, where they fit
        fit = min(nq, Nmax - n)
        assert torch.equal(kc[b, :, n:n + fit], qkv[b, Hq:Hq + Hkv, :fit])
        assert torch.equal(vc[b, :, n:n + fit], qkv[b, Hq + Hkv:, :fit])
    ref = t09["decode_reference"](q, kc, vc, sl)
    err = (out.double() - ref).abs().max().item()
    assert err < tol(dtype), err
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())  # reset by the last blocks
    assert torch.equal(t09["decode_attention"](q, kc, vc, sl, min_keys=16), out)   # the default kernel's sums
    if d == 128:                                     # (at d = 64 the online merge is refused for its own reason)
        with pytest.raises(ValueError, match="pdl=True launches the op's kernel"):
            t09["decode_attention"](q, kc, vc, sl, merge="online", pdl=True)


def test_the_split_plan_fills_one_wave(t09):
    plan = t09["decode_plan"]
    for B, Hkv, G, nq, Nmax, d in ((1, 8, 4, 1, 131072, 128), (1, 8, 8, 1, 8192, 64), (4, 8, 4, 1, 65536, 128),
                                   (2, 1, 32, 1, 32768, 128), (1, 8, 8, 4, 65536, 64)):
        p = plan(B, Hkv, G, nq, Nmax, d, sms=132)
        blocks = p.splits // 4 * B * Hkv * p.row_groups
        wave = 132 * p.blocks_per_sm
        assert p.splits % 4 == 0 and wave // 2 < blocks <= wave, (B, Hkv, G, Nmax, p)     # between half and one wave
        assert p.row_groups * p.rows_per_warp >= G * nq
    assert plan(1, 8, 4, 1, 1024, 128, sms=132).splits == 32           # decode_floor at 1k: 32 keys a split
    assert plan(1, 8, 4, 1, 1024, 128, sms=132, min_keys=64).splits == 16   # the override: 64 keys a split at least
    assert plan(1, 8, 4, 1, 512, 128, sms=132).splits == 32            # 16 keys a split: one tile a warp
    assert plan(1, 8, 4, 1, 2048, 128, sms=132).splits == 32           # from 2k the floor is 64 again
    assert plan(1, 8, 4, 1, 512, 64, sms=132).splits == 16             # d = 64: at least a 32-key tile a warp
    assert plan(64, 8, 4, 1, 8192, 128, sms=132).splits == 4           # more heads than a wave: the least, 4
    p = plan(1, 8, 8, 4, 8192, 64, sms=132)                            # 32 rows at d = 64: one warp takes them
    assert (p.rows_per_warp, p.row_groups) == (32, 1)
    p = plan(1, 8, 8, 4, 8192, 128, sms=132)                           # at d = 128: two groups of 16
    assert (p.rows_per_warp, p.row_groups) == (16, 2)


def test_the_plans_blocks_per_sm_are_the_occupancy_of_the_compiled_kernels(t09, modules):
    """The wave the split plan fills is what the occupancy model gives for the compiled kernels' registers and the
    plan's shared memory, for both the fused kernel (what decode_attention launches) and the two-kernel step's."""
    kernels = {k.name: k for k in modules["decode_kernels"].kernels}
    for d, G in ((64, 4), (64, 8), (128, 4)):
        p = t09["decode_plan"](1, 8, G, 4 if G == 8 else 1, 8192, d, sms=132)
        for kind in ("decode_fused", "decode"):
            k = kernels[f"{kind}_bf16_d{d}_m{p.rows_per_warp}"]
            occ = k.occupancy(128, shared_bytes=p.shared_bytes)
            assert occ.blocks_per_sm == p.blocks_per_sm, (kind, d, G, p, occ.title)
        assert p.shared_bytes <= 227 * 1024


def test_the_launchers_refuse_what_the_kernels_do_not_take(t09):
    q = torch.zeros(1, 6, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        t09["gqa_attention"](q, k, k, False)
    with pytest.raises(ValueError, match="d = 64 or 128"):
        t09["gqa_attention"](torch.zeros(1, 4, 8, 96, dtype=torch.bfloat16), torch.zeros(1, 4, 8, 96,
                             dtype=torch.bfloat16), torch.zeros(1, 4, 8, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="int32"):
        t09["decode_attention"](q[:, :4, :1].contiguous(), k, k, torch.tensor([3]))
    with pytest.raises(ValueError, match="contiguous"):
        sq = torch.zeros(1, 4, 64, 64, dtype=torch.bfloat16).transpose(2, 3)
        t09["gqa_attention"](sq, sq, sq)
    kv16 = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)          # 16 positions against q's 8: both launchers say so
    with pytest.raises(ValueError, match=r"^gqa_attention: q has 8 positions and k, v 16; for a KV cache use "
                                         r"decode_attention$"):
        t09["gqa_attention"](q, kv16, kv16)
    with pytest.raises(ValueError, match=r"^gqa_attention_wgmma: q has 8 positions and k, v 16$"):
        t09["gqa_attention_wgmma"](q, kv16, kv16)
    with pytest.raises(ValueError, match=r"^gqa_attention_wgmma: the batch must match"):
        t09["gqa_attention_wgmma"](q, torch.zeros(2, 2, 8, 64, dtype=torch.bfloat16),
                                   torch.zeros(2, 2, 8, 64, dtype=torch.bfloat16))


# --- the Hopper GQA kernels (wgmma + TMA, tutorial 07's consumer from kl/attention.cuh) -----------------------------

def test_the_hopper_gqa_kernel_takes_tutorial_07s_producer_from_the_header():
    """The wgmma GQA kernel's producer (the Q copy, the K/V ring) is tutorial 07's step 3's, written once in
    kernellab/include/kl/attention.cuh with the KV head as its argument: the cell holds no copy of it."""
    src = CELLS["gqa_wgmma_kernels"]
    assert "#include <kl/attention.cuh>" in src and src.count("wg_attention<") == 1, src[:400]
    assert src.count("produce_q<") == 1 and src.count("produce_kv<") == 1 and src.count("QKvRing<") == 1
    assert "n_tiles, bkv)" in src, "the K/V copies read the KV head (bkv), not the query head"
    assert "tma_load_3d(" not in src and "mbar_expect_tx(" not in src
    # and its block prologue: tutorial 07's causal tile count and fenced mbarrier inits
    assert "kv_tiles<BM, BN, CAUSAL>(N, q0)" in src and src.count("sm.init_barriers_and_sync(") == 1
    assert "fence.mbarrier_init" not in src and "n_tiles_all" not in src


def test_the_hopper_gqa_kernels_are_wgmma_fed_by_tma_without_spills(modules):
    from notebook_cells import named_cuda_cells_with_arch

    assert named_cuda_cells_with_arch(T09)["gqa_wgmma_kernels"][0] == "sm_90a"
    kernels = {k.name: k for k in modules["gqa_wgmma_kernels"].kernels}
    assert sorted(kernels) == sorted(f"gqa_wgmma_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in (64, 128)
                                     for c in ("", "_causal"))
    for name, k in kernels.items():
        consumers = 3 if "_d64" in name else 2
        assert k.resources.max_threads_per_block == 128 * (consumers + 1), (name, k.resources)
        assert not k.resources.spills and k.resources.local_bytes == 0, (name, k.resources)
        assert [p.name for p in k.params] == ["tq", "tk", "tv", "o", "n", "scale"]
        text = str(k.instruction_summary)
        assert "HGMMA.64x" in text and "UTMALDG" in text and "HMMA.16816" not in text, (name, text)


@needs_cxx
@pytest.mark.parametrize("dtype, d, Hq, Hkv, N, causal", [
    (torch.bfloat16, 64, 4, 2, 65, True),                        # two groups of 2; a partial query block and tile
    pytest.param(torch.float16, 128, 6, 2, 200, False, marks=pytest.mark.slow),   # G = 3, two query blocks
    pytest.param(torch.bfloat16, 128, 4, 1, 130, True, marks=pytest.mark.slow),   # MQA: one KV head for all
])
def test_hopper_gqa_on_the_emulator(t09, dtype, d, Hq, Hkv, N, causal):
    """Query head h reads KV head h / G through the third TMA coordinate: the emulated kernel (TMA, mbarriers, wgmma)
    matches attention in float64, each KV head's K/V differing so that a wrong head shows."""
    from kernellab.run.sim.cuda.emulate import TensorMap

    g = torch.Generator().manual_seed(N + d)
    B = 1
    q = torch.randn(B, Hq, N, d, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, N, d, generator=g).to(dtype) for _ in range(2))
    o = torch.full_like(q, float("nan"))
    consumers = 3 if d == 64 else 2
    bm, bn, stages = 64 * consumers, 128, 2
    arrays = [_array(x.reshape(-1, N, d)) for x in (q, k, v)]
    maps = [TensorMap(a, 64, rows) for a, rows in zip(arrays, (bm, bn, bn))]
    name = f"gqa_wgmma_{'bf16' if dtype == torch.bfloat16 else 'f16'}_d{d}{'_causal' if causal else ''}"
    smem = 1024 + (bm + 2 * stages * bn) * d * 2 + 256
    emulate(CELLS["gqa_wgmma_kernels"], name, (Hq // Hkv, -(-N // bm), B * Hkv), (128 * (consumers + 1),),
            maps + [_array(o.view(-1, N, d)), N, d ** -0.5], smem)
    assert not o.isnan().any(), f"{int(o.isnan().sum())} elements never written"
    ref = t09["gqa_reference"](q, k, v, causal)
    err = (o.double() - ref).abs().max().item()
    assert err < tol(dtype) * 1.5, err
    # reading the query head's own index as the KV head would give another answer: the test tells them apart
    wrong = t09["gqa_reference"](q, k.repeat_interleave(Hq // Hkv, 1)[:, :Hkv].contiguous(),
                                 v.repeat_interleave(Hq // Hkv, 1)[:, :Hkv].contiguous(), causal) if Hkv > 1 else None
    if wrong is not None:
        assert (o.double() - wrong).abs().max().item() > 10 * err


# --- benchmarks/attention_inference.py: its PyTorch baseline computes the same op, its tables print -----------------

sys.path.insert(0, str(HERE.parent / "benchmarks"))


def test_the_pytorch_decode_baseline_is_the_same_op(t09):
    """decode_torch (the torch.compile baseline of benchmarks/attention_inference.py) computes decode_attention."""
    g = torch.Generator().manual_seed(5)
    for nq, lens in ((1, (0, 1, 40, 77)), (3, (2, 50))):
        B, Nmax = len(lens), 80
        q = torch.randn(B, 8, nq, 64, generator=g)
        kc, vc = (torch.randn(B, 2, Nmax, 64, generator=g) for _ in range(2))
        sl = torch.tensor(lens, dtype=torch.int32)
        ours = t09["decode_torch"](q, kc, vc, sl)
        assert torch.allclose(ours.double(), t09["decode_reference"](q, kc, vc, sl), atol=1e-5)


def test_a_loaded_tutorials_functions_compile_with_dynamo(t09):
    """load_tutorial runs the launcher cells in a module registered in sys.modules, so dynamo (which imports a
    function's module by its __name__ to read its globals) traces decode_torch, the benchmark's torch.compile
    baseline; a second load of the same tutorial gets its own module."""
    import torch._dynamo

    fn = t09["decode_torch"]
    assert sys.modules[fn.__module__].__dict__ is fn.__globals__
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 8, 1, 64, generator=g)
    kc, vc = (torch.randn(2, 2, 40, 64, generator=g) for _ in range(2))
    sl = torch.tensor([40, 17], dtype=torch.int32)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(q, kc, vc, sl).double(), t09["decode_reference"](q, kc, vc, sl), atol=1e-5)
    again = load_tutorial(T09, compile=EmulatedModule)
    assert again["decode_torch"].__module__ != fn.__module__
    assert sys.modules[again["decode_torch"].__module__].__dict__ is again["decode_torch"].__globals__
    assert sys.modules[fn.__module__].__dict__ is fn.__globals__


def test_the_benchmarks_tables_name_the_targets():
    import attention_inference as bench
    from as_called import METHODS

    names = (bench.FLASH_EXPANDED, bench.SDPA_DEFAULT, bench.SDPA_CUDNN)
    ms = {m: {"ours": 1.0, names[0]: 1.1, names[1]: 0.9, names[2]: 0.8} for m in METHODS}
    gqa = [{"label": "bfloat16 N=512 d=64 B*Hq=512 G=4", "check": "passed", "ms": ms, "tflops": 300.0,
            "sdpa_choice": "cudnn_attention", "cudnn_how": "enable_gqa",
            "vs": {b: {m: ms[m][b] for m in METHODS} for b in names}},
           {"label": "bfloat16 N=512 d=64 B*Hq=512 G=8", "check": "passed", "ms": ms, "tflops": 300.0,
            "sdpa_choice": "flash_attention", "cudnn_how": None,
            "vs": {b: {m: ms[m][b] for m in METHODS} for b in names[:2]}}]
    dec = [{"label": "B=1 cache=8192 nq=1", "B": 1, "L": 8192, "check": "passed", "ms": {},
            "of_copy": {m: 0.75 for m in METHODS}, "fastest_torch": {m: "SDPA flash" for m in METHODS},
            "vs_fastest": {m: 2.0 for m in METHODS}}]
    text = bench.tables(gqa, dec, 3000.0)
    assert "| cudnn_attention | enable_gqa | 1.10x" in text and "| flash_attention | - | 1.10x" in text
    g8 = next(line for line in text.splitlines() if "G=8" in line)
    assert g8.endswith(" | -" * len(METHODS) + " |") and "-" not in text.splitlines()[2].split("|")[-2]
    assert (f"{names[0]} 1.10x; {names[1]} 0.90x; {names[2]} 0.80x (target 1.0x against {names[0]})" in text)
    assert f"2/2 against {names[0]}; 0/2 against {names[1]}; 0/1 against {names[2]}" in text
    assert "lowest 75% of copy (B=1 cache=8192 nq=1, kernellab.bench; target 80%)" in text
    assert "over the two-kernel step" not in text and "split floor" not in text
    dec[0].update(vs_two_kernels={m: 2.5 for m in METHODS}, sweep_of_copy={"ours, min_keys=32": 0.81})
    dtext = bench.tables([], dec, 3000.0)
    assert dtext.splitlines()[3].endswith(" | SDPA flash | " + " | ".join(["2.50x"] * len(METHODS)) + " |")
    assert "the one-launch op over the two-kernel step (every case and method): 2.50x to 2.50x" in dtext
    assert "B=1 cache=8192 nq=1: default 75%, min_keys=32 81%" in dtext
    assert "the op picks" not in text and "wgmma / mma.sync" not in text          # no step timings, no step table
    gqa[0].update(op_picks="wgmma", steps={bench.MMA: {"check": "passed", "tflops": 300.0},
                                           bench.WGMMA: {"check": "passed", "tflops": 450.0}},
                  wgmma_over_mma={m: 1.5 for m in METHODS}, op_over_best_step={m: 0.98 for m in METHODS})
    text = bench.tables(gqa, dec, 3000.0)
    line = next(x for x in text.splitlines() if x.startswith("| bfloat16 N=512 d=64 B*Hq=512 G=4 | wgmma |"))
    assert line == "| bfloat16 N=512 d=64 B*Hq=512 G=4 | wgmma | 300 | 450 | " + "1.50x | " * len(METHODS) \
        + " | ".join(["0.98x"] * len(METHODS)) + " |"
    assert "the op against the faster of its two kernels (kernellab.bench): lowest 0.98x" in text


def test_the_benchmarks_gqa_loop_calls_every_function_as_it_times_it(monkeypatch):
    """benchmarks/attention_inference.py's GQA loop on the CPU: a stand-in tutorial (SDPA for both kernels), fake
    timings; every function is called with the inputs it is timed on (q, k, v and K/V expanded beforehand) and the
    rows and tables come out with the op's choice, both kernels and the baselines that take the case."""
    import as_called
    import attention_inference as bench
    from as_called import METHODS

    F = torch.nn.functional
    calls = []

    def fake_time(fns, inputs, **kw):
        args = inputs(torch.Generator(kw["generator_device"]).manual_seed(0))
        assert len(args) == 5 and args[3].shape == args[0].shape          # K/V expanded to Hq heads, made outside
        for name, fn in fns.items():
            out = fn(*args)
            assert out.shape == args[0].shape, name
            calls.append(name)
        return {m: {n: 1.0 + 0.1 * i for i, n in enumerate(fns)} for m in METHODS}

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    monkeypatch.setattr(as_called, "time_as_called", fake_time)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    t = {"gqa_attention_mma": sdpa, "gqa_attention_wgmma": sdpa,
         "gqa_step": lambda q, N, d: "wgmma" if d == 128 else "mma.sync"}
    rows = bench.gqa_rows(t, torch, True, (torch.float32,), True, shapes=[(16, 4)], ratios=[2], op=sdpa)
    assert len(rows) == 4                                     # d 64 and 128, causal and not
    for r in rows:
        assert r["check"] == "passed" and set(r["steps"]) == {bench.MMA, bench.WGMMA}
        assert r["op_picks"] == ("wgmma" if "d=128" in r["label"] else "mma.sync")
        assert bench.FLASH_EXPANDED in r["vs"] and bench.SDPA_DEFAULT in r["vs"]
        assert bench.MMA not in r["vs"] and set(r["wgmma_over_mma"]) == set(METHODS)
    assert {"ours", bench.FLASH_EXPANDED, bench.SDPA_DEFAULT, bench.MMA, bench.WGMMA} <= set(calls)
    text = bench.tables(rows, [], 3000.0)
    assert "| float32 N=16 d=128 B*Hq=4 G=2 | wgmma |" in text and "lowest ratio over all methods" in text


def test_the_benchmarks_decode_loop_calls_every_function_as_it_times_it(monkeypatch, t09, capsys):
    """The decoding loop on the CPU: decode_torch as the op's stand-in and (uncompiled) as the torch.compile
    baseline, fake timings; the SDPA backends that refuse the case are skipped with one line each, the rest timed."""
    import as_called
    import attention_inference as bench
    from as_called import METHODS

    timed = []

    def fake_time(fns, inputs, **kw):
        args = inputs(torch.Generator(kw["generator_device"]).manual_seed(0))
        for name, fn in fns.items():
            assert fn(*args).shape == args[0].shape, name
        timed.append(list(fns))
        return as_called.Timings({m: {n: 1.0 + 0.1 * i for i, n in enumerate(fns)} for m in METHODS},
                                 host_ms={n: 0.01 * (i + 1) for i, n in enumerate(fns)})

    monkeypatch.setattr(as_called, "time_as_called", fake_time)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    steps = lambda B, L: {bench.TWO_KERNELS: t09["decode_torch"],                       # noqa: E731
                          "ours, min_keys=16": lambda *a: t09["decode_torch"](*a)}
    rows = bench.decode_rows(t09, torch, True, 3000.0, 1, cases=[(2, 40)], op=t09["decode_torch"], steps=steps)
    assert len(rows) == 1 and rows[0]["check"] == "passed" and rows[0]["steps_check"] == [], rows
    assert timed[0][:2] == ["ours", "torch.compile grouped matmul"] and "SDPA math" in timed[0]
    assert {bench.TWO_KERNELS, "ours, min_keys=16"} <= set(timed[0])
    # our own launches are neither the fastest PyTorch path nor missing from the row
    assert rows[0]["fastest_torch"]["kernellab.bench"] not in (bench.TWO_KERNELS, "ours, min_keys=16")
    assert set(rows[0]["vs_two_kernels"]) == set(METHODS) and set(rows[0]["sweep_of_copy"]) == {"ours, min_keys=16"}
    assert rows[0]["host_us"]["ours"] == pytest.approx(10.0)            # as_called's host ms a call, in µs
    captured = capsys.readouterr()
    out = captured.out
    assert "Traceback" not in captured.err, captured.err[-2000:]
    skipped = [line for line in out.splitlines() if "skipping" in line]
    assert len(skipped) == len(set(skipped)) and all(name not in timed[0] for line in skipped
                                                      for name in [line.split("skipping ")[1].split(" where")[0]])


def test_the_benchmark_skips_backends_that_refuse_a_case_quietly_and_names_pytorchs_choice(capsys):
    import warnings

    import attention_inference as bench

    def refuses():
        warnings.warn("Flash attention kernel not used because:")
        warnings.warn("For dense input, both fused kernels require query, key and value to have the same num_heads. "
                      "(Triggered internally at sdp_utils_cpp.h:418.)")
        raise RuntimeError("No available kernel. Aborting execution.")

    assert bench.refusal(lambda: None) is None
    why = bench.refusal(refuses)
    assert why == "For dense input, both fused kernels require query, key and value to have the same num_heads"
    assert bench.refusal(lambda: (_ for _ in ()).throw(RuntimeError("No available kernel. Aborting execution."))) == "No available kernel"
    with pytest.raises(ValueError):                       # only a refusal (RuntimeError) is skipped
        bench.refusal(lambda: int("x"))
    bench.note_skipped("SDPA efficient", why)
    bench.note_skipped("SDPA efficient", why)
    out = capsys.readouterr()
    assert out.out.count("skipping SDPA efficient") == 1 and out.err == ""
    q = torch.randn(1, 8, 16, 64)
    k = torch.randn(1, 2, 16, 64)
    from torch.nn.attention import SDPBackend
    assert bench.sdpa_choice(torch, q, k, k, False) in {n.lower() for n in SDPBackend.__members__}


@needs_cxx
def test_the_pdl_step_benchmark_checks_and_times_each_step_on_the_emulator(t09, capsys):
    """benchmarks/decode_pdl.py (attention_inference.py --part decode --pdl) on the CPU: the tutorial's producer and
    decode on the emulator (a small head, a 40-position cache), both producers; every function called as it would be
    timed, fake timings; the check against SDPA and of the PDL step against the plain one passes; decode's share of
    copy in the step is the bytes over (step - producer alone)."""
    import decode_pdl as dp

    timed = []

    def fake_time(fns, inputs):
        args = inputs(torch.Generator().manual_seed(1))
        for name, fn in fns.items():
            fn(*args)
        timed.append(list(fns))
        return {"kernellab.bench": {dp.STEP_PDL: 0.025, dp.STEP: 0.030, dp.PRODUCER: 0.005, dp.DECODE: 0.028}}

    graph = {dp.STEP_PDL: 20.0, dp.STEP: 24.0, dp.PRODUCER: 4.0, dp.DECODE: 22.0}
    names = {}

    def fake_graph(fn, args):
        return graph[names[id(fn)]]

    def timing(fns, inputs):
        names.update({id(f): n for n, f in fns.items()})
        return fake_time(fns, inputs)

    launches = t09["decode_kernels"].launches
    before = len(launches)
    ops = (lambda q, k, v, s: t09["decode_attention"](q, k, v, s),
           lambda q, k, v, s: t09["decode_attention"](q, k, v, s, pdl=True))
    rows = dp.run(t09, torch, 3000.0, caches=(40,), qkv_caches=(40,), time_fn=timing, graph_fn=fake_graph,
                  device="cpu", ops=ops, shape=(1, 4, 1, 128), log=print)
    assert [r["check"] for r in rows] == ["passed", "passed"], rows
    assert [r["producer"] for r in rows] == ["append", "qkv projection + append"]
    assert timed == [[dp.STEP_PDL, dp.STEP, dp.PRODUCER, dp.DECODE]] * 2
    pdl_launches = [x for x in launches[before:] if x[-1] == ("pdl", True)]
    assert pdl_launches and all(x[0] == "decode_fused_bf16_d128_m16_pdl" for x in pdl_launches)
    assert {x[0] for x in launches[before:]} == {"decode_append_bf16", "decode_fused_bf16_d128_m16",
                                                 "decode_fused_bf16_d128_m16_pdl"}
    r = rows[0]
    copy_us = dp._moved(40, 1, 4, 1, 128) / 3000e3
    assert r["of_copy"]["kernellab.bench"] == pytest.approx(
        {"alone": copy_us / 28.0, "step": copy_us / 25.0, "step, PDL": copy_us / 20.0})
    assert r["of_copy"]["CUDA graph"]["step, PDL"] == pytest.approx(copy_us / 16.0)
    assert r["pdl_speedup"] == pytest.approx({"kernellab.bench": 1.2, "CUDA graph": 1.2})
    text = dp.table(rows, 3000.0)
    assert "| B=1 cache=40 producer: append | kernellab.bench | passed | 5.0 | 28.0 | 30.0 | 25.0 | 1.20x |" in text
    assert text.splitlines()[-1] == "PDL step over the plain step, every case and method: 1.20x to 1.20x"
    assert "Traceback" not in capsys.readouterr().err


def test_the_pdl_prediction_is_the_latency_models_decode_less_what_the_producer_hides():
    """benchmarks/decode_pdl.py's prediction: decode_model's call (alone), its kernel plus the gap between queued
    kernels (in the step), less what PDL hides, capped by the producer's length (in the step with PDL)."""
    import decode_pdl as dp
    import decode_profile

    m = decode_profile.decode_model(1, 8192, decode_profile.profile_plan(1, 8192))
    p = dp.prediction(8192, copy_gbps=3000.0)
    hideable = decode_profile.H100.kernel_floor_us / 2 + m.ramp_us + dp.GAP_US + 2 * (
        decode_profile.H100.dram_latency_us - decode_profile.H100.l2_latency_us)
    assert p["hideable_us"] == pytest.approx(hideable) and hideable > dp.PRODUCER_KERNEL_US
    assert p["us"] == pytest.approx({"alone": m.clean_us, "step": m.ncu_us + dp.GAP_US,
                                     "step, PDL": m.ncu_us + dp.GAP_US - dp.PRODUCER_KERNEL_US})
    long_producer = dp.prediction(8192, producer_us=50.0, copy_gbps=3000.0)          # hides all it can, no more
    assert long_producer["us"]["step, PDL"] == pytest.approx(m.ncu_us + dp.GAP_US - hideable)
    assert [round(100 * v) for v in p["of_copy"].values()] == [48, 51, 58]          # what the notes and notebook say
    import attention_inference as bench

    assert p["of_copy"]["step, PDL"] < bench.TARGET_OF_COPY           # the target stays out of reach at 8k
