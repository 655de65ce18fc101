"""Compile a CUDA C++ source for the CPU (cuda_host.h: threads as fibers) and launch its kernels on CPU tensors.

    mod = compile_host(source)                   # NVRTC compiles it too: signatures and cluster sizes from the cubin
    mod["softmax_rows<float, 8>"][grid, block](x, y, rows, cols, 32)      # torch CPU tensors and numbers

For tests on machines without a GPU: indexing, guards, barriers, shuffles and the arithmetic of a kernel run for
real, slowly (about a million barrier crossings per second). kernellab's headers (`#include <kl/ptx.cuh>`,
kernellab/include) are on the include path: their PTX wrappers run cuda_host.h's kl_emu:: emulation (their #else
branches). A source's own cluster helpers written in inline PTX (cluster_ctarank, cluster_nctarank, cluster_arrive,
cluster_arrive_relaxed, cluster_wait, cluster_sync, cluster_map), statistic exchange (exchange_init, exchange_push,
exchange_wait, exchange_arm: st.async and an mbarrier), exp_ftz, prefetch_l1 and prefetch_l2 (no-ops) and
programmatic dependent launch's griddepcontrol_wait and griddepcontrol_launch_dependents are cut from the source and
replaced by the emulated ones (the two griddepcontrol statements also where they stand inline, in a kernel too:
no-ops, since launches on the CPU run one after the other); other inline PTX cannot run here.

`emulate` (below) runs a tutorial's kernel as a program of its own on the same runtime, tensor-core PTX included,
for the tests of tutorials 05 to 09 (NumPy arrays and TMA tensor maps, no NVRTC):

    emulate(source, "fa3_bf16_d64", grid, block, [TensorMap(Q, 64, 128), ..., O, N, scale], shared_bytes)

It builds the kernel with KL_SHARED_ARENA (shared memory one arena per block, filled with 0xFF bytes so that a read
of an element nothing wrote is NaN; shared addresses small offsets as on a GPU) and hopper.h's mbarriers, TMA loads
and stores, wgmma and named barriers, and without the checks (a program exits on the first error it finds). The
source is prepared first:
- `#include` lines go (cuda_host.h provides the types and intrinsics), except kernellab's own headers (`<kl/...>`,
  on the include path: their PTX wrappers call the kl_emu:: emulations), and so does a definition of `CUtensorMap`
  (the emulator encodes its own tensor maps);
- every top-level `__device__` helper whose body holds inline PTX (`asm`) goes, and the emulation of the helper of
  the same name takes its place (`using kl_emu::name;` where kernellab's headers have the same helper): the helpers'
  names and signatures are a contract (see hopper.h). Inside a namespace the same, and the helper's other
  declarations there go too, so that calls find the emulation;
- a one-statement `fence.mbarrier_init` inline in a function becomes `fence_barrier_init()`, and the source's own
  `typedef unsigned ... uint32_t / uint64_t` lines go (the host's <cstdint> has them);
- `__shared__` arrays become references into the block's arena, `extern __shared__` ones its dynamic part.
A kernel whose own body holds `asm` cannot be emulated: move the PTX into a named helper.

Builds are cached (KERNELLAB_EMU_DIR, else <tmp>/kernellab-emu) by content. One program holds every kernel of a
source (the compiler compiles them all in any case), launched by name; the runtime's headers come precompiled (g++:
a .gch, clang from the ziglang wheel: a .pch), parsed once per header version instead of in every build.
"""
from __future__ import annotations

import ctypes
import faulthandler
import hashlib
import os
import pathlib
import pickle
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from ....analysis.arch import DEFAULT_ARCH, normalize_arch
from ....compile.cubin import read_cubin
from ....compile.nvrtc import compile_cached
from ....compile.signature import (ATTRIBUTE_WORDS, defines_from_options, find_kernels, match_bracket, signature_for,
                                   split_top_level, strip_comments_and_strings)
from ....compile.toolkit import KL_INCLUDE, find_tool, own_headers_digest
from ...findings import Finding, Location
from ...launch.job import KernelImage
from ...launch.launch import check_on_arch

from .toolchain import host_compiler, is_gcc, why_none

