// exercise: 03-block-sum
// expect: wrong_values on gpu
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
    __shared__ float warp_sums[8];
    int i = blockIdx.x * 256 + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = warp_sums[0];   // warp 0's sum only: 7 warps are lost
}
