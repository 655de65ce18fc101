"""Kernels as PyTorch operators: `kernellab.op` registers a Python launcher (one or several kernellab kernels) through
torch.library, so that eager mode, torch.compile(fullgraph=True), torch.export, CUDA graphs and autograd see one op.

    @kernellab.op("kl::softmax", "(Tensor x) -> Tensor", outputs=lambda x: x)
    def softmax(x):
        y = torch.empty_like(x)
        k[x.shape[0], 256](x, y, x.shape[1])      # does not wait for the kernel: see below
        return y

The op is defined with the direct `torch.library.Library` define/impl form: its whole host path costs about half
what `torch.library.custom_op`'s does around the same launcher (`benchmarks/launch_overhead.py --cpu` times it stage
by stage; `--ops` on a GPU). A plain eager call skips the dispatcher where it would change nothing (EAGER_FAST_CALLS
says when); with a backward, calls that need no graph skip torch's Python autograd kernel (Op._register_autograd), and
eager calls that record one (a training step's) apply the op's autograd.Function without the dispatcher (Op._graph_apply).
Its fake (meta) implementation, which torch.compile and torch.export
trace, is made from `outputs=`: a function of the op's arguments (fake tensors while tracing) giving, per output, a
tensor the output is shaped like or `kernellab.out(like, shape=, dtype=)`. The first calls check the launcher's real
outputs against it. With `backward=` the op is differentiable (torch.library.register_autograd).

Launches inside an op do not wait for their kernel (the op runs inside `deferred_sync`, as kernellab.bench does);
`kernellab.set_launch_blocking(True)` (or KERNELLAB_LAUNCH_BLOCKING=1) makes every launch wait, for debugging.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import ArgumentError, KernellabError
from .run.launch.launch import DEFER_SYNC

RESERVED_NAMESPACES = ("aten", "prim", "prims", "torch", "_")
CHECKED_CALLS = 8          # outputs="first": the launcher's outputs are checked against the spec on this many calls
_DEVICE_KEYS = {"cuda": "CUDA", "cpu": "CPU"}


def _has_fast_autograd_internals() -> bool:
    """Whether this torch has the private pieces the op's faster Autograd door is built from (torch 2.13's
    torch._library.utils.is_out, autograd.Info and make_autograd_impl, the after-autograd keyset); older versions
    (the GPU hosts run 2.11) register torch.library.register_autograd's kernel alone."""
    lib = getattr(torch, "_library", None)
    auto, utils = getattr(lib, "autograd", None), getattr(lib, "utils", None)
    return (all(hasattr(utils, n) for n in ("is_functional_schema", "is_out", "has_kwarg_only_tensors"))
            and all(hasattr(auto, n) for n in ("Info", "make_autograd_impl"))
            and all(hasattr(torch._C, n) for n in ("_after_autograd_keyset", "_any_requires_grad",
                                                   "_AutoDispatchBelowAutograd")))


_FAST_AUTOGRAD_INTERNALS = _has_fast_autograd_internals()


@dataclass(frozen=True)
class OutputSpec:
    """One output of an op: a new contiguous tensor on `like`'s device, of `shape` and `dtype` (by default like's)."""

    like: Any                          # a tensor: the device, and the shape and dtype where these are not given
    shape: tuple | None = None
    dtype: Any = None

    def empty(self):
        """A new tensor as this spec describes (a fake one while tracing)."""
        like = self.like
        shape = tuple(like.shape) if self.shape is None else tuple(self.shape)
        return torch.empty(shape, dtype=self.dtype or like.dtype, device=like.device)

    def describe(self) -> tuple:
        like = self.like
        return (tuple(like.shape) if self.shape is None else tuple(self.shape), self.dtype or like.dtype, like.device)


def out(like, shape=None, dtype=None) -> OutputSpec:
    """An op output on `like`'s device: `like`'s shape and dtype unless `shape` or `dtype` is given.

    outputs=lambda x, w: kernellab.out(x, shape=x.shape[:-1], dtype=torch.float32) declares a float32 tensor of
    x's shape without its last dimension."""
    if not isinstance(like, torch.Tensor):
        raise ArgumentError(f"kernellab.out(like, ...) takes a tensor to place the output beside (its device, and "
                            f"its shape and dtype unless given), got {type(like).__name__}")
    if shape is not None:
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(shape)
    return OutputSpec(like, shape, dtype)


