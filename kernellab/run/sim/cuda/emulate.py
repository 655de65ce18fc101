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
import faulthandler
import hashlib
import os
import pathlib
import pickle
import re
import subprocess
import tempfile

import numpy as np

from ....analysis.arch import DEFAULT_ARCH, normalize_arch
from ....compile.cubin import read_cubin
from ....compile.nvrtc import compile_cached
from ....compile.signature import (ATTRIBUTE_WORDS, find_kernels, match_bracket, signature_for, split_top_level,
                                   strip_comments_and_strings)
from ....compile.toolkit import KL_INCLUDE, find_tool, own_headers_digest
from ...findings import Finding, Location

from .toolchain import host_compiler, is_gcc, why_none

HERE = pathlib.Path(__file__).resolve().parent
HEADER = HERE / "cuda_host.h"
HOST_HEADERS = ("cuda_host.h", "cuda_spellings.h", "checks.h")     # what a build includes from HERE
EMULATED = ("cluster_ctarank", "cluster_nctarank", "cluster_arrive", "cluster_wait", "cluster_sync", "cluster_map",
            "exp_ftz", "cluster_arrive_relaxed", "exchange_init", "exchange_push", "exchange_wait",
            "exchange_arm", "prefetch_l1")
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int8": ctypes.c_int8, "uint8": ctypes.c_uint8,
           "int16": ctypes.c_int16, "uint16": ctypes.c_uint16, "int32": ctypes.c_int32, "uint32": ctypes.c_uint32,
           "int64": ctypes.c_int64, "uint64": ctypes.c_uint64, "bool": ctypes.c_bool}


def compiler() -> str | None:
    """The host C++ compiler's command line, or None where there is none (see toolchain.py)."""
    found = host_compiler()
    return " ".join(found[0]) if found else None


def host_source(source: str) -> str:
    """`source` with the CUDA headers dropped and the PTX cluster helpers cut out (cuda_host.h's kl_emu:: supplies
    them)."""
    text = re.sub(r"^\s*#include\s*<(cuda_[a-z0-9_]+\.h|cuda/.*|math_constants\.h|mma\.h)>\s*(?://.*)?$", "", source,
                  flags=re.M)
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


# --- the checked build: host.py's rewrites (see checks.h) ---------------------------------------------------------

CHECK_LEVELS = {2: "bounds of every pointer argument and shared array, shared-memory races, uninitialised shared "
                   "reads and barriers",
                1: "bounds of the pointer arguments only (the shared arrays are used in ways the checked build "
                   "does not compile)",
                0: "nothing (the kernel's pointers are used in ways the checked build does not compile)"}
SHARED_ONLY = ("the shared arrays' bounds, shared-memory races, uninitialised shared reads and barriers, but not the "
               "bounds of the pointer arguments (they go where checked pointers do not compile, e.g. to a template "
               "that deduces T from T*)")


def describe_checks(level: int, global_checks: bool = True) -> str:
    """What a build with checks `level` (and the pointer arguments checked or not) checks, in words."""
    return SHARED_ONLY if level >= 2 and not global_checks else CHECK_LEVELS[level]


def _checked_param(text: str) -> str:
    """`const float* __restrict__ x` -> `::kl::gptr<const float> x` (other parameters as they are)."""
    t = " ".join(text.split())
    if t.count("*") != 1 or "CUtensorMap" in t or "(" in t:
        return text
    m = re.match(r"^(.*?)\*\s*(?:__restrict__|__restrict)?\s*(?:const\s+)?(\w*)\s*$", t)
    if not m or not m.group(1).strip() or m.group(2) in ("const", "__restrict__", "__restrict"):
        return text
    return f"::kl::gptr<{m.group(1).strip()}> {m.group(2)}".rstrip()     # (an explicit instantiation names none)


def _wrap_auto(text: str, clean: str, edits: list, lo: int, hi: int) -> None:
    """`auto v = EXPR;` -> `auto v = ::kl::value(EXPR);` (the value of a checked element, not the element)."""
    for m in re.finditer(r"\bauto\s+(\w+)\s*=(?!=)\s*", clean[lo:hi]):
        s = lo + m.end()
        depth, j = 0, s
        while j < hi:
            c = clean[j]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c in ";," and depth == 0:
                break
            j += 1
        if j < hi and clean[j] in ";,":
            edits.append((s, s, "::kl::value("))
            edits.append((j, j, ")"))


