// exercise: 08-delta-rows (reference solution)
extern "C" __global__ void delta_rows(const float* o, const float* d_o, float* delta, int rows, int d) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;   // warp threadIdx.y of the block owns this row
    const int lane = threadIdx.x;                            // in [0, 32)
    if (row >= rows) return;                                 // the whole warp leaves together
    float s = 0.f;                                           // this lane's columns lane, lane + 32, ...
    for (int c = lane; c < d; c += 32) s += o[(size_t)row * d + c] * d_o[(size_t)row * d + c];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) delta[row] = s;
}
