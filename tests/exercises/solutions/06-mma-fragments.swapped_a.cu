// exercise: 06-mma-fragments
// expect: wrong_values on gpu
#include <cuda_fp16.h>
#define MMA_PTX "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
#define MMA_16816(d, a, b) asm volatile(MMA_PTX : MMA_OUT(d) : MMA_IN(a, b))
#define MMA_OUT(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define MMA_IN(a, b) "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])
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
        MMA_16816(d, a, b);
    }
    float* c = C + (size_t)(row0 + g) * N + col0 + 2 * t;
    c[0] = d[0];
    c[1] = d[1];
    c[8 * (size_t)N] = d[2];
    c[8 * (size_t)N + 1] = d[3];
}
