"""The roofline with the user's kernels on it (sweep plots and result HTML live in kernellab/render/bench_html.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernellab.analysis.roofline import ROOF_LABELS, DeviceCeilings, datasheet_ceilings, ridge_point
from kernellab.errors import KernellabError
from kernellab.render.bench_html import (  # noqa: F401 (public here too)
    bench_result_html, figure_png, new_figure, sweep_html, sweep_plot)
from kernellab.run.measure.bench import BenchResult, SweepResult
from kernellab.run.measure.ceilings import device_ceilings


class RooflineError(KernellabError, ValueError):
    """A roofline that cannot be drawn: a result lacks flops or bytes, or no ceilings are known."""


# --- roofline -------------------------------------------------------------------------------------------------


def roofline(results, ceilings=None, *, ax=None, datasheet: bool = True, include_baselines: bool = True,
             title: str | None = None):
    """Log-log roofline: DRAM and compute ceilings, ridge points, and each result at (FLOP/byte, TFLOP/s).

    `results`: a BenchResult, a SweepResult, or a list of them. `ceilings`: a DeviceCeilings, "datasheet",
    or None for the ceilings measured (and cached) on this machine's GPU, or the datasheet figures of the
    results' device where there is no GPU. With `datasheet`, the datasheet ceilings are drawn too, dashed.
    Hollow markers take their intensity from declared bytes, filled ones from measured DRAM bytes.
    Results without FLOPs (flops None or 0, or under one FLOP per 100 kB, e.g. a copy) have no place on a
    FLOP roofline: a note on the chart gives their GB/s instead.
    """
    placed, unplaced = _points(results, include_baselines)
    device = (placed or unplaced)[0].device if placed or unplaced else ""
    ceil = _resolve_ceilings(ceilings, device)
    reference = datasheet_ceilings(ceil.device) if datasheet and ceil.source != "datasheet" else None
    if ax is None:
        fig, ax = new_figure((7.0, 5.0))
    else:
        fig = ax.figure
    shown = [c for c in (ceil, reference) if c is not None]

    # Limits: from 1/16 FLOP/byte (or below the lowest point) to 4x the last ridge or point; from under the lowest
    # point or the DRAM roof at the left edge to above the highest roof or point, with room for labels.
    xs, ys = [p.x for p in placed], [p.y for p in placed]
    x_lo = _LOWEST_X if min(xs, default=1.0) >= _LOWEST_X * 1.25 else 2.0 ** math.floor(math.log2(min(xs) / 1.25))
    x_hi = 4 * max([*xs, *(ridge_point(v, c.dram_gbps) for c in shown for _, v in c.roofs())])
    y_lo = min([*ys, *(c.dram_gbps * x_lo / 1e3 for c in shown)]) / 2
    y_hi = 2.5 * max([*ys, *(v for c in shown for _, v in c.roofs())])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    _plain_log_ticks(ax)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="major", alpha=0.25)
    ax.grid(True, which="minor", alpha=0.08)

    layout = _Layout(ax)
    if reference is not None:
        _draw_roofs(ax, reference, layout, x_lo, x_hi, style="--", color="0.55", solid=False)
    ends = _draw_roofs(ax, ceil, layout, x_lo, x_hi, style="-", color="black", solid=True)

    markers = "osD^v<>ph*"
    for k, p in enumerate(placed):
        color = f"C{(k + 1) % 10}"
        size = 34 if p.is_baseline else 46
        ax.scatter([p.x], [p.y], marker=markers[(k + k // 10) % len(markers)], s=size, zorder=7,
                   facecolors=color if p.measured else "none", edgecolors=color, linewidths=1.5, label=p.label)
        layout.add_marker(p.x, p.y, math.sqrt(size) / 2 + 0.75)
    direct = len(placed) <= _MAX_DIRECT_LABELS
    if placed and not direct:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  ncol=2 if len(placed) > 16 else 1)            # outside, right of the axes

    _label_roofs(ax, ceil, reference, layout, x_hi)
    if unplaced:
        _note_unplaced(ax, ceil, unplaced, layout)
    if direct:
        for p in placed:
            _label_point(ax, p, ceil, layout)
    _label_dram(ax, ceil, reference, layout, ends)

    note = f"{ceil.source} ceilings"
    if reference is not None:
        note += f"; dashed: {reference.device} datasheet"
    if placed:
        note += "; hollow: declared bytes" if any(not p.measured for p in placed) else ""
        note += "; filled: measured DRAM bytes" if any(p.measured for p in placed) else ""
    ax.set_title(title or f"{ceil.device} roofline\n{note}", fontsize=9)
    return fig


# Intensities below this are a copy or a fill with a token FLOP count: they are noted, not placed.
_MIN_INTENSITY = 1e-5
_LOWEST_X = 1 / 16               # the left edge unless a point lies further left
_MAX_DIRECT_LABELS = 8           # more points than this get a legend instead of a label each
_TEXT, _MARKER, _LINE, _SOFT_LINE, _OUTSIDE = 100.0, 100.0, 50.0, 3.0, 1000.0   # costs of a label hitting...
_ALONG = 3.0                     # ...and how much more a dashed roof costs (a label would hide a stretch of it)


@dataclass(frozen=True)
class _Point:
    label: str
    x: float                     # FLOP/byte
    y: float                     # TFLOP/s
    gbps: float
    device: str
    measured: bool               # bytes measured (filled marker) rather than declared (hollow)
    is_baseline: bool


@dataclass(frozen=True)
class _Unplaced:
    label: str
    gbps: float
    device: str
    reason: str                  # why it is not on the FLOP roofline


def _points(results, include_baselines: bool) -> tuple[list[_Point], list[_Unplaced]]:
    """Every result placed at (intensity, TFLOP/s), and those without FLOPs to note by their GB/s."""
    items = results if isinstance(results, (list, tuple)) else [results]
    flat = []
    for item in items:
        if isinstance(item, SweepResult):
            flat.extend((f"{r.name} {item.x_name}={x}", r) for x, r in zip(item.xs, item.results))
        elif isinstance(item, BenchResult):
            flat.append((item.name, item))
        else:
            raise RooflineError(f"roofline takes BenchResults or SweepResults, got a {type(item).__name__}")
    placed, unplaced, missing = [], [], []
    for label, r in flat:
        group = [(label, r, False)]
        if include_baselines:
            group += [(f"{b.name} ({label})" if len(flat) > 1 else b.name, b, True) for b in r.baselines]
        for lab, one, is_base in group:
            if not one.bytes_moved:
                missing.append(f"{lab}: no flops or bytes" if one.flops is None else f"{lab}: flops but no bytes")
            elif not one.flops or one.intensity < _MIN_INTENSITY:
                reason = ("no FLOPs declared" if one.flops is None else "0 FLOPs" if not one.flops
                          else f"{one.intensity:.2g} FLOP/byte, as good as none")
                unplaced.append(_Unplaced(lab, one.gbps, one.device, reason))
            else:
                placed.append(_Point(lab, one.intensity, one.tflops, one.gbps, one.device,
                                     one.bytes_source != "declared", is_base))
    if missing:
        raise RooflineError(f"{'; '.join(missing)}, so no place on a roofline; pass bench(..., flops=..., "
                            f"bytes=...) (numbers per call, or callables of the arguments)")
    return placed, unplaced


def _draw_roofs(ax, ceil: DeviceCeilings, layout, x_lo: float, x_hi: float, style: str, color: str,
                solid: bool) -> dict:
    """The DRAM slope up to the highest ridge and each compute roof from its ridge on; returns their ends."""
    roofs = ceil.roofs()                      # ascending
    top_ridge = ridge_point(roofs[-1][1], ceil.dram_gbps)
    dram = ((x_lo, ceil.dram_gbps * x_lo / 1e3), (top_ridge, roofs[-1][1]))
    ax.plot(*zip(*dram), style, color=color, linewidth=1.4 if solid else 1.0, zorder=3 if solid else 2)
    layout.add_segment(*dram, _LINE if solid else _SOFT_LINE)
    ends = {"dram": dram}
    for precision, peak in roofs:
        ridge = ridge_point(peak, ceil.dram_gbps)
        ends[precision] = ((ridge, peak), (x_hi, peak))
        ax.plot([ridge, x_hi], [peak, peak], style, color=color, linewidth=1.2 if solid else 1.0,
                zorder=3 if solid else 2)
        layout.add_roof(*ends[precision], _LINE if solid else _SOFT_LINE)
        if solid:
            ax.scatter([ridge], [peak], marker="|", s=40, color="black", zorder=4)
            layout.add_marker(ridge, peak, 1.0, 3.0)
    return ends


def _label_roofs(ax, ceil: DeviceCeilings, reference, layout, x_hi: float) -> None:
    """Each roof's label level with it, left of its ridge (nothing can lie above the DRAM slope), else where clear."""
    for group in reversed(_roof_groups(ceil)):   # the highest roof first: it has the least room
        names = "/".join(ROOF_LABELS[p].split()[0] for p, _ in group)
        unit = " ".join(ROOF_LABELS[group[0][0]].split()[1:])
        rates = "/".join(f"{v:,.4g}" for _, v in group)
        ridges = "/".join(dict.fromkeys(f"{ridge_point(v, ceil.dram_gbps):.3g}" for _, v in group))
        hi, lo = group[0][1], group[-1][1]
        ridge = ridge_point(hi, ceil.dram_gbps)
        roof = ax.annotate(f"{names} {unit} {rates} TFLOP/s, ridge {ridges} FLOP/B", xy=(x_hi, hi), xytext=(0, 0),
                           textcoords="offset points", fontsize=7.5, zorder=6,
                           bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.75))
        corner = hi * 1e3 / max(c.dram_gbps for c in (ceil, reference) if c is not None)   # left of both slopes
        mid = math.sqrt(hi * lo)
        layout.place(roof, [
            _anchor_at(corner, mid, (-8, 0), "right", "center"),     # level with the roof, left of where it starts
            _anchor_at(corner, mid, (-12, 0), "right", "center"),
            _anchor_at(x_hi, hi, (-4, 4), "right", "bottom"),        # above, at the right edge
            _anchor_at(x_hi, lo, (-4, -4), "right", "top"),          # below, at the right edge
            _anchor_at(ridge, hi, (8, 4), "left", "bottom"),         # above, from the ridge
            _anchor_at(ridge, lo, (8, -4), "left", "top"),           # below, from the ridge
        ], pad=0.5)


