"""Compile a CUDA C++ source for the CPU (cuda_host.h: threads as fibers) and launch its kernels on CPU tensors.

    mod = compile_host(source)                   # NVRTC compiles it too: signatures and cluster sizes from the cubin
    mod["softmax_rows<float, 8>"][grid, block](x, y, rows, cols, 32)      # torch CPU tensors and numbers

For tests on machines without a GPU: indexing, guards, barriers, shuffles and the arithmetic of a kernel run for
real, slowly (about a million barrier crossings per second). kernellab's headers (`#include <kl/ptx.cuh>`,
kernellab/include) are on the include path: their PTX wrappers run cuda_host.h's kl_emu:: emulation (their #else
branches). A source's own cluster helpers written in inline PTX (cluster_ctarank, cluster_nctarank, cluster_arrive,
cluster_arrive_relaxed, cluster_wait, cluster_sync, cluster_map), statistic exchange (exchange_init, exchange_push,
exchange_wait, exchange_arm: st.async and an mbarrier), exp_ftz and prefetch_l1 (a no-op) are cut from the source
and replaced by the emulated ones; other inline PTX cannot run here.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
HEADER = HERE / "cuda_host.h"
EMULATED = ("cluster_ctarank", "cluster_nctarank", "cluster_arrive", "cluster_wait", "cluster_sync", "cluster_map",
            "exp_ftz", "cluster_arrive_relaxed", "exchange_init", "exchange_push", "exchange_wait",
            "exchange_arm", "prefetch_l1")
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int8": ctypes.c_int8, "uint8": ctypes.c_uint8,
           "int16": ctypes.c_int16, "uint16": ctypes.c_uint16, "int32": ctypes.c_int32, "uint32": ctypes.c_uint32,
           "int64": ctypes.c_int64, "uint64": ctypes.c_uint64, "bool": ctypes.c_bool}


def compiler() -> str | None:
    """The host C++ compiler, or None where there is none."""
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def host_source(source: str) -> str:
    """`source` with the CUDA headers dropped and the PTX cluster helpers cut out (cuda_host.h's kl_emu:: supplies
    them)."""
    text = re.sub(r"^\s*#include\s*<(cuda_[a-z0-9_]+\.h|cuda/.*)>\s*$", "", source, flags=re.M)
    # dynamic shared memory: a per-block array of the most a block can have (sm_90: 227 KiB)
    text = re.sub(r"extern\s+__shared__\s+((?:__align__\(\d+\)\s+)?)([A-Za-z_][\w:<>, ]*?)\s+(\w+)\s*\[\s*\]\s*;",
                  lambda m: f"__shared__ {m.group(1)}{m.group(2)} {m.group(3)}[KL_DYNAMIC_SHARED_BYTES / "
                            f"sizeof({m.group(2)})];", text)
    for name in EMULATED:
        while True:
            m = re.search(r"(template\s*<[^<>{};]*>(?:\s|//[^\n]*\n)*)?__device__[^;{}()]*?\b" + name + r"\s*\(", text)
            if not m:
                break
            body = text.index("{", m.end())
            depth, i = 0, body
            while True:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            newlines = "\n" * text.count("\n", m.start(), i)          # keep the line numbers
            text = text[:m.start()] + f"using kl_emu::{name};   /* emulated */" + newlines + text[i + 1:]
    return text


def _param_type(p) -> str:
    t = p.ctype.replace("__restrict__", "").replace("__restrict", "")
    return " ".join(t.split())


def compile_host(source: str, arch: str = "sm_90", first_line: int = 2, filename: str = "cell.cu"):
    """Compile `source` with NVRTC (for the signatures) and with the host C++ compiler; a HostModule.

    first_line and filename are those of a `%%cuda` cell by default, so the NVRTC compile shares kernellab's cache
    with the tests that compile the same cell for its resources."""
    import kernellab
    from kernellab.compile.toolkit import KL_INCLUDE, own_headers_digest

    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no host C++ compiler (g++) to build the CPU emulation with")
    module = kernellab.compile_cuda(source, arch=arch, first_line=first_line, filename=filename)
    kernels = list(module.kernels)
    wrappers = []
    for i, k in enumerate(kernels):
        call = k.signature.display
        args = ", ".join(f"*reinterpret_cast<{_param_type(p)}*>(args[{j}])" for j, p in enumerate(k.params))
        wrappers.append(
            f'extern "C" __attribute__((visibility("default"))) const char* kl_launch_{i}(\n'
            f'        unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, int cluster,\n'
            f'        void** args) {{\n'
            f'    static thread_local std::string err;\n'
            f'    try {{\n'
            f'        err = kl::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, cluster, [&] {{ {call}({args}); }});\n'
            f'    }}\n'
            f'    catch (const std::exception& e) {{ err = e.what(); }}\n'
            f'    return err.c_str();\n}}\n')
    text = (f'#include "{HEADER}"\n#line {first_line} "{filename}"\n' + host_source(source) + "\n"
            + "\n".join(wrappers))
    # Each library keeps its own inline and template thread_locals (the __shared__ variables and the scheduler's
    # state): unified across libraries, they would break distributed shared memory.
    flags = ["-fvisibility=hidden", "-fvisibility-inlines-hidden", "-fno-gnu-unique"]
    opt = os.environ.get("KERNELLAB_EMU_OPT", "-O1 -g0").split()       # e.g. "-O0 -g" to debug under gdb
    key = hashlib.sha256("\0".join([text, HEADER.read_text(), own_headers_digest(), *opt, *flags]).encode()
                         ).hexdigest()[:20]
    build = pathlib.Path(os.environ.get("KERNELLAB_EMU_DIR", pathlib.Path(tempfile.gettempdir()) / "kernellab-emu"))
    build.mkdir(parents=True, exist_ok=True)
    lib = build / f"{key}.so"
    if not lib.exists():
        src = build / f"{key}.{os.getpid()}.cpp"       # this process's own: others (pytest -n) may build the same
        src.write_text(text)
        tmp = build / f"{key}.{os.getpid()}.so"
        proc = subprocess.run([cxx, "-std=c++17", *opt, "-shared", "-fPIC", "-w", "-pthread", *flags, f"-I{KL_INCLUDE}",
                               "-o", str(tmp), str(src)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"host compile failed:\n{proc.stderr[-4000:]}")
        tmp.replace(lib)
    return HostModule(ctypes.CDLL(str(lib)), kernels, cluster_dims(module.cubin))


def cluster_dims(cubin: bytes) -> dict[str, int]:
    """Blocks per cluster (x) of each kernel compiled with __cluster_dims__, from the cubin's .nv.info sections."""
    from kernellab.compile.toolkit import find_tool

    tool = find_tool("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump (from the CUDA wheels) is needed to read cluster sizes from the cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-elf", f.name], capture_output=True, text=True, check=True).stdout
    found = {}
    for sec in re.split(r"\n(?=\.nv\.info\.)", text):
        m = re.match(r"\.nv\.info\.(\S+)", sec)
        c = re.search(r"EIATTR_CTA_PER_CLUSTER\s*\n\s*Format:[^\n]*\n\s*Value:\s*(0x[0-9a-f]+)", sec)
        if m and c:
            found[m.group(1)] = int(c.group(1), 16)
    return found


