// kl/convert.cuh: fp32 <-> the element types of kernellab's tutorials (float, bf16, fp16), for templated kernels.
// Math happens in fp32: a kernel widens each element with to_float where it is used and narrows its result with
// from_float<T> (round to nearest even) where it is stored.
#pragma once
#ifndef KL_EMULATOR            // the CPU emulators (kernellab/run/sim/cuda) define the 16-bit types themselves
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

__device__ __forceinline__ float to_float(float v) { return v; }                               // fp32 as it is
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }     // bf16 -> fp32, exact
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }                // fp16 -> fp32, exact
template <typename T> __device__ __forceinline__ T from_float(float v);                         // fp32 -> T, rounded
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Two fp32 values as one 32-bit register of two T (lo in the low half): the A operand of an MMA from fp32 results.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}
