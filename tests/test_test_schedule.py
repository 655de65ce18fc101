"""The test suite's own scheduling under pytest-xdist (tests/conftest.py): units handed out longest first by
tests/durations.json, unrecorded units after them (most tests first), the tutorials' notebook tests one per unit."""
import json

import pytest

import conftest

xdist = pytest.importorskip("xdist")


def test_the_queue_hands_out_the_longest_recorded_unit_first_then_the_largest_unrecorded():
    q = conftest._LongestFirstQueue({"tests/a.py": 5.0, "tests/b.py": 50.0})
    for unit, n in [("tests/a.py", 1), ("tests/new_small.py", 2), ("tests/b.py", 3), ("tests/new_big.py", 9)]:
        q[unit] = {f"{unit}::t{i}": False for i in range(n)}
    order = [q.popitem(last=False)[0] for _ in range(4)]
    assert order == ["tests/b.py", "tests/a.py", "tests/new_big.py", "tests/new_small.py"]
    assert not q


def test_notebook_tests_are_units_of_their_own_and_other_files_are_one_unit():
    nb = "tests/test_notebooks.py::test_tutorial_runs_to_the_end[05-matmul]"
    assert conftest._unit(nb) == nb
    assert conftest._unit("tests/test_bench.py::test_x[a-b]") == "tests/test_bench.py"
    assert conftest._unit("tests/test_job.py::TestJob::test_y") == "tests/test_job.py"


def test_recorded_durations_name_existing_units():
    """Every unit in durations.json is a test file that exists (or one test of an OWN_UNITS file): a renamed file
    left there would be scheduled as unrecorded."""
    recorded = json.loads(conftest.DURATIONS.read_text())
    root = conftest.DURATIONS.parent.parent
    assert recorded, "tests/durations.json is empty: make test-durations"
    missing = sorted({u.split("::")[0] for u in recorded if not (root / u.split("::")[0]).exists()})
    assert not missing, f"durations.json names files that are gone (make test-durations): {missing}"
    assert all(isinstance(s, (int, float)) and s >= 0 for s in recorded.values())
