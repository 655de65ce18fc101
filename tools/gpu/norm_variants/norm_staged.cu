
// ---- candidate (tools/gpu/try_staged.py appends this file to tutorial 04's norm_kernels cell) -------------------
// Rows staged through shared memory by the bulk-copy engine. A persistent block of cols / (VPT * VEC) threads takes
// rows blockIdx.x, + gridDim.x, ... in turn; STAGES of them sit in shared memory: the row it works on and the next
// STAGES - 1, each brought by one cp.async.bulk (issued by thread 0, its bytes counted on the stage's mbarrier). The
// loads of later rows then stay in flight through this row's reductions and stores, where the cell's blocks have
// none in flight between their reduction and their exit (the suspect in small_rows.py's run B: at bf16 4096 x 4096
// under bench's write flush LayerNorm takes 1.17x and RMSNorm 1.08x a copy of the same geometry, 1.09x and 1.02x
// with a clean L2). w and b are read once per block, into registers.
// Needs rows 16-byte aligned and cols == blockDim.x * VPT * VEC (the launcher checks).
__device__ __forceinline__ void stage_init(unsigned long long* bar) {   // one arrival (the expect_tx) a phase
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(shared_addr(bar)) : "memory");
}
__device__ __forceinline__ void stage_fence() {                         // the inits, seen by the bulk copies
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void bulk_row(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(shared_addr(bar)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(shared_addr(dst)), "l"(src), "r"(bytes), "r"(shared_addr(bar)) : "memory");
}

// A block's sum; `part`: 32 floats this reduction alone uses until every thread has passed the next barrier.
__device__ __forceinline__ float staged_sum(float v, float* part) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_merge(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_merge(lane < (int)(blockDim.x / 32) ? part[lane] : 0.0f);
}

template <typename T, int VPT, int STAGES, bool LN>
__global__ void __launch_bounds__(1024) norm_staged(const T* __restrict__ x, const T* __restrict__ w,
                                                    const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                                    float eps) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(128) unsigned char staged_rows[];       // STAGES rows of x
    __shared__ unsigned long long full[STAGES];                         // stage s holds its row: phase done
    __shared__ float part[2][32];
    const unsigned row_bytes = cols * sizeof(T);
    const int t = threadIdx.x, stride = blockDim.x;
    if (t == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) stage_init(&full[s]);
        stage_fence();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {                              // turns 0 .. STAGES-1
            int row = blockIdx.x + s * gridDim.x;
            if (row < rows) bulk_row(staged_rows + s * row_bytes, x + (size_t)row * cols, row_bytes, &full[s]);
        }
    }
    Pack<T> wk[VPT], bk[VPT];                                           // pack t + j * stride of w and b
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        wk[j] = reinterpret_cast<const Pack<T>*>(w)[t + j * stride];
        if (LN) bk[j] = reinterpret_cast<const Pack<T>*>(b)[t + j * stride];
    }
    int turn = 0;
    for (int row = blockIdx.x; row < rows; row += gridDim.x, ++turn) {
        int s = turn % STAGES;
        exchange_wait(&full[s], (turn / STAGES) & 1);
        const Pack<T>* xs = reinterpret_cast<const Pack<T>*>(staged_rows + s * row_bytes) + t;
        Pack<T> pk[VPT];
#pragma unroll
        for (int j = 0; j < VPT; ++j) pk[j] = xs[j * stride];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT * VEC; ++i) acc = LN ? acc + at(pk, i) : fmaf(at(pk, i), at(pk, i), acc);
        acc = staged_sum(acc, part[LN ? 0 : turn & 1]);
        // Past that barrier every thread is done with the previous turn's row: its stage takes turn + STAGES - 1.
        if (t == 0 && turn > 0) {
            int prev = (turn - 1) % STAGES, next = row + (STAGES - 1) * gridDim.x;
            if (next < rows)
                bulk_row(staged_rows + prev * row_bytes, x + (size_t)next * cols, row_bytes, &full[prev]);
        }
        float mean = 0.0f, rstd;
        if (LN) {
            mean = acc / cols;
            keep_packed(pk);
            float m2 = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT * VEC; ++i) {
                float d = at(pk, i) - mean;
                m2 = fmaf(d, d, m2);
            }
            keep_packed(pk);
            rstd = rsqrtf(staged_sum(m2, part[1]) / cols + eps);
        } else {
            rstd = rsqrtf(acc / cols + eps);
        }
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y + (size_t)row * cols) + t;
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            float out[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                out[k] = LN ? fmaf((pk[j].get(k) - mean) * rstd, wk[j].get(k), bk[j].get(k))
                            : pk[j].get(k) * rstd * wk[j].get(k);
            yp[j * stride] = from_floats<T>(out);
        }
    }
}

#define NORM_STAGED(T, VPT, STAGES)                                                                                 \
    template __global__ void norm_staged<T, VPT, STAGES, true>(const T*, const T*, const T*, T*, int, int, float); \
    template __global__ void norm_staged<T, VPT, STAGES, false>(const T*, const T*, const T*, T*, int, int, float);
// 4 packs a thread: 64 registers, no spills (NVRTC, sm_90); 8 packs spill 200-460 bytes under the 1024 bound
NORM_STAGED(__nv_bfloat16, 4, 2) NORM_STAGED(__nv_bfloat16, 4, 3) NORM_STAGED(__nv_bfloat16, 4, 4)
NORM_STAGED(float, 4, 2) NORM_STAGED(float, 4, 3)
