// exercise: 06-mma-fragments
// expect: wrong_values on gpu
#include <kl/mma.cuh>     // mma_16816<__half>(d, a, b): one mma.sync.m16n8k16, fp16 in, fp32 accumulate
extern "C" __global__ void mma_fragments(const __half* A, const __half* B, float* C, int M, int N, int K) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < K; k += 16) {
        const __half* a_g = A + (size_t)(row0 + g) * K + k + 2 * t;       // row g, columns 2t and 2t + 1
        const __half* a_g8 = a_g + 8 * (size_t)K;                           // row g + 8
        const __half* b_g = B + (size_t)(col0 + g) * K + k + 2 * t;        // column g of B^T
        unsigned a[4], b[2];
        a[0] = *reinterpret_cast<const unsigned*>(a_g);
        a[1] = *reinterpret_cast<const unsigned*>(a_g + 8);      // a[1] and a[2] swapped
        a[2] = *reinterpret_cast<const unsigned*>(a_g8);
        a[3] = *reinterpret_cast<const unsigned*>(a_g8 + 8);
        b[0] = *reinterpret_cast<const unsigned*>(b_g);
        b[1] = *reinterpret_cast<const unsigned*>(b_g + 8);
        mma_16816<__half>(d, a, b);
    }
    float* c = C + (size_t)(row0 + g) * N + col0 + 2 * t;
    c[0] = d[0];
    c[1] = d[1];
    c[8 * (size_t)N] = d[2];
    c[8 * (size_t)N + 1] = d[3];
}
