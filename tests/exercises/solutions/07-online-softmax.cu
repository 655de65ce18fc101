// exercise: 07-online-softmax (reference solution)
#include <math_constants.h>   // CUDART_INF_F
extern "C" __global__ void softmax_stats(const float* x, float* m, float* l, int rows, int n) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;   // warp threadIdx.y of the block owns this row
    const int lane = threadIdx.x;                            // in [0, 32)
    if (row >= rows) return;                                 // the whole warp leaves together
    const float* xr = x + (size_t)row * n;                   // [n] this row
    float mi = -CUDART_INF_F, li = 0.f;                      // this lane's (max, sum) over keys lane, lane + 32, ...
    for (int j = lane; j < n; j += 32) {                     // tiles of 32 keys, one key per lane
        const float v = xr[j];
        const float mn = fmaxf(mi, v);
        if (mn != -CUDART_INF_F)                             // still all -inf: (-inf, 0) stays as it is
            li = li * expf(mi - mn) + expf(v - mn);
        mi = mn;
    }
    for (int o = 16; o > 0; o /= 2) {                        // merge the 32 lanes' states, 5 butterfly steps
        const float mo = __shfl_xor_sync(0xffffffffu, mi, o);
        const float lo = __shfl_xor_sync(0xffffffffu, li, o);
        const float mn = fmaxf(mi, mo);
        if (mn != -CUDART_INF_F)                             // both sums rescaled to the larger max
            li = li * expf(mi - mn) + lo * expf(mo - mn);
        mi = mn;
    }
    if (lane == 0) {
        m[row] = mi;
        l[row] = li;
    }
}
