// Session 7 candidate "cp3" (issue 13): cuBLAS's FP32 recipe on CUDA cores. C = A B, fp32, row-major.
// - Block tile BM x BN, k-slices BK deep, STAGES slices in flight through cp.async (LDGSTS): global -> shared with no
//   register staging, no STS and no register dependency on the loads.
// - 8 warps of 64 x 64; a lane holds 16 x 8 of C as 4 x 2 blocks of 4 x 4 (rows 16 apart, columns 32 apart), so its
//   operands per k are 4 + 2 LDS.128 (broadcasts: 4 and 8 distinct float4s per warp) for 128 FFMAs.
// - Operands double-buffered in registers: k + 1's LDS.128 are issued before k's FFMAs; the next slice's first
//   operands are loaded during the current slice's last FFMAs, after the one barrier per slice.
// - A is transposed on its way in by 4-byte cp.async (As[s][k][m]); B comes as 16-byte cp.async (Bs[s][k][n]) when
//   N % 4 == 0, else 4-byte ones. The edges are exact: a copy whose element lies outside A or B reads 0 source
//   bytes (cp.async zero-fills), so any M, N, K >= 1 works; C's stores are guarded.
// - GROUP_M > 0: blocks walk C in column strips GROUP_M block-rows tall (the L2 reuse order of Triton's matmul
//   tutorial); 0 keeps the launch order (blockIdx.x across N).
// Launch: grid (ceil(N / BN), ceil(M / BM)), NTW threads, cp3_smem_bytes() bytes of dynamic shared memory when it is
// over 48 KiB (the tiles are static below that: SMEM_BYTES).
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 8
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef GROUP_M
#define GROUP_M 0
#endif
#define NTW ((BM / WM) * (BN / WN) * 32)   // threads per block: one warp per warp tile
#define TM (WM / 4)                        // a lane's rows: WM / 16 blocks of 4, 16 apart (4 lanes x 4 rows)
#define TN (WN / 8)                        // a lane's columns: WN / 32 blocks of 4, 32 apart (8 lanes x 4 columns)
#define APAD 4                             // As rows padded by 4 floats: the 4-byte copies of a warp (4 m x 8 k)
                                           // land on 32 different banks at BK = 8
#define A_STAGE (BK * (BM + APAD))         // floats
#define B_STAGE (BK * BN)
#define SMEM_BYTES (STAGES * (A_STAGE + B_STAGE) * 4)
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiles must tile the block tile");
static_assert((BM * BK) % NTW == 0 && (BK * BN / 4) % NTW == 0, "whole copies per thread");
static_assert(STAGES >= 3, "the slice after next is refilled once the current one is read: 3 stages at least");

