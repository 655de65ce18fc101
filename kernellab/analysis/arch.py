"""Per-architecture SM limits that decide occupancy: one frozen `ArchSpec` per compute capability.

Sources, for every table below:
- CUDA C++ Programming Guide, "Compute Capabilities" / "Technical Specifications per Compute Capability" table
  (threads, warps, blocks, registers and shared memory per SM and per block, the shared-memory capacities
  an SM can be configured to);
- cuda_occupancy.h of the CUDA 13.0 toolkit, which mirrors the driver's occupancy code: allocation
  granularities, register sub-partitions, resident blocks per SM, the carveout steps and the 1 KiB per-block
  shared-memory reservation from sm_80 on;
- the CUDA Occupancy Calculator spreadsheet ("GPU data" sheet): register allocation unit 256, allocation
  granularity "warp", warp allocation granularity 4.
The sm_90 row is also checked against a live H100/H200 in tests/golden/device_sm90.json.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from kernellab.errors import KernellabError

KIB = 1024


class UnknownArchError(KernellabError, ValueError):
    """An architecture that has no table here."""


@dataclass(frozen=True)
class ArchSpec:
    """The per-SM and per-block limits of one compute capability, as the occupancy calculation uses them."""

    name: str                                  # "sm_90"
    compute_capability: tuple[int, int]        # (9, 0)
    family: str                                # "Hopper"
    example_gpus: str                          # products with this capability
    warp_size: int                             # threads per warp
    max_threads_per_block: int
    max_threads_per_sm: int
    max_warps_per_sm: int                      # max_threads_per_sm / warp_size
    max_blocks_per_sm: int                     # resident blocks per SM
    registers_per_sm: int                      # 32-bit registers in one SM's register file
    max_registers_per_block: int
    max_registers_per_thread: int              # what ptxas can assign (255)
    register_allocation_unit: int              # registers per allocation, per warp
    register_allocation_granularity: str       # registers are given to whole warps
    warp_allocation_granularity: int           # warps come in groups of this many (one per SM sub-partition)
    register_sub_partitions: int               # the register file is split in this many equal parts
    shared_memory_per_sm_bytes: int            # the largest shared-memory carveout of one SM
    shared_memory_per_block_bytes: int         # the per-block limit without opt-in (48 KiB)
    shared_memory_per_block_optin_bytes: int   # the per-block limit with cudaFuncAttributeMaxDynamicSharedMemorySize
    reserved_shared_memory_per_block_bytes: int  # the driver's per-block reservation (1 KiB from sm_80 on)
    shared_memory_allocation_unit_bytes: int   # shared memory per block is rounded up to this
    shared_memory_configs_kib: tuple[int, ...]  # the carveouts (KiB) an SM can be set to, ascending
    source: str                                # where these numbers come from

    def __post_init__(self):
        if self.max_warps_per_sm * self.warp_size != self.max_threads_per_sm:
            raise AssertionError(f"{self.name}: max_warps_per_sm x warp_size != max_threads_per_sm")
        if self.shared_memory_configs_kib[-1] * KIB != self.shared_memory_per_sm_bytes:
            raise AssertionError(f"{self.name}: the largest carveout must equal shared_memory_per_sm_bytes")

    @property
    def sm(self) -> int:
        """The compute capability as one number, e.g. 90."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def shared_memory_configs_bytes(self) -> tuple[int, ...]:
        """The carveouts an SM can be set to, in bytes, ascending."""
        return tuple(k * KIB for k in self.shared_memory_configs_kib)

    def smem_config_at_least(self, nbytes: int) -> int | None:
        """The smallest shared-memory carveout (bytes) holding `nbytes`, or None where none does."""
        for kib in self.shared_memory_configs_kib:
            if nbytes <= kib * KIB:
                return kib * KIB
        return None

    def to_json(self) -> dict:
        """All fields as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        d["shared_memory_configs_kib"] = list(self.shared_memory_configs_kib)
        return d

    def __str__(self):
        return (f"{self.name} ({self.family}: {self.example_gpus}): {self.max_warps_per_sm} warps, "
                f"{self.max_blocks_per_sm} blocks, {self.registers_per_sm} registers and "
                f"{self.shared_memory_per_sm_bytes // KIB} KiB shared memory per SM")


_SOURCE = ("CUDA C++ Programming Guide, Compute Capabilities table; cuda_occupancy.h (CUDA 13.0); "
           "CUDA Occupancy Calculator GPU data")

# The fields every architecture here shares (Volta to Blackwell): 64K registers per SM and per block,
# 255 registers per thread, registers given per warp in units of 256, warps in groups of 4
# (one per SM sub-partition), at most 1024 threads per block and 48 KiB shared memory without opt-in.
_COMMON = dict(
    warp_size=32,
    max_threads_per_block=1024,
    registers_per_sm=65536,
    max_registers_per_block=65536,
    max_registers_per_thread=255,
    register_allocation_unit=256,
    register_allocation_granularity="warp",
    warp_allocation_granularity=4,
    register_sub_partitions=4,
    shared_memory_per_block_bytes=48 * KIB,
    source=_SOURCE,
)

# Carveout steps from cuda_occupancy.h (cudaOccAlignUpShmemSizeVoltaPlus), in KiB.
_CONFIGS_VOLTA = (0, 8, 16, 32, 64, 96)
_CONFIGS_TURING = (32, 64)
_CONFIGS_GA100 = (0, 8, 16, 32, 64, 100, 132, 164)
_CONFIGS_GA10X = (0, 8, 16, 32, 64, 100)
_CONFIGS_HOPPER = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


def _arch(name, cc, family, gpus, *, warps, blocks, configs, optin_kib, reserved, smem_unit):
    return ArchSpec(
        name=name, compute_capability=cc, family=family, example_gpus=gpus,
        max_threads_per_sm=warps * 32, max_warps_per_sm=warps, max_blocks_per_sm=blocks,
        shared_memory_per_sm_bytes=configs[-1] * KIB,
        shared_memory_per_block_optin_bytes=optin_kib * KIB,
        reserved_shared_memory_per_block_bytes=reserved,
        shared_memory_allocation_unit_bytes=smem_unit,
        shared_memory_configs_kib=configs,
        **_COMMON,
    )


ARCHS: dict[str, ArchSpec] = {a.name: a for a in (
    # Volta and Turing: no per-block reservation, shared memory in 256-byte units.
    _arch("sm_70", (7, 0), "Volta", "V100", warps=64, blocks=32, configs=_CONFIGS_VOLTA,
          optin_kib=96, reserved=0, smem_unit=256),
    _arch("sm_75", (7, 5), "Turing", "T4, RTX 20xx", warps=32, blocks=16, configs=_CONFIGS_TURING,
          optin_kib=64, reserved=0, smem_unit=256),
    # Ampere on: the driver reserves 1 KiB per block, shared memory in 128-byte units,
    # and the opt-in limit per block is the SM's capacity less that reservation.
    _arch("sm_80", (8, 0), "Ampere", "A100, A30", warps=64, blocks=32, configs=_CONFIGS_GA100,
          optin_kib=163, reserved=KIB, smem_unit=128),
    _arch("sm_86", (8, 6), "Ampere", "A10, A40, RTX 30xx", warps=48, blocks=16, configs=_CONFIGS_GA10X,
          optin_kib=99, reserved=KIB, smem_unit=128),
    _arch("sm_87", (8, 7), "Ampere", "Jetson Orin", warps=48, blocks=16, configs=_CONFIGS_GA100,
          optin_kib=163, reserved=KIB, smem_unit=128),
    _arch("sm_89", (8, 9), "Ada Lovelace", "L4, L40S, RTX 40xx", warps=48, blocks=24, configs=_CONFIGS_GA10X,
          optin_kib=99, reserved=KIB, smem_unit=128),
    _arch("sm_90", (9, 0), "Hopper", "H100, H200, GH200", warps=64, blocks=32, configs=_CONFIGS_HOPPER,
          optin_kib=227, reserved=KIB, smem_unit=128),
    _arch("sm_100", (10, 0), "Blackwell", "B200, GB200", warps=64, blocks=32, configs=_CONFIGS_HOPPER,
          optin_kib=227, reserved=KIB, smem_unit=128),
    # cuda_occupancy.h gives compute capability 12.x 24 resident blocks per SM.
    _arch("sm_120", (12, 0), "Blackwell", "RTX 50xx, RTX PRO 6000", warps=48, blocks=24, configs=_CONFIGS_GA10X,
          optin_kib=99, reserved=KIB, smem_unit=128),
)}

DEFAULT_ARCH = "sm_90"        # what kernellab compiles for where no GPU says otherwise (H100, H200)
_NAME_RE = re.compile(r"(?:sm_?|compute_?)?(\d{2,3})([af]?)")
_DOTTED_RE = re.compile(r"(\d{1,2})\.(\d)")


def normalize_arch(arch) -> str:
    """The one arch parser: 'sm_90', '90', 90, (9, 0), '9.0', 'compute_90', 'sm90', 'sm_90a' -> 'sm_90' or 'sm_90a'
    (an 'a'/'f' suffix is kept). ValueError for anything else."""
    if isinstance(arch, tuple) and len(arch) == 2 and all(isinstance(v, int) for v in arch):
        return f"sm_{arch[0]}{arch[1]}"
    if isinstance(arch, (str, int)) and not isinstance(arch, bool):
        text = str(arch).strip().lower()
        m, d = _NAME_RE.fullmatch(text), _DOTTED_RE.fullmatch(text)
        if m:
            return f"sm_{m.group(1)}{m.group(2)}"
        if d:
            return f"sm_{d.group(1)}{d.group(2)}"
    raise ValueError(f"arch {arch!r} is not an architecture name; expected e.g. 'sm_90', 'sm_80' or 90")


def base_arch(arch) -> str:
    """The arch without its 'a'/'f' suffix, as tables, occupancy and devices name it: 'sm_90a' -> 'sm_90'."""
    return normalize_arch(arch).rstrip("af")


def compute_capability(arch) -> tuple[int, int]:
    """'sm_90' -> (9, 0), 'sm_120a' -> (12, 0), 'sm_89' -> (8, 9)."""
    digits = base_arch(arch)[3:]
    return int(digits[:-1]), int(digits[-1])


def _unknown(arch, why=""):
    known = ", ".join(ARCHS)
    return UnknownArchError(
        f"unknown architecture {arch!r}{why}; known: {known}. "
        "Pass one of those (e.g. 'sm_90', '90', 90 or (9, 0)); the 'a'/'f' suffixes are accepted.")


def get_arch(arch) -> ArchSpec:
    """The ArchSpec for "sm_90", "sm_90a", "90", "9.0", 90, (9, 0) or an ArchSpec itself."""
    if isinstance(arch, ArchSpec):
        return arch
    spec = ARCHS.get(arch) if isinstance(arch, str) else None  # fast path for "sm_90"
    if spec is not None:
        return spec
    if isinstance(arch, bool):
        raise _unknown(arch)
    if not isinstance(arch, (int, str, tuple)) or isinstance(arch, tuple) and not (
            len(arch) == 2 and all(isinstance(v, int) for v in arch)):
        raise _unknown(arch, f" (a {type(arch).__name__})")
    try:
        key = base_arch(arch)
    except ValueError:
        raise _unknown(arch, " (not an architecture name)" if isinstance(arch, str) else "") from None
    spec = ARCHS.get(key)
    if spec is None:
        raise _unknown(arch)
    return spec


# cudaGetDeviceProperties field (as cupy.cuda.runtime.getDeviceProperties names it) -> the ArchSpec value.
_DEVICE_FIELDS = {
    "warpSize": lambda a: a.warp_size,
    "maxThreadsPerBlock": lambda a: a.max_threads_per_block,
    "maxThreadsPerMultiProcessor": lambda a: a.max_threads_per_sm,
    "maxBlocksPerMultiProcessor": lambda a: a.max_blocks_per_sm,
    "regsPerMultiprocessor": lambda a: a.registers_per_sm,
    "regsPerBlock": lambda a: a.max_registers_per_block,
    "sharedMemPerMultiprocessor": lambda a: a.shared_memory_per_sm_bytes,
    "sharedMemPerBlock": lambda a: a.shared_memory_per_block_bytes,
    "sharedMemPerBlockOptin": lambda a: a.shared_memory_per_block_optin_bytes,
    "reservedSharedMemPerBlock": lambda a: a.reserved_shared_memory_per_block_bytes,
    "major": lambda a: a.compute_capability[0],
    "minor": lambda a: a.compute_capability[1],
}


def device_mismatches(spec: ArchSpec, props: dict) -> dict[str, tuple[int, int]]:
    """Fields where a device-properties dict (cudaGetDeviceProperties names) disagrees with `spec`: {field: (table, device)}."""
    out = {}
    for key, get in _DEVICE_FIELDS.items():
        if key in props and int(props[key]) != get(spec):
            out[key] = (get(spec), int(props[key]))
    return out