def _label_dram(ax, ceil: DeviceCeilings, reference, layout, ends: dict) -> None:
    """The DRAM bandwidth written along its slope, near the left where it is clear."""
    (x0, y0), (x1, y1) = ends["dram"]
    (p0, p1) = (layout.display(x0, y0), layout.display(x1, y1))
    angle = math.degrees(math.atan2(p1[1] - p0[1], p1[0] - p0[0]))
    normal = (-math.sin(math.radians(angle)), math.cos(math.radians(angle)))
    text = f"DRAM {ceil.dram_gbps:,.0f} GB/s"
    if reference is not None:
        text += f" (datasheet {reference.dram_gbps:,.0f})"
    dram = ax.annotate(text, xy=(x0, y0), xytext=(0, 0), textcoords="offset points", fontsize=8, rotation=angle,
                       rotation_mode="anchor", ha="left", va="bottom", zorder=6,
                       bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.75))
    x_first = ridge_point(ceil.roofs()[0][1], ceil.dram_gbps)
    anchors = [x0 * (x_first / x0) ** (k / 16) for k in range(1, 14)]   # along the slope, from the left
    layout.place(dram, [_anchor_at(x, x * ceil.dram_gbps / 1e3, (lift * normal[0], lift * normal[1]), "left", va)
                        for lift, va in ((3, "bottom"), (-3, "top"), (9, "bottom"), (-9, "top")) for x in anchors])


