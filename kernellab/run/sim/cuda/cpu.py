"""A compiled CUDA C++ kernel launched on the CPU: what `%%cuda --sim`, a kernel where no GPU is usable, and the
graders use. Like the GPU's launch path, it receives the kernel as a value, a KernelImage (`Kernel.image()`: source,
cubin, parameters), and never calls back into the Kernel object; the Kernel above builds the image and keeps the
launch syntax, `k[grid, block](args)`, on CPU torch tensors and NumPy arrays; a launch the GPU would refuse for
resources (registers, shared memory, threads, cluster shape; check_launch) is refused first, with the GPU path's error;
an out-of-bounds access stops the launch and raises CpuLaunchError naming the cell line, the thread and the block
(as the simulator of Numba kernels does); `sanitize(image, ..., tool=...)` returns the checks' findings as a
kernellab.run.findings.SanitizerReport, in compute-sanitizer's terms (memcheck, racecheck, synccheck, initcheck)."""
from __future__ import annotations

import re
import threading
import time

import numpy as np

from ....errors import KernellabError
from ...findings import Finding, Location, SanitizerReport, combine
from ...launch.job import KernelImage
from ...launch.launch import LaunchConfig, check_on_arch, marshal_args
from ..numba_sim import SimulatedKernelError
from .emulate import EMULATED, compile_host, host_source
from .toolchain import host_compiler, why_none

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
NOTE = ("found by kernellab's CPU path for CUDA C++ (kernellab.run.sim.cuda, no GPU): every access of the pointer "
        "arguments and shared arrays, and every barrier, of this launch, in compute-sanitizer's terms")
MEMCHECK_SCOPE = ("memcheck on the CPU checks the bounds of each pointer argument and shared array the kernel indexes; "
                  "accesses through pointers it passes to device functions or casts to other types are not checked")
INITCHECK_SCOPE = ("initcheck on the CPU watches shared memory (reads of elements no thread of the block wrote); "
                   "compute-sanitizer's initcheck, on a GPU, watches global memory")
_lock = threading.Lock()
_built: dict = {}            # (source, options, first line, file name, arch) -> HostModule, the CPU builds made
_BUILT_MAX = 64
_ASM = re.compile(r"\basm\b(\s+volatile)?\s*\(")
# kernellab's headers whose kl_emu:: branches the checked build does not run (emulate.emulate's programs do)
_TENSOR_CORE_HEADERS = {"kl/cp_async.cuh": "cp.async (<kl/cp_async.cuh>)", "kl/mma.cuh": "mma.sync (<kl/mma.cuh>)",
                        "kl/wgmma.cuh": "wgmma (<kl/wgmma.cuh>)"}
_NOT_EMULATED = (("wgmma", "wgmma (warpgroup matrix multiply)"), ("cp.async.bulk.tensor", "TMA (cp.async.bulk.tensor)"),
                 ("CUtensorMap", "TMA tensor maps (CUtensorMap)"), ("mma.sync", "mma.sync (tensor cores)"),
                 ("ldmatrix", "ldmatrix"), ("cp.async", "cp.async"), ("setmaxnreg", "setmaxnreg"),
                 ("wmma::", "WMMA fragments"))


class NotOnCpu(KernellabError):
    """The CPU path cannot run this kernel (inline PTX it does not emulate, no host compiler): the message says why."""


class CpuLaunchError(SimulatedKernelError):
    """A launch on the CPU path failed: out of bounds (exception 'IndexError'), a barrier deadlock, or an error of
    the emulated kernel. `findings` holds what the checks found."""

    def __init__(self, message: str, findings=(), **kw):
        super().__init__(message, **kw)
        self.findings = tuple(findings)


