// Copy probes for tools/gpu/small_rows.py: y = x in 16-byte packs, to learn what a copy of a row kernel's bytes can
// reach at the small shapes (4096 x 1024) under kernellab.bench's flush, and which cache qualifiers or launch
// geometries move it. Thread t of a block copies packs base + t, base + t + blockDim.x, ... (P of them, all loaded
// before the first store), so each warp-wide load or store covers 512 contiguous bytes; blocks take chunks of
// P * blockDim.x packs, in a grid-stride loop (one turn when the grid covers the tensor).
//   LQ (loads):  0 ld.global, 1 ld.global.nc.L1::no_allocate, 2 that and an L2 evict_first policy, 3 ld.global.cs
//   SQ (stores): 0 st.global, 1 st.global.cs, 2 an L2 evict_first policy, 3 an L2 evict_last policy
#include <cuda_runtime.h>

template <int LQ>
__device__ __forceinline__ uint4 probe_load(const uint4* p, unsigned long long policy) {
    uint4 r;
    if constexpr (LQ == 0) {
        r = *p;
    } else if constexpr (LQ == 1) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    } else if constexpr (LQ == 2) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(policy));
    } else {
        asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    }
    return r;
}

template <int SQ>
__device__ __forceinline__ void probe_store(uint4* p, uint4 v, unsigned long long policy) {
    if constexpr (SQ == 0) {
        *p = v;
    } else if constexpr (SQ == 1) {
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    } else {
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                     :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy) : "memory");
    }
}

template <int P, int LQ, int SQ>
__global__ void __launch_bounds__(1024) copy_probe(const void* __restrict__ xv, void* __restrict__ yv, long long n) {
    const uint4* x = static_cast<const uint4*>(xv);    // n packs of 16 bytes
    uint4* y = static_cast<uint4*>(yv);
    unsigned long long load_policy = 0, store_policy = 0;
    if constexpr (LQ == 2) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(load_policy));
    if constexpr (SQ == 2) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(store_policy));
    if constexpr (SQ == 3) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(store_policy));
    long long chunk = (long long)P * blockDim.x;
    for (long long base = blockIdx.x * chunk; base < n; base += (long long)gridDim.x * chunk) {
        uint4 v[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {                        // pack base + j * blockDim.x + threadIdx.x
            long long q = base + j * blockDim.x + threadIdx.x;
            if (q < n) v[j] = probe_load<LQ>(x + q, load_policy);
        }
#pragma unroll
        for (int j = 0; j < P; ++j) {
            long long q = base + j * blockDim.x + threadIdx.x;
            if (q < n) probe_store<SQ>(y + q, v[j], store_policy);
        }
    }
}

#define COPY_PROBE(P, LQ, SQ) template __global__ void copy_probe<P, LQ, SQ>(const void*, void*, long long);
COPY_PROBE(1, 0, 0) COPY_PROBE(2, 0, 0) COPY_PROBE(4, 0, 0) COPY_PROBE(8, 0, 0)
COPY_PROBE(4, 1, 0) COPY_PROBE(4, 2, 0) COPY_PROBE(4, 3, 0)
COPY_PROBE(4, 0, 1) COPY_PROBE(4, 0, 2) COPY_PROBE(4, 0, 3)
COPY_PROBE(4, 2, 1) COPY_PROBE(4, 2, 2) COPY_PROBE(4, 3, 1)
