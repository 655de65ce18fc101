"""Theoretical occupancy: how many blocks of a kernel fit on one SM, which resource stops the next one, and why.

The arithmetic follows the driver's cuOccupancyMaxActiveBlocksPerMultiprocessor as cuda_occupancy.h (CUDA 13.0)
describes it, for flags 0 and a kernel that opted in to the dynamic shared memory it asks for:

  warps      warps/block = ceil(threads / 32); blocks = max warps per SM // warps/block
  registers  registers are given to whole warps: regs/warp = round_up(regs/thread x 32, 256). The register
             file is split into 4 sub-partitions, so warps/SM = (regs per SM / 4 // regs/warp) x 4 and
             blocks = warps/SM // warps/block. A block cannot launch at all (0 blocks) when
             regs/warp x round_up(warps/block, 4) exceeds the 64K registers a block may hold.
  shared     bytes/block = round_up(static + dynamic + reservation (1 KiB from sm_80), 128 (256 before sm_80)).
             The SM's carveout is the preferred one (the largest by default, or `carveout` percent of it,
             rounded up to a configuration the SM has) unless one block needs more, in which case the
             smallest configuration that holds one block. blocks = carveout // bytes/block.
  blocks     the resident-block limit of the architecture.

Barriers (1 per block) and virtual resources never bind for ordinary kernels, so they are not modelled.
"""
from __future__ import annotations

import html
import operator
from dataclasses import dataclass, field

import numpy as np

from kernellab.analysis.arch import DEFAULT_ARCH, KIB, ArchSpec, get_arch
from kernellab.errors import KernellabError
from kernellab.report import REPORT_MIME, mimebundle

UNLIMITED = 2**31 - 1  # the block count for a resource the kernel does not use (the driver's INT_MAX)
LIMITERS = ("warps", "registers", "shared_memory", "blocks")  # in the driver's order of limiting-factor bits


class OccupancyInputError(KernellabError, ValueError):
    """A block size, register count, shared-memory size or carveout outside what the architecture allows."""


def _index(name, value):
    """`value` as a Python int, or an OccupancyInputError naming the argument."""
    try:
        return operator.index(value)
    except TypeError:
        raise OccupancyInputError(
            f"{name}={value!r} is not an integer; pass a whole number (a {type(value).__name__} was given)") from None


def _check_scalars(spec: ArchSpec, block_size, registers, shared_bytes, carveout):
    """Validate one configuration; raise OccupancyInputError naming the limit it breaks."""
    if not 1 <= block_size <= spec.max_threads_per_block:
        raise OccupancyInputError(
            f"block_size={block_size} is outside 1..{spec.max_threads_per_block}, the threads per block "
            f"{spec.name} allows; use a block of 1 to {spec.max_threads_per_block} threads")
    if not 0 <= registers <= spec.max_registers_per_thread:
        raise OccupancyInputError(
            f"registers={registers} is outside 0..{spec.max_registers_per_thread}, the registers per thread "
            f"{spec.name} allows; pass the kernel's register count as ptxas reports it")
    if not 0 <= shared_bytes <= spec.shared_memory_per_block_optin_bytes:
        raise OccupancyInputError(
            f"shared_bytes={shared_bytes} is outside 0..{spec.shared_memory_per_block_optin_bytes} "
            f"({spec.shared_memory_per_block_optin_bytes // KIB} KiB), the per-block opt-in shared-memory limit of "
            f"{spec.name} (static + dynamic, without the driver's reservation); use less shared memory per block")
    if carveout is not None and not (isinstance(carveout, (int, np.integer)) and 0 <= carveout <= 100):
        raise OccupancyInputError(
            f"carveout={carveout!r} is neither None (the driver's default) nor a percentage 0..100 of "
            f"the SM's {spec.shared_memory_per_sm_bytes // KIB} KiB shared memory")


