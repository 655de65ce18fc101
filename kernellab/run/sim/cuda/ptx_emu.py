"""Runs a tutorial's CUDA C++ kernel on the CPU, tensor-core PTX included (tests only): compile it with g++ against
ptx_emu.h and launch it. (emulate.py beside it is the general emulator: fibers, cluster helpers, torch tensors; this
one models the instructions tutorials 05 and 06 use: ldmatrix, mma.sync, cp.async, TMA loads and stores,
mbarriers, named barriers, wgmma, and tutorial 07's attention step 3.)

    out = emulate(source, "sgemm_naive", grid, block, [A, B, C, M, N, K])   # numpy arrays are copied back

Each CUDA thread is an OS thread and blocks run one after another, so keep the problems small (a few blocks of a
few hundred threads). What the emulator models, and what it does not, is listed at the top of ptx_emu.h. The
source is prepared first:
- `#include` lines go (ptx_emu.h provides the types and intrinsics), except kernellab's own headers (`<kl/...>`, on
  the include path: their PTX wrappers call ptx_emu.h's kl_emu:: emulations), and so does a definition of
  `CUtensorMap` (the emulator encodes its own tensor maps);
- every top-level `__device__` helper whose body holds inline PTX (`asm`) goes, and ptx_emu.h's emulation of the
  helper of the same name takes its place (`using kl_emu::name;` where kernellab's headers have the same helper):
  the helpers' names and signatures are a contract (see ptx_emu.h). Inside a namespace the same, and the helper's
  other declarations there go too, so that calls find the emulation;
- a one-statement `fence.mbarrier_init` inline in a function becomes `fence_barrier_init()`, and the source's own
  `typedef unsigned ... uint32_t / uint64_t` lines go (the host's <cstdint> has them);
- `__shared__` arrays become references into one shared-memory arena, `extern __shared__` ones its dynamic part.
A kernel whose own body holds `asm` cannot be emulated: move the PTX into a named helper.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernellab.compile.signature import find_kernels, strip_comments_and_strings
from kernellab.compile.toolkit import KL_INCLUDE, own_headers_digest

from .toolchain import host_compiler, is_gcc, why_none

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("KERNELLAB_EMU_CACHE", Path(tempfile.gettempdir()) / "kernellab-emu"))


class EmulationError(RuntimeError):
    """The emulated kernel failed: it did not build, crashed, hung, or broke a rule ptx_emu.h checks."""


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


# The helpers ptx_emu.h emulates in namespace kl_emu (kernellab's headers have them too): a source's own helper of one
# of these names is replaced by a using-declaration of the emulation.
_KL_EMU = {"cp_async_4", "cp_async_16", "cp_async_commit", "cp_async_wait", "cp_async_wait_all", "ldmatrix_x1",
           "ldmatrix_x2", "ldmatrix_x4", "ldmatrix_x2_trans", "ldmatrix_x4_trans", "mma_16816", "wgmma_fence",
           "wgmma_commit", "wgmma_wait", "wgmma_256", "wgmma_128", "wgmma_ss", "wgmma_rs_tb", "fence_acc"}


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
    call; if PTX remains, the function goes (a helper: ptx_emu.h has its emulation). Returns the name it removed."""
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
    """The kernel source as ptx_emu.h compiles it (see the module docstring)."""
    source = _INT_TYPEDEF.sub("", source)
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
    # ptx_emu.h has its own CUtensorMap (the emulator's encoding): drop the source's definition of the opaque struct
    text = re.sub(r"(typedef\s+)?struct\s+(alignas\s*\(\s*\d+\s*\)\s+)?CUtensorMap\w*\s*\{[^{}]*\}\s*\w*\s*;", "", text)

    counter = iter(range(1, 1 << 30))

    def dynamic(m):
        decl = m.group(1)
        align, rest = _split_align(decl)
        mm = re.fullmatch(r"\s*(.+?)\s*\b(\w+)\s*\[\s*\]\s*", rest)
        if not mm:
            raise EmulationError(f"cannot parse extern __shared__ declaration: {decl}")
        typ, name = mm.group(1), mm.group(2)
        return f"{typ}* {name} = reinterpret_cast<{typ}*>(emu::dynamic_smem());"

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
            out.append(f"auto& {name} = *emu::shared_alloc<{typ}{dims}, {align or 16}, {next(counter)}>();")
        return " ".join(out)

    text = re.sub(r"\bextern\s+__shared__\s+([^;]*);", dynamic, text)
    text = re.sub(r"\b__shared__\s+([^;]*);", static, text)
    return text


