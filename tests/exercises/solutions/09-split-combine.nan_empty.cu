// exercise: 09-split-combine
// expect: wrong_values on gpu
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void combine_splits(const float* o_part, const float* lse, float* out, int rows, int splits,
                                          int d) {
    const int r = blockIdx.x;                                // one block per row (grid = rows)
    const float* l = lse + (size_t)r * splits;               // [splits] this row's log2-sum-exps
    float m = -CUDART_INF_F;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, l[s]);     // M: every thread finds it (splits are few)
    for (int c = threadIdx.x; c < d; c += blockDim.x) {      // this thread's columns
        float acc = 0.f, wsum = 0.f;
        {                                                    // no guard: exp2f(-inf - -inf) = NaN
            for (int s = 0; s < splits; ++s) {
                const float w = exp2f(l[s] - m);             // 0 for an empty split (-inf)
                wsum += w;
                acc += w * o_part[((size_t)r * splits + s) * d + c];
            }
        }
        out[(size_t)r * d + c] = acc / wsum;
    }
}
