// exercise: 01-vadd4
// expect: unwritten on gpu
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * t + 3 < n) {                             // whole groups only: the last n % 4 elements are never written
        float4 x = reinterpret_cast<const float4*>(a)[t];
        float4 y = reinterpret_cast<const float4*>(b)[t];
        reinterpret_cast<float4*>(c)[t] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
