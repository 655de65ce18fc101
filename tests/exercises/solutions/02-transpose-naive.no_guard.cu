// exercise: 02-transpose-naive
// expect: out_of_bounds on gpu
extern "C" __global__ void transpose_naive(const float* in, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    out[c * rows + r] = in[r * cols + c];            // no guard: edge blocks reach past both ends
}
