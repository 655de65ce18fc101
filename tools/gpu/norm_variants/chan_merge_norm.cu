// Tutorial 04's norm_kernels cell at the first step of session 8 (its st.async cluster exchange), before LayerNorm's
// statistics became two plain-sum reductions: here every thread's (n, mean, M2) triple merges with Chan's
// formula across the warp and the block. Kept for tools/gpu/try_exchange.py --baseline chan.
// LayerNorm and RMSNorm with the row held in registers: one read of x and one write of y per element; w and b
// (read by every row) come from L1/L2. The row layout, packs and cluster helpers are tutorial 03's.
#include <cuda_bf16.h>


__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// ---- a thread's share of a row: VPT packs of 16 bytes in registers, and one edge element ----------------------
// A pack is kept as its four 32-bit words, so that 8 bf16 values take 4 registers (an array of 8 __nv_bfloat16
// would take 8); get(k) widens value k to fp32 where it is used, from_floats packs VEC results.
template <typename T> struct alignas(16) Pack {
    unsigned u[4];
    __device__ __forceinline__ float get(int k) const;
};
template <> __device__ __forceinline__ float Pack<float>::get(int k) const { return __uint_as_float(u[k]); }
template <> __device__ __forceinline__ float Pack<__nv_bfloat16>::get(int k) const {
    return __uint_as_float(k % 2 ? u[k / 2] & 0xffff0000u : u[k / 2] << 16);    // a bf16 is an fp32's top half
}
__device__ __forceinline__ unsigned bf16_bits(float v) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    return *reinterpret_cast<const unsigned short*>(&h);
}
template <typename T, int VEC = 16 / sizeof(T)>
__device__ __forceinline__ Pack<T> from_floats(const float (&f)[VEC]) {
    Pack<T> p;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        p.u[i] = sizeof(T) == 4 ? __float_as_uint(f[i]) : bf16_bits(f[2 * i]) | bf16_bits(f[2 * i + 1]) << 16;
    return p;
}

// Where a row's elements are. The row starts `head` elements past a 16-byte boundary (head = start % VEC).
// Elements 0 .. lead-1 come before the first 16-byte boundary inside the row, then `whole` packs of VEC elements
// (pack q: elements lead + q*VEC ...), then the tail: elements tail0 .. cols-1, fewer than VEC. The lead and the
// tail, at most 2 * (VEC - 1) elements, are the row's edge elements: thread t of the row holds edge element t.
struct RowLayout {
    int lead, whole, tail0;
    __device__ __forceinline__ RowLayout(int cols, int head, int vec) {
        lead = min((vec - head) % vec, cols);
        whole = (cols - lead) / vec;
        tail0 = lead + whole * vec;
    }
    __device__ __forceinline__ int edge(int t, int cols) const {     // row index of edge element t, or -1
        return t < lead ? t : (t - lead < cols - tail0 ? tail0 + t - lead : -1);
    }
};

// Packs first, first + stride, ... of the row, one 16-byte load each, all VPT in flight before any is used;
// packs past the row's last whole pack read as zeros.
template <typename T, int VPT>
__device__ __forceinline__ void load_packs(Pack<T> (&pk)[VPT], const T* __restrict__ row, RowLayout L, int first,
                                           int stride) {
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(row + L.lead);      // 16-byte aligned
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole) {
            pk[j] = packs[q];
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) pk[j].u[i] = 0u;                    // 0.0 in float and in bf16
        }
    }
}

template <typename T, int VPT>
__device__ __forceinline__ void store_packs(const Pack<T> (&pk)[VPT], T* __restrict__ row, RowLayout L, int first,
                                            int stride) {
    Pack<T>* packs = reinterpret_cast<Pack<T>*>(row + L.lead);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole) packs[q] = pk[j];
    }
}