def checked_source(text: str, level: int, global_checks: bool = True) -> str:
    """`text` (host_source's) rewritten for the checks of `level` (2, 1; 0 leaves it); global_checks=False leaves
    the kernels' pointer parameters plain (the shared arrays are still checked at level 2)."""
    if level <= 0:
        return text
    clean = strip_comments_and_strings(text)
    edits: list[tuple[int, int, str]] = []          # (start, end, replacement) in text's positions
    for m in re.finditer(r"\b__global__\b", clean):
        i = m.end()
        name_at = None
        while i < len(clean):
            mm = re.compile(r"\s*([A-Za-z_][\w:]*)\s*(\(|<)?").match(clean, i)
            if not mm:
                i += 1
                continue
            word, bracket = mm.group(1), mm.group(2)
            if bracket == "(" and word not in ATTRIBUTE_WORDS:
                name_at = mm.end() - 1
                break
            if bracket == "(":
                i = match_bracket(clean, mm.end() - 1, "(", ")") + 1
            elif bracket == "<":
                i = match_bracket(clean, mm.end() - 1, "<", ">") + 1
                after_args = re.compile(r"\s*\(").match(clean, i)
                if after_args:                  # an explicit instantiation: name<args>(params)
                    name_at = after_args.end() - 1
                    break
            else:
                i = mm.end()
        if name_at is None:
            continue
        close = match_bracket(clean, name_at, "(", ")")
        params = split_top_level(clean[name_at + 1:close])
        if global_checks:
            new = ", ".join(_checked_param(p) for p in params if p.strip())
            edits.append((name_at + 1, close, new + "\n" * clean.count("\n", name_at + 1, close)))
        after = re.compile(r"\s*(?:->[^{;]*)?([{;])").match(clean, close + 1)
        if not after or after.group(1) != "{":
            continue
        body_open = after.end() - 1
        body_close = match_bracket(clean, body_open, "{", "}")
        body = clean[body_open:body_close]
        for r in re.finditer(r"\breturn\s*;", body):
            edits.append((body_open + r.start(), body_open + r.end(), "return ::kl::exit_at(__LINE__);"))
        # local pointer variables keep the argument's bounds: `const float4* p = ...` -> `auto p = ...`
        for d in re.finditer(r"(?<![\w>:.\]\)])((?:const\s+)?[A-Za-z_][\w:]*(?:\s+const)?)\s*\*\s*(?:__restrict__\s*)?"
                             r"(?:const\s+)?(\w+)\s*=(?!=)\s*(\S)", body):
            if d.group(1).split()[-1] in ("return", "else", "case", "delete", "new", "typedef", "using") or \
                    body.startswith("nullptr", d.start(3)) or d.group(3) == "0":
                continue
            edits.append((body_open + d.start(), body_open + d.end(2), f"auto {d.group(2)}"))
    _wrap_auto(text, clean, edits, 0, len(clean))
    for r in re.finditer(r"\breinterpret_cast\s*<", clean):
        edits.append((r.start(), r.end(), "::kl::reinterpret<"))
    if level >= 2:
        for s in re.finditer(r"\b__shared__\s+((?:__align__\(\d+\)\s+)?)([A-Za-z_][\w:<>, ]*?)\s+(\w+)\s*"
                             r"((?:\[[^\]]+\]\s*)+);", clean):
            dims = [d.strip() for d in re.findall(r"\[([^\]]+)\]", s.group(4))]
            dynamic = "true" if any("KL_DYNAMIC_SHARED_BYTES" in d for d in dims) else "false"
            arr = f"::kl::sarr<{s.group(2)}, {dynamic}, {', '.join(f'({d})' for d in dims)}>"
            edits.append((s.start(), s.end(), f'__shared__ {s.group(1)}{arr} {s.group(3)}{{"{s.group(3)}"}};'))
    out = text
    for start, end, rep in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + rep + out[end:]
    return out


def _param_type(p) -> str:
    t = p.ctype.replace("__restrict__", "").replace("__restrict", "")
    return " ".join(t.split())


