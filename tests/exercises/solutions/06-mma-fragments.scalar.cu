// exercise: 06-mma-fragments
// expect: no_tensor_cores on cpu
#include <cuda_fp16.h>
extern "C" __global__ void mma_fragments(const __half* A, const __half* B, float* C, int M, int N, int K) {
    const int row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
    for (int e = threadIdx.x; e < 128; e += 32) {          // right, on the CUDA cores
        int r = row0 + e / 8, c = col0 + e % 8;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += __half2float(A[(size_t)r * K + k]) * __half2float(B[(size_t)c * K + k]);
        C[(size_t)r * N + c] = acc;
    }
}
