"""The CUDA driver (libcuda) through ctypes: why there is no GPU, and the few calls a fast launch needs.

A kernel launch through CuPy's `Function.__call__` costs about as much as CuPy's RawKernel; kernellab's launch path
checks the arguments in Python, packs them into one buffer and calls `cuLaunchKernel` directly, so that the checks
are not paid on top of CuPy's own marshalling. Modules and functions are still loaded through CuPy (the primary
context torch and CuPy share); only the launch (cuLaunchKernelEx with a CUlaunchConfig for thread-block clusters),
the stream synchronisation, the capture query and making a primary context current come here. cuLaunchKernelEx also
carries programmatic dependent launch (PDL, sm_90): CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION lets the
kernel start while the previous kernel on its stream is still running; the kernel's `griddepcontrol.wait`
(kl/pdl.cuh, griddepcontrol_wait) then waits for that kernel's completion and memory. The generated launch
(run/launch/launch.py, LaunchPath.fast) calls `Driver.launch_kernel`: CuPy's Cython launchKernel where CuPy imports (one
C call, where ctypes converts 11 arguments one by one), else this module's ctypes cuLaunchKernel.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_READY = 600
CU_STREAM_CAPTURE_STATUS_NONE = 0

_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6   # cuda.h's CUlaunchAttributeID (CUDA 12.0 on)


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CUlaunchAttributeValue(ctypes.Union):
    """cuda.h's CUlaunchAttributeValue: a 64-byte union (8-byte aligned: some members hold pointers); kernellab sets
    clusterDim and programmaticStreamSerializationAllowed (an int)."""

    _fields_ = [("pad", ctypes.c_char * 64), ("clusterDim", _ClusterDim),
                ("programmaticStreamSerializationAllowed", ctypes.c_int), ("_align", ctypes.c_uint64)]


class CUlaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: the id, padding to 8 bytes, the value (72 bytes in all)."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig, cuLaunchKernelEx's first argument."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(CUlaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def launch_config(grid, block, shared_bytes: int, stream: int, cluster=None,
                  pdl: bool = False) -> tuple[CUlaunchConfig, object]:
    """(the CUlaunchConfig, the attribute array it points at: keep both alive until the launch returns) for
    cuLaunchKernelEx: with a thread-block cluster shape (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) and/or programmatic
    dependent launch (pdl: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1), in that order."""
    n = bool(cluster) + bool(pdl)
    attrs = (CUlaunchAttribute * max(n, 1))()
    i = 0
    if cluster:
        attrs[i].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[i].value.clusterDim.x, attrs[i].value.clusterDim.y, attrs[i].value.clusterDim.z = (int(c) for c in cluster)
        i += 1
    if pdl:
        attrs[i].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[i].value.programmaticStreamSerializationAllowed = 1
    cfg = CUlaunchConfig(int(grid[0]), int(grid[1]), int(grid[2]), int(block[0]), int(block[1]), int(block[2]),
                         int(shared_bytes), int(stream) or None, attrs, n)
    return cfg, attrs


def max_active_clusters(function: int, grid, block, shared_bytes: int, cluster, lib=None) -> int:
    """cuOccupancyMaxActiveClusters: how many clusters of this shape can be resident on the device at once (in the
    current context); a persistent kernel sizes its grid with it, since clusters must fit inside one GPC."""
    lib = _lib() if lib is None else lib
    cfg, _attrs = launch_config(grid, block, shared_bytes, 0, cluster)
    n = ctypes.c_int(0)
    rc = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(int(function)), ctypes.byref(cfg))
    if rc:
        raise CudaDriverError(rc)
    return n.value


class DriverUnavailable(RuntimeError):
    """libcuda could not be loaded: no NVIDIA driver on this machine."""


@functools.lru_cache(maxsize=1)
def _lib():
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError as exc:
        raise DriverUnavailable(f"{_LIBRARY} cannot be loaded") from None
    p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
    lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(i)]
    lib.cuInit.argtypes = [u]
    lib.cuGetErrorName.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorString.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
    lib.cuStreamSynchronize.argtypes = [p]
    lib.cuStreamIsCapturing.argtypes = [p, ctypes.POINTER(i)]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(p), i]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
    lib.cuCtxSetCurrent.argtypes = [p]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(p)]
    lib.cuCtxPushCurrent_v2.argtypes = [p]
    lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(p)]
    fns = [lib.cuDriverGetVersion, lib.cuInit, lib.cuGetErrorName, lib.cuGetErrorString, lib.cuLaunchKernel,
           lib.cuStreamSynchronize, lib.cuStreamIsCapturing, lib.cuDevicePrimaryCtxRetain, lib.cuDeviceGet,
           lib.cuCtxSetCurrent, lib.cuCtxGetCurrent, lib.cuCtxPushCurrent_v2, lib.cuCtxPopCurrent_v2]
    try:                                       # CUDA 12.0 on; an older driver launches clusters with an error
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(CUlaunchConfig), p, p, p]
        fns.append(lib.cuLaunchKernelEx)
    except AttributeError:
        pass
    for f in fns:
        f.restype = i
    return lib


def driver_version() -> int:
    """The CUDA version the installed driver supports, as 1000 * major + 10 * minor (13000 for CUDA 13.0).

    Raises DriverUnavailable where libcuda cannot be loaded. Needs no GPU and no cuInit."""
    v = ctypes.c_int(0)
    rc = _lib().cuDriverGetVersion(ctypes.byref(v))
    if rc != CUDA_SUCCESS:
        raise RuntimeError(error_text(rc))
    return v.value


def init_error() -> str | None:
    """None when cuInit(0) succeeds, else its error ('CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected')."""
    rc = _lib().cuInit(0)
    return None if rc == CUDA_SUCCESS else error_text(rc)


def error_text(rc: int) -> str:
    """'CUDA_ERROR_NAME: description' for a CUresult, as CuPy writes driver errors ('CUDA error N' where libcuda
    cannot be loaded to name it)."""
    try:
        lib = _lib()
    except DriverUnavailable:
        return f"CUDA error {rc}"
    name, desc = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(rc, ctypes.byref(name))
    lib.cuGetErrorString(rc, ctypes.byref(desc))
    n = name.value.decode() if name.value else f"CUDA error {rc}"
    return f"{n}: {desc.value.decode()}" if desc.value else n


def version_text(v: int) -> str:
    """13020 -> '13.2'."""
    return f"{v // 1000}.{v % 1000 // 10}"


class CudaDriverError(RuntimeError):
    """A CUresult other than CUDA_SUCCESS, with CuPy's wording ('CUDA_ERROR_X: description')."""

    def __init__(self, rc: int):
        self.rc = rc
        super().__init__(error_text(rc))


