"""Tutorial 07's short-sequence variant of step 3b (the fa3p_*_bm64 entries of the notebook's step-3 cell: one consumer
warpgroup of 64 query rows, 64-key tiles, two CTAs an SM) without a GPU: it compiles for sm_90a to wgmma fed by TMA
with no spills and registers for two CTAs an SM, and in the CPU emulator (kernellab/run/sim/cuda) it matches attention
in float64 on awkward shapes, its CTAs walking many work items from the counter."""
import pathlib
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "gpu"))
from kernellab.run.sim.cuda.emulate import compiler  # noqa: E402
from kernellab.run.sim.cuda.emulate import TensorMap, emulate  # noqa: E402

from notebook_cells import cuda_cells  # noqa: E402
from test_attention_persistent import as_float, case, reference  # noqa: E402

SOURCE = next(c for c in cuda_cells("07-fused-attention.py") if "fa3p_bf16_d64" in c)     # the notebook's cell
BLOCK_M, BLOCK_N, STAGES = 64, 64, 3          # the cell's FA3P_BM64_BN / FA3P_BM64_ST64, one consumer warpgroup
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the emulation")


def smem_bytes(d=64):
    return 1024 + (2 * BLOCK_M + 2 * STAGES * BLOCK_N) * d * 2 + 256       # slack, 2 Q buffers, K/V stages, barriers


def test_the_variant_fits_two_ctas_an_sm_without_spills():
    import kernellab
    from kernellab.analysis import occupancy  # noqa: F401  (the arch tables the card reads)

    mod = kernellab.compile_cuda(SOURCE, arch="sm_90a")
    names = sorted(k.name for k in mod.kernels if k.name.endswith("_bm64"))
    assert names == sorted(f"fa3p_{dt}_d64{c}_bm64" for dt in ("bf16", "f16") for c in ("", "_causal"))
    for name in names:
        k = mod[name]
        assert k.resources.max_threads_per_block == 256, k.resources            # producer + one consumer warpgroup
        assert not k.resources.spills and k.resources.local_bytes == 0, (name, k.resources)
        # two CTAs an SM: 2 x 256 threads x registers within the SM's 64k, shared memory within its 228 KB
        assert 2 * 256 * k.resources.registers <= 65536, k.resources
        assert 2 * (smem_bytes() + 1024) <= 228 * 1024
        occ = k.occupancy(256, shared_bytes=smem_bytes())
        assert occ.blocks_per_sm >= 2, occ
    text = str(mod["fa3p_bf16_d64_causal_bm64"].instruction_summary)
    assert "HGMMA.64x64x16.F32.BF16" in text and "UTMALDG" in text and "HMMA.16816" not in text, text


def run_bm64(arrays, O, dtype, causal, ctas, heads_per_section, counter):
    BH, N, d = O.shape
    maps = [TensorMap(a, 64, rows) for a, rows in zip(arrays, (BLOCK_M, BLOCK_N, BLOCK_N))]
    items = -(-N // BLOCK_M) * BH
    name = f"fa3p_{'bf16' if dtype == 'bf16' else 'f16'}_d64{'_causal' if causal else ''}_bm64"
    emulate(SOURCE, name, (min(ctas, items),), (256,), maps + [O, N, BH, heads_per_section, counter, d ** -0.5],
            smem_bytes(d))
    return items


# (BH, N, dtype, causal, CTAs, heads per section, schedule): 2-4 CTAs walk 3-17 work items each
SHAPES = [
    (3, 130, "bf16", True, 2, 2, "dynamic"),      # 9 items of 1-3 key tiles; partial last tile; sections alternate
    pytest.param(2, 65, "fp16", False, 3, 1, "static", marks=pytest.mark.slow),    # one key past a tile
    pytest.param(2, 1, "bf16", True, 2, 1, "dynamic", marks=pytest.mark.slow),     # one row, one key
    pytest.param(1, 1031, "fp16", True, 4, 1, "dynamic", marks=pytest.mark.slow),  # 17 items of 1-17 tiles
    pytest.param(4, 63, "bf16", False, 3, 4, "static", marks=pytest.mark.slow),    # one short of a tile
]


@needs_cxx
@pytest.mark.parametrize("BH,N,dtype,causal,ctas,heads_per_section,sched", SHAPES)
def test_the_variant_in_the_emulator(BH, N, dtype, causal, ctas, heads_per_section, sched):
    arrays, vals, O = case(BH, N, 64, dtype, seed=N + 1)
    counter = np.zeros(1, np.int32) if sched == "dynamic" else None
    items = run_bm64(arrays, O, dtype, causal, ctas, heads_per_section, counter)
    out = as_float(O)
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} elements never written (or NaN)"
    err = np.abs(out - reference(vals, causal)).max()
    assert err < (2e-2 if dtype == "bf16" else 3e-3), f"max |err| {err:.3g} over {items} work items"
    if counter is not None:
        assert counter[0] == 0, f"the work counter was left at {counter[0]}: the next launch would skip items"
