"""The occupancy calculator (no GPU): worked examples from NVIDIA's documents, each limiter, bad input, the sweep,
the report formats, the plots and the explorer widget; a cross-check against cuda_occupancy.h compiled on the host;
and the golden table of driver answers recorded on an H100/H200 (tests/golden/occupancy_sm90.csv)."""
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from kernellab.analysis.arch import ARCHS, UnknownArchError, device_mismatches, get_arch
from kernellab.analysis.occupancy import (
    LIMITERS, REPORT_MIME, UNLIMITED, Occupancy, OccupancyInputError, best_block_sizes, occupancy, occupancy_sweep,
)

GOLDEN = Path(__file__).parent / "golden"
KIB = 1024


# ---------------------------------------------------------------- architecture tables

@pytest.mark.parametrize("arch", ["sm_90", "90", 90, (9, 0), "sm_90a", "compute_90", "9.0", " SM_90 "])
def test_get_arch_accepts_the_usual_spellings(arch):
    assert get_arch(arch) is ARCHS["sm_90"]


def test_get_arch_accepts_every_table_and_an_archspec():
    for name, spec in ARCHS.items():
        assert get_arch(name) is spec
        assert get_arch(spec) is spec
        assert get_arch(spec.compute_capability) is spec
    assert get_arch("sm_100a").name == "sm_100"
    assert get_arch("sm_120f").name == "sm_120"


@pytest.mark.parametrize("arch, name, base, cc", [
    ("sm_90", "sm_90", "sm_90", (9, 0)), (90, "sm_90", "sm_90", (9, 0)), ((9, 0), "sm_90", "sm_90", (9, 0)),
    (" SM_90A ", "sm_90a", "sm_90", (9, 0)), ("compute_80", "sm_80", "sm_80", (8, 0)), ("12.0", "sm_120", "sm_120", (12, 0)),
    ("sm_120f", "sm_120f", "sm_120", (12, 0)), ("89", "sm_89", "sm_89", (8, 9)), ("sm100a", "sm_100a", "sm_100", (10, 0))])
def test_the_one_arch_parser(arch, name, base, cc):
    """analysis.arch.normalize_arch is the only parser of arch names; base_arch drops the a/f suffix."""
    from kernellab.analysis.arch import base_arch, compute_capability, normalize_arch

    assert (normalize_arch(arch), base_arch(arch), compute_capability(arch)) == (name, base, cc)


@pytest.mark.parametrize("bad", ["hopper", "sm_9", 9.0, True, None, (9,), "sm_90b"])
def test_the_arch_parser_refuses_what_is_not_an_arch(bad):
    from kernellab.analysis.arch import normalize_arch

    with pytest.raises(ValueError, match="not an architecture name"):
        normalize_arch(bad)


