"""A kernel job: one launch as a serializable value that runs in-process, in a worker, under ncu or compute-sanitizer.

A `KernelJob` holds everything a fresh process needs to repeat a launch: the backend, the source (for line
numbers), the compiled image (cubin, or PTX for Numba) or the compile options to rebuild it, the kernel's symbol,
grid, block, dynamic shared memory, and the arguments as `ArgSpec`s: tensors saved with their data, tensors to
regenerate from a fill spec, tensors shared through a CUDA IPC handle, tensors staged in one of the worker's own
buffers (the caller copies them in and out on the GPU), scalars with their exact C type.

The wire and file format is `to_bytes()`: an 8-byte magic, the header length, a JSON header and the tensors' bytes
after it. No pickle: a job file is safe to load. `python -m kernellab.run.launch.job JOBFILE [--out RESULTFILE]` runs one
job and writes a `JobResult`; that is what compute-sanitizer and ncu run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ...analysis.arch import DEFAULT_ARCH, normalize_arch
from ...compile.cubin import read_cubin
from ...compile.nvrtc import compile_cached
from ...compile.signature import Param
from ...errors import ArgumentError, KernellabError
from .launch import (PORTABLE_CLUSTER_BLOCKS, LaunchConfig, allow_dynamic_shared, allow_large_clusters, cluster_blocks,
                     cluster_dims, is_sticky, launch_dims, launch_values, scalar_of, tensor_map_of)
from .tensor_map import TensorMap, encode_for_job

JOB_MAGIC = b"KLJOB01\n"
RESULT_MAGIC = b"KLRES01\n"
FORMAT_VERSION = 1

# Element sizes of the dtypes kernellab passes to kernels; bfloat16 travels as raw 16-bit words.
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
            "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
FILLS = ("zeros", "ones", "full", "arange", "randn", "rand", "empty")


def storage_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that holds `dtype`'s bits (bfloat16 as uint16)."""
    return np.dtype("uint16" if dtype == "bfloat16" else dtype)


# --- arguments ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument: a tensor (data, fill spec or IPC handle), a scalar of an exact C type, or a null pointer."""

    kind: str                          # "tensor", "scalar" or "null"
    name: str = ""                     # the parameter's name, for messages
    dtype: str = ""                    # "float32", "bfloat16", "int32", ... (element type for tensors)
    shape: tuple[int, ...] = ()
    value: int | float | bool | None = None  # scalars: the value as passed (bfloat16: its 16-bit pattern)
    data: bytes | None = field(default=None, repr=False)  # tensors: the elements in C order
    fill: str | None = None            # tensors without data: one of FILLS
    fill_value: float = 0.0            # for fill="full"
    seed: int = 0                      # for fill="randn"/"rand"
    writes: bool = True                # a non-const pointer: its contents come back after the launch
    ipc_handle: bytes | None = field(default=None, repr=False)  # the allocation's cudaIpcMemHandle (shared)
    ipc_offset: int = 0                # bytes from the allocation's base to the tensor's first element
    stage_slot: int | None = None      # staged: the worker's staging buffer that holds it (see stage_buffers)
    tensor_map: dict | None = None     # a CUtensorMap over this tensor: the worker encodes it (TensorMap.job_params)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE.get(self.dtype, 1)

    @property
    def shared(self) -> bool:
        return self.ipc_handle is not None

    @property
    def staged(self) -> bool:
        return self.stage_slot is not None

    def describe(self) -> str:
        """'c: float32[4096]' or 'n = 4096'."""
        if self.kind == "scalar":
            return f"{self.name} = {self.value!r}" if self.name else repr(self.value)
        if self.kind == "null":
            return f"{self.name}: null" if self.name else "null"
        dims = ", ".join(map(str, self.shape))
        how = ("shared" if self.shared else "staged" if self.staged else
               "data" if self.data is not None else (self.fill or "empty"))
        what = f"{self.dtype}[{dims}]"
        if self.tensor_map:
            what = f"CUtensorMap over {what}, box [{', '.join(map(str, self.tensor_map['box']))}]"
        return f"{self.name + ': ' if self.name else ''}{what} ({how})"

    def host_array(self) -> np.ndarray:
        """This tensor's elements as a host array in its storage dtype (bfloat16 as uint16): data, or the fill."""
        if self.kind != "tensor":
            raise KernellabError(f"argument {self.name or '?'} is a {self.kind}, not a tensor")
        st = storage_dtype(self.dtype)
        if self.data is not None:
            if len(self.data) != self.nbytes:
                raise KernellabError(f"argument {self.name}: {len(self.data)} bytes of data for {self.describe()}, "
                                     f"expected {self.nbytes}")
            return np.frombuffer(self.data, dtype=st).reshape(self.shape).copy()
        fill = self.fill or "empty"
        if fill in ("zeros", "empty"):
            return np.zeros(self.shape, dtype=st)
        if fill == "ones":
            values = np.ones(self.shape, dtype=np.float64)
        elif fill == "full":
            values = np.full(self.shape, self.fill_value, dtype=np.float64)
        elif fill == "arange":
            values = np.arange(self.numel, dtype=np.float64).reshape(self.shape)
        elif fill in ("randn", "rand"):
            rng = np.random.default_rng(self.seed)
            values = rng.standard_normal(self.shape) if fill == "randn" else rng.random(self.shape)
        else:
            raise KernellabError(f"argument {self.name}: unknown fill {fill!r}; expected one of {', '.join(FILLS)}")
        return _from_float64(values, self.dtype)


def _from_float64(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        bits = values.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16     # round to nearest even
        out = rounded.astype(np.uint16)
        out[np.isnan(values)] = 0x7FC0
        return out
    return values.astype(np.dtype(dtype))


def tensor_spec(x, name: str = "", *, writes: bool = True, data: str = "copy") -> ArgSpec:
    """An ArgSpec for a torch tensor, CuPy array or NumPy array: with its bytes (data='copy') or zero-filled ('shapes')."""
    dtype, shape = _dtype_name(x), tuple(int(s) for s in x.shape)
    if data == "shapes":
        return ArgSpec("tensor", name, dtype, shape, fill="zeros", writes=writes)
    return ArgSpec("tensor", name, dtype, shape, data=_tensor_bytes(x), writes=writes)


def tensor_of(x):
    """The tensor behind an argument: a TensorMap's tensor, else the argument itself."""
    return x.tensor if isinstance(x, TensorMap) else x


def _framework(x) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "cupy") or isinstance(x, np.ndarray):
        return mod if mod in ("torch", "cupy") else "numpy"
    return "cai" if hasattr(x, "__cuda_array_interface__") else ""


