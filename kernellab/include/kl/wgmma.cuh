// kl/wgmma.cuh: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): four warps (a warpgroup, 128 threads) multiply a
// 64 x 16 tile of A by a 16 x N tile of B into a 64 x N fp32 accumulator spread over their registers (N / 2 floats a
// thread), asynchronously. Tutorials 06 (GEMM) and 07 (attention) drive it:
//
//     wgmma_fence();                              // the accumulator registers are ready for the tensor cores
//     for each k16: wgmma_ss<N, T>(d, desc_a, desc_b, k > 0);   // issue; scale_d 0: d = A B, 1: d += A B
//     wgmma_commit();                             // the issued wgmmas become one group
//     wgmma_wait<0>();                            // at most 0 groups still running: d may be read
//
// A and B come from shared memory through 64-bit matrix descriptors (wgmma_ss), or A from registers (wgmma_rs_tb,
// with B read MN-major: transposed). T is __nv_bfloat16 or __half; accumulators are fp32.
// On the CPU the emulator (kernellab/run/sim/cuda/hopper.h) supplies kl_emu's versions of these functions.
#pragma once
#include "convert.cuh"

// ---- the operand lists: N / 2 accumulator registers "%0, %1, ..." and their "+f"(d[i]) bindings --------------------
#define KL_WG_R10(p) "%" #p "0, %" #p "1, %" #p "2, %" #p "3, %" #p "4, %" #p "5, %" #p "6, %" #p "7, %" #p "8, %" #p "9, "   // %p0 .. %p9
#define KL_WG_REGS_32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " KL_WG_R10(1) KL_WG_R10(2) "%30, %31"
#define KL_WG_REGS_64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " KL_WG_R10(1) KL_WG_R10(2) KL_WG_R10(3) KL_WG_R10(4) \
    KL_WG_R10(5) "%60, %61, %62, %63"
#define KL_WG_REGS_128 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " KL_WG_R10(1) KL_WG_R10(2) KL_WG_R10(3) KL_WG_R10(4) \
    KL_WG_R10(5) KL_WG_R10(6) KL_WG_R10(7) KL_WG_R10(8) KL_WG_R10(9) KL_WG_R10(10) KL_WG_R10(11)                  \
    "%120, %121, %122, %123, %124, %125, %126, %127"
#define KL_WG_D4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define KL_WG_D16(d, i) KL_WG_D4(d, i), KL_WG_D4(d, i + 4), KL_WG_D4(d, i + 8), KL_WG_D4(d, i + 12)
#define KL_WG_D_32(d) KL_WG_D16(d, 0), KL_WG_D16(d, 16)
#define KL_WG_D_64(d) KL_WG_D_32(d), KL_WG_D16(d, 32), KL_WG_D16(d, 48)
#define KL_WG_D_128(d) KL_WG_D_64(d), KL_WG_D16(d, 64), KL_WG_D16(d, 80), KL_WG_D16(d, 96), KL_WG_D16(d, 112)

// d (64 x N, fp32: N / 2 a thread) = A B + scale_d * d: A (64 x 16) and B (16 x N, K-major) both from shared memory,
// described by desc_a, desc_b.
template <int kN, typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 2], unsigned long long desc_a, unsigned long long desc_b,
                                         int scale_d);
// d (64 x N) += A B: A (64 x 16) from registers (a[4]: the mma.sync A fragment of each warp's 16 rows), B from
// shared memory MN-major (transposed: a [16 keys][N] tile read as B).
template <int kN, typename T>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[kN / 2], const unsigned (&a)[4], unsigned long long desc_b);

// d (64 x N) = A B + scale_d * d: A (64 x 16, K-major) from shared memory, B from shared memory MN-major
// (transposed: a [16 k][N] tile read as B, as wgmma_rs_tb reads it). The attention backward's dQ = dS K.
template <int kN, typename T>
__device__ __forceinline__ void wgmma_ss_tb(float (&d)[kN / 2], unsigned long long desc_a, unsigned long long desc_b,
                                            int scale_d);

// One specialisation per shape and type: the PTX spells both (m64nNk16, .bf16 / .f16) in the instruction's name.
// NREG = N / 2 accumulators; A, B, S: the operand numbers of desc_a, desc_b and scale_d (after the accumulators).
#ifdef __CUDA_ARCH__
#define KL_WGMMA_SS_BODY(N, NREG, PTX_T, A, B, S)                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                                   \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " {" KL_WG_REGS_##NREG "}, "      \
                 "%" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                                                              \
                 : KL_WG_D_##NREG(d) : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define KL_WGMMA_SS_TB_BODY(N, NREG, PTX_T, A, B, S)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                                   \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " {" KL_WG_REGS_##NREG "}, "      \
                 "%" #A ", %" #B ", p, 1, 1, 0, 1;\n}\n"                                                              \
                 : KL_WG_D_##NREG(d) : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define KL_WGMMA_RS_BODY(N, NREG, PTX_T, A0, A1, A2, A3, B)                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " {" KL_WG_REGS_##NREG "}, "      \
                 "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"                                \
                 : KL_WG_D_##NREG(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
