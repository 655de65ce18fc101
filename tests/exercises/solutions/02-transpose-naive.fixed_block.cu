// exercise: 02-transpose-naive
// expect: launch_config on gpu
extern "C" __global__ void transpose_naive(const float* in, float* out, int rows, int cols) {
    int c = blockIdx.x * 32 + threadIdx.x;           // assumes 32 x 8 blocks
    int r = blockIdx.y * 8 + threadIdx.y;
    if (r < rows && c < cols) out[c * rows + r] = in[r * cols + c];
}
