// Candidate for tutorial 07 (kernellab issue 12 item 3): fa3_persistent.cu (now step 3b of the notebook, fa3p_*; persistent grid, producer warpgroup with TMA,
// 2-3 consumer warpgroups with wgmma, dynamic or snake schedule; see step 3b for the schedule, the Q double buffer
// and the barrier phases, all unchanged here) with FA3's intra-warpgroup pipelining in the consumers. Kernels fa3q_*,
// defines FA3Q_*, so both files load side by side. tools/gpu/try_attention_pipe.py checks and times it;
// tests/test_attention_pipe.py runs it in the CPU emulator (tests/emu) and checks its SASS.
//
// What changes in a consumer's loop over an item's key tiles (FlashAttention-3, Algorithm 2):
//   tile 0:    issue S_0 = Q K_0^T; wait_group 0; softmax(S_0) -> P_0
//   tile j>=1: issue S_j = Q K_j^T; issue O += P_{j-1} V_{j-1};
//              wait_group 1 (S_j done; P V may still run); softmax(S_j) in place (masks, max, exponentials, l);
//              wait_group 0; release stage j-1 (its K and V); rescale O by alpha_j; P_j = pack(S_j)
//   after:     issue O += P_last V_last; wait_group 0; release the last stage
// so the softmax of tile j overlaps the P V product of tile j - 1 inside the warpgroup (the other warpgroups still
// overlap as before). Registers: O, S and the previous tile's P (BN / 4 more than fa3_persistent.cu, which can pack P
// as S dies): the producer gives its registers to the consumers with setmaxnreg (24 / 240 with 2 consumer
// warpgroups, 32 / 160 with 3); without it (FA3Q_SETMAXNREG=0) the kernels spill. d = 128 with 3 consumer warpgroups
// (160 registers) spills too, so d = 128 keeps 2. K/V stages: at least 2 (tile j's K is awaited before stage j - 1
// is released). The arithmetic is fa3_persistent.cu's, operation for operation: the same bits come out.
// ptxas hoists a wgmma.wait_group above register-only work it does not depend on, which put the second wait before
// the exponentials; a shared store of their sum (one per warp, never read) keeps them before it (the test checks
// the SASS). Not done: FA3's ping-pong of two consumer warpgroups with named barriers.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math_constants.h>
#include <cuda.h>   // CUtensorMap
typedef unsigned int uint32_t;

#ifndef FA3Q_BN64
#define FA3Q_BN64 128        // keys per tile at d = 64
#endif
#ifndef FA3Q_BN128
#define FA3Q_BN128 128       // keys per tile at d = 128
#endif
#ifndef FA3Q_WG64
#define FA3Q_WG64 3          // consumer warpgroups at d = 64: BLOCK_M = 192
#endif
#ifndef FA3Q_WG64C
#define FA3Q_WG64C 3         // consumer warpgroups at d = 64 with the causal mask
#endif
#ifndef FA3Q_WG128
#define FA3Q_WG128 2         // consumer warpgroups at d = 128: BLOCK_M = 128
#endif
#ifndef FA3Q_ST64
#define FA3Q_ST64 2          // K/V stages in flight
#endif
#ifndef FA3Q_ST128
#define FA3Q_ST128 2
#endif
#ifndef FA3Q_SETMAXNREG
#define FA3Q_SETMAXNREG 1    // 1: the producer gives registers to the consumers (setmaxnreg.dec / .inc)
#endif
#ifndef FA3Q_RESCALE_LOG2
#define FA3Q_RESCALE_LOG2 8.0f
#endif

// wgmma.mma_async wrappers: D[64 x N] (+)= A[64 x 16] B[16 x N] with fp32 accumulators, one per (N, dtype) used.
// wgmma_ss: A and B from shared memory (descriptors), both K-major; scale_d = 0 starts from zero.
// wgmma_rs_tb: A from registers (four 16-bit pairs, mma.sync's A layout), B from shared memory read N-major.
template <int N, typename T> __device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b, int scale_d);
template <int N, typename T> __device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], unsigned long long b);
template <> __device__ __forceinline__ void wgmma_ss<128, __nv_bfloat16>(float (&d)[64], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(scale_d));
}