def _spec_of(value, what: str) -> OutputSpec:
    if isinstance(value, OutputSpec):
        return value
    if isinstance(value, torch.Tensor):
        return OutputSpec(value)
    raise ArgumentError(f"{what} must be a tensor (the output is shaped like it) or kernellab.out(like, shape=, "
                        f"dtype=), got {type(value).__name__}")


class Op:
    """A kernellab launcher registered as a PyTorch operator: call it like the launcher; `torch.ops.<ns>.<name>`
    is the same op. Made by kernellab.op (see its docstring)."""

    def __init__(self, qualname: str, schema: str, returns: int, launcher: Callable, outputs, backward,
                 setup_context, device_types: tuple[str, ...], check_outputs, mutates: tuple[str, ...]):
        self.qualname, self.schema, self.returns = qualname, schema, returns
        self.namespace, self.name = qualname.split("::")
        self.device_types, self.mutates = device_types, mutates
        self._set(launcher, outputs, backward, setup_context, check_outputs)
        self._autograd_registered = False
        self._lib = torch.library.Library(self.namespace, "FRAGMENT")
        try:
            self._lib.define(f"{self.name}{schema}")
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise ArgumentError(f"torch.library could not define {qualname}{schema}: {first}. Pick another name (an "
                                f"op outside kernellab may hold this one)") from None
        for dev in device_types:
            self._lib.impl(self.name, self._impl, _DEVICE_KEYS[dev])
        if returns:
            torch.library.register_fake(qualname, self._fake, lib=self._lib)
        self.overload = getattr(getattr(torch.ops, self.namespace), self.name).default
        self._register_autograd()
        self._call = self._make_call()

    def _set(self, launcher, outputs, backward, setup_context, check_outputs) -> None:
        self.launcher, self.outputs, self.backward, self.setup_context = launcher, outputs, backward, setup_context
        self.check_outputs = check_outputs
        self._checks_left = CHECKED_CALLS if check_outputs == "first" else (1 << 62 if check_outputs else 0)
        self.__doc__ = launcher.__doc__
        self.__wrapped__ = launcher

    def _register_autograd(self) -> None:
        """The op's Autograd kernel: torch.library.register_autograd's, behind a faster door for calls that need no
        graph (no input requires grad, or grad mode off: inference, a model under torch.no_grad, torch.compile's
        inference graphs). Those redispatch below autograd at once, as torch's kernel does for them, without its
        per-call Python (a Metadata object, the out= tag test, OpOverload.redispatch): the same kernels run."""
        if self.backward is None or self._autograd_registered:
            return
        schema, utils = self.overload._schema, torch._library.utils
        internals = getattr(torch._library, "autograd", None)     # checked by _FAST_AUTOGRAD_INTERNALS
        if (not _FAST_AUTOGRAD_INTERNALS or not utils.is_functional_schema(schema) or utils.is_out(self.overload)
                or utils.has_kwarg_only_tensors(schema)):        # torch's own refusal, in its words
            torch.library.register_autograd(self.qualname, self._backward, setup_context=self._setup_context,
                                            lib=self._lib)
            self._autograd_registered = True
            return
        info = internals.Info(self._backward, self._setup_context)
        self._torch_autograd = internals.make_autograd_impl(self.overload, info)
        redispatch, after = self.overload._handle.redispatch_boxed, torch._C._after_autograd_keyset
        grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad
        below = torch._C._AutoDispatchBelowAutograd

        def autograd(keyset, *args, **kwargs):
            if kwargs or (grad_enabled() and any_requires_grad(*args)):
                return self._torch_autograd(keyset, *args, **kwargs)
            with below():
                return redispatch(keyset & after, *args)
        self._lib.impl(self.name, autograd, "Autograd", with_keyset=True)
        self._autograd_registered = True

    # -- the implementations torch.library calls --------------------------------------------------------------------
    def _impl(self, *args, _set=DEFER_SYNC.set, _reset=DEFER_SYNC.reset):
        """The op on real tensors: the launcher, its launches not waiting (deferred_sync's context variable, set
        here without a context manager: this is on every call's path); its first outputs checked."""
        token = _set(True)
        try:
            result = self.launcher(*args)
        finally:
            _reset(token)
        if self._checks_left:
            self._checks_left -= 1
            self._check(args, result)
        return result

    def _fake(self, *args):
        """The op on fake (meta) tensors, from outputs=: what torch.compile and torch.export trace."""
        return self._made(self._specs(args))

    @staticmethod
    def _made(specs: list[OutputSpec]):
        made = tuple(s.empty() for s in specs)
        return made[0] if len(made) == 1 else made

    def _specs(self, args) -> list[OutputSpec]:
        try:
            declared = self.outputs(*args)
        except KernellabError:
            raise
        except Exception as exc:
            raise ArgumentError(f"{self.qualname}'s outputs= failed on the arguments {_describe_args(args)} "
                                f"({type(exc).__name__}: {exc}); it must work out each output's shape, dtype and "
                                f"device from the arguments' .shape, .dtype and .device alone (while tracing they "
                                f"are fake tensors, without values)") from None
        if self.returns == 1 and not isinstance(declared, (tuple, list)):
            declared = (declared,)
        if not isinstance(declared, (tuple, list)) or len(declared) != self.returns:
            raise ArgumentError(f"{self.qualname} returns {self.returns} tensor{'s' if self.returns != 1 else ''} "
                                f"(schema {self.schema}) but outputs= gave {_count(declared)}; give one spec per "
                                f"output, as a tuple")
        return [_spec_of(d, f"{self.qualname}'s outputs= entry {i}") for i, d in enumerate(declared)]

    def _check(self, args, result) -> None:
        """The launcher's outputs against outputs=: a fake that disagrees would trace a different program."""
        got = result if isinstance(result, (tuple, list)) else (result,)
        if self.returns == 0:
            if result is not None:
                raise KernellabError(f"{self.qualname}'s schema {self.schema} returns nothing, but the launcher "
                                     f"returned {_count(result)}; return None, or declare the outputs in the schema")
            return
        if len(got) != self.returns:
            raise KernellabError(f"{self.qualname}'s launcher returned {_count(result)} but its schema "
                                 f"{self.schema} returns {self.returns}")
        for i, (real, spec) in enumerate(zip(got, self._specs(args))):
            if not isinstance(real, torch.Tensor):
                raise KernellabError(f"{self.qualname}'s launcher returned a {type(real).__name__} as output {i}; "
                                     f"it must return the tensors its schema names")
            if any(real is a for a in args):
                raise KernellabError(f"{self.qualname}'s launcher returned its argument as output {i}; an op's "
                                     f"output must be a new tensor (allocate it with torch.empty_like), or declare "
                                     f"the argument as written (Tensor(a!)) and return nothing")
            want = spec.describe()
            have = (tuple(real.shape), real.dtype, real.device)
            if have != want or not real.is_contiguous():
                raise KernellabError(
                    f"{self.qualname}'s output {i} is {_tensor_text(*have)}{'' if real.is_contiguous() else ' (not contiguous)'}"
                    f" but its outputs= spec says {_tensor_text(*want)} for the arguments {_describe_args(args)}; "
                    f"torch.compile and torch.export trace the op from the spec, so the two must agree: fix "
                    f"outputs= (or the launcher)")

    def _setup_context(self, ctx, inputs, output):
        if self.setup_context is not None:
            return self.setup_context(ctx, inputs, output)
        outs = list(output) if isinstance(output, (tuple, list)) else [output]
        flat = list(inputs) + outs
        ctx.save_for_backward(*[x for x in flat if isinstance(x, torch.Tensor)])
        ctx.kl_layout = ([None if isinstance(x, torch.Tensor) else x for x in flat], len(inputs),
                         isinstance(output, (tuple, list)))

    def _backward(self, ctx, *grads):
        if self.backward is None:
            raise KernellabError(f"{self.qualname} has no backward now (its cell was run again without one)")
        if self.setup_context is None:
            layout, n_in, many = ctx.kl_layout
            saved = iter(ctx.saved_tensors)
            flat = [next(saved) if v is None else v for v in layout]
            ctx.inputs, outs = tuple(flat[:n_in]), tuple(flat[n_in:])
            ctx.output = outs if many else outs[0]
        return self.backward(ctx, *grads)

    # -- the user's side ------------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if kwargs:
            return self.overload(*args, **kwargs)
        return self._call(*args)

    def _make_call(self):
        """The op's call: through the dispatcher (the OpOverload), or, in the common eager case, straight to the
        implementation the dispatcher would pick (see _eager_source); None where the schema has no such case."""
        apply = self._graph_apply() if self.backward is not None and self.returns else None
        source = _eager_source(self.overload._schema, self.device_types, self.returns, graph=apply is not None)
        if source is None or not EAGER_FAST_CALLS:
            return self.overload
        C = torch._C
        ns = {"OVERLOAD": self.overload, "IMPL": self._impl, "Tensor": torch.Tensor, "Parameter": _PARAMETER,
              "IS_COMPILING": torch.compiler.is_compiling, "COMPILER": torch.compiler,
              "DYNAMO": getattr(torch.compiler, "is_dynamo_compiling", None), "TF_MODE": C._is_torch_function_mode_enabled,
              "DISPATCH_MODES": C._len_torch_dispatch_stack, "TRACING": C._get_tracing_state,
              "FUNCTORCH": C._functorch.peek_interpreter_stack, "PROFILING": C._autograd._profiler_enabled,
              "GRAD": C.is_grad_enabled, "APPLY": apply, "WRAPPED": _functorch_wrapped,
              "FORWARD_AD": torch.autograd.forward_ad}
        exec(compile(source, f"<kernellab op call {self.qualname}>", "exec"), ns)
        call = ns["call"]
        call.source = source
        return call

    def _graph_apply(self):
        """The eager call's graph path (see _eager_source): apply(*args) of a torch.autograd.Function whose forward
        is the op's implementation and setup_context, and whose backward is the op's backward: what torch's Autograd
        kernel for the op (torch.library.register_autograd's) runs, without the dispatcher around it, its Python
        (a Metadata object, the out= test, OpOverload.redispatch, fill_defaults) or autograd.Function.apply's (the
        functorch checks, which the eager call has made). None where this torch lacks the C-level apply."""
        op, many = self, self.returns > 1
        set_defer, reset_defer = DEFER_SYNC.set, DEFER_SYNC.reset

        def forward(ctx, *args):
            token = set_defer(True)              # Op._impl, inline (a training step's every forward call)
            try:
                result = op.launcher(*args)
            finally:
                reset_defer(token)
            if op._checks_left:
                op._checks_left -= 1
                op._check(args, result)
            if many:
                result = tuple(result)
            (op.setup_context or op._setup_context)(ctx, args, result)      # Op._setup_context's choice, inline
            return result

        def backward(ctx, *grads):
            user = op.backward
            if user is None or op.setup_context is None:       # Op._backward's cases: its error, ctx.inputs
                return op._backward(ctx, *grads)
            return user(ctx, *grads)

        name = f"KernellabOp_{self.namespace}_{self.name}"       # its graph nodes: KernellabOp_kl_layernormBackward
        function = type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                           "backward": staticmethod(backward),
                                                           "__module__": __name__})
        self._function = function
        base = getattr(torch._C, "_FunctionBase", None)
        apply = getattr(base, "__dict__", {}).get("apply")
        if apply is None or not hasattr(apply, "__get__"):
            return None
        return apply.__get__(None, function)                   # autograd.Function.apply's C part, bound to it

    def opcheck(self, *args, test_utils=None, **kwargs):
        """torch.library.opcheck on these arguments: the schema (mutation, aliasing), the fake implementation against
        the real one, autograd's registration and AOT dispatch with dynamic shapes. Raises on the first failure."""
        extra = {} if test_utils is None else {"test_utils": test_utils}
        return torch.library.opcheck(self.overload, args, kwargs or None, **extra)

    def __repr__(self) -> str:
        grad = ", with backward" if self.backward is not None else ""
        return f"<kernellab.Op {self.qualname}{self.schema} on {', '.join(self.device_types)}{grad}>"


