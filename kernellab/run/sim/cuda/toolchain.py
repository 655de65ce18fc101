"""The host C++ compiler of the CPU path: clang from the `ziglang` wheel on PyPI (a dependency of kernellab, so a fresh
machine needs no system compiler), else $CXX, g++, c++ or clang++ where one is installed.

Why ziglang: it is the one PyPI package that ships a whole C/C++ toolchain (clang, libc++ and the C libraries'
headers) as a wheel for Linux, macOS and Windows, runs as `python -m ziglang c++`, and needs nothing else installed.
Its first build of the C++ runtime takes about a minute (kept in zig's own cache); later builds take seconds.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys

SYSTEM = ("g++", "c++", "clang++")


@functools.lru_cache(maxsize=None)
def host_compiler() -> tuple[tuple[str, ...], str] | None:
    """(command, what it is) of the host C++ compiler, or None where there is none.

    KERNELLAB_CXX=system prefers $CXX or g++ to ziglang (KERNELLAB_CXX=zig insists on ziglang)."""
    choice = os.environ.get("KERNELLAB_CXX", "")
    zig = importlib.util.find_spec("ziglang") is not None
    system = None
    for name in ([os.environ["CXX"]] if os.environ.get("CXX") else []) + list(SYSTEM):
        path = shutil.which(name)
        if path:
            system = ((path,), f"{os.path.basename(path)} (system)")
            break
    if choice == "system" and system:
        return system
    if zig and choice != "system":
        return (sys.executable, "-m", "ziglang", "c++"), "clang from the ziglang wheel (PyPI)"
    return system if choice != "zig" else None


def why_none() -> str:
    """One sentence on why there is no host compiler, and how to get one."""
    return ("no host C++ compiler: kernellab runs CUDA C++ on the CPU by compiling it with clang from the `ziglang` "
            "package (pip install ziglang), or with g++ where one is installed")


def is_gcc(command) -> bool:
    return os.path.basename(command[-1]).startswith(("g++", "c++")) and len(command) == 1
