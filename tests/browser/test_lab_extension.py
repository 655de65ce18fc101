"""The JupyterLab extension in a real Lab: type a `%%cuda` cell, see C++ tokens, run it, see the report panel.

Screenshots go to test-artifacts/browser/. No GPU needed: `%%cuda` compiles without one, and the status bar says so.
"""
from __future__ import annotations

import json
import re

import pytest

from .report_fixtures import BENCH_SETUP, BROKEN

pytestmark = pytest.mark.slow

VADD = """\
__global__ void vadd(const float* __restrict__ a, const float* b, float* c, int n) {
    // one thread per element
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""

REPORTS_CELL = BENCH_SETUP + '''
import torch, kernellab
from kernellab.run.measure.bench import bench

def inputs(g):
    x = torch.randn(1000, generator=g)
    return (x, torch.empty_like(x))

def good(x, out):
    return torch.mul(x, 2, out=out)

def off(x, out):
    torch.mul(x, 2, out=out); out[17] += 0.5; return out

clock = FakeClock({"saxpy": 0.21, "torch": 0.34})
display(kernellab.occupancy(block_size=256, registers=72, shared_bytes=12288, arch="sm_90"))
display(kernellab.check(off, lambda x, out: x * 2, inputs, trials=2))
display(bench(clock.timed("saxpy", good), inputs, baselines={"torch": clock.timed("torch", good)}, bytes=12_000,
              name="saxpy", timer=clock, rounds=4, min_reps=5, max_reps=20, warmup_ms=0.1, rep_ms=0.5))
'''


def _open_notebook(page, lab, name: str):
    base, token, root = lab
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / name).write_text(json.dumps(nb))
    page.goto(f"{base}/lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for()
    _wait_idle(page)


def _wait_idle(page):
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle")).wait_for(timeout=60_000)


def _cell(page, i: int):
    return page.locator(".jp-NotebookPanel .jp-Cell").nth(i)


def _edit(page, i: int):
    """Click into cell i's editor (creating it below the last cell if needed) and return the cell."""
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    while cells.count() <= i:
        page.keyboard.press("Escape")
        page.keyboard.press("b")
    cell = _cell(page, i)
    cell.locator(".cm-content").click()
    return cell


def _run(page, cell, count: int):
    """Shift+Enter in the cell; wait until it shows execution count `count` and the kernel is idle again."""
    _wait_idle(page)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    cell.locator(".jp-InputArea-prompt").get_by_text(f"[{count}]").wait_for(timeout=90_000)
    _wait_idle(page)


def _language(cell) -> str | None:
    return cell.locator(".cm-content").get_attribute("data-language")


