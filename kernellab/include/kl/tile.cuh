// kl/tile.cuh: reading tiles of a row-major fp32 matrix whose sizes need not be multiples of the tile (tutorial 05).
#pragma once

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
