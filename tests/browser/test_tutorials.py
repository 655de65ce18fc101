"""The tutorials as a learner meets them in Lab without a GPU: opening one leaves it unmodified, Run All keeps the
GPU results recorded in it (on the page and on disk), and a fresh notebook shows kernellab's plots."""
from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest

from .test_lab_extension import _cell, _command, _open_with_cells, _run, _wait_idle

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _open_tutorial(page, lab, name: str):
    base, token, root = lab
    shutil.copy(ROOT / "notebooks" / name, root / name)
    page.goto(f"{base}/lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for()
    _wait_idle(page)
    return root / name


def _dirty(page) -> bool:
    return page.locator(".jp-NotebookPanel.jp-mod-dirty, .lm-TabBar-tab.jp-mod-dirty").count() > 0


def test_opening_a_tutorial_leaves_it_unmodified(page, lab, artifacts):
    _open_tutorial(page, lab, "03-reductions-softmax.ipynb")
    page.wait_for_timeout(3000)                 # renderers, the status item, the editor's language: all settled
    assert not _dirty(page)


@pytest.mark.parametrize("name", ["05-matmul.ipynb"])
def test_opening_a_tutorial_with_widget_state_leaves_it_unmodified(page, lab, name):
    _open_tutorial(page, lab, name)
    page.wait_for_timeout(3000)
    assert not _dirty(page)


def _gpu_cells(nb: dict) -> list[int]:
    return [i for i, c in enumerate(nb["cells"])
            if c["cell_type"] == "code" and "".join(c["source"]).startswith("%%gpu") and c["outputs"]]


def test_run_all_without_a_gpu_keeps_the_recorded_gpu_outputs(page, lab, artifacts):
    name = "03-reductions-softmax.ipynb"
    committed = json.loads((ROOT / "notebooks" / name).read_text())
    gpu = _gpu_cells(committed)
    code = [i for i, c in enumerate(committed["cells"]) if c["cell_type"] == "code"]
    path = _open_tutorial(page, lab, name)
    _cell(page, 0).click()
    _command(page, "Run All Cells")
    last = _cell(page, code[-1])
    last.locator(".jp-InputArea-prompt").get_by_text(re.compile(r"\[\d+\]")).wait_for(timeout=300_000)
    _wait_idle(page)

    # On the page: each %%gpu cell says where its outputs were recorded, and shows them (the roofline's image).
    labels = page.locator(".kernellab-recorded")
    assert labels.count() == len(gpu)
    labels.first.scroll_into_view_if_needed()
    stamp = committed["metadata"]["kernellab"]["recorded_on"]         # written by tools/gpu/run_notebooks.py
    assert labels.first.text_content().startswith(f"⏭ recorded on {stamp['device']}, {stamp['date']}; no GPU here")
    roofline = _cell(page, next(i for i in gpu if any("image/png" in o.get("data", {})
                                                      for o in committed["cells"][i]["outputs"])))
    roofline.scroll_into_view_if_needed()
    assert roofline.locator(".jp-OutputArea-output img").count() >= 1
    roofline.screenshot(path=str(artifacts / "recorded-gpu-outputs.png"))

    # On disk, once saved: every recorded output item is still there, unchanged.
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel.jp-mod-dirty')", timeout=30_000)
    page.wait_for_timeout(1000)
    saved = json.loads(path.read_text())
    for i in gpu:
        before, after = committed["cells"][i]["outputs"], saved["cells"][i]["outputs"]
        shown = [o["data"] for o in after if "data" in o]
        for o in before:
            if "data" in o:
                assert o["data"] in shown, (i, sorted(o["data"]))
        for stream in ("stdout", "stderr"):
            text = lambda outs: "".join("".join(o["text"]) for o in outs
                                        if o["output_type"] == "stream" and o["name"] == stream)
            assert text(before) == text(after), (i, stream)


PLOT_CELLS = ["%load_ext kernellab",
              "import kernellab\nkernellab.plot_occupancy(256, registers=32, shared_bytes=1032)",
              "%%cuda\n__global__ void flip(float* x) {\n    __shared__ float t[258];\n    t[threadIdx.x] = x[0];\n"
              "    __syncthreads();\n    x[threadIdx.x] = t[257 - threadIdx.x];\n}",
              "kernellab.occupancy_explorer(flip)",
              "%%numba --sim\nfrom numba import float32\n@cuda.jit\ndef flip32(x):\n"
              "    t = cuda.shared.array(32, float32)\n    t[cuda.threadIdx.x] = x[cuda.threadIdx.x]\n"
              "    cuda.syncthreads()\n    x[cuda.threadIdx.x] = t[31 - cuda.threadIdx.x]",
              "import numpy as np\nx = np.arange(32, dtype=np.float32)\nflip32[1, 32](x)\nx[:3]"]


def test_a_fresh_notebook_shows_plots_cards_and_notes(page, lab, artifacts):
    """A plot without `%matplotlib inline`; the explorer's shared memory as the card's; a `%%numba --sim` card
    filled in by the kernel's first launch; the simulator's notice as a quiet note, not a stderr box."""
    _open_with_cells(page, lab, "fresh.ipynb", PLOT_CELLS)
    for i in range(len(PLOT_CELLS) - 1):            # all but the launch
        _run(page, _cell(page, i), i + 1)
    plot = _cell(page, 1)
    plot.locator(".jp-OutputArea-output img").wait_for()
    assert "<Figure" not in plot.locator(".jp-OutputArea").inner_text()
    plot.screenshot(path=str(artifacts / "fresh-notebook-plot.png"))
    card = _cell(page, 2).locator(".kl-Stat", has_text="Shared")
    assert card.locator(".kl-Stat-value").inner_text() == "1,032 B"
    explorer = _cell(page, 3)
    slider = explorer.locator(".widget-slider", has_text="declared")
    slider.wait_for()
    assert slider.locator(".widget-readout").inner_text().strip() == "1032"

    numba_card = _cell(page, 4).locator(".kl-Report--compile")
    registers = numba_card.locator(".kl-Stat", has_text="Registers").locator(".kl-Stat-value")
    assert registers.inner_text() == "—"
    launch = _cell(page, 5)
    _run(page, launch, 6)
    launch.locator(".kernellab-note").wait_for()
    assert "runs in Numba's CUDA simulator" in launch.locator(".kernellab-note").inner_text()
    assert launch.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    page.wait_for_function("el => el.innerText.trim() !== '—'", arg=registers.element_handle(), timeout=10_000)
    assert int(registers.inner_text()) > 0
    assert numba_card.locator(".kl-Stat", has_text="Shared").locator(".kl-Stat-value").inner_text() == "128 B"
    _cell(page, 4).screenshot(path=str(artifacts / "numba-card-after-launch.png"))


def test_an_edited_gpu_cell_keeps_the_tutorials_recorded_outputs(page, lab, artifacts):
    """The learner changes a %%gpu cell and runs it without a GPU: the tutorial's recorded outputs stay, labelled as
    the tutorial's version's (JupyterLab sends the cell's id; the source no longer matches)."""
    name = "01-first-kernel.ipynb"
    committed = json.loads((ROOT / "notebooks" / name).read_text())
    code = [i for i, c in enumerate(committed["cells"]) if c["cell_type"] == "code"]
    i = _gpu_cells(committed)[-1]
    _open_tutorial(page, lab, name)
    _cell(page, 0).click()
    _command(page, "Run All Cells")
    _cell(page, code[-1]).locator(".jp-InputArea-prompt").get_by_text(re.compile(r"\[\d+\]")).wait_for(timeout=300_000)
    _wait_idle(page)
    cell = _cell(page, i)
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+End")
    page.keyboard.type("\n# my change")
    page.keyboard.press("Shift+Enter")
    _wait_idle(page)
    label = cell.locator(".kernellab-recorded")
    label.wait_for()
    assert "for the tutorial's version of this cell (yours differs)" in label.text_content()
    kinds = {k for o in committed["cells"][i]["outputs"] for k in o.get("data", {})}
    assert "application/vnd.kernellab.report+json" in kinds
    assert cell.locator(".kl-Report").count() >= 1                # the recorded report panel, shown again
    cell.screenshot(path=str(artifacts / "edited-gpu-cell.png"))
