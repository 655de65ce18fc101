"""kernellab.op without a GPU: the schema and its errors, the fake implementation made from outputs= (FakeTensorMode,
meta tensors), torch.compile(fullgraph=True) on CPU backends, torch.export, torch.library.opcheck, autograd wiring and
gradcheck in double through a kernel launched by kernellab (a %%numba kernel in the simulator), the check of the real
outputs against the spec, and launches inside an op not waiting. The same on a GPU: tests/gpu/test_ops_gpu.py."""
import statistics

import numpy as np
import pytest

import kernellab
from kernellab.errors import ArgumentError, KernellabError
from kernellab.run.launch import launch as L

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

cuda = pytest.importorskip("numba.cuda")

_COUNT = iter(range(10_000))


def fresh(stem: str) -> str:
    """A new op name per test: PyTorch cannot forget an op within a process."""
    return f"kltest::{stem}_{next(_COUNT)}"


def make_scale_rows(calls=None, **kw):
    """y = x * w[None, :] row by row, and a float32 row sum: a two-output CPU op standing in for a kernel launcher."""
    @kernellab.op(fresh("scale_rows"), "(Tensor x, Tensor w) -> (Tensor, Tensor)", device_types=("cpu",),
                  outputs=lambda x, w: (x, kernellab.out(x, shape=x.shape[:-1], dtype=torch.float32)), **kw)
    def scale_rows(x, w):
        if calls is not None:
            calls.append(L.resolve_sync(None))
        y = x * w
        return y, y.sum(-1, dtype=torch.float32)
    return scale_rows


# --- registration and its errors --------------------------------------------------------------------------------

def test_an_op_is_a_torch_operator_with_its_schema():
    op = make_scale_rows()
    qual = op.qualname
    assert isinstance(op, kernellab.Op) and op.schema == "(Tensor x, Tensor w) -> (Tensor, Tensor)"
    ns, name = qual.split("::")
    assert getattr(getattr(torch.ops, ns), name).default == op.overload and op.overload.name() == qual
    assert str(op.overload._schema) == f"{qual}(Tensor x, Tensor w) -> (Tensor, Tensor)"
    x, w = torch.randn(3, 5), torch.randn(5)
    y, s = op(x, w)
    torch.testing.assert_close(y, x * w)
    assert s.dtype == torch.float32 and s.shape == (3,)
    assert qual in repr(op) and "cpu" in repr(op)


