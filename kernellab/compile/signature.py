"""Kernel signatures: C parameter types parsed from the source and from mangled C++ names."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from dataclasses import dataclass

# C scalar spelling -> (dtype name, size in bytes). dtype names follow NumPy/torch ("bfloat16" included).
SCALAR_TYPES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4), "double": ("float64", 8),
    "__half": ("float16", 2), "half": ("float16", 2),
    "__nv_bfloat16": ("bfloat16", 2), "nv_bfloat16": ("bfloat16", 2),
    "bool": ("bool", 1),
    "char": ("int8", 1), "signed char": ("int8", 1), "unsigned char": ("uint8", 1),
    "short": ("int16", 2), "short int": ("int16", 2), "signed short": ("int16", 2),
    "unsigned short": ("uint16", 2), "unsigned short int": ("uint16", 2),
    "int": ("int32", 4), "signed": ("int32", 4), "signed int": ("int32", 4),
    "unsigned": ("uint32", 4), "unsigned int": ("uint32", 4),
    "long": ("int64", 8), "long int": ("int64", 8), "signed long": ("int64", 8),
    "unsigned long": ("uint64", 8), "unsigned long int": ("uint64", 8),
    "long long": ("int64", 8), "long long int": ("int64", 8), "signed long long": ("int64", 8),
    "unsigned long long": ("uint64", 8), "unsigned long long int": ("uint64", 8),
    "int8_t": ("int8", 1), "uint8_t": ("uint8", 1), "int16_t": ("int16", 2), "uint16_t": ("uint16", 2),
    "int32_t": ("int32", 4), "uint32_t": ("uint32", 4), "int64_t": ("int64", 8), "uint64_t": ("uint64", 8),
    "size_t": ("uint64", 8), "ptrdiff_t": ("int64", 8),
}
# CUDA vector types: pointer to float4 takes a float32 tensor whose data is 16-byte aligned.
VECTOR_TYPES: dict[str, tuple[str, int, int]] = {
    f"{base}{n}": (SCALAR_TYPES[c][0], n, SCALAR_TYPES[c][1] * n)
    for base, c in (("float", "float"), ("double", "double"), ("int", "int"), ("uint", "unsigned int"),
                    ("char", "char"), ("uchar", "unsigned char"), ("short", "short"), ("ushort", "unsigned short"),
                    ("longlong", "long long"), ("ulonglong", "unsigned long long"))
    for n in (1, 2, 3, 4)
} | {"__half2": ("float16", 2, 4), "half2": ("float16", 2, 4), "__nv_bfloat162": ("bfloat16", 2, 4)}

# The TMA descriptor type (<cuda.h>): passed by value as `const __grid_constant__ CUtensorMap`, 128 bytes,
# 64-byte aligned. A C++ kernel's mangled name spells it by its struct tag.
TENSOR_MAP_TYPES = ("CUtensorMap", "CUtensorMap_st")
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN_BYTES = 64

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its C type and what a launch must pass for it."""

    name: str
    ctype: str            # as written (normalised spacing), e.g. "const float* __restrict__"
    base: str             # the type with qualifiers and pointers stripped, e.g. "float"
    pointer: bool
    const: bool
    dtype: str | None     # element dtype for pointers, value dtype for scalars; None when unknown
    vector_width: int = 1  # float4* -> 4
    size_bytes: int = 8    # bytes the parameter takes in the launch (8 for pointers)

    @property
    def tensor_map(self) -> bool:
        """A `CUtensorMap` passed by value: the launch takes a kernellab.TensorMap for it."""
        return not self.pointer and self.base in TENSOR_MAP_TYPES

    @property
    def grid_constant(self) -> bool:
        """Declared `__grid_constant__` (known only where the source was parsed)."""
        return "__grid_constant__" in self.ctype.split()

    @property
    def align_bytes(self) -> int:
        """The parameter's alignment in the launch's parameter buffer."""
        return TENSOR_MAP_ALIGN_BYTES if self.tensor_map else self.size_bytes

    @property
    def supported(self) -> bool:
        return self.dtype is not None or (self.pointer and self.base == "void") or self.tensor_map

    def __str__(self) -> str:
        return f"{self.ctype} {self.name}".strip()


