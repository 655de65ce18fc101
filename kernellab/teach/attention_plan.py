"""Which of tutorial 07's attention kernels, with which tiles, runs one call: the selection model of `kl::attention`.

The entry point (07's launcher cell, `attention(q, k, v, out=None, causal=False)`) asks
`plan_attention(B, H, N, d, causal, dtype, sms, device=name)` for a `Plan` and launches what it names. Pure Python:
no GPU, no torch; the same function is unit-tested on the CPU (tests/test_attention_plan.py) with 132 SMs.

The model. A kernel splits each (batch, head) into *work items* of `block_m` query rows; an item walks its key tiles
of `block_n` keys (all of them, or with the causal mask those up to the diagonal: item j of a head has
`min(ceil(N / block_n), ceil((j + 1) block_m / block_n))` tiles). Per candidate kernel the model counts:

- **slots**: CTAs resident at once, `sms * ctas_per_sm` (one CTA an SM for the wgmma kernels of steps 3 and 3b, two for
  step 2 and for the short-sequence variant `_bm64`);
- **tile time**: one key tile of one item on one slot, `4 block_m block_n d` FLOPs at the kernel's steady rate
  (`tflops`, the whole GPU's rate on long items) shared by the slots: `4 bm bn d * slots / (tflops * 1e12)` seconds;
  a kernel of two CTAs an SM whose items all have an SM to themselves runs `alone_speedup` times faster;
- **fixed cost per item** (`item_fixed_tiles`, in tile times): what an item pays that its tiles' products do not
  cover: the Q load and pipeline fill before the first product, the epilogue after the last, less whatever another
  resident CTA (or, in the persistent kernel, the producer loading the next item) hides; with the causal mask,
  `mask_tiles` more (masking the diagonal tiles). An item takes `(tiles + fixed + mask) * tile time`;
- **waves and the tail**: items go to slots greedily in the kernel's order (the hardware's CTA dispatch for one CTA
  per item, the work counter for the persistent kernels, which run `min(slots, items)` CTAs; both hand the heaviest
  causal items out first). The makespan is simulated exactly up to 8 items a slot; beyond, it is the mean load plus
  one item (persistent: the lightest, as the counter evens the loads out; one CTA per item: half the heaviest); equal
  items (no mask) take `ceil(items / slots)` whole waves;
- **launch and fill** (per call): `launch_us`, fitted (the launch, CTA start-up, the last CTA's drain), and the first
  wave's fill: every resident item loads its Q block and first K/V tile from DRAM at once (`fill_us`);
- **memory floor** (`memory_us`): Q, K, V read once and O written once at the copy ceiling, after the launch; the L2 a
  call meets is full of dirty lines, so its first L2_BYTES each evict one (written back: twice the traffic, what the
  17-34 MB shapes measured), the rest do not. A floor at half the copy ceiling whatever the size put B*H = 256,
  N = 512, d = 128 causal (134 MB) at 89.5 µs, above both Hopper kernels' GPU time, and the lighter launch chose step
  3 (83.8 µs measured) over 3b (74.7): the GPU terms (waves, tiles, the persistent kernel's even tail) had it right;
- **host time**, reported, not chosen on: the op's Python path with its launch (`host_us`; 11.3 µs with pointers,
  18.6 µs with the Hopper kernels' three tensor maps). A call's host time overlaps the GPU work queued before it: on
  the H100 grid triton's do_bench (calls one at a time after a 256 MB memset) timed every step at its
  kernellab.bench time within noise, fa3p_bm64 8.4 µs against fa2's 8.7 at N = 128, so the launch paths' difference
  never showed, and the plan that minimised `max(GPU, host)` ran up to 1.37x the best step's time (fa2 23.1 µs,
  fa3 16.9). `Estimate.host_bound` says where the host would be the limit for calls issued one after another with
  nothing queued.

The predicted time of a candidate is `launch + max(fill + makespan, memory floor)`; the plan is the candidate with
the least, predictions within TIE (1 %) of the least going to the earliest in `CANDIDATES` order; a candidate whose
constants no GPU has measured yet (`measured=False`) competes with its prediction times UNMEASURED_MARGIN, so it
replaces a measured kernel only where the model predicts a clear win. `Plan.alternatives` keeps every candidate's
prediction, so a benchmark can print the model beside the measurement and refit the constants.

The H100's constants (`tflops`, `item_fixed_tiles`, `mask_tiles`, `alone_speedup`, `launch_us` per kernel) are
`fit_golden()`: `refit` to the golden table attention_plan_h100.json, measured on an NVIDIA H100 80GB HBM3 (bf16,
kernellab.bench): the quick grid (`benchmarks/attention.py --grid --quick`, 2026-11-27, run twice: its 16 cheapest
shapes, then all 32: B*H 16 and 256, N 128 to 8192, d 64 and 128, causal and not) and the FlashAttention-3 shapes
(`benchmarks/attention.py`, 2026-11-23: N 1k to 16k, TFLOP/s turned into µs). On the 32 shapes the plan's kernel is
within 3 % of the fastest step measured (each step's mean over the golden runs), and on the FlashAttention-3 shapes
it is the fastest measured (tests/test_attention_plan.py replays them). What the fit says: the Hopper kernels pay 4-6
µs a call whatever the size, which the earlier per-item model had spread over the items as up to 8 tiles of fixed
cost; step 2 alone on an SM runs 1.3x its shared rate and masks its diagonal tiles at 0.75-1 tile's cost; at B*H =
256 and N = 128 every kernel is near the memory floor and step 2, launched soonest, wins. Beyond the measured shapes
the model extrapolates: steps 3 and 3b at N = 16k are predicted within 2 % of each other, closer than they are
measured at N = 4096 (3b 1.02-1.17x step 3).

Per GPU model. The constants are a GPU model's: `constants_for(device)` picks them by the driver's name of the device
(torch.cuda.get_device_name, which the entry point passes as `device`): the H200's (`H200_CANDIDATES`,
`fit_golden(H200_TABLE, H200_CANDIDATES)`: the same kernels, model and fit on attention_plan_h200.json, the quick
grid measured on an NVIDIA H200 on 2026-11-28, with the H200's copy ceiling in the fill and the memory floor) on an
H200, the H100's (`CANDIDATES`) on an H100 and on any other device, and the plan says which (`Plan.constants`, in
its `str`). On the H200's 32 shapes its plan is within 3 % of the fastest step measured; the H100's constants there
chose step 2 at B*H = 16, N = 128 unmasked, 1.08x the 64-row variant's time at d = 64 and 1.06x step 3's at 128.
"""
from __future__ import annotations

