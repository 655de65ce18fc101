// notebooks/04-layernorm.py's norm_kernels cell at commit 95f39db (before the early w/b loads), for tools/gpu/try_norms.py
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
template <typename T> struct alignas(16) Pack { T v[16 / sizeof(T)]; };

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
// packs past the row's last whole pack read as `fill`.
template <typename T, int VPT>
__device__ __forceinline__ void load_packs(Pack<T> (&pk)[VPT], const T* __restrict__ row, RowLayout L, int first,
                                           int stride, T fill) {
    constexpr int VEC = 16 / sizeof(T);
    const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(row + L.lead);      // 16-byte aligned
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q < L.whole) {
            pk[j] = packs[q];
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) pk[j].v[k] = fill;
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

template <typename T, int VPT, int VEC = 16 / sizeof(T)>
__device__ __forceinline__ void unpack(const Pack<T> (&pk)[VPT], float (&v)[VPT * VEC]) {
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[j * VEC + k] = to_float(pk[j].v[k]);
}
template <typename T, int VPT, int VEC = 16 / sizeof(T)>
__device__ __forceinline__ void pack(const float (&v)[VPT * VEC], Pack<T> (&pk)[VPT]) {
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) pk[j].v[k] = from_float<T>(v[j * VEC + k]);
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
    __shared__ S block_part;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (row_warps > 1) {
        if (lane == 0) warp_part[warp] = v;
        __syncthreads();
        int first = warp - warp % row_warps;
        v = warp_merge(lane < row_warps ? warp_part[first + lane] : zero);
    }
    if (CLUSTER > 1) {
        if (threadIdx.x == 0) block_part = v;
        cluster_arrive();
        cluster_wait();
        S other = lane < CLUSTER ? *cluster_map(&block_part, lane) : zero;
        cluster_arrive();                                 // done reading the others' block_part (waited on at exit)
        v = warp_merge(other);
    }
    return v;
}

// ---- the normalisations of this thread's values ---------------------------------------------------------------
// LayerNorm's statistics from this thread's values: its own mean first, then squared deviations from it (the
// values are in registers, so two passes cost nothing), then Chan's merge across the row. `valid` counts packs.
template <int CLUSTER, int VPT, int VEC>
__device__ __forceinline__ Welford layernorm_stats(const float (&v)[VPT * VEC], int valid, bool edge_ok, float edge,
                                                   int row_warps) {
    float s = edge_ok ? edge : 0.0f;                      // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) s += v[i];
    float n = valid * VEC + (edge_ok ? 1.0f : 0.0f);
    float mean = n > 0.0f ? s / n : 0.0f;
    float m2 = edge_ok ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float d = v[j * VEC + k] - mean;
            m2 += j < valid ? d * d : 0.0f;
        }
    return row_merge<CLUSTER>(Welford{n, mean, m2}, Welford{0.0f, 0.0f, 0.0f}, row_warps);
}

// y = (x - mean) * rstd * w + b for this thread's packs (w, b packs: 16-byte loads where the row's packs are
// 16-byte aligned in w too, that is when the row starts on a boundary; element loads otherwise), then the store.
template <typename T, int VPT>
__device__ __forceinline__ void affine_store(const float (&v)[VPT * (16 / sizeof(T))], float mean, float rstd,
                                             const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ row,
                                             RowLayout L, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        int e = L.lead + q * VEC;                        // the pack's first row element
        Pack<T> wk, bk, out;
        if (L.lead == 0) {
            wk = *reinterpret_cast<const Pack<T>*>(w + e);
            bk = *reinterpret_cast<const Pack<T>*>(b + e);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                wk.v[k] = w[e + k];
                bk.v[k] = b[e + k];
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out.v[k] = from_float<T>(fmaf((v[j * VEC + k] - mean) * rstd, to_float(wk.v[k]), to_float(bk.v[k])));
        *reinterpret_cast<Pack<T>*>(row + e) = out;
    }
}