def test_cuda_cell_highlighting_report_and_diagnostics(page, lab, artifacts):
    _open_notebook(page, lab, "cuda.ipynb")

    # %load_ext: the status bar learns the kernel's GPU; the status output itself stays hidden.
    cell = _edit(page, 0)
    page.keyboard.type("%load_ext kernellab")
    _run(page, cell, 1)
    status = page.locator(".kl-GpuStatus")
    status.get_by_text(re.compile(r"no GPU: (compile-only|simulator)|GPU: ")).wait_for()
    assert cell.locator(".jp-OutputArea-child").evaluate_all(
        "nodes => nodes.filter(n => n.offsetParent !== null).length") == 0

    # Typing %%cuda switches the editor to CUDA C++ at once; another magic switches it back.
    cell = _edit(page, 1)
    assert _language(cell) == "python"
    page.keyboard.type("%%cuda")
    assert _language(cell) == "cuda"
    page.keyboard.press("Backspace")
    assert _language(cell) == "python"
    page.keyboard.type("a")
    assert _language(cell) == "cuda"
    page.keyboard.press("Enter")
    page.keyboard.insert_text(VADD)
    content = cell.locator(".cm-content")
    assert content.locator(".kl-cm-cellMagic").inner_text() == "%%cuda"
    assert content.locator(".kl-cm-cudaQualifier").first.inner_text() == "__global__"
    assert content.locator(".tok-typeName", has_text="float").count() >= 3       # C++ types, not Python names
    assert content.locator(".tok-comment", has_text="one thread per element").count() == 1   # `//` is a comment
    assert content.locator(".tok-keyword", has_text="if").count() == 1
    assert {t.inner_text() for t in content.locator(".kl-cm-cudaBuiltin").all()} == {"blockIdx", "blockDim", "threadIdx"}
    # The cursor sits after the kernel's closing brace: bracket matching marks it and its partner.
    assert content.locator(".cm-matchingBracket").count() == 2
    cell.screenshot(path=str(artifacts / "cuda-cell-editor.png"))

    _run(page, cell, 2)
    report = cell.locator(".kl-Report--compile")
    report.wait_for()
    assert report.locator(".kl-Kernel-name").inner_text() == "vadd"
    assert report.locator(".kl-Occupancy-value").inner_text().endswith("%")
    # Occupancy at the block size that matters, saying which (vadd has no launch bounds: its best block).
    assert report.locator(".kl-Occupancy-at").inner_text() == "at 1,024 threads/block (its best block size)"
    assert report.locator(".kl-Stat", has_text="Registers").count() == 1
    cell.screenshot(path=str(artifacts / "cuda-cell-report.png"))

    # A compile error: the panel lists it, the gutter marks its line, clicking it puts the cursor there.
    cell = _edit(page, 2)
    page.keyboard.type("%%cuda")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(BROKEN.rstrip())
    _run(page, cell, 3)
    error = cell.locator(".kl-Diag--error")
    error.wait_for()
    assert "factor" in error.inner_text()
    # Shown once: the panel; the cell's UsageError (which makes it fail) is there but hidden. No "failed · failed".
    visible = cell.locator(".jp-OutputArea-child").evaluate_all(
        "nodes => nodes.filter(n => n.offsetParent !== null).map(n => n.innerText)")
    assert len(visible) == 1 and "diagnostics" in visible[0].lower(), visible
    stderr = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert stderr.count() == 1 and "UsageError" in stderr.inner_text() and not stderr.is_visible()
    header = cell.locator(".kl-Report--compile .kl-Report-header").inner_text()
    assert "cell.cu: 1 error, 1 warning" in header and header.count("failed") == 1, header
    line = int(error.get_attribute("data-line"))
    assert line == 4                                       # %%cuda is line 1
    marker = cell.locator(".kl-cm-diagnosticMarker--error")
    marker.wait_for()
    assert cell.locator(".kl-cm-diagnosticMarker--warning").count() == 1
    marked_line = cell.locator(".kl-cm-diagnosticLine--error")
    assert "factor" in marked_line.inner_text()
    page.locator(".jp-NotebookPanel .jp-Cell").nth(0).click()   # move away, then come back through the panel
    error.click()
    cursor_line = page.evaluate(
        "() => { const n = window.getSelection().anchorNode;"
        " const el = n && (n.nodeType === 1 ? n : n.parentElement); return el && el.closest('.cm-line')?.textContent; }")
    assert cursor_line is not None and "factor" in cursor_line
    cell.screenshot(path=str(artifacts / "cuda-compile-error.png"))
    page.screenshot(path=str(artifacts / "lab-notebook.png"))


def test_occupancy_check_and_bench_panels(page, lab, artifacts):
    _open_notebook(page, lab, "reports.ipynb")
    cell = _edit(page, 0)
    page.keyboard.insert_text(REPORTS_CELL)
    _run(page, cell, 1)
    for kind in ("occupancy", "check", "bench"):
        panel = cell.locator(f".kl-Report--{kind}")
        panel.wait_for()
        panel.screenshot(path=str(artifacts / f"report-{kind}.png"))
    occupancy = cell.locator(".kl-Report--occupancy")
    assert occupancy.locator("tr.kl-is-limiter").inner_text().startswith("registers")
    assert "37.5%" in occupancy.locator(".kl-Occupancy-value").inner_text()
    check = cell.locator(".kl-Report--check")
    assert check.locator(".kl-Verdict--fail").count() == 1
    assert "[17]" in check.locator(".kl-Worst").inner_text()
    bench = cell.locator(".kl-Report--bench")
    assert bench.locator(".kl-Bench-name").all_inner_texts() == ["saxpy", "torch"]
    assert "vs torch" in bench.locator(".kl-Speedups").inner_text()


