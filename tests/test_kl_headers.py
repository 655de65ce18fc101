"""kernellab's shared device headers (kernellab/include/kl/*.cuh): on NVRTC's include path for every compile, part of
the compile cache's key, and each one compiled with NVRTC for sm_90 to the instructions its names promise (SASS read
with cuobjdump; no GPU needed)."""
import pathlib
import re
import shutil

import numpy as np

import pytest

import kernellab
from kernellab.compile import toolkit

KL = toolkit.KL_INCLUDE + "/kl"


def opcodes(kernel) -> set[str]:
    """The SASS mnemonics of one kernel (predicates dropped)."""
    return set(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]+)", kernel.sass, re.M))


def compile_kernels(source: str, arch: str = "sm_90") -> dict:
    """{kernel symbol: its opcodes} of `source` compiled as a %%cuda cell is."""
    module = kernellab.compile_cuda(source, arch=arch, first_line=2, filename="cell.cu")
    return {k.symbol: opcodes(k) for k in module.kernels}


HEADERS = ("add_norm.cuh", "attention.cuh", "attention_mma.cuh", "cluster.cuh", "convert.cuh", "cp_async.cuh",
           "mma.cuh", "pdl.cuh", "ptx.cuh", "reduce.cuh", "rows.cuh", "tile.cuh", "tma.cuh", "wgmma.cuh")


def test_the_headers_are_where_nvrtc_looks():
    assert sorted(p.name for p in pathlib.Path(KL).glob("*.cuh")) == list(HEADERS)
    assert toolkit.KL_INCLUDE in toolkit.include_dirs()


@pytest.mark.parametrize("header", HEADERS)
def test_each_header_compiles_on_its_own_and_twice(header):
    """Self-contained (includes what it uses) and guarded (#pragma once): included twice, alone, it compiles."""
    found = compile_kernels(f'#include <kl/{header}>\n#include <kl/{header}>\n'
                            'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }\n')
    assert set(found) == {"k"}


# The tile macros the tutorials define (and benchmarks/ sweep with -D): no header may use them as names.
CELL_MACROS = ("BM", "BN", "BK", "TM", "TN", "WM", "WN", "PAD", "NTHREADS", "STAGES", "CHUNKS", "M", "N", "K", "D",
               "VPT", "VEC", "CLUSTER", "BLOCK", "ROWS")


@pytest.mark.parametrize("header", HEADERS)
def test_each_header_survives_the_cells_macros(header):
    """A cell #defines BK, N, PAD, ... before its #include, or compiles with -DBK=...: the headers' template
    parameters and arguments use none of those names."""
    defines = "".join(f"#define {m} 1\n" for m in CELL_MACROS)
    found = compile_kernels(defines + f'#include <kl/{header}>\n'
                            'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }\n', arch="sm_90a")
    assert set(found) == {"k"}


def test_ptx_wrappers_compile_to_their_instructions():
    ops = compile_kernels(r'''
#include <kl/ptx.cuh>
extern "C" __global__ void k_exp(float* y) { y[threadIdx.x] = exp_ftz(y[threadIdx.x]); }
extern "C" __global__ void k_prefetch(const float* p) { prefetch_l1(p + threadIdx.x * 32); }
extern "C" __global__ void __cluster_dims__(2, 1, 1) k_cluster(unsigned* y) {
    cluster_arrive_relaxed();
    cluster_wait();
    y[blockIdx.x] = cluster_ctarank() + shared_addr(y);
}
''')
    # exp_ftz: one FMUL by log2(e), one MUFU.EX2, and none of __expf's denormal fix-up (FSETP / a second FMUL)
    assert {"FMUL", "MUFU.EX2"} <= ops["k_exp"] and not {"FSETP.GEU.AND", "FSETP.GE.AND"} & ops["k_exp"]
    assert "CCTL.E.PF1" in ops["k_prefetch"]                                          # prefetch.global.L1
    assert {"UCGABAR_ARV", "UCGABAR_WAIT"} <= ops["k_cluster"]                         # barrier.cluster.arrive/wait
    assert "MEMBAR.ALL.GPU" not in ops["k_cluster"]                                    # .relaxed: no fence


def test_the_cluster_exchange_is_st_async_counted_on_an_mbarrier():
    ops = compile_kernels(r'''
#include <kl/cluster.cuh>
extern "C" __global__ void __cluster_dims__(2, 1, 1) k(float* y) {
    exchange_open<float, 2>();
    Exchange<float, 2>& ex = exchange<float, 2>();
    unsigned me = cluster_ctarank();
    cluster_wait();
    if (threadIdx.x == 0) exchange_push(&ex.part[me], y[blockIdx.x], &ex.bar, me ^ 1u);
    exchange_wait(&ex.bar, 0);
    y[blockIdx.x] = ex.part[me ^ 1u];
}
''')["k"]
    assert {"SYNCS.EXCH.64", "SYNCS.ARRIVE.TRANS64", "STAS", "SYNCS.PHASECHK.TRANS64.TRYWAIT"} <= ops, ops
    assert "MEMBAR.ALL.GPU" not in ops