def test_the_schema_can_come_from_annotations():
    @kernellab.op(fresh("axpy"), outputs=lambda x, y, a: x, device_types="cpu")
    def axpy(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
        return a * x + y
    assert axpy.schema == "(Tensor x, Tensor y, float a) -> Tensor"
    torch.testing.assert_close(axpy(torch.ones(4), torch.ones(4), 2.0), torch.full((4,), 3.0))


@pytest.mark.parametrize("name, schema, kw, match", [
    ("softmax", "(Tensor x) -> Tensor", {}, r"'namespace::name'.*'kl::softmax'; got 'softmax'"),
    ("aten::my_softmax", "(Tensor x) -> Tensor", {}, r"namespace 'aten' belongs to PyTorch"),
    (None, "(Tensor x -> Tensor", {}, r"not PyTorch's schema language .*e\.g\. '\(Tensor x, Tensor w"),
    (None, "(Tensr x) -> Tensor", {}, r"not PyTorch's schema language"),
    (None, "Tensor x -> Tensor", {}, r"should start with its argument list"),
    (None, "(Tensor y) -> Tensor", {}, r"schema names the arguments \(y\) but the launcher takes \(x\)"),
    (None, "(Tensor x) -> Tensor", {"outputs": None}, r"returns Tensor but has no outputs=.*outputs=lambda x"),
    (None, "(Tensor x) -> int", {}, r"kernellab ops return tensors"),
    (None, "(Tensor x) -> Tensor", {"device_types": ("tpu",)}, r"device_types takes 'cuda' and/or 'cpu'"),
    (None, "(Tensor x) -> Tensor", {"outputs": "like x"}, r"outputs= is a function of the op's arguments"),
    (None, None, {}, r"could not infer .*schema from the launcher's annotations"),
])
def test_a_bad_schema_or_spec_says_what_is_wrong_and_how_to_fix_it(name, schema, kw, match):
    options = {"outputs": lambda x: x, "device_types": ("cpu",), **kw}
    with pytest.raises(ArgumentError, match=match):
        kernellab.op(name or fresh("bad"), schema, **options)(lambda x: x.clone())


def test_running_the_cell_again_replaces_the_launcher_but_not_the_schema():
    name = fresh("again")
    first = kernellab.op(name, "(Tensor x) -> Tensor", outputs=lambda x: x, device_types="cpu")(lambda x: x + 1)
    again = kernellab.op(name, "(Tensor x) -> Tensor", outputs=lambda x: x, device_types="cpu")(lambda x: x + 2)
    assert again is first and again(torch.zeros(2)).tolist() == [2.0, 2.0]
    with pytest.raises(ArgumentError, match="already registered as \\(Tensor x\\) -> Tensor.*new name"):
        kernellab.op(name, "(Tensor x, float a) -> Tensor", outputs=lambda x, a: x,
                     device_types="cpu")(lambda x, a: x + a)


# --- the fake implementation ------------------------------------------------------------------------------------

def test_the_fake_implementation_comes_from_outputs_and_never_runs_the_launcher():
    calls = []
    op = make_scale_rows(calls)
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(6, 7, dtype=torch.float64))
        w = mode.from_tensor(torch.randn(7, dtype=torch.float64))
        y, s = op(x, w)
    assert (tuple(y.shape), y.dtype, tuple(s.shape), s.dtype) == ((6, 7), torch.float64, (6,), torch.float32)
    assert calls == []


def test_a_cuda_op_traces_on_meta_tensors_without_a_gpu():
    @kernellab.op(fresh("norm"), "(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)",
                  outputs=lambda x, w, eps: (x, kernellab.out(x, shape=(x.shape[0],), dtype=torch.float32)))
    def norm(x, w, eps):
        raise AssertionError("the CUDA launcher must not run on meta tensors")
    y, rstd = norm(torch.empty(4, 64, device="meta", dtype=torch.bfloat16), torch.empty(64, device="meta"), 1e-5)
    assert (y.device.type, y.shape, y.dtype, rstd.shape, rstd.dtype) == ("meta", (4, 64), torch.bfloat16, (4,),
                                                                         torch.float32)
    with pytest.raises(NotImplementedError):             # a CPU tensor: no implementation for it
        norm(torch.empty(4, 64), torch.empty(64), 1e-5)


def test_outputs_that_read_values_say_they_must_use_shapes_alone():
    @kernellab.op(fresh("by_value"), "(Tensor x) -> Tensor", device_types="cpu",
                  outputs=lambda x: kernellab.out(x, shape=(int(x.sum()),)))
    def by_value(x):
        return x.clone()
    with pytest.raises(ArgumentError, match="outputs= failed on the arguments .*shape, dtype and device.*alone"):
        with FakeTensorMode() as mode:
            by_value(mode.from_tensor(torch.ones(3)))