def parse_param(text: str, index: int) -> Param:
    """Parse one parameter declaration such as 'const float* __restrict__ x'."""
    text = " ".join(text.replace("*", " * ").replace("&", " & ").split())
    if "[" in text:  # float x[] is a pointer
        text = re.sub(r"\[[^\]]*\]", "", text).strip() + " *"
    tokens = text.split()
    stars = tokens.count("*")
    ref = "&" in tokens
    const = "const" in tokens
    core = [t for t in tokens if t not in ("*", "&") and t not in _QUALIFIERS]
    name = f"arg{index}"
    # "unsigned int" is a type alone; "unsigned int n" and "float x" end with the parameter's name.
    if len(core) >= 2 and " ".join(core) not in SCALAR_TYPES:
        name = core.pop()
    base = " ".join(core)
    base = re.sub(r"^(std::|::)", "", base)
    ctype = " ".join(w for w in text.split() if w != name or w in core)
    ctype = ctype.replace(" *", "*").replace(" &", "&")
    dtype, width, size = None, 1, 8
    if ref:
        dtype = None
    elif stars >= 1:
        if stars == 1:
            if base in SCALAR_TYPES:
                dtype = SCALAR_TYPES[base][0]
            elif base in VECTOR_TYPES:
                dtype, width, _ = VECTOR_TYPES[base]
    else:
        if base in SCALAR_TYPES:
            dtype, size = SCALAR_TYPES[base]
        elif base in TENSOR_MAP_TYPES:
            size = TENSOR_MAP_BYTES
    return Param(name=name, ctype=ctype, base=base, pointer=stars >= 1, const=const, dtype=dtype,
                 vector_width=width, size_bytes=size)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), <>, [] and {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_params(param_list: str) -> tuple[Param, ...]:
    """Parse the text between a kernel's parentheses."""
    items = [p for p in split_top_level(param_list) if p and p != "void"]
    return tuple(parse_param(re.sub(r"=.*$", "", p).strip(), i) for i, p in enumerate(items))


def strip_comments_and_strings(source: str) -> str:
    """Blank out comments and string/char literals, keeping line structure and offsets."""
    out = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in source[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class SourceKernel:
    """A `__global__` function as found in the source text."""

    name: str
    params: tuple[Param, ...]
    line: int
    template: bool


# Words that take parentheses between __global__ and a kernel's name (not the name).
ATTRIBUTE_WORDS = ("__launch_bounds__", "__attribute__", "alignas", "__cluster_dims__", "__maxnreg__", "__declspec")


# --- the cell's own macros ----------------------------------------------------------------------------------------
# Kernel discovery reads the source text (the launch path packs arguments from the parameter types found here, and
# the CPU emulator's kernel table and the card are built from them), so a kernel that a macro defines, e.g.
#     #define RUNG(name, T, D) extern "C" __global__ void name(const T* x, T* y, int n) { body<T, D>(x, y, n); }
#     RUNG(rung_bf16_d64, __nv_bfloat16, 64)
# is found only once the macros are expanded. Two ways were weighed: (1) the compiled module's entry points with
# their parameter lists from PTX `.entry` declarations; (2) expanding the cell's own #defines here. (1) needs an
# NVRTC compile before a kernel can be named, and PTX spells every parameter `.param .u64` / `.b32`: a pointer's
# element type, constness, `__half` against `short` and a CUtensorMap's `__grid_constant__` are gone, and the
# launch path's dtype checks and the emulator's wrappers need exactly those. (NVRTC has no -E, and a host compiler's
# -E lacks the CUDA headers and may be absent.) (2) is pure text, costs a few milliseconds on tutorial 08's
# 41k-character cell, works where no NVRTC, host compiler or GPU is, and yields the C types as written. So the text
# is expanded: a small C preprocessor for the cell's object-like and function-like `#define`s (with `#undef`, `#`,
# `##`, variadic `__VA_ARGS__`, arguments expanded before substitution, no macro re-entering its own expansion),
# applied in the order the directives stand, with the compile's -D options defined first and #ifdef/#ifndef/
# `#if defined(X)`/`#if 0` decided (see expand_macros for the conditions it cannot decide). Not modelled: macros
# defined in #included headers (their names stay as written; a kernel's parameter type spelled by such a macro is
# unknown to the launch path, as it was before the expansion).

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(define|undef|ifdef|ifndef|if|elif|else|endif)\b[ \t]*(.*)$")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\.?\d(?:[eEpP][+-]|[\w.])*|##|#|\s+|.", re.S)
_MAX_DEPTH = 64


@dataclass(frozen=True)
class _Macro:
    params: tuple[str, ...] | None      # None: object-like
    body: tuple[str, ...]               # the replacement list's tokens (whitespace runs kept)


def _define(line: str, macros: dict) -> None:
    m = re.match(r"([A-Za-z_]\w*)(\(([^)]*)\))?(.*)$", line, re.S)
    if not m:
        return
    params = None
    if m.group(2) is not None:          # function-like only when '(' follows the name directly
        params = tuple(p.strip() for p in m.group(3).split(",")) if m.group(3).strip() else ()
        params = tuple("__VA_ARGS__" if p == "..." else p for p in params)
    macros[m.group(1)] = _Macro(params, tuple(_TOKEN.findall(m.group(4).strip())))


def _macro_args(text: str, i: int) -> tuple[list[str], int] | None:
    """The arguments of the invocation whose '(' is text[i] (split at commas outside parentheses only, as cpp does;
    `a<b, c>` is two arguments) and the index after its ')'; None where it never closes."""
    depth, start, args = 0, i + 1, []
    for j in range(i, len(text)):
        c = text[j]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:j])
                return args, j + 1
        elif c == "," and depth == 1:
            args.append(text[start:j])
            start = j + 1
    return None


