"""Tensor maps for the tensor memory accelerator (TMA): `kernellab.tensor_map(tensor, box)` encodes a `CUtensorMap`.

A kernel takes the map as `const __grid_constant__ CUtensorMap tmap` (from `#include <cuda.h>`) and copies one box
(a tile) of the tensor between global and shared memory with `cp.async.bulk.tensor`. The map is 128 opaque bytes
that the driver's `cuTensorMapEncodeTiled` writes from the tensor's address, sizes and strides and the box shape;
it is only valid in the process (and on the GPU) that encoded it. Every rule that call checks is checked here first,
so that a mistake says which rule and how to fix it instead of CUDA_ERROR_INVALID_VALUE.

Shapes are given as the tensor's own (outermost dimension first, like `tensor.shape`): a [M, K] bf16 matrix with
box (64, 64) copies 64 rows of 64 elements. The driver wants them innermost first; `TensorMap.driver_args()` shows
the call as made.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ... import report
from ...errors import ArgumentError, KernellabError, NoGPUError
from . import cudriver

TENSOR_MAP_BYTES = 128           # sizeof(CUtensorMap)
TENSOR_MAP_ALIGN_BYTES = 64      # the map's address must be 64-byte aligned (a __grid_constant__ parameter is)
MAX_RANK = 5
MAX_BOX = 256                    # elements per box dimension
MAX_ELEMENT_STRIDE = 8
GLOBAL_ALIGN_BYTES = 16          # the tensor's address and every outer stride (32 with 32-byte interleave)
MAX_STRIDE_BYTES = 1 << 40
MAX_DIM = 1 << 32

# Element dtype -> CUtensorMapDataType name. TMA moves bits: 1-byte and 2-byte integer and fp8 tensors travel as
# unsigned words of their width (the out-of-bounds fill is zero bits either way).
DATA_TYPES = {
    "float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32", "float64": "FLOAT64",
    "int32": "INT32", "int64": "INT64", "uint32": "UINT32", "uint64": "UINT64",
    "uint8": "UINT8", "int8": "UINT8", "bool": "UINT8", "float8_e4m3fn": "UINT8", "float8_e5m2": "UINT8",
    "uint16": "UINT16", "int16": "UINT16",
}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4,
            "uint64": 8, "uint8": 1, "int8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2,
            "int16": 2}
FLOAT_TYPES = ("FLOAT16", "BFLOAT16", "FLOAT32", "FLOAT64")
SWIZZLES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}            # name -> swizzle span in bytes
INTERLEAVES = {"none": 0, "16B": 16, "32B": 32}
L2_PROMOTIONS = ("none", "64B", "128B", "256B")
OOB_FILLS = ("zero", "nan")      # out-of-bounds elements read as zero, or as a NaN that FMA treats as zero


@dataclass(frozen=True)
class TensorMap:
    """A `CUtensorMap` for one tensor and one box shape: pass it for a `const __grid_constant__ CUtensorMap` parameter.

    It keeps a reference to the tensor, so the memory it points at stays alive as long as the map does.
    """

    tensor: object = field(repr=False, compare=False)
    shape: tuple[int, ...]                 # the tensor's, outermost first
    dtype: str                             # element dtype ("bfloat16", "float32", ...)
    box: tuple[int, ...]                   # elements per copy along each dimension, outermost first
    strides_bytes: tuple[int, ...]         # the tensor's strides in bytes, outermost first (the last is the itemsize)
    swizzle: str = "128B"
    interleave: str = "none"
    l2_promotion: str = "256B"
    oob_fill: str = "zero"
    element_strides: tuple[int, ...] = ()  # traversal step per dimension, outermost first (all 1: every element)
    global_address: int = 0
    device: int | None = None              # the GPU ordinal of the tensor
    encoded: bytes = field(default=b"", repr=False)  # the 128 bytes cuTensorMapEncodeTiled wrote

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def data_type(self) -> str:
        """The CUtensorMapDataType name (without CU_TENSOR_MAP_DATA_TYPE_)."""
        return DATA_TYPES[self.dtype]

    @property
    def box_elements(self) -> int:
        """Elements one copy moves."""
        return math.prod(-(-b // s) for b, s in zip(self.box, self.element_strides))

    @property
    def box_bytes(self) -> int:
        """Bytes one copy moves into shared memory: the transaction count an mbarrier expects (expect_tx)."""
        return self.box_elements * self.itemsize

    @property
    def contiguous(self) -> bool:
        """Whether the tensor is dense in C order (then a worker process can rebuild the map on its own copy)."""
        return self.strides_bytes == contiguous_strides_bytes(self.shape, self.itemsize)

    def driver_args(self) -> dict:
        """cuTensorMapEncodeTiled's arguments as kernellab passes them: sizes innermost first, strides in bytes."""
        return encode_args(self.data_type, self.global_address, self.shape, self.strides_bytes, self.box,
                           self.element_strides, self.interleave, self.swizzle, self.l2_promotion, self.oob_fill)

    def kernel_arg(self) -> np.ndarray:
        """The 128 bytes as a one-element array, which CuPy passes to the kernel by value."""
        if len(self.encoded) != TENSOR_MAP_BYTES:
            raise ArgumentError(f"this TensorMap holds {len(self.encoded)} encoded bytes, not {TENSOR_MAP_BYTES}; "
                                 f"build it with kernellab.tensor_map(tensor, box)")
        return np.frombuffer(self.encoded, dtype=np.dtype((np.void, TENSOR_MAP_BYTES))).copy()

    def job_params(self) -> dict:
        """What a worker process needs to encode the same map over its own copy of the tensor (see KernelJob)."""
        return {"box": list(self.box), "element_strides": list(self.element_strides), "swizzle": self.swizzle,
                "interleave": self.interleave, "l2_promotion": self.l2_promotion, "oob_fill": self.oob_fill}

    def describe(self) -> str:
        dims = ", ".join(map(str, self.shape))
        box = ", ".join(map(str, self.box))
        return f"CUtensorMap over {self.dtype}[{dims}], box [{box}] ({self.box_bytes:,} B per copy)"

    def __str__(self) -> str:
        outer = ", ".join(f"{s:,}" for s in self.strides_bytes[:-1]) or "-"
        steps = "" if all(s == 1 for s in self.element_strides) else f", element strides {list(self.element_strides)}"
        return (f"{self.describe()}: strides {outer} B, swizzle {self.swizzle}, interleave {self.interleave}, "
                f"L2 promotion {self.l2_promotion}, out-of-bounds fill {self.oob_fill}{steps}, "
                f"address {self.global_address:#x}" + (f" on GPU {self.device}" if self.device is not None else ""))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = [["tensor", f"{self.dtype}[{', '.join(map(str, self.shape))}]"],
                ["box", f"[{', '.join(map(str, self.box))}] = {self.box_bytes:,} B per copy"],
                ["strides", ", ".join(f"{s:,} B" for s in self.strides_bytes)],
                ["swizzle", self.swizzle], ["interleave", self.interleave], ["L2 promotion", self.l2_promotion],
                ["out-of-bounds fill", self.oob_fill], ["address", f"{self.global_address:#x}"]]
        return report.html_table(["CUtensorMap", ""], rows)


