
// ---- session 8 candidate: the cell's cluster kernels without __cluster_dims__, launched with cluster=(C, 1, 1) ----
// tools/gpu/try_norms.py appends this file to the notebook's norm_kernels cell (family "rt"). A launch-time cluster
// shape may have 16 blocks (sm_90's non-portable size; kernellab sets the opt-in), so a 1 MB fp32 row can be
// 16 blocks of 512 threads x 8 packs (two blocks an SM) instead of 8 of 1024 (one), and a bf16 row of 512 KB 16
// of 256 (four an SM) instead of 8 of 512 (two). Same body as layernorm_rows_cluster / rmsnorm_rows_cluster.
template <typename T, int CLUSTER, int VPT>
__global__ void __launch_bounds__(1024)
layernorm_rows_cluster_rt(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                          T* __restrict__ y, int rows, int cols, float eps) {
    exchange_open<Welford, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    layernorm_row<T, VPT, CLUSTER>(x + start, w, b, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                   blockDim.x, first, blockDim.x / 32, eps);
}

template <typename T, int CLUSTER, int VPT>
__global__ void __launch_bounds__(1024)
rmsnorm_rows_cluster_rt(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                        float eps) {
    exchange_open<float, CLUSTER>();
    size_t start = (size_t)(blockIdx.x / CLUSTER) * cols;
    int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    rmsnorm_row<T, VPT, CLUSTER>(x + start, w, y + start, cols, true, (int)(start % (16 / sizeof(T))), first,
                                 blockDim.x, first, blockDim.x / 32, eps);
}
#define NORM_CLUSTER_RT(T, C, VPT)                                                                              \
    template __global__ void layernorm_rows_cluster_rt<T, C, VPT>(const T*, const T*, const T*, T*, int, int,   \
                                                                  float);                                      \
    template __global__ void rmsnorm_rows_cluster_rt<T, C, VPT>(const T*, const T*, T*, int, int, float);
NORM_CLUSTER_RT(float, 16, 8) NORM_CLUSTER_RT(float, 16, 4) NORM_CLUSTER_RT(float, 8, 8)
NORM_CLUSTER_RT(__nv_bfloat16, 16, 8) NORM_CLUSTER_RT(__nv_bfloat16, 8, 8)