@pytest.mark.parametrize("launcher, outputs, match", [
    (lambda x: x.float(), lambda x: x, r"output 0 is float32\[4\] on cpu but its outputs= spec says float64\[4\]"),
    (lambda x: x[:2].clone(), lambda x: x, r"output 0 is float64\[2\] .* spec says float64\[4\]"),
    (lambda x: x, lambda x: x, r"returned its argument as output 0.*torch.empty_like"),
    (lambda x: (x + 1, x + 2), lambda x: x, r"returned 2 values but its schema .* returns 1"),
    (lambda x: x + 1, lambda x: (x, x), r"returns 1 tensor .* outputs= gave 2 values"),
    (lambda x: x.t().contiguous().t() + 0 if x.dim() == 2 else x.new_empty(8, 8).t(), lambda x: x.new_empty(8, 8),
     r"\(not contiguous\)"),
])
def test_a_launcher_whose_outputs_disagree_with_the_spec_is_caught(launcher, outputs, match):
    op = kernellab.op(fresh("disagree"), "(Tensor x) -> Tensor", outputs=outputs, device_types="cpu")(launcher)
    with pytest.raises((KernellabError, ArgumentError), match=match):
        op(torch.zeros(4, dtype=torch.float64))


def test_outputs_are_checked_on_the_first_calls_or_every_call():
    shapes = iter([4, 4] + [3] * 20)
    launcher = lambda x: torch.zeros(next(shapes), dtype=x.dtype)   # noqa: E731  goes wrong on the third call
    first = kernellab.op(fresh("first"), "(Tensor x) -> Tensor", outputs=lambda x: x, device_types="cpu")(launcher)
    for _ in range(2):
        first(torch.zeros(4))
    with pytest.raises(KernellabError, match=r"output 0 is float32\[3\]"):
        first(torch.zeros(4))
    shapes = iter([4] * 8 + [3])
    for _ in range(8):
        first(torch.zeros(4))
    assert first(torch.zeros(4)).shape == (3,)           # past the first calls: not checked
    every = kernellab.op(fresh("every"), "(Tensor x) -> Tensor", outputs=lambda x: x, device_types="cpu",
                         check_outputs=True)(lambda x: torch.zeros(3))
    with pytest.raises(KernellabError):
        every(torch.zeros(4))


# --- torch.compile, torch.export, opcheck -----------------------------------------------------------------------

class Block(torch.nn.Module):
    """A small module around the op: the shape of a transformer block's normalisation."""

    def __init__(self, op, d):
        super().__init__()
        self.op, self.proj = op, torch.nn.Linear(d, d, dtype=torch.float64)
        self.register_buffer("w", torch.randn(d, dtype=torch.float64))       # the op has no backward here

    def forward(self, x):
        y, s = self.op(x, self.w)
        return self.proj(y) + s[:, None]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_traces_through_the_op(backend):
    torch._dynamo.reset()
    op = make_scale_rows()
    block = Block(op, 8)
    x = torch.randn(5, 8, dtype=torch.float64)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x), block(x))
    explained = torch._dynamo.explain(block)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert any(op.qualname.replace("::", ".") in str(n.target) for g in explained.graphs for n in g.graph.nodes)


def test_torch_export_sees_the_op():
    op = make_scale_rows()
    exported = torch.export.export(Block(op, 8), (torch.randn(5, 8, dtype=torch.float64),))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert any(op.qualname.replace("::", ".") in t for t in targets), targets


def test_opcheck_passes_for_an_op_with_and_without_backward():
    plain = make_scale_rows()
    plain.opcheck(torch.randn(3, 4), torch.randn(4))

    def backward(ctx, gy, gs):
        x, w = ctx.inputs
        g = gy + gs[:, None].to(gy.dtype)
        return g * w, (g * x).sum(0)

    trained = make_scale_rows(backward=backward)
    trained.opcheck(torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True))


