"""The occupancy calculator's three graphs: occupancy against block size, registers per thread and shared memory per block.

Like the CUDA Occupancy Calculator spreadsheet, each graph varies one input, holds the other two at the kernel's
values and marks the kernel's own point (a Line2D with gid "current"). Figures are made with
matplotlib.figure.Figure, not pyplot, so that nothing is drawn twice in a notebook and no global state is kept.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from kernellab.analysis.arch import DEFAULT_ARCH, KIB
from kernellab.analysis.occupancy import LIMITERS, Occupancy, occupancy, occupancy_sweep

_LIMITER_COLOUR = {"warps": "C0", "registers": "C1", "shared_memory": "C2", "blocks": "C4"}


def _current(block_size, registers, shared_bytes, arch, carveout) -> Occupancy:
    """The kernel's own point: `block_size` may already be an Occupancy."""
    if isinstance(block_size, Occupancy):
        return block_size
    if registers is None:
        raise TypeError("pass registers per thread, or an Occupancy as the first argument")
    return occupancy(block_size, registers, shared_bytes, arch, carveout=carveout)


def _axes(ax, figsize=(5.0, 3.2)):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _draw(ax, x, sweep, occ: Occupancy, marker_x, xlabel, *, steps, legend_loc="best"):
    """The occupancy curve over `x`, coloured background bands by limiter, and the kernel's point."""
    pct = 100.0 * sweep.ratio
    ax.plot(x, pct, color="0.25", lw=1.4, drawstyle="steps-post" if steps else "default",
            marker=None if steps else ".", ms=4, gid="curve")
    ax.plot([marker_x], [occ.percent], "o", color="C3", ms=8, zorder=5, gid="current",
            label=f"this kernel: {occ.percent:.0f}% ({occ.limiter.replace('_', ' ')})")
    # Which limit binds where: a thin strip along the bottom of the graph.
    codes = sweep.limiter_code
    for code, name in enumerate(LIMITERS):
        where = codes == code
        if where.any():
            ax.fill_between(x, -4, -1, where=where, step="post" if steps else "mid",
                            color=_LIMITER_COLOUR[name], alpha=0.5, lw=0, label=f"limited by {name.replace('_', ' ')}")
    ax.set_ylim(-5, 105)
    ax.set_ylabel("occupancy (% of warps)")
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    maxw = occ.max_warps_per_sm
    sec = ax.secondary_yaxis("right", functions=(lambda p: p * maxw / 100.0, lambda w: w * 100.0 / maxw))
    sec.set_ylabel("warps/SM")
    ax.legend(loc=legend_loc, fontsize="x-small", framealpha=0.8)


def plot_occupancy_vs_block_size(block_size, registers=None, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None, ax=None):
    """Occupancy against threads per block (multiples of the warp size), the kernel's point marked."""
    occ = _current(block_size, registers, shared_bytes, arch, carveout)
    spec = occ.spec
    sizes = np.arange(spec.warp_size, spec.max_threads_per_block + 1, spec.warp_size)
    sweep = occupancy_sweep(sizes, occ.registers, occ.shared_bytes, spec, carveout=occ.carveout)
    fig, ax = _axes(ax)
    _draw(ax, sizes, sweep, occ, occ.block_size, "threads per block", steps=False)
    ax.set_title(f"Varying block size ({occ.registers} regs, {occ.shared_bytes} B smem, {occ.arch})", fontsize="small")
    ax.set_xlim(0, spec.max_threads_per_block + spec.warp_size)
    return fig


def plot_occupancy_vs_registers(block_size, registers=None, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None, ax=None):
    """Occupancy against registers per thread (0..255), the kernel's point marked."""
    occ = _current(block_size, registers, shared_bytes, arch, carveout)
    spec = occ.spec
    regs = np.arange(0, spec.max_registers_per_thread + 1)
    sweep = occupancy_sweep(occ.block_size, regs, occ.shared_bytes, spec, carveout=occ.carveout)
    fig, ax = _axes(ax)
    _draw(ax, regs, sweep, occ, occ.registers, "registers per thread", steps=True)
    ax.set_title(f"Varying registers ({occ.block_size} threads, {occ.shared_bytes} B smem, {occ.arch})",
                 fontsize="small")
    ax.set_xlim(0, spec.max_registers_per_thread + 1)
    return fig


def plot_occupancy_vs_shared_memory(block_size, registers=None, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None,
                                    ax=None):
    """Occupancy against shared memory per block (static + dynamic, KiB), the kernel's point marked."""
    occ = _current(block_size, registers, shared_bytes, arch, carveout)
    spec = occ.spec
    unit = spec.shared_memory_allocation_unit_bytes
    smem = np.arange(0, spec.shared_memory_per_block_optin_bytes + 1, unit)
    sweep = occupancy_sweep(occ.block_size, occ.registers, smem, spec, carveout=occ.carveout)
    fig, ax = _axes(ax)
    _draw(ax, smem / KIB, sweep, occ, occ.shared_bytes / KIB, "shared memory per block (KiB)", steps=True)
    ax.set_title(f"Varying shared memory ({occ.block_size} threads, {occ.registers} regs, {occ.arch})",
                 fontsize="small")
    ax.set_xlim(0, spec.shared_memory_per_block_optin_bytes / KIB)
    return fig


def plot_occupancy(block_size, registers=None, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None, axes=None):
    """All three graphs side by side in one Figure; `axes` may be three existing Axes to draw into."""
    occ = _current(block_size, registers, shared_bytes, arch, carveout)
    if axes is None:
        fig = Figure(figsize=(15.0, 3.6), layout="constrained")
        axes = fig.subplots(1, 3)
    else:
        if len(axes) != 3:
            raise ValueError(f"plot_occupancy draws three graphs; pass 3 Axes, not {len(axes)}")
        fig = axes[0].figure
    plot_occupancy_vs_block_size(occ, ax=axes[0])
    plot_occupancy_vs_registers(occ, ax=axes[1])
    plot_occupancy_vs_shared_memory(occ, ax=axes[2])
    fig.suptitle(occ.title, fontsize="medium")
    return fig


__all__ = ["plot_occupancy", "plot_occupancy_vs_block_size", "plot_occupancy_vs_registers",
           "plot_occupancy_vs_shared_memory"]
