"""CUDA C++ source -> cubin + PTX through NVRTC (cuda.bindings), with the ptxas resource report parsed."""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field

from ..analysis.arch import DEFAULT_ARCH, normalize_arch
from ..errors import CompileError, Diagnostic
from . import cache, toolkit



@dataclass(frozen=True)
class PtxasReport:
    """What ptxas said about one entry function (`--ptxas-options=-v`)."""

    registers: int = 0
    barriers: int = 0
    shared_bytes: int = 0       # static smem, as ptxas counts it (no system reservation)
    constant_bytes: int = 0     # cmem[0]: parameters and driver constants
    stack_bytes: int = 0        # per-thread stack frame (local memory)
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0


@dataclass(frozen=True)
class CompileOutput:
    """Everything one NVRTC compile produced."""

    arch: str
    options: tuple[str, ...]
    cubin: bytes
    ptx: str
    log: str
    diagnostics: tuple[Diagnostic, ...]
    reports: dict = field(default_factory=dict)  # entry symbol -> PtxasReport
    compile_ms: float = 0.0
    nvrtc_version: tuple[int, int] = (0, 0)
    lowered_names: tuple[tuple[str, str], ...] = ()  # (name expression, its mangled symbol), e.g. ("k<4>", "_Z1kILi4EEvPf")

    def lowered(self, expression: str) -> str | None:
        """The entry symbol NVRTC gave a name expression passed to the compile (a template instance), or None."""
        return dict(self.lowered_names).get(expression)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """The NVRTC library's (major, minor)."""
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return (major, minor)



def compile_key(source: str, arch, options=(), *, filename: str = "kernel.cu", first_line: int = 1,
                name_expressions=()) -> str:
    """The compile cache's key for one NVRTC compile: everything that changes its output."""
    return cache.make_key(kind="nvrtc", source=source, options=list(options), arch=normalize_arch(arch),
                          nvrtc=nvrtc_version(), first_line=first_line, filename=filename,
                          name_expressions=list(name_expressions))


def compile_cached(source: str, arch, options=(), *, filename: str = "kernel.cu", first_line: int = 1,
                   name_expressions=()) -> tuple[CompileOutput, str]:
    """compile_source through the compile cache: (output, where it came from: 'memory', 'disk' or 'miss').

    The one way kernellab compiles CUDA C++: compile_cuda, the workers (a job without an image) and autotune's
    compile tasks all come here, so they share cache entries. Compile errors raise CompileError and are not cached.
    """
    key = compile_key(source, arch, options, filename=filename, first_line=first_line,
                      name_expressions=name_expressions)
    output, state = cache.get(key)
    if output is None:
        output = compile_source(source, arch, options, filename=filename, first_line=first_line,
                                name_expressions=name_expressions)
        cache.put(key, output)
        state = "miss"
    return output, state

_DIAG = re.compile(r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark)"
                   r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")
_PTXAS_ERR = re.compile(r"^ptxas (?P<sev>error|fatal|warning)\s*: (?P<msg>.*)$")
# ptxas on a line of the generated PTX: "ptxas application ptx input, line 34; error   : Instruction ..."
_PTXAS_LINE = re.compile(r"^ptxas application ptx input, line (?P<ptx>\d+); (?P<sev>error|fatal|warning)\s*: "
                         r"(?P<msg>.*)$")
_PTXAS_ABORTED = "Ptx assembly aborted due to errors"


