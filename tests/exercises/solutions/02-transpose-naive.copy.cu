// exercise: 02-transpose-naive
// expect: input_copy on gpu
extern "C" __global__ void transpose_naive(const float* in, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) out[r * cols + c] = in[r * cols + c];   // copies instead of transposing
}
