"""racecheck and synccheck without a GPU (kernellab.run.simrace): the race corpus's verdicts and line pairs, every
hazard kind, clean kernels, barrier placement, and the same SanitizerReport as compute-sanitizer's; the comparison
with compute-sanitizer's own verdicts once tests/golden/racecheck_sm90.csv is recorded on a GPU."""
import csv
import importlib.util
import pathlib
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")

import kernellab  # noqa: E402
from kernellab.errors import ArgumentError, KernellabError  # noqa: E402
from kernellab.run.sanitize import SanitizerReport  # noqa: E402
from kernellab.run.simrace import sanitize_simulated  # noqa: E402

from numba import cuda  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "racecheck_sm90.csv"
pytestmark = pytest.mark.filterwarnings("ignore::kernellab.run.numba_sim.SimulatorNotice")


def load_corpus():
    """tests/fixtures/race_corpus.py as a module (also what tools/gpu/record_racecheck.py loads)."""
    name = "kernellab_race_corpus"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "fixtures" / "race_corpus.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


corpus = load_corpus()


def run_case(c, tool="racecheck+synccheck"):
    return sanitize_simulated(c.kernel, c.grid, c.block, c.args(np.random.default_rng(0)), tool=tool,
                              shared_bytes=c.shared_bytes)


def verdict(report):
    """{'racecheck': {(line, line)}, 'synccheck': {(line, 'warp' | 'block')}} from a report's findings."""
    races = {tuple(sorted(f.lines)) for f in report.findings if f.kind == "race"}
    barriers = {(f.lines[0], "warp" if "in warp" in f.message else "block") for f in report.findings
                if f.kind == "barrier"}
    return {"racecheck": races, "synccheck": barriers}


# -- the corpus ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("c", corpus.CASES, ids=[c.name for c in corpus.CASES])
def test_corpus_verdicts_and_line_pairs(c):
    report = run_case(c)
    assert report.job_status == "ok", report
    assert verdict(report) == corpus.expected(c), report
    assert report.simulated and report.ok == (not c.races and not c.barriers)


def test_every_hazard_kind_is_named_with_its_accesses():
    raw = run_case(corpus.case("reverse_racy"), "racecheck").findings[0]
    assert (raw.hazard, raw.access, raw.other_access) == ("RAW", "Write", "Read")
    war = run_case(corpus.case("matmul_no_sync_after_compute"), "racecheck").findings
    assert {(f.hazard, f.access, f.other_access) for f in war} == {("WAR", "Read", "Write")}
    waw = run_case(corpus.case("same_slot_racy"), "racecheck").findings[0]
    assert (waw.hazard, waw.access, waw.other_access) == ("WAW", "Write", "Write")
    assert waw.thread[0] % 32 == waw.other_thread[0] % 32 and waw.thread != waw.other_thread   # t and t + 32
    atomic = run_case(corpus.case("histogram_init_racy"), "racecheck").findings[0]
    assert (atomic.hazard, atomic.access, atomic.other_access) == ("WAW", "Write", "Atomic")


def test_a_finding_names_threads_block_address_and_element():
    c = corpus.case("reverse_racy")
    f = run_case(c, "racecheck").findings[0]
    w, r = corpus.markers(c.kernel)["w"], corpus.markers(c.kernel)["r"]
    assert f.kind == "race" and f.lines == (w, r) and f.where.source_line.strip().startswith("tile[t] = x[i]")
    assert f.block == (0, 0, 0) and f.thread[0] + f.other_thread[0] == 63       # tile[t] read by thread 63 - t
    assert f.address == hex(4 * f.thread[0]) and f.size_bytes == 4
    assert f.detail.startswith(f"tile[{f.thread[0]}] (the shared array of line {w - 3})")
    assert f.count == 128                                                        # 64 elements in each of 2 blocks
    j = f.to_json()
    assert j["where"]["line"] == w and j["other"]["line"] == r and j["other_thread"] == list(f.other_thread)


def test_threads_of_one_warp_race_without_syncwarp():
    """Since Volta a warp's threads need not run in lockstep: only syncwarp() (or syncthreads()) orders them."""
    f = run_case(corpus.case("warp_exchange_unsynced"), "racecheck").findings[0]
    assert f.thread[0] // 32 == f.other_thread[0] // 32 and "threads of one warp" in f.detail
    assert run_case(corpus.case("warp_exchange_syncwarp")).ok


def test_atomics_do_not_race_with_each_other():
    report = run_case(corpus.case("histogram_ok"), "racecheck")
    assert report.ok, report


