"""An occupancy explorer for notebooks: sliders for block size, registers and shared memory, live numbers and graphs.

The numbers and the limiter follow every slider move (one occupancy() call, microseconds). The graphs are
rendered to PNG into an ipywidgets.Image (any matplotlib backend, and headless tests work); a render takes about
0.2 s, so inside a running kernel it is debounced, as in the ipywidgets "Widget Events" docs: it happens once the
slider has rested for `debounce_s`. Without an event loop (scripts, tests) it happens at once.
"""
from __future__ import annotations

import asyncio
import io
import math

import ipywidgets as widgets

from kernellab.analysis.arch import ARCHS, DEFAULT_ARCH, get_arch
from kernellab.analysis.occupancy import Occupancy, occupancy
from kernellab.notebook.occupancy_plots import plot_occupancy

# Dropdown values are never None: ipywidgets shows a None value as an empty (blank) dropdown.
DEFAULT_CARVEOUT = "default"
_CARVEOUTS = [("default", DEFAULT_CARVEOUT), ("0% (max L1)", 0), ("25%", 25), ("50%", 50), ("75%", 75),
              ("100% (max shared)", 100)]


class OccupancyExplorer(widgets.VBox):
    """The explorer: sliders on top, the verdict and its reasons, then the three graphs; `result` is the current Occupancy."""

    def __init__(self, block_size=256, registers=32, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None, dpi=72,
                 debounce_s=0.15, max_threads: int | None = None):
        spec = get_arch(arch)
        self._max_threads = max_threads          # a kernel's max_threads_per_block, when explored from one
        self._dpi = dpi
        self._debounce_s = debounce_s
        self._pending = None  # the scheduled graph render, if any
        self._rescaling = False
        style = {"description_width": "150px"}
        layout = widgets.Layout(width="560px")
        self.arch_dropdown = widgets.Dropdown(options=list(ARCHS), value=spec.name, description="architecture",
                                              style=style)
        self.carveout_dropdown = widgets.Dropdown(options=_CARVEOUTS,
                                                  value=DEFAULT_CARVEOUT if carveout is None else carveout,
                                                  description="smem carveout", style=style)
        warp = spec.warp_size                      # blocks are granted in whole warps: the slider moves by one
        self.block_size_slider = widgets.IntSlider(value=block_size, min=warp, max=self._block_max(spec), step=warp,
                                                   description="threads/block", style=style, layout=layout)
        self.registers_slider = widgets.IntSlider(value=registers, min=0, max=spec.max_registers_per_thread,
                                                  description="registers/thread", style=style, layout=layout)
        # The shared memory a block declares (static + dynamic: what ptxas and the kernel's card report), not what
        # it is allocated (that, rounded up to the allocation unit with the system's reservation, is in the
        # verdict's reasons). The slider's grid holds the kernel's own figure: a slider snaps to min + k * step.
        self.shared_slider = widgets.IntSlider(value=shared_bytes, min=0,
                                               max=spec.shared_memory_per_block_optin_bytes,
                                               step=_shared_step(spec, shared_bytes),
                                               description="shared B/block declared", style=style, layout=layout)
        self.summary = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.result: Occupancy = occupancy(block_size, registers, shared_bytes, spec, carveout=carveout)
        for w in (self.block_size_slider, self.registers_slider, self.shared_slider, self.carveout_dropdown):
            w.observe(self._on_change, names="value")
        self.arch_dropdown.observe(self._on_arch, names="value")
        super().__init__([widgets.HBox([self.arch_dropdown, self.carveout_dropdown]), self.block_size_slider,
                          self.registers_slider, self.shared_slider, self.summary, self.image])
        self.summary.value = self.result._repr_html_()
        self._render_graphs()

    @property
    def carveout(self) -> int | None:
        """The carveout picked: a percentage, or None for the driver's default."""
        value = self.carveout_dropdown.value
        return None if value == DEFAULT_CARVEOUT else value

    def _block_max(self, spec) -> int:
        """The largest block: the architecture's, or the kernel's max_threads_per_block when smaller."""
        limit = spec.max_threads_per_block
        return limit if self._max_threads is None else min(limit, self._max_threads)

    def _on_arch(self, change):
        """Rescale the sliders to the new architecture's limits, then recompute."""
        spec = get_arch(change["new"])
        self._rescaling = True  # clamping a slider's value below must not redraw for an arch it doesn't fit yet
        try:
            self.block_size_slider.max = self._block_max(spec)
            self.registers_slider.max = spec.max_registers_per_thread
            self.shared_slider.step = _shared_step(spec, self.shared_slider.value)
            self.shared_slider.max = spec.shared_memory_per_block_optin_bytes  # clamps the value if it was larger
        finally:
            self._rescaling = False
        self._on_change(None)

    def _on_change(self, change):
        if self._rescaling:
            return
        self.result = occupancy(self.block_size_slider.value, self.registers_slider.value, self.shared_slider.value,
                                self.arch_dropdown.value, carveout=self.carveout)
        self.summary.value = self.result._repr_html_()
        self._schedule_graphs()

    def _schedule_graphs(self):
        """Render the graphs once the sliders rest (debounced) inside a running event loop, else now."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._debounce_s <= 0:
            self._render_graphs()
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self._debounce_s, self._render_graphs)

    def _render_graphs(self):
        self._pending = None
        fig = plot_occupancy(self.result)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=self._dpi)
        self.image.value = buf.getvalue()


def _shared_step(spec, shared_bytes: int) -> int:
    """The shared slider's step: the allocation unit, or a divisor of it on which `shared_bytes` lies (1032 B with
    128 B units: 8), so that the slider shows the kernel's 1032 B rather than snapping to 1024."""
    unit = spec.shared_memory_allocation_unit_bytes
    return math.gcd(unit, int(shared_bytes)) or unit


def occupancy_explorer(block_size=256, registers=32, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None) -> OccupancyExplorer:
    """Sliders for block size, registers and shared memory with the occupancy, its limiter and graphs updating live.

    The first argument may instead be a kernel (anything with `.resources.registers`, `.resources.shared_bytes`
    and `.resources.arch`): its registers, static shared memory and architecture are the starting point, the block
    size starts where its card shows occupancy (launch bounds or best block; else 256), and the block slider stops
    at its max_threads_per_block. The block slider moves in whole warps.
    """
    res = getattr(block_size, "resources", None)
    max_threads = None
    if res is not None:
        kernel = block_size
        registers, shared_bytes, arch = res.registers, res.shared_bytes, res.arch
        max_threads = getattr(res, "max_threads_per_block", None)
        card = getattr(kernel, "card_block_size", None)
        block_size = card()[0] if card is not None else min(256, max_threads or 256)
    return OccupancyExplorer(block_size, registers, shared_bytes, arch, carveout=carveout, max_threads=max_threads)


__all__ = ["OccupancyExplorer", "occupancy_explorer"]
