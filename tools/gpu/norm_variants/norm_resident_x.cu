
// ---- session 9 candidate: norm_resident_x, session 7's resident clusters with the st.async exchange --------------
// Measured on an H100 (session 9 run G, benchmarks/NOTES-memory-bound.md): slower than the cell's one-row-a-cluster
// plans (LayerNorm bf16 1024 x 262144 483-526 µs against 407, fp32 1053 against 778; RMSNorm a tie at best): the
// resident block stops all its warps at each of a row's barriers, where the cell's 2-4 independent blocks an SM
// overlap each other's. Kept as a candidate with its emulator tests.
// Appended to the notebook's norm_kernels cell by tools/gpu/try_norms.py (family "resx"). Session 7's norm_resident
// (norm_resident.cu, replaced by this file; git history: a cluster keeps its slice of w and b in shared memory and
// takes rows in turn, the next row's x loaded under this row's work) measured 0.56-0.87x the one-row-a-cluster
// plans; the suspect was its one
// barrier.cluster a row, whose arrive.release waits for the thread's outstanding loads (the prefetch) and stores.
// Session 8's exchange has no such fence: each block pushes its row statistic into the others' shared memory with
// st.async, counted on their mbarriers. Here the slots and the mbarrier are double-buffered by row parity: a block
// pushes row i + 2's statistic only after it has every block's row i + 1 statistic, which each block sends only
// after reading row i's slots, so a slot is never overwritten before it is read. After its wait a block re-arms
// that parity's mbarrier for row i + 2 (one arrival with the byte count; pushes that come first count the bytes down
// below zero, which PTX allows while the arrival is pending). Statistics in a block: the cell's two plain sums
// (LayerNorm) or sum of squares (RMSNorm), block_merge as in the cell; Chan's merge across the cluster.
// Launch: grid = clusters x CLUSTER (clusters: Kernel.max_active_clusters), blockDim.x threads x VPT = 4 packs,
// dynamic shared memory (LN ? 2 : 1) x 4 x blockDim.x x 16 bytes; cols % (16 / sizeof(T)) == 0 and
// cols / VEC <= CLUSTER x blockDim.x x 4.
__device__ __forceinline__ void exchange_arm(unsigned long long* bar, unsigned bytes) {   // the next phase expects
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"                 // `bytes` (one arrival)
                 :: "r"(shared_addr(bar)), "r"(bytes) : "memory");
}
template <typename S, int CLUSTER>
struct RowExchange {                                     // double-buffered by row parity
    S part[2][CLUSTER];
    unsigned long long bar[2];
};
template <typename S, int CLUSTER>
__device__ __forceinline__ RowExchange<S, CLUSTER>& row_exchange() {
    __shared__ RowExchange<S, CLUSTER> ex;
    return ex;
}
template <bool LN> struct ResidentStat { using type = float; };
template <> struct ResidentStat<true> { using type = Welford; };

// Row `it` (this cluster's it-th row) of the cluster's statistic: every thread holds its block's v.
template <int CLUSTER, typename S>
__device__ __forceinline__ S resident_cluster_merge(S v, S zero, int it) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, p = it & 1;
    RowExchange<S, CLUSTER>& ex = row_exchange<S, CLUSTER>();
    unsigned me = cluster_ctarank();
    if (warp == 0 && lane < CLUSTER && lane != (int)me) exchange_push(&ex.part[p][me], v, &ex.bar[p], lane);
    if (warp == 0) {
        exchange_wait(&ex.bar[p], (it >> 1) & 1);         // this parity's (it / 2)-th phase
        if (lane == 0) exchange_arm(&ex.bar[p], (CLUSTER - 1) * sizeof(S));   // for row it + 2
    }
    __syncthreads();
    return warp_merge(lane < CLUSTER ? (lane == (int)me ? v : ex.part[p][lane]) : zero);
}

