"""Tutorial 00's puzzles on the CPU, beyond what tests/test_teach.py proves for every exercise (the reference solution
passes, each wrong variant fails with its finding): the notebook's own stub cells fail without raising, a missing
barrier is reported as a race between the two lines it should separate, every puzzle is graded completely in the
simulator, and the simulated launches stay small enough for the simulator."""
import linecache
import math
import pathlib

import jupytext
import pytest

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.teach import exercise, exercises

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "00-puzzles.py"
IDS = exercises("00").ids
SIM_THREADS_MAX = 2048        # threads in any one simulated launch of a puzzle: a few hundred ms each at most


def test_twelve_puzzles_from_map_to_matmul():
    assert len(IDS) == 12
    assert IDS[0] == "00-map" and IDS[-1] == "00-matmul"
    assert all(exercise(i).kind == "numba" for i in IDS)


def _stub_cells():
    """(exercise id, cell source without its magic line) of each stub cell of the notebook."""
    out = []
    for cell in jupytext.read(NOTEBOOK).cells:
        lines = cell.source.splitlines()
        if cell.cell_type == "code" and lines and lines[0].startswith("%%numba") and len(lines) > 1 \
                and lines[1].startswith("# exercise:"):
            out.append((lines[1].split(":", 1)[1].strip(), "\n".join(lines[1:]) + "\n"))
    return out


def test_every_stub_cell_runs_with_the_simulator_magic():
    stubs = _stub_cells()
    assert [i for i, _ in stubs] == list(IDS)
    for cell in jupytext.read(NOTEBOOK).cells:
        if cell.cell_type == "code" and cell.source.startswith("%%numba"):
            assert cell.source.splitlines()[0] == "%%numba --sim", "graded in the simulator, with or without a GPU"


@pytest.mark.parametrize("ex_id,source", _stub_cells(), ids=[i for i, _ in _stub_cells()])
def test_the_notebooks_stub_fails_without_raising(ex_id, source):
    """The stub as the notebook has it: a FAILED verdict (nothing written, nothing stored), not an exception."""
    ex = exercise(ex_id)
    filename = f"<stub-{ex_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    r = kernellab.grade(ex_id, namespace[ex.kernel], seed=0)
    assert not r.passed and r.complete, str(r)
    assert [f.kind for f in r.findings] == ["no_store", "unwritten"], str(r)     # the cause, then the symptom


def _line(path: pathlib.Path, text: str) -> int:
    """The number of the one line of `path` holding `text`."""
    [n] = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


