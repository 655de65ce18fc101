// exercise: 04-layernorm-block
// expect: missing_barrier on cpu
extern "C" __global__ void layernorm_block(const float* x, const float* w, const float* b, float* y, int rows,
                                           int cols, float eps) {
    __shared__ float part[8][2];
    const float* in = x + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += in[c];
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32][0] = s;
    s = 0.0f;                                              // no barrier: other warps' sums may not be written yet
    for (int k = 0; k < 8; ++k) s += part[k][0];
    float mean = s / cols;
    float m2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m2 += (in[c] - mean) * (in[c] - mean);
    for (int o = 16; o > 0; o /= 2) m2 += __shfl_xor_sync(0xffffffffu, m2, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32][1] = m2;
    m2 = 0.0f;
    for (int k = 0; k < 8; ++k) m2 += part[k][1];
    float rstd = rsqrtf(m2 / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(size_t)blockIdx.x * cols + c] = (in[c] - mean) * rstd * w[c] + b[c];
}