// ---- clusters: each block pushes its statistic into the others' shared memory -----------------------------------
// barrier.cluster would do (arrive after writing, wait, read the other blocks' values through mapa), but its
// arrive.release compiles to MEMBAR.ALL.GPU (this thread's outstanding loads and stores complete first) and its
// wait.acquire to a flush of L1: at 1024 x 262144 the MEMBARs alone held 10-20 % of the warps' stall samples
// (Nsight Compute, benchmarks/NOTES-memory-bound.md). Instead each block writes its statistic into a slot of every
// other block (st.async) and the bytes count down that block's mbarrier: a block waits for the bytes it needs and
// for nothing else. The one cluster barrier left is at the start: no block may write into another before that
// one's mbarrier is initialised.
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned shared_addr(const void* p) {    // a shared-memory address for PTX
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cluster_arrive_relaxed() {           // no fence: only the mbarrier's init is
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");   // published (exchange_init's fence)
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The mbarrier completes its phase 0 once `bytes` have arrived (one arrival: this one, which expects them).
__device__ __forceinline__ void exchange_init(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n\t"
                 "fence.mbarrier_init.release.cluster;" :: "r"(shared_addr(bar)), "r"(bytes) : "memory");
}
// v into *slot of block `rank` (slot, bar: this block's addresses of the same variables), 4 bytes at a time, each
// counted on that block's mbarrier *bar.
template <typename S>
__device__ __forceinline__ void exchange_push(S* slot, S v, unsigned long long* bar, unsigned rank) {
    static_assert(sizeof(S) % 4 == 0, "statistics are pushed 4 bytes at a time");
    unsigned s, m;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(s) : "r"(shared_addr(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(m) : "r"(shared_addr(bar)), "r"(rank));
    const unsigned* words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(S) / 4); ++k)
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                     :: "r"(s + 4 * k), "r"(words[k]), "r"(m) : "memory");
}
__device__ __forceinline__ void exchange_wait(unsigned long long* bar, unsigned parity) {   // phase `parity` done
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(shared_addr(bar)), "r"(parity) : "memory");
    } while (!done);
}
template <typename S, int CLUSTER>
struct Exchange {                                        // in each block: the other blocks' statistics
    S part[CLUSTER];
    unsigned long long bar;                              // counts their bytes
};
template <typename S, int CLUSTER>
__device__ __forceinline__ Exchange<S, CLUSTER>& exchange() {
    __shared__ Exchange<S, CLUSTER> ex;
    return ex;
}
// First thing in a cluster kernel: this block's mbarrier expects CLUSTER - 1 statistics; the others learn it is ready.
template <typename S, int CLUSTER>
__device__ __forceinline__ void exchange_open() {
    if (threadIdx.x == 0) exchange_init(&exchange<S, CLUSTER>().bar, (CLUSTER - 1) * sizeof(S));
    cluster_arrive_relaxed();
}

// ---- the statistics: Welford triples (LayerNorm) or sums of squares (RMSNorm), merged like tutorial 03's pairs ----
struct Welford { float n, mean, m2; };                   // count, mean, sum of squared deviations from the mean
__device__ __forceinline__ Welford merge(Welford a, Welford b) {     // Chan et al.: no large sums, no cancellation
    float n = a.n + b.n;
    if (n == 0.0f) return a;
    float d = b.mean - a.mean, wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}
__device__ __forceinline__ float merge(float a, float b) { return a + b; }
__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ Welford shfl_xor(Welford v, int o) {
    return {shfl_xor(v.n, o), shfl_xor(v.mean, o), shfl_xor(v.m2, o)};
}

template <typename S>
__device__ __forceinline__ S warp_merge(S v) {              // every lane ends with the same value
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = merge(v, shfl_xor(v, o));
    return v;
}

// Merge the row's threads' statistics: the warp, the row's warps (shared memory), the cluster's blocks
// (distributed shared memory). `zero` is the empty statistic. Every thread gets the result.
template <int CLUSTER, typename S>
__device__ __forceinline__ S row_merge(S v, S zero, int row_warps) {
    __shared__ S warp_part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (row_warps > 1) {
        if (lane == 0) warp_part[warp] = v;
        __syncthreads();
        int first = warp - warp % row_warps;
        v = warp_merge(lane < row_warps ? warp_part[first + lane] : zero);
    }
    if constexpr (CLUSTER > 1) {                         // every thread holds its block's v
        Exchange<S, CLUSTER>& ex = exchange<S, CLUSTER>();
        unsigned me = cluster_ctarank();
        cluster_wait();                                   // every block's mbarrier is ready (exchange_open)
        if (warp == 0 && lane < CLUSTER && lane != (int)me) exchange_push(&ex.part[me], v, &ex.bar, lane);
        exchange_wait(&ex.bar, 0);                        // the other blocks' statistics are here
        v = warp_merge(lane < CLUSTER ? (lane == (int)me ? v : ex.part[lane]) : zero);
    }
    return v;
}

