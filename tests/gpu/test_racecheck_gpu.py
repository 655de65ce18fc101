"""The simulator's race and barrier checks against compute-sanitizer on a real GPU, on cases of the race corpus whose
verdicts do not hang on the fine print of the tool's semantics (cross-warp races, a divergent barrier, clean kernels),
and a racy matmul whose second pair of lines compute-sanitizer prints only past its default print limit of 100
hazards (every report here is printed whole). The whole corpus is compared through the golden table:
tools/gpu/record_racecheck.py records it and tests/test_simrace.py checks the simulator against it on the CPU.

Run on a GPU machine: tools/gpu/run.py tests-sim, or `pytest -m gpu tests/gpu/test_racecheck_gpu.py`; with
$KERNELLAB_ARTIFACTS set, each raw compute-sanitizer report is saved there as racecheck_<case>_<tool>.txt."""
import importlib.util
import os
import pathlib
import sys

import numpy as np
import pytest

import kernellab

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = [("reverse_racy", "racecheck"), ("reverse_ok", "racecheck"), ("matmul_ok", "racecheck"),
         ("matmul_no_sync_before_compute", "racecheck"), ("matmul_no_sync_after_compute", "racecheck"),
         ("reduce_shuffle_racy", "racecheck"),
         ("divergent_warp_barrier", "synccheck"), ("reduce_ok", "synccheck")]


@pytest.fixture(scope="module")
def corpus():
    name = "kernellab_race_corpus"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "fixtures" / "race_corpus.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("name, tool", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_simulator_and_compute_sanitizer_agree(corpus, name, tool):
    import torch

    from kernellab.run.sim.race import sanitize_simulated

    c = corpus.case(name)
    host = c.args(np.random.default_rng(0))
    args = tuple(torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in host)
    gpu = kernellab.numba_kernel(c.kernel).sanitize(c.grid, c.block, *args, tool=tool, shared_bytes=c.shared_bytes,
                                                    sim=False, print_limit=100_000)
    out = os.environ.get("KERNELLAB_ARTIFACTS")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / f"racecheck_{name}_{tool}.txt").write_text(gpu.raw)
    assert not gpu.simulated and not gpu.timed_out, gpu.raw[-3000:]
    assert not any("(print limit)" in n for n in gpu.notes), gpu.notes
    sim = sanitize_simulated(c.kernel, c.grid, c.block, host, tool=tool, shared_bytes=c.shared_bytes)
    assert (corpus.verdict(gpu), corpus.describe(c, gpu)) == (corpus.verdict(sim), corpus.describe(c, sim)), (
        f"compute-sanitizer:\n{gpu}\nsimulator:\n{sim}")
