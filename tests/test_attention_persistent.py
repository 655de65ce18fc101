"""Tutorial 07's step 3b, the persistent kernel (the fa3p_* entries of the notebook's step-3 cell, kernellab issue 12)
without a GPU: it compiles to the Hopper instructions with no spills, and in the CPU emulator (kernellab/run/sim/cuda) it matches
attention in float64 on awkward shapes with CTAs that each walk many work items (their barriers' phases wrapping),
and writes the very bits the notebook's step 3 writes."""
import pathlib
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "gpu"))
from kernellab.run.sim.cuda.emulate import compiler  # noqa: E402
from kernellab.run.sim.cuda.emulate import TensorMap, bf16_bits, bf16_values, emulate  # noqa: E402

from notebook_cells import cuda_cells  # noqa: E402

SOURCE = next(c for c in cuda_cells("07-fused-attention.py") if "fa3p_bf16_d64" in c)     # the notebook's cell
BLOCK_N, STAGES = 128, 2
STAGES_3B = {64: 3, 128: 2}                  # the cell's FA3P_ST64 / FA3P_ST128 (step 3 keeps 2)
CONSUMERS = {64: 3, 128: 2}                   # the file's FA3P_WG64 / FA3P_WG128
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the emulation")


def test_the_candidate_is_wgmma_fed_by_tma_without_spills():
    import kernellab

    mod = kernellab.compile_cuda(SOURCE, arch="sm_90a")
    kernels = [k for k in mod.kernels if k.name.startswith("fa3p_") and not k.name.startswith("fa3p_sched_")]
    assert sorted(k.name for k in kernels) == sorted(f"fa3p_{dt}_d{d}{c}{h}" for dt in ("bf16", "f16") for d in (64, 128)
                                                     for c in ("", "_causal") for h in ("", "_bm128", "_bm64")
                                                     if d == 64 or not h)
    for k in kernels:
        d = 64 if "_d64" in k.name else 128
        consumers = 2 if k.name.endswith("_bm128") else 1 if k.name.endswith("_bm64") else CONSUMERS[d]
        assert k.resources.max_threads_per_block == 128 * (consumers + 1)
        assert not k.resources.spills and k.resources.local_bytes == 0, (k.name, k.resources)
        assert [p.name for p in k.params] == ["tq", "tk", "tv", "o", "n", "bh", "heads_per_section", "work_counter",
                                              "scale"]
    text = str(mod["fa3p_bf16_d128_causal"].instruction_summary)
    assert "HGMMA.64x128x16.F32" in text and "UTMALDG" in text and "HMMA.16816" not in text, text