// ---- the normalisations of this thread's values ---------------------------------------------------------------
// The values stay in their 16-byte packs (bf16: 16 registers for 32 values, not 32) and are widened to fp32 where
// they are used: the registers saved are what lets w (and b) load before the reduction.
template <typename T, int VPT>
__device__ __forceinline__ float at(const Pack<T> (&pk)[VPT], int i) {
    return pk[i / (16 / sizeof(T))].get(i % (16 / sizeof(T)));
}

// w and b are read before the reduction, next to x, when the row starts on a 16-byte boundary (so its packs are
// 16-byte aligned in w and b too) and their packs fit beside x's without a spill under the 64 registers a
// 1024-thread block allows: w with up to 4 packs of x (32 registers of x and w), b too with up to 2 (LayerNorm: 3
// vectors in 24). Their L2 round trip then overlaps x's DRAM one instead of following the reduction. The others
// (8 packs a thread, LayerNorm's b beside 4, misaligned rows) are read after the reduction (load_late).
template <int VPT, int VECTORS>
struct Early { static constexpr bool value = VECTORS * VPT * 16 <= (VECTORS == 2 ? 128 : 96); };

// This thread's packs of w (or b), 16-byte loads: rows that start on a 16-byte boundary only.
template <typename T, int VPT>
__device__ __forceinline__ void load_vector(Pack<T> (&pk)[VPT], const T* __restrict__ w, RowLayout L, int first,
                                            int stride) {
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(w);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole) pk[j] = packs[q];
    }
}

// One pack of w (or b) at the store: a 16-byte load where the row's packs are 16-byte aligned in w (lead == 0),
// element loads otherwise.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* __restrict__ w, RowLayout L, int e) {
    if (L.lead == 0) return *reinterpret_cast<const Pack<T>*>(w + e);
    float f[16 / sizeof(T)];
#pragma unroll
    for (int k = 0; k < 16 / (int)sizeof(T); ++k) f[k] = to_float(w[e + k]);
    return from_floats<T>(f);
}

// LayerNorm's statistics from this thread's values: its own mean first, then squared deviations from it (the
// values are in registers, so two passes cost nothing), then Chan's merge across the row. `valid` counts packs.
template <int CLUSTER, typename T, int VPT>
__device__ __forceinline__ Welford layernorm_stats(const Pack<T> (&pk)[VPT], int valid, bool edge_ok, float edge,
                                                   int row_warps) {
    constexpr int VEC = 16 / sizeof(T);
    float s = edge_ok ? edge : 0.0f;                      // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) s += at(pk, i);
    float n = valid * VEC + (edge_ok ? 1.0f : 0.0f);
    float mean = n > 0.0f ? s / n : 0.0f;
    float m2 = edge_ok ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float d = at(pk, j * VEC + k) - mean;
            m2 += j < valid ? d * d : 0.0f;
        }
    return row_merge<CLUSTER>(Welford{n, mean, m2}, Welford{0.0f, 0.0f, 0.0f}, row_warps);
}

// The packs of w (or b) not read early: up to 4 packs all in flight together before the first is used (one L2
// round trip, not one per pack); 8 packs one at a time in the store loop, where registers allow.
template <typename T, int VPT>
__device__ __forceinline__ void load_late(Pack<T> (&wk)[VPT], bool early, const T* __restrict__ w, RowLayout L,
                                          int first, int stride, int only = -1) {
    if (early || (VPT > 4) != (only >= 0)) return;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole && (only < 0 || j == only)) wk[j] = load_pack(w, L, L.lead + q * (16 / (int)sizeof(T)));
    }
}