template <bool LN, int CLUSTER, typename T, int VPT>
__device__ __forceinline__ void resident_row_x(const Pack<T> (&pk)[VPT], const Pack<T>* wb, T* __restrict__ y,
                                               int cols, int whole, int first, int it, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    const int stride = blockDim.x, row_warps = blockDim.x / 32;
    int valid = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) valid += first + j * stride < whole;
    float mean = 0.0f, var;
    if constexpr (LN) {
        float s = 0.0f;                                   // packs past the row were loaded as 0
#pragma unroll
        for (int i = 0; i < VPT * VEC; ++i) s += at(pk, i);
        SumCount sn = block_merge<0>(SumCount{s, float(valid * VEC)}, SumCount{0.0f, 0.0f}, row_warps);
        float m = sn.n > 0.0f ? sn.s / sn.n : 0.0f, m2 = 0.0f;
        keep_packed(pk);
        if (valid == VPT) {
#pragma unroll
            for (int i = 0; i < VPT * VEC; ++i) {
                float d = at(pk, i) - m;
                m2 = fmaf(d, d, m2);
            }
        } else {
#pragma unroll
            for (int j = 0; j < VPT; ++j) {
                if (j >= valid) continue;
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = at(pk, j * VEC + k) - m;
                    m2 = fmaf(d, d, m2);
                }
            }
        }
        keep_packed(pk);
        m2 = block_merge<1>(m2, 0.0f, row_warps);
        Welford st = resident_cluster_merge<CLUSTER>(Welford{sn.n, m, m2}, Welford{0.0f, 0.0f, 0.0f}, it);
        mean = st.mean;
        var = st.m2 / cols;
    } else {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT * VEC; ++i) ss += at(pk, i) * at(pk, i);
        ss = resident_cluster_merge<CLUSTER>(block_merge<0>(ss, 0.0f, row_warps), 0.0f, it);
        var = ss / cols;
    }
    float rstd = rsqrtf(var + eps);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        if (j >= valid) continue;
        Pack<T> wk = wb[j * stride + threadIdx.x];
        Pack<T> bk = LN ? wb[(VPT + j) * stride + threadIdx.x] : wk;
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out[k] = LN ? fmaf((at(pk, j * VEC + k) - mean) * rstd, wk.get(k), bk.get(k))
                        : at(pk, j * VEC + k) * rstd * wk.get(k);
        yp[first + j * stride] = from_floats<T>(out);
    }
}

template <bool LN, typename T, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024, 1)
norm_resident_x(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                int rows, int cols, float eps) {
    using S = typename ResidentStat<LN>::type;
    constexpr int VEC = 16 / sizeof(T), VPT = 4;
    extern __shared__ __align__(16) unsigned char resident_smem[];
    Pack<T>* wb = reinterpret_cast<Pack<T>*>(resident_smem);   // [VPT][blockDim.x] of w, then (LN) of b
    RowExchange<S, CLUSTER>& ex = row_exchange<S, CLUSTER>();
    if (threadIdx.x == 0) {                               // both parities expect the other blocks' first bytes
        exchange_init(&ex.bar[0], (CLUSTER - 1) * sizeof(S));
        exchange_init(&ex.bar[1], (CLUSTER - 1) * sizeof(S));
    }
    cluster_arrive_relaxed();
    const int clusters = gridDim.x / CLUSTER, whole = cols / VEC;
    const int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    const RowLayout L(cols, 0, VEC);                      // lead 0: rows start on 16-byte boundaries
    Pack<T> xa[VPT], xb[VPT];                             // this row and the next
    int row = blockIdx.x / CLUSTER;
    if (row < rows) load_packs(xa, x + (size_t)row * cols, L, first, blockDim.x);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {                       // this thread's packs of w and b, once for all rows
        int q = first + j * blockDim.x;
        if (q >= whole) continue;
        wb[j * blockDim.x + threadIdx.x] = reinterpret_cast<const Pack<T>*>(w)[q];
        if (LN) wb[(VPT + j) * blockDim.x + threadIdx.x] = reinterpret_cast<const Pack<T>*>(b)[q];
    }
    cluster_wait();                                       // every block's mbarriers are ready
    int it = 0;
    while (row < rows) {
        int next = row + clusters;
        if (next < rows) load_packs(xb, x + (size_t)next * cols, L, first, blockDim.x);   // under row's work
        resident_row_x<LN, CLUSTER>(xa, wb, y + (size_t)row * cols, cols, whole, first, it++, eps);
        if (next >= rows) break;
        row = next + clusters;
        if (row < rows) load_packs(xa, x + (size_t)row * cols, L, first, blockDim.x);
        resident_row_x<LN, CLUSTER>(xb, wb, y + (size_t)next * cols, cols, whole, first, it++, eps);
    }
}
#define RESIDENT_X(C)                                                                                             \
    template __global__ void norm_resident_x<true, float, C>(const float*, const float*, const float*, float*, int, \
                                                             int, float);                                        \
    template __global__ void norm_resident_x<false, float, C>(const float*, const float*, const float*, float*,   \
                                                              int, int, float);                                   \
    template __global__ void norm_resident_x<true, __nv_bfloat16, C>(const __nv_bfloat16*, const __nv_bfloat16*, \
                                                                     const __nv_bfloat16*, __nv_bfloat16*, int,   \
                                                                     int, float);                                 \
    template __global__ void norm_resident_x<false, __nv_bfloat16, C>(const __nv_bfloat16*,                      \
                                                                      const __nv_bfloat16*, const __nv_bfloat16*, \
                                                                      __nv_bfloat16*, int, int, float);
RESIDENT_X(3) RESIDENT_X(8) RESIDENT_X(16)