def test_one_default_arch_and_no_other_arch_parser():
    """The default arch is analysis.arch.DEFAULT_ARCH everywhere, and no module outside analysis/arch.py strips the
    a/f suffix or spells a default "sm_90" of its own (compile errors and cubin notes are read, not parsed as input)."""
    import re

    import kernellab
    from kernellab.analysis.arch import DEFAULT_ARCH
    from kernellab.compile import nvrtc, numba_backend
    from kernellab.run.launch import device, job

    assert nvrtc.DEFAULT_ARCH is numba_backend.DEFAULT_ARCH is DEFAULT_ARCH == "sm_90"
    assert job.KernelJob.__dataclass_fields__["arch"].default is DEFAULT_ARCH
    assert device.current_arch.__defaults__ == (DEFAULT_ARCH,)
    pkg = Path(kernellab.__file__).parent
    bad = []
    for path in pkg.rglob("*.py"):
        if path.name == "arch.py" and path.parent.name == "analysis" or path.parent.name == "teach" and \
                path.name.startswith("ex"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\[af\]\$|rstrip\(\"af\"\)|=\s*\"sm_90\"|def normalize_arch|def cc_of", code):
                bad.append(f"{path.relative_to(pkg)}:{n}: {line.strip()}")
    assert bad == []


@pytest.mark.parametrize("bad", ["sm_61", "sm_91", 35, (6, 1), "hopper", None, 9.0, True])
def test_unknown_arch_names_the_known_ones(bad):
    with pytest.raises(UnknownArchError) as info:
        get_arch(bad)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    for name in ARCHS:
        assert name in msg


def test_arch_tables_are_consistent():
    for spec in ARCHS.values():
        assert spec.max_warps_per_sm * spec.warp_size == spec.max_threads_per_sm
        assert spec.registers_per_sm == 65536 and spec.register_allocation_unit == 256
        assert spec.register_allocation_granularity == "warp" and spec.max_registers_per_thread == 255
        assert spec.shared_memory_configs_kib == tuple(sorted(spec.shared_memory_configs_kib))
        assert spec.shared_memory_configs_kib[-1] * KIB == spec.shared_memory_per_sm_bytes
        # From Ampere on, the opt-in per-block limit is the SM's capacity less the 1 KiB reservation.
        if spec.compute_capability >= (8, 0):
            assert spec.reserved_shared_memory_per_block_bytes == KIB
            assert spec.shared_memory_per_block_optin_bytes == spec.shared_memory_per_sm_bytes - KIB
            assert spec.shared_memory_allocation_unit_bytes == 128
        else:
            assert spec.reserved_shared_memory_per_block_bytes == 0
            assert spec.shared_memory_allocation_unit_bytes == 256
        assert spec.source
        json.dumps(spec.to_json())


def test_arch_tables_match_the_programming_guide():
    """CUDA C++ Programming Guide, Technical Specifications per Compute Capability (warps, blocks, smem per SM)."""
    expected = {  # name: (max warps/SM, max blocks/SM, smem/SM KiB, opt-in smem/block KiB)
        "sm_70": (64, 32, 96, 96), "sm_75": (32, 16, 64, 64), "sm_80": (64, 32, 164, 163),
        "sm_86": (48, 16, 100, 99), "sm_87": (48, 16, 164, 163), "sm_89": (48, 24, 100, 99),
        "sm_90": (64, 32, 228, 227), "sm_100": (64, 32, 228, 227), "sm_120": (48, 24, 100, 99),
    }
    assert set(expected) == set(ARCHS)
    for name, (warps, blocks, smem_kib, optin_kib) in expected.items():
        s = ARCHS[name]
        assert (s.max_warps_per_sm, s.max_blocks_per_sm, s.shared_memory_per_sm_bytes // KIB,
                s.shared_memory_per_block_optin_bytes // KIB) == (warps, blocks, smem_kib, optin_kib), name


# ---------------------------------------------------------------- worked examples

def test_best_practices_guide_volta_example():
    """CUDA C++ Best Practices Guide, "Calculating Occupancy": compute capability 7.0, 37 registers per thread:
    128-thread blocks give 12 blocks and 75%; 320-thread blocks only 4 blocks and 63%."""
    a = occupancy(128, 37, 0, "sm_70")
    assert (a.blocks_per_sm, a.warps_per_sm, a.ratio, a.limiter) == (12, 48, 0.75, "registers")
    b = occupancy(320, 37, 0, "sm_70")
    assert (b.blocks_per_sm, b.warps_per_sm, b.ratio) == (4, 40, 0.625)  # 62.5%, "63%" in the guide
    assert b.limiter == "registers"
    # "register allocations are rounded up to the nearest 256 registers per warp": 37 x 32 = 1184 -> 1280.
    assert a.registers_per_warp == 1280


def test_registers_come_per_warp_and_per_sub_partition():
    """cuda_occupancy.h: regs/warp rounded up to 256; warps/SM = (65536 / 4 // regs/warp) x 4.
    40 regs: 1280/warp, 12 warps per sub-partition, 48 warps/SM (not 65536 // 1280 = 51)."""
    o = occupancy(256, 40, 0, "sm_90")
    assert (o.blocks_per_sm, o.limiter, o.blocks_limit_registers) == (6, "registers", 6)
    assert "1280 regs/warp" in str(o) and "6 blocks" in str(o)
    # 3-warp blocks: 48 // 3 = 16, where a whole-SM count would give 51 // 3 = 17.
    assert occupancy(96, 40, 0, "sm_90").blocks_limit_registers == 16
    assert occupancy(64, 48, 0, "sm_90").blocks_limit_registers == 20  # 40 warps // 2, not 42 // 2


def test_a_block_that_cannot_hold_its_registers_gives_zero_blocks():
    """cuOccupancyMaxActiveBlocksPerMultiprocessor answers 0 when regs/warp x warps (rounded to 4) > 64K."""
    o = occupancy(1024, 65, 0, "sm_90")  # 65 x 32 = 2080 -> 2304 regs/warp x 32 warps = 73728 > 65536
    assert o.blocks_per_sm == 0 and o.warps_per_sm == 0 and o.ratio == 0.0
    assert o.limiter == "registers" and o.blocks_limit_registers == 0
    assert "cannot launch" in str(o) and "73728" in str(o)
    assert occupancy(1024, 64, 0, "sm_90").blocks_per_sm == 1  # 2048 x 32 = 65536 fits exactly
    assert occupancy(1024, 255, 0, "sm_90").blocks_per_sm == 0
    assert occupancy(256, 255, 0, "sm_90").blocks_per_sm == 1  # 255 regs: 8192/warp, 8 warps/SM
    assert occupancy(288, 255, 0, "sm_90").blocks_per_sm == 0  # 9 warps count as 12
    assert occupancy(64, 0, 0, "sm_90").blocks_limit_registers == UNLIMITED


def test_the_one_kib_reservation_from_ampere_on():
    """NVIDIA Ampere tuning guide: A100 has up to 164 KB shared memory per SM, 163 KB per block, and CUDA reserves
    1 KB per block. Two 82 KiB blocks would fill 164 KiB exactly, but with the reservation only one fits."""
    assert occupancy(128, 32, 163 * KIB, "sm_80").blocks_per_sm == 1
    assert occupancy(128, 32, 81 * KIB, "sm_80").blocks_per_sm == 2
    o = occupancy(128, 32, 82 * KIB, "sm_80")
    assert (o.blocks_per_sm, o.limiter, o.shared_bytes_per_block) == (1, "shared_memory", 83 * KIB)
    # Hopper tuning guide: 228 KB per SM, 227 KB per block.
    assert occupancy(128, 32, 227 * KIB, "sm_90").blocks_per_sm == 1
    assert occupancy(128, 32, 113 * KIB, "sm_90").blocks_per_sm == 2
    assert occupancy(128, 32, 114 * KIB - 1, "sm_90").blocks_per_sm == 1
    # 48 KiB blocks: 49152 + 1024 = 50176 B each, 233472 // 50176 = 4 on sm_90.
    assert occupancy(128, 32, 48 * KIB, "sm_90").blocks_per_sm == 4
    # No reservation on Volta/Turing; allocation in 256-byte units there, 128 from Ampere on.
    assert occupancy(32, 16, 1, "sm_70").shared_bytes_per_block == 256
    assert occupancy(32, 16, 1, "sm_80").shared_bytes_per_block == 1152
    assert occupancy(32, 16, 0, "sm_75").shared_bytes_per_block == 0
    assert occupancy(32, 16, 0, "sm_75").blocks_limit_shared == UNLIMITED


def test_each_limiter():
    warps = occupancy(1024, 16, 0, "sm_90")         # 64 // 32 = 2; registers allow 4
    regs = occupancy(256, 64, 0, "sm_90")           # 2048/warp: 32 warps/SM // 8 = 4; warps allow 8
    smem = occupancy(128, 32, 40 * KIB, "sm_90")    # 41 KiB/block: 228 // 41 = 5; warps allow 16
    blocks = occupancy(32, 16, 0, "sm_90")          # 32 resident blocks; warps allow 64
    assert (warps.limiter, warps.blocks_per_sm, warps.ratio) == ("warps", 2, 1.0)
    assert (regs.limiter, regs.blocks_per_sm, regs.ratio) == ("registers", 4, 0.5)
    assert (smem.limiter, smem.blocks_per_sm) == ("shared_memory", 5)
    assert (blocks.limiter, blocks.blocks_per_sm, blocks.ratio) == ("blocks", 32, 0.5)
    for o in (warps, regs, smem, blocks):
        assert o.limiters == (o.limiter,)
        assert o.blocks_per_sm == min(o.limits().values())
        assert f"{o.limiter.replace('_', ' ')}" in o.title
    tie = occupancy(1024, 32, 0, "sm_90")  # warps and registers both allow 2
    assert tie.limiters == ("warps", "registers") and tie.limiter == "warps"


@pytest.mark.parametrize("arch, block, regs, smem, blocks", [
    ("sm_75", 1024, 64, 0, 1),      # Turing: 32 warps/SM; 2048 regs/warp x 32 warps = 64K
    ("sm_75", 1024, 65, 0, 0),      # 2304 regs/warp no longer fit a 32-warp block
    ("sm_75", 64, 16, 0, 16),       # 16 resident blocks
    ("sm_75", 256, 32, 20 * KIB, 3),  # 64 KiB // 20 KiB (no reservation)
    ("sm_86", 1024, 32, 0, 1),      # 48 warps: one 32-warp block, 66.7%
    ("sm_86", 64, 16, 0, 16),
    ("sm_87", 64, 16, 100 * KIB, 1),  # 164 KiB SM: 101 KiB blocks, one fits
    ("sm_89", 64, 16, 0, 24),       # Ada: 24 resident blocks x 2 warps = 48 warps, 100%
    ("sm_100", 128, 128, 0, 4),     # 4096 regs/warp: 4 warps per sub-partition, 16 warps/SM // 4
    ("sm_120", 128, 32, 0, 12),     # 48 warps // 4
    ("sm_120", 32, 8, 0, 24),
])
def test_hand_worked_cases(arch, block, regs, smem, blocks):
    assert occupancy(block, regs, smem, arch).blocks_per_sm == blocks


def test_partial_warps_round_up():
    o = occupancy(33, 16, 0, "sm_90")
    assert o.warps_per_block == 2 and o.blocks_limit_warps == 32
    assert occupancy(1, 16, 0, "sm_90").warps_per_block == 1


def test_carveout():
    """cuda_occupancy.h: the default carveout is the SM's largest configuration; a percentage asks for that share,
    rounded up to a configuration the SM has, and one block that needs more raises it."""
    default = occupancy(128, 32, 16 * KIB, "sm_90")
    half = occupancy(128, 32, 16 * KIB, "sm_90", carveout=50)  # 114 KiB -> the 132 KiB configuration
    assert default.smem_config_bytes == 228 * KIB and default.blocks_per_sm == 13  # 233472 // 17408
    assert half.smem_config_bytes == 132 * KIB and half.blocks_per_sm == 7      # 135168 // 17408
    assert occupancy(128, 32, 16 * KIB, "sm_90", carveout=100).smem_config_bytes == 228 * KIB
    # Asking for 0 still leaves room for one block: the smallest configuration holding it.
    zero = occupancy(128, 32, 40_000, "sm_80", carveout=0)
    assert zero.smem_config_bytes == 64 * KIB and zero.blocks_per_sm == 1
    assert "raised from 0 KiB" in str(zero)
    # Even without shared memory, Ampere+ blocks hold the 1 KiB reservation: carveout 0 -> 8 KiB -> 8 blocks.
    assert occupancy(32, 16, 0, "sm_90", carveout=0).blocks_per_sm == 8
    # Turing's smallest configuration is 32 KiB; Volta has a 0 KiB one.
    assert occupancy(32, 16, 0, "sm_75", carveout=0).smem_config_bytes == 32 * KIB
    assert occupancy(32, 16, 0, "sm_70", carveout=0).smem_config_bytes == 0


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=0, registers=32), ["block_size=0", "1..1024"]),
    (dict(block_size=1025, registers=32), ["block_size=1025", "1..1024"]),
    (dict(block_size=128, registers=-1), ["registers=-1", "0..255"]),
    (dict(block_size=128, registers=256), ["registers=256", "0..255"]),
    (dict(block_size=128, registers=32, shared_bytes=227 * KIB + 1), ["232449", "232448", "opt-in"]),
    (dict(block_size=128, registers=32, shared_bytes=-4), ["shared_bytes=-4"]),
    (dict(block_size=128, registers=32, carveout=101), ["carveout=101", "0..100"]),
    (dict(block_size=128, registers=32, carveout=0.5), ["carveout=0.5"]),
    (dict(block_size=128.0, registers=32), ["block_size=128.0", "not an integer"]),
    (dict(block_size="128", registers=32), ["block_size='128'"]),
])
def test_bad_input_names_the_limit(kwargs, words):
    with pytest.raises(OccupancyInputError) as info:
        occupancy(**kwargs)
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value)


