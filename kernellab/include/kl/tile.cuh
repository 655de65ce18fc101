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
// A row-major [rows, cols] matrix's tile of kRows x kCols 16-bit elements (rows row0.., columns k0..) into shared
// memory dst[kRows][kLd] (kLd >= kCols: padded rows), 16 bytes per thread per step, kThreads threads; zeros past the
// last row or the last column. cols % 8 == 0, so a 16-byte chunk is all in or all out.
template <int kRows, int kCols, int kThreads, typename T, int kLd>
__device__ __forceinline__ void load_tile(T (*dst)[kLd], const T* __restrict__ src, int row0, int rows, int k0,
                                          int cols) {
    for (int i = threadIdx.x; i < kRows * kCols / 8; i += kThreads) {
        int r = i / (kCols / 8), c = (i % (kCols / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < rows && k0 + c < cols) v = *reinterpret_cast<const uint4*>(&src[(size_t)(row0 + r) * cols + k0 + c]);
        *reinterpret_cast<uint4*>(&dst[r][c]) = v;
    }
}
// Two fp32 results into C[row][col, col + 1] (a rows x cols matrix of T = bf16 or fp16), guarded; one 4-byte store
// when both fit and are aligned.
template <typename T>
__device__ __forceinline__ void store2(T* C, int row, int col, int rows, int cols, float x, float y) {
    if (row >= rows) return;
    if (col + 1 < cols && cols % 2 == 0) {
        *reinterpret_cast<unsigned*>(&C[(size_t)row * cols + col]) = pack2<T>(x, y);
    } else {
        if (col < cols) C[(size_t)row * cols + col] = from_float<T>(x);
        if (col + 1 < cols) C[(size_t)row * cols + col + 1] = from_float<T>(y);
    }
}