class HostModule:
    """The kernels of one source, built for the CPU: `mod[name][grid, block(, cluster)](*args)`."""

    def __init__(self, lib, kernels, clusters):
        self.lib, self.kernels, self.clusters = lib, kernels, clusters
        self._index = {}
        for i, k in enumerate(kernels):
            for key in {k.name, k.signature.display, k.symbol}:
                self._index.setdefault(key, []).append(i)

    def __getitem__(self, name: str) -> HostKernel:
        found = self._index.get(name, [])
        if len(found) != 1:
            raise KeyError(f"{name!r} names {len(found)} kernels; kernels: "
                           f"{[k.signature.display for k in self.kernels]}")
        i = found[0]
        fn = getattr(self.lib, f"kl_launch_{i}")
        fn.restype = ctypes.c_char_p
        return HostKernel(self.kernels[i], fn, self.clusters.get(self.kernels[i].symbol, 1))


class HostKernel:
    """One kernel on the CPU: `k[grid, block](*args)`, in clusters of the size it was compiled with."""

    def __init__(self, kernel, fn, cluster: int):
        self.kernel, self.fn, self.cluster = kernel, fn, cluster

    def __getattr__(self, name):
        """Everything else (name, signature, resources, occupancy, sass) is the NVRTC-compiled kernel's."""
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, config):
        grid, block = config[:2]
        return lambda *args, cluster=None: self.launch(grid, block, *args, cluster=cluster)

    def launch(self, grid, block, *args, cluster=None, shared_bytes: int = 0):
        """cluster: blocks per cluster for a kernel without __cluster_dims__ (a launch-time cluster shape);
        shared_bytes: dynamic shared memory (extern __shared__ arrays hold KL_DYNAMIC_SHARED_BYTES here)."""
        if shared_bytes > 227 * 1024:
            raise ValueError(f"{shared_bytes} bytes of dynamic shared memory: more than a block has (227 KiB)")
        import torch

        dims = [tuple(d) + (1,) * (3 - len(d)) if isinstance(d, tuple) else (int(d), 1, 1) for d in (grid, block)]
        params = self.kernel.params
        if len(args) != len(params):
            raise TypeError(f"{self.kernel.signature.display} takes {len(params)} arguments, got {len(args)}")
        keep, ptrs = [], (ctypes.c_void_p * max(1, len(args)))()
        for j, (p, a) in enumerate(zip(params, args)):
            if p.pointer:
                if isinstance(a, torch.Tensor):
                    if a.is_cuda or not a.is_contiguous():
                        raise TypeError(f"argument {p.name}: a contiguous CPU tensor, please")
                    if p.dtype is not None and str(a.dtype).replace("torch.", "") != p.dtype:
                        raise TypeError(f"argument {p.name} expects {p.dtype}, got {a.dtype}")
                    v = ctypes.c_void_p(a.data_ptr())
                elif a is None:
                    v = ctypes.c_void_p(0)
                else:
                    raise TypeError(f"argument {p.name}: a tensor, please")
            else:
                v = _CTYPES[p.dtype](a)
            keep.append(v)
            ptrs[j] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
        c = self.cluster if cluster is None else (cluster if isinstance(cluster, int) else int(cluster[0]))
        if cluster is not None and self.cluster != 1 and c != self.cluster:
            raise ValueError(f"{self.kernel.name} was compiled for clusters of {self.cluster}, not {c}")
        if dims[0][0] % c:
            raise ValueError(f"grid {dims[0]} is not a whole number of clusters of {c}")
        err = self.fn(*dims[0], *dims[1], c, ptrs)
        if err:
            raise RuntimeError(f"{self.kernel.signature.display}: {err.decode()}")
        del keep           # the argument storage lived through the call
