"""Shared-memory bank model (kernellab.analysis.banks), simulator traces (kernellab.run.sim.trace) and bank pictures.

CPU only. The simulator tests use `numba.cuda.simulator` directly, which works next to the real `numba.cuda`;
one test also runs a trace in a subprocess with NUMBA_ENABLE_CUDASIM=1, where `numba.cuda` is the simulator.
"""
import csv
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kernellab.analysis.banks import (
    BankAccessError,
    BankReport,
    WarpAccess,
    analyze_access,
    analyze_accesses,
    bank_of,
    bank_wavefronts,
)
from kernellab.errors import KernellabError

REPO = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "banks_sm90.csv"


def strided(stride_elements, access_bytes=4, active=range(32)):
    """32 lane addresses, lane * stride elements apart; lanes outside `active` inactive."""
    active = set(active)
    return [lane * stride_elements * access_bytes if lane in active else None for lane in range(32)]


# ---------------------------------------------------------------------------------------------------------------------
# Hand-worked 4-byte cases


@pytest.mark.parametrize(
    "stride, wavefronts",
    [(1, 1), (2, 2), (3, 1), (4, 4), (8, 8), (16, 16), (32, 32), (33, 1), (64, 32)],
)
def test_4_byte_stride_conflicts_are_gcd_of_stride_and_32(stride, wavefronts):
    access = analyze_access(strided(stride))
    assert access.wavefronts == wavefronts == bank_wavefronts(strided(stride))
    assert access.ways == wavefronts
    assert access.ideal_wavefronts == 1
    assert access.conflict_wavefronts == wavefronts - 1


def test_stride_2_pairs_lanes_n_and_n_plus_16_in_one_bank():
    access = analyze_access(strided(2))
    bank0 = access.banks[0]
    assert bank0.lanes == (0, 16)
    assert bank0.word_addresses == (0, 128)
    assert bank0.ways == 2
    assert access.wavefront_lanes == (tuple(range(16)), tuple(range(16, 32)))


def test_stride_32_is_a_32_way_conflict_on_bank_0():
    access = analyze_access(strided(32))
    assert access.ways == 32
    assert [b.bank for b in access.banks if b.lanes] == [0]
    assert access.wavefront_lanes == tuple((lane,) for lane in range(32))


def test_broadcast_and_multicast_cost_one_wavefront():
    assert bank_wavefronts([64] * 32) == 1
    assert bank_wavefronts([(lane % 4) * 4 for lane in range(32)]) == 1  # 4 words, each read by 8 lanes
    assert bank_wavefronts([(lane % 2) * 128 for lane in range(32)]) == 2  # 2 words in bank 0: a real conflict


def test_inactive_lanes_do_not_conflict():
    only_four = strided(32, active=(0, 9, 18, 27))
    access = analyze_access(only_four)
    assert access.wavefronts == 4
    assert access.active_lanes == (0, 9, 18, 27)
    assert bank_wavefronts([None] * 32) == 0
    assert analyze_access([None] * 32).ways == 0


def test_bank_of():
    assert [bank_of(a) for a in (0, 4, 124, 128, 132)] == [0, 1, 31, 0, 1]


# ---------------------------------------------------------------------------------------------------------------------
# Hand-worked 8- and 16-byte cases


def test_8_byte_contiguous_takes_two_half_warp_wavefronts():
    access = analyze_access(strided(1, 8), 8)
    assert (access.wavefronts, access.ideal_wavefronts, access.ways) == (2, 2, 1)
    assert access.lanes_per_phase == 16
    assert access.wavefront_lanes == (tuple(range(16)), tuple(range(16, 32)))


def test_8_byte_stride_2_is_2_way_within_each_half_warp():
    access = analyze_access(strided(2, 8), 8)  # lanes 0 and 8 both in banks 0-1
    assert (access.wavefronts, access.ideal_wavefronts, access.ways) == (4, 2, 2)


def test_8_byte_half_warps_reading_the_same_128_bytes_still_take_two():
    assert bank_wavefronts([(lane % 16) * 8 for lane in range(32)], 8) == 2


