"""Shared-memory bank model: how many wavefronts one warp-wide shared load takes (sm_90, measured with Nsight Compute).

The rules (32 banks, each 4 bytes wide; bank = (byte address // 4) % 32):

- A warp's request is processed in phases of lanes. 4-byte loads (LDS.32) are one phase of 32 lanes; 8-byte loads
  (LDS.64) two half-warps (lanes 0-15, 16-31); 16-byte loads (LDS.128) four quarter-warps (lanes 0-7, 8-15, ...):
  each phase asks for at most 128 bytes. A phase with no active lane costs nothing.
- Paired lanes double the phase: for 8- and 16-byte loads, if lanes n and n^1 read the same address for every n where
  both are active (or likewise lanes n and n^2), the hardware returns one value to both lanes of a pair, and the phases
  are twice as wide: the whole warp for 8 bytes, half-warps for 16 bytes. A lane whose partner is inactive does not
  break the pairing; a broadcast (every lane the same address) pairs. Pairing n with n^4, n^8 or n^16 does not count.
- Within a phase, one wavefront reads at most one 4-byte word from each bank. Lanes asking for the same word are served
  together (broadcast/multicast), so a phase takes as many wavefronts as the largest number of distinct words that its
  lanes ask of one bank: its "n-way bank conflict".
- The warp's wavefronts are the sum over its active phases: Nsight Compute's
  `l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum` for one LDS instruction. Wavefronts beyond one per active
  phase are its `l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum`.

These rules reproduce every row of `tests/golden/banks_sm90.csv` (373 single-warp patterns measured with ncu on an
H200: strides, permutations, random, broadcast, pairs, inactive lanes, for each width), both counters exactly. The
pairing rule matches NVIDIA's description of uniform-address shared loads on Volta/Turing (forum answer on LDS.128
"thread pairing"). Stores and atomics are modelled with the same rules; the table measures loads only.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Iterable, Sequence

from kernellab.errors import KernellabError
from kernellab.report import esc, html_table, mimebundle

WARP_SIZE = 32
BANK_COUNT = 32
BANK_WIDTH_BYTES = 4
WAVEFRONT_BYTES = BANK_COUNT * BANK_WIDTH_BYTES  # 128: one word from every bank
ACCESS_BYTES = (4, 8, 16)  # LDS.32, LDS.64, LDS.128


class BankAccessError(KernellabError, ValueError):
    """A warp access the bank model cannot take: wrong lane count, width, or a misaligned or negative address."""


def bank_of(byte_address: int) -> int:
    """The bank (0..31) holding the 4-byte word at this byte address."""
    return (byte_address // BANK_WIDTH_BYTES) % BANK_COUNT


@dataclass(frozen=True)
class LaneWord:
    """One 4-byte word that one lane reads, and the wavefront that delivers it."""

    lane: int
    word_address: int  # byte address of the 4-byte word
    bank: int
    phase: int  # index of the lane group (whole warp, half-warp or quarter-warp) the lane belongs to
    wavefront: int  # 0-based, over the whole warp's request


@dataclass(frozen=True)
class BankUse:
    """Which lanes touch one bank and which distinct words they ask of it."""

    bank: int
    lanes: tuple[int, ...]
    word_addresses: tuple[int, ...]  # distinct, sorted
    ways: int  # distinct words asked of this bank within one phase, worst phase


@dataclass(frozen=True)
class WarpAccess:
    """One warp-wide shared-memory access: its lanes' addresses and the wavefronts the hardware takes for it."""

    addresses: tuple[int | None, ...]  # 32 byte addresses, None for an inactive lane
    access_bytes: int  # 4, 8 or 16
    wavefronts: int  # what ncu counts as l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld
    ideal_wavefronts: int  # the same lanes without any bank conflict: one per active phase
    ways: int  # worst n-way bank conflict (1 = none, 0 = no active lane)
    lanes_per_phase: int  # 32, 16 or 8
    pair_xor: int  # 1 or 2 if lanes n and n^pair_xor share addresses (phases doubled for 8/16 bytes), else 0
    lane_words: tuple[LaneWord, ...]  # every word every active lane reads, in lane order

    @property
    def active_lanes(self) -> tuple[int, ...]:
        """Lanes that take part in the access."""
        return tuple(lane for lane, a in enumerate(self.addresses) if a is not None)

    @property
    def conflict_wavefronts(self) -> int:
        """Wavefronts beyond the conflict-free count: the price of the bank conflicts."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def banks(self) -> tuple[BankUse, ...]:
        """Per bank (0..31): the lanes that touch it and the distinct words they read."""
        lanes: list[set[int]] = [set() for _ in range(BANK_COUNT)]
        words: list[set[int]] = [set() for _ in range(BANK_COUNT)]
        per_phase: dict[tuple[int, int], set[int]] = {}
        for w in self.lane_words:
            lanes[w.bank].add(w.lane)
            words[w.bank].add(w.word_address)
            per_phase.setdefault((w.phase, w.bank), set()).add(w.word_address)
        ways = [0] * BANK_COUNT
        for (_, bank), ws in per_phase.items():
            ways[bank] = max(ways[bank], len(ws))
        return tuple(
            BankUse(bank, tuple(sorted(lanes[bank])), tuple(sorted(words[bank])), ways[bank])
            for bank in range(BANK_COUNT)
        )

    @property
    def wavefront_lanes(self) -> tuple[tuple[int, ...], ...]:
        """For each wavefront, the lanes it delivers (a 16-byte lane may be served over several)."""
        served: list[set[int]] = [set() for _ in range(self.wavefronts)]
        for w in self.lane_words:
            served[w.wavefront].add(w.lane)
        return tuple(tuple(sorted(s)) for s in served)

    @property
    def title(self) -> str:
        """One line: width, lanes, wavefronts and the worst conflict."""
        n = len(self.active_lanes)
        conflict = "no bank conflict" if self.ways <= 1 else f"{self.ways}-way bank conflict"
        return (
            f"{self.access_bytes}-byte shared access, {n} active lane{'s' if n != 1 else ''}: "
            f"{self.wavefronts} wavefront{'s' if self.wavefronts != 1 else ''} "
            f"(ideal {self.ideal_wavefronts}), {conflict}"
        )

    @property
    def phase_text(self) -> str:
        """How the hardware splits the warp, in words."""
        n = WARP_SIZE // self.lanes_per_phase
        text = "one phase of 32 lanes" if n == 1 else f"{n} phases of {self.lanes_per_phase} lanes"
        if self.pair_xor:
            text += f" (lanes n and n^{self.pair_xor} read the same address, so each phase serves twice the lanes)"
        return text

    def __str__(self) -> str:
        lines = [self.title, f"  processed as {self.phase_text}"]
        for i, lanes in enumerate(self.wavefront_lanes):
            lines.append(f"  wavefront {i}: lanes {_lane_ranges(lanes)}")
        conflicted = sorted((b for b in self.banks if b.ways > 1), key=lambda b: (-b.ways, b.bank))
        for b in conflicted[:4]:
            words = ", ".join(f"{a:#x}" for a in b.word_addresses[:6]) + (" ..." if len(b.word_addresses) > 6 else "")
            lines.append(f"  bank {b.bank:2d}: {b.ways}-way, lanes {_lane_ranges(b.lanes)} read words {words}")
        if len(conflicted) > 4:
            lines.append(f"  ... and {len(conflicted) - 4} more banks in conflict")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        served = html_table(
            ["wavefront", "lanes served"], [(i, _lane_ranges(lanes)) for i, lanes in enumerate(self.wavefront_lanes)]
        )
        conflicted = [
            (b.bank, f"{b.ways}-way", _lane_ranges(b.lanes), len(b.word_addresses)) for b in self.banks if b.ways > 1
        ]
        conflicts = html_table(["bank", "conflict", "lanes", "distinct words"], conflicted) if conflicted else ""
        return (
            f"<div class='kernellab-banks'><b>{esc(self.title)}</b><br><small>processed as {esc(self.phase_text)}"
            f"</small>{served}{conflicts}</div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """`{"kind": "banks", "version": 1, "title", "access_bytes", "addresses" (null = inactive lane), "wavefronts",
        "ideal_wavefronts", "ways", "lanes_per_phase", "pair_xor", "wavefront_lanes" (lanes per wavefront),
        "banks" ([{"bank", "lanes", "word_addresses", "ways"}] for the banks in use)}`."""
        return {
            "kind": "banks",
            "version": 1,
            "title": self.title,
            **self._json_fields(),
        }

    def _json_fields(self) -> dict:
        return {
            "access_bytes": self.access_bytes,
            "addresses": list(self.addresses),
            "wavefronts": self.wavefronts,
            "ideal_wavefronts": self.ideal_wavefronts,
            "ways": self.ways,
            "lanes_per_phase": self.lanes_per_phase,
            "pair_xor": self.pair_xor,
            "wavefront_lanes": [list(lanes) for lanes in self.wavefront_lanes],
            "banks": [
                {"bank": b.bank, "lanes": list(b.lanes), "word_addresses": list(b.word_addresses), "ways": b.ways}
                for b in self.banks
                if b.lanes
            ],
        }


@dataclass(frozen=True)
class BankReport:
    """Many warp accesses modelled together: totals and the worst conflict."""

    accesses: tuple[WarpAccess, ...]

    @property
    def instructions(self) -> int:
        """Warp-level accesses (shared load instructions executed)."""
        return len(self.accesses)

    @property
    def wavefronts(self) -> int:
        """Total wavefronts."""
        return sum(a.wavefronts for a in self.accesses)

    @property
    def ideal_wavefronts(self) -> int:
        """Total wavefronts had there been no bank conflict."""
        return sum(a.ideal_wavefronts for a in self.accesses)

    @property
    def ways(self) -> int:
        """Worst n-way bank conflict over all accesses."""
        return max((a.ways for a in self.accesses), default=0)

    @property
    def title(self) -> str:
        """One line: instructions, wavefronts, worst conflict."""
        per = self.wavefronts / self.instructions if self.instructions else 0.0
        return (
            f"{self.instructions} shared access{'es' if self.instructions != 1 else ''}: {self.wavefronts} wavefronts "
            f"({per:.2f} per access, ideal {self.ideal_wavefronts}), worst {self.ways}-way"
        )

    def __str__(self) -> str:
        lines = [self.title]
        for i, a in enumerate(self.accesses[:16]):
            lines.append(f"  [{i}] {a.title}")
        if len(self.accesses) > 16:
            lines.append(f"  ... {len(self.accesses) - 16} more")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = [
            (i, a.access_bytes, len(a.active_lanes), a.wavefronts, a.ideal_wavefronts, a.ways)
            for i, a in enumerate(self.accesses[:64])
        ]
        table = html_table(["#", "bytes", "active lanes", "wavefronts", "ideal", "n-way"], rows)
        more = f"<p>... {len(self.accesses) - 64} more</p>" if len(self.accesses) > 64 else ""
        return f"<div class='kernellab-banks'><b>{esc(self.title)}</b>{table}{more}</div>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """`{"kind": "banks", "version": 1, "title", "instructions", "wavefronts", "ideal_wavefronts", "ways",
        "accesses": [one WarpAccess.to_json() without kind/version each]}`."""
        return {
            "kind": "banks",
            "version": 1,
            "title": self.title,
            "instructions": self.instructions,
            "wavefronts": self.wavefronts,
            "ideal_wavefronts": self.ideal_wavefronts,
            "ways": self.ways,
            "accesses": [a._json_fields() for a in self.accesses],
        }


def bank_wavefronts(addresses: Sequence[int | None], access_bytes: int = 4) -> int:
    """Wavefronts one warp-wide shared load takes, given its 32 lanes' byte addresses (None = inactive lane)."""
    return analyze_access(addresses, access_bytes).wavefronts


