"""Numba kernels in the CUDA simulator, next to the real numba.cuda: host copies in and out, and errors that name the
thread, the block and the source line.

How the simulator and the real `numba.cuda` share one process (checked with numba 0.68 + numba-cuda 0.30.4):
- `numba.cuda.simulator` is an ordinary subpackage. Importing it does not need `NUMBA_ENABLE_CUDASIM`; that variable
  only decides what `numba.cuda` *is* (with it set, `numba.cuda` is the simulator and `compile_ptx` is None). So
  kernellab never sets it: `numba.cuda` stays real (compiling to PTX needs no GPU) and the simulator is used directly.
- `FakeCUDAKernel(py_func)` runs the very Python function behind a real `@cuda.jit` kernel. During a launch the
  simulator swaps every global of the function's module that *is* the real `numba.cuda` (under any name) for a fake
  module holding threadIdx, blockIdx, shared arrays and atomics, and puts it back afterwards. A notebook cell's globals
  are the user namespace, so `cuda` there is briefly the fake during a simulated launch.
- Real device functions (`@cuda.jit(device=True)`) named in those globals are swapped for simulated ones for the launch
  (`kernellab.run.sim.trace`, which also records shared-memory traffic for the bank model).
- What does not carry over: names imported from numba.cuda one by one (`from numba.cuda import grid`) stay the real,
  GPU-only stubs; write `cuda.grid(1)`. Blocks run one at a time, and a block's threads take turns (kernellab.run.
  simsched: each runs until its next barrier, not in warp lockstep); some 10,000 to 40,000 threads run per second,
  barriers included. Only one simulated launch runs at a time (the simulator keeps one global kernel context), so
  launches here take simtrace's lock.
- With `NUMBA_ENABLE_CUDASIM=1` the same code works (kernels are then the simulator's own), but nothing can be
  compiled for a real GPU in that process.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

from ...errors import KernellabError
from . import sched as simsched

# Threads per second before a kernel's own rate is known: benchmarks/simulator_speed.py on the 2-core CI machine
# measured 8,000 to 38,000 with kernellab's scheduler (a vector add fastest, an 18x18 tiled matmul slowest); numba-cuda's
# own scheduler ran 90 to 5,000. Each kernel's simulated launches measure its own rate (see estimated_seconds).
SIMULATED_THREADS_PER_S = 20000
_rates: dict = {}                 # kernel code object -> threads per second of its last long-enough simulated launch
_notice_shown = False             # the simulator notice is shown once per session
# Every simulated launch in this process holds it: the simulator keeps one global kernel context and swaps module
# globals (numba.cuda) while it runs.
launch_lock = threading.Lock()


class SimulatorNotice(UserWarning):
    """A kernel ran in Numba's CUDA simulator rather than on a GPU."""


class SimulatedKernelError(KernellabError):
    """A Python exception inside a simulated kernel: which thread, which block, which source line."""

    def __init__(self, message: str, *, kernel: str, exception: str, detail: str, thread, block, filename: str | None,
                 line: int | None, source: str, original: BaseException | None = None):
        self.kernel = kernel
        self.exception = exception            # e.g. "IndexError"
        self.detail = detail                  # the exception's own message, without the thread prefix
        self.thread = thread                  # threadIdx (x, y, z), or None where unknown
        self.block = block                    # blockIdx (x, y, z), or None
        self.filename = filename
        self.line = line
        self.source = source                  # the source line, stripped
        self.original = original
        super().__init__(message)

    def _render_traceback_(self):
        """IPython shows this instead of a traceback through the simulator's and kernellab's frames."""
        return [f"{type(self).__name__}: {self}"]


def simulator_lock():
    """The lock every simulated launch in this process holds. The simulator swaps module globals (numba.cuda) while
    it runs, so code that builds or compiles Numba kernels in another thread of this process takes it too."""
    return launch_lock


# ---------------------------------------------------------------------------------------------------------------------
# Arguments: device and tensor memory as host NumPy arrays, written back after the launch


def to_host(args) -> tuple[list, list]:
    """(host arguments, write-backs): NumPy arrays the simulator can use, and what copies results back.

    NumPy arrays and torch CPU tensors are used in place (the simulator copies in and back itself); torch CUDA tensors,
    CuPy arrays and other `__cuda_array_interface__` arrays are copied to the host and back after the launch.
    """
    host, back = [], []
    for x in args:
        mod = type(x).__module__.split(".")[0]
        if mod == "torch" and hasattr(x, "dim"):
            if x.is_cuda:
                h = x.detach().cpu().numpy()
                back.append(_torch_back(x, h))
            else:
                h = x.detach().numpy()
            host.append(h)
        elif mod == "cupy" and hasattr(x, "get"):
            h = x.get()
            back.append(_cupy_back(x, h))
            host.append(h)
        elif not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__") and hasattr(x, "copy_to_host"):
            h = x.copy_to_host()
            back.append(lambda x=x, h=h: x.copy_to_device(h))
            host.append(h)
        else:
            host.append(x)
    return host, back


