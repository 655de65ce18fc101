"""`NumbaKernel` and `NumbaModule`: Numba `@cuda.jit` kernels as kernellab Kernels, on a GPU or in the simulator.

A NumbaKernel is a `kernellab.Kernel`: `resources`, `ptx`, `sass`, `occupancy`, `best_block_sizes`, `to_json` and
`k[grid, block](args)`. Its signature (Numba argument types) is given, or taken from its first launch; until then it
is "pending" and has no resources. Resources come from the PTX numba-cuda writes, assembled with ptxas for `arch`
(`kernellab.compile.numba_backend`), so they need no GPU.

Launches: with a GPU, through numba-cuda's own launcher, on torch CUDA tensors, CuPy arrays or Numba device arrays
(zero copy, through `__cuda_array_interface__`). With `simulate=True` (the default where there is no GPU), in Numba's
CUDA simulator on NumPy arrays and torch tensors (`kernellab.run.sim.numba_sim`); the kernel is compiled for the real
target as well, so code that the simulator runs but the compiler rejects is reported. Both modes check the arguments
against the signature first and name the argument that does not fit. `k.sanitize(..., tool="racecheck")` (or
"synccheck") of a simulated kernel checks the launch for shared-memory races and divergent barriers in the simulator
(`kernellab.run.sim.race`), with no GPU.

A kernel may also be a factory, GPU-Puzzles' style: a function whose only parameter is `cuda` and which returns the
kernel function. It is called with the real `numba.cuda` to compile, and with the simulator's module for each
simulated launch. Numba bakes the module globals a kernel reads into the compiled code while the simulator reads
them live, so a kernel whose globals were rebound is compiled again at its next launch (GlobalsChanged says which).
"""
from __future__ import annotations

import dataclasses
import inspect
import linecache
import math
import time
import warnings

import numpy as np

from . import report
from .analysis.arch import DEFAULT_ARCH, normalize_arch
from .compile import disasm, numba_backend as nb
from .compile.signature import KernelSignature
from .errors import ArgumentError, KernellabError
from .kernel import Kernel, KernelCollection, Resources, max_threads_for, occupancy_text
from .run.launch import device as _device, worker as _worker
from .run.launch.launch import (RECENT_LAUNCHES, as_launch_error, describe_value, make_config, record_async, resolve_sync,
                                scalar_of)
from .run.sim import numba_sim, race as simrace
from .run.sim.numba_sim import SIMULATED_THREADS_PER_S, caller_stacklevel
from .run.sim.trace import simulate_traced

TRACE_MAX_THREADS = 65536   # a traced launch simulates every thread: 65,536 threads take some seconds


class GlobalsChanged(UserWarning):
    """A global a compiled Numba kernel reads was rebound, so the kernel was compiled again with its new value."""


def _caller_stacklevel() -> int:
    return caller_stacklevel()