def test_8_byte_pairs_and_broadcast_take_one_wavefront():
    pairs = [(lane // 2) * 8 for lane in range(32)]  # lanes n and n^1 share an address
    access = analyze_access(pairs, 8)
    assert (access.wavefronts, access.pair_xor, access.lanes_per_phase) == (1, 1, 32)
    assert bank_wavefronts([256] * 32, 8) == 1
    # A lane whose partner is inactive keeps the pairing: four scattered lanes are one phase, one wavefront.
    scattered = [None] * 32
    for lane, address in ((13, 104), (18, 144), (25, 200), (26, 208)):
        scattered[lane] = address
    assert bank_wavefronts(scattered, 8) == 1


def test_16_byte_contiguous_takes_four_quarter_warp_wavefronts():
    access = analyze_access(strided(1, 16), 16)
    assert (access.wavefronts, access.ideal_wavefronts, access.lanes_per_phase) == (4, 4, 8)
    assert bank_wavefronts(strided(1, 16, active=range(8)), 16) == 1


def test_16_byte_pairs_halve_the_wavefronts_but_broadcast_takes_two():
    assert bank_wavefronts([256] * 32, 16) == 2
    assert bank_wavefronts([(lane // 2) * 16 for lane in range(32)], 16) == 2
    lanes_n_and_n_xor_2 = [((lane >> 2) * 2 + (lane & 1)) * 16 for lane in range(32)]  # 128 B per half-warp
    access = analyze_access(lanes_n_and_n_xor_2, 16)
    assert (access.wavefronts, access.pair_xor) == (2, 2)
    assert bank_wavefronts([(lane % 8) * 16 for lane in range(32)], 16) == 4  # n^8 partners do not pair


def test_16_byte_conflict_within_a_quarter_warp():
    addresses = strided(2, 16)  # lanes 0 and 4 of each quarter-warp both in banks 0-3
    access = analyze_access(addresses, 16)
    assert (access.wavefronts, access.ideal_wavefronts, access.ways) == (8, 4, 2)
    assert {b.ways for b in access.banks if b.lanes} == {2}


def test_16_byte_word_coverage_spans_four_banks():
    access = analyze_access([16] + [None] * 31, 16)
    assert [(w.lane, w.bank) for w in access.lane_words] == [(0, 4), (0, 5), (0, 6), (0, 7)]


# ---------------------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "addresses, access_bytes, message",
    [
        ([0] * 31, 4, "expected 32 byte addresses"),
        ([0] * 33, 4, "got 33"),
        ([0] * 5 + [6] + [0] * 26, 4, "lane 5: address 6 is not a multiple of the 4-byte access width"),
        ([0] * 3 + [4] + [0] * 28, 8, "lane 3: address 4 is not a multiple of the 8-byte access width"),
        ([0] * 7 + [24] + [0] * 24, 16, "lane 7: address 24 is not a multiple of the 16-byte"),
        ([0] * 2 + [-4] + [0] * 29, 4, "lane 2: address -4 is negative"),
        ([0] * 4 + [4.0] + [0] * 27, 4, "lane 4: address 4.0 is not an integer"),
        ([0] * 32, 2, "access_bytes must be 4, 8 or 16"),
        ([0] * 32, 32, "access_bytes must be 4, 8 or 16"),
        ([0] * 32, True, "access_bytes must be 4, 8 or 16"),
        (None, 4, "expected a sequence of 32 byte addresses"),
    ],
)
def test_bad_input_names_the_lane_and_the_rule(addresses, access_bytes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as caught:
        analyze_access(addresses, access_bytes)
    assert isinstance(caught.value, BankAccessError) and isinstance(caught.value, KernellabError)


def test_analyze_accesses_names_the_bad_access():
    with pytest.raises(ValueError, match="access 1: lane 0"):
        analyze_accesses([strided(1), [2] + [0] * 31])
    with pytest.raises(ValueError, match="one per access"):
        analyze_accesses([strided(1)], access_bytes=[4, 8])


def test_numpy_integer_addresses_are_accepted():
    assert bank_wavefronts(np.arange(32, dtype=np.int64) * 8) == 2


# ---------------------------------------------------------------------------------------------------------------------
# Results


def test_warp_access_reprs_and_json():
    access = analyze_access(strided(32))
    text = str(access)
    assert "32 wavefronts" in text and "32-way bank conflict" in text and "bank  0: 32-way" in text
    assert "<table" in access._repr_html_()
    data = access.to_json()
    assert (data["kind"], data["version"], data["wavefronts"], data["ways"]) == ("banks", 1, 32, 32)
    assert data["addresses"] == strided(32)
    json.dumps(data)
    bundle = access._repr_mimebundle_()
    assert bundle["application/vnd.kernellab.report+json"]["kind"] == "banks"
    with pytest.raises(AttributeError):
        access.wavefronts = 1  # frozen


def test_bank_report_totals():
    report = analyze_accesses([strided(1), strided(2), strided(32), [None] * 32])
    assert isinstance(report, BankReport) and all(isinstance(a, WarpAccess) for a in report.accesses)
    assert (report.instructions, report.wavefronts, report.ideal_wavefronts, report.ways) == (4, 35, 3, 32)
    mixed = analyze_accesses([strided(1, 8), strided(1, 16)], access_bytes=[8, 16])
    assert mixed.wavefronts == 6
    data = report.to_json()
    assert (data["kind"], data["version"], data["wavefronts"]) == ("banks", 1, 35) and len(data["accesses"]) == 4
    json.dumps(data)
    assert "4 shared accesses: 35 wavefronts" in str(report)
    assert "<table" in report._repr_html_()


# ---------------------------------------------------------------------------------------------------------------------
# Golden table: ncu on sm_90


def _golden_rows():
    if not GOLDEN.exists():
        return []
    with open(GOLDEN) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [pytest.param(row, id=f"{row['pattern']}-{row['access_bytes']}B") for row in rows]


@pytest.mark.skipif(not GOLDEN.exists(), reason="golden table not recorded yet")
@pytest.mark.parametrize("row", _golden_rows())
def test_golden_sm90(row):
    addresses = [None if int(a) < 0 else int(a) for a in row["addresses"].split()]
    access_bytes = int(row["access_bytes"])
    assert int(row["instructions"]) == 1
    access = analyze_access(addresses, access_bytes)
    assert access.wavefronts == int(row["wavefronts"]), str(access)
    if row.get("conflicts"):  # ncu's bank-conflict counter: wavefronts beyond one per active phase
        assert access.conflict_wavefronts == int(row["conflicts"]), str(access)


# ---------------------------------------------------------------------------------------------------------------------
# Simulator traces

from kernellab.run.sim.trace import SharedTrace, trace_shared  # noqa: E402  (imports numba only when tracing)

try:  # the real numba.cuda, or the simulator when NUMBA_ENABLE_CUDASIM=1
    import numba
    from numba import cuda
except Exception as exc:  # missing, or broken (numba-cuda 0.30 fails to import with numpy 2.5)
    numba = cuda = None
    NUMBA_SKIP = f"numba.cuda does not import here: {type(exc).__name__}: {exc}"
else:
    NUMBA_SKIP = None
needs_numba = pytest.mark.skipif(NUMBA_SKIP is not None, reason=NUMBA_SKIP or "")


def jit(*args, **kwargs):
    """`cuda.jit` where numba.cuda imports; otherwise the plain function (its tests are skipped)."""
    if cuda is not None:
        return cuda.jit(*args, **kwargs)
    return args[0] if args and callable(args[0]) else (lambda func: func)


TILE = 32
TILE_PADDED = TILE + 1  # a shared array's shape must be a compile-time constant: `TILE + 1` inline is not


@jit
def transpose_tile32(out, inp):
    tile = cuda.shared.array((TILE, TILE), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = inp[cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx]
    cuda.syncthreads()
    out[cuda.blockIdx.x * TILE + ty, cuda.blockIdx.y * TILE + tx] = tile[tx, ty]


@jit
def transpose_tile33(out, inp):
    tile = cuda.shared.array((TILE, TILE_PADDED), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty][tx] = inp[cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx]  # row view, then element
    cuda.syncthreads()
    out[cuda.blockIdx.x * TILE + ty, cuda.blockIdx.y * TILE + tx] = tile[tx][ty]


@jit
def transpose_xor(out, inp):
    tile = cuda.shared.array((TILE, TILE), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx ^ ty] = inp[cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx]
    cuda.syncthreads()
    out[cuda.blockIdx.x * TILE + ty, cuda.blockIdx.y * TILE + tx] = tile[tx, ty ^ tx]


def _line_of(func, text):
    """Absolute line number of the first line of `func` containing `text`."""
    import inspect

    lines, first = inspect.getsourcelines(func.py_func)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _transpose(kernel, n):
    inp = np.arange(n * n, dtype=np.float32).reshape(n, n)
    out = np.zeros_like(inp)
    trace = trace_shared(kernel, (n // TILE, n // TILE), (TILE, TILE), out, inp)
    np.testing.assert_array_equal(out, inp.T)
    return trace


@needs_numba
def test_trace_transpose_unpadded_column_read_is_32_way():
    trace = _transpose(transpose_tile32, 64)  # 2x2 blocks of 32 warps
    assert isinstance(trace, SharedTrace)
    store = trace.line(_line_of(transpose_tile32, "tile[ty, tx] ="), "store")
    load = trace.line(_line_of(transpose_tile32, "= tile[tx, ty]"), "load")
    assert (store.instructions, store.wavefronts, store.ways) == (128, 128, 1)
    assert (load.instructions, load.wavefronts, load.ways) == (128, 128 * 32, 32)
    assert load.source.endswith("= tile[tx, ty]")
    assert load.worst.wavefronts == 32
    assert (trace.instructions, trace.wavefronts, trace.ways) == (256, 128 * 33, 32)
    assert {a.block for a in trace.accesses} == {(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)}
    assert trace.allocations[0].shape == (32, 32) and trace.allocations[0].nbytes == 4096


@needs_numba
@pytest.mark.parametrize("kernel", [transpose_tile33, transpose_xor], ids=["padded-33", "xor-swizzle"])
def test_trace_transpose_padded_or_swizzled_is_conflict_free(kernel):
    trace = _transpose(kernel, 32)
    assert [(s.kind, s.instructions, s.wavefronts, s.ways) for s in trace.lines] == [
        ("store", 32, 32, 1),
        ("load", 32, 32, 1),
    ]


@needs_numba
def test_trace_result_reprs_json_and_line_offset():
    trace = _transpose(transpose_tile32, 32)
    load_line = _line_of(transpose_tile32, "= tile[tx, ty]")
    text = str(trace)
    assert "transpose_tile32" in text and "32-way" in text and "not run in warp lockstep" in text
    assert "<table" in trace._repr_html_()
    data = trace.to_json()
    assert (data["kind"], data["version"], data["source"], data["wavefronts"]) == ("banks", 1, "simulator", 32 + 1024)
    json.dumps(data)
    assert trace._repr_mimebundle_()["application/vnd.kernellab.report+json"]["ways"] == 32

    inp = np.zeros((32, 32), np.float32)
    shifted = trace_shared(transpose_tile32, 1, (32, 32), np.zeros_like(inp), inp, line_offset=-(load_line - 7))
    assert shifted.line(7, "load").wavefronts == 1024
    with pytest.raises(KeyError, match="lines traced"):
        shifted.line(load_line, "load")


@jit(device=True)
def _row_sum(tile, row):
    total = 0.0
    for k in range(8):
        total += tile[row, k]  # a loop: each iteration is one warp access
    return total


@jit
def shared_features(out, counts):
    tile = cuda.shared.array((8, 8), numba.float64)
    hist = cuda.shared.array(4, numba.int32)
    dyn = cuda.shared.array(0, numba.int8)
    t = cuda.threadIdx.x
    if t < 4:
        hist[t] = 0
    tile[t // 8, t % 8] = t
    dyn[t] = t
    cuda.syncthreads()
    cuda.atomic.add(hist, t % 4, 1)
    cuda.syncthreads()
    out[t] = _row_sum(tile, t % 8) + dyn[63 - t]
    if t < 4:
        counts[t] = hist[t]


@needs_numba
def test_trace_loops_device_functions_atomics_dynamic_and_8_byte_elements():
    out = np.zeros(64, np.float64)
    counts = np.zeros(4, np.int32)
    trace = trace_shared(shared_features, 1, 64, out, counts, dynamic_smem_bytes=64)
    assert counts.tolist() == [16, 16, 16, 16]
    row_sums = [sum(range(8 * r, 8 * r + 8)) for r in range(8)]
    np.testing.assert_array_equal(out, [row_sums[t % 8] + (63 - t) for t in range(64)])

    by_source = {(s.source.split("#")[0].strip(), s.kind): s for s in trace.lines}
    loop = by_source[("total += tile[row, k]", "load")]
    # 8 iterations x 2 warps; lanes read tile[lane % 8, k]: 8 distinct 8-byte words 64 bytes apart in each half-warp.
    assert loop.instructions == 16 and loop.element_bytes == 8
    assert loop.worst.ways == 4 and loop.wavefronts == 16 * 8
    atomic = by_source[("cuda.atomic.add(hist, t % 4, 1)", "atomic")]
    assert (atomic.instructions, atomic.wavefronts) == (2, 2)  # one access each, 4 words broadcast to 8 lanes each
    dynamic = by_source[("dyn[t] = t", "store")]
    assert (dynamic.element_bytes, dynamic.instructions, dynamic.wavefronts) == (1, 2, 2)  # bytes of one word share it
    assert [a.dynamic for a in trace.allocations].count(True) == 1
    assert not any(s.line == 0 for s in trace.lines)


@needs_numba
@pytest.mark.skipif(getattr(cuda, "compile_ptx", 1) is None, reason="numba.cuda is the simulator (no compile_ptx)")
@pytest.mark.parametrize("kernel", [transpose_tile32, transpose_tile33, transpose_xor])
def test_traced_kernels_also_compile(kernel):
    ptx, _ = cuda.compile_ptx(kernel.py_func, "void(float32[:, :], float32[:, :])", cc=(9, 0))
    assert "ld.shared.f32" in ptx and "st.shared.f32" in ptx


@needs_numba
def test_trace_rejects_a_non_kernel():
    with pytest.raises(TypeError, match="@cuda.jit kernel"):
        trace_shared(42, 1, 32)
    with pytest.raises(ValueError, match="block must be"):
        trace_shared(transpose_tile32, 1, (0, 32))


@needs_numba
def test_trace_under_numba_enable_cudasim(tmp_path):
    script = tmp_path / "simmode.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import numba
            from numba import cuda
            assert cuda.compile_ptx is None  # numba.cuda is the simulator here
            from kernellab.run.sim.trace import trace_shared

            @cuda.jit
            def column(out):
                tile = cuda.shared.array((32, 32), numba.float32)
                tile[cuda.threadIdx.x, 0] = 1.0
                out[cuda.threadIdx.x] = tile[cuda.threadIdx.x, 0]

            trace = trace_shared(column, 1, 32, np.zeros(32, np.float32))
            print(trace.wavefronts, trace.ways)
            """
        )
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64", "32"]


def test_analysis_module_imports_no_gpu_or_notebook_packages():
    code = (
        "import sys, kernellab.analysis.banks; "
        "print([m for m in ('numba', 'IPython', 'torch', 'cupy', 'matplotlib') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------------
# Pictures


@needs_numba
def test_plots_return_figures():
    from matplotlib.figure import Figure

    from kernellab.notebook.bank_plots import plot_bank_access, plot_shared_trace

    fig = plot_bank_access(analyze_access(strided(2, 8), 8))
    assert isinstance(fig, Figure) and "4 wavefronts" in fig.axes[0].get_title()
    assert isinstance(plot_bank_access(strided(32)), Figure)  # raw addresses work too

    trace = _transpose(transpose_tile32, 32)
    fig = plot_shared_trace(trace)
    assert isinstance(fig, Figure) and "1056 wavefronts" in fig.axes[0].get_title()

    own = Figure()
    ax = own.add_subplot()
    assert plot_bank_access(trace.lines[1].worst, ax=ax) is own
    assert plot_shared_trace(trace, ax=ax) is own
