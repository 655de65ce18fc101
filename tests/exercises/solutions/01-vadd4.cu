// exercise: 01-vadd4 (reference solution)
extern "C" __global__ void vadd4(const float* a, const float* b, float* c, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;   // thread t owns elements 4t .. 4t + 3
    if (4 * t + 3 < n) {                             // a whole group of four: one 16-byte load per input
        float4 x = reinterpret_cast<const float4*>(a)[t];
        float4 y = reinterpret_cast<const float4*>(b)[t];
        reinterpret_cast<float4*>(c)[t] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else if (t == n / 4) {                         // the thread just past the last group: the n % 4 tail
        for (int i = 4 * t; i < n; ++i) c[i] = a[i] + b[i];
    }
}
