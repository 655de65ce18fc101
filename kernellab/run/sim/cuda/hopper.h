// Hopper's asynchronous PTX on the fibers of cuda_host.h (included at its end): mbarriers, TMA loads and stores,
// wgmma, named barriers, and the spellings tutorials 06, 07 and 09 give them (emulate.py's `emulate`, which builds a
// kernel with KL_SHARED_ARENA: shared memory as one arena per block, addresses small offsets as on a GPU).
//
// - mbarrier (init, arrive, arrive.expect_tx, expect_tx, try_wait.parity): its state lives in its own 8 bytes of
//   shared memory (the bytes still expected, the arrivals still expected, the count and the phase bit), every access
//   under one lock (a cluster's blocks run on OS threads of their own). A wait that finds its phase incomplete
//   yields the fiber (Wait::poll): the scheduler runs the block's other fibers, and where every waiter has looked
//   and no mbarrier changed since, a single block reports a deadlock at once; a cluster's waits are reported after
//   KERNELLAB_EMU_WAIT_S seconds (60 by default), since another block may still complete them.
// - TMA loads (cp.async.bulk.tensor 2d/3d, multicast to a cluster's blocks): land at issue, out-of-bounds elements
//   zero, the 128-byte swizzle, then complete their bytes on the mbarrier. TMA stores (bulk_group): queued per thread,
//   performed at the wait_group(.read) that lets them go; the box's bytes must be the same at issue and at that wait
//   (else a race: a store issued before its box was written, or the box rewritten too early); a thread may not exit
//   with stores unwaited. fence.proxy.async is a no-op (the ordering it gives is not modelled).
// - wgmma.mma_async m64nNk16 (bf16/fp16 -> fp32; A K-major from shared memory or from registers; B K-major, or
//   MN-major with the 128-byte swizzle): queued per thread at issue and computed at wgmma.wait_group, reading shared
//   memory then, so a stage released before its wgmma finished is caught. The accumulator registers hold a poison NaN
//   from issue to that wait (their values kept aside): a read too early gives NaN, a write is an error at the wait. A
//   from registers is read at issue. The wgmma instructions are .sync.aligned: the warp's lanes meet at each (the
//   scheduler's warp barrier), so no lane passes a wait before every lane of its warp has its results.
// - Named barriers (bar.sync / bar.arrive id 1-15, a thread count): per block, counting threads; a fiber at bar.sync
//   waits (Wait::named) until the count is reached; one still holding arrivals when the block ends is an error.
// - WMMA 16x16x16: each lane's fragment holds the whole tile (the layout is opaque in CUDA, so any layout is legal).
#pragma once
#include <map>
#include <memory>
#include <type_traits>

#define __grid_constant__
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __any_sync(unsigned, int pred) {       // the whole warp takes part (the mask is not checked)
    uint64_t* s = kl::warp_scratch();
    int lane = kl::self().linear & 31;
    s[8 * lane] = pred != 0;
    kl::warp_meet("__any_sync", false);
    int any = 0;
    int lanes = std::min(32, int(kl::g_block->fibers.size()) - (kl::self().linear & ~31));
    for (int l = 0; l < lanes; ++l)
        if (kl::g_block->fibers[(kl::self().linear & ~31) + l].wait != kl::Wait::done) any |= int(s[8 * l]);
    kl::warp_meet("__any_sync", false);
    return any;
}

