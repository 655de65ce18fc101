"""The attention grid's paired timing on a real GPU (benchmarks/attention.py bench_timer, time_paired, paired_gap): one
function under two names is never a loss, and a function that moves 10 % more bytes is."""
import pathlib
import sys

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module")
def grid():
    from attention_steps import attention_benchmark

    return attention_benchmark()


def inputs(g):
    import torch

    # 96 MiB of bf16, about twice the H100's 50 MB L2: kernellab.bench makes one input set of it, and each call reads
    # it from DRAM after the flush
    return (torch.randn(48 * 2**20, generator=g, device="cuda", dtype=torch.bfloat16),)


def test_one_kernel_under_two_names_is_not_a_loss(grid):
    """The same memory-bound kernel (192 MB moved: 40-60 µs on an H100 or H200) as 'entry' and as its 'step': the
    two-order gap stays inside 3 % and the finding is never a loss; each name's two timings (one before the other, one
    after) within 3 %."""
    def copy(x):
        return x.mul(2.0)

    paired = grid.time_paired(grid.bench_timer({"entry": copy, "step": copy}, inputs), ["entry", "step"])
    g = grid.paired_gap(paired, "step")
    assert g["finding"] != "loss" and abs(g["gap"]) < 0.03 and g["spread"] < 0.03, (g, paired)


def test_a_tenth_more_bytes_is_a_loss(grid):
    """'entry' reads and writes 10 % more of the same buffer than 'step': a memory-bound kernel 1.05-1.15x as long in
    both orders, beyond its spread: a loss."""
    def step(x):
        return x[: 40 * 2**20].mul(2.0)

    def entry(x):
        return x[: 44 * 2**20].mul(2.0)

    paired = grid.time_paired(grid.bench_timer({"entry": entry, "step": step}, inputs), ["entry", "step"])
    g = grid.paired_gap(paired, "step")
    assert g["finding"] == "loss" and 0.05 < g["gap"] < 0.15 and all(r > 1.03 for r in g["ratios"]), (g, paired)