__device__ __forceinline__ void cp_async_4(unsigned smem_addr, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16(unsigned smem_addr, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <bool VECB>
__device__ __forceinline__ void cp3_block(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K, int bm, int bn, float* smem) {
    constexpr int A1 = BM * BK / NTW;                 // 4-byte copies of A per thread per slice
    constexpr int B4 = BK * BN / 4 / NTW;             // 16-byte copies of B per thread per slice
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int lr = lane / 8, lc = lane % 8;          // the lane's place in the warp's 4 x 8 grid
    const unsigned s_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    // Stage s at smem + s (A_STAGE + B_STAGE): As[BK][BM + APAD] (A transposed), then Bs[BK][BN].

    // This thread's copies, idx = tid + i NTW. A: element (row a_r0 + i NTW / BK, column k0 + a_c): BK consecutive
    // threads read one row's slice (32 bytes at BK = 8). B: float4 (row k0 + b_r0 + i NTW / (BN / 4), column b_c).
    // The pointers advance by one slice per load while the next slice starts inside A and B; a copy outside them
    // reads 0 bytes (zero-fill) from an address kept inside (rows clamped to M - 1, columns to K - 1). Shared
    // offsets are in bytes; a stage is STAGE_B bytes.
    constexpr int A_ROWS = NTW / BK, B_ROWS = NTW / (BN / 4);        // rows apart of a thread's successive copies
    constexpr unsigned STAGE_B = 4u * (A_STAGE + B_STAGE);
    const int a_c = tid % BK, a_r0 = tid / BK, b_c = (tid % (BN / 4)) * 4, b_r0 = tid / (BN / 4);
    const float* a_src = A + (size_t)min(bm + a_r0, M - 1) * K + min(a_c, K - 1);
    const size_t a_step = (size_t)A_ROWS * K;                         // elements between a thread's A copies
    const float* b_src = B + (size_t)min(b_r0, K - 1) * N + (bn + b_c < N ? bn + b_c : 0);   // col 0: aligned
    const size_t b_step = (size_t)B_ROWS * N;
    const int a_rows_left = M - bm - a_r0;                            // copy i is inside A's rows: i A_ROWS < this
    const int b_bytes = VECB ? max(0, min(16, 4 * (N - bn - b_c))) : 0;   // B's row tail past N zero-filled
    const unsigned a_dst = s_base + 4u * (a_c * (BM + APAD) + a_r0);
    const unsigned b_dst = s_base + 4u * (A_STAGE + b_r0 * BN + b_c);
    unsigned ld_off = 0;                                              // stage being filled, in bytes
    int k_left = K - a_c;                                             // this thread's A column: inside while > 0
    int kb_left = K - b_r0;                                           // this thread's first B row: likewise
    auto load_slice = [&]() {                         // the next slice -> stage ld_off (cp.async, one group)
#pragma unroll
        for (int i = 0; i < A1; ++i) {
            const bool ok = k_left > 0 && i * A_ROWS < a_rows_left;
            cp_async_4(a_dst + ld_off + 4u * i * A_ROWS, a_src + (ok ? i * a_step : 0), ok ? 4 : 0);
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            const unsigned dst = b_dst + ld_off + 4u * i * B_ROWS * BN;
            const bool kb = i * B_ROWS < kb_left;
            if (VECB) {                               // rows on 16 bytes: one copy, its tail zero-filled at N
                cp_async_16(dst, b_src + (kb ? i * b_step : 0), kb ? b_bytes : 0);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const bool ok = kb && bn + b_c + q < N;
                    cp_async_4(dst + 4u * q, b_src + (ok ? i * b_step + q : 0), ok ? 4 : 0);
                }
            }
        }
        cp_async_commit();
        if (k_left > BK) a_src += BK;                 // the pointers stay inside A and B (a copy of 0 bytes
        if (kb_left > BK) b_src += (size_t)BK * N;    // reads nothing, but its address stays a legal one)
        k_left -= BK, kb_left -= BK;
        ld_off = ld_off + STAGE_B == STAGES * STAGE_B ? 0 : ld_off + STAGE_B;
    };

    float a[2][TM], b[2][TN];                         // operands of k (one half) and of k + 1 (the other)
    float acc[TM][TN] = {};
    const float* frag_a = smem + wm0 + lr * 4;        // this lane's operands in stage 0, k = 0
    const float* frag_b = smem + A_STAGE + wn0 + lc * 4;
    auto load_frag = [&](int buf, int rd, int k) {    // shared -> registers: TM / 4 + TN / 4 LDS.128 (rd: floats)
        const float* as = frag_a + rd + k * (BM + APAD);
        const float* bs = frag_b + rd + k * BN;
#pragma unroll
        for (int mi = 0; mi < TM / 4; ++mi) {
            const float4 x = *reinterpret_cast<const float4*>(as + mi * 16);
            a[buf][4 * mi] = x.x, a[buf][4 * mi + 1] = x.y, a[buf][4 * mi + 2] = x.z, a[buf][4 * mi + 3] = x.w;
        }
#pragma unroll
        for (int ni = 0; ni < TN / 4; ++ni) {
            const float4 y = *reinterpret_cast<const float4*>(bs + ni * 32);
            b[buf][4 * ni] = y.x, b[buf][4 * ni + 1] = y.y, b[buf][4 * ni + 2] = y.z, b[buf][4 * ni + 3] = y.w;
        }
    };

    const int slices = (K + BK - 1) / BK;
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) load_slice();   // prologue: STAGES - 1 slices in flight (past K: zeros)
    cp_async_wait<STAGES - 2>();                      // slice 0 has landed (this thread's copies) ...
    __syncthreads();                                  // ... and everyone's
    constexpr int STAGE_F = A_STAGE + B_STAGE;
    int rd = 0;                                       // the stage being read, in floats
    load_frag(0, rd, 0);
    for (int t = 0; t < slices; ++t) {
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k == BK - 1) {
                // Slice t + 1 must be in shared memory before its first operands are read below. Groups committed
                // so far: slices 0 .. t + STAGES - 2; slices 0 .. t + 1 complete leaves STAGES - 3 in flight.
                cp_async_wait<STAGES - 3>();
                __syncthreads();                      // also: every warp has read stage (t - 1) % STAGES ...
                load_slice();                         // ... so it takes slice t + STAGES - 1 now (zeros past K)
                rd = rd + STAGE_F == STAGES * STAGE_F ? 0 : rd + STAGE_F;
                load_frag((k + 1) & 1, rd, 0);        // past the last slice: reads a stage nobody writes, unused
            } else {
                load_frag((k + 1) & 1, rd, k + 1);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[k & 1][i] * b[k & 1][j];
        }
    }
    cp_async_wait<0>();                               // only empty groups are left; none may outlive the thread

    for (int i = 0; i < TM; ++i) {
        const int row = bm + wm0 + (i / 4) * 16 + lr * 4 + i % 4;
        if (row >= M) continue;
        for (int j = 0; j < TN; j += 4) {
            const int col = bn + wn0 + (j / 4) * 32 + lc * 4;
            if (VECB && col + 3 < N) {
                *reinterpret_cast<float4*>(&C[(size_t)row * N + col]) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
            } else {
                for (int q = 0; q < 4; ++q)
                    if (col + q < N) C[(size_t)row * N + col + q] = acc[i][j + q];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTW, 1)
sgemm_warptile(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
#if SMEM_BYTES > 48 * 1024
    extern __shared__ __align__(16) float smem[];
#else
    __shared__ __align__(16) float smem[SMEM_BYTES / 4];
#endif
    int by = blockIdx.y, bx = blockIdx.x;
    if (GROUP_M > 0) {                                // strips of GROUP_M block-rows, walked column by column
        const int pid = blockIdx.y * gridDim.x + blockIdx.x, per_group = GROUP_M * gridDim.x;
        const int first = (pid / per_group) * GROUP_M, rows = min((int)gridDim.y - first, GROUP_M);
        by = first + (pid % per_group) % rows;
        bx = (pid % per_group) / rows;
    }
    if (N % 4 == 0) cp3_block<true>(A, B, C, M, N, K, by * BM, bx * BN, smem);
    else cp3_block<false>(A, B, C, M, N, K, by * BM, bx * BN, smem);
}
