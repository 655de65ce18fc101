"""SASS beside the source: the instruction classifier, nvdisasm's line table, `Kernel.source_view()`, `%%cuda --sass`,
and Nsight Compute's per-line figures (`Kernel.profile_lines`) parsed from the captured source page. No GPU."""
import pathlib
import re
import stat
import sys
import textwrap
import types

import pytest

import kernellab
from kernellab.compile.sass_lines import (
    CLASSES,
    count_classes,
    instruction_class,
    opcode,
    parse_nvdisasm,
    ptx_lines,
)
from kernellab.report import REPORT_MIME
from kernellab.run.nvtools import ncu_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
SASS_PAGE = (ROOT / "tests" / "fixtures" / "captured" / "ncu_source_sass.csv").read_text()
CUDA_PAGE = (ROOT / "tests" / "fixtures" / "captured" / "ncu_source_cuda.csv").read_text()


@pytest.mark.parametrize("instruction,cls", [
    ("LDG.E R0, desc[UR4][R2.64]", "global_loads"),
    ("@!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64]", "global_loads"),
    ("LD.E R5, [R2.64]", "global_loads"),
    ("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", "global_loads"),
    ("UTMALDG.2D [UR8], [UR4]", "global_loads"),
    ("STG.E desc[UR4][R2.64], R5", "global_stores"),
    ("@P1 ST.E [R2.64], R7", "global_stores"),
    ("LDS.128 R8, [R0+0x10]", "shared_loads"),
    ("LDSM.16.M88.4 R4, [R12]", "shared_loads"),
    ("STS [R5], R0", "shared_stores"),
    ("STSM.16.M88.4 [R2], R4", "shared_stores"),
    ("LDL R2, [R1+0x8]", "local_loads"),
    ("STL.64 [R1], R4", "local_stores"),
    ("FFMA R7, R0, R0, 1", "ffma"),
    ("FFMA.FTZ R3, R2, R2, R3", "ffma"),
    ("HMMA.16816.F32 R4, R8, R12, R4", "mma"),
    ("HGMMA.64x128x16.F32 R24, gdesc[UR4], R24", "mma"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "barriers"),
    ("SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ", "barriers"),
    ("@P0 BRA `(.L_x_1)", "branches"),
    ("CALL.REL.NOINC `(sq)", "branches"),
    ("RET.REL.NODEC R20 `(k)", "branches"),
    ("IMAD R7, R7, UR4, R0", None),
    ("FADD R11, R11, 1", None),
    ("LDC.64 R2, c[0x0][0x210]", None),
    ("S2R R0, SR_TID.X", None),
    ("EXIT", None),
    ("BSYNC B0", None),
])
def test_each_instruction_falls_in_its_class(instruction, cls):
    assert instruction_class(instruction) == cls
    counts = count_classes([instruction, "NOP"])
    assert set(counts) == set(CLASSES) and sum(counts.values()) == (cls is not None)


def test_opcode_ignores_predicates_and_modifiers():
    assert opcode("@!UP0 LDG.E.128 R4, [R2]") == "LDG" and opcode("  FFMA.SAT R1, R2, R3, R4 ;") == "FFMA"


NVDISASM = """\
//--------------------- .text.other               --------------------------
        /*0000*/                   EXIT ;
//--------------------- .text.k                   --------------------------
	.section	.text.k,"ax",@progbits
k:
.text.k:
	//## File "/home/u/cell.cu", line 6
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/home/u/cell.cu", line 9
        /*0010*/                   LDG.E R0, desc[UR8][R4.64] ;
	//## File "/home/u/cell.cu", line 4 inlined at "/home/u/cell.cu", line 10
	//## File "/home/u/cell.cu", line 10
        /*0020*/                   FFMA R7, R0, R0, 1 ;
	//## File "/usr/include/cuda_fp16.hpp", line 300 inlined at "/home/u/cell.cu", line 9
	//## File "/home/u/cell.cu", line 9
        /*0030*/                   HMUL2 R0, R0.H0_H0, R0.H0_H0 ;
	//## File "/usr/include/cuda_fp16.hpp", line 310
        /*0040*/                   PRMT R8, R0, 0x7610, R8 ;
	//## File "/home/u/cell.cu", line 12
        /*0050*/                   EXIT ;
.L_x_0:
        /*0060*/                   BRA `(.L_x_0);
        /*0070*/                   NOP;
        /*0080*/                   NOP;
.L_x_3:
//--------------------- SYMBOLS --------------------------
"""


