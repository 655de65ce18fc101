"""Launching compiled kernels through the driver (run/launch/cudriver.py), with every argument checked against the C
signature first."""
from __future__ import annotations

import collections
import contextlib
import contextvars
import ctypes
import functools
import math
import os
import re
import struct
import sys
import threading
from dataclasses import dataclass

import numpy as np

from ...analysis.occupancy import (max_registers_at_threads, max_threads_at_registers, occupancy,
                                  registers_per_sub_partition)
from ...compile.signature import TENSOR_MAP_ALIGN_BYTES, TENSOR_MAP_BYTES, Param
from ...errors import ArgumentError, KernellabError, LaunchError
from . import cudriver
from .cudriver import CUDA_ERROR_INVALID_CONTEXT
from .device import DeviceInfo, device_for_arch
from .tensor_map import TensorMap

# CUDA errors after which the context is unusable until the process ends.
STICKY_ERRORS = ("ILLEGAL_ADDRESS", "IllegalAddress", "MISALIGNED_ADDRESS", "MisalignedAddress", "LAUNCH_FAILED",
                 "LaunchFailure", "ILLEGAL_INSTRUCTION", "IllegalInstruction", "HARDWARE_STACK_ERROR",
                 "HardwareStackError", "ASSERT", "Assert", "INVALID_PC", "InvalidPc", "LAUNCH_TIMEOUT",
                 "LaunchTimeout", "TRAP", "Trap", "INVALID_ADDRESS_SPACE", "InvalidAddressSpace",
                 # the runtime's own words, as torch reports them ("CUDA error: an illegal memory access ...")
                 "illegal memory access", "misaligned address", "unspecified launch failure",
                 "device-side assert", "illegal instruction")

_INT_RANGES = {name: (np.iinfo(name).min, np.iinfo(name).max)
               for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")}


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block as 3-tuples, plus dynamic shared memory (and a cluster shape, programmatic dependent launch)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    cluster: tuple[int, int, int] | None = None   # blocks per thread-block cluster (sm_90 on); None: no cluster
    pdl: bool = False    # programmatic dependent launch (sm_90 on): may start before the stream's previous kernel ends

    @property
    def launch_ex(self) -> bool:
        """Whether this launch goes through cuLaunchKernelEx (a cluster shape or PDL) rather than cuLaunchKernel."""
        return bool(self.cluster) or self.pdl

    def driver_kwargs(self) -> dict:
        """The keyword arguments of Driver.launch beyond the grid, block and shared bytes: cluster=, pdl= where set
        (none for a plain launch, so that drivers without them, tests' fakes, take it)."""
        kw = {"cluster": self.cluster} if self.cluster else {}
        if self.pdl:
            kw["pdl"] = True
        return kw

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def __str__(self) -> str:
        return (f"grid={self.grid}, block={self.block}, shared_bytes={self.shared_bytes}"
                + (f", cluster={self.cluster}" if self.cluster else "") + (", pdl=True" if self.pdl else ""))


PORTABLE_CLUSTER_BLOCKS = 8   # clusters up to 8 blocks run on every sm_90 part
MAX_CLUSTER_BLOCKS = 16       # 9-16 blocks: the non-portable size, which kernellab opts the kernel in to at launch


def cluster_dims(cluster, grid: tuple[int, int, int], device: DeviceInfo | None = None) -> tuple[int, int, int] | None:
    """Validate a thread-block cluster shape against the grid (and the device): None, or a 3-tuple."""
    if cluster is None:
        return None
    c = launch_dims(cluster, "cluster")
    blocks = cluster_blocks(c)
    if blocks > MAX_CLUSTER_BLOCKS:
        raise ArgumentError(f"cluster {c} has {blocks} blocks; at most {MAX_CLUSTER_BLOCKS} blocks per cluster (sm_90's "
                            f"limit: {PORTABLE_CLUSTER_BLOCKS} portable, up to {MAX_CLUSTER_BLOCKS} with the "
                            f"non-portable opt-in kernellab sets); use a smaller cluster shape")
    for axis, (g, n) in enumerate(zip(grid, c)):
        if g % n:
            raise ArgumentError(f"grid {grid} is not a whole number of clusters {c}: grid {'xyz'[axis]} = {g} is not a "
                                f"multiple of {n}; round the grid up to a multiple of the cluster shape")
    if device is not None and int(re.sub(r"\D", "", device.arch) or 0) < 90:
        raise ArgumentError(f"thread-block clusters need compute capability 9.0 or newer; {device.name} is "
                            f"{device.arch}")
    return c


PDL_MIN_ARCH = 90       # griddepcontrol and CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: sm_90 on


def pdl_flag(pdl, device: DeviceInfo | None = None) -> bool:
    """Validate pdl= (a bool): programmatic dependent launch where asked for and the device has it (sm_90 on). On an
    older device (or None there) the launch is a plain one, exactly as without the option: a kernel written for PDL
    waits in griddepcontrol_wait (kl/pdl.cuh), which compiles to nothing below sm_90, so its result is the same."""
    if not isinstance(pdl, (bool, np.bool_)):
        raise ArgumentError(f"pdl must be True or False (programmatic dependent launch, sm_90 on), got {pdl!r}")
    if not pdl:
        return False
    return device is None or int(re.sub(r"\D", "", device.arch) or 0) >= PDL_MIN_ARCH


def launch_dims(value, what: str) -> tuple[int, int, int]:
    """A grid, block or cluster shape as (x, y, z): an int or a 1- to 3-tuple of positive ints, checked."""
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
                device: DeviceInfo | None, cluster=None, registers: int = 0, name: str = "the kernel",
                pdl: bool = False) -> LaunchConfig:
    """Validate grid, block, dynamic shared memory (and a cluster shape) against the kernel and the device; with the
    kernel's `registers` (ptxas's count), also whether the block's registers fit an SM, raising the LaunchError the
    driver's CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES gives (`name` names the kernel in it). pdl=True: programmatic
    dependent launch on sm_90 on, a plain launch below (pdl_flag)."""
    g, b = launch_dims(grid, "grid"), launch_dims(block, "block")
    if not isinstance(shared_bytes, (int, np.integer)) or shared_bytes < 0:
        raise ArgumentError(f"shared_bytes must be a non-negative int (dynamic shared memory per block), "
                            f"got {shared_bytes!r}")
    cfg = LaunchConfig(g, b, int(shared_bytes), cluster_dims(cluster, g, device), pdl_flag(pdl, device))
    threads = cfg.threads_per_block
    why = ""
    if registers and device is not None:
        why = registers_do_not_fit(threads, registers, static_shared_bytes + cfg.shared_bytes, device.arch)
    # A block above the limit its registers set gets the driver's CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES and why (the
    # fullest sub-partition), below, as on the GPU; one above __launch_bounds__ or the arch gets this ArgumentError.
    if threads > max_threads_per_block and not (why and max_threads_per_block >= max_threads_at_registers(
            registers, device.arch)):
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
        if why:
            raise as_launch_error(OUT_OF_RESOURCES, name, cfg, during="launch", why=why)
    return cfg