def test_an_op_with_backward_called_without_grad_skips_torchs_autograd_kernel():
    """The Autograd kernel's fast door: where no graph is needed (no input requires grad, grad mode off, inference
    mode) the call goes straight below autograd, as torch's kernel (torch.library.register_autograd's) would send
    it, without that kernel's Python; an input requiring grad goes through torch's kernel and gets a graph."""
    def backward(ctx, gy, gs):
        x, w = ctx.inputs
        g = gy + gs[:, None].to(gy.dtype)
        return g * w, (g * x).sum(0)

    op = make_scale_rows(backward=backward)
    torch_kernel, through_torch = op._torch_autograd, []

    def counted(*args, **kwargs):
        through_torch.append(1)
        return torch_kernel(*args, **kwargs)
    op._torch_autograd = counted
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    y, s = op(x, w)
    assert y.grad_fn is None and s.grad_fn is None and not through_torch
    torch.testing.assert_close(y, x * w)
    with torch.no_grad():
        y, _ = op(x.requires_grad_(), w)
    assert y.grad_fn is None and not through_torch
    with torch.inference_mode():
        y, _ = op(x, w)
    assert y.is_inference() and not through_torch
    y, s = op.overload(x, w)                                # through the dispatcher: torch's kernel
    assert through_torch == [1] and y.grad_fn is not None and s.grad_fn is not None
    (y.sum() + s.sum()).backward()
    torch.testing.assert_close(x.grad, 2 * w.expand(3, 4))
    x.grad = None
    y, s = op(x, w)                                         # the eager call: the same Function, applied directly
    assert through_torch == [1] and type(y.grad_fn).__name__ == f"KernellabOp_{op.namespace}_{op.name}Backward"
    assert s.grad_fn is y.grad_fn
    (y.sum() + s.sum()).backward()
    torch.testing.assert_close(x.grad, 2 * w.expand(3, 4))


def test_the_eager_graph_path_follows_the_ops_backward_and_leaves_functorch_to_the_dispatcher():
    """A call that records a graph goes to the op's autograd.Function only while the op has a backward (the cell run
    again without one: the dispatcher, whose Autograd kernel then says the backward is gone); under torch.func (functorch)
    it takes the dispatcher, and meets torch's own answer there (torch's Autograd kernel for the op has no
    setup_context staticmethod, which functorch asks of an autograd.Function), as torch.ops' call does."""
    name = fresh("scale_graph")

    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        return gy * w, (gy * x).sum(0)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def register(**kw):
        return kernellab.op(name, "(Tensor x, Tensor w) -> Tensor", outputs=lambda x, w: x, device_types="cpu",
                            **kw)(lambda x, w: x * w)

    op = register(backward=backward, setup_context=setup)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    y = op(x, w)
    assert type(y.grad_fn).__name__.startswith("KernellabOp_")
    y.sum().backward()
    torch.testing.assert_close(x.grad, w.detach().expand(3, 4))
    torch.testing.assert_close(w.grad, x.detach().sum(0))
    ns, through = op._call.__globals__, []
    overload = ns["OVERLOAD"]
    ns["OVERLOAD"] = lambda *args: through.append(1) or overload(*args)
    for f in (op, op.overload):
        with pytest.raises(RuntimeError, match="setup_context"):
            torch.func.grad(lambda x: f(x, w.detach()).sum())(x.detach())
    assert through == [1]                                                # functorch: the eager call took the dispatcher
    assert register() is op                                              # the cell again, without a backward
    assert "APPLY(*args)" not in op._call.source                         # the dispatcher: torch's kernel says
    with pytest.raises(KernellabError, match="no backward now"):         # what is missing
        op(x, w).sum().backward()
    assert register(backward=backward, setup_context=setup) is op        # and with it again
    assert "return APPLY(*args)" in op._call.source and op(x, w).grad_fn is not None


def test_an_op_with_backward_on_a_torch_without_the_private_pieces_uses_torchs_autograd_kernel(monkeypatch):
    """A torch that lacks what the fast door is built from (torch 2.11 on the GPU hosts has no
    torch._library.utils.is_out) registers torch.library.register_autograd's kernel alone, and gradients flow."""
    from kernellab import ops

    monkeypatch.setattr(ops, "_FAST_AUTOGRAD_INTERNALS", False)

    def backward(ctx, gy, gs):
        x, w = ctx.inputs
        g = gy + gs[:, None].to(gy.dtype)
        return g * w, (g * x).sum(0)

    op = make_scale_rows(backward=backward)
    assert not hasattr(op, "_torch_autograd")             # torch's kernel alone: no fast door built
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64)
    y, s = op(x, w)
    assert y.grad_fn is not None
    (y.sum() + s.sum()).backward()
    torch.testing.assert_close(x.grad, 2 * w.expand(3, 4))
    with torch.no_grad():
        assert op(x, w)[0].grad_fn is None


