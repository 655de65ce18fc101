"""Launching compiled kernels through CuPy, with every argument checked against the C signature first."""
from __future__ import annotations

import contextlib
import contextvars
import math
import re
import struct
from dataclasses import dataclass

import numpy as np

from ..compile.signature import Param
from ..errors import ArgumentError, LaunchError
from .device import DeviceInfo
from .tensor_map import TensorMap

# CUDA errors after which the context is unusable until the process ends.
STICKY_ERRORS = ("ILLEGAL_ADDRESS", "IllegalAddress", "MISALIGNED_ADDRESS", "MisalignedAddress", "LAUNCH_FAILED",
                 "LaunchFailure", "ILLEGAL_INSTRUCTION", "IllegalInstruction", "HARDWARE_STACK_ERROR",
                 "HardwareStackError", "ASSERT", "Assert", "INVALID_PC", "InvalidPc", "LAUNCH_TIMEOUT",
                 "LaunchTimeout", "TRAP", "Trap", "INVALID_ADDRESS_SPACE", "InvalidAddressSpace")

_INT_RANGES = {name: (np.iinfo(name).min, np.iinfo(name).max)
               for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")}


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block as 3-tuples, plus dynamic shared memory."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    cluster: tuple[int, int, int] | None = None   # blocks per thread-block cluster (sm_90 on); None: no cluster

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def __str__(self) -> str:
        return (f"grid={self.grid}, block={self.block}, shared_bytes={self.shared_bytes}"
                + (f", cluster={self.cluster}" if self.cluster else ""))


MAX_CLUSTER_BLOCKS = 8   # the portable cluster size; 16 needs the non-portable opt-in, which kernellab does not set


def cluster_dims(cluster, grid: tuple[int, int, int], device: DeviceInfo | None = None) -> tuple[int, int, int] | None:
    """Validate a thread-block cluster shape against the grid (and the device): None, or a 3-tuple."""
    if cluster is None:
        return None
    c = _dims(cluster, "cluster")
    blocks = c[0] * c[1] * c[2]
    if blocks > MAX_CLUSTER_BLOCKS:
        raise ArgumentError(f"cluster {c} has {blocks} blocks; at most {MAX_CLUSTER_BLOCKS} blocks per cluster (the "
                            f"portable limit) are supported")
    for axis, (g, n) in enumerate(zip(grid, c)):
        if g % n:
            raise ArgumentError(f"grid {grid} is not a whole number of clusters {c}: grid {'xyz'[axis]} = {g} is not a "
                                f"multiple of {n}; round the grid up to a multiple of the cluster shape")
    if device is not None and int(re.sub(r"\D", "", device.arch) or 0) < 90:
        raise ArgumentError(f"thread-block clusters need compute capability 9.0 or newer; {device.name} is "
                            f"{device.arch}")
    return c


def _dims(value, what: str) -> tuple[int, int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        dims = tuple(int(v) for v in value)
    else:
        raise ArgumentError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}; "
                            f"e.g. kernel[(n + 255) // 256, 256](...)")
    if any(d < 1 for d in dims):
        raise ArgumentError(f"{what} {dims} has a dimension below 1; every dimension must be at least 1")
    return dims + (1,) * (3 - len(dims))


