"""What the tutorials' `%%gpu` cells showed on a GPU, shipped with kernellab so that a cell skipped without a GPU
shows those outputs again (labelled as recorded, with the device and date) instead of wiping them.

The maintainer's flow: the tutorials are re-run on a GPU (tools/gpu/run_notebooks.py stamps each notebook's metadata
with `kernellab.recorded_on = {"device", "date"}`) and committed; then `python tools/record_gpu_outputs.py` extracts
the outputs of every `%%gpu` cell into kernellab/notebook/recorded/<tutorial>.json. A CPU test
(tests/test_recorded_outputs.py) fails while a committed notebook and its recorded copy differ.

A recorded cell is found by the hash of its source (`cell_key`). A tutorial cell the learner has edited is found by its
cell id instead (JupyterLab sends it with each execution), and its recorded outputs are labelled as those of the
tutorial's version of the cell; any other cell gets the plain skip line.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pathlib

RECORDED_DIR = pathlib.Path(__file__).with_name("recorded")
SKIP_MIME = "application/vnd.kernellab.skipped+json"   # a skipped GPU cell's line (gpu_magic shows it)
VERSION = 1


def cell_key(args: str, body: str) -> str:
    """The key of a `%%gpu ARGS` cell with `body` below its magic line: a hash of both, blind to trailing spaces
    and to blank lines at either end (Jupyter and jupytext differ there)."""
    lines = [args.strip()] + [ln.rstrip() for ln in body.strip("\n").splitlines()]
    while len(lines) > 1 and not lines[-1]:
        lines.pop()
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]


def split_cell(source: str) -> tuple[str, str] | None:
    """(magic arguments, body) of a `%%gpu` cell's source; None for any other cell."""
    first, _, body = source.partition("\n")
    if first.split(" ", 1)[0].strip() != "%%gpu":
        return None
    return first[len("%%gpu"):], body


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _kept(output: dict) -> dict | None:
    """An output as recorded: streams, displays and results; never errors or skip lines."""
    kind = output.get("output_type")
    if kind == "stream":
        text = output.get("text", "")
        return {"output_type": "stream", "name": output.get("name", "stdout"),
                "text": "".join(text) if isinstance(text, list) else text}
    if kind in ("display_data", "execute_result"):
        data = dict(output.get("data", {}))
        if SKIP_MIME in data:
            return None
        data = {k: ("".join(v) if isinstance(v, list) else v) for k, v in data.items()}
        return {"output_type": kind, "data": data, "metadata": dict(output.get("metadata", {}))}
    return None


def extract(nb: dict, name: str) -> dict:
    """The recorded copy of notebook `nb` (its JSON as a dict): every `%%gpu` cell that has outputs from a GPU."""
    stamp = nb.get("metadata", {}).get("kernellab", {}).get("recorded_on")
    if not stamp or not stamp.get("device") or not stamp.get("date"):
        raise ValueError(f"{name}: its metadata has no kernellab.recorded_on {{device, date}}: run it with "
                         f"tools/gpu/run_notebooks.py on a GPU (which stamps it), or stamp it with "
                         f"tools/record_gpu_outputs.py --device NAME --date YYYY-MM-DD")
    cells = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        parts = split_cell(_source(cell))
        if parts is None:
            continue
        outputs = [o for o in (_kept(o) for o in cell.get("outputs", [])) if o is not None]
        if outputs:
            cells[cell_key(*parts)] = {"cell_id": cell.get("id"), "outputs": outputs}
    return {"version": VERSION, "notebook": name, "device": stamp["device"], "date": stamp["date"], "cells": cells}


def dumps(recorded: dict) -> str:
    """The recorded copy as the file holds it (stable: sorted keys, one trailing newline)."""
    return json.dumps(recorded, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@functools.lru_cache(maxsize=1)
def _index() -> tuple[dict, dict]:
    """({cell key: entry}, {cell id: entry}) over every recorded tutorial; an entry is (outputs, device, date,
    notebook)."""
    by_key, by_id = {}, {}
    for path in sorted(RECORDED_DIR.glob("*.json")):
        rec = json.loads(path.read_text())
        for key, cell in rec.get("cells", {}).items():
            entry = (cell["outputs"], rec["device"], rec["date"], rec["notebook"])
            by_key[key] = entry
            if cell.get("cell_id"):
                by_id[cell["cell_id"]] = entry
    return by_key, by_id


def lookup(args: str, body: str):
    """(outputs, device, date, notebook) recorded for this `%%gpu` cell, or None."""
    return _index()[0].get(cell_key(args, body))


def lookup_cell_id(cell_id: str | None):
    """(outputs, device, date, notebook) recorded for the tutorial cell of this id (nbformat 4.5's cell id, which a
    copied notebook keeps), or None: for a tutorial cell the learner has edited, whose source no longer matches."""
    return _index()[1].get(cell_id) if cell_id else None


def current_cell_id(shell) -> str | None:
    """The id of the cell being run, where the front end sends it (JupyterLab and Notebook 7 put `cellId` in the
    execute request's metadata); None elsewhere."""
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None and hasattr(kernel, "get_parent") else None
    except Exception:
        return None
    cell_id = ((parent or {}).get("metadata") or {}).get("cellId")
    return cell_id if isinstance(cell_id, str) else None
