"""The GPU outputs recorded with kernellab (kernellab/notebook/recorded/): fresh against the committed tutorials, and
shown again, labelled with device and date, by a tutorial's `%%gpu` cell skipped without a GPU."""
import importlib.util
import json
import pathlib

import pytest
from IPython.core.interactiveshell import InteractiveShell

from kernellab.notebook import gpu_magic, recorded
from kernellab.run.launch import device

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def _tool():
    spec = importlib.util.spec_from_file_location("record_gpu_outputs", ROOT / "tools" / "record_gpu_outputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_recorded_copies_match_the_committed_notebooks():
    problems = _tool().stale()
    assert not problems, "\n".join(problems) + "\nrun: python tools/record_gpu_outputs.py"


def test_every_committed_gpu_output_is_recorded_with_its_device_and_date():
    cells = 0
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        stamp = nb["metadata"].get("kernellab", {}).get("recorded_on")    # none before its first GPU run
        for cell in nb["cells"]:
            parts = recorded.split_cell("".join(cell["source"])) if cell["cell_type"] == "code" else None
            if parts is None or not cell["outputs"]:
                continue
            outputs, dev, date, name = recorded.lookup(*parts)
            assert (dev, date, name) == (stamp["device"], stamp["date"], path.name)
            assert len(outputs) == len(cell["outputs"])
            cells += 1
    assert cells >= 50


def test_the_key_ignores_what_jupyter_and_jupytext_change_but_not_the_code():
    assert recorded.cell_key(" --skip-note 'x'", "a = 1\nb = 2\n\n") == recorded.cell_key("--skip-note 'x' ", "a = 1  \nb = 2")
    assert recorded.cell_key("", "a = 1") != recorded.cell_key("", "a = 2")
    assert recorded.cell_key("", "a = 1") != recorded.cell_key("--skip-note 'x'", "a = 1")


@pytest.fixture
def shell(monkeypatch):
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    monkeypatch.setattr(device, "gpu_status", lambda: (False, "no CUDA driver"))
    shown = []
    monkeypatch.setattr(gpu_magic, "display", lambda data, metadata=None, raw=False: shown.append(data))
    return ip, shown


def _gpu_cell_with(path, mime):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if src.startswith("%%gpu") and any(mime in o.get("data", {}) for o in cell["outputs"]):
            return src, cell["outputs"]
    raise AssertionError(f"no %%gpu cell of {path.name} shows {mime}")


def test_a_skipped_tutorial_cell_shows_its_recorded_outputs(shell, capsys):
    ip, shown = shell
    path = ROOT / "notebooks" / "03-reductions-softmax.ipynb"
    src, outputs = _gpu_cell_with(path, "image/png")
    stamp = json.loads(path.read_text())["metadata"]["kernellab"]["recorded_on"]    # written by run_notebooks.py
    result = ip.run_cell(src)
    assert result.success and result.result is None
    label = shown[0]
    assert label[gpu_magic.SKIP_MIME]["recorded"] == {"device": stamp["device"], "date": stamp["date"], "edited": False}
    assert label["text/plain"].startswith(f"recorded on {stamp['device']}, {stamp['date']}; no GPU here (no CUDA driver)")
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert pngs and [d["image/png"] for d in shown[1:] if "image/png" in d] == pngs
    streams = "".join("".join(o["text"]) for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout")
    assert capsys.readouterr().out == streams


def test_an_edited_gpu_cell_gets_the_plain_skip_line_where_the_front_end_sends_no_cell_id(shell):
    ip, shown = shell
    src, _ = _gpu_cell_with(ROOT / "notebooks" / "03-reductions-softmax.ipynb", "image/png")
    assert ip.run_cell(src + "\nprint('mine')").success
    assert len(shown) == 1 and "recorded" not in shown[0][gpu_magic.SKIP_MIME]
    assert shown[0]["text/plain"].startswith("skipped: this cell needs a CUDA GPU")


def test_a_notebook_without_its_stamp_is_refused():
    nb = {"metadata": {}, "cells": [{"cell_type": "code", "source": "%%gpu\nx", "outputs": []}]}
    with pytest.raises(ValueError, match="recorded_on"):
        recorded.extract(nb, "99-x.ipynb")


def test_a_recorded_cells_skip_note_gives_way_to_its_outputs(shell, capsys):
    """01's timing cell quotes an older H200 figure in --skip-note; with the H100 outputs shown, the label leaves it out."""
    ip, shown = shell
    nb = json.loads((ROOT / "notebooks" / "01-first-kernel.ipynb").read_text())
    src = next("".join(c["source"]) for c in nb["cells"]
               if "".join(c["source"]).startswith("%%gpu --skip-note") and c["outputs"])
    assert ip.run_cell(src).success
    label = shown[0]
    assert label[gpu_magic.SKIP_MIME]["recorded"] and label[gpu_magic.SKIP_MIME]["note"] is None
    assert "H200" not in label["text/plain"] and label["text/plain"].startswith("recorded on NVIDIA H100")
    assert len(shown) > 1 or capsys.readouterr().out


def test_an_edited_tutorial_cell_shows_the_tutorials_outputs_labelled_so(shell, monkeypatch, capsys):
    """JupyterLab sends the cell's id with each execution: an edited tutorial cell keeps showing the outputs of the
    tutorial's version, said to be those; an unknown id gets the plain skip line."""
    ip, shown = shell
    nb = json.loads((ROOT / "notebooks" / "03-reductions-softmax.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "".join(c["source"]).startswith("%%gpu")
                and any("image/png" in o.get("data", {}) for o in c["outputs"]))
    parent = {"metadata": {"cellId": cell["id"]}}
    monkeypatch.setattr(ip, "kernel", type("K", (), {"get_parent": lambda self: parent})(), raising=False)
    assert ip.run_cell("".join(cell["source"]) + "\n# my change").success
    label = shown[0]
    assert label[gpu_magic.SKIP_MIME]["recorded"]["edited"] is True
    assert "for the tutorial's version of this cell (yours differs)" in label["text/plain"]
    pngs = [o["data"]["image/png"] for o in cell["outputs"] if "image/png" in o.get("data", {})]
    assert [d["image/png"] for d in shown[1:] if "image/png" in d] == pngs
    shown.clear()
    parent["metadata"]["cellId"] = "not-a-tutorial-cell"
    assert ip.run_cell("".join(cell["source"]) + "\n# my change").success
    assert len(shown) == 1 and shown[0]["text/plain"].startswith("skipped: this cell needs a CUDA GPU")