#else
#define KL_WGMMA_SS_BODY(N, NREG, PTX_T, A, B, S) kl_emu::wgmma_ss<N, T>(d, desc_a, desc_b, scale_d)
#define KL_WGMMA_RS_BODY(N, NREG, PTX_T, A0, A1, A2, A3, B) kl_emu::wgmma_rs_tb<N, T>(d, a, desc_b)
#define KL_WGMMA_SS_TB_BODY(N, NREG, PTX_T, A, B, S) kl_emu::wgmma_ss_tb<N, T>(d, desc_a, desc_b, scale_d)
#endif
#define KL_WGMMA_SS(N, NREG, CTYPE, PTX_T, A, B, S)                                                                  \
    template <> __device__ __forceinline__ void wgmma_ss<N, CTYPE>(                                                  \
        float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {                     \
        using T = CTYPE;                                                                                             \
        KL_WGMMA_SS_BODY(N, NREG, PTX_T, A, B, S);                                                                  \
    }
#define KL_WGMMA_SS_TB(N, NREG, CTYPE, PTX_T, A, B, S)                                                               \
    template <> __device__ __forceinline__ void wgmma_ss_tb<N, CTYPE>(                                               \
        float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {                     \
        using T = CTYPE;                                                                                             \
        KL_WGMMA_SS_TB_BODY(N, NREG, PTX_T, A, B, S);                                                               \
    }
#define KL_WGMMA_RS(N, NREG, CTYPE, PTX_T, A0, A1, A2, A3, B)                                                        \
    template <> __device__ __forceinline__ void wgmma_rs_tb<N, CTYPE>(                                               \
        float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc_b) {                                     \
        using T = CTYPE;                                                                                             \
        KL_WGMMA_RS_BODY(N, NREG, PTX_T, A0, A1, A2, A3, B);                                                        \
    }
KL_WGMMA_SS(64, 32, __nv_bfloat16, "bf16", 32, 33, 34)
KL_WGMMA_SS(64, 32, __half, "f16", 32, 33, 34)
KL_WGMMA_SS(128, 64, __nv_bfloat16, "bf16", 64, 65, 66)
KL_WGMMA_SS(128, 64, __half, "f16", 64, 65, 66)
KL_WGMMA_SS(256, 128, __nv_bfloat16, "bf16", 128, 129, 130)
KL_WGMMA_SS(256, 128, __half, "f16", 128, 129, 130)
KL_WGMMA_SS_TB(64, 32, __nv_bfloat16, "bf16", 32, 33, 34)
KL_WGMMA_SS_TB(64, 32, __half, "f16", 32, 33, 34)
KL_WGMMA_SS_TB(128, 64, __nv_bfloat16, "bf16", 64, 65, 66)
KL_WGMMA_SS_TB(128, 64, __half, "f16", 64, 65, 66)
KL_WGMMA_RS(64, 32, __nv_bfloat16, "bf16", 32, 33, 34, 35, 36)
KL_WGMMA_RS(64, 32, __half, "f16", 32, 33, 34, 35, 36)
KL_WGMMA_RS(128, 64, __nv_bfloat16, "bf16", 64, 65, 66, 67, 68)
KL_WGMMA_RS(128, 64, __half, "f16", 64, 65, 66, 67, 68)

// The accumulator registers (and shared memory) written before are ready for the wgmmas issued next
// (wgmma.fence.sync.aligned).
__device__ __forceinline__ void wgmma_fence() {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    kl_emu::wgmma_fence();
#endif
}
// The wgmmas this warpgroup issued since the last commit become one group (wgmma.commit_group.sync.aligned).
__device__ __forceinline__ void wgmma_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    kl_emu::wgmma_commit();
#endif
}
// Wait until at most kGroups of this warpgroup's groups are still running (wgmma.wait_group.sync.aligned kGroups).
template <int kGroups>
__device__ __forceinline__ void wgmma_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kGroups) : "memory");
#else
    kl_emu::wgmma_wait<kGroups>();
#endif
}
// Keeps the compiler from moving reads of the accumulators across a wgmma_wait (they change behind its back).
template <int kCount>
__device__ __forceinline__ void fence_acc(float (&d)[kCount]) {
#ifdef __CUDA_ARCH__
#pragma unroll
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
    kl_emu::fence_acc(d);
#endif
}
