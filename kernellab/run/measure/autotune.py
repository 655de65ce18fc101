"""Autotune a kernel over configurations: compile them in parallel, prune by resources before any launch, check the
survivors against a reference, time them with `bench`, and keep the table on disk.

How `autotune(source, configs, kernel=, launch=, inputs=, ...)` goes:
1. Where: this machine's GPU, or with `executor=` the workers' (one probe task asks a worker which GPU and arch it has).
2. Compile. Each configuration's entries become `-D NAME=VALUE` defines, or template arguments where `kernel` names a
   template (`template <int BM, int BN> __global__ void sgemm(...)` takes the entries named BM and BN; NVRTC
   instantiates it from the name expression `sgemm<64, 128>`). NVRTC is CPU-bound, so the configurations compile in
   parallel: in a process pool sized to this machine, or on the executor's workers. One that does not compile is a
   pruned row holding the compiler's message.
3. Prune, before any launch, with the reason: spills, local memory, shared memory over the arch's per-block limit, more
   threads than the kernel allows, zero occupancy, and optionally occupancy below `min_occupancy`. The threads and the
   dynamic shared memory come from the configuration's own launch: `launch(k, config, *args)` is called with a stand-in
   for `k` that notes `k[grid, block, shared_bytes](...)` and launches nothing.
4. Check each survivor once against `reference` (kernellab.check), its launches isolated in a worker process
   (kernellab.run.launch.worker): a faulting configuration is a row, never the end of the sweep.
5. Time the configurations that passed with kernellab.bench, the baselines in the same run on the same GPU.
6. Cache: each row is kept (kernellab's compile cache, in memory and on disk), keyed by the source, the configuration,
   the options, the arch, the device and the code of launch, inputs, reference and baselines with the numbers they read
   (so the input shapes): running the cell again costs nothing.
With no GPU the stages up to the timing run (CUDA C++ is compiled and pruned; Numba kernels in the simulator are also
checked) and the result says what did not run and why.

With `executor=` (any concurrent.futures.Executor; Dask's `Client(...).get_executor()` for a cluster, one worker per
GPU with dask-cuda's LocalCUDACluster), the compiles and the per-configuration check-and-time tasks run on the workers,
each timed on its worker's GPU; results stream back to the progress bar. On a Dask pool no stage waits for the whole
previous one: a configuration's check-and-time goes out as soon as it compiled and survived the pruning, and where
several workers share a GPU, one of them (the GPU's lane) takes the checks and timings, ahead of the compiles queued
there, while the others compile; a lock per GPU keeps any two timings on one GPU apart whatever runs them. Each row
records when and on which worker it compiled and was checked and timed (`compiled_at`, `measured_at`). Every row names
its GPU, and the table says so when rows were timed on more than one (the best is then the best speed-up against the
first baseline, a ratio taken on one GPU in one run, rather than the shortest time).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import socket
import statistics
import time
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ... import report
from ...analysis.arch import DEFAULT_ARCH, base_arch, get_arch, normalize_arch
from ...analysis.occupancy import occupancy
from ...compile import cache as _cache
from ...compile.nvrtc import CompileOutput, compile_cached, compile_key, nvrtc_version
from ...compile.signature import split_top_level, strip_comments_and_strings
from ...errors import CompileError, KernellabError, LaunchError
from .. import fanout
from ..launch import device as _device, worker as _worker
from ..launch.launch import launch_dims
from ..sim.numba_sim import simulator_lock
from .bench import bench
from .check import check

ROW_FORMAT = 3                # bump when AutotuneRow changes: cached rows of another format are not reused
DEFAULT_CHECK = {"trials": 1}  # "check each survivor once": one fresh input set (kernellab.check's default is 5)


class AutotuneError(KernellabError, ValueError):
    """`autotune` was called with something it cannot use: the configurations, the kernel name, the callables."""


# --- results ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchShape:
    """One launch a configuration asks for, as recorded before anything runs."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0          # dynamic shared memory per block

    @property
    def threads(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class AutotuneRow:
    """One configuration: what it costs, whether it was pruned (and why), its check and its time."""

    config: dict
    registers: int | None = None           # per thread
    shared_bytes: int | None = None        # static shared memory per block (ptxas's figure)
    dynamic_shared_bytes: int | None = None  # asked for by the configuration's launch
    local_bytes: int | None = None         # stack frame per thread
    spill_bytes: int | None = None         # spill stores + loads per thread
    block: tuple[int, int, int] | None = None
    occupancy: float | None = None         # theoretical, 0..1, at the launch's block and shared memory
    limiter: str | None = None             # what bounds the occupancy: warps, registers, shared_memory, blocks
    pruned: str | None = None              # why it was not launched, or None
    check: str | None = None               # "passed", "failed: ...", "fault: ...", "error: ...", "not run: ..."
    median_ms: float | None = None
    spread: float | None = None            # interquartile range / median of the repetitions
    speedups: tuple = ()                   # kernellab.run.measure.bench.Speedup per baseline: > 1 is faster than it
    baseline_ms: tuple[tuple[str, float], ...] = ()  # each baseline's median in the same run
    device: str | None = None              # the GPU model it ran on
    gpu: str | None = None                 # which GPU: model, host and PCI bus id
    worker: str | None = None              # which process (a Dask worker's address, or host:pid)
    symbol: str | None = None              # the kernel's entry symbol (template instances are mangled)
    compile_ms: float | None = None
    timed_at: tuple[float, float] | None = field(default=None, repr=False, compare=False)  # wall clock, for overlap
    error: str | None = field(default=None, repr=False)   # the whole compiler message, fault or exception
    check_report: Any = field(default=None, repr=False, compare=False)  # kernellab.CheckReport
    bench: Any = field(default=None, repr=False, compare=False)          # kernellab.BenchResult
    note: str | None = None                 # why a row that passed was not timed (no GPU, the simulator, ...)
    cached: bool = False                    # read from the cache, not run in this call
    rerun: str | None = None                # run again elsewhere: its worker died or was restarted (why)
    # when and where each job ran (wall clock, time.time(), of the process that ran it; one host's processes agree):
    compiled_at: tuple[float, float] | None = field(default=None, repr=False, compare=False)   # compile start, end
    compile_worker: str | None = field(default=None, repr=False, compare=False)
    measured_at: tuple | None = field(default=None, repr=False, compare=False)  # check-and-time: start, GPU held, end

    @property
    def timed(self) -> bool:
        return self.median_ms is not None

    @property
    def label(self) -> str:
        """'BM=64, BN=128'."""
        return config_label(self.config)

    def speedup(self, baseline: str):
        """The Speedup against that baseline, or None where this row was not timed."""
        return next((s for s in self.speedups if s.baseline == baseline), None)

    @property
    def status(self) -> str:
        """'timed', 'pruned', 'failed' (the check failed or the kernel faulted), 'error' (something else raised) or
        'not run' (no GPU here, or not timed: see `note`)."""
        if self.pruned:
            return "pruned"
        if self.timed:
            return "timed"
        if self.check and not self.check.startswith(("passed", "not run")):
            return "failed"
        if self.error:
            return "error"
        return "not run"

    def to_json(self) -> dict:
        return {"config": {k: _json_value(v) for k, v in self.config.items()}, "registers": self.registers,
                "shared_bytes": self.shared_bytes, "dynamic_shared_bytes": self.dynamic_shared_bytes,
                "local_bytes": self.local_bytes, "spill_bytes": self.spill_bytes,
                "block": list(self.block) if self.block else None, "occupancy": self.occupancy,
                "limiter": self.limiter, "pruned": self.pruned, "check": self.check, "median_ms": self.median_ms,
                "spread": self.spread, "speedups": {s.baseline: s.ratio for s in self.speedups},
                "device": self.device, "gpu": self.gpu, "worker": self.worker, "symbol": self.symbol,
                "status": self.status, "note": self.note, "error": self.error, "cached": self.cached,
                "rerun": self.rerun, "compile_ms": self.compile_ms,
                "compiled_at": list(self.compiled_at) if self.compiled_at else None,
                "compile_worker": self.compile_worker,
                "measured_at": list(self.measured_at) if self.measured_at else None,
                "timed_at": list(self.timed_at) if self.timed_at else None}


@dataclass(frozen=True)
class AutotuneBest:
    """The winning configuration and its compiled kernel."""

    config: dict
    kernel: Any
    row: AutotuneRow
    ranked_by: str                          # "median_ms" or "speed-up vs <baseline>"

    def __str__(self) -> str:
        t = f"{self.row.median_ms:.4g} ms" if self.row.median_ms is not None else "untimed"
        sp = "".join(f", {s.ratio:.3g}x vs {s.baseline}" for s in self.row.speedups)
        return f"best: {self.row.label} ({t}{sp}; ranked by {self.ranked_by})"


@dataclass(frozen=True)
class AutotuneResult:
    """The table of an autotune: `.rows` (one per configuration, in the order given), `.best`, and what was run."""

    kernel: str
    arch: str
    rows: tuple[AutotuneRow, ...]
    baselines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    stage_s: tuple[tuple[str, float], ...] = ()   # wall seconds of each stage of this call
    _kernel_for: Callable | None = field(default=None, repr=False, compare=False)

    # the answer --------------------------------------------------------------------------------------------
    @property
    def devices(self) -> tuple[str, ...]:
        """The distinct GPUs (model, host and bus id) that timed rows ran on."""
        return tuple(dict.fromkeys(r.gpu for r in self.rows if r.timed and r.gpu))

    @property
    def ranked_by(self) -> str:
        """How `best` is chosen: the shortest median time on one GPU; across several GPUs, the best speed-up against
        the first baseline (a ratio taken on one GPU in one run) where there is one."""
        if len(self.devices) > 1 and self.baselines:
            return f"speed-up vs {self.baselines[0]}"
        return "median_ms"

    @functools.cached_property
    def best(self) -> AutotuneBest | None:
        """The best timed configuration that passed its check (None when nothing was timed), with its kernel."""
        ok = [r for r in self.rows if r.timed and (r.check is None or r.check == "passed")]
        if not ok:
            return None
        if self.ranked_by == "median_ms":
            row = min(ok, key=lambda r: r.median_ms)
        else:
            base = self.baselines[0]
            row = max(ok, key=lambda r: r.speedup(base).ratio if r.speedup(base) else -math.inf)
        kernel = self._kernel_for(row) if self._kernel_for is not None else None
        return AutotuneBest(config=dict(row.config), kernel=kernel, row=row, ranked_by=self.ranked_by)

    @property
    def parameter(self) -> str | None:
        """The configuration entry that matters most: the one whose values explain the largest share of the variance
        of log(median time) over the timed rows (None with fewer than three timed rows)."""
        ranked = self.parameters()
        return ranked[0][0] if ranked else None

    def parameters(self) -> list[tuple[str, float]]:
        """(entry, share of the variance of log time its values explain), largest first, over the timed rows."""
        timed = [r for r in self.rows if r.timed and r.median_ms > 0]
        if len(timed) < 3:
            return []
        logs = [math.log(r.median_ms) for r in timed]
        mean = statistics.fmean(logs)
        total = sum((v - mean) ** 2 for v in logs)
        if total <= 0:
            return []
        out = []
        for key in dict.fromkeys(k for r in timed for k in r.config):
            groups: dict = {}
            for r, v in zip(timed, logs):
                groups.setdefault(_hashable(r.config.get(key)), []).append(v)
            if len(groups) < 2:
                continue
            between = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups.values())
            out.append((key, between / total))
        return sorted(out, key=lambda kv: -kv[1])

    def counts(self) -> dict[str, int]:
        """How many rows are timed, pruned, failed, not run and in error."""
        out = {"timed": 0, "pruned": 0, "failed": 0, "not run": 0, "error": 0}
        for r in self.rows:
            out[r.status] += 1
        return out

    def row(self, **config) -> AutotuneRow:
        """The row of the configuration with these entries (all of them given)."""
        for r in self.rows:
            if r.config == config:
                return r
        raise KeyError(f"no configuration {config_label(config)}; the configurations are "
                       f"{', '.join('{' + r.label + '}' for r in self.rows[:8])}{' ...' if len(self.rows) > 8 else ''}")

    # display ---------------------------------------------------------------------------------------------------
    def headline(self) -> str:
        c = self.counts()
        where = ", ".join(dict.fromkeys(r.device for r in self.rows if r.device)) or "no GPU"
        parts = [f"{c[k]} {k}" for k in ("timed", "pruned", "failed", "not run", "error") if c[k]]
        head = f"autotune {self.kernel}: {len(self.rows)} configurations on {where} ({self.arch}): {', '.join(parts)}"
        cached = sum(r.cached for r in self.rows)
        if cached:
            head += f"; {cached} from the cache"
        reruns = sum(r.rerun is not None for r in self.rows)
        if reruns:
            head += f"; {reruns} run again after a lost worker"
        return head

    def _display_rows(self) -> list[AutotuneRow]:
        order = {"timed": 0, "failed": 1, "not run": 2, "error": 3, "pruned": 4}
        return sorted(self.rows, key=lambda r: (order[r.status], r.median_ms if r.timed else 0))

    def _columns(self) -> list[str]:
        cols = ["config", "regs", "smem B", "block", "occupancy", "pruned / check", "median ms", "spread"]
        cols += [f"vs {b}" for b in self.baselines]
        if len({r.gpu for r in self.rows if r.gpu}) > 1:
            cols.append("GPU")
        return cols

    def _cells(self, r: AutotuneRow, best: AutotuneRow | None) -> list:
        smem = None if r.shared_bytes is None else r.shared_bytes + (r.dynamic_shared_bytes or 0)
        occ = f"{r.occupancy:.0%} ({r.limiter})" if r.occupancy is not None else "-"
        block = _block_text(r.block)
        verdict = f"pruned: {r.pruned}" if r.pruned else (r.check or ("-" if r.timed else r.note or "not run"))
        if r.check == "passed" and r.note:
            verdict = f"passed, {r.note}"
        cells = [("* " if best is not None and r is best else "") + r.label, _cell(r.registers), _cell(smem), block,
                 occ, _short(verdict, 70), _cell(r.median_ms), f"{r.spread:.1%}" if r.spread is not None else "-"]
        for b in self.baselines:
            s = r.speedup(b)
            cells.append(f"{s.ratio:.3g}x" if s else "-")
        if "GPU" in self._columns():
            cells.append(r.gpu or "-")
        return cells

    def __str__(self) -> str:
        best = self.best.row if self.best else None
        table = report.text_table(self._columns(), [self._cells(r, best) for r in self._display_rows()])
        lines = [self.headline(), table]
        if self.best:
            lines.append(str(self.best))
        if self.parameter:
            share = self.parameters()[0][1]
            lines.append(f"the parameter that matters: {self.parameter} (its values explain {share:.0%} of the "
                         f"variance of log time)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        best = self.best.row if self.best else None
        rows = []
        for r in self._display_rows():
            cells = self._cells(r, best)
            if r is best:
                cells[0] = report.Raw(f"<b>&#9733; {report.esc(r.label)}</b>", cells[0])
            elif r.status in ("pruned", "not run"):
                cells[0] = report.Raw(f"<span style='color:#888'>{report.esc(r.label)}</span>", cells[0])
            elif r.status in ("failed", "error"):
                cells[5] = report.Raw(f"<span style='color:#c00'>{report.esc(cells[5])}</span>", cells[5])
            rows.append(cells)
        out = [report.html_table(self._columns(), rows, caption=self.headline())]
        if self.best:
            out.append(f"<div>{report.esc(str(self.best))}</div>")
        if self.parameter:
            out.append(f"<div>the parameter that matters: <b>{report.esc(self.parameter)}</b> "
                       f"(kernellab.autotune_plot(result) draws time against it)</div>")
        out += [f"<div style='color:#666'>note: {report.esc(n)}</div>" for n in self.notes]
        return "".join(out)

    def to_json(self) -> dict:
        """{"kind": "autotune", "version": 1, "title", "kernel", "arch", "baselines", "rows" (AutotuneRow.to_json),
        "best" (config, or None), "ranked_by", "parameter", "notes", "stage_s"}."""
        best = self.best
        return {"kind": "autotune", "version": 1, "title": self.headline(), "kernel": self.kernel, "arch": self.arch,
                "baselines": list(self.baselines), "rows": [r.to_json() for r in self.rows],
                "best": {k: _json_value(v) for k, v in best.config.items()} if best else None,
                "ranked_by": self.ranked_by, "parameter": self.parameter, "notes": list(self.notes),
                "stage_s": dict(self.stage_s)}


def config_label(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def _block_text(block) -> str:
    """'256', '16x16', '-'."""
    if not block:
        return "-"
    dims = list(block)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return "x".join(map(str, dims))


def _cell(v) -> str:
    return report.fmt_cell(v)


def _short(text: str, n: int) -> str:
    text = text.splitlines()[0] if text else ""
    return text if len(text) <= n else text[:n - 3] + "..."


def _json_value(v):
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


# --- configurations -> compile options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateParam:
    """One parameter of a kernel template: `int BM`, `typename T = float`."""

    name: str
    default: str | None


def template_params(source: str, kernel: str) -> tuple[TemplateParam, ...] | None:
    """The template parameters of `__global__ ... kernel(...)` in `source`, or None when it is not a template."""
    text = strip_comments_and_strings(source)
    for m in re.finditer(r"\b__global__\b", text):
        after = text[m.end():]
        name = re.search(r"([A-Za-z_]\w*)\s*\(", re.sub(r"__launch_bounds__\s*\([^)]*\)", "", after))
        if not name or name.group(1) != kernel:
            continue
        before = text[:m.start()].rstrip()
        if not before.endswith(">"):
            return None
        depth, i = 0, len(before) - 1
        while i >= 0:
            depth += {">": 1, "<": -1}.get(before[i], 0)
            if depth == 0:
                break
            i -= 1
        if not re.search(r"\btemplate\s*$", before[:i]):
            return None
        params = []
        for p in split_top_level(before[i + 1:-1], ","):
            p = p.strip()
            if not p:
                continue
            decl, _, default = p.partition("=")
            words = re.findall(r"[A-Za-z_]\w*", decl)
            if not words:
                raise AutotuneError(f"cannot read the template parameter {p!r} of {kernel}")
            params.append(TemplateParam(words[-1], default.strip() or None))
        return tuple(params)
    return None


def _value_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) + ("f" if not math.isinf(v) else "")
    return str(v)


def compile_plan(kernel: str, config: dict, tparams: tuple[TemplateParam, ...] | None
                 ) -> tuple[tuple[str, ...], str | None]:
    """(-D options, name expression or None) for one configuration: entries named like a template parameter become
    template arguments, the others `-DNAME=VALUE`."""
    defines, args = [], []
    names = {p.name for p in tparams or ()}
    for k, v in config.items():
        if k in names:
            continue
        defines.append(f"-D{k}=" + ("1" if v is True else "0" if v is False else str(v)))
    if tparams is None:
        return tuple(defines), None
    for p in tparams:
        if p.name in config:
            args.append(_value_text(config[p.name]))
        elif p.default is None:
            raise AutotuneError(f"{kernel} is a template whose parameter {p.name} has no default, and configuration "
                                f"{{{config_label(config)}}} does not give it; add {p.name} to every configuration")
        else:
            break            # the remaining parameters take their defaults
    return tuple(defines), f"{kernel}<{', '.join(args)}>"


def _normalize_configs(configs) -> list[dict]:
    if isinstance(configs, dict) or not isinstance(configs, (list, tuple)) or not configs:
        raise AutotuneError("configs must be a non-empty list of dicts, e.g. "
                            "[{'BM': 64, 'BN': 64}, {'BM': 128, 'BN': 64}]")
    out = []
    for i, c in enumerate(configs):
        if not isinstance(c, dict):
            raise AutotuneError(f"configuration {i} is a {type(c).__name__}; each configuration is a dict of "
                                f"NAME: value, e.g. {{'BM': 64}}")
        for k, v in c.items():
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise AutotuneError(f"configuration {i}: {k!r} is not a C identifier; entries become -D NAME=VALUE "
                                    f"defines or template arguments")
            if not isinstance(v, (int, float, str, bool)):
                raise AutotuneError(f"configuration {i}: {k}={v!r} is a {type(v).__name__}; values are numbers, "
                                    f"bools or strings (C++ text such as 'float')")
        out.append(dict(c))
    seen = set()
    for c in out:
        key = tuple(sorted((k, repr(v)) for k, v in c.items()))
        if key in seen:
            raise AutotuneError(f"configuration {{{config_label(c)}}} is given twice")
        seen.add(key)
    return out


# --- the compile stage (runs in a process pool or on an executor's workers) ------------------------------------


@dataclass(frozen=True)
class CompileTask:
    """One configuration to compile: plain data, so a process pool or a Dask worker can take it."""

    source: str
    options: tuple[str, ...]
    arch: str
    name_expression: str | None = None
    filename: str = "kernel.cu"
    first_line: int = 1

    def cache_key(self) -> str:
        """Its entry in the compile cache: the one compile_cuda and the workers use for the same compile."""
        return compile_key(self.source, self.arch, self.options, filename=self.filename, first_line=self.first_line,
                           name_expressions=self.name_expressions)

    @property
    def name_expressions(self) -> tuple[str, ...]:
        return (self.name_expression,) if self.name_expression else ()


@dataclass(frozen=True)
class Compiled:
    """What compiling one configuration gave: the output, or the compiler's message."""

    output: CompileOutput | None
    error: str | None = None
    wall_ms: float = 0.0
    cache_state: str = "miss"
    worker: str = ""
    started: float = 0.0               # wall clock (time.time()) where it ran
    ended: float = 0.0


def compile_task(task: CompileTask) -> Compiled:
    """Compile one configuration through the compile cache; never raises for compile errors."""
    started, t0 = time.time(), time.perf_counter()
    try:
        output, state = compile_cached(task.source, task.arch, task.options, filename=task.filename,
                                       first_line=task.first_line, name_expressions=task.name_expressions)
    except CompileError as exc:
        return Compiled(None, str(exc), (time.perf_counter() - t0) * 1e3, "miss", fanout.worker_name(), started,
                        time.time())
    except Exception as exc:              # e.g. a name expression NVRTC cannot resolve
        return Compiled(None, f"{type(exc).__name__}: {exc}", (time.perf_counter() - t0) * 1e3, "miss",
                        fanout.worker_name(), started, time.time())
    return Compiled(output, None, (time.perf_counter() - t0) * 1e3, state, fanout.worker_name(), started, time.time())


# --- recording a configuration's launch without running it ---------------------------------------------------------


class LaunchRecorder:
    """Stands in for the kernel while `launch(k, config, *args)` runs: notes each `k[grid, block](...)` (and
    `k.launch(...)`) and launches nothing. Everything else (`k.resources`, `k.name`, ...) is the real kernel's."""

    def __init__(self, kernel):
        self._kernel = kernel
        self.launches: list[LaunchShape] = []
        self.args: tuple | None = None

    def __getitem__(self, cfg):
        if not isinstance(cfg, tuple) or len(cfg) not in (2, 3):
            raise KernellabError(f"launch as k[grid, block](args...) or k[grid, block, shared_bytes](args...); "
                                 f"got k[{cfg!r}]")
        grid, block, *smem = cfg

        def record(*args, shared_bytes=None, **_):
            return self.launch(grid, block, *args, shared_bytes=smem[0] if shared_bytes is None and smem
                               else shared_bytes or 0)
        return record

    def launch(self, grid, block, *args, shared_bytes: int = 0, **_):
        self.launches.append(LaunchShape(launch_dims(grid, "grid"), launch_dims(block, "block"),
                                          int(shared_bytes or 0)))
        if self.args is None:
            self.args = args
        return None

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def record_launches(launch: Callable, kernel, config: dict, args: tuple) -> list[LaunchShape]:
    """The launches `launch(kernel, config, *args)` makes, recorded without running them."""
    rec = LaunchRecorder(kernel)
    launch(rec, config, *args)
    if not rec.launches:
        raise AutotuneError(f"launch(k, config, *args) did not launch k for {{{config_label(config)}}}; it should "
                            f"call k[grid, block](...)")
    return rec.launches


# --- pruning -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneRules:
    """What prunes a configuration before it is launched, besides what cannot launch at all."""

    spills: bool = True             # register spills (local-memory traffic in the inner loop)
    local_memory: bool = True       # any stack frame (arrays indexed at run time live there)
    min_occupancy: float | None = None   # theoretical occupancy floor, 0..1


def prune_by_resources(res, rules: PruneRules) -> str | None:
    """The reason to drop a compiled kernel before looking at its launch, or None."""
    if rules.spills and (res.spill_store_bytes or res.spill_load_bytes):
        return (f"spills: {res.spill_store_bytes} B stored, {res.spill_load_bytes} B loaded per thread "
                f"({res.registers} registers)")
    if rules.local_memory and res.local_bytes:
        return f"local memory: {res.local_bytes} B stack frame per thread"
    return None


def prune_by_launch(res, shapes: list[LaunchShape], arch: str, rules: PruneRules):
    """(occupancy, limiter, reason or None) of a kernel's recorded launches: what cannot launch at all (more threads
    than the kernel allows, shared memory over the per-block limit, zero occupancy) and the occupancy floor. The
    occupancy reported is the lowest among the launches."""
    base = base_arch(arch)
    spec = get_arch(base)
    worst = None
    for s in shapes:
        threads = s.threads
        limit = min(res.max_threads_per_block, spec.max_threads_per_block)
        if threads > limit:
            per_warp = -(-res.registers * spec.warp_size // spec.register_allocation_unit) * \
                spec.register_allocation_unit
            by_registers = (spec.max_registers_per_block // per_warp) * spec.warp_size if res.registers else None
            why = (f"{res.registers} registers per thread" if limit == by_registers else
                   "its __launch_bounds__" if limit < spec.max_threads_per_block else base)
            return None, None, (f"threads: a block of {threads} threads, more than the {limit} this kernel allows "
                                f"({why})")
        smem = res.shared_bytes + s.shared_bytes
        if smem > spec.shared_memory_per_block_optin_bytes:
            return None, None, (f"shared memory: {smem:,} B per block ({res.shared_bytes:,} static + {s.shared_bytes:,}"
                                f" dynamic), more than the {spec.shared_memory_per_block_optin_bytes:,} B a block may "
                                f"have on {base}")
        occ = occupancy(threads, res.registers, smem, base)
        if occ.blocks_per_sm == 0:
            return 0.0, occ.limiter, f"zero occupancy: {occ.reasons()[occ.limiter]}"
        if worst is None or occ.ratio < worst.ratio:
            worst = occ
    if worst is not None and rules.min_occupancy is not None and worst.ratio < rules.min_occupancy:
        return worst.ratio, worst.limiter, (f"occupancy {worst.ratio:.0%} below min_occupancy "
                                            f"{rules.min_occupancy:.0%} ({worst.limiter} bound)")
    return (worst.ratio if worst else None), (worst.limiter if worst else None), None


# --- where things run ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """The GPU a process can use (or why none), and which process it is."""

    gpu_ok: bool
    reason: str
    device: str | None = None      # model, e.g. "NVIDIA H200"
    arch: str | None = None
    gpu: str | None = None         # model, host and PCI bus id: one physical GPU
    worker: str = ""


def where() -> Where:
    """This process's GPU (probe task for an executor's workers)."""
    ok, reason = _device.gpu_status()
    worker = fanout.worker_name()
    if not ok:
        return Where(False, reason, worker=worker)
    info = _device.device_info()
    bus = ""
    try:
        import cupy

        bus = cupy.cuda.runtime.deviceGetPCIBusId(info.index)
    except Exception:          # a stand-in device in tests, or no bus id: the index names it
        bus = f"GPU {info.index}"
    return Where(True, reason, info.name, info.arch, f"{info.name} [{socket.gethostname()} {bus}]", worker)


# --- one configuration checked and timed (runs here, or on an executor's worker) -----------------------------------


@dataclass
class KernelSpec:
    """How to get one configuration's kernel: rebuilt from its compile output (CUDA C++), or from `factory(config)`
    (e.g. a Numba kernel). The live kernel is kept here and never pickled."""

    config: dict
    build: Callable | None = None            # Module(output, source, ...) from the kernel layer
    output: CompileOutput | None = None
    source: str | None = None
    symbol: str | None = None                # the entry to pick (mangled for template instances)
    name: str = ""                           # the kernel's name, to pick it where symbol is None
    filename: str = "kernel.cu"
    first_line: int = 1
    factory: Callable | None = None
    kernel: Any = None

    def get(self):
        if self.kernel is None:
            if self.factory is not None:
                # A simulated launch in another thread (a threaded Dask worker) swaps numba.cuda for the simulator's
                # module in the kernels' modules; building (and compiling) a Numba kernel then would see it.
                with simulator_lock():
                    self.kernel = self.factory(self.config)
            else:
                module = self.build(self.output, self.source, name=self.name, first_line=self.first_line,
                                    filename=self.filename, cache_state="memory", wall_ms=0.0)
                self.kernel = _pick(module, self.symbol, self.name)
        return self.kernel

    def __getstate__(self):
        return {k: (None if k == "kernel" else v) for k, v in self.__dict__.items()}


def _pick(module, symbol: str | None, name: str):
    if symbol is not None:
        for k in module.kernels:
            if k.symbol == symbol:
                return k
    try:
        return module[name]
    except KeyError as exc:
        raise AutotuneError(str(exc).strip("'\"")) from None


@dataclass
class MeasureTask:
    """Everything one configuration's check and timing need; the user's callables travel inside (a Dask executor
    pickles them with cloudpickle; a process pool needs module-level functions)."""

    index: int
    spec: KernelSpec
    launch: Callable
    inputs: Callable
    reference: Callable | None
    baselines: dict | None
    check_options: dict
    bench_options: dict
    rules: PruneRules
    arch: str
    isolate: bool = True
    shapes: list | None = None               # recorded in the caller; None: record here
    resources_pruned: bool = False           # the caller already looked at the resources


@dataclass
class Outcome:
    """What checking and timing one configuration found (the fields a row takes from it)."""

    index: int
    fields: dict
    context_lost: bool = False               # a fault while timed in this process: its CUDA context is gone


def _resources(kernel):
    try:
        return kernel.resources
    except KernellabError:                   # a Numba kernel whose signature is not known yet
        return None


def _resource_fields(res) -> dict:
    if res is None:
        return {}
    return {"registers": res.registers, "shared_bytes": res.shared_bytes, "local_bytes": res.local_bytes,
            "spill_bytes": res.spill_store_bytes + res.spill_load_bytes}


def _generator(seed: int = 0):
    import torch

    return torch.Generator(device="cpu").manual_seed(seed)


def _first_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def _verdict(rep) -> str:
    """'passed', or 'failed: ...', 'fault: ...', 'error: ...' from a CheckReport."""
    if rep.passed:
        return "passed"
    exc = rep.exception or ""
    kind = exc.split(":", 1)[0]
    if kind in ("IsolatedLaunchError", "LaunchError", "SimulatedKernelError"):
        return "fault: " + _first_line(exc.split(":", 1)[1])
    if exc:
        return "error: " + _first_line(exc)
    return "failed: " + rep.message


def measure(task: MeasureTask) -> Outcome:
    """Prune (if the caller could not), check once against the reference, then time one configuration; a fault or an
    exception becomes part of the outcome, never an exception. The outcome's `measured_at` says when: (start, when
    it got its GPU (None: it never needed it), end)."""
    started = time.time()
    out = _measure(task)
    out.fields["measured_at"] = (started, out.fields.pop("gpu_held_at", None), time.time())
    return out


def _measure(task: MeasureTask) -> Outcome:
    here = where()
    f: dict = {"device": here.device, "gpu": here.gpu, "worker": here.worker}
    out = Outcome(task.index, f)
    config, launch = task.spec.config, task.launch
    try:
        k = task.spec.get()
    except Exception as exc:
        f.update(error=f"{type(exc).__name__}: {exc}", check=f"error: building the kernel failed: {_first_line(exc)}")
        return out
    f["symbol"] = getattr(k, "symbol", None)
    simulated = bool(getattr(k, "simulate", False))
    res = _resources(k)
    f.update(_resource_fields(res))
    if res is not None and not task.resources_pruned:
        why = prune_by_resources(res, task.rules)
        if why:
            f["pruned"] = why
            return out
    can_launch = here.gpu_ok or simulated
    not_run = "not run: no GPU"
    shapes = task.shapes
    if shapes is None:
        try:
            args = _call_inputs(task.inputs, 0)
        except Exception as exc:
            if can_launch:
                f.update(check=f"error: inputs(generator) raised: {_first_line(exc)}",
                         error=f"{type(exc).__name__}: {exc}")
            else:
                f["check"] = not_run      # e.g. inputs that make CUDA tensors: nothing to record here
            return out
        try:
            shapes = record_launches(launch, k, config, args)
        except Exception as exc:
            f.update(pruned=f"launch(k, config, *args) raised while its launch was recorded: {_first_line(exc)}",
                     error=f"{type(exc).__name__}: {exc}")
            return out
    f.update(block=shapes[0].block, dynamic_shared_bytes=shapes[0].shared_bytes)
    if res is not None:
        occ, limiter, why = prune_by_launch(res, shapes, getattr(k, "arch", task.arch), task.rules)
        f.update(occupancy=occ, limiter=limiter)
        if why:
            f["pruned"] = why
            return out
    if not can_launch:
        f["check"] = not_run
        return out
    # Several workers may share a GPU (a pool with more workers than GPUs, for the compiles): one configuration is
    # checked and timed on a GPU at a time, so that no two timings overlap there.
    with fanout.gpu_lock(here.gpu if here.gpu_ok and not simulated else None):
        f["gpu_held_at"] = time.time()
        return _check_and_time(task, k, here, f, out, res, simulated)


def _check_and_time(task: MeasureTask, k, here: Where, f: dict, out: Outcome, res, simulated: bool) -> Outcome:
    """measure's last steps: the check against the reference, then the timing; `f` takes what they find."""
    config, launch = task.spec.config, task.launch
    isolate = task.isolate and not simulated

    def candidate(*args):
        return launch(k, config, *args)

    ran_clean = False
    if task.reference is not None:
        try:
            rep = check(candidate, task.reference, task.inputs, isolate=isolate, **task.check_options)
        except Exception as exc:             # a CheckError: the options, not the kernel
            f.update(check=f"error: {_first_line(exc)}", error=f"{type(exc).__name__}: {exc}")
            return out
        f["check_report"] = rep
        f["check"] = _verdict(rep)
        if not rep.passed:
            f["error"] = rep.exception or rep.message
            return out
        ran_clean = True
        if res is None:                      # a Numba kernel compiled at its first launch
            f.update(_resource_fields(_resources(k)))
    timer = task.bench_options.get("timer")
    if not (here.gpu_ok and not simulated) and timer is None:
        f["note"] = "not timed: " + ("a simulated kernel" if simulated else "no GPU")
        return out

    label = config_label(config)
    t0 = time.time()
    try:
        result = bench(candidate, task.inputs, baselines=task.baselines, name=label,
                       isolate=isolate and not ran_clean, **task.bench_options)
    except _worker.IsolatedLaunchError as exc:
        f.update(check="fault: " + _first_line(exc), error=str(exc))
        return out
    except LaunchError as exc:
        f.update(check="fault while timed: " + _first_line(exc), error=str(exc))
        out.context_lost = bool(exc.sticky)
        return out
    except Exception as exc:
        f.update(error=f"{type(exc).__name__}: {exc}", note=f"timing failed: {_first_line(exc)}")
        return out
    f.update(median_ms=result.median_ms, spread=result.spread, speedups=result.speedups,
             baseline_ms=tuple((b.name, b.median_ms) for b in result.baselines), bench=result,
             timed_at=(t0, time.time()))
    if not here.gpu_ok:                      # a stand-in clock (tests): say which
        f["device"] = f["device"] or getattr(timer, "device", None)
    return out


def _call_inputs(inputs: Callable, seed: int) -> tuple:
    import torch

    args = inputs(_generator(seed))
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise AutotuneError(f"inputs(generator) returned a {type(args).__name__}; it should return the argument "
                            f"tuple that launch(k, config, *args) takes")
    return tuple(args)


# --- the cache key: what decides a row ---------------------------------------------------------------------------


def fingerprint(obj, _depth: int = 0) -> str:
    """What decides what a callable computes, as text: its code and constants, and the values of the globals and
    closure variables it reads (numbers, strings and tuples as they are; arrays and tensors by dtype and shape;
    dataclasses and namespaces by their fields; functions followed three levels deep; modules by name). Two runs of
    a cell with the same shapes agree; a change of shape changes it."""
    if _depth > 3:
        return "..."
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, complex)):
        return repr(obj)
    if isinstance(obj, (tuple, list, frozenset, set, dict)) and len(obj) > 256:
        return f"{type(obj).__name__}(len={len(obj)})"
    if isinstance(obj, (tuple, list, frozenset, set)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return type(obj).__name__ + "(" + ",".join(fingerprint(x, _depth + 1) for x in items) + ")"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k!r}:{fingerprint(v, _depth + 1)}" for k, v in sorted(obj.items(), key=repr)) + "}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, functools.partial):
        return f"partial({fingerprint(obj.func, _depth + 1)},{fingerprint(obj.args, _depth + 1)}," \
               f"{fingerprint(obj.keywords, _depth + 1)})"
    if isinstance(obj, types.MethodType):
        return f"method({fingerprint(obj.__func__, _depth + 1)})"
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        parts = [obj.__qualname__, code.co_code.hex(), _consts(code)]
        g = obj.__globals__
        for name in _names(code):
            if name in g:
                parts.append(f"{name}={fingerprint(g[name], _depth + 1)}")
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                parts.append(f"{name}={fingerprint(cell.cell_contents, _depth + 1)}")
            except ValueError:           # an empty cell
                parts.append(f"{name}=<empty>")
        if obj.__defaults__:
            parts.append(fingerprint(obj.__defaults__, _depth + 1))
        return "fn(" + ";".join(parts) + ")"
    shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(obj).__name__}[{dtype}]{tuple(shape)}"
    kind = type(obj)
    if isinstance(obj, type) or callable(obj) and kind.__module__ in ("builtins", "torch", "numpy"):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return f"{kind.__qualname__}{fingerprint(dataclasses.asdict(obj), _depth + 1)}"
    if not callable(obj) and isinstance(getattr(obj, "__dict__", None), dict):   # a namespace of sizes, say
        return f"{kind.__qualname__}{fingerprint(vars(obj), _depth + 1)}"
    return f"{kind.__module__}.{kind.__qualname__}"