class NumbaKernel(Kernel):
    """A Numba `@cuda.jit` kernel as a kernellab Kernel: inspect it and launch it with k[grid, block](...)."""

    backend = "numba"

    def __init__(self, kernel, *, signature=None, arch: str | None = None, simulate: bool | None = None,
                 name: str | None = None, module: "NumbaModule | None" = None, source: str | None = None,
                 first_line: int = 1, line_label: str = "line"):
        self.factory = None                   # a kernel factory: def k(cuda): ...; return kernel_function
        if nb.is_kernel_factory(kernel):
            self.factory = kernel
            self.dispatcher, fn = nb.kernel_from_factory(kernel)   # with the real numba.cuda, for the compiler
            name = name or kernel.__name__
        else:
            fn = nb.kernel_function(kernel)
            self.dispatcher = kernel if nb.is_kernel_dispatcher(kernel) else nb.as_kernel(fn)
        self.py_func = fn
        self.module = module
        self._name = name or fn.__name__
        self.notes: list[str] = []
        self.on_signature: list = []   # called with the kernel once its signature (and resources) are known
        if arch is None:
            arch, note = _default_arch()
            if note:
                self.notes.append(note)
        self._arch = normalize_arch(arch)
        self._sim_reason = "simulate=True"
        if simulate is None:
            simulate = not _device.has_gpu()
            self._sim_reason = "no GPU here"
        self.simulate = bool(simulate)
        self._source, self._first_line, self._line_label = source, first_line, line_label
        self._compiled: nb.NumbaCompileOutput | None = None
        self._globals: dict | None = None     # the globals' values it was compiled with (nb.global_values)
        self._argtypes: tuple | None = None   # set with or without a real compile (NUMBA_ENABLE_CUDASIM)
        self._sass: str | None = None
        self._source_view = None
        self._launchers: dict = {}            # k[grid, block] objects, per configuration
        self.trace_next = False               # the next launch runs in the simulator and returns its SharedTrace
        self.last_trace = None
        self.can_compile, why = nb.numba_available()
        if not self.can_compile:
            self.simulate = True
            self._sim_reason = why
            self.notes.append(f"{self._name}: simulator only, no resources: {why}")
        if signature is None:
            sigs = nb.dispatcher_signatures(kernel)
            if len(sigs) > 1:
                self.notes.append(f"{self._name} names {len(sigs)} signatures; kernellab uses the first "
                                  f"({sigs[0]}); {self._name}.with_signature(...) gives the others")
            signature = sigs[0] if sigs else None
        if signature is not None:
            self._set_types(nb.numba_types(signature))

    # -- identity -------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def arch(self) -> str:
        return self._arch

    @property
    def compiled(self) -> "nb.NumbaCompileOutput | None":
        """The real compile (PTX, cubin, ptxas report), or None while the signature is pending."""
        return self._compiled

    @property
    def pending(self) -> bool:
        """True until a signature is known (given, or taken from the first launch)."""
        return self._argtypes is None

    @property
    def symbol(self) -> str:
        return self._compiled.symbol if self._compiled else self._name

    @property
    def numba_signature(self) -> str | None:
        """The Numba argument types, e.g. 'float32[::1], float32[::1], int32'; None while pending."""
        return None if self._argtypes is None else nb.signature_text(self._argtypes)

    @property
    def params(self):
        if self._argtypes is not None:
            return nb.params_for(self.py_func, self._argtypes)
        return tuple(nb.NumbaParam(name=n, ctype="", base="", pointer=False, const=False, dtype=None)
                     for n in nb.param_names(self.py_func))

    @property
    def signature(self) -> KernelSignature:
        return KernelSignature(symbol=self.symbol, name=self._name, display=self._name, params=self.params,
                               line=self.py_func.__code__.co_firstlineno)

    @property
    def extensions(self):
        return list((getattr(self.dispatcher, "targetoptions", None) or {}).get("extensions") or ())

    def __repr__(self) -> str:
        if self._compiled is None:
            state = "signature pending" if self.pending else "simulator only"
            return f"<kernellab.NumbaKernel {self._name}({', '.join(p.name for p in self.params)}) [{state}]>"
        return (f"<kernellab.NumbaKernel {self.signature} [{self.arch}]: {self._compiled.registers} regs"
                f"{', simulated' if self.simulate else ''}>")

    # -- compiling ------------------------------------------------------------------------------------------
    def _set_types(self, argtypes: tuple) -> None:
        names = nb.param_names(self.py_func)
        if len(argtypes) != len(names):
            raise KernellabError(f"{self._name} takes {len(names)} arguments ({', '.join(names)}) but the signature "
                                 f"has {len(argtypes)}: {nb.signature_text(argtypes)}")
        if self.can_compile:
            self._globals = nb.global_values(self.py_func, self.factory)
            self._compiled = nb.compile_kernel(self.dispatcher, argtypes, self._arch, source=self._source,
                                               first_line=self._first_line)
            self._sass = self._source_view = None
            self.notes.extend(n for n in self._compiled.notes if n not in self.notes)
        first = self._argtypes is None
        self._argtypes = tuple(argtypes)
        if first:
            for callback in tuple(self.on_signature):
                try:
                    callback(self)
                except Exception:      # a display's refresh must never fail a launch
                    pass

    def _refresh_globals(self) -> None:
        """Recompile if a module global (or closure variable) the kernel reads was rebound since it was compiled.

        Numba bakes such values into the compiled kernel while the simulator reads them live; recompiling keeps the
        GPU, the resources and the simulator on the same values. A warning (GlobalsChanged) names what changed.
        """
        if self._compiled is None or self._globals is None:
            return
        changed = nb.changed_globals(self._globals, nb.global_values(self.py_func, self.factory))
        if not changed:
            return
        warnings.warn(f"kernellab: {self._name} was compiled with other values of {', '.join(changed)}; recompiling "
                      f"it, so that the GPU, its resources and the simulator all use the new value"
                      f"{'s' if len(changed) > 1 else ''}", GlobalsChanged, stacklevel=_caller_stacklevel())
        if self.factory is not None:
            self.dispatcher, self.py_func = nb.kernel_from_factory(self.factory)
        else:
            self.dispatcher = nb.fresh_dispatcher(self.dispatcher)
        self._set_types(self._argtypes)

    def with_signature(self, signature) -> "NumbaKernel":
        """The same kernel compiled for another signature (a new NumbaKernel)."""
        k = NumbaKernel(self.factory or self.dispatcher, signature=signature, arch=self._arch, simulate=self.simulate,
                        name=self._name, module=self.module, source=self._source, first_line=self._first_line,
                        line_label=self._line_label)
        k._sim_reason = self._sim_reason
        return k

    def _require_compiled(self, what: str) -> "nb.NumbaCompileOutput":
        if self._compiled is not None:
            return self._compiled
        if self._argtypes is not None:
            raise KernellabError(f"{self._name} has no {what}: {self._sim_reason}")
        raise KernellabError(
            f"{self._name} has no signature yet, so it has not been compiled and has no {what}. Launch it once (its "
            f"argument types become the signature), or give one: %%numba --signature '{self._name}: float32[::1], "
            f"int32' or {self._name} = {self._name}.with_signature('float32[::1], int32')")

    # -- inspection -----------------------------------------------------------------------------------------
    @property
    def resources(self) -> Resources:
        """Registers, shared and local memory and spills, as ptxas reports them for this kernel's arch."""
        c = self._require_compiled("resources")
        r = c.report
        bounds = (int(c.launch_bounds[0]), 1, 1) if c.launch_bounds else None
        return Resources(registers=r.registers, shared_bytes=r.shared_bytes, local_bytes=r.stack_bytes,
                         spill_store_bytes=r.spill_store_bytes, spill_load_bytes=r.spill_load_bytes,
                         max_threads_per_block=max_threads_for(r.registers, bounds, c.arch), arch=c.arch,
                         constant_bytes=r.constant_bytes, barriers=r.barriers,
                         launch_bounds_threads=bounds[0] if bounds else None)

    @property
    def ptx(self) -> str:
        """The PTX numba-cuda wrote for this kernel and signature."""
        return self._require_compiled("PTX").ptx

    @property
    def cubin(self) -> bytes:
        return self._require_compiled("cubin").cubin

    @property
    def sass(self) -> str:
        """SASS of the cubin ptxas made (cuobjdump from the CUDA wheels; no GPU needed)."""
        if self._sass is None:
            c = self._require_compiled("SASS")
            self._sass = disasm.sass(c.cubin, c.symbol)
        return self._sass

    def _view_inputs(self) -> tuple[str, int, str, bytes, str]:
        """(source, its first line's number, filename, cubin, PTX) for source_view: the cell (or the function's
        file) and the line numbers Numba's line information uses."""
        c = self._require_compiled("SASS")
        filename = self.py_func.__code__.co_filename
        if self._source is not None:
            return self._source, self._first_line, filename, c.cubin, c.ptx
        lines, start = inspect.getsourcelines(self.py_func)
        return "".join(lines), start, filename, c.cubin, c.ptx

    # -- launching ------------------------------------------------------------------------------------------
    def launch(self, grid, block, *args, shared_bytes: int = 0, stream=None, sync: bool | None = None,
               isolate: bool | None = None, timeout_s: float | None = None):
        """Check the arguments, then launch on the GPU, or in the simulator when `simulate` is set.

        Returns None, the SharedTrace when `trace_next` was set (that launch runs in the simulator), or the
        IsolatedRun of an isolated launch (isolate=True, or the notebook-wide setting when isolate is None).
        """
        self._refresh_globals()
        if self.trace_next:
            self.trace_next = False
            return self.trace_banks(grid, block, *args, shared_bytes=shared_bytes)
        if self.simulate:
            self._simulate(grid, block, args, shared_bytes)
            return None
        if isolate is None:
            own = getattr(self, "isolate", None)
            isolate = own if own is not None else _worker.settings.isolate
        if isolate:
            return self.run_isolated(grid, block, *args, shared_bytes=shared_bytes, timeout_s=timeout_s)
        self._launch_gpu(grid, block, args, shared_bytes, stream, sync)
        return None

    # -- the same launch in another process: a worker, compute-sanitizer, Nsight Compute ---------------------
    def job_fields(self) -> dict:
        """How a fresh process loads this kernel (KernelJob): the cubin ptxas made, the cell's source and line
        numbers (the cubin's line table refers to them), and Numba's kernel ABI for the arguments."""
        c = self._require_compiled("GPU image")
        if "-c" in c.options:
            raise KernellabError(f"{self._name} links extra files (link=...), so its cubin is relocatable and cannot "
                                 f"be loaded on its own in another process: launch it in this process, or test the "
                                 f"bad access in the simulator ({self._name}.simulate = True)")
        if self._source is not None:
            source, first_line = self._source, self._first_line
        else:                                   # a kernel from a .py file: its line table numbers the file's lines
            source, first_line = "".join(linecache.getlines(c.filename)), 1
        return {"source": source, "options": c.options, "first_line": first_line, "filename": c.filename,
                "image": c.cubin, "image_format": "cubin", "abi": "numba"}

    def check_launch_args(self, args, device) -> None:
        """The argument checks of a GPU launch (for launches in another process, whose arrays travel C-contiguous)."""
        _check_args(self.params, tuple(args), self.numba_signature, host_ok=False, device=device)
        for pos, (p, x) in enumerate(zip(self.params, args)):
            info = _array_info(x) if p.pointer else None
            if info is None:
                continue
            dtype, shape, strides, _, _ = info
            if p.layout == "F" and len(shape) > 1:
                raise ArgumentError(f"argument {pos} ('{p.name}', {p.ctype}) is Fortran-ordered; launches in another "
                                    f"process pass C-contiguous arrays: use a C-ordered signature, or launch in "
                                    f"this process")
            itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
            if not nb.contiguous(shape, strides, itemsize, "C"):
                raise ArgumentError(f"argument {pos} ('{p.name}', {p.ctype}) has strides {strides} bytes; launches in "
                                    f"another process take C-contiguous arrays: pass x.contiguous() (torch) or "
                                    f"cupy.ascontiguousarray(x)")
            if type(x).__module__.split(".")[0] not in ("torch", "cupy"):
                raise ArgumentError(f"argument {pos} ('{p.name}', {p.ctype}) is a {type(x).__name__}; launches in "
                                    f"another process take CUDA torch tensors and CuPy arrays (wrap a Numba device "
                                    f"array with cupy.asarray(x))")

    def check_args(self, *args) -> None:
        """Check `args` against the Numba signature as a launch would (count, array or scalar, dtype, dimensions,
        layout, scalar ranges), with host arrays and CPU tensors standing in for GPU ones; before a signature is
        known, only the count. Needs no GPU."""
        names = nb.param_names(self.py_func)
        if len(args) != len(names):
            raise ArgumentError(f"{self._name}({', '.join(names)}) takes {len(names)} argument"
                                f"{'s' if len(names) != 1 else ''}, got {len(args)}")
        if self._argtypes is not None:
            _check_args(self.params, args, self.numba_signature, host_ok=True)

    def _ready_for(self, args) -> None:
        """Compile for these arguments' types if no signature is known yet (as the first launch does)."""
        if self.simulate:
            raise KernellabError(f"{self._name} runs in the simulator ({self._sim_reason}); isolated, sanitized and "
                                 f"profiled launches run on a GPU: set {self._name}.simulate = False there")
        self._types_for(args)

    def run_isolated(self, grid, block, *args, shared_bytes: int = 0, timeout_s: float | None = None, **kw):
        """Launch in a warm worker process, so a fault cannot poison this process; outputs are copied back."""
        self._refresh_globals()
        self._ready_for(args)
        return super().run_isolated(grid, block, *args, shared_bytes=shared_bytes, timeout_s=timeout_s, **kw)

    def sanitize(self, grid, block, *args, shared_bytes: int = 0, tool: str = "memcheck", sim: bool | None = None,
                 **kw):
        """Run this launch under compute-sanitizer (memcheck, racecheck, synccheck, initcheck or all) in a new
        process; findings name the cell line through the cubin's line table.

        In the simulator (`sim=True`, or by default where this kernel simulates, e.g. with no GPU here), racecheck,
        synccheck and initcheck (reads of shared memory no thread wrote) need no GPU: the launch runs in Numba's
        CUDA simulator with every shared-memory access and barrier watched (kernellab.run.sim.race), and the findings
        come back as the same SanitizerReport, marked `simulated`. The arguments are not modified. `max_threads` bounds the simulated launch's size.
        """
        self._refresh_globals()
        max_threads = kw.pop("max_threads", TRACE_MAX_THREADS)
        if sim is None:
            sim = self.simulate
        if sim:
            return self._sanitize_simulated(grid, block, args, shared_bytes, tool, max_threads)
        self._ready_for(args)
        return super().sanitize(grid, block, *args, shared_bytes=shared_bytes, tool=tool, **kw)

    def _sanitize_simulated(self, grid, block, args, shared_bytes, tool, max_threads):
        simrace.sim_tools(tool)                      # an unknown or GPU-only tool fails before anything runs
        self._types_for(args)
        values = _check_args(self.params, tuple(args), self.numba_signature, host_ok=True)
        cfg = self._config(grid, block, shared_bytes, None)
        threads = math.prod(cfg.grid) * math.prod(cfg.block)
        if threads > max_threads:
            seconds = numba_sim.estimated_seconds(cfg.grid, cfg.block, self)
            raise ArgumentError(f"checking {self._name} in the simulator runs every thread: this launch has "
                                f"{threads:,} threads (about {seconds:.0f} s); check a launch of at most "
                                f"{max_threads:,} threads (races show in one or a few blocks), or pass max_threads=")
        return simrace.sanitize_simulated(self, cfg.grid, cfg.block, values, tool=tool, shared_bytes=cfg.shared_bytes,
                                          line_label=self._line_label, name=self._name)

    def profile(self, grid, block, *args, shared_bytes: int = 0, metrics=None, full: bool = False, **kw):
        """Run this launch under Nsight Compute (a small metric set, or full=True for `--set full`) in a new process."""
        self._refresh_globals()
        self._ready_for(args)
        return super().profile(grid, block, *args, shared_bytes=shared_bytes, metrics=metrics, full=full, **kw)

    def profile_banks(self, grid, block, *args, shared_bytes: int = 0, strict: bool = False):
        """Shared-memory wavefronts and conflicts per source line, measured by Nsight Compute (see Kernel)."""
        self._refresh_globals()
        self._ready_for(args)
        return super().profile_banks(grid, block, *args, shared_bytes=shared_bytes, strict=strict)

    def _types_for(self, args) -> tuple:
        """The signature's types, taken from `args` on the first launch (compiling then)."""
        names = nb.param_names(self.py_func)
        if len(args) != len(names):
            raise ArgumentError(f"{self._name}({', '.join(names)}) takes {len(names)} argument"
                                f"{'s' if len(names) != 1 else ''}, got {len(args)}")
        if self._argtypes is None:
            try:
                types = nb.infer_types(args, names)
            except ArgumentError:
                raise
            except KernellabError as exc:
                raise ArgumentError(str(exc)) from None
            self._set_types(types)
        return self._argtypes

    def _config(self, grid, block, shared_bytes, device):
        res = self.resources if self._compiled is not None else None
        return make_config(grid, block, shared_bytes,
                           max_threads_per_block=res.max_threads_per_block if res else 1024,
                           static_shared_bytes=res.shared_bytes if res else 0, device=device,
                           registers=(res.registers or 0) if res else 0, name=self._name)

    def _simulate(self, grid, block, args, shared_bytes):
        self._types_for(args)
        values = _check_args(self.params, args, self.numba_signature, host_ok=True)
        cfg = self._config(grid, block, shared_bytes, None)
        numba_sim.notice(self._name, self._sim_reason)
        seconds = numba_sim.estimated_seconds(cfg.grid, cfg.block, self)
        if seconds > 30:
            threads = math.prod(cfg.grid) * math.prod(cfg.block)
            rate = numba_sim.threads_per_second(self)
            warnings.warn(f"kernellab: this simulated launch of {self._name} runs {threads:,} threads, about "
                          f"{seconds:.0f} s at {rate:,.0f} threads per second; try a smaller problem",
                          numba_sim.SimulatorNotice, stacklevel=numba_sim.caller_stacklevel())
        numba_sim.simulate(self, cfg.grid, cfg.block, values, shared_bytes=cfg.shared_bytes,
                           line_label=self._line_label)

    def trace_banks(self, grid, block, *args, shared_bytes: int = 0, max_threads: int = TRACE_MAX_THREADS):
        """Run this launch in the simulator, recording shared memory, and return its bank-conflict SharedTrace.

        Results are written back into the arguments as for any simulated launch. Lines are the kernel's source lines
        (cell lines for `%%numba` kernels). Trace a small launch: every thread is simulated.
        """
        self._refresh_globals()
        self._types_for(args)
        values = _check_args(self.params, args, self.numba_signature, host_ok=True)
        cfg = self._config(grid, block, shared_bytes, None)
        threads = math.prod(cfg.grid) * math.prod(cfg.block)
        if threads > max_threads:
            raise ArgumentError(f"tracing {self._name} simulates every thread: this launch has {threads:,} threads "
                                f"(about {numba_sim.estimated_seconds(cfg.grid, cfg.block, self):.0f} s); trace a launch of at "
                                f"most {max_threads:,} threads (one or a few blocks show the pattern), or pass "
                                f"max_threads=")
        trace = simulate_traced(self, cfg.grid, cfg.block, values, shared_bytes=cfg.shared_bytes,
                                line_label=self._line_label)
        if trace.kernel_name != self._name:       # a factory's inner function, or a cell's other binding
            trace = dataclasses.replace(trace, kernel_name=self._name)
        self.last_trace = trace
        return trace

    def _launch_gpu(self, grid, block, args, shared_bytes, stream, sync):
        _device.require_gpu(f"launching {self._name} on a GPU (set {self._name}.simulate = True to use the simulator)")

        argtypes = self._types_for(args)
        dev = _device.device_info()
        values = _check_args(self.params, args, self.numba_signature, host_ok=False, device=dev)
        cfg = self._config(grid, block, shared_bytes, dev)
        # What numba-cuda's dispatcher does for k[grid, block, stream, shared](...), minus its choice of overload:
        # compile (once) for exactly this signature, for this GPU, and launch that. Arrays pass by their
        # __cuda_array_interface__ (no copy); scalars as Python numbers of the checked value.
        kernel = self.dispatcher.compile(argtypes)
        values = [v.item() if isinstance(v, np.generic) else v for v in values]
        s = _numba_stream(stream, args)
        try:
            kernel.launch(values, cfg.grid, cfg.block, _core_stream(s), cfg.shared_bytes)
        except Exception as exc:
            raise as_launch_error(exc, self._name, cfg, during="launch") from None
        if resolve_sync(self.launch_blocking if sync is None else sync):
            try:
                s.synchronize()
            except Exception as exc:
                raise as_launch_error(exc, self._name, cfg, during="run") from None
            RECENT_LAUNCHES.clear()
        else:
            record_async(self._name, cfg)

    # -- reports --------------------------------------------------------------------------------------------
    def to_json(self, block_size: int | None = None) -> dict:
        base = {"name": self._name, "display": self._name, "symbol": self.symbol, "backend": "numba",
                "signature": str(self.signature), "numba_signature": self.numba_signature,
                "simulate": self.simulate, "pending": self.pending, "arch": self._arch}
        if self._compiled is None:
            return base | {"registers": None, "shared_bytes": None, "local_bytes": None, "spill_store_bytes": None,
                           "spill_load_bytes": None, "max_threads_per_block": None}
        return super().to_json(block_size) | {k: v for k, v in base.items() if k not in ("signature",)}