@functools.lru_cache(maxsize=None)
def primary_context(device_index: int) -> int:
    """The CUcontext handle of a GPU's primary context (the one torch and CuPy use), retained once per process
    (cuInit first), as the CUDA runtime keeps it: alive until the process ends."""
    lib = _lib()
    rc = lib.cuInit(0)
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
    if rc == CUDA_SUCCESS:
        rc = lib.cuDeviceGet(ctypes.byref(dev), int(device_index))
    if rc == CUDA_SUCCESS:
        rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)
    if rc:
        raise CudaDriverError(rc)
    return ctx.value


def current_context() -> int | None:
    """The calling thread's current CUcontext, or None where it has none."""
    ctx = ctypes.c_void_p()
    rc = _lib().cuCtxGetCurrent(ctypes.byref(ctx))
    if rc not in (CUDA_SUCCESS, CUDA_ERROR_NOT_INITIALIZED):   # no cuInit yet: no context either
        raise CudaDriverError(rc)
    return ctx.value or None


def context_on(device_index: int):
    """A context manager inside which `device_index`'s primary context is current in this thread (pushed, and popped
    on the way out), for driver calls that need a context (cuTensorMapEncodeTiled) in a thread or process that has
    none yet. Raises DriverUnavailable or CudaDriverError now, not on entry, where there is no such context."""
    return _pushed(primary_context(device_index))


@contextlib.contextmanager
def _pushed(ctx: int):
    lib = _lib()
    rc = lib.cuCtxPushCurrent_v2(ctypes.c_void_p(ctx))
    if rc:
        raise CudaDriverError(rc)
    try:
        yield
    finally:
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def replace_tensor_map_address(encoded: bytes, address: int) -> bytes:
    """The 128 bytes of a CUtensorMap `encoded` with its global address replaced by `address` (the driver's
    cuTensorMapReplaceAddress: the map is not encoded again, so its layout rules must already hold for the new
    address: alignment). DriverUnavailable without libcuda or a driver older than CUDA 12; CudaDriverError from the
    driver."""
    if len(encoded) != 128:
        raise ValueError(f"a CUtensorMap is 128 bytes, got {len(encoded)}")
    fn = _replace_address_fn()
    base = getattr(_SCRATCH, "base", None)
    if base is None:                                             # one 64-byte-aligned CUtensorMap a thread
        _SCRATCH.raw = ctypes.create_string_buffer(128 + 64)
        base = _SCRATCH.base = ctypes.addressof(_SCRATCH.raw) + (-ctypes.addressof(_SCRATCH.raw) % 64)
    ctypes.memmove(base, encoded, 128)
    rc = fn(base, address)
    if rc:
        raise CudaDriverError(rc)
    return ctypes.string_at(base, 128)


_SCRATCH = threading.local()


@functools.lru_cache(maxsize=1)
def _replace_address_fn():
    fn = getattr(_lib(), "cuTensorMapReplaceAddress", None)
    if fn is None:
        raise DriverUnavailable("this driver has no cuTensorMapReplaceAddress (CUDA 12.0 on)")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    return fn