def test_bad_input_per_arch_limits():
    with pytest.raises(OccupancyInputError, match="101376"):
        occupancy(128, 32, 99 * KIB + 1, "sm_86")
    occupancy(128, 32, 99 * KIB, "sm_86")
    with pytest.raises(OccupancyInputError, match="65536"):
        occupancy(128, 32, 64 * KIB + 1, "sm_75")
    with pytest.raises(UnknownArchError, match="sm_90"):
        occupancy(128, 32, 0, "sm_52")


def test_numpy_integers_are_accepted():
    o = occupancy(np.int32(256), np.int64(40), np.uint16(0), "sm_90")
    assert o.blocks_per_sm == 6 and type(o.block_size) is int


# ---------------------------------------------------------------- sweep and best block sizes

def _random_configs(n, seed=1234):
    rng = random.Random(seed)
    for _ in range(n):
        spec = rng.choice(list(ARCHS.values()))
        yield (spec.name, rng.randint(1, spec.max_threads_per_block), rng.randint(0, spec.max_registers_per_thread),
               rng.choice([0, rng.randint(0, spec.shared_memory_per_block_optin_bytes), rng.randint(0, 48 * KIB)]),
               rng.choice([None, None, 0, 25, 50, 66, 100]))


def test_sweep_agrees_with_single_calls():
    fields = ["blocks_per_sm", "warps_per_sm", "ratio", "blocks_limit_warps", "blocks_limit_registers",
              "blocks_limit_shared", "blocks_limit_blocks", "smem_config_bytes"]
    for arch in ARCHS:
        for regs, smem, carveout in [(0, 0, None), (40, 0, None), (96, 20_000, None), (255, 7, 50), (33, 1, 0)]:
            sweep = occupancy_sweep(None, regs, smem, arch, carveout=carveout)
            assert len(sweep) == get_arch(arch).max_threads_per_block
            for i, b in enumerate(sweep.block_size):
                o = occupancy(int(b), regs, smem, arch, carveout=carveout)
                assert [getattr(o, f) for f in fields] == [getattr(sweep, f)[i] for f in fields], (arch, b)
                assert o.limiter == sweep.limiter[i]
    configs = list(_random_configs(3000))
    for arch in ARCHS:
        for carveout in (None, 0, 25, 50, 66, 100):
            rows = [c for c in configs if c[0] == arch and c[4] == carveout]
            if not rows:
                continue
            b, r, s = (np.array([c[k] for c in rows]) for k in (1, 2, 3))
            sweep = occupancy_sweep(b, r, s, arch, carveout=carveout)
            single = [occupancy(*c[1:4], arch, carveout=carveout) for c in rows]
            assert sweep.blocks_per_sm.tolist() == [o.blocks_per_sm for o in single]
            assert sweep.limiter.tolist() == [o.limiter for o in single]
            assert sweep.smem_config_bytes.tolist() == [o.smem_config_bytes for o in single]


