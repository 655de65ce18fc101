"""Timing ops as a user calls them, three ways in one run: kernellab.bench, triton.testing.do_bench and
kernellab.bench(sustained=True); every ratio from the same run, and a reason wherever two ways disagree by > 5 %.

Method. Each function is called as a model calls it (a registered op, its launch path and output allocation
included) on the same arguments. kernellab.bench: CUDA events per call, L2 flushed by writing a buffer twice the L2
before each call, calls queued behind a spin so that host time is hidden, batches at most half the GPU's time
(below the power cap), medians over alternating rounds. triton.testing.do_bench: CUDA events per call, L2 cleared
by zeroing a 256 MB buffer before each call, calls not queued: a call whose host time exceeds its kernel's GPU time
is timed at its host time. sustained=True: kernellab.bench with calls back to back after a 500 ms warm-up, as a
training loop runs them (the GPU at its power cap): each call queued behind a 100 MB L2 flush and nothing else, so a
call whose host path outlasts the flush and its kernel leaves the GPU waiting for it, and the events time host work.
Host time: each function's host milliseconds per call (host_ms_per_call: perf_counter around a loop of calls, the
GPU synchronised only before and after), kept as the result's `host_ms`, so that `why` can tell a host-bound
sustained time from a clock-bound one.
"""
from __future__ import annotations

import statistics

import kernellab

METHODS = ("kernellab.bench", "do_bench", "sustained")
HOST_LOOP_GPU_MS = 5.0       # host_ms_per_call queues about this much GPU work a loop (10 to 200 calls)
HOST_BOUND_SLACK = 0.9       # host-bound: the loop's host time a call >= this share of its GPU time (see host_bound)


class Timings(dict):
    """{method: {name: median ms}} as time_as_called returns it, with `host_ms`: {name: host ms per call}, the larger
    of the same arguments' and kernellab.bench's rotating input sets' (`host_same_ms` and `host_rotating_ms` keep
    both), and `loop_ms`: what sustained's loop adds to each call (sustained_loop_ms), each empty where not
    measured. A dict, so callers that read methods and names see nothing else."""

    def __init__(self, *args, host_ms: dict | None = None, loop_ms: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.host_ms, self.loop_ms = dict(host_ms or {}), dict(loop_ms or {})
        self.host_same_ms: dict = {}
        self.host_rotating_ms: dict = {}


def restrict(ms: dict, names) -> Timings:
    """`ms` with only these functions' times (and host times), its loop costs kept."""
    return Timings({m: {k: v[k] for k in names if k in v} for m, v in ms.items()},
                   host_ms={k: v for k, v in getattr(ms, "host_ms", {}).items() if k in names},
                   loop_ms=getattr(ms, "loop_ms", None))


def rotating_sets(inputs, generator_device: str = "cpu") -> list[tuple]:
    """The input sets kernellab.bench turns through on this GPU (enough that together they are twice the L2), or []
    where there is no GPU or only one set."""
    import torch

    if not torch.cuda.is_available():
        return []
    from kernellab.run.measure.bench import _input_sets

    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0)
    sets = _input_sets(inputs, l2 or 64 * 2**20, True, 0, generator_device)
    return sets if len(sets) > 1 else []


