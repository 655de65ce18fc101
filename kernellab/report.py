"""Small shared helpers for rich reprs: HTML escaping, tables, the report MIME bundle. No dependencies."""
from __future__ import annotations

import html
import json

REPORT_MIME = "application/vnd.kernellab.report+json"

STYLE = ("font-family: var(--jp-code-font-family, monospace); font-size: 12px; border-collapse: collapse; "
         "margin: 2px 0")


def esc(x) -> str:
    """HTML-escape str(x)."""
    return html.escape(str(x))


def fmt_cell(v) -> str:
    """A table cell: '-' for None, 4 significant digits for floats."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def html_table(headers, rows, *, caption: str | None = None) -> str:
    """A compact HTML table; cells are escaped unless wrapped in Raw."""
    cell = "padding: 1px 8px; text-align: right; border-bottom: 1px solid #ddd"
    head = "".join(f"<th style='{cell}; text-align: left'>{esc(h)}</th>" if i == 0 else f"<th style='{cell}'>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        tds = []
        for i, v in enumerate(row):
            content = v.html if isinstance(v, Raw) else esc(v)
            align = "left" if i == 0 else "right"
            tds.append(f"<td style='{cell}; text-align: {align}'>{content}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    cap = f"<caption style='text-align: left; font-weight: bold'>{esc(caption)}</caption>" if caption else ""
    return f"<table style='{STYLE}'>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def text_table(headers, rows) -> str:
    """A fixed-width text table."""
    cells = [[str(h) for h in headers]] + [[v.text if isinstance(v, Raw) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for j, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Raw:
    """A table cell given as trusted HTML (with a text fallback)."""

    def __init__(self, html_text: str, text: str):
        self.html, self.text = html_text, text


def mimebundle(obj, include=None, exclude=None) -> dict:
    """text/plain, text/html and the kernellab report JSON for an object with to_json() and _repr_html_()."""
    data = {"text/plain": str(obj), "text/html": obj._repr_html_(), REPORT_MIME: json.loads(json.dumps(obj.to_json(), default=str))}
    if include:
        data = {k: v for k, v in data.items() if k in include}
    if exclude:
        data = {k: v for k, v in data.items() if k not in exclude}
    return data