import heapq
import json
import math
import pathlib
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

H100_SMS = 132
DRAM_BYTES_PER_S = 3.0e12        # the H100's copy ceiling as kernellab measures it (docs/RESULTS.md, 3.00 TB/s)
H200_DRAM_BYTES_PER_S = 4.25e12  # the H200's (docs/RESULTS.md, device ceilings: 4,247 GB/s)
# The memory floor. kernellab.bench (as do_bench and a model's previous kernels) leaves the L2 full of dirty lines, so
# each byte a call moves first evicts a dirty byte, written back, until the L2's dirty lines are spent: the first
# L2_BYTES a call moves cost twice the traffic (on the H100 grid the shapes whose Q, K, V and O fill 17-34 MB, B*H =
# 256 and N = 128, took 13-22 µs: 1.5 TB/s, not 3.0), the rest moves at the copy ceiling (B*H = 256, N = 512,
# d = 128: 134 MB, causal, took 74.7 µs with step 3b; at 1.5 TB/s the floor alone would be 89.5).
L2_BYTES = 50 * 2 ** 20          # the H100's L2
EXACT_ITEMS_PER_SLOT = 8         # up to this many items a slot the greedy schedule is simulated item by item
UNMEASURED_MARGIN = 1.10         # a candidate no GPU has measured is chosen only if predicted 10 % faster
TIE = 0.01                       # predictions within 1 % are a tie, which goes to the earlier candidate


