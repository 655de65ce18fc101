"""The GPU this process can use: whether there is one, and its properties (through CuPy)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ...analysis.arch import DEFAULT_ARCH, base_arch, get_arch, normalize_arch
from ...errors import NoGPUError
from . import cudriver


@dataclass(frozen=True)
class DeviceInfo:
    """The launch-relevant properties of one GPU (tests build fake ones)."""

    index: int
    name: str
    arch: str                          # 'sm_90'
    multiprocessors: int
    max_threads_per_block: int = 1024
    max_block_dims: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dims: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    shared_per_block_bytes: int = 48 * 1024          # without opt-in
    shared_per_block_optin_bytes: int = 48 * 1024    # with cudaFuncAttributeMaxDynamicSharedMemorySize
    shared_per_sm_bytes: int = 64 * 1024
    l2_bytes: int = 0
    memory_bytes: int = 0

    def __str__(self) -> str:
        return f"{self.name} ({self.arch}, {self.multiprocessors} SMs, {self.memory_bytes / 2**30:.0f} GiB)"


@functools.lru_cache(maxsize=None)
def device_for_arch(arch: str) -> DeviceInfo:
    """The launch limits of a GPU of `arch` from kernellab.analysis's tables (no GPU needed): what the CPU path checks
    a launch against, so that it refuses what that GPU would."""
    spec = get_arch(base_arch(arch))
    return DeviceInfo(index=-1, name=f"an {spec.name} GPU", arch=spec.name, multiprocessors=0,
                      max_threads_per_block=spec.max_threads_per_block,
                      shared_per_block_bytes=spec.shared_memory_per_block_bytes,
                      shared_per_block_optin_bytes=spec.shared_memory_per_block_optin_bytes,
                      shared_per_sm_bytes=spec.shared_memory_per_sm_bytes)


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """(usable, reason): whether a CUDA GPU can be used from this process, and why not."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError:
        return False, "CuPy is not installed (pip install cupy-cuda13x)"
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return False, why_no_gpu(text, _runtime_version())
    if n == 0:
        return False, "the CUDA driver reports no GPU"
    return True, f"{n} GPU(s)"


def _runtime_version() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        return None


def why_no_gpu(error: str, runtime_version: int | None) -> str:
    """Which of 'no driver', 'driver too old' and 'no device' it is, asked of libcuda itself: CUDA's runtime says
    "driver version is insufficient" for all of them when it cannot load a driver."""
    try:
        have = cudriver.driver_version()
    except cudriver.DriverUnavailable as exc:
        return (f"no NVIDIA driver is installed on this machine ({exc}); CUDA kernels need a machine with an NVIDIA "
                f"GPU and its driver")
    except Exception as exc:
        return f"the CUDA driver does not answer ({exc}; the runtime said: {error})"
    if runtime_version and have < runtime_version:
        return (f"the NVIDIA driver is too old: it supports CUDA {cudriver.version_text(have)}, and CuPy's CUDA "
                f"runtime needs CUDA {cudriver.version_text(runtime_version)}; update the driver, or install the CuPy "
                f"build for CUDA {have // 1000} (cupy-cuda{have // 1000}x)")
    try:
        init = cudriver.init_error()
    except Exception as exc:
        init = str(exc)
    if init:
        return f"the NVIDIA driver (CUDA {cudriver.version_text(have)}) finds no usable GPU: {init}"
    return f"the NVIDIA driver (CUDA {cudriver.version_text(have)}) is installed but CUDA failed: {error}"


def has_gpu() -> bool:
    """True when a CUDA GPU is usable here."""
    return gpu_status()[0]


def require_gpu(what: str = "launching a kernel") -> None:
    """Raise NoGPUError explaining that `what` needs a GPU and what still works without one."""
    ok, reason = gpu_status()
    if not ok:
        raise NoGPUError(f"{what} needs a CUDA GPU, and none is usable here: {reason}. Compiling, resources, "
                         "PTX/SASS, occupancy, bank and roofline analysis all work without one; run on a GPU "
                         "machine to launch, check or time kernels.")


@functools.lru_cache(maxsize=None)
def device_info(index: int | None = None) -> DeviceInfo:
    """Properties of GPU `index` (default: the current CuPy device)."""
    require_gpu("reading device properties")
    import cupy

    if index is None:
        index = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(index)
    attrs = cupy.cuda.Device(index).attributes
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceInfo(
        index=index, name=name, arch=normalize_arch((props['major'], props['minor'])),
        multiprocessors=props["multiProcessorCount"],
        max_threads_per_block=props["maxThreadsPerBlock"],
        max_block_dims=tuple(props["maxThreadsDim"]), max_grid_dims=tuple(props["maxGridSize"]),
        shared_per_block_bytes=props["sharedMemPerBlock"],
        shared_per_block_optin_bytes=attrs.get("MaxSharedMemoryPerBlockOptin", props["sharedMemPerBlock"]),
        shared_per_sm_bytes=props["sharedMemPerMultiprocessor"], l2_bytes=props["l2CacheSize"],
        memory_bytes=props["totalGlobalMem"],
    )


def current_arch(default: str = DEFAULT_ARCH) -> tuple[str, str | None]:
    """(arch, note): the current GPU's arch, or `default` with a note saying no GPU was found."""
    if has_gpu():
        return device_info().arch, None
    return default, f"no GPU here: compiled for {default} (pass arch= for another); launching needs a GPU"
