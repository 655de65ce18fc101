"""The static schedule of a kernel's main loop, read from the control bits of its sm_90 SASS (no GPU needed).

    sched = loop_schedule(kernel.sass)      # the backward branch holding the most FFMAs
    sched.stall_cycles, sched.cycles_per_ffma, sched.reuse_hit_fraction, sched.bank_conflicts

Volta and newer encode every instruction in 128 bits; `cuobjdump -sass` prints them as two 64-bit words in comments,
the low word on the instruction's line, the high word on the next. Bits 105-125 of the instruction (bits 41-61 of the
high word) are the control field the assembler (ptxas) writes for the scheduler, least significant first
(Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking", 2018, section 2.2; the same layout
as the maxas/turingas/CuAssembler decoders):

    stall  4 bits   cycles before this warp may issue its next instruction (the fixed-latency wait)
    yield  1 bit    as encoded (the hardware reads it inverted: 0 asks the scheduler to switch warps)
    wbar   3 bits   scoreboard (0-5) this variable-latency instruction releases when its result is written; 7 none
    rbar   3 bits   scoreboard released once its source registers have been read (stores, LDGSTS); 7 none
    wait   6 bits   scoreboards this instruction waits on before it issues
    reuse  4 bits   operand slots (bit 0 = first source) kept in the operand reuse cache for the next instruction

Register banks (the model, not a measurement): Jia et al. find two banks on Volta, bank = register index % 2, each
serving two 32-bit reads a cycle (64 bits wide), so an FFMA loses a cycle only when all three of its sources sit in
one bank and none comes from the reuse cache. A source comes from the reuse cache when the previous instruction of
the warp held the same register in the same slot with `.reuse` set. RZ (R255) and uniform registers are not read
from the banks. Ampere and Hopper are taken to keep Volta's arrangement (Jia et al.'s Turing and Ampere follow-ups
report the same two banks).

What the numbers say: one warp takes `stall_cycles` (+ `bank_conflicts`) cycles to issue one pass of the loop when no
scoreboard wait holds it; a scheduler with W such warps issues at most one instruction a cycle, so a pass costs about
max(instructions, (stall_cycles + bank_conflicts) / W) cycles of the scheduler, and FFMAs / that is the issue share
the FFMA pipe can get. Scoreboard waits (LDS, LDG, barriers) are not in the static sum.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_LINE = re.compile(r"/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<body>[^;]*?)\s*;\s*/\*\s*0x(?P<lo>[0-9a-f]{16})\s*\*/\s*\n"
                   r"\s*/\*\s*0x(?P<hi>[0-9a-f]{16})\s*\*/")
PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)\s+")
_REG = re.compile(r"^-?\|?(R\d+|RZ)\b")


@dataclass(frozen=True)
class Control:
    """The scheduling control field of one instruction (see the module docstring for the bits)."""

    stall: int
    yield_bit: int
    write_barrier: int | None     # None: no scoreboard set
    read_barrier: int | None
    wait_mask: int                # bit b: wait on scoreboard b
    reuse: int                    # bit i: source slot i kept in the reuse cache

    @classmethod
    def decode(cls, hi: int) -> Control:
        c = (hi >> 41) & 0x1FFFFF
        wbar, rbar = (c >> 5) & 7, (c >> 8) & 7
        return cls(stall=c & 15, yield_bit=(c >> 4) & 1, write_barrier=None if wbar == 7 else wbar,
                   read_barrier=None if rbar == 7 else rbar, wait_mask=(c >> 11) & 0x3F, reuse=(c >> 17) & 15)

    def __str__(self) -> str:
        wait = "".join(str(b) for b in range(6) if self.wait_mask >> b & 1) or "-"
        return (f"S{self.stall:02d} Y{self.yield_bit} W{'-' if self.write_barrier is None else self.write_barrier}"
                f" R{'-' if self.read_barrier is None else self.read_barrier} wait:{wait} reuse:{self.reuse:04b}")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: address, text (predicate included), opcode with modifiers, its control field."""

    addr: int
    text: str
    opcode: str
    control: Control

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    def sources(self) -> list[str | None]:
        """The instruction's source operands in slot order, a register name ('R12', 'RZ') or None for others.
        For instructions with a destination (the first operand) that one is skipped; stores have none."""
        body = PREDICATE.sub("", self.text).split(None, 1)
        ops = [o.strip() for o in body[1].split(",")] if len(body) > 1 else []
        if self.base not in ("STS", "STG", "ST", "STL", "BRA", "BAR", "RED", "ATOM", "EXIT"):
            ops = ops[1:]
            while ops and re.fullmatch(r"!?U?P(T|\d+)", ops[0]) and self.base.endswith("SETP"):
                ops = ops[1:]             # ISETP/FSETP: the second predicate destination
        out = []
        for o in ops:
            m = _REG.match(o.replace(".reuse", ""))
            out.append(m.group(1) if m else None)
        return out


def parse(sass: str) -> list[Instruction]:
    """Every instruction of `sass` (cuobjdump -sass text with the encoding comments), in address order."""
    out = []
    for m in _LINE.finditer(sass):
        body = m.group("body").strip()
        opcode = PREDICATE.sub("", body).split()[0]
        out.append(Instruction(int(m.group("addr"), 16), body, opcode, Control.decode(int(m.group("hi"), 16))))
    return out


