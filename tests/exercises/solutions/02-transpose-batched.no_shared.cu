// exercise: 02-transpose-batched
// expect: no_shared missing_barrier on cpu
extern "C" __global__ void transpose_batched(const float* in, float* out, int batch, int rows, int cols) {
    const float* src = in + (size_t)blockIdx.z * rows * cols;   // right answer, but no tile: the stores are not
    float* dst = out + (size_t)blockIdx.z * rows * cols;        // coalesced, which is what the exercise is about
    int c = blockIdx.x * 32 + threadIdx.x, r = blockIdx.y * 32 + threadIdx.y;
    for (int j = 0; j < 32; j += 8)
        if (r + j < rows && c < cols) dst[c * rows + r + j] = src[(r + j) * cols + c];
}
