"""Tutorials 05 and 06 on a GPU: every step, as the notebooks' own `%%cuda` cells, and every tile configuration
benchmarks/matmul.py sweeps, matches a float64 reference on awkward shapes (in bf16 and fp16 for the tensor-core
steps); a single persistent wgmma block walks every tile; compute-sanitizer finds no out-of-bounds access and no
shared-memory race in the kernels that share tiles.

The launchers (grids, blocks, shared memory, the K padding of the tensor-core kernels, the tensor maps) are the
benchmark's (`variant_function` in benchmarks/matmul.py), so this tests exactly what it times.
"""
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import kernellab
from kernellab.run.launch.device import device_info

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("matmul_bench", ROOT / "benchmarks" / "matmul.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["matmul_bench"] = bench
_spec.loader.exec_module(bench)

SMS = device_info().multiprocessors if kernellab.has_gpu() else 132
VARIANTS = bench.all_variants(["sgemm", "tc", "hopper"], SMS)
SGEMM_SHAPES = [(1, 1, 1), (31, 33, 17), (130, 260, 36), (257, 129, 64), (4095, 4097, 1023)]
TC_SHAPES = [(1, 1, 1), (15, 17, 33), (130, 270, 40), (255, 129, 200), (512, 384, 264), (2304, 2304, 264),
             (4095, 4097, 1023)]
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_modules = {}


def hopper_or_skip(v):
    if v.family == "hopper" and device_info().arch != "sm_90":
        pytest.skip(f"wgmma and TMA need sm_90; this GPU is {device_info().arch}")


def function(v, cell, dtype):
    key = (v.label, cell.source)
    if key not in _modules:
        options = tuple(f"-D{k}={val}" for k, val in v.defines.items())
        _modules[key] = kernellab.compile_cuda(cell.source, arch=cell.arch or "sm_90", options=options, first_line=2,
                                               filename="cell.cu")
    fn, _ = bench.variant_function(v, _modules[key], dtype)
    return fn


def check(v, fn, dtype, M, N, K, trials=2):
    """The float64 check; the wgmma kernel's launches run in a worker, so a hang (a wrong barrier phase) is killed
    after a minute and reported instead of stalling the suite."""
    return kernellab.check(fn, bench.reference(v.family), bench.inputs(v.family, TORCH_DTYPES[dtype], M, N, K),
                           trials=trials, generator_device="cuda", isolate=v.family == "hopper")


SGEMM = [(v, c) for v, c in VARIANTS if v.family == "sgemm"]
TC = [(v, c, t) for v, c in VARIANTS if v.family != "sgemm" for t in ("bf16", "fp16")]


@pytest.mark.parametrize("v,cell", SGEMM, ids=[v.label for v, _ in SGEMM])
def test_sgemm_matches_float64_on_awkward_shapes(v, cell):
    fn = function(v, cell, "fp32")
    for M, N, K in SGEMM_SHAPES:
        report = check(v, fn, "fp32", M, N, K)
        assert report.passed, f"{v.label} at {M} x {N} x {K}: {report}"


@pytest.mark.parametrize("v,cell,dtype", TC, ids=[f"{v.label}-{t}" for v, _, t in TC])
def test_tensor_core_step_matches_float64_on_awkward_shapes(v, cell, dtype):
    hopper_or_skip(v)
    fn = function(v, cell, dtype)
    for M, N, K in TC_SHAPES:
        report = check(v, fn, dtype, M, N, K)
        assert report.passed, f"{v.label} {dtype} at {M} x {N} x {K}: {report}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_one_persistent_wgmma_cluster_walks_every_tile(dtype):
    """grid = one cluster of two: the stage phases wrap across 2 x 5 cluster tiles of 40 slices each."""
    v, cell = next((v, c) for v, c in VARIANTS if v.name == "wgmma" and v.config == "default")
    hopper_or_skip(v)
    one = replace(v, grid=lambda M, N: v.cluster[0])
    report = check(one, function(one, cell, dtype), dtype, 500, 1100, 2560, trials=1)
    assert report.passed, report


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_wgmma_at_8192_cubed_matches_cublas(dtype):
    """The benchmark's largest size: compared with cuBLAS itself (a float64 product of 8192^3 would take long)."""
    v, cell = next((v, c) for v, c in VARIANTS if v.name == "wgmma" and v.config == "default")
    hopper_or_skip(v)
    fn = function(v, cell, dtype)
    g = torch.Generator(device="cuda").manual_seed(3)
    A, B, C = bench.inputs("hopper", TORCH_DTYPES[dtype], 8192, 8192, 8192)(g)
    ref = torch.matmul(A, B.T).float()
    out = fn(A, B, C).float()
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < (1e-2 if dtype == "bf16" else 2e-3), rel


SANITIZED = [("sgemm_smem", "default", "racecheck"), ("sgemm_warptile", "default", "racecheck"),
             ("sgemm_warptile", "default", "memcheck"), ("sgemm_vec", "default", "memcheck"),
             ("sgemm_cp", "default", "racecheck"), ("sgemm_cp", "default", "memcheck"),
             ("mma_pipe", "default", "memcheck"), ("wgmma", "default", "memcheck"), ("wgmma", "no cluster", "memcheck")]


@pytest.mark.parametrize("name,config,tool", SANITIZED, ids=[f"{n}-{t}" for n, _, t in SANITIZED])
def test_compute_sanitizer_is_clean(name, config, tool):
    """Edge tiles in every dimension (the guards and the zero-fills) under memcheck; shared tiles under racecheck."""
    v, cell = next((v, c) for v, c in VARIANTS if v.name == name and v.config == config)
    hopper_or_skip(v)
    dtype = "fp32" if v.family == "sgemm" else "bf16"
    M, N, K = (130, 260, 36) if v.family == "sgemm" else (130, 270, 40)
    options = tuple(f"-D{k}={val}" for k, val in v.defines.items())
    module = kernellab.compile_cuda(cell.source, arch=cell.arch or "sm_90", options=options, first_line=2,
                                    filename="cell.cu")
    kernel = module[v.kernels[dtype]]
    g = torch.Generator(device="cuda").manual_seed(1)
    A, B, C = bench.inputs(v.family, TORCH_DTYPES[dtype], M, N, K)(g)
    first = bench.hopper_maps(A, B, C, v.tensor_maps) if v.tensor_maps else (A, B)
    extra = {"cluster": v.cluster} if v.cluster else {}
    report = kernel.sanitize(v.grid(M, N), v.block, *first, C, M, N, K, shared_bytes=v.smem, tool=tool, **extra)
    assert report.ok, str(report)