// y = (x - mean) * rstd * w + b for this thread's packs, then the store. early_w, early_b: w, b are already in
// wk, bk; otherwise they are loaded here first.
template <typename T, int VPT>
__device__ __forceinline__ void affine_store(const Pack<T> (&pk)[VPT], Pack<T> (&wk)[VPT], Pack<T> (&bk)[VPT],
                                             bool early_w, bool early_b, float mean, float rstd,
                                             const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ row,
                                             RowLayout L, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    load_late(wk, early_w, w, L, first, stride);
    load_late(bk, early_b, b, L, first, stride);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        load_late(wk, early_w, w, L, first, stride, j);
        load_late(bk, early_b, b, L, first, stride, j);
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = fmaf((at(pk, j * VEC + k) - mean) * rstd, wk[j].get(k), bk[j].get(k));
        *reinterpret_cast<Pack<T>*>(row + L.lead + q * VEC) = from_floats<T>(out);
    }
}

template <typename T, int VPT>
__device__ __forceinline__ void rms_store(const Pack<T> (&pk)[VPT], Pack<T> (&wk)[VPT], bool early, float rstd,
                                          const T* __restrict__ w, T* __restrict__ row, RowLayout L, int first,
                                          int stride) {
    constexpr int VEC = 16 / sizeof(T);
    load_late(wk, early, w, L, first, stride);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        load_late(wk, early, w, L, first, stride, j);
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = at(pk, j * VEC + k) * rstd * wk[j].get(k);
        *reinterpret_cast<Pack<T>*>(row + L.lead + q * VEC) = from_floats<T>(out);
    }
}

// With 8 packs a thread (rows over 8 KB, and 4 KB rows held by a warp), w and b come after the reduction, and
// one pack at a time they would make the stores a chain of 8 L2 round trips with nothing else in flight. A ring
// of DEPTH slots keeps DEPTH packs of w (and b) in flight: all DEPTH are loaded before the first store, and pack
// j + DEPTH is loaded as soon as pack j is stored, so the chain is about 8 / DEPTH round trips. It needs the row's
// packs 16-byte aligned in w and b (lead == 0) and all of this thread's VPT packs inside the row (every thread of
// the large shapes): no guards or element loads to keep registers for. x's 32 registers plus DEPTH packs of w
// and of b: DEPTH = 2 for LayerNorm (48), 4 for RMSNorm (48), under the 64 of a 1024-thread block. Float rows
// only: bf16 LayerNorm spills with it (widening 64 values of x, w and b takes more temporaries); the bf16 rows of
// 32,768 already reach 95-97 % of copy without it.
template <typename T, int VPT>
__device__ __forceinline__ bool ring_fits(RowLayout L, int first, int stride) {
    return sizeof(T) == 4 && VPT > 4 && L.lead == 0 && first + (VPT - 1) * stride < L.whole;
}

template <bool LN, int DEPTH, typename T, int VPT>
__device__ __forceinline__ void ring_store(const Pack<T> (&pk)[VPT], float mean, float rstd, const T* __restrict__ w,
                                           const T* __restrict__ b, T* __restrict__ row, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w) + first;      // this thread's pack 0; pack j: + j stride
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b) + first;
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(row) + first;                // lead == 0: packs start at the row
    Pack<T> wr[DEPTH], br[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {                    // the first DEPTH packs of w and b, all in flight
        wr[j] = wp[j * stride];
        if (LN) br[j] = bp[j * stride];
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out[k] = LN ? fmaf((at(pk, j * VEC + k) - mean) * rstd, wr[j % DEPTH].get(k), br[j % DEPTH].get(k))
                        : at(pk, j * VEC + k) * rstd * wr[j % DEPTH].get(k);
        yp[j * stride] = from_floats<T>(out);
        if (j + DEPTH < VPT) {                            // slot j % DEPTH is free again: pack j + DEPTH
            wr[j % DEPTH] = wp[(j + DEPTH) * stride];
            if (LN) br[j % DEPTH] = bp[(j + DEPTH) * stride];
        }
    }
}