def test_an_eager_call_skips_the_dispatcher_only_where_the_dispatcher_would_change_nothing():
    """kernellab.ops.EAGER_FAST_CALLS: a plain eager call goes straight to the implementation; every case where the
    dispatcher does more (a mode, a subclass, a graph to record, the profiler, a device the op lacks, a scalar to
    convert, keyword arguments, forward AD) goes through it, with the same result."""
    seen = []

    @kernellab.op(fresh("scaled"), "(Tensor x, float a) -> Tensor", outputs=lambda x, a: x, device_types="cpu")
    def scaled(x, a):
        seen.append(type(a))
        return x * a

    ns = scaled._call.__globals__
    through, overload = [], ns["OVERLOAD"]

    def counted(*args, **kwargs):
        through.append(1)
        return overload(*args, **kwargs)
    ns["OVERLOAD"] = counted
    x = torch.randn(5)

    def call(*args, **kwargs):
        through.clear()
        out = scaled(*args, **kwargs)
        torch.testing.assert_close(out, x.detach() * 2.0)
        return bool(through)

    assert not call(x, 2.0) and seen[-1] is float                  # the fast call: the dispatcher is not asked
    assert call(x, 2) and seen[-1] is float                        # an int for a float: the dispatcher converts it
    torch.testing.assert_close(scaled(x, a=2.0), x * 2.0)          # keywords: Op.__call__ hands them to the overload
    assert call(x.requires_grad_(), 2.0)                           # a graph to record (PyTorch warns at backward)
    with torch.no_grad():
        assert not call(x, 2.0)
    x.requires_grad_(False)

    class Sub(torch.Tensor):                                       # torch's __torch_function__: it may see the op
        pass
    assert call(x.as_subclass(Sub), 2.0)                           # a subclass
    assert not call(torch.nn.Parameter(x, requires_grad=False), 2.0)   # a Parameter: __torch_function__ disabled

    class Recording(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func)
            return func(*args, **(kwargs or {}))
    ops = []
    with Recording():
        assert call(x, 2.0)
    assert scaled.overload in ops                                  # the mode saw the op
    with torch.device("cpu"):                                      # a __torch_function__ mode
        assert call(x, 2.0)
    with torch.profiler.profile() as prof:
        assert call(x, 2.0)
    assert any(scaled.qualname in e.name for e in prof.events())   # the profiler still shows the op
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        assert call(x, 2.0)
    flag = getattr(torch.compiler, "_is_compiling_flag", None)    # what is_compiling() reads: export's, a compile's
    if isinstance(flag, bool):
        torch.compiler._is_compiling_flag = True
        try:
            assert torch.compiler.is_compiling() and call(x, 2.0)
        finally:
            torch.compiler._is_compiling_flag = flag
        assert not call(x, 2.0)
    through.clear()
    assert scaled(torch.randn(2, device="meta"), 2.0).is_meta and through      # meta: the fake, as before

    @kernellab.op(fresh("on_gpu"), "(Tensor x) -> Tensor", outputs=lambda x: x)
    def on_gpu(x):
        return x.clone()
    with pytest.raises(NotImplementedError, match="CPU"):              # a device the op lacks: torch's own error
        on_gpu(x)

    @kernellab.op(fresh("fill"), "(Tensor(a!) y, float v) -> ()", device_types="cpu")
    def fill(y, v):
        y.fill_(v)
    assert fill._call is fill.overload                             # in place: always the dispatcher (version counter)
    y = torch.zeros(3)
    fill(y, 1.5)
    assert y._version == 1 and torch.equal(y, torch.full((3,), 1.5))