def _build(text: str, opt: list[str]) -> tuple[pathlib.Path | None, str]:
    """Compile `text` to a shared object (cached by text, headers, compiler and flags); (path, "") or (None, log)."""
    found = host_compiler()
    if found is None:
        raise HostCompilerMissing(why_none())
    command, _what = found
    flags = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    if is_gcc(command):
        # Each library keeps its own inline and template thread_locals (the __shared__ variables and the
        # scheduler's state): unified across libraries, they would break distributed shared memory.
        flags.append("-fno-gnu-unique")
    flags.append(f"-I{KL_INCLUDE}")                   # kernellab's headers (<kl/...>), their kl_emu:: branches
    headers = "".join((HERE / h).read_text() for h in HOST_HEADERS) + own_headers_digest()
    key = hashlib.sha256("\0".join([text, headers, *command, *opt, *flags]).encode()).hexdigest()[:20]
    build = pathlib.Path(os.environ.get("KERNELLAB_EMU_DIR", pathlib.Path(tempfile.gettempdir()) / "kernellab-emu"))
    build.mkdir(parents=True, exist_ok=True)
    lib = build / f"{key}.so"
    failed = build / f"{key}.failed"
    if lib.exists():
        return lib, ""
    if failed.exists():
        return None, failed.read_text()
    src = build / f"{key}.{os.getpid()}.cpp"       # this process's own: others (pytest -n) may build the same
    src.write_text(text)
    tmp = build / f"{key}.{os.getpid()}.so"
    proc = subprocess.run([*command, "-std=c++17", *opt, "-shared", "-fPIC", "-w", "-pthread", *flags, "-o",
                           str(tmp), str(src)], capture_output=True, text=True)
    if proc.returncode:
        if "error:" in proc.stderr:         # the source's own errors (not a compiler that did not start): kept
            part = build / f"{key}.{os.getpid()}.failed"
            part.write_text(proc.stderr[-6000:])
            part.replace(failed)
        return None, proc.stderr[-6000:] or proc.stdout[-6000:]
    tmp.replace(lib)
    return lib, ""


class HostCompilerMissing(RuntimeError):
    """No host C++ compiler to build the CPU path with (see toolchain.py)."""


def compile_host(source: str, arch: str = DEFAULT_ARCH, first_line: int = 2, filename: str = "cell.cu", *,
                 cubin: bytes | None = None, options=(), module=None, checks: int = 2):
    """Compile `source` with NVRTC (for the signatures) and with the host C++ compiler; a HostModule.

    first_line and filename are those of a `%%cuda` cell by default, so the NVRTC compile shares kernellab's cache
    with the tests that compile the same cell for its resources; `cubin` is that compile's output where the caller
    has it (a KernelImage's `image`: NVRTC is not run again), `options` its NVRTC options; `module` (a compiled
    Module) stands for its cubin. checks: the most checks to build in (2: all, 1: pointer arguments' bounds, 0:
    none); where the kernel does not compile with them, the next is tried (2, 1, then the shared arrays' checks
    with plain pointer arguments, then none) and the HostModule's `notes` say so."""
    if cubin is None and module is not None:
        cubin = module.cubin
    found = find_kernels("\n" * (first_line - 1) + source)
    if cubin is None:                     # the compile cache's entry (compile_cuda's too), its kernels' signatures
        output, _ = compile_cached(source, normalize_arch(arch), tuple(options), filename=filename,
                                   first_line=first_line)
        symbols, cubin = (output.reports or read_cubin(output.cubin)), output.cubin
    else:
        symbols = read_cubin(cubin)
    kernels = [_Compiled(signature_for(sym, found)) for sym in symbols]
    kernels.sort(key=lambda k: (k.signature.line is None, k.signature.line or 0, k.symbol))
    base = host_source(source)
    opt = os.environ.get("KERNELLAB_EMU_OPT", "-O1 -g0").split()       # e.g. "-O0 -g" to debug under gdb
    notes, logs = [], []
    top = max(0, min(2, int(checks)))
    # all; the pointer arguments' bounds only; the shared arrays only (pointer arguments plain: a template that
    # deduces T from T* takes them); none
    tries = [(lv, g) for lv, g in ((2, True), (1, True), (2, False), (0, True)) if lv <= top]
    for level, global_checks in tries:
        text = (f'#define KL_CHECKS {level}\n#include "{HEADER}"\n#line {first_line} "{filename}"\n'
                + checked_source(base, level, global_checks) + "\n" + _wrappers(kernels, level, global_checks))
        lib, log = _build(text, opt)
        if lib is not None:
            break
        logs.append(log)
    else:
        raise RuntimeError(f"host compile failed:\n{logs[-1][-4000:]}")
    if logs:
        first = next((ln for ln in logs[0].splitlines() if "error" in ln), logs[0].strip().splitlines()[0]
                     if logs[0].strip() else "")
        notes.append(f"checked on the CPU: {describe_checks(level, global_checks)}; the fuller checks did not "
                     f"compile: {first.strip()[:300]}")
    return HostModule(ctypes.CDLL(str(lib)), kernels, cluster_dims(cubin), level=level, global_checks=global_checks,
                      source=source, first_line=first_line, filename=filename, notes=notes)


