// exercise: 03-softmax-warp (reference solution)
extern "C" __global__ void softmax_warp(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;                               // the whole warp leaves: no shuffle is left half-done
    const float* in = x + (size_t)row * cols;
    float v[32];                                           // lane l holds columns l, l + 32, ... (cols <= 1024)
    float m = -__int_as_float(0x7f800000);                 // -inf
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        v[k] = c < cols ? in[c] : -__int_as_float(0x7f800000);
        m = fmaxf(m, v[k]);
    }
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));   // the row's max
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        v[k] = __expf(v[k] - m);                           // a fully masked row: -inf - -inf = NaN, as torch
        s += lane + 32 * k < cols ? v[k] : 0.0f;
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);           // the row's sum
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        int c = lane + 32 * k;
        if (c < cols) y[(size_t)row * cols + c] = v[k] / s;
    }
}
