"""`Kernel.profile_lines` on a real GPU: Nsight Compute's per-line figures beside the SASS of each cell line.

Needs ncu with access to the performance counters (strict=True: a missing ncu or counter permission fails the test).
"""
import pytest

import kernellab

pytestmark = pytest.mark.gpu

CELL = """\
extern "C" __global__ void t32(const float* in, float* out, int n) {
    __shared__ float tile[32][32];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
extern "C" __global__ void t33(const float* in, float* out, int n) {
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
"""
N = 1024
WARP_ACCESSES = N * N // 32


def line_of(text: str, after: int = 0) -> int:
    """The cell line (the magic is line 1) of the first CELL line after `after` containing `text`."""
    return next(i for i, line in enumerate(CELL.splitlines(), start=2) if i > after and text in line)


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(CELL, first_line=2, filename="cell.cu")


def test_profile_lines_measures_each_cell_line(mod):
    import torch

    x = torch.randn(N, N, device="cuda")
    out = torch.empty_like(x)
    view = mod.t32.profile_lines((N // 32, N // 32), (32, 32), x, out, N, strict=True)
    assert view.profiled and view.profile_note is None
    store, load = view.row(line_of("tile[threadIdx.y][threadIdx.x] = in[")), view.row(line_of("out[y * n + x]"))
    assert store.profile.global_bytes == N * N * 4 and load.profile.global_bytes == N * N * 4
    assert store.counts["shared_stores"] == 1 and load.counts["shared_loads"] == 1
    assert load.profile.shared_wavefronts == 32 * WARP_ACCESSES                 # the column read: 32-way
    assert load.profile.bank_conflict_wavefronts == 31 * WARP_ACCESSES
    assert store.profile.bank_conflict_wavefronts == 0
    assert view.row(line_of("__syncthreads")).profile.instructions_executed == WARP_ACCESSES
    assert sum(r.profile.stall_samples for r in view.rows if r.profile) > 0
    assert not out.isnan().any()                                                # the caller's tensors untouched
    print(view)


def test_padding_removes_the_conflicts_line_by_line(mod):
    import torch

    x = torch.randn(N, N, device="cuda")
    view = mod.t33.profile_lines((N // 32, N // 32), (32, 32), x, torch.empty_like(x), N, strict=True)
    first = line_of("t33")
    load = view.row(line_of("out[y * n + x]", after=first))
    assert load.profile.shared_wavefronts == WARP_ACCESSES and load.profile.bank_conflict_wavefronts == 0