def _dtype_name(x) -> str:
    if _framework(x) == "torch":
        return str(x.dtype).replace("torch.", "")
    if _framework(x) == "cai":
        return str(np.dtype(x.__cuda_array_interface__["typestr"]))
    return str(x.dtype)


def _tensor_bytes(x) -> bytes:
    """The elements of a contiguous tensor, copied to the host."""
    fw = _framework(x)
    if fw == "torch":
        import torch

        t = x.detach().contiguous().reshape(-1)
        return t.view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b""
    if fw == "cupy":
        import cupy

        return cupy.ascontiguousarray(x).get().tobytes()
    if fw == "numpy":
        return np.ascontiguousarray(x).tobytes()
    if fw == "cai":
        import cupy

        return cupy.asarray(x).get().tobytes()
    raise ArgumentError(f"cannot read the data of a {type(x).__name__}")


def device_pointer(x) -> int | None:
    """The device address of a CUDA tensor, or None for host data."""
    fw = _framework(x)
    if fw == "torch":
        return int(x.data_ptr()) if x.is_cuda else None
    if fw == "cupy":
        return int(x.data.ptr)
    if fw == "cai":
        return int(x.__cuda_array_interface__["data"][0])
    return None


# --- CUDA IPC: lending a caller's allocation to a worker -------------------------------------------------------

SHARE_SLACK_BYTES = 1 << 20   # torch and CuPy do not split a cached block whose remainder is at most 1 MiB