def test_nvdisasm_lines_innermost_in_the_cell_and_no_padding():
    ins = parse_nvdisasm(NVDISASM, "k", "cell.cu")
    assert [(i.address, i.line) for i in ins] == [(0, 6), (0x10, 9), (0x20, 4), (0x30, 9), (0x40, None), (0x50, 12)]
    assert ins[2].text == "FFMA R7, R0, R0, 1" and ins[2].locations == (("/home/u/cell.cu", 4),
                                                                         ("/home/u/cell.cu", 10))
    assert ins[3].locations[0] == ("/usr/include/cuda_fp16.hpp", 300)   # a header: the cell line that called it
    assert parse_nvdisasm(NVDISASM, "other", "cell.cu")[0].text == "EXIT"


CELL = """\
#include <cuda_fp16.h>
__device__ float sq(float v) {
    return v * v + 1.0f;
}
extern "C" __global__ void tr(const float* in, float* out, __half* h, int n) {
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = sq(tile[threadIdx.x][threadIdx.y]);
    h[x] = __hmul(h[x], h[x]);
}
"""


def cell_line(text: str) -> int:
    """The %%cuda cell's number of the CELL line containing `text` (the magic is line 1)."""
    return next(i for i, line in enumerate(CELL.splitlines(), start=2) if text in line)


@pytest.fixture
def view(tmp_cache):
    m = kernellab.compile_cuda(CELL, arch="sm_90", first_line=2, filename="cell.cu")
    return m.tr, m.tr.source_view()


def test_source_view_puts_each_instruction_on_its_cell_line(view):
    k, v = view
    assert [r.line for r in v.rows] == list(range(2, 2 + len(CELL.splitlines())))
    assert v.row(cell_line("tile[threadIdx.y][threadIdx.x] = in[")).counts | {} == {
        **dict.fromkeys(CLASSES, 0), "global_loads": 1, "shared_stores": 1}
    assert v.row(cell_line("__syncthreads")).counts["barriers"] == 1
    read = v.row(cell_line("out[y * n + x] = sq("))
    assert read.counts["shared_loads"] == 1 and read.counts["global_stores"] == 1
    assert v.row(cell_line("return v * v")).counts["ffma"] == 1            # the inlined device function's own line
    half = v.row(cell_line("h[x] = __hmul"))
    assert any(s.startswith("HMUL2") for s in half.sass)                   # header code: on the calling line
    assert half.counts["global_loads"] == 1 and half.counts["global_stores"] == 1
    assert all(not s.startswith("NOP") for r in v.rows for s in r.sass)
    assert v.row(cell_line("#include")).sass == ()
    # Every instruction of the kernel is somewhere, and the totals are the rows' sums.
    listed = [line for line in k.sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/\s+\S", line)
              and not re.search(r"\bNOP\b|BRA `?\(?\.L_x_\d+\)?\s*;\s*\*/\s*$", line)]
    assert v.instructions <= len(listed) and v.instructions >= len(listed) - 1   # the trap loop left out
    assert v.totals["global_loads"] == len(re.findall(r"\bLDG\b", k.sass))
    assert v.totals["shared_loads"] == len(re.findall(r"\bLDS\b", k.sass))


def test_ptx_is_beside_its_line_too(view):
    _, v = view
    assert any(p.startswith("ld.shared") for p in v.row(cell_line("out[y * n + x] = sq(")).ptx)
    assert any(p.startswith("st.shared") for p in v.row(cell_line("tile[threadIdx.y][threadIdx.x] = in[")).ptx)
    assert any(p.startswith("bar.sync") for p in v.row(cell_line("__syncthreads")).ptx)


