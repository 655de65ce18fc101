"""Numba kernels -> PTX (numba-cuda's compiler, no GPU needed) -> cubin + ptxas resources, errors at source lines.

`compile_numba(function, "float32[::1], float32[::1], int32")` types the kernel's Python function with the given
signature, lowers it to PTX with numba-cuda's NVVM for `arch` (`cuda.compile_ptx`, which needs no GPU), and
assembles that PTX with ptxas (`-v`) to a cubin, so that registers, shared memory, local memory and spills are the
compiler's own figures for that arch. Given source text, it runs the source, finds its `@cuda.jit` kernels and
compiles each one.

What differs from the real launch path: numba-cuda launches through its own linker (nvJitLink, with LTO where
available) for the GPU in hand, while this path assembles the same PTX with ptxas for a named arch. Both start from
the same PTX; register counts can differ by a few where LTO inlines differently.

Without a GPU two numba-cuda behaviours need help, and this module gives it only while it compiles:
- device functions (`@cuda.jit(device=True)`) compile for "the current device", which does not exist: their
  compute capability is read from a stand-in device for the arch being compiled (`_target_device`);
- `@cuda.jit("signature")` compiles eagerly and binds to a GPU at decoration: `deferred_signatures()` makes such
  decorators lazy while a source runs and keeps their signatures for `compile_numba` (`SIGNATURES_ATTR`).
"""
from __future__ import annotations

import contextlib
import dis
import inspect
import linecache
import os
import re
import subprocess
import tempfile
import threading
import time
import types as pytypes
from dataclasses import dataclass, field

import numpy as np

from ..analysis.arch import DEFAULT_ARCH, compute_capability, normalize_arch
from ..errors import CompileError, Diagnostic, KernellabError
from . import toolkit
from .nvrtc import PtxasReport, parse_ptxas
from .signature import Param

SIGNATURES_ATTR = "_kernellab_signatures"  # set on dispatchers whose decorator named signatures (deferred)

_patch_lock = threading.RLock()


# ---------------------------------------------------------------------------------------------------------------------
# Types and signatures


@dataclass(frozen=True)
class NumbaParam(Param):
    """A Numba kernel parameter: a typed array (pointer=True, with ndim and layout) or a scalar."""

    ndim: int = 0
    layout: str = ""      # 'C' (C-contiguous), 'F' (Fortran-contiguous) or 'A' (any strides) for arrays
    numba_type: str = ""  # numba's own spelling, e.g. 'array(float32, 1d, C)'


def numba_available() -> tuple[bool, str]:
    """(usable, reason): whether numba-cuda's real compiler can be used in this process."""
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda fails to import with some NumPy versions
        return False, f"numba-cuda does not import here ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    if getattr(cuda, "compile_ptx", None) is None:
        return False, ("NUMBA_ENABLE_CUDASIM=1 is set, so numba.cuda is the simulator and cannot compile; unset it "
                       "(kernellab runs the simulator without it)")
    return True, "numba-cuda " + _numba_cuda_version()


def _numba_cuda_version() -> str:
    try:
        import numba_cuda

        return getattr(numba_cuda, "__version__", "?")
    except ImportError:
        return "?"


def numba_types(spec) -> tuple:
    """Argument types from a signature: 'float32[::1], int32', 'void(float32[::1], int32)', a Signature or a tuple."""
    from numba.core import types
    from numba.cuda.core import sigutils

    if isinstance(spec, (list, tuple)) and all(isinstance(t, str) for t in spec):
        spec = ", ".join(spec)
    if isinstance(spec, types.Type):
        return (spec,)
    try:
        argtypes, restype = sigutils.normalize_signature(spec)
    except TypeError as exc:
        if isinstance(spec, str) and "instead of tuple" in str(exc):  # a single type: 'float32[::1]'
            argtypes, restype = sigutils.normalize_signature(f"({spec},)")
        else:
            raise _signature_error(spec, exc) from None
    except Exception as exc:  # NameError, SyntaxError from evaluating the string
        raise _signature_error(spec, exc) from None
    if restype is not None and restype != types.void and restype != types.none:
        raise KernellabError(f"signature {spec!r} returns {restype}; a kernel returns nothing: write "
                             f"'void(...)' or just the argument types")
    return tuple(argtypes)


def _signature_error(spec, exc) -> KernellabError:
    return KernellabError(f"signature {spec!r} is not a Numba signature ({type(exc).__name__}: {exc}); write the "
                          f"argument types, e.g. 'float32[::1], float32[::1], int32' (1-D C-contiguous float32 "
                          f"arrays and an int32) or 'float32[:, ::1], int64'")