def _size_text(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes >= 2**20 else f"{nbytes:,} bytes"


def _address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the CUDA allocation holding device address `ptr` (cuMemGetAddressRange)."""
    from cuda.bindings import driver

    err, base, size = driver.cuMemGetAddressRange(ptr)
    if int(err) != 0:
        name = getattr(err, "name", None) or str(err)
        raise RuntimeError(f"{name} ({int(err)})")
    return int(base), int(size)


def _ipc_get_handle(base: int) -> bytes:
    """The cudaIpcMemHandle (64 bytes) of the allocation starting at `base`."""
    import cupy

    return bytes(cupy.cuda.runtime.ipcGetMemHandle(base))


def lend(x, *, disabled: str | None = None) -> tuple[bytes, int] | str:
    """(handle, offset) to share `x`'s memory with another process, or the reason it cannot be shared (a str).

    Safe means: `x` is a CUDA tensor that starts its allocation and fills it up to SHARE_SLACK_BYTES, so a kernel
    that writes out of bounds in the worker cannot reach another of the caller's tensors. `disabled` is the reason
    to copy a tensor that could be lent, without trying (CUDA IPC failed earlier in this session).
    """
    ptr = device_pointer(x)
    if ptr is None:
        return "it is host memory"
    nbytes = math.prod(x.shape) * ITEMSIZE.get(_dtype_name(x), 1)
    try:
        base, size = _address_range(ptr)
    except Exception as exc:  # no cuda.bindings, a pointer the driver does not know
        return f"cuMemGetAddressRange failed on its address ({type(exc).__name__}: {exc})"
    if base != ptr:
        return (f"it starts {_size_text(ptr - base)} into a {_size_text(size)} allocation that holds other data (a "
                f"view, or a block carved from a caching allocator's segment); lending it would let the worker's "
                f"kernel reach that data")
    if size < nbytes:
        return (f"its {_size_text(nbytes)} span more than one allocation (the first is {_size_text(size)}): "
                f"memory mapped piecewise, e.g. torch's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                f"expandable_segments:True), which cudaIpcGetMemHandle cannot export")
    if size - nbytes > SHARE_SLACK_BYTES:
        return (f"its allocation is {_size_text(size)} for {_size_text(nbytes)} of data (a caching allocator's "
                f"segment shared with other tensors); lending it would let the worker's kernel reach them")
    if disabled:
        return disabled
    try:
        handle = _ipc_get_handle(base)
    except Exception as exc:  # a VMM or cudaMallocAsync allocation, a platform without IPC
        return (f"cudaIpcGetMemHandle failed ({type(exc).__name__}: {exc}); memory from cudaMallocAsync pools or "
                f"VMM (torch's expandable segments) cannot be exported this way")
    return handle, ptr - base


def ipc_export(x) -> tuple[bytes, int] | None:
    """(handle, offset) to share `x`'s memory with another process, or None where sharing would not be safe
    (`lend` says why)."""
    lent = lend(x)
    return None if isinstance(lent, str) else lent


# --- the job ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelImage:
    """A compiled kernel as a value (Kernel.image()): what a job needs of it, to check arguments and load it anew."""

    symbol: str                        # the entry's name in the image (mangled for C++ kernels)
    name: str                          # for messages: the kernel's short name
    signature: str                     # the C signature, for messages
    params: tuple[Param, ...]          # how each argument is checked and passed
    arch: str
    backend: str = "cuda"              # "cuda" or "numba"
    static_shared_bytes: int = 0
    registers: int = 0                 # per thread, ptxas's count for `arch` (0: unknown): the launch checks
    max_threads_per_block: int = 1024  # its launch bounds, registers and arch allow
    source: str = ""                   # the rest: how a fresh process loads it (KernelJob's fields of the same names)
    options: tuple[str, ...] = ()
    first_line: int = 1
    filename: str = "kernel.cu"
    image: bytes | None = field(default=None, repr=False)
    image_format: str | None = None
    abi: str = "c"


@dataclass(frozen=True)
class KernelJob:
    """One launch of one kernel, with its arguments: serializable with to_bytes() and runnable anywhere."""

    symbol: str                        # the entry's name in the image (mangled for C++ kernels)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[ArgSpec, ...]
    source: str = ""                   # for line numbers and excerpts; compiled when there is no image
    backend: str = "cuda"              # "cuda" (C++ through NVRTC) or "numba"
    name: str = ""                     # for messages: the kernel's short name
    signature: str = ""                # the C signature, for messages
    arch: str = DEFAULT_ARCH
    options: tuple[str, ...] = ()      # the user's NVRTC options (kernellab adds -lineinfo and the arch)
    shared_bytes: int = 0              # dynamic shared memory per block
    static_shared_bytes: int = 0
    first_line: int = 1                # the number of the source's first line (2 in a %%cuda cell)
    filename: str = "kernel.cu"        # the name line numbers refer to ("cell.cu" for %%cuda cells)
    image: bytes | None = field(default=None, repr=False)  # the compiled module; None: compile `source`
    image_format: str | None = None    # "cubin" or "ptx"
    device: int | None = None          # the GPU ordinal to run on (None: the current one)
    abi: str = "c"                     # "c": one value per parameter; "numba": arrays as Numba's struct members
    cluster: tuple[int, int, int] | None = None  # thread-block cluster shape (cuLaunchKernelEx); None: none

    @property
    def label(self) -> str:
        return self.name or self.symbol

    @property
    def threads(self) -> int:
        return math.prod(self.grid) * math.prod(self.block)

    def describe(self) -> str:
        """'vadd[(16, 1, 1), (256, 1, 1)](a: float32[4096] (data), ..., n = 4096)'."""
        cfg = f"{self.grid}, {self.block}" + (f", {self.shared_bytes}" if self.shared_bytes else "")
        cfg += f", cluster={self.cluster}" if self.cluster else ""
        return f"{self.label}[{cfg}]({', '.join(a.describe() for a in self.args)})"

    def __str__(self) -> str:
        return f"KernelJob {self.describe()} [{self.backend}, {self.arch}]"

    def line(self, number: int) -> str | None:
        """The text of source line `number` (numbered as the user sees it), or None."""
        lines = self.source.splitlines()
        idx = number - self.first_line
        return lines[idx] if 0 <= idx < len(lines) else None

    def with_data(self) -> "KernelJob":
        """This job without IPC handles or staging: fill specs stay; shared and staged tensors become zero-filled
        (their data stayed on the GPU)."""
        args = tuple(replace(a, ipc_handle=None, ipc_offset=0, stage_slot=None, fill=a.fill or "zeros")
                     if a.shared or a.staged else a for a in self.args)
        return replace(self, args=args)

    # -- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_launch(cls, kernel: KernelImage, grid, block, args, shared_bytes: int = 0, *, data: str = "copy",
                    share_min_bytes: int | None = None, device: int | None = None, not_shared: dict | None = None,
                    share_disabled: str | None = None, stage_min_bytes: int | None = None,
                    stage_disabled: str | None = None, not_staged: dict | None = None,
                    cluster=None) -> "KernelJob":
        """The job for kernel[grid, block](*args), `kernel` being a compiled kernel's KernelImage (Kernel.job builds
        jobs this way, after the checks a launch makes).

        data='copy' saves every tensor's elements (host or device); 'shapes' keeps shapes and dtypes only and
        fills with zeros (for a launch whose data is unreachable, e.g. after a sticky fault); 'share' lends
        CUDA tensors of at least `share_min_bytes` through CUDA IPC where that is safe (see `lend`), stages the
        other CUDA tensors of at least `stage_min_bytes` (None: none) in the worker's own buffers, and copies the
        rest. `not_shared` (a dict) receives {name: why} for each tensor of `share_min_bytes` or more that is not
        lent, and `share_disabled` is the reason to copy those that could be lent (IPC failed earlier);
        `not_staged` receives {name: stage_disabled} for each tensor that would be staged but is copied because
        staging is disabled. Staged tensors get slot numbers 0, 1, ... in order, one per distinct (address, size),
        so a tensor passed twice is staged once; the worker pool maps them to its buffers (StagingPlan). Arguments
        are checked against the signature as Kernel.launch does.

        A tensor map travels as its tensor (copied, lent or staged like any other) plus how to encode it: the worker
        builds the same map over its own view of the tensor, since the map's address is only valid in the process
        that made it. That needs a C-contiguous tensor. The tensor comes back after the launch (TMA may store).
        """
        if data not in ("copy", "shapes", "share"):
            raise ValueError(f"data must be 'copy', 'shapes' or 'share', got {data!r}")
        params = kernel.params
        if len(args) != len(params):
            raise ArgumentError(f"{kernel.signature} takes {len(params)} argument{'s' if len(params) != 1 else ''}, "
                                f"got {len(args)}")
        specs = []
        stage_keys: dict[tuple[int, int], int] = {}
        for pos, (p, x) in enumerate(zip(params, args)):
            tmap = None
            if getattr(p, "tensor_map", False):
                tensor_map_of(p, x, None, pos)                  # a TensorMap, or the error a launch gives
                if not x.contiguous:
                    raise ArgumentError(
                        f"argument {pos} ('{p.name}'): {x.describe()} maps a tensor that is not C-contiguous "
                        f"(strides {x.strides_bytes} bytes); a launch in another process (isolate=True, sanitize, "
                        f"profile) rebuilds the map over a copy of the tensor, which is supported for contiguous "
                        f"tensors only so far: map a contiguous tensor, or launch in this process")
                tmap, x = x, x.tensor
            elif not p.pointer:
                v = scalar_of(p, x, pos)
                specs.append(ArgSpec("scalar", p.name, p.dtype or "", value=v.item()))
                continue
            if x is None:
                specs.append(ArgSpec("null", p.name))
                continue
            if not _framework(x):
                raise ArgumentError(f"argument {pos} ('{p.name}', {p.ctype}) is a pointer parameter but got a "
                                    f"{type(x).__name__}; pass a CUDA torch tensor, a CuPy array or None")
            dt = _dtype_name(x)
            if tmap is None and p.dtype is not None and dt != p.dtype:
                raise ArgumentError(f"argument {pos} ('{p.name}', {p.ctype}) expects {p.dtype} elements but got "
                                    f"{dt}; convert it or change the parameter type")
            writes = not p.const or tmap is not None
            name = p.name or f"argument {pos}"
            nbytes = math.prod(x.shape) * ITEMSIZE.get(dt, 1)
            lent = slot = None
            if data == "share" and share_min_bytes is not None and nbytes >= share_min_bytes:
                lent = lend(x, disabled=share_disabled)
                if isinstance(lent, str):
                    if not_shared is not None:
                        not_shared[name] = lent
                    lent = None
            if data == "share" and lent is None and stage_min_bytes is not None and nbytes >= max(stage_min_bytes, 1):
                ptr = device_pointer(x)
                if ptr is not None and stage_disabled:
                    if not_staged is not None:
                        not_staged[name] = stage_disabled
                elif ptr is not None:
                    slot = stage_keys.setdefault((ptr, nbytes), len(stage_keys))
            if lent is not None:
                specs.append(ArgSpec("tensor", p.name, dt, tuple(int(s) for s in x.shape), writes=writes,
                                     ipc_handle=lent[0], ipc_offset=lent[1]))
            elif slot is not None:
                specs.append(ArgSpec("tensor", p.name, dt, tuple(int(s) for s in x.shape), writes=writes,
                                     stage_slot=slot))
            else:
                specs.append(tensor_spec(x, p.name, writes=writes, data="shapes" if data == "shapes" else "copy"))
            if tmap is not None:
                specs[-1] = replace(specs[-1], tensor_map=tmap.job_params())
        if kernel.abi == "numba":
            for p, spec in zip(params, specs):
                if p.pointer and spec.kind == "null":
                    raise ArgumentError(f"{p.name} is a Numba array parameter and cannot be None")
        return cls(symbol=kernel.symbol, grid=launch_dims(grid, "grid"), block=launch_dims(block, "block"),
                   args=tuple(specs), backend=kernel.backend, name=kernel.name, signature=kernel.signature,
                   arch=kernel.arch, shared_bytes=int(shared_bytes), static_shared_bytes=kernel.static_shared_bytes,
                   device=device, cluster=cluster_dims(cluster, launch_dims(grid, "grid")), source=kernel.source,
                   options=kernel.options, first_line=kernel.first_line, filename=kernel.filename,
                   image=kernel.image, image_format=kernel.image_format, abi=kernel.abi)

    # -- serialization --------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The job as bytes: magic, header length, JSON header, then the tensors' data and the image."""
        blobs: list[bytes] = []

        def blob(b: bytes | None):
            if b is None:
                return None
            blobs.append(b)
            return len(blobs) - 1

        head = {"version": FORMAT_VERSION, "symbol": self.symbol, "grid": list(self.grid), "block": list(self.block),
                "source": self.source, "backend": self.backend, "name": self.name, "signature": self.signature,
                "arch": self.arch, "options": list(self.options), "shared_bytes": self.shared_bytes,
                "static_shared_bytes": self.static_shared_bytes, "first_line": self.first_line,
                "filename": self.filename, "image": blob(self.image), "image_format": self.image_format,
                "device": self.device, "abi": self.abi, "cluster": list(self.cluster) if self.cluster else None,
                "args": [{"kind": a.kind, "name": a.name, "dtype": a.dtype, "shape": list(a.shape), "value": a.value,
                          "data": blob(a.data), "fill": a.fill, "fill_value": a.fill_value, "seed": a.seed,
                          "writes": a.writes, "ipc_handle": a.ipc_handle.hex() if a.ipc_handle else None,
                          "ipc_offset": a.ipc_offset, "stage_slot": a.stage_slot, "tensor_map": a.tensor_map}
                         for a in self.args]}
        return _pack(JOB_MAGIC, head, blobs)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "KernelJob":
        head, blob = _unpack(JOB_MAGIC, raw, "kernel job")
        args = tuple(ArgSpec(kind=a["kind"], name=a["name"], dtype=a["dtype"], shape=tuple(a["shape"]),
                             value=a["value"], data=blob(a["data"]), fill=a["fill"], fill_value=a["fill_value"],
                             seed=a["seed"], writes=a["writes"],
                             ipc_handle=bytes.fromhex(a["ipc_handle"]) if a["ipc_handle"] else None,
                             ipc_offset=a["ipc_offset"], stage_slot=a.get("stage_slot"),
                             tensor_map=a.get("tensor_map")) for a in head["args"])
        return cls(symbol=head["symbol"], grid=tuple(head["grid"]), block=tuple(head["block"]), args=args,
                   source=head["source"], backend=head["backend"], name=head["name"], signature=head["signature"],
                   arch=head["arch"], options=tuple(head["options"]), shared_bytes=head["shared_bytes"],
                   static_shared_bytes=head["static_shared_bytes"], first_line=head["first_line"],
                   filename=head["filename"], image=blob(head["image"]), image_format=head["image_format"],
                   device=head["device"], abi=head.get("abi", "c"),
                   cluster=tuple(head["cluster"]) if head.get("cluster") else None)

    def save(self, path) -> str:
        """Write the job to `path` (atomically) and return the path."""
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(self.to_bytes())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path) -> "KernelJob":
        with open(path, "rb") as fh:
            return cls.from_bytes(fh.read())


