// exercise: 08-delta-rows
// expect: no_shuffle on cpu
extern "C" __global__ void delta_rows(const float* o, const float* d_o, float* delta, int rows, int d) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;   // right values, but lane 0 walks the row alone
    if (row >= rows || threadIdx.x != 0) return;
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += o[(size_t)row * d + c] * d_o[(size_t)row * d + c];
    delta[row] = s;
}
