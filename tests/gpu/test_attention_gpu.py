"""Tutorial 03's fused attention kernel against PyTorch's scaled_dot_product_attention, on awkward shapes.

The kernel is the tutorial's own: the `%%cuda` cell of notebooks/07-fused-attention.py, compiled as the magic
compiles it (first_line=2). The reference is SDPA in float64 (kernellab.check upcasts); tolerances are fp16's.
"""

import pytest

import kernellab
from notebook_cells import cuda_cell as notebook_cuda_cell

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

BLOCK_M, BLOCK_N, HEAD_DIM = 64, 16, 64   # as in the cell


def cuda_cell() -> str:
    """The notebook's `%%cuda` cell without its magic line: what the magic hands to compile_cuda."""
    return notebook_cuda_cell("07-fused-attention.py")


@pytest.fixture(scope="module")
def kernel():
    return kernellab.compile_cuda(cuda_cell(), first_line=2, filename="cell.cu").flash_attention_fwd


def launcher(kernel, causal):
    """The tutorial's wrapper: (q, k, v, out) [B, H, N, 64] fp16 -> out."""
    def attention(q, k, v, out):
        B, H, N, d = q.shape
        kernel[((N + BLOCK_M - 1) // BLOCK_M, B * H), BLOCK_M](q, k, v, out, N, d ** -0.5, int(causal))
        return out
    return attention


def inputs(B, H, N, amplitude=1.0):
    """q (times amplitude: larger scores, a peakier softmax), k, v ~ N(0, 1) in fp16, and an output buffer."""
    def make(g):
        q, k, v = (torch.randn(B, H, N, HEAD_DIM, generator=g) for _ in range(3))
        q, k, v = ((amplitude * q).half().cuda(), k.half().cuda(), v.half().cuda())
        return q, k, v, torch.empty_like(q)
    return make


def check(kernel, B, H, N, causal, amplitude=1.0, trials=2):
    return kernellab.check(launcher(kernel, causal),
                           lambda q, k, v, out: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                           inputs(B, H, N, amplitude), trials=trials, precision="float16")


def test_resources(kernel):
    r = kernel.resources
    assert not r.spills and r.local_bytes == 0, r            # q[], acc[] and s[] stayed in registers
    assert r.max_threads_per_block == BLOCK_M, r              # __launch_bounds__(BLOCK_M)
    assert r.shared_bytes == 2 * BLOCK_N * HEAD_DIM * 4, r    # the K and V tiles in fp32


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("B,H,N", [(1, 1, 1), (1, 2, 15), (1, 2, 16), (1, 2, 17), (1, 2, 63), (2, 1, 64),
                                   (2, 1, 65), (1, 1, 129), (1, 2, 1000), (2, 2, 1031)])
def test_matches_sdpa(kernel, B, H, N, causal):
    report = check(kernel, B, H, N, causal)
    assert report.passed, report


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_peaky_softmax(kernel, causal):
    """Scores of a few tens: the running max moves from tile to tile and the rescaling must be exact."""
    report = check(kernel, 1, 2, 777, causal, amplitude=4.0)
    assert report.passed, report


def test_many_heads(kernel):
    """gridDim.y = B * H = 320: every (batch, head) reads and writes only its own [N, D] slices."""
    report = check(kernel, 8, 40, 100, causal=False, trials=1)
    assert report.passed, report


def test_tutorial_shape(kernel):
    """The benchmark's shape, B = 4, H = 16, N = 4096, against SDPA in fp32 (one trial; float64 would be slow)."""
    g = torch.Generator().manual_seed(0)
    q, k, v, out = inputs(4, 16, 4096)(g)
    launcher(kernel, False)(q, k, v, out)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    err = (out.float() - ref).abs()
    assert torch.isfinite(out).all()
    assert (err <= 2e-3 * ref.pow(2).mean().sqrt() + 2e-3 * ref.abs()).all(), err.max()