# An op's call in eager mode skips the dispatcher where the dispatcher would only hand the arguments to the op's
# implementation (Op._impl) unchanged: plain torch.Tensor arguments on the op's devices, scalars of the schema's
# Python types, all arguments given by position, no graph to record (grad off or no input requires it), and nothing
# that watches or transforms ops: torch.compile/export (torch.compiler.is_compiling, read as _COMPILING does;
# TorchDynamo reads it as True, so a traced call takes the dispatcher), __torch_function__ modes (torch.device(...)
# is one) and subclasses, __torch_dispatch__ modes (FakeTensorMode, FlopCounterMode, make_fx), torch.jit.trace,
# functorch transforms (vmap, grad), forward-mode AD (dual_level), the autograd profiler. Ops that write an argument in place always take the
# dispatcher (it bumps the argument's version counter), as does every other case, opcheck and
# torch.ops.<ns>.<name>. The saving: about 0.4 µs of CPU time a call, 1.5 µs for an op with a backward
# (benchmarks/launch_overhead.py --cpu). EAGER_FAST_CALLS = False before registering turns it off.
#
# A call that records a graph (grad on, an input requiring grad) of an op with a backward goes the same way, into the
# autograd.Function that torch's Autograd kernel for the op would apply (Op._graph_apply): the same forward,
# setup_context and backward, with a graph node of its own name (KernellabOp_<ns>_<name>Backward). This is what a
# training step calls: it saves about half the host time of a LayerNorm op's forward and backward
# (benchmarks/launch_overhead.py --cpu, tests/test_norm_host_path.py).
#
# nn.Parameter passes as a plain Tensor: its __torch_function__ is torch's disabled one, so the dispatcher treats it
# as one (a model's weights are Parameters).
EAGER_FAST_CALLS = True
_EAGER_SCALARS = {"float": "float", "int": "int", "bool": "bool"}
_PARAMETER = (torch.nn.Parameter if getattr(torch.nn.Parameter, "__torch_function__", None)
              is getattr(torch._C, "_disabled_torch_function_impl", object()) else torch.Tensor)
