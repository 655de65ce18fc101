"""kernellab's device headers (kernellab/include/kl) on a GPU: each wrapper computes what its PTX promises, against
PyTorch (float64 references where sums are involved). The tutorials' own GPU tests run the same headers inside their
kernels (test_memory_bound_gpu, test_matmul_gpu, test_attention_gpu)."""
import pathlib
import sys

import pytest

import kernellab

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SRC = r"""
#include <kl/cp_async.cuh>
#include <kl/mma.cuh>
#include <kl/ptx.cuh>
#include <kl/reduce.cuh>
#include <kl/rows.cuh>

extern "C" __global__ void exp_k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = exp_ftz(x[i]);
}

// y = 2 x for one row of bf16 that starts `head` elements past a 16-byte boundary: packs, then the edge elements
extern "C" __global__ void row_k(const __nv_bfloat16* x, __nv_bfloat16* y, int cols, int head) {
    RowLayout L(cols, head, 8);
    Pack<__nv_bfloat16> pk[2];
    load_packs<Pad::zero>(pk, x, L, threadIdx.x, blockDim.x);
    float f[8];
    for (int j = 0; j < 2; ++j) {
        for (int k = 0; k < 8; ++k) f[k] = 2.0f * pk[j].get(k);
        pk[j] = from_floats<__nv_bfloat16>(f);
    }
    store_packs(pk, y, L, threadIdx.x, blockDim.x);
    int e = L.edge(threadIdx.x, cols);
    if (e >= 0) y[e] = from_float<__nv_bfloat16>(2.0f * to_float(x[e]));
}

extern "C" __global__ void reduce_k(const float* x, float* out) {     // one block; out: sum, max, warp 0's sum
    float v = x[threadIdx.x];
    float s = block_sum(v), m = block_max(v), w = warp_sum(v);
    if (threadIdx.x == 0) { out[0] = s; out[1] = m; out[2] = w; }
}

// C (16 x 8, fp32) = A (16 x 16) B^T (B: 8 x 16), fp16: A through ldmatrix_x4, B by the fragment layout, one MMA
extern "C" __global__ void mma_k(const __half* A, const __half* B, float* C) {
    __shared__ __align__(16) __half a_s[16 * 16];
    for (int i = threadIdx.x; i < 256; i += 32) a_s[i] = A[i];
    __syncthreads();
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned a[4];
    ldmatrix_x4(a, shared_addr(&a_s[(lane % 16) * 16 + (lane / 16) * 8]));
    const unsigned b[2] = {*reinterpret_cast<const unsigned*>(&B[g * 16 + 2 * t]),
                           *reinterpret_cast<const unsigned*>(&B[g * 16 + 2 * t + 8])};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_16816<__half>(d, a, b);
    C[g * 8 + 2 * t] = d[0];
    C[g * 8 + 2 * t + 1] = d[1];
    C[(g + 8) * 8 + 2 * t] = d[2];
    C[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// 64 chunks of 16 bytes through cp.async into shared memory; odd chunks zero-filled (src_bytes 0)
extern "C" __global__ void cp_async_k(const float* x, float* y) {
    __shared__ __align__(16) float4 s[64];
    cp_async_16(shared_addr(&s[threadIdx.x]), x + 4 * threadIdx.x, threadIdx.x % 2 ? 0 : 16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    reinterpret_cast<float4*>(y)[threadIdx.x] = s[63 - threadIdx.x];
}
"""


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(SRC, arch="sm_90")


def test_exp_ftz_is_exp_and_flushes_denormals(mod):
    x = torch.cat([torch.linspace(-80, 80, 10_001, device="cuda"), torch.tensor([-100.0, -88.0], device="cuda")])
    y = torch.full_like(x, float("nan"))
    mod.exp_k[(x.numel() + 255) // 256, 256](x, y, x.numel())
    ref = torch.exp(x.double())
    normal = ref > 2.0**-125
    # ex2.approx of x * log2(e) in fp32: the product's rounding dominates, |x log2 e| 2^-24 ln 2 (5e-6 at |x| = 80)
    torch.testing.assert_close(y[normal].double(), ref[normal], rtol=1e-5, atol=0)
    assert (y[ref < 2.0**-127] == 0).all() and y[-2] == 0          # denormal results are flushed to 0


@pytest.mark.parametrize("cols, head", [(1, 0), (7, 3), (8, 0), (9, 5), (100, 1), (250, 7)])
def test_a_row_moves_in_packs_and_edges(mod, cols, head):
    base = torch.randn(head + cols + 8, device="cuda").to(torch.bfloat16)     # torch's allocation: 16-byte aligned
    x = base[head:head + cols]
    out = torch.full_like(base, float("nan"))
    y = out[head:head + cols]
    mod.row_k[1, 16](x, y, cols, head)
    torch.testing.assert_close(y, (2 * x.float()).to(torch.bfloat16), rtol=0, atol=0)
    assert out[:head].isnan().all() and out[head + cols:].isnan().all()       # nothing outside the row written


def test_block_and_warp_reductions(mod):
    x = torch.randn(1024, device="cuda")
    out = torch.zeros(3, device="cuda")
    mod.reduce_k[1, 1024](x, out)
    torch.testing.assert_close(out[0].double(), x.double().sum(), rtol=1e-5, atol=1e-4)
    assert out[1] == x.max()
    torch.testing.assert_close(out[2].double(), x[:32].double().sum(), rtol=1e-5, atol=1e-5)


def test_ldmatrix_and_mma_16816_multiply(mod):
    A = torch.randn(16, 16, device="cuda").half()
    B = torch.randn(8, 16, device="cuda").half()
    C = torch.full((16, 8), float("nan"), device="cuda")
    mod.mma_k[1, 32](A, B, C)
    torch.testing.assert_close(C.double(), A.double() @ B.double().T, rtol=1e-4, atol=1e-3)


def test_cp_async_copies_and_zero_fills(mod):
    x = torch.randn(64 * 4, device="cuda")
    y = torch.full_like(x, float("nan"))
    mod.cp_async_k[1, 64](x, y)
    want = x.view(64, 4).clone()
    want[1::2] = 0.0
    torch.testing.assert_close(y.view(64, 4), want.flip(0), rtol=0, atol=0)


def test_the_cluster_exchange_delivers_every_block_the_others_values():
    """The kernels the CPU emulator runs in tests/test_emulator.py, on the GPU: <kl/cluster.cuh>'s exchange."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from test_emulator import exchange_source

    mod = kernellab.compile_cuda(exchange_source(), arch="sm_90")
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    y = torch.full((8,), float("nan"), device="cuda")
    mod.cluster_sums[8, 64](x, y)
    assert y.tolist() == [6.0] * 4 + [22.0] * 4