template <typename T, int VPT>
__device__ __forceinline__ void rms_store(const float (&v)[VPT * (16 / sizeof(T))], float rstd,
                                          const T* __restrict__ w, T* __restrict__ row, RowLayout L, int first,
                                          int stride) {
    constexpr int VEC = 16 / sizeof(T);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        int q = first + j * stride;
        if (q >= L.whole) continue;
        int e = L.lead + q * VEC;
        Pack<T> wk, out;
        if (L.lead == 0) {
            wk = *reinterpret_cast<const Pack<T>*>(w + e);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) wk.v[k] = w[e + k];
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[j * VEC + k] * rstd * to_float(wk.v[k]));
        *reinterpret_cast<Pack<T>*>(row + e) = out;
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
    Pack<T> pk[VPT];
    load_packs(pk, x, L, first, stride, from_float<T>(0.0f));
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    float v[VPT * VEC];
    unpack(pk, v);
    int valid = min(VPT, max(0, (L.whole - first + stride - 1) / stride));   // packs j with first + j*stride < whole
    Welford st = layernorm_stats<CLUSTER, VPT, VEC>(v, valid, e >= 0, edge, row_warps);
    float rstd = rsqrtf(st.m2 / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(fmaf((edge - st.mean) * rstd, to_float(w[e]), to_float(b[e])));
    affine_store<T, VPT>(v, st.mean, rstd, w, b, y, L, first, stride);
}

template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void rmsnorm_row(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                            int cols, bool live, int head, int first, int stride, int edge_t,
                                            int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    Pack<T> pk[VPT];
    load_packs(pk, x, L, first, stride, from_float<T>(0.0f));
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    float v[VPT * VEC];
    unpack(pk, v);
    float ss = edge * edge;                              // packs past the row hold 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) ss += v[i] * v[i];
    ss = row_merge<CLUSTER>(ss, 0.0f, row_warps);
    float rstd = rsqrtf(ss / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(edge * rstd * to_float(w[e]));
    rms_store<T, VPT>(v, rstd, w, y, L, first, stride);
}

// ---- the kernels: rows that fit in a block (row_threads threads per row, blockDim.x / row_threads rows per
// block; grid = ceil(rows / rows per block)), and rows split over a cluster (grid = rows * CLUSTER) ----------
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

template <typename T, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
layernorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, int rows, int cols, float eps) {
    constexpr int VPT = 32 / (16 / sizeof(T));
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                   blockDim.x, first, blockDim.x / 32, eps);
    cluster_wait();                                      // no block leaves while another may read its block_part
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

template <typename T, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_rows_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                     float eps) {
    constexpr int VPT = 32 / (16 / sizeof(T));
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    rmsnorm_row<T, VPT, CLUSTER>(x + start, w, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                 blockDim.x, first, blockDim.x / 32, eps);
    cluster_wait();
}

#define NORMS(T)                                                                                              \
    template __global__ void layernorm_rows<T, 1>(const T*, const T*, const T*, T*, int, int, int, float);   \
    template __global__ void layernorm_rows<T, 2>(const T*, const T*, const T*, T*, int, int, int, float);   \
    template __global__ void layernorm_rows<T, 4>(const T*, const T*, const T*, T*, int, int, int, float);   \
    template __global__ void layernorm_rows_cluster<T, 2>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void layernorm_rows_cluster<T, 4>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void layernorm_rows_cluster<T, 8>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void rmsnorm_rows<T, 1>(const T*, const T*, T*, int, int, int, float);               \
    template __global__ void rmsnorm_rows<T, 2>(const T*, const T*, T*, int, int, int, float);               \
    template __global__ void rmsnorm_rows<T, 4>(const T*, const T*, T*, int, int, int, float);               \
    template __global__ void rmsnorm_rows_cluster<T, 2>(const T*, const T*, T*, int, int, float);            \
    template __global__ void rmsnorm_rows_cluster<T, 4>(const T*, const T*, T*, int, int, float);            \
    template __global__ void rmsnorm_rows_cluster<T, 8>(const T*, const T*, T*, int, int, float);
NORMS(float)
NORMS(__nv_bfloat16)
template __global__ void layernorm_rows<float, 8>(const float*, const float*, const float*, float*, int, int, int,
                                                  float);       // 32 values per thread
template __global__ void rmsnorm_rows<float, 8>(const float*, const float*, float*, int, int, int, float);