# ---------------------------------------------------------------------------------------------------------------------
# Argument checks against the Numba signature


def _array_info(x):
    """(dtype name, shape, byte strides, on the GPU, device index) of an array-like argument, or None."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "dim"):
        size = x.element_size()
        return (str(x.dtype).replace("torch.", ""), tuple(x.shape), tuple(s * size for s in x.stride()), x.is_cuda,
                x.device.index if x.is_cuda else None)
    if mod == "cupy" and hasattr(x, "device"):
        return str(x.dtype), tuple(x.shape), tuple(x.strides), True, x.device.id
    if isinstance(x, np.ndarray):
        return x.dtype.name, x.shape, x.strides, False, None
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or tuple(
            int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
        return dtype.name, shape, tuple(strides), True, None
    return None


def _check_args(params, args, signature_text: str | None, *, host_ok: bool, device=None) -> list:
    """Check `args` against the typed parameters; return them with scalars as exact-width NumPy scalars."""
    sig = f" (signature {signature_text})" if signature_text else ""
    out = []
    for pos, (p, x) in enumerate(zip(params, args)):
        where = f"argument {pos} ('{p.name}', {p.ctype})"
        if not p.pointer:
            if p.dtype is None:
                out.append(x)           # a type kernellab does not check (tuples, records): numba checks it
            elif p.dtype.startswith("complex"):
                if not isinstance(x, (int, float, complex, np.number)):
                    raise ArgumentError(f"{where} expects a number, got {describe_value(x)}")
                out.append(np.dtype(p.dtype).type(x))
            else:
                out.append(scalar_of(p, x, pos))
            continue
        info = _array_info(x)
        if info is None:
            raise ArgumentError(f"{where} is an array parameter but got {describe_value(x)}; pass a "
                                f"{'NumPy array or torch tensor' if host_ok else 'CUDA torch tensor or CuPy array'}")
        dtype, shape, strides, on_gpu, index = info
        if p.dtype is not None and dtype != p.dtype:
            raise ArgumentError(f"{where} expects {p.dtype} elements but got a {describe_value(x)}{sig}; convert it "
                                f"(torch: .to(torch.{p.dtype}); NumPy/CuPy: .astype('{p.dtype}')) or change the "
                                f"signature")
        if len(shape) != p.ndim:
            raise ArgumentError(f"{where} expects a {p.ndim}-D array but got shape {shape}{sig}; reshape it or "
                                f"change the signature")
        itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
        if p.layout in ("C", "F") and not nb.contiguous(shape, strides, itemsize, p.layout):
            want = "C-contiguous" if p.layout == "C" else "Fortran-contiguous"
            raise ArgumentError(f"{where} needs a {want} array, but this one has strides {strides} bytes{sig}; pass "
                                f"x.contiguous() (torch) or np.ascontiguousarray(x), or write the type with [:] "
                                f"(any strides)")
        if not host_ok:
            if not on_gpu:
                raise ArgumentError(f"{where} got a {describe_value(x)}; the kernel runs on the GPU: pass a CUDA torch "
                                    f"tensor (x.cuda()) or a CuPy array. Host arrays work in the simulator "
                                    f"(%%numba --sim, or kernel.simulate = True)")
            if device is not None and index is not None and index != device.index:
                raise ArgumentError(f"{where} is on GPU {index} but the kernel launches on GPU {device.index}; move "
                                    f"it with .to('cuda:{device.index}')")
        out.append(x)
    return out


def _numba_stream(stream, args):
    """A numba Stream for `stream` (None: torch's current stream when torch tensors are passed, else CuPy's)."""
    from numba import cuda

    ptr = None
    if stream is None:
        for x in args:
            mod = type(x).__module__.split(".")[0]
            if mod == "torch" and getattr(x, "is_cuda", False):
                import torch

                ptr = torch.cuda.current_stream(x.device).cuda_stream
                break
            if mod == "cupy":
                import cupy

                ptr = cupy.cuda.get_current_stream().ptr
                break
        ptr = ptr or 0
    elif isinstance(stream, int):
        ptr = stream
    elif type(stream).__module__.split(".")[0] == "torch":
        ptr = stream.cuda_stream
    elif type(stream).__module__.split(".")[0] == "cupy":
        ptr = stream.ptr
    else:
        return stream                 # a numba Stream already
    return cuda.default_stream() if ptr == 0 else cuda.external_stream(ptr)


def _core_stream(stream):
    """The stream object numba-cuda's kernel launch takes (cuda.core's, in numba-cuda 0.30)."""
    from numba.cuda.cudadrv import driver

    convert = getattr(driver, "_to_core_stream", None)
    return convert(stream) if convert is not None else stream


# ---------------------------------------------------------------------------------------------------------------------
# A cell's kernels


class NumbaModule(KernelCollection):
    """The kernels of one `%%numba` cell or source: `module['name']` or `module.name` gives a NumbaKernel."""

    def __init__(self, kernels, *, name: str | None = None, arch: str, simulate: bool, notes=(), wall_ms: float = 0.0,
                 filename: str = "", source: str = "", first_line: int = 1):
        self.kernels: tuple[NumbaKernel, ...] = tuple(kernels)
        self.name = name
        self.arch = arch
        self.simulate = simulate
        self.notes = tuple(notes)
        self.wall_ms = wall_ms
        self.filename = filename
        self.source = source
        self.first_line = first_line
        for k in self.kernels:
            k.module = self

    @property
    def compile_ms(self) -> float:
        """numba typing + NVVM + ptxas, summed over the kernels compiled so far."""
        return sum(k.compiled.compile_ms for k in self.kernels if k.compiled is not None)

    def __getitem__(self, name: str) -> NumbaKernel:
        for k in self.kernels:
            if k.name == name:
                return k
        known = ", ".join(k.name for k in self.kernels) or "none"
        raise KeyError(f"no kernel {name!r} in this cell; its kernels: {known}")

    # -- reports --------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """`{"kind": "compile", "version": 1, "ok": true, "backend": "numba", "title", "arch", "simulate",
        "compile_ms", "wall_ms", "notes": [str], "diagnostics": [], "kernels": [NumbaKernel.to_json()]}`; a pending
        kernel has `"pending": true` and null resource fields."""
        n = len(self.kernels)
        return {"kind": "compile", "version": 1, "ok": True, "backend": "numba",
                "title": f"{self.name or 'numba'}: {n} kernel{'s' if n != 1 else ''}", "arch": self.arch,
                "simulate": self.simulate, "compile_ms": round(self.compile_ms, 2), "wall_ms": round(self.wall_ms, 2),
                "notes": list(self.notes) + [n for k in self.kernels for n in k.notes if n not in self.notes]
                + self._pending_notes(),
                "diagnostics": [], "kernels": [k.to_json() for k in self.kernels]}

    def _pending_notes(self) -> list[str]:
        """Which kernels wait for their first launch to be compiled (none, once each has run)."""
        pending = [k.name for k in self.kernels if k.pending]
        if not pending:
            return []
        return [f"{', '.join(pending)}: no signature yet; compiled (and resources shown) at the first launch, or "
                f"give --signature 'NAME: float32[::1], int32'"]

    def _rows(self, html: bool):
        rows = []
        for k in self.to_json()["kernels"]:
            sig = k["numba_signature"] or "(from its first launch)"
            if k["registers"] is None:
                rows.append([k["display"], sig, "-", "-", "-", "-", "-"] + ([] if not html else ["-"]))
                continue
            occ = k.get("occupancy")
            spill = f"{k['spill_store_bytes']}/{k['spill_load_bytes']}"
            occ_text = occupancy_text(occ) if occ else "-"
            if html:
                spill = report.Raw(f"<span style='color:#c00;font-weight:bold'>{spill}</span>", spill) \
                    if k["spill_store_bytes"] or k["spill_load_bytes"] else spill
                rows.append([report.Raw(f"<b>{report.esc(k['display'])}</b>", k["display"]), sig, k["registers"],
                             k["shared_bytes"], k["local_bytes"], spill, occ_text,
                             ", ".join(map(str, k.get("best_block_sizes", []))) or "-"])
            else:
                rows.append([k["display"], sig, k["registers"], k["shared_bytes"], k["local_bytes"], spill, occ_text])
        return rows

    def _mode(self) -> str:
        return "runs in the simulator" if self.simulate else "runs on the GPU"

    def __str__(self) -> str:
        j = self.to_json()
        head = f"{j['title']} | {self.arch} | compiled in {self.compile_ms:.1f} ms | {self._mode()}"
        parts = [head, report.text_table(["kernel", "signature", "regs", "smem B", "local B", "spill st/ld B",
                                          "occupancy"], self._rows(False))]
        parts += [f"note: {n}" for n in j["notes"]]
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        j = self.to_json()
        cap = f"{j['title']} · {self.arch} · {self.compile_ms:.1f} ms compile · {self._mode()}"
        out = [report.html_table(["kernel", "signature", "regs", "smem B", "local B", "spill st/ld B", "occupancy",
                                  "best blocks"], self._rows(True), caption=cap)]
        for n in j["notes"]:
            out.append(f"<div style='color:#666'>note: {report.esc(n)}</div>")
        return "".join(out)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)


def _default_arch() -> tuple[str, str | None]:
    """The current GPU's arch, or sm_90 with a note where there is no GPU."""
    if _device.has_gpu():
        return _device.device_info().arch, None
    return DEFAULT_ARCH, f"no GPU here: resources are for {DEFAULT_ARCH} (--arch or arch= for another)"


