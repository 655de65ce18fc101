"""kernellab.teach.rows: the row plan's shape and the benchmark sweep table tutorials 03 and 04 share, on real
BenchResults timed by a fake clock (no GPU), and both tutorials' launcher cells returning the shared RowPlan."""
import dataclasses
import pathlib
import re
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from notebook_cells import launcher_cells  # noqa: E402
from test_bench import FakeClock, ms_from_tensor  # noqa: E402

from kernellab.run.measure.bench import bench  # noqa: E402
from kernellab.teach.rows import SWEEP_HEADERS, RowPlan, sweep_rows, sweep_table  # noqa: E402


def test_row_plan_is_frozen_and_names_its_kind():
    warp = RowPlan(row_threads=32, vpt=2, cluster=1, block=128, grid=1024)
    assert warp.kind == "warp per row"
    assert RowPlan(256, 4, 1, 256, 4096).kind == "block per row"
    assert RowPlan(512, 8, 4, 512, 12).kind == "cluster of 4 per row"
    with pytest.raises(dataclasses.FrozenInstanceError):
        warp.vpt = 4
    assert warp == RowPlan(32, 2, 1, 128, 1024) and hash(warp) == hash(RowPlan(32, 2, 1, 128, 1024))


def _result(ours_ms, eager_ms, compiled_ms, nbytes):
    """A real BenchResult: ours and the two baselines take the milliseconds their input asks of the fake clock."""
    return bench(lambda x: x.clone(), lambda g: (torch.full((4,), float(ours_ms)),), bytes=nbytes,
                 baselines={"torch eager": lambda x: x * (eager_ms / ours_ms),
                            "torch.compile": lambda x: x * (compiled_ms / ours_ms)},
                 timer=FakeClock(ms_from_tensor), name="ours")


def test_sweep_rows_are_microseconds_speedups_and_share_of_copy_bandwidth():
    results = {(4096, 4096): _result(0.05, 0.1, 0.04, 1.5e8),       # 3000 GB/s: all of a 3000 GB/s copy
               (3, 100003): _result(0.01, 0.02, 0.02, 6e6)}        # 600 GB/s: a fifth of it
    rows = sweep_rows(results, copy_gbps=3000.0)
    assert rows == [["4096 x 4096", "50.0", "100.0", "40.0", "2.00x", "0.80x", "100%"],
                    ["3 x 100003", "10.0", "20.0", "20.0", "2.00x", "2.00x", "20%"]]
    assert sweep_rows(results, copy_gbps=6000.0)[0][-1] == "50%"     # the share follows the given bandwidth


def test_sweep_table_is_one_captioned_html_row_per_shape():
    results = {(r, 1024): _result(0.01 * (i + 1), 0.02, 0.03, 1e6) for i, r in enumerate((1, 1000, 4096))}
    page = sweep_table(results, "softmax, bfloat16, H100 & co", 3000.0)
    assert page.count("<tr>") == 1 + 3 and "<caption" in page and "H100 &amp; co" in page   # escaped
    assert all(f"<th style='padding: 1px 8px; text-align: right; border-bottom: 1px solid #ddd'>{h}</th>" in page
               for h in SWEEP_HEADERS[1:])
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)
    assert cells[0::7] == ["1 x 1024", "1000 x 1024", "4096 x 1024"] and cells[1::7] == ["10.0", "20.0", "30.0"]


@pytest.mark.parametrize("nb,header", [("03-reductions-softmax.py", "# launchers: softmax"),
                                       ("04-layernorm.py", "# launchers: layernorm, rmsnorm (")])
def test_both_tutorials_plan_with_the_shared_row_plan(nb, header):
    """Each tutorial keeps its own plan_rows (its lesson); the plans it returns are kernellab.teach.rows.RowPlan."""
    cell = next(c for c in launcher_cells(nb) if c.startswith(header))
    assert "class RowPlan" not in cell
    ns = {}
    exec(compile(cell, nb, "exec"), ns)
    plans = [ns["plan_rows"](r, c, 2) for r, c in ((4096, 1024), (4096, 4096), (3, 100003))]
    assert all(type(p) is RowPlan for p in plans), plans
    assert [p.kind for p in plans][::2] == ["warp per row", "cluster of 8 per row"], plans