@dataclass(frozen=True)
class KernelModel:
    """One launchable kernel configuration and its fitted costs (see the module's docstring)."""
    family: str                  # the launcher: "fa2" (step 2), "fa3" (step 3), "fa3p" (step 3b and its variants)
    suffix: str                  # the entry name's tail: "", "_bm128", "_bm64"
    d: int                       # head dim
    block_m: int                 # query rows per work item
    block_n: int                 # keys per tile
    ctas_per_sm: int             # CTAs resident on one SM
    persistent: bool             # grid = min(slots, items), items drawn from a counter
    tflops: float                # steady rate on long items, whole GPU, TFLOP/s of computed (row, key) pairs
    item_fixed_tiles: float      # fixed cost per work item not hidden, in tile times
    host_us: float               # host time per call of the op with this kernel
    stages: int = 2              # K/V tiles in flight (shared-memory buffers)
    measured: bool = True        # False: predicted constants, no GPU measurement behind them yet
    launch_us: float = 0.0       # GPU time a call pays whatever its size: launch, CTA start-up, the last CTA's drain
    mask_tiles: float = 0.0      # with the causal mask, extra cost per item (tile times): masking its diagonal tiles
    alone_speedup: float = 1.0   # ctas_per_sm > 1: how much faster a CTA runs with its SM to itself (items <= SMs)
    dram_bytes_per_s: float = DRAM_BYTES_PER_S   # the copy ceiling of the GPU the constants were fitted on

    @property
    def name(self) -> str:
        """Short label: step and tile, e.g. 'fa3p_bm64'."""
        return self.family + self.suffix

    @property
    def threads(self) -> int:
        """Threads a CTA: 4 warps (step 2); a producer warpgroup and one consumer warpgroup per 64 rows (3, 3b)."""
        return 128 if self.family == "fa2" else 128 * (self.block_m // 64 + 1)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory a CTA, as 07's launchers compute it: step 2's Q tile and K/V double buffers; the
        Hopper kernels' 1 KB alignment slack, Q (two buffers when persistent), K/V stages and 256 B of barriers."""
        tile = 2 * self.d                                   # bytes a row of Q, K or V (16-bit elements)
        if self.family == "fa2":
            return (self.block_m + 2 * self.stages * self.block_n) * tile
        q_buffers = 2 if self.persistent else 1
        return 1024 + (q_buffers * self.block_m + 2 * self.stages * self.block_n) * tile + 256

    def entry(self, dtype: str, causal: bool) -> str:
        """The kernel's entry name in 07's cell, e.g. fa3p_bf16_d64_causal_bm64 (dtype 'bf16' or 'fp16')."""
        dt = "bf16" if dtype == "bf16" else "f16"
        return f"{self.family}_{dt}_d{self.d}{'_causal' if causal else ''}{self.suffix}"


# Host time per call (µs), reported (Estimate.host_bound): a one-kernel op with its output 11.3 µs, tutorial 07's step
# 3b as an op 18.6 µs (docs/RESULTS.md, launch overhead, registered ops, H100, 2026-11-27; SDPA 21.9 µs there).
_HOST_POINTERS_US, _HOST_MAPS_US = 11.3, 18.6

CANDIDATES: tuple[KernelModel, ...] = (
    # Constants: fit_golden(), the refit to attention_plan_h100.json (H100, bf16, kernellab.bench: the quick grid's two
    # runs of 2026-11-27 and the FlashAttention-3 shapes of 2026-11-23); each comment gives the fit's RMS relative
    # error over the compute-bound samples it used (tests/test_attention_plan.py refits and compares). Order breaks
    # ties (TIE).
    # Step 3b, persistent wgmma + TMA; the 128-row height first (ties at d = 64 causal go to it)
    KernelModel("fa3p", "_bm128", 64, 128, 128, 1, True, 451.5, 1.35, _HOST_MAPS_US, stages=3,
                launch_us=6.26, mask_tiles=0.00, alone_speedup=1.0),  # 4.9% over 25
    KernelModel("fa3p", "", 64, 192, 128, 1, True, 524.7, 1.15, _HOST_MAPS_US, stages=3,
                launch_us=6.17, mask_tiles=0.25, alone_speedup=1.0),  # 3.2% over 34
    KernelModel("fa3p", "", 128, 128, 128, 1, True, 665.1, 1.95, _HOST_MAPS_US,
                launch_us=5.55, mask_tiles=0.00, alone_speedup=1.0),  # 2.0% over 28
    # the short-sequence variant: one consumer warpgroup, 64-key tiles, two CTAs an SM
    KernelModel("fa3p", "_bm64", 64, 64, 64, 2, True, 383.2, 4.10, _HOST_MAPS_US, stages=3,
                launch_us=4.44, mask_tiles=0.00, alone_speedup=1.3),  # 4.0% over 18
    # step 3, one CTA per item
    KernelModel("fa3", "", 64, 192, 128, 1, False, 529.8, 1.85, _HOST_MAPS_US,
                launch_us=4.60, mask_tiles=0.50, alone_speedup=1.0),  # 5.6% over 27
    KernelModel("fa3", "", 128, 128, 128, 1, False, 663.3, 2.75, _HOST_MAPS_US,
                launch_us=3.94, mask_tiles=0.00, alone_speedup=1.0),  # 2.2% over 21
    # step 2, mma.sync, two CTAs an SM
    KernelModel("fa2", "", 64, 128, 64, 2, False, 367.0, 1.35, _HOST_POINTERS_US,
                launch_us=3.75, mask_tiles=1.00, alone_speedup=1.3),  # 4.9% over 18
    KernelModel("fa2", "", 128, 128, 64, 2, False, 423.6, 1.50, _HOST_POINTERS_US,
                launch_us=2.88, mask_tiles=0.75, alone_speedup=1.3),  # 4.8% over 11
)

# The same kernels, model and order on an H200: fit_golden(H200_TABLE, H200_CANDIDATES), the refit to
# attention_plan_h200.json (NVIDIA H200, bf16, kernellab.bench: the quick grid's 32 shapes, 2026-11-28; no
# FlashAttention-3 shapes), the fill and the memory floor at the H200's copy ceiling. (name, d): (tflops,
# item_fixed_tiles, mask_tiles, alone_speedup, launch_us), with the fit's RMS relative error over its samples.
_H200_FIT = {
    ("fa3p_bm128", 64): (450.9, 1.40, 0.25, 1.0, 6.62),  # 4.0% over 16
    ("fa3p", 64): (511.4, 1.05, 0.25, 1.0, 6.85),        # 3.1% over 16
    ("fa3p", 128): (681.1, 2.25, 0.00, 1.0, 6.21),       # 3.2% over 16
    ("fa3p_bm64", 64): (373.0, 3.00, 0.00, 1.3, 5.64),   # 3.3% over 11
    ("fa3", 64): (526.0, 2.70, 0.00, 1.0, 4.04),         # 2.6% over 14
    ("fa3", 128): (689.4, 3.50, 0.00, 1.0, 3.84),        # 5.2% over 15
    ("fa2", 64): (370.7, 1.75, 0.50, 1.3, 4.77),         # 4.6% over 9
    ("fa2", 128): (533.4, 5.00, 1.00, 1.3, 0.00),        # 0.4% over 4: its launch cost folded into the fixed cost
}
H200_CANDIDATES: tuple[KernelModel, ...] = tuple(
    replace(m, dram_bytes_per_s=H200_DRAM_BYTES_PER_S, **dict(zip(
        ("tflops", "item_fixed_tiles", "mask_tiles", "alone_speedup", "launch_us"), _H200_FIT[m.name, m.d])))
    for m in CANDIDATES)


@dataclass(frozen=True)
class Estimate:
    """One candidate's predicted cost for one call."""
    kernel: str                  # KernelModel.name
    items: int                   # work items (query blocks x heads)
    ctas: int                    # CTAs launched
    waves: float                 # items per slot
    tiles_per_item: float        # mean key tiles per item
    gpu_us: float                # the schedule's makespan
    memory_us: float             # the memory floor
    host_us: float               # the host's time per call (reported; the plan does not choose on it)
    predicted_us: float          # max(gpu_us, memory_us)

    @property
    def host_bound(self) -> bool:
        """True where calls issued one after another with nothing queued would wait on the host, not the GPU."""
        return self.host_us > self.predicted_us

    def __str__(self) -> str:
        return (f"{self.kernel:10s} {self.predicted_us:9.1f} µs (GPU {self.gpu_us:.1f}, memory {self.memory_us:.1f}, "
                f"host {self.host_us:.1f}); {self.items} items on {self.ctas} CTAs, {self.waves:.2f} waves, "
                f"{self.tiles_per_item:.1f} tiles an item")


@dataclass(frozen=True)
class Plan:
    """What the entry point launches for one call, and why."""
    family: str                  # "fa2", "fa3" or "fa3p"
    entry: str                   # the kernel's name in 07's cell, e.g. "fa3p_bf16_d64_causal_bm64"
    block_m: int                 # query rows per work item (per CTA for the non-persistent kernels)
    block_n: int                 # keys per tile
    persistent: bool
    ctas: int                    # CTAs launched: the grid's size (persistent), or query blocks x heads
    ctas_per_sm: int
    threads: int                 # threads a CTA
    shared_bytes: int            # dynamic shared memory a CTA
    stages: int                  # K/V tiles in flight
    estimate: Estimate           # the chosen candidate's prediction
    alternatives: tuple[Estimate, ...] = field(default=(), compare=False)   # every candidate, best first
    constants: str = field(default="", compare=False)   # whose constants chose, and why those (GpuConstants.note)

    @property
    def kernel(self) -> str:
        """Short label of the chosen kernel, e.g. 'fa3p_bm64'."""
        return self.estimate.kernel

    def __str__(self) -> str:
        why = self.estimate
        return (f"{self.entry}: {self.block_m} x {self.block_n} tiles, {self.ctas} CTAs"
                f"{' (persistent)' if self.persistent else ''}, {why.waves:.2f} waves; predicted "
                f"{why.predicted_us:.1f} µs" + (f" with the {self.constants}" if self.constants else ""))


def item_tiles(N: int, block_m: int, block_n: int, causal: bool) -> list[int]:
    """Key tiles of each of one head's work items, in the kernels' order (heaviest first with the causal mask)."""
    all_tiles = math.ceil(N / block_n)
    blocks = math.ceil(N / block_m)
    if not causal:
        return [all_tiles] * blocks
    return [min(all_tiles, math.ceil((j + 1) * block_m / block_n)) for j in reversed(range(blocks))]


def makespan_us(item_us: list[float], heads: int, slots: int, persistent: bool) -> tuple[float, int]:
    """(time until the last slot finishes, CTAs launched) for `heads` copies of one head's items on `slots` slots.

    Items are handed out greedily, each to the slot free first. One CTA per item: in launch order (a head's items,
    then the next head's). Persistent: min(slots, items) CTAs, the heaviest items of every head first (the counter's
    order). Equal items take whole waves; beyond EXACT_ITEMS_PER_SLOT unequal items a slot, the mean load plus one
item (see the module's docstring)."""
    items = len(item_us) * heads
    ctas = min(slots, items) if persistent else items
    busy = min(slots, items)
    total = sum(item_us) * heads
    if min(item_us) == max(item_us):                 # equal items: whole waves
        return math.ceil(items / busy) * item_us[0], ctas
    if items > EXACT_ITEMS_PER_SLOT * busy:
        return total / busy + (min(item_us) if persistent else max(item_us) / 2), ctas
    if persistent:   # level by level: every head's heaviest item, then every head's next
        order = [t for t in item_us for _ in range(heads)]
    else:
        order = item_us * heads
    free = [0.0] * busy
    for t in order:
        heapq.heapreplace(free, free[0] + t)
    return max(free), ctas


def fill_us(model: KernelModel, B: int, H: int, N: int, elem_bytes: int = 2, sms: int = H100_SMS) -> float:
    """The first wave's pipeline fill: every resident item loads its Q block and first K/V tile from DRAM at once
    before its first product, at the model's copy ceiling (later items' loads hide under products)."""
    first_wave = min(math.ceil(N / model.block_m) * B * H, sms * model.ctas_per_sm)
    loaded = first_wave * (model.block_m + 2 * min(model.block_n, N)) * model.d * elem_bytes
    return loaded / model.dram_bytes_per_s * 1e6


def memory_us(B: int, H: int, N: int, d: int, elem_bytes: int = 2,
              dram_bytes_per_s: float = DRAM_BYTES_PER_S) -> float:
    """The memory floor: Q, K, V read once and O written once, each of the first L2_BYTES evicting a dirty line the
    call meets in the L2 (written back: twice the traffic), the rest at the copy ceiling (default the H100's)."""
    moved = 4 * B * H * N * d * elem_bytes
    return (moved + min(moved, L2_BYTES)) / dram_bytes_per_s * 1e6


def estimate(model: KernelModel, B: int, H: int, N: int, causal: bool, elem_bytes: int = 2,
             sms: int = H100_SMS) -> Estimate:
    """One candidate's prediction for a call on [B, H, N, d] inputs."""
    slots = sms * model.ctas_per_sm
    tiles = item_tiles(N, model.block_m, model.block_n, causal)
    tile_us = 4 * model.block_m * model.block_n * model.d * slots / (model.tflops * 1e12) * 1e6
    if len(tiles) * B * H <= sms:                    # every item has an SM to itself
        tile_us /= model.alone_speedup
    extra = model.item_fixed_tiles + (model.mask_tiles if causal else 0.0)
    per_item = [(t + extra) * tile_us for t in tiles]
    heads = B * H
    makespan, ctas = makespan_us(per_item, heads, slots, model.persistent)
    gpu = model.launch_us + fill_us(model, B, H, N, elem_bytes, sms) + makespan
    memory = memory_us(B, H, N, model.d, elem_bytes, model.dram_bytes_per_s)
    items = len(tiles) * heads
    return Estimate(model.name, items, ctas, items / slots, sum(tiles) / len(tiles), gpu, memory, model.host_us,
                    model.launch_us + max(gpu - model.launch_us, memory))


@lru_cache(maxsize=4096)
def plan_attention(B: int, H: int, N: int, d: int, causal: bool, dtype: str = "bf16", sms: int = H100_SMS,
                   candidates: tuple[KernelModel, ...] | None = None, kernel: str | None = None,
                   device: str | None = None) -> Plan:
    """The kernel and tiles for softmax(q k^T / sqrt(d)) v on [B, H, N, d] inputs: the candidate with the least
    predicted time (module docstring). dtype: 'bf16' or 'fp16' (both run the same kernels); sms: the GPU's SM count;
    kernel: a candidate's name ('fa2', 'fa3', 'fa3p', 'fa3p_bm128', 'fa3p_bm64') to plan that one alone (how tests
    and benchmarks time each step through the entry point's own launch path); device: the GPU's name as the driver
    gives it (torch.cuda.get_device_name), which picks the constants (constants_for: its GPU model's table, the
    H100's for any other device and for None); candidates: these instead. The plan names them (`Plan.constants`)."""
    if candidates is None:
        table = constants_for(device)
        candidates, constants = table.candidates, table.note
    else:
        constants = "candidates given by the caller"
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype is 'bf16' or 'fp16', got {dtype!r}")
    if min(B, H, N) < 1 or sms < 1:
        raise ValueError(f"B, H, N and sms are positive; got B={B}, H={H}, N={N}, sms={sms}")
    usable = [m for m in candidates if m.d == d and (kernel is None or m.name == kernel)]
    if not usable:
        have = sorted({m.name for m in candidates if m.d == d})
        raise ValueError(f"no attention kernel {kernel!r} for head dim {d}: there are {have}" if have and kernel else
                         f"no attention kernel for head dim {d}: tutorial 07's take d = "
                         f"{sorted({m.d for m in candidates})}")
    scored = [(estimate(m, B, H, N, causal, 2, sms), i, m) for i, m in enumerate(usable)]
    scored.sort(key=lambda s: (s[0].predicted_us * (1.0 if s[2].measured else UNMEASURED_MARGIN), s[1]))
    least = scored[0][0].predicted_us * (1.0 if scored[0][2].measured else UNMEASURED_MARGIN)
    # within TIE of the least, the earliest in CANDIDATES order (the model cannot tell them apart)
    best, _, model = min((s for s in scored if s[0].predicted_us * (1.0 if s[2].measured else UNMEASURED_MARGIN)
                          <= least * (1 + TIE)), key=lambda s: s[1])
    return Plan(model.family, model.entry(dtype, causal), model.block_m, model.block_n, model.persistent, best.ctas,
                model.ctas_per_sm, model.threads, model.shared_bytes, model.stages, best, tuple(s[0] for s in scored),
                constants)


def model_for(plan: Plan, d: int, candidates: tuple[KernelModel, ...] = CANDIDATES) -> KernelModel:
    """The KernelModel a plan for head dim `d` chose."""
    return next(m for m in candidates if m.d == d and m.name == plan.kernel)


def refit(model: KernelModel, samples: list[tuple[int, int, int, bool, float]], sms: int = H100_SMS,
          fixed_tiles: tuple[float, ...] = tuple(i / 20 for i in range(161)),
          mask_tiles: tuple[float, ...] = tuple(i / 4 for i in range(9)),
          alone_speedups: tuple[float, ...] = (1.0, 1.1, 1.2, 1.3),
          launch_us: float | None = None, weights: list[float] | None = None) -> tuple[KernelModel, float]:
    """(the model with `tflops`, `item_fixed_tiles`, `mask_tiles` and `launch_us` fitted to measurements, the fit's
    RMS relative error).

    samples: (B, H, N, causal, measured GPU µs) of this kernel at its head dim, timed with the host hidden
    (kernellab.bench), where the GPU, not the memory floor, is the limit (`compute_bound`). For each fixed cost on the
    `fixed_tiles` grid (and mask cost on `mask_tiles`, where causal samples are given) the GPU time is
    `launch_us + fill + x / tflops`, x the makespan at tflops = 1 and the fill fixed by the shape (fill_us): a straight
    line in x, fitted by least squares on the relative error (launch_us held at least 0, or at the value given); the
    grid point kept is the one with the least error. weights: one a sample (default 1 each), e.g. to let a few long
    shapes count as much as many short ones; the RMS error returned is unweighted."""
    if not samples:
        raise ValueError(f"no measurements to refit {model.name} (d = {model.d}) with")
    ws = list(weights) if weights is not None else [1.0] * len(samples)
    if len(ws) != len(samples) or min(ws) <= 0:
        raise ValueError(f"weights: one positive number a sample ({len(samples)}), got {len(ws)}")
    fills = [fill_us(model, B, H, N, 2, sms) for B, H, N, _, _ in samples]
    ys = [us - c for (*_, us), c in zip(samples, fills)]
    scale = [us / math.sqrt(w) for (*_, us), w in zip(samples, ws)]
    masks = mask_tiles if any(s[3] for s in samples) else (0.0,)
    alones = alone_speedups if model.ctas_per_sm > 1 else (1.0,)
    best = None
    for f, m, alone in ((f, m, g) for f in fixed_tiles for m in masks for g in alones):
        if True:
            unit = replace(model, tflops=1.0, item_fixed_tiles=f, mask_tiles=m, alone_speedup=alone, launch_us=0.0)
            xs = [estimate(unit, B, H, N, causal, 2, sms).gpu_us - c for (B, H, N, causal, _), c in zip(samples, fills)]
            a, b = _line(xs, ys, scale, launch_us)
            errs = [((a + b * x + c) / (y + c) - 1) ** 2 for x, y, c in zip(xs, ys, fills)]
            loss = sum(w * e for w, e in zip(ws, errs))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, f, m, alone, a, b, sum(errs) / len(errs))
    _, f, m, alone, a, b, err = best
    return (replace(model, tflops=1.0 / b, item_fixed_tiles=f, mask_tiles=m, alone_speedup=alone, launch_us=a,
                    measured=True), math.sqrt(err))