def type_text(t) -> str:
    """Numba signature spelling of one type: 'float32[::1]', 'float64[:, :]', 'int32'."""
    from numba.core import types

    if isinstance(t, types.Array):
        dims = [":"] * t.ndim
        if t.ndim and t.layout == "C":
            dims[-1] = "::1"
        elif t.ndim and t.layout == "F":
            dims[0] = "::1"
        text = f"{t.dtype}[{', '.join(dims)}]"
        return text if t.mutable else f"readonly {text}"
    return str(t)


def signature_text(argtypes) -> str:
    """'float32[::1], float32[::1], int32'."""
    return ", ".join(type_text(t) for t in argtypes)


def _dtype_name(t) -> str | None:
    from numba.np import numpy_support

    try:
        return numpy_support.as_dtype(t).name
    except Exception:
        return None


def param_names(py_func) -> tuple[str, ...]:
    """The kernel function's parameter names."""
    try:
        return tuple(inspect.signature(py_func).parameters)
    except (TypeError, ValueError):
        code = py_func.__code__
        return code.co_varnames[:code.co_argcount]


def params_for(py_func, argtypes) -> tuple[NumbaParam, ...]:
    """One NumbaParam per argument: names from the Python function, types from the signature."""
    from numba.core import types

    names = param_names(py_func)
    out = []
    for i, t in enumerate(argtypes):
        name = names[i] if i < len(names) else f"arg{i}"
        text = type_text(t)
        if isinstance(t, types.Array):
            out.append(NumbaParam(name=name, ctype=text, base=str(t.dtype), pointer=True, const=not t.mutable,
                                  dtype=_dtype_name(t.dtype), size_bytes=8, ndim=t.ndim, layout=t.layout,
                                  numba_type=str(t)))
        else:
            dtype = _dtype_name(t) if isinstance(t, (types.Integer, types.Float, types.Boolean)) else None
            size = {"bool": 1}.get(dtype, int(dtype[-2:]) // 8 if dtype and dtype[-2:].isdigit() else 8)
            out.append(NumbaParam(name=name, ctype=text, base=text, pointer=False, const=False, dtype=dtype,
                                  size_bytes=size, numba_type=str(t)))
    return tuple(out)


def infer_types(args, names=()) -> tuple:
    """Numba argument types of runtime values, by Numba's own rules (a Python int is int64, a float float64).

    NumPy arrays and torch CPU tensors are typed by their dtype, ndim and layout; objects with
    `__cuda_array_interface__` (CuPy arrays, torch CUDA tensors, Numba device arrays) from that interface.
    """
    return tuple(_infer_one(x, i, names[i] if i < len(names) else f"arg{i}") for i, x in enumerate(args))


def _infer_one(x, pos: int, name: str):
    from numba.core import types
    from numba.np import numpy_support

    where = f"argument {pos} ('{name}')"
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "dtype") and hasattr(x, "dim"):
        dtype_name = str(x.dtype).replace("torch.", "")
        if dtype_name == "bfloat16":
            raise KernellabError(f"{where} is a bfloat16 tensor; Numba kernels have no bfloat16 arrays: convert it "
                                 f"with .float() (or .half() for float16)")
        if x.dim() == 0:
            raise KernellabError(f"{where} is a 0-d tensor; pass a number (x.item()) or a 1-element tensor")
        shape, strides = tuple(x.shape), tuple(s * x.element_size() for s in x.stride())
        dtype = np.dtype(dtype_name)
        return types.Array(numpy_support.from_dtype(dtype), x.dim(), _layout(shape, strides, dtype.itemsize))
    cai = getattr(x, "__cuda_array_interface__", None) if mod != "numpy" else None
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        if not shape:
            raise KernellabError(f"{where} is a 0-d array; pass a number or a 1-element array")
        strides = cai.get("strides")
        layout = "C" if strides is None else _layout(shape, tuple(strides), dtype.itemsize)
        return types.Array(numpy_support.from_dtype(dtype), len(shape), layout, readonly=bool(cai["data"][1]))
    if isinstance(x, np.ndarray) and x.ndim == 0:
        raise KernellabError(f"{where} is a 0-d array; pass a number (x.item()) or a 1-element array")
    if isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)):
        from numba.cuda.typing.typeof import Purpose, typeof

        try:
            return typeof(x, Purpose.argument)
        except Exception as exc:
            raise KernellabError(f"{where}: Numba cannot type a {type(x).__name__} ({exc})") from None
    raise KernellabError(f"{where} is a {type(x).__name__}; a Numba kernel takes arrays (NumPy, torch, CuPy) and "
                         f"numbers")


