// kl/tma.cuh: Hopper's asynchronous copies (sm_90), as tutorial 07's attention kernels use them: the tensor memory
// accelerator (TMA) copies a box of a tensor from global into shared memory and counts its bytes down on an mbarrier,
// a shared-memory barrier that consumers wait on by phase; and the 64-bit shared-memory matrix descriptor through
// which wgmma reads a tile the TMA wrote with the 128-byte swizzle.
//
//     mbar_init(bar, 1);                            // one thread; then fence_mbarrier_init() and __syncthreads()
//     mbar_expect_tx(bar, bytes);                   // the producer arrives, expecting `bytes` from the copies
//     tma_load_3d(dst, &tmap, bar, c0, c1, c2);     // the copy engine counts them down as they land
//     mbar_wait(bar, phase);                        // consumers: until phase `phase` (0, 1, 0, ...) completed
//
// Addresses are shared-state-space addresses (__cvta_generic_to_shared). On the CPU the emulator
// (kernellab/run/sim/cuda/hopper.h) defines these names itself (its mbarrier and TMA emulation), so only the GPU
// (__CUDA_ARCH__) compiles the inline PTX below.
#pragma once

#ifdef __CUDA_ARCH__
// Initialise the mbarrier at `bar` to expect `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(unsigned bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// After a thread's mbar_inits, before the block's __syncthreads: make the inits visible to the other threads and to the
// copy engine, whose transactions complete on the barriers (fence.mbarrier_init.release.cluster; named so as not to
// clash with a tutorial's own fence_barrier_init, which adds fence.proxy.async).
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive on `bar`, and expect `bytes` more from the copies that complete on it (mbarrier.arrive.expect_tx).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrive on `bar` (mbarrier.arrive).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until phase `phase` (its parity) of `bar` has completed (mbarrier.try_wait.parity in a loop).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(phase) : "memory");
    } while (!done);
}
// TMA: the box of the 3-D tensor map `tmap` (a __grid_constant__ CUtensorMap parameter's address) at coordinates
// (c0 innermost, c1, c2) into shared memory at `dst`, completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void* tmap, unsigned bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
#endif

// wgmma's shared-memory matrix descriptor for a tile in the 128-byte swizzle: its start address, leading and stride
// byte offsets (each stored >> 4), and the swizzle mode (1 << 62).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo_bytes, unsigned sbo_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo_bytes >> 4) << 16) |
           ((unsigned long long)(sbo_bytes >> 4) << 32) | (1ull << 62);
}
