"""An autotune's picture: median time against the configuration entry that matters, one point per timed row."""
from __future__ import annotations

import math

from kernellab.errors import KernellabError
from kernellab.render.bench_html import new_figure


def autotune_plot(result, param: str | None = None, *, by: str | None = None, ax=None):
    """Median time of each timed configuration against `param` (default: the entry that explains most of the
    variance, `result.parameter`), coloured by `by` (default: the next one); interquartile bars, the best starred,
    the baselines' medians as dashed lines. Returns the Figure."""
    import matplotlib

    timed = [r for r in result.rows if r.timed]
    if not timed:
        raise KernellabError(f"nothing to plot: no configuration of {result.kernel} was timed ({result.headline()})")
    ranked = [k for k, _ in result.parameters()]
    keys = list(dict.fromkeys(k for r in timed for k in r.config))
    param = param or (ranked[0] if ranked else keys[0] if keys else None)
    if param is None or param not in keys:
        raise KernellabError(f"{param!r} is not an entry of the configurations; they have {', '.join(keys)}")
    if by is None:
        by = next((k for k in ranked if k != param), None)
    elif by not in keys:
        raise KernellabError(f"by={by!r} is not an entry of the configurations; they have {', '.join(keys)}")
    if ax is None:
        fig, ax = new_figure((6.4, 4.0))
    else:
        fig = ax.figure

    values = sorted({r.config.get(param) for r in timed}, key=_order)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    pos = {v: (v if numeric else i) for i, v in enumerate(values)}
    groups: dict = {}
    for r in timed:
        groups.setdefault(r.config.get(by) if by else None, []).append(r)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    n = max(len(groups), 1)
    width = _spacing(list(pos.values())) * 0.5
    for g, (value, rows) in enumerate(sorted(groups.items(), key=lambda kv: _order(kv[0]))):
        offset = (g - (n - 1) / 2) * width / n
        xs = [_shift(pos[r.config.get(param)], offset, numeric) for r in rows]
        ys = [r.median_ms for r in rows]
        lo = [r.median_ms - r.bench.quantile(0.25) if r.bench is not None else 0 for r in rows]
        hi = [r.bench.quantile(0.75) - r.median_ms if r.bench is not None else 0 for r in rows]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", markersize=4, capsize=2, color=colors[g % len(colors)],
                    label=f"{by}={value}" if by else None)
    best = result.best
    if best is not None:
        ax.scatter([pos[best.row.config.get(param)]], [best.row.median_ms], marker="*", s=160, color="gold",
                   edgecolor="black", zorder=5, label=f"best: {best.row.label}")
    for j, name in enumerate(result.baselines):
        ms = [dict(r.baseline_ms).get(name) for r in timed]
        ms = [m for m in ms if m is not None]
        if ms:
            m = sorted(ms)[len(ms) // 2]
            ax.axhline(m, linestyle="--", color="gray", linewidth=1)
            ax.annotate(f"{name} {m:.4g} ms", (0.01, m), xycoords=("axes fraction", "data"), fontsize=8,
                        color="gray", va="bottom")
    if numeric and len(values) > 1 and min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(pos.values()))
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()
    ys = [r.median_ms for r in timed]
    if min(ys) > 0 and max(ys) / min(ys) >= 10:
        ax.set_yscale("log")
    ax.set_xlabel(param)
    ax.set_ylabel("median time (ms)")
    ax.grid(True, alpha=0.3)
    skipped = len(result.rows) - len(timed)
    where = ", ".join(dict.fromkeys(r.device for r in timed if r.device))
    ax.set_title(f"{result.kernel} on {where or 'no GPU'}" + (f" ({skipped} not timed)" if skipped else ""),
                 fontsize=10)
    ax.legend(fontsize=8)
    return fig


def _order(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _spacing(xs: list) -> float:
    xs = sorted(set(xs))
    if len(xs) < 2:
        return 1.0
    return min(b - a for a, b in zip(xs, xs[1:])) if not all(x > 0 for x in xs) else 1.0


def _shift(x, offset: float, numeric: bool):
    """Side by side within one x: additive on a category axis, multiplicative (so even on log2) on a number axis."""
    if not numeric:
        return x + offset
    return x * math.pow(2.0, offset) if x > 0 else x + offset
