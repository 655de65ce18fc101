"""Tutorials 05 and 06 without a GPU: every kernel variant the benchmark runs compiles for its arch with no spills and
no local memory and holds the instructions its step is about; every step computes the right product on awkward
shapes in the CPU emulator (kernellab/run/sim/cuda), in both dtypes for the tensor-core steps; and the emulator catches the bugs
it is there to catch (a missing wait, a stage released too early, a wrong fragment).
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import kernellab
from kernellab.run.sim.cuda.emulate import TensorMap, bf16_bits, bf16_values, emulate
from exercises.solutions_lib import solution_path, variants

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("matmul_bench", ROOT / "benchmarks" / "matmul.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["matmul_bench"] = bench
_spec.loader.exec_module(bench)

C05 = bench.cuda_cells("05-matmul.py")
C06 = bench.cuda_cells("06-tensor-cores.py")
VARIANTS = bench.all_variants(["sgemm", "tc", "hopper"])

# What each step's SASS must hold (Kernel.instruction_summary keys), beyond "no spills, no local memory".
SASS = {
    "sgemm_naive": ("FFMA", "LDG.32"), "sgemm_coalesced": ("FFMA", "LDG.32"), "sgemm_smem": ("FFMA", "LDS", "BAR"),
    "sgemm_1d": ("FFMA", "LDS.128"), "sgemm_2d": ("FFMA", "LDS.128"),
    "sgemm_vec": ("FFMA", "LDS.128", "LDG.128", "STG.128"), "sgemm_warptile": ("FFMA", "LDS.128", "LDG.128", "STS.128"),
    "sgemm_cp": ("FFMA", "LDS.128", "LDGSTS", "BAR"),
    "wmma": ("HMMA",), "mma": ("HMMA", "LDSM"), "mma_pipe": ("HMMA", "LDSM", "LDGSTS"),
    "wgmma": ("HGMMA", "UTMALDG"),
}


def compiled(v, cell):
    options = tuple(f"-D{k}={val}" for k, val in v.defines.items())
    return kernellab.compile_cuda(cell.source, arch=cell.arch or "sm_90", options=options, first_line=2,
                                  filename="cell.cu")


# --- compile, resources, SASS ------------------------------------------------------------------------------------

def test_the_notebooks_hold_every_step():
    names = {k for c in C05 + C06 for k in c.kernels}
    assert {"sgemm_naive", "sgemm_coalesced", "sgemm_smem", "sgemm_1d", "sgemm_2d", "sgemm_vec",
            "sgemm_warptile", "sgemm_cp"} <= names
    assert {f"{s}_{t}" for s in ("wmma", "mma", "mma_pipe", "wgmma") for t in ("bf16", "f16")} <= names
    assert not any("exercise" in c.source.splitlines()[0] for c in C05 + C06)   # stubs are not steps
    assert bench.cell_with(C06, "wgmma_bf16").arch == "sm_90a"


@pytest.mark.parametrize("v,cell", [pytest.param(v, c, id=v.label, marks=() if v.config == "default" else
                                                   pytest.mark.slow) for v, c in VARIANTS])
def test_variant_compiles_without_spills_and_holds_its_instructions(v, cell):
    module = compiled(v, cell)
    for name in v.kernels.values():
        k = module[name]
        r = k.resources
        assert not r.spills and r.local_bytes == 0, r
        assert r.arch == (cell.arch or "sm_90")
        threads = v.block if isinstance(v.block, int) else int(np.prod(v.block))
        assert threads <= r.max_threads_per_block, (threads, r)
        assert r.shared_bytes + v.smem <= 227 * 1024, "fits an H100 block's shared memory with opt-in"
        mix = k.instruction_summary
        for key in SASS[v.name]:
            assert mix[key] > 0, f"{name}: no {key} in its SASS: {mix}"
        assert not mix["LDL"] and not mix["STL"]
        if v.family != "sgemm":
            assert mix.tensor_core_path == ("wgmma" if v.family == "hopper" else "mma"), mix
        else:
            assert not mix["tensor cores"]


def test_bf16_wmma_loads_fragments_without_ldmatrix_and_mma_sync_fixes_it():
    """What tutorial 06 reads off the SASS: bf16 WMMA takes generic loads, fp16 WMMA and the mma.sync step LDSM."""
    wmma = compiled(*next(p for p in VARIANTS if p[0].name == "wmma"))
    mma = compiled(*next(p for p in VARIANTS if p[0].name == "mma"))
    assert wmma["wmma_bf16"].instruction_summary["LDSM"] == 0
    assert wmma["wmma_f16"].instruction_summary["LDSM"] > 0
    assert mma["mma_bf16"].instruction_summary["LDSM"] > 0


def test_hopper_kernel_needs_sm_90a():
    cell = bench.cell_with(C06, "wgmma_bf16")
    with pytest.raises(kernellab.CompileError):
        kernellab.compile_cuda(cell.source, arch="sm_90", first_line=2, filename="cell.cu")


# --- the emulator: each step on awkward shapes -------------------------------------------------------------------

rng = np.random.default_rng(5)


def sgemm_case(M, N, K):
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    return A, B, np.full((M, N), np.nan, np.float32), A.astype(np.float64) @ B.astype(np.float64)


def tc_case(M, N, K, dtype):
    """A [M, K], B [N, K] in bf16 (as uint16 bits) or fp16; C poisoned; the float64 reference of A B^T."""
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((N, K)).astype(np.float32)
    if dtype == "bf16":
        A, B = bf16_bits(A), bf16_bits(B)
        a, b = bf16_values(A), bf16_values(B)
        C = np.full((M, N), 0x7FC0, np.uint16)                      # NaN
    else:
        A, B = A.astype(np.float16), B.astype(np.float16)
        a, b = A.astype(np.float32), B.astype(np.float32)
        C = np.full((M, N), np.nan, np.float16)
    return A, B, C, a.astype(np.float64) @ b.astype(np.float64).T


def as_float(C):
    return bf16_values(C) if C.dtype == np.uint16 else C.astype(np.float32)


def assert_close(C, ref, rtol):
    C = as_float(C)
    assert not np.isnan(C).any(), f"{np.isnan(C).sum()} elements never written (or NaN)"
    err = np.abs(C - ref) / (np.abs(ref) + np.sqrt(np.mean(ref**2)))
    assert err.max() < rtol, f"max error {err.max():.3g} (relative to |ref| + rms)"


def grid_dims(g):
    return g if isinstance(g, tuple) else (g,)


def run_variant(v, cell, M, N, K, dtype, grid=None):
    """Run one variant in the emulator on an M x N x K problem; returns (C, reference)."""
    name = v.kernels[dtype if dtype in v.kernels else "fp32"]
    if v.family == "sgemm":
        A, B, C, ref = sgemm_case(M, N, K)
        args = [A, B, C, M, N, K]
    else:
        A, B, C, ref = tc_case(M, N, K, dtype)
        first = [A, B]
        if v.tensor_maps:                   # C's map where its rows are 16-byte multiples, else A's stands in
            first = [TensorMap(A, *v.tensor_maps[0][::-1]), TensorMap(B, *v.tensor_maps[1][::-1])]
            first.append(TensorMap(C, *v.tensor_maps[2][::-1]) if N % 8 == 0 else first[0])
        args = first + [C, M, N, K]
    block = v.block if isinstance(v.block, tuple) else (v.block,)
    emulate(cell.source, name, grid_dims(grid or v.grid(M, N)), block, args, v.smem, defines=v.defines,
            cluster=v.cluster or (1,))
    return C, ref


def pick(name, config="default"):
    return next((v, c) for v, c in VARIANTS if v.name == name and v.config == config)


SGEMM_STEPS = ["sgemm_naive", "sgemm_coalesced", "sgemm_smem", "sgemm_1d", "sgemm_2d", "sgemm_vec",
               "sgemm_warptile", "sgemm_cp"]


@pytest.mark.parametrize("name", [n if n in ("sgemm_warptile", "sgemm_cp") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SGEMM_STEPS])
def test_sgemm_step_in_the_emulator(name):
    """K not a multiple of 4 or of the slice, M and N one off the tile: guards and the scalar fallback."""
    v, cell = pick(name)
    C, ref = run_variant(v, cell, 70, 45, 19, "fp32")
    assert_close(C, ref, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default", "128x128x8 w32x64", "BK=16 w32x64",
                                    "128x256x8 w64x64 1 block/SM"])
def test_sgemm_warptile_configs_in_the_emulator(config):
    v, cell = pick("sgemm_warptile", config)
    for M, N, K in ((130, 132, 36), (200, 300, 44)):          # aligned (float4 path) with edge tiles
        C, ref = run_variant(v, cell, M, N, K, "fp32")
        assert_close(C, ref, 1e-5)


@pytest.mark.parametrize("name,dtype", [("mma_pipe", "bf16")] + [
    pytest.param(n, t, marks=pytest.mark.slow) for n, t in (("mma_pipe", "fp16"), ("wmma", "bf16"), ("wmma", "fp16"),
                                                           ("mma", "bf16"), ("mma", "fp16"))])
def test_mma_sync_steps_in_the_emulator(name, dtype):
    v, cell = pick(name)
    C, ref = run_variant(v, cell, 130, 270, 40, dtype)            # edge tiles in M and N, K past one slice
    assert_close(C, ref, 8e-3 if dtype == "bf16" else 1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["128x128 2x2 warps", "BK=32 4 stages (the first default)", "BK=64 4 stages",
                                    "128x128 BK=32 4 stages", "256x128 4x2 warps"])
def test_mma_pipe_configs_in_the_emulator(config):
    v, cell = pick("mma_pipe", config)
    for M, N, K in ((260, 140, 200), (260, 270, 320)):           # a K tail; interior tiles too; more slices than stages
        C, ref = run_variant(v, cell, M, N, K, "bf16")
        assert_close(C, ref, 8e-3)


@pytest.mark.slow
def test_mma_pipe_interior_and_edge_tiles_in_the_emulator():
    """Four interior tiles (the unguarded loop and the 16-byte epilogue through smem) beside five edge tiles, with
    more slices than stages: both copies of the main loop and both epilogues."""
    v, cell = pick("mma_pipe")
    C, ref = run_variant(v, cell, 300, 520, 256, "bf16")
    assert_close(C, ref, 8e-3)


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
def test_wgmma_in_the_emulator(dtype):
    """Two clusters of two: B multicast to both CTAs, more cluster tiles than clusters, more slices than stages, a K
    tail for TMA to zero-fill, a CTA whose tile row lies past M."""
    v, cell = pick("wgmma")
    C, ref = run_variant(v, cell, 300, 520, 136, dtype, grid=4)
    assert_close(C, ref, 8e-3 if dtype == "bf16" else 1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["no cluster", "3 stages", "GROUP_M=16", "GROUP_M=1 (row order)",
                                    "BN=128 6 stages", "BN=128 no cluster"])
def test_wgmma_configs_in_the_emulator(config):
    v, cell = pick("wgmma", config)
    C, ref = run_variant(v, cell, 300, 520, 264, "bf16", grid=v.cluster[0] if v.cluster else 1)   # phases wrap
    assert_close(C, ref, 8e-3)


@pytest.mark.slow
def test_wgmma_single_cluster_walks_every_tile():
    """grid = one cluster: it does all 2 x 2 cluster tiles, its stages' phases wrapping many times."""
    v, cell = pick("wgmma")
    C, ref = run_variant(v, cell, 300, 300, 200, "fp16", grid=2)
    assert_close(C, ref, 1e-3)