namespace kl {
// What a thread has in flight besides cp.async (made at its first wgmma or TMA store).
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
struct TmaStore { TensorMap2D map; uint32_t src; int c0, c1; std::vector<unsigned char> seen; };
struct InFlight { std::vector<float> shadow; int pending = 0; };
struct Wgmma {
    float* d; int n; uint64_t da, db; bool accumulate; bool bf16;
    std::shared_ptr<InFlight> acc = nullptr;
    bool a_regs = false;          // A from registers: this thread's two rows (g, g + 8), read at issue
    bool b_mn_major = false;      // B MN-major (the transpose bit): N contiguous
    uint16_t a_rows[2][16] = {};
};
struct AsyncState {
    std::deque<std::vector<TmaStore>> store_groups;   // committed bulk groups, oldest first
    std::vector<TmaStore> store_open;
    std::map<float*, std::shared_ptr<InFlight>> in_flight;
    std::deque<std::vector<Wgmma>> wg_groups;
    std::vector<Wgmma> wg_open;
    bool wg_fenced = false;
    std::vector<int> maxnreg;     // the setmaxnreg counts this thread executed, in order (dec negative)
};
inline AsyncState& async_state() {
    Fiber& f = self();
    if (!f.async) f.async = std::make_shared<AsyncState>();
    return *f.async;
}
#ifdef KL_SHARED_ARENA
inline void check_setmaxnreg_done();          // below: a thread exits with its warpgroup's setmaxnreg done
#endif
inline void check_async_done() {
    Fiber& f = self();
#ifdef KL_SHARED_ARENA
    check_setmaxnreg_done();
#endif
    if (!f.async) return;
    if (!f.async->wg_open.empty() || !f.async->wg_groups.empty()) fail("thread exited with wgmma never waited for");
    if (!f.async->store_open.empty() || !f.async->store_groups.empty())
        fail("thread exited with TMA stores never waited for (cp.async.bulk.wait_group)");
}

// ---- mbarriers: state in their 8 bytes (MbarState, as the statistic exchange's), under atomic_lock() ------------
inline MbarState* mbar_at(uint32_t addr) {
    if (addr % 8) fail("mbarrier not 8-byte aligned");
    return reinterpret_cast<MbarState*>(smem_ptr(addr));
}
inline void mbar_init_at(uint32_t addr, int count) {
    if (count < 1 || count > 0x7fff) fail("mbarrier.init with a count outside 1..32767");
    std::lock_guard<std::mutex> g(atomic_lock());
    *mbar_at(addr) = MbarState{0, uint16_t(count), uint16_t(count)};
    ++g_mbar_changes;
}
inline MbarState& mbar_checked(uint32_t addr) {           // with atomic_lock() held
    MbarState& m = *mbar_at(addr);
#ifdef KL_SHARED_ARENA
    if (m.pending == 0xffff && m.count_phase == 0xffff) fail("mbarrier used before mbarrier.init");
#endif
    return m;
}
inline void mbar_settle_at(MbarState& m) {
    if (m.pending == 0 && m.tx == 0) {
        m.count_phase ^= 0x8000;
        m.pending = m.count_phase & 0x7fff;
    }
}
inline void mbar_arrive_at(uint32_t addr, int tx_bytes) {   // arrive (expecting tx_bytes more first)
    std::lock_guard<std::mutex> g(atomic_lock());
    MbarState& m = mbar_checked(addr);
    m.tx += tx_bytes;
    if (m.pending == 0) fail("mbarrier: more arrivals than its count");
    m.pending -= 1;
    mbar_settle_at(m);
    ++g_mbar_changes;
}
inline void mbar_tx_at(uint32_t addr, int delta, bool settle) {   // expect_tx (+), or copies completing (-)
    std::lock_guard<std::mutex> g(atomic_lock());
    MbarState& m = mbar_checked(addr);
    m.tx += delta;
    if (settle) mbar_settle_at(m);
    ++g_mbar_changes;
}
// Until the phase of this parity has completed: the current phase's parity differs from `parity`.
inline void mbar_wait_at(uint32_t addr, int parity) {
    auto t0 = std::chrono::steady_clock::now();
    for (bool polled = false;; polled = true) {
        MbarState m;
        {
            std::lock_guard<std::mutex> g(atomic_lock());
            m = mbar_checked(addr);
        }
        if (int((m.count_phase >> 15) & 1) != (parity & 1)) {
            if (polled) ++g_mbar_changes;          // a waiter went on: the scheduler's deadlock check sees progress
            return;
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(wait_limit_s()))
            fail("mbarrier wait (shared address " + std::to_string(addr) + ", parity " + std::to_string(parity) +
                 ") did not complete within " + std::to_string(int(wait_limit_s())) + " s: phase parity " +
                 std::to_string((m.count_phase >> 15) & 1) + ", " + std::to_string(m.pending) + " arrivals and " +
                 std::to_string(m.tx) + " tx bytes pending (a wrong parity, count or byte count?); "
                 "KERNELLAB_EMU_WAIT_S sets the limit");
        yield(Wait::poll);
    }
}

// ---- named barriers ------------------------------------------------------------------------------------------
inline void named_barrier(int id, int threads, bool wait) {
    if (id < 1 || id > 15) fail("named barrier id outside 1-15 (0 is __syncthreads)");
    if (threads <= 0 || threads % 32) fail("named barrier thread count not a positive multiple of 32");
    Block::Named& nb = g_block->named[id];
    if (nb.arrived == 0) nb.expected = threads;
    else if (nb.expected != threads) fail("named barrier used with two different thread counts at once");
    if (++nb.arrived == nb.expected) {
        nb.arrived = 0;
        for (auto& f : g_block->fibers)
            if (f.wait == Wait::named && f.named_id == id) f.wait = Wait::none;
        return;
    }
    if (wait) {
        self().named_id = id;
        yield(Wait::named);
    }
}

// ---- TMA ----------------------------------------------------------------------------------------------------------
// The 128-byte swizzle: the 16-byte chunk index (address bits 4-6) XORed with the 128-byte row index within 1024 bytes
// (address bits 7-9).
inline uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }
inline void tma_load(uint32_t dst, const TensorMap2D& t, int c0, int c1, int c2, uint32_t mbar) {
    uint32_t row_bytes = t.box0 * t.elem_bytes;
    if (dst % 128) fail("TMA destination not 128-byte aligned");
    if (t.swizzle_bytes == 128 && (row_bytes != 128 || dst % 1024))
        fail("128B swizzle needs 128-byte rows, 1 KiB alignment");
    for (uint32_t z = 0; z < t.box2; ++z)
        for (uint32_t r = 0; r < t.box1; ++r)
            for (uint32_t e = 0; e < t.box0; ++e) {
                int64_t i0 = int64_t(c0) + e, i1 = int64_t(c1) + r, i2 = int64_t(c2) + z;
                uint32_t a = dst + (z * t.box1 + r) * row_bytes + e * t.elem_bytes;
                if (t.swizzle_bytes == 128) a = swizzle128(a);
                unsigned char* d = smem_ptr(a);
                if (i0 < 0 || i1 < 0 || i2 < 0 || uint64_t(i0) >= t.dim0 || uint64_t(i1) >= t.dim1 ||
                    uint64_t(i2) >= t.dim2)
                    std::memset(d, 0, t.elem_bytes);
                else
                    std::memcpy(d, t.base + uint64_t(i2) * t.stride2_bytes + uint64_t(i1) * t.stride1_bytes +
                                       uint64_t(i0) * t.elem_bytes, t.elem_bytes);
            }
    mbar_tx_at(mbar, -int(t.box0 * t.box1 * t.box2 * t.elem_bytes), true);
}
// The box's bytes in shared memory as the store reads them (swizzled addresses, row by row).
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
    // ends, or the result depends on timing.
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
    AsyncState& a = async_state();
    while (int(a.store_groups.size()) > keep) {
        for (auto& s : a.store_groups.front()) run_tma_store(s);
        a.store_groups.pop_front();
    }
}