@dataclass(frozen=True)
class JobResult:
    """What running a job produced: a status, the written arguments' bytes, timing, notes and captured output."""

    status: str                        # "ok", "fault" (sticky CUDA error), "launch_error", "error",
                                       # "timeout" or "crashed" (the last two are made by the caller)
    message: str = ""
    cuda_error: str | None = None
    poisoned: bool = False             # the process's CUDA context is unusable: the worker must be replaced
    outputs: tuple[tuple[int, bytes], ...] = field(default=(), repr=False)  # (argument index, bytes) per copy-back
    kernel_ms: float | None = None     # CUDA events around the launch
    notes: tuple[str, ...] = ()        # e.g. NaN found in an output
    stdout: str = ""                   # the process's output during the job (device printf included)
    pid: int | None = None
    device: str = ""
    # wall-clock times (time.time()) of the job's moments: "module loaded" (the CUDA context made, the kernel's module
    # loaded), "kernel start", "kernel end" and, from the command line (under compute-sanitizer), "process start" and
    # "job ready" (Python, kernellab and the job file loaded): where a tool's run spends its time (ToolCost)
    marks: tuple[tuple[str, float], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def output(self, index: int) -> bytes | None:
        return dict(self.outputs).get(index)

    def to_bytes(self) -> bytes:
        blobs = [b for _, b in self.outputs]
        head = {"version": FORMAT_VERSION, "status": self.status, "message": self.message,
                "cuda_error": self.cuda_error, "poisoned": self.poisoned,
                "outputs": [i for i, _ in self.outputs], "kernel_ms": self.kernel_ms, "notes": list(self.notes),
                "stdout": self.stdout, "pid": self.pid, "device": self.device, "marks": [list(m) for m in self.marks]}
        return _pack(RESULT_MAGIC, head, blobs)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "JobResult":
        head, blob = _unpack(RESULT_MAGIC, raw, "job result")
        return cls(status=head["status"], message=head["message"], cuda_error=head["cuda_error"],
                   poisoned=head["poisoned"], outputs=tuple((i, blob(k)) for k, i in enumerate(head["outputs"])),
                   kernel_ms=head["kernel_ms"], notes=tuple(head["notes"]), stdout=head["stdout"], pid=head["pid"],
                   device=head["device"], marks=tuple((str(k), float(t)) for k, t in head.get("marks", ())))


def _pack(magic: bytes, head: dict, blobs: list[bytes]) -> bytes:
    head = dict(head, blobs=[len(b) for b in blobs])
    text = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([magic, struct.pack("<Q", len(text)), text, *blobs])


def _unpack(magic: bytes, raw: bytes, what: str):
    if raw[:len(magic)] != magic:
        raise KernellabError(f"not a kernellab {what}: it starts with {raw[:8]!r}, expected {magic!r} "
                             f"(written by a different kernellab version?)")
    (n,) = struct.unpack_from("<Q", raw, len(magic))
    start = len(magic) + 8
    head = json.loads(raw[start:start + n])
    if head.get("version") != FORMAT_VERSION:
        raise KernellabError(f"{what} format version {head.get('version')}, this kernellab reads {FORMAT_VERSION}")
    offsets, pos = [], start + n
    for size in head["blobs"]:
        offsets.append((pos, pos + size))
        pos += size
    if pos != len(raw):
        raise KernellabError(f"{what} is truncated or padded: {len(raw)} bytes, the header describes {pos}")
    mem = memoryview(raw)

    def blob(index):
        if index is None:
            return None
        a, b = offsets[index]
        return bytes(mem[a:b])

    return head, blob


# --- running a job (on a GPU, through CuPy) --------------------------------------------------------------------


def job_image(job: KernelJob) -> tuple[bytes, str]:
    """(image, 'cubin' | 'ptx'): the job's own image, or its source compiled with NVRTC through the compile cache."""
    if job.image is not None:
        return job.image, job.image_format or "cubin"
    if job.backend != "cuda" or not job.source:
        raise KernellabError(f"job {job.label} has no compiled image and no CUDA C++ source to compile")

    output, _ = compile_cached(job.source, job.arch, job.options, filename=job.filename, first_line=job.first_line)
    return output.cubin, "cubin"


def init_worker(device: int | None = None) -> dict:
    """Create this process's CUDA context on `device` and describe it (called once when a worker starts)."""
    import cupy

    if device is not None:
        cupy.cuda.Device(device).use()
    cupy.empty(1, dtype=cupy.uint8)          # creates the context now, not at the first launch
    index = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(index)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"device": name, "index": index, "arch": normalize_arch((props['major'], props['minor'])), "pid": os.getpid()}