def test_rows_move_16_bytes_a_load_and_a_store():
    ops = compile_kernels(r'''
#include <kl/rows.cuh>
template <typename T, Pad PAD>
__global__ void k(const T* __restrict__ x, T* __restrict__ y, int cols) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(cols, 0, VEC);
    Pack<T> pk[2];
    load_packs<PAD>(pk, x, L, threadIdx.x, blockDim.x);
    float f[VEC];
    for (int j = 0; j < 2; ++j) {
        for (int k = 0; k < VEC; ++k) f[k] = pk[j].get(k) * 2.0f;
        pk[j] = from_floats<T>(f);
    }
    store_packs(pk, y, L, threadIdx.x, blockDim.x);
    int e = L.edge(threadIdx.x, cols);
    if (e >= 0) y[e] = from_float<T>(to_float(x[e]) + 1.0f);
}
template __global__ void k<float, Pad::zero>(const float*, float*, int);
template __global__ void k<__nv_bfloat16, Pad::neg_inf>(const __nv_bfloat16*, __nv_bfloat16*, int);
template __global__ void k<__half, Pad::zero>(const __half*, __half*, int);
''')
    assert len(ops) == 3
    for name, o in ops.items():
        assert {"LDG.E.128.CONSTANT", "STG.E.128"} <= o, (name, o)
    bf16 = next(o for n, o in ops.items() if "bfloat16" in n)
    assert "F2FP.BF16.F32.PACK_AB" in bf16                           # from_floats: two values, one conversion


def test_reductions_shuffle_then_meet_in_shared_memory():
    ops = compile_kernels(r'''
#include <kl/reduce.cuh>
extern "C" __global__ void k(float* y) {
    float v = y[threadIdx.x];
    y[threadIdx.x] = block_sum(v) + block_max(v) + warp_sum(v) * warp_max(v);
}
''')["k"]
    assert {"SHFL.BFLY", "BAR.SYNC.DEFER_BLOCKING", "STS", "LDS", "FMNMX", "FADD"} <= ops


def test_conversions_round_to_nearest_even():
    ops = compile_kernels(r'''
#include <kl/convert.cuh>
extern "C" __global__ void k(const float* x, __nv_bfloat16* b, __half* h, unsigned* p) {
    b[threadIdx.x] = from_float<__nv_bfloat16>(to_float(x[threadIdx.x]));
    h[threadIdx.x] = from_float<__half>(to_float(b[threadIdx.x]) + to_float(h[threadIdx.x]));
    p[threadIdx.x] = pack2<__nv_bfloat16>(x[0], x[1]) ^ pack2<__half>(x[2], x[3]);
}
''')["k"]
    assert "F2F.BF16.F32" in ops                                     # one value: F2F (round to nearest even)
    assert {"F2FP.BF16.F32.PACK_AB", "F2FP.F16.F32.PACK_AB"} <= ops, ops   # pack2: two values, one instruction


def test_mma_and_ldmatrix_are_hmma_and_ldsm():
    ops = compile_kernels(r'''
#include <kl/mma.cuh>
template <typename T>
__global__ void k(float* out) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    tile[threadIdx.x] = threadIdx.x;
    __syncthreads();
    unsigned a[4], b[4];
    unsigned addr = (unsigned)__cvta_generic_to_shared(&tile[(threadIdx.x % 32) * 8]);
    ldmatrix_x4(a, addr);
    ldmatrix_x4_trans(b, addr);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const unsigned b01[2] = {b[0], b[1]};
    mma_16816<T>(d, a, b01);
    mma_16816<T>(d, a, b[2], b[3]);
    for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = d[i];
}
template __global__ void k<__nv_bfloat16>(float*);
template __global__ void k<__half>(float*);
''')
    assert len(ops) == 2
    for name, o in ops.items():
        assert {"LDSM.16.M88.4", "LDSM.16.MT88.4", "HMMA.16816.F32" + (".BF16" if "bfloat16" in name else "")} <= o, \
            (name, sorted(o))


def test_cp_async_is_ldgsts_with_its_groups():
    ops = compile_kernels(r'''
#include <kl/cp_async.cuh>
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ __align__(16) float s[256 + 4 * 256];
    unsigned base = (unsigned)__cvta_generic_to_shared(s);
    cp_async_4(base + 4 * threadIdx.x, x + threadIdx.x, 4);
    cp_async_commit();
    cp_async_16(base + 1024 + 16 * threadIdx.x, x + 4 * threadIdx.x, threadIdx.x % 2 ? 16 : 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float v = s[threadIdx.x];
    cp_async_wait_all();
    __syncthreads();
    y[threadIdx.x] = v + s[256 + threadIdx.x];
}
''')["k"]
    assert {"LDGSTS.E", "LDGSTS.E.BYPASS.128", "LDGDEPBAR", "DEPBAR.LE"} <= ops, sorted(ops)


def test_load4_is_one_16_byte_load_inside_and_guarded_loads_at_the_edges():
    ops = compile_kernels(r'''
#include <kl/tile.cuh>
extern "C" __global__ void k(const float* __restrict__ a, float4* out, int rows, int cols, bool vec) {
    out[threadIdx.x] = load4(a, blockIdx.x, 4 * threadIdx.x, rows, cols, vec);
}
''')["k"]
    assert {"LDG.E.128.CONSTANT", "LDG.E.CONSTANT", "STG.E.128"} <= ops, sorted(ops)


