// exercise: 01-reverse
// expect: out_of_bounds on gpu
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[n - 1 - i];                          // no guard: the last block's extra threads go out of bounds
}