_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
# torch.compiler.is_compiling() outside TorchScript, without its two Python frames (it calls torch.jit.is_scripting,
# about 8 µs of a cold call's 15 for all the eager call's guards on the CPU, launch_overhead.py --cold):
# is_dynamo_compiling(), which TorchDynamo reads as True, or the compiling flag torch.export and torch.compile set (what
# is_compiling() returns). Where this torch lacks either, is_compiling() itself.
_COMPILING = ("DYNAMO() or COMPILER._is_compiling_flag"
              if hasattr(torch.compiler, "is_dynamo_compiling") and isinstance(
                  getattr(torch.compiler, "_is_compiling_flag", None), bool) else "IS_COMPILING()")


def _eager_source(schema, device_types: tuple[str, ...], returns: int, graph: bool = False) -> str | None:
    """The source of an op's eager call (see EAGER_FAST_CALLS): call(*args) -> the op's result, or None
    where this schema has no fast case (an argument written in place, a type other than Tensor, Tensor?, float, int,
    bool, a keyword-only argument). graph: a call that records a graph goes to APPLY (Op._graph_apply), unless an
    argument is a functorch wrapper (which autograd.Function.apply would unwrap), else to the dispatcher."""
    args = list(schema.arguments)
    if any(a.alias_info is not None or a.kwarg_only for a in args):
        return None
    device = " or ".join(f"not a{{i}}.is_{d}" for d in device_types) if len(device_types) == 1 else \
        "(" + " and ".join(f"not a{{i}}.is_{d}" for d in device_types) + ")"
    checks, grads, wrapped = [], [], []
    for i, a in enumerate(args):
        kind = str(a.type)
        plain = f"type(a{i}) is not Tensor and type(a{i}) is not Parameter"
        if kind == "Tensor":
            checks.append(f"({plain}) or {device.format(i=i)}")
            grads.append(f"a{i}.requires_grad")
            wrapped.append(f"WRAPPED(a{i})")
        elif kind == "Optional[Tensor]":
            checks.append(f"(a{i} is not None and ({plain} or {device.format(i=i)}))")
            grads.append(f"(a{i} is not None and a{i}.requires_grad)")
            wrapped.append(f"(a{i} is not None and WRAPPED(a{i}))")
        elif kind in _EAGER_SCALARS:
            checks.append(f"type(a{i}) is not {_EAGER_SCALARS[kind]}")
        else:
            return None
    names = "".join(f"a{i}, " for i in range(len(args)))
    result = {0: "    IMPL(*args)\n    return None", 1: "    return IMPL(*args)"}.get(
        returns, "    return tuple(IMPL(*args))")
    lines = ["def call(*args):",
             f"    if ({_COMPILING} or TF_MODE() or DISPATCH_MODES() or TRACING() is not None",
             "            or FUNCTORCH() is not None or PROFILING() or FORWARD_AD._current_level >= 0):",
             "        return OVERLOAD(*args)",
             "    try:",
             f"        {names or '()'} = args" if args else "        if args: raise ValueError",
             "    except ValueError:",
             "        return OVERLOAD(*args)"]
    if checks:
        lines += ["    if (" + "\n            or ".join(checks) + "):", "        return OVERLOAD(*args)"]
    if grads and graph:
        lines += [f"    if GRAD() and ({' or '.join(grads)}):",
                  f"        if {' or '.join(wrapped)}:", "            return OVERLOAD(*args)",
                  "        return APPLY(*args)"]
    elif grads:
        lines += [f"    if GRAD() and ({' or '.join(grads)}):", "        return OVERLOAD(*args)"]
    lines.append(result)
    return "\n".join(lines) + "\n"


