"""Candidate epilogues for tutorial 06's wgmma kernel (tools/gpu/wgmma_variants, issue 13), and the two emulator
features they need (tests/emu/ptx_emu.h): named barriers and TMA stores.

The candidates compile for sm_90a with no spills and hold the instructions they are about (HGMMA, UTMALDG, UTMASTG
where C goes through a TMA store); in the emulator they compute the right product on awkward shapes in bf16 and fp16,
with clusters walking several tiles and an odd number of tiles per CTA (the ping-pong tail); and the emulator catches
the mistakes these epilogues invite (a staging box rewritten before its store read it, a store issued before the box
was written, a bar.arrive nobody waits for). tools/gpu/try_wgmma.py times them on a GPU.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import kernellab
from emu.ptx_emu import EmulationError, TensorMap, emulate
from test_matmul import as_float, assert_close, tc_case

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ROOT / "tools" / "gpu" / "wgmma_variants"


# --- the emulator's named barriers and TMA stores -------------------------------------------------------------------

EXT = r"""
#include <cuda.h>
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Warp 0 hands `rounds` values to warp 1 through one smem word: barrier 1 says "written", barrier 2 "read".
extern "C" __global__ void handoff(int* out, int rounds, int unmatched) {
    __shared__ int box[1];
    const int warp = threadIdx.x / 32;
    for (int r = 0; r < rounds; ++r) {
        if (warp == 0) {
            if (r > 0) named_bar_sync(2, 64);
            for (volatile int spin = 0; spin < 20000; ++spin) {}      // late: a consumer that does not wait reads early
            if (threadIdx.x == 0) box[0] = 100 + r;
            named_bar_arrive(1, 64);
        } else {
            named_bar_sync(1, 64);
            if (threadIdx.x == 32) out[r] = box[0];
            if (r + 1 < rounds || unmatched) named_bar_arrive(2, 64);
        }
    }
}