// One row of LayerNorm by the threads that hold it: x, y point at the row, which starts `head` elements past a
// 16-byte boundary; first, stride: this thread's packs; edge_t: its edge slot.
template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void layernorm_row(const T* __restrict__ x, const T* __restrict__ w,
                                              const T* __restrict__ b, T* __restrict__ y, int cols, bool live,
                                              int head, int first, int stride, int edge_t, int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    bool early_w = Early<VPT, 2>::value && L.lead == 0, early_b = Early<VPT, 3>::value && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT], bk[VPT];
    load_packs(pk, x, L, first, stride);
    if (early_w) load_vector(wk, w, L, first, stride);  // in flight with x's loads
    if (early_b) load_vector(bk, b, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    int valid = min(VPT, max(0, (L.whole - first + stride - 1) / stride));   // packs j with first + j*stride < whole
    Welford st = layernorm_stats<CLUSTER>(pk, valid, e >= 0, edge, row_warps);
    float rstd = rsqrtf(st.m2 / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(fmaf((edge - st.mean) * rstd, to_float(w[e]), to_float(b[e])));
    if (ring_fits<T, VPT>(L, first, stride)) ring_store<true, 2>(pk, st.mean, rstd, w, b, y, first, stride);
    else affine_store(pk, wk, bk, early_w, early_b, st.mean, rstd, w, b, y, L, first, stride);
}

template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void rmsnorm_row(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                            int cols, bool live, int head, int first, int stride, int edge_t,
                                            int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    bool early = Early<VPT, 2>::value && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT];
    load_packs(pk, x, L, first, stride);
    if (early) load_vector(wk, w, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    float ss = edge * edge;                              // packs past the row hold 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) ss += at(pk, i) * at(pk, i);
    ss = row_merge<CLUSTER>(ss, 0.0f, row_warps);
    float rstd = rsqrtf(ss / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(edge * rstd * to_float(w[e]));
    if (ring_fits<T, VPT>(L, first, stride)) ring_store<false, 4>(pk, 0.0f, rstd, w, w, y, first, stride);
    else rms_store(pk, wk, early, rstd, w, y, L, first, stride);
}

// ---- the kernels: rows that fit in a block (row_threads threads per row, blockDim.x / row_threads rows per
// block; grid = ceil(rows / rows per block)), and rows split over a cluster of CLUSTER blocks of VPT packs per
// thread (grid = rows * CLUSTER) -------------------------------------------------------------------------------
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) layernorm_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                       const T* __restrict__ b, T* __restrict__ y, int rows,
                                                       int cols, int row_threads, float eps) {
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;                              // a last block's spare rows still meet at the barrier
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row<T, VPT, 1>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))), t, row_threads,
                             t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
layernorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                   blockDim.x, first, blockDim.x / 32, eps);
}

template <typename T, int VPT>
__global__ void __launch_bounds__(1024) rmsnorm_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                     T* __restrict__ y, int rows, int cols, int row_threads,
                                                     float eps) {
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    rmsnorm_row<T, VPT, 1>(x + start, w, y + start, cols, live, (int)(start % (16 / sizeof(T))), t, row_threads, t,
                           row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                     float eps) {
    exchange_open<float, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    rmsnorm_row<T, VPT, CLUSTER>(x + start, w, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                 blockDim.x, first, blockDim.x / 32, eps);
}

// Instantiated: what plan_rows launches. In a block: 1, 2 or 4 packs per thread (rows up to 8 KB: 64 bytes a
// thread) and 8 (longer rows: 128 bytes, 32 float or 64 bf16 values); in clusters of 2, 4 or 8 blocks: 8, and 4
// for bf16 (a few long rows spread over clusters).
#define NORM_ROWS(T, VPT)                                                                                    \
    template __global__ void layernorm_rows<T, VPT>(const T*, const T*, const T*, T*, int, int, int, float); \
    template __global__ void rmsnorm_rows<T, VPT>(const T*, const T*, T*, int, int, int, float);
#define NORM_CLUSTER(T, C, VPT)                                                                                   \
    template __global__ void layernorm_rows_cluster<T, C, VPT>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void rmsnorm_rows_cluster<T, C, VPT>(const T*, const T*, T*, int, int, float);
#define NORMS(T)                                                                                              \
    NORM_ROWS(T, 1) NORM_ROWS(T, 2) NORM_ROWS(T, 4) NORM_ROWS(T, 8)                                           \
    NORM_CLUSTER(T, 2, 8) NORM_CLUSTER(T, 4, 8) NORM_CLUSTER(T, 8, 8)
NORMS(float)
NORMS(__nv_bfloat16)
NORM_CLUSTER(__nv_bfloat16, 2, 4) NORM_CLUSTER(__nv_bfloat16, 4, 4) NORM_CLUSTER(__nv_bfloat16, 8, 4)   // few rows