def _roof_groups(ceil: DeviceCeilings) -> list[list[tuple[str, float]]]:
    """The roofs, lowest first, those within 5 % of each other (bf16, fp16) in one group, highest first, one label."""
    groups: list[list[tuple[str, float]]] = []
    for precision, peak in ceil.roofs():
        if groups and peak <= groups[-1][0][1] * 1.05:
            groups[-1].append((precision, peak))
        else:
            groups.append([(precision, peak)])
    return [sorted(g, key=lambda pv: -pv[1]) for g in groups]


def _note_unplaced(ax, ceil: DeviceCeilings, unplaced: list[_Unplaced], layout) -> None:
    """A small boxed note: each result without FLOPs, by its GB/s and share of the DRAM roof."""
    lines = [f"{u.label}: {u.gbps:,.0f} GB/s, {100 * u.gbps / ceil.dram_gbps:.0f}% of DRAM "
             f"({u.reason}; not placed)" for u in unplaced]
    note = ax.annotate("\n".join(lines), xy=(0, 0), xycoords="axes fraction", xytext=(0, 0),
                       textcoords="offset points", fontsize=7, zorder=8,
                       bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.7", alpha=0.9))
    layout.place(note, [
        _anchor_at(1, 0, (-6, 6), "right", "bottom"),
        _anchor_at(0, 1, (6, -6), "left", "top"),
        _anchor_at(0.5, 0, (0, 6), "center", "bottom"),
        _anchor_at(1, 1, (-6, -6), "right", "top"),
    ], pad=3.0)


def _label_point(ax, p: _Point, ceil: DeviceCeilings, layout) -> None:
    """The result's name and rate next to its marker, on whichever side is free."""
    rate = f"{p.y:.3g} TFLOP/s"
    if p.x < max(ridge_point(v, ceil.dram_gbps) for _, v in ceil.roofs()):
        rate += f", {p.gbps:,.0f} GB/s"
    sides = [((1, 0), "left", "center"), ((0.8, -0.8), "left", "top"), ((0.8, 0.8), "left", "bottom"),
             ((-1, 0), "right", "center"), ((-0.8, 0.8), "right", "bottom"), ((-0.8, -0.8), "right", "top"),
             ((0, 1), "center", "bottom"), ((0, -1), "center", "top")]
    spots = [((d * dx, d * dy), ha, va) for d in (7, 16) for (dx, dy), ha, va in sides]
    box = dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.75)
    text = ax.annotate(f"{p.label} ({rate})", xy=(p.x, p.y), xytext=(0, 0), textcoords="offset points",
                       fontsize=7.5, zorder=6, bbox=box)
    k = layout.place(text, [_anchor_at(p.x, p.y, *spot) for spot in spots],
                     extra=[0.0] * len(sides) + [5.0] * len(sides))   # near, even across dashed lines
    if k >= len(sides):                       # away from its marker: a thin leader line says whose label it is
        offset, ha, va = spots[k]
        text.remove()
        text = ax.annotate(f"{p.label} ({rate})", xy=(p.x, p.y), xytext=offset, textcoords="offset points",
                           ha=ha, va=va, fontsize=7.5, zorder=6, bbox=box,
                           arrowprops=dict(arrowstyle="-", color="0.45", linewidth=0.6, shrinkA=1, shrinkB=4))
        layout.add_leader(text, p.x, p.y)


