// Run CUDA C++ kernels on the CPU, for tests on machines without a GPU: every CUDA thread is a fiber (ucontext), a
// block's fibers run on one OS thread and switch at barriers (__syncthreads, __syncwarp, warp shuffles), and the
// blocks of a cluster run on their own OS threads so that cluster barriers and distributed shared memory work.
// `__shared__` becomes `static thread_local`: one copy per block. What this is not: a model of timing, of the memory
// model between blocks (atomics are plain read-modify-writes under one lock), or of undefined behaviour. It catches
// wrong indexing, missing guards, barrier mismatches (a deadlock is reported, not hung), shuffles that read a lane
// that has exited, and arithmetic mistakes; tutorial 05's warp-level PTX (cp.async, ldmatrix, mma.sync) runs here
// too, with the checks (see the section before checks.h), and Hopper's (wgmma, TMA, mbarriers, named barriers:
// hopper.h). The one CPU runtime of CUDA C++ in kernellab; emulate.py beside it builds kernels against it.
#pragma once
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <ucontext.h>
#include "cuda_spellings.h"

#define __restrict__ __restrict
#define __cluster_dims__(...)
#define __shared__ static thread_local
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define KL_DYNAMIC_SHARED_BYTES (227 * 1024)   // extern __shared__ arrays become arrays of this many bytes
#define KL_EMULATOR 1   // kernellab's headers (<kl/ptx.cuh>, ...) call kl_emu:: where the GPU runs inline PTX

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) int2 { int x, y; };
struct float3 { float x, y, z; };
struct alignas(16) double2 { double x, y; };
// math_constants.h
#define CUDART_INF_F std::numeric_limits<float>::infinity()
#define CUDART_NAN_F std::numeric_limits<float>::quiet_NaN()
#define CUDART_INF std::numeric_limits<double>::infinity()
#define CUDART_NAN std::numeric_limits<double>::quiet_NaN()
#define CUDART_PI_F 3.141592654f
#define CUDART_PI 3.1415926535897931e+0
#define CUDART_L2E_F 1.442695041f
#define CUDART_LN2_F 0.693147181f
#define CUDART_MAX_NORMAL_F 3.40282347e+38f
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