template <> __device__ __forceinline__ void wgmma_rs_tb<64, __nv_bfloat16>(float (&d)[32], const uint32_t (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <> __device__ __forceinline__ void wgmma_rs_tb<128, __nv_bfloat16>(float (&d)[64], const uint32_t (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <> __device__ __forceinline__ void wgmma_ss<128, __half>(float (&d)[64], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(scale_d));
}

template <> __device__ __forceinline__ void wgmma_rs_tb<64, __half>(float (&d)[32], const uint32_t (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <> __device__ __forceinline__ void wgmma_rs_tb<128, __half>(float (&d)[64], const uint32_t (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// -- mbarrier -------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void fence_barrier_init() {      // make the inits visible to the TMA unit
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {   // arrive, and expect `bytes`
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {         // until phase `phase` completed
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(phase) : "memory");
    } while (!done);
}
// -- TMA: a [64 x rows] box of a 3-D tensor (d0 innermost) into shared memory, completing on `bar` ---------------------
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
// -- wgmma ----------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the registers d at this point of the program: the compiler may move neither their reads above a wgmma_wait
// (they change behind its back) nor the arithmetic that writes them below the next one (which would undo the overlap).
template <int N> __device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// setmaxnreg: this warpgroup's registers per thread go down (the producer) or up (the consumers), sm_90a
template <int R> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

namespace fa3q {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float RESCALE_LOG2 = FA3Q_RESCALE_LOG2;

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte offsets (all >> 4).
__device__ __forceinline__ unsigned long long sw128_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo_bytes >> 4) << 16) |
           ((unsigned long long)(sbo_bytes >> 4) << 32) | (1ull << 62);
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Work item -> (query block, batch*head). Sections of `hps` heads (the last may have fewer); inside one, query
// blocks outermost (heaviest first when causal), heads innermost.
template <bool CAUSAL>
__device__ __forceinline__ void item_coords(int item, int n_qblocks, int BH, int hps, bool alternate, int& qblock,
                                            int& bh) {
    const int per_section = hps * n_qblocks;
    const int sec = item / per_section;
    const int r = item - sec * per_section;
    const int heads = min(hps, BH - sec * hps);
    const int level = r / heads;
    bh = sec * hps + (r - level * heads);
    qblock = (CAUSAL && !(alternate && (sec & 1))) ? n_qblocks - 1 - level : level;
}

// The producer's next work item after item number `it` of this CTA (-1: no more). Static: round it + 1 of the snake.
// Dynamic: a draw from *counter; the draws of a launch number n_items in all (the successful ones, then one failing
// draw per CTA), so the one that returns n_items - 1 is the launch's last and puts the counter back to 0.
__device__ __forceinline__ int next_item(int it, int n_items, int* counter) {
    if (counter == nullptr) {
        const int round = it + 1;
        const int item = round * gridDim.x + ((round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
        return item < n_items ? item : -1;
    }
    const int drawn = atomicAdd(counter, 1);
    if (drawn == n_items - 1) atomicExch(counter, 0);
    const int item = gridDim.x + drawn;
    return item < n_items ? item : -1;
}

// S = Q K^T on the tensor cores, issued and committed, not waited for: D / 16 wgmmas of m64 n BN k16, both operands
// K-major in shared memory (Q rows 64 c .. of the item's Q tile).
template <typename T, int D, int BN, int BM>
__device__ __forceinline__ void issue_qk(float (&sacc)[BN / 2], uint32_t q_tile, uint32_t k_tile, int c) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned long long da = sw128_desc(q_tile + (kk / 4) * BM * 128 + 64 * c * 128 + (kk % 4) * 32, 16, 1024);
        const unsigned long long db = sw128_desc(k_tile + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
        wgmma_ss<BN, T>(sacc, da, db, kk > 0);
    }
    wgmma_commit();
}

// O += P V, issued and committed, not waited for: A = P from registers, B = V read N-major (transposed) from its
// [BN keys][64 dims] boxes. Until it retires, neither o nor p may be touched.
template <typename T, int D, int BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[BN / 16][4], uint32_t v_tile) {
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
        const unsigned long long dv = sw128_desc(v_tile + kc * 16 * 128, BN * 128, 1024);
        wgmma_rs_tb<D, T>(o, p[kc], dv);
    }
    wgmma_commit();
}

// The online softmax of one S tile (keys kv0 ..), in place: masks keys past N and (causal) past the row, moves the
// running max m lazily (only when the tile's max exceeds it by RESCALE_LOG2), scales l, and leaves
// exp2(S * scale_log2 - m) in sacc, summed into l. alpha: the factor O must be scaled by (applied by the caller once
// the P V in flight has retired); returns whether any row of the warp moved its max (else alpha is 1 everywhere).
template <int BN, bool CAUSAL>
__device__ __forceinline__ bool softmax_tile(float (&sacc)[BN / 2], int kv0, int N, int diag, int row0, int row1, int t,
                                             float scale_log2, float& m0, float& m1, float& l0, float& l1,
                                             float& alpha0, float& alpha1) {
    if (kv0 + BN > N || (CAUSAL && kv0 + BN - 1 > diag)) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int key = kv0 + 8 * (i / 4) + 2 * t + (i & 1);
            const int row = (i & 2) ? row1 : row0;
            if (key >= N || (CAUSAL && key > row)) sacc[i] = -CUDART_INF_F;
        }
    }
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {
        mx0 = fmaxf(mx0, fmaxf(sacc[i], sacc[i + 1]));
        mx1 = fmaxf(mx1, fmaxf(sacc[i + 2], sacc[i + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    mx0 *= scale_log2; mx1 *= scale_log2;
    const bool up0 = mx0 > m0 + RESCALE_LOG2, up1 = mx1 > m1 + RESCALE_LOG2;
    const float mn0 = up0 ? mx0 : m0, mn1 = up1 ? mx1 : m1;
    alpha0 = up0 ? exp2_approx(m0 - mn0) : 1.f;
    alpha1 = up1 ? exp2_approx(m1 - mn1) : 1.f;
    const float ref0 = mn0 == -CUDART_INF_F ? 0.f : mn0, ref1 = mn1 == -CUDART_INF_F ? 0.f : mn1;
    m0 = mn0; m1 = mn1;
    l0 *= alpha0; l1 *= alpha1;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {        // the order of fa3_persistent.cu's sums: the same l, bit for bit
        sacc[i] = exp2_approx(fmaf(sacc[i], scale_log2, -ref0));
        sacc[i + 1] = exp2_approx(fmaf(sacc[i + 1], scale_log2, -ref0));
        sacc[i + 2] = exp2_approx(fmaf(sacc[i + 2], scale_log2, -ref1));
        sacc[i + 3] = exp2_approx(fmaf(sacc[i + 3], scale_log2, -ref1));
        l0 += sacc[i] + sacc[i + 1]; l1 += sacc[i + 2] + sacc[i + 3];
    }
    return __any_sync(0xffffffffu, up0 || up1);
}

// The exponentials as 16-bit wgmma A fragments, 16 keys each (mma.sync's A layout).
template <typename T, int BN>
__device__ __forceinline__ void pack_p(const float (&sacc)[BN / 2], uint32_t (&p)[BN / 16][4]) {
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 8 * kc + 4 * h;
            p[kc][2 * h] = pack2<T>(sacc[i], sacc[i + 1]);
            p[kc][2 * h + 1] = pack2<T>(sacc[i + 2], sacc[i + 3]);
        }
}

// setmaxnreg split of the 64 K registers per SM (FA3's): the producer keeps 24 (2 consumers: 24 + 2 x 240 = 504 per
// thread column) or 32 (3 consumers: 32 + 3 x 160 = 512); the consumers take the rest.
template <int NCWG> struct ProducerRegs { static constexpr int value = NCWG == 2 ? 24 : 32; };
template <int NCWG> struct ConsumerRegs { static constexpr int value = NCWG == 2 ? 240 : 160; };

template <typename T, int D, int BN, int NCWG, int STAGES, bool CAUSAL>
__device__ __forceinline__ void attention_fwd_persistent(const void* tq, const void* tk, const void* tv,
                                                         T* __restrict__ O, int N, int BH, int heads_per_section,
                                                         int* __restrict__ work_counter, float scale) {
    constexpr int BM = 64 * NCWG;               // query rows per work item: 64 per consumer warpgroup
    constexpr int DB = D / 64;                  // 64-column blocks of the head dim (one TMA box each)
    constexpr uint32_t Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
    static_assert(STAGES >= 2, "tile j's K is awaited before tile j - 1's stage is released: at least 2 stages");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    const uint32_t q_s = base;                                   // [2][DB][BM][64]: two Q buffers
    const uint32_t k_s = q_s + 2 * Q_BYTES;                      // [STAGES][DB][BN][64]
    const uint32_t v_s = k_s + STAGES * KV_BYTES;                // [STAGES][DB][BN][64]
    const uint32_t bars = v_s + STAGES * KV_BYTES;               // full_q[2], empty_q[2], full_k[S], full_v[S], empty[S]
    const uint32_t full_q = bars, empty_q = bars + 16, full_k = bars + 32, full_v = full_k + 8 * STAGES,
                   empty = full_v + 8 * STAGES;
    // the work item whose Q is in buffer b (-1: none left), written by the producer before it arrives on full_q[b]
    volatile int* item_slot = reinterpret_cast<volatile int*>(smem_raw + (empty + 8 * STAGES - smem_u32(smem_raw)));
    volatile float* sink = reinterpret_cast<volatile float*>(item_slot + 2);   // [4 NCWG]: written, never read

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int n_qblocks = (N + BM - 1) / BM;
    const int n_items = n_qblocks * BH;
    const int n_tiles_all = (N + BN - 1) / BN;
    const int hps = max(1, min(heads_per_section, BH));

    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b) {
            mbar_init(full_q + 8 * b, 1);
            mbar_init(empty_q + 8 * b, 4 * NCWG);   // one arrival per consumer warp
        }
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_k + 8 * s, 1);
            mbar_init(full_v + 8 * s, 1);
            mbar_init(empty + 8 * s, 4 * NCWG);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (wg == 0) {                              // producer: one thread issues every copy, item after item
        if (FA3Q_SETMAXNREG) setmaxnreg_dec<ProducerRegs<NCWG>::value>();
        if (tid == 0) {
            int kv = 0;                         // K/V tiles loaded so far, over all items: stage kv % STAGES
            int item = blockIdx.x < n_items ? (int)blockIdx.x : -1;
            for (int it = 0;; ++it) {           // it: items so far, Q buffer it % 2
                const int qb = it & 1;
                // the buffer held item it - 2's Q: wait until every consumer warp has done its last S = Q K^T
                if (it >= 2) mbar_wait(empty_q + 8 * qb, ((it >> 1) - 1) & 1);
                item_slot[qb] = item;
                if (item < 0) {                 // no more work: release the consumers with an empty phase
                    mbar_arrive(full_q + 8 * qb);
                    break;
                }
                int qblock, bh;
                item_coords<CAUSAL>(item, n_qblocks, BH, hps, work_counter == nullptr, qblock, bh);
                const int q0 = qblock * BM;
                const int n_tiles = CAUSAL ? min(n_tiles_all, (q0 + BM + BN - 1) / BN) : n_tiles_all;
                mbar_expect_tx(full_q + 8 * qb, Q_BYTES);
                for (int b = 0; b < DB; ++b)
                    tma_load_3d(q_s + qb * Q_BYTES + b * BM * 128, tq, full_q + 8 * qb, 64 * b, q0, bh);
                for (int j = 0; j < n_tiles; ++j, ++kv) {
                    const int s = kv % STAGES;
                    if (kv >= STAGES) mbar_wait(empty + 8 * s, ((kv / STAGES) - 1) & 1);
                    mbar_expect_tx(full_k + 8 * s, KV_BYTES);
                    for (int b = 0; b < DB; ++b)
                        tma_load_3d(k_s + s * KV_BYTES + b * BN * 128, tk, full_k + 8 * s, 64 * b, j * BN, bh);
                    mbar_expect_tx(full_v + 8 * s, KV_BYTES);
                    for (int b = 0; b < DB; ++b)
                        tma_load_3d(v_s + s * KV_BYTES + b * BN * 128, tv, full_v + 8 * s, 64 * b, j * BN, bh);
                }
                item = next_item(it, n_items, work_counter);
            }
        }
        return;
    }

    // consumers: warpgroup c = wg - 1 owns query rows q0 + 64 c .. + 63 of each item; warp w of it rows 16 w ..
    if (FA3Q_SETMAXNREG) setmaxnreg_inc<ConsumerRegs<NCWG>::value>();
    const int c = wg - 1, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;
    int kv = 0;                                  // K/V tiles consumed so far, over all items: stage kv % STAGES
    for (int it = 0;; ++it) {
        const int qb = it & 1;
        mbar_wait(full_q + 8 * qb, (it >> 1) & 1);
        const int item = item_slot[qb];
        if (item < 0) break;
        int qblock, bh;
        item_coords<CAUSAL>(item, n_qblocks, BH, hps, work_counter == nullptr, qblock, bh);
        const int q0 = qblock * BM;
        const int n_tiles = CAUSAL ? min(n_tiles_all, (q0 + BM + BN - 1) / BN) : n_tiles_all;
        const uint32_t q_tile = q_s + qb * Q_BYTES;
        const int row0 = q0 + 64 * c + 16 * warp + g, row1 = row0 + 8;
        const int diag = q0 + 64 * c;            // this warpgroup's first query row: keys past diag + 63 are all masked
        float o[D / 2];                          // O: 64 x D per warpgroup; o[4 e + 0..1] row g, [4 e + 2..3] row g + 8
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.f, l1 = 0.f;
        float sacc[BN / 2];                      // S of the tile in hand, then its exponentials in place
        uint32_t p[BN / 16][4];                  // P of the previous tile as wgmma A fragments (read by its P V in flight)

        // tile 0: S_0 = Q K_0^T, waited for at once (nothing else to overlap it with inside this warpgroup)
        {
            const int s = kv % STAGES;
            mbar_wait(full_k + 8 * s, (kv / STAGES) & 1);
            issue_qk<T, D, BN, BM>(sacc, q_tile, k_s + s * KV_BYTES, c);
            wgmma_wait<0>();
            fence_acc(sacc);
            if (n_tiles == 1 && lane == 0) mbar_arrive(empty_q + 8 * qb);   // this warp is done with Q
            float alpha0, alpha1;               // O is still 0: nothing to rescale
            softmax_tile<BN, CAUSAL>(sacc, 0, N, diag, row0, row1, t, scale_log2, m0, m1, l0, l1, alpha0, alpha1);
            pack_p<T, BN>(sacc, p);
        }
        // tile j >= 1: issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; wait for S_j only (wait_group 1) and do its
        // softmax while P V runs on the tensor cores; then wait for P V, release its stage, rescale O, make P_j.
        for (int j = 1; j < n_tiles; ++j) {
            const int kj = kv + j, sj = kj % STAGES, sp = (kj - 1) % STAGES;
            mbar_wait(full_k + 8 * sj, (kj / STAGES) & 1);
            issue_qk<T, D, BN, BM>(sacc, q_tile, k_s + sj * KV_BYTES, c);
            mbar_wait(full_v + 8 * sp, ((kj - 1) / STAGES) & 1);
            issue_pv<T, D, BN>(o, p, v_s + sp * KV_BYTES);
            wgmma_wait<1>();                     // groups retire in order: S_j is done, P_{j-1} V_{j-1} may not be
            fence_acc(sacc);
            if (j == n_tiles - 1 && lane == 0) mbar_arrive(empty_q + 8 * qb);
            float alpha0, alpha1;
            const bool moved = softmax_tile<BN, CAUSAL>(sacc, j * BN, N, diag, row0, row1, t, scale_log2, m0, m1, l0, l1,
                                                        alpha0, alpha1);
            fence_acc(sacc);
            // ptxas would otherwise hoist the wait below above the exponentials (they are register-only), undoing the
            // overlap: a shared store of their sum, which it keeps before the wait, pins them here (one per warp).
            if (lane == 0) sink[4 * c + warp] = l0 + l1;
            wgmma_wait<0>();                     // P_{j-1} V_{j-1} is in O; p and stage sp are free
            fence_acc(o);
            if (lane == 0) mbar_arrive(empty + 8 * sp);
            if (moved) {
#pragma unroll
                for (int i = 0; i < D / 2; i += 4) { o[i] *= alpha0; o[i + 1] *= alpha0; o[i + 2] *= alpha1; o[i + 3] *= alpha1; }
            }
            pack_p<T, BN>(sacc, p);
        }
        // the last tile's O += P V
        {
            const int kl = kv + n_tiles - 1, sl = kl % STAGES;
            mbar_wait(full_v + 8 * sl, (kl / STAGES) & 1);
            issue_pv<T, D, BN>(o, p, v_s + sl * KV_BYTES);
            wgmma_wait<0>();
            fence_acc(o);
            if (lane == 0) mbar_arrive(empty + 8 * sl);
        }
        kv += n_tiles;
        // epilogue (the producer is already loading the next item's Q and K/V meanwhile)
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        T* out = O + (size_t)bh * N * D;
#pragma unroll
        for (int i = 0; i < D / 2; i += 4) {
            const int col = 8 * (i / 4) + 2 * t;
            if (row0 < N) *reinterpret_cast<uint32_t*>(out + (size_t)row0 * D + col) = pack2<T>(o[i] * inv0, o[i + 1] * inv0);
            if (row1 < N) *reinterpret_cast<uint32_t*>(out + (size_t)row1 * D + col) = pack2<T>(o[i + 2] * inv1, o[i + 3] * inv1);
        }
    }
}

}  // namespace fa3q

extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG64 + 1), 1)
fa3q_bf16_d64(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, __nv_bfloat16* __restrict__ o, int n, int bh, int heads_per_section,
              int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__nv_bfloat16, 64, FA3Q_BN64, FA3Q_WG64, FA3Q_ST64, false>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG64C + 1), 1)
