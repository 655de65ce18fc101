
// ---- session 8/9 candidates: bf16 LayerNorm under a 512-thread launch bound ------------------------------------
// tools/gpu/try_norms.py appends this file to the notebook's norm_kernels cell (families "wide", "wideb", "early").
// The cell keeps a bf16 thread's values packed (two to a register) and widens each one three times: for the sum,
// for the squared deviations, for the affine store; Nsight Compute counts 25 instructions issued per element for
// bf16 LayerNorm against RMSNorm's 14 (session 8, run I). And b (with 4 packs a thread; w and b with 8) is read
// after the reduction: one more L2 round trip with no x in flight. Both are for want of registers under
// __launch_bounds__(1024)'s 64. These kernels are bounded at 512 threads (up to 128 registers):
//   WIDE:  x widened to fp32 once, kept for all three passes (an empty asm keeps the floats, or the compiler
//          widens again from the packs);
//   EARLY: w and b loaded next to x wherever the row's packs are 16-byte aligned (the cell: w only, up to 4 packs).
// Session 9, run A: all three slower than the cell (fewer blocks an SM cost more than the instructions saved). The
// other way, fewer registers for more blocks (__launch_bounds__(THREADS, MINB)), spills (NVRTC): 160-328 bytes at 4
// packs and 10-16 blocks of 128, 84-584 at c16 x 256 x 8 with 5-6 blocks; the cell's own kernels so bounded were
// far slower (session 9 run H, benchmarks/NOTES-memory-bound.md).
// Same plans, launches and statistics as the cell's layernorm_rows / layernorm_rows_cluster (edge elements as there).
template <typename T, int VPT, int CLUSTER, bool WIDE, int WB>
__device__ __forceinline__ void layernorm_row_x(const T* __restrict__ x, const T* __restrict__ w,
                                                const T* __restrict__ b, T* __restrict__ y, int cols, bool live,
                                                int head, int first, int stride, int edge_t, int row_warps,
                                                float eps) {
    constexpr int VEC = 16 / sizeof(T), N = VPT * VEC;
    RowLayout L(live ? cols : 0, head, VEC);
    bool early_w = WB != 2 && (WB == 1 || Early<VPT, 2>::value) && L.lead == 0;     // WB 0: the cell's rule
    bool early_b = WB != 2 && (WB == 1 || Early<VPT, 3>::value) && L.lead == 0;
    Pack<T> pk[VPT], wk[VPT], bk[VPT];
    load_packs(pk, x, L, first, stride);
    if (early_w) load_vector(wk, w, L, first, stride);
    if (early_b) load_vector(bk, b, L, first, stride);
    int e = L.edge(edge_t, live ? cols : 0);
    float edge = e >= 0 ? to_float(x[e]) : 0.0f;
    int valid = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) valid += first + j * stride < L.whole;
    float v[WIDE ? N : 1];                                // x widened once, for all three passes (WIDE)
    if constexpr (WIDE) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            unsigned u = __float_as_uint(at(pk, i));
            asm volatile("" : "+r"(u));                   // the compiler keeps v, not the packs it came from
            v[i] = __uint_as_float(u);
        }
    }
    auto val = [&](int i) { if constexpr (WIDE) return v[i]; else return at(pk, i); };
    float s = e >= 0 ? edge : 0.0f;                       // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < N; ++i) s += val(i);
    SumCount sn = block_merge<0>(SumCount{s, valid * VEC + (e >= 0 ? 1.0f : 0.0f)}, SumCount{0.0f, 0.0f},
                                 row_warps);
    float mean = sn.n > 0.0f ? sn.s / sn.n : 0.0f;
    if constexpr (!WIDE) keep_packed(pk);
    float m2 = e >= 0 ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        if (j >= valid) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) m2 = fmaf(val(j * VEC + k) - mean, val(j * VEC + k) - mean, m2);
    }
    if constexpr (!WIDE) keep_packed(pk);
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
        for (int k = 0; k < VEC; ++k) out[k] = fmaf((val(j * VEC + k) - st.mean) * rstd, wk[j].get(k), bk[j].get(k));
        *reinterpret_cast<Pack<T>*>(y + L.lead + q * VEC) = from_floats<T>(out);
    }
}

template <typename T, int VPT, bool WIDE, int WB, int THREADS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) layernorm_rows_x(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, T* __restrict__ y, int rows,
                                                        int cols, int row_threads, float eps) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> (__ffs(row_threads) - 1);
    int t = threadIdx.x & (row_threads - 1);
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row_x<T, VPT, 1, WIDE, WB>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))),
                                            t, row_threads, t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT, bool WIDE, int WB, int THREADS, int MINB>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MINB)
layernorm_rows_cluster_x(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                         T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row_x<T, VPT, CLUSTER, WIDE, WB>(x + start, w, b, y + start, cols, true,
                                                  (int)(start % (16 / sizeof(T))), first, blockDim.x, first,
                                                  blockDim.x / 32, eps);
}
// families <WIDE, WB, THREADS, MINB>: wide <true, 0, 512, 1>, wideb <true, 1, 512, 1> (4 packs only: 64 widened
// values beside w and b would not fit 128 registers), early <false, 1, 512, 1>
#define NORM_X(VPT, WIDE, WB, THREADS, MINB)                                                                      \
    template __global__ void layernorm_rows_x<__nv_bfloat16, VPT, WIDE, WB, THREADS, MINB>(                       \
        const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int, float);
#define NORM_X_CLUSTER(C, VPT, WIDE, WB, THREADS, MINB)                                                           \
    template __global__ void layernorm_rows_cluster_x<__nv_bfloat16, C, VPT, WIDE, WB, THREADS, MINB>(            \
        const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, float);
NORM_X(4, true, 0, 512, 1) NORM_X(8, true, 0, 512, 1) NORM_X(4, true, 1, 512, 1) NORM_X(4, false, 1, 512, 1)
NORM_X(8, false, 1, 512, 1)
NORM_X_CLUSTER(16, 8, true, 0, 512, 1) NORM_X_CLUSTER(8, 8, true, 0, 512, 1)
NORM_X_CLUSTER(16, 8, false, 1, 512, 1) NORM_X_CLUSTER(8, 8, false, 1, 512, 1)