// Thread t writes box element (r, e) = 64 r + e at its 128-byte-swizzled place; thread 0 stores the 64 x 64 box at
// column c0, row c1 of C. rewrite: thread 0 changes the box before waiting; exit_early: it never waits.
extern "C" __global__ void box_store(const __grid_constant__ CUtensorMap tm, unsigned short* C, int c0, int c1,
                                     int rewrite, int exit_early) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(smem), base = (smem0 + 1023) & ~1023u;
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
        const int r = i / 64, e = i % 64;
        const unsigned a = base + r * 128 + e * 2, sw = a ^ (((a >> 7) & 7) << 4);
        *reinterpret_cast<unsigned short*>(smem + (sw - smem0)) = (unsigned short)(64 * r + e);
    }
    fence_proxy_async();
    __syncthreads();
    if (threadIdx.x == 0) {
        tma_store_2d(&tm, base, c0, c1);
        tma_store_commit();
        if (exit_early) return;
        if (rewrite) *reinterpret_cast<unsigned short*>(smem + (base - smem0)) = 7;
        tma_store_wait_read<0>();
    }
}
"""


def test_named_barriers_order_two_warps_in_the_emulator():
    out = np.zeros(5, np.int32)
    emulate(EXT, "handoff", (1,), (64,), [out, 5, 0])
    assert out.tolist() == [100, 101, 102, 103, 104]


def test_an_unmatched_bar_arrive_is_reported():
    with pytest.raises(EmulationError, match="named barrier 2 .* still holds 32 of 64 arrivals"):
        emulate(EXT, "handoff", (1,), (64,), [np.zeros(2, np.int32), 2, 1])


def test_tma_store_writes_the_swizzled_box_clipped_at_the_edges():
    C = np.zeros((70, 90), np.uint16)
    emulate(EXT, "box_store", (1,), (128,), [TensorMap(C, 64, 64), C, 32, 40, 0, 0], 64 * 128 + 1024)
    want = np.zeros_like(C)
    r, e = np.meshgrid(np.arange(30), np.arange(58), indexing="ij")    # rows 40-69, columns 32-89 lie inside C
    want[40:, 32:] = 64 * r + e
    assert np.array_equal(C, want)


@pytest.mark.parametrize("rewrite,exit_early,message", [
    (1, 0, "smem source changed between the store's issue and its wait_group.read"),
    (0, 1, "TMA stores never waited for")])
def test_tma_store_races_are_reported(rewrite, exit_early, message):
    C = np.zeros((64, 64), np.uint16)
    with pytest.raises(EmulationError, match=message):
        emulate(EXT, "box_store", (1,), (128,), [TensorMap(C, 64, 64), C, 0, 0, rewrite, exit_early],
                64 * 128 + 1024)


# --- the candidates ----------------------------------------------------------------------------------------------

def load_try_wgmma():
    """tools/gpu/try_wgmma.py as a module (it imports torch and reads the notebook's cell; no GPU needed to load)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("try_wgmma", ROOT / "tools" / "gpu" / "try_wgmma.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRY = load_try_wgmma()
CONFIGS = [(family, d) for _, family, d in TRY.VARIANTS]   # what the GPU script times (the cell at each setting)


def smem_bytes(name: str, d: dict) -> int:
    """Dynamic shared memory of a candidate configuration, as tools/gpu/try_wgmma.py launches it."""
    return TRY.geometry(name, d)[5]


def test_the_gpu_script_times_the_cell_and_every_candidate():
    assert [f for _, f, _ in TRY.VARIANTS][0] == "wgmma" and "wgmma_bf16" in TRY.SOURCES["wgmma"]
    assert {"pingpong", "wgmma"} <= {f for f, _ in CONFIGS}
    assert any(d.get("EPI_BUFS") for f, d in CONFIGS if f == "wgmma"), "the cell's staging boxes at other settings"
    assert any(d.get("TMA_STORE") for f, d in CONFIGS if f == "pingpong")
    assert any(n % 8 for _, n, _ in TRY.CHECKS) and any(n % 8 == 0 and n % 256 for _, n, _ in TRY.CHECKS), \
        "checks on both epilogue paths: direct stores (N odd) and TMA stores clipped at the edge"


def label(name, d):
    return name + "".join(f" {k}={v}" for k, v in d.items())


@pytest.mark.parametrize("name,d", [pytest.param(n, d, id=label(n, d)) for n, d in CONFIGS])
def test_candidate_compiles_without_spills_and_holds_its_instructions(name, d):
    source = TRY.SOURCES[name]
    module = kernellab.compile_cuda(source, arch="sm_90a", options=tuple(f"-D{k}={v}" for k, v in d.items()))
    tma_store = name == "wgmma" or d.get("TMA_STORE")
    for dtype in ("bf16", "f16"):
        k = module[f"{name}_{dtype}"]
        r, mix = k.resources, k.instruction_summary
        assert not r.spills and r.local_bytes == 0, r
        assert r.shared_bytes + smem_bytes(name, d) <= 227 * 1024, "fits an H100 block's shared memory with opt-in"
        assert mix["HGMMA"] > 0 and mix["UTMALDG"] > 0, mix
        assert (mix["UTMASTG"] > 0) == bool(tma_store), mix
        # GPU-scope fences: the two of the cluster barriers at the start and the end, as in the notebook's cell; none
        # per k-slice or per tile (the notebook's discussion: one per release cost the kernel half its speed)
        assert k.sass.count("MEMBAR.ALL.GPU") <= 2, [ln for ln in k.sass.splitlines() if "MEMBAR" in ln]


def run_candidate(name, d, M, N, K, dtype, grid, source=None):
    """One candidate in the emulator: C = A B^T with C's TMA store where N % 8 == 0; returns (C, reference)."""
    source = source or TRY.SOURCES[name]
    cm = d.get("CLUSTER_M", 2)
    rows, cols = (d.get("WM", 64), 16384 // d.get("WM", 64)) if name == "pingpong" else (128, 256)
    A, B, C, ref = tc_case(M, N, K, dtype)
    by_tma = int(N % 8 == 0)                               # C's rows a multiple of 16 bytes: a tensor map exists
    box_rows = rows if name == "pingpong" else 64
    tmC = TensorMap(C, 64, box_rows) if by_tma else TensorMap(A, 64, box_rows)    # a stand-in the kernel never uses
    emulate(source, f"{name}_{'bf16' if dtype == 'bf16' else 'f16'}", (grid,), (384,),
            [TensorMap(A, 64, rows), TensorMap(B, 64, cols // cm), tmC, C, M, N, K] + ([by_tma] if name == "pingpong"
                                                                                     else []),   # the cell tests N
            smem_bytes(name, d),
            defines=d, cluster=(cm,))
    return C, ref


# 300 x 520: 5 x 3 tiles of 64 x 256 (3 x 3 cluster tiles: with 2 clusters, 5 and 4 tiles per CTA, so consumer 0 has
# one more than consumer 1), a CTA whose tile row lies past M, K past one slice and a K tail.
CASES = [("pingpong", {}, 300, 520, 136, "bf16", 4),
         ("pingpong", {"TMA_STORE": 1, "STAGES": 4}, 300, 520, 264, "bf16", 4),
         ("wgmma", {}, 300, 520, 136, "bf16", 4)]
SLOW_CASES = [("pingpong", {}, 255, 129, 200, "fp16", 2),                        # N odd: direct stores
              ("pingpong", {"TMA_STORE": 1, "STAGES": 4}, 300, 520, 136, "fp16", 2),
              ("pingpong", {"TMA_STORE": 1, "STAGES": 4}, 130, 271, 40, "bf16", 2),   # N odd: the fallback path
              ("pingpong", {"WM": 128, "STAGES": 6}, 300, 520, 264, "fp16", 2),
              ("pingpong", {"WM": 128, "STAGES": 5, "TMA_STORE": 1}, 300, 520, 264, "bf16", 4),
              ("pingpong", {"ORDERED": 0}, 300, 520, 136, "bf16", 2),
              ("pingpong", {"CLUSTER_M": 1, "TMA_STORE": 1, "STAGES": 4}, 130, 272, 40, "fp16", 3),
              ("wgmma", {}, 300, 520, 264, "fp16", 2),
              ("wgmma", {"EPI_BUFS": 1}, 300, 520, 264, "bf16", 2),
              ("wgmma", {"STAGES": 3, "EPI_BUFS": 4}, 300, 520, 264, "bf16", 2),
              ("wgmma", {}, 255, 129, 200, "bf16", 2),
              ("wgmma", {"CLUSTER_M": 1}, 130, 272, 40, "fp16", 3)]


@pytest.mark.parametrize("name,d,M,N,K,dtype,grid", [pytest.param(*c, id=f"{label(c[0], c[1])} {c[2]}x{c[3]}x{c[4]} "
                                                                     f"{c[5]}") for c in CASES] + [
    pytest.param(*c, id=f"{label(c[0], c[1])} {c[2]}x{c[3]}x{c[4]} {c[5]}", marks=pytest.mark.slow)
    for c in SLOW_CASES])
def test_candidate_in_the_emulator(name, d, M, N, K, dtype, grid):
    C, ref = run_candidate(name, d, M, N, K, dtype, grid)
    assert_close(C, ref, 8e-3 if dtype == "bf16" else 1e-3)


def mutated(name, old, new):
    source = TRY.SOURCES[name]
    assert old in source, old
    return source.replace(old, new, 1)


def test_emulator_catches_a_staging_box_rewritten_before_its_store_read_it():
    bad = mutated("wgmma", "tma_store_wait_read<EPI_BUFS - 1>();", "")
    with pytest.raises(EmulationError, match="smem source changed"):
        run_candidate("wgmma", {}, 300, 520, 136, "bf16", 4, source=bad)


@pytest.mark.slow
def test_emulator_catches_a_store_issued_before_the_box_is_written():
    bad = mutated("pingpong", "named_bar_sync(EPI_BAR + c, 128);         // the whole box is in smem", "")
    with pytest.raises(EmulationError, match="smem source changed"):
        run_candidate("pingpong", {"TMA_STORE": 1, "STAGES": 4}, 300, 520, 136, "bf16", 4, source=bad)


def test_emulator_catches_a_pingpong_handoff_nobody_waits_for():
    """The last tile's bar.arrive must be skipped when the other consumer has no tile left: an unmatched arrive."""
    bad = mutated("pingpong", "if (ORDERED && ct + stride < cluster_tiles) named_bar_arrive",
                  "if (ORDERED) named_bar_arrive")
    with pytest.raises(EmulationError, match="still holds 128 of 256 arrivals"):
        run_candidate("pingpong", {}, 300, 520, 136, "bf16", 4, source=bad)



class _Recorder:
    """Stands in for a Kernel in try_wgmma's launch function: records the launch, checks it against the signature."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def launch(self, grid, block, *args, shared_bytes=0, cluster=None, sync=None):
        params = self.kernel.params
        assert len(args) == len(params), (self.kernel.name, len(args), len(params))
        for p, a in zip(params, args):
            if p.base == "CUtensorMap":
                assert isinstance(a, tuple) and a[0] == "map", (p, a)
            elif p.pointer:
                assert hasattr(a, "data_ptr"), (p, a)
            else:
                assert isinstance(a, int), (p, a)
        self.calls.append((grid, block, args, shared_bytes, cluster))


@pytest.mark.parametrize("label,family,d", TRY.VARIANTS, ids=[v[0] for v in TRY.VARIANTS])
def test_the_gpu_script_launches_match_the_kernels(label, family, d, monkeypatch):
    """try_wgmma's launches, on CPU tensors with stand-in tensor maps: the argument order of each signature, the
    C map only where N % 8 == 0 (else the flag 0), whole persistent clusters, the smem the kernel's layout needs."""
    import torch

    monkeypatch.setattr(TRY.kernellab, "tensor_map", lambda t, box, swizzle: ("map", tuple(t.shape), box))
    module = kernellab.compile_cuda(TRY.SOURCES[family], arch="sm_90a",
                                    options=tuple(f"-D{k}={v}" for k, v in d.items()))
    rec = _Recorder(module[f"{family}_bf16"])
    run = TRY.run_fn(rec, family, d, 132)
    for M, N, K in [(4095, 4097, 1023), (1000, 1000, 200), (4096, 4096, 4096)]:
        A, B = torch.zeros(M, K, dtype=torch.bfloat16), torch.zeros(N, K, dtype=torch.bfloat16)
        run(A, B, torch.zeros(M, N, dtype=torch.bfloat16))
        grid, block, args, smem, cluster = rec.calls[-1]
        rows, cols, c_rows, cm, _, _ = TRY.geometry(family, d)
        assert block == 384 and cluster == (cm, 1, 1) and grid % cm == 0 and grid <= 132
        assert args[0] == ("map", (M, K + -K % 8), (rows, 64)) and args[1] == ("map", (N, K + -K % 8), (cols // cm, 64))
        if family != "wgmma":
            assert args[-1] == int(N % 8 == 0)
            assert args[2] == (("map", (M, N), (c_rows, 64)) if N % 8 == 0 else args[0])
        assert smem + rec.kernel.resources.shared_bytes <= 227 * 1024
