// exercise: 04-layernorm-block
// expect: wrong_values on gpu
extern "C" __global__ void layernorm_block(const float* x, const float* w, const float* b, float* y, int rows,
                                           int cols, float eps) {
    __shared__ float part[8][2];
    const float* in = x + (size_t)blockIdx.x * cols;
    float s = 0.0f, ss = 0.0f;                             // E[x^2] - E[x]^2: gone at a mean of 10,000
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        s += in[c];
        ss += in[c] * in[c];
    }
    for (int o = 16; o > 0; o /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    }
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32][0] = s;
        part[threadIdx.x / 32][1] = ss;
    }
    __syncthreads();
    s = 0.0f;
    ss = 0.0f;
    for (int k = 0; k < 8; ++k) {
        s += part[k][0];
        ss += part[k][1];
    }
    float mean = s / cols;
    float rstd = rsqrtf(fmaxf(ss / cols - mean * mean, 0.0f) + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(size_t)blockIdx.x * cols + c] = (in[c] - mean) * rstd * w[c] + b[c];
}