def make_config(grid, block, shared_bytes: int, *, max_threads_per_block: int, static_shared_bytes: int,
                device: DeviceInfo | None, cluster=None) -> LaunchConfig:
    """Validate grid, block, dynamic shared memory (and a cluster shape) against the kernel and the device."""
    g, b = _dims(grid, "grid"), _dims(block, "block")
    if not isinstance(shared_bytes, (int, np.integer)) or shared_bytes < 0:
        raise ArgumentError(f"shared_bytes must be a non-negative int (dynamic shared memory per block), "
                            f"got {shared_bytes!r}")
    cfg = LaunchConfig(g, b, int(shared_bytes), cluster_dims(cluster, g, device))
    threads = cfg.threads_per_block
    if threads > max_threads_per_block:
        raise ArgumentError(
            f"block {b} has {threads} threads, more than this kernel's max_threads_per_block = "
            f"{max_threads_per_block} (set by __launch_bounds__, its {'registers' if max_threads_per_block < 1024 else 'arch'}"
            f" and the device); use a block of at most {max_threads_per_block} threads")
    if device is not None:
        for axis, (n, lim) in enumerate(zip(b, device.max_block_dims)):
            if n > lim:
                raise ArgumentError(f"block dimension {'xyz'[axis]} = {n} exceeds the device limit {lim} "
                                    f"(max block dims {device.max_block_dims})")
        for axis, (n, lim) in enumerate(zip(g, device.max_grid_dims)):
            if n > lim:
                raise ArgumentError(f"grid dimension {'xyz'[axis]} = {n} exceeds the device limit {lim} "
                                    f"(max grid dims {device.max_grid_dims})")
        limit = device.shared_per_block_optin_bytes - static_shared_bytes
        if shared_bytes > limit:
            raise ArgumentError(
                f"shared_bytes = {shared_bytes} of dynamic shared memory plus the kernel's {static_shared_bytes} "
                f"static bytes exceeds {device.name}'s per-block limit of {device.shared_per_block_optin_bytes} "
                f"bytes (with opt-in); at most {max(limit, 0)} dynamic bytes fit")
    return cfg


def _describe(x) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "dtype"):
        return f"torch tensor (dtype {str(x.dtype).replace('torch.', '')}, shape {tuple(x.shape)}, device {x.device})"
    if mod == "cupy":
        return f"CuPy array (dtype {x.dtype}, shape {x.shape})"
    if isinstance(x, np.ndarray):
        return f"NumPy array (dtype {x.dtype}, shape {x.shape}, in host memory)"
    return f"{type(x).__name__} {x!r}"[:120]


def _torch_dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _pointer_of(param: Param, x, device: DeviceInfo | None, pos: int) -> int:
    """Device address for a pointer parameter, after checking dtype, device and layout."""
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    if x is None:
        return 0
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "data_ptr"):
        if not x.is_cuda:
            raise ArgumentError(f"{where} got a torch tensor on {x.device}; the kernel needs GPU memory: pass "
                                f"x.cuda() (or create it with device='cuda')")
        if device is not None and x.device.index not in (None, device.index):
            raise ArgumentError(f"{where} is on {x.device} but the kernel launches on cuda:{device.index}; "
                                f"move it with .to('cuda:{device.index}')")
        dtype, contiguous, ptr, nbytes = _torch_dtype_name(x), x.is_contiguous(), x.data_ptr(), x.numel() * x.element_size()
    elif mod == "cupy" and hasattr(x, "data"):
        if device is not None and x.device.id != device.index:
            raise ArgumentError(f"{where} is on GPU {x.device.id} but the kernel launches on GPU {device.index}")
        dtype, contiguous, ptr, nbytes = str(x.dtype), x.flags.c_contiguous, x.data.ptr, x.nbytes
    elif hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        dtype = str(np.dtype(cai["typestr"]))
        strides = cai.get("strides")
        contiguous = strides is None or strides == tuple(
            int(np.prod(cai["shape"][i + 1:])) * np.dtype(cai["typestr"]).itemsize for i in range(len(cai["shape"])))
        ptr = cai["data"][0]
        nbytes = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
    elif isinstance(x, np.ndarray) or (mod == "torch"):
        raise ArgumentError(f"{where} got a {_describe(x)}; the kernel needs device memory: use a CUDA torch tensor "
                            f"or a CuPy array")
    else:
        raise ArgumentError(f"{where} is a pointer parameter but got a {_describe(x)}; pass a CUDA torch tensor, a "
                            f"CuPy array or None (null)")
    if param.dtype is not None and dtype != param.dtype:
        raise ArgumentError(f"{where} expects {param.dtype} elements but got a {_describe(x)}; convert it with "
                            f".to(torch.{param.dtype}) or change the parameter type")
    if not contiguous:
        raise ArgumentError(f"{where} got a non-contiguous {_describe(x)}; the kernel indexes memory densely: pass "
                            f"x.contiguous()")
    if param.vector_width > 1:
        itemsize = 2 if param.dtype == "bfloat16" else np.dtype(param.dtype).itemsize  # NumPy has no bfloat16
        align = param.vector_width * itemsize
        align = 16 if align == 12 else align
        if ptr % align:
            raise ArgumentError(f"{where} needs {align}-byte aligned data, but the address is {ptr:#x}")
        elems = nbytes // itemsize
        if elems % param.vector_width:
            raise ArgumentError(f"{where} views elements as {param.base}; the tensor has {elems} elements, not a "
                                f"multiple of {param.vector_width}")
    return int(ptr)


