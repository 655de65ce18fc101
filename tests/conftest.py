"""Shared pytest setup: the `gpu` marker skips with a reason where no CUDA GPU is visible."""
import os

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