def parse_log(log: str, filename: str, ptx: str = "") -> tuple[Diagnostic, ...]:
    """Diagnostics from an NVRTC log; columns come from the caret line under the echoed source.

    ptxas messages about a PTX line are placed on the source line that the PTX's `.loc` directives give it
    (given `ptx`, compiled with -lineinfo); ptxas's closing "assembly aborted" is dropped when it said why.
    """
    lines = log.splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _DIAG.match(lines[i])
        if m and m.group("file").endswith(filename):
            column = None
            msg = m.group("msg").strip()
            # NVRTC echoes the source line indented by two spaces, then a caret line.
            if i + 2 < len(lines) and lines[i + 2].strip() == "^":
                column = lines[i + 2].index("^") - 2 + 1
                i += 2
            sev = "error" if m.group("sev") == "catastrophic error" else m.group("sev")
            out.append(Diagnostic(int(m.group("line")), column if column and column > 0 else None, sev, msg,
                                  m.group("code")))
        else:
            p = _PTXAS_LINE.match(lines[i].strip()) or _PTXAS_ERR.match(lines[i].strip())
            if p:
                sev = "error" if p.group("sev") in ("error", "fatal") else "warning"
                line = ptx_source_line(ptx, int(p.group("ptx")), filename) if "ptx" in p.groupdict() else None
                out.append(Diagnostic(line, None, sev, "ptxas: " + p.group("msg").strip()))
        i += 1
    if any(d.message.startswith("ptxas: ") and _PTXAS_ABORTED not in d.message and d.severity == "error"
           for d in out):
        out = [d for d in out if _PTXAS_ABORTED not in d.message]
    return tuple(out)


_LOC = re.compile(r"^\s*\.loc\s+(?P<file>\d+)\s+(?P<line>\d+)\s")
_FILE = re.compile(r'^\s*\.file\s+(?P<file>\d+)\s+"(?P<name>[^"]*)"')


def ptx_source_line(ptx: str, ptx_line: int, filename: str) -> int | None:
    """The source line (of `filename`) that PTX line `ptx_line` (1-based) came from, by the last `.loc` before it."""
    if not ptx:
        return None
    lines = ptx.splitlines()
    files = {m.group("file") for m in map(_FILE.match, lines) if m and m.group("name").endswith(filename)}
    for text in reversed(lines[:ptx_line]):
        m = _LOC.match(text)
        if m:
            return int(m.group("line")) if m.group("file") in files and int(m.group("line")) > 0 else None
    return None


# Instructions that exist only on an arch-specific ('a') target, by PTX opcode prefix -> the targets that have them.
ARCH_SPECIFIC_PTX = {
    "wgmma": "sm_90a",
    "setmaxnreg": "sm_90a or sm_100a",
    "tcgen05": "sm_100a",
}
_NOT_ON_TARGET = re.compile(r"Instruction '(?P<insn>[\w.:]+)' not supported on \.target '(?P<target>sm_\d+[af]?)'")


def arch_hint(diagnostics) -> str | None:
    """What to do when ptxas rejected an instruction that the compile's target lacks (e.g. wgmma on plain sm_90)."""
    for d in diagnostics:
        m = _NOT_ON_TARGET.search(d.message)
        if not m:
            continue
        insn, target = m.group("insn"), m.group("target")
        root = insn.split(".")[0]
        where = f" (line {d.line})" if d.line else ""
        if root in ARCH_SPECIFIC_PTX:
            want = ARCH_SPECIFIC_PTX[root]
            first = want.split()[0]
            return (f"'{insn}'{where} is an arch-specific instruction: it exists on {want}, not on plain {target}. "
                    f"Compile with arch=\"{first}\" (`%%cuda --arch {first}`); an {first} kernel runs only on a GPU "
                    f"of exactly that compute capability.")
        if not target.endswith(("a", "f")):
            return (f"'{insn}'{where} is not available on {target}. If it is an arch-specific feature, compile for the "
                    f"'a' target, e.g. arch=\"{target}a\" (`%%cuda --arch {target}a`); otherwise it needs a newer "
                    f"architecture.")
        return f"'{insn}'{where} is not available on {target}; it needs another architecture."
    return None


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_PROPS = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<regs>\d+) registers")


