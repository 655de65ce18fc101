// ptx_emu.h: runs a tutorial's CUDA C++ kernel on the CPU, one OS thread per CUDA thread, to test it without a GPU.
//
// What is emulated, and how faithfully (ptx_emu.py beside it prepares the source; see its docstring):
// - threadIdx/blockIdx/blockDim/gridDim; blocks run one after another, the threads of a block all at once; the CTAs
//   of a thread-block cluster run at once, each with its own shared memory: mapa, cluster barriers, mbarrier
//   arrivals on another CTA, and TMA multicast.
// - __syncthreads() is a barrier of the block's threads; __syncwarp() of the warp's. A thread that returns drops out.
// - Shared memory is one arena, filled with 0xFF bytes (NaN as float, bf16 and fp16) before every block, so a read of
//   an element nothing wrote shows up as NaN in the result. Shared addresses (__cvta_generic_to_shared) are offsets
//   into the arena, whose base is 4 KiB aligned: address bits, and so swizzles, are those a kernel computes on a GPU.
// - Warp collectives the tutorials use: ldmatrix (x1/x2/x4, .trans), mma.sync m16n8k16 (bf16, fp16 -> fp32), with the
//   fragment layouts of the PTX ISA. Each lane posts its operands, the warp meets, each lane computes its own outputs.
// - cp.async (16 and 4 bytes, src-size zero-fill): the copy is queued and lands at the latest moment the program allows (cp.async.wait_group), so a read
//   before the wait, or without the barrier after it, sees the poison.
// - TMA (cp.async.bulk.tensor.2d and .3d with a tensor map built by the test): lands at issue, out-of-bounds elements
//   zero, 128-byte swizzle; completes tx bytes on its mbarrier. mbarrier: init, arrive, expect_tx, try_wait.parity.
// - wgmma.mma_async m64nNk16 (bf16/fp16 -> fp32; A K-major from shared memory or from registers; B K-major, or
//   MN-major (the transpose bit) with the 128-byte swizzle, from shared memory; descriptors with no or 128-byte
//   swizzle): queued at issue and computed at wgmma.wait_group, reading shared memory then, so a stage released
//   before its wgmma finished is caught. The accumulator registers hold a poison NaN from issue to that wait (their
//   values kept aside), so reading them too early gives NaN and writing them is an error at the wait. A from
//   registers is read at issue (overwriting it while the wgmma is in flight is not caught).
// - __shfl_xor_sync and __any_sync over a whole warp; ex2.approx as exp2; atomicAdd and atomicExch on int, atomicAdd
//   on float, red.global.add.v2.f32 (red_add_v2) as two of those.
// - Named barriers (bar.sync / bar.arrive with an id 1-15 and a thread count): per CTA, counting threads; a barrier
//   still holding arrivals when the cluster's CTAs finish is an error (an unmatched bar.arrive).
// - TMA store (cp.async.bulk.tensor.2d.global.shared::cta.bulk_group): queued per thread at issue, bulk_group commit,
//   and performed (smem read, out-of-bounds elements skipped, 128-byte swizzle) at the wait_group(.read) that lets it
//   go; the box's bytes must be the same at issue and at that wait (else a race: a store issued before its box was
//   fully written, or the box rewritten too early); a thread may not exit with stores unwaited.
//   fence.proxy.async is a no-op here (the ordering it gives is not modelled).
// - WMMA 16x16x16: each lane's fragment holds the whole tile (the layout is opaque in CUDA, so any layout is legal).
// Not emulated: timing, occupancy, bank conflicts, the memory model beyond barriers, anything not listed above.
#pragma once
#include <array>
#include <barrier>
#include <cassert>
#include <deque>
#include <map>
#include <memory>
#include <type_traits>
#include "cuda_spellings.h"

