"""Shared pytest setup: the `gpu` marker skips with a reason where no CUDA GPU is visible; pytest-xdist hands the
longest test files out first (tests/durations.json)."""
import collections
import json
import multiprocessing
import os
import pathlib

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def _gpu_reason():
    """Return None when a CUDA GPU is usable, else why not."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no libcuda, no device: say which (the runtime blames the driver for all)
        try:
            from kernellab.run.launch.device import _runtime_version, why_no_gpu

            return f"no CUDA GPU: {why_no_gpu(str(exc).splitlines()[0] if str(exc) else '', _runtime_version())}"
        except Exception:
            return f"no CUDA GPU: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None if n > 0 else "no CUDA GPU: device count is 0"


GPU_SKIP_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private, empty compile cache directory for one test."""
    monkeypatch.setenv("KERNELLAB_CACHE_DIR", str(tmp_path / "cache"))
    from kernellab.compile import cache

    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


# --- pytest-xdist: the longest work first ----------------------------------------------------------------------------
# `make test` runs `pytest -n auto --dist loadfile`: each test file is one unit of work, run whole in one process (its
# module-scoped compiles and loaded tutorials built once). xdist hands the units out in the order of their number of
# tests, so a file of a few long tests (a tutorial's emulation, the browser) used to start last and run alone at the
# end while the other cores idled. Here the units are handed out longest first, by the seconds recorded in
# tests/durations.json (`make test-durations` re-records them), and the files in OWN_UNITS are split into a unit per
# test: each of their tests starts from nothing (a fresh Jupyter kernel running a tutorial), so no process builds
# twice what one would have built once, and two cores share them instead of one.
DURATIONS = pathlib.Path(__file__).with_name("durations.json")
OWN_UNITS = ("tests/test_notebooks.py",)


def _recorded_seconds() -> dict[str, float]:
    """Each unit's recorded seconds, from durations.json (none where it is missing or unreadable)."""
    try:
        return {unit: float(seconds) for unit, seconds in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _unit(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or the test itself in an OWN_UNITS file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in OWN_UNITS else path


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each scheduling unit's seconds (setup, call and teardown of its tests) to PATH as "
                          "JSON, for tests/durations.json")


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist missing: one process, nothing to schedule
    LoadFileScheduling = None
else:
    class _LongestFirstQueue(collections.OrderedDict):
        """xdist's queue of units, handing out the longest recorded unit first (unrecorded ones after, most tests
        first): popitem(last=False) is the only way xdist takes work from it."""

        def __init__(self, seconds: dict[str, float]):
            super().__init__()
            self.seconds = seconds

        def popitem(self, last=True):
            if last or not self:
                return super().popitem(last)
            unit = max(self, key=lambda u: (self.seconds.get(u, -1.0), len(self[u])))
            return unit, self.pop(unit)

    class LongestFirstScheduling(LoadFileScheduling):
        """--dist loadfile, OWN_UNITS split per test, units handed out longest first."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = _LongestFirstQueue(_recorded_seconds())

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)


@pytest.hookimpl(optionalhook=True)               # an xdist hook: unknown where xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    if LoadFileScheduling is not None and config.getoption("dist", None) == "loadfile":
        return LongestFirstScheduling(config, log)
    return None


_unit_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _unit_seconds[_unit(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    """--record-durations: each unit's seconds (setup, call and teardown of its tests), longest first. And no process
    a test started outlives the run: child processes still alive (a Dask worker whose test failed before its cluster
    closed) are killed, not left to spin as orphans."""
    for child in multiprocessing.active_children():
        child.kill()
    path = session.config.getoption("record_durations")
    if path and not hasattr(session.config, "workerinput"):   # the controller (or the one process) writes it
        units = sorted(_unit_seconds.items(), key=lambda kv: -kv[1])
        pathlib.Path(path).write_text("{\n" + ",\n".join(f"{json.dumps(u)}: {s:.1f}" for u, s in units) + "\n}\n")
