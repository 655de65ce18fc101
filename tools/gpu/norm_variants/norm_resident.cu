// Issue 14, session 7 candidate (measured slower, not in notebook 04): norm_resident, appended to the notebook's
// norm_kernels cell and cluster_barrier.cu by tests/test_norm_candidates.py. A cluster of C blocks of 1024
// threads x 4 packs takes rows in turn with its slice of w and b in shared memory; launch with
// grid = clusters x C, cluster (C, 1, 1) (2-16: 16 is the non-portable size), dynamic shared memory
// (LN ? 2 : 1) x 4 x blockDim.x x 16 bytes, cols % (16 / sizeof(T)) == 0, whole packs <= C x blockDim.x x 4.
// Measured on an H100 (session 7 run A, benchmarks/NOTES-memory-bound.md): 0.78-0.80x the one-row-a-cluster plans
// at 1024 x 262144 and 2048 x 131072. The suspect: barrier.cluster.arrive.release waits for this thread's
// outstanding memory operations, the next row's prefetched loads and this row's stores among them, so the
// prefetch does not overlap the barrier.

__device__ __forceinline__ unsigned cluster_nctarank() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}

template <typename T, int VPT>
__device__ __forceinline__ Welford resident_welford(const Pack<T> (&pk)[VPT], int valid, bool edge_ok, float edge) {
    constexpr int VEC = 16 / sizeof(T);
    float s = edge_ok ? edge : 0.0f;                      // packs past the row were loaded as 0
#pragma unroll
    for (int i = 0; i < VPT * VEC; ++i) s += at(pk, i);
    float n = valid * VEC + (edge_ok ? 1.0f : 0.0f);
    float mean = n > 0.0f ? s / n : 0.0f;
    float m2 = edge_ok ? (edge - mean) * (edge - mean) : 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float d = at(pk, j * VEC + k) - mean;
            m2 += j < valid ? d * d : 0.0f;
        }
    return Welford{n, mean, m2};
}

// ---- many long rows: w and b resident in shared memory ------------------------------------------------------
// The cluster kernels above re-read their slice of w (and b) for every row: a block's 128 KB of them does not stay
// in L1 while x streams through, so L2 serves w and b as many bytes as x again (twice for LayerNorm). Here a
// cluster owns rows in turn (rows c, c + clusters, ...; grid = the clusters that fit at once), each block keeps
// its slice of w and b in shared memory for all of them (each thread stores and reads only its own packs: no
// barrier), and x of the next row is loaded while this row is reduced and stored. A thread holds VPT = 4 packs
// of a row (pack q = rank x blockDim x 4 + threadIdx.x + j x blockDim), so a cluster of C blocks of 1024 holds
// rows of up to C x 4096 packs: 16 blocks (the non-portable cluster size) for a 1 MB fp32 row, 8 for bf16.
// Rows must be whole packs (cols % VEC == 0): then every row, w and b start on a 16-byte boundary.
// The partials are double-buffered by row parity, so one cluster barrier per row suffices: a block writes its
// partial for row i + 2 only after the barrier of row i + 1, which every block reaches after reading row i's.
template <typename S>
__device__ __forceinline__ S resident_merge(S v, S zero, int parity) {
    __shared__ S warp_part[2][32];
    __shared__ S block_part[2];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (lane == 0) warp_part[parity][warp] = v;
    __syncthreads();
    v = warp_merge(lane < (int)blockDim.x / 32 ? warp_part[parity][lane] : zero);
    if (threadIdx.x == 0) block_part[parity] = v;
    cluster_arrive();
    cluster_wait();
    return warp_merge(lane < (int)cluster_nctarank() ? *cluster_map(&block_part[parity], lane) : zero);
}