def test_ptx_lines_follow_inlined_at_out_of_other_files():
    module = '.file 1 "/x/cell.cu"\n.file 2 "/inc/cuda_fp16.hpp"\n'
    entry = ("{\n.loc 1 5 3\nld.global.u16 %rs1, [%rd1];\n.loc 2 300 1, function_name $L0, inlined_at 1 7 9\n"
             "mul.f16 %rs2, %rs1, %rs1;\n$L__BB0_2:\n// comment\n.loc 1 9 1\nret;\n}\n")
    assert ptx_lines(module, entry, "cell.cu") == {5: ["ld.global.u16 %rs1, [%rd1]"], 7: ["mul.f16 %rs2, %rs1, %rs1"],
                                                  9: ["ret"]}


def test_the_view_renders_as_two_columns_text_html_and_json(view):
    _, v = view
    line = cell_line("__syncthreads")
    text = str(v)
    assert text.splitlines()[1].split()[:3] == ["line", "source", "SASS"]
    assert re.search(rf"^\s*{line}\s+__syncthreads\(\);\s+1\s", text, re.M)
    html = v._repr_html_()
    row = re.search(rf"<tr data-line='{line}'>(.*?)</tr>", html).group(1)
    assert "__syncthreads();" in row and "BAR.SYNC" in row
    assert "&lt;cuda_fp16.h&gt;" in html                                   # escaped
    bundle = v._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"} and REPORT_MIME not in bundle   # Lab shows the HTML
    j = v.to_json()
    assert j["kind"] == "source" and j["rows"][line - 2]["counts"]["barriers"] == 1 and j["profiled"] is False


def test_numba_kernels_have_a_source_view_too(tmp_cache):
    pytest.importorskip("numba")
    from kernellab.kernel_numba import numba_module

    src = "@cuda.jit\ndef scale(x, a):\n    i = cuda.grid(1)\n    if i < x.size:\n        x[i] = x[i] * a + 1.0\n"
    module = numba_module(src, signatures={"scale": "float32[::1], float32"}, arch="sm_90", simulate=True,
                          first_line=2)
    v = module.scale.source_view()
    body = v.row(6)                                                           # `x[i] = x[i] * a + 1.0`
    assert body.source.strip().startswith("x[i] = x[i] * a") and body.counts["ffma"] >= 1
    assert body.counts["global_loads"] >= 1 and body.counts["global_stores"] >= 1


