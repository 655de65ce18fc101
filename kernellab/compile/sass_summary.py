"""What a kernel's SASS is made of: its instructions counted by kind, so a learner sees which path the compiler took.

"tensor cores: 4 HMMA.16816.F32.BF16; async copies: 2 LDGSTS; shared: 4 LDSM" says the mma.sync path was taken;
a matrix kernel whose SASS shows only FFMA is on the CUDA cores. Counts are *static*: instructions in the code, once
each, not how often they run (a loop body counts once); Nsight Compute counts executed ones (Kernel.profile).

`opcode_of(line)` reads one line of cuobjdump/nvdisasm SASS; `classify(opcode)` names its group and the key it is
counted under. Both are shared with the per-source-line SASS view.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ..report import html_table

# An instruction line: "/*0170*/  @!P0 SYNCS.EXCH.64 URZ, [UR8], UR4 ;" (cuobjdump) or "/*0170*/ ... ;" (nvdisasm)
_LINE = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<body>[^;]*?)\s*;")
# A guard predicate at the start of an instruction ("@P0 ", "@!UPT "): one rule for the summary and the line view.
PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)\s+")

# (group, base opcodes): the order is the order groups are shown in.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tensor cores", ("HGMMA", "QGMMA", "IGMMA", "BGMMA", "HMMA", "IMMA", "DMMA", "BMMA", "QMMA", "OMMA", "UTCHMMA",
                      "UTCQMMA", "UTCIMMA", "UTCOMMA")),
    ("TMA", ("UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF", "UTMACCTL", "UTMACMDFLUSH", "UBLKCP", "UBLKRED", "UBLKPF")),
    ("async copies", ("LDGSTS",)),
    ("matrix load/store", ("LDSM", "STSM")),
    ("global memory", ("LDG", "STG")),
    ("shared memory", ("LDS", "STS")),
    ("local memory", ("LDL", "STL")),
    ("atomics", ("ATOM", "ATOMG", "ATOMS", "RED", "REDG", "REDS")),
    ("fp32", ("FFMA", "FADD", "FMUL")),
    ("special functions", ("MUFU",)),
    ("barriers", ("BAR", "SYNCS", "WARPGROUP")),
)
_GROUP_OF = {base: group for group, bases in GROUPS for base in bases}
# Opcodes counted by access width ("LDG.128"): what a memory-bound kernel's vectorisation shows in.
BY_WIDTH = ("LDG", "STG", "LDS", "STS", "LDL", "STL")
# Opcodes whose full spelling (shape and types) is worth showing: "HMMA.16816.F32.BF16", "HGMMA.64x128x16.F32.BF16".
MATRIX = ("tensor cores",)


def opcode_of(line: str) -> str | None:
    """The opcode with its modifiers ("LDG.E.128", "HMMA.16816.F32.BF16") of one SASS line, or None for others."""
    m = _LINE.match(line)
    if not m:
        return None
    body = PREDICATE.sub("", m.group("body").strip())
    return body.split()[0] if body else None


def access_bits(opcode: str) -> int:
    """The width in bits of a load or store: .128, .64, .U16/.S16, .U8/.S8; 32 when unsuffixed."""
    mods = opcode.split(".")[1:]
    for mod, bits in (("128", 128), ("64", 64), ("U16", 16), ("S16", 16), ("U8", 8), ("S8", 8)):
        if mod in mods:
            return bits
    return 32


def classify(opcode: str) -> tuple[str | None, str]:
    """(group, key) of an opcode: ("tensor cores", "HMMA"), ("global memory", "LDG.128"); the group is None for
    instructions no group names (integer math, moves, branches), the key then their base opcode."""
    base = opcode.split(".")[0]
    group = _GROUP_OF.get(base)
    if base in BY_WIDTH:
        return group, f"{base}.{access_bits(opcode)}"
    return group, base


@dataclass(frozen=True)
class InstructionSummary:
    """Static counts of one kernel's SASS instructions by kind (in the code, not as executed)."""

    counts: dict = field(default_factory=dict)     # key -> count: "HMMA", "LDG.128", "FFMA", ... (grouped kinds)
    variants: dict = field(default_factory=dict)   # full opcode -> count, for tensor-core instructions
    total: int = 0                                 # every instruction, NOPs included

    def __getitem__(self, key: str) -> int:
        """Count of a key ("HMMA", "LDG.128"), a base opcode summed over widths ("LDG"), or a group ("TMA")."""
        if key in self.counts:
            return self.counts[key]
        if key in BY_WIDTH:
            return sum(n for k, n in self.counts.items() if k.split(".")[0] == key)
        bases = dict(GROUPS).get(key)
        if bases:
            return sum(n for k, n in self.counts.items() if k.split(".")[0] in bases)
        return 0

    def group(self, name: str) -> dict[str, int]:
        """{key: count} of one group, e.g. group("shared memory") -> {"LDS.128": 4, "STS.32": 2}."""
        bases = dict(GROUPS)[name]
        return {k: n for k, n in self.counts.items() if k.split(".")[0] in bases}

    @property
    def tensor_core_path(self) -> str | None:
        """'wgmma' (HGMMA, QGMMA, ...), 'mma' (HMMA, IMMA, ...) or None: which tensor-core instructions there are."""
        if any(self[b] for b in ("HGMMA", "QGMMA", "IGMMA", "BGMMA")):
            return "wgmma"
        if self["tensor cores"]:
            return "mma"
        return None

    def lines(self) -> list[tuple[str, str]]:
        """(group, "96 HMMA.16816.F32.BF16, 8 LDSM") for each group present, in GROUPS order; local memory always."""
        out = []
        for name, _ in GROUPS:
            items = self.group(name)
            if name in MATRIX:
                bases = dict(GROUPS)[name]
                items = {k: n for k, n in self.variants.items() if k.split(".")[0] in bases} or items
            if items:
                out.append((name, ", ".join(f"{n:,} {k}" for k, n in sorted(items.items(), key=lambda kv: -kv[1]))))
            elif name == "local memory":
                out.append((name, "none"))
        return out

    def headline(self) -> str:
        """One line for the card: the matrix and memory paths ("tensor cores: 4 HMMA.16816.F32.BF16; ...")."""
        shown = ("tensor cores", "TMA", "async copies", "matrix load/store", "local memory")
        lines = self.lines()
        parts = [f"{g}: {text}" for g, text in lines if g in shown]
        if not self["tensor cores"] and self["fp32"]:
            parts.insert(0, "no tensor cores, fp32: " + dict(lines)["fp32"])
        return "; ".join(parts)

    def __str__(self) -> str:
        width = max((len(g) for g, _ in self.lines()), default=0)
        rows = [f"{g:<{width}}  {text}" for g, text in self.lines()]
        return "\n".join([f"{self.total:,} SASS instructions (static counts, not executed)"] + rows)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_table(["instructions", "static count"], [list(r) for r in self.lines()],
                          caption=f"{self.total:,} SASS instructions (in the code, not executed)")

    def to_json(self) -> dict:
        """{"total", "counts", "variants", "groups": {group: {key: count}}, "lines": [[group, text]],
        "tensor_core_path", "headline"}."""
        return {"total": self.total, "counts": dict(self.counts), "variants": dict(self.variants),
                "groups": {name: self.group(name) for name, _ in GROUPS if self.group(name)},
                "lines": [list(line) for line in self.lines()],
                "tensor_core_path": self.tensor_core_path, "headline": self.headline()}


def summarize(sass: str) -> InstructionSummary:
    """Count the instructions of SASS text (one function's, or several functions' together)."""
    counts: Counter = Counter()
    variants: Counter = Counter()
    total = 0
    for line in sass.splitlines():
        op = opcode_of(line)
        if op is None:
            continue
        total += 1
        group, key = classify(op)
        if group is None:
            continue
        counts[key] += 1
        if group in MATRIX:
            variants[op] += 1
    return InstructionSummary(counts=dict(counts), variants=dict(variants), total=total)


_FUNCTION = re.compile(r"^\s*Function\s*:\s*(?P<name>\S+)", re.M)


def split_functions(sass: str) -> dict[str, str]:
    """cuobjdump -sass of a whole cubin -> {symbol: that function's SASS text}."""
    marks = list(_FUNCTION.finditer(sass))
    return {m.group("name"): sass[m.start():(marks[i + 1].start() if i + 1 < len(marks) else len(sass))]
            for i, m in enumerate(marks)}
