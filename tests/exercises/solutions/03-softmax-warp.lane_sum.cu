// exercise: 03-softmax-warp
// expect: wrong_values on gpu
extern "C" __global__ void softmax_warp(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (size_t)row * cols;
    float v[32];
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        v[k] = c < cols ? in[c] : -__int_as_float(0x7f800000);
        m = fmaxf(m, v[k]);
    }
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        v[k] = __expf(v[k] - m);
        s += lane + 32 * k < cols ? v[k] : 0.0f;           // this lane's sum only: never shared across the warp
    }
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        if (c < cols) y[(size_t)row * cols + c] = v[k] / s;
    }
}
