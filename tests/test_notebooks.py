"""Tutorials: each .ipynb matches its reviewed jupytext .py, and runs through nbclient (GPU cells need a GPU)."""
import os
import pathlib

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import kernellab
from kernellab.notebook.gpu_magic import SKIP_MIME
from kernellab.report import REPORT_MIME

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]-*.py"))


def _sources(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_ipynb_matches_its_jupytext_source(py):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `jupytext --to ipynb {py}`"
    assert _sources(jupytext.read(py)) == _sources(nbformat.read(ipynb, 4)), \
        f"{ipynb.name} differs from {py.name}: run `jupytext --sync {py}`"


@pytest.mark.slow
@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_runs(py, tmp_path):
    """On a GPU: top to bottom. Without one: to the end where GPU cells are marked %%gpu (they are skipped in one
    line each), else every cell up to the first launch, which stops with a clear note."""
    nb = jupytext.read(py)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(py.parent)}})
    if kernellab.has_gpu():
        client.execute()
        artifacts = os.environ.get("KERNELLAB_ARTIFACTS")
        if artifacts:  # keep the executed notebook (real outputs from the GPU) for docs and review
            nbformat.write(nb, os.path.join(artifacts, py.stem + ".ipynb"))
        return
    if "# %%gpu" in py.read_text():
        # Tutorials whose GPU cells are marked %%gpu run to the end: each GPU cell says in one line it was skipped.
        client.execute()
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), "every code cell should have run"
        skipped = [c for c in code if any(SKIP_MIME in o.get("data", {}) for o in c.outputs)]
        assert skipped and all(c.source.startswith("%%gpu") for c in skipped)
        assert all(c in skipped for c in code if c.source.startswith("%%gpu"))
        assert any(REPORT_MIME in o.get("data", {}) for c in code for o in c.outputs), "no %%cuda card shown"
        return
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    text = str(info.value)
    assert "NoGPUError" in text and "needs a CUDA GPU" in text, text[-2000:]
    ran = [c for c in nb.cells if c.cell_type == "code" and c.get("execution_count")]
    failed = ran[-1]
    assert "[" in failed.source and "](" in failed.source, "the first failing cell should be a kernel launch"
    for cell in ran[:-1]:
        assert not any(o.get("output_type") == "error" for o in cell.outputs)
    cards = [o for c in ran for o in c.outputs if "application/vnd.kernellab.report+json" in o.get("data", {})]
    assert cards, "the %%cuda cell should have shown its card"