def run_job(job: KernelJob, state: dict | None = None, *, scan: bool = True) -> JobResult:
    """Run `job` on this process's GPU and return its result; never raises for CUDA errors.

    `state` carries loaded modules and the staging buffers between jobs of one worker; allocations opened through
    CUDA IPC are closed when the job ends (close_ipc). `scan` counts NaN and Inf in the outputs, staged and shared
    ones included (it launches a few CuPy kernels, so the tool runs leave it off).

    Every step (uploads, the launch, the scan, downloads) runs on one stream, the job's: CuPy copies and kernels go
    to the *current* stream, and the legacy default stream does not order work on a non-blocking stream, so an
    upload left there may still be in flight when the kernel starts (it then reads the previous job's memory).
    """
    state = {} if state is None else state
    try:
        return _run_job(job, state, scan)
    finally:
        close_ipc(state)


def _run_job(job: KernelJob, state: dict, scan: bool) -> JobResult:
    try:
        import cupy

        if job.device is not None and cupy.cuda.runtime.getDevice() != job.device:
            cupy.cuda.Device(job.device).use()
        fn = _function(job, state)
    except Exception as exc:
        return _failure(job, exc, "loading the kernel")
    marks = [("module loaded", time.time())]
    stream = state.get("stream")
    if stream is None:
        stream = state["stream"] = cupy.cuda.Stream(non_blocking=True)
    with stream:
        try:
            arrays, values = _materialize(job, state, stream)
        except Exception as exc:
            return _failure(job, exc, "preparing the arguments")
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        marks.append(("kernel start", time.time()))
        try:
            start.record(stream)
            if job.cluster:                  # cuLaunchKernelEx with the cluster shape, through run/launch/cudriver.py
                launch_values(fn.ptr, LaunchConfig(job.grid, job.block, job.shared_bytes, job.cluster), values,
                              stream.ptr, cupy.cuda.runtime.getDevice())
            else:
                fn(job.grid, job.block, tuple(values), shared_mem=job.shared_bytes, stream=stream)
            stop.record(stream)
            stream.synchronize()
            marks.append(("kernel end", time.time()))
        except Exception as exc:
            return _failure(job, exc, "running")
        kernel_ms = cupy.cuda.get_elapsed_time(start, stop)
        outputs, notes = [], []
        try:
            for i, (spec, arr) in enumerate(zip(job.args, arrays)):
                if arr is None or not spec.writes:
                    continue
                if scan and spec.dtype in ("float16", "bfloat16", "float32", "float64"):
                    note = nonfinite_note(spec, arr, cupy)
                    if note:
                        notes.append(note)
                if not (spec.shared or spec.staged):       # those were written in place
                    outputs.append((i, arr.get(stream=stream)))
            stream.synchronize()
            outputs = [(i, host.tobytes()) for i, host in outputs]
        except Exception as exc:
            return _failure(job, exc, "reading the outputs")
    _trim_pool(cupy)
    return JobResult("ok", outputs=tuple(outputs), kernel_ms=kernel_ms, notes=tuple(notes), pid=os.getpid(),
                     device=state.get("device_name", ""), marks=tuple(marks))


