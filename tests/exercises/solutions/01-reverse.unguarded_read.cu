// exercise: 01-reverse
// expect: missing_guard on cpu
extern "C" __global__ void reverse(const float* in, float* out, int len) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[gridDim.x * blockDim.x - 1 - i];     // never reads the length: reverses the whole grid's range
}
