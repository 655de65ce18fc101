// ---- candidate "2read" (issue 14, session 5): tools/gpu/try_norms.py appends this file to the notebook's
// norm_kernels cell and uses its helpers (Pack, Welford, merge, row_merge, at, from_floats). ---------------------
// What torch.compile's Inductor kernel for a long row does, written out: nothing held in registers across the
// reduction. Pass 1 streams the row from DRAM in chunks of U1 packs a thread (Welford per chunk: the chunk's exact
// mean and squared deviations, merged into the thread's triple with Chan's formula), keeping the lines in L2
// (ld ... L2::evict_last); one merge across the row; pass 2 streams the row again from L2 (L2::evict_first) with
// w and b, U2 packs a thread, and writes y. A thread never waits on a phase with nothing in flight longer than one
// chunk, and a thread's registers (<= 32: __launch_bounds__(1024, 2)) let an SM run 2048 threads, so 2 rows of
// 1024 threads or 4 of 512 are in flight per SM. The price: the L2 serves x twice, and the rows in flight
// (2 x 132 x 128 KB = 35 MB at 4096 x 32768 fp32 with 1024 threads a row) must stay in the 50 MB L2 between passes.
// Rows must start on a 16-byte boundary (cols % VEC == 0; the launcher checks): no edge elements.
template <typename T>
__device__ __forceinline__ Pack<T> load_keep(const Pack<T>* p) {      // first read: keep the line in L2
#ifdef __CUDA_ARCH__
    Pack<T> r;                                          // sm_90 takes L2 priorities on 16-byte loads as a policy
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(policy));
    return r;
#else
    return *p;                                                          // the CPU emulation: a plain load
#endif
}
template <typename T>
__device__ __forceinline__ Pack<T> load_last(const Pack<T>* p) {      // second read: the line's last use
#ifdef __CUDA_ARCH__
    Pack<T> r;
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3]) : "l"(p), "l"(policy));
    return r;
#else
    return *p;
#endif
}

// LN: LayerNorm (w, b) or RMSNorm (w only). row_threads threads per row (a multiple of 32), blockDim.x /
// row_threads rows per block; grid = ceil(rows / rows per block).
template <typename T, int U1, int U2, bool LN>
__device__ __forceinline__ void norm_tworead(const T* __restrict__ x, const T* __restrict__ w,
                                             const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                             int row_threads, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    int row = blockIdx.x * (blockDim.x / row_threads) + threadIdx.x / row_threads;
    int t = threadIdx.x % row_threads;
    bool live = row < rows;                               // spare rows of a last block still meet at the barrier
    int whole = live ? cols / VEC : 0;                    // the row's packs
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x + (size_t)(live ? row : 0) * cols);
    Welford st{0.0f, 0.0f, 0.0f};
    float ss = 0.0f;
    for (int q0 = t; q0 < whole; q0 += row_threads * U1) {        // pass 1: DRAM -> registers, lines kept in L2
        Pack<T> pk[U1];
        int valid = 0;
#pragma unroll
        for (int u = 0; u < U1; ++u) {
            int q = q0 + u * row_threads;
            if (q < whole) {
                pk[u] = load_keep(xp + q);
                ++valid;
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) pk[u].u[i] = 0u;
            }
        }
        if (LN) {                                        // this chunk's exact mean and M2, then Chan's merge
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < U1 * VEC; ++i) s += at(pk, i);
            float n = valid * VEC, mean = s / n, m2 = 0.0f;   // valid >= 1: q0 < whole
#pragma unroll
            for (int u = 0; u < U1; ++u)
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = at(pk, u * VEC + k) - mean;
                    m2 += u < valid ? d * d : 0.0f;
                }
            st = merge(st, Welford{n, mean, m2});
        } else {
#pragma unroll
            for (int i = 0; i < U1 * VEC; ++i) ss += at(pk, i) * at(pk, i);
        }
    }
    float mean = 0.0f, rstd;
    if (LN) {
        st = row_merge<1>(st, Welford{0.0f, 0.0f, 0.0f}, row_threads / 32);
        mean = st.mean;
        rstd = rsqrtf(st.m2 / cols + eps);
    } else {
        ss = row_merge<1>(ss, 0.0f, row_threads / 32);
        rstd = rsqrtf(ss / cols + eps);
    }
    const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w);
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y + (size_t)(live ? row : 0) * cols);
    for (int q0 = t; q0 < whole; q0 += row_threads * U2) {        // pass 2: L2 -> y, with w and b
        Pack<T> pk[U2], wk[U2], bk[U2];
#pragma unroll
        for (int u = 0; u < U2; ++u) {
            int q = q0 + u * row_threads;
            if (q < whole) {
                pk[u] = load_last(xp + q);
                wk[u] = wp[q];
                if (LN) bk[u] = bp[q];
            }
        }
#pragma unroll
        for (int u = 0; u < U2; ++u) {
            int q = q0 + u * row_threads;
            if (q >= whole) continue;
            float out[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                out[k] = LN ? fmaf((pk[u].get(k) - mean) * rstd, wk[u].get(k), bk[u].get(k))
                            : pk[u].get(k) * rstd * wk[u].get(k);
            yp[q] = from_floats<T>(out);
        }
    }
}

template <typename T, int U1, int U2>
__global__ void __launch_bounds__(1024, 2) layernorm_tworead(const T* __restrict__ x, const T* __restrict__ w,
                                                             const T* __restrict__ b, T* __restrict__ y, int rows,
                                                             int cols, int row_threads, float eps) {
    norm_tworead<T, U1, U2, true>(x, w, b, y, rows, cols, row_threads, eps);
}

template <typename T, int U1, int U2>
__global__ void __launch_bounds__(1024, 2) rmsnorm_tworead(const T* __restrict__ x, const T* __restrict__ w,
                                                           T* __restrict__ y, int rows, int cols, int row_threads,
                                                           float eps) {
    norm_tworead<T, U1, U2, false>(x, w, w, y, rows, cols, row_threads, eps);
}

#define TWOREAD_LN(U1, U2)                                                                                     \
    template __global__ void layernorm_tworead<float, U1, U2>(const float*, const float*, const float*, float*, int, \
                                                              int, int, float);
TWOREAD_LN(2, 1)      // (4, 1) and (2, 2) spill under 32 registers (Chan's merge per chunk); RMSNorm's (4, 2) fits
template __global__ void rmsnorm_tworead<float, 4, 2>(const float*, const float*, float*, int, int, int, float);