def contiguous(shape, strides, itemsize: int, order: str) -> bool:
    """Whether byte `strides` lay the array out densely in `order` ('C' or 'F'); dimensions of size 1 do not count."""
    if any(s == 0 for s in shape):
        return True
    expect = itemsize
    for d in (range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))):
        if shape[d] != 1 and strides[d] != expect:
            return False
        expect *= shape[d]
    return True


def _layout(shape, strides, itemsize: int) -> str:
    """Numba's layout letter for an array: 'C', else 'F', else 'A' (as NumPy's flags decide, C first)."""
    if contiguous(shape, strides, itemsize, "C"):
        return "C"
    return "F" if contiguous(shape, strides, itemsize, "F") else "A"


# ---------------------------------------------------------------------------------------------------------------------
# Running source text


def is_kernel_dispatcher(obj) -> bool:
    """A `@cuda.jit` kernel (real or simulated), not a device function."""
    options = getattr(obj, "targetoptions", None)
    if isinstance(options, dict) and hasattr(obj, "py_func"):
        return not options.get("device", False)
    if type(obj).__name__ == "FakeCUDAKernel" and hasattr(obj, "fn"):
        return not getattr(obj, "_device", False)
    return False


def kernel_function(obj):
    """The Python function behind a real or simulated kernel, or the function itself."""
    for attr in ("py_func", "fn"):
        fn = getattr(obj, attr, None)
        if callable(fn) and hasattr(fn, "__code__"):
            return fn
    if callable(obj) and hasattr(obj, "__code__"):
        return obj
    raise KernellabError(f"expected a @cuda.jit kernel or a Python function, got a {type(obj).__name__}")


@contextlib.contextmanager
def deferred_signatures(on_kernel=None):
    """While a source runs: `@cuda.jit("sig")` stays lazy (no GPU needed) and keeps its signatures on the kernel.

    Without this, a signature in the decorator compiles and loads the kernel on the current GPU at decoration,
    which fails where there is none. Device-function signatures are dropped (they are typed from their callers).
    `on_kernel(dispatcher)`, if given, is called on each kernel the decorator makes, and what it returns is bound
    in the dispatcher's place (kernellab wraps kernels there, so that a launch in the same cell is already checked).
    """
    from numba import cuda

    real_jit = cuda.jit
    if getattr(cuda, "compile_ptx", None) is None or getattr(real_jit, "_kernellab_deferring", False):
        yield
        return
    from numba.cuda.core import sigutils

    def is_sig(x):
        return sigutils.is_signature(x) or (isinstance(x, list) and x and all(sigutils.is_signature(s) for s in x))

    def finish(fn, sigs, kwargs):
        disp = real_jit(fn, **kwargs)
        if kwargs.get("device", False):
            return disp
        if sigs:
            setattr(disp, SIGNATURES_ATTR, sigs)
        return on_kernel(disp) if on_kernel is not None else disp

    def jit(func_or_sig=None, **kwargs):
        if func_or_sig is None:
            return lambda fn: finish(fn, (), kwargs)
        if is_sig(func_or_sig):
            sigs = tuple(func_or_sig) if isinstance(func_or_sig, list) else (func_or_sig,)
            return lambda fn: finish(fn, sigs, kwargs)
        return finish(func_or_sig, (), kwargs)

    jit._kernellab_deferring = True
    jit.__doc__ = real_jit.__doc__
    with _patch_lock:
        cuda.jit = jit
        try:
            yield
        finally:
            cuda.jit = real_jit


def register_source(text: str, filename: str) -> None:
    """Put `text` in linecache under `filename`, so that tracebacks and Numba's messages quote its lines."""
    linecache.cache[filename] = (len(text), None, [line + "\n" for line in text.splitlines()], filename)


def exec_source(source: str, namespace: dict, filename: str, first_line: int = 1, on_kernel=None) -> None:
    """Run `source` in `namespace` as a file whose first line is `first_line`, under `deferred_signatures(on_kernel)`.

    A SyntaxError becomes a CompileError at its line; other exceptions propagate (their tracebacks quote the source).
    """
    from numba import cuda

    namespace.setdefault("cuda", cuda)
    text = "\n" * (first_line - 1) + source
    if filename not in linecache.cache:
        register_source(text, filename)
    try:
        code = compile(text, filename, "exec")
    except SyntaxError as exc:
        diag = Diagnostic(exc.lineno, exc.offset, "error", f"{type(exc).__name__}: {exc.msg}")
        raise CompileError((diag,), str(exc), source, (), first_line=first_line, filename=filename) from None
    with deferred_signatures(on_kernel):
        exec(code, namespace)