# (exercise, variant): the statements on either side of the missing barrier
RACES = {
    ("00-flip", "no_barrier"): ("tile[t] = x[i]", "out[i] = tile[length - 1 - t]"),
    ("00-dot", "no_first_barrier"): ("cache[t] = acc", "cache[t] += cache[t + s]"),
    ("00-cumsum", "no_read_barrier"): ("v = tile[t - step]", "tile[t] += v"),
    ("00-cumsum", "no_chunk_barrier"): ("carry += tile[TPB - 1]", "tile[t] = x[i] if i < n"),
    ("00-col-sums", "no_barrier"): ("part[ty, tx] = acc", "out[c] = part[0, tx]"),
    ("00-matmul", "no_load_barrier"): ("sa[ty, tx] = a[row", "acc += sa[ty, j] * sb[j, tx]"),
    ("00-matmul", "no_reuse_barrier"): ("acc += sa[ty, j] * sb[j, tx]", "sa[ty, tx] = a[row"),
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # counters added to before zeroing
@pytest.mark.parametrize("key", list(RACES), ids=lambda k: f"{k[0]}.{k[1]}")
def test_a_missing_barrier_is_a_race_between_the_lines_it_separates(key):
    ex_id, name = key
    [v] = [v for v in variants(ex_id) if v.name == name]
    r = kernellab.grade(ex_id, load_kernel(exercise(ex_id), v.path), seed=3)
    [race] = [f for f in r.findings if f.kind == "race"]
    first, second = (_line(v.path, text) for text in RACES[key])
    assert f"between cell line {min(first, second)} and line {max(first, second)}" in race.message or \
        f"between cell line {max(first, second)} and line {min(first, second)}" in race.message, race.message
    assert race.cell_line in (first, second) and race.where.endswith("(simulator)")
    assert "syncthreads" in race.hint


def test_a_missing_barrier_is_diagnosed_cause_first_in_numbas_words():
    """00-flip without its barrier: the race between the two lines first, then the missing `cuda.syncthreads()`
    (Numba's name, not CUDA C++'s), then the wrong values, whose hint points back at the race."""
    [v] = [v for v in variants("00-flip") if v.name == "no_barrier"]
    r = kernellab.grade("00-flip", load_kernel(exercise("00-flip"), v.path), seed=3)
    kinds = [f.kind for f in r.findings]
    assert kinds[:2] == ["race", "missing_barrier"] and "wrong_values" in kinds[2:], str(r)
    missing = r.findings[1]
    assert "`cuda.syncthreads()`" in missing.message and "__syncthreads" not in str(r), str(r)
    values = r.findings[kinds.index("wrong_values")]
    assert values.hint.startswith("the race above can give these values"), values.hint
    assert str(r).index("race between cell line") < str(r).index("elements of `out` differ")


# An atomic against a plain store of the same shared counter is a real race that compute-sanitizer's racecheck does
# not report (H100, tests/golden/racecheck_sm90.csv), so neither does the simulator's detector (its report names the
# lines in a note: tests/test_simrace.py): the grade fails on the counts instead.
UNREPORTED = {
    ("00-histogram", "no_zero_barrier"): ("h[t] = 0", "cuda.atomic.add(h, x[i], 1)"),
    ("00-histogram", "no_count_barrier"): ("cuda.atomic.add(h, x[i], 1)", "counts[t] = h[t]"),
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("key", list(UNREPORTED), ids=lambda k: f"{k[0]}.{k[1]}")
def test_a_race_racecheck_does_not_report_fails_on_values_and_is_named_in_a_note(key):
    ex_id, name = key
    [v] = [v for v in variants(ex_id) if v.name == name]
    assert all(_line(v.path, text) for text in UNREPORTED[key])     # the two lines the race is between
    r = kernellab.grade(ex_id, load_kernel(exercise(ex_id), v.path), seed=3)
    assert not r.passed and not any(f.kind == "race" for f in r.findings), str(r)
    assert {f.kind for f in r.findings} & {"wrong_values", "zero_output"}, str(r)


@pytest.mark.slow
def test_every_puzzle_with_shared_memory_is_race_checked_and_complete_in_the_simulator():
    for ex_id in IDS:
        ex = exercise(ex_id)
        r = kernellab.grade(ex_id, load_kernel(ex, solution_path(ex_id)), seed=1)
        assert r.passed and r.complete and not r.needs_gpu, str(r)
        checks = {c.what: c for c in r.checks}
        assert any(w.endswith("(simulator)") and "launches on" in w for w in checks), checks
        if ex.needs_shared:
            for tool in ("racecheck", "synccheck"):
                assert checks[tool].passed and checks[tool].detail == "clean", str(r)
            assert checks["goes through shared memory (STS and LDS)"].passed
            assert checks["has a barrier (BAR.SYNC)"].passed
        else:
            assert "racecheck" not in checks and "synccheck" not in checks


@pytest.mark.parametrize("ex_id", IDS)
def test_simulated_launches_stay_small(ex_id):
    """Every simulated launch has at most SIM_THREADS_MAX threads, and the GPU shapes go beyond the simulator's."""
    ex = exercise(ex_id)
    for shape in ex.sim_shapes:
        for grid, block in ex.launch.configs(shape):
            assert math.prod(grid) * math.prod(block) <= SIM_THREADS_MAX, (shape, grid, block)
    assert set(ex.sim_shapes) < set(ex.shapes)
    assert ex.sanitize_shape in ex.sim_shapes, "the race detector runs on a shape the launches ran on"
    assert max(math.prod(s) for s in ex.shapes) > 100 * max(math.prod(s) for s in ex.sim_shapes)


@pytest.mark.parametrize("key", ["00-cumsum.no_chunk_barrier", "00-cumsum.no_read_barrier", "00-flip.off_by_one",
                                 "00-histogram.no_count_barrier", "00-histogram.no_zero_barrier"])
def test_on_a_gpu_a_puzzle_is_also_graded_in_the_simulator(key, monkeypatch):
    """On an H100 these five wrong variants ran right on the hardware (a one-warp block steps together) and
    compute-sanitizer did not flag them (2026-11-23): the grader's GPU branch grades Numba kernels in the simulator
    as well, which finds what the CPU grading finds. The GPU parts are stood in for here."""
    from kernellab.run.launch import device
    from kernellab.teach import grader

    [v] = [v for v in variants(key.split(".")[0]) if str(v) == key]
    ex = exercise(v.exercise)
    k = kernellab.numba_kernel(load_kernel(ex, v.path), simulate=False)
    cls = next(c for c in vars(grader).values() if isinstance(c, type) and hasattr(c, "sim_racecheck"))
    real_run_all = cls.run_all
    monkeypatch.setattr(device, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(cls, "run_all", lambda self, k, simulated: real_run_all(self, k, simulated=True)
                        if simulated else True)         # the hardware runs: right values, as on the H100
    monkeypatch.setattr(cls, "sanitizers", lambda self, k: None)
    monkeypatch.setattr(cls, "determinism", lambda self, k: None)   # two more hardware runs: they agree there too
    monkeypatch.setattr(cls, "numba_static_checks", lambda self, k: None)
    r = kernellab.grade(v.exercise, k, speed=False)
    assert not r.passed and set(v.kinds) <= {f.kind for f in r.findings}, str(r)
