// exercise: 03-block-sum (reference solution)
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
    __shared__ float warp_sums[8];                         // one per warp of the 256-thread block
    int i = blockIdx.x * 256 + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;                         // threads past n add nothing
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);   // every lane: its warp's sum
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();                                       // the 8 warp sums are written
    if (threadIdx.x < 32) {
        v = threadIdx.x < 8 ? warp_sums[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) partial[blockIdx.x] = v;
    }
}
