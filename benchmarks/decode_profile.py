"""Why tutorial 09's one-launch decode is slow on small caches: a latency model of one call, Nsight Compute on the
kernel, and the op's time split by how the L2 is left before it (issue 32).

    python3 benchmarks/attention_inference.py --part decode --profile     (runner suite: profile-decode)

What it measures, Hq = 32 over Hkv = 8, d = 128, bf16, one query token, full caches, at B = 1 with caches of 1k, 8k,
32k and 128k and at B = 32 with 8k (PROFILE_CASES):
- Nsight Compute (kernellab's ncu wrapper, Kernel.profile: one launch in a new process, normal clocks, ncu's own L2
  flush and invalidate before the launch, so a clean L2) on up to five launches a case (all five at B = 1 with 1k and
  8k, where each question is open; the fused kernel and the split kernel at 128k; the fused kernel at B = 32, where
  one block a head merges nothing; the split-floor variant only where it shortens a warp's chain of tiles): the fused
  kernel as planned at min_keys 64 ("fused": FIT_MIN_KEYS, the floor the model was fitted on; where the op's own
  floor, decode_floor, plans otherwise, its launch beside as DEFAULT_FLOOR, H14); the same launch with every
  cache_seqlens = 0 ("fused, no keys": the grid, the in-block merge, the ticket and the last block's merge, no cache
  read: the fixed part); the two-kernel step's split kernel alone ("split only":
  the fused time minus this is the merge's serial tail); the fused kernel with the split floor VARIANT_MIN_KEYS
  ("fused, min_keys=16": more, shorter splits), and the fused kernel whose last block keeps 16 partial loads in flight
  (MERGE: decode_fused_bf16_d128_m16_l16, the tutorial's variant; the default keeps 8); and the variants VARIANTS,
  each against its prediction written here before a GPU ran it: the online merge (merge="online", also with no keys),
  the early first tile (early=True) and both. Counters: duration, DRAM
  throughput (% of peak), DRAM bytes read and written (read against the cache's bytes), achieved occupancy, SMs
  active, waves, L2 hit rate, warp stall reasons.
- kernellab.bench of the op (torch.ops.kl.decode_attention, as called; where its floor is not min_keys 64, the
  launcher at min_keys 64, and the op beside as "floor bench clean") with the L2 left three ways before each call:
  written ("write", the default of kernellab.bench and do_bench: dirty lines that the call evicts), read ("clean") and
  not flushed (inputs rotated: still from DRAM), plus CUDA-graph replay (per call, the launch gaps gone; a call
  captured on the graph's own stream makes and zeroes its ticket counters in the graph, so each holds a small memset
  node too: an upper bound of the graph's per-call time), the op with empty caches (the fixed part as kernellab.bench
  sees it), and both variants.
Beside every figure, decode_model's prediction. The last lines: one table, then one line per hypothesis with what the
numbers say about it (profile_reading).
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

PROFILE_CASES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (32, 8192))     # (B, cache length)
VARIANT_MIN_KEYS = 16           # the lowest split floor, against FIT_MIN_KEYS
# The split floor of every launch profiled here and of the golden figures the model was fitted to (the plan's
# default before tutorial 09's decode_floor, which now gives 64 from 2k at B = 1 and at every case here but 1k):
# launches and timings stay on it so that the variants' predictions compare like with like. Where the op's own
# floor differs, its plan is profiled and timed beside (DEFAULT_FLOOR).
FIT_MIN_KEYS = 64
DEFAULT_FLOOR = "fused, the plan's floor"
# The split floor's choice (tutorial 09's decode_floor), from the model: its time at each floor for these cases
FLOOR_CHOICES = (16, 32, 64)
FLOOR_CASES = tuple((B, L) for B in (1, 4, 8) for L in (512, 1024, 2048, 4096, 8192))
FLOOR_WARPS = 256               # tutorial 09's DEC_FLOOR_WARPS: a short cache's keys over about this many warps
MERGE_LOADS = 16                # the variant decode_attention(merge_loads=16): 16 partial loads in flight, not 8
MERGE = f"fused, merge loads {MERGE_LOADS}"
ONLINE = "fused, online merge"  # the variant decode_attention(merge="online"): the last block's merge in one pass
# The online merge's prediction, written before any GPU ran it: ncu µs of the kernel at B = 1 (from the measured
# default, less the model's saved round trips: 8 -> 3 at 1k, 8 -> 4 at 8k, 11 -> 5 at 32k and 128k; B = 32 has no
# merge). The l16 variant's figures (3 trips saved: 0.7 µs at 1k, none at 8k) say the saving may be half this.
ONLINE_PREDICTED_US = {(1, 1024): 10.7, (1, 8192): 20.4, (1, 32768): 52.1, (1, 131072): 183.8, (32, 8192): 357.0}
# The variant decode_attention(early=True): each warp asks for its first tile before cache_seqlens arrives (a guess
# that the cache is full, right in every case here). Prediction, written before any GPU ran it: one DRAM round trip
# (the model's first_load_us, 1.0 µs) off the kernel at every case, from the measured default (32k: the model's);
# and with the online merge both savings. The guess's copies are unused where a cache is empty, so no "no keys" run.
EARLY = "fused, early first tile"
BOTH = "fused, online merge + early"
EARLY_PREDICTED_US = {(1, 1024): 11.7, (1, 8192): 21.0, (1, 32768): 53.5, (1, 131072): 185.2, (32, 8192): 356.0}
BOTH_PREDICTED_US = {(1, 1024): 9.7, (1, 8192): 19.4, (1, 32768): 51.1, (1, 131072): 182.8, (32, 8192): 356.0}
# The split floor with both: at 1k (the only case where min_keys 16 changes the chain) one tile a warp and 16 block
# partials a head: predicted from the measured min_keys=16 launch (10.5 µs) less the model's savings (6 -> 3 merge
# trips, one DRAM trip): 8.3 µs.
FLOOR_BOTH = f"fused, min_keys={VARIANT_MIN_KEYS}, online merge + early"
FLOOR_BOTH_PREDICTED_US = {(1, 1024): 8.3}
VARIANTS = {   # name -> (kernel suffix, decode_attention's keywords, predicted ncu µs, bench key)
    ONLINE: ("_online", {"merge": "online"}, ONLINE_PREDICTED_US, "online bench clean"),
    EARLY: ("_early", {"early": True}, EARLY_PREDICTED_US, "early bench clean"),
    BOTH: ("_online_early", {"merge": "online", "early": True}, BOTH_PREDICTED_US, "online+early bench clean"),
    FLOOR_BOTH: ("_online_early", {"merge": "online", "early": True, "min_keys": VARIANT_MIN_KEYS},
                 FLOOR_BOTH_PREDICTED_US, "min_keys=16+online+early bench clean"),
}
HQ, HKV, D, NQ = 32, 8, 128, 1
DEC_WARPS = 4                   # tutorial 09's DEC_NWARPS: a block's warps, one split each
TARGET_OF_COPY = 0.80           # issue 32: caches of 8k and more
BUDGET_S = 230.0                # from the script's start (compile included): no new ncu launch after it, no new case
CASE_RESERVE_S = 25.0           # after BUDGET_S - this, no new case starts (the suite's limit is 300 s)
STALLS = ("long_scoreboard", "barrier", "membar", "short_scoreboard", "wait", "lg_throttle", "mio_throttle",
          "math_pipe_throttle", "no_instruction", "dispatch_stall", "drain", "branch_resolving", "sleeping",
          "not_selected", "selected")
NCU_METRICS = (
    ("gpu__time_duration.sum", "duration"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput"),
    ("dram__bytes_read.sum", "DRAM bytes read"),
    ("dram__bytes_write.sum", "DRAM bytes written"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy"),
    ("sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "SMs active"),
    ("launch__grid_size", "CTAs"),
    ("launch__waves_per_multiprocessor", "waves"),
    ("lts__t_sector_hit_rate.pct", "L2 hit rate"),
    ("lts__t_sector_op_read_hit_rate.pct", "L2 read hit rate"),
) + tuple((f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio", f"stall: {r}") for r in STALLS)


@dataclass(frozen=True)
class Machine:
    """The constants of decode_model: an H100 SXM as measured (docs/RESULTS.md) or as commonly quoted."""
    sms: int = 132
    read_tbps: float = 3.1          # a pure read stream: 1 GB (B = 32, 8k) in 365.5 µs less the flush's write-back
    dram_latency_us: float = 1.0    # a load's round trip to HBM under load
    # a round trip to L2 from an SM (fence, atomic, a dependent load): fitted to the merge tails measured on an H100
    # (fused - split only: 3.4 µs at 1k, 3.1 at 8k), each 8 round trips in the merge as compiled (merge_trips)
    l2_latency_us: float = 0.4
    launch_us: float = 2.5          # what a call adds to the kernel's own duration: launch API and the event pair
    # The fixed part of the kernel as Nsight Compute times it (its launch with every cache_seqlens 0: 7.5 µs at 1k,
    # 9.0 at 8k on an H100), beside block_merge_us and the merge tail: the grid's start and end with cold
    # instruction and constant caches (kernel_floor_us), the dispatch of its 80 KB blocks (ramp_us_per_wave, per wave
    # of blocks), and cache_seqlens read from DRAM before any tile's address is known (one dram_latency_us).
    # kernel_floor_us and ramp_us_per_wave are fitted to those two figures, the rest is the model's own.
    kernel_floor_us: float = 2.6
    ramp_us_per_wave: float = 1.3
    block_merge_us: float = 0.5     # a block's warps merged in shared memory, its partial written
    sm_l2_gbps: float = 150.0       # what one SM reads from L2 (the last block's merge runs on one SM)
    merge_unroll: int = 8           # o_part loads a thread keeps in flight in the last block's merge
    merge: str = "shared"           # the last block's merge: "shared" (weights in shared memory) or "online" (one pass)
    early: bool = False             # the first tile asked for before cache_seqlens arrives (a full cache guessed)
    l2_bytes: int = 50 * 2**20
    # The share of a "write" flush's dirty lines that the call's reads write back at full bandwidth: 1.0 is the upper
    # bound (what fits the 8k, 128k and B = 32 figures with read_tbps 3.1). kernellab.bench's own note saw a 16 MB copy
    # only 1.9 µs slower under the write flush, far under that bound; profile-decode's "bench write - clean"
    # measures it.
    dirty_share: float = 1.0


H100 = Machine()


@dataclass(frozen=True)
class DecodeModel:
    """One call of the fused decode at one shape: the launch's geometry and the predicted µs of each part."""
    label: str
    cache_bytes: int
    blocks: int
    slots: int                      # blocks one wave holds (blocks_per_sm x SMs)
    waves: float
    splits: int                     # warps (splits) per (sequence, KV head, row group)
    parts: int                      # block partials the last block merges (splits / DEC_WARPS)
    keys_per_warp: int
    tiles_per_warp: int             # tiles a warp loads one after the other (one in flight at a time)
    in_flight_bytes: int            # one stage a resident warp, across the GPU
    little_bytes: int               # what Little's law asks: read bandwidth x DRAM latency
    launch_us: float
    floor_us: float                 # the grid's start and end, cold caches (Machine.kernel_floor_us)
    ramp_us: float                  # block dispatch, per wave of blocks
    first_load_us: float            # cache_seqlens from DRAM before any tile is asked for
    chain_us: float                 # tiles in series x DRAM latency (the loads' floor when few bytes are in flight)
    stream_us: float                # cache bytes / read bandwidth + one latency (the floor when enough are)
    loads_us: float                 # max(chain, stream)
    block_merge_us: float
    merge_tail_us: float            # fence, ticket, the last block's L2 round trips: serial after the last split
    dirty_us: float                 # the write-back of dirty L2 lines a kernellab.bench "write" flush leaves
    fixed_us: float                 # floor + ramp + first load + block merge + merge tail: the launch with no keys (ncu)
    ncu_us: float                   # fixed + loads: the kernel's duration under Nsight Compute (clean L2, no launch)
    clean_us: float                 # launch + ncu (kernellab.bench with a clean L2)
    bench_us: float                 # clean + dirty: kernellab.bench's default flush
    blame: str                      # the largest part of bench_us beyond the cache's own stream (the overhead)
    B: int = 0
    L: int = 0                      # cache positions (every sequence full)

    def parts_us(self) -> dict:
        return {"launch": self.launch_us, "kernel floor": self.floor_us, "block dispatch ramp": self.ramp_us,
                "first load (cache_seqlens)": self.first_load_us, "loads: stream": self.stream_us,
                "loads: chain beyond stream": max(0.0, self.chain_us - self.stream_us),
                "block merge": self.block_merge_us, "merge tail": self.merge_tail_us,
                "dirty L2 write-back (bench flush)": self.dirty_us}