HERE = pathlib.Path(__file__).resolve().parent
HEADER = HERE / "cuda_host.h"
HOST_HEADERS = ("cuda_host.h", "cuda_spellings.h", "checks.h", "hopper.h")     # what a build includes from HERE
EMULATED = ("cluster_ctarank", "cluster_nctarank", "cluster_arrive", "cluster_wait", "cluster_sync", "cluster_map",
            "exp_ftz", "cluster_arrive_relaxed", "exchange_init", "exchange_push", "exchange_wait",
            "exchange_arm", "prefetch_l1", "prefetch_l2", "griddepcontrol_wait", "griddepcontrol_launch_dependents")
# One-statement PTX a function (a kernel too) may hold inline, and the emulator's call for it: programmatic dependent
# launch's two instructions (no-ops on the CPU: cuda_host.h says why).
_STATEMENT_PTX = {name: r'asm\s+(?:volatile\s*)?\(\s*"' + ptx.replace(".", r"\.") + r';(?:\\n)?"\s*(?::\s*)*(?:"memory"\s*)?\)\s*;'
                  for name, ptx in (("griddepcontrol_wait", "griddepcontrol.wait"),
                                    ("griddepcontrol_launch_dependents", "griddepcontrol.launch_dependents"))}


def statement_ptx(source: str) -> str:
    """`source` with each one-statement PTX of _STATEMENT_PTX (griddepcontrol.wait, ...), in a kernel or a helper,
    replaced by its emulation's call `kl_emu::name();` (same length: line numbers and columns stay)."""
    for name, pattern in _STATEMENT_PTX.items():
        source = re.sub(pattern, lambda m, name=name: f"kl_emu::{name}();".ljust(len(m.group(0))), source)
    return source


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
    text = statement_ptx(text)
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
        params = split_top_level(re.sub(r"\\[ \t]*\n", " ", clean[name_at + 1:close]))   # a macro's lines joined
        if global_checks:
            new = ", ".join(_checked_param(p) for p in params if p.strip())
            # the lines kept; inside a #define (a kernel a macro defines) each line still ends with its backslash
            fill = "".join(" \\\n" if re.search(r"\\[ \t]*$", ln) else "\n"
                           for ln in clean[name_at + 1:close].split("\n")[:-1])
            edits.append((name_at + 1, close, new + fill))
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
    tmp = build / f"{key}.{os.getpid()}.so"
    cmd = [*command, "-std=c++17", *opt, "-shared", "-fPIC", "-w", "-pthread", *flags, "-o", str(tmp), str(src)]
    first, _, rest = text.partition("\n#line ")
    pch = None if is_gcc(command) else _host_pch(build, first, [*command, "-std=c++17", *opt, "-fPIC", "-w",
                                                               "-pthread", *flags])
    if pch is not None:
        # clang: the checks' level and cuda_host.h come from a .pch (-include-pch); those lines left blank
        src.write_text("\n" * first.count("\n") + "\n#line " + rest)
        proc = subprocess.run([*cmd[:-3], "-include-pch", str(pch), *cmd[-3:]], capture_output=True, text=True)
        if proc.returncode and re.search(r"precompiled|\.pch\b|PCH|AST file", proc.stderr):
            pch.unlink(missing_ok=True)         # stale (a header or the compiler changed under it): built again next time
            pch = None
    if pch is None:
        src.write_text(text)
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        if "error:" in proc.stderr:         # the source's own errors (not a compiler that did not start): kept
            part = build / f"{key}.{os.getpid()}.failed"
            part.write_text(proc.stderr[-6000:])
            part.replace(failed)
        return None, proc.stderr[-6000:] or proc.stdout[-6000:]
    tmp.replace(lib)
    return lib, ""


def _host_pch(build: pathlib.Path, first: str, command: list[str]) -> pathlib.Path | None:
    """The precompiled form of a CPU build's first lines (`first`: the checks' level and cuda_host.h), made once per
    level, header version, compiler and flags; None where it cannot be made (the build then parses the headers)."""
    if not first.startswith("#define KL_CHECKS") or "#line" in first:
        return None
    key = hashlib.sha256("\0".join([first, *(((HERE / h).read_text()) for h in HOST_HEADERS), own_headers_digest(),
                                    *command]).encode()).hexdigest()[:16]
    header = build / f"host-{key}.h"
    pch = build / f"host-{key}.h.pch"
    if pch.exists():
        return pch
    if not header.exists():
        part = build / f"host-{key}.{os.getpid()}.h"
        part.write_text(first + "\n")
        part.replace(header)
    tmp = build / f"host-{key}.{os.getpid()}.pch.tmp"
    r = subprocess.run([*command, "-x", "c++-header", str(header), "-o", str(tmp)], capture_output=True, text=True)
    if r.returncode:
        tmp.unlink(missing_ok=True)
        return None
    tmp.replace(pch)
    return pch


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
    found = find_kernels("\n" * (first_line - 1) + source, defines_from_options(options))
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
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:                                          # the child: launch, send the bytes, leave at once
            try:
                die_with_parent(parent)
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