def _consts(code) -> str:
    out = []
    for c in code.co_consts:
        out.append(_consts(c) if isinstance(c, types.CodeType) else repr(c))
    return "(" + ",".join(out) + ")"


def _names(code) -> list[str]:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += _names(c)
    return list(dict.fromkeys(names))


def _options_key(options: dict) -> dict:
    return {k: ("timer:" + type(v).__qualname__ if k == "timer" else fingerprint(v)) for k, v in options.items()}


# --- autotune --------------------------------------------------------------------------------------------------------


def autotune(source, configs: Sequence[dict], *, kernel: str, launch: Callable, inputs: Callable,
             reference: Callable | None = None, arch=None, baselines: dict | None = None, executor=None,
             options=(), build: Callable | None = None, min_occupancy: float | None = None,
             prune_spills: bool = True, prune_local_memory: bool = True, check_options: dict | None = None,
             bench_options: dict | None = None, isolate: bool = True, cache: bool = True, progress: bool = True,
             compile_workers: int | None = None, filename: str = "kernel.cu", first_line: int = 1) -> AutotuneResult:
    """Compile, prune, check and time every configuration of a kernel; return the table and the best.

    source: CUDA C++ text, or a callable `source(config)` returning a kernellab Kernel (e.g. a Numba kernel made for
        that configuration; it is built where it runs).
    configs: a list of dicts; each entry becomes `-D NAME=VALUE`, or a template argument where `kernel` is a template
        with a parameter of that name. Defines are macros for the whole source, CUDA's headers included: prefer
        distinctive names (a define named T breaks a header's `template <class T>`).
    launch(k, config, *args): launches one configuration (and returns its output tensor(s) for the check).
    inputs(generator): the argument tuple; reference(*args): the expected output(s) (kernellab.check).
    baselines: {name: callable(*args)} timed in the same run as each configuration, on the same GPU.
    executor: any concurrent.futures.Executor (e.g. `distributed.Client(...).get_executor()`): the compiles and the
        check-and-time tasks run on its workers. None: compiles in a process pool here, checks and times here.
    build: makes a Module from a compile output (kernellab.autotune passes kernellab.Module).
    min_occupancy: prune configurations below this theoretical occupancy (0..1). prune_spills, prune_local_memory:
        prune kernels that spill or use a stack frame.
    check_options, bench_options: passed to kernellab.check (default: trials=1) and kernellab.bench.
    isolate: run each configuration's first launches in a worker process, so a fault is a row.
    cache: keep and reuse rows on disk (kernellab's compile cache; KERNELLAB_CACHE=0 turns it off).
    """
    t_start = time.perf_counter()
    configs = _normalize_configs(configs)
    for what, fn in (("launch", launch), ("inputs", inputs)):
        if not callable(fn):
            raise AutotuneError(f"{what} must be callable: launch(k, config, *args) launches one configuration, "
                                f"inputs(generator) gives the argument tuple")
    if reference is not None and not callable(reference):
        raise AutotuneError("reference must be callable (reference(*args) returns the expected output) or None")
    if baselines is not None and (not isinstance(baselines, dict) or not all(callable(v) for v in baselines.values())):
        raise AutotuneError("baselines must map names to callables, e.g. {'torch': lambda a, b, c, *_: a @ b}")
    if min_occupancy is not None and not (0 < min_occupancy <= 1):
        raise AutotuneError(f"min_occupancy is a fraction of the SM's warp slots, 0 < min_occupancy <= 1; "
                            f"got {min_occupancy!r}")
    is_cuda = isinstance(source, str)
    if not is_cuda and not callable(source):
        raise AutotuneError("source is CUDA C++ text, or a callable source(config) that returns a kernellab Kernel")
    if is_cuda and build is None:
        raise AutotuneError("compiling CUDA C++ needs build= (a Module from a compile output): call "
                            "kernellab.autotune, which passes it")
    if isinstance(options, str):
        options = tuple(options.split())
    options = tuple(options)
    check_options = {**DEFAULT_CHECK, **(check_options or {})}
    bench_options = dict(bench_options or {})
    rules = PruneRules(prune_spills, prune_local_memory, min_occupancy)
    notes: list[str] = []
    stages: dict[str, float] = {}

    # 1. where
    t0 = time.perf_counter()
    here = where() if executor is None else _probe(executor)
    if arch is None:
        if here.arch:
            arch = here.arch
        else:
            arch = DEFAULT_ARCH
            notes.append(f"compiled for {DEFAULT_ARCH}, the default where there is no GPU (pass arch= for another)")
    arch = normalize_arch(arch)
    tparams = template_params(source, kernel) if is_cuda else None
    stages["probe"] = time.perf_counter() - t0

    # 2. the cache
    common = {"kind": "autotune-row", "format": ROW_FORMAT,
              "source": source if is_cuda else fingerprint(source), "kernel": kernel, "options": options,
              "arch": arch, "device": here.device or "no GPU", "nvrtc": nvrtc_version() if is_cuda else None,
              "launch": fingerprint(launch), "inputs": fingerprint(inputs), "reference": fingerprint(reference),
              "baselines": fingerprint(baselines), "check": _options_key(check_options),
              "bench": _options_key(bench_options), "rules": dataclasses.astuple(rules), "isolate": isolate,
              "first_line": first_line, "filename": filename}
    keys = [_cache.make_key(**common, config=sorted((k, repr(v)) for k, v in c.items())) for c in configs]
    rows: list[AutotuneRow | None] = [None] * len(configs)
    if cache:
        for i, key in enumerate(keys):
            hit, _ = _cache.get(key)
            if isinstance(hit, AutotuneRow):
                rows[i] = replace(hit, cached=True, rerun=None)
    todo = [i for i, r in enumerate(rows) if r is None]
    steps = 2 if is_cuda else 1              # compile, then check and time
    bar = fanout.Progress(steps * len(todo), f"autotune {kernel}: {'compile' if is_cuda else 'check and time'}",
                          progress)
    advanced = dict.fromkeys(todo, 0)

    def advance(i: int, upto: int, postfix: str | None = None) -> None:
        if upto > advanced[i]:
            bar.update(upto - advanced[i], postfix)
            advanced[i] = upto

    fields: dict[int, dict] = {i: {} for i in todo}
    specs: dict[int, KernelSpec] = {}
    outputs: dict[int, CompileOutput] = {}
    tasks: dict[int, CompileTask] = {}

    # 3. compile (CUDA C++): every configuration at once, in parallel
    def compiled(i: int, got, rerun: str | None) -> None:
        """One compile's outcome into its row's fields (and its output kept)."""
        if rerun:
            fields[i]["rerun"] = "compile: " + rerun
        if isinstance(got, BaseException):
            fields[i].update(pruned=f"compile task failed: {type(got).__name__}: {_first_line(got)}",
                             error=f"{type(got).__name__}: {got}")
            return
        if got.started:
            fields[i].update(compiled_at=(got.started, got.ended), compile_worker=got.worker or None)
        if got.error is not None:
            errs = [l for l in got.error.splitlines() if ": error" in l or "error:" in l]
            fields[i].update(pruned="compile error: " + _first_line(errs[0] if errs else got.error),
                             error=got.error, compile_ms=got.wall_ms)
        else:
            outputs[i] = got.output
            fields[i]["compile_ms"] = got.output.compile_ms if got.cache_state == "miss" else 0.0

    def prune_compiled(i: int) -> None:
        """Build configuration i's kernel here from its output, read its resources and prune by them (CUDA C++)."""
        expr = tasks[i].name_expression
        spec = specs[i] = KernelSpec(configs[i], build=build, output=outputs[i], source=source,
                                     symbol=outputs[i].lowered(expr) if expr else None, name=kernel,
                                     filename=filename, first_line=first_line)
        try:
            k = spec.get()
        except Exception as exc:
            fields[i].update(pruned=f"no kernel {kernel!r}: {_first_line(exc)}", error=str(exc))
            return
        res = k.resources
        fields[i].update(_resource_fields(res), symbol=k.symbol)
        if not getattr(res, "ptxas_report", True):
            unreported.append(config_label(configs[i]))
        why = prune_by_resources(res, rules)
        if why:
            fields[i]["pruned"] = why

    def measure_task(i: int) -> MeasureTask:
        return MeasureTask(i, specs[i], launch, inputs, reference, baselines, check_options, bench_options, rules,
                           arch, isolate, shapes.get(i), resources_pruned=is_cuda)

    best_ms = math.inf
    lost = None

    def measured(i: int, got, rerun: str | None) -> None:
        """One check-and-time outcome into its row's fields."""
        nonlocal best_ms, lost
        if rerun:
            fields[i]["rerun"] = (fields[i].get("rerun", "") + "; " if fields[i].get("rerun") else "") + rerun
        if isinstance(got, BaseException):
            fields[i].update(check=f"error: the task failed: {type(got).__name__}: {_first_line(got)}",
                             error=f"{type(got).__name__}: {got}")
            if _unpicklable(got) and _pickle_note(got) not in notes:
                notes.append(_pickle_note(got))
        elif lost is not None:
            fields[i].update(check=f"not run: the CUDA context was lost when {lost} faulted while timed",
                             device=here.device, gpu=here.gpu)
        else:
            fields[i].update(got.fields)
            if got.context_lost and executor is None:
                lost = config_label(configs[i])
                notes.append(f"{lost} faulted while being timed, after its check ran clean (a fault that depends on "
                             f"the data or on timing); this process's CUDA context is lost: the later configurations "
                             f"were not run. Restart the kernel and find the fault with k.sanitize(...)")
            elif got.context_lost:
                notes.append(f"{config_label(configs[i])} faulted while being timed on {got.fields.get('worker')}, "
                             f"after its check ran clean: that worker's CUDA context is lost and the configurations "
                             f"it ran later failed; restart the workers (client.restart()) before the next sweep")
        ms = fields[i].get("median_ms")
        if ms is not None and ms < best_ms:
            best_ms = ms
        advance(i, steps, f"best {best_ms:.4g} ms" if best_ms < math.inf else None)

    shapes: dict[int, list] = {}
    unreported: list[str] = []                 # compiled without a ptxas report: spills and stack unknown
    t0 = time.perf_counter()
    if is_cuda and todo:
        for i in todo:
            try:
                opts, expr = compile_plan(kernel, configs[i], tparams)
            except AutotuneError as exc:
                fields[i].update(pruned=f"cannot compile: {exc}", error=str(exc))
                continue
            tasks[i] = CompileTask(source, options + opts, arch, expr, filename, first_line)
    lanes = _lanes(executor) if is_cuda and tasks and fanout.dask_client(executor) is not None else None
    if lanes is not None:
        # A Dask pool: no stage waits for the whole previous one. Each configuration goes from its compile (any
        # worker) to its check-and-time (one worker per GPU, its lane, ahead of the compiles still queued there) as
        # soon as it compiled and survived the pruning here; the GPU lock still keeps timings apart on a GPU.
        stages["prune"] = 0.0
        t_last = {"compile": t0, "check_and_time": t0}
        jobs_of: list[tuple[str, int]] = []    # the pipeline's job index -> (what it is, the configuration)
        measuring: set[int] = set()

        def then_measure(i: int):
            """After configuration i compiled: prune it here; its check-and-time job, or None where it is done."""
            if i not in outputs:
                return None
            tp = time.perf_counter()
            prune_compiled(i)
            stages["prune"] += time.perf_counter() - tp
            if "pruned" in fields[i]:
                return None
            measuring.add(i)
            jobs_of.append(("measure", i))
            return fanout.Job(measure, measure_task(i), workers=lanes, priority=1)

        def follow(done: fanout.JobDone):
            what, i = jobs_of[done.index]
            if what != "compile":
                return None
            compiled(i, done.value, done.rerun)
            if i in outputs:
                _cache.put(tasks[i].cache_key(), outputs[i])    # the worker wrote its own process's cache
            return then_measure(i)

        first = []
        for i in todo:
            if i not in tasks:
                advance(i, steps)              # it cannot compile: its row is done
                continue
            hit, state = _cache.get(tasks[i].cache_key())
            if hit is None:
                jobs_of.append(("compile", i))
                first.append(fanout.Job(compile_task, tasks[i]))
                continue
            compiled(i, Compiled(hit, None, 0.0, state), None)
            job = then_measure(i)
            advance(i, 1 if job else steps)
            if job:
                first.append(job)
        for done in fanout.pipeline(executor, first, follow):
            what, i = jobs_of[done.index]
            t_last["compile" if what == "compile" else "check_and_time"] = time.perf_counter()
            if what == "compile":
                advance(i, 1 if i in measuring else steps)
            else:
                measured(i, done.value, done.rerun)
        # compile: to the last compile's result; check-and-time: from then to the last result (the part of the
        # timing that did not overlap the compiles); each row's compiled_at and measured_at say when it ran
        stages["compile"] = t_last["compile"] - t0
        stages["check_and_time"] = max(0.0, t_last["check_and_time"] - t_last["compile"])
    else:
        if is_cuda and todo:
            for i, got, rerun in _compile_all(tasks, executor, compile_workers, notes):
                compiled(i, got, rerun)
                advance(i, 1)
            stages["compile"] = time.perf_counter() - t0

        # 4. resources and pruning here, before anything runs
        t0 = time.perf_counter()
        bar.describe(f"autotune {kernel}: prune")
        local_args, args_error = None, None
        for i in todo:
            if is_cuda and i not in outputs:
                continue                   # it did not compile
            if is_cuda:
                prune_compiled(i)
            else:
                specs[i] = KernelSpec(configs[i], build=build, name=kernel, filename=filename,
                                      first_line=first_line, factory=source)
                continue
            if "pruned" in fields[i] or i not in specs or executor is not None:
                continue               # with an executor, the launch is recorded where the inputs are made
            if local_args is None and args_error is None:
                try:
                    local_args = _call_inputs(inputs, 0)
                except Exception as exc:
                    args_error = f"{type(exc).__name__}: {_first_line(exc)}"
            if local_args is None:
                continue
            k = specs[i].get()
            try:
                shapes[i] = record_launches(launch, k, configs[i], local_args)
            except Exception as exc:
                fields[i].update(pruned=f"launch(k, config, *args) raised while its launch was recorded: "
                                        f"{_first_line(exc)}", error=f"{type(exc).__name__}: {exc}")
                continue
            occ, limiter, why = prune_by_launch(k.resources, shapes[i], arch, rules)
            fields[i].update(block=shapes[i][0].block, dynamic_shared_bytes=shapes[i][0].shared_bytes,
                             occupancy=occ, limiter=limiter)
            if why:
                fields[i]["pruned"] = why
        local_args = None              # the check and the timing make their own inputs
        if args_error:
            notes.append(f"inputs(generator) cannot run here ({args_error}), so the launches were not recorded: "
                         f"block sizes, occupancy and the pruning that needs them wait for a GPU")
        for i in todo:
            if "pruned" in fields[i] or i not in specs:
                advance(i, steps)
        stages["prune"] = time.perf_counter() - t0

        # 5. check and time the survivors
        t0 = time.perf_counter()
        bar.describe(f"autotune {kernel}: check and time")
        survivors = [i for i in todo if i in specs and "pruned" not in fields[i]]
        for i, got, rerun in _measure_all([measure_task(i) for i in survivors], executor):
            measured(i, got, rerun)
        stages["check_and_time"] = time.perf_counter() - t0
    if unreported:
        notes.append(f"no ptxas report for {len(unreported)} configuration(s) ({', '.join(unreported[:3])}"
                     f"{', ...' if len(unreported) > 3 else ''}): registers and shared memory come from the cubin, "
                     f"spills and the stack frame are unknown, so they were not pruned by them")
    bar.close()

    # 6. rows, the cache, what was not run
    for i in todo:
        f = {k: v for k, v in fields[i].items() if k in _ROW_FIELDS}
        rows[i] = AutotuneRow(config=configs[i], **f)
        if cache:
            _cache.put(keys[i], rows[i])
    rows_t = tuple(rows)
    notes += _stage_notes(rows_t, here, executor, reference, bench_options)
    stages["total"] = time.perf_counter() - t_start
    kernel_for = functools.partial(_best_kernel, specs=specs, configs=configs, source=source, kernel=kernel,
                                   options=options, arch=arch, tparams=tparams, build=build, filename=filename,
                                   first_line=first_line)
    return AutotuneResult(kernel=kernel, arch=arch, rows=rows_t, baselines=tuple(baselines or ()),
                          notes=tuple(notes), stage_s=tuple(stages.items()), _kernel_for=kernel_for)


