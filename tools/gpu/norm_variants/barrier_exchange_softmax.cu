// The notebook's softmax_kernels cell as it was before session 8 (commit c830cb4): the cluster's blocks exchange their
// statistics through barrier.cluster (arrive.release, wait.acquire) and mapa loads. Kept for
// tools/gpu/try_exchange.py, which times it against the cell's st.async exchange in the same run.
// Row softmax with the row held in registers: one read and one write of every element.
// A row is cut into 16-byte packs (4 float or 8 bf16/half), counted from the 16-byte boundary at or before its
// first element; thread t of the row's threads holds packs t, t + row_threads, ... (VPT of them). Rows that fit in
// one block take a warp (several rows per block) or a block; longer rows are split over a cluster of blocks that
// meet through distributed shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define NEG_INF __uint_as_float(0xff800000u)   // -infinity (NVRTC has no INFINITY macro)
#define NAN_F __uint_as_float(0x7fffffffu)

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// ---- a thread's share of a row: VPT packs of 16 bytes in registers, and one edge element ----------------------
// A pack is kept as its four 32-bit words, so that 8 bf16 or fp16 values take 4 registers (an array of 8
// __nv_bfloat16 would take 8); get(k) widens value k to fp32 where it is used, from_floats packs VEC results.
template <typename T> struct alignas(16) Pack {
    unsigned u[4];
    __device__ __forceinline__ float get(int k) const;
};
template <> __device__ __forceinline__ float Pack<float>::get(int k) const { return __uint_as_float(u[k]); }
template <> __device__ __forceinline__ float Pack<__nv_bfloat16>::get(int k) const {
    return __uint_as_float(k % 2 ? u[k / 2] & 0xffff0000u : u[k / 2] << 16);    // a bf16 is an fp32's top half
}
template <> __device__ __forceinline__ float Pack<__half>::get(int k) const {
    return __half2float(__ushort_as_half((unsigned short)(k % 2 ? u[k / 2] >> 16 : u[k / 2] & 0xffffu)));
}
template <typename T> __device__ __forceinline__ unsigned bits16(float v) {
    T h = from_float<T>(v);
    return *reinterpret_cast<const unsigned short*>(&h);
}
template <typename T, int VEC = 16 / sizeof(T)>
__device__ __forceinline__ Pack<T> from_floats(const float (&f)[VEC]) {
    Pack<T> p;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        p.u[i] = sizeof(T) == 4 ? __float_as_uint(f[i]) : bits16<T>(f[2 * i]) | bits16<T>(f[2 * i + 1]) << 16;
    return p;
}
template <typename T> __device__ __forceinline__ unsigned neg_inf_word() {    // a 32-bit word of -inf values
    return sizeof(T) == 4 ? 0xff800000u : bits16<T>(NEG_INF) * 0x10001u;
}
template <typename T> struct Pair { typedef float2 type; };                 // two 16-bit values in one word
template <> struct Pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct Pair<__half> { typedef __half2 type; };
template <typename T> __device__ __forceinline__ typename Pair<T>::type as_pair(unsigned w) {
    return *reinterpret_cast<const typename Pair<T>::type*>(&w);
}

// exp(x) as one FMUL and one MUFU.EX2: __expf without -use_fast_math adds four instructions per call to keep
// results under 2^-126 (denormals) exact; those are below anything a softmax output resolves, so flush them.
__device__ __forceinline__ float exp_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
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
// packs past the row's last whole pack read as -inf.
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
            for (int i = 0; i < 4; ++i) pk[j].u[i] = neg_inf_word<T>();
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

// ---- clusters: PTX for what cooperative_groups would do ------------------------------------------------------
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive() {       // release: this block's shared writes are visible...
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {         // ...to every block of the cluster once all arrived
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
template <typename T>                                    // where *p lives in the shared memory of block `rank`
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
    unsigned long long in = reinterpret_cast<unsigned long long>(p), out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(in), "r"(rank));
    return reinterpret_cast<const T*>(out);
}

