// kl/mma.cuh: tensor cores through mma.sync (sm_80+): the m16n8k16 MMA with bf16 or fp16 inputs and fp32
// accumulators, and ldmatrix, which loads its operand fragments from shared memory.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"; g = lane / 4, t = lane % 4; two 16-bit values a register,
// the lower column in the low half):
//   a[4] (A 16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   b0, b1 (B 16 x 8, column-major): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   d[4] (D 16 x 8, fp32): d[0], d[1] = D[g][2t, 2t+1]; d[2], d[3] = D[g+8][2t, 2t+1]
// ldmatrix_x4 gives a warp four 8 x 8 matrices in exactly these layouts: one x4 is a whole A fragment, or the B
// fragments of two n8 tiles.
// Each function is inline PTX on the GPU; on the CPU the emulator (kernellab/run/sim/cuda/cuda_host.h) supplies kl_emu's.
#pragma once
#include "convert.cuh"

// ldmatrix: the warp reads four 8x8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix
// l / 8 and gets, of each matrix i, row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, packed in r[i].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr));
#else
    kl_emu::ldmatrix_x4(r, smem_addr);
#endif
}
// The same, each matrix transposed (.trans): lane l gets column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1. A [k][n]
// tile in shared memory so gives the column-major B fragments.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_addr) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr));
#else
    kl_emu::ldmatrix_x4_trans(r, smem_addr);
#endif
}

// d (16 x 8, fp32) += a (16 x 16, row-major) * b (16 x 8, column-major; registers b0, b1), inputs of type T
// (__nv_bfloat16 or __half), in the fragment layouts above: mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                                         unsigned b1) {
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    kl_emu::mma_16816<__nv_bfloat16>(d, a, b0, b1);
#endif
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    kl_emu::mma_16816<__half>(d, a, b0, b1);
#endif
}
// The same with the B fragment as one array b[2] (b[0] = b0, b[1] = b1).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    mma_16816<T>(d, a, b[0], b[1]);
}
