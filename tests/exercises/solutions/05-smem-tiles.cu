// exercise: 05-smem-tiles
#define T16 16
extern "C" __global__ void sgemm_tile16(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[T16][T16];
    __shared__ float Bs[T16][T16];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * T16 + ty, col = blockIdx.x * T16 + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += T16) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < T16; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
