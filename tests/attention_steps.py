"""Tutorial 07's steps 2 and 3 as the notebook compiles them: its `%%cuda` cells, their `#define` configuration and a
launcher per step (benchmarks/attention.py's, so the tests, the benchmark and the notebook launch alike)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def attention_benchmark():
    """benchmarks/attention.py as a module (it reads the notebook's cells and builds the launchers)."""
    spec = importlib.util.spec_from_file_location("kernellab_attention_benchmark", ROOT / "benchmarks" / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
