"""Timing ops as a user calls them, three ways in one run: kernellab.bench, triton.testing.do_bench and
kernellab.bench(sustained=True); every ratio from the same run, and a reason wherever two ways disagree by > 5 %.

Method. Each function is called as a model calls it (a registered op, its launch path and output allocation
included) on the same arguments. kernellab.bench: CUDA events per call, L2 flushed by writing a buffer twice the L2
before each call, calls queued behind a spin so that host time is hidden, batches at most half the GPU's time
(below the power cap), medians over alternating rounds. triton.testing.do_bench: CUDA events per call, L2 cleared
by zeroing a 256 MB buffer before each call, calls not queued: a call whose host time exceeds its kernel's GPU time
is timed at its host time. sustained=True: kernellab.bench with calls back to back after a 500 ms warm-up, as a
training loop runs them (the GPU at its power cap).
"""
from __future__ import annotations

import statistics

import kernellab

METHODS = ("kernellab.bench", "do_bench", "sustained")


def time_as_called(fns: dict, inputs, *, flops=None, quick: bool = False,
                   generator_device: str = "cpu", only: dict[str, tuple[str, ...]] | None = None,
                   min_reps: int = 20, max_reps: int = 10_000) -> dict[str, dict[str, float]]:
    """{method: {name: median ms}} for every function of `fns` (name -> f(*args)) on `inputs` (a tuple, or
    inputs(generator) -> tuple, the generator on `generator_device`), the three methods in METHODS; a method that
    cannot run here is left out. only: {method: names} times just those functions by that method (the first of
    `fns` always); min_reps, max_reps: kernellab.bench's bounds on repetitions (and warm-up calls) per function."""
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
    try:
        from triton.testing import do_bench
    except ImportError:
        return out
    args = inputs(torch.Generator(generator_device).manual_seed(0)) if callable(inputs) else tuple(inputs)
    out["do_bench"] = {n: float(do_bench(lambda f=f: f(*args), warmup=25, rep=(50 if only else 100) if quick else 200,
                                         return_mode="median")) for n, f in chosen("do_bench").items()}
    return out


def why(ratios: dict[str, float], ms: dict[str, dict[str, float]], name: str, baseline: str) -> str:
    """Why the methods' ratios for `name` against `baseline` differ by more than 5 % (empty where they agree)."""
    values = [v for v in ratios.values() if v]
    if len(values) < 2 or max(values) / min(values) <= 1.05:
        return ""
    mid = statistics.median(values)
    odd = max(ratios, key=lambda m: abs(ratios[m] / mid - 1))
    if odd == "do_bench":
        ours, theirs = ms["do_bench"][name], ms["kernellab.bench"][name]
        return (f"do_bench does not hide host time and clears L2 with a 256 MB memset: {name} takes "
                f"{ours * 1e3:.0f} µs there against {theirs * 1e3:.0f} µs under kernellab.bench, so its host path "
                f"(launch_overhead.py --ops) or its cold-L2 start weighs differently against {baseline}'s")
    if odd == "sustained":
        return (f"sustained: calls back to back, the GPU at its power-capped clock and never idle between the L2 "
                f"flush and the call; {name} and {baseline} split their time differently between DRAM and the SMs "
                f"(and draw different power), so the clock moves them differently")
    return "kernellab.bench idles the GPU between batches (below the power cap); the other two do not"


def rows_for(ms: dict[str, dict[str, float]], baseline: str) -> list[dict]:
    """One row per function other than `baseline`: ms and speed-up (baseline ms / ms) per method, and why they
    differ."""
    names = [n for n in next(iter(ms.values())) if n != baseline]
    rows = []
    for n in names:
        ratios = {m: ms[m][baseline] / ms[m][n] for m in METHODS if m in ms and ms[m].get(n)}
        rows.append({"name": n, "ms": {m: ms[m][n] for m in ms}, "baseline_ms": {m: ms[m][baseline] for m in ms},
                     "ratio": ratios, "why": why(ratios, ms, n, baseline)})
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
