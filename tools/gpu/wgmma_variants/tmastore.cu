// Candidate for tutorial 06 step 4 (issue 13): the notebook's cell with its epilogue through shared memory and TMA
// stores. Each consumer warpgroup converts its 64 x 256 half to bf16/fp16 into a 64 x 64 staging box (128-byte
// swizzled rows: conflict-free 4-byte writes), and one of its threads stores the box with
// cp.async.bulk.tensor (TMA clips the edges: no per-element guards) and goes on; EPI_BUFS boxes per warpgroup let the
// next box fill while the previous one is stored. The consumers are back at the next tile's wgmmas as soon as their
// last box is in smem, not when 128 scattered 4-byte stores per thread have left the SM. Where the launch passes
// c_by_tma = 0 (C's rows not 16-byte multiples: N % 8 != 0), the epilogue is the cell's direct stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda.h>                 // CUtensorMap: the 128-byte tensor map kernellab.tensor_map encodes

#ifndef BN
#define BN 256                    // block tile BM x BN; each consumer warpgroup: 64 x BN with one wgmma m64nBNk16
#endif
#ifndef STAGES
#define STAGES 4                  // smem stages of (A: BM x 64, B: BN x 64) bf16: 48 KiB each at BN = 256;
                                  // 4 x 48 KiB + 2 x EPI_BUFS x 8 KiB of staging fit 227 KiB at EPI_BUFS 2
#endif
#ifndef GROUP_M
#define GROUP_M 8                 // tile order: GROUP_M rows of tiles are swept together (L2 reuse)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2               // CTAs per cluster along M: each loads its own A and half of the shared B tile,
#endif                            // which TMA multicasts to both (half the L2 traffic for B); 1: no cluster
#define BM 128                    // 2 consumer warpgroups x 64 rows
#define BK 64                     // 128-byte rows: what the 128-byte swizzle of TMA and wgmma expects
#define CONSUMERS 2
#define NTHREADS (128 * (CONSUMERS + 1))    // warpgroup 0 produces (TMA), 1 and 2 consume (wgmma)
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define B_PART_BYTES (B_BYTES / CLUSTER_M)     // the part of a B tile each CTA of a cluster loads and multicasts
static_assert(BN == 128 || BN == 256, "one wgmma m64nBNk16 per consumer per 16 of k");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");

#ifndef EPI_BUFS
#define EPI_BUFS 2                // staging boxes of 64 x 64 per consumer (one being stored, one filling)
#endif
#define C_BOX_BYTES (64 * 128)    // one staging box: 64 rows x 64 columns of C (128-byte rows)
#define EPI_BAR 1                 // named barriers 1, 2: consumer warpgroup (wg - 1)'s staging boxes
static_assert(EPI_BUFS >= 1 && EPI_BUFS <= 4, "1 to 4 staging boxes per consumer");

