
// ---- session 9 candidate: the cell's LayerNorm kernels with more blocks an SM, spilling ----------------------------
// tools/gpu/try_norms.py appends this file to the notebook's norm_kernels cell (families "occ10", "occ5"). The
// 512-bound candidates of norm_wide.cu lost to the cell because they held fewer blocks an SM; this is the other
// direction: the cell's own layernorm_row under __launch_bounds__(THREADS, MINB), which caps the registers at
// 64K / (THREADS x MINB) and makes the compiler spill the rest (NVRTC: 48 registers and 172 bytes of spills for 128 x
// 4 / 128 at 10 blocks an SM, 48 and 84 bytes for c16 x 256 x 8 at 5; the cell: 64, 8 and 4 blocks).
template <typename T, int VPT, int THREADS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) layernorm_rows_occ(const T* __restrict__ x, const T* __restrict__ w,
                                                                    const T* __restrict__ b, T* __restrict__ y,
                                                                    int rows, int cols, int row_threads, float eps) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> (__ffs(row_threads) - 1);
    int t = threadIdx.x & (row_threads - 1);
    bool live = row < rows;
    size_t start = (size_t)(live ? row : 0) * cols;
    layernorm_row<T, VPT, 1>(x + start, w, b, y + start, cols, live, (int)(start % (16 / sizeof(T))), t, row_threads,
                             t, row_threads / 32, eps);
}

template <typename T, int CLUSTER, int VPT, int THREADS, int MINB>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MINB)
layernorm_rows_cluster_occ(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                   blockDim.x, first, blockDim.x / 32, eps);
}
template __global__ void layernorm_rows_occ<__nv_bfloat16, 4, 128, 10>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                                       const __nv_bfloat16*, __nv_bfloat16*, int,
                                                                       int, int, float);
template __global__ void layernorm_rows_cluster_occ<__nv_bfloat16, 16, 8, 256, 5>(const __nv_bfloat16*,
                                                                                  const __nv_bfloat16*,
                                                                                  const __nv_bfloat16*,
                                                                                  __nv_bfloat16*, int, int, float);
