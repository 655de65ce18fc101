"""The %%cuda magic in a real IPython shell: binding, cards, options, errors as UsageError at cell lines."""
import re

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kernellab

CELL = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
__global__ void twice(double* x) { x[threadIdx.x] *= 2; }
"""


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernellab")
    yield shell


def test_cell_binds_kernels_and_returns_the_module(ip, tmp_cache):
    result = ip.run_cell("%%cuda --arch sm_90 --name mod\n" + CELL)
    assert result.success, result.error_in_exec
    assert isinstance(ip.user_ns["vadd"], kernellab.Kernel)
    assert ip.user_ns["twice"].params[0].dtype == "float64"
    mod = ip.user_ns["mod"]
    assert isinstance(mod, kernellab.Module) and result.result is mod
    assert mod.vadd.resources.registers > 0


def test_magic_help_lists_options(ip):
    doc = ip.find_cell_magic("cuda").__doc__
    for opt in ("--arch", "--options", "--name", "--ptx", "--sass"):
        assert opt in doc


def test_options_reach_nvrtc(ip, tmp_cache):
    src = "__global__ void f(float* x) { x[0] = __expf(x[1]) / x[2]; }\n"
    ip.run_cell("%%cuda --arch sm_90 --name slow\n" + src)
    ip.run_cell("%%cuda --arch sm_90 --name fast -O \"--use_fast_math -ftz=true\"\n" + src)
    assert ip.user_ns["fast"].options == ("--use_fast_math", "-ftz=true")
    assert ip.user_ns["fast"].cubin != ip.user_ns["slow"].cubin


def test_ptx_and_sass_are_shown(ip, tmp_cache, capsys):
    result = ip.run_cell("%%cuda --arch sm_90 --ptx --sass\n" + CELL)
    assert result.success
    out = capsys.readouterr().out
    assert ".entry vadd(" in out and "vadd (sm_90):" in out and "LDG" not in out.split("vadd (sm_90):")[0]
    assert re.search(r"^\s*4\s+if \(i < n\) c\[i\] = a\[i\] \+ b\[i\];\s+\d+\s+2\s+1", out, re.M)


def test_compile_error_is_a_usage_error_at_the_cell_line(ip, tmp_cache, capsys):
    cell = "%%cuda --arch sm_90\n__global__ void k(float* x) {\n    x[0] = nope;\n}\n"
    result = ip.run_cell(cell)
    assert not result.success
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "UsageError" in text and "Traceback" not in text
    assert "cell.cu:line 3, column 12: error" in text and ' >3 |     x[0] = nope;' in text


def test_bad_magic_arguments_are_one_line_usage_errors(ip, capsys):
    result = ip.run_cell("%%cuda --bogus\n__global__ void k() {}\n")
    assert isinstance(result.error_in_exec, UsageError)
    result = ip.run_cell("%%cuda --arch hopper\n__global__ void k() {}\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "not an architecture" in str(result.error_in_exec)


def test_default_arch_is_configurable(ip, tmp_cache):
    ip.run_line_magic("config", "KernellabMagics.default_arch = 'sm_80'")
    try:
        ip.run_cell("%%cuda --name m80\n" + CELL)
        assert ip.user_ns["m80"].arch == "sm_80"
    finally:
        ip.run_line_magic("config", "KernellabMagics.default_arch = None")