def find_kernels(namespace: dict, filename: str, before: dict | None = None, marked=()) -> list[tuple[str, object]]:
    """(name, kernel) for each kernel that `filename`'s code bound in `namespace`, in source order.

    Kernels are `@cuda.jit` kernels whose function was defined in `filename` (and, given `before`, that are new or
    rebound since), plus the plain functions named in `marked`, which are jitted here.
    """
    found = []
    for name, value in list(namespace.items()):
        if before is not None and before.get(name, None) is value and name not in marked:
            continue
        if name in marked:
            if not callable(value):
                raise KernellabError(f"{name!r} was marked as a kernel but is a {type(value).__name__}; mark a "
                                     f"function defined in the cell")
            if is_kernel_factory(value):
                continue                   # wrapped as a factory by the caller (find_factories)
            if not is_kernel_dispatcher(value):
                value = as_kernel(value)
                namespace[name] = value
            found.append((name, value))
            continue
        if is_kernel_dispatcher(value):
            fn = kernel_function(value)
            if os.path.normcase(fn.__code__.co_filename) == os.path.normcase(filename):
                found.append((name, value))
    missing = [m for m in marked if m not in namespace]
    if missing:
        raise KernellabError(f"no function named {', '.join(map(repr, missing))} in the cell to mark as a kernel")
    found.sort(key=lambda item: kernel_function(item[1]).__code__.co_firstlineno)
    return found


def is_kernel_factory(obj) -> bool:
    """A plain function whose only parameter is `cuda`: it takes the cuda module and returns the kernel function
    (the GPU-Puzzles style, `def map_test(cuda): def call(out, a): ...; return call`)."""
    if not inspect.isfunction(obj) or is_kernel_dispatcher(obj):
        return False
    try:
        return tuple(inspect.signature(obj).parameters) == ("cuda",)
    except (TypeError, ValueError):
        return False


def kernel_from_factory(factory, cuda_module=None):
    """(kernel dispatcher, its Python function) from a kernel factory called with `cuda_module` (numba.cuda)."""
    if cuda_module is None:
        from numba import cuda as cuda_module
    made = factory(cuda_module)
    if is_kernel_dispatcher(made):
        return made, kernel_function(made)
    if not inspect.isfunction(made):
        raise KernellabError(f"{factory.__name__}(cuda) returned a {type(made).__name__}; a kernel factory returns the "
                             f"kernel function: def {factory.__name__}(cuda):\n    def call(out, a): ...\n    "
                             f"return call")
    return as_kernel(made), made


def find_factories(namespace: dict, filename: str, before: dict | None = None) -> list[tuple[str, object]]:
    """(name, factory) for each kernel factory (see is_kernel_factory) that `filename`'s code bound in `namespace`."""
    found = []
    for name, value in list(namespace.items()):
        if before is not None and before.get(name, None) is value:
            continue
        if is_kernel_factory(value) and os.path.normcase(value.__code__.co_filename) == os.path.normcase(filename):
            found.append((name, value))
    return found


def as_kernel(fn):
    """A plain Python function as a lazy `@cuda.jit` kernel (a simulator kernel where numba.cuda is the simulator)."""
    from numba import cuda

    if not inspect.isfunction(fn):
        raise KernellabError(f"{getattr(fn, '__name__', fn)!r} is a {type(fn).__name__}, not a Python function; "
                             f"a kernel is a `def` that uses cuda.threadIdx, cuda.blockIdx, ...")
    return cuda.jit(fn)


# ---------------------------------------------------------------------------------------------------------------------
# Globals a kernel reads: numba freezes them at compile time, the simulator reads them live


_names_read: dict = {}