def _anchor_at(x, y, offset=None, ha=None, va=None):
    """A candidate spot for an annotation: its anchor, offset in points and alignment (None: unchanged)."""
    def move(text):
        text.xy = (x, y)
        if offset is not None:
            text.xyann = offset
        if ha is not None:
            text.set_horizontalalignment(ha)
        if va is not None:
            text.set_verticalalignment(va)
    return move


class _Layout:
    """Greedy labelling in display space: each label takes its first clear spot (or its cheapest) and then blocks it."""

    def __init__(self, ax):
        self.ax = ax
        self.renderer = _renderer(ax.figure)
        self.pt = ax.figure.dpi / 72          # pixels per point
        f = ax.get_window_extent(self.renderer)
        self.frame = (f.x0, f.y0, f.x1, f.y1)
        self.boxes: list[tuple[tuple[float, float, float, float], float]] = []
        self.segments: list[tuple[tuple[float, float], tuple[float, float], float]] = []

    def display(self, x, y) -> tuple[float, float]:
        """Data coordinates to pixels."""
        return tuple(self.ax.transData.transform((x, y)))

    def add_marker(self, x, y, half_w_pts: float, half_h_pts: float | None = None) -> None:
        cx, cy = self.display(x, y)
        w, h = half_w_pts * self.pt, (half_w_pts if half_h_pts is None else half_h_pts) * self.pt
        self.boxes.append(((cx - w, cy - h, cx + w, cy + h), _MARKER))

    def add_segment(self, xy0, xy1, cost: float) -> None:
        self.segments.append((self.display(*xy0), self.display(*xy1), cost))

    def add_roof(self, xy0, xy1, cost: float) -> None:
        """A horizontal line: a label lying along a dashed one would hide a long stretch, so that costs more."""
        self.add_segment(xy0, xy1, cost if cost >= _LINE else cost * _ALONG)

    def add_leader(self, text, x, y) -> None:
        """The line from a label's nearest corner to its point: other labels keep off it."""
        x1, y1 = self.display(x, y)
        b = text.get_window_extent(self.renderer)
        x0, y0 = min(max(x1, b.x0), b.x1), min(max(y1, b.y0), b.y1)
        self.segments.append(((x0, y0), (x1, y1), _LINE))

    def extent(self, text) -> list[tuple[float, float, float, float]]:
        """The boxes a label covers: its bounding box, or for a rotated one, squares along its centre line."""
        angle = text.get_rotation()
        bb = text.get_window_extent(self.renderer)
        if angle % 180 == 0:
            return [(bb.x0, bb.y0, bb.x1, bb.y1)]
        text.set_rotation(0)
        flat = text.get_window_extent(self.renderer)
        text.set_rotation(angle)
        w, h = flat.width, flat.height
        u = (math.cos(math.radians(angle)), math.sin(math.radians(angle)))
        n = (-u[1], u[0])
        x0, y0 = self.display(*text.xy)       # rotated labels are anchored in data, offset in points
        x0, y0 = x0 + text.xyann[0] * self.pt, y0 + text.xyann[1] * self.pt
        r = h / 2 / (abs(u[0]) + abs(u[1]))  # half the side of a square that stays inside the text's band
        dy = {"bottom": h / 2, "top": -h / 2}.get(text.get_verticalalignment(), 0.0)
        out = []
        for k in range(math.ceil(w / r) + 1):
            t = min(w, k * r)
            cx, cy = x0 + u[0] * t + n[0] * dy, y0 + u[1] * t + n[1] * dy
            out.append((cx - r, cy - r, cx + r, cy + r))
        return out

    def cost(self, boxes, pad: float) -> float:
        """What the boxes, grown by `pad` points, hit: the frame's edge, labels, markers, lines."""
        e = pad * self.pt
        boxes = [(b[0] - e, b[1] - e, b[2] + e, b[3] + e) for b in boxes]
        f = self.frame
        total = _OUTSIDE if any(b[0] < f[0] or b[1] < f[1] or b[2] > f[2] or b[3] > f[3] for b in boxes) else 0.0
        total += sum(c for o, c in self.boxes if any(_boxes_meet(b, o) for b in boxes))
        total += sum(c for p0, p1, c in self.segments if any(_segment_meets_box(p0, p1, b) for b in boxes))
        return total

    def place(self, text, candidates, pad: float = 1.0, extra=None) -> int:
        """Moves `text` to the cheapest of `candidates` (callables that move it; `extra[k]` added); returns which."""
        best = None
        for k, move in enumerate(candidates):
            move(text)
            c = self.cost(self.extent(text), pad) + (extra[k] if extra else 0.0)
            if best is None or c < best[0]:
                best = (c, k)
            if c == 0:
                break
        candidates[best[1]](text)
        self.boxes.extend((b, _TEXT) for b in self.extent(text))
        return best[1]