# --- autograd through a kernel kernellab launches (the simulator, on the CPU) -----------------------------------

def _scale(x, out, a, n):
    """out[i] = a * x[i] (`cuda` is this module's global: the simulator swaps it for its own during a launch)."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < n:
        out[i] = a * x[i]


@pytest.fixture(scope="module")
def sim_scale():
    """_scale as a %%numba kernel that Numba's simulator runs on CPU tensors, launched through kernellab."""
    return kernellab.numba_kernel(cuda.jit(_scale), signature="float64[::1], float64[::1], float64, int32",
                                  arch="sm_90", simulate=True)


def test_gradcheck_in_double_through_a_launched_kernel(sim_scale):
    seen = []

    def launch(x, a):
        out = torch.empty_like(x)
        seen.append(L.resolve_sync(None))
        sim_scale[(x.numel() + 31) // 32, 32](x, out, a, x.numel())
        return out

    def backward(ctx, grad):                             # the op itself, so that the backward traces too
        return scale(grad.contiguous(), ctx.inputs[1]), None

    @kernellab.op(fresh("sim_scale"), "(Tensor x, float a) -> Tensor", outputs=lambda x, a: x, device_types="cpu",
                  backward=backward)
    def scale(x, a):
        return launch(x, a)

    x = torch.randn(12, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(scale(x, 2.5), 2.5 * x.detach())
    assert torch.autograd.gradcheck(lambda t: scale(t, -1.5), (x,))
    scale.opcheck(torch.randn(12, dtype=torch.float64, requires_grad=True), 0.5)
    assert seen and not any(seen)                        # launches inside the op did not wait


def test_a_custom_setup_context_follows_torchs_convention():
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])

    def backward(ctx, gy, gs):
        (w,) = ctx.saved_tensors
        return (gy + gs[:, None]) * w, None

    op = make_scale_rows(backward=backward, setup_context=setup_context)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: op(t, w)[0], (x,))


# --- launches inside an op --------------------------------------------------------------------------------------

def test_launches_inside_an_op_do_not_wait_unless_blocking_is_asked_for():
    calls = []
    op = make_scale_rows(calls)
    old = L.set_launch_blocking(None)
    try:
        op(torch.ones(2, 2), torch.ones(2))
        L.set_launch_blocking(True)                      # KERNELLAB_LAUNCH_BLOCKING=1: every launch waits
        op(torch.ones(2, 2), torch.ones(2))
    finally:
        L.set_launch_blocking(old)
    assert calls == [False, True] and L.resolve_sync(None) is (old is not False)


# --- the tutorials' transformer block (kernellab/teach/block.py) ------------------------------------------------

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_the_tutorials_block_with_ops_matches_pytorch_and_compiles_in_one_graph(norm):
    from kernellab.teach.block import TransformerBlock, max_errors

    softmax_op = kernellab.op(fresh("softmax"), "(Tensor x) -> Tensor", outputs=lambda x: x,
                              device_types="cpu")(lambda x: torch.softmax(x, -1))
    if norm == "layernorm":
        norm_op = kernellab.op(fresh("layernorm"), "(Tensor x, Tensor w, Tensor b, float eps) -> Tensor",
                               outputs=lambda x, w, b, eps: x, device_types="cpu")(
            lambda x, w, b, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps))
    else:
        norm_op = kernellab.op(fresh("rmsnorm"), "(Tensor x, Tensor w, float eps) -> Tensor",
                               outputs=lambda x, w, eps: x, device_types="cpu")(
            lambda x, w, eps: torch.nn.functional.rms_norm(x, x.shape[-1:], w, eps))
    attention_op = kernellab.op(fresh("attention"), "(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor",
                                outputs=lambda q, k, v, causal: q, device_types="cpu")(
        lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.manual_seed(0)
    ref = TransformerBlock(64, 4, norm=norm, attention="explicit", dtype=torch.float64)
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))            # norms with weights and biases that are not 1 and 0
        want = ref(x)
        for ops in ({"softmax_op": softmax_op}, {"norm_op": norm_op}, {"attention_op": attention_op}):
            ours = TransformerBlock(64, 4, norm=norm, dtype=torch.float64, **ops)
            ours.load_state_dict(ref.state_dict())
            torch._dynamo.reset()
            got = torch.compile(ours, fullgraph=True, backend="eager")(x)
            err, _ = max_errors(got, want, want)
            assert err < 1e-12, (ops, err)
            graph = torch._dynamo.explain(ours)(x)
            assert graph.graph_break_count == 0 and graph.graph_count == 1


