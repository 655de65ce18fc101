// exercise: 01-reverse
// expect: launch_config on gpu
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * 256 + threadIdx.x;          // assumes 256 threads per block
    if (i < n) out[i] = in[n - 1 - i];
}