def sustained_loop_ms(calls: int = 200) -> dict[str, float]:
    """What kernellab.bench(sustained=True) queues around each call, measured on this GPU with the clock it uses
    (CudaClock(spin=False)): {"host": host ms a call of its L2 flush and two event records, "flush": the flush's
    GPU ms}."""
    import time

    import torch

    from kernellab.run.measure.bench import CudaClock

    clock = CudaClock(spin=False)
    event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    with torch.cuda.device(clock.dev):
        starts, ends = [event() for _ in range(calls)], [event() for _ in range(calls)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s, e in zip(starts, ends):
            clock.flush()
            s.record()
            e.record()
        host = (time.perf_counter() - t0) / calls * 1e3
        first, last = event(), event()
        first.record()
        for _ in range(20):
            clock.flush()
        last.record()
        last.synchronize()
    return {"host": host, "flush": first.elapsed_time(last) / 20}


def host_ms_per_call(f, args: tuple, *, gpu_ms: float | None = None, loops: int = 3,
                     arg_sets: list[tuple] | None = None) -> float:
    """Host milliseconds one call of f(*args) takes, as a loop of calls back to back pays them: time.perf_counter
    around `n` calls with the GPU synchronised before the loop and after the second reading, never inside, and
    kernellab launches not waiting (deferred_sync, as kernellab.bench times them); n queues about
    HOST_LOOP_GPU_MS of GPU work (gpu_ms a call; 10 to 200 calls, fewer than the launch queue holds, so the loop
    never waits for the GPU). The median of `loops` loops. arg_sets: call with these argument sets in turn instead
    (as kernellab.bench rotates its input sets to beat L2), `args` first."""
    import time

    import torch

    from kernellab.run.launch.launch import deferred_sync

    n = max(10, min(200, round(HOST_LOOP_GPU_MS / max(gpu_ms or 0.1, 1e-3))))
    cuda = torch.cuda.is_available()
    sets = [tuple(args)] + [tuple(a) for a in arg_sets or ()]
    calls = [sets[k % len(sets)] for k in range(n)]
    out = []
    with deferred_sync():
        for a in sets:
            f(*a)
        for _ in range(loops):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for a in calls:
                f(*a)
            out.append((time.perf_counter() - t0) / n * 1e3)
            if cuda:
                torch.cuda.synchronize()
    return statistics.median(out)


def time_as_called(fns: dict, inputs, *, flops=None, quick: bool = False,
                   generator_device: str = "cpu", only: dict[str, tuple[str, ...]] | None = None,
                   min_reps: int = 20, max_reps: int = 10_000, host: bool = True) -> Timings:
    """{method: {name: median ms}} for every function of `fns` (name -> f(*args)) on `inputs` (a tuple, or
    inputs(generator) -> tuple, the generator on `generator_device`), the three methods in METHODS; a method that
    cannot run here is left out. only: {method: names} times just those functions by that method (the first of
    `fns` always); min_reps, max_reps: kernellab.bench's bounds on repetitions (and warm-up calls) per function.
    host: also measure the host ms per call of each function timed sustained (host_ms_per_call), kept as the
    result's `host_ms`, and sustained's own costs a call (sustained_loop_ms, on a GPU) as its `loop_ms`."""
    import torch

    def chosen(method):
        keep = (only or {}).get(method)
        return {n: f for i, (n, f) in enumerate(fns.items()) if keep is None or i == 0 or n in keep}

    opts = dict(rounds=4 if quick else 8, rep_ms=40 if quick else 80, warmup_ms=20, min_reps=min_reps,
                max_reps=max_reps)
    out: dict[str, dict[str, float]] = {}
    for method, extra in (("kernellab.bench", {}), ("sustained", {"sustained": True})):
        these = chosen(method)
        first, *rest = these
        r = kernellab.bench(these[first], inputs, baselines={n: these[n] for n in rest}, flops=flops, name=first,
                            generator_device=generator_device, **opts, **extra)
        out[method] = {first: r.median_ms, **{b.name: b.median_ms for b in r.baselines}}
    args = inputs(torch.Generator(generator_device).manual_seed(0)) if callable(inputs) else tuple(inputs)
    timings = Timings(out)
    if host:                                   # what why() compares sustained times with
        sets = rotating_sets(inputs, generator_device)
        for n, f in chosen("sustained").items():
            gpu_ms = out["kernellab.bench"].get(n)
            timings.host_same_ms[n] = host_ms_per_call(f, args, gpu_ms=gpu_ms)
            if sets:
                timings.host_rotating_ms[n] = host_ms_per_call(f, sets[0], gpu_ms=gpu_ms, arg_sets=sets[1:])
            timings.host_ms[n] = max(timings.host_same_ms[n], timings.host_rotating_ms.get(n, 0.0))
        if "sustained" in out and torch.cuda.is_available():
            timings.loop_ms = sustained_loop_ms()
    try:
        from triton.testing import do_bench
    except ImportError:
        return timings
    timings["do_bench"] = {n: float(do_bench(lambda f=f: f(*args), warmup=25,
                                             rep=(50 if only else 100) if quick else 200, return_mode="median"))
                           for n, f in chosen("do_bench").items()}
    return timings


def host_bound(ms: dict[str, dict[str, float]], host_ms: dict[str, float] | None, name: str,
               loop_ms: dict[str, float] | None = None) -> bool:
    """Whether `name`'s sustained time is host time: it rose above the kernel (kernellab.bench, host hidden) by more
    than 5 %, and the host cannot keep the GPU fed. Back to back, a call's host path runs while the GPU flushes L2
    for it; where the loop's host time a call (the call's, plus the flush's and the events' queuing, loop_ms["host"])
    reaches the GPU's (the flush, loop_ms["flush"], plus the kernel; HOST_BOUND_SLACK of it: the margin jitter
    needs), the GPU waits for the call and the events around it time that wait. Without loop_ms, the weaker test:
    the host time a call covers the rise (HOST_BOUND_SLACK of it)."""
    h = (host_ms or {}).get(name)
    s, b = ms.get("sustained", {}).get(name), ms.get("kernellab.bench", {}).get(name)
    if h is None or s is None or b is None or s <= 1.05 * b:
        return False
    if loop_ms:
        return h + loop_ms["host"] >= HOST_BOUND_SLACK * (loop_ms["flush"] + b)
    return h >= HOST_BOUND_SLACK * (s - b)


def why(ratios: dict[str, float], ms: dict[str, dict[str, float]], name: str, baseline: str,
        host_ms: dict[str, float] | None = None, loop_ms: dict[str, float] | None = None) -> str:
    """Why the methods' ratios for `name` against `baseline` differ by more than 5 % (empty where they agree).
    host_ms: {name: host ms per call}, loop_ms: sustained's own costs a call (default: ms.host_ms and ms.loop_ms,
    where time_as_called measured them)."""
    values = [v for v in ratios.values() if v]
    if len(values) < 2 or max(values) / min(values) <= 1.05:
        return ""
    host = host_ms if host_ms is not None else getattr(ms, "host_ms", None) or {}
    loop = loop_ms if loop_ms is not None else getattr(ms, "loop_ms", None) or {}
    mid = statistics.median(values)
    odd = max(ratios, key=lambda m: abs(ratios[m] / mid - 1))
    if odd == "do_bench":
        ours, theirs = ms["do_bench"][name], ms["kernellab.bench"][name]
        hosted = f" (host {host[name] * 1e3:.0f} µs a call)" if name in host else ""
        return (f"do_bench does not hide host time and clears L2 with a 256 MB memset: {name} takes "
                f"{ours * 1e3:.0f} µs there against {theirs * 1e3:.0f} µs under kernellab.bench{hosted}, so its host "
                f"path (launch_overhead.py --ops) or its cold-L2 start weighs differently against {baseline}'s")
    if odd == "sustained":
        bound = [w for w in (name, baseline) if host_bound(ms, host, w, loop)]
        if bound:
            def said(w):
                b = ms["kernellab.bench"][w]
                per_call = (f" ({(host[w] + loop['host']) * 1e3:.0f} µs of host with the flush's and events' queuing, "
                            f"against {(loop['flush'] + b) * 1e3:.0f} µs of GPU with the flush)" if loop else "")
                return (f"{w} host-bound back to back: host {host[w] * 1e3:.0f} µs a call against a kernel of "
                        f"{b * 1e3:.0f} µs (sustained {ms['sustained'][w] * 1e3:.0f} µs){per_call}: behind "
                        f"sustained's L2 flush and nothing else, a call whose host path outlasts the flush leaves "
                        f"the GPU waiting for it, and the events time host work, not the clock")
            return "; ".join(said(w) for w in bound)
        measured = [w for w in (name, baseline) if w in host]
        if loop:
            note = "; not host time: " + ", ".join(
                f"{w} {host[w] * 1e3:.0f} µs a call on the host (+{loop['host'] * 1e3:.0f} µs the flush's and "
                f"events' queuing) under {(loop['flush'] + ms['kernellab.bench'][w]) * 1e3:.0f} µs of GPU a call "
                f"with the flush" for w in measured) if measured else ""
        else:
            note = ("; not host time: " + ", ".join(f"{w} {host[w] * 1e3:.0f} µs a call on the host" for w in measured)
                    + ", less than the sustained times rose") if measured else ""
        return (f"sustained: calls back to back, the GPU at its power-capped clock and never idle between the L2 "
                f"flush and the call; {name} and {baseline} split their time differently between DRAM and the SMs "
                f"(and draw different power), so the clock moves them differently{note}")
    return "kernellab.bench idles the GPU between batches (below the power cap); the other two do not"


def rows_for(ms: dict[str, dict[str, float]], baseline: str, host_ms: dict[str, float] | None = None,
             loop_ms: dict[str, float] | None = None) -> list[dict]:
    """One row per function other than `baseline`: ms and speed-up (baseline ms / ms) per method, the host ms per
    call where measured (host_ms, default ms.host_ms; loop_ms, default ms.loop_ms: see why), and why they differ."""
    host = host_ms if host_ms is not None else getattr(ms, "host_ms", None) or {}
    loop = loop_ms if loop_ms is not None else getattr(ms, "loop_ms", None) or {}
    names = [n for n in next(iter(ms.values())) if n != baseline]
    rows = []
    for n in names:
        ratios = {m: ms[m][baseline] / ms[m][n] for m in METHODS if m in ms and ms[m].get(n)}
        rows.append({"name": n, "ms": {m: ms[m][n] for m in ms}, "baseline_ms": {m: ms[m][baseline] for m in ms},
                     "host_ms": {k: host[k] for k in (n, baseline) if k in host},
                     "ratio": ratios, "why": why(ratios, ms, n, baseline, host, loop)})
    return rows


def markdown(rows: list[dict], label: str, baseline: str) -> str:
    """The table: one line per function and shape, the speed-up against `baseline` by each method."""
    head = (f"| {label} | " + " | ".join(f"vs {baseline}, {m}" for m in METHODS)
            + " | ms (kernellab.bench / do_bench / sustained) | why they differ |")
    lines = [head, "|" + "---|" * (len(METHODS) + 3)]
    for r in rows:
        cells = [f"{r['ratio'][m]:.2f}x" if m in r["ratio"] else "-" for m in METHODS]
        times = " / ".join(f"{r['ms'][m]:.3f}" if m in r["ms"] else "-" for m in METHODS)
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {times} | {r['why'] or '-'} |")
    return "\n".join(lines)