def check_on_arch(image, grid, block, shared_bytes: int = 0, cluster=None, pdl: bool = False) -> LaunchConfig:
    """Refuse, before anything runs, what a GPU of the arch of `image` (a KernelImage, Kernel.image()) refuses, in
    the GPU path's words: make_config against kernellab.analysis's table for that arch (no GPU needed). A block above
    the kernel's max_threads_per_block or the arch's block dimensions, dynamic plus static shared memory above the
    per-block limit with the opt-in (which a launch on the GPU makes for any kernel asking for more than 48 KiB), a
    cluster shape the arch does not run: ArgumentError; a block whose registers (ptxas's count in the image) do not
    fit an SM: the LaunchError of CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. What the CPU paths check launches with."""
    return make_config(grid, block, shared_bytes, max_threads_per_block=image.max_threads_per_block,
                       static_shared_bytes=image.static_shared_bytes, device=device_for_arch(image.arch),
                       cluster=cluster, registers=image.registers, name=image.name, pdl=pdl)


OUT_OF_RESOURCES = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch"   # the driver's words


def registers_do_not_fit(threads: int, registers: int, shared_bytes: int, arch: str) -> str:
    """Why a block of `threads` threads at `registers` a thread cannot launch on `arch` ('' where it can), by
    kernellab.analysis's register rule (warps_per_sub_partition): registers go to whole warps (units of 256), and a
    block's warps are spread over the SM's 4 sub-partitions, each with a quarter of the register file, so the
    fullest one must hold its share."""
    try:
        occ = occupancy(threads, registers, shared_bytes, arch)
    except KernellabError:                     # an arch without a table, or limits checked elsewhere
        return ""
    if occ.blocks_limit_registers > 0:
        return ""
    spec = occ.spec
    parts = spec.register_sub_partitions
    fullest = -(-occ.warps_per_block // parts)
    per_part = registers_per_sub_partition(spec)
    fit_regs = max_registers_at_threads(threads, spec)
    fit_threads = max_threads_at_registers(registers, spec)
    return (f"Its {occ.warps_per_block} warps put {fullest} on one of the SM's {parts} sub-partitions: {fullest} x "
            f"{occ.registers_per_warp} registers (a warp of {registers} registers a thread, ptxas's count) = "
            f"{fullest * occ.registers_per_warp}, more than the {per_part} each holds "
            f"(kernellab.occupancy({threads}, {registers}, {shared_bytes}, {spec.name!r}): 0 blocks). It fits with at "
            f"most {fit_regs} registers a thread (__maxnreg__, __launch_bounds__) or at most {fit_threads} threads.")


def describe_value(x) -> str:
    """What an argument is, for error messages: "torch tensor (dtype float32, shape (4,), device cuda:0)", ..."""
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


def _pointer_of(param: Param, x, device: DeviceInfo | None, pos: int, any_device: bool = False) -> int:
    """Device address for a pointer parameter, after checking dtype, device and layout.

    any_device=True checks everything that does not depend on where the memory is: host (CPU torch, NumPy) and meta
    tensors stand in for GPU ones, and alignment is judged by the element offset (allocations are aligned).
    """
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    if x is None:
        return 0
    mod = type(x).__module__.split(".")[0]
    offset_bytes = None                        # the address's offset from an aligned allocation, where known
    if mod == "torch" and hasattr(x, "data_ptr"):
        if not x.is_cuda and not any_device:
            raise ArgumentError(f"{where} got a torch tensor on {x.device}; the kernel needs GPU memory: pass "
                                f"x.cuda() (or create it with device='cuda')")
        if not any_device and device is not None and x.device.index not in (None, device.index):
            raise ArgumentError(f"{where} is on {x.device} but the kernel launches on cuda:{device.index}; "
                                f"move it with .to('cuda:{device.index}')")
        dtype, contiguous, nbytes = _torch_dtype_name(x), x.is_contiguous(), x.numel() * x.element_size()
        if any_device and hasattr(x, "storage_offset"):
            offset_bytes = x.storage_offset() * x.element_size()
        ptr = 0 if getattr(x, "is_meta", False) else x.data_ptr()
    elif mod == "cupy" and hasattr(x, "data"):
        if not any_device and device is not None and x.device.id != device.index:
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
    elif any_device and isinstance(x, np.ndarray):
        dtype, contiguous, ptr, nbytes = str(x.dtype), x.flags.c_contiguous, x.ctypes.data, x.nbytes
    elif isinstance(x, np.ndarray) or (mod == "torch"):
        raise ArgumentError(f"{where} got a {describe_value(x)}; the kernel needs device memory: use a CUDA torch "
                            f"tensor or a CuPy array")
    else:
        raise ArgumentError(f"{where} is a pointer parameter but got a {describe_value(x)}; pass a CUDA torch "
                            f"tensor, a CuPy array or None (null)")
    if param.dtype is not None and dtype != param.dtype:
        raise ArgumentError(f"{where} expects {param.dtype} elements but got a {describe_value(x)}; convert it with "
                            f".to(torch.{param.dtype}) or change the parameter type")
    if not contiguous:
        raise ArgumentError(f"{where} got a non-contiguous {describe_value(x)}; the kernel indexes memory densely: "
                            f"pass x.contiguous()")
    if param.vector_width > 1:
        itemsize = 2 if param.dtype == "bfloat16" else np.dtype(param.dtype).itemsize  # NumPy has no bfloat16
        align = param.vector_width * itemsize
        align = 16 if align == 12 else align
        if offset_bytes is not None:
            if offset_bytes % align:
                raise ArgumentError(f"{where} needs {align}-byte aligned data, but the tensor starts {offset_bytes} "
                                    f"bytes into its storage (a view): pass x.clone() or a view at a multiple of "
                                    f"{align // itemsize} elements")
        elif ptr % align:
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


def scalar_of(param: Param, x, pos: int):
    """The exact-width NumPy scalar for a scalar parameter."""
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "cupy") or isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__"):
        if getattr(x, "ndim", None) == 0 and mod != "torch" or (mod == "torch" and x.dim() == 0 and not x.is_cuda):
            x = x.item()
        else:
            raise ArgumentError(f"{where} is a scalar parameter but got a {describe_value(x)}; pass a number "
                                f"(or declare the parameter as a pointer)")
    if isinstance(x, np.generic):
        x = x.item()
    if not isinstance(x, (int, float, bool)):
        raise ArgumentError(f"{where} expects a number, got {describe_value(x)}")
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