def test_sweep_broadcasts_and_validates():
    grid = occupancy_sweep(np.arange(32, 1025, 32)[:, None], np.arange(0, 256)[None, :], 0, "sm_90")
    assert grid.blocks_per_sm.shape == (32, 256)
    assert grid.blocks_per_sm[7, 40] == 6  # 256 threads, 40 regs
    with pytest.raises(OccupancyInputError, match="block_size=1025"):
        occupancy_sweep(range(1, 1026), 32, 0, "sm_90")
    with pytest.raises(OccupancyInputError, match="registers=300"):
        occupancy_sweep([128, 128], [32, 300], 0, "sm_90")
    with pytest.raises(OccupancyInputError, match="integers"):
        occupancy_sweep([128.5], 32, 0)
    assert "1024 configurations" in str(occupancy_sweep(None, 32, 0))


def test_sweep_and_single_call_run_fast_enough():
    """No timing asserts: this only shows that a whole 1..1024 sweep and many single calls run (a few ms in all)."""
    for _ in range(50):
        occupancy_sweep(range(1, 1025), 40, 4096, "sm_90")
    for b in range(1, 1025):
        occupancy(b, 40, 4096, "sm_90")


def test_best_block_sizes():
    best = best_block_sizes(40, 0, "sm_90", top=4)
    assert all(b % 32 == 0 for b in best) and len(best) == 4
    occs = [occupancy(b, 40, 0, "sm_90").ratio for b in best]
    assert occs == sorted(occs, reverse=True)
    assert occs[0] == max(occupancy(b, 40, 0, "sm_90").ratio for b in range(32, 1025, 32))
    # 40 regs: 48 warps/SM at best; 768 threads = 24 warps x 2; the larger block ranks first among equals.
    assert best[0] == 768
    # Shared memory as a function of the block size (e.g. one float per thread, 8 KiB extra).
    best = best_block_sizes(32, lambda n: 4 * n + 8 * KIB, "sm_80", top=3)
    assert len(best) == 3
    # Blocks that cannot launch are never suggested.
    assert all(occupancy(b, 255, 0, "sm_90").blocks_per_sm > 0 for b in best_block_sizes(255, 0, "sm_90", top=32))
    # 255 regs: 8 warps/SM. 1, 2, 4 or 8-warp blocks fill them; then 7 (224), 6 (192 and 96 as 2 x 3), 5 (160).
    assert best_block_sizes(255, 0, "sm_90", top=32) == [256, 128, 64, 32, 224, 192, 96, 160]