def test_16_bit_tiles_load_16_bytes_and_store_pairs():
    ops = compile_kernels(r'''
#include <kl/tile.cuh>
template <typename T>
__global__ void k(const T* __restrict__ a, T* c, int rows, int K, int M, int N) {
    __shared__ __align__(128) T tile[128][32 + 8];
    load_tile<128, 32, 256>(tile, a, blockIdx.x * 128, rows, 0, K);
    __syncthreads();
    store2(c, threadIdx.x, 2 * threadIdx.y, M, N, to_float(tile[threadIdx.x][0]), to_float(tile[threadIdx.x][1]));
}
template __global__ void k<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int, int, int, int);
template __global__ void k<__half>(const __half*, __half*, int, int, int, int);
''')
    assert len(ops) == 2
    for name, o in ops.items():
        assert any(op.startswith("LDG.E.128") for op in o) and {"STS.128", "STG.E", "STG.E.U16"} <= o, \
            (name, sorted(o))


def test_wgmma_is_hgmma_for_every_shape_and_type_on_sm_90a():
    ops = compile_kernels(r'''
#include <kl/wgmma.cuh>
template <int N, typename T>
__global__ void ss(float* out, unsigned long long da, unsigned long long db) {
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    wgmma_fence();
    wgmma_ss<N, T>(d, da, db, 0);
    wgmma_ss<N, T>(d, da, db, 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(d);
    for (int i = 0; i < N / 2; ++i) out[i * 128 + threadIdx.x] = d[i];
}
template <int N, typename T>
__global__ void rs(float* out, const unsigned* a, unsigned long long db) {
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    const unsigned frag[4] = {a[threadIdx.x], a[threadIdx.x + 128], a[threadIdx.x + 256], a[threadIdx.x + 384]};
    wgmma_fence();
    wgmma_rs_tb<N, T>(d, frag, db);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i) out[i * 128 + threadIdx.x] = d[i];
}
template __global__ void ss<128, __nv_bfloat16>(float*, unsigned long long, unsigned long long);
template __global__ void ss<128, __half>(float*, unsigned long long, unsigned long long);
template __global__ void ss<256, __nv_bfloat16>(float*, unsigned long long, unsigned long long);
template __global__ void ss<256, __half>(float*, unsigned long long, unsigned long long);
template __global__ void rs<64, __nv_bfloat16>(float*, const unsigned*, unsigned long long);
template __global__ void rs<64, __half>(float*, const unsigned*, unsigned long long);
template __global__ void rs<128, __nv_bfloat16>(float*, const unsigned*, unsigned long long);
template __global__ void rs<128, __half>(float*, const unsigned*, unsigned long long);
''', arch="sm_90a")
    assert len(ops) == 8
    for name, o in ops.items():
        n = 256 if "Li256E" in name else 128 if "Li128E" in name else 64
        hgmma = {op for op in o if op.startswith("HGMMA.")}
        shape = f"HGMMA.64x{n}x16.F32" + (".BF16" if "bfloat16" in name else "")
        assert any(op.startswith(shape) for op in hgmma), (name, hgmma)
        assert {"WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE"} <= o, (name, sorted(o))


def test_tma_is_utmaldg_counted_on_an_mbarrier_and_the_descriptor_is_swizzled():
    ops = compile_kernels(r'''
#include <kl/tma.cuh>
#include <cuda.h>
extern "C" __global__ void k(const __grid_constant__ CUtensorMap tmap, float* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned tile = (unsigned)__cvta_generic_to_shared(smem), bar = tile + 8192;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_expect_tx(bar, 8192);
        tma_load_3d(tile, &tmap, bar, 0, 64 * blockIdx.x, blockIdx.y);
    }
    mbar_wait(bar, 0);
    out[threadIdx.x] = reinterpret_cast<const float*>(smem)[threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) mbar_arrive(bar);
}
extern "C" __global__ void desc(unsigned addr, unsigned long long* out) { *out = sw128_desc(addr, 16, 1024); }
''', arch="sm_90a")
    # mbar_init: SYNCS.EXCH; mbar_expect_tx / mbar_arrive: SYNCS.ARRIVE; mbar_wait: the try_wait loop; tma_load_3d
    assert {"UTMALDG.3D", "SYNCS.EXCH.64", "SYNCS.ARRIVE.TRANS64", "SYNCS.ARRIVE.TRANS64.A1T0",
            "SYNCS.PHASECHK.TRANS64.TRYWAIT"} <= ops["k"], sorted(ops["k"])
    assert "STG.E.64" in ops["desc"] and not any(op.startswith(("SYNCS", "UTMA")) for op in ops["desc"])



