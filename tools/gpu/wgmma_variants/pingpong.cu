// Candidate for tutorial 06 step 4 (issue 13): "ping-pong" consumers. Each consumer warpgroup owns whole tiles of
// WM x WN (64 x 256: one wgmma m64n256k16 per 16 of k; or 128 x 128: two m64n128k16), 128 fp32 accumulators per
// thread either way. The CTA's tiles alternate between the two: tile 0 to consumer 0, tile 1 to consumer 1, ...
// The producer loads every tile's slices in order into one ring of stages; named barriers (bar.sync / bar.arrive)
// order the mainloops, so one warpgroup's epilogue (convert + store its tile) runs while the other's wgmmas keep the
// tensor cores busy. Everything else is the notebook's cell: TMA + mbarrier ring, setmaxnreg 40/232, persistent grid
// with GROUP_M tile order, clusters of 2 along M with B multicast. TMA_STORE=1 writes C through a swizzled smem
// staging buffer and TMA stores (one thread per warpgroup) where the launch passes c_by_tma = 1 (N % 8 == 0).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda.h>                 // CUtensorMap: the 128-byte tensor map kernellab.tensor_map encodes

#ifndef WM
#define WM 64                     // a consumer warpgroup's tile: WM x WN, WM = 64 (m64n256) or 128 (2 x m64n128)
#endif
#define WN (16384 / WM)           // 256 or 128: 128 accumulators per thread
#ifndef STAGES
#define STAGES 5                  // smem stages of (A: WM x 64, B: WN x 64) bf16: 40 KiB (WM 64), 32 KiB (WM 128)
#endif
#ifndef GROUP_M
#define GROUP_M (1024 / WM)       // tile order: GROUP_M rows of tiles (1024 rows of C) are swept together (L2 reuse)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2               // CTAs per cluster along M: each loads its own A and half of the shared B tile
#endif
#ifndef ORDERED
#define ORDERED 1                 // 1: named barriers alternate the consumers' mainloops; 0: only the data orders them
#endif
#ifndef TMA_STORE
#define TMA_STORE 0               // 1: the epilogue through smem and TMA stores (where the launch allows it)
#endif
#ifndef EPI_BUFS
#define EPI_BUFS 2                // TMA_STORE: staging buffers of WM x 64 per consumer (one in flight, one filling)
#endif
#define BK 64                     // 128-byte rows: what the 128-byte swizzle of TMA and wgmma expects
#define CONSUMERS 2
#define NTHREADS (128 * (CONSUMERS + 1))    // warpgroup 0 produces (TMA), 1 and 2 consume (wgmma)
#define A_BYTES (WM * BK * 2)
#define B_BYTES (WN * BK * 2)
#define B_PART_BYTES (B_BYTES / CLUSTER_M)     // the part of a B tile each CTA of a cluster loads and multicasts
#define C_BOX_BYTES (WM * 128)                 // one staging buffer: WM rows x 64 columns of C (128-byte rows)
#define ORDER_BAR 1                            // named barriers 1, 2: "consumer c may start its mainloop"
#define EPI_BAR 3                              // named barriers 3, 4: consumer c's staging buffer
static_assert(WM == 64 || WM == 128, "a consumer tile of 64 x 256 or 128 x 128");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");
static_assert(EPI_BUFS >= 1 && EPI_BUFS <= 4, "1 to 4 staging buffers per consumer");

// @cell-helpers: tutorial 06 wgmma cell's helpers, mbarrier_init through the TMA-store ones (try_wgmma.variant_source)