def tensor_map_of(param: Param, x, device: DeviceInfo | None, pos: int) -> np.ndarray:
    """The 128 bytes of a TensorMap for a `CUtensorMap` parameter, after checking it is one and on the right GPU."""
    where = f"argument {pos} ('{param.name}', {param.ctype})"
    if isinstance(x, TensorMap):
        if device is not None and x.device is not None and x.device != device.index:
            raise ArgumentError(f"{where} maps a tensor on GPU {x.device} but the kernel launches on GPU "
                                f"{device.index}; build the map from a tensor on cuda:{device.index}")
        return x.kernel_arg()
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "cupy") or isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__"):
        raise ArgumentError(f"{where} takes a tensor map, but got a {describe_value(x)}; build one with "
                            f"kernellab.tensor_map(x, box=(rows, cols)) (the tile each copy moves) and pass that")
    raise ArgumentError(f"{where} takes a tensor map (kernellab.tensor_map(tensor, box)), got a {describe_value(x)}")


def marshal_args(params: tuple[Param, ...], args: tuple, device: DeviceInfo | None, signature: str = "", *,
                 any_device: bool = False) -> list:
    """Check `args` against the parameters and return the exact-width NumPy values to launch with (a tensor map's
    128 bytes as a one-element array).

    any_device=True (Kernel.check_args) accepts host and meta tensors in place of GPU ones: see _pointer_of.
    """
    if len(args) != len(params):
        raise ArgumentError(f"{signature or 'the kernel'} takes {len(params)} argument"
                            f"{'s' if len(params) != 1 else ''}, got {len(args)}")
    out = []
    for pos, (param, x) in enumerate(zip(params, args)):
        if param.tensor_map:
            out.append(tensor_map_of(param, x, None if any_device else device, pos))
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
            out.append(np.uint64(_pointer_of(param, x, device, pos, any_device)))
        else:
            out.append(scalar_of(param, x, pos))
    return out


# CUfunction_attribute values (CUDA driver API)
FUNC_ATTRIBUTES = {"max_threads_per_block": 0, "shared_size_bytes": 1, "const_size_bytes": 2, "local_size_bytes": 3,
                   "num_regs": 4, "ptx_version": 5, "binary_version": 6, "max_dynamic_shared_size_bytes": 8,
                   "preferred_shared_memory_carveout": 9, "non_portable_cluster_size_allowed": 14}


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


def allow_large_clusters(function) -> None:
    """Opt a kernel in to clusters of 9-16 blocks (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED); without it
    the driver refuses a launch with more than 8 blocks per cluster."""
    from cupy.cuda import driver

    driver.funcSetAttribute(function.ptr, FUNC_ATTRIBUTES["non_portable_cluster_size_allowed"], 1)


def cluster_blocks(cluster) -> int:
    """Blocks in a cluster shape (a 3-tuple or None: 1)."""
    return int(np.prod(cluster)) if cluster else 1


# True inside deferred_sync(): launches there do not wait. Public for the hot paths that set it without the context
# manager (a registered op's implementation: set and reset, about a tenth of the generator's cost).
DEFER_SYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("kernellab_defer_sync", default=False)

# --- whether a launch waits for its kernel ----------------------------------------------------------------------
# One rule, first answer wins: the call's `sync=`; the kernel's `launch_blocking` (Kernel.launch_blocking, passed in
# as sync by the launcher); the global setting (set_launch_blocking, or KERNELLAB_LAUNCH_BLOCKING in the environment,
# like CUDA_LAUNCH_BLOCKING); else wait, except inside deferred_sync() (a registered op, kernellab.bench). A launch
# on a stream being captured into a CUDA graph never waits (it records, it does not run).
_ENV_BLOCKING = "KERNELLAB_LAUNCH_BLOCKING"
_BLOCKING: list = [None]      # the global setting: None (the default rule), True (always wait), False (never)


def _blocking_from_env(text: str | None) -> bool | None:
    """KERNELLAB_LAUNCH_BLOCKING's value: 1/true/yes -> True, 0/false/no -> False, unset or empty -> None."""
    if text is None or not text.strip():
        return None
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{_ENV_BLOCKING}={text!r} is not understood; use 1 (every launch waits for its kernel), "
                        f"0 (no launch waits) or leave it unset (wait at the top level, not inside ops or bench)")


_BLOCKING[0] = _blocking_from_env(os.environ.get(_ENV_BLOCKING))


def set_launch_blocking(value: bool | None = True) -> bool | None:
    """Whether kernel launches wait for their kernel, for every kernel in this process; returns the old setting.

    True: every launch waits (inside registered ops and kernellab.bench too), so a fault is reported at the launch
    that caused it, like CUDA_LAUNCH_BLOCKING=1. False: no launch waits (a notebook cell then runs ahead of the
    GPU; a fault surfaces at the next synchronising call, naming the recent launches). None (the default): a
    top-level launch waits, a launch inside an op, torch.compile, CUDA-graph capture or kernellab.bench does not.
    A kernel's own `launch_blocking` and a call's `sync=` take precedence. The environment variable
    KERNELLAB_LAUNCH_BLOCKING (1 or 0) sets it at import."""
    if value is not None and not isinstance(value, bool):
        raise ArgumentError(f"set_launch_blocking takes True, False or None, got {value!r}")
    old, _BLOCKING[0] = _BLOCKING[0], value
    return old


def launch_blocking() -> bool | None:
    """The global setting set_launch_blocking gives (None: the default rule)."""
    return _BLOCKING[0]


@contextlib.contextmanager
def deferred_sync():
    """Kernel launches inside do not wait for their kernel (unless they ask to): `bench` times them with CUDA
    events, and a launch that synchronizes would put its own launch overhead into every repetition."""
    token = DEFER_SYNC.set(True)
    try:
        yield
    finally:
        DEFER_SYNC.reset(token)


def resolve_sync(sync: bool | None) -> bool:
    """A launch's `sync`: as given, else the global setting (set_launch_blocking), else yes, except inside
    `deferred_sync()`."""
    if sync is not None:
        return bool(sync)
    g = _BLOCKING[0]
    return (not DEFER_SYNC.get()) if g is None else g