def run_in_process(job: KernelJob) -> JobResult:
    """Run `job` in this process (a fault here poisons this process's context: prefer a worker)."""
    return run_job(job, {})


def _function(job: KernelJob, state: dict):
    import cupy

    image, fmt = job_image(job)
    key = (hash(image), job.symbol, job.device)
    cache = state.setdefault("functions", {})
    fn = cache.get(key)
    if fn is None:
        mod = cupy.cuda.function.Module()
        mod.load(image + b"\0" if fmt == "ptx" and not image.endswith(b"\0") else image)
        fn = mod.get_function(job.symbol)
        state.setdefault("modules", []).append(mod)          # keep the module loaded
        if len(cache) > 256:
            cache.clear()
        cache[key] = fn
    if job.shared_bytes + job.static_shared_bytes > 48 * 1024:
        allow_dynamic_shared(fn, job.shared_bytes)            # opt in above 48 KiB

    compiled = None
    if fmt == "cubin":                                        # __cluster_dims__ in the image

        facts = read_cubin(image).get(job.symbol)
        compiled = facts.cluster_dims if facts else None
    if max(cluster_blocks(job.cluster), cluster_blocks(compiled)) > PORTABLE_CLUSTER_BLOCKS:
        allow_large_clusters(fn)                              # opt in to clusters of 9-16 blocks
    return fn


def _materialize(job: KernelJob, state: dict, stream=None):
    """Device arrays (None for scalars and nulls) and the launch values, in argument order; uploads go to `stream`.

    In the C ABI each argument is one value (a tensor its address); in Numba's, a tensor is its array struct's
    members (numba_array_values)."""
    import cupy

    arrays, values = [], []
    for spec in job.args:
        if spec.kind == "scalar":
            arrays.append(None)
            values.append(scalar_value(spec))
        elif spec.kind == "null":
            arrays.append(None)
            values.append(np.uint64(0))
        else:
            arr, ptr = _tensor_on_device(cupy, spec, state, stream)
            arrays.append(arr)
            if spec.tensor_map is not None:
                values.append(encode_for_job(spec, ptr, job.device))
            else:
                values.extend(numba_array_values(spec, ptr) if job.abi == "numba" else [np.uint64(ptr)])
    return arrays, values


def _tensor_on_device(cupy, spec: ArgSpec, state: dict, stream):
    """(device array, its address) for a tensor argument: opened through IPC, in a staging buffer, or uploaded."""
    if spec.shared:
        try:
            ptr = _ipc_open(state, spec.ipc_handle) + spec.ipc_offset
        except Exception as exc:
            raise IpcUnavailable(f"CUDA IPC is not available here ({type(exc).__name__}: {exc})") from None
        return _device_view(cupy, ptr, spec), ptr
    if spec.staged:
        ptr, capacity = state.get("staging", {}).get(spec.stage_slot, (None, 0))
        if ptr is None or capacity < spec.nbytes:
            have = f"holds {capacity:,} bytes" if ptr is not None else "does not exist"
            raise KernellabError(f"argument {spec.name or '?'} ({spec.nbytes:,} bytes) is staged in buffer "
                                 f"{spec.stage_slot} of this worker, which {have}: the caller's view of the "
                                 f"staging buffers is out of date")
        return _device_view(cupy, ptr, spec), ptr
    st = storage_dtype(spec.dtype)
    arr = cupy.empty(spec.shape, dtype=st)
    if spec.data is not None:
        arr.set(np.frombuffer(spec.data, dtype=st).reshape(spec.shape), stream=stream)
    elif (spec.fill or "empty") != "empty":
        arr.set(spec.host_array(), stream=stream)
    return arr, (arr.data.ptr if arr.size else 0)


def numba_array_values(spec: ArgSpec, ptr: int) -> list:
    """The launch values of one array in numba-cuda's kernel ABI: the members of its array struct (meminfo, parent,
    nitems, itemsize, data, shape..., strides... in bytes), as numba-cuda's dispatcher passes them. The job's arrays
    are C-contiguous."""
    itemsize = ITEMSIZE.get(spec.dtype, 1)
    strides, step = [], itemsize
    for n in reversed(spec.shape):
        strides.append(step)
        step *= int(n)
    return ([np.uint64(0), np.uint64(0), np.int64(spec.numel), np.int64(itemsize), np.uint64(ptr)]
            + [np.int64(n) for n in spec.shape] + [np.int64(s) for s in reversed(strides)])


def _device_view(cupy, ptr: int, spec: ArgSpec):
    """A CuPy array over `spec.nbytes` of device memory at `ptr` that this process does not own."""
    mem = cupy.cuda.UnownedMemory(ptr, spec.nbytes, owner=None)
    return cupy.ndarray(spec.shape, dtype=storage_dtype(spec.dtype), memptr=cupy.cuda.MemoryPointer(mem, 0))


# --- staging buffers: the worker's own device memory, mapped by the caller -------------------------------------

STAGE_GRANULE_BYTES = 2 << 20   # staging buffers are whole 2 MiB pages (cudaMalloc's granule for large sizes)