def parse_ptxas(log: str) -> dict[str, PtxasReport]:
    """Per-entry resource reports from ptxas's verbose output."""
    reports: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group("name")
            reports[current] = {}
            continue
        if current is None:
            continue
        p = _PROPS.search(line)
        if p:
            reports[current].update(stack_bytes=int(p.group("stack")), spill_store_bytes=int(p.group("st")),
                                    spill_load_bytes=int(p.group("ld")))
        u = _USED.search(line)
        if u:
            r = reports[current]
            r["registers"] = int(u.group("regs"))
            for key, pat in (("barriers", r"used (\d+) barriers"), ("shared_bytes", r"(\d+) bytes smem"),
                             ("constant_bytes", r"(\d+) bytes cmem\[0\]")):
                mm = re.search(pat, line)
                if mm:
                    r[key] = int(mm.group(1))
    return {k: PtxasReport(**v) for k, v in reports.items()}


NVRTC_CACHE_SINCE = (12, 9)     # NVRTC's own compile cache (and its --no-cache option) arrived in CUDA 12.9


def build_options(arch: str, options=()) -> tuple[str, ...]:
    """The full NVRTC option list for a compile: the user's options plus ours."""
    opts = [f"--gpu-architecture={arch}", "--ptxas-options=-v", "-lineinfo"]
    if nvrtc_version() >= NVRTC_CACHE_SINCE:
        # NVRTC 12.9+ keeps its own cache of compiled programs (on a GPU host, beside the driver's); a hit there
        # runs no ptxas, so the log has no `ptxas info` lines and every kernel would lose its resource report
        # (shared memory, stack, spills). kernellab caches the whole CompileOutput, log and reports included.
        opts.append("--no-cache")
    if not any(o.startswith(("-std", "--std")) for o in options):
        opts.append("--std=c++17")
    opts += [f"-I{d}" for d in toolkit.include_dirs()]
    opts += list(options)
    return tuple(opts)


def compile_source(source: str, arch: str = DEFAULT_ARCH, options=(), *, filename: str = "kernel.cu",
                   first_line: int = 1, name_expressions=()) -> CompileOutput:
    """Compile with NVRTC; raise CompileError (diagnostics numbered from `first_line`) on failure.

    `name_expressions` (e.g. "sgemm<64, 64, 8>") instantiate template kernels without an explicit instantiation in
    the source; the output's `lowered(expression)` gives each one's entry symbol.
    """
    from cuda.bindings import nvrtc

    arch = normalize_arch(arch)
    # Leading newlines make NVRTC's line numbers (and -lineinfo) count as the user's editor does.
    text = "\n" * (first_line - 1) + source
    all_opts = build_options(arch, tuple(options))
    t0 = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), filename.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcAddNameExpression({expr!r})")
        enc = [o.encode() for o in all_opts]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(enc), enc)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.replace(b"\0", b"").decode(errors="replace")
        failed = status != nvrtc.nvrtcResult.NVRTC_SUCCESS
        diags = parse_log(log, filename, _ptx_text(nvrtc, prog) if "ptxas application ptx input" in log else "")
        if failed:
            if not any(d.severity == "error" for d in diags):
                diags = diags + (Diagnostic(None, None, "error", _first_meaningful(log) or str(status)),)
            raise CompileError(diags, log, source, all_opts, first_line=first_line, filename=filename,
                               hint=arch_hint(diags))
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        ptx = _ptx_text(nvrtc, prog)
        lowered = []
        for expr in name_expressions:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcGetLoweredName({expr!r})")
            lowered.append((expr, name.decode() if isinstance(name, bytes) else str(name)))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    ms = (time.perf_counter() - t0) * 1e3
    return CompileOutput(arch=arch, options=tuple(options), cubin=bytes(cubin), ptx=ptx,
                         log=log, diagnostics=diags, reports=parse_ptxas(log), compile_ms=ms,
                         nvrtc_version=nvrtc_version(), lowered_names=tuple(lowered))


def _ptx_text(nvrtc, prog) -> str:
    """The program's PTX ("" where there is none); NVRTC keeps it even when ptxas then failed."""
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not size:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")


def _first_meaningful(log: str) -> str:
    for line in log.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _check(nvrtc, err, what):
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