def contiguous_strides_bytes(shape, itemsize: int) -> tuple[int, ...]:
    """C-order strides in bytes, outermost first."""
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= int(n)
    return tuple(reversed(out))


def _device_tensor(x) -> tuple[str, tuple[int, ...], tuple[int, ...], int, int | None]:
    """(dtype, shape, strides in bytes, address, GPU ordinal) of a CUDA torch tensor, CuPy array or any object with
    __cuda_array_interface__; ArgumentError for host memory and other values."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "data_ptr"):
        if not x.is_cuda:
            raise ArgumentError(f"a tensor map describes GPU memory, but the tensor is on {x.device}: pass x.cuda() "
                                f"(or create it with device='cuda')")
        dtype = str(x.dtype).replace("torch.", "")
        item = x.element_size()
        return (dtype, tuple(int(s) for s in x.shape), tuple(int(s) * item for s in x.stride()), int(x.data_ptr()),
                x.device.index)
    if mod == "cupy" and hasattr(x, "data"):
        return str(x.dtype), tuple(map(int, x.shape)), tuple(map(int, x.strides)), int(x.data.ptr), x.device.id
    if hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        dt = np.dtype(cai["typestr"])
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        strides = tuple(int(s) for s in strides) if strides else contiguous_strides_bytes(shape, dt.itemsize)
        return str(dt), shape, strides, int(cai["data"][0]), None
    if isinstance(x, np.ndarray) or mod == "torch":
        raise ArgumentError("a tensor map describes GPU memory, but this is host memory; use a CUDA torch tensor or "
                            "a CuPy array")
    raise ArgumentError(f"kernellab.tensor_map needs a CUDA torch tensor or a CuPy array, got a {type(x).__name__}")


def _dims(value, rank: int, what: str, lo: int, hi: int) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),)
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise ArgumentError(f"{what} must be a tuple of ints, one per tensor dimension (outermost first, like "
                            f"tensor.shape), got {value!r}")
    value = tuple(int(v) for v in value)
    if len(value) != rank:
        raise ArgumentError(f"{what} {value} has {len(value)} entr{'y' if len(value) == 1 else 'ies'} but the tensor "
                            f"has {rank} dimension{'s' if rank != 1 else ''}; give one per dimension, outermost first "
                            f"(like tensor.shape)")
    for axis, v in enumerate(value):
        if not lo <= v <= hi:
            raise ArgumentError(f"{what} {value}: dimension {axis} is {v}, outside [{lo}, {hi}] (the tensor memory "
                                f"accelerator's limit); use smaller tiles and copy several")
    return value


def _choice(value, options, what: str) -> str:
    key = "none" if value is None else str(value)
    for opt in options:
        if key.lower() == opt.lower():
            return opt
    raise ArgumentError(f"{what}={value!r} is not one of {', '.join(repr(o) for o in options)}")


def tensor_map(tensor, box, *, swizzle: str | None = "128B", interleave: str | None = None,
               l2_promotion: str | None = "256B", oob_fill: str = "zero", element_strides=None) -> TensorMap:
    """Encode a CUtensorMap for copying `box`-shaped tiles of `tensor` (a CUDA torch tensor or CuPy array) with TMA.

    box: elements per copy along each dimension, outermost first (like tensor.shape), each at most 256; the inner
    box dimension must span a multiple of 16 bytes, and at most the swizzle span (32, 64 or 128 bytes).
    swizzle: "128B" (default), "64B", "32B" or "none": the bank-conflict-avoiding XOR pattern the copy writes shared
    memory in (wgmma's shared-memory layouts name the same patterns). interleave: None, "16B" or "32B".
    l2_promotion: None, "64B", "128B" or "256B" (default): how much L2 fetches from DRAM per request.
    oob_fill: "zero" (default) or "nan": what out-of-bounds elements read as. element_strides: the traversal step per
    dimension (outermost first, 1 to 8; default all 1).
    The tensor's innermost dimension must be contiguous; its address and every other stride a multiple of 16 bytes.

    Maps are cached by what the encoding depends on (address, shape, strides, dtype, GPU, box and options), so a
    repeated call on the same memory returns at once instead of encoding again, and a tensor of a layout already
    mapped, at a new address, gets the newest such map with its address replaced (the driver's
    cuTensorMapReplaceAddress) instead of a full encode (tensor_map_cache_clear() empties the cache; the cache holds
    no tensor).
    """
    key = _cache_key(tensor, box, swizzle, interleave, l2_promotion, oob_fill, element_strides)
    if key is not None:
        hit = _MAP_CACHE.get(key)
        if hit is None:
            hit = _moved(key)                              # a layout seen before, at a new address
        if hit is not None:
            found = object.__new__(TensorMap)
            fields = hit.copy()
            fields["tensor"] = tensor                      # keep this tensor alive, as a fresh map would
            object.__setattr__(found, "__dict__", fields)   # frozen: past its __setattr__
            return found
    dtype, shape, strides, address, device = _device_tensor(tensor)
    rank = len(shape)
    if not 1 <= rank <= MAX_RANK:
        raise ArgumentError(f"a tensor map has 1 to {MAX_RANK} dimensions; the tensor has {rank} (shape {shape}): "
                            f"reshape it (a view) to at most {MAX_RANK}")
    if dtype not in DATA_TYPES:
        raise ArgumentError(f"a tensor map cannot hold {dtype} elements; supported: {', '.join(DATA_TYPES)}")
    itemsize = ITEMSIZE[dtype]
    swizzle = _choice(swizzle, SWIZZLES, "swizzle")
    interleave = _choice(interleave, INTERLEAVES, "interleave")
    l2_promotion = _choice(l2_promotion, L2_PROMOTIONS, "l2_promotion")
    oob_fill = _choice(oob_fill, OOB_FILLS, "oob_fill")
    box = _dims(box, rank, "box", 1, MAX_BOX)
    steps = _dims(element_strides if element_strides is not None else (1,) * rank, rank, "element_strides", 1,
                  MAX_ELEMENT_STRIDE)
    check_layout(dtype, shape, strides, address, box, interleave, swizzle, oob_fill)
    encoded = encode(DATA_TYPES[dtype], address, shape, strides, box, steps, interleave, swizzle, l2_promotion,
                     oob_fill, device=device)
    made = TensorMap(tensor=tensor, shape=shape, dtype=dtype, box=box, strides_bytes=strides, swizzle=swizzle,
                     interleave=interleave, l2_promotion=l2_promotion, oob_fill=oob_fill, element_strides=steps,
                     global_address=address, device=device, encoded=encoded)
    if key is not None:
        kept = dict(made.__dict__)                         # the map's fields: a hit copies them (one dict copy)
        kept["tensor"] = None                              # the cache keeps no memory alive
        _remember(key, kept)
    return made


# Entries are small (the 128 encoded bytes and a description, no tensor). 256 was too few: benchmarks/attention.py's
# grid rotates 134 input sets of (q, k, v) at small shapes, 402 maps, and every call re-encoded its three maps
# (130-186 µs a call back to back on an H100, against 9 µs for the kernel); a model that cycles through more than
# ~85 address sets a step would pay the same.
MAP_CACHE_SIZE = 4096
_MAP_CACHE: collections.OrderedDict = collections.OrderedDict()   # oldest first: a full cache drops it in O(1)


# The newest map of each layout (the key without the address): a tensor of a known layout at a new address (a
# training step's fresh activations and gradients) gets its map from that one by the driver's address replacement
# instead of a full encode and its checks: about 2 µs instead of 40-50 on an H100 host.
_LAYOUTS: collections.OrderedDict = collections.OrderedDict()


def tensor_map_cache_clear() -> None:
    """Forget every cached tensor map (they are keyed by address, so a new tensor at an old address reuses one:
    correct, since the 128 bytes depend on the address, not on which tensor is there)."""
    _MAP_CACHE.clear()
    _LAYOUTS.clear()


def _remember(key, fields: dict) -> None:
    """Cache a map's fields (no tensor) under its key, and as its layout's newest map."""
    if len(_MAP_CACHE) >= MAP_CACHE_SIZE:
        _MAP_CACHE.popitem(last=False)                     # the oldest entry (a plain dict's next(iter()) walks
    _MAP_CACHE[key] = fields                               # the holes its pops left: 1 µs a miss at 4096)
    layout = key[1:]
    if layout not in _LAYOUTS and len(_LAYOUTS) >= MAP_CACHE_SIZE:
        _LAYOUTS.popitem(last=False)
    _LAYOUTS[layout] = fields


def _moved(key) -> dict | None:
    """The cached fields of the map for `key` made from its layout's newest map by replacing the address (cached in
    turn), or None where the layout is new, the address breaks its alignment rule (the full path says so) or the
    driver cannot replace addresses (the full path encodes)."""
    template = _LAYOUTS.get(key[1:])
    if template is None:
        return None
    address = key[0]
    if address % (32 if template["interleave"] == "32B" else GLOBAL_ALIGN_BYTES):
        return None
    encoded = replace_address(template["encoded"], address, template["device"])
    if encoded is None:
        return None
    fields = template.copy()
    fields["global_address"], fields["encoded"] = address, encoded
    _remember(key, fields)
    return fields


def replace_address(encoded: bytes, address: int, device: int | None) -> bytes | None:
    """The map `encoded` pointing at `address` instead (cuTensorMapReplaceAddress; where the thread has no current
    context, again with GPU `device`'s primary context pushed), or None where the driver cannot do it."""
    try:
        return cudriver.replace_tensor_map_address(encoded, address)
    except cudriver.DriverUnavailable:
        return None
    except cudriver.CudaDriverError as exc:
        if exc.rc != cudriver.CUDA_ERROR_INVALID_CONTEXT:
            return None
    try:
        with _context_for(device):
            return cudriver.replace_tensor_map_address(encoded, address)
    except (cudriver.DriverUnavailable, cudriver.CudaDriverError):
        return None


def _cache_key(tensor, box, swizzle, interleave, l2_promotion, oob_fill, element_strides):
    """The cache key of a tensor_map call, from the tensor without building its description: a CUDA torch tensor's
    (address, shape, strides, dtype, GPU) and every option as given; None (no caching) for anything else. On the hit
    path of every launch that takes a map: C attribute calls only (torch.Size and stride() are tuples already)."""
    is_torch = _TORCH_TYPES.get(type(tensor))
    if is_torch is None:
        is_torch = _TORCH_TYPES[type(tensor)] = type(tensor).__module__.split(".")[0] == "torch"
    if not is_torch or not getattr(tensor, "is_cuda", False):
        return None
    if type(box) is list:
        box = tuple(box)
    if type(element_strides) is list:
        element_strides = tuple(element_strides)
    key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.get_device(), box, swizzle,
           interleave, l2_promotion, oob_fill, element_strides)
    try:
        hash(key)
    except TypeError:
        return None
    return key