# --- launches that did not wait ---------------------------------------------------------------------------------
# A launch that does not wait cannot report its kernel's fault; the next synchronising call kernellab makes (a
# waiting launch, kernellab.synchronize, bench) sees it instead. Each such launch leaves (kernel, configuration,
# file, line, function) of the code that made it here, as a plain tuple (record_async is on every such launch's
# path: an op's launches all take it); recent_launches() and the error text read them as AsyncLaunch. A successful
# wait empties the record, and a failed one names what it holds.
RECENT_LAUNCHES: collections.deque = collections.deque(maxlen=16)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # kernellab/
_INTERNAL_FILES = (_PACKAGE_DIR, "<kernellab")        # kernellab's files and its generated launches and plans


@dataclass(frozen=True)
class AsyncLaunch:
    """One launch that did not wait for its kernel, and the line of user code that made it."""

    kernel: str
    config: LaunchConfig
    filename: str | None
    line: int
    function: str | None

    def __str__(self) -> str:
        where = f"{self.filename}, line {self.line}, in {self.function}" if self.filename else "an unknown line"
        return f"{self.kernel} ({self.config}) launched at {where}"


def record_async(kernel: str, config: LaunchConfig, _getframe=sys._getframe, _append=RECENT_LAUNCHES.append,
                 _internal=_INTERNAL_FILES) -> None:
    """Keep a launch that did not wait, with the first caller outside kernellab (a notebook cell's line)."""
    f = _getframe(1)
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(_internal):
            _append((kernel, config, code.co_filename, f.f_lineno, code.co_name))
            return
        f = f.f_back
    _append((kernel, config, None, 0, None))


def _code_line(code, lasti: int) -> int:
    """The source line of byte offset `lasti` in `code` (what a frame's f_lineno gives at its f_lasti)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def _async_launch(record) -> AsyncLaunch:
    """A RECENT_LAUNCHES entry as an AsyncLaunch: (kernel, config, filename, line, function) from record_async, or
    (kernel, config, code, lasti) from a generated launch, which leaves the line to be found here (a frame's f_lineno
    decodes the code's line table: on a cold CPU cache about 1.5 µs of every launch that does not wait)."""
    if len(record) == 4:
        kernel, config, code, lasti = record
        return AsyncLaunch(kernel, config, code.co_filename, _code_line(code, lasti), code.co_name)
    return AsyncLaunch(*record)


def recent_launches() -> tuple[AsyncLaunch, ...]:
    """The launches that did not wait since kernellab last saw the GPU finish (oldest first, at most 16)."""
    return tuple(r if isinstance(r, AsyncLaunch) else _async_launch(r) for r in list(RECENT_LAUNCHES))


def unwaited_note(exclude: str | None = None) -> str:
    """The sentence a fault found at a wait adds: which launches that did not wait may have caused it."""
    recent = recent_launches()
    if not recent:
        return ""
    shown = "; ".join(str(r) for r in reversed(recent[-4:]))
    more = f" (and {len(recent) - 4} earlier)" if len(recent) > 4 else ""
    return (f" Launches that did not wait for their kernel ran before this point, and the fault may be theirs; most "
            f"recent first: {shown}{more}. To find which, run with kernellab.set_launch_blocking(True) (or "
            f"KERNELLAB_LAUNCH_BLOCKING=1), so that each launch waits and reports its own fault.")


def synchronize(device=None) -> None:
    """Wait for all work on the GPU (torch.cuda.synchronize, else CuPy's): a fault of a launch that did not wait
    is raised here as a LaunchError that names the recent launches (kernel, configuration, cell line)."""
    try:
        if "torch" in sys.modules:
            import torch

            torch.cuda.synchronize(device)
        else:
            import cupy

            cupy.cuda.Device(device or 0).synchronize() if device is not None else \
                cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sticky = is_sticky(exc)
        names = ", ".join(dict.fromkeys(r.kernel for r in recent_launches())) or "a kernel"
        raise LaunchError(f"{names} faulted ({text}), found at kernellab.synchronize().{unwaited_note()}"
                          + (" The error is sticky: this process's CUDA context is lost; restart the notebook "
                             "kernel." if sticky else ""), sticky=sticky, cuda_error=text) from None
    RECENT_LAUNCHES.clear()


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


def is_sticky(exc: BaseException) -> bool:
    """Whether a CUDA error leaves the context unusable (illegal address, trap, ...)."""
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in STICKY_ERRORS)


# --- the launch path ------------------------------------------------------------------------------------------
# A launch checks every argument against the signature, packs the values into one parameter buffer and calls
# cuLaunchKernel (run/launch/cudriver.py). What depends only on the signature and the arguments' types (which dtype a
# tensor must have, the integer range of a scalar, how to pack it, where the stream comes from) is worked out once
# per type combination: an ArgPlan. Each call then runs the plan's checks, in one pass, on what can change from call
# to call (dtype, device, contiguity, alignment, the value of a scalar). Anything the plan cannot settle (an
# argument that fails a check, or a type without a plan) goes through marshal_args, which raises the precise error
# or handles the rarer case.

_SCALAR_STRUCT = {"bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
                  "int64": "q", "uint64": "Q", "float16": "e", "bfloat16": "H", "float32": "f", "float64": "d"}


class _Fallback(Exception):
    """An argument the plan cannot settle: marshal_args decides (and raises the precise error if it is wrong)."""


_FALLBACK = _Fallback()


def _layout(params: tuple[Param, ...]) -> tuple[str, tuple[int, ...], int]:
    """(struct format, byte offset of each parameter, total bytes) of the host-side parameter buffer: each value at
    its natural alignment, a CUtensorMap (PTX `.param .align 64 .b8 tmap[128]`) as 128 bytes at a multiple of 64.

    The launch passes kernelParams, one pointer per parameter, and the driver copies each value's bytes (the size
    the cubin's EIATTR_KPARAM_INFO gives) to the kernel's own offset, so these offsets need not be the kernel's. They
    are not: the 64-byte alignment is of the address in constant bank 0, where parameters start at 0x210 on sm_90,
    so after a pointer a map sits at parameter offset 0x30, not 0x40 (tests/test_launch_path.py reads KPARAM_INFO).
    An `extra` CU_LAUNCH_PARAM_BUFFER_POINTER buffer would have to follow KPARAM_INFO instead."""
    fmt, offsets, off = "<", [], 0
    for p in params:
        scalar = not p.pointer and p.dtype in _SCALAR_STRUCT
        if p.tensor_map:
            size, align, code = TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN_BYTES, f"{TENSOR_MAP_BYTES}s"
        elif scalar:
            size = np.dtype("uint16" if p.dtype == "bfloat16" else p.dtype).itemsize
            align, code = size, _SCALAR_STRUCT[p.dtype]
        else:
            # A parameter Python cannot pass (a struct) keeps an 8-byte slot: marshal_args refuses it first.
            size, align, code = 8, 8, "Q"
        pad = -off % align
        fmt += "x" * pad
        off += pad
        offsets.append(off)
        fmt += code
        off += size
    return fmt, tuple(offsets), off


