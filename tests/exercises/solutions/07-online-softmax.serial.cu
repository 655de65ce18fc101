// exercise: 07-online-softmax
// expect: no_shuffle on cpu
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void softmax_stats(const float* x, float* m, float* l, int rows, int n) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;   // warp threadIdx.y of the block owns this row
    const int lane = threadIdx.x;                            // in [0, 32)
    if (row >= rows) return;                                 // the whole warp leaves together
    const float* xr = x + (size_t)row * n;                   // [n] this row
    float mi = -CUDART_INF_F, li = 0.f;                      // this lane's (max, sum) over keys lane, lane + 32, ...
    if (lane != 0) return;                                   // lane 0 alone walks the row: no merge needed
    for (int j = 0; j < n; ++j) {
        const float v = xr[j];
        const float mn = fmaxf(mi, v);
        if (mn != -CUDART_INF_F)                             // still all -inf: (-inf, 0) stays as it is
            li = li * expf(mi - mn) + expf(v - mn);
        mi = mn;
    }
    if (lane == 0) {
        m[row] = mi;
        l[row] = li;
    }
}