def _open_with_cells(page, lab, name: str, sources: list[str]):
    """Open a notebook whose code cells hold `sources` (written to disk first: no typing)."""
    base, token, root = lab
    cells = [{"cell_type": "code", "source": src, "metadata": {}, "outputs": [], "execution_count": None}
             for src in sources]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    (root / name).write_text(json.dumps(nb))
    page.goto(f"{base}/lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-Cell").nth(len(sources) - 1).wait_for()
    _wait_idle(page)


def _command(page, label: str):
    """Runs a JupyterLab command from the command palette."""
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    palette.wait_for()
    palette.fill(label)
    page.locator(".lm-CommandPalette-item", has_text=label).first.click()


def test_run_all_stops_at_a_compile_error_shown_once(page, lab, artifacts):
    _open_with_cells(page, lab, "runall.ipynb", ["%load_ext kernellab", "%%cuda\n" + BROKEN.rstrip(),
                                                  "print('ran after the error')"])
    _cell(page, 0).locator(".cm-content").click()
    _command(page, "Run All Cells")
    broken = _cell(page, 1)
    broken.locator(".kl-Diag--error").wait_for(timeout=90_000)
    _wait_idle(page)
    page.wait_for_timeout(1000)                      # give a (wrongly) queued third cell time to run
    after = _cell(page, 2)
    assert after.locator(".jp-OutputArea-output").count() == 0, after.locator(".jp-OutputArea").inner_text()
    assert after.locator(".jp-InputArea-prompt").inner_text().strip() in ("[ ]:", "[ ]")
    assert broken.locator(".jp-OutputArea-child").evaluate_all(
        "nodes => nodes.filter(n => n.offsetParent !== null).length") == 1
    page.screenshot(path=str(artifacts / "run-all-stops.png"))


EXPLORER = """import kernellab
m = kernellab.compile_cuda('__global__ void __launch_bounds__(128) k(float* x) { x[threadIdx.x] *= 2; }',
                           arch="sm_90")
kernellab.occupancy_explorer(m.k)"""

SIM = """%%numba --sim
@cuda.jit
def twice(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= 2"""

SASS_CELL = """%%cuda --sass
extern "C" __global__ void add(const float* a, float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] += a[i];
}"""


def test_explorer_source_view_and_the_simulator_status(page, lab, artifacts):
    _open_with_cells(page, lab, "explore.ipynb", ["%load_ext kernellab", EXPLORER, SASS_CELL, SIM])
    status = page.locator(".kl-GpuStatus")
    _run(page, _cell(page, 0), 1)
    status.get_by_text("no GPU: compile-only").wait_for()

    # The explorer: the carveout dropdown reads "default", the block slider stops at the kernel's 128 threads
    # and moves a warp at a time.
    cell = _cell(page, 1)
    _run(page, cell, 2)
    dropdown = cell.locator(".widget-dropdown", has_text="smem carveout").locator("select")
    dropdown.wait_for()
    assert dropdown.evaluate("s => s.options[s.selectedIndex].text").startswith("default")
    slider = cell.locator(".widget-slider").first
    readout = slider.locator(".widget-readout")
    assert readout.inner_text().strip() == "128"
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("el => el.innerText.trim() === '96'", arg=readout.element_handle(), timeout=10_000)
    cell.screenshot(path=str(artifacts / "occupancy-explorer.png"))

    # %%cuda --sass: each cell line beside its SASS.
    cell = _cell(page, 2)
    _run(page, cell, 3)
    row = cell.locator(".kernellab-source tr[data-line='4']")
    row.wait_for()
    assert "b[i] += a[i]" in row.inner_text() and "LDG" in row.inner_text() and "STG" in row.inner_text()
    cell.screenshot(path=str(artifacts / "sass-source-view.png"))

    # A %%numba --sim cell: the status bar leaves "compile-only".
    _run(page, _cell(page, 3), 4)
    status.get_by_text("no GPU: simulator").wait_for()
