// kl/ptx.cuh: one-instruction PTX wrappers the tutorials share: a flushing exp, an L1 prefetch, a shared-memory
// address, and a block's place in its thread-block cluster (sm_90).
// Each function is inline PTX on the GPU (__CUDA_ARCH__ defined: NVRTC, nvcc's device pass). On the CPU, kernellab's
// emulator (kernellab/run/sim/cuda: cuda_host.h, hopper.h) defines KL_EMULATOR and kl_emu::<the same name>, which the #else
// branches call instead.
#pragma once

// exp(x) as one FMUL and one MUFU.EX2: __expf without -use_fast_math adds four instructions per call to keep
// results under 2^-126 (denormals) exact; those are below anything a softmax output resolves, so flush them.
__device__ __forceinline__ float exp_ftz(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
#else
    return kl_emu::exp_ftz(x);
#endif
}

// Ask for the 128-byte line holding p into this SM's L1 (prefetch.global.L1): no register is written, no wait.
__device__ __forceinline__ void prefetch_l1(const void* p) {
#ifdef __CUDA_ARCH__
    asm volatile("prefetch.global.L1 [%0];" :: "l"(p));
#else
    kl_emu::prefetch_l1(p);
#endif
}

// A shared-memory address for PTX: the 32-bit offset in the shared window of the generic pointer p.
__device__ __forceinline__ unsigned shared_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- thread-block clusters (sm_90) -------------------------------------------------------------------------------
// This block's rank in its cluster (%cluster_ctarank), 0 .. blocks per cluster - 1.
__device__ __forceinline__ unsigned cluster_ctarank() {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return kl_emu::cluster_ctarank();
#endif
}
// This thread arrives at the cluster barrier with no fence (barrier.cluster.arrive.relaxed): nothing it wrote is
// published by the arrival itself.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#ifdef __CUDA_ARCH__
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
    kl_emu::cluster_arrive_relaxed();
#endif
}
// Wait until every thread of the cluster has arrived (barrier.cluster.wait, acquire: what they published is seen).
__device__ __forceinline__ void cluster_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    kl_emu::cluster_wait();
#endif
}