def test_clean_kernels_have_no_findings_on_awkward_launches():
    """No false positives when the block is not a whole number of warps, or several blocks share the arrays."""
    x = np.arange(64, dtype=np.float32)
    assert sanitize_simulated(corpus.reverse_ok, 1, 64, (x, np.zeros(64, np.float32))).ok
    c = corpus.case("early_exit_ok")
    for n in (1, 33, 64):
        args = (np.ones(64, np.float32), np.zeros(64, np.float32), n)
        assert sanitize_simulated(c.kernel, 1, 64, args, tool="racecheck+synccheck").ok


# -- barriers ------------------------------------------------------------------------------------------------------


def test_divergent_barrier_in_a_warp_counts_each_waiting_thread():
    """As compute-sanitizer counts it: one error per thread that reached the barrier (16 of 32)."""
    c = corpus.case("divergent_warp_barrier")
    report = run_case(c, "synccheck")
    (f,) = report.findings
    assert (f.kind, f.tool, f.count, report.error_count) == ("barrier", "synccheck", 16, 16)
    assert f.message == "Barrier error detected. Divergent thread(s) in warp"
    assert f.lines == (corpus.markers(c.kernel)["b"],) and f.thread == (0, 0, 0)
    assert "threads 0-15 of warp 0 wait" in f.detail and "threads 16-31 returned at line" in f.detail


def test_block_level_barrier_placement():
    """A whole warp skipping a barrier the other waits at; a barrier every thread reaches is fine anywhere."""
    (f,) = run_case(corpus.case("divergent_block_barrier"), "synccheck").findings
    assert f.message.endswith("Divergent thread(s) in block") and f.count == 32
    src = ("@cuda.jit\ndef k(x):\n    t = cuda.threadIdx.x\n    if t < 64:\n        cuda.syncthreads()\n"
           "    x[t] = 1.0\n")
    ns = {"cuda": cuda}
    exec(compile(src, "<barrier-placement>", "exec"), ns)
    assert sanitize_simulated(ns["k"], 1, 64, (np.zeros(64, np.float32),), tool="synccheck").ok


def test_barriers_at_different_lines_in_one_warp():
    src = ("def k(x):\n    t = cuda.threadIdx.x\n    if t % 2 == 0:\n        cuda.syncthreads()\n    else:\n"
           "        cuda.syncthreads()\n    x[t] = 1.0\n")
    import linecache

    linecache.cache["<two-barriers>"] = (len(src), None, src.splitlines(True), "<two-barriers>")
    ns = {"cuda": cuda}
    exec(compile(src, "<two-barriers>", "exec"), ns)
    report = sanitize_simulated(ns["k"], 1, 32, (np.zeros(32, np.float32),), tool="synccheck")
    assert sorted(f.lines[0] for f in report.findings) == [4, 6]
    assert all(f.message.endswith("in warp") and f.count == 16 for f in report.findings)


def test_syncwarp_waiting_for_lanes_in_syncthreads_is_a_deadlock():
    from kernellab.run.numba_sim import simulate
    from kernellab.run.simsched import SimulatedDeadlockError

    src = ("def k(x):\n    t = cuda.threadIdx.x\n    if t == 0:\n        cuda.syncwarp()\n    else:\n"
           "        cuda.syncthreads()\n    x[t] = 1.0\n")
    ns = {"cuda": cuda}
    exec(compile(src, "<deadlock>", "exec"), ns)
    report = sanitize_simulated(ns["k"], 1, 32, (np.zeros(32, np.float32),), tool="synccheck")
    deadlock, skipped = report.findings          # and lane 0 then skips the syncthreads() the others wait at
    assert (deadlock.kind, deadlock.lines) == ("deadlock", (4,))
    assert "wait in syncthreads() at line 6" in deadlock.detail
    assert (skipped.kind, skipped.lines) == ("barrier", (6,))
    with pytest.raises(SimulatedDeadlockError, match=r"waits in syncwarp\(\) at line 4"):
        simulate(ns["k"], 1, 32, (np.zeros(32, np.float32),))


# -- the report ----------------------------------------------------------------------------------------------------


def test_the_report_is_the_gpu_sanitizers_type_and_display():
    report = run_case(corpus.case("transpose_racy"))
    assert isinstance(report, SanitizerReport) and report.tool == "racecheck+synccheck" and not report.ok
    text = str(report)
    assert text.startswith("racecheck+synccheck (simulator): 1 distinct problem in transpose_racy")
    assert "shared-memory data race (RAW hazard): Write at line" in text and "and Read at line" in text
    assert "tile[" in text and "syncthreads() orders these accesses" in text
    assert "<table" in report._repr_html_()
    j = report.to_json()
    assert j["kind"] == "sanitize" and j["simulated"] is True and j["findings"][0]["kind"] == "race"
    from kernellab.report import REPORT_MIME

    assert REPORT_MIME in report._repr_mimebundle_()