def case(BH, N, d, dtype, seed):
    """Q, K, V [BH, N, d] as the kernel's element type (bf16 as uint16 bits), O poisoned, and their float32 values."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3)]
    if dtype == "bf16":
        arrays = [bf16_bits(a) for a in x]
        return arrays, [bf16_values(a) for a in arrays], np.full((BH, N, d), 0x7FC0, np.uint16)
    arrays = [a.astype(np.float16) for a in x]
    return arrays, [a.astype(np.float32) for a in arrays], np.full((BH, N, d), np.nan, np.float16)


def reference(vals, causal):
    q, k, v = (a.astype(np.float64) for a in vals)
    N, d = q.shape[1:]
    s = q @ k.transpose(0, 2, 1) * d ** -0.5
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def as_float(O):
    return bf16_values(O) if O.dtype == np.uint16 else O.astype(np.float32)


def run_persistent(arrays, O, d, dtype, causal, ctas, heads_per_section, counter=None, family="fa3p"):
    """The candidate (`family` fa3p, or fa3p_sched: the same with ping-pong scheduling) on `ctas` CTAs (at most one per
    work item): the static schedule, or the dynamic one drawing from `counter` (an int32 [1] array holding 0). Returns
    the number of work items."""
    BH, N = O.shape[:2]
    bm = 64 * CONSUMERS[d]
    maps = [TensorMap(a, 64, rows) for a, rows in zip(arrays, (bm, BLOCK_N, BLOCK_N))]
    items = -(-N // bm) * BH
    smem = 1024 + (2 * bm + 2 * STAGES_3B[d] * BLOCK_N) * d * 2 + 256        # alignment slack, 2 Q, K/V stages, barriers
    name = f"{family}_{'bf16' if dtype == 'bf16' else 'f16'}_d{d}{'_causal' if causal else ''}"
    emulate(SOURCE, name, (min(ctas, items),), (128 * (CONSUMERS[d] + 1),),
            maps + [O, N, BH, heads_per_section, counter, d ** -0.5], smem)
    return items


# (BH, N, d, dtype, causal, CTAs, heads per section, schedule): 2 or 3 CTAs walk 6-27 work items each
SHAPES = [
    # items of one key tile (< the 2 stages): the Q buffers' barriers
    pytest.param(5, 65, 128, "bf16", True, 3, 2, "static", marks=pytest.mark.slow),
    (3, 300, 64, "fp16", True, 2, 2, "dynamic"),    # 6 items of 1-3 tiles drawn from the counter; sections alternate
    pytest.param(3, 1031, 64, "bf16", True, 3, 2, "static", marks=pytest.mark.slow),   # 18 items of 1-9 key tiles
    pytest.param(4, 63, 64, "fp16", False, 3, 4, "dynamic", marks=pytest.mark.slow),
    pytest.param(3, 1000, 128, "fp16", False, 2, 2, "static", marks=pytest.mark.slow),  # 24 items, 8 tiles each
    pytest.param(2, 1, 64, "bf16", True, 3, 1, "dynamic", marks=pytest.mark.slow),      # one row
    pytest.param(3, 1031, 128, "bf16", True, 3, 3, "dynamic", marks=pytest.mark.slow),  # 27 items of 1-9 tiles
]


@needs_cxx
@pytest.mark.parametrize("BH,N,d,dtype,causal,ctas,heads_per_section,sched", SHAPES)
def test_persistent_attention_in_the_emulator(BH, N, d, dtype, causal, ctas, heads_per_section, sched):
    arrays, vals, O = case(BH, N, d, dtype, seed=N)
    counter = np.zeros(1, np.int32) if sched == "dynamic" else None
    items = run_persistent(arrays, O, d, dtype, causal, ctas, heads_per_section, counter)
    out = as_float(O)
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} elements never written (or NaN)"
    err = np.abs(out - reference(vals, causal)).max()
    # one rounding of P to 16 bits before P V and one of O: a few units in the last place of values below 1
    assert err < (2e-2 if dtype == "bf16" else 3e-3), f"max |err| {err:.3g} over {items} work items"
    if counter is not None:
        assert counter[0] == 0, f"the work counter was left at {counter[0]}: the next launch would skip items"


@needs_cxx
@pytest.mark.slow
def test_persistent_attention_writes_the_notebooks_bits():
    """The notebook's step 3 (one block per work item, launched as the notebook does) and the candidate on 3 CTAs give
    bit-identical O: the persistent loop changes the schedule, not one operation of the arithmetic."""
    from notebook_cells import cuda_cells

    cell = next(c for c in cuda_cells("07-fused-attention.py") if "fa3_bf16_d64" in c)
    BH, N, d, dtype = 3, 400, 128, "bf16"
    arrays, _, O_nb = case(BH, N, d, dtype, seed=7)
    O = O_nb.copy()
    bm = 64 * CONSUMERS[d]
    maps = [TensorMap(a, 64, rows) for a, rows in zip(arrays, (bm, BLOCK_N, BLOCK_N))]
    emulate(cell, "fa3_bf16_d128_causal", (-(-N // bm), BH), (128 * (CONSUMERS[d] + 1),), maps + [O_nb, N, d ** -0.5],
            1024 + (bm + 2 * STAGES * BLOCK_N) * d * 2 + 256)
    run_persistent(arrays, O, d, dtype, True, 3, 2)
    assert np.array_equal(O, O_nb), f"{(O != O_nb).sum()} of {O.size} elements differ"


# --- fa3p_sched: step 3b with ping-pong scheduling between the consumer warpgroups -----------------------------------

def sass_digest(kernel) -> str:
    """A kernel's SASS, its whitespace collapsed (the listing's column widths follow the module's longest line)."""
    import hashlib

    return hashlib.sha256(" ".join(kernel.sass.split()).encode()).hexdigest()[:16]