_TORCH_TYPES: dict = {}          # type -> whether its module is torch's (a tensor map's cache key needs one)


def check_layout(dtype: str, shape, strides_bytes, address: int, box, interleave: str, swizzle: str,
                 oob_fill: str) -> None:
    """cuTensorMapEncodeTiled's rules on the tensor's layout and the box, each as an ArgumentError that says the fix."""
    itemsize = ITEMSIZE[dtype]
    rank = len(shape)
    for axis, n in enumerate(shape):
        if not 1 <= n <= MAX_DIM:
            raise ArgumentError(f"dimension {axis} of the tensor (shape {tuple(shape)}) is {n}; a tensor map needs "
                                f"every dimension in [1, 2^32]")
    if interleave != "none" and rank < 3:
        raise ArgumentError(f"interleave={interleave!r} needs a tensor of 3 to 5 dimensions; this one has {rank}")
    if interleave == "32B" and swizzle != "32B":
        raise ArgumentError(f"interleave='32B' needs swizzle='32B' (got swizzle={swizzle!r})")
    if strides_bytes[-1] != itemsize:
        raise ArgumentError(f"the tensor's innermost dimension is not contiguous (strides {tuple(strides_bytes)} "
                            f"bytes, element size {itemsize}): the tensor memory accelerator reads the innermost "
                            f"dimension densely; pass x.contiguous() or a view whose last dimension has stride 1")
    align = 32 if interleave == "32B" else GLOBAL_ALIGN_BYTES
    if address % align:
        raise ArgumentError(f"the tensor's address {address:#x} is not {align}-byte aligned (it is {address % align} "
                            f"bytes past a boundary): a view that starts mid-row or at an odd offset cannot be mapped; "
                            f"map the whole tensor and start the box there instead (the coordinates in the kernel)")
    for axis in range(rank - 1):
        s = strides_bytes[axis]
        if s % align or not 0 < s < MAX_STRIDE_BYTES:
            per = align // itemsize if align >= itemsize else 1
            raise ArgumentError(
                f"stride {s} bytes of dimension {axis} (shape {tuple(shape)}, strides {tuple(strides_bytes)} bytes) "
                f"is not a positive multiple of {align} bytes below 2^40: the tensor memory accelerator needs every "
                f"dimension but the innermost to start on a {align}-byte boundary. Pad the innermost dimension to a "
                f"multiple of {per} {dtype} elements (allocate the padded tensor and map it, or a slice of it)")
    inner_bytes = box[-1] * itemsize
    if interleave == "none":
        if inner_bytes % 16:
            raise ArgumentError(f"the box's innermost dimension is {box[-1]} {dtype} elements = {inner_bytes} bytes, "
                                f"not a multiple of 16 bytes; use a multiple of {max(1, 16 // itemsize)} elements")
        span = SWIZZLES[swizzle]
        if span and inner_bytes > span:
            raise ArgumentError(f"the box's innermost dimension is {inner_bytes} bytes ({box[-1]} {dtype}), more than "
                                f"the {swizzle} swizzle span: with swizzle={swizzle!r} at most {span // itemsize} "
                                f"elements; split the tile into {-(-inner_bytes // span)} boxes of "
                                f"{span // itemsize} along that dimension, or use swizzle='none'")
    if oob_fill == "nan" and DATA_TYPES[dtype] not in FLOAT_TYPES:
        raise ArgumentError(f"oob_fill='nan' needs a floating-point tensor; this one holds {dtype}")