// ---- CUDA C++ spellings (beyond cuda_spellings.h's) ---------------------------------------------------------------
#define __grid_constant__
#define __align__(n) alignas(n)
#define KL_EMULATOR 1   // kernellab's headers (<kl/mma.cuh>, ...) call kl_emu:: where the GPU runs inline PTX

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) int4 { int x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

template <class A, class B> inline auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) { return a < b ? b : a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16 and fp16 ------------------------------------------------------------------------------------------------
struct __nv_bfloat16 { uint16_t bits; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct __half { uint16_t bits; };
struct __half2 { __half x, y; };
using nv_bfloat16 = __nv_bfloat16;
using half = __half;

inline uint16_t emu_f32_to_bf16_bits(float f) {            // round to nearest even; NaN stays NaN
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return uint16_t(u >> 16);
}
inline float emu_bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
inline uint16_t emu_f32_to_f16_bits(float f) {             // round to nearest even, with subnormals and overflow to inf
    uint32_t u = __float_as_uint(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return uint16_t(sign | 0x7e00);
    if (a >= 0x477ff000) return uint16_t(sign | 0x7c00);     // rounds to >= 65520: inf
    if (a < 0x38800000) {                                    // below 2^-14: subnormal half
        float m = __uint_as_float(a) * 16777216.0f;          // * 2^24: the subnormal's integer mantissa
        return uint16_t(sign | uint32_t(std::nearbyint(m)));
    }
    uint32_t h = ((a >> 13) - (112u << 10));
    uint32_t rest = a & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return uint16_t(sign | h);
}
inline float emu_f16_bits_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) { float v = std::ldexp(float(m), -24); return sign ? -v : v; }
    if (e == 31) return __uint_as_float(sign | 0x7f800000 | (m << 13));
    return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {emu_f32_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf16_bits_to_f32(b.bits); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __half __float2half_rn(float f) { return {emu_f32_to_f16_bits(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return emu_f16_bits_to_f32(h.bits); }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline float emu_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float emu_to_float(__half v) { return __half2float(v); }
inline float emu_to_float(float v) { return v; }

// ---- the launch: indices, barriers, shared memory -----------------------------------------------------------------
namespace emu {
inline thread_local dim3 tl_threadIdx, tl_blockIdx;
inline dim3 g_blockDim, g_gridDim;
constexpr size_t kArenaBytes = 1u << 20;                     // 256 KiB dynamic + static shared arrays after it
constexpr size_t kDynamicBytes = 256u * 1024;
constexpr int kMaxCluster = 4;                               // CTAs of one cluster run at once, an arena each
alignas(4096) inline unsigned char arenas[kMaxCluster][kArenaBytes];
inline size_t static_used = kDynamicBytes;
inline std::mutex static_mutex;
// Shared addresses: an offset into the running CTA's arena; mapa's cluster addresses carry the CTA's rank + 1 in
// bits 24 and up, so `(rank + 1) << 24 | offset` names shared memory of any CTA of the cluster.
constexpr uint32_t kRankShift = 24;

struct Block {
    explicit Block(int threads)
        : bar(threads), warps((threads + 31) / 32), warpgroups((threads + 127) / 128) {
        for (int w = 0; w < (threads + 31) / 32; ++w) {
            int n = std::min(32, threads - 32 * w);
            warps[w] = std::make_unique<std::barrier<>>(n);
        }
        for (int g = 0; g < (threads + 127) / 128; ++g)
            warpgroups[g] = std::make_unique<std::barrier<>>(std::min(128, threads - 128 * g));
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::unique_ptr<std::barrier<>>> warpgroups;
    // per-warp scratch for collectives: 32 lanes x 16 words
    std::vector<std::array<uint64_t, 32 * 16>> scratch = std::vector<std::array<uint64_t, 32 * 16>>(64);
};
inline thread_local Block* tl_block = nullptr;
inline thread_local int tl_cta = 0;                          // this CTA's rank in its cluster
inline std::barrier<>* g_cluster_bar = nullptr;
inline unsigned char* cur_arena() { return arenas[tl_cta]; }

inline int linear_tid() {
    return int(tl_threadIdx.x + g_blockDim.x * (tl_threadIdx.y + g_blockDim.y * tl_threadIdx.z));
}
inline int lane_id() { return linear_tid() % 32; }
inline int warp_id() { return linear_tid() / 32; }
inline void syncthreads() { tl_block->bar.arrive_and_wait(); }
inline void syncwarp() { tl_block->warps[warp_id()]->arrive_and_wait(); }
inline void sync_warpgroup() { tl_block->warpgroups[warp_id() / 4]->arrive_and_wait(); }
inline uint64_t* warp_scratch() { return tl_block->scratch[warp_id()].data(); }

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "emu: %s (block %u,%u thread %u,%u)\n", what, tl_blockIdx.x, tl_blockIdx.y,
                 tl_threadIdx.x, tl_threadIdx.y);
    std::fflush(stderr);
    std::_Exit(3);
}

inline uint32_t smem_addr(const void* p) {
    auto d = reinterpret_cast<const unsigned char*>(p) - cur_arena();
    if (d < 0 || size_t(d) >= kArenaBytes) fail("a shared-memory address outside this CTA's shared memory");
    return uint32_t(d);
}
// The dynamic part starts 16 bytes into the arena, as it may on a GPU after static shared memory: a kernel that needs
// more alignment must round its base up itself (and ask for the slack in shared_bytes).
constexpr uint32_t kDynamicOffset = 16;
inline size_t g_dynamic_bytes = 0;
inline int g_cluster_size = 1;
inline int rank_of(uint32_t a) { return (a >> kRankShift) ? int(a >> kRankShift) - 1 : tl_cta; }
inline uint32_t offset_of(uint32_t a) { return a & ((1u << kRankShift) - 1); }
inline unsigned char* smem_ptr(uint32_t a) {
    int rank = rank_of(a);
    uint32_t off = offset_of(a);
    if (rank >= g_cluster_size) fail("a cluster shared address of a CTA outside the cluster");
    if (off >= kArenaBytes) fail("a shared address past the end of shared memory");
    if (off < kDynamicBytes && off >= kDynamicOffset + g_dynamic_bytes)
        fail("a dynamic shared-memory access past the launch's shared_bytes");
    return arenas[rank] + off;
}
inline void* dynamic_smem() { return cur_arena() + kDynamicOffset; }

template <class T, size_t Align, int Site>
T* shared_alloc() {                                          // one slot per declaration site (template instance)
    static size_t offset = [] {
        std::lock_guard<std::mutex> lock(static_mutex);
        size_t off = (static_used + Align - 1) / Align * Align;
        static_used = off + sizeof(T);
        if (static_used > kArenaBytes) fail("static shared memory exceeds the emulator's arena");
        return off;
    }();
    return reinterpret_cast<T*>(cur_arena() + offset);
}

void run_pending_cp_async(int keep);                          // defined below
void run_pending_wgmma(int keep);
void check_no_pending();
void reset_named_barriers(int ctas);
void check_named_barriers(int ctas);

// Clusters run one after another; the CTAs of one cluster run at once (their threads together).
inline void launch(dim3 grid, dim3 block, size_t dynamic_bytes, dim3 cluster,
                   const std::function<void()>& body) {
    if (dynamic_bytes + kDynamicOffset > kDynamicBytes) { std::fprintf(stderr, "emu: dynamic smem too large\n"); std::_Exit(3); }
    int csize = int(cluster.x * cluster.y * cluster.z);
    if (csize > kMaxCluster || grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z) {
        std::fprintf(stderr, "emu: bad cluster shape\n");
        std::_Exit(3);
    }
    g_blockDim = block;
    g_gridDim = grid;
    g_dynamic_bytes = dynamic_bytes;
    g_cluster_size = csize;
    int threads = int(block.x * block.y * block.z);
    for (unsigned cz = 0; cz < grid.z; cz += cluster.z)
        for (unsigned cy = 0; cy < grid.y; cy += cluster.y)
            for (unsigned cx = 0; cx < grid.x; cx += cluster.x) {
                std::vector<std::unique_ptr<Block>> blocks;
                for (int r = 0; r < csize; ++r) {
                    std::memset(arenas[r], 0xff, kArenaBytes);
                    blocks.push_back(std::make_unique<Block>(threads));
                }
                reset_named_barriers(csize);
                std::barrier<> cluster_bar(csize * threads);
                g_cluster_bar = &cluster_bar;
                std::vector<std::thread> ts;
                ts.reserve(csize * threads);
                for (int r = 0; r < csize; ++r)
                    for (int t = 0; t < threads; ++t)
                        ts.emplace_back([&, r, t] {
                            // rank r: x fastest within the cluster, as %cluster_ctarank counts
                            unsigned rx = r % cluster.x, ry = (r / cluster.x) % cluster.y, rz = r / (cluster.x * cluster.y);
                            tl_cta = r;
                            tl_block = blocks[r].get();
                            tl_blockIdx = dim3(cx + rx, cy + ry, cz + rz);
                            tl_threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
                            body();
                            check_no_pending();
                            tl_block->bar.arrive_and_drop();
                            tl_block->warps[t / 32]->arrive_and_drop();
                            tl_block->warpgroups[t / 128]->arrive_and_drop();
                            g_cluster_bar->arrive_and_drop();
                        });
                for (auto& th : ts) th.join();
                check_named_barriers(csize);
                g_cluster_bar = nullptr;
            }
}
}  // namespace emu

#define threadIdx emu::tl_threadIdx
#define blockIdx emu::tl_blockIdx
#define blockDim emu::g_blockDim
#define gridDim emu::g_gridDim
#define __syncthreads() emu::syncthreads()
#define __syncwarp(...) emu::syncwarp()
inline size_t __cvta_generic_to_shared(const void* p) { return emu::smem_addr(p); }

// ---- cp.async: queued per thread, landing at cp.async.wait_group --------------------------------------------------
namespace emu {
struct CpAsync { uint32_t dst; const void* src; int bytes, src_bytes; };
inline thread_local std::deque<std::vector<CpAsync>> tl_cp_groups;   // committed groups, oldest first
inline thread_local std::vector<CpAsync> tl_cp_open;                  // issued, not yet committed
inline void run_pending_cp_async(int keep) {
    while (int(tl_cp_groups.size()) > keep) {
        for (auto& c : tl_cp_groups.front()) {
            unsigned char* d = smem_ptr(c.dst);
            std::memcpy(d, c.src, c.src_bytes);
            std::memset(d + c.src_bytes, 0, c.bytes - c.src_bytes);
        }
        tl_cp_groups.pop_front();
    }
}
}  // namespace emu
// The PTX helpers kernellab's headers provide (kernellab/include/kl: cp_async.cuh, mma.cuh) are kl_emu's, which their
// #else branches call; a kernel's own helper of such a name is cut out and replaced by `using kl_emu::name;`.
namespace kl_emu {
inline void cp_async_16(uint32_t dst, const void* src, int src_bytes = 16) {
    if (dst % 16) emu::fail("cp.async destination not 16-byte aligned");
    if (src_bytes && reinterpret_cast<uintptr_t>(src) % 16) emu::fail("cp.async source not 16-byte aligned");
    emu::tl_cp_open.push_back({dst, src, 16, src_bytes});
}
inline void cp_async_4(uint32_t dst, const void* src, int src_bytes = 4) {   // cp.async.ca ... 4 (A transposed)
    if (dst % 4) emu::fail("cp.async destination not 4-byte aligned");
    if (src_bytes && reinterpret_cast<uintptr_t>(src) % 4) emu::fail("cp.async source not 4-byte aligned");
    if (src_bytes < 0 || src_bytes > 4) emu::fail("cp.async src-size outside 0..4 for a 4-byte copy");
    emu::tl_cp_open.push_back({dst, src, 4, src_bytes});
}
inline void cp_async_commit() { emu::tl_cp_groups.push_back(std::move(emu::tl_cp_open)); emu::tl_cp_open.clear(); }
template <int N> inline void cp_async_wait() { emu::run_pending_cp_async(N); }
inline void cp_async_wait_all() { emu::tl_cp_groups.push_back(std::move(emu::tl_cp_open)); emu::tl_cp_open.clear();
                                  emu::run_pending_cp_async(0); }
}  // namespace kl_emu

// ---- ldmatrix and mma.sync (warp collectives) ---------------------------------------------------------------------
namespace emu {
// matrix i's row r address comes from lane 8 i + r; lane l gets row l / 4, 16-bit columns 2 (l % 4), +1 (packed,
// the lower column in the low half). With .trans, the 8x8 matrix is transposed first.
template <int NMAT>
inline void ldmatrix(uint32_t* out, uint32_t addr, bool trans) {
    uint64_t* s = warp_scratch();
    int lane = lane_id();
    s[lane] = addr;
    syncwarp();
    for (int i = 0; i < NMAT; ++i) {
        uint16_t v[2];
        for (int e = 0; e < 2; ++e) {
            int r = lane / 4, c = 2 * (lane % 4) + e;                 // element (r, c) of the (transposed) matrix
            int src_row = trans ? c : r, src_col = trans ? r : c;
            uint32_t row_addr = uint32_t(s[8 * i + src_row]);
            if (row_addr % 16) fail("ldmatrix row address not 16-byte aligned");
            std::memcpy(&v[e], smem_ptr(row_addr + 2 * src_col), 2);
        }
        out[i] = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
    }
    syncwarp();
}

template <class T>
inline float elem(uint32_t packed, int half) { return emu_to_float(T{uint16_t(half ? packed >> 16 : packed & 0xffff)}); }

// D (16x8, f32) += A (16x16, row) * B (16x8, col). Lane l: group g = l / 4, t = l % 4.
// A regs: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..). B regs: b0 (k 2t.., n g), b1 (k 2t + 8.., n g).
// C regs: c0, c1 (g, 2t, 2t + 1), c2, c3 (g + 8, 2t, 2t + 1).
template <class T>
inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    uint64_t* s = warp_scratch();
    int lane = lane_id();
    for (int i = 0; i < 4; ++i) s[32 + lane * 6 + i] = a[i];
    for (int i = 0; i < 2; ++i) s[32 + lane * 6 + 4 + i] = b[i];
    syncwarp();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, t = l % 4;
        const uint64_t* f = s + 32 + l * 6;
        for (int e = 0; e < 2; ++e) {
            A[g][2 * t + e] = elem<T>(uint32_t(f[0]), e);
            A[g + 8][2 * t + e] = elem<T>(uint32_t(f[1]), e);
            A[g][2 * t + 8 + e] = elem<T>(uint32_t(f[2]), e);
            A[g + 8][2 * t + 8 + e] = elem<T>(uint32_t(f[3]), e);
            B[2 * t + e][g] = elem<T>(uint32_t(f[4]), e);
            B[2 * t + 8 + e][g] = elem<T>(uint32_t(f[5]), e);
        }
    }
    syncwarp();
    int g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; ++q) {
        int r = g + (q >= 2 ? 8 : 0), c = 2 * t + (q & 1);
        double acc = d[q];
        for (int k = 0; k < 16; ++k) acc += double(A[r][k]) * double(B[k][c]);
        d[q] = float(acc);
    }
}
}  // namespace emu
namespace kl_emu {
inline void ldmatrix_x1(uint32_t (&r)[1], uint32_t addr) { emu::ldmatrix<1>(r, addr, false); }
inline void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) { emu::ldmatrix<2>(r, addr, false); }
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix<4>(r, addr, false); }
inline void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) { emu::ldmatrix<2>(r, addr, true); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix<4>(r, addr, true); }
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __nv_bfloat16) {
    emu::mma_16816<__nv_bfloat16>(d, a, b);
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __half) {
    emu::mma_16816<__half>(d, a, b);
}
template <class T> inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t b[2] = {b0, b1};                  // <kl/mma.cuh>'s mma_16816<T>(d, a, b0, b1)
    emu::mma_16816<T>(d, a, b);
}
}  // namespace kl_emu

