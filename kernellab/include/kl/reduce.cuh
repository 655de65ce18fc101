// kl/reduce.cuh: sums and maxima over a warp and over a block, in every thread (tutorial 03 builds them step by
// step; the later tutorials include them). Blocks of whole warps, at most 1024 threads.
#pragma once

struct SumOp { __device__ __forceinline__ static float of(float a, float b) { return a + b; } };     // a + b
struct MaxOp { __device__ __forceinline__ static float of(float a, float b) { return fmaxf(a, b); } };  // the larger

// Op over the warp's 32 lanes, in every lane: lane i combines with lane i ^ o for o = 16, 8, 4, 2, 1.
template <typename Op> __device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o /= 2) v = Op::of(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Op over the whole block, in every thread: each warp's result meets in shared memory (`empty` stands for the
// missing warps), one more warp reduction. A barrier before and inside: safe to call back to back.
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float empty) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce<Op>(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_reduce<Op>(lane < blockDim.x / 32 ? part[lane] : empty);
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }      // the warp's sum, every lane
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }      // the warp's max, every lane
__device__ __forceinline__ float block_max(float v) {                                  // the block's max (-inf: none)
    return block_reduce<MaxOp>(v, __uint_as_float(0xff800000u));
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<SumOp>(v, 0.0f); }   // the block's sum
