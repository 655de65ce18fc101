"""Pictures of shared-memory bank conflicts: lanes against banks for one warp access, wavefronts per traced line."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kernellab.analysis.banks import BANK_COUNT, WARP_SIZE, WarpAccess, analyze_access
from kernellab.run.sim.trace import SharedTrace

_NONE, _SERVED, _CONFLICT = 0, 1, 2
_COLOURS = ("#ffffff", "#9ecae1", "#e6550d")  # no access, served without conflict, in a conflicting bank


def plot_bank_access(access: WarpAccess | Sequence[int | None], access_bytes: int = 4, ax=None):
    """Heatmap of lanes (rows) against banks (columns) for one warp access; conflicting cells in orange.

    Each cell a lane touches shows the wavefront that serves it; lines separate the half- or quarter-warps that the
    hardware processes apart for 8- and 16-byte accesses. `access` is a `WarpAccess` or 32 byte addresses.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    if not isinstance(access, WarpAccess):
        access = analyze_access(access, access_bytes)
    fig, ax = _figure(ax, (7.5, 7.0))

    words_in_bank: dict[tuple[int, int], set[int]] = {}
    for w in access.lane_words:
        words_in_bank.setdefault((w.phase, w.bank), set()).add(w.word_address)
    cells = np.full((WARP_SIZE, BANK_COUNT), _NONE)  # [lane, bank]
    for w in access.lane_words:
        conflict = len(words_in_bank[(w.phase, w.bank)]) > 1
        cells[w.lane, w.bank] = max(cells[w.lane, w.bank], _CONFLICT if conflict else _SERVED)

    ax.imshow(cells, cmap=ListedColormap(_COLOURS), vmin=0, vmax=2, aspect="equal", interpolation="nearest")
    for w in access.lane_words:
        ax.text(w.bank, w.lane, str(w.wavefront), ha="center", va="center", fontsize=5, color="black")
    for boundary in range(access.lanes_per_phase, WARP_SIZE, access.lanes_per_phase):
        ax.axhline(boundary - 0.5, color="black", linewidth=1.0)
    ax.set_xticks(range(0, BANK_COUNT, 4))
    ax.set_yticks(range(0, WARP_SIZE, 4))
    ax.set_xticks(np.arange(-0.5, BANK_COUNT), minor=True)
    ax.set_yticks(np.arange(-0.5, WARP_SIZE), minor=True)
    ax.grid(which="minor", color="#dddddd", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("bank")
    ax.set_ylabel("lane")
    conflict = "no conflict" if access.ways <= 1 else f"{access.ways}-way conflict"
    ax.set_title(
        f"{access.access_bytes}-byte access: {access.wavefronts} wavefront{'s' if access.wavefronts != 1 else ''} "
        f"(ideal {access.ideal_wavefronts}), {conflict}",
        fontsize=10,
    )
    ax.legend(
        handles=[
            Patch(color=_COLOURS[_SERVED], label="served"),
            Patch(color=_COLOURS[_CONFLICT], label="bank conflict"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08),
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    return fig


def plot_shared_trace(trace: SharedTrace, ax=None):
    """Bar chart per source line of a `SharedTrace`: wavefronts taken against the conflict-free count."""
    fig, ax = _figure(ax, (max(5.0, 1.2 * len(trace.lines) + 2.0), 4.0))
    labels = [f"line {s.line}\n{s.kind}" for s in trace.lines]
    x = np.arange(len(trace.lines))
    taken = [s.wavefronts for s in trace.lines]
    ideal = [s.ideal_wavefronts for s in trace.lines]
    ax.bar(x - 0.2, ideal, width=0.4, color=_COLOURS[_SERVED], label="without conflicts")
    bars = ax.bar(x + 0.2, taken, width=0.4, color=_COLOURS[_CONFLICT], label="modelled")
    for bar, s in zip(bars, trace.lines):
        ax.annotate(
            f"{s.ways}-way",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("shared wavefronts")
    ax.set_title(
        f"{trace.kernel_name}: {trace.wavefronts} wavefronts for {trace.instructions} accesses\n"
        f"(ideal {trace.ideal_wavefronts}, worst {trace.ways}-way)",
        fontsize=10,
    )
    ax.margins(y=0.15)
    ax.legend(fontsize=8, frameon=False)
    return fig


def _figure(ax, size):
    """The Figure and Axes to draw on: `ax`'s, or a new Figure not registered with pyplot (so it shows once)."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()