def _boxes_meet(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _segment_meets_box(p0, p1, box) -> bool:
    """Whether the segment p0-p1 passes through the box (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = p0, p1
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def _renderer(fig):
    get = getattr(fig.canvas, "get_renderer", None)
    return get() if get is not None else fig._get_renderer()


def _plain_log_ticks(ax) -> None:
    """Decade ticks written as plain numbers (0.1, 1, 10, 1,000) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def plain(v, _):
        return f"{v:,.0f}" if v >= 1 else f"{v:g}"
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(plain))
        axis.set_minor_formatter(NullFormatter())


def _resolve_ceilings(ceilings, device: str) -> DeviceCeilings:
    if isinstance(ceilings, DeviceCeilings):
        return ceilings
    if ceilings not in (None, "datasheet"):
        raise RooflineError(f"ceilings must be a DeviceCeilings, 'datasheet' or None, got {ceilings!r}")
    if ceilings is None and _gpu_usable():
        return device_ceilings()
    found = datasheet_ceilings(device) if device else None
    if found is None:
        raise RooflineError(f"no datasheet ceilings for {device or 'an unnamed device'!r} and no GPU to measure "
                            f"them; pass ceilings=kernellab.analysis.roofline.DATASHEETS[...] or a DeviceCeilings")
    return found


def _gpu_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