def _prepare_namespace(text_clean: str, keep: list, clean: list, start: int, end: int) -> None:
    """Inside a namespace's braces [start, end): helpers holding inline PTX go, and so do their other declarations
    (a primary template's), so that calls from the namespace find ptx_emu.h's global emulation of the same name."""
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
            return f"#define {name}({params}) emu::mma_16816<{ctype}>({params})"
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
        a[m.k].map = emu::make_tensor_map(a[m.alias < 0 ? m.k : m.alias].data.data(), m.d0, m.d1, m.s1, m.b0, m.b1,
                                          m.eb, m.sw, m.d2, m.s2, m.b2);
    emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), shared, dim3(cx, cy, cz), [&] { CALL; });
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


def _headers_text() -> str:
    """ptx_emu.h and the cuda_spellings.h it includes (from HERE, on the include path): part of every cache key."""
    return (HERE / "ptx_emu.h").read_text() + (HERE / "cuda_spellings.h").read_text()


def _precompiled_header() -> Path:
    """ptx_emu.h copied into the cache with (for g++) its precompiled .gch beside it (once per header version): g++
    then parses the C++ library headers once instead of in every build."""
    text = (HERE / "ptx_emu.h").read_text()
    if not is_gcc(_compiler()):
        CACHE.mkdir(parents=True, exist_ok=True)
        header = CACHE / f"ptx_emu-{hashlib.sha256(_headers_text().encode()).hexdigest()[:16]}.h"
        if not header.exists():
            _write_atomically(header, text)
        return header
    digest = hashlib.sha256((_headers_text() + " ".join(_FLAGS)).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    header = CACHE / f"ptx_emu-{digest}.h"
    gch = Path(str(header) + ".gch")
    if not gch.exists():
        _write_atomically(header, text)
        tmp = Path(str(gch) + f".{os.getpid()}.tmp")
        r = subprocess.run([*_compiler(), *_FLAGS, f"-I{HERE}", "-x", "c++-header", str(header), "-o", str(tmp)],
                           capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp, gch)        # without it, g++ parses the header itself: slower, same program
    elif not header.exists():
        _write_atomically(header, text)
    return header


def _write_atomically(path: Path, text: str) -> None:
    """Write through a file of this process's own and a rename: test processes running side by side (pytest -n)
    never see a half-written file."""
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def build(source: str, kernel: str, defines: dict | None = None) -> tuple[Path, object]:
    """Compile `kernel` of `source` for the emulator (cached by content); returns (binary, its SourceKernel)."""
    found = [k for k in find_kernels(source) if k.name == kernel]
    if not found:
        raise EmulationError(f"no __global__ {kernel} in the source")
    k = found[0]
    head = "".join(f"#define {name} {value}\n" for name, value in (defines or {}).items())
    header = _precompiled_header()
    program = (f'#include "{header}"\n{head}\n{prepare(source)}\n' + _MAIN.replace("CALL", _call(k)))
    digest = hashlib.sha256((program + _headers_text() + own_headers_digest()
                             + " ".join(_compiler())).encode()
                            ).hexdigest()[:20]
    binary = CACHE / f"{kernel}-{digest}"
    if not binary.exists():
        cpp = CACHE / f"{kernel}-{digest}.cpp"
        _write_atomically(cpp, program)
        tmp = f"{binary}.{os.getpid()}.tmp"              # this process's own: others may build the same kernel
        cmd = [*_compiler(), *_FLAGS, f"-I{HERE}", f"-I{KL_INCLUDE}", str(cpp), "-o", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise EmulationError(f"{' '.join(_compiler())} failed on {cpp}:\n{r.stderr[-4000:]}")
        os.replace(tmp, binary)
    return binary, k


def emulate(source: str, kernel: str, grid, block, args, shared_bytes: int = 0, *, defines: dict | None = None,
            cluster=(1, 1, 1), timeout_s: float = 300.0) -> list:
    """Launch `kernel`<<<grid, block, shared_bytes>>>(args) (in clusters of `cluster`) in the emulator; numpy arrays
    in `args` are updated."""
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
        Path(f"{d}/args.txt").write_text("\n".join(lines) + "\n")
        try:
            r = subprocess.run([str(binary), d], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"{kernel} did not finish within {timeout_s} s in the emulator (a hang?)") from None
        if r.returncode:
            raise EmulationError(f"{kernel} failed in the emulator (exit {r.returncode}): {r.stderr[-2000:]}")
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                a[...] = np.fromfile(f"{d}/out{i}.bin", dtype=a.dtype).reshape(a.shape)
    return list(args)