// ---- the reduction: (max, sum of exp(x - max)) pairs, merged across the warp, the row's warps, the cluster ----
struct MaxSum { float m, s; };
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    float shift = m == NEG_INF ? 0.0f : m;             // all -inf so far: sums stay 0 (exp(-inf - -inf) is NaN)
    return {m, a.s * exp_ftz(a.m - shift) + b.s * exp_ftz(b.m - shift)};
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {     // every lane ends with the same pair
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
    return v;
}

// Merge the pairs of the row's threads: warp shuffles, then (row_warps > 1) the row's warps through shared
// memory, then (CLUSTER > 1) the cluster's blocks through distributed shared memory. Every thread gets the result.
template <int CLUSTER>
__device__ __forceinline__ MaxSum row_merge(MaxSum v, int row_warps) {
    __shared__ MaxSum warp_part[32];
    __shared__ MaxSum block_part;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (row_warps > 1) {                                 // the same for the whole block: no divergent barrier
        if (lane == 0) warp_part[warp] = v;
        __syncthreads();
        int first = warp - warp % row_warps;         // the row's first warp; each warp merges the row's pairs
        v = warp_merge(lane < row_warps ? warp_part[first + lane] : MaxSum{NEG_INF, 0.0f});
    }
    if (CLUSTER > 1) {
        if (threadIdx.x == 0) block_part = v;
        cluster_arrive();                                 // block_part is written...
        cluster_wait();                                   // ...in every block of the cluster
        MaxSum other = lane < CLUSTER ? *cluster_map(&block_part, lane) : MaxSum{NEG_INF, 0.0f};
        cluster_arrive();                                 // done reading the others' block_part (waited on at exit)
        v = warp_merge(other);
    }
    return v;
}

// Softmax of this thread's values, in place: VPT packs of VEC (packs past the row hold -inf and contribute 0) and
// `edge`, one more element (-inf where the thread has none). Up to 32 values a thread, the sum pass keeps
// exp(x - m) for this thread's own max m in fp32 registers and the output rescales it by exp(m - row max) / row
// sum: one exp per element. 64 values (8 packs of bf16 or fp16) would need 64 registers for those exps alone, so
// there the values stay packed and the output computes the same exp again: two exps per element, still far from
// the limit of the special-function units at 2 bytes an element.
template <typename T, int VPT, int CLUSTER, typename Pair2 = typename Pair<T>::type>
__device__ __forceinline__ void softmax_values(Pack<T> (&pk)[VPT], float& edge, int row_warps) {
    constexpr int VEC = 16 / sizeof(T), N = VPT * VEC;
    constexpr bool KEEP = N <= 32;                       // the exps fit in registers
    float m = edge;
    if constexpr (sizeof(T) == 2) {                      // bf16 / fp16: max of pairs (HMNMX2), no widening
        Pair2 mm = as_pair<T>(pk[0].u[0]);
#pragma unroll
        for (int i = 1; i < 4 * VPT; ++i) mm = __hmax2(mm, as_pair<T>(pk[i / 4].u[i % 4]));
        m = fmaxf(m, fmaxf(to_float(mm.x), to_float(mm.y)));
    } else {
#pragma unroll
        for (int j = 0; j < VPT; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) m = fmaxf(m, pk[j].get(k));
    }
    float shift = m == NEG_INF ? 0.0f : m;               // all -inf here: exp(x - 0) = 0, not exp(-inf - -inf) = NaN
    edge = exp_ftz(edge - shift);
    float s = edge;
    float e[KEEP ? N : 1];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        float ei = exp_ftz(pk[i / VEC].get(i % VEC) - shift);
        if constexpr (KEEP) e[i] = ei;
        s += ei;
    }
    MaxSum r = row_merge<CLUSTER>({m, s}, row_warps);
    float scale = r.m == NEG_INF || r.m == -NEG_INF ? NAN_F   // a row of -inf, or one holding +inf: NaN
                                                         // everywhere (torch's sum is NaN there)
                : m == NEG_INF ? 0.0f                    // this thread's elements are all -inf: 0
                : exp_ftz(m - r.m) / r.s;
    // Packed values: exp(x - row max) / row sum directly (x = -inf gives 0; a NaN row max or sum, NaN). Written
    // as the sum pass's exp(x - m) times scale, the compiler would keep those 64 exps from the sum pass: spills.
    float inv = isnan(scale) ? NAN_F : 1.0f / r.s;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        float f[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            if constexpr (KEEP) f[k] = e[j * VEC + k] * scale;
            else f[k] = exp_ftz(pk[j].get(k) - r.m) * inv;
        }
        pk[j] = from_floats<T>(f);
    }
    edge *= scale;
}