// ---- mbarrier -----------------------------------------------------------------------------------------------------
namespace emu {
struct MBarrier {
    std::mutex m;
    std::condition_variable cv;
    int expected = 0, pending = 0;
    long tx = 0;
    unsigned phase = 0;
    void complete_if_done() {                                   // with m held
        if (pending == 0 && tx == 0) {
            ++phase;
            pending = expected;
            cv.notify_all();
        }
    }
};
inline std::mutex g_mbar_mutex;
inline std::map<uint32_t, std::unique_ptr<MBarrier>> g_mbars;
inline MBarrier& mbar(uint32_t addr, bool create = false) {
    std::lock_guard<std::mutex> lock(g_mbar_mutex);
    if (addr % 8) fail("mbarrier not 8-byte aligned");
    addr = (uint32_t(rank_of(addr) + 1) << kRankShift) | offset_of(addr);     // one key per CTA and offset
    auto it = g_mbars.find(addr);
    if (it == g_mbars.end()) {
        if (!create) fail("mbarrier used before mbarrier.init");
        it = g_mbars.emplace(addr, std::make_unique<MBarrier>()).first;
    }
    return *it->second;
}
}  // namespace emu
inline void mbarrier_init(uint32_t addr, int count) {  // (or re-init)
    auto& b = emu::mbar(addr, true);
    std::lock_guard<std::mutex> lock(b.m);
    b.expected = b.pending = count;
    b.tx = 0;
    b.phase = 0;
}
inline bool emu_trace() { static bool on = std::getenv("EMU_TRACE") != nullptr; return on; }
inline void mbarrier_arrive(uint32_t addr) {
    if (emu_trace()) std::fprintf(stderr, "t%u arrive %u\n", threadIdx.x, addr);
    auto& b = emu::mbar(addr);
    std::lock_guard<std::mutex> lock(b.m);
    if (b.pending <= 0) emu::fail("mbarrier: more arrivals than its count");
    --b.pending;
    b.complete_if_done();
}
inline void mbarrier_arrive_expect_tx(uint32_t addr, int bytes) {
    if (emu_trace()) std::fprintf(stderr, "t%u arrive_expect_tx %u %d\n", threadIdx.x, addr, bytes);
    auto& b = emu::mbar(addr);
    std::lock_guard<std::mutex> lock(b.m);
    b.tx += bytes;
    if (b.pending <= 0) emu::fail("mbarrier: more arrivals than its count");
    --b.pending;
    b.complete_if_done();
}
inline void mbarrier_expect_tx(uint32_t addr, int bytes) {
    auto& b = emu::mbar(addr);
    std::lock_guard<std::mutex> lock(b.m);
    b.tx += bytes;
}
// Waits until the phase of this parity has completed: the current phase's parity differs from `parity`.
inline void mbarrier_wait(uint32_t addr, int parity) {
    if (emu_trace()) std::fprintf(stderr, "t%u wait %u parity %d\n", threadIdx.x, addr, parity);
    auto& b = emu::mbar(addr);
    std::unique_lock<std::mutex> lock(b.m);
    if (!b.cv.wait_for(lock, std::chrono::seconds(60), [&] { return int(b.phase & 1) != parity; })) {
        char what[200];
        std::snprintf(what, sizeof what, "mbarrier wait (shared address %u, parity %d) did not complete within 60 s: "
                      "phase %u, %d arrivals and %ld tx bytes pending (a wrong parity, count or byte count?)",
                      addr, parity, b.phase, b.pending, b.tx);
        emu::fail(what);
    }
}
inline void emu_mbarrier_complete_tx(uint32_t addr, int bytes) {
    auto& b = emu::mbar(addr);
    std::lock_guard<std::mutex> lock(b.m);
    b.tx -= bytes;
    b.complete_if_done();
}
inline void fence_barrier_init() {}
inline void fence_proxy_async() {}