// ---- bf16 and fp16 as their bits, with round-to-nearest-even conversions --------------------------------------
struct __nv_bfloat16 { unsigned short bits; };
struct __half { unsigned short bits; };
typedef __nv_bfloat16 nv_bfloat16;
typedef __half half;
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = uint32_t(h.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return {0x7FC0};
    u += 0x7FFF + ((u >> 16) & 1);
    return {static_cast<unsigned short>(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __half2float(__half h) {
    uint32_t s = (h.bits >> 15) & 1, e = (h.bits >> 10) & 0x1F, m = h.bits & 0x3FF;
    float v;
    if (e == 0) v = std::ldexp(float(m), -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp(float(m | 0x400), int(e) - 25);
    return s ? -v : v;
}
inline __half __float2half_rn(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    uint16_t sign = (u >> 16) & 0x8000;
    if (std::isnan(f)) return {static_cast<unsigned short>(0x7E00)};
    float a = std::fabs(f);
    if (a >= 65520.0f) return {static_cast<unsigned short>(sign | 0x7C00)};
    if (a < std::ldexp(1.0f, -14)) {                           // subnormal: multiples of 2^-24
        float q = std::nearbyint(a * 16777216.0f);                // ties to even in the default rounding mode
        return {static_cast<unsigned short>(sign | uint16_t(q))};
    }
    int e; float m = std::frexp(a, &e);                           // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(std::ldexp(m, 11));                  // 11 significant bits
    if (q >= 2048.0f) { q /= 2; e += 1; }
    uint16_t bits = uint16_t(((e + 14) << 10) | (uint16_t(q) & 0x3FF));
    return {static_cast<unsigned short>(sign | bits)};
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
// Pairs of 16-bit values in one 32-bit word (x the low half), and the packed max of two pairs (HMNMX2: a NaN
// loses to a number, as fmaxf).
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
struct alignas(4) __half2 { __half x, y; };
inline float kl_max_nan_loses(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b); }
inline __nv_bfloat162 __hmax2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return {__float2bfloat16_rn(kl_max_nan_loses(__bfloat162float(a.x), __bfloat162float(b.x))),
            __float2bfloat16_rn(kl_max_nan_loses(__bfloat162float(a.y), __bfloat162float(b.y)))};
}
inline __half2 __hmax2(__half2 a, __half2 b) {
    return {__float2half_rn(kl_max_nan_loses(__half2float(a.x), __half2float(b.x))),
            __float2half_rn(kl_max_nan_loses(__half2float(a.y), __half2float(b.y)))};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }

using std::max;
using std::min;

// ---- math intrinsics -----------------------------------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
using std::isnan;
using std::isinf;
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmul_rn(float a, float b) { return a * b; }      // a product the device never fuses into an FMA
inline float __fadd_rn(float a, float b) { return a + b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return std::min(1.0f, std::max(0.0f, x)); }
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
inline void __threadfence() {}
inline size_t __cvta_generic_to_shared(const void* p);      // a shared-memory offset (below, with the scheduler)
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { std::fprintf(stderr, "emu: __trap()\n"); std::abort(); }

namespace kl {

std::mutex& atomic_lock();

// ---- fibers --------------------------------------------------------------------------------------------------
enum class Wait { none, block, warp, cluster, poll, named, done };   // poll: an mbarrier wait; named: bar.sync id

struct AsyncState;
struct CpCopy { uint32_t dst; const void* src; int bytes, src_bytes; };    // one cp.async, queued

struct Fiber {
    ucontext_t ctx;
    void* stack = nullptr;
    dim3 tid;
    int linear = 0;          // threadIdx as one number
    Wait wait = Wait::none;
    int arrived_phase = 0;   // cluster barrier phases this thread has arrived at
    int waiting_phase = 0;   // the phase it waits for
    int barrier_line = 0;    // the line of the __syncthreads() it waits at
    int exit_line = 0;       // the line of the `return` it left at (0: the end of the kernel)
    bool syncwarp = false;   // it waits at a __syncwarp() (not a shuffle)
    std::deque<std::vector<CpCopy>> cp_groups;   // committed cp.async groups, oldest first
    std::vector<CpCopy> cp_open;                 // issued, not yet committed
    int named_id = 0;                            // the named barrier it waits at (Wait::named)
    std::shared_ptr<AsyncState> async;          // its wgmmas and TMA stores in flight (hopper.h), made at first use
};

struct PendingRead { int line, tid; long long index; const char* name; int size; bool cancelled; };

struct Cluster;

struct Block {
    dim3 bid, bdim, gdim;
    std::vector<Fiber> fibers;
    ucontext_t sched;
    Fiber* cur = nullptr;
    std::function<void()> body;
    std::vector<unsigned long long> shfl;   // one exchange slot per thread
    std::vector<uint64_t> scratch;          // warp collectives (ldmatrix, mma.sync): 8 words per thread
    Cluster* cluster = nullptr;
    int rank = 0;
    char* tls_anchor = nullptr;
    std::string error;
    // the checks (checks.h)
    unsigned serial = 0;                     // distinct for every block of every launch
    int epoch = 0;                           // __syncthreads() released so far
    std::vector<int> warp_gen;               // per warp: __syncwarp()s released so far
    unsigned flush = 0;                      // times `pending` was emptied
    std::vector<PendingRead> pending;        // uninitialised shared reads, final at the next barrier
    size_t dyn_bytes = 0;                    // dynamic shared memory of the launch
    bool out_of_bounds = false;              // an access out of bounds happened (reported; the launch fails)
    // named barriers (bar.sync / bar.arrive id, count: hopper.h), per block
    struct Named { int expected = 0, arrived = 0; };
    Named named[16];
    unsigned char* arena = nullptr;          // KL_SHARED_ARENA: this block's shared memory (emulate.py's programs)
    unsigned long long polled_at = ~0ull;    // mbarrier changes seen when the pollers last found nothing to do
};

struct Cluster {
    int size = 1;
    std::vector<Block*> blocks;
    std::mutex m;
    std::condition_variable cv;
    std::vector<int> arrivals;               // per phase: threads arrived, over the whole cluster
    int threads = 0;                         // live threads in the cluster
    bool failed = false;
};

inline thread_local Block* g_block = nullptr;
inline thread_local char tls_anchor_byte = 0;
inline std::atomic<unsigned long long> g_mbar_changes{0};   // every mbarrier arrival and completed copy, all blocks
inline void check_async_done();                             // hopper.h: a thread exits with nothing in flight
#ifdef KL_SHARED_ARENA
// One shared-memory arena per OS thread (a block's, or a cluster block's): the dynamic part 16 bytes in, the static
// __shared__ arrays from 256 KiB on (emulate.py's programs place them there). Shared addresses are offsets into it,
// small as on a GPU: a wgmma descriptor's 18 address bits hold those of the dynamic part (where the tutorials' wgmma
// operands live). Filled with 0xFF bytes (NaN in float, bf16 and fp16) before every block, so a read of an element
// nothing wrote shows up as NaN.
constexpr size_t kArenaBytes = 1u << 20, kDynamicBytes = 256u * 1024, kDynamicOffset = 16;
inline thread_local unsigned char arena_raw[kArenaBytes + 4096];
inline unsigned char* thread_arena() {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(arena_raw) + 4095) & ~uintptr_t(4095));
}
#endif

inline Fiber& self() { return *g_block->cur; }
inline void yield(Wait w) {
    Fiber& f = self();
    f.wait = w;
    swapcontext(&f.ctx, &g_block->sched);
}

[[noreturn]] inline void fail(const std::string& why) {
    throw std::runtime_error(why);
}

}  // namespace kl

#define threadIdx (::kl::self().tid)
#define blockIdx (::kl::g_block->bid)
#define blockDim (::kl::g_block->bdim)
#define gridDim (::kl::g_block->gdim)

inline void __syncthreads(int line = __builtin_LINE()) { kl::self().barrier_line = line; kl::yield(kl::Wait::block); }
inline void __syncwarp(unsigned = 0xffffffffu) { kl::self().syncwarp = true; kl::yield(kl::Wait::warp); }
namespace kl {
inline void exit_at(int line) { self().exit_line = line; }     // a kernel's `return;` (host.py adds it)
void block_barrier_released(Block& b);
void flush_pending(Block& b);
}

namespace kl {
template <typename T> inline T shuffle(T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    Fiber& f = self();
    int warp0 = f.linear & ~31;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    g_block->shfl[f.linear] = bits;
    f.syncwarp = false;
    yield(Wait::warp);                       // every lane has written its value
    int src = warp0 + (src_lane & 31);
    if (src >= int(g_block->fibers.size()) || g_block->fibers[src].wait == Wait::done)
        fail("a warp shuffle read lane " + std::to_string(src_lane & 31) + ", which has exited or does not exist");
    unsigned long long got = g_block->shfl[src];
    yield(Wait::warp);                       // every lane has read before anyone writes again
    T out;
    std::memcpy(&out, &got, sizeof(T));
    return out;
}
}  // namespace kl

template <typename T> inline T __shfl_sync(unsigned, T v, int lane, int width = 32) {
    int me = kl::self().linear & 31;
    return kl::shuffle(v, (me & ~(width - 1)) + (lane & (width - 1)));
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    int me = kl::self().linear & 31;
    int src = me ^ mask;
    if ((src & ~(width - 1)) != (me & ~(width - 1))) src = me;
    return kl::shuffle(v, src);
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    int me = kl::self().linear & 31;
    int src = me + int(d);
    if ((src & ~(width - 1)) != (me & ~(width - 1))) src = me;
    return kl::shuffle(v, src);
}

template <typename T> inline T atomicAdd(T* p, T v) {   // float, int, unsigned: one lock for all atomics
    std::lock_guard<std::mutex> g(kl::atomic_lock());
    T o = *p;
    *p = o + v;
    return o;
}
inline unsigned atomicInc(unsigned* p, unsigned lim) {
    std::lock_guard<std::mutex> g(kl::atomic_lock()); unsigned o = *p; *p = o >= lim ? 0 : o + 1; return o;
}
#define KL_ATOMIC(fn, update)                                                                               \
    template <typename T> inline T fn(T* p, T v) {                                                          \
        std::lock_guard<std::mutex> g(kl::atomic_lock()); T o = *p; *p = (update); return o; }
KL_ATOMIC(atomicSub, o - v) KL_ATOMIC(atomicExch, v) KL_ATOMIC(atomicMax, o < v ? v : o)
KL_ATOMIC(atomicMin, v < o ? v : o) KL_ATOMIC(atomicAnd, o & v) KL_ATOMIC(atomicOr, o | v) KL_ATOMIC(atomicXor, o ^ v)
#undef KL_ATOMIC
template <typename T> inline T atomicCAS(T* p, T cmp, T v) {
    std::lock_guard<std::mutex> g(kl::atomic_lock()); T o = *p; if (o == cmp) *p = v; return o;
}

// ---- clusters: what the kernels' own PTX helpers do ---------------------------------------------------------
namespace kl {
inline unsigned cluster_rank() { return unsigned(g_block->rank); }
inline unsigned cluster_size() { return unsigned(g_block->cluster ? g_block->cluster->size : 1); }
inline void arrive() {
    Fiber& f = self();
    Cluster* c = g_block->cluster;
    int phase = f.arrived_phase++;
    if (!c) return;
    std::lock_guard<std::mutex> g(c->m);
    if (int(c->arrivals.size()) <= phase) c->arrivals.resize(phase + 1, 0);
    if (++c->arrivals[phase] == c->threads) c->cv.notify_all();
}
inline void wait_cluster() {
    Fiber& f = self();
    f.waiting_phase = f.arrived_phase - 1;
    if (f.waiting_phase < 0) fail("barrier.cluster.wait without an arrive");
    if (!g_block->cluster) return;
    yield(Wait::cluster);
}
// The address `p` (this block's shared memory) has in the block of cluster rank `rank`.
template <typename T> inline T* map_rank(T* p, unsigned rank) {
    Cluster* c = g_block->cluster;
    if (!c) { if (rank != 0) fail("mapa to another rank outside a cluster"); return p; }
    if (rank >= unsigned(c->size))
        fail("mapa to rank " + std::to_string(rank) + " of a cluster of " + std::to_string(c->size));
    char* mine = g_block->tls_anchor;
    char* theirs = c->blocks[rank]->tls_anchor;
    return reinterpret_cast<T*>(reinterpret_cast<char*>(p) - mine + theirs);
}
}  // namespace kl

// ---- the scheduler ---------------------------------------------------------------------------------------------
namespace kl {

#ifdef KL_SHARED_ARENA
constexpr size_t kStack = 256 * 1024;   // (tensor-core kernels' accumulators; the pages are touched on use)
#else
constexpr size_t kStack = 64 * 1024;
#endif

inline void fiber_entry(unsigned lo, unsigned hi) {
    Block* b = reinterpret_cast<Block*>((uintptr_t(hi) << 32) | uintptr_t(lo));
    try {
        b->body();
        if (!b->cur->cp_open.empty() || !b->cur->cp_groups.empty())
            fail("a thread exited with cp.async copies it never waited for (cp.async.wait_group)");
        check_async_done();
    } catch (const std::exception& e) {
        if (b->error.empty()) b->error = e.what();
    }
    b->cur->wait = Wait::done;
    if (b->cluster) {   // an exited thread no longer counts in cluster barriers
        std::lock_guard<std::mutex> g(b->cluster->m);
        b->cluster->threads--;
        b->cluster->cv.notify_all();
    }
    swapcontext(&b->cur->ctx, &b->sched);
}

// Run one block to completion on this OS thread.
inline void run_block(Block& b) {
    g_block = &b;
    b.tls_anchor = &tls_anchor_byte;
#ifdef KL_SHARED_ARENA
    b.arena = thread_arena();
    if (!b.cluster) std::memset(b.arena, 0xff, kArenaBytes);   // (a cluster's blocks: before any of them starts)
    if (b.dyn_bytes + kDynamicOffset > kDynamicBytes) {
        b.error = "dynamic shared memory of " + std::to_string(b.dyn_bytes) + " bytes: more than the emulator's " +
                  std::to_string(kDynamicBytes - kDynamicOffset);
        g_block = nullptr;
        return;
    }
#endif
    int n = int(b.bdim.x * b.bdim.y * b.bdim.z);
    b.fibers.assign(n, Fiber{});
    b.shfl.assign(n, 0);
    b.scratch.assign(size_t(n) * 8, 0);
    static std::atomic<unsigned> serials{0};
    b.serial = ++serials;
    b.warp_gen.assign((n + 31) / 32, 0);
    for (int i = 0; i < n; ++i) {
        Fiber& f = b.fibers[i];
        f.linear = i;
        f.tid = dim3{unsigned(i % b.bdim.x), unsigned((i / b.bdim.x) % b.bdim.y), unsigned(i / (b.bdim.x * b.bdim.y))};
        f.stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        uintptr_t p = reinterpret_cast<uintptr_t>(&b);
        makecontext(&f.ctx, reinterpret_cast<void (*)()>(fiber_entry), 2, unsigned(p & 0xffffffffu), unsigned(p >> 32));
    }
    auto describe = [&]() {
        std::string s;
        int counts[7] = {0, 0, 0, 0, 0, 0, 0};
        for (auto& f : b.fibers) counts[int(f.wait)]++;
        s += "running " + std::to_string(counts[0]) + ", at __syncthreads " + std::to_string(counts[1]) +
             ", at a warp barrier/shuffle " + std::to_string(counts[2]) + ", at a cluster barrier " +
             std::to_string(counts[3]) + ", at an mbarrier wait " + std::to_string(counts[4]) +
             ", at a named barrier " + std::to_string(counts[5]) + ", exited " + std::to_string(counts[6]);
        return s;
    };
    while (true) {
        // Run every runnable fiber until it waits or exits.
        bool ran = false;
        for (auto& f : b.fibers) {
            if (f.wait != Wait::none) continue;
            b.cur = &f;
            swapcontext(&b.sched, &f.ctx);
            ran = true;
            if (!b.error.empty()) goto done;
        }
        if (ran) continue;
        {
            int live = 0, at_block = 0, at_cluster = 0, at_poll = 0;
            for (auto& f : b.fibers) {
                if (f.wait == Wait::done) continue;
                live++;
                at_block += f.wait == Wait::block;
                at_cluster += f.wait == Wait::cluster;
                at_poll += f.wait == Wait::poll;
            }
            if (live == 0) break;
            bool released = false;
            // Warps whose live lanes all wait at a warp barrier go on.
            for (int w0 = 0; w0 < n; w0 += 32) {
                int lanes = 0, waiting = 0;
                for (int i = w0; i < std::min(n, w0 + 32); ++i) {
                    if (b.fibers[i].wait == Wait::done) continue;
                    lanes++;
                    waiting += b.fibers[i].wait == Wait::warp;
                }
                if (lanes && waiting == lanes) {
                    bool all_syncwarp = true;
                    for (int i = w0; i < std::min(n, w0 + 32); ++i)
                        if (b.fibers[i].wait == Wait::warp) all_syncwarp = all_syncwarp && b.fibers[i].syncwarp;
                    if (all_syncwarp) b.warp_gen[w0 / 32]++;       // a __syncwarp() orders shared memory
                    for (int i = w0; i < std::min(n, w0 + 32); ++i)
                        if (b.fibers[i].wait == Wait::warp) { b.fibers[i].wait = Wait::none; b.fibers[i].syncwarp = false; }
                    released = true;
                }
            }
            if (released) continue;
            if (at_block == live) {
                block_barrier_released(b);
                for (auto& f : b.fibers) if (f.wait == Wait::block) f.wait = Wait::none;
                continue;
            }
            if (at_cluster == live && b.cluster) {
                Cluster* c = b.cluster;
                std::unique_lock<std::mutex> g(c->m);
                for (auto& f : b.fibers) {
                    if (f.wait != Wait::cluster) continue;
                    int ph = f.waiting_phase;
                    c->cv.wait(g, [&] {
                        return c->failed || (int(c->arrivals.size()) > ph && c->arrivals[ph] >= c->threads);
                    });
                    if (c->failed) { b.error = "another block of the cluster failed"; goto done; }
                    f.wait = Wait::none;
                }
                continue;
            }
            if (at_poll) {                       // mbarrier waits: let the cluster's other blocks run, then look again
                unsigned long long changes = g_mbar_changes.load();
                if (!b.cluster && changes == b.polled_at) {
                    // every waiter looked and nothing changed since: only this block could complete their phases
                    b.error = "deadlock: mbarrier waits that nothing can complete (" + describe() +
                              "): a wrong parity, arrival count or byte count?";
                    goto done;
                }
                b.polled_at = changes;
                if (b.cluster) std::this_thread::yield();
                for (auto& f : b.fibers) if (f.wait == Wait::poll) f.wait = Wait::none;
                continue;
            }
            b.error = "deadlock: no thread can go on (" + describe() + "); a barrier is not reached by every thread";
            goto done;
        }
    }
    for (int id = 0; id < 16; ++id)
        if (b.named[id].arrived) {
            b.error = "named barrier " + std::to_string(id) + " of the block still holds " +
                      std::to_string(b.named[id].arrived) + " of " + std::to_string(b.named[id].expected) +
                      " arrivals when the block ends (a bar.arrive nobody waits for)";
            break;
        }
done:
    flush_pending(b);
    if (!b.error.empty() && std::getenv("KERNELLAB_EMU_DEBUG"))
        std::fprintf(stderr, "emu: block %u: %s\n", b.bid.x, b.error.c_str());
    for (auto& f : b.fibers) munmap(f.stack, kStack);
    b.fibers.clear();
    g_block = nullptr;
}

// Launch: blocks in order; the blocks of one cluster (consecutive blockIdx.x) together, each on an OS thread.
inline std::string launch(dim3 grid, dim3 block, int cluster_size, const std::function<void()>& body,
                          size_t dyn_bytes = 0) {
    if (cluster_size < 1 || grid.x % cluster_size) return "grid.x must be a multiple of the cluster size";
    bool oob = false;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x0 = 0; x0 < grid.x; x0 += cluster_size) {
                if (cluster_size == 1) {
                    Block b;
                    b.bid = dim3{x0, y, z}; b.bdim = block; b.gdim = grid; b.body = body; b.dyn_bytes = dyn_bytes;
                    run_block(b);
                    if (!b.error.empty()) return "block (" + std::to_string(x0) + ", " + std::to_string(y) + ", " +
                                                 std::to_string(z) + "): " + b.error;
                    if (b.out_of_bounds) oob = true;
                    continue;
                }
                Cluster c;
                c.size = cluster_size;
                c.threads = cluster_size * int(block.x * block.y * block.z);
                std::vector<Block> blocks(cluster_size);
                std::vector<std::atomic<bool>> ready(cluster_size);
                for (auto& r : ready) r = false;
                for (int r = 0; r < cluster_size; ++r) {
                    Block& b = blocks[r];
                    b.bid = dim3{x0 + unsigned(r), y, z}; b.bdim = block; b.gdim = grid; b.body = body; b.dyn_bytes = dyn_bytes;
                    b.cluster = &c; b.rank = r;
                    c.blocks.push_back(&b);
                }
                // Each block's thread publishes its TLS anchor before any fiber runs (mapa needs them all).
                std::vector<std::thread> threads;
                std::mutex start_m; std::condition_variable start_cv; int published = 0;
                for (int r = 0; r < cluster_size; ++r) {
                    threads.emplace_back([&, r] {
                        blocks[r].tls_anchor = &tls_anchor_byte;
#ifdef KL_SHARED_ARENA
                        blocks[r].arena = thread_arena();
                        std::memset(blocks[r].arena, 0xff, kArenaBytes);
#endif
                        {
                            std::unique_lock<std::mutex> g(start_m);
                            published++;
                            start_cv.notify_all();
                            start_cv.wait(g, [&] { return published == cluster_size; });
                        }
                        run_block(blocks[r]);
                        if (!blocks[r].error.empty()) {
                            std::lock_guard<std::mutex> g(c.m);
                            c.failed = true;
                            c.cv.notify_all();
                        }
                    });
                }
                for (auto& t : threads) t.join();
                for (auto& b : blocks) if (b.out_of_bounds) oob = true;
                for (int r = 0; r < cluster_size; ++r)
                    if (!blocks[r].error.empty())
                        return "cluster block " + std::to_string(x0 + r) + ": " + blocks[r].error;
            }
    return oob ? "out of bounds (see the findings)" : "";
}

inline std::mutex& atomic_lock() { static std::mutex m; return m; }

}  // namespace kl