def compute_bound(model: KernelModel, samples: list[tuple[int, int, int, bool, float]], share: float = 0.8) -> list:
    """The samples whose memory floor is below `share` of the measured time: those say what the GPU's work costs."""
    return [s for s in samples if memory_us(s[0], s[1], s[2], model.d, 2, model.dram_bytes_per_s) < share * s[4]]


def _line(xs: list[float], ys: list[float], scale: list[float], a_fixed: float | None) -> tuple[float, float]:
    """(a, b) of y = a + b x with the least sum of ((a + b x - y) / scale)^2, a >= 0 (or a = a_fixed), b > 0."""
    w = [1.0 / (t * t) for t in scale]
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    if a_fixed is None:
        s1 = sum(w)
        sx = sum(wi * x for wi, x in zip(w, xs))
        sy = sum(wi * y for wi, y in zip(w, ys))
        det = s1 * sxx - sx * sx
        if det > 0:
            a = (sy * sxx - sx * sxy) / det
            b = (s1 * sxy - sx * sy) / det
            if a >= 0 and b > 0:
                return a, b
        a_fixed = 0.0
    sx = sum(wi * x for wi, x in zip(w, xs))
    return a_fixed, max((sxy - a_fixed * sx) / sxx, 1e-12)


H100_TABLE = pathlib.Path(__file__).with_name("attention_plan_h100.json")   # the measurements the constants fit
H200_TABLE = pathlib.Path(__file__).with_name("attention_plan_h200.json")   # those H200_CANDIDATES fit