// Rows that fit in a block: row_threads (32, 64, ..., 1024) threads per row, blockDim.x / row_threads rows per
// block. x, y: [rows, cols], 16-byte aligned. Grid: ceil(rows / rows per block). With 64 values a thread (8 packs
// of bf16/fp16: rows over 8 KB, at least 128 threads each) the plan gives every row its own block.
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_rows(const T* __restrict__ x, T* __restrict__ y, int rows, int cols,
                                                     int row_threads) {
    constexpr int VEC = 16 / sizeof(T);
    if (VPT * VEC > 32) row_threads = blockDim.x;        // known to be one row a block: 4 registers fewer
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;                              // a last block's spare rows still meet at the barrier
    size_t start = (size_t)(live ? row : 0) * cols;
    RowLayout L(live ? cols : 0, (int)(start % VEC), VEC);
    Pack<T> pk[VPT];
    load_packs(pk, x + start, L, t, row_threads);
    int e = L.edge(t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[start + e]) : NEG_INF;
    softmax_values<T, VPT, 1>(pk, edge, row_threads / 32);
    if (live) store_packs(pk, y + start, L, t, row_threads);
    if (e >= 0) y[start + e] = from_float<T>(edge);
}

// Rows split over a cluster of CLUSTER blocks: block rank r holds packs r * blockDim.x * VPT + (0 .. blockDim.x * VPT).
// Grid: rows * CLUSTER blocks.
template <typename T, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
softmax_rows_cluster(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    constexpr int VEC = 16 / sizeof(T), VPT = 8;         // 128 bytes per thread: 32 float or 64 bf16/fp16 values
    int row = blockIdx.x / CLUSTER;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    size_t start = (size_t)row * cols;
    RowLayout L(cols, (int)(start % VEC), VEC);
    Pack<T> pk[VPT];
    load_packs(pk, x + start, L, first, blockDim.x);
    int e = first < 2 * VEC ? L.edge(first, cols) : -1;  // edge elements go to the first threads of rank 0
    float edge = e >= 0 ? to_float(x[start + e]) : NEG_INF;
    softmax_values<T, VPT, CLUSTER>(pk, edge, blockDim.x / 32);
    store_packs(pk, y + start, L, first, blockDim.x);
    if (e >= 0) y[start + e] = from_float<T>(edge);
    cluster_wait();                                      // no block leaves while another may read its block_part
}

#define ROWS(T) template __global__ void softmax_rows<T, 1>(const T*, T*, int, int, int); \
                template __global__ void softmax_rows<T, 2>(const T*, T*, int, int, int); \
                template __global__ void softmax_rows<T, 4>(const T*, T*, int, int, int); \
                template __global__ void softmax_rows<T, 8>(const T*, T*, int, int, int); \
                template __global__ void softmax_rows_cluster<T, 2>(const T*, T*, int, int); \
                template __global__ void softmax_rows_cluster<T, 4>(const T*, T*, int, int); \
                template __global__ void softmax_rows_cluster<T, 8>(const T*, T*, int, int);
ROWS(float)
ROWS(__nv_bfloat16)
ROWS(__half)