// What inline PTX does on the GPU: kernellab's headers (kernellab/include/kl) call these in their #else branches,
// and a kernel's own helper of the same name is cut out of the source and replaced by `using kl_emu::name;`.
namespace kl_emu {
inline unsigned cluster_ctarank() { return kl::cluster_rank(); }
inline unsigned cluster_nctarank() { return kl::cluster_size(); }
inline void cluster_arrive() { kl::arrive(); }
inline void cluster_wait() { kl::wait_cluster(); }
inline void cluster_sync() { kl::arrive(); kl::wait_cluster(); }
template <typename T> inline T* cluster_map(T* p, unsigned rank) { return kl::map_rank(p, rank); }
inline void cluster_arrive_relaxed() { kl::arrive(); }

// The statistic exchange of tutorials 03/04 (st.async into another block's shared memory, counted in bytes on its
// mbarrier). The mbarrier's 8 bytes hold, here: the bytes still expected (int32), the arrivals still expected
// (16 bits), the arrival count (15 bits) and the phase (top bit); every access under one lock, across blocks.
}  // namespace kl_emu

namespace kl {
struct MbarState { int32_t tx; uint16_t pending; uint16_t count_phase; };
static_assert(sizeof(MbarState) == 8, "an mbarrier is 8 bytes");
inline MbarState mbar_load(const unsigned long long* bar) { MbarState m; std::memcpy(&m, bar, 8); return m; }
inline void mbar_store(unsigned long long* bar, MbarState m) { std::memcpy(bar, &m, 8); }
inline double wait_limit_s() {                 // how long an mbarrier wait may poll before it is reported
    const char* v = std::getenv("KERNELLAB_EMU_WAIT_S");
    return v ? std::atof(v) : 60.0;
}
inline void mbar_settle(unsigned long long* bar, MbarState m) {   // complete the phase when nothing is expected
    ++g_mbar_changes;
    if (m.pending == 0 && m.tx == 0) {
        m.count_phase ^= 0x8000;
        m.pending = m.count_phase & 0x7fff;
    }
    mbar_store(bar, m);
}
}  // namespace kl
namespace kl_emu {
inline void exchange_init(unsigned long long* bar, unsigned bytes) {
    if (reinterpret_cast<uintptr_t>(bar) % 8) kl::fail("mbarrier not 8-byte aligned");
    std::lock_guard<std::mutex> g(kl::atomic_lock());
    kl::mbar_store(bar, kl::MbarState{int32_t(bytes), 0, 1});      // init(1), then this thread's arrive.expect_tx
    kl::mbar_settle(bar, kl::mbar_load(bar));
}
template <typename S> inline void exchange_push(S* slot, S v, unsigned long long* bar, unsigned rank) {
    S* dst = kl::map_rank(slot, rank);
    unsigned long long* m = kl::map_rank(bar, rank);
    std::lock_guard<std::mutex> g(kl::atomic_lock());
    std::memcpy(dst, &v, sizeof(S));
    kl::MbarState st = kl::mbar_load(m);
    st.tx -= int32_t(sizeof(S));
    if (st.tx < 0 && st.pending == 0) kl::fail("st.async: more bytes than the mbarrier expects");
    kl::mbar_settle(m, st);
}
inline void exchange_arm(unsigned long long* bar, unsigned bytes) {   // arrive.expect_tx: the next phase's bytes
    std::lock_guard<std::mutex> g(kl::atomic_lock());
    kl::MbarState m = kl::mbar_load(bar);
    if (m.pending == 0) kl::fail("mbarrier.arrive.expect_tx with no arrival pending");
    m.pending -= 1;
    m.tx += int32_t(bytes);
    kl::mbar_settle(bar, m);
}
inline void exchange_wait(unsigned long long* bar, unsigned parity) {
    auto t0 = std::chrono::steady_clock::now();
    while (true) {
        {
            std::lock_guard<std::mutex> g(kl::atomic_lock());
            if (((kl::mbar_load(bar).count_phase >> 15) & 1u) != (parity & 1u)) {       // that phase completed
                ++kl::g_mbar_changes;
                return;
            }
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(kl::wait_limit_s()))
            kl::fail("mbarrier wait did not complete within " + std::to_string(int(kl::wait_limit_s())) +
                     " s: the bytes it expects were never pushed (KERNELLAB_EMU_WAIT_S sets the limit)");
        kl::yield(kl::Wait::poll);
    }
}
// exp with results under 2^-126 flushed to zero (ex2.approx.ftz.f32 on the GPU, inline PTX in the cells).
inline float exp_ftz(float x) {
    float y = std::exp(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
// prefetch.global.L1 of a thread's w and b packs (tutorial 04): a hint, nothing to emulate
template <typename T, int VPT> inline void prefetch_l1(const T*, const T*, int, int) {}
inline void prefetch_l1(const void*) {}          // <kl/ptx.cuh>'s prefetch.global.L1 of one line: a hint
inline void prefetch_l2(const void*) {}          // <kl/pdl.cuh>'s prefetch.global.L2 of one line: a hint
// Programmatic dependent launch (sm_90; <kl/pdl.cuh>'s griddepcontrol_wait and griddepcontrol_launch_dependents, or
// a source's own one-statement `asm volatile("griddepcontrol.wait;" ::: "memory");`): no-ops here. Launches on the
// CPU run one after the other, so when a kernel starts every kernel before it on the stream has finished and its
// writes are in memory: griddepcontrol.wait has nothing to wait for, and there is no dependent launch for
// griddepcontrol.launch_dependents to let start early. (The emulator therefore cannot find a read placed before the
// wait that the previous kernel writes: that is the GPU test's job, and the kernel's comments'.)
inline void griddepcontrol_wait() {}
inline void griddepcontrol_launch_dependents() {}
}  // namespace kl_emu
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline int __ffs(int x) { return __builtin_ffs(x); }           // 1 + the lowest set bit; 0 for 0
// The SM's cycle counter: here the host's steady clock in nanoseconds (a spin on it runs, without yielding its fiber)
inline long long clock64() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// ---- shared-memory addresses, and the warp-level PTX of tutorial 05 (ldmatrix, mma.sync, cp.async) -------------
// A shared address (__cvta_generic_to_shared) is the offset of the element from a 1 MiB-aligned point of the block's
// thread-local storage, where its __shared__ arrays live: the low address bits, and so alignment and swizzles, are
// the element's own. ldmatrix and mma.sync are warp collectives: each lane posts its operands, the warp meets at the
// scheduler's warp barrier, and every lane of a whole warp must be there (an exited lane is an error, not a garbage
// fragment). cp.async is queued per thread and lands at the cp.async.wait_group that lets it go, so a read before the
// wait, or without the barrier after it, sees what was there before. The fragment layouts are the PTX ISA's (the same
// layouts hopper.h's wgmma reads).
namespace kl {
#ifndef KL_SHARED_ARENA
inline char* smem_base() {
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(g_block->tls_anchor) & ~uintptr_t((1u << 20) - 1));
}
inline uint32_t smem_addr(const void* p) { return uint32_t(reinterpret_cast<const char*>(p) - smem_base()); }
inline unsigned char* smem_ptr(uint32_t a) { return reinterpret_cast<unsigned char*>(smem_base() + int32_t(a)); }
#else
// Shared addresses are offsets into the block's arena; a shared::cluster address (mapa) carries the block's cluster
// rank + 1 in bits 24 and up.
constexpr uint32_t kRankShift = 24;
inline uint32_t smem_addr(const void* p) {
    auto d = reinterpret_cast<const unsigned char*>(p) - g_block->arena;
    if (d < 0 || size_t(d) >= kArenaBytes) fail("a shared-memory address outside this block's shared memory");
    return uint32_t(d);
}
inline int rank_of(uint32_t a) { return (a >> kRankShift) ? int(a >> kRankShift) - 1 : g_block->rank; }
inline uint32_t offset_of(uint32_t a) { return a & ((1u << kRankShift) - 1); }
inline Block* block_of_rank(int rank) {
    if (rank == g_block->rank) return g_block;
    if (!g_block->cluster || rank >= g_block->cluster->size) fail("a cluster shared address of a block outside the cluster");
    return g_block->cluster->blocks[rank];
}
inline unsigned char* smem_ptr(uint32_t a) {
    Block* b = block_of_rank(rank_of(a));
    uint32_t off = offset_of(a);
    if (off >= kArenaBytes) fail("a shared address past the end of shared memory");
    if (off < kDynamicBytes && off >= kDynamicOffset + b->dyn_bytes)
        fail("a dynamic shared-memory access past the launch's shared_bytes");
    return b->arena + off;
}
#endif
inline uint64_t* warp_scratch() { return &g_block->scratch[size_t(self().linear & ~31) * 8]; }
void note_shared(const void* p, size_t bytes, bool write, const char* what);     // checks.h
// Meet the warp's other lanes (a collective, not a __syncwarp: it orders no shared memory for the checks); the first
// meeting of an instruction checks that the whole warp is there.
inline void warp_meet(const char* what, bool check) {
    Fiber& f = self();
    f.syncwarp = false;
    yield(Wait::warp);
    if (!check) return;
    int w0 = f.linear & ~31, n = int(g_block->fibers.size());
    if (w0 + 32 > n)
        fail(std::string(what) + ": warp " + std::to_string(w0 / 32) + " has " + std::to_string(n - w0) +
             " threads; a warp collective needs all 32 lanes (make the block a whole number of warps)");
    for (int i = w0; i < w0 + 32; ++i)
        if (g_block->fibers[i].wait == Wait::done)
            fail(std::string(what) + ": lane " + std::to_string(i - w0) + " of warp " + std::to_string(w0 / 32) +
                 " has exited; every lane of the warp must execute it (.sync.aligned)");
}
template <int NMAT> inline void ldmatrix(uint32_t* out, uint32_t addr, bool trans) {
    uint64_t* s = warp_scratch();
    int lane = self().linear & 31;
    s[lane] = addr;
    warp_meet("ldmatrix", true);
    for (int i = 0; i < NMAT; ++i) {      // matrix i's row r address from lane 8 i + r; lane l: row l / 4, cols 2 (l % 4) +0, +1
        uint16_t v[2];
        for (int e = 0; e < 2; ++e) {
            int r = lane / 4, c = 2 * (lane % 4) + e;
            int src_row = trans ? c : r, src_col = trans ? r : c;
            uint32_t row_addr = uint32_t(s[8 * i + src_row]);
            if (row_addr % 16) fail("ldmatrix: a row address not 16-byte aligned");
            const unsigned char* from = smem_ptr(row_addr + 2 * src_col);
            note_shared(from, 2, false, "ldmatrix");
            std::memcpy(&v[e], from, 2);
        }
        out[i] = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
    }
    warp_meet("ldmatrix", false);          // every lane has read the addresses before any posts again
}
inline float half_value(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float half_value(__half v) { return __half2float(v); }
template <class T> inline float elem(uint32_t packed, int hi) {
    return half_value(T{static_cast<unsigned short>(hi ? packed >> 16 : packed & 0xffff)});
}
// D (16 x 8, f32) += A (16 x 16, row) B (16 x 8, col); lane l: g = l / 4, t = l % 4. A: a0 (g, 2t..), a1 (g + 8, 2t..),
// a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..); B: b0 (k 2t.., n g), b1 (k 2t + 8.., n g); D: d0, d1 (g, 2t..), d2, d3 (g + 8, 2t..).
template <class T> inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    uint64_t* s = warp_scratch();
    int lane = self().linear & 31;
    for (int i = 0; i < 4; ++i) s[8 * lane + i] = a[i];
    for (int i = 0; i < 2; ++i) s[8 * lane + 4 + i] = b[i];
    warp_meet("mma.sync", true);
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, t = l % 4;
        const uint64_t* f = s + 8 * l;
        for (int e = 0; e < 2; ++e) {
            A[g][2 * t + e] = elem<T>(uint32_t(f[0]), e);
            A[g + 8][2 * t + e] = elem<T>(uint32_t(f[1]), e);
            A[g][2 * t + 8 + e] = elem<T>(uint32_t(f[2]), e);
            A[g + 8][2 * t + 8 + e] = elem<T>(uint32_t(f[3]), e);
            B[2 * t + e][g] = elem<T>(uint32_t(f[4]), e);
            B[2 * t + 8 + e][g] = elem<T>(uint32_t(f[5]), e);
        }
    }
    warp_meet("mma.sync", false);
    int g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; ++q) {
        int r = g + (q >= 2 ? 8 : 0), c = 2 * t + (q & 1);
        double acc = d[q];
        for (int k = 0; k < 16; ++k) acc += double(A[r][k]) * double(B[k][c]);
        d[q] = float(acc);
    }
}
inline void run_cp_async(int keep) {
    Fiber& f = self();
    while (int(f.cp_groups.size()) > keep) {
        for (auto& c : f.cp_groups.front()) {
            unsigned char* d = smem_ptr(c.dst);
            note_shared(d, size_t(c.bytes), true, "cp.async");
            std::memcpy(d, c.src, size_t(c.src_bytes));
            std::memset(d + c.src_bytes, 0, size_t(c.bytes - c.src_bytes));
        }
        f.cp_groups.pop_front();
    }
}
}  // namespace kl
inline size_t __cvta_generic_to_shared(const void* p) { return kl::smem_addr(p); }