_OPS: dict[str, Op] = {}
_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*)$")


def op(name: str, schema: str | None = None, *, outputs=None, backward: Callable | None = None,
       setup_context: Callable | None = None, mutates=(), device_types=("cuda",), check_outputs="first"):
    """Register a Python launcher (one or several kernellab kernels, and any torch code around them) as the PyTorch
    operator `name` ("namespace::name", e.g. "kl::softmax"): a decorator; returns an Op, called like the launcher.

    schema: the op's arguments and results in PyTorch's schema language, "(Tensor x, float eps) -> Tensor", with the
    launcher's parameter names; None infers it from the launcher's type annotations (torch.library.infer_schema).
    outputs: a function of the op's arguments giving each output (a tuple for several): a tensor the output is like
    (same shape, dtype, device), or kernellab.out(like, shape=, dtype=). It makes the fake implementation that
    torch.compile(fullgraph=True) and torch.export trace, so it reads only shapes, dtypes and devices. Needed
    whenever the schema returns something. check_outputs: "first" (default: the first 8 calls), True (every call)
    or False: compare the launcher's real outputs with outputs=.
    backward: backward(ctx, *grads) -> one gradient (or None) per argument, registered with
    torch.library.register_autograd. It is traced like the forward (torch.compile, opcheck), so it calls ops (this
    one, another kernellab.op, torch's), never a launcher directly. Without backward=, the op is not
    differentiable (PyTorch warns where a gradient is asked through it). Without setup_context, every tensor argument and output is saved, and backward
    finds them as ctx.inputs and ctx.output; with setup_context(ctx, inputs, output), torch's own convention holds.
    mutates: the names of arguments the launcher writes in place (schema inference marks them Tensor(a!)).
    device_types: where the launcher runs, ("cuda",) by default; ("cpu",) or ("cuda", "cpu") for launchers that take
    CPU tensors (a reference, or a simulated kernel).

    Launches inside the op do not wait for their kernels, so an op queues work as fast as PyTorch's own. Running
    the cell again with the same schema replaces the launcher, outputs and backward; a different schema needs a new
    name (PyTorch cannot redefine an op in a running process).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ArgumentError(f"an op's name is 'namespace::name' (letters, digits and _), e.g. 'kl::softmax'; got "
                            f"{name!r}")
    namespace = name.split("::")[0]
    if namespace in RESERVED_NAMESPACES:
        raise ArgumentError(f"the namespace '{namespace}' belongs to PyTorch; use your own, e.g. 'kl::{name.split('::')[1]}'")
    devices = (device_types,) if isinstance(device_types, str) else tuple(device_types)
    bad = [d for d in devices if d not in _DEVICE_KEYS]
    if not devices or bad:
        raise ArgumentError(f"device_types takes 'cuda' and/or 'cpu', got {device_types!r}")
    if check_outputs not in ("first", True, False):
        raise ArgumentError(f"check_outputs is 'first', True or False, got {check_outputs!r}")
    if backward is not None and not callable(backward):
        raise ArgumentError(f"backward must be a function backward(ctx, *grads), got {type(backward).__name__}")
    if setup_context is not None and backward is None:
        raise ArgumentError("setup_context= without backward= does nothing; give the backward too")
    if isinstance(mutates, str):
        mutates = (mutates,)

    def register(launcher: Callable) -> Op:
        if not callable(launcher):
            raise ArgumentError(f"kernellab.op({name!r}) decorates a launcher function, got {type(launcher).__name__}")
        text = _schema_text(name, schema, launcher, tuple(mutates))
        parsed = _parse(name, text)
        _check_names(name, parsed, launcher)
        returns = len(parsed.returns)
        written = tuple(a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write)
        if returns and outputs is None:
            kinds = ", ".join(str(r.type) for r in parsed.returns)
            raise ArgumentError(f"{name} returns {kinds} but has no outputs=: kernellab makes the op's fake "
                                f"implementation (what torch.compile and torch.export trace) from it. Give one spec "
                                f"per output, e.g. outputs=lambda {_first_tensor_name(parsed)}, ...: "
                                f"{_first_tensor_name(parsed)} (an output like that argument) or "
                                f"kernellab.out({_first_tensor_name(parsed)}, shape=..., dtype=...)")
        if outputs is not None and not callable(outputs):
            raise ArgumentError(f"outputs= is a function of the op's arguments (e.g. lambda x: x), got "
                                f"{type(outputs).__name__}")
        if any(str(r.type) not in ("Tensor",) for r in parsed.returns):
            raise ArgumentError(f"{name} returns {', '.join(str(r.type) for r in parsed.returns)}; kernellab ops "
                                f"return tensors (one or a tuple), e.g. '-> (Tensor, Tensor)'")
        old = _OPS.get(name)
        if old is not None:
            if old.schema != text or old.device_types != devices:
                raise ArgumentError(f"{name} is already registered as {old.schema} on {', '.join(old.device_types)}; "
                                    f"PyTorch cannot redefine an op in a running process: give this one a new name "
                                    f"(e.g. '{name}_v2') or restart the kernel")
            old._set(launcher, outputs, backward, setup_context, check_outputs)
            old._register_autograd()
            old._call = old._make_call()          # with or without a backward now: the eager call's grad branch
            return old
        made = Op(name, text, returns, launcher, outputs, backward, setup_context, devices, check_outputs, written)
        _OPS[name] = made
        return made

    return register


def _schema_text(name: str, schema, launcher, mutates: tuple) -> str:
    """The schema's text without the op's name, "(Tensor x) -> Tensor", given or inferred."""
    short = name.split("::")[1]
    if schema is None:
        try:
            inferred = torch.library.infer_schema(launcher, mutates_args=mutates)
        except Exception as exc:
            raise ArgumentError(f"could not infer {name}'s schema from the launcher's annotations ({exc}); give it "
                                f"as kernellab.op({name!r}, '(Tensor x, float eps) -> Tensor', ...) or annotate "
                                f"the parameters (x: torch.Tensor, eps: float) -> torch.Tensor") from None
        return inferred
    if not isinstance(schema, str):
        raise ArgumentError(f"schema is a string such as '(Tensor x, float eps) -> Tensor', got {type(schema).__name__}")
    text = schema.strip()
    if text.startswith(short + "("):
        text = text[len(short):]
    elif not text.startswith("("):
        raise ArgumentError(f"{name}'s schema {schema!r} should start with its argument list, e.g. "
                            f"'(Tensor x, float eps) -> Tensor'")
    return text


def _parse(name: str, text: str):
    try:
        return torch._C.parse_schema(f"{name}{text}")
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ArgumentError(f"{name}'s schema {text!r} is not PyTorch's schema language ({detail}). It lists typed "
                            f"arguments and results, e.g. '(Tensor x, Tensor w, float eps=1e-5) -> Tensor', "
                            f"'(Tensor q, Tensor k, Tensor v, bool causal) -> (Tensor, Tensor)', and "
                            f"'(Tensor x, Tensor(a!) y) -> ()' for an argument written in place") from None


def _check_names(name: str, parsed, launcher) -> None:
    """The schema's arguments are the launcher's parameters, in order: torch passes them by position."""
    try:
        params = [p for p in inspect.signature(launcher).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(launcher).parameters.values()):
        return
    want = [a.name for a in parsed.arguments]
    have = [p.name for p in params]
    if want != have:
        raise ArgumentError(f"{name}'s schema names the arguments ({', '.join(want)}) but the launcher takes "
                            f"({', '.join(have)}); torch calls the launcher with the schema's arguments in order, "
                            f"so make the two lists the same")


def _first_tensor_name(parsed) -> str:
    return next((a.name for a in parsed.arguments if str(a.type).startswith("Tensor")), "x")


def _count(value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (tuple, list)):
        return f"{len(value)} value{'s' if len(value) != 1 else ''}"
    return f"one {type(value).__name__}"


def _tensor_text(shape, dtype, device) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(shape)} on {device}"


def _describe_args(args) -> str:
    parts = [(_tensor_text(tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a))[:60]
             for a in args]
    return "(" + ", ".join(parts) + ")"


def registered() -> dict[str, Op]:
    """The ops kernellab.op registered in this process, by name."""
    return dict(_OPS)