def _substitute(macro: _Macro, args: list[str], macros: dict, hidden: frozenset, depth: int) -> str:
    """The replacement list with the arguments put in (`#p`, `a ## b`), before the rescan."""
    params = macro.params or ()
    if params and params[-1] == "__VA_ARGS__" and len(args) > len(params):
        args = args[:len(params) - 1] + [",".join(args[len(params) - 1:])]
    raw = {p: " ".join(a.split()) for p, a in zip(params, args)}
    toks = list(macro.body)
    out: list[str] = []
    paste = False
    following: list[int | None] = [None] * len(toks)        # the next token that is not whitespace
    for k in range(len(toks) - 2, -1, -1):
        following[k] = k + 1 if not toks[k + 1].isspace() else following[k + 1]
    i = 0
    while i < len(toks):
        t = toks[i]
        nxt = following[i]
        if t == "##":
            while out and out[-1].isspace():
                out.pop()
            paste = True
        elif t.isspace():
            if not paste:
                out.append(" ")
        elif t == "#" and macro.params is not None and nxt is not None and toks[nxt] in raw:
            out.append('" "')           # a string (its text is blanked, as strip_comments_and_strings does)
            i = nxt
        else:
            before_paste = nxt is not None and toks[nxt] == "##"
            if t in raw:
                piece = raw[t] if (paste or before_paste) else _expand(raw[t], macros, hidden, depth + 1)
            else:
                piece = t
            if paste and out:
                out[-1] = out[-1] + piece
            else:
                out.append(piece)
            paste = False
        i += 1
    return "".join(out)


def _expand(text: str, macros: dict, hidden: frozenset = frozenset(), depth: int = 0) -> str:
    """`text` with every macro of `macros` expanded; an invocation spanning lines keeps its newlines after it."""
    if depth > _MAX_DEPTH or not macros:
        return text
    out = []
    i = 0
    for m in re.finditer(r"[A-Za-z_]\w*|\d[\w.]*", text):
        if m.start() < i:
            continue
        name = m.group(0)
        macro = macros.get(name)
        if macro is None or name in hidden:
            continue
        if macro.params is None:
            rep, end = _substitute(macro, [], macros, hidden, depth), m.end()
        else:
            k = m.end()
            while k < len(text) and text[k].isspace():
                k += 1
            if k >= len(text) or text[k] != "(":
                continue                # a function-like macro's name without arguments stays
            parsed = _macro_args(text, k)
            if parsed is None:
                continue
            args, end = parsed
            if args == [""] and not macro.params:
                args = []
            rep = _substitute(macro, args, macros, hidden, depth)
        rep = _expand(rep, macros, hidden | {name}, depth + 1).replace("\n", " ")
        out.append(text[i:m.start()] + rep + "\n" * text.count("\n", m.start(), end))
        i = end
    out.append(text[i:])
    return "".join(out)


def defines_from_options(options) -> dict[str, str]:
    """The macros that compile options define: `-DNAME`, `-DNAME=VALUE`, `-D NAME=VALUE`, `--define-macro=...`."""
    out: dict[str, str] = {}
    items = list(options or ())
    i = 0
    while i < len(items):
        opt = str(items[i])
        value = None
        if opt in ("-D", "--define-macro") and i + 1 < len(items):
            value, i = str(items[i + 1]), i + 1
        elif opt.startswith("--define-macro="):
            value = opt[len("--define-macro="):]
        elif opt.startswith("-D") and len(opt) > 2:
            value = opt[2:]
        if value:
            name, _, body = value.partition("=")
            out[name.strip()] = body if "=" in value else "1"
        i += 1
    return out