@dataclass(frozen=True)
class GpuConstants:
    """The constants a call is planned with: one GPU model's candidates, fitted to its golden table, and why these."""
    gpu: str                                 # the GPU model the golden table was measured on: "H100", "H200"
    golden: pathlib.Path                     # the golden table (fit_golden(golden, candidates) makes the candidates)
    candidates: tuple[KernelModel, ...]
    note: str                                # what the plan says of them (Plan.constants)


# GPU model -> (golden table, candidates). A device takes the table of the model its driver name names as a word
# ("NVIDIA H200" the H200's; "NVIDIA GH200 480GB" none); any other device the H100's.
GPU_CONSTANTS: dict[str, tuple[pathlib.Path, tuple[KernelModel, ...]]] = {
    "H100": (H100_TABLE, CANDIDATES), "H200": (H200_TABLE, H200_CANDIDATES)}


@lru_cache(maxsize=64)
def constants_for(device: str | None) -> GpuConstants:
    """The constants for a device, by its name as the driver gives it (torch.cuda.get_device_name): its GPU model's
    table where GPU_CONSTANTS has one, else the H100's (the kernels are sm_90's; another sm_90 device is taken for an
    H100), the note saying which and why."""
    for gpu, (golden, candidates) in GPU_CONSTANTS.items():
        if device and re.search(rf"\b{gpu}\b", device):
            return GpuConstants(gpu, golden, candidates, f"{gpu} constants ({golden.name})")
    why = f"no table for {device!r}: the H100's, as for every other sm_90 device" if device else "no device named"
    return GpuConstants("H100", H100_TABLE, CANDIDATES, f"H100 constants ({H100_TABLE.name}; {why})")


