"""HTML and plots for benchmark results (`BenchResult`, `SweepResult`): what they need to render themselves."""
from __future__ import annotations

import base64
import io

from kernellab.errors import KernellabError
from kernellab.report import esc, fmt_cell, html_table

_METRIC_LABELS = {"ms": "median time (ms)", "tflops": "TFLOP/s", "gbps": "GB/s"}


# --- sweep ----------------------------------------------------------------------------------------------------


def sweep_plot(sweep, metric: str = "ms", ax=None):
    """Median of every function at each x, with its interquartile band; returns the Figure."""
    if metric not in _METRIC_LABELS:
        raise KernellabError(f"metric must be one of {', '.join(_METRIC_LABELS)}, got {metric!r}")
    if ax is None:
        fig, ax = new_figure((6.4, 4.0))
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
    table = html_table(cols, [[fmt_cell(row.get(c)) for c in cols] for row in rows])
    method = esc(f"{sweep.results[0].device}: {sweep.results[0].method}")
    return (f'<div class="kernellab-sweep">{table}{figure_png(sweep_plot(sweep))}'
            f'<div style="font-size:85%;color:#555">{method}</div></div>')


def bench_result_html(result) -> str:
    """One benchmark for the notebook: the numbers, speed-ups with their spread, and how they were taken."""
    rows = [(r.name, f"{r.median_ms:.4g}", f"{r.quantile(0.25):.4g}-{r.quantile(0.75):.4g}", r.reps,
             fmt_cell(r.tflops), fmt_cell(r.gbps)) for r in (result, *result.baselines)]
    table = html_table(("function", "median ms", "25%-75% ms", "reps", "TFLOP/s", "GB/s"), rows)
    speed = "".join(f"<div>speed-up {esc(s)}</div>" for s in result.speedups)
    speed += "".join(f'<div style="color:#c00"><b>not trusted, {esc(f.kind)}</b>: {esc(f.message)}</div>'
                     for f in getattr(result, "findings", ()))
    return (f'<div class="kernellab-bench">{table}{speed}'
            f'<div style="font-size:85%;color:#555">{esc(result.device)}: {esc(result.method)}</div></div>')


def new_figure(size):
    """A Figure and its Axes, not registered with pyplot: returned from a cell it shows once (pyplot's inline
    backend would show a pyplot figure a second time at the end of the cell), and nothing global is kept."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)                      # a canvas that can measure text (layout code asks it), as pyplot's does
    return fig, fig.add_subplot()


def figure_png(fig) -> str:
    """A Matplotlib figure as an <img> tag holding its PNG inline (a pyplot figure is released)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    if getattr(fig.canvas, "manager", None) is not None:     # a pyplot figure the caller gave us: release it
        import matplotlib.pyplot as plt

        plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode("ascii")}"/>'


