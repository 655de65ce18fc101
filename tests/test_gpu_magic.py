"""%%gpu in a real IPython shell: runs the cell where a GPU is usable, skips it in one line where none is."""
import pytest
from IPython.core.interactiveshell import InteractiveShell

from kernellab.notebook import gpu_magic
from kernellab.run.launch import device


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernellab")
    yield shell


@pytest.fixture
def gpu(monkeypatch):
    """Pretend a GPU is (True) or is not (False) usable."""
    def set_(usable: bool):
        monkeypatch.setattr(device, "gpu_status", lambda: (usable, "1 GPU(s)" if usable else "no CUDA driver"))
    return set_


def test_cell_runs_and_returns_its_last_value_with_a_gpu(ip, gpu):
    gpu(True)
    ip.user_ns.pop("gpu_x", None)
    result = ip.run_cell("%%gpu\ngpu_x = 20\nhere = %pwd\ngpu_x + 1")
    assert result.success, result.error_in_exec
    assert result.result == 21 and ip.user_ns["gpu_x"] == 20 and ip.user_ns["here"]


def test_cell_is_skipped_in_one_line_without_a_gpu(ip, gpu, capsys):
    gpu(False)
    ip.user_ns.pop("gpu_y", None)
    shown = []
    orig = gpu_magic.display
    gpu_magic.display = lambda data, raw=False: shown.append(data)
    try:
        result = ip.run_cell('%%gpu --skip-note "Figures below: H100."\ngpu_y = 1\nraise RuntimeError("ran")')
    finally:
        gpu_magic.display = orig
    assert result.success and result.result is None
    assert "gpu_y" not in ip.user_ns
    assert len(shown) == 1
    text = shown[0]["text/plain"]
    assert "\n" not in text and "needs a CUDA GPU (no CUDA driver)" in text and text.endswith("Figures below: H100.")
    assert shown[0][gpu_magic.SKIP_MIME]["reason"] == "no CUDA driver"


def test_errors_inside_a_gpu_cell_fail_the_cell(ip, gpu):
    gpu(True)
    result = ip.run_cell("%%gpu\n1 / 0")
    assert not result.success and isinstance(result.error_in_exec, ZeroDivisionError)