def die_with_parent(parent: int) -> None:
    """In a forked child: be killed when the thread that forked it ends (Linux's PR_SET_PDEATHSIG), and leave at once
    where `parent` is already gone, so that a launch that never ends cannot outlive the process that waits for it (a
    grading worker restarted by its nanny, a test's process killed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)            # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):                     # not Linux: the child ends only with its launch
        return
    if os.getppid() != parent:                            # the parent ended between fork() and prctl()
        os._exit(1)


def ptrs_value(v) -> int:
    return int(v.value or 0)


def _fork_ok() -> bool:
    """Whether launches with fewer checks run in a forked child (POSIX; KERNELLAB_EMU_FORK=0 turns it off)."""
    return hasattr(os, "fork") and os.environ.get("KERNELLAB_EMU_FORK", "1") != "0"


# --- a kernel as a program of its own: emulate() ----------------------------------------------------------------

CACHE = pathlib.Path(os.environ.get("KERNELLAB_EMU_DIR", pathlib.Path(tempfile.gettempdir()) / "kernellab-emu"))


class EmulationError(RuntimeError):
    """The emulated kernel failed: it did not build, crashed, hung, or broke a rule cuda_host.h or hopper.h checks."""


@dataclass(frozen=True, eq=False)
class TensorMap:
    """A TMA tensor map (a `CUtensorMap` argument) over `array` [dim1, dim0] or [dim2, dim1, dim0]: box [box1, box0]
    (by box2 along dim2), swizzle 0 or 128. Where `array` is also one of the launch's pointer arguments (the same
    object), the map aliases it: what a TMA store writes through the map comes back in that argument."""

    array: np.ndarray
    box0: int
    box1: int
    swizzle_bytes: int = 128
    box2: int = 1


def bf16_bits(x) -> np.ndarray:
    """float32 values -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# --- preparing the source ------------------------------------------------------------------------------------------

def _top_level_blocks(text: str):
    """(header_start, body_open, body_close) of each top-level {...} block of comment-free `text`."""
    depth, start, header = 0, 0, 0
    out = []
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append((header, start, i))
                header = i + 1
        elif depth == 0 and ch == ";":
            header = i + 1
        elif depth == 0 and ch == "\n" and text[header:i].lstrip().startswith("#"):
            header = i + 1          # a preprocessor line ends a header
    return out


# One-statement PTX that a device function may hold inline, and the emulator's call for it (the helper named as the
# call, which holds just this PTX, goes like any other).
_INLINE_PTX = {"fence_barrier_init": r'asm\s+(?:volatile\s*)?\(\s*"fence\.mbarrier_init\.release\.cluster;(?:\\n)?"'
                                     r'\s*(?::\s*)*(?:"memory"\s*)?\)\s*;'}
# The fixed-width integer typedefs an NVRTC source spells itself (the host's <cstdint> has its own).
_INT_TYPEDEF = re.compile(r"(?m)^[ \t]*typedef\s+unsigned\s+(?:int|long\s+long)\s+uint(?:32|64)_t\s*;")


def _blank(keep: list, start: int, end: int) -> None:
    for j in range(start, end):
        if keep[j] != "\n":
            keep[j] = " "


def _function_name(head: str) -> str | None:
    m = re.search(r"(\w+)\s*(?:<[^<>(){};]*>)?\s*\($", head.strip().split("(")[0] + "(")
    return m.group(1) if m else None


# The helpers cuda_host.h and hopper.h emulate in namespace kl_emu (kernellab's headers have them too): a source's own helper of one
# of these names is replaced by a using-declaration of the emulation.
_KL_EMU = {"cp_async_4", "cp_async_16", "cp_async_commit", "cp_async_wait", "cp_async_wait_all", "ldmatrix_x1",
           "ldmatrix_x2", "ldmatrix_x4", "ldmatrix_x2_trans", "ldmatrix_x4_trans", "mma_16816", "wgmma_fence",
           "wgmma_commit", "wgmma_wait", "wgmma_256", "wgmma_128", "wgmma_ss", "wgmma_ss_tb", "wgmma_rs_tb",
           "fence_acc", "griddepcontrol_wait", "griddepcontrol_launch_dependents", "prefetch_l2"}


