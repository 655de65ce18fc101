// Session 7 candidate "lean" (issue 13): the sgemm_warptile cell of notebooks/05-matmul.py (step 7: 128x128x16,
// warp tiles 64x32, a lane 16x4, A transposed through registers, one barrier per slice, 2 blocks/SM) with its main
// loop made lean:
// - two instances of the block (template<bool VEC>): where K % 4 == 0 and N % 4 == 0 (rows of A and B on 16 bytes)
//   every global load is one predicated LDG.128 (zeros past the edges, exact since a float4 is all inside or all
//   outside), so the loop holds no scalar fallback; other shapes take the scalar instance;
// - the FFMAs of a k-step walk the lane's 16 x 4 column by column, serpentine (down one column, up the next), so
//   each b[j] stays in the operand reuse cache for 16 FFMAs and the turn reuses a[i] too (ORDER=0: the cell's
//   row-by-row order).
// Tile sizes: the defaults below; compile with -DBM=... to try others (benchmarks/matmul.py sweeps them).
#ifndef BM
#define BM 128            // block tile: BM x BN of C ...
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 16             // ... built from k-slices BK wide
#endif
#ifndef WM
#define WM 64             // warp tile: WM x WN of C; a lane holds (WM / 4) x (WN / 8) of it
#endif
#ifndef WN
#define WN 32
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2      // __launch_bounds__: blocks that must fit on one SM (caps registers at 64K / (2 x 256))
#endif
#define NTW ((BM / WM) * (BN / WN) * 32)   // threads per block: one warp per warp tile
#define WMITER (WM / 16)                   // a lane's 4 x 4 blocks down the warp tile (4 lanes x 4 rows = 16 rows)
#define WNITER (WN / 32)                   // and across it (8 lanes x 4 columns = 32 columns)
#define APAD 4                             // As rows padded by one float4: the transposed stores miss each other
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiles must tile the block tile");
static_assert(BK % 4 == 0 && (BM * BK / 4) % NTW == 0 && (BK * BN / 4) % NTW == 0, "whole float4s per thread");

#ifndef ORDER
#define ORDER 1           // 1: column by column, serpentine; 0: the cell's order (row by row)
#endif

// Four floats of row `row`, columns col..col+3 of a rows x cols matrix, zeros past the edges. VEC: rows start on
// 16 bytes (cols % 4 == 0) and col % 4 == 0, so the four are all inside or all outside: one predicated LDG.128.
template <bool VEC>
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int row, int col, int rows, int cols) {
    if (VEC) return (row < rows && col < cols) ? *reinterpret_cast<const float4*>(&p[row * cols + col])
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v;
    v.x = (row < rows && col + 0 < cols) ? p[row * cols + col + 0] : 0.0f;
    v.y = (row < rows && col + 1 < cols) ? p[row * cols + col + 1] : 0.0f;
    v.z = (row < rows && col + 2 < cols) ? p[row * cols + col + 2] : 0.0f;
    v.w = (row < rows && col + 3 < cols) ? p[row * cols + col + 3] : 0.0f;
    return v;
}

template <bool VEC>
__device__ __forceinline__ void lean_block(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
        int M, int N, int K, float (&As)[2][BK][BM + APAD], float (&Bs)[2][BK][BN]) {
    constexpr int A4 = BM * BK / 4 / NTW, B4 = BK * BN / 4 / NTW;   // float4s each thread loads per k-slice
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;   // the warp's tile in the block's
    const int lr = lane / 8, lc = lane % 8;                                    // the lane's place in a 4 x 8 grid
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float4 ra[A4], rb[B4];                         // the next k-slice, on its way from global memory
    float acc[4 * WMITER][4 * WNITER] = {};

    auto load_slice = [&](int k0) {                // global -> registers
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            ra[i] = load4<VEC>(A, bm + r, k0 + c, M, K);
        }
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            rb[i] = load4<VEC>(B, k0 + r, bn + c, K, N);
        }
    };
    auto store_slice = [&](int s) {                // registers -> shared stage s
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            As[s][c + 0][r] = ra[i].x;
            As[s][c + 1][r] = ra[i].y;
            As[s][c + 2][r] = ra[i].z;
            As[s][c + 3][r] = ra[i].w;
        }
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[s][r][c]) = rb[i];
        }
    };

    const int slices = (K + BK - 1) / BK;
    load_slice(0);
    store_slice(0);
    __syncthreads();
    for (int t = 0; t < slices; ++t) {
        const int s = t & 1;
        if (t + 1 < slices) load_slice((t + 1) * BK);   // in flight while the FFMAs below run
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[4 * WMITER], b[4 * WNITER];
#pragma unroll
            for (int mi = 0; mi < WMITER; ++mi) {      // 4 distinct float4s across the warp: one wavefront
                float4 x = *reinterpret_cast<const float4*>(&As[s][k][wm0 + mi * 16 + lr * 4]);
                a[4 * mi] = x.x, a[4 * mi + 1] = x.y, a[4 * mi + 2] = x.z, a[4 * mi + 3] = x.w;
            }
#pragma unroll
            for (int ni = 0; ni < WNITER; ++ni) {      // 8 distinct float4s, 128 contiguous bytes: one wavefront
                float4 y = *reinterpret_cast<const float4*>(&Bs[s][k][wn0 + ni * 32 + lc * 4]);
                b[4 * ni] = y.x, b[4 * ni + 1] = y.y, b[4 * ni + 2] = y.z, b[4 * ni + 3] = y.w;
            }
#if ORDER
#pragma unroll
            for (int j = 0; j < 4 * WNITER; ++j)
#pragma unroll
                for (int ii = 0; ii < 4 * WMITER; ++ii) {
                    const int i = j % 2 ? 4 * WMITER - 1 - ii : ii;
                    acc[i][j] += a[i] * b[j];
                }
#else
#pragma unroll
            for (int i = 0; i < 4 * WMITER; ++i)
#pragma unroll
                for (int j = 0; j < 4 * WNITER; ++j) acc[i][j] += a[i] * b[j];
#endif
        }
        if (t + 1 < slices) store_slice(s ^ 1);        // the other stage: nobody reads it during this slice
        __syncthreads();
    }

    for (int i = 0; i < 4 * WMITER; ++i) {
        int row = bm + wm0 + (i / 4) * 16 + lr * 4 + i % 4;
        if (row >= M) continue;
        for (int j = 0; j < 4 * WNITER; j += 4) {
            int col = bn + wn0 + (j / 4) * 32 + lc * 4;
            if (VEC && col + 3 < N) {
                *reinterpret_cast<float4*>(&C[row * N + col]) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2],
                                                                            acc[i][j + 3]);
            } else {
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) C[row * N + col + q] = acc[i][j + q];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTW, MIN_BLOCKS)
sgemm_warptile(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[2][BK][BM + APAD];   // two stages; A transposed: As[s][k][m]
    __shared__ __align__(16) float Bs[2][BK][BN];          // Bs[s][k][n]
    if (K % 4 == 0 && N % 4 == 0) lean_block<true>(A, B, C, M, N, K, As, Bs);
    else lean_block<false>(A, B, C, M, N, K, As, Bs);
}