def test_cuda_magic_sass_shows_the_source_view(tmp_cache, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    result = ip.run_cell("%%cuda --arch sm_90 --sass\n" + CELL)
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "tr (sm_90):" in out and re.search(rf"^\s*{cell_line('__syncthreads')}\s+__syncthreads\(\);", out, re.M)


# --- Nsight Compute's per-line figures -------------------------------------------------------------------------

NCU_CELL = """\
extern "C" __global__ void t32(const float* in, float* out, int n) {
    __shared__ float tile[32][32];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
"""
N = 1024                                  # the capture: a 1024 x 1024 transpose, 32 x 32 blocks of 32 x 32 threads
WARP_ACCESSES = N * N // 32


def test_line_profiles_from_the_captured_source_page():
    p = ncu_source.parse_line_profiles(SASS_PAGE, symbol="transpose_naive")
    assert sorted(p) == [2, 4, 5, 6, 7, 8, 9]
    store, load = p[5], p[8]
    assert store.global_bytes == N * N * 4 and load.global_bytes == N * N * 4     # read in, write out: once each
    assert store.shared_wavefronts == store.shared_ideal_wavefronts == WARP_ACCESSES and store.conflict_ways == 1
    assert load.shared_wavefronts == 32 * WARP_ACCESSES and load.bank_conflict_wavefronts == 31 * WARP_ACCESSES
    assert load.conflict_ways == 32
    assert load.instructions_executed == 7 * WARP_ACCESSES and load.thread_instructions_executed == 32 * 7 * WARP_ACCESSES
    assert p[6].instructions_executed == WARP_ACCESSES                           # __syncthreads: one BAR per warp
    assert load.stall_samples == sum(n for _, n in load.stalls) == 326
    assert load.stalls[0] == ("short scoreboard", 209) and ("barrier", 86) in load.stalls
    assert store.stalls[0] == ("long scoreboard", 155)
    assert ncu_source.parse_line_profiles(SASS_PAGE, line_offset=10)[18] == load
    assert ncu_source.parse_line_profiles(CUDA_PAGE) == {}               # ncu could not open the source: no rows


def test_the_view_with_ncu_figures(tmp_cache):
    m = kernellab.compile_cuda(NCU_CELL, arch="sm_90", first_line=2, filename="cell.cu")
    v = ncu_source.lines_from_output(m.t32.source_view(), SASS_PAGE.replace('"transpose_naive"', '"t32"'), "", 0,
                                     "t32")
    assert v.profiled and v.row(8).profile.bank_conflict_wavefronts == 31 * WARP_ACCESSES
    assert v.row(8).counts["shared_loads"] == 1 and v.row(3).profile is None        # __shared__: no code
    assert "bank excess" in str(v) and "1,015,808" in str(v)
    html = v._repr_html_()
    assert "bank-conflict wavefronts" in html and "short scoreboard 209" in html
    assert v.to_json()["rows"][8 - 2]["profile"]["bank_conflict_wavefronts"] == 31 * WARP_ACCESSES
    with pytest.raises(ncu_source.NcuError, match="profiled no launch of t32"):
        ncu_source.lines_from_output(m.t32.source_view(), CUDA_PAGE, "", 0, "t32")


def _fake_ncu(tmp_path, body: str) -> str:
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\nimport sys\nargv = sys.argv[1:]\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def no_gpu_launch_checks(monkeypatch):
    from kernellab.kernel import Kernel
    from kernellab.run.launch import device, worker

    monkeypatch.setattr(device, "require_gpu", lambda what="": None)
    monkeypatch.setattr(worker, "sync_caller", lambda: None)
    monkeypatch.setattr(Kernel, "check_launch", lambda kernel, grid, block, args, shared_bytes=0, cluster=None: (
        types.SimpleNamespace(grid=grid, block=block, shared_bytes=shared_bytes, cluster=cluster),
        types.SimpleNamespace(index=0)))


def test_profile_lines_runs_the_launch_under_ncu(tmp_path, tmp_cache, no_gpu_launch_checks):
    import numpy as np

    m = kernellab.compile_cuda(NCU_CELL, arch="sm_90", first_line=2, filename="cell.cu")
    (tmp_path / "page.csv").write_text(SASS_PAGE.replace('"transpose_naive"', '"t32"'))
    ncu = _fake_ncu(tmp_path, f"""
        assert "--page" in argv and "SourceCounters" in argv and argv[argv.index("-k") + 1] == "regex:^t32$", argv
        assert argv[-5:-3] == ["-m", "kernellab.run.launch.job"], argv
        sys.stdout.write(open({str(tmp_path / "page.csv")!r}).read())
        """)
    x = np.zeros((N, N), np.float32)
    v = m.t32.profile_lines((32, 32), (32, 32), x, np.empty_like(x), N, ncu=ncu)
    assert v.profiled and v.row(5).profile.global_bytes == N * N * 4 and v.profile_note is None


def test_profile_lines_says_why_it_could_not_measure(tmp_path, tmp_cache, no_gpu_launch_checks):
    import numpy as np

    m = kernellab.compile_cuda(NCU_CELL, arch="sm_90", first_line=2, filename="cell.cu")
    ncu = _fake_ncu(tmp_path, "print('==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'); sys.exit(1)\n")
    x = np.zeros((32, 32), np.float32)
    v = m.t32.profile_lines(1, (32, 32), x, x, 32, ncu=ncu)
    assert not v.profiled and "ERR_NVGPUCTRPERM" in v.profile_note and "not profiled" in str(v)
    assert v.rows == m.t32.source_view().rows                                 # the static view, whole
    with pytest.raises(ncu_source.NcuUnavailableError):
        m.t32.profile_lines(1, (32, 32), x, x, 32, ncu=ncu, strict=True)


def test_profile_lines_without_a_gpu_says_so(tmp_cache):
    if kernellab.has_gpu():
        pytest.skip("a GPU is usable here")
    m = kernellab.compile_cuda(NCU_CELL, arch="sm_90", first_line=2)
    with pytest.raises(kernellab.NoGPUError, match="profiling t32 with Nsight Compute needs a CUDA GPU"):
        m.t32.profile_lines(1, (32, 32), 0, 0, 0, ncu=sys.executable)