def merge_trips(parts, unroll=8, merge="shared"):
    """The last block's serial round trips to L2: the fence and the ticket, then for the "shared" merge
    (merge_block_partials) lse read twice (the max, then the weights: a lane a partial, ceil(P / 32) each) and the
    o_part loads: `#pragma unroll 8` over a run-time P compiles to batches of 8 and a rolled remainder loop that waits
    on each load in turn (P // 8 + P % 8 trips; 4 at P = 4 and at P = 32, so both measured tails are 8 trips); with 16
    (the l16 variant, every load issued unconditionally) ceil(P / 16). The "online" merge reads lse beside o, 16 at a
    time, in one pass: ceil(P / 16)."""
    if merge == "online":
        return 2 + -(-parts // 16)
    o_trips = parts // 8 + parts % 8 if unroll == 8 else -(-parts // unroll)
    return 2 + 2 * -(-parts // 32) + o_trips


def decode_model(B, L, plan, machine: Machine = H100, Hq=HQ, Hkv=HKV, d=D, nq=NQ, elem_bytes=2) -> DecodeModel:
    """The latency model of one fused decode call (see benchmarks/NOTES-attention-inference.md). `plan`: tutorial 09's
    DecodePlan for the shape (splits, blocks_per_sm, block_n, row_groups, rows_per_warp)."""
    m = machine
    G = Hq // Hkv
    cache_bytes = 2 * B * Hkv * L * d * elem_bytes
    parts = plan.splits // DEC_WARPS
    blocks = parts * B * Hkv * plan.row_groups
    slots = m.sms * plan.blocks_per_sm
    tiles = -(-L // plan.block_n)
    tiles_per_warp = -(-tiles // plan.splits)
    stage_bytes = 2 * plan.block_n * d * elem_bytes                      # K and V of one tile
    in_flight = min(blocks, slots) * DEC_WARPS * stage_bytes
    bw = m.read_tbps * 1e12
    little = int(bw * m.dram_latency_us * 1e-6)
    chain = math.ceil(blocks / slots) * tiles_per_warp * m.dram_latency_us
    stream = cache_bytes / bw * 1e6 + m.dram_latency_us
    loads = max(chain, stream)
    if parts > 1:
        # serial L2 round trips of the last block (merge_trips), plus the partials' bytes through one SM
        rows = min(plan.rows_per_warp, G * nq)
        trips = merge_trips(parts, m.merge_unroll, m.merge)
        tail = trips * m.l2_latency_us + rows * parts * d * 4 / (m.sm_l2_gbps * 1e9) * 1e6
    else:                           # a triple with one block writes the output itself
        tail = 0.0
    dirty = m.dirty_share * min(cache_bytes, m.l2_bytes) / bw * 1e6
    ramp = m.ramp_us_per_wave * min(1.0, blocks / slots)          # later waves dispatch while the first runs
    first = 0.0 if m.early else m.dram_latency_us                  # early: overlapped with the first tile's trip
    fixed = m.kernel_floor_us + ramp + first + m.block_merge_us + tail
    ncu = fixed + loads
    clean = m.launch_us + ncu
    model = DecodeModel(f"B={B} cache={L}", cache_bytes, blocks, slots, blocks / slots, plan.splits, parts,
                        tiles_per_warp * plan.block_n, tiles_per_warp, in_flight, little, m.launch_us,
                        m.kernel_floor_us, ramp, first, chain, stream, loads, m.block_merge_us, tail,
                        dirty, fixed, ncu, clean, clean + dirty, "", B, L)
    got = {k: v for k, v in model.parts_us().items() if k != "loads: stream"}
    return DecodeModel(**{**asdict(model), "blame": max(got, key=got.get)})


def profile_plan(B, L, min_keys=None, sms=132):
    """Tutorial 09's decode_plan at the profile's shape (Hq 32 / Hkv 8, d = 128, one token: 16 rows a warp, one row
    group), its arithmetic; min_keys None: the plan's default floor (floor_rule). The CPU tests check it against the
    notebook's plan."""
    if min_keys is None:
        min_keys = floor_rule(B, L)
    shared = DEC_WARPS * (16 + 4 * 16) * D * 2
    per_sm = min(3, 228 * 1024 // (shared + 1024))
    wave = sms * per_sm * DEC_WARPS // (B * HKV)
    splits = max(DEC_WARPS, max(1, min(wave, -(-L // min_keys))) // DEC_WARPS * DEC_WARPS)
    return SimpleNamespace(rows_per_warp=16, row_groups=1, block_n=16, splits=splits, shared_bytes=shared,
                           blocks_per_sm=per_sm)


def floor_rule(B, L, Hkv=HKV, groups=1, lo=16, hi=64):
    """Tutorial 09's decode_floor: every key of the B Hkv groups caches over about FLOOR_WARPS warps, the floor kept
    within [lo, hi] (16: one tile a warp; 64: the floor where the wave is full anyway)."""
    return min(hi, max(lo, B * Hkv * groups * L // FLOOR_WARPS))


def floor_table(cases=FLOOR_CASES, choices=FLOOR_CHOICES, machine: Machine = H100) -> list:
    """The model's kernel µs (ncu, no launch) at each split floor, per case: [{B, L, us: {floor: µs}, best, rule,
    rule_us}] (best: the fastest floor; rule: floor_rule's)."""
    rows = []
    for B, L in cases:
        us = {mk: decode_model(B, L, profile_plan(B, L, mk), machine).ncu_us for mk in choices}
        rule = floor_rule(B, L)
        rows.append({"B": B, "L": L, "us": us, "best": min(us, key=lambda mk: (round(us[mk], 2), -mk)), "rule": rule,
                     "rule_us": decode_model(B, L, profile_plan(B, L, rule), machine).ncu_us})
    return rows


def floor_table_text(rows) -> str:
    """floor_table as markdown: a row per case, the model's µs at each floor, the best and the rule's pick."""
    choices = list(rows[0]["us"]) if rows else []
    out = ["| B | cache | " + " | ".join(f"min_keys {mk} µs" for mk in choices) + " | fastest | rule (µs) | "
           "rule vs 64 |", "|---" * (len(choices) + 5) + "|"]
    for r in rows:
        out.append(f"| {r['B']} | {r['L']} | " + " | ".join(f"{r['us'][mk]:.1f}" for mk in choices)
                   + f" | {r['best']} | {r['rule']} ({r['rule_us']:.1f}) | "
                   + (f"{r['us'][64] / r['rule_us']:.2f}x |" if 64 in r["us"] else "- |"))
    return "\n".join(out)


# -- the table from Nsight Compute's reports and the timings ---------------------------------------------------------
def _metric(rep, name):
    """A report's value of one metric (ncu name), a float or None (no report, an error, or ncu left it out)."""
    if rep is None or getattr(rep, "error", None):
        return None
    v = rep.get(name)
    return v if isinstance(v, (int, float)) else None


def top_stalls(rep, n=3):
    """The n largest stall reasons (warps per issue), [(reason, value)], largest first."""
    got = [(r, _metric(rep, f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio")) for r in STALLS
           if r not in ("selected", "not_selected")]
    got = [(r, v) for r, v in got if v is not None]
    return sorted(got, key=lambda x: -x[1])[:n]


def profile_row(model: DecodeModel, reports: dict, timings_us: dict, copy_gbps: float | None = None,
                merge_variant: DecodeModel | None = None, online: DecodeModel | None = None) -> dict:
    """One case's figures: per ncu launch (reports: name -> ProfileReport or None) its duration, DRAM share, bytes
    read over the cache's bytes, occupancy, SMs active, waves, L2 hit rate and top stalls; the timings (name -> µs);
    the model beside them; the derived parts (merge tail = fused - split only, fixed = fused with no keys, dirty =
    bench write - bench clean, launch and events = bench clean - ncu fused); with copy_gbps, shares of copy."""
    launches = {}
    for name, rep in reports.items():
        dur = _metric(rep, "gpu__time_duration.sum")
        read = _metric(rep, "dram__bytes_read.sum")
        launches[name] = {
            "error": (getattr(rep, "error", None) or "") if rep is not None else "not run (time budget)",
            "duration_us": dur * 1e6 if dur is not None else None,
            "dram_pct": _metric(rep, "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "read_over_cache": read / model.cache_bytes if read is not None else None,
            "written_bytes": _metric(rep, "dram__bytes_write.sum"),
            "occupancy_pct": _metric(rep, "sm__warps_active.avg.pct_of_peak_sustained_active"),
            "sms_active_pct": _metric(rep, "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"),
            "waves": _metric(rep, "launch__waves_per_multiprocessor"),
            "ctas": _metric(rep, "launch__grid_size"),
            "l2_hit_pct": _metric(rep, "lts__t_sector_op_read_hit_rate.pct")
            if _metric(rep, "lts__t_sector_op_read_hit_rate.pct") is not None
            else _metric(rep, "lts__t_sector_hit_rate.pct"),
            "stalls": top_stalls(rep),
        }

    def dur(name):
        return launches.get(name, {}).get("duration_us")

    derived = {}
    if dur("fused") is not None and dur("split only") is not None:
        derived["merge tail (ncu: fused - split only)"] = dur("fused") - dur("split only")
    if dur("fused, no keys") is not None:
        derived["fixed part (ncu: fused, no keys)"] = dur("fused, no keys")
    if "bench clean, no keys" in timings_us:
        derived["fixed part (bench clean, no keys)"] = timings_us["bench clean, no keys"]
    if dur("fused") is not None and dur("fused, no keys") is not None:
        derived["loads (ncu: fused - fused, no keys)"] = dur("fused") - dur("fused, no keys")
    if "bench write" in timings_us and "bench clean" in timings_us:
        derived["dirty L2 (bench write - clean)"] = timings_us["bench write"] - timings_us["bench clean"]
    if dur("fused") is not None and "bench clean" in timings_us:
        derived["launch and events (bench clean - ncu fused)"] = timings_us["bench clean"] - dur("fused")
    of_copy = {}
    if copy_gbps:
        for key, us in (("ncu fused", dur("fused")), *((k, timings_us.get(k)) for k in ("bench write", "bench clean",
                                                                                         "graph"))):
            if us:
                of_copy[key] = model.cache_bytes / (us * 1e-6) / (copy_gbps * 1e9)
    return {"label": model.label, "model": asdict(model), "launches": launches, "timings_us": dict(timings_us),
            "derived_us": derived, "of_copy": of_copy, "copy_gbps": copy_gbps,
            "merge_variant_tail_us": merge_variant.merge_tail_us if merge_variant else model.merge_tail_us,
            "online_model": {"ncu_us": online.ncu_us, "fixed_us": online.fixed_us,
                             "merge_tail_us": online.merge_tail_us} if online else None,
            "online_predicted_us": ONLINE_PREDICTED_US.get((model.B, model.L)),
            "predicted_us": {name: v[2].get((model.B, model.L)) for name, v in VARIANTS.items()}}


def _f(v, fmt="{:.1f}", none="-"):
    return none if v is None else fmt.format(v)


def profile_table(rows: list) -> str:
    """The summary: per case, measured beside the model's prediction (µs unless marked)."""
    head = ("| case | blocks / waves (model) | in flight MB (model; Little asks) | ncu fused µs (model, no launch) | "
            "DRAM % | read / cache | occupancy % | SMs active % | L2 read hit % | top stalls | ncu no keys µs "
            "(model, no launch) | ncu split only µs | merge tail µs (model) | bench write µs (model) | "
            "bench clean µs (model) | bench no flush µs | graph µs | dirty µs (model) | "
            f"variant min_keys={VARIANT_MIN_KEYS}: ncu µs / bench write µs | "
            f"{MERGE}: ncu µs (model, no launch) / bench clean µs | "
            "online merge: ncu µs (predicted) / no keys (model) / bench clean µs | "
            "early first tile: ncu µs (predicted) / bench clean µs | online + early: ncu µs (predicted) / bench clean µs | "
            f"min_keys={VARIANT_MIN_KEYS} + online + early: ncu µs (predicted) / bench clean µs |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        m, L, t, dv = r["model"], r["launches"], r["timings_us"], r["derived_us"]
        fused = L.get("fused", {})
        stalls = ", ".join(f"{s} {v:.1f}" for s, v in fused.get("stalls", [])) or "-"
        fixed_model = m["fixed_us"]                                     # ncu's duration has no launch or events
        var = L.get(f"fused, min_keys={VARIANT_MIN_KEYS}", {})
        merge_model = (m["ncu_us"] - m["merge_tail_us"]
                       + r.get("merge_variant_tail_us", m["merge_tail_us"]))
        out.append(
            f"| {r['label']} | {m['blocks']} / {m['waves']:.2f} | {m['in_flight_bytes'] / 1e6:.1f}; "
            f"{m['little_bytes'] / 1e6:.1f} | {_f(fused.get('duration_us'))} ({m['ncu_us']:.1f}) | "
            f"{_f(fused.get('dram_pct'), '{:.0f}')} | {_f(fused.get('read_over_cache'), '{:.2f}')} | "
            f"{_f(fused.get('occupancy_pct'), '{:.0f}')} | {_f(fused.get('sms_active_pct'), '{:.0f}')} | "
            f"{_f(fused.get('l2_hit_pct'), '{:.0f}')} | {stalls} | "
            f"{_f(L.get('fused, no keys', {}).get('duration_us'))} ({fixed_model:.1f}) | "
            f"{_f(L.get('split only', {}).get('duration_us'))} | "
            f"{_f(dv.get('merge tail (ncu: fused - split only)'))} ({m['merge_tail_us']:.1f}) | "
            f"{_f(t.get('bench write'))} ({m['bench_us']:.1f}) | {_f(t.get('bench clean'))} ({m['clean_us']:.1f}) | "
            f"{_f(t.get('bench no flush'))} | {_f(t.get('graph'))} | "
            f"{_f(dv.get('dirty L2 (bench write - clean)'))} ({m['dirty_us']:.1f}) | "
            f"{_f(var.get('duration_us'))} / {_f(t.get('variant bench write'))} | "
            f"{_f(L.get(MERGE, {}).get('duration_us'))} ({merge_model:.1f}) / {_f(t.get('merge bench clean'))} | "
            f"{_f(L.get(ONLINE, {}).get('duration_us'))} ({_f(r.get('online_predicted_us'))}) / "
            f"{_f(L.get(ONLINE + ', no keys', {}).get('duration_us'))} "
            f"({_f((r.get('online_model') or {}).get('fixed_us'))}) / {_f(t.get('online bench clean'))} | "
            + " | ".join(f"{_f(L.get(v, {}).get('duration_us'))} ({_f((r.get('predicted_us') or {}).get(v))}) / "
                         f"{_f(t.get(VARIANTS[v][3]))}" for v in (EARLY, BOTH, FLOOR_BOTH)) + " |")
    return "\n".join(out)


def _plain_verdict(saved: float, dur: float) -> str:
    """A variant judged by the same run's default alone (where the written prediction was for another GPU)."""
    if saved > max(0.3, 0.02 * dur):
        return f"faster by {saved:.1f} µs ({saved / dur:.0%}) than this run's default"
    if saved < -max(0.3, 0.02 * dur):
        return f"slower by {-saved:.1f} µs ({-saved / dur:.0%}) than this run's default: keep the default"
    return "no gain within 2 % of this run's default: keep the default"


def online_verdict(row: dict, dur, t: dict) -> list:
    """H10, the online merge (decode_attention(merge="online")) against its written prediction: ncu beside the
    default's, and as called (bench clean); what to do with the default."""
    on = (row.get("launches") or {}).get(ONLINE) or {}
    pred, got = row.get("online_predicted_us"), on.get("duration_us")
    base_b, on_b = t.get("bench clean"), t.get("online bench clean")
    if got is None or dur is None:
        if base_b and on_b:          # B = 32: no block merges, only the call is timed
            return [f"H10 online merge (predicted as the default: no block merges): bench clean {on_b:.1f} µs "
                    f"against {base_b:.1f} -> " + ("as predicted, no change" if abs(on_b - base_b) < 0.02 * base_b
                                                   else "differs where no merge runs: look at the code path")]
        return []
    want, saved = dur - (pred if pred is not None else dur), dur - got
    nk, nk_on = (row.get("launches") or {}).get("fused, no keys", {}), (row.get("launches") or {}).get(
        ONLINE + ", no keys", {})
    fixed = (f"; no keys {nk_on['duration_us']:.1f} µs against {nk['duration_us']:.1f} (model "
             f"{row['online_model']['fixed_us']:.1f})" if nk.get("duration_us") and nk_on.get("duration_us")
             and row.get("online_model") else "")
    as_called = (f"; bench clean {on_b:.1f} µs against {base_b:.1f}" if on_b and base_b else "")
    if want <= 0:                    # the default already runs below the written (H100) figure: another GPU
        return [f"H10 online merge (predicted {_f(pred)} µs on an H100; this GPU's default is faster): ncu {got:.1f} "
                f"µs against {dur:.1f}{fixed}{as_called} -> " + _plain_verdict(saved, dur)]
    verdict = ("faster as predicted: make merge='online' the default (at d = 128), then add it at d = 64"
               if saved >= 0.5 * want and saved > 0.3 else
               "faster, by less than half the prediction: the merge's round trips are cheaper than l2_latency_us; "
               "make it the default only if bench clean agrees" if saved > 0.3 else
               "no gain: the tail is not the merge's L2 round trips (fence and ticket, or the last block's wait "
               "for the slowest split); keep the default")
    return [f"H10 online merge (predicted {_f(pred)} µs, saving {want:.1f}): ncu {got:.1f} µs against {dur:.1f}"
            f"{fixed}{as_called} -> {verdict}"]


def variant_verdict(row: dict, name: str, dur, t: dict, tag: str) -> list:
    """One line: a variant's ncu duration and call (bench clean) against the default's and its written prediction."""
    got = ((row.get("launches") or {}).get(name) or {}).get("duration_us")
    pred = (row.get("predicted_us") or {}).get(name)
    base_b, var_b = t.get("bench clean"), t.get(VARIANTS[name][3])
    if got is None or dur is None:
        return []
    want, saved = dur - (pred if pred is not None else dur), dur - got
    as_called = f"; bench clean {var_b:.1f} µs against {base_b:.1f}" if var_b and base_b else ""
    if want <= 0:                    # the default already runs below the written (H100) figure: another GPU
        return [f"{tag} {name.split(', ', 1)[1]} (predicted {_f(pred)} µs on an H100; this GPU's default is faster): "
                f"ncu {got:.1f} µs against {dur:.1f}{as_called} -> " + _plain_verdict(saved, dur)]
    verdict = ("faster as predicted: make it the default (tests-attention-inference covers it)"
               if saved >= 0.5 * want and saved > 0.3 else
               "faster, by less than half the prediction: make it the default only if bench clean agrees"
               if saved > 0.3 else "no gain: keep the default; the model's term for it is wrong (see H3)")
    return [f"{tag} {name.split(', ', 1)[1]} (predicted {_f(pred)} µs, saving {want:.1f}): ncu {got:.1f} µs against "
            f"{dur:.1f}{as_called} -> {verdict}"]


def profile_reading(rows: list) -> list:
    """One line per hypothesis: what the measured numbers say about it (or that they are missing)."""
    by = {r["label"]: r for r in rows}
    lines = []

    def get(label, *path):
        x = by.get(label)
        for p in path:
            x = x.get(p) if isinstance(x, dict) else None
        return x

    for label in by:
        m = by[label]["model"]
        fused = get(label, "launches", "fused") or {}
        dv = get(label, "derived_us") or {}
        t = get(label, "timings_us") or {}
        dur, bench_w = fused.get("duration_us"), t.get("bench write")
        stalls = [s for s, _ in fused.get("stalls", [])]
        say = []
        oc = by[label].get("of_copy") or {}
        if oc:
            need = m["cache_bytes"] / (TARGET_OF_COPY * by[label]["copy_gbps"] * 1e9) * 1e6
            say.append("H0 share of copy: " + ", ".join(f"{k} {v:.0%}" for k, v in oc.items())
                       + f"; {TARGET_OF_COPY:.0%} of copy is {need:.1f} µs"
                       + ("" if m["L"] >= 8192 else " (the target is for caches of 8k and more)")
                       + " -> " + (
                           "met with a clean L2: the gap by the default timing is its flush's dirty lines"
                           if oc.get("bench clean", 0) >= TARGET_OF_COPY > oc.get("bench write", 1) else
                           "met" if oc.get("bench write", 0) >= TARGET_OF_COPY else
                           "missed even by the kernel alone (ncu): the kernel's fixed part must shrink"
                           if oc.get("ncu fused", 1) < TARGET_OF_COPY else
                           "the kernel alone (ncu) meets it: what is missing is launch, events and the L2's state"))
        # H1: the timing's dirty L2 lines
        dirty = dv.get("dirty L2 (bench write - clean)")
        if dirty is not None and bench_w:
            share = dirty / bench_w
            say.append(f"H1 dirty L2 (model {m['dirty_us']:.1f} µs): bench write - clean = {dirty:.1f} µs, "
                       f"{share:.0%} of the call -> " + (
                           "the flush's write-back is a large share: the low share of copy is partly the timing's "
                           "L2 state (cuDNN pays it too); report of-copy with flush_l2='clean' beside it"
                           if share > 0.2 else
                           "not the timing's L2 state"))
        # H2: loads in flight / the chain of tiles
        if dur is not None:
            fixed = dv.get("fixed part (ncu: fused, no keys)")
            loads = dv.get("loads (ncu: fused - fused, no keys)")
            need = m["little_bytes"]
            ok_flight = m["in_flight_bytes"] >= need
            ls = "long_scoreboard" in stalls[:1]
            say.append(
                f"H2 loads (model loads {m['loads_us']:.1f} µs: chain {m['chain_us']:.1f}, stream "
                f"{m['stream_us']:.1f}; {m['in_flight_bytes'] / 1e6:.1f} MB in flight vs {need / 1e6:.1f} MB): "
                f"ncu loads part {_f(loads)} µs, DRAM {_f(fused.get('dram_pct'), '{:.0f}')} % -> " + (
                    "too few loads in flight (long_scoreboard leads, fewer bytes in flight than Little asks): "
                    "more splits (a lower min_keys) or a deeper prefetch (3-4 stages a warp)" if ls and not ok_flight
                    else "loads wait on DRAM with enough bytes in flight: bandwidth-bound, as the model says"
                    if ls else "long_scoreboard does not lead: the loads are not what waits"))
            if fixed is not None:
                say.append(f"H3 fixed part (model {m['fixed_us']:.1f} µs without the launch: floor "
                           f"{m['floor_us']:.1f}, ramp {m['ramp_us']:.1f}, cache_seqlens {m['first_load_us']:.1f}, "
                           f"block merge {m['block_merge_us']:.1f}, tail {m['merge_tail_us']:.1f}; "
                           f"{m['launch_us']:.1f} more as "
                           f"timed): ncu with no keys {fixed:.1f} µs = {fixed / dur:.0%} of the kernel (bench clean, "
                           f"no keys: {_f(dv.get('fixed part (bench clean, no keys)'))} µs) -> "
                           + ("the fixed part dominates: ramp, in-block merge, ticket and last-block merge, not "
                              "bandwidth; H4 gives the merge's share" if fixed / dur > 0.4 else
                              "the fixed part is not the main cost here"))
        tail = dv.get("merge tail (ncu: fused - split only)")
        if tail is not None and dur:
            say.append(f"H4 merge tail (model {m['merge_tail_us']:.1f} µs): fused - split only = {tail:.1f} µs, "
                       f"{tail / dur:.0%} of the kernel -> " + (
                           "the last block's merge serialises a large share: merge with more threads (several "
                           "last blocks, one per row chunk) or overlap it (programmatic dependent launch of a "
                           "combine)" if tail / dur > 0.2 else "the merge's tail is small"))
        le = dv.get("launch and events (bench clean - ncu fused)")
        if le is not None:
            say.append(f"H7 launch and events (model {m['launch_us']:.1f} µs): bench clean - ncu fused = {le:.1f} "
                       f"µs; "
                       f"graph replay {_f(t.get('graph'))} µs a call (with a counters memset) -> " + (
                           "the launch and event floor is larger than the model's: a shorter kernel cannot hide it; "
                           "the graph figure is what a model's decode loop (CUDA graphs) sees"
                           "; suspects: the queued spin kernel before each timed call (a shared-memory carveout "
                           "change before an 80 KB block can start), block dispatch"
                           if le > 1.5 * m["launch_us"] else "the launch floor is as modelled"))
        if t.get("bench clean") and t.get("bench no flush"):
            gap = t["bench clean"] - t["bench no flush"]
            say.append(f"H8 the flush beyond the data (TLB reach, L2 state): bench clean - no flush = {gap:.1f} µs -> "
                       + ("the flush's side effects cost the call: a decode loop (warm TLB) sees the no-flush figure"
                          if gap > 0.15 * t["bench clean"] else "no cost beyond reading the cache from DRAM"))
        var = get(label, "launches", f"fused, min_keys={VARIANT_MIN_KEYS}") or {}
        if var.get("duration_us") is not None and dur is not None:
            say.append(f"H5 more splits (min_keys={VARIANT_MIN_KEYS}): ncu {var['duration_us']:.1f} µs against "
                       f"{dur:.1f} -> " + ("more, shorter splits help: make the plan's floor lower for small caches"
                                           if var["duration_us"] < 0.9 * dur else "more splits do not help"))
        mv = get(label, "launches", MERGE) or {}
        if mv.get("duration_us") is not None and dur is not None:
            saved = dur - mv["duration_us"]
            want = m["merge_tail_us"] - by[label].get("merge_variant_tail_us", m["merge_tail_us"])
            say.append(f"H9 merge with {MERGE_LOADS} loads in flight (model saves {want:.1f} µs): ncu "
                       f"{mv['duration_us']:.1f} µs against {dur:.1f} (bench clean {_f(t.get('merge bench clean'))} "
                       f"against {_f(t.get('bench clean'))}) -> " + (
                           f"the merge's round trips were the tail: make merge_loads {MERGE_LOADS} the default at "
                           "d = 128 (after "
                           "tests-attention-inference passes with it)" if saved > 0.5 * max(want, 0.2) and saved > 0.3
                           else "no gain: the tail is not the o_part loads' round trips (see H4)"))
        say += online_verdict(by[label], dur, t)
        say += variant_verdict(by[label], EARLY, dur, t, "H11")
        say += variant_verdict(by[label], BOTH, dur, t, "H12")
        say += variant_verdict(by[label], FLOOR_BOTH, dur, t, "H13")
        fl = get(label, "launches", DEFAULT_FLOOR) or {}
        if fl.get("duration_us") is not None and dur is not None:
            fb, cl = t.get("floor bench clean"), t.get("bench clean")
            say.append(f"H14 the plan's floor (decode_floor) against min_keys={FIT_MIN_KEYS}: ncu "
                       f"{fl['duration_us']:.1f} µs against {dur:.1f} ({dur / fl['duration_us']:.2f}x; bench clean "
                       f"{_f(fb)} against {_f(cl)}) -> " + (
                           "the new default is faster, as the model said" if fl["duration_us"] < 0.97 * dur else
                           "no gain: revisit decode_floor with bench-decode-floor's sweep"
                           if fl["duration_us"] <= 1.03 * dur else
                           "SLOWER than min_keys=64: decode_floor's rule is wrong here (see bench-decode-floor)"))
        if fused.get("read_over_cache") is not None:
            rc = fused["read_over_cache"]
            say.append(f"H6 bytes: DRAM read {rc:.2f}x the cache -> "
                       + ("extra reads (partials, re-reads) cost bandwidth" if rc > 1.1 else
                          "only the cache is read"))
        for err in {v.get("error") for v in (get(label, "launches") or {}).values() if v.get("error")}:
            say.append(f"ncu: {err}")
        lines.append(f"{label}:")
        lines += [f"  {s}" for s in say] or ["  no measurements"]
    return lines


# -- on the GPU ------------------------------------------------------------------------------------------------------
def run(t, torch, out: pathlib.Path, copy_gbps=None, cases=PROFILE_CASES, budget_s: float = BUDGET_S,
        started: float | None = None, log=print, device="cuda", op=None, bench=None) -> int:
    """The suite: ncu launches and timings for each case (t: tutorial 09's loaded cells). Writes
    decode_profile.json and decode_profile.md under `out`; returns 1 where a check or a launch failed. The budget
    counts from `started` (time.time() when the script began; default now). device, op (default
    torch.ops.kl.decode_attention) and bench (default kernellab.bench): what a CPU test replaces."""
    if bench is None:
        import kernellab

        bench = kernellab.bench
    op = op or torch.ops.kl.decode_attention

    t0 = time.time() if started is None else started
    rows, failed = [], []
    dt = "bf16"
    for B, L in cases:
        if time.time() - t0 > budget_s - CASE_RESERVE_S:
            log(f"  ! skipped B={B} cache={L}: past {budget_s - CASE_RESERVE_S:.0f} s of the budget")
            failed.append(f"B={B} cache={L}: not run (time budget)")
            continue
        g = torch.Generator(device).manual_seed(0)
        q = torch.randn(B, HQ, NQ, D, generator=g, device=device).to(torch.bfloat16)
        kc, vc = (torch.randn(B, HKV, L, D, generator=g, device=device).to(torch.bfloat16) for _ in range(2))
        full = torch.full((B,), L, dtype=torch.int32, device=device)
        empty = torch.zeros(B, dtype=torch.int32, device=device)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kc.float(), vc.float(), enable_gqa=True)
        plan = t["decode_plan"](B, HKV, HQ // HKV, NQ, L, D, t["SMS"], FIT_MIN_KEYS)
        dplan = t["decode_plan"](B, HKV, HQ // HKV, NQ, L, D, t["SMS"])      # the op's own (decode_floor)
        # the fitted figures' floor: the op itself where its plan is that one, else the launcher at FIT_MIN_KEYS
        fit_op = op if dplan.splits == plan.splits else (
            lambda *a: t["decode_attention"](*a, min_keys=FIT_MIN_KEYS))
        vplan = t["decode_plan"](B, HKV, HQ // HKV, NQ, L, D, t["SMS"], VARIANT_MIN_KEYS)
        model = decode_model(B, L, plan)
        label = model.label
        for name, fn in (("op", lambda: op(q, kc, vc, full)),
                         (f"min_keys={VARIANT_MIN_KEYS}",
                          lambda: t["decode_attention"](q, kc, vc, full, min_keys=VARIANT_MIN_KEYS)),
                         (f"merge_loads={MERGE_LOADS}",
                          lambda: t["decode_attention"](q, kc, vc, full, merge_loads=MERGE_LOADS)),
                         ("merge=online", lambda: t["decode_attention"](q, kc, vc, full, merge="online")),
                         ("early", lambda: t["decode_attention"](q, kc, vc, full, early=True)),
                         ("merge=online, early",
                          lambda: t["decode_attention"](q, kc, vc, full, merge="online", early=True)),
                         (f"min_keys={VARIANT_MIN_KEYS}, merge=online, early",
                          lambda: t["decode_attention"](q, kc, vc, full, min_keys=VARIANT_MIN_KEYS, merge="online",
                                                        early=True))):
            err = (fn().float() - ref).abs().max().item()
            if not err < 3e-2:
                failed.append(f"{label} {name}: max error {err:.2e} against SDPA in fp32")
                log(f"  ! {label} {name} FAILED its check: max error {err:.2e}")

        def fused_args(p, seqlens):
            rows_ = B * HQ * NQ
            work = torch.empty(rows_ * (p.splits // DEC_WARPS) * (D + 1), dtype=torch.float32, device=device)
            counters = torch.zeros(max(256, B * HKV * p.row_groups), dtype=torch.int32, device=device)
            return (q, kc, vc, seqlens, work, torch.empty_like(q), counters, HKV, HQ // HKV, NQ, L, D ** -0.5)

        def split_args(p):
            rows_ = B * HQ * NQ
            o_part = torch.empty(rows_, p.splits // DEC_WARPS, D, dtype=torch.float32, device=device)
            lse_part = torch.empty(rows_, p.splits // DEC_WARPS, dtype=torch.float32, device=device)
            return (q, kc, vc, full, o_part, lse_part, HKV, HQ // HKV, NQ, L, D ** -0.5)

        launches = {"fused": (f"decode_fused_{dt}_d{D}_m16", plan, lambda: fused_args(plan, full))}
        small = B == 1 and L <= 8192           # where the fixed part matters (the large cases' grids are 8k's)
        if B == 1:                             # the online merge beside the default (at B = 32 no block merges)
            launches[ONLINE] = (f"decode_fused_{dt}_d{D}_m16_online", plan, lambda: fused_args(plan, full))
        launches[EARLY] = (f"decode_fused_{dt}_d{D}_m16_early", plan, lambda: fused_args(plan, full))
        if B == 1:
            launches[BOTH] = (f"decode_fused_{dt}_d{D}_m16_online_early", plan, lambda: fused_args(plan, full))
        if small:
            launches["fused, no keys"] = (f"decode_fused_{dt}_d{D}_m16", plan, lambda: fused_args(plan, empty))
            launches[ONLINE + ", no keys"] = (f"decode_fused_{dt}_d{D}_m16_online", plan,
                                              lambda: fused_args(plan, empty))
        if plan.splits // DEC_WARPS > 1:       # a last block merges: its tail, and the merge variant
            launches["split only"] = (f"decode_{dt}_d{D}_m16", plan, lambda: split_args(plan))
            if small:
                launches[MERGE] = (f"decode_fused_{dt}_d{D}_m16_l{MERGE_LOADS}", plan,
                                   lambda: fused_args(plan, full))
        if dplan.splits != plan.splits:        # the op's floor is not the fitted one: its launch beside
            launches[DEFAULT_FLOOR] = (f"decode_fused_{dt}_d{D}_m16", dplan, lambda: fused_args(dplan, full))
        if decode_model(B, L, vplan).tiles_per_warp != model.tiles_per_warp:    # a shorter chain of tiles
            launches[f"fused, min_keys={VARIANT_MIN_KEYS}"] = (f"decode_fused_{dt}_d{D}_m16", vplan,
                                                               lambda: fused_args(vplan, full))
            if B == 1:
                launches[FLOOR_BOTH] = (f"decode_fused_{dt}_d{D}_m16_online_early", vplan,
                                        lambda: fused_args(vplan, full))
        # timings first (in this process, cheap), then ncu (a process a launch)
        timings = {}

        def inputs(gen, B=B, L=L):
            qq = torch.randn(B, HQ, NQ, D, generator=gen, device=device).to(torch.bfloat16)
            k2, v2 = (torch.randn(B, HKV, L, D, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
            return qq, k2, v2, torch.full((B,), L, dtype=torch.int32, device=device)

        def inputs_empty(gen):
            qq, k2, v2, _ = inputs(gen)
            return qq, k2, v2, torch.zeros(B, dtype=torch.int32, device=device)

        variant = lambda *a: t["decode_attention"](*a, min_keys=VARIANT_MIN_KEYS)  # noqa: E731
        merge = lambda *a: t["decode_attention"](*a, merge_loads=MERGE_LOADS)  # noqa: E731
        online = lambda *a: t["decode_attention"](*a, merge="online")  # noqa: E731
        timed = [("bench write", fit_op, inputs, {"flush_l2": "write"}),
                 ("bench clean", fit_op, inputs, {"flush_l2": "clean"}),
                 ("bench no flush", fit_op, inputs, {"flush_l2": False}),
                 ("graph", fit_op, inputs, {"flush_l2": False, "cuda_graph": True})]
        if "fused, no keys" in launches:
            timed.append(("bench clean, no keys", fit_op, inputs_empty, {"flush_l2": "clean"}))
        if DEFAULT_FLOOR in launches:
            timed.append(("floor bench clean", op, inputs, {"flush_l2": "clean"}))
        if f"fused, min_keys={VARIANT_MIN_KEYS}" in launches:
            timed += [("variant bench write", variant, inputs, {"flush_l2": "write"}),
                      ("variant bench clean", variant, inputs, {"flush_l2": "clean"})]
        if MERGE in launches:
            timed.append(("merge bench clean", merge, inputs, {"flush_l2": "clean"}))
        timed.append(("online bench clean", online, inputs, {"flush_l2": "clean"}))     # every case, B = 32 too
        for vname in (EARLY, BOTH, FLOOR_BOTH):
            if vname in launches:
                timed.append((VARIANTS[vname][3], lambda *a, kw=VARIANTS[vname][1]: t["decode_attention"](*a, **kw),
                              inputs, {"flush_l2": "clean"}))
        for key, fn, inp, kw in timed:
            try:
                r = bench(fn, inp, rep_ms=40.0, rounds=5, generator_device=device, verify=False, **kw)
                timings[key] = r.median_ms * 1e3
            except Exception as exc:  # noqa: BLE001 - say what failed, go on
                log(f"  ! {label} {key}: {type(exc).__name__}: {str(exc)[:200]}")
                failed.append(f"{label} {key}: {type(exc).__name__}")
        reports = {}
        for name, (kernel, p, make) in launches.items():
            if time.time() - t0 > budget_s:
                reports[name] = None
                log(f"  (skipped ncu on {label} {name}: past the {budget_s:.0f} s budget)")
                continue
            args = make()
            try:
                rep = t["decode_kernels"][kernel].profile(p.grid(B, HKV), 32 * DEC_WARPS, *args,
                                                          shared_bytes=p.shared_bytes,
                                                          metrics=[n for n, _ in NCU_METRICS])
            except Exception as exc:  # noqa: BLE001 - no ncu, no counters: say so, go on
                rep = None
                log(f"  ! ncu on {label} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                failed.append(f"{label} ncu {name}: {type(exc).__name__}")
            else:
                if rep.error:
                    log(f"  ! ncu on {label} {name}: {rep.error}")
                    failed.append(f"{label} ncu {name}: {rep.error[:80]}")
                for note in rep.notes:
                    log(f"    ncu note ({label} {name}): {note}")
            reports[name] = rep
            del args
        row = profile_row(model, reports, timings, copy_gbps,
                          decode_model(B, L, plan, dataclasses.replace(H100, merge_unroll=MERGE_LOADS)),
                          decode_model(B, L, plan, dataclasses.replace(H100, merge="online")))
        rows.append(row)
        if fit_op is not op:
            log(f"  {label}: the op's floor gives {dplan.splits} splits; bench and graph timings are the "
                f"launcher at min_keys={FIT_MIN_KEYS} ({plan.splits} splits), as the model was fitted")
        log(f"{label}: model {model.bench_us:.1f} µs (clean {model.clean_us:.1f}; blames {model.blame}); "
            + ", ".join(f"{k} {v:.1f} µs" for k, v in timings.items()) + "; ncu "
            + ", ".join(f"{k} {_f(v['duration_us'])} µs" for k, v in row["launches"].items())
            + f"  [{time.time() - t0:.0f} s]")
        del q, kc, vc
        if device == "cuda":
            torch.cuda.empty_cache()
    text = profile_table(rows) + "\n\n" + "\n".join(profile_reading(rows))
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if device == "cuda" else device
    (out / "decode_profile.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1, default=str))
    (out / "decode_profile.md").write_text(text + "\n")
    log(f"\n{time.time() - t0:.0f} s in all; the model's constants: {asdict(H100)}\n")
    log(text)
    if failed:
        log(f"\nFAILED: {'; '.join(failed)}")
    return 1 if failed else 0


# -- the split floor on the GPU: the plan's default (decode_floor) against min_keys 64 ------------------------------
FLOOR_SWEEP_CASES = ((1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192))      # (B, cache length)


def floor_line(B, L, splits, splits_64, floor, us: dict) -> str:
    """One case's line: the launcher at its plan's default floor and at min_keys 64 under each flush, the ratio (> 1:
    the default is faster), the op as called, the sweep at 16/32/64, the model's ratio."""
    ratio = {f: us[(f, FIT_MIN_KEYS)] / us[(f, "default")] for f in ("clean", "write")
             if us.get((f, "default")) and us.get((f, FIT_MIN_KEYS))}
    pred = decode_model(B, L, profile_plan(B, L, FIT_MIN_KEYS)).ncu_us / decode_model(
        B, L, profile_plan(B, L, floor)).ncu_us
    sweep = ", ".join(f"{mk} {_f(us.get(('clean', mk)))}" for mk in FLOOR_CHOICES)
    if splits == splits_64:
        verdict = " -> the same plan as min_keys 64 (the ratio is noise)"
    elif "clean" not in ratio:
        verdict = ""
    else:
        verdict = (" -> default faster" if ratio["clean"] > 1.03 else " -> SLOWER than min_keys=64: decode_floor's "
                   "rule is wrong here" if ratio["clean"] < 0.97 else " -> the same within 3 %")
    return (f"B={B} cache={L}: default min_keys {floor} ({splits} splits) clean {_f(us.get(('clean', 'default')))} µs "
            f"/ write {_f(us.get(('write', 'default')))}; min_keys={FIT_MIN_KEYS} ({splits_64} splits) clean "
            f"{_f(us.get(('clean', FIT_MIN_KEYS)))} / write {_f(us.get(('write', FIT_MIN_KEYS)))}; 64 / default: "
            f"clean {_f(ratio.get('clean'), '{:.2f}x')}, write {_f(ratio.get('write'), '{:.2f}x')} (model "
            f"{pred:.2f}x); the op as called clean {_f(us.get(('clean', 'op')))}; clean at min_keys {sweep}{verdict}")


def floor_sweep(t, torch, out: pathlib.Path | None = None, cases=FLOOR_SWEEP_CASES, log=print, device="cuda",
                op=None, bench=None) -> int:
    """The suite bench-decode-floor: at each case tutorial 09's launcher with its plan's default floor (decode_floor)
    and at min_keys 16, 32 and 64 (the old default), and the op as called (torch.ops.kl.decode_attention: the default
    floor behind the dispatcher), each checked against SDPA in fp32, timed by kernellab.bench with a clean L2 (the
    default and 64 with a written one too); a line per case (both, the ratio, the model's ratio) and the model's
    table. Default and 64 are both the launcher, so the ratio is the floor's alone. Returns 1 where a check failed or,
    where the plans differ, the default is more than 3 % slower than min_keys 64 (clean L2)."""
    if bench is None:
        import kernellab

        bench = kernellab.bench
    op = op or torch.ops.kl.decode_attention
    failed, lines, rows = [], [], []
    for B, L in cases:
        def inputs(gen, B=B, L=L):
            qq = torch.randn(B, HQ, NQ, D, generator=gen, device=device).to(torch.bfloat16)
            k2, v2 = (torch.randn(B, HKV, L, D, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
            return qq, k2, v2, torch.full((B,), L, dtype=torch.int32, device=device)

        args = inputs(torch.Generator(device).manual_seed(0))
        ref = torch.nn.functional.scaled_dot_product_attention(*(x.float() for x in args[:3]), enable_gqa=True)
        floor = floor_rule(B, L)
        splits = t["decode_plan"](B, HKV, HQ // HKV, NQ, L, D, t["SMS"]).splits
        splits_64 = t["decode_plan"](B, HKV, HQ // HKV, NQ, L, D, t["SMS"], FIT_MIN_KEYS).splits
        fns = {"default": lambda *a: t["decode_attention"](*a), "op": op,
               **{mk: (lambda *a, mk=mk: t["decode_attention"](*a, min_keys=mk)) for mk in FLOOR_CHOICES}}
        us = {}
        for key, fn in fns.items():
            err = (fn(*args).float() - ref).abs().max().item()
            if not err < 3e-2:
                failed.append(f"B={B} cache={L} {key}: max error {err:.2e} against SDPA in fp32")
                log(f"  ! B={B} cache={L} {key} FAILED its check: max error {err:.2e}")
            for flush in ("clean", "write") if key in ("default", FIT_MIN_KEYS) else ("clean",):
                try:
                    r = bench(fn, inputs, rep_ms=40.0, rounds=5, generator_device=device, verify=False,
                              flush_l2=flush)
                    us[(flush, key)] = r.median_ms * 1e3
                except Exception as exc:  # noqa: BLE001 - say what failed, go on
                    failed.append(f"B={B} cache={L} {key} {flush}: {type(exc).__name__}: {str(exc)[:120]}")
                    log(f"  ! B={B} cache={L} {key} {flush}: {type(exc).__name__}: {str(exc)[:200]}")
        line = floor_line(B, L, splits, splits_64, floor, us)
        if splits != splits_64 and us.get(("clean", "default")) and us.get(("clean", FIT_MIN_KEYS)) and \
                us[("clean", "default")] > 1.03 * us[("clean", FIT_MIN_KEYS)]:
            failed.append(f"B={B} cache={L}: the default floor is slower than min_keys={FIT_MIN_KEYS}")
        log(line)
        lines.append(line)
        rows.append({"B": B, "L": L, "floor": floor, "splits": splits, "splits_64": splits_64,
                     "us": {f"{f} {k}": v for (f, k), v in us.items()}})
        del args
    text = ("the model's kernel µs by split floor (H100 constants; decode_floor's pick):\n"
            + floor_table_text(floor_table()) + "\n\nmeasured (kernellab.bench, µs):\n" + "\n".join(lines))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name() if device == "cuda" else device
        (out / "decode_floor.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))
        (out / "decode_floor.md").write_text(text + "\n")
    log("\n" + text)
    if failed:
        log(f"\nFAILED: {'; '.join(failed)}")
    return 1 if failed else 0