def test_a_backward_compiles_with_the_forward_in_one_graph():
    def backward(ctx, gy, gs):
        x, w = ctx.inputs
        g = gy + gs[:, None].to(gy.dtype)
        return g * w, (g * x).sum(0)

    op = make_scale_rows(backward=backward)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)

    def loss(x, w):
        y, s = op(x, w)
        return (y.sin().sum() + s.double().sum()) * 2

    torch._dynamo.reset()
    got = torch.compile(loss, fullgraph=True, backend="aot_eager")(x, w)
    gx, gw = torch.autograd.grad(got, (x, w))
    want_x, want_w = torch.autograd.grad(((x * w).sin().sum() + (x * w).sum()) * 2, (x, w))
    torch.testing.assert_close(gx, want_x, rtol=1e-5, atol=1e-5)        # s is float32: its gradient rounds there
    torch.testing.assert_close(gw, want_w, rtol=1e-5, atol=1e-5)


def test_kernellab_synchronize_names_the_launches_that_did_not_wait(monkeypatch):
    from kernellab.errors import LaunchError

    L.RECENT_LAUNCHES.clear()
    cfg = L.LaunchConfig((4, 1, 1), (128, 1, 1))
    L.record_async("softmax_rows", cfg); line = __import__("inspect").currentframe().f_lineno   # noqa: E702
    assert L.recent_launches()[0].line == line and L.recent_launches()[0].filename == __file__

    def faulted(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "synchronize", faulted)
    with pytest.raises(LaunchError, match=r"softmax_rows faulted \(CUDA error: an illegal memory access") as info:
        kernellab.synchronize()
    assert info.value.sticky and f"test_ops.py, line {line}" in str(info.value) and "restart" in str(info.value)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    kernellab.synchronize()
    assert L.recent_launches() == ()


# --- benchmarks/launch_overhead.py --cpu: the op's host path on this machine ----------------------------------------

def test_the_cpu_breakdown_of_an_ops_host_path_runs_without_a_gpu(monkeypatch, capsys):
    """`launch_overhead.py --cpu` times the one-kernel op stage by stage with the stand-in driver: every stage has a
    figure, and the whole op costs more than the dispatcher's floor and than its launch alone (it contains both)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "launch_overhead.py"
    spec = importlib.util.spec_from_file_location("launch_overhead_cpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name in ("torch_stream_handle", "torch_stream_function"):     # the stand-in replaces them: restore after
        monkeypatch.setattr(L, name, getattr(L, name))
    cases = bench.cpu_cases(3000, 3)
    cpu = {name.strip(): statistics.median(c) for name, _, c in cases}
    assert len(cpu) == 17 and all(v > 0 for v in cpu.values())
    op = cpu["kernellab.op, one kernel: axpb(x)"]
    assert op > cpu["Library op, Python kernel returning None (dispatcher floor)"]
    assert op > cpu["bare launch, sync=False"]
    text = bench.cpu_table(cases, "t")
    assert text.count("\n| ") == 18 and "| kernellab.op, one kernel: axpb(x) |" in text
