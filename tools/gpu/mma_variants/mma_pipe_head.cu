// notebooks/06-tensor-cores.py, cell mma_pipe_cell, at commit 95f39db (before the tight main loop): the baseline
// tools/gpu/try_mma.py times the notebook's current cell against.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Tile sizes: defaults below; benchmarks/matmul.py sweeps others with -D options.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 32                      // 64-byte rows: 4 chunks of 16 bytes
#endif
#ifndef STAGES
#define STAGES 4                   // k-slices in flight: STAGES - 1 loading while one is computed
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#define NTHREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)          // warp tile: WM x WN, (WM / 16) x (WN / 8) mma tiles
#define WN (BN / WARPS_N)
#define CHUNKS (BK / 8)            // 16-byte chunks per smem row
static_assert(WM % 16 == 0 && WN % 16 == 0 && (CHUNKS == 2 || CHUNKS == 4 || CHUNKS == 8), "tile shapes");
static_assert((BM * CHUNKS) % NTHREADS == 0 && (BN * CHUNKS) % NTHREADS == 0, "whole chunks per thread");

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                          __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// cp.async: copy 16 bytes global -> shared without passing through registers; src_bytes < 16 zero-fills the rest.
__device__ __forceinline__ void cp_async_16(unsigned smem_addr, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

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

// The swizzle: 16-byte chunk c of smem row r is stored at chunk c ^ s(r). s(r) takes every value 0..CHUNKS-1 on
// any 8 consecutive rows that share their position in a 128-byte line, so the 8 rows of an ldmatrix (and a warp's
// cp.async stores) hit 8 different 16-byte bank groups.
__device__ __forceinline__ int swz(int r, int c) { return c ^ ((r / (8 / CHUNKS)) % CHUNKS); }
// Byte offset of element (r, k) of a [rows][BK] swizzled tile (k a multiple of 8: the start of a chunk).
__device__ __forceinline__ unsigned tile_off(int r, int k) { return (r * BK + swz(r, k / 8) * 8) * 2; }

// Issue the cp.async copies of one k-slice: rows [row0, row0 + rows_tile) of a [rows, K] matrix into a tile.
template <typename T>
__device__ __forceinline__ void load_async(unsigned tile, const T* __restrict__ src, int row0, int rows_tile, int rows,
                                           int k0, int K) {
    for (int i = threadIdx.x; i < rows_tile * CHUNKS; i += NTHREADS) {
        int r = i / CHUNKS, c = i % CHUNKS;
        bool in = row0 + r < rows && k0 + c * 8 < K;            // K % 8 == 0: a chunk is all in or all out
        const T* g = in ? &src[(size_t)(row0 + r) * K + k0 + c * 8] : src;
        cp_async_16(tile + tile_off(r, c * 8), g, in ? 16 : 0);
    }
}

template <typename T>
__device__ void mma_pipe_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N,
                              int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sA = (unsigned)__cvta_generic_to_shared(smem);        // STAGES tiles [BM][BK], then
    const unsigned sB = sA + STAGES * BM * BK * 2;                        // STAGES tiles [BN][BK]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int slices = (K + BK - 1) / BK;
    float acc[WM / 16][WN / 8][4] = {};

    // Prologue: the first STAGES - 1 slices in flight, one commit group each (empty groups keep the count).
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices) {
            load_async(sA + s * BM * BK * 2, A, bm, BM, M, s * BK, K);
            load_async(sB + s * BN * BK * 2, B, bn, BN, N, s * BK, K);
        }
        cp_async_commit();
    }
    for (int t = 0; t < slices; ++t) {
        cp_async_wait<STAGES - 2>();      // this thread's copies of slice t have landed ...
        __syncthreads();                  // ... and everyone's; and everyone is done computing slice t - 1
        const int next = t + STAGES - 1;  // refill the stage slice t - 1 used
        if (next < slices) {
            load_async(sA + (next % STAGES) * BM * BK * 2, A, bm, BM, M, next * BK, K);
            load_async(sB + (next % STAGES) * BN * BK * 2, B, bn, BN, N, next * BK, K);
        }
        cp_async_commit();
        const unsigned tA = sA + (t % STAGES) * BM * BK * 2, tB = sB + (t % STAGES) * BN * BK * 2;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)
                ldmatrix_x4(a[i], tA + tile_off(wm0 + 16 * i + lane % 16, kk + (lane / 16) * 8));
#pragma unroll
            for (int j = 0; j < WN / 16; ++j) {
                unsigned r[4];
                ldmatrix_x4(r, tB + tile_off(wn0 + 16 * j + lane % 8 + (lane / 16) * 8, kk + ((lane / 8) % 2) * 8));
                b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)
#pragma unroll
                for (int j = 0; j < WN / 8; ++j) mma_16816(acc[i][j], a[i], b[j], T());
        }
    }
    cp_async_wait<0>();                   // nothing may be left in flight when the block exits
#pragma unroll
    for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
            int row = bm + wm0 + 16 * i + lane / 4, col = bn + wn0 + 8 * j + 2 * (lane % 4);
            store2(C, row, col, M, N, acc[i][j][0], acc[i][j][1]);
            store2(C, row + 8, col, M, N, acc[i][j][2], acc[i][j][3]);
        }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_pipe_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K) {
    mma_pipe_gemm(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_pipe_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    mma_pipe_gemm(A, B, C, M, N, K);
}
