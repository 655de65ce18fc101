"""Honest cards: occupancy at the block size that matters, limits respected, a cache hit's own time (no GPU)."""
import pytest

import kernellab
from kernellab.analysis.occupancy import best_block_sizes
from kernellab.errors import ArgumentError

SRC = r"""
__global__ void __launch_bounds__(64) small(float* x) { x[threadIdx.x] *= 2.0f; }
__global__ void plain(float* x) { x[blockIdx.x * blockDim.x + threadIdx.x] += 1.0f; }
"""


@pytest.fixture
def mod(tmp_cache):
    return kernellab.compile_cuda(SRC, arch="sm_90")


def test_launch_bounds_limit_best_block_sizes(mod):
    k = mod.small
    assert k.resources.max_threads_per_block == 64 and k.resources.launch_bounds_threads == 64
    assert k.best_block_sizes() == [64, 32]
    assert max(mod.plain.best_block_sizes()) == 1024
    # The analysis function takes the limit too; without it, the unconstrained answer.
    assert best_block_sizes(16, 0, "sm_90", top=3, max_threads=96) == [64, 96, 32]   # 64 warps/SM, 63, 32
    assert best_block_sizes(16, 0, "sm_90", top=1) == [1024]


def test_occupancy_above_max_threads_is_an_error(mod):
    with pytest.raises(ArgumentError, match=r"small cannot launch a block of 256 threads: its max_threads_per_block "
                                            r"is 64 \(__launch_bounds__\(64\)\)"):
        mod.small.occupancy(256)
    with pytest.raises(ArgumentError, match="block of 128 threads"):
        mod.small.occupancy((32, 4))
    assert mod.small.occupancy(64).block_size == 64


def test_card_shows_occupancy_at_launch_bounds_or_best_block(mod):
    j = {k["name"]: k for k in mod.to_json()["kernels"]}
    assert j["small"]["occupancy"]["block_size"] == 64
    assert j["small"]["occupancy"]["block_source"] == "launch bounds"
    best = mod.plain.best_block_sizes(top=1)[0]
    assert j["plain"]["occupancy"]["block_size"] == best and j["plain"]["occupancy"]["block_source"] == "best block"
    text, html = str(mod), mod._repr_html_()
    assert "@ 64 (warps; launch bounds)" in text and f"@ {best} (warps; best block)" in text
    assert "launch bounds" in html
    asked = mod.plain.to_json(block_size=128)["occupancy"]
    assert asked["block_size"] == 128 and asked["block_source"] == "requested"


def test_a_cache_hit_shows_its_own_time(tmp_cache):
    miss = kernellab.compile_cuda(SRC, arch="sm_90")
    hit = kernellab.compile_cuda(SRC, arch="sm_90")
    assert not miss.cache_hit and hit.cache_hit
    assert hit.wall_ms < hit.compile_ms                 # the lookup is far quicker than the compile it stands for
    for shown in (str(hit), hit._repr_html_()):
        assert f"cache hit (memory) in {hit.wall_ms:.1f} ms" in shown
        assert f"compiled in {hit.compile_ms:.0f} ms" in shown
    assert f"compiled in {miss.compile_ms:.1f} ms (cache miss)" in str(miss)
    j = hit.to_json()
    assert j["cache"] == "hit" and j["wall_ms"] == round(hit.wall_ms, 2)


def test_compile_error_report_title_is_not_compile_failed_failed(tmp_cache):
    with pytest.raises(kernellab.CompileError) as info:
        kernellab.compile_cuda("__global__ void k(float* x) { x[0] = nope; }", arch="sm_90", filename="cell.cu")
    j = info.value.to_json()
    assert j["title"] == "cell.cu: 1 error" and j["ok"] is False