def test_sched_entries_take_turns_through_named_barriers_without_spills():
    """fa3p_sched_*: the launch's registers (168 / 128), setmaxnreg to 24 in the producer and 240 / 160 in the
    consumers, no spills, and the ring's named barriers 8, 9 (, 10) at 256 threads each, apart from __syncthreads' 0."""
    import re

    import kernellab

    mod = kernellab.compile_cuda(SOURCE, arch="sm_90a")
    kernels = [k for k in mod.kernels if k.name.startswith("fa3p_sched_")]
    assert sorted(k.name for k in kernels) == sorted(f"fa3p_sched_{dt}_d{d}{c}" for dt in ("bf16", "f16")
                                                     for d in (64, 128) for c in ("", "_causal"))
    for k in kernels:
        d = 64 if "_d64" in k.name else 128
        assert k.resources.max_threads_per_block == 128 * (CONSUMERS[d] + 1)
        assert k.resources.registers == {64: 128, 128: 168}[d], (k.name, k.resources)     # at launch
        assert not k.resources.spills and k.resources.local_bytes == 0, (k.name, k.resources)
        assert [p.name for p in k.params] == ["tq", "tk", "tv", "o", "n", "bh", "heads_per_section", "work_counter",
                                              "scale"]
        regs = re.findall(r"USETMAXREG\.(DEALLOC|TRY_ALLOC)\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", k.sass)
        assert sorted((w, int(v, 16)) for w, v in set(regs)) == [("DEALLOC", 24), ("TRY_ALLOC", {64: 160, 128: 240}[d])]
        assert 24 * 128 + CONSUMERS[d] * 128 * {64: 160, 128: 240}[d] <= 65536
        bars = re.findall(r"BAR\.(SYNC\.DEFER_BLOCKING|ARV) (\w+)(?:, (0x[0-9a-f]+))?", k.sass)
        assert ("SYNC.DEFER_BLOCKING", "0x0", "") in bars                     # __syncthreads
        counted = {(w, i, n) for w, i, n in bars if i != "0x0"}
        assert counted and all(n == "0x100" for _, _, n in counted), counted   # 256 threads: two warpgroups
        assert {"0x8"} <= {i for _, i, _ in counted}                          # the first warpgroup's barrier 8
        text = str(k.instruction_summary)
        assert "HGMMA.64x128x16.F32" in text and "UTMALDG" in text, text
    # no wgmma under a branch ptxas cannot prove warp-uniform: it would serialise them (C7520, "Potential Performance
    # Loss") or inject warpgroup.arrive (C7519)
    said = [line for line in str(mod.log).splitlines()
            if "fa3p_sched_" in line and ("C7520" in line or "C7519" in line)]
    assert not said, said


# Whitespace-collapsed SASS of step 3's and step 3b's entries as they were before fa3p_sched was added (NVRTC and ptxas
# of the pinned nvidia-cuda-nvrtc / ptxas wheels): the flag adds entries and leaves these instructions as they were.
OLD_SASS = {
    "fa3_bf16_d128": "261100b0213e87d0", "fa3_bf16_d128_causal": "436f5a3f27b94d29",
    "fa3_bf16_d64": "ef203067d6288aeb", "fa3_bf16_d64_causal": "0ea97abb10425323",
    "fa3p_bf16_d128": "d199d932cd582d7d", "fa3p_bf16_d128_causal": "4d13e2ec2ba6da1c",
    "fa3p_bf16_d64": "3af47df4d2790457", "fa3p_bf16_d64_bm128": "aa30fdb5c6059090",
    "fa3p_bf16_d64_bm64": "ab112e1037f3872d", "fa3p_bf16_d64_causal": "af2b998029f1a314",
    "fa3p_bf16_d64_causal_bm128": "0072e99338da4562", "fa3p_bf16_d64_causal_bm64": "ab033cb79cafc065",
    "fa3p_f16_d128": "c0b3c16f990f4740", "fa3p_f16_d128_causal": "a60dcd3dc3f407e4",
    "fa3p_f16_d64": "0bef1121fb99b081", "fa3p_f16_d64_causal": "c2ef491fabf77869",
}


