"""CUDA C++ on the CPU: the product's one emulator of CUDA C++, used by `%%cuda --sim`, by kernels where no GPU is
usable, by the graders and by the tests.

- emulate.py (`compile_host`): a source built for the host with cuda_host.h (every CUDA thread a fiber, barriers,
  warp shuffles, clusters, and tutorial 05's cp.async, ldmatrix and mma.sync) and checks.h (bounds of pointer
  arguments and shared arrays, shared-memory races, uninitialised shared reads, divergent barriers, reported as
  compute-sanitizer's findings);
- cpu.py: a compiled kernel's launches and sanitizer checks on the CPU, given as `Kernel.image()`;
- ptx_emu.py (`emulate`): the tensor-core instructions of tutorials 05-07 (ldmatrix, mma.sync, cp.async, TMA,
  mbarriers, wgmma), a thread per CUDA thread, for the tests of those kernels (what the fibers do not yet run: wgmma,
  TMA, mbarriers; see docs/DESIGN.md);
- toolchain.py: the host C++ compiler (clang from the ziglang wheel, else g++).
"""
from .emulate import CpuKernelError, CpuRun, HostCompilerMissing, HostKernel, HostModule, compile_host, compiler
from .toolchain import host_compiler, why_none

__all__ = ["CpuKernelError", "CpuRun", "HostCompilerMissing", "HostKernel", "HostModule", "compile_host", "compiler",
           "host_compiler", "why_none"]