def _bf16_bits(value: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if math.isnan(value):
        return 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _scalar_of(param: Param, x, pos: int):
    """The exact-width NumPy scalar for a scalar parameter."""
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "cupy") or isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__"):
        if getattr(x, "ndim", None) == 0 and mod != "torch" or (mod == "torch" and x.dim() == 0 and not x.is_cuda):
            x = x.item()
        else:
            raise ArgumentError(f"{where} is a scalar parameter but got a {_describe(x)}; pass a number "
                                f"(or declare the parameter as a pointer)")
    if isinstance(x, np.generic):
        x = x.item()
    if not isinstance(x, (int, float, bool)):
        raise ArgumentError(f"{where} expects a number, got {_describe(x)}")
    dt = param.dtype
    if dt == "bool":
        return np.bool_(bool(x))
    if dt in _INT_RANGES:
        if isinstance(x, float):
            if not x.is_integer():
                raise ArgumentError(f"{where} is an integer parameter but got the float {x!r}; pass int(...) or "
                                    f"change the parameter to float")
            x = int(x)
        lo, hi = _INT_RANGES[dt]
        if not lo <= int(x) <= hi:
            raise ArgumentError(f"{where} is {dt}: {x} is outside [{lo}, {hi}]")
        return np.dtype(dt).type(int(x))
    if dt == "bfloat16":
        return np.uint16(_bf16_bits(float(x)))
    if dt in ("float16", "float32", "float64"):
        return np.dtype(dt).type(float(x))
    raise ArgumentError(f"{where}: parameters of type '{param.ctype}' cannot be passed from Python; use a "
                        f"supported scalar type (int, float, double, ...) or a pointer")


def _tensor_map_of(param: Param, x, device: DeviceInfo | None, pos: int) -> np.ndarray:
    """The 128 bytes of a TensorMap for a `CUtensorMap` parameter, after checking it is one and on the right GPU."""
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    if isinstance(x, TensorMap):
        if device is not None and x.device is not None and x.device != device.index:
            raise ArgumentError(f"{where} maps a tensor on GPU {x.device} but the kernel launches on GPU "
                                f"{device.index}; build the map from a tensor on cuda:{device.index}")
        return x.kernel_arg()
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "cupy") or isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__"):
        raise ArgumentError(f"{where} takes a tensor map, but got a {_describe(x)}; build one with "
                            f"kernellab.tensor_map(x, box=(rows, cols)) (the tile each copy moves) and pass that")
    raise ArgumentError(f"{where} takes a tensor map (kernellab.tensor_map(tensor, box)), got a {_describe(x)}")


