"""The launch path on a real GPU: CUDA graph capture, torch streams, threads, and the cached plans."""
import threading

import pytest

import kernellab

pytestmark = pytest.mark.gpu

SRC = r"""
extern "C" __global__ void axpb(const float* x, float* y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;    // one thread per element
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void spin(long long cycles, int* done) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    if (threadIdx.x == 0) *done = 1;
}
"""


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(SRC)


def test_launches_inside_torch_cuda_graph_capture(mod):
    """A default (synchronous) launch under capture is recorded without waiting; replays run it on new inputs."""
    import torch

    n = 10_000
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    grid = (n + 255) // 256
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                      # warm-up on a side stream, as torch's docs ask
        mod.axpb[grid, 256](x, y, 2.0, 1.0, n)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.axpb[grid, 256](x, y, 2.0, 1.0, n)         # sync=None: no wait under capture
        z = y * 3
    for _ in range(2):
        x.copy_(torch.randn(n, device="cuda"))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 2 * x + 1)
        torch.testing.assert_close(z, (2 * x + 1) * 3)


def test_explicit_sync_under_capture_still_does_not_break_it(mod):
    import torch

    n = 512
    x, y = torch.ones(n, device="cuda"), torch.zeros(n, device="cuda")
    mod.axpb[2, 256](x, y, 1.0, 0.0, n)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.axpb[2, 256](x, y, 5.0, 0.5, n, sync=True)
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert y.eq(5.5).all()


def test_launches_on_torchs_current_and_given_streams(mod):
    """A spinning kernel shows which stream it went to: that stream is busy, the default one is not."""
    import torch

    done = torch.zeros(1, dtype=torch.int32, device="cuda")
    cycles = 200_000_000                               # 0.1 s at 2 GHz, 0.5 s at an idle 400 MHz
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        mod.spin[1, 32](cycles, done, sync=False)      # torch's current stream: `side`
    assert not side.query() and torch.cuda.default_stream().query()
    side.synchronize()
    assert done.item() == 1

    other = torch.cuda.Stream()
    done.zero_()
    torch.cuda.synchronize()
    mod.spin[1, 32](cycles, done, stream=other, sync=False)
    assert not other.query() and torch.cuda.default_stream().query()
    mod.spin[1, 32](1000, done, stream=other)          # sync=True waits for `other`, the stream it launched on
    assert other.query() and done.item() == 1


def test_threads_launching_one_kernel_get_their_own_arguments(mod):
    import torch

    n = 4096
    xs = [torch.full((n,), float(t), device="cuda") for t in range(8)]
    ys = [torch.empty(n, device="cuda") for _ in range(8)]

    def work(t):
        for _ in range(200):
            mod.axpb[(n + 255) // 256, 256](xs[t], ys[t], float(t), float(t), n, sync=False)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    torch.cuda.synchronize()
    for t in range(8):
        assert ys[t].eq(t * t + t).all(), t


def test_the_plan_is_used_and_errors_stay_precise(mod):
    import torch

    n = 256
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    mod.axpb[1, 256](x, y, 1.0, 0.0, n)
    path = mod.axpb._path
    assert path.plan((x, y, 1.0, 0.0, n)) is not None
    with pytest.raises(kernellab.ArgumentError, match=r"'x'.*expects float32"):
        mod.axpb[1, 256](x.double(), y, 1.0, 0.0, n)
    with pytest.raises(kernellab.ArgumentError, match=r"'y'.*non-contiguous"):
        mod.axpb[1, 256](x, torch.empty(n, 2, device="cuda")[:, 0], 1.0, 0.0, n)
    with pytest.raises(kernellab.ArgumentError, match=r"'n'.*int32"):
        mod.axpb[1, 256](x, y, 1.0, 0.0, 2**40)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x)


def test_the_generated_launch_is_taken_through_cupys_launchkernel(mod):
    """After a launcher's first call, its calls go through the generated launch (LaunchPath.fast), which calls CuPy's
    launchKernel; torch tensors and CuPy arrays (CuPy's current stream) both get the right values."""
    import cupy
    import torch

    from kernellab.run.launch.cudriver import driver

    n = 256
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    launcher = mod.axpb[1, 256]
    launcher(x, y, 1.0, 0.0, n)
    assert launcher._fast and driver().launch_kernel is cupy.cuda.driver.launchKernel
    for a in (3.0, -1.5):
        launcher(x, y, a, 0.5, n, sync=False)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, a * x + 0.5)
    cx, cy = cupy.random.rand(n, dtype=cupy.float32), cupy.empty(n, dtype=cupy.float32)
    launcher(cx, cy, 2.0, 1.0, n)
    assert "_c_contiguous" in launcher._fast.source
    cy.fill(0)
    launcher(cx, cy, 2.0, 1.0, n)
    cupy.testing.assert_allclose(cy, 2 * cx + 1, rtol=1e-6)
    with pytest.raises(kernellab.ArgumentError, match=r"'y'.*non-contiguous"):
        launcher(cx, cupy.empty((n, 2), dtype=cupy.float32)[:, 0], 2.0, 1.0, n)