def _torch_back(t, h):
    def write():
        import torch

        with torch.no_grad():
            t.copy_(torch.from_numpy(h))
    return write


def _cupy_back(x, h):
    def write():
        import cupy

        x[...] = cupy.asarray(h)
    return write


# ---------------------------------------------------------------------------------------------------------------------
# Launching


def simulate(kernel, grid, block, args, *, shared_bytes: int = 0, line_offset: int = 0, line_label: str = "line",
             launch=None):
    """Run `kernel[grid, block, 0, shared_bytes](*args)` in Numba's CUDA simulator.

    `kernel` is a real or simulated `@cuda.jit` kernel or its Python function (or a kernellab NumbaKernel, whose
    kernel factory, if it has one, is called with the simulator's `cuda`); `args` may hold NumPy arrays, torch
    tensors (CPU or CUDA), CuPy arrays and numbers; results are written back into them. A Python exception in a
    simulated thread raises SimulatedKernelError naming the thread, the block and the `line_label` line.
    `launch(py_func, grid3, block3, host_args, function_for)`, when given, runs the launch instead and its value is
    returned (trace.simulate_traced records shared memory this way); else None.
    """
    py_func = python_function(kernel)
    function_for = factory_call(kernel)
    grid3, block3 = as_dim3(grid), as_dim3(block)
    host, back = to_host(args)
    try:
        if launch is not None:
            result = launch(py_func, grid3, block3, host, function_for)
        else:
            with launch_lock, simulated_device_functions(py_func):
                t0 = time.perf_counter()
                simsched.launch(py_func, grid3, block3, host, dynamic_smem_bytes=shared_bytes,
                                extensions=getattr(kernel, "extensions", ()) or (), function_for=function_for)
                seconds = time.perf_counter() - t0
            if seconds >= 0.02:
                _rates[py_func.__code__] = int(np.prod(grid3)) * int(np.prod(block3)) / seconds
            result = None
    except (SimulatedKernelError, simsched.SimulatedDeadlockError):
        raise
    except Exception as exc:
        raise kernel_error(exc, py_func, grid3, block3, line_offset, line_label) from None
    for write in back:
        write()
    return result


def factory_call(kernel):
    """For a kernel made by a factory (`def k(cuda): ...; return kernel`): module -> the kernel function to run."""
    factory = getattr(kernel, "factory", None)
    if factory is None:
        return None

    def function_for(module):
        fn = factory(module)
        return getattr(fn, "py_func", fn)
    return function_for


def estimated_seconds(grid, block, kernel=None) -> float:
    """About how long the simulator takes for this launch: at `kernel`'s own measured rate where it ran before (in
    this session, for at least 20 ms), else at SIMULATED_THREADS_PER_S."""
    g, b = as_dim3(grid), as_dim3(block)
    return int(np.prod(g)) * int(np.prod(b)) / threads_per_second(kernel)


def threads_per_second(kernel=None) -> float:
    """The simulator's measured rate for `kernel` (threads per second), else the benchmark's typical rate."""
    if kernel is not None:
        try:
            return _rates.get(python_function(kernel).__code__, SIMULATED_THREADS_PER_S)
        except TypeError:
            pass
    return SIMULATED_THREADS_PER_S


def notice(kernel_name: str, reason: str) -> None:
    """Warn, once per session, that kernels run in the simulator (the first one to run names itself)."""
    global _notice_shown
    if _notice_shown:
        return
    _notice_shown = True
    warnings.warn(f"kernellab: {kernel_name} runs in Numba's CUDA simulator ({reason}), as simulated kernels do from "
                  f"now on: results are right or wrong as on a GPU, but some {SIMULATED_THREADS_PER_S:,} threads run "
                  f"per second, so keep sizes small, and times mean nothing. (Shown once.)", SimulatorNotice,
                  stacklevel=caller_stacklevel())


def caller_stacklevel() -> int:
    """The `stacklevel` for a warning raised here that points at the first caller outside kernellab."""
    package = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")) + os.sep  # kernellab/
    level, frame = 2, sys._getframe(2)  # 1: the function calling warn; 2: its caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level, frame = level + 1, frame.f_back
    return level


