"""Nsight Compute's per-line source page (kernellab.run.nvtools.ncu_source), against a real capture from an H200.

CPU only: the parser reads tests/fixtures/captured/ncu_source_sass.csv (a bank-conflicted 32x32 transpose, see the
README there); running ncu is exercised with stand-in `ncu` scripts; profile_banks with a stand-in KernelJob.
"""
import csv
import io
import json
import pathlib
import re
import runpy
import stat
import sys
import textwrap
import types

import pytest

from kernellab.analysis.banks import analyze_access
from kernellab.report import REPORT_MIME
from kernellab.run.nvtools import ncu_source
from kernellab.run.nvtools.ncu_source import (
    NcuError,
    NcuUnavailableError,
    ncu_bank_command,
    parse_source_page,
    report_from_output,
    run_ncu_banks,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CAPTURED = ROOT / "tests" / "fixtures" / "captured"
SASS_PAGE = (CAPTURED / "ncu_source_sass.csv").read_text()
# The source the capture compiled (CuPy, -lineinfo): its first line is empty, so the kernel starts on line 2.
CAPTURE_SRC = runpy.run_path(str(ROOT / "tools" / "gpu" / "capture_tools.py"))["SRC"]
N = 1024                          # the capture's matrix: 32 x 32 blocks of 32 x 32 threads
WARP_ACCESSES = N * N // 32       # one shared access per warp per line: 32,768


def _line_of(text: str, first_line: int = 1) -> int:
    """Line number of the capture source's first line containing `text`."""
    return next(i for i, line in enumerate(CAPTURE_SRC.splitlines(), start=first_line) if text in line)


STORE_LINE = _line_of("tile[threadIdx.y][threadIdx.x] = in[")   # 5
LOAD_LINE = _line_of("= tile[threadIdx.x][threadIdx.y]")         # 8: the column read


@pytest.fixture(scope="module")
def naive():
    reports = parse_source_page(SASS_PAGE)
    assert len(reports) == 1
    return reports[0]


# --- parsing the captured page ----------------------------------------------------------------------------------


def test_captured_page_has_the_kernel_and_its_two_shared_lines(naive):
    assert naive.kernel == "transpose_naive" and naive.measured and naive.reason is None
    assert naive.file.endswith(".cubin.cu")
    assert [(c.line, c.kind) for c in naive.lines] == [(STORE_LINE, "store"), (LOAD_LINE, "load")]
    assert (STORE_LINE, LOAD_LINE) == (5, 8)


def test_column_read_takes_32_times_its_ideal_wavefronts(naive):
    load = naive.line(LOAD_LINE)
    assert (load.instructions, load.wavefronts, load.ideal_wavefronts) == (WARP_ACCESSES, 32 * WARP_ACCESSES,
                                                                           WARP_ACCESSES)
    assert load.wavefronts == 32 * load.ideal_wavefronts and load.wavefronts_per_instruction == 32.0
    assert load.excess_wavefronts == 31 * WARP_ACCESSES == 1_015_808
    assert load.ways == 32 and load.access_bytes == 4 and load.sass == ("LDS R9, [R6]",)


def test_row_write_is_conflict_free(naive):
    store = naive.line(STORE_LINE, "store")
    assert (store.instructions, store.wavefronts, store.ideal_wavefronts, store.excess_wavefronts) == (
        WARP_ACCESSES, WARP_ACCESSES, WARP_ACCESSES, 0)
    assert store.ways == 1 and store.sass == ("STS [R5], R0",)


def test_totals(naive):
    # Line 5 also loads from global memory and line 8 stores to it: only the shared instructions count here.
    assert naive.instructions == 2 * WARP_ACCESSES == 65_536
    assert naive.wavefronts == 33 * WARP_ACCESSES == 1_081_344
    assert naive.ideal_wavefronts == 65_536 and naive.excess_wavefronts == 1_015_808
    assert naive.ways == 32


def test_bank_model_predicts_the_captured_counters(naive):
    """Warp w of a 32x32 block (threadIdx.y = w) reads tile[lane][w]: word 32 lane + w, all in bank w."""
    per_warp_load = {analyze_access([4 * (32 * lane + w) for lane in range(32)]).wavefronts for w in range(32)}
    per_warp_store = {analyze_access([4 * (32 * w + lane) for lane in range(32)]).wavefronts for w in range(32)}
    assert per_warp_load == {32} and per_warp_store == {1}
    assert naive.line(LOAD_LINE).wavefronts == 32 * naive.line(LOAD_LINE).instructions
    assert naive.line(STORE_LINE).wavefronts == 1 * naive.line(STORE_LINE).instructions


def test_source_text_and_line_offset():
    (r,) = parse_source_page(SASS_PAGE, source=CAPTURE_SRC)
    assert r.line(LOAD_LINE).source == "out[y * n + x] = tile[threadIdx.x][threadIdx.y];"
    assert r.line(STORE_LINE).source == "tile[threadIdx.y][threadIdx.x] = in[y * n + x];"
    # Number the lines from the kernel's signature (line 1) instead: ncu's line 8 is shown as 7.
    src = CAPTURE_SRC.lstrip("\n")
    (shifted,) = parse_source_page(SASS_PAGE, line_offset=-1, source=src)
    assert [c.line for c in shifted.lines] == [4, 7] and shifted.line_offset == -1
    assert shifted.line(7).source.endswith("tile[threadIdx.x][threadIdx.y];")
    with pytest.raises(KeyError, match=r"lines measured: 4 \(store\), 7 \(load\)"):
        shifted.line(8)
    with pytest.raises(KeyError, match="kind 'store'"):
        shifted.line(7, "store")


def test_without_source_ncu_text_is_dropped(naive):
    assert all(c.source == "" for c in naive.lines)  # ncu cannot open sources compiled by NVRTC or CuPy


def test_reports_text_html_json(naive):
    text = str(naive)
    assert "transpose_naive" in text and "1,015,808" in text and "32.00" in text
    assert re.search(r"^8\s+load\s+4\s+32768\s+1048576\s+32768\s+1015808", text, re.M)
    html = naive._repr_html_()
    assert "<table" in html and "transpose_naive" in html
    data = naive.to_json()
    assert (data["kind"], data["version"], data["source"], data["measured"]) == ("banks", 1, "ncu", True)
    assert data["wavefronts"] == 1_081_344 and data["excess_wavefronts"] == 1_015_808
    assert data["lines"][1] == {"file": naive.file, "line": 8, "source": "", "kind": "load", "access_bytes": 4,
                                "instructions": 32768, "wavefronts": 1048576, "ideal_wavefronts": 32768,
                                "excess_wavefronts": 1015808, "ways": 32, "sass": ["LDS R9, [R6]"]}
    json.dumps(data)
    bundle = naive._repr_mimebundle_()
    assert bundle[REPORT_MIME]["kind"] == "banks" and "text/html" in bundle


def test_results_are_frozen(naive):
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        naive.lines[0].wavefronts = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        naive.kernel = "x"


# --- other shapes of ncu output ---------------------------------------------------------------------------------


def _csv_rows(text):
    return list(csv.reader([line for line in text.splitlines() if line.startswith('"')]))


def _write_csv(rows):
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def test_two_kernels_and_program_output_in_between():
    rows = _csv_rows(SASS_PAGE)
    second = [r if r[0] != "Function Name" else ["Function Name", "transpose_other"] for r in rows]
    text = "max error 0.0\n==PROF== Connected\n" + _write_csv(rows) + "hello from the program\n" + _write_csv(second)
    a, b = parse_source_page(text)
    assert (a.kernel, b.kernel) == ("transpose_naive", "transpose_other")
    assert a.wavefronts == b.wavefronts == 1_081_344
    picked = report_from_output(text, "", 0, "transpose_other")
    assert picked.kernel == "transpose_other"


def test_code_inlined_from_a_header_joins_its_kernel():
    """ncu lists a kernel's lines per source file: a second file of the same function is the same launch."""
    rows = _csv_rows(SASS_PAGE)
    header_at = next(i for i, r in enumerate(rows) if r[0] == "Line No")
    header_file = [["File Path", "/usr/include/helpers.cuh"], ["Function Name", "transpose_naive"], rows[header_at]]
    helper_rows = [r if r[0] != "8" else ["3"] + r[1:] for r in rows[header_at + 1:]]
    text = _write_csv(rows) + _write_csv(header_file + helper_rows)
    (r,) = parse_source_page(text, source=CAPTURE_SRC, filename="749ae013bc3d2d5994ad1e260bc34586cb6400c5.cubin.cu")
    assert [(c.file.rsplit("/", 1)[-1], c.line, c.kind) for c in r.lines] == [
        ("749ae013bc3d2d5994ad1e260bc34586cb6400c5.cubin.cu", 5, "store"),
        ("749ae013bc3d2d5994ad1e260bc34586cb6400c5.cubin.cu", 8, "load"),
        ("helpers.cuh", 3, "load"), ("helpers.cuh", 5, "store")]
    assert r.lines[1].source.startswith("out[y * n + x]") and r.lines[2].source == ""  # the header's text is unknown
    assert r.file.endswith(".cubin.cu") and r.wavefronts == 2 * 1_081_344
    # The same function again in a file it already had: a second launch.
    assert len(parse_source_page(_write_csv(rows) + _write_csv(rows))) == 2


def test_source_rows_only_keep_whole_lines():
    """`--print-source cuda` alone: no SASS rows, so no split by kind and no shared instruction count."""
    rows = _csv_rows(SASS_PAGE)
    header_at = next(i for i, r in enumerate(rows) if r[0] == "Line No")
    header = rows[header_at]
    keep = [i for i, name in enumerate(header) if not (name in ("Address",) or (name == "Source" and i > 1))]
    body = [[r[i] for i in keep] for r in rows[header_at + 1:] if r[0].strip()]
    text = _write_csv(rows[:header_at] + [[header[i] for i in keep]] + body)
    (r,) = parse_source_page(text)
    assert [(c.line, c.kind, c.instructions) for c in r.lines] == [(5, "shared", None), (8, "shared", None)]
    assert r.line(8).wavefronts == 1_048_576 and r.line(8).wavefronts_per_instruction is None
    assert r.instructions == 0 and r.wavefronts == 1_081_344


def test_the_failed_cuda_only_capture_has_no_kernel():
    assert parse_source_page((CAPTURED / "ncu_source_cuda.csv").read_text()) == ()


def test_a_page_without_source_counters_says_which_section_to_add():
    text = '"File Path","a.cu"\n"Function Name","k"\n"Line No","Source","Instructions Executed"\n"1","x","3"\n'
    with pytest.raises(NcuError, match="--section SourceCounters"):
        parse_source_page(text)


# --- the ncu command and running it -----------------------------------------------------------------------------


def test_command_profiles_one_launch_of_the_exact_symbol():
    cmd = ncu_bank_command(["python", "-m", "kernellab.run.launch.job", "/tmp/j"], "transpose_tile32", ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu" and cmd[-4:] == ["python", "-m", "kernellab.run.launch.job", "/tmp/j"]
    joined = " ".join(cmd)
    for part in ("--clock-control none", "--csv", "--page source", "--print-source cuda,sass",
                 "--section SourceCounters", "-k regex:^transpose_tile32$", "--launch-count 1",
                 "--kernel-name-base mangled"):
        assert part in joined, part
    cpp = ncu_bank_command(["prog"], "_Z9transposePKfPfii", ncu="ncu", launch_skip=2)
    assert "regex:^_Z9transposePKfPfii$" in cpp and cpp[cpp.index("--launch-skip") + 1] == "2"
    with pytest.raises(ValueError, match="symbol"):
        ncu_bank_command(["prog"], "")


def _fake_ncu(tmp_path, body: str) -> str:
    """An executable standing in for ncu: runs `body` (Python) with `argv` = its arguments."""
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\nimport sys\nargv = sys.argv[1:]\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_run_parses_what_ncu_prints(tmp_path):
    ncu = _fake_ncu(tmp_path, f"""
        assert argv[argv.index("-k") + 1] == "regex:^transpose_naive$", argv
        assert argv[-2:] == ["target", "arg"], argv
        sys.stdout.write(open({str(CAPTURED / "ncu_source_sass.csv")!r}).read())
        """)
    r = run_ncu_banks(["target", "arg"], "transpose_naive", ncu=ncu, source=CAPTURE_SRC)
    assert r.measured and r.command[0] == ncu and r.command[-2:] == ("target", "arg")
    assert r.line(8).wavefronts == 1_048_576 and r.line(8).source.startswith("out[y * n + x]")
    assert "==PROF== Connected to process" in r.log


PERM = ("==PROF== Connected to process 12 (/usr/bin/python3)\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
        "on the target device 0. For instructions on enabling permissions and to get more information see "
        "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_counters_not_permitted_fall_back_to_the_model(tmp_path, stream):
    ncu = _fake_ncu(tmp_path, f"sys.{stream}.write({PERM!r}); sys.exit(1)\n")
    r = run_ncu_banks(["target"], "transpose_tile32", ncu=ncu)
    assert not r.measured and r.lines == () and "ERR_NVGPUCTRPERM" in r.reason
    assert "falling back to the model" in str(r) and "falling back to the model" in r._repr_html_()
    assert r.to_json()["measured"] is False and r.to_json()["reason"] == r.reason
    with pytest.raises(KeyError, match="ERR_NVGPUCTRPERM"):
        r.line(8)
    with pytest.raises(NcuUnavailableError, match="not available here") as info:
        run_ncu_banks(["target"], "transpose_tile32", ncu=ncu, strict=True)
    assert "ERR_NVGPUCTRPERM" in info.value.reason and "ERR_NVGPUCTRPERM" in info.value.log


def test_injection_library_not_loaded_is_unavailable(tmp_path):
    ncu = _fake_ncu(tmp_path, "print('==ERROR== Failed to connect: LibraryNotLoaded')\n")
    assert "LibraryNotLoaded" in run_ncu_banks(["target"], "k", ncu=ncu).reason


def test_missing_ncu_is_unavailable(tmp_path, monkeypatch):
    r = run_ncu_banks(["target"], "k", ncu=str(tmp_path / "no-such-ncu"))
    assert not r.measured and "could not be started" in r.reason
    monkeypatch.setattr(ncu_source, "find_ncu", lambda: None)
    r = run_ncu_banks(["target"], "k")
    assert not r.measured and "ncu) was not found" in r.reason and "ncu=PATH" in r.reason
    with pytest.raises(NcuUnavailableError):
        run_ncu_banks(["target"], "k", strict=True)


def test_no_kernel_profiled_is_an_error_not_a_fallback(tmp_path):
    ncu = _fake_ncu(tmp_path, "print('==PROF== Disconnected'); print('==WARNING== No kernels were profiled.')\n")
    with pytest.raises(NcuError, match="profiled no launch of transpose_tile32") as info:
        run_ncu_banks(["target"], "transpose_tile32", ncu=ncu)
    assert "No kernels were profiled" in str(info.value) and not isinstance(info.value, NcuUnavailableError)


# --- line numbers: NVRTC's are the cell's ---------------------------------------------------------------------

CELL = """\
extern "C" __global__ void t32(const float* in, float* out, int n) {
    __shared__ float tile[32][32];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
"""


def test_first_line_2_makes_lineinfo_count_cell_lines():
    """`%%cuda` compiles with first_line=2; the PTX line table (which ncu reads) then uses the cell's numbers."""
    from kernellab import compile_cuda

    module = compile_cuda(CELL, arch="sm_90", first_line=2, filename="cell.cu")
    cell = ["%%cuda"] + CELL.splitlines()  # the cell as the user sees it: line 1 is the magic
    lines = {}
    loc = None
    for text in module.t32.ptx.splitlines():
        m = re.match(r"\s*\.loc\s+\d+\s+(\d+)", text)
        if m:
            loc = int(m.group(1))
        elif re.search(r"\b(ld|st)\.shared\b", text):
            lines["load" if "ld.shared" in text else "store"] = loc
    assert cell[lines["store"] - 1].strip() == "tile[threadIdx.y][threadIdx.x] = in[y * n + x];"
    assert cell[lines["load"] - 1].strip() == "out[y * n + x] = tile[threadIdx.x][threadIdx.y];"
    assert (lines["store"], lines["load"]) == (5, 8)


# --- profile_banks with a stand-in job -------------------------------------------------------------------------


@pytest.fixture
def no_gpu_launch_checks(monkeypatch):
    """profile_banks as on a GPU: the device checks pass; the job and ncu are real files and processes."""
    pytest.importorskip("kernellab.run.launch.job", reason="profile_banks runs a kernellab.run.launch.job KernelJob")
    from kernellab.kernel import Kernel
    from kernellab.run.launch import device, worker

    monkeypatch.setattr(device, "require_gpu", lambda what="": None)
    monkeypatch.setattr(worker, "sync_caller", lambda: None)

    def check_launch(kernel, grid, block, args, shared_bytes=0, cluster=None):
        return (types.SimpleNamespace(grid=grid, block=block, shared_bytes=shared_bytes, cluster=cluster),
                types.SimpleNamespace(index=0))

    monkeypatch.setattr(Kernel, "check_launch", check_launch)


def test_profile_banks_runs_the_job_under_ncu(tmp_path, no_gpu_launch_checks):
    import numpy as np

    from kernellab import compile_cuda

    module = compile_cuda(CELL, arch="sm_90", first_line=2, filename="cell.cu")
    (tmp_path / "page.csv").write_text(SASS_PAGE.replace('"transpose_naive"', '"t32"'))
    ncu = _fake_ncu(tmp_path, f"""
        import os
        from kernellab.run.launch.job import KernelJob
        assert argv[-5:-3] == ["-m", "kernellab.run.launch.job"] and argv[-2] == "--out", argv
        assert argv[-6] == {sys.executable!r}
        assert argv[argv.index("-k") + 1] == "regex:^t32$", argv
        job = KernelJob.load(argv[-3])  # the job file exists while ncu runs
        assert (job.symbol, job.grid, job.block, job.first_line) == ("t32", (32, 32, 1), (32, 32, 1), 2), job
        assert [a.describe() for a in job.args][-1] == "n = 1024", job
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == {str(ROOT)!r}
        sys.stdout.write(open({str(tmp_path / "page.csv")!r}).read())
        """)
    x = np.zeros((1024, 1024), np.float32)
    r = module.t32.profile_banks((32, 32), (32, 32), x, np.empty_like(x), 1024, ncu=ncu)
    assert r.kernel == "t32" and r.measured
    assert r.line(8, "load").source == "out[y * n + x] = tile[threadIdx.x][threadIdx.y];"
    assert r.line(8).wavefronts == 32 * r.line(8).instructions


def test_profile_banks_reports_a_launch_that_failed_under_ncu(tmp_path, no_gpu_launch_checks):
    import numpy as np

    from kernellab import compile_cuda

    module = compile_cuda(CELL, arch="sm_90", first_line=2, filename="cell.cu")
    ncu = _fake_ncu(tmp_path, """
        from kernellab.run.launch.job import JobResult
        open(argv[-1], "wb").write(JobResult("launch_error", message="too many resources requested").to_bytes())
        print("==WARNING== No kernels were profiled.")
        """)
    x = np.zeros((32, 32), np.float32)
    with pytest.raises(NcuError, match="t32's launch failed under ncu .launch_error.: too many resources"):
        module.t32.profile_banks(1, (32, 32), x, x, 32, ncu=ncu)


def test_profile_banks_without_a_gpu_says_so():
    from kernellab import NoGPUError, compile_cuda, has_gpu

    if has_gpu():
        pytest.skip("a GPU is usable here: the no-GPU message cannot be seen")
    module = compile_cuda(CELL, arch="sm_90", first_line=2)
    with pytest.raises(NoGPUError, match="profiling t32 with Nsight Compute needs a CUDA GPU"):
        module.t32.profile_banks(1, (32, 32), 0)