# --- the emulator has teeth: the bugs it exists to catch -----------------------------------------------------------

def mutated(cell, old, new):
    assert old in cell.source, old
    return bench.Cell(cell.source.replace(old, new, 1), cell.arch, cell.kernels)


def test_emulator_catches_a_cp_async_read_before_its_wait():
    v, cell = pick("mma_pipe")
    bad = mutated(cell, "cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();")
    C, ref = run_variant(v, bad, 128, 256, 200, "bf16")
    assert np.isnan(as_float(C)).any() or np.abs(as_float(C) - ref).max() > 1.0


@pytest.mark.slow
def test_emulator_catches_a_stage_released_before_its_wgmma_finished():
    v, cell = pick("wgmma")
    bad = mutated(cell, "                wgmma_wait<1>();                              // the previous slice",
                  "                if (lane == 0) release(empty + 8 * s);            // too early\n"
                  "                wgmma_wait<1>();                              // the previous slice")
    bad = mutated(bad, "if (k > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));", "")
    bad = mutated(bad, "if (slices > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));", "")
    bad = mutated(bad, "#define CLUSTER_M 2 ", "#define CLUSTER_M 1 ")
    v = pick("wgmma", "no cluster")[0]
    C, ref = run_variant(v, bad, 128, 256, 640, "bf16", grid=1)
    assert np.abs(as_float(C) - ref).max() > 1.0


