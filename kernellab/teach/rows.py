"""What tutorials 03 (softmax) and 04 (LayerNorm, RMSNorm) share around their row-wise kernels: the launch plan's
shape (`RowPlan`) and the table of a benchmark sweep against PyTorch eager and `torch.compile` (`sweep_table`).

Each tutorial's `plan_rows`, which chooses a plan for a shape, stays in its own launcher cell: how it chooses is
that tutorial's lesson, and tutorial 04's plans differ from 03's. No GPU, no torch, no IPython here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report import html_table


@dataclass(frozen=True)
class RowPlan:
    """How a row-wise kernel covers a rows x cols matrix: who holds a row, and the launch that follows."""

    row_threads: int     # threads that share a row: 32 is one warp per row
    vpt: int             # 16-byte packs per thread
    cluster: int         # blocks per row: 1 when a block holds the row
    block: int           # threads per block
    grid: int            # blocks

    @property
    def kind(self) -> str:
        return ("warp per row" if self.row_threads == 32 else "block per row" if self.cluster == 1
                else f"cluster of {self.cluster} per row")


SWEEP_HEADERS = ("shape", "ours µs", "eager µs", "compile µs", "vs eager", "vs compile", "ours, of copy bandwidth")


def sweep_rows(results, copy_gbps: float) -> list[list[str]]:
    """The rows of `sweep_table`: one per (rows, cols) shape of `results` ({shape: BenchResult with baselines
    "torch eager" and "torch.compile"}), in its order: µs of ours, eager and compiled, the two speed-ups, and our
    bandwidth as a share of `copy_gbps` (the device's copy bandwidth, read + write bytes, GB/s)."""
    rows = []
    for (r, c), res in results.items():
        base = {b.name: b for b in res.baselines}
        rows.append([f"{r} x {c}", f"{res.median_ms * 1e3:.1f}", f"{base['torch eager'].median_ms * 1e3:.1f}",
                     f"{base['torch.compile'].median_ms * 1e3:.1f}", f"{res.speedup('torch eager').ratio:.2f}x",
                     f"{res.speedup('torch.compile').ratio:.2f}x", f"{res.gbps / copy_gbps:.0%}"])
    return rows


def sweep_table(results, caption: str, copy_gbps: float) -> str:
    """One HTML table row per shape (`sweep_rows`), captioned; show it with IPython.display.HTML."""
    return html_table(list(SWEEP_HEADERS), sweep_rows(results, copy_gbps), caption=caption)
