"""SASS and PTX instructions per source line, and what each SASS instruction is (a load, a store, an FFMA, ...).

Line information comes from the cubin (kernellab compiles with `-lineinfo`): `nvdisasm -gi` from the CUDA wheels
prints `//## File "cell.cu", line 9` before the instructions of each line (with `inlined at ...` for code inlined
from another function), and the PTX carries `.loc FILE LINE COL` directives. An inlined instruction belongs to the
innermost line that is in the kernel's own source (a device function of the same cell: its own line; a header such
as cuda_fp16.hpp: the cell line that calls it). No GPU is needed.

The classifier (`instruction_class`) is shared: the per-line counts of `Kernel.source_view()` use it, and a
whole-kernel summary can count with the same classes.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from ..errors import KernellabError
from . import toolkit
from .sass_summary import PREDICATE, GROUPS  # one predicate rule and one tensor-core opcode list for both

# class -> (label, what it counts). Generic LD/ST (no state space: the compiler could not prove one) count as global.
CLASSES: dict[str, tuple[str, str]] = {
    "global_loads": ("global ld", "LDG, generic LD, LDGSTS (global to shared), UTMALDG/UBLKCP (TMA loads)"),
    "global_stores": ("global st", "STG, generic ST, UTMASTG (TMA stores)"),
    "shared_loads": ("shared ld", "LDS, LDSM (ldmatrix)"),
    "shared_stores": ("shared st", "STS, STSM (stmatrix)"),
    "local_loads": ("local ld", "LDL: spills and stack arrays"),
    "local_stores": ("local st", "STL: spills and stack arrays"),
    "ffma": ("FFMA", "FFMA: fp32 fused multiply-add"),
    "mma": ("HMMA/HGMMA", "tensor-core MMA: HMMA, HGMMA (wgmma), IMMA, IGMMA, QGMMA, DMMA"),
    "barriers": ("barrier", "BAR (__syncthreads, named barriers), SYNCS (mbarrier)"),
    "branches": ("branch", "BRA, BRX, JMP, JMX, CALL, RET"),
}

_OPCODE_CLASS = {
    "LDG": "global_loads", "LD": "global_loads", "LDGSTS": "global_loads", "UTMALDG": "global_loads",
    "UBLKCP": "global_loads",
    "STG": "global_stores", "ST": "global_stores", "UTMASTG": "global_stores",
    "LDS": "shared_loads", "LDSM": "shared_loads",
    "STS": "shared_stores", "STSM": "shared_stores",
    "LDL": "local_loads", "STL": "local_stores",
    "FFMA": "ffma", "FFMA2": "ffma",
    "BAR": "barriers", "SYNCS": "barriers",
    "BRA": "branches", "BRX": "branches", "JMP": "branches", "JMX": "branches", "CALL": "branches",
    "RET": "branches",
} | {op: "mma" for op in dict(GROUPS)["tensor cores"]}   # the card's instruction summary's tensor-core opcodes


def opcode(instruction: str) -> str:
    """The opcode without modifiers: 'LDG' for '@!P0 LDG.E.128 R4, desc[UR4][R2.64]'."""
    text = PREDICATE.sub("", instruction.strip())
    return text.split(None, 1)[0].split(".", 1)[0] if text else ""


def instruction_class(instruction: str) -> str | None:
    """The class (a key of CLASSES) of one SASS instruction, or None for the others (integer math, moves, ...)."""
    return _OPCODE_CLASS.get(opcode(instruction))


def count_classes(instructions) -> dict[str, int]:
    """How many of `instructions` fall in each class (every class present, zeros included)."""
    counts = dict.fromkeys(CLASSES, 0)
    for ins in instructions:
        cls = instruction_class(ins)
        if cls is not None:
            counts[cls] += 1
    return counts


@dataclass(frozen=True)
class SassInstruction:
    """One SASS instruction of a kernel, with the source line it belongs to."""

    address: int
    text: str                     # e.g. 'LDG.E R0, desc[UR4][R2.64]' (no address, no trailing ';')
    line: int | None              # in the kernel's own source (None: no line there, e.g. code from a header only)
    locations: tuple[tuple[str, int], ...] = ()   # (file, line) innermost first, as nvdisasm names them


# --- SASS: nvdisasm -gi ------------------------------------------------------------------------------------------

_SECTION = re.compile(r"^//-+\s+\.text\.(?P<name>\S+)\s+-+")
_MARKER = re.compile(r'//##\s*File "(?P<file>[^"]*)", line (?P<line>\d+)'
                     r'(?:\s+inlined at "(?P<file2>[^"]*)", line (?P<line2>\d+))?')
_INSTRUCTION = re.compile(r"^\s*/\*(?P<addr>[0-9a-fA-F]{4,})\*/\s+(?P<text>.*?)\s*;?\s*$")
_LABEL = re.compile(r"^(?P<label>\.L_x_\d+):\s*$")


def _same_file(path: str, filename: str) -> bool:
    return os.path.basename(path) == os.path.basename(filename)


def _own_line(locations, filename: str) -> int | None:
    """The innermost location in `filename` (the kernel's own source), else None."""
    return next((line for file, line in locations if _same_file(file, filename)), None)


def parse_nvdisasm(text: str, symbol: str, filename: str) -> tuple[SassInstruction, ...]:
    """The instructions of `symbol`'s section in `nvdisasm -g`/`-gi` output, each with its line in `filename`.

    A `//##` marker applies to the instructions after it until the next marker; consecutive markers (an inlined
    instruction's chain) are read innermost first. The trailing trap loop (`.L_x_N: BRA .L_x_N`) and NOP padding
    after the kernel's last instruction are left out."""
    out: list[SassInstruction] = []
    inside = False
    chain: list[tuple[str, int]] = []
    fresh = False                 # the last line read was a marker: the next marker extends the chain
    label = None
    for raw in text.splitlines():
        section = _SECTION.match(raw.strip())
        if section:
            if inside:
                break
            inside = section.group("name") == symbol
            continue
        if not inside:
            continue
        marker = _MARKER.search(raw)
        if marker:
            if not fresh:
                chain = []
            chain.append((marker.group("file"), int(marker.group("line"))))
            if marker.group("file2"):
                chain.append((marker.group("file2"), int(marker.group("line2"))))
            fresh = True
            continue
        lab = _LABEL.match(raw.strip())
        if lab:
            label = lab.group("label")
            continue
        ins = _INSTRUCTION.match(raw)
        if not ins:
            continue
        fresh = False
        body = ins.group("text").rstrip(" ;")
        if label and re.fullmatch(rf"BRA `\({re.escape(label)}\)", body):
            label = None
            continue              # the trap loop after EXIT: no source line wrote it
        label = None
        locations = tuple(dict.fromkeys(chain))
        out.append(SassInstruction(int(ins.group("addr"), 16), body, _own_line(locations, filename), locations))
    while out and opcode(out[-1].text) == "NOP":
        out.pop()
    return tuple(out)


def sass_instructions(cubin: bytes, symbol: str, filename: str) -> tuple[SassInstruction, ...]:
    """`symbol`'s SASS with source lines, from `nvdisasm -gi` on the cubin (the CUDA wheels; no GPU needed)."""
    tool = toolkit.find_tool("nvdisasm")
    if not tool:
        raise KernellabError("SASS per source line needs nvdisasm, which was not found: pip install "
                             "nvidia-cuda-nvdisasm (kernellab's dependencies include it), or set CUDA_HOME")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        proc = subprocess.run([tool, "-gi", "-c", path], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise KernellabError(f"nvdisasm failed ({proc.returncode}): {proc.stderr.strip()}")
    found = parse_nvdisasm(proc.stdout, symbol, filename)
    if not found:
        raise KernellabError(f"nvdisasm printed no code for {symbol}; the cubin's functions: "
                             f"{', '.join(m.group('name') for m in map(_SECTION.match, proc.stdout.splitlines()) if m)}")
    return found


# --- PTX: .loc directives ----------------------------------------------------------------------------------------

_FILE = re.compile(r'^\s*\.file\s+(?P<n>\d+)\s+"(?P<path>[^"]*)"')
_LOC = re.compile(r"^\s*\.loc\s+(?P<f>\d+)\s+(?P<line>\d+)\s+\d+(?:.*?inlined_at\s+(?P<f2>\d+)\s+(?P<line2>\d+))?")


def ptx_lines(module_ptx: str, entry_ptx: str, filename: str) -> dict[int, list[str]]:
    """{line: PTX instructions} for one entry's PTX (`entry_ptx`), with the file table from the whole module's PTX.

    Directives, labels, declarations and comments are left out; an instruction inlined from a file other than
    `filename` goes to the line of `filename` it was inlined at."""
    files = {int(m.group("n")): m.group("path") for m in map(_FILE.match, module_ptx.splitlines()) if m}
    out: dict[int, list[str]] = {}
    line = None
    body = False
    for raw in entry_ptx.splitlines():
        text = raw.strip()
        if text == "{":
            body = True
            continue
        if not body:
            continue
        loc = _LOC.match(text)
        if loc:
            chain = [(files.get(int(loc.group("f")), ""), int(loc.group("line")))]
            if loc.group("f2"):
                chain.append((files.get(int(loc.group("f2")), ""), int(loc.group("line2"))))
            line = _own_line(chain, filename) if files else chain[0][1]
            continue
        if (not text or text.startswith(("//", ".", "}", "{")) or text.endswith(":") or line is None):
            continue
        out.setdefault(line, []).append(" ".join(text.rstrip(";").split()))
    return out
