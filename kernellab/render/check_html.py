"""HTML for a `CheckReport`: the verdict, yours vs reference at the worst elements, and an error heatmap."""
from __future__ import annotations

import base64
import io
import math

import numpy as np

from kernellab.report import Raw, esc, html_table

_PASS, _FAIL = "#1a7f37", "#cf222e"
# The heatmap shows log10(error / tolerance) from 1e-3 (green) through 1 (yellow, at tolerance) to 1e3 (red).
_LOG_RANGE = (-3.0, 3.0)
_CMAP = "RdYlGn_r"
_MAX_SIDE_PX = 480


def error_heatmap_png(error_map) -> bytes:
    """A PNG of error/tolerance on a log scale, one pixel per heatmap cell (scale it up with CSS)."""
    from matplotlib import image

    grid = np.asarray(error_map, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logs = np.log10(np.where(np.isfinite(grid), np.maximum(grid, 10.0 ** _LOG_RANGE[0]), 10.0 ** _LOG_RANGE[1]))
    buf = io.BytesIO()
    image.imsave(buf, np.clip(logs, *_LOG_RANGE), cmap=_CMAP, vmin=_LOG_RANGE[0], vmax=_LOG_RANGE[1], format="png")
    return buf.getvalue()


def _heatmap_html(report) -> str:
    grid = np.asarray(report.error_map)
    if grid.size == 0:
        return ""
    rows, cols = grid.shape
    scale = max(1, min(_MAX_SIDE_PX // max(rows, cols), 24))
    width, height = cols * scale, max(rows * scale, 16)
    if rows == 1:                          # a 1-D output: a strip wide enough to see
        width, height = min(_MAX_SIDE_PX, max(cols * 4, 160)), 24
    png = base64.b64encode(error_heatmap_png(grid)).decode("ascii")
    shape = report.shape or ()
    if len(shape) > 2:
        layout = f"shape {shape} as {math.prod(shape[:-1]):,} flattened rows x {shape[-1]:,}"
    else:
        layout = f"shape {shape}"
    full = (1, max(1, math.prod(shape))) if len(shape) < 2 else (math.prod(shape[:-1]), shape[-1])
    pooled = ""
    if (rows, cols) != tuple(full):
        pooled = f", each cell the worst of about {math.ceil(full[0] / rows)} x {math.ceil(full[1] / cols)} elements"
    caption = (f"where the errors sit: error / tolerance, {layout}{pooled}; "
               f"green is well within, yellow at the tolerance, red out of it")
    return (f'<div style="margin-top:6px"><img alt="error heatmap" src="data:image/png;base64,{png}" '
            f'style="width:{width}px;height:{height}px;image-rendering:pixelated;border:1px solid #ccc"/>'
            f'<div style="font-size:85%;color:#555">{esc(caption)}</div></div>')


def _worst_table(report) -> str:
    if not report.worst_values:
        return ""
    rows = []
    for idx, yours, ref, ratio in report.worst_values:
        err = abs(yours - ref) if math.isfinite(yours) and math.isfinite(ref) else float("inf")
        if yours == ref or (math.isnan(yours) and math.isnan(ref)):
            err = 0.0
        mark = Raw(f'<span style="color:{_FAIL}">{_num(ratio)}</span>', _num(ratio)) if ratio > 1 else _num(ratio)
        rows.append((str(tuple(idx)), _num(yours), _num(ref), _num(err), mark))
    return html_table(("index", "yours", "reference", "abs error", "error / tolerance"), rows,
                      caption="largest errors, measured against the tolerance")


def check_report_html(report) -> str:
    """The notebook view of a `CheckReport`."""
    color = _PASS if report.passed else _FAIL
    verdict = "check passed" if report.passed else "check failed"
    parts = [f'<div class="kernellab-check" style="font-family:sans-serif;font-size:13px">',
             f'<div><b style="color:{color}">{verdict}</b>: {esc(report.message)}</div>']
    if report.output_count:
        parts.append(f"<div>max abs error {_num(report.max_abs_error)}, max rel error {_num(report.max_rel_error)}, "
                     f"{report.trials} trial{'s' if report.trials != 1 else ''}</div>")
        parts.append(f"<div>tolerance: {esc(report.tolerance)}</div>")
        if report.reference_precision:
            parts.append(f"<div>reference computed in {esc(report.reference_precision)}</div>")
        if getattr(report, "reference_note", None):
            parts.append(f'<div style="color:#9a6700">note: {esc(report.reference_note)}</div>')
    for f in getattr(report, "findings", ()):
        parts.append(f'<div style="color:{_FAIL}"><b>{esc(f.kind)}</b>: {esc(f.message)}</div>')
    if report.mutated_inputs:
        parts.append(f"<div>changed inputs: {esc(', '.join(report.mutated_inputs))}</div>")
    if report.exception:
        parts.append(f"<div><code>{esc(report.exception)}</code></div>")
        if report.traceback:
            parts.append(f"<details><summary>traceback</summary><pre>{esc(report.traceback)}</pre></details>")
    if report.reproduce:
        parts.append(f"<div>reproduce: <code>{esc(report.reproduce)}</code></div>")
    if not report.passed or report.max_abs_error > 0:
        parts.append(_worst_table(report))
    if report.error_map is not None:
        parts.append(_heatmap_html(report))
    parts.append("</div>")
    return "".join(parts)


def _num(v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.6g}"