_ROW_FIELDS = {f.name for f in dataclasses.fields(AutotuneRow)} - {"config", "cached"}


def _probe(executor) -> Where:
    fanout.prepare(executor, fanout.WORKER_IMPORTS + (__name__,))
    try:
        return executor.submit(where).result()
    except Exception as exc:
        raise AutotuneError(f"the executor could not run its probe task ({type(exc).__name__}: {exc}); is kernellab "
                            f"importable on its workers?") from None


def _lanes(executor) -> tuple[str, ...]:
    """The timing lanes of a Dask pool: one worker per GPU (the lowest address among those on it), where some GPU has
    more than one worker; () where every worker has a GPU of its own, or none has one (no lane needed)."""
    client = fanout.dask_client(executor)
    try:
        found = client.run(where)
    except Exception:                          # a worker that cannot answer: no lanes, the GPU lock still holds
        return ()
    by_gpu: dict[str, list[str]] = {}
    for addr, w in found.items():
        if isinstance(w, Where) and w.gpu_ok and w.gpu:
            by_gpu.setdefault(w.gpu, []).append(addr)
    if all(len(v) <= 1 for v in by_gpu.values()):
        return ()
    return tuple(sorted(min(v) for v in by_gpu.values()))


def _compile_all(tasks: dict, executor, workers: int | None, notes: list):
    """(index, Compiled or exception, why it was re-run or None) as each compile finishes: cache hits here, the
    rest in parallel."""
    pending = {}
    for i, t in tasks.items():
        hit, state = _cache.get(t.cache_key())
        if hit is not None:
            yield i, Compiled(hit, None, 0.0, state), None
        else:
            pending[i] = t
    if not pending:
        return
    order = list(pending)
    if executor is None and len(pending) == 1:
        i = order[0]
        yield i, compile_task(pending[i]), None
        return
    pool = executor or fanout.process_pool(workers or fanout.cpu_count(), preload=(__name__,))  # starts as needed
    for done in fanout.jobs(pool, compile_task, [pending[i] for i in order]):
        got = done.value
        if not isinstance(got, BaseException) and got.output is not None:
            _cache.put(pending[order[done.index]].cache_key(), got.output)   # the pool wrote its own process's cache
        yield order[done.index], got, done.rerun