def stage_capacity(nbytes: int) -> int:
    """The size of the staging buffer allocated for `nbytes` of argument."""
    return max(1, -(-int(nbytes) // STAGE_GRANULE_BYTES)) * STAGE_GRANULE_BYTES


def stage_buffers(request: dict, state: dict) -> dict:
    """The worker's side of staging: free the slots in request["free"] (a list, or "all"), (re)allocate
    request["sizes"] ({slot: bytes}), each with its own plain cudaMalloc, and export their CUDA IPC handles.

    Returns {"slots": {slot: {"handle": hex, "bytes": capacity}}} for the allocated slots. The caller unmaps a slot
    before it asks for it to be freed or regrown. A kernel that writes out of bounds of a staged argument can only
    reach this worker's memory: the caller's tensors are copied in before the launch and the written ones copied
    back after a clean finish.
    """
    import cupy

    rt = cupy.cuda.runtime
    staging = state.setdefault("staging", {})          # slot -> (device address, capacity)
    free = request.get("free", ())
    for slot in list(staging) if free == "all" else free:
        old = staging.pop(int(slot), None)
        if old is not None:
            rt.free(old[0])
    out = {}
    for slot, nbytes in request.get("sizes", {}).items():
        slot = int(slot)
        old = staging.pop(slot, None)
        if old is not None:
            rt.free(old[0])
        capacity = stage_capacity(nbytes)
        ptr = rt.malloc(capacity)
        try:
            handle = bytes(rt.ipcGetMemHandle(ptr))
        except Exception:
            rt.free(ptr)
            raise
        staging[slot] = (ptr, capacity)
        out[str(slot)] = {"handle": handle.hex(), "bytes": capacity}
    return {"slots": out}


def scalar_value(spec: ArgSpec):
    """The exact-width NumPy scalar for a scalar argument."""
    if spec.dtype == "bfloat16":
        return np.uint16(spec.value)
    if spec.dtype == "bool":
        return np.bool_(spec.value)
    return np.dtype(spec.dtype).type(spec.value)


class IpcUnavailable(KernellabError):
    """A lent tensor could not be opened in this process: the caller should copy instead."""


def _ipc_open(state: dict, handle: bytes) -> int:
    """The base address of a shared allocation in this process, open until the job ends."""
    import cupy

    opened = state.setdefault("ipc", {})
    ptr = opened.get(handle)
    if ptr is None:
        ptr = opened[handle] = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    return ptr


def close_ipc(state: dict) -> None:
    """Close the allocations the job opened through CUDA IPC. The caller may free its tensors as soon as the launch
    returns (torch.cuda.empty_cache() hands segments back to the driver), and CUDA leaves freeing memory that
    another process still has open undefined; a worker that kept handles open also kept that memory reserved."""
    opened = state.pop("ipc", None) or {}
    if not opened:
        return
    import cupy

    for ptr in opened.values():
        try:
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        except Exception:       # a context a fault has killed: the worker is discarded anyway
            pass


def nonfinite_note(spec: ArgSpec, arr, xp) -> str | None:
    """'c (float32[4096]): 4,096 NaN, first at index 0' when an output holds NaN or Inf, else None."""
    if spec.dtype == "bfloat16":
        bits = arr.view(xp.uint16) if arr.dtype != xp.uint16 else arr
        top = (bits & 0x7F80) == 0x7F80
        if not bool(top.any()):                      # the common case: one reduction, one sync
            return None
        nan, inf = top & ((bits & 0x7F) != 0), top & ((bits & 0x7F) == 0)
    else:
        finite = xp.isfinite(arr)
        if bool(finite.all()):
            return None
        nan = xp.isnan(arr)
        inf = ~finite & ~nan
    n_nan, n_inf = int(xp.count_nonzero(nan)), int(xp.count_nonzero(inf))
    if not (n_nan or n_inf):
        return None
    bad = (nan | inf).ravel()
    first = int(xp.argmax(bad))
    where = np.unravel_index(first, spec.shape) if spec.shape else ()
    index = ", ".join(map(str, (int(i) for i in where))) if len(spec.shape) > 1 else str(first)
    parts = ([f"{n_nan:,} NaN"] if n_nan else []) + ([f"{n_inf:,} Inf"] if n_inf else [])
    dims = ", ".join(map(str, spec.shape))
    return (f"{spec.name or 'output'} ({spec.dtype}[{dims}]) holds {' and '.join(parts)} of {spec.numel:,} elements "
            f"after the launch, the first at index {index}")


def _failure(job: KernelJob, exc: BaseException, during: str) -> JobResult:
    text = f"{type(exc).__name__}: {exc}".strip()
    cuda_like = type(exc).__module__.split(".")[0] in ("cupy", "cupy_backends", "cuda") or "cuda" in text.lower()
    sticky = is_sticky(exc)
    poisoned = sticky or (cuda_like and not _context_healthy())
    if sticky:
        status = "fault"
    elif cuda_like and during == "running":
        status = "launch_error"
    else:
        status = "error"
    return JobResult(status, message=f"{job.label}: {during} failed: {text}", cuda_error=text if cuda_like else None,
                     poisoned=poisoned, pid=os.getpid())


def _context_healthy() -> bool:
    try:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
        cupy.empty(1, dtype=cupy.uint8)
        return True
    except Exception:
        return False


def _trim_pool(cupy) -> None:
    """Give cached device memory back once it passes 1 GiB, so an idle worker does not hold the GPU's memory."""
    pool = cupy.get_default_memory_pool()
    if pool.total_bytes() > (1 << 30):
        pool.free_all_blocks()


# --- the command line: what runs under compute-sanitizer and ncu ------------------------------------------------


def process_start_time() -> float | None:
    """When this process started, as time.time() reads: its start in clock ticks after boot (/proc/self/stat) against
    the uptime now (/proc/uptime), to about 10 ms; None without /proc."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = float(fh.read().rsplit(")", 1)[1].split()[19])     # field 22, starttime (field 3 is index 0)
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def main(argv=None) -> int:
    """`python -m kernellab.run.launch.job JOBFILE [--out RESULTFILE]`: run one job in this process;
    `python -m kernellab.run.launch.job --serve REQUESTS`: run jobs in turn (a pooled compute-sanitizer, serve())."""
    ap = argparse.ArgumentParser(prog="python -m kernellab.run.launch.job", description=main.__doc__)
    ap.add_argument("jobfile", nargs="?")
    ap.add_argument("--out", default=None, help="write the JobResult here")
    ap.add_argument("--scan", action="store_true", help="count NaN/Inf in the outputs (launches CuPy kernels)")
    ap.add_argument("--serve", default=None, metavar="REQUESTS",
                    help="read 'SEQ<TAB>JOBFILE<TAB>RESULTFILE' lines from this named pipe and run each job in turn")
    ap.add_argument("--device", type=int, default=None,
                    help="with --serve: make the CUDA context on this device before the first request")
    ns = ap.parse_args(argv)
    if ns.serve:
        return serve(ns.serve, scan=ns.scan, device=ns.device)
    if not ns.jobfile:
        ap.error("a JOBFILE (or --serve REQUESTS) is needed")
    t0 = time.perf_counter()
    try:
        job = KernelJob.load(ns.jobfile)
    except (OSError, KernellabError) as exc:
        print(f"kernellab.run.launch.job: cannot read {ns.jobfile}: {exc}", file=sys.stderr)
        return 2
    ready = time.time()
    try:
        import cupy

        # One cudaMalloc per argument, so that compute-sanitizer knows each tensor's exact bounds.
        cupy.cuda.set_allocator(None)
        result = run_job(job.with_data(), {}, scan=ns.scan)
    except Exception as exc:  # no CuPy, no GPU: say so in the result
        result = JobResult("error", message=f"{type(exc).__name__}: {exc}", pid=os.getpid())
    started = process_start_time()
    result = replace(result, marks=((("process start", started),) if started is not None else ())
                     + (("job ready", ready),) + result.marks)
    if ns.out:
        with open(ns.out, "wb") as fh:
            fh.write(result.to_bytes())
    print(f"kernellab.run.launch.job: {job.label}: {result.status} in {(time.perf_counter() - t0) * 1e3:.0f} ms"
          + (f": {result.message}" if result.message else ""), file=sys.stderr)
    return 0 if result.ok else 1


# The lines a served job prints around itself on the tool's stdout (kernellab.run.nvtools.sanitize_pool reads them):
# "@@kernellab-job begin SEQ" before the job, "@@kernellab-job end SEQ STATUS [poisoned]" after its device-wide
# synchronize, its result file and its end-of-job call (end_of_job_call), flushed: the tool prints its reports in
# program order with these lines, so what lies between them is the job's.
JOB_MARK = "@@kernellab-job"
# The attribute the end-of-job call of an odd job asks for: no device attribute has this number, so the runtime
# answers cudaErrorInvalidValue; a tool that reports failed API calls (memcheck; racecheck reports none) reports it
# before the end line, which checks the order. An even job's call asks for the properties of a device that does not
# exist instead, so two jobs in a row end with differently named calls and one job's report found in the next job's
# part is known for what it is.
END_OF_JOB_ATTRIBUTE = 0x7FFF0000
END_OF_JOB_DEVICE = 0x7FFF


def end_of_job_call(seq: int) -> str | None:
    """A CUDA call that fails on purpose, whose report (where the tool reports failed calls) must come before job
    `seq`'s end line: cudaDeviceGetAttribute(END_OF_JOB_ATTRIBUTE) for an odd `seq`, cudaGetDeviceProperties(
    END_OF_JOB_DEVICE) for an even one. Returns the error's text (None if the call did not fail)."""
    try:
        import cupy

        rt = cupy.cuda.runtime
        if seq % 2:
            rt.deviceGetAttribute(END_OF_JOB_ATTRIBUTE, rt.getDevice())
        else:
            rt.getDeviceProperties(END_OF_JOB_DEVICE)
    except Exception as exc:       # the point of the call
        return f"{type(exc).__name__}: {exc}"
    return None


def serve(requests: str, *, scan: bool = False, stream=None, device: int | None = None) -> int:
    """Run jobs in turn in this process (under compute-sanitizer: one CUDA context and one tool set-up for many jobs).

    With `device`, the CUDA context is made on it first, before the requests pipe is opened: a pool that starts this
    process ahead of its jobs (sanitize_pool.SanitizerPool.warm) finds it ready, context and all, once the pipe opens.
    Reads 'SEQ<TAB>JOBFILE<TAB>RESULTFILE' lines from the named pipe `requests` until it closes; for each, prints the
    begin mark, runs the job on a fresh state (its modules and allocations are freed after it: memcheck sees each job's
    own allocations only), writes the result file, makes the end-of-job call and prints the end mark. A job that
    leaves the context unusable (poisoned) is the last: the process exits after it."""
    out = stream or sys.stdout
    started = process_start_time()
    try:
        import cupy

        cupy.cuda.set_allocator(None)      # one cudaMalloc per argument, as the one-shot command does
    except Exception:
        cupy = None
    if cupy is not None and device is not None:
        try:
            cupy.cuda.Device(device).use()
            cupy.empty(1, dtype=cupy.uint8)    # the context now (the byte is freed at once: no allocator pool)
        except Exception:                      # the first job meets the same failure and reports it
            pass
    first = True
    with open(requests, "r") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue
            seq, jobfile, resfile = parts
            received = time.time()
            out.write(f"{JOB_MARK} begin {seq}\n")
            out.flush()
            try:
                job = KernelJob.load(jobfile)
                ready = time.time()
                if cupy is None:
                    raise KernellabError("CuPy could not be imported in the tool's process")
                result = run_job(job.with_data(), {}, scan=scan)
            except Exception as exc:
                ready = time.time()
                result = JobResult("error", message=f"{type(exc).__name__}: {exc}", pid=os.getpid())
            start = started if first and started is not None else received
            result = replace(result, marks=(("process start", start), ("job ready", ready)) + result.marks)
            first = False
            if not result.poisoned and cupy is not None:
                try:           # a device-wide synchronize: the tool has seen every kernel of the job finish
                    cupy.cuda.runtime.deviceSynchronize()
                except Exception as exc:      # the context did not survive the job: this process's last
                    result = replace(result, poisoned=True, notes=result.notes + (
                        f"the CUDA context failed after the job ({type(exc).__name__}: {exc})",))
            with open(resfile, "wb") as rf:
                rf.write(result.to_bytes())
            if not result.poisoned:
                end_of_job_call(int(seq))
            sys.stderr.flush()            # the job's own lines come before its end line, as the tool's reports do
            out.write(f"{JOB_MARK} end {seq} {result.status}{' poisoned' if result.poisoned else ''}\n")
            out.flush()
            if result.poisoned:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
