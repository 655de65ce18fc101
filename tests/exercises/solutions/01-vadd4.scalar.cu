// exercise: 01-vadd4
// expect: not_vectorized on cpu
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;   // four elements per thread, but one float at a time
    for (int i = 4 * t; i < 4 * t + 4 && i < n; ++i) c[i] = a[i] + b[i];
}