def _read_names(code) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(global names, closure names) that `code` and the code nested in it load."""
    hit = _names_read.get(code)
    if hit is not None:
        return hit

    glob, free = [], []
    todo = [code]
    while todo:
        c = todo.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in glob:
                glob.append(ins.argval)
            elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval not in free:
                free.append(ins.argval)
        todo += [k for k in c.co_consts if isinstance(k, pytypes.CodeType)]
    hit = _names_read[code] = (tuple(glob), tuple(free))
    return hit


def _fingerprint(value):
    """What decides whether a global's value changed, as numba would see it: values of numbers, strings, tuples and
    arrays (numba freezes arrays as constants), the identity of anything else; None for modules (not tracked)."""
    if isinstance(value, pytypes.ModuleType):
        return None
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        return ("value", type(value).__name__, value)
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_fingerprint(v) for v in value)
    if isinstance(value, np.ndarray):
        data = value.tobytes() if value.nbytes <= 1 << 20 else id(value)
        return ("array", value.dtype.str, value.shape, hash(data))
    return ("id", id(value))


def global_values(py_func, factory=None) -> dict[str, tuple]:
    """{name: (fingerprint, short text of the value)} for the module globals and closure variables that a kernel
    (and the device functions and the kernel factory it comes from) reads; modules are left out."""
    out: dict[str, tuple] = {}
    seen: set[int] = set()
    todo = [py_func] + ([factory] if factory is not None else [])
    while todo:
        fn = todo.pop()
        if id(fn) in seen or not hasattr(fn, "__code__"):
            continue
        seen.add(id(fn))
        glob, free = _read_names(fn.__code__)
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        found = [(n, fn.__globals__[n]) for n in glob if n in fn.__globals__]
        for n in free:
            try:
                found.append((n, cells[n].cell_contents))
            except (KeyError, ValueError):
                continue
        for name, value in found:
            fp = _fingerprint(value)
            if fp is None:
                continue
            text = repr(value)
            out.setdefault(name, (fp, text if len(text) <= 40 else text[:37] + "..."))
            inner = getattr(value, "py_func", None)
            if inner is not None and (getattr(value, "targetoptions", None) or {}).get("device"):
                todo.append(inner)          # a device function: numba compiles its globals in too
    return out


def changed_globals(before: dict, now: dict) -> list[str]:
    """'TPB (3, now 4)' for each global whose value differs between two global_values() results."""
    out = []
    for name in sorted(set(before) | set(now)):
        old, new = before.get(name), now.get(name)
        if (old and old[0]) != (new and new[0]):
            out.append(f"{name} ({old[1] if old else 'unset'}, now {new[1] if new else 'unset'})")
    return out


def fresh_dispatcher(dispatcher):
    """A new dispatcher for the same function and options: it compiles again, with the globals' current values."""
    new = type(dispatcher)(dispatcher.py_func, dict(dispatcher.targetoptions))
    sigs = getattr(dispatcher, SIGNATURES_ATTR, None)
    if sigs:
        setattr(new, SIGNATURES_ATTR, sigs)
    return new


def dispatcher_signatures(obj) -> tuple:
    """Signatures a kernel already has: deferred from its decorator, else those it was compiled for."""
    sigs = getattr(obj, SIGNATURES_ATTR, None)
    if sigs:
        return tuple(sigs)
    try:
        return tuple(getattr(obj, "signatures", ()) or ())
    except Exception:
        return ()


# ---------------------------------------------------------------------------------------------------------------------
# Compiling


@dataclass(frozen=True)
class NumbaCompileOutput:
    """One Numba kernel compiled for one signature and arch: PTX, cubin and what ptxas reported."""

    name: str                 # the Python function's name
    symbol: str               # the PTX entry (Numba's mangled name)
    arch: str
    argtypes: tuple           # numba types
    params: tuple[NumbaParam, ...]
    ptx: str
    cubin: bytes
    log: str                  # ptxas -v output
    report: PtxasReport
    options: tuple[str, ...]  # what shaped the code: fastmath, opt, launch bounds, max registers, ptxas flags
    launch_bounds: tuple | None = None  # (max threads per block, ...) from @cuda.jit(launch_bounds=...)
    compile_ms: float = 0.0   # numba typing + NVVM + ptxas
    filename: str = ""
    line: int | None = None   # the `def` line of the kernel function
    notes: tuple[str, ...] = field(default=())

    @property
    def signature(self) -> str:
        """'float32[::1], float32[::1], int32'."""
        return signature_text(self.argtypes)

    @property
    def registers(self) -> int:
        return self.report.registers

    @property
    def shared_bytes(self) -> int:
        """Static shared memory per block, as ptxas counts it."""
        return self.report.shared_bytes

    @property
    def local_bytes(self) -> int:
        """Per-thread stack frame (local memory)."""
        return self.report.stack_bytes

    def __str__(self) -> str:
        r = self.report
        spill = (f", spills {r.spill_store_bytes} B stored / {r.spill_load_bytes} B loaded"
                 if r.spill_store_bytes or r.spill_load_bytes else ", no spills")
        args = ", ".join(f"{p.ctype} {p.name}" for p in self.params)
        return (f"{self.name}({args}) [{self.arch}]: {r.registers} registers, {r.shared_bytes} B static smem, "
                f"{r.stack_bytes} B local{spill}; compiled in {self.compile_ms:.0f} ms")

    __repr__ = __str__


class _TargetDevice:
    """Stands in for numba's current device while compiling: only its compute capability is read."""

    def __init__(self, cc):
        self.compute_capability = cc