_ENUMS = {"swizzle": {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"},
          "interleave": {"none": "NONE", "16B": "16B", "32B": "32B"},
          "l2_promotion": {"none": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"},
          "oob_fill": {"zero": "NONE", "nan": "NAN_REQUEST_ZERO_FMA"}}


def encode_args(data_type: str, address: int, shape, strides_bytes, box, element_strides, interleave: str,
                swizzle: str, l2_promotion: str, oob_fill: str) -> dict:
    """cuTensorMapEncodeTiled's arguments (enum names without their prefix): sizes innermost first, the
    rank - 1 outer strides in bytes."""
    return {"tensorDataType": data_type, "tensorRank": len(shape), "globalAddress": int(address),
            "globalDim": [int(n) for n in reversed(shape)],
            "globalStrides": [int(s) for s in reversed(strides_bytes[:-1])],
            "boxDim": [int(b) for b in reversed(box)],
            "elementStrides": [int(e) for e in reversed(element_strides)],
            "interleave": _ENUMS["interleave"][interleave], "swizzle": _ENUMS["swizzle"][swizzle],
            "l2Promotion": _ENUMS["l2_promotion"][l2_promotion], "oobFill": _ENUMS["oob_fill"][oob_fill]}


def encode(data_type: str, address: int, shape, strides_bytes, box, element_strides, interleave: str = "none",
           swizzle: str = "128B", l2_promotion: str = "256B", oob_fill: str = "zero", *,
           device: int | None = None) -> bytes:
    """The 128 bytes of a CUtensorMap, from the driver (shapes outermost first; see encode_args), with a context
    current: GPU `device`'s primary context (or, for device=None, the thread's own, else GPU 0's)."""
    kw = encode_args(data_type, address, shape, strides_bytes, box, element_strides, interleave, swizzle,
                     l2_promotion, oob_fill)
    with _context_for(device):
        return encode_tiled(**kw)


def _context_for(device: int | None):
    """cuTensorMapEncodeTiled needs a current context (without one: CUDA_ERROR_INVALID_CONTEXT, e.g. in a thread
    that has not touched CUDA, or a process that has only cuInit): push the device's primary context, the one
    torch and CuPy use. Where the driver is missing or has no GPU, nothing: encode_tiled says why."""
    try:
        if device is None and cudriver.current_context() is not None:
            return contextlib.nullcontext()
        return cudriver.context_on(0 if device is None else device)
    except (cudriver.DriverUnavailable, cudriver.CudaDriverError):
        return contextlib.nullcontext()


def encode_tiled(**kw) -> bytes:
    """Call the driver's cuTensorMapEncodeTiled (cuda-python) with encode_args' arguments; return the 128 bytes.

    It needs the CUDA driver library (libcuda) and a current context (encode makes one current): on a machine
    without libcuda, NoGPUError.
    """
    driver = _cuda_driver()
    err, tmap = driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + kw["tensorDataType"]), kw["tensorRank"],
        kw["globalAddress"], [driver.cuuint64_t(v) for v in kw["globalDim"]],
        [driver.cuuint64_t(v) for v in kw["globalStrides"]], [driver.cuuint32_t(v) for v in kw["boxDim"]],
        [driver.cuuint32_t(v) for v in kw["elementStrides"]],
        getattr(driver.CUtensorMapInterleave, "CU_TENSOR_MAP_INTERLEAVE_" + kw["interleave"]),
        getattr(driver.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + kw["swizzle"]),
        getattr(driver.CUtensorMapL2promotion, "CU_TENSOR_MAP_L2_PROMOTION_" + kw["l2Promotion"]),
        getattr(driver.CUtensorMapFloatOOBfill, "CU_TENSOR_MAP_FLOAT_OOB_FILL_" + kw["oobFill"]))
    if int(err) != 0:
        name = getattr(err, "name", None) or str(err)
        raise KernellabError(f"cuTensorMapEncodeTiled failed with {name} for {kw}; kernellab's own checks passed, so "
                             f"this is a rule it does not know: please report it")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