// ---- wgmma: queued at issue, computed at wgmma.wait_group ---------------------------------------------------------
constexpr uint32_t kAccPoison = 0x7fa5a5a5u;
// Address of element (row, k) of a K-major operand described by `desc` (16-bit elements).
inline uint32_t desc_addr(uint64_t desc, int row, int k) {
    uint32_t start = uint32_t(desc & 0x3fff) << 4;
    uint32_t lbo = uint32_t((desc >> 16) & 0x3fff) << 4;
    uint32_t sbo = uint32_t((desc >> 32) & 0x3fff) << 4;
    if ((desc >> 49) & 7) fail("wgmma descriptor: base offset other than 0 is not emulated");
    uint32_t mode = uint32_t(desc >> 62);
    if (mode == 1) return swizzle128(start + (row / 8) * sbo + (row % 8) * 128 + k * 2);   // 8 rows of 128 bytes
    // no swizzle: core matrices of 8 rows x 16 bytes; K-direction neighbours LBO apart, M/N ones SBO apart
    if (mode == 0) return start + (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2;
    fail("wgmma descriptor: only no swizzle and 128-byte swizzle are emulated");
}
// Address of element (n, k) of an MN-major operand (N contiguous) with the 128-byte swizzle: 64 N-elements (128 bytes)
// per K row, 8 K rows per 1,024-byte atom; the next 8 K rows SBO further, the next 64 N-elements LBO further.
inline uint32_t desc_addr_mn(uint64_t desc, int n, int k) {
    uint32_t start = uint32_t(desc & 0x3fff) << 4;
    uint32_t lbo = uint32_t((desc >> 16) & 0x3fff) << 4;
    uint32_t sbo = uint32_t((desc >> 32) & 0x3fff) << 4;
    if ((desc >> 49) & 7) fail("wgmma descriptor: base offset other than 0 is not emulated");
    if (uint32_t(desc >> 62) != 1)
        fail("wgmma descriptor: an MN-major operand is emulated with the 128-byte swizzle only");
    return swizzle128(start + (n / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (n % 64) * 2);
}
inline float bits_value(uint16_t v, bool bf16) {
    return bf16 ? __bfloat162float(__nv_bfloat16{v}) : __half2float(__half{v});
}
inline void run_wgmma(const Wgmma& w) {
    int t = self().linear % 128, warp = t / 32, lane = t % 32;
    for (int j = 0; j < w.n / 8; ++j)
        for (int q = 0; q < 4; ++q) {
            int row = 16 * warp + lane / 4 + (q >= 2 ? 8 : 0), col = 8 * j + 2 * (lane % 4) + (q & 1);
            double acc = w.accumulate ? w.acc->shadow[4 * j + q] : 0.0;
            for (int k = 0; k < 16; ++k) {
                uint16_t a, b;
                if (w.a_regs) a = w.a_rows[q >= 2][k];
                else std::memcpy(&a, smem_ptr(desc_addr(w.da, row, k)), 2);
                std::memcpy(&b, smem_ptr(w.b_mn_major ? desc_addr_mn(w.db, col, k) : desc_addr(w.db, col, k)), 2);
                acc += double(bits_value(a, w.bf16)) * double(bits_value(b, w.bf16));
            }
            w.acc->shadow[4 * j + q] = float(acc);
        }
    if (--w.acc->pending == 0) {                              // the last wgmma on these registers: they get its values
        for (int i = 0; i < w.n / 2; ++i)
            if (__float_as_uint(w.d[i]) != kAccPoison)
                fail("wgmma accumulator registers written while the wgmma was in flight (before its wait_group)");
        std::memcpy(w.d, w.acc->shadow.data(), sizeof(float) * (w.n / 2));
        async_state().in_flight.erase(w.d);
    }
}
// At issue: the accumulators go into flight (their values to the shadow, the registers poisoned), or stay there.
inline std::shared_ptr<InFlight> take_accumulators(float* d, int n) {
    auto& a = async_state().in_flight[d];
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
    AsyncState& a = async_state();
    while (int(a.wg_groups.size()) > keep) {
        for (auto& w : a.wg_groups.front()) run_wgmma(w);
        a.wg_groups.pop_front();
    }
}
// b_mn_major: B read MN-major (the transpose bit; wgmma_ss_tb).
template <class T> inline void wgmma_issue(float* d, int n, uint64_t da, uint64_t db, int scale_d, bool b_mn_major = false) {
    warp_meet("wgmma.mma_async", true);
    AsyncState& a = async_state();
    if (!a.wg_fenced) fail("wgmma issued without wgmma.fence first");
    a.wg_open.push_back({d, n, da, db, scale_d != 0, std::is_same<T, __nv_bfloat16>::value, take_accumulators(d, n)});
    a.wg_open.back().b_mn_major = b_mn_major;
}
// A from registers (mma.sync's A fragment per warp: a[0] row g cols 2t.., a[1] row g + 8, a[2] row g cols 2t + 8..,
// a[3] row g + 8 cols 2t + 8..), B MN-major from shared memory. The warp's fragments are gathered at issue.
template <class T> inline void wgmma_issue_rs(float* d, int n, const uint32_t (&a)[4], uint64_t db) {
    AsyncState& st = async_state();
    if (!st.wg_fenced) fail("wgmma issued without wgmma.fence first");
    uint64_t* s = warp_scratch();
    int lane = self().linear & 31, g = lane / 4;
    for (int r = 0; r < 4; ++r) s[8 * lane + r] = a[r];
    warp_meet("wgmma.mma_async", true);
    Wgmma w{d, n, 0, db, true, std::is_same<T, __nv_bfloat16>::value};
    w.a_regs = true;
    w.b_mn_major = true;
    for (int src = 4 * g; src < 4 * g + 4; ++src) {
        int tt = src % 4;
        for (int half = 0; half < 2; ++half) {           // rows g (regs 0, 2) and g + 8 (regs 1, 3)
            uint32_t lo = uint32_t(s[8 * src + half]), hi = uint32_t(s[8 * src + 2 + half]);
            w.a_rows[half][2 * tt] = uint16_t(lo & 0xffff);
            w.a_rows[half][2 * tt + 1] = uint16_t(lo >> 16);
            w.a_rows[half][8 + 2 * tt] = uint16_t(hi & 0xffff);
            w.a_rows[half][8 + 2 * tt + 1] = uint16_t(hi >> 16);
        }
    }
    warp_meet("wgmma.mma_async", false);          // every lane has read the fragments before any posts again
    w.acc = take_accumulators(d, n);
    st.wg_open.push_back(w);
}
}  // namespace kl

namespace kl_emu {              // <kl/wgmma.cuh>'s functions
inline void wgmma_fence() { kl::warp_meet("wgmma.fence", true); kl::async_state().wg_fenced = true; }
inline void wgmma_commit() {
    kl::warp_meet("wgmma.commit_group", true);
    kl::AsyncState& a = kl::async_state();
    a.wg_groups.push_back(std::move(a.wg_open));
    a.wg_open.clear();
    a.wg_fenced = false;
}
template <int N> inline void wgmma_wait() {
    kl::warp_meet("wgmma.wait_group", true);
    kl::run_pending_wgmma(N);
    kl::warp_meet("wgmma.wait_group", false);
}
template <class T> inline void wgmma_256(float (&d)[128], uint64_t da, uint64_t db, T) {
    kl::wgmma_issue<T>(d, 256, da, db, 1);
}
template <class T> inline void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, T) {
    kl::wgmma_issue<T>(d, 128, da, db, 1);
}
// Tutorial 07's spellings: wgmma_ss<N, T> (both K-major from shared memory, scale_d = 0 starts from zero),
// wgmma_ss_tb<N, T> (the same with B MN-major: tutorial 08) and wgmma_rs_tb<N, T> (A from registers, B MN-major).
template <int N, typename T>
inline void wgmma_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b, int scale_d) {
    kl::wgmma_issue<T>(d, N, a, b, scale_d);
}
template <int N, typename T>
inline void wgmma_ss_tb(float (&d)[N / 2], unsigned long long a, unsigned long long b, int scale_d) {
    kl::wgmma_issue<T>(d, N, a, b, scale_d, true);
}
template <int N, typename T> inline void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], unsigned long long b) {
    kl::wgmma_issue_rs<T>(d, N, a, b);
}
template <int N> inline void fence_acc(float (&)[N]) {}
}  // namespace kl_emu

