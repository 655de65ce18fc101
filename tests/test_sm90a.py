"""The sm_90a target (NVRTC compile only): wgmma and setmaxnreg compile for it, and a plain sm_90 compile of them
fails with a CompileError that points at the source line and says to use arch="sm_90a"."""
import subprocess

import pytest
from hopper_sources import SETMAXNREG, WGMMA

import kernellab
from kernellab import CompileError
from kernellab.compile import toolkit
from kernellab.compile.cubin import cubin_arch
from kernellab.compile.nvrtc import arch_hint, parse_log, ptx_source_line
from kernellab.errors import ArgumentError
from kernellab.run.launch.device import DeviceInfo


def _cuobjdump_elf_arch(cubin: bytes, tmp_path) -> str:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([toolkit.find_tool("cuobjdump"), "-elf", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return next(w for w in out.split() if w.startswith("sm=")).rstrip(",")


def test_wgmma_compiles_for_sm90a_and_the_cubin_says_so(tmp_cache, tmp_path):
    m = kernellab.compile_cuda(WGMMA, arch="sm_90a")
    k = m.wgmma_tile
    assert m.arch == k.arch == k.resources.arch == "sm_90a"
    assert ".target sm_90a" in m.ptx
    assert cubin_arch(m.cubin) == "sm_90a"
    assert _cuobjdump_elf_arch(m.cubin, tmp_path) == "sm=90a"
    assert "HGMMA" in k.sass
    # resources and occupancy use the sm_90 tables
    assert k.resources.registers > 0 and k.resources.max_threads_per_block == 1024
    occ = k.occupancy(128)
    assert occ.arch == "sm_90" and occ.ratio > 0
    assert k.best_block_sizes()
    j = m.to_json()
    assert j["arch"] == "sm_90a" and j["kernels"][0]["arch"] == "sm_90a" and "occupancy" in j["kernels"][0]
    assert "sm_90a" in str(m)


def test_plain_sm90_cubin_arch(tmp_cache, tmp_path):
    m = kernellab.compile_cuda("__global__ void k(float* x) { x[0] = 1; }", arch="sm_90")
    assert cubin_arch(m.cubin) == "sm_90"
    assert _cuobjdump_elf_arch(m.cubin, tmp_path) == "sm=90"


@pytest.mark.parametrize("source, insn, line", [(WGMMA, "wgmma.fence", 4), (SETMAXNREG, "setmaxnreg.dec", 5)])
def test_sm90a_instruction_on_plain_sm90_is_a_clear_compile_error(tmp_cache, source, insn, line):
    with pytest.raises(CompileError) as info:
        kernellab.compile_cuda(source, arch="sm_90")
    err = info.value
    assert all("not supported on .target 'sm_90'" in d.message for d in err.errors)
    assert any(d.line == line and f"'{insn}'" in d.message for d in err.errors)
    lines = source.splitlines()
    for d in err.errors:     # each error points at the last line of the asm statement that holds its instruction
        start = d.line - 1
        while start > 0 and not lines[start - 1].rstrip().endswith((";", "{", "}")):
            start -= 1
        assert d.message.split("'")[1].split(".")[0] in "\n".join(lines[start:d.line])
    assert not any("aborted" in d.message for d in err.errors)     # ptxas's closing line adds nothing
    assert err.hint and 'arch="sm_90a"' in err.hint and "%%cuda --arch sm_90a" in err.hint
    text = str(err)
    assert text.splitlines()[-1].startswith("hint: ") and f">{line} |" in text
    assert err.to_json()["notes"] == [err.hint]


def test_diagnostic_lines_follow_the_cell_numbering(tmp_cache):
    with pytest.raises(CompileError) as info:
        kernellab.compile_cuda(WGMMA, arch="sm_90", first_line=2, filename="cell.cu")
    assert info.value.errors[0].line == 5
    assert "cell.cu:line 5: error: ptxas: Instruction 'wgmma.fence'" in str(info.value)


def test_ptx_line_mapping_and_hint_units():
    ptx = ('.loc\t1 7 3\nmov.u32 %r1, 1;\n.loc\t2 90 1\nwgmma.fence.sync.aligned;\n.loc\t1 9 3\n'
           'wgmma.commit_group.sync.aligned;\n.file\t1 "/x/kernel.cu"\n.file\t2 "/inc/other.h"\n')
    assert ptx_source_line(ptx, 2, "kernel.cu") == 7
    assert ptx_source_line(ptx, 4, "kernel.cu") is None            # a line from another file
    assert ptx_source_line(ptx, 6, "kernel.cu") == 9
    assert ptx_source_line("", 6, "kernel.cu") is None
    log = ("ptxas application ptx input, line 6; error   : Instruction 'wgmma.commit_group' not supported on "
           ".target 'sm_90'\nptxas fatal   : Ptx assembly aborted due to errors\n")
    (d,) = parse_log(log, "kernel.cu", ptx)
    assert (d.line, d.severity) == (9, "error") and d.message.startswith("ptxas: Instruction 'wgmma.commit_group'")
    assert "sm_90a" in arch_hint([d])
    # an instruction kernellab does not know: the hint names the 'a' target without promising it helps
    (u,) = parse_log("ptxas application ptx input, line 2; error   : Instruction 'foo.bar' not supported on "
                     ".target 'sm_80'\n", "kernel.cu", ptx)
    assert "sm_80a" in arch_hint([u]) and "newer" in arch_hint([u])
    # other ptxas errors keep the fatal line (it is all there is) and get no hint
    only = parse_log("ptxas fatal   : Ptx assembly aborted due to errors\n", "kernel.cu")
    assert len(only) == 1 and arch_hint(only) is None


def test_cache_key_separates_sm90_and_sm90a(tmp_cache):
    src = "__global__ void k(float* x) { x[threadIdx.x] = 2; }"
    a = kernellab.compile_cuda(src, arch="sm_90")
    b = kernellab.compile_cuda(src, arch="sm_90a")
    assert (a.cache_state, b.cache_state) == ("miss", "miss")
    assert kernellab.compile_cuda(src, arch="sm_90a").cache_state == "memory"
    assert cubin_arch(b.cubin) == "sm_90a" and cubin_arch(a.cubin) == "sm_90"


def test_sm90a_kernel_may_launch_on_an_sm90_device_only(tmp_cache):
    k = kernellab.compile_cuda(SETMAXNREG, arch="sm_90a").split_roles
    k._check_arch(DeviceInfo(0, "Fake H100", "sm_90", 132))       # no error: the base arch matches
    with pytest.raises(ArgumentError, match="compiled for sm_90a but the GPU is Fake A100 \\(sm_80\\)"):
        k._check_arch(DeviceInfo(0, "Fake A100", "sm_80", 108))


def test_magic_arch_sm90a(tmp_cache):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    result = ip.run_cell("%%cuda --arch sm_90a --name hop\n" + WGMMA)
    assert result.success, result.error_in_exec
    assert ip.user_ns["hop"].arch == "sm_90a" and ip.user_ns["wgmma_tile"].arch == "sm_90a"
    result = ip.run_cell("%%cuda --arch sm_90\n" + WGMMA)
    assert isinstance(result.error_in_exec, UsageError)
    assert "%%cuda --arch sm_90a" in str(result.error_in_exec) and "cell.cu:line 5" in str(result.error_in_exec)