def _torch_dtype(name: str | None):
    import torch

    return getattr(torch, name, None) if name else None


def _pointer_code(param: Param, typ: type, i: int, ns: dict) -> tuple[list[str], str] | None:
    """(lines that check argument a<i>, the expression of its address) for pointer arguments of type `typ`."""
    a, width = f"a{i}", param.vector_width
    if typ is type(None):
        return [], "0"
    mod = typ.__module__.split(".")[0]
    if mod == "torch" and hasattr(typ, "data_ptr"):
        ns[f"D{i}"] = _torch_dtype(param.dtype)
        if param.dtype is not None and ns[f"D{i}"] is None:
            return None
        dtype = f"{a}.dtype is not D{i} or " if param.dtype is not None else ""
        lines = [f"if {dtype}{a}.get_device() != DEV or not {a}.is_contiguous(): raise FALLBACK"]
        if width == 1:
            return lines, f"{a}.data_ptr()"
        itemsize = 2 if param.dtype == "bfloat16" else np.dtype(param.dtype).itemsize
        ns[f"A{i}"] = 16 if width * itemsize == 12 else width * itemsize
        lines += [f"p{i} = {a}.data_ptr()", f"if p{i} % A{i} or {a}.numel() % {width}: raise FALLBACK"]
        return lines, f"p{i}"
    if mod == "cupy" and hasattr(typ, "data") and width == 1 and param.dtype != "bfloat16":
        dtype = ""
        if param.dtype is not None:
            ns[f"D{i}"] = np.dtype(param.dtype)
            dtype = f"{a}.dtype != D{i} or "
        # The memory pointer's device_id and CuPy's own _c_contiguous flag: no Device or Flags object per call (were
        # _c_contiguous gone, AttributeError sends every call to marshal_args, which reads x.flags).
        return [f"m{i} = {a}.data",
                f"if {dtype}m{i}.device_id != DEV or not {a}._c_contiguous: raise FALLBACK"], f"m{i}.ptr"
    return None


def _scalar_code(param: Param, typ: type, i: int, ns: dict) -> tuple[list[str], str] | None:
    """(lines that check argument a<i>, the expression struct packs) for scalar arguments of Python type `typ`."""
    a, dt = f"a{i}", param.dtype
    if dt in _INT_RANGES and typ is int:
        ns[f"L{i}"], ns[f"H{i}"] = (int(v) for v in _INT_RANGES[dt])
        return [f"if not L{i} <= {a} <= H{i}: raise FALLBACK"], a
    if dt in ("float16", "float32", "float64") and typ in (float, int):
        return [], a                           # struct rounds as NumPy does; beyond the range it raises: fall back
    if dt == "bfloat16" and typ in (float, int):
        ns["BF16"] = _bf16_bits
        return [], f"BF16(float({a}))"
    if dt == "bool" and typ is bool:
        return [], a
    return None


def _tensor_map_code(param: Param, typ: type, i: int, ns: dict) -> tuple[list[str], str] | None:
    """(lines that check argument a<i>, the expression of its 128 bytes) for a CUtensorMap parameter."""
    if typ is not TensorMap:
        return None                            # marshal_args says what to pass instead
    a = f"a{i}"
    ns["TMB"] = TENSOR_MAP_BYTES
    return [f"m{i} = {a}.encoded",
            f"if len(m{i}) != TMB or ({a}.device is not None and {a}.device != DEV): raise FALLBACK"], f"m{i}"


@dataclass(frozen=True)
class ArgPlan:
    """The checks for one combination of argument types, as one generated function (see the section comment)."""

    check: object            # check(*args) -> the values to pack, in order; raises _Fallback
    source: str              # check's Python source, for reading
    torch_index: int | None  # the first torch tensor: its device's current stream is the launch's stream
    cupy_index: int | None   # else the first CuPy array: CuPy's current stream


def make_plan(params: tuple[Param, ...], types: tuple[type, ...], device_index: int) -> ArgPlan | None:
    """The ArgPlan for arguments of these types, or None where marshal_args must handle every call."""
    code = _plan_code(params, types, device_index)
    if code is None:
        return None
    body, values, ns, torch_index, cupy_index = code
    names = ", ".join(f"a{i}" for i in range(len(params)))
    source = "\n".join([f"def check({names}):"] + [f"    {line}" for line in body]
                       + [f"    return ({', '.join(values)}{',' if len(values) == 1 else ''})"]) + "\n"
    exec(compile(source, f"<kernellab argument plan {types}>", "exec"), ns)
    return ArgPlan(ns["check"], source, torch_index, cupy_index if torch_index is None else None)


def _plan_code(params: tuple[Param, ...], types: tuple[type, ...], device_index: int):
    """(check lines, value expressions, their namespace, torch_index, cupy_index) for arguments a0, a1, ... of these
    types, or None where marshal_args must handle every call."""
    if len(types) != len(params):
        return None
    ns = {"FALLBACK": _FALLBACK, "DEV": device_index}
    body, values, torch_index, cupy_index = [], [], None, None
    for i, (p, typ) in enumerate(zip(params, types)):
        if p.tensor_map:
            code = _tensor_map_code(p, typ, i, ns)
        elif typ is TensorMap:
            code = None                        # a map where none is expected: marshal_args's error
        elif p.pointer:
            code = None if p.dtype is None and p.base != "void" else _pointer_code(p, typ, i, ns)
            mod = typ.__module__.split(".")[0]
            torch_index = i if torch_index is None and mod == "torch" else torch_index
            cupy_index = i if cupy_index is None and mod == "cupy" else cupy_index
        else:
            code = _scalar_code(p, typ, i, ns) if p.dtype in _SCALAR_STRUCT else None
        if code is None:
            return None
        lines, value = code
        body += [f"# a{i}: {p} ({typ.__module__}.{typ.__qualname__})"] + lines
        values.append(value)
    return body, values, ns, torch_index, cupy_index