def _condition(kind: str, arg: str, macros: dict, blocked: set) -> str:
    """'on', 'off' or 'unknown': whether #ifdef/#ifndef/#if/#elif `arg` holds, where that can be told from the text."""
    arg = arg.strip()
    m = re.fullmatch(r"(!\s*)?(?:defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+))", arg) if kind in ("if", "elif") else None
    if kind in ("ifdef", "ifndef") or m:
        name = (m.group(2) or m.group(3)) if m else (arg.split() or [""])[0]
        if name in blocked:
            return "unknown"
        held = name in macros
        negate = (kind == "ifndef") or bool(m and m.group(1))
        return "on" if held != negate else "off"
    if arg in ("0", "1"):
        return "on" if arg == "1" else "off"
    return "unknown"


def expand_macros(source: str, defines: dict | None = None) -> str:
    """`source` with its own `#define`d macros (and `defines`, a compile's -D options) expanded (see the note
    above) and the preprocessor's directive lines blanked; comments and strings are blanked too
    (strip_comments_and_strings), and every line stays where it was.

    Conditionals: #ifdef/#ifndef/`#if defined(X)` and `#if 0/1` are decided (a #define in a branch not taken is not
    read); where a condition cannot be told from the text (`#if N > 2`), a macro that its branches define
    differently is left unexpanded (its type unknown, as before the expansion existed). The code of every branch is
    kept: kernels are looked for in all of them."""
    text = strip_comments_and_strings(source)
    if not defines and not re.search(r"^[ \t]*#[ \t]*define\b", text, re.M):
        return text
    lines = text.split("\n")
    macros: dict[str, _Macro] = {}
    for name, value in (defines or {}).items():
        _define(f"{name} {value}", macros)
    blocked: set[str] = set()            # defined differently in branches whose condition is not known
    groups: list[list[str]] = []         # per open #if: [this branch's state, 'yes'/'no'/'maybe' a branch was taken]
    out, chunk = [], []
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if not m:
            chunk.append(lines[i])
            i += 1
            continue
        out.append(_expand("\n".join(chunk), dict(macros)) if chunk else None)
        chunk = []
        logical, n = lines[i], 1             # the directive and its continuation lines
        while logical.endswith("\\") and i + n < len(lines):
            logical = logical[:-1] + " " + lines[i + n]
            n += 1
        m = _DIRECTIVE.match(logical)
        kind, arg = m.group(1), m.group(2)
        active = all(g[0] != "off" for g in groups)
        uncertain = any(g[0] == "unknown" for g in groups)
        if kind in ("if", "ifdef", "ifndef"):
            state = _condition(kind, arg, macros, blocked) if active else "off"
            groups.append([state, {"on": "yes", "off": "no", "unknown": "maybe"}[state] if active else "yes"])
        elif kind in ("elif", "else") and groups:
            g = groups[-1]
            if g[1] == "yes":
                g[0] = "off"
            else:
                state = "on" if kind == "else" else _condition("if", arg, macros, blocked)
                g[0] = "unknown" if g[1] == "maybe" and state != "off" else state
                g[1] = "yes" if g[0] == "on" else "maybe" if g[0] == "unknown" else g[1]
        elif kind == "endif" and groups:
            groups.pop()
        elif kind in ("define", "undef") and active:
            name = (re.match(r"\w*", arg).group(0))
            if uncertain and kind == "define":     # a branch that may or may not be compiled
                before = macros.get(name)
                if name not in blocked:
                    _define(arg, macros)
                    if before is not None and macros.get(name) != before:
                        blocked.add(name)      # two definitions, which one holds is not known here
                        macros.pop(name, None)
            elif uncertain:
                blocked.add(name)
                macros.pop(name, None)
            else:
                blocked.discard(name)
                if kind == "define":
                    _define(arg, macros)
                else:
                    macros.pop(name, None)
        out.append("\n" * (n - 1))
        i += n
    if chunk:
        out.append(_expand("\n".join(chunk), dict(macros)))
    # chunks and directives alternate; join them with the newlines that separated them
    pieces = [p for p in out if p is not None]
    return "\n".join(pieces)