def test_the_flag_leaves_the_old_entries_sass_unchanged():
    import kernellab

    mod = kernellab.compile_cuda(SOURCE, arch="sm_90a")
    got = {name: sass_digest(mod[name]) for name in OLD_SASS}
    if got["fa3_bf16_d64"] != OLD_SASS["fa3_bf16_d64"] and got["fa3p_bf16_d64"] != OLD_SASS["fa3p_bf16_d64"]:
        pytest.skip("another NVRTC / ptxas: the recorded digests are of the pinned wheels'")
    assert got == OLD_SASS, {n: (got[n], OLD_SASS[n]) for n in got if got[n] != OLD_SASS[n]}


# (BH, N, d, dtype, causal, CTAs, heads per section, schedule): the ring's turns across items of different lengths
# (causal), key tails, one-tile items, CTAs left without an item (more CTAs than items), both schedules
SCHED_SHAPES = [
    (3, 300, 128, "bf16", True, 2, 2, "dynamic"),      # 9 items of 1-3 tiles, N tail
    (3, 300, 64, "fp16", True, 2, 2, "static"),        # 3 consumers: a ring of three; 6 items of 1-3 tiles
    pytest.param(2, 65, 128, "fp16", False, 3, 1, "static", marks=pytest.mark.slow),   # one-tile items
    pytest.param(1, 100, 64, "bf16", True, 3, 1, "dynamic", marks=pytest.mark.slow),   # 1 item, 2 CTAs with none
    pytest.param(3, 1031, 128, "bf16", True, 3, 3, "dynamic", marks=pytest.mark.slow),  # 27 items of 1-9 tiles
    pytest.param(3, 1000, 64, "bf16", False, 2, 2, "static", marks=pytest.mark.slow),   # 18 items of 8 tiles
]


@needs_cxx
@pytest.mark.parametrize("BH,N,d,dtype,causal,ctas,heads_per_section,sched", SCHED_SHAPES)
def test_sched_attention_in_the_emulator(BH, N, d, dtype, causal, ctas, heads_per_section, sched):
    """fa3p_sched in the emulator: every named-barrier arrive met by its sync (the emulator fails a block that ends
    with arrivals pending, and a deadlock), O within the float64 tolerance, and the very bits fa3p writes (the
    turns reorder the warpgroups' products, not one operation of a warpgroup's arithmetic)."""
    arrays, vals, O = case(BH, N, d, dtype, seed=N + d)
    O_ref = O.copy()
    counter = np.zeros(1, np.int32) if sched == "dynamic" else None
    items = run_persistent(arrays, O, d, dtype, causal, ctas, heads_per_section, counter, family="fa3p_sched")
    out = as_float(O)
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} elements never written (or NaN)"
    err = np.abs(out - reference(vals, causal)).max()
    assert err < (2e-2 if dtype == "bf16" else 3e-3), f"max |err| {err:.3g} over {items} work items"
    if counter is not None:
        assert counter[0] == 0, f"the work counter was left at {counter[0]}"
    run_persistent(arrays, O_ref, d, dtype, causal, ctas, heads_per_section,
                   None if counter is None else np.zeros(1, np.int32))
    assert np.array_equal(O, O_ref), f"{(O != O_ref).sum()} of {O.size} elements differ from fa3p's"


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("cut, says", [
    ("        if (wg == 1) named_barrier_sync(FA3P_SCHED_BAR, 128 * 2);", "a bar.arrive nobody waits for"),
    ("        if (wg == NCWG) named_barrier_arrive(FA3P_SCHED_BAR, 128 * 2);", "deadlock"),
], ids=["no-last-sync", "no-first-arrive"])
def test_the_emulator_catches_a_broken_ring(cut, says):
    """Without warpgroup 0's last wait the last arrive is left pending at the block's end; without the first arrive
    warpgroup 0 waits for a turn nobody gives: the emulator fails both, so the passing runs above say the ring
    closes."""
    from kernellab.run.sim.cuda.emulate import EmulationError

    global SOURCE
    assert cut in SOURCE
    arrays, _, O = case(3, 300, 128, "bf16", seed=1)
    saved, SOURCE = SOURCE, SOURCE.replace(cut, "")
    try:
        with pytest.raises(EmulationError, match=says):
            run_persistent(arrays, O, 128, "bf16", True, 2, 2, family="fa3p_sched")
    finally:
        SOURCE = saved
