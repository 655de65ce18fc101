"""Launching on a real GPU: torch tensors, CuPy arrays, scalars of every width, and every argument error."""
import subprocess
import sys
import textwrap

import pytest

import kernellab

pytestmark = pytest.mark.gpu

SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;    // one thread per element
    if (i < n) c[i] = a[i] + b[i];
}
__global__ void axpy(double alpha, const double* x, double* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += alpha * x[i];
}
__global__ void scale_half(__half* x, __half s, __nv_bfloat16* y, __nv_bfloat16 t, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] = __hmul(x[i], s); y[i] = __hmul(y[i], t); }
}
__global__ void big_smem(float* out) {
    extern __shared__ float buf[];                   // dynamic: > 48 KiB needs the opt-in
    int n = 100 * 1024 / 4;
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = buf[n - 1];
}
__global__ void __launch_bounds__(64) small_block(int* x) { x[threadIdx.x] = threadIdx.x; }
"""


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(SRC)


def test_arch_defaults_to_the_gpu(mod):
    import torch

    major, minor = torch.cuda.get_device_capability()
    assert mod.arch == f"sm_{major}{minor}" and not mod.notes


def test_vadd_on_torch_with_odd_size(mod):
    import torch

    n = 1_000_003
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full_like(a, float("nan"))
    mod.vadd[(n + 255) // 256, 256](a, b, c, n)
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_axpy_on_cupy_and_64_bit_scalars(mod):
    import cupy

    n = 4097
    x, y = cupy.random.rand(n), cupy.random.rand(n)
    want = y + 0.5 * x
    mod.axpy[(n + 127) // 128, 128](0.5, x, y, n)
    assert cupy.allclose(y, want, rtol=0, atol=1e-15)


def test_half_and_bfloat16_scalars(mod):
    import torch

    n = 1000
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x0, y0 = x.clone(), y.clone()
    mod.scale_half[4, 256](x, 2.0, y, 0.5, n)
    torch.testing.assert_close(x, x0 * 2)
    torch.testing.assert_close(y, y0 * 0.5)


def test_dynamic_shared_memory_above_48k_is_opted_in(mod):
    import torch

    out = torch.zeros(1, device="cuda")
    mod.big_smem[1, 256](out, shared_bytes=100 * 1024)
    assert out.item() == 100 * 1024 / 4 - 1


def test_resources_agree_with_the_driver(mod):
    from kernellab.run.launch.launch import function_attributes

    for k in mod.kernels:
        attrs = function_attributes(k._function(0))
        assert attrs["num_regs"] == k.resources.registers
        assert attrs["shared_size_bytes"] == k.resources.shared_bytes
        assert attrs["local_size_bytes"] == k.resources.local_bytes
        assert attrs["max_threads_per_block"] == k.resources.max_threads_per_block


def test_runs_on_torchs_current_stream(mod):
    import torch

    n = 1 << 20
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        mod.vadd[(n + 255) // 256, 256](a, b, c, n, sync=False)
        d = c * 2  # ordered after the kernel on the same stream
    s.synchronize()
    torch.testing.assert_close(d, (a + b) * 2)


@pytest.mark.parametrize("case,match", [
    ("dtype", r"'a'.*expects float32 elements but got a torch tensor \(dtype float16"),
    ("cpu", r"'a'.*on cpu; the kernel needs GPU memory"),
    ("noncontig", r"'a'.*non-contiguous"),
    ("count", r"takes 4 arguments, got 3"),
    ("scalar_for_pointer", r"'b'.*pointer parameter"),
    ("tensor_for_scalar", r"'n'.*scalar parameter"),
    ("block", r"2048 threads, more than this kernel's max_threads_per_block = 1024"),
    ("smem", r"per-block limit"),
])
def test_argument_errors_on_a_real_device(mod, case, match):
    import torch

    n = 256
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    grid, block, kw = 1, 256, {}
    args = [a, b, c, n]
    if case == "dtype":
        args[0] = a.half()
    elif case == "cpu":
        args[0] = a.cpu()
    elif case == "noncontig":
        args[0] = torch.randn(n, 2, device="cuda")[:, 0]
    elif case == "count":
        args = args[:3]
    elif case == "scalar_for_pointer":
        args[1] = 3
    elif case == "tensor_for_scalar":
        args[3] = a
    elif case == "block":
        block = 2048
    elif case == "smem":
        kw = {"shared_bytes": 1 << 20}
    with pytest.raises(kernellab.ArgumentError, match=match):
        mod.vadd[grid, block](*args, **kw)
    torch.cuda.synchronize()  # nothing was launched: the context is healthy


def test_launch_bounds_are_enforced(mod):
    import torch

    x = torch.zeros(128, dtype=torch.int32, device="cuda")
    with pytest.raises(kernellab.ArgumentError, match="max_threads_per_block = 64"):
        mod.small_block[1, 128](x)
    mod.small_block[1, 64](x)
    assert x[:64].tolist() == list(range(64))


def test_sticky_fault_raises_launch_error_in_a_fresh_process():
    code = textwrap.dedent(r"""
        import torch, kernellab
        m = kernellab.compile_cuda('extern "C" __global__ void oob(float* x) { x[threadIdx.x + (1ll << 40)] = 1; }')
        x = torch.zeros(32, device="cuda")
        try:
            m.oob[1, 32](x)
        except kernellab.LaunchError as e:
            print("STICKY" if e.sticky else "NOT-STICKY")
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "STICKY" in out.stdout, out.stdout + out.stderr
    assert "context" in out.stdout and "restart" in out.stdout
