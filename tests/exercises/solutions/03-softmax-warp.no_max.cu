// exercise: 03-softmax-warp
// expect: wrong_values on gpu
extern "C" __global__ void softmax_warp(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (size_t)row * cols;
    float v[32];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        v[k] = c < cols ? __expf(in[c]) : 0.0f;            // no max subtracted: exp(100) is inf in float32
        s += v[k];
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        if (c < cols) y[(size_t)row * cols + c] = v[k] / s;
    }
}
