// exercise: 01-vadd4
// expect: out_of_bounds on gpu
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * t + 3 < n) {
        float4 x = reinterpret_cast<const float4*>(a)[t];
        float4 y = reinterpret_cast<const float4*>(b)[t];
        reinterpret_cast<float4*>(c)[t] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else if (t == n / 4) {
        for (int i = 4 * t; i <= n; ++i) c[i] = a[i] + b[i];   // one past the end
    }
}
