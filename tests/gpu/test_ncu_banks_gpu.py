"""Nsight Compute's per-line shared wavefronts for tutorial 02's three transposes equal the bank model's prediction.

Needs a GPU, ncu with access to the performance counters, and kernellab.run.launch.job (profile_banks runs the launch as a
job under ncu). The kernels are the tutorial's own: the `%%cuda` cell of notebooks/02-transpose-banks.py, compiled as
the magic compiles it (first_line=2), so the line numbers checked here are the notebook cell's.
"""
import functools

import pytest

import kernellab
from kernellab.analysis.banks import analyze_access

pytestmark = pytest.mark.gpu
pytest.importorskip("kernellab.run.launch.job", reason="profile_banks needs kernellab.run.launch.job (KernelJob), not present here")

from notebook_cells import cuda_cell as notebook_cuda_cell

TILE, ROWS = 32, 8
BLOCK = (TILE, ROWS)  # warp w of a block is threadIdx.y == w; its lanes are threadIdx.x
LAYOUTS = {  # word offset of tile element (row, col) in each kernel's shared array
    "transpose_tile32": lambda row, col: 32 * row + col,
    "transpose_tile33": lambda row, col: 33 * row + col,
    "transpose_xor": lambda row, col: 32 * row + (col ^ row),
}


def cuda_cell() -> str:
    """The notebook's `%%cuda` cell without its magic line: what the magic hands to compile_cuda."""
    return notebook_cuda_cell("02-transpose-banks.py")


@pytest.fixture(scope="module")
def transposes():
    return kernellab.compile_cuda(cuda_cell(), first_line=2, filename="cell.cu")


def cell_line(line: int) -> str:
    """Line `line` of the cell as the notebook numbers it (line 1 is `%%cuda`)."""
    return (["%%cuda"] + cuda_cell().splitlines())[line - 1].strip()


def grid_for(rows, cols):
    return ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE)


@functools.lru_cache(maxsize=None)
def _block_model(name: str, tile_rows: int, tile_cols: int) -> dict:
    """Model of one block whose tile has tile_rows x tile_cols elements inside the matrix (edge blocks: fewer)."""
    layout = LAYOUTS[name]
    out = {"store": [0, 0], "load": [0, 0]}  # kind -> [warp accesses with an active lane, wavefronts]
    for ty in range(ROWS):
        for j in range(0, TILE, ROWS):
            tr = ty + j
            # Row write: lane tx stores element (tr, tx) if it lies inside the matrix.
            store = [4 * layout(tr, tx) if tr < tile_rows and tx < tile_cols else None for tx in range(32)]
            # Column read: lane tx loads element (tx, tr) if out's row (in's column tr) and column (in's row tx) exist.
            load = [4 * layout(tx, tr) if tr < tile_cols and tx < tile_rows else None for tx in range(32)]
            for kind, addresses in (("store", store), ("load", load)):
                if any(a is not None for a in addresses):
                    out[kind][0] += 1
                    out[kind][1] += analyze_access(addresses).wavefronts
    return out


def model(name: str, rows: int, cols: int) -> dict:
    """The bank model's (warp accesses, wavefronts) per kind for one launch on a rows x cols matrix."""
    total = {"store": [0, 0], "load": [0, 0]}
    gx, gy = grid_for(rows, cols)
    for by in range(gy):
        for bx in range(gx):
            block = _block_model(name, min(TILE, rows - by * TILE), min(TILE, cols - bx * TILE))
            for kind in total:
                total[kind][0] += block[kind][0]
                total[kind][1] += block[kind][1]
    return total


def _measure(kernel, rows, cols):
    import torch

    x = torch.randn(rows, cols, device="cuda")
    y = torch.empty(cols, rows, device="cuda")
    report = kernel.profile_banks(grid_for(rows, cols), BLOCK, x, y, rows, cols, strict=True)
    assert report.measured and report.kernel == kernel.name, report
    lines = {c.kind: c for c in report.lines}
    assert sorted(lines) == ["load", "store"] and len(report.lines) == 2, str(report)
    return lines


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_ncu_per_line_wavefronts_equal_the_model_on_full_tiles(transposes, name):
    n = 1024
    lines = _measure(transposes[name], n, n)
    predicted = model(name, n, n)
    for kind, text in (("load", "= tile[threadIdx.x]"), ("store", "= in[(r + j) * cols + c]")):
        c = lines[kind]
        assert text in cell_line(c.line) and c.source == cell_line(c.line), (kind, c.line, cell_line(c.line))
        assert c.instructions == predicted[kind][0] == n * n // 32, (kind, c)
        assert c.wavefronts == predicted[kind][1], (kind, c, predicted[kind])
        assert c.ideal_wavefronts == c.instructions
    per_read = 32 if name == "transpose_tile32" else 1
    assert lines["load"].wavefronts == per_read * lines["load"].ideal_wavefronts
    assert lines["load"].excess_wavefronts == (per_read - 1) * lines["load"].instructions


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_ncu_wavefronts_equal_the_model_on_an_odd_shape(transposes, name):
    """1000 x 777: edge tiles leave lanes idle; a column read with k active lanes of one bank is k-way."""
    rows, cols = 1000, 777
    lines = _measure(transposes[name], rows, cols)
    predicted = model(name, rows, cols)
    assert lines["load"].wavefronts == predicted["load"][1], (lines["load"], predicted["load"])
    assert lines["store"].wavefronts == predicted["store"][1], (lines["store"], predicted["store"])


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_profiled_kernels_transpose(transposes, name):
    import torch

    rows, cols = 1000, 777
    x = torch.randn(rows, cols, device="cuda")
    y = torch.full((cols, rows), float("nan"), device="cuda")
    transposes[name][grid_for(rows, cols), BLOCK](x, y, rows, cols)
    torch.testing.assert_close(y, x.t().contiguous(), rtol=0, atol=0)