# The producer's side of <kl/attention.cuh> (QKvRing's layout and init_barriers_and_sync, produce_q, produce_kv, both
# forms): one thread streams a block's Q and K/V tiles of 16 keys through a 2-stage ring (so it waits on `empty` from
# the third tile on) and one consumer warp copies each tile out, undoing the 128-byte swizzle, and releases its stage.
# PERSISTENT: two work items (heads 0 then 1, two tiles each) on one ring, kv running on; otherwise head 1's four
# tiles. Q, K, V: [2, 64, 64] fp16 (heads, rows, columns); q_out: [16, 64], k_out, v_out: [64, 64].
PRODUCER_KERNEL = r"""
#include <kl/attention.cuh>
#include <cuda.h>
template <bool PERSISTENT>
__device__ __forceinline__ void stream(const void* tq, const void* tk, const void* tv, __half* q_out, __half* k_out,
                                       __half* v_out) {
    constexpr int D = 64, BN = 16, STAGES = 2, N_TILES = 4, KV_BYTES = BN * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u;
    using Ring = QKvRing<D, 16, BN, STAGES>;
    static_assert(Ring::kBytes == 16 * 128 + 2 * STAGES * KV_BYTES + 8 * 7, "Q, the ring, 7 mbarriers");
    const Ring sm(base);
    const unsigned q_s = sm.q_s, k_s = sm.k_s, v_s = sm.v_s, full_q = sm.full_q, full_k = sm.full_k,
                   full_v = sm.full_v, empty = sm.empty;
    if (q_s != base || k_s != base + 16 * 128 || v_s != k_s + STAGES * KV_BYTES || full_q != v_s + STAGES * KV_BYTES
        || full_k != full_q + 8 || full_v != full_k + 8 * STAGES || empty != full_v + 8 * STAGES) __trap();
    sm.init_barriers_and_sync(1);               // one consumer warp
    if (threadIdx.x < 32) {                     // the producer warp: one thread issues every copy
        if (threadIdx.x == 0) {
            produce_q<D, 16>(tq, q_s, full_q, 16, 1);
            if (PERSISTENT) {
                int kv = 0;
                produce_kv<D, BN, STAGES>(tk, tv, k_s, v_s, full_k, full_v, empty, 2, 0, kv);
                produce_kv<D, BN, STAGES>(tk, tv, k_s, v_s, full_k, full_v, empty, 2, 1, kv);
            } else {
                produce_kv<D, BN, STAGES>(tk, tv, k_s, v_s, full_k, full_v, empty, N_TILES, 1);
            }
        }
        return;
    }
    const int lane = threadIdx.x % 32;
    const unsigned char* smem = smem_raw + (base - (unsigned)__cvta_generic_to_shared(smem_raw));
    auto copy_out = [&](unsigned tile, __half* out, int rows) {      // [rows][64] swizzled -> row-major
        for (int i = lane; i < rows * D; i += 32) {
            const int r = i / D, c = i % D;
            const int byte = r * 128 + ((((c / 8) ^ (r % 8))) << 4) + 2 * (c % 8);
            out[i] = *reinterpret_cast<const __half*>(smem + (tile - base) + byte);
        }
    };
    mbar_wait(full_q, 0);
    copy_out(q_s, q_out, 16);
    for (int j = 0; j < N_TILES; ++j) {
        const int s = j % STAGES, phase = (j / STAGES) & 1;
        mbar_wait(full_k + 8 * s, phase);
        mbar_wait(full_v + 8 * s, phase);
        copy_out(k_s + s * KV_BYTES, k_out + j * BN * D, BN);
        copy_out(v_s + s * KV_BYTES, v_out + j * BN * D, BN);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
    }
}
extern "C" __global__ void one_block(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
        const __grid_constant__ CUtensorMap tv, __half* q_out, __half* k_out, __half* v_out) {
    stream<false>(&tq, &tk, &tv, q_out, k_out, v_out);
}
extern "C" __global__ void persistent(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
        const __grid_constant__ CUtensorMap tv, __half* q_out, __half* k_out, __half* v_out) {
    stream<true>(&tq, &tk, &tv, q_out, k_out, v_out);
}
"""


def test_the_attention_producer_is_tma_counted_on_the_rings_mbarriers():
    ops = compile_kernels(PRODUCER_KERNEL, arch="sm_90a")
    for name in ("one_block", "persistent"):
        assert {"UTMALDG.3D", "SYNCS.EXCH.64", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64.TRYWAIT"} <= ops[name], \
            (name, sorted(ops[name]))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["one_block", "persistent"])
def test_the_attention_producer_streams_q_and_every_kv_tile_through_the_ring_on_the_emulator(kernel):
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 64, 64)).astype(np.float16) for _ in range(3))
    q_out = np.full((16, 64), np.nan, np.float16)
    k_out, v_out = (np.full((64, 64), np.nan, np.float16) for _ in range(2))
    maps = [emulate.TensorMap(q, 64, 16), emulate.TensorMap(k, 64, 16), emulate.TensorMap(v, 64, 16)]
    emulate.emulate(PRODUCER_KERNEL, kernel, (1,), (64,), maps + [q_out, k_out, v_out], 1024 + 16 * 128 * 5 + 64)
    np.testing.assert_array_equal(q_out, q[1, 16:32])          # produce_q: rows q0 = 16 .. of head 1
    if kernel == "one_block":                                  # head 1's first four tiles of 16 keys
        np.testing.assert_array_equal(k_out, k[1]), np.testing.assert_array_equal(v_out, v[1])
    else:                                                      # two items: head 0's tiles 0, 1, then head 1's
        np.testing.assert_array_equal(k_out, np.concatenate([k[0, :32], k[1, :32]]))
        np.testing.assert_array_equal(v_out, np.concatenate([v[0, :32], v[1, :32]]))


def test_fence_mbarrier_init_is_the_inline_fence_it_names():
    """<kl/tma.cuh>'s fence_mbarrier_init compiles to the same SASS as the PTX statement written inline."""
    body = r"""(unsigned* out) {
    __shared__ __align__(8) unsigned long long bar;
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        %s
    }
    __syncthreads();
    mbar_arrive(b);
    out[threadIdx.x] = b;
}"""
    source = ('#include <kl/tma.cuh>\nextern "C" __global__ void header' + body % "fence_mbarrier_init();"
              + '\nextern "C" __global__ void inline_ptx'
              + body % 'asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");')
    module = kernellab.compile_cuda(source, arch="sm_90a", first_line=2, filename="cell.cu")
    sass = {k.name: re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]*;)", k.sass) for k in module.kernels}   # instructions
    assert len(sass["header"]) > 10 and sass["header"] == sass["inline_ptx"]
    assert "SYNCS.EXCH.64" in opcodes(module.kernels[0])