def numba_kernel(kernel, signature=None, *, arch: str | None = None, simulate: bool | None = None) -> NumbaKernel:
    """A `@cuda.jit` kernel, a plain function or a kernel factory (`def k(cuda): ...; return kernel`) as a kernellab
    Kernel; `signature` like 'float32[::1], int32'."""
    return NumbaKernel(kernel, signature=signature, arch=arch, simulate=simulate)


def numba_module(source: str, *, signatures=None, arch: str | None = None, simulate: bool | None = None,
                 name: str | None = None, namespace: dict | None = None, filename: str | None = None,
                 first_line: int = 1, kernels=(), line_label: str = "line") -> NumbaModule:
    """Run Numba source (in `namespace`) and wrap each `@cuda.jit` kernel it defines as a NumbaKernel.

    `signatures` maps kernel names to Numba signatures (a key None: the only kernel); `kernels` names plain functions
    to treat as kernels. Kernels are bound in `namespace` as NumbaKernels while the source runs, so a launch in the
    same source is checked too. A compile error raises CompileError at the source line (numbered from `first_line`).
    """
    t0 = time.perf_counter()
    ns = {"__name__": "__kernellab_numba__"} if namespace is None else namespace
    filename = filename or f"<numba-{abs(hash(source)) % 10**10}>"
    signatures = dict(signatures or {})
    notes = []
    if arch is None:
        arch, note = _default_arch()
        if note:
            notes.append(note)
    arch = normalize_arch(arch)
    if simulate is None:
        sim_reason = "no GPU here"
        simulate = not _device.has_gpu()
    else:
        sim_reason = "--sim" if simulate else ""
    made: list[NumbaKernel] = []

    def wrap(dispatcher):
        fn = nb.kernel_function(dispatcher)
        sig = signatures.get(fn.__name__)
        if sig is None and None in signatures and not made:
            sig = signatures[None]
        k = NumbaKernel(dispatcher, signature=sig, arch=arch, simulate=simulate, source=source,
                        first_line=first_line, line_label=line_label)
        k._sim_reason = sim_reason or k._sim_reason
        made.append(k)
        return k

    before = dict(ns)
    nb.exec_source(source, ns, filename, first_line, on_kernel=wrap)
    # Kernels the decorator did not make (NUMBA_ENABLE_CUDASIM, or marked plain functions): wrap them now; and
    # kernel factories (`def k(cuda): ...; return kernel`), called with the right `cuda` for each use.
    for var, obj in nb.find_kernels(ns, filename, before, marked=tuple(kernels)):
        if not isinstance(obj, NumbaKernel):
            ns[var] = wrap(obj)
    for var, obj in nb.find_factories(ns, filename, before):
        try:
            ns[var] = wrap(obj)
        except Exception as exc:             # a function of `cuda` that is not a kernel factory: leave it be
            if var in kernels:
                raise
            notes.append(f"{var} takes `cuda` but {var}(cuda) did not make a kernel, so it stays a function "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); mark it with "
                         f"--kernel {var} to see the error")
    bound = {id(v): var for var, v in ns.items() if isinstance(v, NumbaKernel)}
    ordered = sorted(made, key=lambda k: k.py_func.__code__.co_firstlineno)
    unknown = {s for s in signatures if s is not None} - {k.py_func.__name__ for k in ordered}
    if unknown:
        raise KernellabError(f"--signature names {', '.join(sorted(unknown))}, which the cell does not define as a "
                             f"kernel; its kernels: {', '.join(k.name for k in ordered) or 'none'}")
    if None in signatures and len(ordered) != 1:
        raise KernellabError(f"a signature without a kernel name fits a cell with one kernel; this one has "
                             f"{len(ordered)}: write --signature 'NAME: TYPES'")
    for k in ordered:   # the name the cell bound it to, where it differs from the function's
        k._name = bound.get(id(k), k._name)
    if simulate:
        notes.append(f"launches run in Numba's CUDA simulator ({sim_reason}): some {SIMULATED_THREADS_PER_S:,} "
                     f"threads per second, so keep sizes small; resources are what ptxas reports for {arch}")
    if not ordered:
        notes.append("no @cuda.jit kernel in this cell (device functions are compiled into the kernels that call "
                     "them; mark plain functions with --kernel NAME)")
    return NumbaModule(ordered, name=name, arch=arch, simulate=bool(simulate), notes=notes,
                       wall_ms=(time.perf_counter() - t0) * 1e3, filename=filename, source=source,
                       first_line=first_line)