def measured_samples(path: pathlib.Path = H100_TABLE, table: str | None = None
                     ) -> dict[tuple[str, int], list[tuple[int, int, int, bool, float]]]:
    """{(kernel name, head dim): [(B, H, N, causal, kernellab.bench µs)]} from a golden table of measurements
    (attention_plan_h100.json: "grid" and "quick_grid", the grid's shapes timed step by step, the first 16 and then
    all 32 of them; "fa3_shapes", the FlashAttention-3 shapes' TFLOP/s turned into µs; table: one of the three or
    "grids" for the first two, default all; a table the file lacks gives none: attention_plan_h200.json has the quick
    grid only). A grid's entry point's own time is not a sample: its step is timed too."""
    data = json.loads(pathlib.Path(path).read_text())
    out: dict[tuple[str, int], list] = {}
    for grid in ("grid", "quick_grid"):
        if table not in (None, "grids", grid) or grid not in data:
            continue
        for r in data[grid]["rows"]:
            for name, us in r["us"]["kernellab.bench"].items():
                if name not in ("entry", "FLASH", "CUDNN"):
                    out.setdefault((name, r["d"]), []).append((r["B"], r["H"], r["N"], r["causal"], us))
    if table in (None, "fa3_shapes"):
        for r in data.get("fa3_shapes", {"rows": []})["rows"]:
            flops = 4 * r["B"] * r["H"] * r["N"] ** 2 * r["d"] / (2 if r["causal"] else 1)
            out.setdefault((r["kernel"], r["d"]), []).append((r["B"], r["H"], r["N"], r["causal"],
                                                              flops / (r["tflops"] * 1e12) * 1e6))
    return out


def fit_golden(path: pathlib.Path = H100_TABLE, candidates: tuple[KernelModel, ...] = CANDIDATES
               ) -> dict[tuple[str, int], tuple[KernelModel, float, int]]:
    """{(kernel name, head dim): (the candidate refit to the golden table, RMS relative error, samples used)}: how
    CANDIDATES' constants are made (and H200_CANDIDATES', from H200_TABLE). Per kernel the compute-bound samples of
    both tables, the FlashAttention-3 shapes weighted to count as much in total as the grid's (a few long shapes set
    the steady rate, many short ones the fixed costs)."""
    grid, long = measured_samples(path, "grids"), measured_samples(path, "fa3_shapes")
    out = {}
    for m in candidates:
        short_s = compute_bound(m, grid.get((m.name, m.d), []))
        long_s = compute_bound(m, long.get((m.name, m.d), []))
        weights = [1.0] * len(short_s) + [len(short_s) / len(long_s) if short_s and long_s else 1.0] * len(long_s)
        fitted, rms = refit(m, short_s + long_s, weights=weights)
        out[m.name, m.d] = (fitted, rms, len(weights))
    return out
