// kl/cp_async.cuh: cp.async (sm_80+): copies from global to shared memory that do not pass through registers, in
// groups a thread commits and later waits for. The usual pipeline of STAGES slices:
//
//     for each slice s: cp_async_16(...) ...; cp_async_commit();        // one group per slice
//     cp_async_wait<STAGES - 2>(); __syncthreads();                      // this thread's oldest group has landed;
//                                                                        // the barrier: every thread's has
// A copy whose src_bytes is less than its size fills the rest of its destination with zeros (rows past the matrix).
// Each function is inline PTX on the GPU; on the CPU the emulator (kernellab/run/sim/cuda/cuda_host.h) supplies kl_emu's.
#pragma once

// 4 bytes global -> shared, through L1 (cp.async.ca); src_bytes 0 or 4.
__device__ __forceinline__ void cp_async_4(unsigned smem_addr, const void* gmem, int src_bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
#else
    kl_emu::cp_async_4(smem_addr, gmem, src_bytes);
#endif
}
// 16 bytes global -> shared, L2 only (cp.async.cg); smem_addr and gmem 16-byte aligned, src_bytes 0 .. 16.
__device__ __forceinline__ void cp_async_16(unsigned smem_addr, const void* gmem, int src_bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
#else
    kl_emu::cp_async_16(smem_addr, gmem, src_bytes);
#endif
}
// The copies this thread issued since its last commit become one group (cp.async.commit_group).
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#else
    kl_emu::cp_async_commit();
#endif
}
// Wait until at most kGroups of this thread's committed groups are still in flight (cp.async.wait_group kGroups). Other threads'
// copies are seen only after a barrier (__syncthreads) that follows.
template <int kGroups>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kGroups));
#else
    kl_emu::cp_async_wait<kGroups>();
#endif
}
// Commit, then wait for every copy this thread issued (cp.async.wait_all); a compiler barrier for memory too.
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#else
    kl_emu::cp_async_wait_all();
#endif
}