# ---------------------------------------------------------------- report formats

def test_report_formats():
    o = occupancy(256, 40, 4096, "sm_90")
    assert isinstance(o, Occupancy)
    with pytest.raises(Exception):
        o.blocks_per_sm = 3  # frozen
    text = str(o)
    assert "registers" in text and "<- limit" in text and "1280 regs/warp" in text and "75.0%" in text
    page = o._repr_html_()
    assert page.startswith("<div") and "registers" in page and "75.0%" in page
    j = o.to_json()
    assert j["kind"] == "occupancy" and j["version"] == 1 and j["title"] == o.title
    assert j["blocks_per_sm"] == 6 and j["limiter"] == "registers" and j["arch"] == "sm_90"
    assert set(j["limits"]) == set(LIMITERS) and set(j["reasons"]) == set(LIMITERS)
    assert json.loads(json.dumps(j)) == j
    assert occupancy(64, 0, 0, "sm_70").to_json()["limits"]["registers"] is None  # unlimited -> null
    bundle = o._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", REPORT_MIME}
    assert bundle[REPORT_MIME] == j and bundle["text/plain"] == text
    assert set(o._repr_mimebundle_(include={REPORT_MIME})) == {REPORT_MIME}
    assert set(o._repr_mimebundle_(exclude={"text/html"})) == {"text/plain", REPORT_MIME}