fa3q_bf16_d64_causal(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tv, __nv_bfloat16* __restrict__ o, int n, int bh, int heads_per_section,
                     int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__nv_bfloat16, 64, FA3Q_BN64, FA3Q_WG64C, FA3Q_ST64, true>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG128 + 1), 1)
fa3q_bf16_d128(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, __nv_bfloat16* __restrict__ o, int n, int bh, int heads_per_section,
               int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__nv_bfloat16, 128, FA3Q_BN128, FA3Q_WG128, FA3Q_ST128, false>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG128 + 1), 1)
fa3q_bf16_d128_causal(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                      const __grid_constant__ CUtensorMap tv, __nv_bfloat16* __restrict__ o, int n, int bh, int heads_per_section,
                      int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__nv_bfloat16, 128, FA3Q_BN128, FA3Q_WG128, FA3Q_ST128, true>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG64 + 1), 1)
fa3q_f16_d64(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
             const __grid_constant__ CUtensorMap tv, __half* __restrict__ o, int n, int bh, int heads_per_section,
             int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__half, 64, FA3Q_BN64, FA3Q_WG64, FA3Q_ST64, false>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG64C + 1), 1)
fa3q_f16_d64_causal(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv, __half* __restrict__ o, int n, int bh, int heads_per_section,
                    int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__half, 64, FA3Q_BN64, FA3Q_WG64C, FA3Q_ST64, true>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG128 + 1), 1)
fa3q_f16_d128(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, __half* __restrict__ o, int n, int bh, int heads_per_section,
              int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__half, 128, FA3Q_BN128, FA3Q_WG128, FA3Q_ST128, false>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
extern "C" __global__ void __launch_bounds__(128 * (FA3Q_WG128 + 1), 1)
fa3q_f16_d128_causal(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tv, __half* __restrict__ o, int n, int bh, int heads_per_section,
                     int* __restrict__ work_counter, float scale) {
    fa3q::attention_fwd_persistent<__half, 128, FA3Q_BN128, FA3Q_WG128, FA3Q_ST128, true>(&tq, &tk, &tv, o, n, bh,
        heads_per_section, work_counter, scale);
}
