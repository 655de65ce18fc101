"""What tests/test_norm_host_path.py and tests/test_attention_host_path.py share: benchmarks/launch_overhead.py loaded
as a module (its stand-in driver), and the Python calls a function makes, by origin, file and function."""
import collections
import importlib.util
import pathlib
import sys

import pytest

from kernellab.run.launch import launch as L

ROOT = pathlib.Path(__file__).resolve().parents[1]


def launch_overhead_module(name: str):
    """Yields benchmarks/launch_overhead.py loaded as module `name`; kernellab's torch stream lookups, which its
    stand-in replaces, are restored after (use as a module-scoped fixture's body)."""
    mp = pytest.MonkeyPatch()
    for attr in ("torch_stream_handle", "torch_stream_function"):
        mp.setattr(L, attr, getattr(L, attr))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "launch_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        mp.undo()


def origin(filename: str, tutorial: str) -> str:
    """"kernellab" (its files and generated code), "tutorial" (the notebook `tutorial`'s cells), "torch" or "other"."""
    if filename.startswith(str(ROOT / "kernellab")) or filename.startswith("<kernellab"):
        return "kernellab"
    if filename.startswith(tutorial):
        return "tutorial"
    if "/torch/" in filename:
        return "torch"
    return "other"


def python_calls(fn, tutorial: str, repeat: int = 4) -> collections.Counter:
    """(origin, file tail (40 characters), function) -> Python calls per call of fn(), over `repeat` calls after one
    warm call (sys.setprofile)."""
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            counts[origin(code.co_filename, tutorial), code.co_filename.rsplit("/", 1)[-1][:40], code.co_name] += 1
    fn()
    sys.setprofile(profile)
    try:
        for _ in range(repeat):
            fn()
    finally:
        sys.setprofile(None)
    return collections.Counter({k: v // repeat for k, v in counts.items()})