def find_kernels(source: str, defines: dict | None = None) -> tuple[SourceKernel, ...]:
    """Every __global__ function declared or defined in `source` (names as written), those that the source's own
    macros define included (expand_macros: the macros, and `defines` from the compile's -D options, are expanded
    first, lines kept)."""
    text = expand_macros(source, defines)
    found = []
    for m in re.finditer(r"\b__global__\b", text):
        start = m.end()
        # Skip attribute-like calls: __launch_bounds__(...), __attribute__((...)), alignas(...)
        i = start
        name = None
        while i < len(text):
            mm = re.compile(r"\s*([A-Za-z_][\w:]*)\s*(\(|<)?").match(text, i)
            if not mm:
                i += 1
                continue
            word, bracket = mm.group(1), mm.group(2)
            if bracket == "(" and word not in ATTRIBUTE_WORDS:
                name = word
                i = mm.end() - 1
                break
            if bracket == "(":
                i = match_bracket(text, mm.end() - 1, "(", ")") + 1
                continue
            if bracket == "<":
                i = match_bracket(text, mm.end() - 1, "<", ">") + 1
                continue
            i = mm.end()
        if not name:
            continue
        close = match_bracket(text, i, "(", ")")
        params = parse_params(text[i + 1:close])
        prefix = text[max(0, m.start() - 400):m.start()]
        template = bool(re.search(r"template\s*<[^;{}]*>\s*$", prefix))
        line = text.count("\n", 0, m.start()) + 1
        found.append(SourceKernel(name=name.split("::")[-1], params=params, line=line, template=template))
    # A declaration followed by a definition: keep the first with parameter names.
    unique = {}
    for k in found:
        key = (k.name, len(k.params), tuple(p.base for p in k.params))
        if key not in unique or all(p.name.startswith("arg") for p in unique[key].params):
            unique[key] = k
    return tuple(unique.values())


def match_bracket(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """The index of the `close_ch` that closes the `open_ch` at text[i] (nesting counted; the last index if none)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


@functools.lru_cache(maxsize=None)
def _cxa_demangle():
    for name in ("stdc++", "c++"):
        path = ctypes.util.find_library(name)
        for candidate in ([path] if path else []) + ["libstdc++.so.6"]:
            try:
                lib = ctypes.CDLL(candidate)
                fn = lib.__cxa_demangle
                fn.restype = ctypes.c_void_p
                fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                               ctypes.POINTER(ctypes.c_int)]
                return fn
            except (OSError, AttributeError):
                continue
    return None


@functools.lru_cache(maxsize=4096)
def demangle(symbol: str) -> str | None:
    """The C++ spelling of an Itanium-mangled name (`_Z...`), or None where it cannot be demangled."""
    if not symbol.startswith("_Z"):
        return None
    fn = _cxa_demangle()
    if fn is None:
        return None
    status = ctypes.c_int()
    ptr = fn(symbol.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


@dataclass(frozen=True)
class KernelSignature:
    """What the compiled entry point is called and what it takes."""

    symbol: str          # the entry name in the cubin (mangled for C++ kernels)
    name: str            # the short name users type: 'vadd', 'transpose'
    display: str         # 'transpose<32>' for template instances, else name
    params: tuple[Param, ...]
    line: int | None     # where __global__ stands in the source (as given), when found

    def __str__(self) -> str:
        return f"{self.display}({', '.join(str(p) for p in self.params)})"


def signature_for(symbol: str, source_kernels: tuple[SourceKernel, ...]) -> KernelSignature:
    """Resolve a cubin entry symbol to its signature, using the demangler and the source."""
    text = demangle(symbol)
    if text is None:
        name = symbol
        matches = [k for k in source_kernels if k.name == name]
        if matches:
            k = matches[0]
            return KernelSignature(symbol, name, name, k.params, k.line)
        return KernelSignature(symbol, name, name, (), None)
    close = text.rfind(")")
    depth, open_ = 0, -1
    for j in range(close, -1, -1):
        if text[j] == ")":
            depth += 1
        elif text[j] == "(":
            depth -= 1
            if depth == 0:
                open_ = j
                break
    head = text[:open_]
    params = parse_params(text[open_ + 1:close])
    # head may be "void ns::tk<3>" for template instances (return type first): keep the last top-level word
    words = split_top_level(head, " ")
    display = words[-1] if words else head
    display = display.split("::")[-1] if "<" not in display else display[display.rfind("::", 0, display.find("<")) + 2
                                                                          if "::" in display[:display.find("<")] else 0:]
    name = display.split("<")[0]
    # Borrow parameter names from the source declaration with the same name and arity.
    for k in source_kernels:
        if k.name == name and len(k.params) == len(params):
            # A tensor map keeps the source's spelling ("const __grid_constant__ CUtensorMap", not the struct tag).
            params = tuple(Param(name=sp.name, ctype=sp.ctype if p.tensor_map and sp.tensor_map else p.ctype,
                                 base=p.base, pointer=p.pointer, const=p.const or (p.tensor_map and sp.const),
                                 dtype=p.dtype, vector_width=p.vector_width, size_bytes=p.size_bytes)
                           for p, sp in zip(params, k.params))
            return KernelSignature(symbol, name, display, params, k.line)
    return KernelSignature(symbol, name, display, params, None)
