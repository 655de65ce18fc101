"""Small CUDA C++ kernels that use Hopper's instructions, shared by the sm_90a, tensor-map and SASS-summary tests."""

# wgmma through inline PTX: fence, one m64n8k16 bf16 product with an fp32 accumulator (descriptors are whatever the
# caller passes: compile-only), commit, wait. Compiles for sm_90a only.
WGMMA = r"""
__global__ void wgmma_tile(float* out, unsigned long long desc_a, unsigned long long desc_b) {
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "l"(desc_a), "l"(desc_b), "r"(1));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    int t = threadIdx.x;
    out[4 * t + 0] = d0; out[4 * t + 1] = d1; out[4 * t + 2] = d2; out[4 * t + 3] = d3;
}
"""

# setmaxnreg: a producer warpgroup gives registers back, the consumers take more (sm_90a only).
SETMAXNREG = r"""
__global__ void __launch_bounds__(384, 1) split_roles(float* out) {
    int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        out[threadIdx.x] = 1.0f;
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        out[threadIdx.x] = 2.0f;
    }
}
"""

# mma.sync m16n8k16 (bf16 in, fp32 accumulate) through inline PTX, fed by ldmatrix from shared memory, with a
# cp.async copy of the tile: HMMA, LDSM and LDGSTS in SASS on sm_80 and later.
MMA_SYNC = r"""
#include <cuda_bf16.h>
__global__ void mma_tile(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b, float* c) {
    __shared__ __align__(16) __nv_bfloat16 sa[16 * 16];
    __shared__ __align__(16) __nv_bfloat16 sb[16 * 8];
    int lane = threadIdx.x;
    // 16x16 A tile: 512 bytes = 32 lanes x 16 bytes; 16x8 B tile: 256 bytes = 16 lanes x 16 bytes
    unsigned sa_addr = static_cast<unsigned>(__cvta_generic_to_shared(sa + 8 * lane));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(sa_addr), "l"(a + 8 * lane));
    if (lane < 16) {
        unsigned sb_addr = static_cast<unsigned>(__cvta_generic_to_shared(sb + 8 * lane));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(sb_addr), "l"(b + 8 * lane));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    unsigned a0, a1, a2, a3, b0, b1;
    unsigned pa = static_cast<unsigned>(__cvta_generic_to_shared(sa + 16 * (lane % 16) + 8 * (lane / 16)));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(pa));
    unsigned pb = static_cast<unsigned>(__cvta_generic_to_shared(sb + 8 * (lane % 16)));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(b0), "=r"(b1) : "r"(pb));
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    float4* out = reinterpret_cast<float4*>(c);
    out[lane] = make_float4(d0, d1, d2, d3);
}
"""

# The same product through the WMMA API (mma.h): HMMA in SASS.
WMMA = r"""
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
__global__ void wmma_tile(const half* a, const half* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""

# A TMA tile copy: one thread issues cp.async.bulk.tensor (2D) into shared memory, completing on an mbarrier; the
# block then writes the tile out row-major. The tensor map is a __grid_constant__ parameter. BOX_ROWS x BOX_COLS
# floats per block; block (bx, by) copies the tile at column bx * BOX_COLS, row by * BOX_ROWS.
TMA_COPY = r"""
#include <cuda.h>
#ifndef BOX_ROWS
#define BOX_ROWS 16
#endif
#ifndef BOX_COLS
#define BOX_COLS 32
#endif
__global__ void tma_copy(const __grid_constant__ CUtensorMap tmap, float* out, int rows, int cols) {
    __shared__ alignas(1024) float tile[BOX_ROWS][BOX_COLS];   // 1024: the 128B swizzle pattern repeats every 8 rows of 128 B
    __shared__ alignas(8) unsigned long long bar;
    unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    unsigned tile_addr = static_cast<unsigned>(__cvta_generic_to_shared(&tile[0][0]));
    int x0 = blockIdx.x * BOX_COLS, y0 = blockIdx.y * BOX_ROWS;   // tensor coordinates, innermost first
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(bar_addr));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                     :: "r"(bar_addr), "r"((unsigned)sizeof(tile)) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];\n"
                     :: "r"(tile_addr), "l"(&tmap), "r"(x0), "r"(y0), "r"(bar_addr) : "memory");
    }
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        "@!done bra wait;\n"
        "}\n" :: "r"(bar_addr) : "memory");
    for (int i = threadIdx.x; i < BOX_ROWS * BOX_COLS; i += blockDim.x) {
        int r = i / BOX_COLS, c = i % BOX_COLS;
        if (y0 + r < rows && x0 + c < cols) out[(y0 + r) * cols + x0 + c] = tile[r][c];
    }
}
"""
