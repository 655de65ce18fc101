"""The CUDA driver (libcuda) through ctypes: why there is no GPU, and the few calls a fast launch needs.

A kernel launch through CuPy's `Function.__call__` costs about as much as CuPy's RawKernel; kernellab's launch path
checks the arguments in Python, packs them into one buffer and calls `cuLaunchKernel` here directly, so that the
checks are not paid on top of CuPy's own marshalling. Modules and functions are still loaded through CuPy (the
primary context torch and CuPy share); only the launch, the stream synchronisation and the capture query come here.
"""
from __future__ import annotations

import ctypes
import functools
import sys

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_READY = 600
CU_STREAM_CAPTURE_STATUS_NONE = 0

_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


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
    lib.cuCtxSetCurrent.argtypes = [p]
    for f in (lib.cuDriverGetVersion, lib.cuInit, lib.cuGetErrorName, lib.cuGetErrorString, lib.cuLaunchKernel,
              lib.cuStreamSynchronize, lib.cuStreamIsCapturing, lib.cuDevicePrimaryCtxRetain, lib.cuCtxSetCurrent):
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
    """'CUDA_ERROR_NAME: description' for a CUresult, as CuPy writes driver errors."""
    lib = _lib()
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


class Driver:
    """The launch-path calls: cuLaunchKernel, cuStreamSynchronize, cuStreamIsCapturing (tests substitute fakes)."""

    def __init__(self):
        lib = _lib()
        self._launch = lib.cuLaunchKernel
        self._sync = lib.cuStreamSynchronize
        self._capturing = lib.cuStreamIsCapturing

    def launch(self, function: int, grid, block, shared_bytes: int, stream: int, params: int,
               device_index: int = 0) -> None:
        """cuLaunchKernel(function, grid, block, shared_bytes, stream, params (a void** address), extra=NULL).

        A thread that has not touched CUDA yet has no current context: then the device's primary context (the one
        torch and CuPy use, where the kernel was loaded) is made current and the launch tried again."""
        rc = self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes, stream,
                          params, None)
        if rc == CUDA_ERROR_INVALID_CONTEXT:
            self.make_current(device_index)
            rc = self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                              stream, params, None)
        if rc:
            raise CudaDriverError(rc)

    def make_current(self, device_index: int) -> None:
        """Make `device_index`'s primary context current in this thread."""
        lib = _lib()
        ctx = ctypes.c_void_p()
        rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device_index)
        if rc == CUDA_SUCCESS:
            rc = lib.cuCtxSetCurrent(ctx)
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


@functools.lru_cache(maxsize=1)
def driver() -> Driver:
    """The process's Driver (libcuda loaded once)."""
    return Driver()