# kv_tiles and QKvRing::init_barriers_and_sync (<kl/attention.cuh>): block b of 64 query rows (q0 = 64 b) over N keys
# in tiles of 48 writes kv_tiles without and with the causal mask (tiles: [2][blocks]); after the prologue every thread
# finds the ring's mbarriers initialised: warp 0's lane 0 arrives on full_q and full_k[1] (one arrival each), lane 0
# of each of the 2 warps on empty[1] (consumer_warps = 2), every thread waits for the three phases and writes 1 (ready:
# [blocks][64]).
KV_TILES_KERNEL = r"""
#include <kl/attention.cuh>
extern "C" __global__ void prologue(int* tiles, int* ready, int N) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const QKvRing<64, 64, 48, 2> sm(((unsigned)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u);
    const int q0 = 64 * blockIdx.x;
    sm.init_barriers_and_sync(2);
    if (threadIdx.x == 0) {
        tiles[blockIdx.x] = kv_tiles<64, 48, false>(N, q0);
        tiles[gridDim.x + blockIdx.x] = kv_tiles<64, 48, true>(N, q0);
        mbar_arrive(sm.full_q);
        mbar_arrive(sm.full_k + 8);
    }
    if (threadIdx.x % 32 == 0) mbar_arrive(sm.empty + 8);
    mbar_wait(sm.full_q, 0);
    mbar_wait(sm.full_k + 8, 0);
    mbar_wait(sm.empty + 8, 0);
    ready[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}
"""


def test_the_attention_prologue_compiles_to_the_fenced_mbarrier_inits():
    ops = compile_kernels(KV_TILES_KERNEL, arch="sm_90a")["prologue"]
    assert {"SYNCS.EXCH.64", "BAR.SYNC.DEFER_BLOCKING", "SYNCS.PHASECHK.TRANS64.TRYWAIT"} <= ops, sorted(ops)