def _using(keep: list, start: int, end: int, name: str) -> None:
    """Write `using kl_emu::name;` into the blanked span [start, end) of `keep`, on its longest line (line numbers
    stay)."""
    text = "using kl_emu::" + name + ";"
    best, at, run = 0, start, 0
    for j in range(start, end):
        run = 0 if keep[j] == "\n" else run + 1
        if run > best:
            best, at = run, j - run + 1
    if best >= len(text):
        keep[at:at + len(text)] = list(text)
    else:
        keep[end - 1] = keep[end - 1] + text + "\n"


def _strip_ptx(keep: list, clean: list, header: int, open_: int, close: int, where: str) -> str | None:
    """A function definition [header, close] holding inline PTX: its known one-statement PTX becomes the emulator's
    call; if PTX remains, the function goes (a helper: hopper.h or cuda_host.h has its emulation). Returns the name it removed."""
    head = "".join(clean[header:open_])
    if re.search(r"\bstruct\b|\bclass\b|\bnamespace\b", head):
        raise EmulationError(f"inline PTX inside a type{where} cannot be emulated: {head.strip()[:60]}")
    name = _function_name(head)
    for call, pattern in _INLINE_PTX.items():
        if name == call:
            continue
        body = "".join(keep[open_:close + 1])
        for m in re.finditer(pattern, body):
            if "\n" in m.group(0):
                continue
            repl = (call + "();").ljust(len(m.group(0)))
            keep[open_ + m.start():open_ + m.end()] = list(repl)
            clean[open_ + m.start():open_ + m.end()] = list(repl)
    if not re.search(r"\basm\b", "".join(clean[open_:close + 1])):
        return None
    if "__global__" in head:
        raise EmulationError("a __global__ function holds inline PTX itself; move it into a __device__ helper")
    _blank(keep, header, close + 1)
    if name in _KL_EMU:
        _using(keep, header, close + 1, name)
    return name


def prepare(source: str) -> str:
    """The kernel source as `emulate` compiles it (see its docstring)."""
    source = statement_ptx(_INT_TYPEDEF.sub("", source))
    text_clean = strip_comments_and_strings(source)
    clean = list(text_clean)
    keep = list(source)
    removed = set()
    for header, open_, close in _top_level_blocks(text_clean):
        if not re.search(r"\basm\b", text_clean[open_:close + 1]):
            continue
        if re.search(r"\bnamespace\b", text_clean[header:open_]):
            _prepare_namespace(text_clean, keep, clean, open_ + 1, close)
        else:
            removed.add(_strip_ptx(keep, clean, header, open_, close, ""))
    _blank_declarations(text_clean, keep, 0, len(text_clean), removed & _KL_EMU)   # the using-declarations stand
    text = "".join(keep)
    text = re.sub(r"(?m)^\s*#\s*include\s*[<\"](?!kl/).*$", "", text)
    strings = dict(re.findall(r'(?m)^\s*#\s*define\s+(\w+)\s+("[^\n]*")\s*$', text))   # PTX text in a macro
    text = re.sub(r"(?m)^\s*#\s*define\s+(\w+)\(([^)]*)\)\s+.*\basm\b.*$", lambda m: _ptx_macro(m, strings), text)
    # hopper.h has its own CUtensorMap (the emulator's encoding): drop the source's definition of the opaque struct
    text = re.sub(r"(typedef\s+)?struct\s+(alignas\s*\(\s*\d+\s*\)\s+)?CUtensorMap\w*\s*\{[^{}]*\}\s*\w*\s*;", "", text)

    counter = iter(range(1, 1 << 30))

    def dynamic(m):
        decl = m.group(1)
        align, rest = _split_align(decl)
        mm = re.fullmatch(r"\s*(.+?)\s*\b(\w+)\s*\[\s*\]\s*", rest)
        if not mm:
            raise EmulationError(f"cannot parse extern __shared__ declaration: {decl}")
        typ, name = mm.group(1), mm.group(2)
        return f"{typ}* {name} = reinterpret_cast<{typ}*>(kl::dynamic_smem());"

    def static(m):
        decl = m.group(1)
        align, rest = _split_align(decl)
        mm = re.fullmatch(r"\s*((?:const\s+)?[A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)"
                          r"\s+(\w+\s*(?:\[[^\]]+\]\s*)+(?:,.*)?)", rest, re.S)
        if not mm:
            raise EmulationError(f"cannot parse __shared__ declaration: {decl}")
        typ, declarators = mm.group(1), mm.group(2)
        out = []
        for d in _split_commas(declarators):
            dm = re.fullmatch(r"\s*(\w+)\s*((?:\[[^\]]+\]\s*)+)", d)
            if not dm:
                raise EmulationError(f"cannot parse __shared__ declarator: {d}")
            name, dims = dm.group(1), re.sub(r"\s+", "", dm.group(2))
            out.append(f"auto& {name} = *kl::shared_alloc<{typ}{dims}, {align or 16}, {next(counter)}>();")
        return " ".join(out)

    text = re.sub(r"\bextern\s+__shared__\s+([^;]*);", dynamic, text)
    text = re.sub(r"\b__shared__\s+([^;]*);", static, text)
    return text


