// exercise: 05-register-tiles
// expect: missing_barrier on cpu
extern "C" __global__ void sgemm_4x4(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[64][16];
    __shared__ float Bs[16][64];
    const int tx = threadIdx.x, ty = threadIdx.y, t = ty * 16 + tx;
    const int bm = blockIdx.y * 64, bn = blockIdx.x * 64;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = 0; i < 4; ++i) {
            int idx = t + 256 * i;
            int ar = idx / 16, ac = idx % 16;
            As[ar][ac] = (bm + ar < M && k0 + ac < K) ? A[(bm + ar) * K + k0 + ac] : 0.0f;
            int br = idx / 64, bc = idx % 64;
            Bs[br][bc] = (k0 + br < K && bn + bc < N) ? B[(k0 + br) * N + bn + bc] : 0.0f;
        }
        for (int k = 0; k < 16; ++k) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[ty * 4 + i][k];
            for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx * 4 + j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
            int row = bm + ty * 4 + i, col = bn + tx * 4 + j;
            if (row < M && col < N) C[row * N + col] = acc[i][j];
        }
}