@pytest.mark.slow
@pytest.mark.parametrize("N", [1, 48, 200, 256, 300])
def test_kv_tiles_and_the_ring_prologue_on_the_emulator(N):
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    blocks = -(-N // 64)
    tiles = np.full(2 * blocks, -1, np.int32)
    ready = np.zeros(blocks * 64, np.int32)
    emulate.emulate(KV_TILES_KERNEL, "prologue", (blocks,), (64,), [tiles, ready, N],
                    1024 + 64 * 64 * 2 + 2 * 2 * 48 * 64 * 2 + 8 * 7)   # alignment slack, QKvRing::kBytes
    all_tiles = -(-N // 48)
    # causal: the tiles holding keys 0 .. q0 + 63 (the block's last row), never past the last tile
    causal = [min(all_tiles, -(-(64 * b + 64) // 48)) for b in range(blocks)]
    np.testing.assert_array_equal(tiles, [all_tiles] * blocks + causal)
    assert causal[0] == min(all_tiles, 2) and causal[-1] == all_tiles
    np.testing.assert_array_equal(ready, 1)

# A warp's 16 query rows (kMT = 1) against two tiles of 16 keys (kNB = 2), head dim 64 (kDB = 8): two softmax_pv calls,
# then O / l. S: [16, 32] fp32 scores, V: [32, 64] fp16; O: [16, 64] fp32 (0 where a row saw no key).
SOFTMAX_PV_KERNEL = r"""
#include <kl/attention_mma.cuh>
extern "C" __global__ void k(const float* S, const __half* V, float* O, float scale_log2) {
    __shared__ __align__(128) unsigned char v_s[2][16 * 64 * 2];      // two swizzled [16 keys, 64] V tiles
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (int i = lane; i < 32 * 8; i += 32) {
        const int key = i / 8, c = i % 8;
        *reinterpret_cast<uint4*>(v_s[key / 16] + swz<64>(key % 16, c)) =
            *reinterpret_cast<const uint4*>(V + key * 64 + 8 * c);
    }
    __syncwarp();
    float o[1][8][4], m[1][2], l[1][2];
    for (int e = 0; e < 8; ++e) o[0][e][0] = o[0][e][1] = o[0][e][2] = o[0][e][3] = 0.f;
    m[0][0] = m[0][1] = -CUDART_INF_F, l[0][0] = l[0][1] = 0.f;
    unsigned k_col[4], q_col[4], v_col[4], k_row, qv_row;
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);
    for (int j = 0; j < 2; ++j) {
        float s[1][2][4];
        for (int nb = 0; nb < 2; ++nb)
            for (int e = 0; e < 4; ++e) s[0][nb][e] = S[(g + 8 * (e >> 1)) * 32 + 16 * j + 8 * nb + 2 * t + (e & 1)];
        const unsigned v_base = (unsigned)__cvta_generic_to_shared(v_s[j]) + qv_row;
        softmax_pv<__half>(s, o, m, l, true, scale_log2, 8.0f, v_base, v_col);
    }
    for (int h = 0; h < 2; ++h) {
        float sum = l[0][h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        for (int db = 0; db < 8; ++db)
            for (int e = 0; e < 2; ++e) O[(g + 8 * h) * 64 + 8 * db + 2 * t + e] = sum > 0.f ? o[0][db][2 * h + e] / sum : 0.f;
    }
}
"""


# ldmatrix_offsets<kKC> for head dims 64 and 128: each lane's k_col, q_col, v_col (kKC each), k_row and qv_row.
# The ends of a warp's rows in <kl/attention_mma.cuh>: quad_sums, lane i of one warp holds l = L[i] and writes its
# quad's sum and 1 / it (quad_sum_inv); fresh, each lane writes its O, m and l after init_oml (o: [32][2 * 4 * 4], m, l:
# [32][2 * 2], NaN before).
QUAD_SUM_KERNEL = r"""
#include <kl/attention_mma.cuh>
extern "C" __global__ void fresh(float* O, float* M, float* L) {
    float o[2][4][4], m[2][2], l[2][2];
    init_oml(o, m, l);
    const int lane = threadIdx.x;
    for (int i = 0; i < 32; ++i) O[lane * 32 + i] = o[i / 16][(i / 4) % 4][i % 4];
    for (int i = 0; i < 4; ++i) M[lane * 4 + i] = m[i / 2][i % 2], L[lane * 4 + i] = l[i / 2][i % 2];
}
extern "C" __global__ void quad_sums(const float* L, float* sums, float* invs, float* invs_only) {
    const int lane = threadIdx.x;
    float sum;
    invs[lane] = quad_sum_inv(L[lane], sum);
    sums[lane] = sum;
    invs_only[lane] = quad_sum_inv(L[lane]);
}
"""


@pytest.mark.slow
def test_quad_sum_inv_adds_a_rows_four_lanes_and_inverts_on_the_emulator():
    """Each lane gets the sum of l over its quad (lanes 4 g .. 4 g + 3) and 1 / it; a quad that saw no key (sum 0)
    gets 0, not inf."""
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    L = np.random.default_rng(3).uniform(0.5, 4.0, 32).astype(np.float32)
    L[8:12] = 0.0                                              # quad 2: a row that saw no key
    sums, invs, invs_only = (np.full(32, np.nan, np.float32) for _ in range(3))
    emulate.emulate(QUAD_SUM_KERNEL, "quad_sums", (1,), (32,), [L, sums, invs, invs_only])
    quad = L.reshape(8, 4)
    expect = np.repeat((quad[:, 0] + quad[:, 1]) + (quad[:, 2] + quad[:, 3]), 4)   # xor 1, then xor 2
    np.testing.assert_allclose(sums, expect, rtol=1e-6)
    np.testing.assert_allclose(invs, np.where(expect > 0, 1 / np.where(expect > 0, expect, 1), 0), rtol=1e-6)
    assert (invs[8:12] == 0).all() and (invs[:8] > 0).all()
    np.testing.assert_array_equal(invs_only, invs)


@pytest.mark.slow
def test_init_oml_starts_o_and_l_at_zero_and_m_at_minus_infinity_on_the_emulator():
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    o, m, l = np.full(32 * 32, np.nan, np.float32), np.full(32 * 4, np.nan, np.float32), np.full(32 * 4, np.nan,
                                                                                              np.float32)
    emulate.emulate(QUAD_SUM_KERNEL, "fresh", (1,), (32,), [o, m, l])
    assert (o == 0).all() and (l == 0).all() and (m == -np.inf).all()


def test_quad_sum_inv_is_two_shuffles():
    ops = compile_kernels(QUAD_SUM_KERNEL)["quad_sums"]
    assert "SHFL.BFLY" in ops and "MUFU.RCP" in ops, sorted(ops)


OFFSETS_KERNEL = r"""
#include <kl/attention_mma.cuh>
template <int KC>
__device__ __forceinline__ void offsets(unsigned* out) {
    const int lane = threadIdx.x;
    unsigned k_col[KC], q_col[KC], v_col[KC], k_row, qv_row;
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);
    unsigned* o = out + lane * (3 * KC + 2);
    for (int kc = 0; kc < KC; ++kc) o[kc] = k_col[kc], o[KC + kc] = q_col[kc], o[2 * KC + kc] = v_col[kc];
    o[3 * KC] = k_row, o[3 * KC + 1] = qv_row;
}
extern "C" __global__ void offsets_d64(unsigned* out) { offsets<4>(out); }
extern "C" __global__ void offsets_d128(unsigned* out) { offsets<8>(out); }
"""


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
def test_ldmatrix_offsets_point_each_lane_at_its_row_and_chunk_of_the_swizzled_tile_on_the_emulator(d):
    """Row offset + column offset = swz<d>(row, chunk) of the row and 16-byte chunk the lane gives an ldmatrix.x4:
    K (B fragments, two n8 blocks): key (lane & 7) + 8 (lane / 16), chunk 2 kc + (lane / 8) % 2; Q (A fragments) and
    V (.trans): row lane & 15, chunk 2 kc + lane / 16; and a tile 8 n rows further adds 8 n rows (row & 7 kept)."""
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    kc_n = d // 16
    out = np.full((32, 3 * kc_n + 2), 0xFFFFFFFF, np.uint32)
    emulate.emulate(OFFSETS_KERNEL, f"offsets_d{d}", (1,), (32,), [out])

    def swz(row, chunk):                                   # kl/attention_mma.cuh's layout, written out
        return row * 2 * d + ((chunk ^ (row % 8)) << 4)

    for lane in range(32):
        k_col, q_col, v_col = out[lane, :kc_n], out[lane, kc_n:2 * kc_n], out[lane, 2 * kc_n:3 * kc_n]
        k_row, qv_row = out[lane, 3 * kc_n], out[lane, 3 * kc_n + 1]
        key, row = lane % 8 + 8 * (lane // 16), lane % 16
        for kc in range(kc_n):
            for n in (0, 1, 5):                            # n-block / m-tile / key-tile steps of 8 rows
                assert 8 * n * 2 * d + k_row + k_col[kc] == swz(8 * n + key, 2 * kc + (lane // 8) % 2), (lane, kc)
                assert 8 * n * 2 * d + qv_row + q_col[kc] == swz(8 * n + row, 2 * kc + lane // 16), (lane, kc)
                assert 8 * n * 2 * d + qv_row + v_col[kc] == swz(8 * n + row, 2 * kc + lane // 16), (lane, kc)


# S = Q K^T for 32 query rows (kMT = 2) against 32 keys (kNB = 4), head dim 64 (kKC = 4), one warp; Q fragments held
# in registers (QREGS) or re-read from the Q tile each chunk. Q: [32, 64], K: [32, 64] fp16; S: [32, 32] fp32.
SCORES_QK_KERNEL = r"""
#include <kl/attention_mma.cuh>
template <bool QREGS>
__device__ __forceinline__ void qk(const __half* Q, const __half* K, float* S) {
    __shared__ __align__(128) unsigned char q_s[32 * 128], k_s[32 * 128];   // swizzled [32, 64] tiles
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (int i = lane; i < 32 * 8; i += 32) {
        *reinterpret_cast<uint4*>(q_s + swz<64>(i / 8, i % 8)) = *reinterpret_cast<const uint4*>(Q + 8 * i);
        *reinterpret_cast<uint4*>(k_s + swz<64>(i / 8, i % 8)) = *reinterpret_cast<const uint4*>(K + 8 * i);
    }
    __syncwarp();
    const unsigned q_tile = (unsigned)__cvta_generic_to_shared(q_s), k_tile = (unsigned)__cvta_generic_to_shared(k_s);
    unsigned q_col[4], k_col[4], v_col[4], k_row, qv_row;
    ldmatrix_offsets(lane, k_col, q_col, v_col, k_row, qv_row);
    const unsigned k_base = k_tile + k_row;
    unsigned qf[2][QREGS ? 4 : 1][4];
    if (QREGS)
        for (int mt = 0; mt < 2; ++mt)
            for (int kc = 0; kc < 4; ++kc) ldmatrix_x4(qf[mt][QREGS ? kc : 0], q_tile + 16 * mt * 128 + qv_row + q_col[kc]);
    float s[2][4][4];
    scores_qk<__half, 2, 4, 4, QREGS>(s, qf, q_tile, 0, qv_row, q_col, k_base, k_col);
    for (int mt = 0; mt < 2; ++mt)
        for (int nb = 0; nb < 4; ++nb)
            for (int e = 0; e < 4; ++e) S[(16 * mt + g + 8 * (e >> 1)) * 32 + 8 * nb + 2 * t + (e & 1)] = s[mt][nb][e];
}
extern "C" __global__ void qk_regs(const __half* Q, const __half* K, float* S) { qk<true>(Q, K, S); }
extern "C" __global__ void qk_smem(const __half* Q, const __half* K, float* S) { qk<false>(Q, K, S); }
"""


@pytest.mark.slow
@pytest.mark.parametrize("q_in_regs", [True, False])
def test_scores_qk_is_q_times_k_transposed_on_the_emulator(q_in_regs):
    """Every score of two m16 row tiles against four n8 key blocks, Q held in registers or re-read per chunk."""
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    rng = np.random.default_rng(2)
    Q = rng.standard_normal((32, 64)).astype(np.float16)
    K = rng.standard_normal((32, 64)).astype(np.float16)
    S = np.full((32, 32), np.nan, np.float32)
    emulate.emulate(SCORES_QK_KERNEL, "qk_regs" if q_in_regs else "qk_smem", (1,), (32,), [Q, K, S])
    np.testing.assert_allclose(S, Q.astype(np.float64) @ K.astype(np.float64).T, rtol=1e-4, atol=1e-3)


def test_softmax_pv_is_ex2_shuffles_and_hmma_in_registers():
    """kl/attention_mma.cuh's tile: MUFU.EX2 for p and alpha, the quad's max through SHFL.BFLY, the warp's any-moved
    vote, P packed to 16 bits and fed to HMMA with V through LDSM.T; all in registers (no local memory). S = Q K^T:
    LDSM (no transpose) and HMMA, the accumulators in registers."""
    module = kernellab.compile_cuda(SOFTMAX_PV_KERNEL, arch="sm_90", first_line=2, filename="cell.cu")
    (k,) = module.kernels
    ops = opcodes(k)
    assert {"MUFU.EX2", "SHFL.BFLY", "LDSM.16.MT88.4", "HMMA.16816.F32", "F2FP.F16.F32.PACK_AB"} <= ops, sorted(ops)
    assert any(op.startswith("VOTE.ANY") for op in ops), sorted(ops)
    assert k.resources.local_bytes == 0 and not k.resources.spills, k.resources
    for k in kernellab.compile_cuda(SCORES_QK_KERNEL, arch="sm_90", first_line=2, filename="cell.cu").kernels:
        ops = opcodes(k)
        assert {"LDSM.16.M88.4", "HMMA.16816.F32"} <= ops and "LDSM.16.MT88.4" not in ops, (k.symbol, sorted(ops))
        assert k.resources.local_bytes == 0 and not k.resources.spills, (k.symbol, k.resources)


@pytest.mark.slow
def test_softmax_pv_over_two_tiles_is_softmax_times_v_on_the_emulator():
    """Against float64 softmax(S scale) V: a row masked in the first tile (m = -inf, then keys), a row masked in both
    (0), a row whose max jumps by far more than the rescale threshold in the second tile (O and l rescaled), a row
    whose max rises by less (no rescale: p up to 2^8) and random rows."""
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    rng = np.random.default_rng(1)
    S = rng.standard_normal((16, 32)).astype(np.float32) * 3
    S[0, :16] = -np.inf                                    # first tile all masked, second not
    S[1, :] = -np.inf                                      # no key at all
    S[2, 16:] += 200.0                                     # x scale_log2 = 36 in log2 units: rescale
    S[9, 16:] += 30.0                                      # 5.4 in log2 units: below the threshold of 8
    S[12, 5::3] = -np.inf                                  # scattered masked keys
    V = rng.standard_normal((32, 64)).astype(np.float16)
    O = np.full((16, 64), np.nan, np.float32)
    scale = 0.125
    emulate.emulate(SOFTMAX_PV_KERNEL, "k", (1,), (32,), [S, V, O, scale * np.log2(np.e)])
    s = S.astype(np.float64) * scale
    mx = np.max(s, axis=1, keepdims=True)
    p = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    den = p.sum(axis=1, keepdims=True)
    ref = np.where(den > 0, p @ V.astype(np.float64) / np.where(den > 0, den, 1.0), 0.0)
    assert np.all(O[1] == 0.0)
    np.testing.assert_allclose(O, ref, rtol=2e-3, atol=2e-3)   # P rounded to fp16


def test_editing_a_header_misses_the_compile_cache(tmp_cache, tmp_path, monkeypatch):
    include = tmp_path / "include"
    shutil.copytree(toolkit.KL_INCLUDE, include)
    dirs = tuple(str(include) if d == toolkit.KL_INCLUDE else d for d in toolkit.include_dirs())
    monkeypatch.setattr(toolkit, "KL_INCLUDE", str(include))             # what the cache key hashes
    monkeypatch.setattr(toolkit, "include_dirs", lambda: dirs)           # what NVRTC reads
    source = '#include <kl/ptx.cuh>\nextern "C" __global__ void k(float* y) { y[0] = exp_ftz(y[0]); }\n'
    first = kernellab.compile_cuda(source, arch="sm_90")
    assert first.cache_state == "miss"
    assert kernellab.compile_cuda(source, arch="sm_90").cache_state == "memory"
    header = include / "kl" / "ptx.cuh"
    header.write_text(header.read_text().replace("x * 1.4426950408889634f", "x * 2.0f"))
    edited = kernellab.compile_cuda(source, arch="sm_90")
    assert edited.cache_state == "miss"
    assert edited.cubin != first.cubin                      # and it is the edited header that was compiled


# --- the CPU runtime (kernellab/run/sim/cuda) compiles the headers: their #else branches call kl_emu:: ----------------

# One runtime (cuda_host.h's fibers, with hopper.h) and two ways in: compile_host (the `%%cuda --sim` path, with the
# checks: tutorials 03 to 05's headers) and emulate (a program of its own with a shared-memory arena: tutorials 05
# to 09, wgmma and TMA).
HOST_HEADERS_RUN = ("add_norm.cuh", "cluster.cuh", "convert.cuh", "cp_async.cuh", "mma.cuh", "pdl.cuh", "ptx.cuh",
                    "reduce.cuh", "rows.cuh", "tile.cuh")
PROGRAM_HEADERS = ("attention.cuh", "attention_mma.cuh", "convert.cuh", "cp_async.cuh", "mma.cuh", "pdl.cuh", "tile.cuh",
                   "tma.cuh", "wgmma.cuh")


def test_every_header_is_emulated_by_one_way_in_or_the_other():
    assert sorted(set(HOST_HEADERS_RUN) | set(PROGRAM_HEADERS)) == list(HEADERS)


@pytest.mark.slow
def test_compile_host_compiles_its_headers():
    pytest.importorskip("torch")
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    source = "".join(f"#include <kl/{h}>\n" for h in HOST_HEADERS_RUN) + r'''
extern "C" __global__ void k(const __nv_bfloat16* x, float* y) {
    float v = exp_ftz(to_float(x[threadIdx.x]));
    y[threadIdx.x] = block_sum(v) + block_max(v) + __uint_as_float(pack2<__half>(v, v)) * 0.0f;
}
'''
    mod = emulate.compile_host(source)
    import torch

    x = torch.arange(64, dtype=torch.float32).div(64).to(torch.bfloat16)
    y = torch.zeros(64)
    mod["k"][1, 64](x, y)
    e = torch.exp(x.float())
    torch.testing.assert_close(y, (e.sum() + e.max()).expand(64), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_emulate_compiles_its_headers():
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++)")
    source = ("".join(f"#include <kl/{h}>\n" for h in PROGRAM_HEADERS)
              + (pathlib.Path(__file__).parent / "fixtures" / "mma_16x8x16.cu").read_text())
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((8, 16)).astype(np.float16)
    C = np.full((16, 8), np.nan, np.float32)
    emulate.emulate(source, "k", (1,), (32,), [A, B, C])
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64).T, rtol=1e-4, atol=1e-3)