// ---- TMA: the test builds the tensor map; the kernel only passes it on --------------------------------------------
struct alignas(64) CUtensorMap {
    // emulator's own encoding (a real CUtensorMap is opaque): base, 2 dims (inner first), row stride, box, swizzle
    unsigned long long opaque[16];
};
namespace emu {
struct TensorMap2D {              // (and 3-D: dim2 = box2 = 1 for a 2-D map)
    const unsigned char* base;
    uint64_t dim0, dim1;          // elements: inner (contiguous) and outer
    uint64_t stride1_bytes;       // bytes between consecutive outer indices
    uint32_t box0, box1;          // box in elements
    uint32_t elem_bytes;
    uint32_t swizzle_bytes;       // 0 (none) or 128
    uint64_t dim2, stride2_bytes; // the outermost dimension (3-D maps)
    uint32_t box2;
};
static_assert(sizeof(TensorMap2D) <= sizeof(CUtensorMap), "tensor map encoding too large");
inline CUtensorMap make_tensor_map(const void* base, uint64_t dim0, uint64_t dim1, uint64_t stride1_bytes,
                                   uint32_t box0, uint32_t box1, uint32_t elem_bytes, uint32_t swizzle_bytes,
                                   uint64_t dim2 = 1, uint64_t stride2_bytes = 0, uint32_t box2 = 1) {
    CUtensorMap m{};
    TensorMap2D t{static_cast<const unsigned char*>(base), dim0, dim1, stride1_bytes, box0, box1, elem_bytes,
                  swizzle_bytes, dim2, stride2_bytes, box2};
    std::memcpy(&m, &t, sizeof t);
    return m;
}
// Byte offset of (row, byte-in-row) in a tile whose rows are `row_bytes` long, with the 128-byte swizzle: the 16-byte
// chunk index (address bits 4-6) is XORed with the 128-byte row index within 1024 bytes (address bits 7-9).
inline uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }
}  // namespace emu
inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t mbar_addr) {
    emu::TensorMap2D t;
    std::memcpy(&t, map, sizeof t);
    uint32_t row_bytes = t.box0 * t.elem_bytes;
    if (emu::offset_of(dst) % 128) emu::fail("TMA destination not 128-byte aligned");
    if (t.swizzle_bytes == 128 && (row_bytes != 128 || emu::offset_of(dst) % 1024)) emu::fail("128B swizzle needs 128-byte rows, 1 KiB alignment");
    for (uint32_t z = 0; z < t.box2; ++z)
        for (uint32_t r = 0; r < t.box1; ++r)
            for (uint32_t e = 0; e < t.box0; ++e) {
                uint64_t i0 = uint64_t(int64_t(c0) + e), i1 = uint64_t(int64_t(c1) + r), i2 = uint64_t(int64_t(c2) + z);
                uint32_t a = dst + (z * t.box1 + r) * row_bytes + e * t.elem_bytes;
                if (t.swizzle_bytes == 128) a = emu::swizzle128(a);
                unsigned char* d = emu::smem_ptr(a);
                if (int64_t(c0) + e < 0 || int64_t(c1) + r < 0 || int64_t(c2) + z < 0 || i0 >= t.dim0 ||
                    i1 >= t.dim1 || i2 >= t.dim2)
                    std::memset(d, 0, t.elem_bytes);
                else
                    std::memcpy(d, t.base + i2 * t.stride2_bytes + i1 * t.stride1_bytes + i0 * t.elem_bytes,
                                t.elem_bytes);
            }
    emu_mbarrier_complete_tx(mbar_addr, int(t.box0 * t.box1 * t.box2 * t.elem_bytes));
}
inline void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t mbar_addr) {
    tma_load_3d(dst, map, c0, c1, 0, mbar_addr);
}

