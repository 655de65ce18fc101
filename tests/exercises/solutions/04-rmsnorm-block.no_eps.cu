// exercise: 04-rmsnorm-block
// expect: wrong_values on gpu
extern "C" __global__ void rmsnorm_block(const float* x, const float* w, float* y, int rows, int cols, float eps) {
    __shared__ float warp_sums[8];
    const float* in = x + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += in[c] * in[c];
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int k = 0; k < 8; ++k) ss += warp_sums[k];
    float rstd = rsqrtf(ss / cols);                        // no eps: a row of zeros gives 0 * inf = NaN
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(size_t)blockIdx.x * cols + c] = in[c] * rstd * w[c];
}
