"""Time GPU work honestly: `bench(fn, inputs)` for one function and its baselines, `sweep` over sizes or configs.

The method, and the way of lying each step prevents:
- CUDA events around every call, read after one synchronize: GPU time, not Python time.
- The L2 cache is flushed before every repetition by writing a buffer twice its size (the size comes from the
  device), so no call finds the previous call's data still in L2. That leaves the L2 full of dirty lines, which
  the timed call's own traffic then evicts to DRAM: as in Triton's do_bench, and as a kernel in a model meets the
  outputs of the kernels before it. For kernels of a few tens of microseconds that write-back is a fifth of their
  time (a copy of 16 MB on an H100: 10.6 µs against 8.7); `flush_l2="clean"` reads the buffer instead, so the
  write-back happens during the flush, untimed, and the L2 holds clean lines: the kernel's own cost, closer to
  Nsight Compute's (which flushes and invalidates). The result's `l2_flush` says which was used.
- The GPU is kept behind the CPU: a GPU-side spin (`torch.cuda._sleep`) is queued before each batch of
  repetitions, long enough for the CPU to queue the whole batch, so no event waits on a Python launch and launch
  overhead stays out of the numbers.
- The GPU's power state is held steady: a batch holds at most 5 ms of GPU work and the GPU idles between batches
  so that it is busy at most half the time. Back-to-back work drives a big GPU into its power cap (an H200 running
  a bf16 matmul slows by ~15 % within ~100 ms), and a bench that sometimes does and sometimes does not get there
  gives a different answer each run. `sustained=True` times the capped state on purpose.
- kernellab kernels do not wait for themselves while timed: `k[grid, block](...)` normally synchronizes so that a
  fault is reported at its line, which here would put launch overhead into every repetition. The first call
  still waits (a fault is caught there, by name); a fault in a later repetition is reported as such.
- Warm-up by time (`warmup_ms`), after a first call that may compile or autotune.
- Repetitions by time (`rep_ms`), in rounds that alternate between `fn` and its baselines, so clock and thermal
  drift hit them alike; each speed-up is the median of the per-round ratios, with their range as the spread.
- Where one input set fits in L2, several sets are made and used in turn, so that even without a flush
  (`flush_l2=False`, or between the calls inside one CUDA-graph replay) data comes from DRAM.
- Median and quantiles, not the mean: one preempted repetition does not move the answer.
- Optional CUDA-graph replay (`cuda_graph=True`) for kernels of a few microseconds, whose launch costs more than
  they do: many calls are captured into one graph and each replay's time is divided among them.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from kernellab.analysis.roofline import datasheet_ceilings
from kernellab.errors import KernellabError, LaunchError, NoGPUError
from kernellab.render.bench_html import bench_result_html, sweep_html
from kernellab.report import fmt_cell, mimebundle
from kernellab.run.launch.launch import deferred_sync
from ..launch import worker as _worker
from ..launch.launch import is_sticky, unwaited_note
from . import integrity
from .check import as_outputs, mismatch_count
_MAX_INPUT_SETS = 256      # rotation stops here even where one set is tiny
_SLEEP_CAP_MS = 20.0       # the longest GPU spin queued ahead of one batch of calls
_SLEEP_MIN_MS = 5.0        # the shortest: a first call that takes longer on the CPU is taken to wait for the GPU
# Burst mode (the default) keeps a power-hungry kernel below the GPU's power cap: at most _BATCH_GPU_MS of GPU work
# behind one spin, and the GPU busy at most _DUTY of the time. Measured on an H200 (2026-11-22), a
# bf16 8192^3 matmul: with batches as long as the CPU could queue (up to 200 calls) the medians
# of six benches spread 0.5-1 % and one in five was 3 % slow after a power transient; with 5 ms and 50 % they spread
# 0.03-0.07 %, at 1.5x the wall time.
_BATCH_GPU_MS = 5.0
_DUTY = 0.5


class BenchError(KernellabError, ValueError):
    """`bench` cannot time this: the function, its inputs or the options are not something it can measure."""


# --- results ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Speedup:
    """How many times faster the benchmarked function is than one baseline (> 1: faster)."""

    baseline: str
    ratio: float            # median over rounds of baseline-round-median / fn-round-median
    low: float              # the smallest per-round ratio
    high: float             # the largest per-round ratio
    rounds: int

    def __str__(self) -> str:
        return f"{self.ratio:.3g}x vs {self.baseline} ({self.low:.3g}-{self.high:.3g} over {self.rounds} rounds)"


@dataclass(frozen=True)
class BenchResult:
    """GPU time of one function (median and quantiles over its repetitions), with its baselines and rates."""

    name: str
    median_ms: float
    min_ms: float
    mean_ms: float
    quantiles_ms: tuple[tuple[float, float], ...]   # (q, ms) for each quantile asked for
    reps: int
    rounds: int
    device: str
    method: str                                     # one line: how these numbers were taken
    flops: float | None = None                      # per call, as declared
    bytes_moved: float | None = None                # per call: declared, or measured (see bytes_source)
    bytes_source: str = "declared"                  # "declared", or the measurement, e.g. "ncu dram__bytes.sum"
    l2_flush_bytes: int = 0                         # 0: no flush
    l2_flush: str = "write"                         # "write" (dirty lines left), "clean" (read), "none"
    input_sets: int = 1                             # argument sets used in turn
    cuda_graph: bool = False
    calls_per_replay: int = 1
    baselines: tuple[BenchResult, ...] = ()
    speedups: tuple[Speedup, ...] = ()
    times_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)   # every repetition, in order
    round_medians_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)
    findings: tuple = ()                            # IntegrityFinding(kind, message) per defence that tripped
    roofline_floor_ms: float | None = None          # the least time the roofline allows for flops and bytes

    @property
    def trusted(self) -> bool:
        """No defence tripped: the time may be ranked (an "impossible_speed" or any other finding: never rank it)."""
        return not self.findings

    # rates ------------------------------------------------------------------------------------------------
    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s at the median time (None without `flops`)."""
        return None if self.flops is None else self.flops / (self.median_ms * 1e-3) / 1e12

    @property
    def gbps(self) -> float | None:
        """Achieved GB/s at the median time (None without `bytes`)."""
        return None if self.bytes_moved is None else self.bytes_moved / (self.median_ms * 1e-3) / 1e9

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOP per byte (None without both `flops` and `bytes`)."""
        if self.flops is None or not self.bytes_moved:
            return None
        return self.flops / self.bytes_moved

    @property
    def spread(self) -> float:
        """Interquartile range over the median: the run-to-run noise of one repetition."""
        return (self.quantile(0.75) - self.quantile(0.25)) / self.median_ms if self.median_ms else 0.0

    def quantile(self, q: float) -> float:
        """Any quantile of the repetition times, in ms."""
        for qq, v in self.quantiles_ms:
            if qq == q:
                return v
        if not self.times_ms:
            raise BenchError(f"quantile {q} was not kept and the repetition times were dropped")
        return float(np.quantile(np.asarray(self.times_ms), q))

    def speedup(self, baseline: str) -> Speedup:
        """The speed-up against the baseline of that name."""
        for s in self.speedups:
            if s.baseline == baseline:
                return s
        raise KeyError(f"no baseline {baseline!r}; this result has {[s.baseline for s in self.speedups]}")

    def with_bytes(self, bytes_moved: float, source: str) -> BenchResult:
        """A copy whose bytes (and so intensity and GB/s) come from a measurement, e.g. ncu's DRAM bytes."""
        return replace(self, bytes_moved=float(bytes_moved), bytes_source=source)

    # display ----------------------------------------------------------------------------------------------
    def _rates(self) -> str:
        parts = []
        if self.tflops is not None:
            parts.append(f"{self.tflops:.4g} TFLOP/s")
        if self.gbps is not None:
            source = "" if self.bytes_source == "declared" else f" ({self.bytes_source})"
            parts.append(f"{self.gbps:.4g} GB/s{source}")
        return ", ".join(parts)

    def summary(self) -> str:
        """One line: name, median, interquartile range, rates."""
        line = (f"{self.name}: {_ms(self.median_ms)} median ({_ms(self.quantile(0.25))}-{_ms(self.quantile(0.75))} "
                f"interquartile, {self.reps} reps)")
        rates = self._rates()
        return line + (f", {rates}" if rates else "")

    def __str__(self) -> str:
        lines = [self.summary()]
        for b in self.baselines:
            lines.append("  baseline " + b.summary())
        for s in self.speedups:
            lines.append(f"  speed-up {s}")
        for f in self.findings:
            lines.append(f"  NOT TRUSTED, {f}")
        lines.append(f"  {self.device}: {self.method}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return bench_result_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "bench", "version": 1, "title", "name", "device", "method", "median_ms", "min_ms", "mean_ms",
        "quantiles_ms" ({q: ms}), "reps", "rounds", "flops", "bytes", "bytes_source", "tflops", "gbps",
        "intensity", "l2_flush_bytes", "l2_flush", "input_sets", "cuda_graph", "calls_per_replay",
        "baselines" (the same, without "kind"), "speedups" ([{baseline, ratio, low, high, rounds}]),
        "findings" ([{kind, message}]), "trusted", "roofline_floor_ms"}."""
        return {"kind": "bench", "version": 1, "title": f"bench {self.name}", **self._fields_json()}

    def _fields_json(self) -> dict:
        return {
            "name": self.name, "device": self.device, "method": self.method,
            "median_ms": self.median_ms, "min_ms": self.min_ms, "mean_ms": self.mean_ms,
            "quantiles_ms": {str(q): v for q, v in self.quantiles_ms}, "reps": self.reps, "rounds": self.rounds,
            "flops": self.flops, "bytes": self.bytes_moved, "bytes_source": self.bytes_source,
            "tflops": self.tflops, "gbps": self.gbps, "intensity": self.intensity,
            "l2_flush_bytes": self.l2_flush_bytes, "l2_flush": self.l2_flush, "input_sets": self.input_sets,
            "cuda_graph": self.cuda_graph,
            "calls_per_replay": self.calls_per_replay,
            "baselines": [b._fields_json() for b in self.baselines],
            "speedups": [{"baseline": s.baseline, "ratio": s.ratio, "low": s.low, "high": s.high,
                          "rounds": s.rounds} for s in self.speedups],
            "findings": [f.to_json() for f in self.findings], "trusted": self.trusted,
            "roofline_floor_ms": self.roofline_floor_ms,
        }


@dataclass(frozen=True)
class SweepResult:
    """`bench` over a list of sizes or configurations: a table; its notebook view adds a plot like `perf_report`
    (`kernellab.sweep_plot` draws it on your own axes)."""

    x_name: str
    xs: tuple
    results: tuple[BenchResult, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The function's name, then each baseline's."""
        first = self.results[0] if self.results else None
        return () if first is None else (first.name, *(b.name for b in first.baselines))

    def series(self, name: str, metric: str = "ms") -> list[float | None]:
        """One line of the plot: `metric` ("ms", "tflops", "gbps") of function `name` at each x."""
        if metric not in ("ms", "tflops", "gbps"):
            raise BenchError(f"metric must be 'ms', 'tflops' or 'gbps', got {metric!r}")
        out = []
        for r in self.results:
            one = r if r.name == name else next((b for b in r.baselines if b.name == name), None)
            if one is None:
                raise KeyError(f"no function {name!r}; this sweep has {list(self.names)}")
            out.append({"ms": one.median_ms, "tflops": one.tflops, "gbps": one.gbps}[metric])
        return out

    def table(self) -> list[dict]:
        """One row per x: median ms of every function, speed-ups, and rates where flops/bytes were given."""
        rows = []
        for x, r in zip(self.xs, self.results):
            row = {self.x_name: x, f"{r.name} ms": r.median_ms}
            for b in r.baselines:
                row[f"{b.name} ms"] = b.median_ms
            for s in r.speedups:
                row[f"vs {s.baseline}"] = s.ratio
            if r.tflops is not None:
                row[f"{r.name} TFLOP/s"] = r.tflops
            if r.gbps is not None:
                row[f"{r.name} GB/s"] = r.gbps
            rows.append(row)
        return rows

    def __str__(self) -> str:
        rows = self.table()
        if not rows:
            return "sweep: no points"
        cols = list(rows[0])
        cells = [[fmt_cell(row.get(c)) for c in cols] for row in rows]
        widths = [max(len(c), *(len(r[k]) for r in cells)) for k, c in enumerate(cols)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
        lines.append(f"{self.results[0].device}: {self.results[0].method}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return sweep_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """{"kind": "bench", "version": 1, "title", "sweep": {"x_name", "xs" (as strings where not numbers),
        "points" ([one BenchResult's fields per x])}}."""
        xs = [x if isinstance(x, (int, float)) else str(x) for x in self.xs]
        return {"kind": "bench", "version": 1, "title": f"sweep over {self.x_name}",
                "sweep": {"x_name": self.x_name, "xs": xs, "points": [r._fields_json() for r in self.results]}}


# --- the clock ----------------------------------------------------------------------------------------------


class Clock(Protocol):
    """What `bench` needs from a timer: the CUDA one below, or a fake one in tests."""

    device: str
    l2_bytes: int            # the L2 size; input rotation and the flush are sized by it
    flush_bytes: int         # bytes written (or read) before each repetition (0: no flush)
    # optional: flush_kind, "write" (assumed where missing), "clean" or "none"; results report it as l2_flush
    # optional: escaped_ms(calls), the median ms the device stays busy after a call returned (the other_stream
    # probe), and persistence_finding(who), an l2_persistence finding after a reset or None (integrity.py)

    def check_measurable(self, name: str, returned: Any, args: tuple) -> None: ...

    def time_calls(self, calls: Sequence[Callable[[], Any]]) -> list[float]: ...

    def graph(self, calls: Sequence[Callable[[], Any]]) -> Callable[[], Any]: ...

    def describe(self) -> str: ...


class CudaClock:
    """CUDA-event timing on one device, with an L2 flush before each call and the CPU kept ahead of the GPU."""

    def __init__(self, device=None, flush_l2: bool | str = True, spin: bool = True, batch_gpu_ms: float | None = None,
                 duty: float | None = None):
        import torch

        self.flush_kind = flush_kind(flush_l2)

        if not torch.cuda.is_available():
            raise NoGPUError("bench times GPU work with CUDA events, and torch sees no CUDA GPU here; "
                             "run it on a machine with one (kernellab.check works on the CPU)")
        self.torch = torch
        self.dev = cuda_device(device)
        props = torch.cuda.get_device_properties(self.dev)
        self.device = props.name
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
        self.flush_bytes = 2 * self.l2_bytes if self.flush_kind != "none" else 0
        self._flush_buffer = (torch.empty(self.flush_bytes, dtype=torch.int8, device=self.dev)
                              if self.flush_bytes else None)
        self._flush_words = self._flush_buffer.view(torch.int32) if self._flush_buffer is not None else None
        self._init_state(spin, batch_gpu_ms, duty)
        if self._flush_buffer is not None:
            # The flush kernel's first launch loads its module (lazy loading: milliseconds of CPU); done here, it
            # cannot make the first batch's first call look as if it waited for the GPU.
            with torch.cuda.device(self.dev):
                self._flush_buffer.zero_()
                self.flush()
                torch.cuda.synchronize(self.dev)
        self._cycles_per_ms = self._calibrate_sleep() if spin else None

    def _init_state(self, spin: bool, batch_gpu_ms: float | None, duty: float | None) -> None:
        """The batching state, apart from the device (tests build a clock on a simulated GPU with it)."""
        self._cpu_ms_per_call = 0.05          # refined by every batch: how long the CPU takes to queue one call
        self._waiting: set[int] = set()       # ids of calls seen waiting for the GPU (e.g. they call .item())
        self._strikes = 0                     # batches in a row whose first call found the spin already over
        self._gpu_ms: dict[int, float] = {}   # the last GPU time of each call, by id: sizes the next batches
        self.sustained = not spin
        self.batch_gpu_ms = _BATCH_GPU_MS if batch_gpu_ms is None else batch_gpu_ms
        self.duty = _DUTY if duty is None else duty
        self._cycles_per_ms = None

    def _calibrate_sleep(self) -> float | None:
        """Clock cycles per millisecond of `torch.cuda._sleep`, or None where it is missing."""
        torch = self.torch
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return None
        rates = []
        with torch.cuda.device(self.dev):
            # A GPU that idles at a low clock counts fewer cycles per ms until it ramps up: spin ~5 ms (at full
            # clock) first, then keep the fastest of two readings, so that spins are never shorter than intended.
            sleep(10_000_000)
            for _ in range(2):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                cycles = 2_000_000
                start.record()
                sleep(cycles)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
                if ms > 0:
                    rates.append(cycles / ms)
        return max(rates) if rates else None

    def check_measurable(self, name: str, returned: Any, args: tuple) -> None:
        check_measurable(name, returned, args)

    def flush(self) -> None:
        """Queue the L2 flush: write the buffer (dirty lines left for the next call to evict), or read it (the
        previous call's dirty lines written back now; the L2 then holds clean lines)."""
        if self.flush_kind == "write":
            self._flush_buffer.zero_()
        elif self.flush_kind == "clean":
            self._flush_words.amax()

    def time_calls(self, calls: Sequence[Callable[[], Any]]) -> list[float]:
        """GPU milliseconds of each call, flushing L2 before each; batches queued behind a GPU spin."""
        torch = self.torch
        times: list[float] = []
        recent_ms = None          # the median GPU time of this call list's last batch
        with torch.cuda.device(self.dev):
            i = 0
            while i < len(calls):
                spin = self._cycles_per_ms is not None and id(calls[i]) not in self._waiting
                n = self._batch_size(calls[i], recent_ms) if spin else len(calls) - i
                chunk = calls[i:i + n]
                starts = [torch.cuda.Event(enable_timing=True) for _ in chunk]
                ends = [torch.cuda.Event(enable_timing=True) for _ in chunk]
                spin_done, spin_ms, late = None, 0.0, False
                if spin:   # long enough for the CPU to queue the whole batch twice over
                    spin_ms = min(_SLEEP_CAP_MS, max(_SLEEP_MIN_MS, 2 * self._cpu_ms_per_call * len(chunk)))
                    torch.cuda._sleep(int(spin_ms * self._cycles_per_ms))
                    spin_done = torch.cuda.Event()
                    spin_done.record()
                t0 = time.perf_counter()
                for k, (call, s, e) in enumerate(zip(chunk, starts, ends)):
                    if self._flush_buffer is not None:
                        self.flush()
                    s.record()
                    call()
                    e.record()
                    if k == 0 and spin_done is not None and spin_done.query():
                        late = True       # the first call outlasted the spin on the CPU
                queued_ms = (time.perf_counter() - t0) * 1e3
                ends[-1].synchronize()
                batch = [s.elapsed_time(e) for s, e in zip(starts, ends)]
                self._after_batch(chunk, batch, queued_ms, late)
                if spin and self.duty < 1.0:
                    # Idle so that the GPU is busy at most `duty` of the time: without it a power-hungry kernel
                    # brings the GPU to its power cap within ~100 ms and runs slower (sustained=True times that).
                    rest_ms = sum(batch) * (1.0 / self.duty - 1.0) - spin_ms
                    if rest_ms > 0:
                        time.sleep(rest_ms / 1e3)
                times.extend(batch)
                recent_ms = statistics.median(batch)
                i += len(chunk)
        return times

    def _batch_size(self, first: Callable[[], Any], recent_ms: float | None) -> int:
        """How many calls to queue behind one spin: what the CPU can queue in time, and no more GPU work than
        `batch_gpu_ms` (one call while its GPU time is unknown)."""
        n = max(1, int(_SLEEP_CAP_MS / (2 * self._cpu_ms_per_call)))
        if self.batch_gpu_ms > 0:
            gpu_ms = self._gpu_ms.get(id(first), recent_ms)
            n = min(n, 1 if gpu_ms is None else max(1, int(self.batch_gpu_ms / max(gpu_ms, 1e-6))))
        return n

    def _after_batch(self, chunk, batch_ms: list[float], queued_ms: float, late: bool) -> None:
        """Learn from one batch: the CPU's pace, each call's GPU time, and which calls wait for the GPU.

        A first call that outlasts the spin on the CPU either waits for the GPU itself (`.item()`, a synchronize)
        or was slow once (a module loaded, an allocation, the OS): only two such batches in a row mark the calls
        as waiting, so that a one-off does not take the spin away for the rest of the run."""
        for call, ms in zip(chunk, batch_ms):
            self._gpu_ms[id(call)] = ms
        self._strikes = self._strikes + 1 if late else 0
        if self._strikes >= 2:
            self._waiting.update(id(c) for c in chunk)
        if id(chunk[0]) not in self._waiting:   # a one-off only overstates the pace, for one batch: smaller batches
            self._cpu_ms_per_call = max(queued_ms / len(chunk), 1e-3)

    def escaped_ms(self, calls: Sequence[Callable[[], Any]]) -> float:
        """Median milliseconds the device stays busy after each call has returned, beyond what a synchronize costs:
        work on any stream counts (the events of `time_calls` see only the current one). GPU idle before each."""
        torch = self.torch
        out = []
        with torch.cuda.device(self.dev):
            torch.cuda.synchronize(self.dev)
            idle = []
            for _ in range(3):                    # what a synchronize costs with nothing to wait for
                t1 = time.perf_counter()
                torch.cuda.synchronize(self.dev)
                idle.append(time.perf_counter() - t1)
            for call in calls:
                torch.cuda.synchronize(self.dev)
                call()
                t1 = time.perf_counter()
                torch.cuda.synchronize(self.dev)
                out.append(time.perf_counter() - t1)
        return max(0.0, (statistics.median(out) - statistics.median(idle)) * 1e3)

    def persistence_finding(self, who: str):
        """An l2_persistence finding (after a reset) when the context or the timed stream persists L2 lines."""
        stream = self.torch.cuda.current_stream(self.dev).cuda_stream
        return integrity.L2Persistence().finding(stream, who)

    def graph(self, calls: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
        """A zero-argument replay of one CUDA graph holding `calls` in order."""
        torch = self.torch
        with torch.cuda.device(self.dev):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):          # warm on a side stream, as capture requires
                for call in calls[:3]:
                    call()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for call in calls:
                    call()
            torch.cuda.synchronize(self.dev)
        return g.replay

    def describe(self) -> str:
        if not self.flush_bytes:
            flush = "no L2 flush (warm cache)"
        elif self.flush_kind == "clean":
            flush = (f"L2 ({_mib(self.l2_bytes)}) flushed by reading {_mib(self.flush_bytes)} before each "
                     f"repetition (dirty lines written back untimed: the L2 holds clean lines)")
        else:
            flush = (f"L2 ({_mib(self.l2_bytes)}) flushed by writing {_mib(self.flush_bytes)} before each "
                     f"repetition (the L2 left full of dirty lines)")
        if self.sustained:
            ahead = ("sustained: calls back to back with no idle GPU between them, so the figure is the GPU's "
                     "under continuous load (power- and clock-limited)")
        elif not self._cycles_per_ms:
            ahead = "no GPU spin (torch.cuda._sleep missing): launch overhead may be included"
        else:
            ahead = "the GPU kept behind the CPU by a queued spin, so launch overhead stays out"
            if self.batch_gpu_ms > 0 or self.duty < 1.0:
                ahead += (f"; batches of at most {self.batch_gpu_ms:g} ms of GPU work, the GPU busy at most "
                          f"{100 * self.duty:.0f} % of the time (below its power cap)")
            if self._waiting:
                ahead += " (except for calls that wait for the GPU themselves)"
        return f"CUDA events, {flush}, {ahead}"


FLUSH_KINDS = {True: "write", "write": "write", "clean": "clean", False: "none", None: "none", "none": "none"}


def flush_kind(flush_l2) -> str:
    """bench's `flush_l2` as "write", "clean" or "none"; a BenchError for anything else."""
    try:
        return FLUSH_KINDS[flush_l2]
    except (KeyError, TypeError):
        raise BenchError(f"flush_l2={flush_l2!r} is not a flush: pass True or \"write\" (the default: write a buffer "
                         f"twice the L2, leaving it dirty, as Triton's do_bench), \"clean\" (read it: the L2 holds "
                         f"clean lines, the kernel's own cost) or False (no flush, warm cache)") from None


def cuda_device(device=None):
    """`device` (an index, "cuda:1", a torch.device) as a torch.device; None is the current CUDA device."""
    import torch

    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def check_measurable(name: str, returned: Any, args: tuple) -> None:
    """Refuse a function whose first call shows no GPU work to time."""
    import torch

    def on_cuda(v) -> bool:
        if isinstance(v, torch.Tensor):
            return v.is_cuda
        if hasattr(v, "__cuda_array_interface__"):
            return True
        if isinstance(v, (list, tuple)):
            return any(on_cuda(x) for x in v)
        return False

    def on_cpu(v) -> bool:
        if isinstance(v, torch.Tensor):
            return not v.is_cuda
        if isinstance(v, np.ndarray):
            return True
        if isinstance(v, (list, tuple)):
            return any(on_cpu(x) for x in v)
        return False

    if on_cpu(returned) or (returned is None and on_cpu(args) and not on_cuda(args)):
        raise BenchError(f"{name} runs on the CPU (it {'returned' if returned is not None else 'got'} CPU "
                         f"tensors), and bench times GPU work with CUDA events; make its inputs with "
                         f"device='cuda' (or .cuda()) and time CPU code with %timeit")
    if returned is None and not on_cuda(args):
        raise BenchError(f"{name} returned None and got no CUDA tensors, so there is nothing on the GPU to time; "
                         f"return the output tensor, or pass the CUDA tensors it writes as inputs")
    if returned is not None and not on_cuda(returned):
        raise BenchError(f"{name} returned a {type(returned).__name__}, nothing measurable on the GPU (a Python "
                         f"number means it already waited for the GPU); return the output tensor(s) instead")


# --- bench and sweep ----------------------------------------------------------------------------------------


def bench(fn: Callable, inputs=(), *, baselines: dict[str, Callable] | None = None, flops=None, bytes=None,
          warmup_ms: float = 25.0, rep_ms: float = 100.0, rounds: int = 10, min_reps: int = 20,
          max_reps: int = 10_000, quantiles: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 0.9),
          flush_l2: bool | str = True, rotate: bool = True, cuda_graph: bool = False, seed: int = 0,
          generator_device: str = "cpu", name: str | None = None, device=None,
          timer: Clock | None = None, isolate: bool | None = None, sustained: bool = False,
          reference: Callable | None = None, ceilings=None, verify: bool = True) -> BenchResult:
    """GPU time of `fn(*args)` (and of each `baselines` callable, on the same arguments, in the same run).

    `inputs` is the argument tuple, or `inputs(generator)` returning one (then fresh sets can be made for
    rotation). `flops` and `bytes` (per call) are numbers or callables of the arguments; with them the result
    gives TFLOP/s, GB/s and a point on `kernellab.roofline`. `timer` replaces the CUDA clock (tests).
    flush_l2: True or "write" (default) writes a buffer twice the L2's size before each repetition, leaving dirty
    lines that the timed call pays to evict; "clean" reads it instead (the L2 then holds clean lines); False times
    a warm cache.
    isolate=True (or the notebook-wide isolation setting) first runs `fn` once with its kernels in a worker
    process, so that a faulty kernel is caught there; the timing itself always runs in this process, where
    CUDA events can see the kernels.
    By default calls run in batches of at most 5 ms of GPU work with the GPU idle at least half the time (a queued
    spin keeps launch overhead out), so a heavy kernel is timed below the GPU's power cap, the state Nsight Compute
    measures, and the same way every run. `sustained=True` times calls
    back to back after a warm-up of at least 500 ms, as a long training loop sees them: a power-hungry kernel
    (a bf16 matmul on an H200) then runs ~15 % slower because the GPU reaches its power cap.
    Defences against a function that cheats the timing (docs/GRADING.md), each an entry of `result.findings` that
    makes `result.trusted` False: timing functions replaced ("timer_patched"; the originals are put back), a thread
    left running ("background_thread"), persisting L2 set up ("l2_persistence"; reset before timing), GPU work
    outside the timed stream ("other_stream": a device-synchronised probe takes longer than the events say), with
    `verify` (default) the outputs of a sample of timed calls against `reference(*args)` where given, and an answer
    that survives its inputs being refilled in place ("cached_result": against `reference`, else against the
    function on a fresh copy), and a median below the roofline's
    least time for `flops` and `bytes` ("impossible_speed"; `ceilings`: a DeviceCeilings, default the measured ones
    cached on disk or the datasheet's of the device).
    """
    _validate_options(fn, baselines, warmup_ms, rep_ms, rounds, min_reps, max_reps, quantiles)
    flush_kind(flush_l2)

    guard = integrity.TimingGuard(extra=_guarded())          # before anything of the function's runs
    threads = integrity.ThreadWatch()
    if (_worker.settings.isolate if isolate is None else isolate) and timer is None:
        with _worker.isolation(True):
            probe = _input_sets(inputs, 0, False, seed, generator_device)[0]
            fn(*probe)
    with _worker.isolation(False):
        return _bench(fn, inputs, baselines, flops, bytes, warmup_ms, rep_ms, rounds, min_reps, max_reps, quantiles,
                      flush_l2, rotate, cuda_graph, seed, generator_device, name, device, timer, sustained,
                      reference, ceilings, verify, guard, threads)


def _bench(fn, inputs, baselines, flops, bytes, warmup_ms, rep_ms, rounds, min_reps, max_reps, quantiles, flush_l2,
           rotate, cuda_graph, seed, generator_device, name, device, timer, sustained=False, reference=None,
           ceilings=None, verify=True, guard=None, threads=None) -> BenchResult:
    guard = guard or integrity.TimingGuard(extra=_guarded())          # before anything of the function's runs
    threads = threads or integrity.ThreadWatch()
    findings: list = []
    clock = timer if timer is not None else CudaClock(device, flush_l2=flush_l2, spin=not sustained)
    if sustained:
        warmup_ms = max(warmup_ms, 500.0)
    arg_sets = _input_sets(inputs, clock.l2_bytes, rotate, seed, generator_device)
    work = {"flops": _per_call(flops, "flops", arg_sets[0]), "bytes": _per_call(bytes, "bytes", arg_sets[0])}

    default_name = getattr(fn, "__name__", "fn")
    funcs = {name or ("fn" if default_name == "<lambda>" else default_name): fn}
    if funcs.keys() & (baselines or {}).keys():
        raise BenchError(f"a baseline has the function's own name {next(iter(funcs))!r}; give it another name")
    funcs.update(baselines or {})

    # Persisting L2 left by earlier work (not the function's): reset, no finding.
    if hasattr(clock, "persistence_finding"):
        clock.persistence_finding("earlier work")
    # First call (compiles, autotunes) and the refusal of what cannot be timed.
    for fname, f in funcs.items():
        clock.check_measurable(fname, f(*arg_sets[0]), arg_sets[0])
    main_name = next(iter(funcs))
    _integrity(findings, guard, threads, clock, "after the first call")

    # From here on, kernellab kernels launched by the calls do not wait for their kernel (that would put launch
    # overhead into every repetition, and is illegal during graph capture); the first call above did wait.
    timed_outputs: dict[int, Any] = {}      # the latest output of the function per input set (checked after)
    with deferred_sync(), _faults_named(list(funcs)):
        # Each function becomes a list of zero-argument calls, one per input set (or one graph replay each).
        # A graph holds enough calls for about 0.5 ms of work, and every input set at least once.
        per_call: dict[str, list[Callable[[], Any]]] = {}
        per_replay = {fname: 1 for fname in funcs}
        for fname, f in funcs.items():
            calls = ([_bind_keeping(f, a, timed_outputs, k) for k, a in enumerate(arg_sets)] if fname == main_name
                     else [_bind(f, a) for a in arg_sets])
            if cuda_graph:
                est = statistics.median(clock.time_calls(calls[:1] * 5))
                per_replay[fname] = max(len(calls), _clamp(math.ceil(0.5 / max(est, 1e-4)), 1, 1000))
                calls = [clock.graph(_cycle(calls, per_replay[fname]))]
            per_call[fname] = calls

        # Warm-up by time, then the number of repetitions from the warmed-up time.
        reps: dict[str, int] = {}
        for fname, calls in per_call.items():
            est = statistics.median(clock.time_calls(_cycle(calls, 3)))
            warm = clock.time_calls(_cycle(calls, _clamp(math.ceil(warmup_ms / max(est, 1e-6)), 1, max_reps)))
            est = statistics.median(warm[len(warm) // 2:])
            reps[fname] = _clamp(round(rep_ms / max(est, 1e-6)), min(max(min_reps, rounds), max_reps), max_reps)

        # Rounds alternate between the functions; each keeps its own rotation position.
        times = {f: [] for f in funcs}
        round_medians = {f: [] for f in funcs}
        for r in range(rounds):
            for fname, calls in per_call.items():
                n = reps[fname] // rounds + (1 if r < reps[fname] % rounds else 0)
                start = len(times[fname])
                batch = [calls[(start + k) % len(calls)] for k in range(n)]
                t = [ms / per_replay[fname] for ms in clock.time_calls(batch)]
                times[fname].extend(t)
                round_medians[fname].append(statistics.median(t))

    if len(times[main_name]) and hasattr(clock, "escaped_ms"):
        with deferred_sync():                   # a kernellab launch on a side stream must not wait for itself here
            escaped = clock.escaped_ms(per_call[main_name][:1] * 5)
        timed = statistics.median(times[main_name])
        if escaped > 2 * timed + _ESCAPE_SLACK_MS:
            findings.append(integrity.IntegrityFinding(
                "other_stream", f"with the device synchronised after each call, {main_name} keeps the GPU busy "
                                f"{escaped * 1e3:.3g} us after it returns, but its timed stream saw {timed * 1e3:.3g} "
                                f"us: its work runs on another stream (or is launched later), outside the timing"))
    if verify and not cuda_graph and reference is not None:
        cached = _verify_timed_outputs(main_name, arg_sets, timed_outputs, reference)
        if cached is not None:
            findings.append(cached)
    if verify and not cuda_graph and not any(f.kind == "cached_result" for f in findings):
        cached = _verify_fresh_inputs(fn, main_name, inputs, arg_sets, reference, seed, generator_device)
        if cached is not None:
            findings.append(cached)
    _integrity(findings, guard, threads, clock, "after timing")     # last: nothing of the function's runs after it

    method = (f"{clock.describe()}; warm-up {warmup_ms:g} ms; {rounds} rounds alternating "
              f"{'the function and its baselines' if len(funcs) > 1 else 'repetitions'}")
    if len(arg_sets) > 1:
        method += f"; {len(arg_sets)} input sets in turn"
    if cuda_graph:
        method += ("; CUDA-graph replays of many calls, each replay's time divided among its calls (L2 is flushed "
                   "before each replay, not between the calls inside it)")
    results = {f: _result(f, times[f], round_medians[f], rounds, quantiles, clock, method, work,
                          len(arg_sets), cuda_graph, per_replay[f]) for f in funcs}
    main = results.pop(main_name)
    speedups = tuple(_speedup(b, round_medians[b], round_medians[main_name]) for b in results)
    ceil = _ceilings(clock, ceilings)
    dram = bool(clock.flush_bytes) or len(arg_sets) > 1
    floor = integrity.roofline_floor_ms(main.flops, main.bytes_moved, ceil, dram=dram)
    too_fast = integrity.impossible_speed_finding(main.median_ms, main.flops, main.bytes_moved, ceil, dram=dram)
    if too_fast is not None:
        findings.append(too_fast)
    return replace(main, baselines=tuple(results.values()), speedups=speedups, findings=tuple(findings),
                   roofline_floor_ms=floor)


def sweep(fn: Callable, xs: Sequence, inputs: Callable, *, baselines: dict[str, Callable] | None = None,
          flops=None, bytes=None, x_name: str = "x", progress: bool = True, **options) -> SweepResult:
    """`bench` at each x in `xs`, with `inputs(x, generator)` giving the arguments there.

    For a sweep over configurations, let `inputs` put the configuration among the arguments, e.g.
    `inputs=lambda block, g: (x, y, out, block)` and `fn=lambda x, y, out, block: ...`.
    `options` go to `bench` (warmup_ms, rep_ms, flush_l2, cuda_graph, timer, ...).
    """
    if not callable(inputs):
        raise BenchError("sweep needs inputs(x, generator) -> argument tuple, e.g. "
                         "lambda n, g: (torch.randn(n, generator=g).cuda(),)")
    xs = tuple(xs)
    if not xs:
        raise BenchError("sweep needs at least one x")
    results = []
    for x in _progress(xs, progress, x_name):
        results.append(bench(fn, _inputs_at(inputs, x), baselines=baselines, flops=flops, bytes=bytes, **options))
    return SweepResult(x_name=x_name, xs=xs, results=tuple(results))


# --- helpers --------------------------------------------------------------------------------------------------


_ESCAPE_SLACK_MS = 0.01     # what a synchronize costs beyond the work it waits for (an H100: ~5-8 us)


def _integrity(findings: list, guard, threads, clock, when: str) -> None:
    """The host-side defences at one point of a bench: patched timers (put back), threads left running, persisting L2
    (reset); each finding once."""
    seen = {f.kind for f in findings}
    patched = guard.finding(when)
    if patched is not None and patched.kind not in seen:
        findings.append(patched)
    thread = threads.finding("the function", grace_s=0.05)
    if thread is not None and "background_thread" not in seen:
        if not integrity.environment_threads(threads.new()):
            findings.append(thread)
    persistence = getattr(clock, "persistence_finding", None)
    if persistence is not None:
        l2 = persistence(f"the function ({when})")
        if l2 is not None and "l2_persistence" not in seen:
            findings.append(l2)


def _guarded() -> list:
    """bench's own functions that a timing goes through, for integrity.TimingGuard."""
    here = sys.modules[__name__]
    return [(here, n) for n in ("_result", "_speedup", "_cycle", "_bind", "_bind_keeping", "bench", "_bench")] + \
        [(CudaClock, n) for n in ("time_calls", "flush", "escaped_ms", "_after_batch")]


def _bind_keeping(f, args, store: dict, k: int):
    """`_bind`, keeping the latest return value in store[k] (a reference, no copy)."""
    def call():
        out = f(*args)
        store[k] = out
        return out
    return call


_TIMED_SAMPLE = 3       # input sets whose timed output is checked


def _verify_timed_outputs(name, arg_sets, outputs: dict, reference):
    """cached_result when the output a timed call returned disagrees with `reference` on its input set. Checked on a
    few sets, and only where each set's output has memory of its own (a function that reuses one output buffer across
    sets is not judged here)."""
    import torch

    try:
        got = {k: as_outputs(v, name) for k, v in outputs.items() if v is not None}
    except Exception:
        return None
    got = {k: v for k, v in got.items() if v}
    ptrs = [tuple(t.data_ptr() for t in v) for v in got.values()]
    if not got or len(set(ptrs)) != len(ptrs):
        return None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    for k in sorted(got)[:_TIMED_SAMPLE]:
        try:
            want = as_outputs(reference(*_clone_tensors(arg_sets[k])), "reference")
        except Exception:
            return None
        if not want or len(want) != len(got[k]):
            continue
        for j, (g, w) in enumerate(zip(got[k], want)):
            if g.shape != w.shape:
                continue
            bad = mismatch_count(g, w)
            if bad:
                return integrity.IntegrityFinding(
                    "cached_result", f"a timed call of {name} returned {bad:,} elements of output {j} that disagree "
                                     f"with the reference on its inputs (input set {k}): the timed calls did not all "
                                     f"compute")
    return None


def _verify_fresh_inputs(fn, name, inputs, arg_sets, reference, seed, generator_device):
    """cached_result when `fn`, after its first input set is refilled in place with new values (same memory, same
    shapes), still answers for the old values: checked against `reference` on the new values where given, else
    against `fn` itself on a fresh copy of them (other memory)."""
    import torch

    if not callable(inputs):
        return None
    try:
        fresh = inputs(torch.Generator(device=generator_device).manual_seed(seed + 7919))
        fresh = (fresh,) if isinstance(fresh, torch.Tensor) else tuple(fresh)
        target = arg_sets[0]
        if len(fresh) != len(target):
            return None
        for t, f in zip(target, fresh):
            if isinstance(t, torch.Tensor) and isinstance(f, torch.Tensor) and t.shape == f.shape:
                t.copy_(f)
        got = as_outputs(fn(*target), name)
        want = as_outputs(reference(*_clone_tensors(target)) if reference is not None else
                           fn(*_clone_tensors(target)), "reference")
    except Exception:
        return None
    if not got or not want or len(got) != len(want):
        return None
    for j, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or not g.is_floating_point() and g.dtype != w.dtype:
            continue
        bad = mismatch_count(g, w)
        if bad:
            against = "the reference" if reference is not None else "itself on a fresh copy of them"
            return integrity.IntegrityFinding(
                "cached_result", f"after its inputs were refilled in place with new values, {name} returned "
                                 f"{bad:,} elements of output {j} that disagree with {against}: it "
                                 f"answers from a cache (by pointer, shape or id), so its timed calls did no work")
    return None


def _ceilings(clock, ceilings):
    """The roofline ceilings for the impossible-speed bound: given, else the datasheet's for the clock's device (None
    where unknown). A datasheet's peaks are at or above what any measurement reaches: the bound never flags too much."""
    if ceilings is not None:
        return ceilings
    return datasheet_ceilings(getattr(clock, "device", "") or "")


@contextlib.contextmanager
def _faults_named(names: list[str]):
    """A kernel that faults in a later repetition (the first call ran clean and waited) surfaces at an event's
    synchronize as a bare CUDA error: say what happened and what it means for this process."""
    try:
        yield
    except KernellabError:
        raise
    except Exception as exc:
        if not is_sticky(exc):
            raise
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchError(
            f"a kernel faulted while bench timed {', '.join(names)} ({text}); the first call of each ran clean, so "
            f"the fault depends on the data or on timing (a race). The error is sticky: this process's CUDA context "
            f"is lost; restart the notebook kernel, then find the fault with `kernel.sanitize(grid, block, *args)` "
            f"(compute-sanitizer, in a new process) on the data that faulted.{unwaited_note()}", sticky=True,
            cuda_error=text) from None


def _inputs_at(inputs, x):
    return lambda g: inputs(x, g)


def _bind(f, args):
    return lambda: f(*args)


def _cycle(calls, n):
    return [calls[k % len(calls)] for k in range(n)]


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


def _result(name, times, round_medians, rounds, quantiles, clock, method, work, input_sets, cuda_graph,
            calls_per_replay) -> BenchResult:
    arr = np.asarray(times, dtype=np.float64)
    return BenchResult(
        name=name, median_ms=float(np.median(arr)), min_ms=float(arr.min()), mean_ms=float(arr.mean()),
        quantiles_ms=tuple((float(q), float(np.quantile(arr, q))) for q in quantiles), reps=len(times),
        rounds=rounds, device=clock.device, method=method, flops=work["flops"], bytes_moved=work["bytes"],
        l2_flush_bytes=clock.flush_bytes,
        l2_flush=getattr(clock, "flush_kind", "write" if clock.flush_bytes else "none"), input_sets=input_sets, cuda_graph=cuda_graph,
        calls_per_replay=calls_per_replay, times_ms=tuple(float(t) for t in times),
        round_medians_ms=tuple(round_medians))


def _speedup(baseline: str, base_rounds: list[float], fn_rounds: list[float]) -> Speedup:
    ratios = [b / f for b, f in zip(base_rounds, fn_rounds) if f > 0]
    if not ratios:
        return Speedup(baseline, math.nan, math.nan, math.nan, 0)
    return Speedup(baseline, float(statistics.median(ratios)), float(min(ratios)), float(max(ratios)), len(ratios))


def _input_sets(inputs, l2_bytes: int, rotate: bool, seed: int, generator_device: str) -> list[tuple]:
    """The argument sets used in turn: one, or enough that together they are twice the L2 size."""
    import torch

    def make(k: int) -> tuple:
        if callable(inputs):
            args = inputs(torch.Generator(device=generator_device).manual_seed(seed + k))
        elif k == 0:
            args = inputs
        else:
            args = _clone_tensors(inputs)
        if isinstance(args, torch.Tensor):
            args = (args,)
        if not isinstance(args, (tuple, list)):
            raise BenchError(f"inputs must be an argument tuple or inputs(generator) returning one; got a "
                             f"{type(args).__name__}")
        return tuple(args)

    first = make(0)
    size = _tensor_bytes(first)
    if not rotate or size == 0 or size >= l2_bytes:
        return [first]
    count = min(_MAX_INPUT_SETS, math.ceil(2 * l2_bytes / size))
    return [first] + [make(k) for k in range(1, count)]


def _tensor_bytes(v) -> int:
    import torch

    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(_tensor_bytes(x) for x in v)
    if isinstance(v, dict):
        return sum(_tensor_bytes(x) for x in v.values())
    return 0


def _clone_tensors(v):
    import torch

    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_clone_tensors(x) for x in v)
    if isinstance(v, dict):
        return {k: _clone_tensors(x) for k, x in v.items()}
    return v


def _per_call(value, what: str, args: tuple) -> float | None:
    if value is None:
        return None
    v = value(*args) if callable(value) else value
    if not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v < 0:
        raise BenchError(f"{what} must be a non-negative number per call (or a callable of the arguments "
                         f"giving one), got {v!r}")
    return float(v)


def _validate_options(fn, baselines, warmup_ms, rep_ms, rounds, min_reps, max_reps, quantiles) -> None:
    if not callable(fn):
        raise BenchError(f"fn must be callable, got {type(fn).__name__}")
    if baselines is not None:
        if not isinstance(baselines, dict):
            raise BenchError("baselines must map names to callables, e.g. {'torch': torch.add}")
        for k, v in baselines.items():
            if not callable(v):
                raise BenchError(f"baseline {k!r} must be callable, got {type(v).__name__}")
    for what, v in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)):
        if not isinstance(v, (int, float)) or v < 0:
            raise BenchError(f"{what} must be a non-negative number of milliseconds, got {v!r}")
    for what, v in (("rounds", rounds), ("min_reps", min_reps), ("max_reps", max_reps)):
        if not isinstance(v, int) or v < 1:
            raise BenchError(f"{what} must be a positive integer, got {v!r}")
    if max_reps < rounds:
        raise BenchError(f"max_reps ({max_reps}) must be at least rounds ({rounds}): every round needs a repetition")
    if any(not (0 <= q <= 1) for q in quantiles):
        raise BenchError(f"quantiles must lie in [0, 1], got {tuple(quantiles)}")


def _progress(xs, enabled: bool, label: str):
    if not enabled:
        return xs
    try:
        from tqdm.auto import tqdm
    except ImportError:        # tqdm is optional: no bar
        return xs
    return tqdm(xs, desc=f"sweep {label}", leave=False)


def _ms(v: float) -> str:
    if v >= 1:
        return f"{v:.4g} ms"
    if v >= 1e-3:
        return f"{v * 1e3:.4g} us"
    return f"{v * 1e6:.4g} ns"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