#ifdef KL_SHARED_ARENA
// ---- the spellings of tutorials 06, 07 and 09 (their inline-PTX helpers are cut from the source; see emulate.py) --
struct alignas(64) CUtensorMap {
    // the emulator's own encoding (a real CUtensorMap is opaque): kl::TensorMap2D
    unsigned long long opaque[16];
};
static_assert(sizeof(kl::TensorMap2D) <= sizeof(CUtensorMap), "tensor map encoding too large");
namespace kl {
inline CUtensorMap make_tensor_map(const void* base, uint64_t dim0, uint64_t dim1, uint64_t stride1_bytes,
                                   uint32_t box0, uint32_t box1, uint32_t elem_bytes, uint32_t swizzle_bytes,
                                   uint64_t dim2 = 1, uint64_t stride2_bytes = 0, uint32_t box2 = 1) {
    CUtensorMap m{};
    TensorMap2D t{static_cast<const unsigned char*>(base), dim0, dim1, stride1_bytes, box0, box1, elem_bytes,
                  swizzle_bytes, dim2, stride2_bytes, box2};
    std::memcpy(&m, &t, sizeof t);
    return m;
}
inline TensorMap2D tensor_map(const void* map) { TensorMap2D t; std::memcpy(&t, map, sizeof t); return t; }
// The static __shared__ arrays: one slot per declaration site (template instance), from 256 KiB on in the arena.
inline size_t& static_used() { static size_t used = kDynamicBytes; return used; }
template <class T, size_t Align, int Site> T* shared_alloc() {
    static size_t offset = [] {
        std::lock_guard<std::mutex> lock(atomic_lock());
        size_t off = (static_used() + Align - 1) / Align * Align;
        static_used() = off + sizeof(T);
        if (static_used() > kArenaBytes) fail("static shared memory exceeds the emulator's arena");
        return off;
    }();
    return reinterpret_cast<T*>(g_block->arena + offset);
}
inline void* dynamic_smem() { return g_block->arena + kDynamicOffset; }
}  // namespace kl

