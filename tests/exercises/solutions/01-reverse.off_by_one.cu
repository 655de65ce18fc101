// exercise: 01-reverse
// expect: off_by_one out_of_bounds on gpu
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[n - i];                   // reads in[n] at i = 0
}