@contextlib.contextmanager
def _target_device(cc):
    """Device functions compile for `cc` instead of asking the (possibly absent) GPU for its compute capability."""
    import numba.cuda.dispatcher as disp_mod
    from numba.cuda.core.compiler_lock import global_compiler_lock

    real = getattr(disp_mod, "get_current_device", None)
    with global_compiler_lock, _patch_lock:
        if real is not None:
            disp_mod.get_current_device = lambda: _TargetDevice(cc)
        try:
            yield
        finally:
            if real is not None:
                disp_mod.get_current_device = real


def compile_numba(source_or_function, signature=None, arch: str = DEFAULT_ARCH, *, fastmath: bool | None = None,
                  opt: bool | None = None, max_registers: int | None = None, launch_bounds=None,
                  first_line: int = 1, filename: str | None = None, namespace: dict | None = None):
    """Compile a Numba kernel to PTX and a cubin for `arch` with ptxas; no GPU needed.

    Given a `@cuda.jit` kernel or its Python function, returns a NumbaCompileOutput for `signature` (a Numba
    signature: 'float32[::1], float32[::1], int32'; default: the one in its decorator). Given source text, runs it
    (in `namespace`, default a fresh one with `cuda` imported) and returns {kernel name: NumbaCompileOutput}, in
    source order; `signature` is then a dict {name: signature}, or one signature when the source has one kernel.
    Options left at None come from the kernel's `@cuda.jit(...)` options. Typing and lowering errors raise
    CompileError at the source line (numbered from `first_line`).
    """
    ok, why = numba_available()
    if not ok:
        raise KernellabError(f"compile_numba needs numba-cuda's compiler: {why}")
    arch = normalize_arch(arch or DEFAULT_ARCH)
    if isinstance(source_or_function, str):
        return _compile_source(source_or_function, signature, arch, fastmath=fastmath, opt=opt,
                               max_registers=max_registers, launch_bounds=launch_bounds, first_line=first_line,
                               filename=filename, namespace=namespace)
    kernel = source_or_function
    if signature is None:
        sigs = dispatcher_signatures(kernel)
        if not sigs:
            name = getattr(kernel_function(kernel), "__name__", "kernel")
            raise KernellabError(f"compile_numba needs a signature for {name}: pass e.g. signature='float32[::1], "
                                 f"int32' (the argument types), or name it in the decorator: @cuda.jit('void(...)')")
        signature = sigs[0]
    return compile_kernel(kernel, numba_types(signature), arch, fastmath=fastmath, opt=opt,
                          max_registers=max_registers, launch_bounds=launch_bounds)


def _compile_source(source, signature, arch, *, first_line, filename, namespace, **options):
    filename = filename or f"<numba-{abs(hash(source)) % 10**10}>"
    ns = {"__name__": "__kernellab_numba__"} if namespace is None else namespace
    exec_source(source, ns, filename, first_line)
    kernels = find_kernels(ns, filename)
    if not kernels:
        raise KernellabError("the source defines no @cuda.jit kernel; decorate a function with @cuda.jit "
                             "(device functions, @cuda.jit(device=True), are compiled into the kernels that call them)")
    if signature is not None and not isinstance(signature, dict):
        if len(kernels) != 1:
            raise KernellabError(f"the source has {len(kernels)} kernels ({', '.join(n for n, _ in kernels)}); "
                                 f"give signatures as a dict {{name: signature}}")
        signature = {kernels[0][0]: signature}
    signature = dict(signature or {})
    unknown = set(signature) - {n for n, _ in kernels}
    if unknown:
        raise KernellabError(f"signature given for {', '.join(sorted(unknown))}, which the source does not define as "
                             f"a kernel; its kernels: {', '.join(n for n, _ in kernels)}")
    out = {}
    for name, kernel in kernels:
        sig = signature.get(name) or next(iter(dispatcher_signatures(kernel)), None)
        if sig is None:
            raise KernellabError(f"no signature for kernel {name}: pass signature={{'{name}': 'float32[::1], ...'}} "
                                 f"or name it in the decorator")
        out[name] = compile_kernel(kernel, numba_types(sig), arch, source=source, first_line=first_line, **options)
    return out


_memo: dict = {}
_MEMO_SIZE = 256


