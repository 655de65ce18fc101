"""Benchmark pictures: a sweep's lines (like triton's `perf_report`) and the roofline with the user's kernels on it."""
from __future__ import annotations

import base64
import io
import math

import numpy as np

from kernellab.analysis.roofline import ROOF_LABELS, DeviceCeilings, datasheet_ceilings, ridge_point
from kernellab.errors import KernellabError
from kernellab.report import esc, html_table

_METRIC_LABELS = {"ms": "median time (ms)", "tflops": "TFLOP/s", "gbps": "GB/s"}


class RooflineError(KernellabError, ValueError):
    """A roofline that cannot be drawn: a result lacks flops or bytes, or no ceilings are known."""


# --- sweep ----------------------------------------------------------------------------------------------------


def sweep_plot(sweep, metric: str = "ms", ax=None):
    """Median of every function at each x, with its interquartile band; returns the Figure."""
    import matplotlib.pyplot as plt

    if metric not in _METRIC_LABELS:
        raise KernellabError(f"metric must be one of {', '.join(_METRIC_LABELS)}, got {metric!r}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
    else:
        fig = ax.figure
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in sweep.xs)
    xs = list(sweep.xs) if numeric else list(range(len(sweep.xs)))
    for name in sweep.names:
        ys = sweep.series(name, metric)
        if any(y is None for y in ys):
            raise KernellabError(f"{metric} needs {'flops' if metric == 'tflops' else 'bytes'} in the sweep")
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
        lo, hi = _band(sweep, name, metric)
        ax.fill_between(xs, lo, hi, alpha=0.2)
    if numeric and len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    values = [y for name in sweep.names for y in sweep.series(name, metric)]
    if min(values) > 0 and max(values) / min(values) >= 10:
        ax.set_yscale("log")
    if not numeric:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in sweep.xs], rotation=30, ha="right")
    ax.set_xlabel(sweep.x_name)
    ax.set_ylabel(_METRIC_LABELS[metric])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if sweep.results:
        ax.set_title(f"{sweep.results[0].device}", fontsize=10)
    return fig


def _band(sweep, name, metric):
    """Interquartile band of `metric` per x (times flip: the 75 % time is the 25 % rate)."""
    lo, hi = [], []
    for r in sweep.results:
        one = r if r.name == name else next(b for b in r.baselines if b.name == name)
        q25, q75 = one.quantile(0.25), one.quantile(0.75)
        if metric == "ms":
            lo.append(q25)
            hi.append(q75)
        else:
            work = one.flops / 1e12 if metric == "tflops" else one.bytes_moved / 1e9
            lo.append(work / (q75 * 1e-3))
            hi.append(work / (q25 * 1e-3))
    return lo, hi


def sweep_html(sweep) -> str:
    """The sweep's table and its plot, for the notebook."""
    rows = sweep.table()
    if not rows:
        return "<div>sweep: no points</div>"
    cols = list(rows[0])
    table = html_table(cols, [[_cell(row.get(c)) for c in cols] for row in rows])
    method = esc(f"{sweep.results[0].device}: {sweep.results[0].method}")
    return (f'<div class="kernellab-sweep">{table}{_figure_png(sweep_plot(sweep))}'
            f'<div style="font-size:85%;color:#555">{method}</div></div>')


def bench_result_html(result) -> str:
    """One benchmark for the notebook: the numbers, speed-ups with their spread, and how they were taken."""
    rows = [(r.name, f"{r.median_ms:.4g}", f"{r.quantile(0.25):.4g}-{r.quantile(0.75):.4g}", r.reps,
             _cell(r.tflops), _cell(r.gbps)) for r in (result, *result.baselines)]
    table = html_table(("function", "median ms", "25%-75% ms", "reps", "TFLOP/s", "GB/s"), rows)
    speed = "".join(f"<div>speed-up {esc(s)}</div>" for s in result.speedups)
    return (f'<div class="kernellab-bench">{table}{speed}'
            f'<div style="font-size:85%;color:#555">{esc(result.device)}: {esc(result.method)}</div></div>')


# --- roofline -------------------------------------------------------------------------------------------------


