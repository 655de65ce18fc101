"""The pipelined candidate of tutorial 07's step 3 (tools/gpu/attn_variants/fa3_pipe.cu, kernellab issue 12 item 3:
FA3's intra-warpgroup overlap of the softmax with the GEMMs) without a GPU: it compiles without spills, ptxas keeps
the softmax's exponentials between the two wgmma waits (the overlap survives scheduling), and in the CPU emulator
(tests/emu, which holds a wgmma's accumulators poisoned from issue to wait) it matches attention in float64 and writes
the very bits step 3b (the notebook's fa3p) writes, on awkward shapes with CTAs that walk many work items."""
import pathlib
import re
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from emu.emulate import compiler  # noqa: E402
from emu.ptx_emu import TensorMap, emulate  # noqa: E402
from test_attention_persistent import as_float, case, reference, run_persistent  # noqa: E402

SOURCE = (HERE.parent / "tools" / "gpu" / "attn_variants" / "fa3_pipe.cu").read_text()
BLOCK_N, STAGES = 128, 2
CONSUMERS = {64: 3, 128: 2}                   # the file's FA3Q_WG64 / FA3Q_WG128
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the emulation")


@pytest.mark.parametrize("options", [(), ("-DFA3Q_WG64=2", "-DFA3Q_WG64C=2")])
def test_the_pipelined_candidate_compiles_without_spills(options):
    import kernellab

    mod = kernellab.compile_cuda(SOURCE, arch="sm_90a", options=options)
    names = sorted(k.name for k in mod.kernels)
    assert names == sorted(f"fa3q_{dt}_d{d}{c}" for dt in ("bf16", "f16") for d in (64, 128) for c in ("", "_causal"))
    for k in mod.kernels:
        assert not k.resources.spills and k.resources.local_bytes == 0, (k.name, options, k.resources)


@pytest.mark.parametrize("name", ["fa3q_bf16_d64_causal", "fa3q_f16_d128"])
def test_the_softmax_sits_between_the_two_waits(name):
    """In the SASS of the tile loop, the exponentials come after the wait that leaves one group in flight
    (WARPGROUP.DEPBAR.LE gsb0, 0x1) and before the wait for it (0x0): ptxas did not hoist the second wait."""
    import kernellab

    sass = kernellab.compile_cuda(SOURCE, arch="sm_90a")[name].sass
    ops = [m.group(1) for m in re.finditer(r"(WARPGROUP\.DEPBAR\.LE gsb0, 0x[01]|MUFU\.EX2|HGMMA)", sass)]
    i = ops.index("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    j = ops.index("WARPGROUP.DEPBAR.LE gsb0, 0x0", i)
    assert ops[i + 1:j].count("MUFU.EX2") >= BLOCK_N // 2, ops[i:j + 1]


def run_pipe(arrays, O, d, dtype, causal, ctas, heads_per_section, counter=None):
    """The pipelined candidate, launched as test_attention_persistent launches step 3b."""
    BH, N = O.shape[:2]
    bm = 64 * CONSUMERS[d]
    maps = [TensorMap(a, 64, rows) for a, rows in zip(arrays, (bm, BLOCK_N, BLOCK_N))]
    items = -(-N // bm) * BH
    smem = 1024 + (2 * bm + 2 * STAGES * BLOCK_N) * d * 2 + 256        # alignment slack, 2 Q, K/V stages, barriers
    name = f"fa3q_{'bf16' if dtype == 'bf16' else 'f16'}_d{d}{'_causal' if causal else ''}"
    emulate(SOURCE, name, (min(ctas, items),), (128 * (CONSUMERS[d] + 1),),
            maps + [O, N, BH, heads_per_section, counter, d ** -0.5], smem)
    return items


# (BH, N, d, dtype, causal, CTAs, heads per section, schedule)
SHAPES = [
    (5, 65, 128, "bf16", True, 3, 2, "static"),     # items of one key tile: no pipelined iteration at all
    (3, 300, 64, "fp16", True, 2, 2, "dynamic"),    # 1-3 tiles per item, the diagonal tile masked, counter draws
    (2, 390, 128, "fp16", False, 2, 1, "static"),   # 4 tiles per item (the last partial): the K/V phases wrap
    pytest.param(3, 1031, 64, "bf16", True, 3, 2, "static", marks=pytest.mark.slow),
    pytest.param(4, 63, 64, "fp16", False, 3, 4, "dynamic", marks=pytest.mark.slow),
    pytest.param(2, 1, 64, "bf16", True, 3, 1, "dynamic", marks=pytest.mark.slow),      # one row
    pytest.param(3, 1031, 128, "bf16", True, 3, 3, "dynamic", marks=pytest.mark.slow),
]


@needs_cxx
@pytest.mark.parametrize("BH,N,d,dtype,causal,ctas,heads_per_section,sched", SHAPES)
def test_pipelined_attention_in_the_emulator(BH, N, d, dtype, causal, ctas, heads_per_section, sched):
    arrays, vals, O = case(BH, N, d, dtype, seed=N)
    counter = np.zeros(1, np.int32) if sched == "dynamic" else None
    items = run_pipe(arrays, O, d, dtype, causal, ctas, heads_per_section, counter)
    out = as_float(O)
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} elements never written (or NaN)"
    err = np.abs(out - reference(vals, causal)).max()
    assert err < (2e-2 if dtype == "bf16" else 3e-3), f"max |err| {err:.3g} over {items} work items"
    if counter is not None:
        assert counter[0] == 0, f"the work counter was left at {counter[0]}: the next launch would skip items"
    # the overlap reorders when things are computed, not what: the persistent kernel's very bits
    O_p = np.full_like(O, 0x7FC0 if O.dtype == np.uint16 else np.nan)
    run_persistent(arrays, O_p, d, dtype, causal, ctas, heads_per_section,
                   np.zeros(1, np.int32) if counter is not None else None)
    assert np.array_equal(O.view(np.uint16), O_p.view(np.uint16)), f"{(O != O_p).sum()} of {O.size} elements differ"