inline void mbarrier_init(uint32_t addr, int count) { kl::mbar_init_at(addr, count); }
inline void mbarrier_arrive(uint32_t addr) { kl::mbar_arrive_at(addr, 0); }
inline void mbarrier_arrive_expect_tx(uint32_t addr, int bytes) { kl::mbar_arrive_at(addr, bytes); }
inline void mbarrier_expect_tx(uint32_t addr, int bytes) { kl::mbar_tx_at(addr, bytes, false); }
inline void mbarrier_wait(uint32_t addr, int parity) { kl::mbar_wait_at(addr, parity); }
inline void fence_barrier_init() {}
inline void fence_proxy_async() {}
inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t mbar_addr) {
    kl::tma_load(dst, kl::tensor_map(map), c0, c1, c2, mbar_addr);
}
inline void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t mbar_addr) {
    kl::tma_load(dst, kl::tensor_map(map), c0, c1, 0, mbar_addr);
}
// <kl/tma.cuh>'s spellings (tutorial 07)
inline void mbar_init(uint32_t bar, int count) { mbarrier_init(bar, count); }
inline void mbar_expect_tx(uint32_t bar, uint32_t bytes) { mbarrier_arrive_expect_tx(bar, int(bytes)); }   // arrives
inline void mbar_arrive(uint32_t bar) { mbarrier_arrive(bar); }
inline void fence_mbarrier_init() { fence_barrier_init(); }
inline void mbar_wait(uint32_t bar, uint32_t phase) { mbarrier_wait(bar, int(phase)); }
inline void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2) {
    kl::tma_load(dst, kl::tensor_map(tmap), c0, c1, c2, bar);
}
// clusters (tutorial 06): shared::cluster addresses carry the block's rank + 1 in bits 24 and up
inline unsigned cluster_ctarank() { return kl::cluster_rank(); }
inline void cluster_sync() { kl::arrive(); kl::wait_cluster(); }
inline unsigned mapa_shared(unsigned smem_addr, unsigned cta) {
    if (cta >= kl::cluster_size()) kl::fail("mapa to a block outside the cluster");
    return ((cta + 1) << kl::kRankShift) | kl::offset_of(smem_addr);
}
inline void mbarrier_arrive_cluster(unsigned cluster_bar) { mbarrier_arrive(cluster_bar); }
inline void tma_load_2d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar,
                                  unsigned short mask) {
    for (unsigned r = 0; r < kl::cluster_size(); ++r)
        if (mask & (1u << r)) tma_load_2d(mapa_shared(dst, r), map, c0, c1, mapa_shared(bar, r));
}
inline void named_bar_sync(int id, int threads) { kl::named_barrier(id, threads, true); }
inline void named_bar_arrive(int id, int threads) { kl::named_barrier(id, threads, false); }
inline void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    kl::TensorMap2D t = kl::tensor_map(map);
    if (kl::offset_of(src) % 128) kl::fail("TMA store source not 128-byte aligned");
    if (t.swizzle_bytes == 128 && (t.box0 * t.elem_bytes != 128 || kl::offset_of(src) % 1024))
        kl::fail("128B swizzle needs 128-byte rows, 1 KiB alignment");
    if (kl::rank_of(src) != kl::g_block->rank) kl::fail("TMA store source outside this block's shared memory");
    kl::async_state().store_open.push_back({t, src, c0, c1, kl::store_source(t, src)});
}
inline void tma_store_commit() {
    kl::AsyncState& a = kl::async_state();
    a.store_groups.push_back(std::move(a.store_open));
    a.store_open.clear();
}
template <int N> inline void tma_store_wait_read() { kl::run_pending_stores(N); }
template <int N> inline void tma_store_wait() { kl::run_pending_stores(N); }
// setmaxnreg.{inc,dec}.sync.aligned.u32 R: registers are not modelled, so it changes nothing here; what a GPU
// requires is checked. R a multiple of 8 in [24, 256] (at compile time, as ptxas does); every thread of a whole
// warpgroup executes the same counts in the same order (.sync.aligned: a warp or thread that skips one, exits before
// it, or asks another count hangs or is undefined on a GPU); an inc does not lower and a dec does not raise what the
// warpgroup set last; and the block's warpgroups, at their last counts (24, the least, for one not yet set), hold at
// most an SM's 65,536 registers (else setmaxnreg.inc waits forever for registers no warpgroup gives back).
namespace kl {
inline void setmaxnreg(int r, bool inc) {
    const std::string what = std::string(inc ? "setmaxnreg.inc " : "setmaxnreg.dec ") + std::to_string(r);
    Fiber& f = self();
    const int n = int(g_block->fibers.size()), wg0 = f.linear & ~127, wg = f.linear / 128;
    if (wg0 + 128 > n)
        fail(what + ": warpgroup " + std::to_string(wg) + " has " + std::to_string(n - wg0) +
             " threads; setmaxnreg needs whole warpgroups (make the block a multiple of 128 threads)");
    warp_meet("setmaxnreg", true);             // the whole warp, none exited
    std::vector<int>& mine = async_state().maxnreg;
    const int prev = mine.empty() ? 0 : std::abs(mine.back());
    if (prev && (inc ? r < prev : r > prev))
        fail(what + ": the warpgroup set " + std::to_string(prev) + " before; " + (inc ? "inc" : "dec") +
             " may not " + (inc ? "lower" : "raise") + " it");
    mine.push_back(inc ? r : -r);
    const size_t k = mine.size();
    for (int i = wg0; i < wg0 + 128; ++i) {
        Fiber& o = g_block->fibers[i];
        const size_t m = o.async ? o.async->maxnreg.size() : 0;
        if (m >= k && o.async->maxnreg[k - 1] != mine[k - 1])
            fail(what + ": thread " + std::to_string(i) + " of warpgroup " + std::to_string(wg) + " executed " +
                 (o.async->maxnreg[k - 1] > 0 ? "setmaxnreg.inc " : "setmaxnreg.dec ") +
                 std::to_string(std::abs(o.async->maxnreg[k - 1])) +
                 " there; every thread of a warpgroup must execute the same setmaxnreg (.sync.aligned)");
        if (m < k && o.wait == Wait::done)
            fail(what + ": thread " + std::to_string(i) + " of warpgroup " + std::to_string(wg) +
                 " exited without executing it; every thread of the warpgroup must (.sync.aligned)");
    }
    long total = 0;
    for (int w0 = 0; w0 + 128 <= n; w0 += 128) {
        int last = 24;                          // a warpgroup not yet set holds at least this many
        size_t longest = 0;
        for (int i = w0; i < w0 + 128; ++i) {
            const Fiber& o = g_block->fibers[i];
            if (o.async && o.async->maxnreg.size() > longest) {
                longest = o.async->maxnreg.size();
                last = std::abs(o.async->maxnreg.back());
            }
        }
        total += 128L * last;
    }
    if (total > 65536)
        fail(what + ": the block's warpgroups would hold " + std::to_string(total) +
             " registers, more than an SM's 65,536; setmaxnreg.inc would wait forever on a GPU");
    warp_meet("setmaxnreg", false);            // every lane has checked before any goes on (and may exit)
}
// A thread exits: no other thread of its warpgroup executed a setmaxnreg it did not.
inline void check_setmaxnreg_done() {
    Fiber& f = self();
    const int n = int(g_block->fibers.size()), wg0 = f.linear & ~127;
    const size_t mine = f.async ? f.async->maxnreg.size() : 0;
    for (int i = wg0; i < std::min(wg0 + 128, n); ++i) {
        const Fiber& o = g_block->fibers[i];
        if (o.async && o.async->maxnreg.size() > mine)
            fail("setmaxnreg: thread " + std::to_string(f.linear) + " exited having executed " +
                 std::to_string(mine) + " of the " + std::to_string(o.async->maxnreg.size()) + " setmaxnreg that " +
                 "thread " + std::to_string(i) + " of its warpgroup did; every thread of a warpgroup must " +
                 "(.sync.aligned)");
    }
}
}  // namespace kl
template <int R> inline void setmaxnreg_inc() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: the count must be a multiple of 8 in [24, 256]");
    kl::setmaxnreg(R, true);
}
template <int R> inline void setmaxnreg_dec() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: the count must be a multiple of 8 in [24, 256]");
    kl::setmaxnreg(R, false);
}
inline float exp2_approx(float x) { return std::exp2(x); }
inline void red_add_v2(float* p, float a, float b) { atomicAdd(p, a); atomicAdd(p + 1, b); }   // red.global.add.v2.f32
inline unsigned tid_x_again() { return threadIdx.x; }   // mov.u32 %tid.x in volatile asm: read again

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
inline float value_of(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float value_of(__half v) { return __half2float(v); }
inline float value_of(float v) { return v; }
template <class Use, class T, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            bool is_row = std::is_same<L, wmma::row_major>::value;
            f.x[16 * r + c] = value_of(is_row ? p[r * ldm + c] : p[c * ldm + r]);
        }
    kl::warp_meet("wmma::load_matrix_sync", true);
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
    kl::warp_meet("wmma::store_matrix_sync", true);
    if ((kl::self().linear & 31) == 0)
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[16 * r + c];
    kl::warp_meet("wmma::store_matrix_sync", false);   // (the first meeting checked the warp; lanes may exit after)
}
}  // namespace wmma
}  // namespace nvcuda
#endif  // KL_SHARED_ARENA