def test_analysis_layer_imports_no_plotting_or_widgets():
    code = ("import sys, kernellab.analysis.occupancy, kernellab.analysis.arch; "
            "bad = [m for m in ('matplotlib', 'ipywidgets', 'IPython', 'torch', 'cupy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


# ---------------------------------------------------------------- plots and widget

def _current_point(ax):
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == "current"]
    return float(line.get_xdata()[0]), float(line.get_ydata()[0])


def test_plots_mark_the_kernel():
    from matplotlib.figure import Figure

    from kernellab.notebook.occupancy_plots import (
        plot_occupancy, plot_occupancy_vs_block_size, plot_occupancy_vs_registers, plot_occupancy_vs_shared_memory,
    )
    o = occupancy(256, 40, 20_000, "sm_90")
    fig = plot_occupancy_vs_block_size(256, 40, 20_000, "sm_90")
    assert isinstance(fig, Figure) and _current_point(fig.axes[0]) == (256, 75.0)
    assert _current_point(plot_occupancy_vs_registers(o).axes[0]) == (40, 75.0)
    assert _current_point(plot_occupancy_vs_shared_memory(o).axes[0]) == pytest.approx((20_000 / KIB, 75.0))
    fig = plot_occupancy(256, 40, 20_000, "sm_90")
    main_axes = [ax for ax in fig.axes if any(ln.get_gid() == "current" for ln in ax.get_lines())]
    assert len(main_axes) == 3
    assert [_current_point(ax) for ax in main_axes][:2] == [(256, 75.0), (40, 75.0)]
    # The curves are the sweep: at 40 registers the block-size curve reaches 75% and the register curve 100%.
    curves = [[ln for ln in ax.get_lines() if ln.get_gid() == "curve"][0] for ax in main_axes]
    assert max(curves[0].get_ydata()) == 75.0 and max(curves[1].get_ydata()) == 100.0
    # Drawing into existing Axes returns their Figure.
    fig2 = Figure()
    ax = fig2.add_subplot()
    assert plot_occupancy_vs_registers(128, 32, 0, "sm_80", ax=ax) is fig2
    fig.savefig(__import__("io").BytesIO(), format="png")


@pytest.mark.slow
def test_explorer_builds_and_reacts_to_sliders():
    from kernellab.notebook.occupancy_widget import OccupancyExplorer, occupancy_explorer
    ex = occupancy_explorer(256, 40, 0, "sm_90")
    assert isinstance(ex, OccupancyExplorer)
    ex._debounce_s = 0     # draw at once: another test may have left an event loop running in this thread
    assert ex.result.blocks_per_sm == 6 and "registers" in ex.summary.value
    first_png = bytes(ex.image.value)
    assert first_png[:4] == b"\x89PNG"
    ex.registers_slider.value = 64
    assert ex.result.registers == 64 and ex.result.blocks_per_sm == 4
    assert bytes(ex.image.value) != first_png
    ex.shared_slider.value = 100 * KIB
    assert ex.result.limiter == "shared_memory" and "shared memory" in ex.summary.value
    ex.block_size_slider.value = 1024
    assert ex.result.block_size == 1024
    ex.carveout_dropdown.value = 50
    assert ex.result.carveout == 50
    ex.carveout_dropdown.value = "default"
    assert ex.result.carveout is None
    # A smaller architecture clamps the sliders to its limits.
    ex.arch_dropdown.value = "sm_86"
    assert ex.result.arch == "sm_86" and ex.shared_slider.max == 99 * KIB
    assert ex.result.shared_bytes <= 99 * KIB


def test_explorer_carveout_shows_its_default_and_blocks_move_by_warps():
    """ipywidgets draws a Dropdown whose value is None as blank: the default carveout is a labelled option."""
    from kernellab.notebook.occupancy_widget import occupancy_explorer
    ex = occupancy_explorer(256, 40, 0, "sm_90")
    dropdown = ex.carveout_dropdown
    assert dropdown.value is not None and dropdown.index == 0 and dropdown.label.startswith("default")
    assert ex.carveout is None and ex.result.carveout is None
    assert (ex.block_size_slider.min, ex.block_size_slider.step, ex.block_size_slider.max) == (32, 32, 1024)
    assert occupancy_explorer(256, 40, 0, "sm_90", carveout=25).carveout_dropdown.label == "25%"


def test_explorer_from_a_kernel_respects_its_launch_bounds(tmp_cache):
    import kernellab
    from kernellab.notebook.occupancy_widget import occupancy_explorer
    k = kernellab.compile_cuda("__global__ void __launch_bounds__(128) k(float* x) { x[threadIdx.x] = 1; }",
                               arch="sm_90").k
    ex = occupancy_explorer(k)
    assert ex.block_size_slider.max == 128 and ex.result.block_size == 128
    ex.arch_dropdown.value = "sm_80"
    assert ex.block_size_slider.max == 128