def unsupported(source: str, first_line: int = 1) -> str:
    """What in `source` the CPU path cannot run ('' where it can run all of it): inline PTX other than the helpers it
    emulates, and the instructions behind it (wgmma, TMA, ...), with the cell line."""
    def no_comments(s: str) -> str:
        return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), s, flags=re.S)

    text = no_comments(host_source(source))
    raw = no_comments(source)
    found = []
    for needle, what in _NOT_EMULATED:
        i = raw.find(needle)
        if i >= 0 and (needle != "cp.async" or "cp.async.bulk.tensor" not in raw):
            found.append(f"{what} (line {raw.count(chr(10), 0, i) + first_line})")
    for header, what in _TENSOR_CORE_HEADERS.items():
        inc = re.search(r"^\s*#\s*include\s*[<\"]" + re.escape(header) + r"[>\"]", raw, re.M)
        if inc:
            found.append(f"{what} (line {raw.count(chr(10), 0, inc.start()) + first_line})")
    for m in _ASM.finditer(text):
        if re.match(r'\s*""', text[m.end():]):       # an empty asm (a compiler barrier): the host compiles it too
            continue
        if not found:
            found.append(f"inline PTX (`asm` at line {text.count(chr(10), 0, m.start()) + first_line})")
        break
    if not found:
        return ""
    return ("the CPU path runs CUDA C++ (threads, barriers, shuffles, atomics, shared memory and the cluster helpers "
            f"{', '.join(EMULATED[:3])}, ...) but not " + ", ".join(found[:3]) + ": this kernel needs a GPU")


def available() -> tuple[bool, str]:
    """(usable, why not): whether a host C++ compiler is there to build the CPU path with."""
    return (True, "") if host_compiler() is not None else (False, why_none())


def host_kernel(image: KernelImage):
    """The CPU build of the kernel `image` (Kernel.image()): one build per module (source, options, line numbering,
    arch), kept here, its kernel of `image.symbol`."""
    if not isinstance(image, KernelImage):
        raise TypeError(f"the CPU path takes a KernelImage (Kernel.image()), not {type(image).__name__}")
    key = (image.source, tuple(image.options), image.first_line, image.filename, image.arch)
    with _lock:
        host = _built.get(key)
        if host is None:
            why = unsupported(image.source or "", image.first_line)
            if why:
                raise NotOnCpu(why)
            if host_compiler() is None:
                raise NotOnCpu(why_none())
            cubin = image.image if image.image_format == "cubin" else None
            host = compile_host(image.source, arch=image.arch, first_line=image.first_line,
                                filename=image.filename, cubin=cubin, options=image.options)
            if len(_built) >= _BUILT_MAX:
                _built.pop(next(iter(_built)))
            _built[key] = host
    return host[image.symbol]


def _dims(value) -> tuple:
    if isinstance(value, (tuple, list)):
        return tuple(int(v) for v in value) + (1,) * (3 - len(value))
    return (int(value), 1, 1)


def _error(image: KernelImage, run, grid, block) -> CpuLaunchError:
    """The launch's error as a CpuLaunchError: the first out-of-bounds finding where there is one."""
    memcheck = [f for f in run.findings if f.tool == "memcheck"]
    if memcheck:
        f = memcheck[0]
        src = (f.where.source_line or "").strip()
        access = {"invalid_write": "write", "invalid_read": "read"}.get(f.kind, "access")
        msg = (f"{image.name}: out of bounds at cell line {f.where.cell_line}" + (f": `{src}`" if src else "")
               + f" (thread {f.thread} of block {f.block}: {f.detail})")
        return CpuLaunchError(msg, run.findings, kernel=image.name, exception="IndexError",
                              detail=f"{access} of {f.detail}",
                              thread=f.thread, block=f.block, filename=f.where.file, line=f.where.cell_line,
                              source=src)
    text = run.error
    m = re.match(r"(?:cluster )?block \(?([\d, ]+)\)?: (.*)", text, re.S)
    block_idx = tuple(int(v) for v in m.group(1).split(",")) if m else None
    detail = m.group(2) if m else text
    kind = "Deadlock" if "deadlock" in detail else "RuntimeError"
    return CpuLaunchError(f"{image.name}: {detail}" + (f" (block {block_idx})" if block_idx else ""), run.findings,
                          kernel=image.name, exception=kind, detail=detail, thread=None, block=block_idx,
                          filename=None, line=None, source="")


