// exercise: 02-transpose-naive (reference solution)
extern "C" __global__ void transpose_naive(const float* in, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;   // column of in: [0, cols)
    int r = blockIdx.y * blockDim.y + threadIdx.y;   // row of in: [0, rows)
    if (r < rows && c < cols) out[c * rows + r] = in[r * cols + c];   // in [rows, cols] -> out [cols, rows]
}