def torch_stream_function():
    """The cheapest callable device_index -> torch's current stream on that device as a raw cudaStream_t (under graph
    capture: the capturing stream): torch's own C function where this torch has it."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda device_index: torch.cuda.current_stream(device_index).cuda_stream)


def torch_stream_handle(device_index: int) -> int:
    """torch's current stream on a device, as a raw cudaStream_t (under graph capture: the capturing stream)."""
    return torch_stream_function()(device_index)


def cupy_stream_handle() -> int:
    """CuPy's current stream, as a raw cudaStream_t."""
    import cupy

    return cupy.cuda.get_current_stream().ptr


def cupy_stream_function():
    """A callable () -> CuPy's current raw stream (what cupy_stream_handle returns), with CuPy's lookup bound."""
    import cupy

    current = cupy.cuda.get_current_stream
    return lambda: current().ptr


def stream_handle(stream) -> int:
    """A raw cudaStream_t from what a launch's `stream=` may be: an int, a torch or CuPy stream, a numba stream, or
    any object in the CUDA stream protocol (`__cuda_stream__`)."""
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):        # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    handle = getattr(stream, "handle", None)  # numba's Stream: a ctypes c_void_p
    if handle is not None:
        return int(getattr(handle, "value", handle) or 0)
    raise ArgumentError(f"stream= takes a torch or CuPy stream, a raw cudaStream_t (int) or an object with "
                        f"__cuda_stream__, got {type(stream).__name__}")


