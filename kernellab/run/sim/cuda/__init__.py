"""CUDA C++ on the CPU: the product's one emulator of CUDA C++, used by `%%cuda --sim`, by kernels where no GPU is
usable, by the graders and by the tests.

- cuda_host.h: the runtime, every CUDA thread a fiber (barriers, warp shuffles, clusters, tutorial 05's cp.async,
  ldmatrix and mma.sync), with hopper.h (mbarriers, TMA loads and stores, wgmma, named barriers) and checks.h
  (bounds of pointer arguments and shared arrays, shared-memory races, uninitialised shared reads, divergent
  barriers, reported as compute-sanitizer's findings);
- emulate.py: two ways onto it. `compile_host`: a source built for the host with the checks, launched in-process on
  CPU tensors (`%%cuda --sim`, the graders); `emulate`: a tutorial's kernel built as a program of its own, shared
  memory as one arena (small addresses, as wgmma descriptors need), NumPy arrays and TMA tensor maps, no checks (the
  tests of tutorials 05 to 09's tensor-core kernels);
- cpu.py: a compiled kernel's launches and sanitizer checks on the CPU, given as `Kernel.image()`;
- toolchain.py: the host C++ compiler (clang from the ziglang wheel, else g++).
"""
from .emulate import CpuKernelError, CpuRun, HostCompilerMissing, HostKernel, HostModule, compile_host, compiler
from .toolchain import host_compiler, why_none

__all__ = ["CpuKernelError", "CpuRun", "HostCompilerMissing", "HostKernel", "HostModule", "compile_host", "compiler",
           "host_compiler", "why_none"]