def marshal_args(params: tuple[Param, ...], args: tuple, device: DeviceInfo | None, signature: str = "") -> list:
    """Check `args` against the parameters and return what to hand CuPy (NumPy scalars; a tensor map's 128 bytes
    as a one-element array, which CuPy passes by value)."""
    if len(args) != len(params):
        raise ArgumentError(f"{signature or 'the kernel'} takes {len(params)} argument"
                            f"{'s' if len(params) != 1 else ''}, got {len(args)}")
    out = []
    for pos, (param, x) in enumerate(zip(params, args)):
        if param.tensor_map:
            out.append(_tensor_map_of(param, x, device, pos))
            continue
        if param.pointer and param.base in ("CUtensorMap", "CUtensorMap_st"):
            raise ArgumentError(f"argument {pos} ('{param.name}', {param.ctype}): a tensor map is passed by value, "
                                f"not by pointer; declare it `const __grid_constant__ CUtensorMap {param.name}` and "
                                f"pass kernellab.tensor_map(tensor, box)")
        if isinstance(x, TensorMap):
            raise ArgumentError(f"argument {pos} ('{param.name}', {param.ctype}) got a tensor map, but the parameter "
                                f"is not a CUtensorMap; declare it `const __grid_constant__ CUtensorMap "
                                f"{param.name}` (#include <cuda.h>), or pass the tensor itself")
        if param.pointer:
            if param.dtype is None and param.base != "void":
                raise ArgumentError(f"argument {pos} ('{param.name}'): pointers to '{param.base}' are not supported "
                                    f"from Python; use a pointer to a scalar type (float*, int*, ...) or void*")
            out.append(np.uint64(_pointer_of(param, x, device, pos)))
        else:
            out.append(_scalar_of(param, x, pos))
    return out


# CUfunction_attribute values (CUDA driver API)
FUNC_ATTRIBUTES = {"max_threads_per_block": 0, "shared_size_bytes": 1, "const_size_bytes": 2, "local_size_bytes": 3,
                   "num_regs": 4, "ptx_version": 5, "binary_version": 6, "max_dynamic_shared_size_bytes": 8,
                   "preferred_shared_memory_carveout": 9}


def function_attributes(function) -> dict[str, int]:
    """What the driver says about a loaded kernel (a cupy.cuda.function.Function)."""
    from cupy.cuda import driver

    return {name: driver.funcGetAttribute(code, function.ptr) for name, code in FUNC_ATTRIBUTES.items()}


def allow_dynamic_shared(function, shared_bytes: int) -> None:
    """Opt a kernel in to more than 48 KiB of dynamic shared memory, with the L1/shared split at most shared.

    Without the carveout preference the driver may pick a split that holds fewer blocks than the shared memory
    allows (seen on an H100: one 80 KiB block per SM where 228 KiB hold two), which is not what
    `kernellab.occupancy` predicts.
    """
    from cupy.cuda import driver

    driver.funcSetAttribute(function.ptr, FUNC_ATTRIBUTES["max_dynamic_shared_size_bytes"], int(shared_bytes))
    driver.funcSetAttribute(function.ptr, FUNC_ATTRIBUTES["preferred_shared_memory_carveout"], 100)


_DEFER_SYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("kernellab_defer_sync", default=False)


@contextlib.contextmanager
def deferred_sync():
    """Kernel launches inside do not wait for their kernel (unless they ask to): `bench` times them with CUDA
    events, and a launch that synchronizes would put its own launch overhead into every repetition."""
    token = _DEFER_SYNC.set(True)
    try:
        yield
    finally:
        _DEFER_SYNC.reset(token)


def resolve_sync(sync: bool | None) -> bool:
    """A launch's `sync`: as given, or by default yes, except inside `deferred_sync()`."""
    return (not _DEFER_SYNC.get()) if sync is None else bool(sync)


class _StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol, as `cupy.cuda.Stream.from_external` takes it."""

    def __init__(self, handle: int):
        self.handle = int(handle)

    def __cuda_stream__(self):
        return (0, self.handle)


def external_stream(handle: int):
    """A CuPy stream object for a stream that another library (torch) owns."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:           # CuPy 14: ExternalStream is deprecated
        return from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle)