def analyze_access(addresses: Sequence[int | None], access_bytes: int = 4) -> WarpAccess:
    """Model one warp-wide shared load: wavefronts, worst n-way conflict, and which lanes each wavefront serves.

    Raises `BankAccessError` (a `ValueError`) naming the lane and the rule for anything but 32 lanes of non-negative,
    width-aligned integer byte addresses (None for an inactive lane) and a width of 4, 8 or 16 bytes.
    """
    lanes = _check(addresses, access_bytes)
    words_per_lane = access_bytes // BANK_WIDTH_BYTES
    lanes_per_phase = WARP_SIZE // words_per_lane  # 32, 16, 8: each phase asks for at most 128 bytes
    pair_xor = 0
    if access_bytes > BANK_WIDTH_BYTES:
        pair_xor = next((x for x in _PAIR_XORS if _lanes_paired(lanes, x)), 0)
        if pair_xor:
            lanes_per_phase *= 2  # one value returned to both lanes of a pair: twice the lanes per phase
    lane_words: list[LaneWord] = []
    wavefront_base = 0
    ideal = 0
    ways = 0
    for phase in range(WARP_SIZE // lanes_per_phase):
        phase_lanes = range(phase * lanes_per_phase, (phase + 1) * lanes_per_phase)
        # Distinct words per bank, in order of the first lane asking: the k-th distinct word is served in wavefront k.
        order: dict[int, dict[int, int]] = {}
        phase_words = []
        for lane in phase_lanes:
            if lanes[lane] is None:
                continue
            for k in range(words_per_lane):
                word = lanes[lane] + BANK_WIDTH_BYTES * k
                bank = bank_of(word)
                slots = order.setdefault(bank, {})
                slot = slots.setdefault(word, len(slots))
                phase_words.append((lane, word, bank, slot))
        if not phase_words:
            continue  # a phase with no active lane costs nothing
        depth = max(len(slots) for slots in order.values())
        lane_words += [
            LaneWord(lane, word, bank, phase, wavefront_base + slot) for lane, word, bank, slot in phase_words
        ]
        wavefront_base += depth
        ideal += 1
        ways = max(ways, depth)
    lane_words.sort(key=lambda w: (w.lane, w.word_address))
    return WarpAccess(
        addresses=lanes,
        access_bytes=access_bytes,
        wavefronts=wavefront_base,
        ideal_wavefronts=ideal,
        ways=ways,
        lanes_per_phase=lanes_per_phase,
        pair_xor=pair_xor,
        lane_words=tuple(lane_words),
    )


def analyze_accesses(accesses: Iterable[Sequence[int | None]], access_bytes: int | Sequence[int] = 4) -> BankReport:
    """Model many warp-wide accesses (each 32 byte addresses); `access_bytes` is one width or one per access."""
    accesses = list(accesses)
    if isinstance(access_bytes, numbers.Integral):
        widths = [int(access_bytes)] * len(accesses)
    else:
        widths = [int(w) for w in access_bytes]
        if len(widths) != len(accesses):
            raise BankAccessError(
                f"got {len(accesses)} accesses but {len(widths)} access widths; "
                "pass one width for all or exactly one per access"
            )
    out = []
    for i, (addresses, width) in enumerate(zip(accesses, widths)):
        try:
            out.append(analyze_access(addresses, width))
        except BankAccessError as exc:
            raise BankAccessError(f"access {i}: {exc}") from None
    return BankReport(tuple(out))


_PAIR_XORS = (1, 2)  # partners n^1 and n^2 count; n^4, n^8, n^16 were measured not to


def _lanes_paired(lanes: Sequence[int | None], xor: int) -> bool:
    """True if every two active lanes n and n^xor read the same address."""
    return all(a is None or lanes[n ^ xor] is None or a == lanes[n ^ xor] for n, a in enumerate(lanes))


def _check(addresses: Sequence[int | None], access_bytes: int) -> tuple[int | None, ...]:
    """Validate one warp's addresses and width; return them as a tuple of ints and None."""
    is_int = isinstance(access_bytes, numbers.Integral) and not isinstance(access_bytes, bool)
    if not is_int or access_bytes not in ACCESS_BYTES:
        raise BankAccessError(
            f"access_bytes must be 4, 8 or 16 (LDS.32, LDS.64, LDS.128), got {access_bytes!r}; "
            "for 1- or 2-byte loads pass the address rounded down to a multiple of 4 with access_bytes=4"
        )
    try:
        lanes = list(addresses)
    except TypeError:
        raise BankAccessError(
            f"expected a sequence of {WARP_SIZE} byte addresses (one per lane, None for an inactive lane), "
            f"got {type(addresses).__name__}"
        ) from None
    if len(lanes) != WARP_SIZE:
        raise BankAccessError(
            f"expected {WARP_SIZE} byte addresses (one per lane of a warp, None for an inactive lane), "
            f"got {len(lanes)}"
        )
    out: list[int | None] = []
    for lane, a in enumerate(lanes):
        if a is None:
            out.append(None)
            continue
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise BankAccessError(
                f"lane {lane}: address {a!r} is not an integer byte address (use None for an inactive lane)"
            )
        a = int(a)
        if a < 0:
            raise BankAccessError(
                f"lane {lane}: address {a} is negative; shared-memory byte addresses start at 0 "
                "(use None, not a negative number, for an inactive lane)"
            )
        if a % access_bytes:
            raise BankAccessError(
                f"lane {lane}: address {a} is not a multiple of the {access_bytes}-byte access width; "
                f"a {access_bytes}-byte shared load must be {access_bytes}-byte aligned "
                f"(nearest aligned address: {a - a % access_bytes})"
            )
        out.append(a)
    return tuple(out)


def _lane_ranges(lanes: Iterable[int]) -> str:
    """'0-7, 16, 18-19' for a set of lanes."""
    lanes = sorted(set(lanes))
    if not lanes:
        return "none"
    parts = []
    start = prev = lanes[0]
    for lane in lanes[1:] + [None]:
        if lane is not None and lane == prev + 1:
            prev = lane
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if lane is not None:
            start = prev = lane
    return ", ".join(parts)
