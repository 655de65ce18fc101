"""racecheck and synccheck without a GPU (kernellab.run.sim.race): the race corpus's verdicts and line pairs, every
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
from kernellab.run.findings import SanitizerReport  # noqa: E402
from kernellab.run.sim.race import UNREPORTED_BARRIER, UNREPORTED_RACE, sanitize_simulated  # noqa: E402

from numba import cuda  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "racecheck_sm90.csv"
pytestmark = pytest.mark.filterwarnings("ignore::kernellab.run.sim.numba_sim.SimulatorNotice")


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
    unreported = [n for n in report.notes if n.startswith((UNREPORTED_RACE, UNREPORTED_BARRIER))]
    m = corpus.markers(c.kernel)
    assert bool(unreported) == bool(c.unreported), report
    for name in c.unreported:              # the bug the GPU's tools do not report is still named, in a note
        assert any(f"line {m[name]}" in n for n in unreported), (name, report)


def test_every_hazard_kind_is_named_with_its_accesses():
    raw = run_case(corpus.case("reverse_racy"), "racecheck").findings[0]
    assert (raw.hazard, raw.access, raw.other_access) == ("RAW", "Write", "Read")
    war = run_case(corpus.case("matmul_no_sync_after_compute"), "racecheck").findings
    assert {(f.hazard, f.access, f.other_access) for f in war} == {("WAR", "Read", "Write")}
    waw = run_case(corpus.case("same_slot_racy"), "racecheck").findings[0]
    assert (waw.hazard, waw.access, waw.other_access) == ("WAW", "Write", "Write")
    assert waw.thread[0] % 32 == waw.other_thread[0] % 32 and waw.thread != waw.other_thread   # t and t + 32


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
    assert report.ok and not any(n.startswith(UNREPORTED_RACE) for n in report.notes), report


def test_a_plain_store_against_an_atomic_is_a_note_not_a_finding():
    """racecheck does not report it (the golden table's histogram_init_racy); the simulator says so, and why."""
    c = corpus.case("histogram_init_racy")
    report = run_case(c, "racecheck")
    m = corpus.markers(c.kernel)
    (note,) = [n for n in report.notes if n.startswith(UNREPORTED_RACE)]
    assert report.ok and not report.findings and report.error_count == 0
    assert f"Write at line {m['init']}" in note and f"Atomic at line {m['add']}" in note and "h[" in note
    assert "still a data race" in note
    # the same stores racing with plain reads instead are a finding (the atomics stay out of the shadow)
    src = ("def k(x, out):\n    h = cuda.shared.array(8, int32)\n    t = cuda.threadIdx.x\n    if t < 8:\n"
           "        h[t] = 0\n    cuda.atomic.add(h, t % 8, 1)\n    out[t] = h[t % 8]\n")
    ns = {"cuda": cuda, "int32": corpus.int32}
    exec(compile(src, "<atomic-mix>", "exec"), ns)
    mixed = sanitize_simulated(ns["k"], 1, 64, (np.zeros(64, np.int32), np.zeros(64, np.int32)), tool="racecheck")
    assert {f.lines for f in mixed.findings} == {(5, 7)} and mixed.findings[0].other_access == "Read", mixed
    assert any(n.startswith(UNREPORTED_RACE) for n in mixed.notes)


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
    """Warps waiting at different barriers are divergent; a warp that skips a barrier and exits counts as arrived (on
    sm_90 synccheck does not report it: a note says so); a barrier every thread reaches is fine anywhere."""
    src = ("def k(x):\n    t = cuda.threadIdx.x\n    if t < 32:\n        cuda.syncthreads()\n    else:\n"
           "        cuda.syncthreads()\n    x[t] = 1.0\n")
    ns = {"cuda": cuda}
    exec(compile(src, "<two-warps>", "exec"), ns)
    report = sanitize_simulated(ns["k"], 1, 64, (np.zeros(64, np.float32),), tool="synccheck")
    assert sorted((f.lines[0], f.count) for f in report.findings) == [(4, 32), (6, 32)]
    assert all(f.message.endswith("Divergent thread(s) in block") for f in report.findings)
    skipped = run_case(corpus.case("divergent_block_barrier"), "synccheck")
    (note,) = [n for n in skipped.notes if n.startswith(UNREPORTED_BARRIER)]
    assert skipped.ok and "threads 32-63 returned at line" in note and "threads 0-31 wait at" in note
    src = ("@cuda.jit\ndef k(x):\n    t = cuda.threadIdx.x\n    if t < 64:\n        cuda.syncthreads()\n"
           "    x[t] = 1.0\n")
    ns = {"cuda": cuda}
    exec(compile(src, "<barrier-placement>", "exec"), ns)
    every = sanitize_simulated(ns["k"], 1, 64, (np.zeros(64, np.float32),), tool="synccheck")
    assert every.ok and not any(n.startswith(UNREPORTED_BARRIER) for n in every.notes)


def test_lanes_leaving_a_loop_around_a_barrier_count_as_arrived():
    """loop_trip_barrier is clean on the GPU (ptxas waits for the warp's lanes before a loop's barrier, so the lanes
    that left have exited); a barrier in an `if` inside the loop is predicated, and lanes that skip it diverge."""
    report = run_case(corpus.case("loop_trip_barrier"), "synccheck")
    (note,) = [n for n in report.notes if n.startswith(UNREPORTED_BARRIER)]
    assert report.ok and "threads 0, 2, 4" in note and "in a loop" in note
    src = ("def k(x):\n    t = cuda.threadIdx.x\n    for i in range(2):\n        if i == 0 or t < 16:\n"
           "            cuda.syncthreads()\n    x[t] = 1.0\n"
           "def none_or_once(x):\n    t = cuda.threadIdx.x\n    for _ in range(t % 2):\n        cuda.syncthreads()\n"
           "    x[t] = 1.0\n")
    import linecache

    linecache.cache["<loops>"] = (len(src), None, src.splitlines(True), "<loops>")
    ns = {"cuda": cuda}
    exec(compile(src, "<loops>", "exec"), ns)
    in_if = sanitize_simulated(ns["k"], 1, 32, (np.zeros(32, np.float32),), tool="synccheck")
    (f,) = in_if.findings                                   # the second time round, lanes 16-31 skip it
    assert f.lines == (5,) and f.message.endswith("in warp") and f.count == 16, in_if
    once = sanitize_simulated(ns["none_or_once"], 1, 32, (np.zeros(32, np.float32),), tool="synccheck")
    assert once.ok and any(n.startswith(UNREPORTED_BARRIER) for n in once.notes), once


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
    from kernellab.run.sim.numba_sim import simulate
    from kernellab.run.sim.sched import SimulatedDeadlockError

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
    assert both.tool == "racecheck+synccheck+initcheck" and any("memcheck needs a GPU" in n for n in both.notes)
    assert any("watches shared memory" in n for n in both.notes)


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


def launch_numba_cell(cell: str, launch: str, **names):
    """Runs a %%numba cell in an IPython shell with kernellab loaded, then `%launch {launch}` with `names` in scope."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ip.run_cell(cell).success
        ip.user_ns.update(names)
        return ip.run_line_magic("launch", launch)


def test_numba_cell_racecheck_names_cell_lines():
    cell = ("%%numba --sim\nfrom numba import float32\n@cuda.jit\ndef shift(x, y):\n"
            "    s = cuda.shared.array(32, float32)\n    t = cuda.threadIdx.x\n    s[t] = x[t]\n"
            "    y[t] = s[(t + 1) % 32]\n")
    report = launch_numba_cell(cell, "--sanitize=racecheck shift[1, 32](xs, ys)",
                               xs=np.arange(32, dtype=np.float32), ys=np.zeros(32, np.float32))
    (f,) = report.findings
    assert f.lines == (7, 8) and f.where.cell_line == 7 and f.where.source_line.strip() == "s[t] = x[t]"
    assert str(report).splitlines()[1].endswith("Write at line 7: s[t] = x[t]")


def test_numba_cell_initcheck_names_the_cell_line_and_the_element():
    """`%launch --sanitize=initcheck` on a simulating %%numba kernel: a flip that reads a short chunk as if full."""
    cell = ("%%numba --sim\nfrom numba import float32\n@cuda.jit\ndef flip(x, y, n):\n"
            "    tile = cuda.shared.array(32, float32)\n    t = cuda.threadIdx.x\n    if t < n:\n"
            "        tile[t] = x[t]\n    cuda.syncthreads()\n    if t < n:\n        y[t] = tile[31 - t]\n")
    report = launch_numba_cell(cell, "--sanitize=initcheck flip[1, 32](xs, ys, 20)",
                               xs=np.arange(20, dtype=np.float32), ys=np.zeros(20, np.float32))
    (f,) = report.findings
    assert f.kind == "uninitialized_read" and f.where.cell_line == 11 and f.count == 12    # tile[20:32] unstored
    assert f.detail.startswith("tile[31] (the shared array of line 5)")


# -- against compute-sanitizer ------------------------------------------------------------------------------------


def golden_rows():
    with open(GOLDEN) as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@pytest.mark.skipif(not GOLDEN.exists(), reason="tests/golden/racecheck_sm90.csv is not recorded yet: run "
                                                "tools/gpu/record_racecheck.py on a GPU")
def test_simulator_agrees_with_compute_sanitizer():
    """The same verdict and findings as compute-sanitizer on every case; where the GPU's report stopped at its print
    limit (`complete` 'no'), the pairs of lines it printed are a lower bound: the simulator must find each of them."""
    mismatches, rows = [], golden_rows()
    assert {r["kernel"] for r in rows} == {c.name for c in corpus.CASES}, "re-record the golden table"
    for row in rows:
        c = corpus.case(row["kernel"])
        report = run_case(c, row["tool"])
        mine = (corpus.verdict(report), corpus.describe(c, report))
        gpu = (row["verdict"], row["findings"])
        if row.get("complete", "yes") == "no":
            shown = set(filter(None, row["findings"].split(";")))
            same = mine[0] == gpu[0] and shown <= set(mine[1].split(";"))
        else:
            same = mine == gpu
        if not same:
            mismatches.append(f"{c.name} {row['tool']}: compute-sanitizer {gpu}, simulator {mine}")
    assert not mismatches, "\n".join(mismatches)


def test_a_report_cut_at_the_print_limit_says_so():
    """compute-sanitizer counts every hazard but prints --print-limit of them: the 2026-11-23 recording of
    matmul_no_sync_after_compute printed 100 of 1,794 (all la-mac), so its lb-mac pair was missing."""
    from kernellab.run.nvtools.sanitize import PRINT_LIMIT_NOTE, report_from_text

    hazard = ("========= Error: Potential WAR hazard detected at __shared__ 0x400 in block (0,1,0) :\n"
              "=========     Read Thread (0,7,0) at k+0x5e0 in race_corpus.py:286\n"
              "=========     Write Thread (0,0,0) at k+0x700 in race_corpus.py:282\n"
              "=========     Current Value : 108, Incoming Value : 254\n=========\n")
    cut = report_from_text("========= COMPUTE-SANITIZER\n" + hazard * 100 + "========= RACECHECK SUMMARY: "
                           "100 hazards displayed (513 errors, 1281 warnings)\n", tool="racecheck")
    (f,) = cut.findings
    assert f.lines == (286, 282) and (f.access, f.other_access) == ("Read", "Write") and cut.error_count == 513
    assert any(PRINT_LIMIT_NOTE in n and "printed 100 of 1,794 hazards" in n for n in cut.notes), cut.notes
    whole = report_from_text("========= COMPUTE-SANITIZER\n" + hazard * 9 + "========= RACECHECK SUMMARY: "
                             "9 hazards displayed (9 errors, 0 warnings)\n", tool="racecheck")
    assert not any(PRINT_LIMIT_NOTE in n for n in whole.notes), whole.notes
    rows = {(r["kernel"], r["tool"]): r for r in golden_rows()}
    assert rows[("matmul_no_sync_after_compute", "racecheck")]["complete"] == "no"
    assert rows[("histogram_init_racy", "racecheck")]["complete"] == "yes"   # 0 hazards: nothing was cut


# -- initcheck: shared memory no thread wrote ---------------------------------------------------------------------

TPB = 32


@cuda.jit
def flip_full_chunk(x, out, n):
    tile = cuda.shared.array(TPB, np.float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    if i < n:
        tile[t] = x[i]
    cuda.syncthreads()
    if i < n:
        out[i] = tile[TPB - 1 - t]                  # a short last chunk stored only tile[0 : n - start]


@cuda.jit
def flip_short_chunk(x, out, n):
    tile = cuda.shared.array(TPB, np.float32)
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB
    if start + t < n:
        tile[t] = x[start + t]
    cuda.syncthreads()
    length = min(TPB, n - start)
    if t < length:
        out[start + t] = tile[length - 1 - t]


@cuda.jit
def histogram_unzeroed(x, bins):
    h = cuda.shared.array(8, np.int32)
    cuda.atomic.add(h, x[cuda.threadIdx.x] % 8, 1)  # the bins were never set to 0
    cuda.syncthreads()
    if cuda.threadIdx.x < 8:
        cuda.atomic.add(bins, cuda.threadIdx.x, h[cuda.threadIdx.x])


@cuda.jit
def read_written_later(out):
    s = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    out[t] = s[t]                                   # before any store
    cuda.syncthreads()
    s[t] = t
    cuda.syncthreads()
    out[t] += s[63 - t]


def test_initcheck_names_the_read_of_elements_a_short_chunk_never_stored():
    x, out = np.arange(45, dtype=np.float32), np.zeros(45, np.float32)
    r = sanitize_simulated(flip_full_chunk, 2, TPB, (x, out, 45), tool="initcheck")
    [f] = r.findings
    assert f.kind == "uninitialized_read" and f.tool == "initcheck" and r.tool == "initcheck"
    assert f.message == "Uninitialized __shared__ memory read of size 4 bytes"
    assert f.where.source_line.strip().startswith("out[i] = tile[TPB - 1 - t]")
    assert f.block == (1, 0, 0) and f.thread == (0, 0, 0) and f.count == 13      # block 1 holds 13 elements
    assert f.detail.startswith("tile[31] (the shared array of line") and "not zeroed" in f.detail
    assert any("watches shared memory" in n for n in r.notes)
    assert sanitize_simulated(flip_full_chunk, 2, TPB, (x[:64].copy(), out[:64], 64), tool="initcheck").ok
    assert sanitize_simulated(flip_short_chunk, 2, TPB, (x, out, 45), tool="initcheck").ok


def test_initcheck_counts_atomics_on_bins_never_set_and_reads_before_any_store():
    x, bins = np.arange(32, dtype=np.int32), np.zeros(8, np.int32)
    [f] = sanitize_simulated(histogram_unzeroed, 1, 32, (x, bins), tool="initcheck").findings
    assert f.message == "Uninitialized __shared__ memory atomic update of size 4 bytes" and f.access == "Atomic"
    assert f.count == 8                                   # the first add on each of the 8 bins
    out = np.zeros(64, np.float32)
    [f] = sanitize_simulated(read_written_later, 1, 64, (out,), tool="initcheck").findings
    assert f.where.source_line.strip().startswith("out[t] = s[t]") and f.count == 64


def test_initcheck_leaves_reads_racing_with_their_write_to_racecheck():
    """A read between the same two barriers as a store to its byte is a race (racecheck's finding), not a read of
    memory nobody wrote: the corpus's racy kernels, whose reads the simulator may run before the stores, and every
    clean one, are clean under initcheck."""
    for c in corpus.CASES:
        assert run_case(c, tool="initcheck").ok, c.name
