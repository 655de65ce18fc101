"""On a GPU machine: the CPU path for CUDA C++ (kernellab.run.sim.cuda) computes what the GPU computes on the same
inputs, `%%cuda --sim` still launches on the CPU, `%%cpu` cells do nothing, and a plain `%%cuda` cell stays on the
GPU."""
import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import kernellab
from kernellab.run.sim.cuda import compiler

pytestmark = pytest.mark.gpu

needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler for the CPU path (pip install ziglang)")

TRANSPOSE = """#define TILE 32
#define ROWS 8
extern "C" __global__ void transpose_tile33(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int c = blockIdx.x * TILE + threadIdx.x, r = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        if (r + j < rows && c < cols) tile[threadIdx.y + j][threadIdx.x] = in[(r + j) * cols + c];
    __syncthreads();
    c = blockIdx.y * TILE + threadIdx.x, r = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        if (r + j < cols && c < rows) out[(r + j) * rows + c] = tile[threadIdx.x][threadIdx.y + j];
}
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
    __shared__ float part[8];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = i < n ? x[i] : 0.0f;
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < 8; ++w) t += part[w];
        partial[blockIdx.x] = t;
    }
}
"""


@needs_cxx
def test_cpu_path_computes_what_the_gpu_computes():
    gpu = kernellab.compile_cuda(TRANSPOSE, first_line=2, filename="cell.cu")
    cpu = kernellab.compile_cuda(TRANSPOSE, first_line=2, filename="cell.cu", simulate=True)
    rows, cols = 70, 45
    x = torch.randn(rows, cols)
    out_cpu, out_gpu = torch.empty(cols, rows), torch.empty(cols, rows, device="cuda")
    grid = ((cols + 31) // 32, (rows + 31) // 32)
    cpu.transpose_tile33[grid, (32, 8)](x, out_cpu, rows, cols)
    gpu.transpose_tile33[grid, (32, 8)](x.cuda(), out_gpu, rows, cols)
    assert torch.equal(out_cpu, out_gpu.cpu()) and torch.equal(out_cpu, x.t())
    n = 1000
    v = torch.randn(n)
    p_cpu, p_gpu = torch.empty(4), torch.empty(4, device="cuda")
    cpu.block_sum[4, 256](v, p_cpu, n)
    gpu.block_sum[4, 256](v.cuda(), p_gpu, n)
    assert torch.equal(p_cpu, p_gpu.cpu())             # the same additions in the same order: bit for bit


@needs_cxx
def test_sim_cell_runs_on_the_cpu_and_cpu_cells_do_nothing_on_a_gpu():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    assert ip.run_cell("%%cuda --name on_gpu\n" + TRANSPOSE).success
    assert not ip.user_ns["block_sum"].simulate and not any("CPU" in n for n in ip.user_ns["on_gpu"].notes)
    assert ip.run_cell("%%cuda --sim --name on_cpu\n" + TRANSPOSE).success
    assert ip.user_ns["block_sum"].simulate
    ip.user_ns["v"] = np.ones(300, np.float32)
    ip.user_ns["p"] = np.zeros(2, np.float32)
    assert ip.run_cell("block_sum[2, 256](v, p, 300)").success
    np.testing.assert_array_equal(ip.user_ns["p"], [256, 44])
    result = ip.run_cell("%%cpu\nran_on_cpu = True\n")
    assert result.success and "ran_on_cpu" not in ip.user_ns


@needs_cxx
def test_fibers_tensor_core_ptx_computes_what_the_gpu_computes():
    """Tutorial 05's mma_pipe (cp.async, ldmatrix, mma.sync) on the fiber runtime against the same kernel on the GPU:
    the fragment layouts, swizzles and zero-fills of the CPU's emulation checked on the hardware (the GPU's tensor
    cores add in their own order, so the bf16 results agree to rounding, not bit for bit)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import test_matmul as tm
    from kernellab.run.sim.cuda.emulate import compile_host

    v, cell = tm.pick("mma_pipe")
    name = v.kernels["bf16"]
    for M, N, K in ((130, 270, 40), (260, 140, 200)):
        A = torch.randn(M, K).to(torch.bfloat16)
        B = torch.randn(N, K).to(torch.bfloat16)
        grid = tm.grid_dims(v.grid(M, N))
        C_cpu = torch.full((M, N), float("nan")).to(torch.bfloat16)
        compile_host(cell.source)[name].launch(grid, v.block, A, B, C_cpu, M, N, K, shared_bytes=v.smem)
        gpu = tm.compiled(v, cell)
        C_gpu = torch.full((M, N), float("nan"), device="cuda").to(torch.bfloat16)
        gpu[name][grid, v.block, v.smem](A.cuda(), B.cuda(), C_gpu, M, N, K)
        ref = (A.double() @ B.double().t()).float()
        assert not torch.isnan(C_cpu.float()).any(), (M, N, K)
        torch.testing.assert_close(C_cpu.float(), C_gpu.cpu().float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(C_cpu.float(), ref, rtol=2e-2, atol=5e-2)