def test_emulator_catches_a_wrong_fragment():
    v, cell = pick("mma")
    bad = mutated(cell, "b[2 * j][0] = r[0], b[2 * j][1] = r[1]", "b[2 * j][0] = r[1], b[2 * j][1] = r[0]")
    C, ref = run_variant(v, bad, 64, 64, 32, "fp16")
    assert np.abs(as_float(C) - ref).max() > 1.0


@pytest.mark.slow
def test_emulator_catches_a_missing_barrier():
    """Without the barrier after the compute loop, fast threads overwrite the tile slow ones still read."""
    v, cell = pick("sgemm_smem")
    bad = mutated(cell, "        __syncthreads();                         // everyone is done with them before the next"
                  " slice\n", "")
    wrong = 0
    for _ in range(3):                  # a race: not every schedule shows it, so a few tries
        C, ref = run_variant(v, bad, 64, 64, 256, "fp32")
        wrong += np.abs(C - ref).max() > 1e-3
    assert wrong


# --- the exercises' reference solutions and the variants only a GPU can grade ---------------------------------------

EX_LAUNCH = {  # exercise -> (kernel, grid(M, N), block, shapes (M, N, K), dtype)
    "05-smem-tiles": ("sgemm_tile16", lambda M, N: (-(-N // 16), -(-M // 16)), (16, 16), [(45, 70, 33)], "fp32"),
    "05-register-tiles": ("sgemm_4x4", lambda M, N: (-(-N // 64), -(-M // 64)), (16, 16), [(70, 130, 33)], "fp32"),
    "06-wmma-tile": ("wmma_tile", lambda M, N: (N // 16, M // 16), (32,), [(32, 48, 64)], "fp16"),
    "06-mma-fragments": ("mma_fragments", lambda M, N: (N // 8, M // 16), (32,), [(32, 24, 48)], "fp16"),
}


def run_exercise(ex_id, source):
    kernel, grid, block, shapes, dtype = EX_LAUNCH[ex_id]
    out = []
    for M, N, K in shapes:
        if dtype == "fp32":
            A, B, C, ref = sgemm_case(M, N, K)
        else:
            A = rng.standard_normal((M, K)).astype(np.float16)
            B = rng.standard_normal((N, K)).astype(np.float16)
            C = np.full((M, N), np.nan, np.float32)
            ref = A.astype(np.float64) @ B.astype(np.float64).T
        emulate(source, kernel, grid(M, N), block, [A, B, C, M, N, K])
        out.append((C, ref))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("ex_id", sorted(EX_LAUNCH))
def test_exercise_solution_is_right_in_the_emulator(ex_id):
    for C, ref in run_exercise(ex_id, solution_path(ex_id).read_text()):
        assert_close(C, ref, 1e-4)


GPU_WRONG = [v for v in variants() if v.exercise in EX_LAUNCH and v.where == "gpu"
             and set(v.kinds) <= {"wrong_values", "unwritten"}]


@pytest.mark.slow
@pytest.mark.parametrize("variant", GPU_WRONG, ids=str)
def test_exercise_gpu_variant_fails_as_expected_in_the_emulator(variant):
    """What tests/gpu/test_exercises_gpu.py expects the grader to find, checked here: elements left unwritten (the
    poison stays), or all written and wrong."""
    results = run_exercise(variant.exercise, variant.path.read_text())
    if "unwritten" in variant.kinds:
        assert any(np.isnan(C).any() for C, _ in results), f"{variant} writes every element"
    else:
        assert all(not np.isnan(C).any() for C, _ in results), f"{variant} leaves elements unwritten"
        assert any(np.abs(C - ref).max() > 1e-2 for C, ref in results), f"{variant} computes the right product"