template <typename T>
__device__ void pingpong_gemm(const CUtensorMap* tmA, const CUtensorMap* tmB, const CUtensorMap* tmC,
                              T* __restrict__ C, int M, int N, int K, int c_by_tma) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned base = (smem0 + 1023) & ~1023u;                         // swizzle atoms: 1 KiB
    const unsigned sA = base, sB = base + STAGES * A_BYTES, sC = sB + STAGES * B_BYTES;
    const unsigned full = sC + (TMA_STORE ? CONSUMERS * EPI_BUFS * C_BOX_BYTES : 0), empty = full + 8 * STAGES;
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const unsigned rank = CLUSTER_M > 1 ? cluster_ctarank() : 0;
    const int tiles_m = (M + WM - 1) / WM, tiles_n = (N + WN - 1) / WN, slices = (K + BK - 1) / BK;
    const int cluster_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M, cluster_tiles = cluster_rows * tiles_n;
    const int first = blockIdx.x / CLUSTER_M, stride = gridDim.x / CLUSTER_M;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full + 8 * s, 1);                    // this CTA's producer (plus TMA's bytes)
            mbarrier_init(empty + 8 * s, 4 * CLUSTER_M);       // the 4 warps of the owning consumer, in every CTA
        }
        fence_barrier_init();
    }
    if (CLUSTER_M > 1) cluster_sync(); else __syncthreads();

    if (wg == 0) {                                            // producer: every tile's slices, in order
        setmaxnreg_dec<40>();
        if (t == 0) {
            int it = 0;
            for (int ct = first; ct < cluster_tiles; ct += stride) {
                int mc, n;
                tile_coords(ct, cluster_rows, tiles_n, mc, n);
                const int m = mc * CLUSTER_M + rank;
                for (int k = 0; k < slices; ++k, ++it) {
                    const int s = it % STAGES, phase = (it / STAGES) & 1;
                    mbarrier_wait(empty + 8 * s, phase ^ 1);
                    mbarrier_arrive_expect_tx(full + 8 * s, A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, tmA, k * BK, m * WM, full + 8 * s);
                    if (CLUSTER_M == 1)
                        tma_load_2d(sB + s * B_BYTES, tmB, k * BK, n * WN, full + 8 * s);
                    else
                        tma_load_2d_multicast(sB + s * B_BYTES + rank * B_PART_BYTES, tmB, k * BK,
                                              n * WN + rank * (WN / CLUSTER_M), full + 8 * s, (1 << CLUSTER_M) - 1);
                }
            }
        }
    } else {                                                  // consumer c takes this CTA's tiles c, c + 2, c + 4, ...
        setmaxnreg_inc<232>();
        const int c = wg - 1, warp = t / 32, lane = t % 32;
        float acc[WM / 64][WN / 2];
        int chunk = 0;                                        // TMA_STORE: boxes staged so far (buffer chunk % EPI_BUFS)
        int j = c;                                            // the tile's place in this CTA's sequence
        for (int ct = first + c * stride; ct < cluster_tiles; ct += 2 * stride, j += 2) {
            int mc, n;
            tile_coords(ct, cluster_rows, tiles_n, mc, n);
            const int m = mc * CLUSTER_M + rank;
#pragma unroll
            for (int h = 0; h < WM / 64; ++h)
#pragma unroll
                for (int i = 0; i < WN / 2; ++i) acc[h][i] = 0.0f;
            if (ORDERED && j > 0) named_bar_sync(ORDER_BAR + c, 256);   // the other consumer has issued its mainloop
            int it = j * slices;                              // the ring position of this tile's first slice
            for (int k = 0; k < slices; ++k, ++it) {
                const int s = it % STAGES, phase = (it / STAGES) & 1;
                mbarrier_wait(full + 8 * s, phase);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    const unsigned long long db = make_desc(sB + s * B_BYTES + kk * 32);
#pragma unroll
                    for (int h = 0; h < WM / 64; ++h) {
                        const unsigned long long da = make_desc(sA + s * A_BYTES + h * 64 * 128 + kk * 32);
                        if constexpr (WN == 256) wgmma_256(acc[h], da, db, T());
                        else wgmma_128(acc[h], da, db, T());
                    }
                }
                wgmma_commit();
                wgmma_wait<1>();
                if (k > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));
            }
            // My products are all issued: the other consumer may start its tile (if this CTA has one more).
            if (ORDERED && ct + stride < cluster_tiles) named_bar_arrive(ORDER_BAR + (c ^ 1), 256);
            wgmma_wait<0>();
#pragma unroll
            for (int h = 0; h < WM / 64; ++h) fence_acc(acc[h]);
            if (slices > 0 && lane == 0) release(empty + 8 * ((it - 1) % STAGES));
            // acc[h][4 j + q]: row 64 h + 16 warp + lane / 4 (+ 8 for q >= 2), column 8 j + 2 (lane % 4) (+ 1 odd q)
            if (TMA_STORE && c_by_tma) {
                const unsigned bufs = sC + c * EPI_BUFS * C_BOX_BYTES;
#pragma unroll
                for (int b = 0; b < WN / 64; ++b, ++chunk) {  // one box of WM x 64 per pass
                    const unsigned buf = bufs + (chunk % EPI_BUFS) * C_BOX_BYTES;
                    // The store that last read buf has read it. Only thread 0 has bulk groups; the others pass at
                    // once, and no branch precedes the bar.sync (.aligned: the whole warp executes it together).
                    tma_store_wait_read<EPI_BUFS - 1>();
                    named_bar_sync(EPI_BAR + c, 128);
#pragma unroll
                    for (int h = 0; h < WM / 64; ++h)
#pragma unroll
                        for (int jj = 0; jj < 8; ++jj) {
                            const int jc = 8 * b + jj, r = 64 * h + 16 * warp + lane / 4, col = 8 * jj + 2 * (lane % 4);
                            put2(smem + (swizzle128(buf + r * 128 + col * 2) - smem0), acc[h][4 * jc],
                                 acc[h][4 * jc + 1], T());
                            put2(smem + (swizzle128(buf + (r + 8) * 128 + col * 2) - smem0), acc[h][4 * jc + 2],
                                 acc[h][4 * jc + 3], T());
                        }
                    fence_proxy_async();
                    named_bar_sync(EPI_BAR + c, 128);         // the whole box is in smem
                    if (t == 0) {
                        tma_store_2d(tmC, buf, n * WN + 64 * b, m * WM);
                        tma_store_commit();
                    }
                }
            } else {
#pragma unroll
                for (int h = 0; h < WM / 64; ++h) {
                    const int row = m * WM + 64 * h + 16 * warp + lane / 4, col0 = n * WN + 2 * (lane % 4);
#pragma unroll
                    for (int jc = 0; jc < WN / 8; ++jc) {
                        store2(C, row, col0 + 8 * jc, M, N, acc[h][4 * jc], acc[h][4 * jc + 1]);
                        store2(C, row + 8, col0 + 8 * jc, M, N, acc[h][4 * jc + 2], acc[h][4 * jc + 3]);
                    }
                }
            }
        }
        if (TMA_STORE && t == 0) tma_store_wait<0>();        // smem is read and C written before the CTA leaves
    }
    if (CLUSTER_M > 1) cluster_sync();
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
pingpong_bf16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
              const __grid_constant__ CUtensorMap tmC, __nv_bfloat16* C, int M, int N, int K, int c_by_tma) {
    pingpong_gemm(&tmA, &tmB, &tmC, C, M, N, K, c_by_tma);
}
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
pingpong_f16(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
             const __grid_constant__ CUtensorMap tmC, __half* C, int M, int N, int K, int c_by_tma) {
    pingpong_gemm(&tmA, &tmB, &tmC, C, M, N, K, c_by_tma);
}
