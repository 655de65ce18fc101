"""The compile cache: keyed on everything that changes the output; memory, disk, and off by KERNELLAB_CACHE=0."""
import time

import kernellab
from kernellab.compile import cache

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'


def test_hit_in_memory_then_on_disk(tmp_cache):
    a = kernellab.compile_cuda(SRC, arch="sm_90")
    assert a.cache_state == "miss"
    b = kernellab.compile_cuda(SRC, arch="sm_90")
    assert b.cache_state == "memory" and b.cubin == a.cubin
    cache.clear_memory()
    c = kernellab.compile_cuda(SRC, arch="sm_90")
    assert c.cache_state == "disk" and c.cubin == a.cubin
    assert list(tmp_cache.rglob("*.pkl"))


def test_key_covers_source_options_arch_and_versions(tmp_cache):
    kernellab.compile_cuda(SRC, arch="sm_90")
    assert kernellab.compile_cuda(SRC + " ", arch="sm_90").cache_state == "miss"
    assert kernellab.compile_cuda(SRC, arch="sm_80").cache_state == "miss"
    assert kernellab.compile_cuda(SRC, arch="sm_90", options=["--use_fast_math"]).cache_state == "miss"
    base = cache.make_key(source=SRC, options=(), arch="sm_90", nvrtc=(13, 0))
    assert base != cache.make_key(source=SRC, options=(), arch="sm_90", nvrtc=(13, 1))
    import kernellab.compile.cache as c

    old = c.__version__
    try:
        c.__version__ = "999"
        assert base != cache.make_key(source=SRC, options=(), arch="sm_90", nvrtc=(13, 0))
    finally:
        c.__version__ = old


def test_switched_off_by_environment(tmp_cache, monkeypatch):
    monkeypatch.setenv("KERNELLAB_CACHE", "0")
    assert kernellab.compile_cuda(SRC, arch="sm_90").cache_state == "miss"
    assert kernellab.compile_cuda(SRC, arch="sm_90").cache_state == "miss"
    assert not list(tmp_cache.rglob("*.pkl"))


def test_warm_compile_is_fast(tmp_cache):
    """A warm cell must turn around well under 50 ms (measured figures are in benchmarks/compile_latency.py)."""
    kernellab.compile_cuda(SRC, arch="sm_90")
    t0 = time.perf_counter()
    m = kernellab.compile_cuda(SRC, arch="sm_90")
    assert m.cache_hit
    assert time.perf_counter() - t0 < 0.05


def test_corrupt_disk_entry_is_recompiled(tmp_cache):
    kernellab.compile_cuda(SRC, arch="sm_90")
    cache.clear_memory()
    for p in tmp_cache.rglob("*.pkl"):
        p.write_bytes(b"garbage")
    m = kernellab.compile_cuda(SRC, arch="sm_90")
    assert m.cache_state == "miss" and m.kernels
