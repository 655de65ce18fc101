"""Find the CUDA toolkit pieces kernellab uses: headers, cuobjdump, nvdisasm (pip wheels first, then CUDA_HOME)."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil


def _wheel_roots() -> list[str]:
    try:
        import nvidia  # namespace package of the NVIDIA wheels
    except ImportError:
        return []
    roots = []
    for base in list(getattr(nvidia, "__path__", [])):
        for sub in ("cu13", "cuda_runtime", "cuda_nvcc", "cuda_cuobjdump", "cuda_nvdisasm"):
            p = os.path.join(base, sub)
            if os.path.isdir(p):
                roots.append(p)
    return roots


def _cuda_homes() -> list[str]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    homes += ["/usr/local/cuda"]
    return [h for h in homes if h and os.path.isdir(h)]


# kernellab's own headers for NVRTC, searched first: a device-side <cuda.h> (the toolkit's is host-only).
NVRTC_INCLUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvrtc_include")
# kernellab's shared device headers (<kl/ptx.cuh>, <kl/mma.cuh>, ...): the code the tutorials share.
KL_INCLUDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include")


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """NVRTC's -I directories: kernellab's device <cuda.h> and its <kl/...> headers, then the toolkit's (cuda_fp16.h,
    mma.h, ...) and CCCL's (<cuda/barrier>, <cuda/ptx>, <cuda/std/...>)."""
    out = [NVRTC_INCLUDE, KL_INCLUDE]
    for root in _wheel_roots() + _cuda_homes():
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda_fp16.h")) and inc not in out:
            out.append(inc)
            cccl = os.path.join(inc, "cccl")
            if os.path.isdir(os.path.join(cccl, "cuda")) and not any(o.endswith(os.sep + "cccl") for o in out):
                out.append(cccl)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def find_tool(name: str) -> str | None:
    """Path of a toolkit binary (cuobjdump, nvdisasm, ptxas, ncu, compute-sanitizer), or None."""
    for root in _wheel_roots() + _cuda_homes():
        p = os.path.join(root, "bin", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def own_headers_digest() -> str:
    """A hash of the content of kernellab's own headers (NVRTC_INCLUDE and KL_INCLUDE): part of every compile cache
    key, so that editing a header recompiles the sources that include it."""
    h = hashlib.sha256()
    for root in (NVRTC_INCLUDE, KL_INCLUDE):
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read() + b"\0")
    return h.hexdigest()