// Tutorial 07's spellings of the same operations (step 3).
inline void mbar_init(uint32_t bar, int count) { mbarrier_init(bar, count); }
inline void mbar_expect_tx(uint32_t bar, uint32_t bytes) { mbarrier_arrive_expect_tx(bar, int(bytes)); }   // arrives
inline void mbar_arrive(uint32_t bar) { mbarrier_arrive(bar); }
inline void mbar_wait(uint32_t bar, uint32_t phase) { mbarrier_wait(bar, int(phase)); }
inline void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2) {
    tma_load_3d(dst, static_cast<const CUtensorMap*>(tmap), c0, c1, c2, bar);
}

// ---- warp shuffles and votes (the whole warp takes part; the mask is not checked) ---------------------------------
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t* s = emu::warp_scratch();
    int lane = emu::lane_id();
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    emu::syncwarp();
    s[16 * lane] = bits;
    emu::syncwarp();
    bits = s[16 * (lane ^ lane_mask)];
    emu::syncwarp();
    std::memcpy(&v, &bits, sizeof v);
    return v;
}
inline int __any_sync(unsigned, int pred) {
    uint64_t* s = emu::warp_scratch();
    int lane = emu::lane_id();
    emu::syncwarp();
    s[16 * lane] = pred != 0;
    emu::syncwarp();
    int any = 0;
    for (int l = 0; l < 32; ++l) any |= int(s[16 * l]);
    emu::syncwarp();
    return any;
}
inline float exp2_approx(float x) { return std::exp2(x); }
// Global-memory atomics on int (blocks run one after another here, the threads of one at once).
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicExch(int* p, int v) { return std::atomic_ref<int>(*p).exchange(v); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }   // dQ sums
inline void red_add_v2(float* p, float a, float b) { atomicAdd(p, a); atomicAdd(p + 1, b); }   // red.global.add.v2.f32
#ifndef CUDART_INF_F
#define CUDART_INF_F HUGE_VALF
#endif