template <bool LN, typename T, int VPT>
__device__ __forceinline__ void resident_row(const Pack<T> (&pk)[VPT], const Pack<T>* wb, T* __restrict__ y,
                                             int cols, int whole, int first, int parity, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    const int stride = blockDim.x;
    int valid = min(VPT, max(0, (whole - first + stride - 1) / stride));
    float mean = 0.0f, var;
    if (LN) {
        Welford st = resident_merge(resident_welford(pk, valid, false, 0.0f), Welford{0.0f, 0.0f, 0.0f}, parity);
        mean = st.mean;
        var = st.m2 / cols;
    } else {
        float ss = 0.0f;                                  // packs past the row hold 0
#pragma unroll
        for (int i = 0; i < VPT * VEC; ++i) ss += at(pk, i) * at(pk, i);
        var = resident_merge(ss, 0.0f, parity) / cols;
    }
    float rstd = rsqrtf(var + eps);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        if (j >= valid) continue;
        Pack<T> wk = wb[j * stride + threadIdx.x];
        Pack<T> bk = LN ? wb[(VPT + j) * stride + threadIdx.x] : wk;
        float out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            out[k] = LN ? fmaf((at(pk, j * VEC + k) - mean) * rstd, wk.get(k), bk.get(k))
                        : at(pk, j * VEC + k) * rstd * wk.get(k);
        yp[first + j * stride] = from_floats<T>(out);
    }
}

// Launch: grid = clusters x C, cluster (C, 1, 1), blockDim.x threads, dynamic shared memory
// (LN ? 2 : 1) x VPT x blockDim.x x 16 bytes; needs cols % VEC == 0 and whole packs <= C x blockDim.x x VPT.
template <bool LN, typename T>
__global__ void __launch_bounds__(1024, 1) norm_resident(const T* __restrict__ x, const T* __restrict__ w,
                                                         const T* __restrict__ b, T* __restrict__ y, int rows,
                                                         int cols, float eps) {
    constexpr int VEC = 16 / sizeof(T), VPT = 4;
    extern __shared__ __align__(16) unsigned char resident_smem[];
    Pack<T>* wb = reinterpret_cast<Pack<T>*>(resident_smem);   // [VPT][blockDim.x] of w, then (LN) of b
    const int csize = cluster_nctarank(), clusters = gridDim.x / csize, whole = cols / VEC;
    const int first = cluster_ctarank() * blockDim.x * VPT + threadIdx.x;
    const RowLayout L(cols, 0, VEC);                      // lead 0: rows start on 16-byte boundaries
#pragma unroll
    for (int j = 0; j < VPT; ++j) {                       // this thread's packs of w and b, once for all rows
        int q = first + j * blockDim.x;
        if (q >= whole) continue;
        wb[j * blockDim.x + threadIdx.x] = reinterpret_cast<const Pack<T>*>(w)[q];
        if (LN) wb[(VPT + j) * blockDim.x + threadIdx.x] = reinterpret_cast<const Pack<T>*>(b)[q];
    }
    Pack<T> xa[VPT], xb[VPT];                             // this row and the next: two rows a trip
    int row = blockIdx.x / csize;
    if (row < rows) load_packs(xa, x + (size_t)row * cols, L, first, blockDim.x);
    while (row < rows) {
        int next = row + clusters;
        if (next < rows) load_packs(xb, x + (size_t)next * cols, L, first, blockDim.x);   // under row's work
        resident_row<LN>(xa, wb, y + (size_t)row * cols, cols, whole, first, 0, eps);
        if (next >= rows) break;
        row = next + clusters;
        if (row < rows) load_packs(xa, x + (size_t)row * cols, L, first, blockDim.x);
        resident_row<LN>(xb, wb, y + (size_t)next * cols, cols, whole, first, 1, eps);
    }
    cluster_arrive();                                     // no block leaves while another may read its partials
    cluster_wait();
}
template __global__ void norm_resident<true, float>(const float*, const float*, const float*, float*, int, int,
                                                    float);
template __global__ void norm_resident<false, float>(const float*, const float*, const float*, float*, int, int,
                                                     float);
template __global__ void norm_resident<true, __nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                            const __nv_bfloat16*, __nv_bfloat16*, int, int, float);
template __global__ void norm_resident<false, __nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                             const __nv_bfloat16*, __nv_bfloat16*, int, int, float);

