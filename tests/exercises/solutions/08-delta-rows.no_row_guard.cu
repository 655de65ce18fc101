// exercise: 08-delta-rows
// expect: missing_guard on cpu
extern "C" __global__ void delta_rows(const float* o, const float* d_o, float* delta, int rows, int d) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;   // no guard: warps past the last row read past o
    const int lane = threadIdx.x;
    float s = 0.f;
    for (int c = lane; c < d; c += 32) s += o[(size_t)row * d + c] * d_o[(size_t)row * d + c];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) delta[row] = s;
}