def test_explorer_takes_a_kernel():
    from kernellab.notebook.occupancy_widget import occupancy_explorer
    kernel = types.SimpleNamespace(resources=types.SimpleNamespace(registers=72, shared_bytes=4224, arch="sm_90a"))
    ex = occupancy_explorer(kernel)
    assert (ex.result.block_size, ex.result.registers, ex.result.shared_bytes, ex.result.arch) == \
        (256, 72, 4224, "sm_90")


@pytest.mark.slow
def test_explorer_shows_the_shared_memory_the_kernels_card_shows(tmp_cache):
    """1032 B declared (a float[258] tile): the slider's grid holds 1032 (a slider snaps its value to min + k * step,
    which showed 1024 with 128 B steps); the reasons say what the block is allocated (rounded up, plus the
    reservation)."""
    import kernellab
    from kernellab.notebook.occupancy_widget import occupancy_explorer
    k = kernellab.compile_cuda("__global__ void k(float* x) { __shared__ float t[258]; t[threadIdx.x] = x[0]; "
                               "__syncthreads(); x[threadIdx.x] = t[257 - threadIdx.x]; }", arch="sm_90").k
    assert k.resources.shared_bytes == 1032 == k.to_json()["shared_bytes"]
    ex = occupancy_explorer(k)
    slider = ex.shared_slider
    assert slider.value == 1032 and (slider.value - slider.min) % slider.step == 0 and slider.step == 8
    assert "1032 B + 1024 B reserved -> 2176 B/block" in ex.result.reasons()["shared_memory"]
    assert "declared" in slider.description
    ex.arch_dropdown.value = "sm_80"
    assert (slider.value - slider.min) % slider.step == 0
    assert occupancy_explorer(256, 32, 0).shared_slider.step == 128


# ---------------------------------------------------------------- cross-check: cuda_occupancy.h on the host

_ORACLE = r"""
// Reads "major minor maxThreadsPerSM maxBlocks regsPerSM smemPerSM smemPerBlock optin reserved
//        block regs static dynamic carveout" per line and prints what cuda_occupancy.h computes.
#include <cstdio>
#include "cuda_occupancy.h"
int main() {
  int major, minor, threadsSM, maxBlocks, regsSM, block, regs, carveout;
  long smemSM, smemBlock, optin, reserved, stat, dyn;
  while (scanf("%d %d %d %d %d %ld %ld %ld %ld %d %d %ld %ld %d", &major, &minor, &threadsSM, &maxBlocks, &regsSM,
               &smemSM, &smemBlock, &optin, &reserved, &block, &regs, &stat, &dyn, &carveout) == 14) {
    cudaOccDeviceProp p;
    p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerBlock = 1024;
    p.maxThreadsPerMultiprocessor = threadsSM; p.regsPerBlock = 65536; p.regsPerMultiprocessor = regsSM;
    p.warpSize = 32; p.sharedMemPerBlock = smemBlock; p.sharedMemPerMultiprocessor = smemSM; p.numSms = 1;
    p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved;
    cudaOccFuncAttributes f;
    f.maxThreadsPerBlock = 1024; f.numRegs = regs; f.sharedSizeBytes = stat;
    f.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; f.maxDynamicSharedSizeBytes = optin - stat; f.numBlockBarriers = 1;
    cudaOccDeviceState s;
    s.carveoutConfig = carveout;
    cudaOccResult r;
    int err = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &f, &s, block, dyn);
    printf("%d %d %d %d %d %d %d\n", err, r.activeBlocksPerMultiprocessor, r.blockLimitWarps, r.blockLimitRegs,
           r.blockLimitSharedMem, r.blockLimitBlocks, maxBlocks);
  }
  return 0;
}
"""