class LaunchPath:
    """One kernel's launches on one GPU: the cached plans and launch configurations, the parameter buffer, and the
    call into the driver. `driver` is run/launch/cudriver.py's Driver (tests pass a fake)."""

    MAX_CACHED = 256                           # configurations and plans kept per kernel

    def __init__(self, function_handle: int, params: tuple[Param, ...], device: DeviceInfo, *, name: str,
                 signature: str, max_threads_per_block: int, static_shared_bytes: int, driver=None,
                 opt_in=None, cluster_opt_in=None, registers: int = 0):
        self.function_handle, self.params, self.device = int(function_handle), tuple(params), device
        self.name, self.signature = name, signature
        self.max_threads_per_block, self.static_shared_bytes = max_threads_per_block, static_shared_bytes
        self.registers = registers             # ptxas's count: a block whose registers do not fit is refused
        if driver is None:
            driver = cudriver.driver()
        self.driver = driver
        self._opt_in = opt_in                  # shared_bytes -> None: raise the function's dynamic smem limit
        self._opted_in_bytes = device.shared_per_block_bytes - static_shared_bytes
        self._cluster_opt_in = cluster_opt_in  # () -> None: allow clusters of more than 8 blocks
        fmt, offsets, size = _layout(self.params)
        self._struct = struct.Struct(fmt)
        # The buffer starts at a multiple of 64 bytes, so each value sits at its alignment (a CUtensorMap at 64).
        self._buffer = (ctypes.c_char * (max(size, 1) + TENSOR_MAP_ALIGN_BYTES))()
        self._base = -ctypes.addressof(self._buffer) % TENSOR_MAP_ALIGN_BYTES
        self.offsets = tuple(self._base + o for o in offsets)
        base = ctypes.addressof(self._buffer)
        self._pointers = (ctypes.c_void_p * max(len(self.params), 1))(*[base + o for o in self.offsets])
        self.params_address = ctypes.addressof(self._pointers) if self.params else None
        self._configs: dict = {}
        self._plans: dict = {}
        self._fast: dict = {}
        self.fast_launches = getattr(driver, "launch_kernel", None) is not None   # see fast
        self._lock = threading.Lock()
        self._status = ctypes.c_int(0)         # cuStreamIsCapturing's answer, written with the lock held
        self._status_pointer = ctypes.pointer(self._status)

    def config(self, grid, block, shared_bytes, cluster=None, pdl: bool = False) -> LaunchConfig:
        """The checked LaunchConfig (cached per grid, block, shared_bytes, cluster shape and pdl)."""
        if pdl is not False:
            pdl_flag(pdl)                       # a bool (1 == True would find True's cached configuration)
        try:
            key = (grid, block, shared_bytes, cluster, True) if pdl else (grid, block, shared_bytes, cluster)
            cfg = self._configs.get(key)
        except TypeError:                       # a list for grid or block: not hashable, not cached
            key, cfg = None, None
        if cfg is None:
            cfg = make_config(grid, block, shared_bytes, max_threads_per_block=self.max_threads_per_block,
                              static_shared_bytes=self.static_shared_bytes, device=self.device, cluster=cluster,
                              registers=self.registers, name=self.name, pdl=pdl)
            if cfg.shared_bytes > self._opted_in_bytes and self._opt_in is not None:
                self._opt_in(cfg.shared_bytes)   # opt in above 48 KiB
                self._opted_in_bytes = cfg.shared_bytes
            if cluster_blocks(cfg.cluster) > PORTABLE_CLUSTER_BLOCKS and self._cluster_opt_in is not None:
                self._cluster_opt_in()           # once per kernel: then it is None
                self._cluster_opt_in = None
            if key is not None:
                if len(self._configs) >= self.MAX_CACHED:
                    self._configs.clear()
                self._configs[key] = cfg
        return cfg

    def plan(self, args: tuple) -> ArgPlan | None:
        """The ArgPlan for these arguments' types (made once per combination; None: marshal_args every time)."""
        types = tuple(map(type, args))
        plan = self._plans.get(types, False)
        if plan is False:
            plan = make_plan(self.params, types, self.device.index)
            if len(self._plans) >= self.MAX_CACHED:
                self._plans.clear()
            self._plans[types] = plan
        return plan

    def fast(self, cfg: LaunchConfig, types: tuple[type, ...]):
        """The generated launch function for `cfg` and arguments of exactly these types (made once per pair), or None
        where `run` handles these calls (types without a plan; a cluster shape or PDL where the driver has no raw
        cuLaunchKernelEx, `launch_kernel_ex`), or False where this path has no generated launches at all (a driver
        without the raw calls, `launch_kernel`). See _fast_source for what it does and when it hands the call back."""
        if not self.fast_launches:
            return False
        key = (cfg, types)
        fn = self._fast.get(key, False)
        if fn is False:
            fn = self._make_fast(cfg, types)
            if len(self._fast) >= self.MAX_CACHED:
                self._fast.clear()
            self._fast[key] = fn
        return fn

    def _make_fast(self, cfg: LaunchConfig, types: tuple[type, ...]):
        launch_ex = getattr(self.driver, "launch_kernel_ex", None) if cfg.launch_ex else None
        if cfg.launch_ex and launch_ex is None:
            return None
        code = _plan_code(self.params, types, self.device.index)
        if code is None:
            return None
        body, values, ns, torch_index, _ = code
        ns.update({f"T{i}": t for i, t in enumerate(types)})
        if cfg.launch_ex:
            # cuLaunchKernelEx's CUlaunchConfig with the cluster and/or PDL attribute, made once: each launch sets the
            # stream (with the lock held) and passes the same pointer. The attribute array lives as long as the function.
            config, attrs = cudriver.launch_config(cfg.grid, cfg.block, cfg.shared_bytes, 0, cfg.cluster, cfg.pdl)
            ns.update(LAUNCH_EX=launch_ex, CONFIG=config, CONFIG_P=ctypes.pointer(config), ATTRS=attrs)
        ns.update(FALLBACK_ERRORS=(_Fallback, TypeError, AttributeError, ValueError, OverflowError),
                  PACK_ERRORS=(struct.error, OverflowError), PACK=self._struct.pack_into, BUF=self._buffer,
                  BASE=self._base, LAUNCH=self.driver.launch_kernel, FN=self.function_handle, PARAMS=self.params_address or 0, ACQUIRE=self._lock.acquire,
                  RELEASE=self._lock.release, DEFER=DEFER_SYNC.get, BLOCKING=_BLOCKING, GETFRAME=sys._getframe,
                  APPEND=RECENT_LAUNCHES.append, INTERNAL=_INTERNAL_FILES,
                  NAME=self.name, CFG=cfg, CLEAR=RECENT_LAUNCHES.clear, CAPTURING=self.driver.stream_is_capturing,
                  STATUS=self._status, STATUS_P=self._status_pointer, SYNC=self.driver.stream_synchronize,
                  FAILED=functools.partial(self._failed, cfg), RAISE=functools.partial(self._raise, cfg),
                  STREAM_OF=stream_handle, DEFAULT_STREAM=(torch_stream_function() if torch_index is not None
                                                          else cupy_stream_function()))
        source = _fast_source(body, values, cfg, torch_index is not None)
        exec(compile(source, f"<kernellab launch {cfg} {types}>", "exec"), ns)
        fn = ns["launch"]
        fn.source = source
        return fn

    def _failed(self, cfg: LaunchConfig, error, stream: int) -> None:
        """A generated launch's failure (a CUresult, or what the launch function raised: CuPy's CUDADriverError has
        the CUresult as .status), with the lock held: for CUDA_ERROR_INVALID_CONTEXT (a thread new to CUDA) make the
        primary context current and launch again through the driver, else raise the LaunchError."""
        rc = getattr(error, "status", error)
        try:
            if rc != CUDA_ERROR_INVALID_CONTEXT:
                raise error if isinstance(error, BaseException) else self.driver.error(rc)
            self.driver.make_current(self.device.index)
            self.driver.launch(self.function_handle, cfg.grid, cfg.block, cfg.shared_bytes, stream,
                               self.params_address, self.device.index, **cfg.driver_kwargs())
        except Exception as exc:
            raise as_launch_error(exc, self.name, cfg, during="launch") from None

    def _raise(self, cfg: LaunchConfig, rc: int) -> None:
        """A generated launch's failed capture query or synchronisation: the LaunchError (a fault in the kernel)."""
        raise as_launch_error(self.driver.error(rc), self.name, cfg, during="run")

    def _pack_numpy(self, values: list) -> None:
        """marshal_args's NumPy values into the parameter buffer (the caller holds the lock)."""
        view = memoryview(self._buffer).cast("B")
        for off, v in zip(self.offsets, values):
            raw = v.tobytes()
            view[off:off + len(raw)] = raw

    def stream_for(self, args: tuple, plan: ArgPlan | None, stream) -> int:
        """The stream to launch on: `stream` as given, else torch's current stream where torch tensors are passed,
        else CuPy's."""
        if stream is not None:
            return stream_handle(stream)
        if plan is not None:
            if plan.torch_index is not None:
                return torch_stream_handle(self.device.index)
            return cupy_stream_handle()
        for x in args:
            if type(x).__module__.split(".")[0] == "torch" and getattr(x, "is_cuda", False):
                return torch_stream_handle(x.device.index)
        return cupy_stream_handle()

    def launch(self, grid, block, shared_bytes, args: tuple, *, stream=None, sync: bool | None = None,
               cluster=None, pdl: bool = False) -> None:
        """Check the configuration and the arguments, pack and launch (see run)."""
        self.run(self.config(grid, block, shared_bytes, cluster, pdl), args, stream, sync)

    def run(self, cfg: LaunchConfig, args: tuple, stream=None, sync: bool | None = None) -> None:
        """Check the arguments (the plan's pass, or marshal_args), pack them and launch with `cfg`; raise LaunchError
        for launch failures and, with sync, for faults in the kernel.

        A synchronous launch on a stream that is being captured into a CUDA graph (torch.cuda.graph) does not wait:
        the kernel is recorded, not run, and waiting would end the capture. A configuration with a cluster shape or
        PDL launches through cuLaunchKernelEx: by its generated launch (fast) where there is one for these argument
        types, as a launcher's `k[grid, block](...)` does for a plain launch."""
        if cfg.launch_ex:
            fast = self.fast(cfg, tuple(map(type, args)))
            if fast and fast(args, stream, sync):
                return
        plan = self.plan(args)
        values = checked = None
        if plan is not None:
            try:
                values = plan.check(*args)
            except (_Fallback, TypeError, AttributeError, ValueError, OverflowError):
                pass
        if values is None:                      # marshal_args decides: the precise error, or a rarer case
            checked, plan = marshal_args(self.params, args, self.device, self.signature), None
        handle = self.stream_for(args, plan, stream)
        with self._lock:
            if checked is None:
                try:
                    self._struct.pack_into(self._buffer, self._base, *values)
                except (struct.error, OverflowError):   # a float NumPy rounds to inf and struct refuses
                    checked = marshal_args(self.params, args, self.device, self.signature)
            if checked is not None:
                self._pack_numpy(checked)
            try:
                self.driver.launch(self.function_handle, cfg.grid, cfg.block, cfg.shared_bytes, handle,
                                   self.params_address, self.device.index, **cfg.driver_kwargs())
            except Exception as exc:
                raise as_launch_error(exc, self.name, cfg, during="launch") from None
        if resolve_sync(sync):
            try:
                if not self.driver.is_capturing(handle):
                    self.driver.synchronize(handle)
                    RECENT_LAUNCHES.clear()
            except Exception as exc:
                raise as_launch_error(exc, self.name, cfg, during="run") from None
        else:
            record_async(self.name, cfg)


