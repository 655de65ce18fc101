// exercise: 09-gqa-scores
// expect: wrong_values on gpu
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void gqa_scores(const float* q, const float* k, const int* seqlens, float* s, int B, int Hq,
                                      int Hkv, int nmax, int d, float scale) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;     // this thread's key
    const int row = blockIdx.y;                              // b * Hq + h
    if (j >= nmax) return;                                   // the grid is rounded up to whole blocks
    const int b = row / Hq, h = row % Hq;
    const int kvh = h / (Hq / Hkv);                          // the G = Hq / Hkv query heads of a KV head are consecutive
    float v = -CUDART_INF_F;                                 // keys past the cache
    {                      // no cache length: every key scored
        const float* qr = q + (size_t)row * d;                              // [d]
        const float* kr = k + (((size_t)b * Hkv + kvh) * nmax + j) * d;     // [d] key j of KV head kvh
        float acc = 0.f;
        for (int c = 0; c < d; ++c) acc += qr[c] * kr[c];
        v = scale * acc;
    }
    s[(size_t)row * nmax + j] = v;
}