def roofline(results, ceilings=None, *, ax=None, datasheet: bool = True, include_baselines: bool = True,
             title: str | None = None):
    """Log-log roofline: DRAM and compute ceilings, ridge points, and each result at (FLOP/byte, TFLOP/s).

    `results`: a BenchResult, a SweepResult, or a list of them. `ceilings`: a DeviceCeilings, "datasheet",
    or None for the ceilings measured (and cached) on this machine's GPU, or the datasheet figures of the
    results' device where there is no GPU. With `datasheet`, the datasheet ceilings are drawn too, dashed.
    Hollow markers take their intensity from declared bytes, filled ones from measured DRAM bytes.
    """
    import matplotlib.pyplot as plt

    points = _points(results, include_baselines)
    device = points[0][3] if points else ""
    ceil = _resolve_ceilings(ceilings, device)
    reference = datasheet_ceilings(ceil.device) if datasheet and ceil.source != "datasheet" else None

    if ax is None:
        fig, ax = plt.subplots(figsize=(7.0, 4.6))
    else:
        fig = ax.figure
    ridges = [ridge_point(v, ceil.dram_gbps) for _, v in ceil.roofs()]
    xs_pts = [p[1] for p in points]
    x_lo = 10 ** math.floor(math.log10(min([*xs_pts, *ridges, 1.0]) / 4))
    x_hi = 10 ** math.ceil(math.log10(max([*xs_pts, *ridges]) * 4))
    grid = np.logspace(math.log10(x_lo), math.log10(x_hi), 256)

    _draw_roofs(ax, ceil, grid, style="-", alpha=1.0, label_roofs=True)
    if reference is not None:
        _draw_roofs(ax, reference, grid, style="--", alpha=0.45, label_roofs=False)

    markers = "osD^v<>ph*"
    for k, (label, x, y, _, measured, is_baseline) in enumerate(points):
        m = markers[k % len(markers)]
        color = f"C{(k + 1) % 10}"
        ax.scatter([x], [y], marker=m, s=46 if not is_baseline else 34, zorder=5,
                   facecolors=color if measured else "none", edgecolors=color, linewidths=1.5, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    peaks = [v for _, v in ceil.roofs()] + [p[2] for p in points]
    ax.set_ylim(min([*(p[2] for p in points), ceil.dram_gbps * x_lo / 1e3]) / 2, max(peaks) * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.25)
    note = f"{ceil.source} ceilings"
    if reference is not None:
        note += "; dashed: datasheet"
    if points:
        note += "; hollow: declared bytes" if any(not p[4] for p in points) else ""
        note += "; filled: measured DRAM bytes" if any(p[4] for p in points) else ""
    ax.set_title(title or f"{ceil.device} roofline\n{note}", fontsize=9)
    if points:
        ax.legend(fontsize=8, loc="lower right")
    return fig


def _draw_roofs(ax, ceil: DeviceCeilings, grid, style: str, alpha: float, label_roofs: bool) -> None:
    roofs = ceil.roofs()                      # ascending
    top = roofs[-1][1]
    mem = grid * ceil.dram_gbps / 1e3
    keep = mem <= top
    ax.plot(grid[keep], mem[keep], style, color="black", alpha=alpha, linewidth=1.4)
    for precision, peak in roofs:
        ridge = ridge_point(peak, ceil.dram_gbps)
        right = grid[grid >= ridge]
        ax.plot([ridge, *right], [peak] * (len(right) + 1), style, color="black" if label_roofs else "gray",
                alpha=alpha, linewidth=1.2)
        if label_roofs:
            ax.scatter([ridge], [peak], marker="|", s=80, color="black", zorder=4)
    if not label_roofs:
        return
    x_label = ridge_point(roofs[0][1], ceil.dram_gbps) / 20
    ax.text(x_label, x_label * ceil.dram_gbps / 1e3 * 1.6, f"DRAM {ceil.dram_gbps:,.0f} GB/s", fontsize=8,
            ha="right", va="bottom")
    # Roofs within 5 % of each other (bf16 and fp16 on most GPUs) share one label.
    groups: list[list[tuple[str, float]]] = []
    for precision, peak in roofs:
        if groups and peak <= groups[-1][0][1] * 1.05:
            groups[-1].append((precision, peak))
        else:
            groups.append([(precision, peak)])
    for group in groups:
        names = "/".join(ROOF_LABELS[p].split()[0] for p, _ in group)
        unit = " ".join(ROOF_LABELS[group[0][0]].split()[1:])
        rates = "/".join(f"{v:,.4g}" for _, v in group)
        peak = max(v for _, v in group)
        ridge = ridge_point(group[0][1], ceil.dram_gbps)
        ax.text(grid[-1], peak * 1.06, f"{names} {unit} {rates} TFLOP/s, ridge {ridge:.3g} FLOP/B",
                fontsize=7.5, ha="right", va="bottom")


def _points(results, include_baselines: bool):
    """(label, intensity, TFLOP/s, device, measured bytes, is baseline) for every result."""
    from kernellab.run.bench import BenchResult, SweepResult

    items = results if isinstance(results, (list, tuple)) else [results]
    flat = []
    for item in items:
        if isinstance(item, SweepResult):
            flat.extend((f"{r.name} {item.x_name}={x}", r) for x, r in zip(item.xs, item.results))
        elif isinstance(item, BenchResult):
            flat.append((item.name, item))
        else:
            raise RooflineError(f"roofline takes BenchResults or SweepResults, got a {type(item).__name__}")
    points, missing = [], []
    for label, r in flat:
        group = [(label, r, False)]
        if include_baselines:
            group += [(f"{b.name} ({label})" if len(flat) > 1 else b.name, b, True) for b in r.baselines]
        for lab, one, is_base in group:
            if one.flops is None or not one.bytes_moved:
                missing.append(lab)
                continue
            points.append((lab, one.intensity, one.tflops, one.device, one.bytes_source != "declared", is_base))
    if missing:
        raise RooflineError(f"{', '.join(missing)}: no flops or bytes, so no place on a roofline; pass "
                            f"bench(..., flops=..., bytes=...) (numbers per call, or callables of the arguments)")
    return points


def _resolve_ceilings(ceilings, device: str) -> DeviceCeilings:
    if isinstance(ceilings, DeviceCeilings):
        return ceilings
    if ceilings not in (None, "datasheet"):
        raise RooflineError(f"ceilings must be a DeviceCeilings, 'datasheet' or None, got {ceilings!r}")
    if ceilings is None and _gpu_usable():
        from kernellab.run.ceilings import device_ceilings

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


def _figure_png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode("ascii")}"/>'


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