class Driver:
    """The launch-path calls: cuLaunchKernel, cuLaunchKernelEx (clusters, PDL), cuStreamSynchronize, cuStreamIsCapturing
    (tests substitute fakes)."""

    def __init__(self, lib=None, cupy_launch: bool | None = None):
        lib = _lib() if lib is None else lib
        self._launch = lib.cuLaunchKernel
        self._launch_ex = getattr(lib, "cuLaunchKernelEx", None)
        self._sync = lib.cuStreamSynchronize
        self._capturing = lib.cuStreamIsCapturing
        # What the launch path's generated code calls (run/launch/launch.py, LaunchPath.fast): the raw cuLaunchKernel, with
        # extra as 0; the raw cuStreamIsCapturing (stream, a pointer to a c_int status) and cuStreamSynchronize, each
        # returning the CUresult. CuPy's Cython launchKernel costs a fraction of a ctypes call with 11 conversions;
        # it returns None, or raises CUDADriverError with the CUresult as .status, where ctypes returns the CUresult.
        cupy_fn = _cupy_launch_kernel() if cupy_launch is not False and lib is _lib_or_none() else None
        self.launch_kernel = self._launch if cupy_fn is None else cupy_fn
        # A cluster (or PDL) launch's generated code calls the raw cuLaunchKernelEx (a CUlaunchConfig pointer, the function,
        # kernelParams, extra), returning the CUresult; None where the driver has no cuLaunchKernelEx (CUDA < 12).
        self.launch_kernel_ex = self._launch_ex
        self.stream_is_capturing, self.stream_synchronize = self._capturing, self._sync

    def error(self, rc: int) -> Exception:
        """The exception for a CUresult (CudaDriverError, CuPy's wording)."""
        return CudaDriverError(rc)

    def launch(self, function: int, grid, block, shared_bytes: int, stream: int, params: int,
               device_index: int = 0, cluster=None, pdl: bool = False) -> None:
        """cuLaunchKernel(function, grid, block, shared_bytes, stream, params (a void** address), extra=NULL), or
        with a cluster shape and/or pdl=True cuLaunchKernelEx with the CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION and/or
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION attributes (launch_config).

        A thread that has not touched CUDA yet has no current context: then the device's primary context (the one
        torch and CuPy use, where the kernel was loaded) is made current and the launch tried again."""
        rc = self._call(function, grid, block, shared_bytes, stream, params, cluster, pdl)
        if rc == CUDA_ERROR_INVALID_CONTEXT:
            self.make_current(device_index)
            rc = self._call(function, grid, block, shared_bytes, stream, params, cluster, pdl)
        if rc:
            raise CudaDriverError(rc)

    def _call(self, function: int, grid, block, shared_bytes: int, stream: int, params, cluster, pdl=False) -> int:
        if not cluster and not pdl:
            return self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                                stream, params, None)
        if self._launch_ex is None:
            what = "cluster launches" if cluster else "programmatic dependent launches (pdl=True)"
            raise RuntimeError(f"{what} need cuLaunchKernelEx (CUDA 12.0 or newer); this driver supports "
                               f"CUDA {version_text(driver_version())}")
        cfg, _attrs = launch_config(grid, block, shared_bytes, stream, cluster, pdl)
        return self._launch_ex(ctypes.byref(cfg), function, params, None)

    def make_current(self, device_index: int) -> None:
        """Make `device_index`'s primary context current in this thread."""
        rc = _lib().cuCtxSetCurrent(ctypes.c_void_p(primary_context(device_index)))
        if rc:
            raise CudaDriverError(rc)

    def synchronize(self, stream: int) -> None:
        rc = self._sync(stream)
        if rc:
            raise CudaDriverError(rc)

    def is_capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph (then nothing on it may be waited for)."""
        status = ctypes.c_int(0)
        rc = self._capturing(stream, ctypes.byref(status))
        if rc:
            raise CudaDriverError(rc)
        return status.value != CU_STREAM_CAPTURE_STATUS_NONE


def _lib_or_none():
    try:
        return _lib()
    except DriverUnavailable:
        return None


def _cupy_launch_kernel():
    """cupy.cuda.driver.launchKernel where CuPy is importable and has it, else None.

    launchKernel(f, gx, gy, gz, bx, by, bz, shared_bytes, stream, kernel_params, extra) takes ints (intptr_t,
    unsigned int), calls cuLaunchKernel of the process's one libcuda without the GIL, and raises CUDADriverError (its
    .status the CUresult) on failure."""
    try:
        import cupy.cuda
    except Exception:
        return None
    return getattr(getattr(cupy.cuda, "driver", None), "launchKernel", None)


@functools.lru_cache(maxsize=1)
def driver() -> Driver:
    """The process's Driver (libcuda loaded once)."""
    return Driver()
