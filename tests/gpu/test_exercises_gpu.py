"""Graded exercises on a GPU: every reference solution passes in full (launches, NaN-filled outputs, compute-sanitizer),
every wrong variant fails with the finding its file names, the speed bar is measured, and a faulting kernel leaves
the notebook's CUDA context usable."""
import pytest

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.teach import exercise, exercises

pytestmark = pytest.mark.gpu

IDS = exercises().ids


@pytest.mark.parametrize("ex_id", IDS)
def test_the_reference_solution_passes_in_full(ex_id):
    ex = exercise(ex_id)
    r = kernellab.grade(ex_id, load_kernel(ex, solution_path(ex_id)))
    assert r.passed and r.complete, str(r)
    assert any("launches on" in c.what and c.passed for c in r.checks)
    tools = {c.what for c in r.checks}
    assert "memcheck" in tools
    if ex.needs_barrier:
        assert {"racecheck", "synccheck"} <= tools
    if ex.speed is not None:
        assert r.speed is not None and r.speed.ratio > 0, str(r)


@pytest.mark.parametrize("variant", variants(), ids=str)
def test_every_wrong_variant_fails_with_its_finding(variant):
    ex = exercise(variant.exercise)
    r = kernellab.grade(variant.exercise, load_kernel(ex, variant.path), speed=False)
    kinds = [f.kind for f in r.findings]
    assert not r.passed and set(variant.kinds) <= set(kinds), (str(variant), str(r))
    assert "internal" not in kinds and "spec" not in kinds
    assert r.speed is None


def test_out_of_bounds_names_the_cell_line():
    ex = exercise("01-reverse")
    [v] = [v for v in variants("01-reverse") if v.name == "no_guard"]
    r = kernellab.grade("01-reverse", load_kernel(ex, v.path), speed=False)
    [f] = [f for f in r.findings if f.kind == "out_of_bounds"]
    # the variant's line 6 (numbered from 2 as in a %%cuda cell) is `out[i] = in[n - 1 - i];`
    assert f.cell_line == 6 and "out[i] = in[n - 1 - i]" in f.message, str(r)
    assert f.hint == ex.hints["out_of_bounds"]


def test_a_race_names_both_lines():
    ex = exercise("02-transpose-batched")
    [v] = [v for v in variants("02-transpose-batched") if v.name == "no_barrier"]
    r = kernellab.grade("02-transpose-batched", load_kernel(ex, v.path), speed=False)
    races = [f for f in r.findings if f.kind == "race"]
    assert races and races[0].message.startswith("race between cell line"), str(r)


def test_grading_a_faulting_kernel_leaves_this_process_usable():
    import torch

    src = ('extern "C" __global__ void reverse(const float* in, float* out, int n) {\n'
           '    int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
           '    out[i + (1 << 28)] = in[n - 1 - i];   // far out of bounds: an illegal address\n}\n')
    r = kernellab.grade("01-reverse", kernellab.compile_cuda(src, first_line=2).reverse, speed=False)
    assert not r.passed and {"fault", "out_of_bounds"} & {f.kind for f in r.findings}, str(r)
    assert (torch.ones(4, device="cuda") + 1).sum().item() == 8.0


def test_a_hanging_submission_fails_with_a_timeout_at_the_launch_timeout():
    """benchmarks/autotune_multigpu.py's drill kernel (an endless spin on a volatile global load) graded from its
    source: the isolated launch is killed at the grader's 30 s timeout, the grade fails with the `timeout` finding,
    and no compute-sanitizer run follows (each would hang for 120 s)."""
    import importlib
    import pathlib
    import sys
    import time

    import kernellab.teach

    root = str(pathlib.Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    hang = importlib.import_module("benchmarks.autotune_multigpu").HANG
    t0 = time.perf_counter()
    r = kernellab.teach.grade("01-reverse", hang, speed=False)
    wall_s = time.perf_counter() - t0
    assert not r.passed and "timeout" in [f.kind for f in r.findings], str(r)
    assert 29 < dict(r.stage_s)["launches (GPU)"] < 90 and wall_s < 100, (r.stage_s, wall_s)
    assert not any(s.startswith("compute-sanitizer") for s, _ in r.stage_s), r.stage_s
