// exercise: 01-reverse (reference solution)
extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // global thread index: [0, gridDim.x * blockDim.x)
    if (i < n) out[i] = in[n - 1 - i];               // threads past n do nothing
}