def _wrappers(kernels, level: int, global_checks: bool = True) -> str:
    out = []
    for i, k in enumerate(kernels):
        call = k.signature.display
        args = []
        for j, p in enumerate(k.params):
            raw = f"*reinterpret_cast<{_param_type(p)}*>(args[{j}])"
            ptype = _param_type(p)
            if level >= 1 and global_checks and p.pointer and ptype.count("*") == 1 and "CUtensorMap" not in ptype:
                elem = ptype.rsplit("*", 1)[0].strip()
                args.append(f'::kl::gptr<{elem}>({raw}, size_t(extents[{j}]), "{p.name}")')
            else:
                args.append(raw)
        out.append(
            f'extern "C" __attribute__((visibility("default"))) const char* kl_launch_{i}(\n'
            f'        unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, int cluster,\n'
            f'        void** args, const unsigned long long* extents, unsigned long long dyn_bytes) {{\n'
            f'    static thread_local std::string err;\n'
            f'    try {{\n'
            f'        err = kl::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, cluster, [&] {{ {call}({", ".join(args)}); }},'
            f' size_t(dyn_bytes));\n'
            f'    }}\n'
            f'    catch (const std::exception& e) {{ err = e.what(); }}\n'
            f'    return err.c_str();\n}}\n')
    out.append('extern "C" __attribute__((visibility("default"))) const char* kl_findings() {\n'
               '    static thread_local std::string s; s = kl::findings_text(); return s.c_str(); }\n'
               'extern "C" __attribute__((visibility("default"))) void kl_clear_findings() { kl::clear_findings(); }\n')
    return "\n".join(out)


def cluster_dims(cubin: bytes) -> dict[str, int]:
    """Blocks per cluster (x) of each kernel compiled with __cluster_dims__, from the cubin's .nv.info sections."""
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


class _Compiled:
    """A kernel compiled by NVRTC, as compile_host needs it without a kernellab Module: its signature."""

    def __init__(self, signature):
        self.signature = signature

    name = property(lambda self: self.signature.name)
    symbol = property(lambda self: self.signature.symbol)
    params = property(lambda self: self.signature.params)


class HostModule:
    """The kernels of one source, built for the CPU: `mod[name][grid, block(, cluster)](*args)`."""

    def __init__(self, lib, kernels, clusters, *, level: int = 0, global_checks: bool = True, source: str = "",
                 first_line: int = 1,
                 filename: str = "cell.cu", notes=()):
        self.lib, self.kernels, self.clusters = lib, kernels, clusters
        self.level = level                      # the checks built in (CHECK_LEVELS)
        self.global_checks = global_checks      # False: the pointer arguments' bounds are not checked (SHARED_ONLY)
        self.source, self.first_line, self.filename = source, first_line, filename
        self.notes = tuple(notes)
        self._index = {}
        for i, k in enumerate(kernels):
            for key in {k.name, k.signature.display, k.symbol}:
                self._index.setdefault(key, []).append(i)
        self._findings = lib.kl_findings
        self._findings.restype = ctypes.c_char_p

    def __getitem__(self, name: str) -> HostKernel:
        found = self._index.get(name, [])
        if len(found) != 1:
            raise KeyError(f"{name!r} names {len(found)} kernels; kernels: "
                           f"{[k.signature.display for k in self.kernels]}")
        i = found[0]
        fn = getattr(self.lib, f"kl_launch_{i}")
        fn.restype = ctypes.c_char_p
        return HostKernel(self.kernels[i], fn, self.clusters.get(self.kernels[i].symbol, 1), self)

    def source_line(self, line: int) -> str | None:
        lines = self.source.splitlines()
        i = line - self.first_line
        return lines[i] if 0 <= i < len(lines) else None

    def take_findings(self, kernel: str, text: str | None = None) -> list:
        """The findings of the launch that just ran (kernellab.run.findings.Finding, cell lines), and clear them;
        `text`: the library's findings text, where the launch ran in a child process."""
        if text is None:
            text = self._findings().decode()
            self.lib.kl_clear_findings()
        out, seqs = [], {}
        for row in text.splitlines():
            (tool, kind, message, line, other_line, thread, block, other_thread, access, other_access, name, index,
             size, count, detail, seq) = row.split("\t")

            def loc(n):
                n = int(n)
                return Location(function=kernel, file=self.filename, line=n, cell_line=n,
                                source_line=self.source_line(n))

            def dim(s):
                return tuple(int(v) for v in s.split(",")) if s else None

            other = loc(other_line) if int(other_line) and kind == "race" else None
            out.append(Finding(tool=tool, kind=kind, message=message, where=loc(line), thread=dim(thread),
                               block=dim(block), size_bytes=int(size) or None, detail=detail, other=other,
                               other_access=other_access or None, access=access or None,
                               other_thread=dim(other_thread), count=int(count)))
            seqs[id(out[-1])] = int(seq)
        order = {"memcheck": 0, "racecheck": 1, "synccheck": 2, "initcheck": 3}
        return sorted(out, key=lambda f: (order.get(f.tool, 9), seqs[id(f)]))