def _prepare_namespace(text_clean: str, keep: list, clean: list, start: int, end: int) -> None:
    """Inside a namespace's braces [start, end): helpers holding inline PTX go, and so do their other declarations
    (a primary template's), so that calls from the namespace find hopper.h's global emulation of the same name."""
    inner = text_clean[start:end]
    removed = set()
    for header, open_, close in _top_level_blocks(inner):
        if re.search(r"\basm\b", inner[open_:close + 1]):
            name = _strip_ptx(keep, clean, start + header, start + open_, start + close, " or nested namespace")
            if name:
                removed.add(name)
    _blank_declarations(text_clean, keep, start, end, removed)


def _blank_declarations(text_clean: str, keep: list, start: int, end: int, names) -> None:
    """Blank the declarations (no body) of `names` at the top level of text_clean[start:end), not calls in bodies."""
    inner = text_clean[start:end]
    depth, depths = 0, []
    for ch in inner:
        depth += (ch == "{") - (ch == "}")
        depths.append(depth)
    for name in names:
        for m in re.finditer(r"[^;{}]*\b" + name + r"\s*\([^;{}]*\)\s*;", inner):
            if depths[m.start()] == 0:
                lines = inner[m.start():m.end()].split("\n")      # preprocessor lines before it stay
                last = max((i for i, l in enumerate(lines) if l.lstrip().startswith("#")), default=-1)
                first = m.start() + sum(len(l) + 1 for l in lines[:last + 1])
                _blank(keep, start + first, start + m.end())


def _ptx_macro(m, strings: dict) -> str:
    """A `#define NAME(d, a, b) asm volatile(...)` one-liner of PTX, as the emulator's call (mma.sync only); the PTX
    text may be a string macro of its own (`asm volatile(MMA_PTX : ...)`)."""
    line, name, params = m.group(0), m.group(1), m.group(2)
    line = re.sub(r"\b\w+\b", lambda w: strings.get(w.group(0), w.group(0)), line)
    for dtype, ctype in (("bf16", "__nv_bfloat16"), ("f16", "__half")):
        if "mma.sync" in line and f".{dtype}.{dtype}" in line:
            return f"#define {name}({params}) kl::mma_16816<{ctype}>({params})"
    raise EmulationError(f"inline PTX in macro {name} is not one the emulator knows: {line.strip()[:80]}")


def _split_align(decl: str) -> tuple[int | None, str]:
    m = re.search(r"__align__\s*\(\s*(\d+)\s*\)|alignas\s*\(\s*(\d+)\s*\)", decl)
    if not m:
        return None, decl
    return int(m.group(1) or m.group(2)), decl[:m.start()] + " " + decl[m.end():]


