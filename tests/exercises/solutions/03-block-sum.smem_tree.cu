// exercise: 03-block-sum
// expect: no_shuffle on cpu
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
    __shared__ float buf[256];                             // right, but a tree in shared memory: no shuffles
    int i = blockIdx.x * 256 + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = 128; s > 0; s /= 2) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}
