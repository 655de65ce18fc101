// exercise: 02-transpose-batched
// expect: out_of_bounds on gpu
#define TILE 32   // each block transposes one TILE x TILE tile of one matrix
#define ROWS 8    // with TILE x ROWS threads: each thread copies TILE / ROWS = 4 elements
extern "C" __global__ void transpose_batched(const float* in, float* out, int batch, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];              // padded: a column read hits 32 different banks
    const float* src = in + (size_t)blockIdx.z * rows * cols;   // matrix blockIdx.z: [rows, cols]
    float* dst = out + (size_t)blockIdx.z * rows * cols;        // its transpose: [cols, rows]
    int c = blockIdx.x * TILE + threadIdx.x, r = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        tile[threadIdx.y + j][threadIdx.x] = src[(r + j) * cols + c];
    __syncthreads();
    c = blockIdx.y * TILE + threadIdx.x, r = blockIdx.x * TILE + threadIdx.y;   // out's column and row
    for (int j = 0; j < TILE; j += ROWS)
        if (r + j < cols && c < rows) dst[(r + j) * rows + c] = tile[threadIdx.x][threadIdx.y + j];
}