// --- mbarrier: a shared-memory barrier that counts arrivals and, for TMA, bytes ------------------------------------
__device__ __forceinline__ void mbarrier_init(unsigned bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void fence_barrier_init() {      // make the inits visible to the TMA unit
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with this parity has completed (a fresh barrier's "previous" phase, parity 1, has).
__device__ __forceinline__ void mbarrier_wait(unsigned bar, int parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// --- TMA: one instruction copies a whole box of a 2-D tensor into smem and counts its bytes on an mbarrier --------
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// --- wgmma: a warpgroup's asynchronous 64 x N x 16 product from smem, fp32 accumulators in registers ---------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads of the accumulators across a wgmma_wait (they change behind its back).
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// --- clusters: CTAs that see each other's shared memory -----------------------------------------------------------
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {            // every thread of every CTA of the cluster
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ unsigned mapa_shared(unsigned smem_addr, unsigned cta) {   // the same offset in CTA `cta`
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr), "r"(cta));
    return out;
}
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned cluster_bar) {      // an mbarrier of any CTA
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// TMA into the same smem offset of every CTA in `mask`, counting the bytes on each one's mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1,
                                                      unsigned bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
__device__ __forceinline__ void wgmma_256(float (&d)[128], unsigned long long desc_a,
                                          unsigned long long desc_b, __nv_bfloat16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
                   "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
                   "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
                   "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
                   "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
                   "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
                   "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                   "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_256(float (&d)[128], unsigned long long desc_a,
                                          unsigned long long desc_b, __half) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
                   "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
                   "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
                   "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
                   "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
                   "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
                   "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                   "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_128(float (&d)[64], unsigned long long desc_a,
                                          unsigned long long desc_b, __nv_bfloat16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_128(float (&d)[64], unsigned long long desc_a,
                                          unsigned long long desc_b, __half) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(1));
}

// The smem matrix descriptor of a K-major tile written by TMA with the 128-byte swizzle: rows of 128 bytes, 8-row
// groups 1024 bytes apart (the stride byte offset). Advancing the start address by 32 bytes moves 16 elements along k.
__device__ __forceinline__ unsigned long long make_desc(unsigned smem_addr) {
    return (unsigned long long)((smem_addr & 0x3FFFF) >> 4)   // bits 0-13: start address / 16
           | (1ull << 16)                                     // bits 16-29: leading byte offset (unused when swizzled)
           | ((unsigned long long)(1024 >> 4) << 32)          // bits 32-45: stride byte offset / 16
           | (1ull << 62);                                    // bits 62-63: 1 = 128-byte swizzle
}

__device__ __forceinline__ void store2(__nv_bfloat16* C, int row, int col, int M, int N, float x, float y) {
    if (row >= M) return;
    if (col + 1 < N && N % 2 == 0) {
        *reinterpret_cast<__nv_bfloat162*>(&C[(size_t)row * N + col]) = __floats2bfloat162_rn(x, y);
    } else {
        if (col < N) C[(size_t)row * N + col] = __float2bfloat16_rn(x);
        if (col + 1 < N) C[(size_t)row * N + col + 1] = __float2bfloat16_rn(y);
    }
}
__device__ __forceinline__ void store2(__half* C, int row, int col, int M, int N, float x, float y) {
    if (row >= M) return;
    if (col + 1 < N && N % 2 == 0) {
        *reinterpret_cast<__half2*>(&C[(size_t)row * N + col]) = __floats2half2_rn(x, y);
    } else {
        if (col < N) C[(size_t)row * N + col] = __float2half_rn(x);
        if (col + 1 < N) C[(size_t)row * N + col + 1] = __float2half_rn(y);
    }
}

// A consumer warp frees a stage: one arrival on that stage's `empty` barrier in every CTA of the cluster (each CTA's
// producer writes into all of them).
__device__ __forceinline__ void release(unsigned empty_bar) {
    if (CLUSTER_M == 1) {
        mbarrier_arrive(empty_bar);
    } else {
#pragma unroll
        for (unsigned cta = 0; cta < CLUSTER_M; ++cta) mbarrier_arrive_cluster(mapa_shared(empty_bar, cta));
    }
}

// Tile t of the persistent loop -> (tile row m, tile column n): GROUP_M tile rows at a time, column by column, so
// the blocks running at once share A's row panels and B's column panels in L2.
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& m, int& n) {
    int group = t / (GROUP_M * tiles_n), first_m = group * GROUP_M;
    int rows = min(tiles_m - first_m, GROUP_M), in_group = t % (GROUP_M * tiles_n);
    m = first_m + in_group % rows;
    n = in_group / rows;
}


// --- named barriers: bar.sync / bar.arrive on hardware barrier `id` (1-15; 0 is __syncthreads) for `threads` threads
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {      // arrive and go on: no wait
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// --- TMA store: one instruction copies a box of smem into the tensor (clipped at its edges), in bulk groups ----------
__device__ __forceinline__ void fence_proxy_async() {      // this thread's smem writes, visible to TMA (async proxy)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {    // at most N groups still reading their smem
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void tma_store_wait() {         // at most N groups not yet complete
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Two results as a packed bf16x2 / fp16x2 word into (generic-addressed) shared memory.
__device__ __forceinline__ void put2(unsigned char* p, float x, float y, __nv_bfloat16) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void put2(unsigned char* p, float x, float y, __half) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
// The 128-byte swizzle of TMA: 16-byte chunk (address bits 4-6) XOR 128-byte row within 1 KiB (bits 7-9).
__device__ __forceinline__ unsigned swizzle128(unsigned addr) { return addr ^ (((addr >> 7) & 7) << 4); }

template <typename T>
__device__ void wgmma_gemm(const CUtensorMap* tmA, const CUtensorMap* tmB, const CUtensorMap* tmC,
                           T* __restrict__ C, int M, int N, int K, int c_by_tma) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned base = (smem0 + 1023) & ~1023u;                                     // swizzle atoms: 1 KiB
    const unsigned sA = base, sB = base + STAGES * A_BYTES, sC = sB + STAGES * B_BYTES;  // sC: staging boxes
    const unsigned full = sC + CONSUMERS * EPI_BUFS * C_BOX_BYTES, empty = full + 8 * STAGES;   // STAGES mbarriers each
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const unsigned rank = CLUSTER_M > 1 ? cluster_ctarank() : 0;                       // this CTA in its cluster
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, slices = (K + BK - 1) / BK;
    // The persistent loop walks cluster tiles: CLUSTER_M tile rows (one per CTA) by one tile column.
    const int cluster_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M, cluster_tiles = cluster_rows * tiles_n;
    const int first = blockIdx.x / CLUSTER_M, stride = gridDim.x / CLUSTER_M;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + 8 * s, 1);                            // this CTA's producer (plus TMA's bytes)
            mbarrier_init(empty + 8 * s, CONSUMERS * 4 * CLUSTER_M);   // every consumer warp of the cluster
        }
        fence_barrier_init();
    }
    if (CLUSTER_M > 1) cluster_sync(); else __syncthreads();     // the barriers exist before anyone uses them

    if (wg == 0) {                                            // producer: one thread issues every TMA load
        setmaxnreg_dec<40>();
        if (t == 0) {
            int it = 0;                                       // k-slices issued so far, over all tiles
            for (int ct = first; ct < cluster_tiles; ct += stride) {
                int mc, n;
                tile_coords(ct, cluster_rows, tiles_n, mc, n);
                const int m = mc * CLUSTER_M + rank;          // this CTA's tile row (may lie past M: TMA reads zeros)
                for (int k = 0; k < slices; ++k, ++it) {
                    const int s = it % STAGES, phase = (it / STAGES) & 1;
                    mbarrier_wait(empty + 8 * s, phase ^ 1);  // every CTA's consumers have released this stage
                    mbarrier_arrive_expect_tx(full + 8 * s, A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, tmA, k * BK, m * BM, full + 8 * s);   // coordinates: {k, row}
                    if (CLUSTER_M == 1)
                        tma_load_2d(sB + s * B_BYTES, tmB, k * BK, n * BN, full + 8 * s);
                    else                                      // my part of B, into every CTA of the cluster
                        tma_load_2d_multicast(sB + s * B_BYTES + rank * B_PART_BYTES, tmB, k * BK,
                                              n * BN + rank * (BN / CLUSTER_M), full + 8 * s, (1 << CLUSTER_M) - 1);
                }
            }
        }
    } else {                                                  // consumers: warpgroup wg - 1 owns rows 64 (wg - 1)..
        setmaxnreg_inc<232>();
        const int half = wg - 1, warp = t / 32, lane = t % 32;
        float acc[BN / 2];
        int it = 0, chunk = 0;                                // chunk: boxes staged so far (buffer chunk % EPI_BUFS)
        const unsigned bufs = sC + half * EPI_BUFS * C_BOX_BYTES;
        for (int ct = first; ct < cluster_tiles; ct += stride) {
            int mc, n;
            tile_coords(ct, cluster_rows, tiles_n, mc, n);
            const int m = mc * CLUSTER_M + rank;
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
            for (int k = 0; k < slices; ++k, ++it) {
                const int s = it % STAGES, phase = (it / STAGES) & 1;
                mbarrier_wait(full + 8 * s, phase);           // TMA has delivered this stage's bytes
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {        // 4 x (64 x BN x 16), 32 bytes further along k each
                    unsigned long long da = make_desc(sA + s * A_BYTES + half * 64 * 128 + kk * 32);
                    unsigned long long db = make_desc(sB + s * B_BYTES + kk * 32);
                    if constexpr (BN == 256) wgmma_256(acc, da, db, T());
                    else wgmma_128(acc, da, db, T());
                }
                wgmma_commit();
                wgmma_wait<1>();                              // the previous slice's products are done ...
                if (k > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));   // ... free its stage
            }
            wgmma_wait<0>();
            fence_acc(acc);
            if (slices > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));
            // acc[4 j + q]: row 16 warp + lane / 4 (+ 8 for q >= 2), column 8 j + 2 (lane % 4) (+ 1 for odd q)
            if (c_by_tma) {
#pragma unroll
                for (int b = 0; b < BN / 64; ++b, ++chunk) {  // one 64 x 64 box per pass
                    const unsigned buf = bufs + (chunk % EPI_BUFS) * C_BOX_BYTES;
                    // The store that last read buf has read it. Only thread 0 has bulk groups; the others pass at
                    // once, and no branch precedes the bar.sync (.aligned: the whole warp executes it together).
                    tma_store_wait_read<EPI_BUFS - 1>();
                    named_bar_sync(EPI_BAR + half, 128);
#pragma unroll
                    for (int jj = 0; jj < 8; ++jj) {
                        const int j = 8 * b + jj, r = 16 * warp + lane / 4, col = 8 * jj + 2 * (lane % 4);
                        put2(smem + (swizzle128(buf + r * 128 + col * 2) - smem0), acc[4 * j], acc[4 * j + 1], T());
                        put2(smem + (swizzle128(buf + (r + 8) * 128 + col * 2) - smem0), acc[4 * j + 2],
                             acc[4 * j + 3], T());
                    }
                    fence_proxy_async();                      // my writes, visible to the TMA store
                    named_bar_sync(EPI_BAR + half, 128);      // the whole box is in smem
                    if (t == 0) {
                        tma_store_2d(tmC, buf, n * BN + 64 * b, m * BM + 64 * half);
                        tma_store_commit();
                    }
                }
            } else {
                const int row = m * BM + half * 64 + 16 * warp + lane / 4, col0 = n * BN + 2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    store2(C, row, col0 + 8 * j, M, N, acc[4 * j], acc[4 * j + 1]);
                    store2(C, row + 8, col0 + 8 * j, M, N, acc[4 * j + 2], acc[4 * j + 3]);
                }
            }
        }
        if (t == 0) tma_store_wait<0>();                      // smem read and C written before the CTA leaves
    }
    if (CLUSTER_M > 1) cluster_sync();       // no CTA leaves while another may still write its smem or barriers
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
tmastore_bf16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
              const __grid_constant__ CUtensorMap tmC, __nv_bfloat16* C, int M, int N, int K, int c_by_tma) {
    wgmma_gemm(&tmA, &tmB, &tmC, C, M, N, K, c_by_tma);
}
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
tmastore_f16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
             const __grid_constant__ CUtensorMap tmC, __half* C, int M, int N, int K, int c_by_tma) {
    wgmma_gemm(&tmA, &tmB, &tmC, C, M, N, K, c_by_tma);
}
