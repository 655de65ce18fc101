"""HTML for a `SourceView`: the source on the left with its own line numbers, the SASS of each line on the right."""
from __future__ import annotations

from kernellab.report import esc

# Colours per instruction class (the same class names as kernellab.compile.sass_lines.CLASSES).
_CLASS_COLOR = {"global_loads": "#0550ae", "global_stores": "#0550ae", "shared_loads": "#8250df",
                "shared_stores": "#8250df", "local_loads": "#cf222e", "local_stores": "#cf222e", "ffma": "#1a7f37",
                "mma": "#1a7f37", "barriers": "#9a6700", "branches": "#6e7781"}
_MONO = "font-family: var(--jp-code-font-family, monospace); font-size: 12px"
_CELL = "padding: 0 8px; vertical-align: top; border-bottom: 1px solid #eee"


def _sass_html(sass, instruction_class) -> str:
    out = []
    for ins in sass:
        cls = instruction_class(ins)
        style = f" style='color:{_CLASS_COLOR[cls]}'" if cls else ""
        out.append(f"<div{style}>{esc(ins)}</div>")
    return "".join(out)


def _counts_html(counts, classes) -> str:
    chips = [f"<span style='border:1px solid #ccc;border-radius:8px;padding:0 5px;margin-right:3px;"
             f"color:{_CLASS_COLOR[k]}'>{v} {esc(classes[k][0])}</span>" for k, v in counts.items() if v]
    return f"<div style='margin-bottom:2px'>{''.join(chips)}</div>" if chips else ""


def _profile_cells(p) -> str:
    if p is None:
        return f"<td style='{_CELL}'></td>" * 4
    stalls = ", ".join(f"{esc(name)} {n:,}" for name, n in p.stalls[:3])
    excess = p.bank_conflict_wavefronts
    bank = f"{excess:,} ({p.conflict_ways:g}-way)" if excess else ("0" if p.shared_wavefronts else "")
    gbytes = f"{p.global_bytes:,}" if p.global_sectors else ""
    return (f"<td style='{_CELL}; text-align:right'>{p.instructions_executed:,}</td>"
            f"<td style='{_CELL}; text-align:left'>{p.stall_samples:,}"
            f"{'<br><small>' + stalls + '</small>' if stalls else ''}</td>"
            f"<td style='{_CELL}; text-align:right'>{gbytes}</td>"
            f"<td style='{_CELL}; text-align:right{';color:#cf222e' if excess else ''}'>{bank}</td>")


def source_view_html(view) -> str:
    """The notebook view of a `SourceView`: a two-column table (source | SASS), Nsight Compute's columns if profiled."""
    classes, instruction_class = view.classes, view.classify
    head = [f"<th style='{_CELL}; text-align:right'>line</th>", f"<th style='{_CELL}; text-align:left'>source</th>",
            f"<th style='{_CELL}; text-align:left'>SASS</th>"]
    if view.profiled:
        head += [f"<th style='{_CELL}'>{h}</th>" for h in
                 ("executed (warp instr.)", "stall samples (top reasons)", "global bytes (L2 sectors x 32)",
                  "bank-conflict wavefronts")]
    body = []
    for r in view.rows:
        ptx = ""
        if r.ptx:
            ptx = (f"<details><summary style='color:#6e7781'>PTX ({len(r.ptx)})</summary>"
                   f"<div style='color:#6e7781'>{''.join(f'<div>{esc(p)}</div>' for p in r.ptx)}</div></details>")
        cells = [f"<td style='{_CELL}; text-align:right; color:#6e7781'>{r.line}</td>",
                 f"<td style='{_CELL}; text-align:left; white-space:pre'>{esc(r.source)}</td>",
                 f"<td style='{_CELL}; text-align:left; white-space:nowrap'>{_counts_html(r.counts, classes)}"
                 f"{_sass_html(r.sass, instruction_class)}{ptx}</td>"]
        if view.profiled:
            cells.append(_profile_cells(r.profile))
        body.append(f"<tr data-line='{r.line}'>{''.join(cells)}</tr>")
    notes = []
    if view.unattributed:
        notes.append(f"<details><summary>{len(view.unattributed)} instructions with no line in "
                     f"{esc(view.filename)}</summary>{_sass_html(view.unattributed, instruction_class)}</details>")
    if view.profile_note:
        notes.append(f"<div style='color:#9a6700'>not profiled: {esc(view.profile_note)}</div>")
    legend = " · ".join(f"<span style='color:{_CLASS_COLOR[k]}'>{esc(v[0])}</span>: {esc(v[1])}"
                        for k, v in classes.items())
    return (f"<div class='kernellab-source' style='{_MONO}'><div style='font-weight:bold'>{esc(view.title)}</div>"
            f"<table style='border-collapse:collapse; {_MONO}'><thead><tr>{''.join(head)}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{''.join(notes)}"
            f"<details><summary style='color:#6e7781'>instruction classes</summary>"
            f"<div style='font-size:11px'>{legend}</div></details></div>")
