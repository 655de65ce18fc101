// sgemm_warptile as in notebooks/05-matmul.py at commit bf13cc7 (issue 13's tuning: 64 x 64 warp tiles, 16 x 8
// per lane, 128 threads, operands of k+1 loaded during k's FFMAs, a branch-free float4 path). Measured slower than
// the notebook's kernel (84.0 % of torch.mm at 4096^3 on an H100, 2026-11-23; benchmarks/NOTES-matmul.md); kept so
// that tools/gpu/try_sgemm.py can time it beside the notebook's cell.
// Tile sizes: the defaults below; compile with -DBM=... to try others (benchmarks/matmul.py sweeps them).
#ifndef BM
#define BM 128            // block tile: BM x BN of C ...
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8              // ... built from k-slices BK wide
#endif
#ifndef WM
#define WM 64             // warp tile: WM x WN of C; a lane holds (WM / 4) x (WN / 8) of it
#endif
#ifndef WN
#define WN 64
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2      // __launch_bounds__: blocks that must fit on one SM (caps registers at 64K / (2 x 128))
#endif
#define NTW ((BM / WM) * (BN / WN) * 32)   // threads per block: one warp per warp tile
#define TM (WM / 4)                        // a lane's rows: WM / 16 blocks of 4, 16 rows apart (4 lanes x 4 rows)
#define TN (WN / 8)                        // a lane's columns: WN / 32 blocks of 4, 32 apart (8 lanes x 4 columns)
#define APAD 4                             // As rows padded by one float4: the transposed stores miss each other
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiles must tile the block tile");
static_assert(BK % 4 == 0 && (BM * BK / 4) % NTW == 0 && (BK * BN / 4) % NTW == 0, "whole float4s per thread");

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

// One block's BM x BN tile of C. VEC (K and N multiples of 4) is the fast path; the other instance serves any shape.
template <bool VEC>
__device__ __forceinline__ void warptile_block(const float* __restrict__ A, const float* __restrict__ B,
                                               float* __restrict__ C, int M, int N, int K,
                                               float (&As)[2][BK][BM + APAD], float (&Bs)[2][BK][BN]) {
    constexpr int A4 = BM * BK / 4 / NTW, B4 = BK * BN / 4 / NTW;   // float4s each thread loads per k-slice
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;   // the warp's tile in the block's
    const int lr = lane / 8, lc = lane % 8;                                    // the lane's place in a 4 x 8 grid
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float4 ra[A4], rb[B4];                         // the next k-slice, on its way from global memory
    float a[2][TM], b[2][TN];                      // operands of this k (one half) and of the next (the other)
    float acc[TM][TN] = {};

    auto load_slice = [&](int k0) {                // global -> registers
#pragma unroll
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            ra[i] = load4<VEC>(A, bm + r, k0 + c, M, K);
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            rb[i] = load4<VEC>(B, k0 + r, bn + c, K, N);
        }
    };
    auto store_slice = [&](int s) {                // registers -> shared stage s
#pragma unroll
        for (int i = 0; i < A4; ++i) {
            int idx = tid + i * NTW, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            As[s][c + 0][r] = ra[i].x;
            As[s][c + 1][r] = ra[i].y;
            As[s][c + 2][r] = ra[i].z;
            As[s][c + 3][r] = ra[i].w;
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            int idx = tid + i * NTW, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[s][r][c]) = rb[i];
        }
    };
    auto load_operands = [&](int s, int k, int h) {   // shared stage s, row k -> a[h], b[h]: TM / 4 + TN / 4 LDS.128
#pragma unroll
        for (int mi = 0; mi < TM / 4; ++mi) {         // 4 distinct float4s across the warp: one wavefront
            float4 x = *reinterpret_cast<const float4*>(&As[s][k][wm0 + mi * 16 + lr * 4]);
            a[h][4 * mi] = x.x, a[h][4 * mi + 1] = x.y, a[h][4 * mi + 2] = x.z, a[h][4 * mi + 3] = x.w;
        }
#pragma unroll
        for (int ni = 0; ni < TN / 4; ++ni) {         // 8 distinct float4s, 128 contiguous bytes: one wavefront
            float4 y = *reinterpret_cast<const float4*>(&Bs[s][k][wn0 + ni * 32 + lc * 4]);
            b[h][4 * ni] = y.x, b[h][4 * ni + 1] = y.y, b[h][4 * ni + 2] = y.z, b[h][4 * ni + 3] = y.w;
        }
    };

    const int slices = (K + BK - 1) / BK;
    load_slice(0);
    store_slice(0);
    __syncthreads();
    load_operands(0, 0, 0);
    for (int t = 0; t < slices; ++t) {
        const int s = t & 1;
        const bool more = t + 1 < slices;
        if (more) load_slice((t + 1) * BK);        // global loads in flight during this slice's FFMAs
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k < BK - 1) {
                load_operands(s, k + 1, (k + 1) % 2);   // shared loads of k + 1 in flight during k's FFMAs
            } else if (more) {                     // last k: the next slice goes to the other stage, and its
                store_slice(s ^ 1);                // first operands are read after the one barrier per slice
                __syncthreads();
                load_operands(s ^ 1, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[k % 2][i] * b[k % 2][j];
        }
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int row = bm + wm0 + (i / 4) * 16 + lr * 4 + i % 4;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            int col = bn + wn0 + (j / 4) * 32 + lc * 4;
            if (VEC) {                             // N % 4 == 0: four columns are all inside or all outside
                if (col < N)
                    *reinterpret_cast<float4*>(&C[row * N + col]) = make_float4(acc[i][j], acc[i][j + 1],
                                                                                acc[i][j + 2], acc[i][j + 3]);
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
    if (K % 4 == 0 && N % 4 == 0) warptile_block<true>(A, B, C, M, N, K, As, Bs);   // rows start on 16 bytes
    else warptile_block<false>(A, B, C, M, N, K, As, Bs);
}