def registers_per_warp(registers, arch=DEFAULT_ARCH):
    """Registers one warp is given at `registers` a thread: x warp size, rounded up to the allocation unit (256).
    Works element-wise on NumPy arrays too."""
    spec = get_arch(arch)
    unit = spec.register_allocation_unit
    return -(-(registers * spec.warp_size) // unit) * unit


def registers_per_sub_partition(arch=DEFAULT_ARCH) -> int:
    """The registers one SM sub-partition holds: a quarter (register_sub_partitions) of the register file, or of the
    per-block limit where that is smaller."""
    spec = get_arch(arch)
    return min(spec.registers_per_sm, spec.max_registers_per_block) // spec.register_sub_partitions


def warps_per_sub_partition(registers, arch=DEFAULT_ARCH):
    """The register rule, once: how many warps at `registers` a thread one SM sub-partition holds (UNLIMITED at 0).

    The register file is split into `register_sub_partitions` (4) equal parts and a warp's registers
    (registers_per_warp) live in one part, so one part holds registers_per_sm / 4 // regs/warp warps. A block of W
    warps puts ceil(W / 4) on its fullest part, so it launches only where ceil(W / 4) <= this number. The per-block
    limit (regs/warp x round_up(W, 4) <= max_registers_per_block) is the same inequality with a quarter of that
    limit, so the smaller quarter counts. Works element-wise on NumPy arrays too.
    """
    spec = get_arch(arch)
    per_part = registers_per_sub_partition(spec)
    per_warp = registers_per_warp(registers, spec)
    if isinstance(per_warp, np.ndarray):
        return np.where(per_warp == 0, UNLIMITED, per_part // np.maximum(per_warp, 1))
    return UNLIMITED if per_warp == 0 else per_part // per_warp


def _check_registers(spec: ArchSpec, registers) -> int:
    registers = _index("registers", registers)
    if not 0 <= registers <= spec.max_registers_per_thread:
        raise OccupancyInputError(
            f"registers={registers} is outside 0..{spec.max_registers_per_thread}, the registers per thread "
            f"{spec.name} allows; pass the kernel's register count as ptxas reports it")
    return registers


def max_threads_at_registers(registers: int, arch=DEFAULT_ARCH, *, launch_bounds_threads: int | None = None) -> int:
    """The largest block a kernel of `registers` a thread can launch on `arch`, as the driver's
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK gives it: whole warps up to 4 x warps_per_sub_partition (the fullest
    sub-partition holds its share), capped by the architecture's threads per block (1024) and by
    `launch_bounds_threads` (the product of __launch_bounds__/.maxntid) where given. 0 registers: no register cap.
    E.g. sm_90: 224 registers -> 7168 a warp, 2 warps a sub-partition -> 256 threads (not 65536 // 7168 = 9 warps)."""
    spec = get_arch(arch)
    registers = _check_registers(spec, registers)
    limit = spec.max_threads_per_block
    if launch_bounds_threads:
        limit = min(limit, _index("launch_bounds_threads", launch_bounds_threads))
    hold = warps_per_sub_partition(registers, spec)
    if hold != UNLIMITED:
        limit = min(limit, hold * spec.register_sub_partitions * spec.warp_size)
    return limit


def max_registers_at_threads(threads: int, arch=DEFAULT_ARCH) -> int:
    """The most registers a thread (ptxas's count, __maxnreg__) at which a block of `threads` threads launches on
    `arch`: the fullest sub-partition's ceil(warps / 4) warps must fit a quarter of the register file, in whole
    allocation units (256 a warp, so a multiple of 8 a thread), at most max_registers_per_thread (255).
    E.g. sm_90: 288 threads -> 9 warps, 3 on one sub-partition -> 16384 // 3 = 5461 -> 5376 a warp -> 168."""
    spec = get_arch(arch)
    threads = _index("threads", threads)
    if not 1 <= threads <= spec.max_threads_per_block:
        raise OccupancyInputError(
            f"threads={threads} is outside 1..{spec.max_threads_per_block}, the threads per block "
            f"{spec.name} allows; use a block of 1 to {spec.max_threads_per_block} threads")
    fullest = -(-(-(-threads // spec.warp_size)) // spec.register_sub_partitions)
    unit = spec.register_allocation_unit
    per_warp = registers_per_sub_partition(spec) // fullest // unit * unit
    return min(spec.max_registers_per_thread, per_warp // spec.warp_size)


def _preferred_smem_config(spec: ArchSpec, carveout) -> int:
    """The carveout (bytes) the SM is asked for: the largest by default, else `carveout`% rounded up to a configuration."""
    if carveout is None:
        return spec.shared_memory_per_sm_bytes
    return spec.smem_config_at_least(carveout * spec.shared_memory_per_sm_bytes // 100)


@dataclass(frozen=True)
class Occupancy:
    """The theoretical occupancy of one launch configuration on one architecture, with the limit that binds."""

    block_size: int               # threads per block (input)
    registers: int                # registers per thread (input)
    shared_bytes: int             # static + dynamic shared memory per block, without the reservation (input)
    arch: str                     # architecture name, e.g. "sm_90"
    carveout: int | None          # requested shared-memory carveout in percent; None = driver default (input)
    blocks_per_sm: int            # resident blocks per SM
    warps_per_sm: int             # resident warps per SM
    max_warps_per_sm: int         # the architecture's warp slots per SM
    ratio: float                  # warps_per_sm / max_warps_per_sm, 0..1
    limiter: str                  # "warps", "registers", "shared_memory" or "blocks": the first limit that binds
    limiters: tuple[str, ...]     # every limit that binds (ties)
    blocks_limit_warps: int       # blocks the warp slots allow
    blocks_limit_registers: int   # blocks the register file allows (UNLIMITED with 0 registers)
    blocks_limit_shared: int      # blocks the shared-memory carveout allows (UNLIMITED with 0 bytes per block)
    blocks_limit_blocks: int      # the architecture's resident-block limit
    warps_per_block: int          # ceil(block_size / warp size)
    registers_per_warp: int       # registers allocated per warp, rounded up to the allocation unit
    shared_bytes_per_block: int   # shared memory allocated per block: + reservation, rounded up to the unit
    smem_config_bytes: int        # the SM shared-memory carveout the calculation used
    spec: ArchSpec = field(repr=False, compare=False)

    @property
    def percent(self) -> float:
        """Occupancy in percent."""
        return 100.0 * self.ratio

    def limits(self) -> dict[str, int]:
        """Blocks per SM each resource allows, keyed as LIMITERS."""
        return {"warps": self.blocks_limit_warps, "registers": self.blocks_limit_registers,
                "shared_memory": self.blocks_limit_shared, "blocks": self.blocks_limit_blocks}

    def reasons(self) -> dict[str, str]:
        """For each limit, the arithmetic that gives its block count, keyed as LIMITERS."""
        s = self.spec
        w = self.warps_per_block
        out = {"warps": f"{s.max_warps_per_sm} warps/SM // {w} warps/block -> {_blocks(self.blocks_limit_warps)}"}

        if self.registers == 0:
            out["registers"] = "0 regs/thread: no register limit"
        else:
            g = s.warp_allocation_granularity
            need = self.registers_per_warp * -(-w // g) * g
            as_groups = f" (counted as {need // self.registers_per_warp}: warps come in groups of {g})" if w % g else ""
            head = (f"{self.registers} regs/thread -> {self.registers_per_warp} regs/warp "
                    f"(x{s.warp_size}, rounded up to {s.register_allocation_unit})")
            if self.blocks_limit_registers == 0:
                out["registers"] = (
                    f"{head}; {w} warps/block{as_groups} need {need} regs > "
                    f"{s.max_registers_per_block} per block -> 0 blocks: the block cannot launch; "
                    "use fewer registers (__launch_bounds__, -maxrregcount) or a smaller block")
            else:
                per_part = s.registers_per_sm // s.register_sub_partitions
                warps_part = per_part // self.registers_per_warp
                warps_sm = warps_part * s.register_sub_partitions
                out["registers"] = (
                    f"{head} -> {per_part} regs per sub-partition // {self.registers_per_warp} = {warps_part} warps "
                    f"x {s.register_sub_partitions} = {warps_sm} warps/SM // {w} warps/block "
                    f"-> {_blocks(self.blocks_limit_registers)}")

        reserved = s.reserved_shared_memory_per_block_bytes
        smem = f"{self.shared_bytes} B" + (f" + {reserved} B reserved" if reserved else "")
        cfg = f"{self.smem_config_bytes // KIB} KiB carveout"
        if self.smem_config_bytes != _preferred_smem_config(s, self.carveout):
            cfg += f" (raised from {_preferred_smem_config(s, self.carveout) // KIB} KiB to hold one block)"
        if self.shared_bytes_per_block == 0:
            out["shared_memory"] = "0 B/block: no shared-memory limit"
        else:
            out["shared_memory"] = (
                f"{smem} -> {self.shared_bytes_per_block} B/block (rounded up to "
                f"{s.shared_memory_allocation_unit_bytes}); {cfg} // {self.shared_bytes_per_block} "
                f"-> {_blocks(self.blocks_limit_shared)}")
        out["blocks"] = f"at most {s.max_blocks_per_sm} resident blocks/SM -> {_blocks(self.blocks_limit_blocks)}"
        return out

    @property
    def title(self) -> str:
        """One line: the occupancy and what limits it."""
        if self.blocks_per_sm == 0:
            return (f"Occupancy on {self.arch}: 0 blocks/SM - a block of {self.block_size} threads cannot launch "
                    f"({_LABEL[self.limiter]})")
        return (f"Occupancy on {self.arch}: {self.percent:.1f}% ({self.warps_per_sm}/{self.max_warps_per_sm} warps, "
                f"{_blocks(self.blocks_per_sm)}/SM x {self.warps_per_block} warps), limited by {_LABEL[self.limiter]}")

    def __str__(self):
        lines = [self.title,
                 f"  {self.block_size} threads/block, {self.registers} regs/thread, {self.shared_bytes} B shared/block"
                 + ("" if self.carveout is None else f", carveout {self.carveout}%")]
        reasons = self.reasons()
        for key in LIMITERS:
            mark = "  <- limit" if key in self.limiters else ""
            lines.append(f"  {_LABEL[key] + ':':15s}{reasons[key]}{mark}")
        return "\n".join(lines)

    def _repr_html_(self):
        reasons = self.reasons()
        limits = self.limits()
        rows = []
        for key in LIMITERS:
            bind = key in self.limiters
            style = ' style="font-weight:bold;background:#fff3cd"' if bind else ""
            n = "&infin;" if limits[key] == UNLIMITED else str(limits[key])
            rows.append(f"<tr{style}><td style='text-align:left'>{_LABEL[key]}</td>"
                        f"<td style='text-align:right'>{n}</td>"
                        f"<td style='text-align:left;font-family:monospace'>{html.escape(reasons[key])}</td></tr>")
        pct = self.percent
        bar = (f"<div style='width:240px;height:10px;background:#eee;display:inline-block;vertical-align:middle'>"
               f"<div style='width:{pct:.1f}%;height:10px;background:#4c72b0'></div></div>")
        inputs = (f"{self.block_size} threads/block &middot; {self.registers} regs/thread &middot; "
                  f"{self.shared_bytes} B shared/block &middot; {html.escape(self.arch)}"
                  + ("" if self.carveout is None else f" &middot; carveout {self.carveout}%"))
        return (f"<div class='kernellab-occupancy'><b>{html.escape(self.title)}</b><br>{bar} "
                f"<span>{pct:.1f}%</span><br><small>{inputs}</small>"
                "<table><thead><tr><th style='text-align:left'>limit</th><th>blocks/SM</th>"
                "<th style='text-align:left'>why</th></tr></thead><tbody>"
                + "".join(rows) + "</tbody></table></div>")

    def to_json(self) -> dict:
        """The report as JSON.

        Fields: kind "occupancy", version 1, title; the inputs block_size, registers, shared_bytes, arch,
        carveout (percent or null); blocks_per_sm, warps_per_sm, max_warps_per_sm, ratio (0..1), limiter,
        limiters; limits {warps, registers, shared_memory, blocks: blocks per SM, null = unlimited};
        reasons {same keys: the arithmetic as text}; warps_per_block, registers_per_warp,
        shared_bytes_per_block (allocated, reservation included), smem_config_bytes.
        """
        return {
            "kind": "occupancy", "version": 1, "title": self.title,
            "block_size": self.block_size, "registers": self.registers, "shared_bytes": self.shared_bytes,
            "arch": self.arch, "carveout": self.carveout,
            "blocks_per_sm": self.blocks_per_sm, "warps_per_sm": self.warps_per_sm,
            "max_warps_per_sm": self.max_warps_per_sm, "ratio": self.ratio,
            "limiter": self.limiter, "limiters": list(self.limiters),
            "limits": {k: (None if v == UNLIMITED else v) for k, v in self.limits().items()},
            "reasons": self.reasons(),
            "warps_per_block": self.warps_per_block, "registers_per_warp": self.registers_per_warp,
            "shared_bytes_per_block": self.shared_bytes_per_block, "smem_config_bytes": self.smem_config_bytes,
        }

    def _repr_mimebundle_(self, include=None, exclude=None):
        return mimebundle(self, include, exclude)


def _blocks(n: int) -> str:
    return "1 block" if n == 1 else f"{n} blocks"


_LABEL = {"warps": "warps", "registers": "registers", "shared_memory": "shared memory", "blocks": "blocks"}


def occupancy(block_size: int, registers: int, shared_bytes: int = 0, arch=DEFAULT_ARCH, *, carveout=None) -> Occupancy:
    """Theoretical occupancy of blocks of `block_size` threads using `registers`/thread and `shared_bytes`/block."""
    spec = get_arch(arch)
    block_size = _index("block_size", block_size)
    registers = _index("registers", registers)
    shared_bytes = _index("shared_bytes", shared_bytes)
    _check_scalars(spec, block_size, registers, shared_bytes, carveout)

    warp = spec.warp_size
    warps_per_block = -(-block_size // warp)
    limit_warps = spec.max_warps_per_sm // warps_per_block

    regs_per_warp = registers_per_warp(registers, spec)
    parts = spec.register_sub_partitions
    if regs_per_warp == 0:
        limit_regs = UNLIMITED
    elif -(-warps_per_block // parts) > warps_per_sub_partition(registers, spec):
        limit_regs = 0  # the fullest sub-partition cannot hold its warps: the block cannot launch
    else:
        limit_regs = (spec.registers_per_sm // parts // regs_per_warp) * parts // warps_per_block

    sunit = spec.shared_memory_allocation_unit_bytes
    smem_per_block = -(-(shared_bytes + spec.reserved_shared_memory_per_block_bytes) // sunit) * sunit
    config = _preferred_smem_config(spec, carveout)
    if config < smem_per_block:
        config = spec.smem_config_at_least(smem_per_block)
    limit_smem = config // smem_per_block if smem_per_block else UNLIMITED

    limit_blocks = spec.max_blocks_per_sm
    blocks = min(limit_warps, limit_regs, limit_smem, limit_blocks)
    limiters = tuple(k for k, v in zip(LIMITERS, (limit_warps, limit_regs, limit_smem, limit_blocks)) if v == blocks)
    warps = blocks * warps_per_block
    return Occupancy(
        block_size=block_size, registers=registers, shared_bytes=shared_bytes, arch=spec.name, carveout=carveout,
        blocks_per_sm=blocks, warps_per_sm=warps, max_warps_per_sm=spec.max_warps_per_sm,
        ratio=warps / spec.max_warps_per_sm, limiter=limiters[0], limiters=limiters,
        blocks_limit_warps=limit_warps, blocks_limit_registers=limit_regs, blocks_limit_shared=limit_smem,
        blocks_limit_blocks=limit_blocks, warps_per_block=warps_per_block, registers_per_warp=regs_per_warp,
        shared_bytes_per_block=smem_per_block, smem_config_bytes=config, spec=spec,
    )


@dataclass(frozen=True)
class OccupancySweep:
    """Occupancy over many configurations at once: every field is a NumPy array of one broadcast shape."""

    arch: str
    carveout: int | None
    block_size: np.ndarray
    registers: np.ndarray
    shared_bytes: np.ndarray
    blocks_per_sm: np.ndarray
    warps_per_sm: np.ndarray
    ratio: np.ndarray
    limiter_code: np.ndarray          # index into LIMITERS of the first limit that binds
    blocks_limit_warps: np.ndarray
    blocks_limit_registers: np.ndarray
    blocks_limit_shared: np.ndarray
    blocks_limit_blocks: np.ndarray
    smem_config_bytes: np.ndarray

    @property
    def limiter(self) -> np.ndarray:
        """The first binding limit of each configuration, as LIMITERS names."""
        return np.asarray(LIMITERS)[self.limiter_code]

    def __len__(self):
        return self.block_size.size

    def __str__(self):
        best = int(np.argmax(self.ratio)) if self.ratio.size else 0
        return (f"OccupancySweep on {self.arch}: {self.ratio.size} configurations, occupancy "
                f"{100 * self.ratio.min():.1f}%..{100 * self.ratio.max():.1f}% (best at block_size="
                f"{self.block_size.flat[best]}, registers={self.registers.flat[best]}, "
                f"shared_bytes={self.shared_bytes.flat[best]})")


def _as_int_array(name, value):
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.floor(arr)):
            arr = arr.astype(np.int64)
        else:
            raise OccupancyInputError(f"{name} must hold integers (got dtype {arr.dtype}); pass whole numbers")
    return arr.astype(np.int64, copy=False)


def occupancy_sweep(block_sizes=None, registers=32, shared_bytes=0, arch=DEFAULT_ARCH, *, carveout=None) -> OccupancySweep:
    """Vectorised occupancy(): block_sizes, registers and shared_bytes broadcast against each other.

    block_sizes defaults to every size 1..max threads per block. Each argument may be a scalar or array-like;
    the result's arrays have the broadcast shape. Agrees element for element with occupancy().
    """
    spec = get_arch(arch)
    if block_sizes is None:
        block_sizes = np.arange(1, spec.max_threads_per_block + 1)
    b, r, s = np.broadcast_arrays(_as_int_array("block_sizes", block_sizes), _as_int_array("registers", registers),
                                  _as_int_array("shared_bytes", shared_bytes))
    if b.size:  # each check looks at one argument, so the extremes of each array cover every element
        _check_scalars(spec, int(b.min()), int(r.min()), int(s.min()), carveout)
        _check_scalars(spec, int(b.max()), int(r.max()), int(s.max()), carveout)
    else:
        _check_scalars(spec, 1, 0, 0, carveout)

    warp = spec.warp_size
    warps_per_block = -(-b // warp)
    limit_warps = spec.max_warps_per_sm // warps_per_block

    parts = spec.register_sub_partitions
    regs_per_warp = registers_per_warp(r, spec)
    fits = -(-warps_per_block // parts) <= warps_per_sub_partition(r, spec)
    warps_by_regs = (spec.registers_per_sm // parts) // np.maximum(regs_per_warp, 1) * parts
    limit_regs = np.where(regs_per_warp == 0, UNLIMITED, np.where(fits, warps_by_regs // warps_per_block, 0))

    sunit = spec.shared_memory_allocation_unit_bytes
    smem_per_block = -(-(s + spec.reserved_shared_memory_per_block_bytes) // sunit) * sunit
    configs = np.asarray(spec.shared_memory_configs_bytes, dtype=np.int64)
    preferred = _preferred_smem_config(spec, carveout)
    smallest_fit = configs[np.minimum(np.searchsorted(configs, smem_per_block, side="left"), configs.size - 1)]
    config = np.where(smem_per_block <= preferred, preferred, smallest_fit)
    limit_smem = np.where(smem_per_block == 0, UNLIMITED, config // np.maximum(smem_per_block, 1))

    limit_blocks = np.full(b.shape, spec.max_blocks_per_sm, dtype=np.int64)
    stacked = np.stack([limit_warps, limit_regs, limit_smem, limit_blocks])  # (4, ...) in LIMITERS order
    blocks = stacked.min(axis=0)
    limiter_code = np.argmax(stacked == blocks, axis=0)  # the first limit equal to the minimum
    warps = blocks * warps_per_block
    return OccupancySweep(
        arch=spec.name, carveout=carveout, block_size=b, registers=r, shared_bytes=s,
        blocks_per_sm=blocks, warps_per_sm=warps, ratio=warps / spec.max_warps_per_sm, limiter_code=limiter_code,
        blocks_limit_warps=limit_warps, blocks_limit_registers=limit_regs, blocks_limit_shared=limit_smem,
        blocks_limit_blocks=limit_blocks, smem_config_bytes=config,
    )


def best_block_sizes(registers: int, shared_bytes=0, arch=DEFAULT_ARCH, *, top: int = 5, carveout=None,
                     max_threads: int | None = None) -> list[int]:
    """The `top` block sizes (multiples of the warp size) with the highest occupancy, best first.

    `shared_bytes` may be a number or a function of the block size (bytes per block), as with
    cudaOccupancyMaxPotentialBlockSizeVariableSMem. Equal occupancy ranks the larger block first, as the
    driver's cuOccupancyMaxPotentialBlockSize prefers it. Block sizes that cannot launch are left out, and so are
    those above `max_threads` (a kernel's max_threads_per_block: its launch bounds and registers).
    """
    spec = get_arch(arch)
    limit = spec.max_threads_per_block if max_threads is None else min(int(max_threads), spec.max_threads_per_block)
    sizes = np.arange(spec.warp_size, limit + 1, spec.warp_size)
    smem = np.array([shared_bytes(int(n)) for n in sizes]) if callable(shared_bytes) else shared_bytes
    sweep = occupancy_sweep(sizes, registers, smem, spec, carveout=carveout)
    order = np.lexsort((-sizes, -sweep.warps_per_sm))  # most warps first, then the larger block
    order = order[sweep.blocks_per_sm[order] > 0]
    return [int(n) for n in sizes[order[:top]]]