def check_launch(image: KernelImage, grid, block, shared_bytes: int = 0, cluster=None) -> LaunchConfig:
    """Refuse, before anything runs, what a GPU of the image's arch refuses for resources, in the GPU path's words
    and error types (run/launch/launch.py's check_on_arch: threads, shared memory with the opt-in, clusters, and
    registers against kernellab.occupancy, as CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)."""
    if not isinstance(image, KernelImage):
        raise TypeError(f"the CPU path takes a KernelImage (Kernel.image()), not {type(image).__name__}")
    return check_on_arch(image, grid, block, shared_bytes, cluster)


def launch(image: KernelImage, grid, block, args, *, shared_bytes: int = 0, cluster=None):
    """Run one launch of the kernel `image` (Kernel.image()) on the CPU, its configuration and arguments checked as
    a GPU launch's are (check_launch: what the GPU refuses for resources is refused here, before running); raise
    CpuLaunchError where it failed (out of bounds, deadlock)."""
    check_launch(image, grid, block, shared_bytes, cluster)
    hk = host_kernel(image)
    marshal_args(image.params, tuple(args), None, image.signature, any_device=True)
    run = hk.run(grid, block, *args, shared_bytes=shared_bytes, cluster=cluster)
    if run.error:
        raise _error(image, run, grid, block)
    return run


def sanitize(image: KernelImage, grid, block, args, *, tool: str = "memcheck", shared_bytes: int = 0, cluster=None,
             **_ignored) -> SanitizerReport:
    """The checks of one CPU launch of the kernel `image` (Kernel.image()) as compute-sanitizer reports: tool
    'memcheck', 'racecheck', 'synccheck', 'initcheck', several joined with '+', or 'all'. The launch runs on copies
    of the arguments."""
    tools = TOOLS if tool == "all" else tuple(t.strip() for t in str(tool).split("+"))
    for t in tools:
        if t not in TOOLS:
            raise ValueError(f"unknown tool {t!r}; on the CPU: memcheck, racecheck, synccheck, initcheck, joined with "
                             f"'+', or all")
    check_launch(image, grid, block, shared_bytes, cluster)
    hk = host_kernel(image)
    copies = tuple(_copy(a) for a in args)
    t0 = time.perf_counter()
    run = hk.run(grid, block, *copies, shared_bytes=shared_bytes, cluster=cluster)
    wall_ms = (time.perf_counter() - t0) * 1e3
    notes = [NOTE]
    if "memcheck" in tools:
        notes.append(MEMCHECK_SCOPE)
    if "initcheck" in tools:
        notes.append(INITCHECK_SCOPE)
    notes += list(hk.host.notes)
    status = "ok"
    if run.error:
        status = "error"
        if not any(f.tool == "memcheck" for f in run.findings):
            notes.append(f"the launch itself: {run.error.splitlines()[0]}")
    reports = []
    for t in tools:
        mine = tuple(f for f in run.findings if f.tool == t)
        if t == "synccheck" and run.error and "deadlock" in run.error:
            mine += (Finding(tool="synccheck", kind="deadlock", message="Deadlock: a barrier that not every thread "
                             "reaches", where=Location(function=image.name), detail=run.error.splitlines()[0]),)
        reports.append(SanitizerReport(tool=t, kernel=image.name, findings=mine,
                                       error_count=sum(f.count for f in mine), notes=tuple(notes),
                                       job_status=status, wall_ms=wall_ms, simulated=True))
    if len(reports) == 1:
        return reports[0]
    both = combine(reports)
    return SanitizerReport(**{**both.__dict__, "notes": tuple(notes), "exit_code": None})


def _copy(a):
    if isinstance(a, np.ndarray):
        return a.copy()
    if type(a).__module__.startswith("torch"):
        return a.clone()
    return a
