
// ---- extra variants: tools/gpu/try_norms.py appends this file to the notebook's norm_kernels cell ---------------
// A persistent grid: each block (or cluster) keeps its columns' w and b packs in registers, read once, and loops
// over rows group, group + groups, ...; the next row's x packs are loaded before the current row is reduced, so
// a thread always has a row's loads in flight. Needs cols % VEC == 0 (every row starts on a 16-byte boundary:
// the same packs in every row, no edge elements); the launcher falls back otherwise.
// Shared partials are double-buffered by iteration parity, so one barrier (or cluster barrier) per row suffices.

template <int CLUSTER, typename S>
__device__ __forceinline__ S row_merge_loop(S v, S zero, int row_warps, int parity) {
    __shared__ S warp_part[2][32];
    __shared__ S block_part[2];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (row_warps > 1) {
        if (lane == 0) warp_part[parity][warp] = v;
        __syncthreads();
        int first = warp - warp % row_warps;
        v = warp_merge(lane < row_warps ? warp_part[parity][first + lane] : zero);
    }
    if (CLUSTER > 1) {
        if (threadIdx.x == 0) block_part[parity] = v;
        cluster_arrive();
        cluster_wait();
        v = warp_merge(lane < CLUSTER ? *cluster_map(&block_part[parity], lane) : zero);
    }
    return v;
}

// LN: LayerNorm (w, b) or RMSNorm (w only). Rows per group: CLUSTER > 1: one row per cluster; else
// blockDim.x / row_threads rows per block. grid: groups * CLUSTER blocks (any number: groups loop over rows).
template <typename T, int VPT, int CLUSTER, bool LN>
__device__ __forceinline__ void norm_persistent(const T* __restrict__ x, const T* __restrict__ w,
                                                const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                                int row_threads, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    RowLayout L(cols, 0, VEC);                            // lead 0, whole = cols / VEC, no tail (cols % VEC == 0)
    int rank = CLUSTER > 1 ? (int)cluster_ctarank() : 0;
    int group = blockIdx.x / CLUSTER, groups = gridDim.x / CLUSTER;
    int per_group = CLUSTER > 1 ? 1 : blockDim.x / row_threads;
    int sub = CLUSTER > 1 ? 0 : threadIdx.x / row_threads;
    int stride = CLUSTER > 1 ? blockDim.x : row_threads;
    int first = CLUSTER > 1 ? rank * blockDim.x * VPT + threadIdx.x : threadIdx.x % row_threads;
    int row_warps = stride / 32;
    Pack<T> wk[VPT], bk[VPT], cur[VPT], nxt[VPT];
    load_vector(wk, w, L, first, stride);
    if (LN) load_vector(bk, b, L, first, stride);
    int base = group * per_group, step = groups * per_group;
    {
        int row = base + sub;
        load_packs(cur, x + (size_t)(row < rows ? row : 0) * cols, row < rows ? L : RowLayout(0, 0, VEC), first,
                   stride);
    }
    int valid = min(VPT, max(0, (L.whole - first + stride - 1) / stride));
    for (int it = 0; base < rows; base += step, ++it) {   // base is uniform across the block and the cluster
        int row = base + sub, next = row + step;
        bool live = row < rows;
        load_packs(nxt, x + (size_t)(next < rows ? next : 0) * cols, next < rows ? L : RowLayout(0, 0, VEC), first,
                   stride);
        T* out = y + (size_t)(live ? row : 0) * cols;
        if (LN) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT * VEC; ++i) s += at(cur, i);
            float n = valid * VEC;
            float mean = n > 0.0f ? s / n : 0.0f, m2 = 0.0f;
#pragma unroll
            for (int j = 0; j < VPT; ++j)
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = at(cur, j * VEC + k) - mean;
                    m2 += j < valid ? d * d : 0.0f;
                }
            Welford st = row_merge_loop<CLUSTER>(Welford{n, mean, m2}, Welford{0.0f, 0.0f, 0.0f}, row_warps, it & 1);
            float rstd = rsqrtf(st.m2 / cols + eps);
#pragma unroll
            for (int j = 0; j < VPT; ++j) {
                int q = first + j * stride;
                if (!live || q >= L.whole) continue;
                float o[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) o[k] = fmaf((at(cur, j * VEC + k) - st.mean) * rstd, wk[j].get(k),
                                                          bk[j].get(k));
                *reinterpret_cast<Pack<T>*>(out + q * VEC) = from_floats<T>(o);
            }
        } else {
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT * VEC; ++i) ss += at(cur, i) * at(cur, i);
            ss = row_merge_loop<CLUSTER>(ss, 0.0f, row_warps, it & 1);
            float rstd = rsqrtf(ss / cols + eps);
#pragma unroll
            for (int j = 0; j < VPT; ++j) {
                int q = first + j * stride;
                if (!live || q >= L.whole) continue;
                float o[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) o[k] = at(cur, j * VEC + k) * rstd * wk[j].get(k);
                *reinterpret_cast<Pack<T>*>(out + q * VEC) = from_floats<T>(o);
            }
        }
#pragma unroll
        for (int j = 0; j < VPT; ++j) cur[j] = nxt[j];
    }
    if (CLUSTER > 1) {                                    // no block leaves while another may read its block_part
        cluster_arrive();
        cluster_wait();
    }
}

template <typename T, int VPT, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
layernorm_persistent(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                     int rows, int cols, int row_threads, float eps) {
    norm_persistent<T, VPT, CLUSTER, true>(x, w, b, y, rows, cols, row_threads, eps);
}

template <typename T, int VPT, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_persistent(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                   int row_threads, float eps) {
    norm_persistent<T, VPT, CLUSTER, false>(x, w, w, y, rows, cols, row_threads, eps);
}

#define PERSISTENT_RMS(T, VPT, C)                                                                             \
    template __global__ void rmsnorm_persistent<T, VPT, C>(const T*, const T*, T*, int, int, int, float);
#define PERSISTENT(T, VPT, C)                                                                                     \
    template __global__ void layernorm_persistent<T, VPT, C>(const T*, const T*, const T*, T*, int, int, int, float); \
    PERSISTENT_RMS(T, VPT, C)
PERSISTENT(__nv_bfloat16, 1, 1)
PERSISTENT(__nv_bfloat16, 2, 1)
PERSISTENT(__nv_bfloat16, 2, 2)
PERSISTENT(__nv_bfloat16, 2, 4)
PERSISTENT(float, 2, 1)
PERSISTENT(float, 2, 4)
PERSISTENT_RMS(float, 4, 2)       // LayerNorm's would spill: x twice, w and b, 4 packs each

// ---- the plans the notebook's plan_rows no longer picks, for comparison: 32 values per thread in clusters (tutorial
// 03's plan: 4 bf16 or 8 float packs), and the same rows over twice the threads (2 bf16, 4 float packs). The cell
// itself instantiates 1-8 packs per thread in a block, 8 in clusters and 4 in bf16 clusters. ------------------
NORM_CLUSTER(__nv_bfloat16, 2, 2) NORM_CLUSTER(__nv_bfloat16, 4, 2) NORM_CLUSTER(__nv_bfloat16, 8, 2)
NORM_CLUSTER(float, 2, 4) NORM_CLUSTER(float, 4, 4) NORM_CLUSTER(float, 8, 4)
