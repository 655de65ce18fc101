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

// @cell-helpers: tutorial 06 wgmma cell's helpers, mbarrier_init through tile_coords (try_wgmma.variant_source)


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