def _measure_all(tasks: list[MeasureTask], executor):
    """(index, Outcome or exception, why it was re-run or None) as each configuration is checked and timed."""
    if executor is None:
        for t in tasks:
            yield t.index, measure(t), None
        return
    for done in fanout.jobs(executor, measure, tasks):
        yield tasks[done.index].index, done.value, done.rerun


def _unpicklable(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return "pickl" in text or "serializ" in text


def _pickle_note(exc: BaseException) -> str:
    return ("the executor could not send launch, inputs, reference or the baselines to its workers "
            f"({type(exc).__name__}); a process pool pickles them, which works for module-level functions only: use "
            "Dask's executor (cloudpickle sends lambdas and notebook functions) or define them in a module")


def _stage_notes(rows, here: Where, executor, reference, bench_options) -> list[str]:
    notes = []
    if not here.gpu_ok and "timer" not in bench_options:
        checked = any(r.check == "passed" or (r.check or "").startswith(("failed", "fault")) for r in rows)
        notes.append(f"no GPU {'here' if executor is None else 'on the workers'} ({here.reason}): compiled, "
                     f"resources read and pruned{', checked in the simulator' if checked else ''}; "
                     f"{'timing needs' if checked else 'checking and timing need'} a GPU")
    if reference is None:
        notes.append("no reference: the configurations were timed without checking their outputs")
    gpus = {}
    for r in rows:
        if r.timed and r.gpu:
            gpus.setdefault(r.gpu, []).append(r)
    if len(gpus) > 1:
        models = sorted({r.device for rs in gpus.values() for r in rs})
        same = f"all {models[0]}" if len(models) == 1 else "different models: " + ", ".join(models)
        notes.append(f"timed on {len(gpus)} GPUs ({same}); each speed-up is against baselines timed on the same GPU "
                     f"in the same run, and the ranking compares " +
                     ("speed-ups, not times from different GPUs" if any(r.speedups for r in rows) else
                      "times taken on different GPUs (no baselines to rank by)"))
    for gpu, rs in gpus.items():
        spans = sorted(r.timed_at for r in rs if r.timed_at)
        overlaps = sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
        if overlaps:
            notes.append(f"{overlaps + 1} configurations were timed at the same time on one GPU ({gpu}): the executor "
                         f"runs several tasks per GPU, so their times disturb each other; give each worker one "
                         f"thread (threads_per_worker=1)")
    return notes


def _best_kernel(row: AutotuneRow, *, specs, configs, source, kernel, options, arch, tparams, build, filename,
                 first_line):
    """The kernel of a row: the one already built in this call, else built again (the compile cache has it)."""
    for i, c in enumerate(configs):
        if c == row.config and i in specs and specs[i].kernel is not None:
            return specs[i].kernel
    if not isinstance(source, str):
        return source(dict(row.config))
    opts, expr = compile_plan(kernel, row.config, tparams)
    got = compile_task(CompileTask(source, tuple(options) + opts, arch, expr, filename, first_line))
    if got.output is None:
        raise AutotuneError(f"the best configuration no longer compiles: {got.error}")
    spec = KernelSpec(dict(row.config), build=build, output=got.output, source=source,
                      symbol=got.output.lowered(expr) if expr else None, name=kernel, filename=filename,
                      first_line=first_line)
    return spec.get()