def _stream_for(args) -> object:
    """The stream to launch on: torch's current stream when torch tensors are involved, else CuPy's."""
    import cupy

    for x in args:
        if type(x).__module__.split(".")[0] == "torch" and getattr(x, "is_cuda", False):
            import torch

            return external_stream(torch.cuda.current_stream(x.device).cuda_stream)
    return cupy.cuda.get_current_stream()


def is_sticky(exc: BaseException) -> bool:
    """Whether a CUDA error leaves the context unusable (illegal address, trap, ...)."""
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in STICKY_ERRORS)


def launch(function, config: LaunchConfig, values: list, args: tuple, *, stream=None, sync: bool | None = None,
           kernel_name: str = "kernel", job=None) -> None:
    """Launch a cupy Function; raise LaunchError for launch failures and, with sync, for faults in the kernel."""
    import cupy

    if stream is None:
        s = _stream_for(args)
    elif isinstance(stream, int):
        s = external_stream(stream)
    elif type(stream).__module__.split(".")[0] == "torch":
        s = external_stream(stream.cuda_stream)
    else:
        s = stream
    try:
        if config.cluster:
            launch_cluster(function, config, values, s)
        else:
            function(config.grid, config.block, tuple(values), shared_mem=config.shared_bytes, stream=s)
    except Exception as exc:  # cupy raises CUDADriverError for bad launches
        raise _launch_error(exc, kernel_name, config, during="launch", job=job) from None
    if resolve_sync(sync):
        try:
            s.synchronize()
        except Exception as exc:
            raise _launch_error(exc, kernel_name, config, during="run", job=job) from None


class ClusterLaunchError(RuntimeError):
    """cuLaunchKernelEx returned an error (its CUresult name is in the message)."""


def launch_cluster(function, config: LaunchConfig, values: list, stream) -> None:
    """Launch a cupy Function with a thread-block cluster shape, through the driver's cuLaunchKernelEx (cuda-python);
    `values` as marshal_args makes them (NumPy scalars, one-element arrays for by-value structs)."""
    import ctypes

    from cuda.bindings import driver

    held = [np.array(v).reshape(-1)[:1].copy() for v in values]       # each value's bytes, alive until the launch
    pointers = (ctypes.c_void_p * max(1, len(held)))(*[h.ctypes.data for h in held])
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = config.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = config.block
    cfg.sharedMemBytes = config.shared_bytes
    cfg.hStream = driver.CUstream(int(getattr(stream, "ptr", 0) or 0))
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = config.cluster
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    (err,) = driver.cuLaunchKernelEx(cfg, driver.CUfunction(int(function.ptr)), ctypes.addressof(pointers), None)
    if int(err) != 0:
        raise ClusterLaunchError(f"cuLaunchKernelEx: {getattr(err, 'name', err)}")


def _launch_error(exc, kernel_name, config, during, job=None) -> LaunchError:
    text = str(exc)
    if is_sticky(exc):
        msg = (f"{kernel_name} faulted while running ({text}) with {config}. This error is sticky: the CUDA context "
               f"of this process is lost, and every later CUDA call here (CuPy and torch alike) will fail. Save what "
               f"you need and restart the notebook kernel. To see the faulting line now, from this session: "
               f"`kernellab.run.sanitize.sanitize_last()` re-runs this launch (same shapes and scalars, tensors "
               f"zero-filled) under compute-sanitizer in a new process. After the restart, "
               f"`{kernel_name}.sanitize({config.grid}, {config.block}, *args)` runs it on your data, and "
               f"`{kernel_name}[grid, block](*args, isolate=True)` (or `%config KernellabRun.isolate = True`) keeps "
               f"faults out of this process.")
        return LaunchError(msg, sticky=True, cuda_error=text, job=job)
    hint = ""
    if "OUT_OF_RESOURCES" in text or "TooManyResources" in text:
        hint = " The block asks for more registers or shared memory than an SM has: use fewer threads per block."
    return LaunchError(f"{kernel_name} failed at {during} ({text}) with {config}.{hint}", sticky=False,
                       cuda_error=text, job=job)