def main_loop(instrs: list[Instruction]) -> list[Instruction]:
    """The body of the backward branch holding the most FFMAs (ties: the shortest, e.g. a kernel's float4 instance
    beside its scalar one): the main loop."""
    best, key = [], None
    for i, ins in enumerate(instrs):
        m = re.match(r"(?:@!?P\w+\s+)?BRA\b.*?0x([0-9a-f]+)", ins.text)
        if not m or int(m.group(1), 16) >= ins.addr:
            continue
        body = [x for x in instrs if int(m.group(1), 16) <= x.addr <= ins.addr]
        k = (sum(x.base == "FFMA" for x in body), -len(body))
        if k[0] and (key is None or k > key):
            best, key = body, k
    return best


def bank_conflict_cycles(ins: Instruction, prev: Instruction | None) -> int:
    """Extra cycles the register banks cost `ins` (model of the module docstring): reads of distinct registers
    per bank, those the reuse cache serves left out, beyond two in one bank."""
    cached = set()
    if prev is not None:
        for slot, reg in enumerate(prev.sources()[:4]):
            if reg and prev.control.reuse >> slot & 1:
                cached.add((slot, reg))
    reads = {reg for slot, reg in enumerate(ins.sources()[:4])
             if reg and reg != "RZ" and (slot, reg) not in cached}
    per_bank = [sum(1 for r in reads if int(r[1:]) % 2 == b) for b in (0, 1)]
    return max(0, max(per_bank) - 2)


@dataclass
class LoopSchedule:
    """The static schedule of one main loop (one pass through its SASS, as the assembler laid it out)."""

    instructions: int
    ffma: int
    mix: dict = field(repr=False)
    stall_cycles: int                 # sum of the stall counts: one warp's issue cycles per pass, no waits
    bank_conflicts: int               # extra cycles from the register-bank model
    ffma_stall_hist: dict             # stall count -> FFMAs with it
    reuse_set_fraction: float         # FFMA register sources with the reuse flag set
    reuse_hit_fraction: float         # FFMA register sources served by the reuse cache (flag on the previous one)
    waits: int                        # instructions that wait on a scoreboard
    write_barriers: dict              # opcode base -> instructions that set a write scoreboard

    @property
    def cycles_per_ffma(self) -> float:
        """One warp's issue cycles per FFMA (stalls + bank conflicts): 1.0 is an FFMA every cycle."""
        return (self.stall_cycles + self.bank_conflicts) / max(1, self.ffma)

    def issue_bound(self, warps_per_scheduler: int) -> float:
        """Scheduler cycles per pass with this many warps and no scoreboard waits: at most one issue a cycle."""
        return max(self.instructions, (self.stall_cycles + self.bank_conflicts) / warps_per_scheduler)

    def ffma_issue_share(self, warps_per_scheduler: int) -> float:
        """FFMAs per scheduler cycle at issue_bound: the ceiling the schedule puts on the FFMA pipe's use."""
        return self.ffma / self.issue_bound(warps_per_scheduler)

    def summary(self, warps_per_scheduler: int = 2) -> str:
        return (f"{self.instructions} instr, FFMA {self.ffma / max(1, self.instructions):.1%}, "
                f"stall sum {self.stall_cycles} ({self.cycles_per_ffma:.2f}/FFMA), bank {self.bank_conflicts}, "
                f"reuse {self.reuse_hit_fraction:.0%}, FFMA share @{warps_per_scheduler}w "
                f"{self.ffma_issue_share(warps_per_scheduler):.1%}")


def schedule(body: list[Instruction]) -> LoopSchedule:
    mix: dict = {}
    hist: dict = {}
    wbars: dict = {}
    srcs = set_ = hits = conflicts = waits = 0
    prev = None
    for ins in body:
        name = ins.opcode if ins.base in ("LDS", "LDG", "STS", "LDGSTS") else ins.base
        name = re.sub(r"\.(E|CONSTANT|64|SYS|STRONG\.\w+|LTC128B|BYPASS|ZFILL)\b", "", name)
        mix[name] = mix.get(name, 0) + 1
        if ins.control.wait_mask:
            waits += 1
        if ins.control.write_barrier is not None:
            wbars[ins.base] = wbars.get(ins.base, 0) + 1
        c = bank_conflict_cycles(ins, prev)
        conflicts += c
        if ins.base == "FFMA":
            hist[ins.control.stall] = hist.get(ins.control.stall, 0) + 1
            cached = set()
            if prev is not None:
                cached = {(s, r) for s, r in enumerate(prev.sources()[:4]) if r and prev.control.reuse >> s & 1}
            for slot, reg in enumerate(ins.sources()[:3]):
                if reg and reg != "RZ":
                    srcs += 1
                    set_ += ins.control.reuse >> slot & 1
                    hits += (slot, reg) in cached
        prev = ins
    return LoopSchedule(instructions=len(body), ffma=mix.get("FFMA", 0), mix=mix,
                        stall_cycles=sum(i.control.stall for i in body), bank_conflicts=conflicts,
                        ffma_stall_hist=dict(sorted(hist.items())), reuse_set_fraction=set_ / max(1, srcs),
                        reuse_hit_fraction=hits / max(1, srcs), waits=waits, write_barriers=wbars)


def loop_schedule(sass: str) -> LoopSchedule:
    """The static schedule of the main loop of `sass` (one kernel's cuobjdump text)."""
    body = main_loop(parse(sass))
    if not body:
        raise ValueError("no backward branch holding an FFMA: no main loop found in this SASS")
    return schedule(body)
