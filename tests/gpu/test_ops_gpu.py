"""kernellab.op on a GPU, with a real CUDA C++ kernel: eager calls, opcheck, gradcheck in double, torch.compile
(fullgraph=True, inductor), CUDA-graph capture and replay, launches inside an op not waiting, and an asynchronous
fault reported at the next synchronising call with the kernel and the line that launched it (in a new process: the
fault is sticky)."""
import subprocess
import sys
import textwrap

import pytest

import kernellab
from kernellab.run.launch import launch as L

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SRC = r"""
extern "C" __global__ void scale_f64(const double* x, double* y, double a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void row_sum(const float* x, float* s, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float acc = 0.0f;
    for (int c = 0; c < cols; ++c) acc += x[r * cols + c];
    s[r] = acc;
}
"""
_COUNT = iter(range(10_000))


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(SRC)


def make_scale(mod):
    k = mod.scale_f64

    def backward(ctx, grad):
        return scale(grad.contiguous(), ctx.inputs[1]), None

    @kernellab.op(f"klgpu::scale_{next(_COUNT)}", "(Tensor x, float a) -> Tensor", outputs=lambda x, a: x,
                  backward=backward)
    def scale(x, a):
        y = torch.empty_like(x)
        n = x.numel()
        k[(n + 255) // 256, 256](x, y, a, n)
        return y
    return scale


def make_row_sum(mod):
    k = mod.row_sum

    @kernellab.op(f"klgpu::row_sum_{next(_COUNT)}", "(Tensor x) -> Tensor",
                  outputs=lambda x: kernellab.out(x, shape=x.shape[:1]))
    def row_sum(x):
        s = x.new_empty(x.shape[0])
        k[(x.shape[0] + 127) // 128, 128](x, s, x.shape[0], x.shape[1])
        return s
    return row_sum


def test_eager_opcheck_and_gradcheck_in_double(mod):
    scale = make_scale(mod)
    x = torch.randn(1000, dtype=torch.float64, device="cuda", requires_grad=True)
    torch.testing.assert_close(scale(x, 3.0), 3.0 * x.detach())
    scale.opcheck(torch.randn(300, dtype=torch.float64, device="cuda", requires_grad=True), -0.5)
    assert torch.autograd.gradcheck(lambda t: scale(t, 1.75), (x[:64].detach().requires_grad_(),))
    row_sum = make_row_sum(mod)
    row_sum.opcheck(torch.randn(37, 19, device="cuda"))


def test_launches_inside_an_op_do_not_wait_and_are_recorded_with_their_line(mod):
    row_sum = make_row_sum(mod)
    L.RECENT_LAUNCHES.clear()
    row_sum(torch.randn(8, 8, device="cuda"))
    (launch,) = L.recent_launches()
    assert launch.kernel == "row_sum" and launch.filename == __file__ and launch.function == "row_sum"
    kernellab.synchronize()
    assert L.recent_launches() == ()


class Block(torch.nn.Module):
    """Linear, the op, a residual: a model around the kernel."""

    def __init__(self, op, d):
        super().__init__()
        self.op, self.lin = op, torch.nn.Linear(d, d, device="cuda")

    def forward(self, x):
        h = torch.relu(self.lin(x))
        return x + self.op(h)[:, None]


def test_torch_compile_fullgraph_with_inductor(mod):
    torch._dynamo.reset()
    block = Block(make_row_sum(mod), 64)
    x = torch.randn(128, 64, device="cuda")
    want = block(x)
    got = torch.compile(block, fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    assert torch._dynamo.explain(block)(x).graph_break_count == 0


def test_cuda_graph_capture_and_replay(mod):
    row_sum = make_row_sum(mod)
    x = torch.randn(256, 32, device="cuda")
    row_sum(x)                                          # the first call: load the kernel, check the outputs
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        row_sum(x)
        with torch.cuda.graph(graph, stream=stream):
            s = row_sum(x)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(s, x.sum(1), rtol=1e-5, atol=1e-4)


def test_an_op_with_backward_captured_and_compiled_where_no_graph_is_needed(mod):
    """An op with a backward called where autograd needs no graph (no_grad, inputs without grad) takes the autograd
    kernel's fast door: it still captures into a CUDA graph, compiles with fullgraph=True and gives the same
    values; an input that requires grad still gets the backward."""
    scale = make_scale(mod)
    x = torch.randn(4096, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(scale(x, 2.0), 2.0 * x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.no_grad():
        scale(x, 2.0)
        with torch.cuda.graph(graph, stream=stream):
            y = scale(x, 2.0)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, 2.0 * x)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(lambda t: scale(t, -1.5) + 1.0, fullgraph=True)(x)
    torch.testing.assert_close(got, -1.5 * x + 1.0)
    xg = x.clone().requires_grad_()
    scale(xg, 3.0).sum().backward()
    torch.testing.assert_close(xg.grad, torch.full_like(x, 3.0))


FAULT = textwrap.dedent(r'''
    import torch, kernellab
    m = kernellab.compile_cuda(r"""
    extern "C" __global__ void oob(float* x, int n) { x[threadIdx.x + n] = 1.0f; }
    extern "C" __global__ void fine(float* x) { x[threadIdx.x] = 2.0f; }
    """)
    x = torch.zeros(32, device="cuda")

    @kernellab.op("klfault::oob", "(Tensor x) -> Tensor", outputs=lambda x: x)
    def oob(x):
        y = x.clone()
        m.oob[1, 32](y, 1 << 30)
        return y

    oob(x)
    MODE
''')


@pytest.mark.parametrize("mode, found_at", [
    ("kernellab.synchronize()", "found at kernellab.synchronize()"),
    ("m.fine[1, 32](x)", "fine faulted while running"),
])
def test_an_asynchronous_fault_names_the_kernel_and_its_line_at_the_next_wait(mode, found_at):
    code = FAULT.replace("MODE", mode)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    err = run.stderr
    assert run.returncode != 0 and "LaunchError" in err, err[-3000:]
    line = code.splitlines().index("    m.oob[1, 32](y, 1 << 30)") + 1
    assert found_at in err and "oob (grid=(1, 1, 1), block=(32, 1, 1)" in err, err[-3000:]
    assert f"launched at <string>, line {line}, in oob" in err, err[-3000:]


@pytest.mark.parametrize("notebook", ["03-reductions-softmax.py", "04-layernorm.py"])
def test_the_tutorials_blocks_with_their_ops_run_and_match_pytorch(notebook):
    """The tutorial's last section (its kernels as ops in a compiled transformer block, checked against float64 and
    the PyTorch block, timed against it), run on the tutorial's launchers as the notebook runs it."""
    import pathlib

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from notebook_cells import load_tutorial

    ns = load_tutorial(notebook)
    ns.update(kernellab=kernellab, torch=torch)
    text = (pathlib.Path(__file__).resolve().parents[2] / "notebooks" / notebook).read_text()
    last = text[text.index("# ## From the notebook into a model"):]       # cells as Python: magics are comments
    torch._dynamo.reset()
    exec(compile(last, notebook, "exec"), ns)
    for name in ("kl_softmax", "kl_layernorm", "kl_rmsnorm"):              # the tutorial's ops pass opcheck
        if name in ns:
            x = torch.randn(37, 1031, device="cuda")
            w, b = torch.randn(1031, device="cuda"), torch.randn(1031, device="cuda")
            args = {"kl_softmax": (x,), "kl_layernorm": (x, w, b, 1e-5), "kl_rmsnorm": (x, w, 1e-5)}[name]
            ns[name].opcheck(*args)
    results = [ns["block_result"]] if "block_result" in ns else list(ns["block_results"].values())
    for r in results:
        assert {s.baseline for s in r.speedups} == {"PyTorch block", "PyTorch block, torch.compile"}
        assert all(s.ratio > 0.5 for s in r.speedups), r    # the same block: never half as fast