def _find_cuda_occupancy_h():
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    candidates = [Path(r) / "cu13" / "include" for r in roots] + [Path(r) / "cuda_runtime" / "include" for r in roots]
    candidates += [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"]
    for c in candidates:
        if (c / "cuda_occupancy.h").is_file():
            return c
    return None


def test_agrees_with_cuda_occupancy_h(tmp_path):
    """Compile a small host program against the toolkit's cuda_occupancy.h and compare on random configurations of
    every architecture, carveouts included (this checks the algorithm; the tables are checked above and on a GPU)."""
    include = _find_cuda_occupancy_h()
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if include is None or cxx is None:
        pytest.skip(f"needs cuda_occupancy.h (found: {include}) and a C++ compiler (found: {cxx})")
    (tmp_path / "oracle.cpp").write_text(textwrap.dedent(_ORACLE))
    exe = tmp_path / "oracle"
    subprocess.run([cxx, "-O1", "-I", str(include), str(tmp_path / "oracle.cpp"), "-o", str(exe)], check=True)
    configs = list(_random_configs(6000, seed=99))
    # Edges: exact fits, the largest shared memory and register counts, 0 registers, tiny blocks.
    for spec in ARCHS.values():
        for block in (1, 32, 33, 96, 256, 288, 1000, 1024):
            for regs in (0, 1, 8, 32, 40, 64, 65, 128, 168, 255):
                for smem in (0, 1, 48 * KIB, spec.shared_memory_per_block_optin_bytes):
                    configs.append((spec.name, block, regs, smem, None))
    lines = []
    for arch, block, regs, smem, carveout in configs:
        s = get_arch(arch)
        static = smem // 3
        lines.append(f"{s.compute_capability[0]} {s.compute_capability[1]} {s.max_threads_per_sm} "
                     f"{s.max_blocks_per_sm} {s.registers_per_sm} {s.shared_memory_per_sm_bytes} "
                     f"{s.shared_memory_per_block_bytes} {s.shared_memory_per_block_optin_bytes} "
                     f"{s.reserved_shared_memory_per_block_bytes} {block} {regs} {static} {smem - static} "
                     f"{-1 if carveout is None else carveout}")
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    answers = out.stdout.split("\n")
    bad = []
    for (arch, block, regs, smem, carveout), ans in zip(configs, answers):
        err, blocks, lw, lr, ls, lb, _ = map(int, ans.split())
        o = occupancy(block, regs, smem, arch, carveout=carveout)
        got = (0, o.blocks_per_sm, o.blocks_limit_warps, o.blocks_limit_registers, o.blocks_limit_shared,
               o.blocks_limit_blocks)
        if got != (err, blocks, lw, lr, ls, lb):
            bad.append(((arch, block, regs, smem, carveout), got, (err, blocks, lw, lr, ls, lb)))
    assert not bad, f"{len(bad)} of {len(configs)} differ from cuda_occupancy.h, e.g. {bad[:5]}"


# ---------------------------------------------------------------- golden: the driver on an H100/H200

def _golden_rows():
    path = GOLDEN / "occupancy_sm90.csv"
    if not path.is_file():
        return [pytest.param(None, marks=pytest.mark.skip(reason="golden table not recorded yet"), id="missing")]
    with path.open() as fh:
        reader = csv.DictReader(line for line in fh if not line.startswith("#") and line.strip())
        rows = [{k: int(v) for k, v in row.items()} for row in reader]
    return [pytest.param(r, id=f"{i}-b{r['block_size']}-r{r['registers']}-s{r['static_shared_bytes']}"
                                f"-d{r['dynamic_shared_bytes']}") for i, r in enumerate(rows)]


@pytest.mark.parametrize("row", _golden_rows())
def test_golden_driver_occupancy_sm90(row):
    """occupancy() equals cuOccupancyMaxActiveBlocksPerMultiprocessor (flags 0, default carveout) on sm_90."""
    shared = row["static_shared_bytes"] + row["dynamic_shared_bytes"]
    assert row["dynamic_shared_bytes"] <= row["max_dynamic_shared_bytes"]  # the recording opted in to what it used
    o = occupancy(row["block_size"], row["registers"], shared, "sm_90")
    assert o.blocks_per_sm == row["blocks_per_sm"], str(o)


def test_golden_device_properties_sm90():
    """The sm_90 table agrees with cudaGetDeviceProperties recorded on the H100/H200."""
    path = GOLDEN / "device_sm90.json"
    if not path.is_file():
        pytest.skip("golden table not recorded yet")
    props = json.loads(path.read_text())
    spec = get_arch("sm_90")
    assert (props["major"], props["minor"]) == (9, 0)
    assert device_mismatches(spec, props) == {}
    checked = {"maxThreadsPerMultiProcessor", "maxBlocksPerMultiProcessor", "regsPerMultiprocessor",
               "sharedMemPerMultiprocessor", "sharedMemPerBlockOptin", "reservedSharedMemPerBlock"}
    assert checked <= set(props), f"device_sm90.json lacks {checked - set(props)}"
    if "_optin_shared_per_block" in props:
        assert props["_optin_shared_per_block"] == spec.shared_memory_per_block_optin_bytes


def test_golden_max_threads_per_block_sm90():
    """The register model also predicts each recorded kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: the largest
    warp-multiple block that can launch (0 blocks beyond it), capped by __launch_bounds__."""
    path = GOLDEN / "kernel_attrs_sm90.csv"
    if not path.is_file():
        pytest.skip("golden table not recorded yet")
    with path.open() as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#") and line.strip()))
    assert rows
    for r in rows:
        regs, bounds = int(r["registers"]), int(r["launch_bounds"])
        fits = max(b for b in range(32, 1025, 32) if occupancy(b, regs, 0, "sm_90").blocks_per_sm > 0)
        assert min(bounds, fits) == int(r["max_threads_per_block"]), r