def _fast_source(body: list[str], values: list[str], cfg: LaunchConfig, torch_stream: bool) -> str:
    """The source of one generated launch: launch(args, stream, sync, depth=1) -> True once launched (and waited for),
    False, having launched nothing, where the call is not for it (other types or count) or an argument fails a check
    (`run` then decides, through marshal_args's precise error where it is wrong). depth: how many frames up the
    no-wait record starts looking for the first frame outside kernellab (2 from _Launcher.__call__: no frame object
    is made for the launcher's own frame, which is kernellab's).

    Inline, in this order: the argument types, the plan's checks, the stream (torch's or CuPy's current one, else
    `stream=` as given), then with the lock held the packing into the parameter buffer, the raw cuLaunchKernel with
    the grid, block and shared bytes as constants (with a cluster shape or PDL: the stream set in the CUlaunchConfig
    made once, CONFIG, and the raw cuLaunchKernelEx), and for a synchronous launch the capture query; the lock released,
    the wait. A failed launch goes to FAILED (INVALID_CONTEXT's retry, the LaunchError), a failed query or wait to
    RAISE."""
    n = len(values)
    names = "".join(f"a{i}, " for i in range(n))
    unpack = [f"    {names} = args"] if n else ["    if args:", "        return False"]
    types = " or ".join(f"type(a{i}) is not T{i}" for i in range(n)) or "False"
    (gx, gy, gz), (bx, by, bz) = cfg.grid, cfg.block
    # ctypes returns the CUresult; CuPy's launchKernel returns None or raises (CUDADriverError, its .status the
    # CUresult); either way, and for a value the call refuses, FAILED decides.
    if cfg.launch_ex:    # cuLaunchKernelEx(&config, f, kernelParams, extra): grid, block and attributes in CONFIG
        call = ["        CONFIG.hStream = s", "        try:", "            rc = LAUNCH_EX(CONFIG_P, FN, PARAMS, None)"]
    else:
        call = ["        try:",
                f"            rc = LAUNCH(FN, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {cfg.shared_bytes}, s, PARAMS, 0)"]
    launch = call + ["        except Exception as exc:", "            rc = exc", "        if rc:",
                     "            FAILED(rc, s)"]
    lines = (["def launch(args, stream, sync, depth=1):", "    try:"] + ["    " + line for line in unpack]
             + ["    except (ValueError, TypeError):", "        return False",
                f"    if {types}:", "        return False", "    try:"]
             + [f"        {line}" for line in body]
             + [f"        v{i} = {v}" for i, v in enumerate(values)]
             + ["    except FALLBACK_ERRORS:", "        return False",
                f"    s = {'DEFAULT_STREAM(DEV)' if torch_stream else 'DEFAULT_STREAM()'} if stream is None "
                f"else STREAM_OF(stream)",
                "    if sync is None:", "        sync = BLOCKING[0]",
                "        wait = (not DEFER()) if sync is None else sync", "    else:", "        wait = sync",
                "    ACQUIRE()", "    try:", "        try:",
                f"            PACK(BUF, BASE, {', '.join(f'v{i}' for i in range(n))})",
                "        except PACK_ERRORS:", "            return False"]
             + launch
             + ["        if wait:", "            rc = CAPTURING(s, STATUS_P)", "            if rc:",
                "                RAISE(rc)", "            wait = not STATUS.value",
                "        else:",                     # record_async, inline: the first frame outside kernellab
                "            f = GETFRAME(depth)",   # the caller's (depth 1) or, from _Launcher.__call__, its caller's
                "            while f is not None and f.f_code.co_filename.startswith(INTERNAL):",
                "                f = f.f_back",
                "            APPEND((NAME, CFG, None, 0, None) if f is None else (NAME, CFG, f.f_code, f.f_lasti))",
                "    finally:", "        RELEASE()",
                "    if wait:", "        rc = SYNC(s)", "        if rc:", "            RAISE(rc)",
                "        CLEAR()",
                "    return True"])
    return "\n".join(lines) + "\n"


def launch_values(function_handle: int, config: LaunchConfig, values: list, stream: int, device_index: int = 0,
                  driver=None) -> None:
    """Launch with marshal_args-style values (NumPy scalars, a tensor map's bytes) through run/launch/cudriver.py:
    cuLaunchKernel, or cuLaunchKernelEx where `config` has a cluster shape or PDL (a worker's launches)."""
    if driver is None:
        driver = cudriver.driver()
    held = [np.ascontiguousarray(v) for v in values]        # each value's bytes, alive until the launch returns
    pointers = (ctypes.c_void_p * max(1, len(held)))(*[h.ctypes.data for h in held])
    driver.launch(int(function_handle), config.grid, config.block, config.shared_bytes, int(stream),
                  ctypes.addressof(pointers) if held else None, device_index, **config.driver_kwargs())


def as_launch_error(exc, kernel_name, config, during, job=None, why: str = "") -> LaunchError:
    """A driver error during a launch as a LaunchError: what failed, the launch's configuration, what to do next
    (`why`, where known, says what in the launch caused it)."""
    text = str(exc)
    if is_sticky(exc):
        msg = (f"{kernel_name} faulted while running ({text}) with {config}. This error is sticky: the CUDA context "
               f"of this process is lost, and every later CUDA call here (CuPy and torch alike) will fail. Save what "
               f"you need and restart the notebook kernel. To see the faulting line now, from this session: "
               f"`kernellab.run.nvtools.sanitize.sanitize_last()` re-runs this launch (same shapes and scalars, tensors "
               f"zero-filled) under compute-sanitizer in a new process. After the restart, "
               f"`{kernel_name}.sanitize({config.grid}, {config.block}, *args)` runs it on your data, and "
               f"`{kernel_name}[grid, block](*args, isolate=True)` (or `%config KernellabRun.isolate = True`) keeps "
               f"faults out of this process." + (unwaited_note() if during == "run" else ""))
        return LaunchError(msg, sticky=True, cuda_error=text, job=job)
    hint = ""
    if "OUT_OF_RESOURCES" in text or "TooManyResources" in text:
        hint = " The block asks for more registers or shared memory than an SM has: use fewer threads per block."
    if why:
        hint += " " + why
    if during == "run":
        hint += unwaited_note()
    return LaunchError(f"{kernel_name} failed at {during} ({text}) with {config}.{hint}", sticky=False,
                       cuda_error=text, job=job)