@functools.cache
def _cuda_driver():
    """cuda-python's driver module with cuInit done: once a process, not once a map (a failure is not kept: the
    next call tries again)."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise NoGPUError("building a tensor map needs cuda-python (pip install cuda-bindings)") from exc
    try:
        driver.cuInit(0)
    except RuntimeError as exc:       # "Failed to dlopen libcuda.so.1"
        raise NoGPUError(f"building a tensor map needs the CUDA driver (libcuda), and it is not usable here "
                         f"({exc}); tensor maps are made on a GPU machine") from None
    return driver


def encode_for_job(spec, address: int, device: int | None = None) -> np.ndarray:
    """In a worker: the kernel argument for a tensor-map ArgSpec whose (C-contiguous) tensor is at `address` on GPU
    `device` (None: the worker's current one)."""
    p = spec.tensor_map
    dtype = spec.dtype
    strides = contiguous_strides_bytes(spec.shape, ITEMSIZE[dtype])
    raw = encode(DATA_TYPES[dtype], address, spec.shape, strides, tuple(p["box"]), tuple(p["element_strides"]),
                 p["interleave"], p["swizzle"], p["l2_promotion"], p["oob_fill"], device=device)
    return np.frombuffer(raw, dtype=np.dtype((np.void, TENSOR_MAP_BYTES))).copy()