class CpuKernelError(RuntimeError):
    """A launch on the CPU path failed: out of bounds (the launch stops there, as on a GPU), a deadlock at a barrier,
    or an error the emulator raised. `findings` holds what the checks found (kernellab.run.findings.Finding)."""

    def __init__(self, message: str, findings=()):
        super().__init__(message)
        self.findings = tuple(findings)


class CpuRun:
    """What one CPU launch did: its error text ('' when it finished) and the checks' findings."""

    def __init__(self, error: str, findings):
        self.error, self.findings = error, tuple(findings)


class HostKernel:
    """One kernel on the CPU: `k[grid, block](*args)`, in clusters of the size it was compiled with."""

    def __init__(self, kernel, fn, cluster: int, module: HostModule | None = None):
        self.kernel, self.fn, self.cluster, self.host = kernel, fn, cluster, module

    def __getattr__(self, name):
        """Everything else (name, signature, resources, occupancy, sass) is the NVRTC-compiled kernel's."""
        if name in ("kernel", "host"):
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, config):
        grid, block = config[:2]
        shared = config[2] if len(config) > 2 else 0
        return lambda *args, cluster=None: self.launch(grid, block, *args, cluster=cluster, shared_bytes=shared)

    def launch(self, grid, block, *args, cluster=None, shared_bytes: int = 0):
        """cluster: blocks per cluster for a kernel without __cluster_dims__ (a launch-time cluster shape);
        shared_bytes: dynamic shared memory (extern __shared__ arrays hold that much). Raises CpuKernelError where
        the launch failed (an out-of-bounds access stops it, as on a GPU)."""
        run = self.run(grid, block, *args, cluster=cluster, shared_bytes=shared_bytes)
        if run.error:
            raise CpuKernelError(f"{self.kernel.signature.display}: {run.error}", run.findings)
        return run

    def run(self, grid, block, *args, cluster=None, shared_bytes: int = 0) -> CpuRun:
        """Launch and return a CpuRun (error text and findings) instead of raising for what the kernel did."""
        if shared_bytes > 227 * 1024:
            raise ValueError(f"{shared_bytes} bytes of dynamic shared memory: more than a block has (227 KiB)")
        dims = [tuple(d) + (1,) * (3 - len(d)) if isinstance(d, (tuple, list)) else (int(d), 1, 1)
                for d in (grid, block)]
        if any(int(v) < 1 for d in dims for v in d):
            raise ValueError(f"grid {dims[0]} and block {dims[1]} must be at least 1 in every dimension")
        if dims[1][0] * dims[1][1] * dims[1][2] > 1024:
            raise ValueError(f"block {dims[1]}: more than 1024 threads")
        params = self.kernel.params
        if len(args) != len(params):
            raise TypeError(f"{self.kernel.signature.display} takes {len(params)} arguments, got {len(args)}")
        n = max(1, len(args))
        keep, ptrs, extents = [], (ctypes.c_void_p * n)(), (ctypes.c_ulonglong * n)()
        for j, (p, a) in enumerate(zip(params, args)):
            if p.pointer:
                if a is None:
                    v, nbytes = ctypes.c_void_p(0), 0
                elif isinstance(a, np.ndarray):
                    if not a.flags.c_contiguous:
                        raise TypeError(f"argument {p.name}: a contiguous array, please")
                    if p.dtype is not None and a.dtype.name != p.dtype:
                        raise TypeError(f"argument {p.name} expects {p.dtype}, got {a.dtype}")
                    v, nbytes = ctypes.c_void_p(a.ctypes.data), a.nbytes
                elif type(a).__module__.startswith("torch"):
                    if a.is_cuda or not a.is_contiguous():
                        raise TypeError(f"argument {p.name}: a contiguous CPU tensor, please")
                    if p.dtype is not None and str(a.dtype).replace("torch.", "") != p.dtype:
                        raise TypeError(f"argument {p.name} expects {p.dtype}, got {a.dtype}")
                    v, nbytes = ctypes.c_void_p(a.data_ptr()), a.numel() * a.element_size()
                else:
                    raise TypeError(f"argument {p.name}: a tensor or a NumPy array, please")
                extents[j] = nbytes
            else:
                if p.dtype not in _CTYPES:
                    raise TypeError(f"argument {p.name} ({p.ctype}): the CPU path passes numbers and pointers only")
                v = _CTYPES[p.dtype](a)
            keep.append(v)
            ptrs[j] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
        c = self.cluster if cluster is None else (cluster if isinstance(cluster, int) else int(cluster[0]))
        if cluster is not None and self.cluster != 1 and c != self.cluster:
            raise ValueError(f"{self.kernel.name} was compiled for clusters of {self.cluster}, not {c}")
        if dims[0][0] % c:
            raise ValueError(f"grid {dims[0]} is not a whole number of clusters of {c}")
        if self.host is not None:
            self.host.lib.kl_clear_findings()
        call = (*dims[0], *dims[1], c, ptrs, extents, ctypes.c_ulonglong(int(shared_bytes)))
        buffers = [(ptrs_value(keep[j]), int(extents[j])) for j, p in enumerate(params) if p.pointer and extents[j]]
        if self.host is not None and (self.host.level < 2 or not self.host.global_checks) and _fork_ok():
            # fewer checks were built in: an access out of bounds could corrupt this process, so the launch runs in
            # a child process and its outputs are copied back
            return self._run_forked(call, buffers)
        err = self.fn(*call)
        del keep           # the argument storage lived through the call
        findings = self.host.take_findings(self.kernel.name) if self.host is not None else []
        return CpuRun(err.decode() if err else "", findings)

    def _run_forked(self, call, buffers) -> CpuRun:
        """The launch in a forked child; its pointer arguments' bytes come back through a pipe."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                          # the child: launch, send the bytes, leave at once
            try:
                os.close(r)
                faulthandler.disable()                        # a crash here is reported by the parent, quietly
                err = self.fn(*call)
                payload = pickle.dumps((err.decode() if err else "", self.host._findings().decode(),
                                        [ctypes.string_at(ptr, n) for ptr, n in buffers]))
                view = memoryview(payload)
                while view:
                    view = view[os.write(w, view):]
            finally:
                os._exit(0)
        os.close(w)
        chunks = []
        while True:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if not chunks:
            why = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {status}")
            return CpuRun(f"the kernel crashed the CPU path ({why}): this build checks "
                          f"{describe_checks(self.host.level, self.host.global_checks)}, "
                          f"so an access out of bounds was not caught where it happened (see the launch's notes)", [])
        err, text, outs = pickle.loads(b"".join(chunks))
        for (ptr, n), data in zip(buffers, outs):
            ctypes.memmove(ptr, data, n)
        return CpuRun(err, self.host.take_findings(self.kernel.name, text))


def ptrs_value(v) -> int:
    return int(v.value or 0)


def _fork_ok() -> bool:
    """Whether launches with fewer checks run in a forked child (POSIX; KERNELLAB_EMU_FORK=0 turns it off)."""
    return hasattr(os, "fork") and os.environ.get("KERNELLAB_EMU_FORK", "1") != "0"