def _split_commas(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[(<"
        depth -= ch in "])>"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


# --- building and running ------------------------------------------------------------------------------------------

_MAIN = r"""
#include <fstream>
#include <sstream>
#include <string>
namespace emu_main {
struct Arg { std::vector<unsigned char> data; long long i = 0; double f = 0; CUtensorMap map{}; };
}
int main(int argc, char** argv) {
    std::string dir = argv[1];
    std::ifstream in(dir + "/args.txt");
    unsigned gx, gy, gz, bx, by, bz, cx, cy, cz; size_t shared;
    in >> gx >> gy >> gz >> bx >> by >> bz >> shared >> cx >> cy >> cz;
    int n; in >> n;
    std::vector<emu_main::Arg> a(n);
    std::vector<std::string> kinds(n);
    struct Map { int k, alias; unsigned long long d0, d1, s1, d2, s2; unsigned b0, b1, eb, sw, b2; };
    std::vector<Map> maps;
    for (int k = 0; k < n; ++k) {
        std::string kind; in >> kind; kinds[k] = kind;
        if (kind == "buf") {
            size_t bytes; in >> bytes;
            a[k].data.resize(bytes + 64);
            std::ifstream f(dir + "/arg" + std::to_string(k) + ".bin", std::ios::binary);
            f.read(reinterpret_cast<char*>(a[k].data.data()), bytes);
        } else if (kind == "int") { in >> a[k].i; }
        else if (kind == "float") { in >> a[k].f; }
        else if (kind == "tmap") {                                   // the tensor's bytes, then the map
            size_t bytes; unsigned long long d0, d1, s1, d2, s2; unsigned b0, b1, eb, sw, b2; int alias;
            in >> bytes >> d0 >> d1 >> s1 >> b0 >> b1 >> eb >> sw >> d2 >> s2 >> b2 >> alias;
            maps.push_back({k, alias, d0, d1, s1, d2, s2, b0, b1, eb, sw, b2});
            if (alias < 0) {
                a[k].data.resize(bytes + 64);
                std::ifstream f(dir + "/arg" + std::to_string(k) + ".bin", std::ios::binary);
                f.read(reinterpret_cast<char*>(a[k].data.data()), bytes);
            }
        }
    }
    for (auto& m : maps)        // a map over a buffer argument (a TMA store's output) aliases that buffer
        a[m.k].map = kl::make_tensor_map(a[m.alias < 0 ? m.k : m.alias].data.data(), m.d0, m.d1, m.s1, m.b0, m.b1,
                                          m.eb, m.sw, m.d2, m.s2, m.b2);
    if (cy * cz != 1) { std::fprintf(stderr, "emu: clusters along x only\n"); return 3; }
    WHICH
    std::string err = kl::launch(dim3{gx, gy, gz}, dim3{bx, by, bz}, int(cx), [&] { CALL; }, shared);
    if (!err.empty()) { std::fprintf(stderr, "emu: %s\n", err.c_str()); return 3; }
    for (int k = 0; k < n; ++k)
        if (kinds[k] == "buf") {
            std::ofstream f(dir + "/out" + std::to_string(k) + ".bin", std::ios::binary);
            f.write(reinterpret_cast<const char*>(a[k].data.data()), a[k].data.size() - 64);
        }
    return 0;
}
"""


def _call(kernel) -> str:
    parts = []
    for k, p in enumerate(kernel.params):
        if p.pointer:                                   # (None: a null pointer)
            parts.append(f"(a[{k}].data.empty() ? nullptr : reinterpret_cast<{p.base}*>(a[{k}].data.data()))")
        elif p.base == "CUtensorMap":
            parts.append(f"a[{k}].map")
        elif p.base in ("float", "double"):
            parts.append(f"({p.base})a[{k}].f")
        else:
            parts.append(f"({p.base})a[{k}].i")
    return f"{kernel.name}({', '.join(parts)})"


_FLAGS = ("-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing", "-w")


def _compiler() -> tuple[str, ...]:
    """The host C++ compiler's command (toolchain.py: clang from the ziglang wheel, else g++)."""
    found = host_compiler()
    if found is None:
        raise EmulationError(why_none())
    return found[0]


_PROGRAM_HEADER = f'#define KL_CHECKS 0\n#define KL_SHARED_ARENA 1\n#include "{HEADER}"\n'


def _headers_text() -> str:
    """The runtime's headers (cuda_host.h and what it includes): part of every cache key."""
    return _PROGRAM_HEADER + "".join((HERE / h).read_text() for h in HOST_HEADERS)


def _precompiled_header() -> pathlib.Path:
    """The programs' first lines (cuda_host.h with the arena and without the checks) as a header in the cache, with
    its precompiled form beside it (once per header version; g++: a .gch the textual #include finds, clang: a .pch
    that build() passes with -include-pch): the compiler then parses the runtime and the C++ library headers once
    instead of in every build (about a second of each clang build of the ziglang wheel)."""
    digest = hashlib.sha256((_headers_text() + " ".join(_FLAGS)).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    header = CACHE / f"program-{digest}.h"
    if not header.exists():
        _write_atomically(header, _PROGRAM_HEADER)
    pre = _pch_path(header)
    if not pre.exists():
        tmp = pathlib.Path(f"{pre}.{os.getpid()}.tmp")
        r = subprocess.run([*_compiler(), *_FLAGS, f"-I{HERE}", f"-I{KL_INCLUDE}", "-x", "c++-header", str(header),
                            "-o", str(tmp)], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp, pre)        # without it, the compiler parses the header itself: slower, same program
        else:
            tmp.unlink(missing_ok=True)
    return header


def _pch_path(header: pathlib.Path) -> pathlib.Path:
    """The precompiled form of `header`: g++ looks for <header>.gch itself; clang is given <header>.pch."""
    return pathlib.Path(str(header) + (".gch" if is_gcc(_compiler()) else ".pch"))


def _write_atomically(path: pathlib.Path, text: str) -> None:
    """Write through a file of this process's own and a rename: test processes running side by side (pytest -n)
    never see a half-written file."""
    tmp = pathlib.Path(f"{path}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def build(source: str, kernel: str, defines: dict | None = None) -> tuple[pathlib.Path, object]:
    """Compile `kernel` of `source` for the emulator (cached by content); returns (binary, its SourceKernel).

    The binary holds every (non-template) kernel of `source`, the one to launch named by its second argument: the
    host compiler compiles every kernel of the source in any case, so one build serves them all (a cell's ten
    kernels cost one build, not ten). Where that program does not compile (a kernel the preprocessor removes, say),
    the binary holds `kernel` alone."""
    found = [k for k in find_kernels(source, defines) if k.name == kernel]
    if not found:
        raise EmulationError(f"no __global__ {kernel} in the source")
    k = found[0]
    head = "".join(f"#define {name} {value}\n" for name, value in (defines or {}).items())
    header = _precompiled_header()
    body = f'#include "{header}"\n{head}\n{prepare(source)}\n'
    every = [c for c in find_kernels(source, defines) if not c.template]
    names = [c.name for c in every]
    if not k.template and len(set(names)) == len(names) and len(every) > 1:
        calls = "switch (which) {" + " ".join(f"case {i}: {_call(c)}; break;" for i, c in enumerate(every)) + "}"
        which = ("const std::string name = argc > 2 ? argv[2] : \"\"; int which = -1;\n    "
                 + " ".join(f'if (name == "{c.name}") which = {i};' for i, c in enumerate(every))
                 + '\n    if (which < 0) { std::fprintf(stderr, "emu: no kernel %s\\n", name.c_str()); return 3; }')
        binary = _compile_program("cell", body + _MAIN.replace("WHICH", which).replace("CALL", calls), header,
                                  missing_ok=True)
        if binary is not None:
            return binary, k
    return _compile_program(kernel, body + _MAIN.replace("WHICH", "").replace("CALL", _call(k)), header), k


def _compile_program(stem: str, program: str, header: pathlib.Path, missing_ok: bool = False) -> pathlib.Path | None:
    """The emulator binary of `program` (cached by content; a failed build is remembered where `missing_ok`: None)."""
    digest = hashlib.sha256((program + _headers_text() + own_headers_digest()
                             + " ".join(_compiler())).encode()
                            ).hexdigest()[:20]
    binary = CACHE / f"{stem}-{digest}"
    failed = CACHE / f"{stem}-{digest}.failed"
    if missing_ok and failed.exists():
        return None
    if not binary.exists():
        cpp = CACHE / f"{stem}-{digest}.cpp"
        tmp = f"{binary}.{os.getpid()}.tmp"              # this process's own: others may build the same kernel
        cmd = [*_compiler(), *_FLAGS, f"-I{HERE}", f"-I{KL_INCLUDE}", str(cpp), "-o", tmp]
        pch = _pch_path(header)
        if not is_gcc(_compiler()) and pch.exists():
            # clang: the header comes from its .pch (-include-pch), its #include line left blank (same line numbers)
            _write_atomically(cpp, "\n" + program.split("\n", 1)[1])
            r = subprocess.run([*cmd[:-3], "-include-pch", str(pch), *cmd[-3:]], capture_output=True, text=True)
            if r.returncode and re.search(r"precompiled|\.pch\b|PCH|AST file", r.stderr):
                pch.unlink(missing_ok=True)     # stale (a header or the compiler changed under it): built again next time
                _write_atomically(cpp, program)
                r = subprocess.run(cmd, capture_output=True, text=True)
        else:
            _write_atomically(cpp, program)
            r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            if missing_ok:
                if "error" in r.stderr:         # the program's own errors, not a compiler that did not start
                    _write_atomically(failed, r.stderr[-4000:])
                return None
            raise EmulationError(f"{' '.join(_compiler())} failed on {cpp}:\n{r.stderr[-4000:]}")
        os.replace(tmp, binary)
    return binary


def emulate(source: str, kernel: str, grid, block, args, shared_bytes: int = 0, *, defines: dict | None = None,
            cluster=(1, 1, 1), timeout_s: float = 300.0, image: KernelImage | None = None) -> list:
    """Launch `kernel`<<<grid, block, shared_bytes>>>(args) (in clusters of `cluster`) in the emulator; numpy arrays
    in `args` are updated.

    The launch is first checked as a GPU launch is (run/launch/launch.py's check_on_arch), so that what the GPU
    refuses is refused here too: `image`, the kernel compiled for its GPU from the same source and defines
    (Kernel.image(): ptxas's registers, static shared memory, max_threads_per_block, arch), gives every check, the
    registers' included (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES); without it, only what needs no compile for the GPU
    (threads per block, dynamic shared memory against sm_90's limits, the cluster shape)."""
    if image is not None and image.name != kernel and image.symbol != kernel:
        raise EmulationError(f"image= is {image.name}'s, not {kernel}'s: pass the image of the kernel launched")
    check_on_arch(image or KernelImage(symbol=kernel, name=kernel, signature="", params=(), arch=DEFAULT_ARCH),
                  grid, block, shared_bytes, None if tuple(cluster) in ((1,), (1, 1), (1, 1, 1)) else cluster)
    binary, k = build(source, kernel, defines)
    if len(args) != len(k.params):
        raise EmulationError(f"{kernel} takes {len(k.params)} arguments, got {len(args)}")
    grid = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    block = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (block, 1, 1)
    with tempfile.TemporaryDirectory() as d:
        cluster = tuple(cluster) + (1,) * (3 - len(tuple(cluster)))
        lines = [" ".join(map(str, grid + block + (shared_bytes,) + cluster)), str(len(args))]
        for i, (a, p) in enumerate(zip(args, k.params)):
            if isinstance(a, np.ndarray):
                if not p.pointer:
                    raise EmulationError(f"argument {i} ({p}) is not a pointer but got an array")
                np.ascontiguousarray(a).tofile(f"{d}/arg{i}.bin")
                lines.append(f"buf {a.nbytes}")
            elif isinstance(a, TensorMap):
                buf = np.ascontiguousarray(a.array)
                view = buf if buf.ndim == 3 else buf[None]
                dim2, dim1, dim0 = view.shape
                # a map over an array that is also a pointer argument (a TMA store's C) writes into that argument
                alias = next((j for j, b in enumerate(args) if b is a.array and k.params[j].pointer), -1)
                if alias < 0:
                    buf.tofile(f"{d}/arg{i}.bin")
                elif not a.array.flags.c_contiguous:
                    raise EmulationError(f"argument {i}: a tensor map over a pointer argument must be contiguous")
                lines.append(f"tmap {buf.nbytes} {dim0} {dim1} {view.strides[1]} {a.box0} {a.box1} {buf.itemsize} "
                             f"{a.swizzle_bytes} {dim2} {view.strides[0]} {a.box2} {alias}")
            elif a is None:
                if not p.pointer:
                    raise EmulationError(f"argument {i} ({p}) is not a pointer but got None")
                lines.append("int 0")
            elif isinstance(a, (int, np.integer)):
                lines.append(f"int {int(a)}")
            else:
                lines.append(f"float {float(a)!r}")
        pathlib.Path(f"{d}/args.txt").write_text("\n".join(lines) + "\n")
        try:
            r = subprocess.run([str(binary), d, kernel], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"{kernel} did not finish within {timeout_s} s in the emulator (a hang?)") from None
        if r.returncode:
            raise EmulationError(f"{kernel} failed in the emulator (exit {r.returncode}): {r.stderr[-2000:]}")
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                a[...] = np.fromfile(f"{d}/out{i}.bin", dtype=a.dtype).reshape(a.shape)
    return list(args)