def as_dim3(value) -> tuple[int, int, int]:
    """(x, y, z) from an int or a 1- to 3-tuple (unchecked: the launch path checked it)."""
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class simulated_device_functions:
    """Context manager: real `@cuda.jit(device=True)` functions the kernel reaches are simulated ones meanwhile."""

    def __init__(self, py_func):
        self._py_func = py_func
        self._saved: list[tuple[dict, str, Any]] = []

    def __enter__(self):
        from numba.cuda.simulator import kernel as sim_kernel  # numba is optional: imported where a launch needs it

        seen: set[int] = set()
        todo = [self._py_func.__globals__]
        while todo:
            globs = todo.pop()
            if id(globs) in seen:
                continue
            seen.add(id(globs))
            for name, value in list(globs.items()):
                options = getattr(value, "targetoptions", None)
                if isinstance(options, dict) and options.get("device") and hasattr(value, "py_func"):
                    self._saved.append((globs, name, value))
                    globs[name] = sim_kernel.FakeCUDAKernel(value.py_func, device=True)
                    todo.append(value.py_func.__globals__)
        return self

    def __exit__(self, *exc):
        for globs, name, value in reversed(self._saved):
            globs[name] = value
        return False


def python_function(kernel):
    """The Python function behind a real or simulated Numba kernel (or the function itself)."""
    for attr in ("py_func", "fn"):
        func = getattr(kernel, attr, None)
        if callable(func) and hasattr(func, "__globals__"):
            return func
    if callable(kernel) and hasattr(kernel, "__globals__"):
        return kernel
    raise TypeError(
        f"trace_shared needs a @cuda.jit kernel or its Python function, got {type(kernel).__name__}; "
        "write the kernel with numba (`@cuda.jit def k(...)`) and pass `k`"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Errors

_PREFIX = re.compile(r"^tid=\[(?P<tid>[-\d, ]+)\] ctaid=\[(?P<cta>[-\d, ]+)\](?::\s?(?P<rest>.*))?$", re.S)
_HINTS = {
    "IndexError": ("an index outside the array: on a GPU this reads or writes memory that is not the array's (wrong "
                   "results, or an illegal-address fault that ends the CUDA context); guard it, e.g. `if i < n:`, or "
                   "launch no more threads than elements"),
    "ZeroDivisionError": "on a GPU an integer division by zero gives garbage and a float one inf or nan",
    "NameError": "names in a kernel must be defined when it runs (module globals are frozen at compile time on a GPU)",
}


def kernel_error(exc: BaseException, py_func, grid, block, line_offset: int, label: str) -> BaseException:
    """A SimulatedKernelError from an exception a simulated thread raised (others pass unchanged)."""
    text = str(exc)
    m = _PREFIX.match(text)
    if m is None:  # not from a simulated thread (bad arguments to the simulator, say): pass it on unchanged
        return exc
    thread = tuple(int(v) for v in m.group("tid").split(","))
    block_idx = tuple(int(v) for v in m.group("cta").split(","))
    detail = (m.group("rest") or "").strip()
    filename, line = _user_line(exc, py_func)
    shown = line + line_offset if (line is not None and filename == py_func.__code__.co_filename) else line
    source = linecache.getline(filename, line).strip() if filename and line else ""
    where = f"{label} {shown}" if shown else "an unknown line"
    if filename and filename != py_func.__code__.co_filename and shown:
        where = f"line {shown} of {filename}"
    kind = type(exc).__name__
    msg = (f"{py_func.__name__} raised {kind} in thread {thread} of block {block_idx} (threadIdx, blockIdx), at "
           f"{where}" + (f": {source}" if source else "") + (f"\n  {kind}: {detail}" if detail else "")
           + f"\n  simulated launch: grid {grid}, block {block}")
    hint = _HINTS.get(kind)
    if hint:
        msg += f"\n  hint: {hint}"
    return SimulatedKernelError(msg, kernel=py_func.__name__, exception=kind, detail=detail, thread=thread,
                                block=block_idx, filename=filename, line=shown, source=source, original=exc)


def _user_line(exc: BaseException, py_func) -> tuple[str | None, int | None]:
    """The innermost traceback frame in the kernel's own file, else the innermost outside numba, NumPy and threading."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    own = py_func.__code__.co_filename
    for filename, line in reversed(frames):
        if filename == own:
            return filename, line
    skip = tuple(os.path.dirname(p) for p in (np.__file__, threading.__file__, __file__))
    for filename, line in reversed(frames):
        if "numba" not in filename and not filename.startswith(skip):
            return filename, line
    return None, None