def test_arguments_are_not_modified_and_errors_end_the_launch_with_a_note():
    c = corpus.case("reverse_racy")
    x, y = np.arange(128, dtype=np.float32), np.full(128, 7, np.float32)
    sanitize_simulated(c.kernel, 2, 64, (x, y))
    assert (y == 7).all()
    report = sanitize_simulated(c.kernel, 3, 64, (x, y))          # block 2 reads x[128:]: IndexError
    assert report.job_status == "error" and any("IndexError" in n for n in report.notes)
    assert report.findings and report.findings[0].kind == "race"  # what blocks 0 and 1 showed


def test_tools_in_the_simulator():
    c = corpus.case("reverse_racy")
    args = c.args(np.random.default_rng(0))
    with pytest.raises(KernellabError, match="memcheck runs under compute-sanitizer on a GPU"):
        sanitize_simulated(c.kernel, 2, 64, args, tool="memcheck")
    with pytest.raises(ValueError, match="unknown tool 'racechek'"):
        sanitize_simulated(c.kernel, 2, 64, args, tool="racechek")
    both = sanitize_simulated(c.kernel, 2, 64, args, tool="all")
    assert both.tool == "racecheck+synccheck" and any("memcheck and initcheck need a GPU" in n for n in both.notes)


# -- through the kernel and the magics --------------------------------------------------------------------------


def test_numba_kernel_sanitize_runs_in_the_simulator():
    c = corpus.case("reduce_loop_racy")
    k = kernellab.numba_kernel(c.kernel, simulate=True)
    args = c.args(np.random.default_rng(0))
    report = k.sanitize(c.grid, c.block, *args, tool="racecheck")
    assert report.simulated and report.kernel == "reduce_loop_racy"
    assert verdict(report)["racecheck"] == corpus.expected(c)["racecheck"]
    with pytest.raises(KernellabError, match="memcheck runs under compute-sanitizer"):
        k.sanitize(c.grid, c.block, *args)                       # the default tool needs a GPU
    with pytest.raises(ArgumentError, match="runs every thread"):
        k.sanitize(64, c.block, *args, tool="racecheck", max_threads=1000)
    with pytest.raises(ArgumentError, match=r"argument 0 \('x'"):
        k.sanitize(c.grid, c.block, args[0].astype(np.float64), args[1], tool="racecheck")


def test_numba_cell_racecheck_names_cell_lines():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    cell = ("%%numba --sim\nfrom numba import float32\n@cuda.jit\ndef shift(x, y):\n"
            "    s = cuda.shared.array(32, float32)\n    t = cuda.threadIdx.x\n    s[t] = x[t]\n"
            "    y[t] = s[(t + 1) % 32]\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ip.run_cell(cell).success
        ip.user_ns.update(xs=np.arange(32, dtype=np.float32), ys=np.zeros(32, np.float32))
        report = ip.run_line_magic("launch", "--sanitize=racecheck shift[1, 32](xs, ys)")
    (f,) = report.findings
    assert f.lines == (7, 8) and f.where.cell_line == 7 and f.where.source_line.strip() == "s[t] = x[t]"
    assert str(report).splitlines()[1].endswith("Write at line 7: s[t] = x[t]")


# -- against compute-sanitizer ------------------------------------------------------------------------------------


def golden_rows():
    with open(GOLDEN) as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@pytest.mark.skipif(not GOLDEN.exists(), reason="tests/golden/racecheck_sm90.csv is not recorded yet: run "
                                                "tools/gpu/record_racecheck.py on a GPU")
def test_simulator_agrees_with_compute_sanitizer():
    mismatches, rows = [], golden_rows()
    assert {r["kernel"] for r in rows} == {c.name for c in corpus.CASES}, "re-record the golden table"
    for row in rows:
        c = corpus.case(row["kernel"])
        report = run_case(c, row["tool"])
        mine = (corpus.verdict(report), corpus.describe(c, report))
        gpu = (row["verdict"], row["findings"])
        if mine != gpu:
            mismatches.append(f"{c.name} {row['tool']}: compute-sanitizer {gpu}, simulator {mine}")
    assert not mismatches, "\n".join(mismatches)