namespace kl_emu {
inline void ldmatrix_x1(uint32_t (&r)[1], uint32_t addr) { kl::ldmatrix<1>(r, addr, false); }
inline void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) { kl::ldmatrix<2>(r, addr, false); }
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { kl::ldmatrix<4>(r, addr, false); }
inline void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) { kl::ldmatrix<2>(r, addr, true); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { kl::ldmatrix<4>(r, addr, true); }
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __nv_bfloat16) {
    kl::mma_16816<__nv_bfloat16>(d, a, b);
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __half) {
    kl::mma_16816<__half>(d, a, b);
}
template <class T> inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t b[2] = {b0, b1};                  // <kl/mma.cuh>'s mma_16816<T>(d, a, b0, b1)
    kl::mma_16816<T>(d, a, b);
}
inline void cp_async_16(uint32_t dst, const void* src, int src_bytes = 16) {
    if (dst % 16) kl::fail("cp.async: destination not 16-byte aligned");
    if (src_bytes && reinterpret_cast<uintptr_t>(src) % 16) kl::fail("cp.async: source not 16-byte aligned");
    if (src_bytes < 0 || src_bytes > 16) kl::fail("cp.async: src-size outside 0..16 for a 16-byte copy");
    kl::self().cp_open.push_back({dst, src, 16, src_bytes});
}
inline void cp_async_4(uint32_t dst, const void* src, int src_bytes = 4) {
    if (dst % 4) kl::fail("cp.async: destination not 4-byte aligned");
    if (src_bytes && reinterpret_cast<uintptr_t>(src) % 4) kl::fail("cp.async: source not 4-byte aligned");
    if (src_bytes < 0 || src_bytes > 4) kl::fail("cp.async: src-size outside 0..4 for a 4-byte copy");
    kl::self().cp_open.push_back({dst, src, 4, src_bytes});
}
inline void cp_async_commit() {
    kl::Fiber& f = kl::self();
    f.cp_groups.push_back(std::move(f.cp_open));
    f.cp_open.clear();
}
template <int N> inline void cp_async_wait() { kl::run_cp_async(N); }
inline void cp_async_wait_all() { cp_async_commit(); kl::run_cp_async(0); }
}  // namespace kl_emu

#include "checks.h"
#include "hopper.h"