// ---- clusters ------------------------------------------------------------------------------------------------------
inline unsigned cluster_ctarank() { return unsigned(emu::tl_cta); }
inline void cluster_sync() { emu::g_cluster_bar->arrive_and_wait(); }
inline unsigned mapa_shared(unsigned smem_addr, unsigned cta) {
    return ((cta + 1) << emu::kRankShift) | emu::offset_of(smem_addr);
}
inline void mbarrier_arrive_cluster(unsigned cluster_bar) { mbarrier_arrive(cluster_bar); }
inline void tma_load_2d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar,
                                  unsigned short mask) {
    for (int r = 0; r < emu::g_cluster_size; ++r)
        if (mask & (1u << r)) tma_load_2d(mapa_shared(dst, r), map, c0, c1, mapa_shared(bar, r));
}

// ---- named barriers: bar.sync / bar.arrive with an id and a thread count ----------------------------------------
namespace emu {
struct NamedBarrier {
    std::mutex m;
    std::condition_variable cv;
    int expected = 0, arrived = 0;
    unsigned generation = 0;
};
inline NamedBarrier g_named[kMaxCluster][16];
inline void reset_named_barriers(int ctas) {
    for (int r = 0; r < ctas; ++r)
        for (auto& b : g_named[r]) { b.expected = b.arrived = 0; b.generation = 0; }
}
inline void check_named_barriers(int ctas) {
    for (int r = 0; r < ctas; ++r)
        for (int id = 0; id < 16; ++id)
            if (g_named[r][id].arrived) {
                std::fprintf(stderr, "emu: named barrier %d of CTA %d still holds %d of %d arrivals when the block "
                             "ends (a bar.arrive nobody waits for)\n", id, r, g_named[r][id].arrived,
                             g_named[r][id].expected);
                std::_Exit(3);
            }
}
inline void named_barrier(int id, int threads, bool wait) {
    if (id < 1 || id > 15) fail("named barrier id outside 1-15 (0 is __syncthreads)");
    if (threads <= 0 || threads % 32) fail("named barrier thread count not a positive multiple of 32");
    NamedBarrier& b = g_named[tl_cta][id];
    std::unique_lock<std::mutex> lock(b.m);
    if (b.arrived == 0) b.expected = threads;
    else if (b.expected != threads) fail("named barrier used with two different thread counts at once");
    unsigned gen = b.generation;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.generation;
        b.cv.notify_all();
        return;
    }
    if (wait && !b.cv.wait_for(lock, std::chrono::seconds(60), [&] { return b.generation != gen; }))
        fail("named barrier (bar.sync) did not complete within 60 s: too few threads arrive");
}
}  // namespace emu
inline void named_bar_sync(int id, int threads) { emu::named_barrier(id, threads, true); }
inline void named_bar_arrive(int id, int threads) { emu::named_barrier(id, threads, false); }

// ---- TMA store: queued per thread, performed at the bulk wait_group that lets it go -------------------------------
namespace emu {
struct TmaStore { TensorMap2D map; uint32_t src; int c0, c1; std::vector<unsigned char> seen; };
inline thread_local std::deque<std::vector<TmaStore>> tl_store_groups;   // committed bulk groups, oldest first
inline thread_local std::vector<TmaStore> tl_store_open;
// The box's bytes in smem as the store reads them (swizzled addresses, row by row).
inline std::vector<unsigned char> store_source(const TensorMap2D& t, uint32_t src) {
    uint32_t row_bytes = t.box0 * t.elem_bytes;
    std::vector<unsigned char> out(size_t(t.box1) * row_bytes);
    for (uint32_t r = 0; r < t.box1; ++r)
        for (uint32_t e = 0; e < row_bytes; e += t.elem_bytes) {
            uint32_t a = src + r * row_bytes + e;
            if (t.swizzle_bytes == 128) a = swizzle128(a);
            std::memcpy(&out[size_t(r) * row_bytes + e], smem_ptr(a), t.elem_bytes);
        }
    return out;
}
inline void run_tma_store(const TmaStore& s) {
    const TensorMap2D& t = s.map;
    uint32_t row_bytes = t.box0 * t.elem_bytes;
    // The hardware reads the box at some moment between the issue and the wait: the bytes must be the same at both
    // ends, or the result depends on timing (a store issued before the box was written, or the box rewritten before
    // the wait_group.read that frees it).
    if (store_source(t, s.src) != s.seen)
        fail("a TMA store's smem source changed between the store's issue and its wait_group.read (a race)");
    for (uint32_t r = 0; r < t.box1; ++r)
        for (uint32_t e = 0; e < t.box0; ++e) {
            int64_t i0 = int64_t(s.c0) + e, i1 = int64_t(s.c1) + r;
            if (i0 < 0 || i1 < 0 || uint64_t(i0) >= t.dim0 || uint64_t(i1) >= t.dim1) continue;   // clipped
            uint32_t a = s.src + r * row_bytes + e * t.elem_bytes;
            if (t.swizzle_bytes == 128) a = swizzle128(a);
            unsigned char* out = const_cast<unsigned char*>(t.base) + uint64_t(i1) * t.stride1_bytes;
            std::memcpy(out + uint64_t(i0) * t.elem_bytes, smem_ptr(a), t.elem_bytes);
        }
}
inline void run_pending_stores(int keep) {
    while (int(tl_store_groups.size()) > keep) {
        for (auto& s : tl_store_groups.front()) run_tma_store(s);
        tl_store_groups.pop_front();
    }
}
}  // namespace emu
inline void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    emu::TensorMap2D t;
    std::memcpy(&t, map, sizeof t);
    if (emu::offset_of(src) % 128) emu::fail("TMA store source not 128-byte aligned");
    if (t.swizzle_bytes == 128 && (t.box0 * t.elem_bytes != 128 || emu::offset_of(src) % 1024))
        emu::fail("128B swizzle needs 128-byte rows, 1 KiB alignment");
    if (emu::rank_of(src) != emu::tl_cta) emu::fail("TMA store source outside this CTA's shared memory");
    emu::tl_store_open.push_back({t, src, c0, c1, emu::store_source(t, src)});
}
inline void tma_store_commit() {
    emu::tl_store_groups.push_back(std::move(emu::tl_store_open));
    emu::tl_store_open.clear();
}
template <int N> inline void tma_store_wait_read() { emu::run_pending_stores(N); }
template <int N> inline void tma_store_wait() { emu::run_pending_stores(N); }

