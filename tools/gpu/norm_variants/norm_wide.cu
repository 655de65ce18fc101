
// ---- session 8 candidate (not timed yet): LayerNorm with x widened to fp32 once ----------------------------------
// tools/gpu/try_norms.py appends this file to the notebook's norm_kernels cell (family "wide"). The cell keeps a
// bf16 thread's values packed (two to a register) and widens each one three times: for the sum, for the squared
// deviations, for the affine store; Nsight Compute counts 25-26 instructions issued per element for bf16
// LayerNorm against RMSNorm's 14 (session 8, run I). Kept widened, the values need twice the registers, more than
// __launch_bounds__(1024)'s 64: these kernels are bounded at 512 threads (up to 128 registers), so a 128-thread
// block of 4 packs a thread has room for 32 widened values beside w. Same plans, launches and statistics as the
// cell's layernorm_rows / layernorm_rows_cluster (cols % VEC == 0 or not: the edge elements as there).
template <typename T, int VPT, int CLUSTER>
__device__ __forceinline__ void layernorm_row_wide(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, int cols, bool live,
                                                   int head, int first, int stride, int edge_t, int row_warps,
                                                   float eps) {
    constexpr int VEC = 16 / sizeof(T), N = VPT * VEC;
    RowLayout L(live ? cols : 0, head, VEC);
    bool early_w = Early<VPT, 2>::value && L.lead == 0, early_b = Early<VPT, 3>::value && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT], bk[VPT];
    load_packs(pk, x, L, first, stride);
    if (early_w) load_vector(wk, w, L, first, stride);
    if (early_b) load_vector(bk, b, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    int valid = min(VPT, max(0, (L.whole - first + stride - 1) / stride));
    float v[N];                                           // x widened once, for all three passes
#pragma unroll
    for (int i = 0; i < N; ++i) {
        unsigned u = __float_as_uint(at(pk, i));
        asm volatile("" : "+r"(u));                       // the compiler keeps v, not the packs it came from
        v[i] = __uint_as_float(u);
    }
    float s = e >= 0 ? edge : 0.0f;                       // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < N; ++i) s += v[i];
    SumCount sn = block_merge<0>(SumCount{s, valid * VEC + (e >= 0 ? 1.0f : 0.0f)}, SumCount{0.0f, 0.0f},
                                 row_warps);
    float mean = sn.n > 0.0f ? sn.s / sn.n : 0.0f;
    float m2 = e >= 0 ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        if (j >= valid) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) m2 = fmaf(v[j * VEC + k] - mean, v[j * VEC + k] - mean, m2);
    }
    m2 = block_merge<1>(m2, 0.0f, row_warps);
    Welford st = cluster_merge<CLUSTER>(Welford{sn.n, mean, m2}, Welford{0.0f, 0.0f, 0.0f});
    float rstd = rsqrtf(st.m2 / cols + eps);
    if (!live) return;
    if (e >= 0) y[e] = from_float<T>(fmaf((edge - st.mean) * rstd, to_float(w[e]), to_float(b[e])));
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
        for (int k = 0; k < VEC; ++k) out[k] = fmaf((v[j * VEC + k] - st.mean) * rstd, wk[j].get(k), bk[j].get(k));
        *reinterpret_cast<Pack<T>*>(y + L.lead + q * VEC) = from_floats<T>(out);
    }
}

template <typename T, int VPT>
__global__ void __launch_bounds__(512) layernorm_rows_wide(const T* __restrict__ x, const T* __restrict__ w,
                                                           const T* __restrict__ b, T* __restrict__ y, int rows,
                                                           int cols, int row_threads, float eps) {
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row_wide<T, VPT, 1>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))), t,
                                  row_threads, t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512)
layernorm_rows_cluster_wide(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row_wide<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))),
                                        first, blockDim.x, first, blockDim.x / 32, eps);
}
template __global__ void layernorm_rows_wide<__nv_bfloat16, 4>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                               const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                                               float);
template __global__ void layernorm_rows_wide<__nv_bfloat16, 8>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                               const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                                               float);
template __global__ void layernorm_rows_cluster_wide<__nv_bfloat16, 16, 8>(const __nv_bfloat16*,
                                                                           const __nv_bfloat16*,
                                                                           const __nv_bfloat16*, __nv_bfloat16*,
                                                                           int, int, float);
template __global__ void layernorm_rows_cluster_wide<__nv_bfloat16, 8, 8>(const __nv_bfloat16*,
                                                                          const __nv_bfloat16*,
                                                                          const __nv_bfloat16*, __nv_bfloat16*,
                                                                          int, int, float);
