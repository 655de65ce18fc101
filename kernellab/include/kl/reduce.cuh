// kl/reduce.cuh: sums and maxima over a warp and over a block, in every thread (tutorial 03 builds them step by
// step; the later tutorials include them). Blocks of whole warps, at most 1024 threads.
#pragma once

// The sum of v over the warp's 32 lanes, in every lane: lane i adds lane i ^ o for o = 16, 8, 4, 2, 1.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The max of v over the warp's 32 lanes, in every lane.
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// The whole block's max, in every thread: warp maxima meet in shared memory, one more warp max. A barrier before
// and inside: safe to call back to back.
__device__ __forceinline__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_max(lane < blockDim.x / 32 ? part[lane] : __uint_as_float(0xff800000u));
}
// The whole block's sum, in every thread, the same way.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_sum(lane < blockDim.x / 32 ? part[lane] : 0.0f);
}
