// ---- candidate "pipe" (issue 14, session 5): tools/gpu/try_norms.py appends this file to the notebook's
// norm_kernels cell (after norm_persistent.cu) and uses the cell's helpers. -----------------------------------
// The cell's kernels at 8 packs a thread read w (and b) after the reduction one pack at a time: the SASS of
// layernorm_rows_cluster<float, 2, 8> is 8 rounds of {LDG w[j], LDG b[j], wait, FMAs, STG y[j]}, 8 L2 round trips
// in a row (about 0.6-0.8 us each under load) while the thread has nothing else in flight. Here the late packs of
// w and b go through a ring of DEPTH slots: DEPTH packs of each are in flight before the first store, and the load
// of pack j + DEPTH is issued as soon as pack j is stored, so the 8 round trips become about 8 / DEPTH. Registers:
// x's 8 packs (32) plus DEPTH packs of w and of b (8 DEPTH for LayerNorm, 4 DEPTH for RMSNorm), under the 64 a
// 1024-thread block allows. Same statistics, same plans, same numerics as the cell.
// The ring runs on rows whose packs are 16-byte aligned in w and b (lead == 0) where all of this thread's VPT
// packs lie in the row (every thread of the large shapes): no per-pack guards or element loads to keep registers
// for. Other threads take the cell's affine_store / rms_store (one pack at a time), as before.
template <bool LN, int DEPTH, typename T, int VPT>
__device__ __forceinline__ void pipe_store(const Pack<T> (&pk)[VPT], float mean, float rstd,
                                           const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ row,
                                           RowLayout L, int first, int stride) {
    constexpr int VEC = 16 / sizeof(T);
    if (L.lead != 0 || first + (VPT - 1) * stride >= L.whole) {
        Pack<T> wk[VPT], bk[VPT];
        if (LN) affine_store(pk, wk, bk, false, false, mean, rstd, w, b, row, L, first, stride);
        else rms_store(pk, wk, false, rstd, w, row, L, first, stride);
        return;
    }
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w) + first;      // this thread's pack 0; pack j: + j stride
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b) + first;
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(row) + first;                // lead == 0: packs start at the row
    Pack<T> wr[DEPTH], br[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH && j < VPT; ++j) {         // the first DEPTH packs of w and b, all in flight
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

template <typename T, int VPT, int CLUSTER, int DEPTH>
__device__ __forceinline__ void layernorm_row_pipe(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, int cols, bool live,
                                                   int head, int first, int stride, int edge_t, int row_warps,
                                                   float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    Pack<T> pk[VPT];
    load_packs(pk, x, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    int valid = min(VPT, max(0, (L.whole - first + stride - 1) / stride));
    Welford st = layernorm_stats<CLUSTER>(pk, valid, e >= 0, edge, row_warps);
    float rstd = rsqrtf(st.m2 / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(fmaf((edge - st.mean) * rstd, to_float(w[e]), to_float(b[e])));
    pipe_store<true, DEPTH>(pk, st.mean, rstd, w, b, y, L, first, stride);
}

template <typename T, int VPT, int CLUSTER, int DEPTH>
__device__ __forceinline__ void rmsnorm_row_pipe(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                                 int cols, bool live, int head, int first, int stride, int edge_t,
                                                 int row_warps, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(live ? cols : 0, head, VEC);
    Pack<T> pk[VPT];
    load_packs(pk, x, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    float ss = edge * edge;
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) ss += at(pk, i) * at(pk, i);
    ss = row_merge<CLUSTER>(ss, 0.0f, row_warps);
    float rstd = rsqrtf(ss / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(edge * rstd * to_float(w[e]));
    pipe_store<false, DEPTH>(pk, 0.0f, rstd, w, w, y, L, first, stride);
}

// The launches are the cell's: layernorm_rows_pipe<T, VPT, DEPTH> as layernorm_rows<T, VPT> (grid, block,
// row_threads), layernorm_rows_cluster_pipe<T, C, VPT, DEPTH> as layernorm_rows_cluster<T, C, VPT>.
template <typename T, int VPT, int DEPTH>
__global__ void __launch_bounds__(1024) layernorm_rows_pipe(const T* __restrict__ x, const T* __restrict__ w,
                                                            const T* __restrict__ b, T* __restrict__ y, int rows,
                                                            int cols, int row_threads, float eps) {
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row_pipe<T, VPT, 1, DEPTH>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))), t,
                                         row_threads, t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT, int DEPTH>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
layernorm_rows_cluster_pipe(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, int rows, int cols, float eps) {
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row_pipe<T, VPT, CLUSTER, DEPTH>(x + start, w, b, y + start, cols, true,
                                               (int)(start % (16 / sizeof(T))), first, blockDim.x, first,
                                               blockDim.x / 32, eps);
    cluster_wait();
}

template <typename T, int VPT, int DEPTH>
__global__ void __launch_bounds__(1024) rmsnorm_rows_pipe(const T* __restrict__ x, const T* __restrict__ w,
                                                          T* __restrict__ y, int rows, int cols, int row_threads,
                                                          float eps) {
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    rmsnorm_row_pipe<T, VPT, 1, DEPTH>(x + start, w, y + start, cols, live, (int)(start % (16 / sizeof(T))), t,
                                       row_threads, t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT, int DEPTH>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_rows_cluster_pipe(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                          float eps) {
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    rmsnorm_row_pipe<T, VPT, CLUSTER, DEPTH>(x + start, w, y + start, cols, true, (int)(start % (16 / sizeof(T))),
                                             first, blockDim.x, first, blockDim.x / 32, eps);
    cluster_wait();
}

#define PIPE_LN(T, VPT, D)                                                                                          \
    template __global__ void layernorm_rows_pipe<T, VPT, D>(const T*, const T*, const T*, T*, int, int, int, float); \
    template __global__ void layernorm_rows_cluster_pipe<T, 2, VPT, D>(const T*, const T*, const T*, T*, int, int,  \
                                                                         float);                                     \
    template __global__ void layernorm_rows_cluster_pipe<T, 4, VPT, D>(const T*, const T*, const T*, T*, int, int,  \
                                                                         float);
#define PIPE_RMS(T, VPT, D)                                                                                         \
    template __global__ void rmsnorm_rows_pipe<T, VPT, D>(const T*, const T*, T*, int, int, int, float);            \
    template __global__ void rmsnorm_rows_cluster_pipe<T, 2, VPT, D>(const T*, const T*, T*, int, int, float);      \
    template __global__ void rmsnorm_rows_cluster_pipe<T, 4, VPT, D>(const T*, const T*, T*, int, int, float);
PIPE_LN(float, 8, 2)
PIPE_RMS(float, 8, 4)
// DEPTH 3 gave the same SASS as 2 (ptxas issues the later packs as x's registers free up): about 3 waits for
// LayerNorm's 16 late loads, 2 for RMSNorm's 8; 64 and 62 registers, no spills.