def compile_kernel(kernel, argtypes: tuple, arch: str = DEFAULT_ARCH, *, fastmath: bool | None = None,
                   opt: bool | None = None, max_registers: int | None = None, launch_bounds=None,
                   source: str | None = None, first_line: int = 1) -> NumbaCompileOutput:
    """Compile one kernel (dispatcher or function) for `argtypes` on `arch`; memoised per function, types and options.

    `source`/`first_line` give the text CompileError quotes (default: the function's file, from linecache).
    """
    from numba import cuda

    arch = normalize_arch(arch)
    py_func = kernel_function(kernel)
    topts = dict(getattr(kernel, "targetoptions", {}) or {})
    fastmath = bool(topts.get("fastmath", False)) if fastmath is None else bool(fastmath)
    debug = bool(topts.get("debug") or False)
    opt = (topts.get("opt", True) if topts.get("opt") is not None else True) if opt is None else bool(opt)
    max_registers = topts.get("max_registers") if max_registers is None else max_registers
    launch_bounds = topts.get("launch_bounds") if launch_bounds is None else launch_bounds
    if isinstance(launch_bounds, int):
        launch_bounds = (launch_bounds,)
    links = tuple(topts.get("link") or ())
    argtypes = tuple(argtypes)
    frozen = tuple(sorted((n, v[0]) for n, v in global_values(py_func).items()))  # numba bakes these values in
    key = (py_func, argtypes, arch, fastmath, debug, opt, max_registers, launch_bounds, links, frozen)
    hit = _memo.get(key)
    if hit is not None:
        return hit

    filename = py_func.__code__.co_filename
    t0 = time.perf_counter()
    try:
        with _target_device(compute_capability(arch)):
            ptx, _ = cuda.compile_ptx(py_func, argtypes, cc=compute_capability(arch), fastmath=fastmath, opt=opt,
                                      debug=debug, lineinfo=not debug, launch_bounds=launch_bounds)
    except Exception as exc:
        if not _is_compile_failure(exc):
            raise
        raise _compile_error(exc, py_func, argtypes, source, first_line) from None
    names = param_names(py_func)
    if len(names) != len(argtypes):
        raise KernellabError(f"{py_func.__name__} takes {len(names)} arguments but the signature has {len(argtypes)}: "
                             f"{signature_text(argtypes)}")
    symbol = _entry_symbol(ptx)
    notes = []
    ptxas_flags = []
    if max_registers:
        ptxas_flags.append(f"-maxrregcount={int(max_registers)}")
    if links:
        ptxas_flags.append("-c")
        notes.append(f"{py_func.__name__} links {len(links)} extra file(s); the resources count the kernel's own "
                     f"code only")
    cubin, log = assemble(ptx, arch, ptxas_flags, debug=debug, source=source, py_func=py_func,
                          first_line=first_line)
    if log.startswith("note: "):
        notes.append(log.splitlines()[0][len("note: "):])
    reports = parse_ptxas(log)
    report = reports.get(symbol) or (next(iter(reports.values())) if len(reports) == 1 else PtxasReport())
    options = tuple(o for o in (("fastmath" if fastmath else ""), ("" if opt else "opt=False"),
                                ("debug" if debug else ""),
                                (f"launch_bounds={launch_bounds}" if launch_bounds else ""), *ptxas_flags) if o)
    out = NumbaCompileOutput(name=py_func.__name__, symbol=symbol, arch=arch, argtypes=argtypes,
                             params=params_for(py_func, argtypes), ptx=ptx, cubin=cubin, log=log, report=report,
                             options=options, launch_bounds=launch_bounds,
                             compile_ms=(time.perf_counter() - t0) * 1e3, filename=filename,
                             line=py_func.__code__.co_firstlineno, notes=tuple(notes))
    if len(_memo) >= _MEMO_SIZE:
        _memo.pop(next(iter(_memo)))
    _memo[key] = out
    return out


def _entry_symbol(ptx: str) -> str:
    m = re.search(r"\.entry\s+([\w$.]+)\s*\(", ptx)
    if not m:
        raise KernellabError("numba produced PTX without a kernel entry point")
    return m.group(1)


