// kl/tile.cuh: moving tiles of a row-major matrix whose sizes need not be multiples of the tile (tutorials 05, 06).
#pragma once
#include "convert.cuh"

// Four floats of row `row`, columns col..col+3 of a rows x cols matrix: one 16-byte load where aligned and inside,
// else four guarded loads (zeros past the edges).
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int row, int col, int rows, int cols, bool vec) {
    if (vec && row < rows && col + 3 < cols) return *reinterpret_cast<const float4*>(&p[row * cols + col]);
    float4 v;
    v.x = (row < rows && col + 0 < cols) ? p[row * cols + col + 0] : 0.0f;
    v.y = (row < rows && col + 1 < cols) ? p[row * cols + col + 1] : 0.0f;
    v.z = (row < rows && col + 2 < cols) ? p[row * cols + col + 2] : 0.0f;
    v.w = (row < rows && col + 3 < cols) ? p[row * cols + col + 3] : 0.0f;
    return v;
}

// ---- 16-bit tiles (tutorial 06) -------------------------------------------------------------------------------------
// A row-major [rows, K] matrix's tile of ROWS x BK 16-bit elements (rows row0.., columns k0..) into shared memory
// dst[ROWS][LD] (LD >= BK: padded rows), 16 bytes per thread per step, NTHREADS threads; zeros past the last row or
// the last column. K % 8 == 0, so a 16-byte chunk is all in or all out.
template <int ROWS, int BK, int NTHREADS, typename T, int LD>
__device__ __forceinline__ void load_tile(T (*dst)[LD], const T* __restrict__ src, int row0, int rows, int k0, int K) {
    for (int i = threadIdx.x; i < ROWS * BK / 8; i += NTHREADS) {
        int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < rows && k0 + c < K) v = *reinterpret_cast<const uint4*>(&src[(size_t)(row0 + r) * K + k0 + c]);
        *reinterpret_cast<uint4*>(&dst[r][c]) = v;
    }
}
// Two fp32 results into C[row][col, col + 1] (an M x N matrix of T = bf16 or fp16), guarded; one 4-byte store when
// both fit and are aligned.
template <typename T>
__device__ __forceinline__ void store2(T* C, int row, int col, int M, int N, float x, float y) {
    if (row >= M) return;
    if (col + 1 < N && N % 2 == 0) {
        *reinterpret_cast<unsigned*>(&C[(size_t)row * N + col]) = pack2<T>(x, y);
    } else {
        if (col < N) C[(size_t)row * N + col] = from_float<T>(x);
        if (col + 1 < N) C[(size_t)row * N + col + 1] = from_float<T>(y);
    }
}
