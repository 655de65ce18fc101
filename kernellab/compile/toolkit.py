"""Find the CUDA toolkit pieces kernellab uses: headers, cuobjdump, nvdisasm (pip wheels first, then CUDA_HOME)."""
from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """Directories holding cuda_runtime.h / cuda_fp16.h for NVRTC's -I."""
    out = []
    for root in _wheel_roots() + _cuda_homes():
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda_fp16.h")) and inc not in out:
            out.append(inc)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def find_tool(name: str) -> str | None:
    """Path of a toolkit binary (cuobjdump, nvdisasm, ptxas, ncu, compute-sanitizer), or None."""
    for root in _wheel_roots() + _cuda_homes():
        p = os.path.join(root, "bin", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which(name)