def assemble(ptx: str, arch: str, flags=(), *, debug: bool = False, source=None, py_func=None,
             first_line: int = 1) -> tuple[bytes, str]:
    """PTX -> cubin with the toolkit's ptxas (`-v`); returns (cubin, log). Errors become CompileError."""
    tool = toolkit.find_tool("ptxas")
    if tool is None:
        raise KernellabError("resources for Numba kernels come from ptxas, which was not found: install the wheel "
                             "nvidia-cuda-nvcc (pip install 'nvidia-cuda-nvcc==13.0.*') or set CUDA_HOME")
    with tempfile.TemporaryDirectory(prefix="kernellab-numba-") as tmp:
        src, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        cmd = [tool, "-v", f"-arch={arch}", *(["-g"] if debug else ["-lineinfo"]), *flags, src, "-o", out]
        proc, log = _run_ptxas(cmd, ptx, src)
        older = re.search(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'", log)
        if proc.returncode != 0 and older:
            # numba-cuda's NVVM writes a newer PTX ISA than this ptxas reads; the code itself rarely needs it.
            ptx = re.sub(r"^\.version\s+\d+\.\d+", f".version {older.group(2)}", ptx, count=1, flags=re.M)
            proc, log = _run_ptxas(cmd, ptx, src)
            log = (f"note: PTX ISA {older.group(1)} from NVVM lowered to {older.group(2)} for this ptxas\n"
                   + log)
        if proc.returncode != 0:
            first = next((l.strip() for l in log.splitlines() if "error" in l.lower() or "fatal" in l.lower()),
                         log.strip() or "ptxas failed")
            diag = Diagnostic(None, None, "error", "ptxas: " + first)
            text = source if source is not None else _file_text(py_func)
            raise CompileError((diag,), log, text, tuple(cmd[1:]), first_line=first_line if source else 1,
                               filename=py_func.__code__.co_filename if py_func else "kernel.ptx")
        with open(out, "rb") as fh:
            cubin = fh.read()
    return cubin, log


def _run_ptxas(cmd, ptx: str, path: str):
    with open(path, "w") as fh:
        fh.write(ptx)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc, (proc.stdout + proc.stderr).replace(path, "kernel.ptx")


# ---------------------------------------------------------------------------------------------------------------------
# Errors at source lines


def _is_compile_failure(exc) -> bool:
    """Whether an exception from numba's compiler is about the user's code (not kernellab or the installation)."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "CudaSupportError" in names or "CudaDriverError" in names:
        return False
    mods = {c.__module__.split(".")[0] for c in type(exc).__mro__}
    return "NumbaError" in names or "numba" in mods or isinstance(
        exc, (TypeError, ValueError, NotImplementedError, KeyError, AttributeError, IndexError, NameError))


_DROP = re.compile(r"^(Failed in .* pipeline|During: |Enable logging at debug level|For more information about "
                   r"typing errors|See https://|<source elided>|\^\s*$|File \")")


def _summary(text: str) -> str:
    """The few lines of a Numba error that say what is wrong (no pipeline steps, source echoes or URLs)."""
    lines, skip_echo = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("File \""):
            skip_echo = True
            continue
        if skip_echo:
            if not line:
                skip_echo = False
            continue
        if line.startswith(("There are ", "- Of which")) and lines:
            break
        if not line or _DROP.match(line) or set(line) <= {"-", "=", " "}:
            continue
        lines.append(line)
        if len(lines) == 4:
            break
    if lines:
        return " ".join(lines)
    return text.strip().splitlines()[0] if text.strip() else "compilation failed"


def error_line(exc, filename: str) -> int | None:
    """The line of `filename` that a Numba error is about: from its message, else from the compiler's frames."""
    texts = [str(exc), str(getattr(exc, "msg", "") or "")]
    texts += [str(c) for c in (getattr(exc, "contexts", None) or [])]
    loc = getattr(exc, "loc", None)
    if loc is not None and getattr(loc, "filename", None) == filename and getattr(loc, "line", None):
        return int(loc.line)
    f = re.escape(filename)
    for pattern in (rf'File "{f}", line (\d+)', rf"at {f} \((\d+)\)", rf"{f}:(\d+)"):
        for text in texts:
            m = re.search(pattern, text)
            if m:
                return int(m.group(1))
    # The compiler's own frames hold the IR location it was working on (innermost first).
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            for cand in (value, getattr(value, "loc", None), getattr(getattr(value, "inst", None), "loc", None)):
                if (cand is not None and type(cand).__name__ == "Loc" and getattr(cand, "filename", None) == filename
                        and getattr(cand, "line", None)):
                    return int(cand.line)
    return None


def _file_text(py_func) -> str:
    if py_func is None:
        return ""
    return "".join(linecache.getlines(py_func.__code__.co_filename))


def _compile_error(exc, py_func, argtypes, source, first_line) -> CompileError:
    filename = py_func.__code__.co_filename
    line = error_line(exc, filename)
    message = _summary(str(exc))
    if line is None:
        line = py_func.__code__.co_firstlineno
        message += f" (in {py_func.__name__}; Numba gave no line)"
    message = f"{message} [{py_func.__name__}({signature_text(argtypes)})]"
    diag = Diagnostic(line, None, "error", message)
    log = f"{type(exc).__name__}: {exc}"
    if source is None:
        return CompileError((diag,), log, _file_text(py_func), ("numba",), first_line=1, filename=filename)
    return CompileError((diag,), log, source, ("numba",), first_line=first_line, filename=filename)