// ---- wgmma: queued at issue, computed at wgmma.wait_group ---------------------------------------------------------
namespace emu {
// The accumulators of wgmmas in flight: their values live in `shadow` until the last of them retires, and the
// registers hold a poison NaN meanwhile, so a read before wgmma.wait_group sees NaN and a write is caught at the wait.
struct InFlight { std::vector<float> shadow; int pending = 0; };
constexpr uint32_t kAccPoison = 0x7fa5a5a5u;
inline thread_local std::map<float*, std::shared_ptr<InFlight>> tl_in_flight;
struct Wgmma {
    float* d; int n; uint64_t da, db; bool accumulate; bool bf16;
    std::shared_ptr<InFlight> acc = nullptr;
    bool a_regs = false;          // A from registers: this thread's two rows (g, g + 8), read at issue
    bool b_mn_major = false;      // B MN-major (the transpose bit): N contiguous
    uint16_t a_rows[2][16] = {};
};
inline thread_local std::deque<std::vector<Wgmma>> tl_wg_groups;
inline thread_local std::vector<Wgmma> tl_wg_open;
inline thread_local bool tl_wg_fenced = false;

// Address of element (row, k) of a K-major operand described by `desc` (16-bit elements).
inline uint32_t desc_addr(uint64_t desc, int row, int k) {
    uint32_t start = uint32_t(desc & 0x3fff) << 4;
    uint32_t lbo = uint32_t((desc >> 16) & 0x3fff) << 4;
    uint32_t sbo = uint32_t((desc >> 32) & 0x3fff) << 4;
    uint32_t base_offset = uint32_t((desc >> 49) & 7);
    uint32_t mode = uint32_t(desc >> 62);
    if (base_offset) fail("wgmma descriptor: base offset other than 0 is not emulated");
    if (mode == 1) {                                          // 128-byte swizzle: 8 rows of 128 bytes per SBO step
        uint32_t a = start + (row / 8) * sbo + (row % 8) * 128 + k * 2;
        return swizzle128(a);
    }
    if (mode == 0) {                                          // no swizzle: core matrices of 8 rows x 16 bytes
        // core matrix (row / 8, k / 8): rows 16 bytes apart; K-direction neighbours LBO apart, M/N ones SBO apart
        return start + (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2;
    }
    fail("wgmma descriptor: only no swizzle and 128-byte swizzle are emulated");
}
// Address of element (n, k) of an MN-major operand (N contiguous) with the 128-byte swizzle: 64 N-elements (128 bytes)
// per K row, 8 K rows per 1,024-byte atom; the next 8 K rows SBO further, the next 64 N-elements LBO further.
inline uint32_t desc_addr_mn(uint64_t desc, int n, int k) {
    uint32_t start = uint32_t(desc & 0x3fff) << 4;
    uint32_t lbo = uint32_t((desc >> 16) & 0x3fff) << 4;
    uint32_t sbo = uint32_t((desc >> 32) & 0x3fff) << 4;
    if ((desc >> 49) & 7) fail("wgmma descriptor: base offset other than 0 is not emulated");
    if (uint32_t(desc >> 62) != 1) fail("wgmma descriptor: an MN-major operand is emulated with the 128-byte swizzle only");
    return swizzle128(start + (n / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (n % 64) * 2);
}
inline void run_wgmma(const Wgmma& w) {
    int t = linear_tid() % 128, warp = t / 32, lane = t % 32;
    for (int j = 0; j < w.n / 8; ++j)
        for (int q = 0; q < 4; ++q) {
            int row = 16 * warp + lane / 4 + (q >= 2 ? 8 : 0), col = 8 * j + 2 * (lane % 4) + (q & 1);
            double acc = w.accumulate ? w.acc->shadow[4 * j + q] : 0.0;
            for (int k = 0; k < 16; ++k) {
                uint16_t a, b;
                if (w.a_regs) a = w.a_rows[q >= 2][k];
                else std::memcpy(&a, smem_ptr(desc_addr(w.da, row, k)), 2);
                std::memcpy(&b, smem_ptr(w.b_mn_major ? desc_addr_mn(w.db, col, k) : desc_addr(w.db, col, k)), 2);
                float fa = w.bf16 ? emu_bf16_bits_to_f32(a) : emu_f16_bits_to_f32(a);
                float fb = w.bf16 ? emu_bf16_bits_to_f32(b) : emu_f16_bits_to_f32(b);
                acc += double(fa) * double(fb);
            }
            w.acc->shadow[4 * j + q] = float(acc);
        }
    if (--w.acc->pending == 0) {                              // the last wgmma on these registers: they get its values
        for (int i = 0; i < w.n / 2; ++i)
            if (__float_as_uint(w.d[i]) != kAccPoison)
                fail("wgmma accumulator registers written while the wgmma was in flight (before its wait_group)");
        std::memcpy(w.d, w.acc->shadow.data(), sizeof(float) * (w.n / 2));
        tl_in_flight.erase(w.d);
    }
}
// At issue: the accumulators go into flight (their values to the shadow, the registers poisoned), or stay there.
inline std::shared_ptr<InFlight> take_accumulators(float* d, int n) {
    auto& a = tl_in_flight[d];
    if (!a) {
        a = std::make_shared<InFlight>();
        a->shadow.assign(d, d + n / 2);
        for (int i = 0; i < n / 2; ++i) d[i] = __uint_as_float(kAccPoison);
    } else if (int(a->shadow.size()) != n / 2) {
        fail("a wgmma in flight on part of another's accumulators");
    }
    ++a->pending;
    return a;
}
inline void run_pending_wgmma(int keep) {
    while (int(tl_wg_groups.size()) > keep) {
        for (auto& w : tl_wg_groups.front()) run_wgmma(w);
        tl_wg_groups.pop_front();
    }
}
inline void check_no_pending() {
    if (!tl_cp_open.empty() || !tl_cp_groups.empty()) fail("thread exited with cp.async copies never waited for");
    if (!tl_wg_open.empty() || !tl_wg_groups.empty()) fail("thread exited with wgmma never waited for");
    if (!tl_store_open.empty() || !tl_store_groups.empty())
        fail("thread exited with TMA stores never waited for (cp.async.bulk.wait_group)");
}
template <class T>
inline void wgmma_issue(float* d, int n, uint64_t da, uint64_t db, int scale_d) {  // queued
    syncwarp();
    if (!tl_wg_fenced) fail("wgmma issued without wgmma.fence first");
    tl_wg_open.push_back({d, n, da, db, scale_d != 0, std::is_same<T, __nv_bfloat16>::value, take_accumulators(d, n)});
}
// A from registers (mma.sync's A fragment per warp: a[0] row g cols 2t.., a[1] row g + 8, a[2] row g cols 2t + 8..,
// a[3] row g + 8 cols 2t + 8..), B MN-major from shared memory. The warp's fragments are gathered at issue.
template <class T>
inline void wgmma_issue_rs(float* d, int n, const uint32_t (&a)[4], uint64_t db) {
    syncwarp();
    if (!tl_wg_fenced) fail("wgmma issued without wgmma.fence first");
    uint64_t* s = warp_scratch();
    int lane = lane_id(), g = lane / 4;
    for (int r = 0; r < 4; ++r) s[16 * lane + r] = a[r];
    syncwarp();
    Wgmma w{d, n, 0, db, true, std::is_same<T, __nv_bfloat16>::value};
    w.a_regs = true;
    w.b_mn_major = true;
    for (int src = 4 * g; src < 4 * g + 4; ++src) {
        int tt = src % 4;
        for (int half = 0; half < 2; ++half) {           // rows g (regs 0, 2) and g + 8 (regs 1, 3)
            uint32_t lo = uint32_t(s[16 * src + half]), hi = uint32_t(s[16 * src + 2 + half]);
            w.a_rows[half][2 * tt] = uint16_t(lo & 0xffff);
            w.a_rows[half][2 * tt + 1] = uint16_t(lo >> 16);
            w.a_rows[half][8 + 2 * tt] = uint16_t(hi & 0xffff);
            w.a_rows[half][8 + 2 * tt + 1] = uint16_t(hi >> 16);
        }
    }
    syncwarp();
    w.acc = take_accumulators(d, n);
    tl_wg_open.push_back(w);
}
}  // namespace emu
namespace kl_emu {              // <kl/wgmma.cuh>'s functions (see cp_async above)
// The wgmma instructions are .sync.aligned: every lane of the warp meets there (lanes cannot drift apart across one).
inline void wgmma_fence() { emu::syncwarp(); emu::tl_wg_fenced = true; }
inline void wgmma_commit() {
    emu::syncwarp();
    emu::tl_wg_groups.push_back(std::move(emu::tl_wg_open));
    emu::tl_wg_open.clear();
    emu::tl_wg_fenced = false;
}
template <int N> inline void wgmma_wait() { emu::syncwarp(); emu::run_pending_wgmma(N); emu::syncwarp(); }
inline void wgmma_256(float (&d)[128], uint64_t da, uint64_t db, __nv_bfloat16) { emu::wgmma_issue<__nv_bfloat16>(d, 256, da, db, 1); }
inline void wgmma_256(float (&d)[128], uint64_t da, uint64_t db, __half) { emu::wgmma_issue<__half>(d, 256, da, db, 1); }
inline void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, __nv_bfloat16) { emu::wgmma_issue<__nv_bfloat16>(d, 128, da, db, 1); }
inline void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, __half) { emu::wgmma_issue<__half>(d, 128, da, db, 1); }
// Tutorial 07's spellings (step 3): wgmma_ss<N, T> (both K-major from shared memory, scale_d = 0 starts from zero) and
// wgmma_rs_tb<N, T> (A from registers, B MN-major).
template <int N, typename T>
inline void wgmma_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b, int scale_d) {
    emu::wgmma_issue<T>(d, N, a, b, scale_d);
}
template <int N, typename T>
inline void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], unsigned long long b) {
    emu::wgmma_issue_rs<T>(d, N, a, b);
}
template <int N> inline void fence_acc(float (&)[N]) {}
}  // namespace kl_emu
template <int R> inline void setmaxnreg_inc() {}
template <int R> inline void setmaxnreg_dec() {}

// ---- WMMA: each lane holds the whole 16x16 tile -------------------------------------------------------------------
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int num_elements = 256;
    float x[256];   // element (r, c) of the tile at x[16 r + c], as floats
};
template <class Use, class T, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            bool is_row = std::is_same<L, wmma::row_major>::value;
            f.x[16 * r + c] = emu_to_float(is_row ? p[r * ldm + c] : p[c * ldm + r]);
        }
    emu::syncwarp();
}
template <class T>
inline void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, float v) { for (auto& e : f.x) e = v; }
template <class TA, class LA, class TB, class LB, class TC>
inline void mma_sync(fragment<accumulator, 16, 16, 16, TC>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, TC>& c) {
    float out[256];
    for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 16; ++n) {
            double acc = c.x[16 * r + n];
            for (int k = 0; k < 16; ++k) acc += double(a.x[16 * r + k]) * double(b.x[16 * k + n]);
            out[16 * r + n] = float(acc);
        }
    std::memcpy(d.x, out, sizeof out);
}
template <class T>
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm, layout_t layout) {
    emu::syncwarp();
    if (emu::lane_id() == 0)
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[16 * r + c];
    emu::syncwarp();
}
}  // namespace wmma
}  // namespace nvcuda
