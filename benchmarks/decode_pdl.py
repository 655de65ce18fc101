"""A decode step as a model meets it: the kernel before attention (the producer) and then tutorial 09's decode, timed
as a whole step with the decode launched plainly and as a programmatic dependent launch (PDL, sm_90) behind the
producer. What `python3 benchmarks/attention_inference.py --part decode --pdl` runs (`tools/gpu/run.py
bench-decode-pdl`).

Method. B = 1, Hq 32 over Hkv 8, d = 128, bf16, one new token, caches of 1k, 8k, 32k and 128k positions. The
producer is tutorial 09's decode_append (the new token's q, k, v from the QKV projection's output into q, the cache's
last row and cache_seqlens: everything the decode reads but the older rows; it calls griddepcontrol.launch_dependents
first), and at 8k also "qkv projection + append": x [1, 4096] @ W_qkv [4096, 6144] (cuBLAS, 50 MB of weights, the
realistic producer at B = 1) before it. Functions, each as called (the registered ops, kernellab.bench, do_bench and
sustained through benchmarks/as_called.py, every ratio from one run):
- producer alone; decode alone (torch.ops.kl.decode_attention on the state the producer leaves: today's figure);
- step: producer, then torch.ops.kl.decode_attention; step, PDL: producer, then torch.ops.kl.decode_attention_pdl;
- and in a CUDA graph (what serving frameworks replay a decode step from): 20 steps captured, each behind a 2 x L2
  flush (a memset), the flushes' own graph subtracted: per-step µs with the host out of the way.
Decode's share of the copy bandwidth kernellab measures is given both ways: decode alone (bytes / its time), and in
the step (bytes / (step - producer alone)). The decode output is checked against SDPA (float32, enable_gqa; the cache
is full, so no mask) and the PDL step's output against the plain step's, bit for bit.

Prediction (written before the GPU ran it; `prediction` below: benchmarks/decode_profile.py's latency model with its
H100 constants, printed beside each measured row): at 8k the decode kernel is 20.8 µs under Nsight Compute (9.0 of it
the fixed part: floor 2.6, dispatch ramp 1.3, cache_seqlens' DRAM trip 1.0, in-block merge 0.5, merge tail 3.6) plus
2.5 µs of launch as called: 23.3 µs, 48 % of copy alone. In a step with the host ahead (kernellab.bench queues
calls), the decode's launch overlaps the producer and only the gap between the two kernels (~1 µs) is added: step -
producer 21.8 µs (51 %). With PDL the decode's blocks are placed while the producer runs: its grid start (half the
floor), the ramp, the gap, cache_seqlens from L2 (the producer just wrote it: 0.6 µs saved) and each warp's first tile
prefetched into L2 (0.6) could leave the critical path, 4.8 µs, but no more than the producer lasts (decode_append:
assumed 2.5 µs on the GPU): 19.3 µs, **58 % of copy at 8k, not 80 %** (the merge tail and the stream's own DRAM
latency come after the wait). 1k 12 / 14 / 19 %, 32k 78 / 81 / 84 %, 128k 96 / 97 / 98 % (alone / step / step with
PDL). The step as a whole 2.5 µs faster at every cache (~1.2x at 1k, ~1.1x at 8k). The QKV projection producer does
not change the decode's gain (its GEMV ends before the append starts: the PDL edge is append -> decode). Under CUDA
graphs the same gain, the launch gaps smaller in both.
"""
from __future__ import annotations

import statistics

CACHES = (1024, 8192, 32768, 131072)
QKV_CACHES = (8192,)                   # the projection producer (50 MB of weights a call) at these caches only
B, HQ, HKV, D = 1, 32, 8, 128
GRAPH_STEPS = 20
PRODUCER, DECODE, STEP, STEP_PDL = "producer alone", "decode alone", "step", "step, PDL"


def _moved(L, B=B, Hq=HQ, Hkv=HKV, d=D):
    return 2 * B * Hkv * L * d * 2 + 2 * B * Hq * d * 2


GAP_US = 1.0               # between two kernels queued on one stream: the second's launch and start after the first
PRODUCER_KERNEL_US = 2.5   # decode_append on the GPU: a grid of 48 small blocks, its floor (an assumption, not fitted)


def prediction(L, machine=None, producer_us=PRODUCER_KERNEL_US, copy_gbps=3000.0) -> dict:
    """The latency model's prediction (benchmarks/decode_profile.py's decode_model, H100 constants) at B = 1, Hq 32 /
    Hkv 8, d = 128: decode's µs and share of copy alone (kernellab.bench with a clean L2: launch + kernel), in the
    step (the kernel + the gap to the producer: its launch overlaps the producer), and in the step with PDL (less
    what the producer's run hides: half the kernel floor (the grid's start), the dispatch ramp, the gap,
    cache_seqlens read from L2 instead of DRAM and the first tile prefetched into L2; no more than the producer
    lasts)."""
    import decode_profile as dp

    m = machine or dp.H100
    model = dp.decode_model(B, L, dp.profile_plan(B, L), m)
    saved_trip = m.dram_latency_us - m.l2_latency_us
    hideable = m.kernel_floor_us / 2 + model.ramp_us + GAP_US + 2 * saved_trip
    us = {"alone": model.clean_us, "step": model.ncu_us + GAP_US,
          "step, PDL": model.ncu_us + GAP_US - min(producer_us, hideable)}
    copy_us = _moved(L) / (copy_gbps * 1e3)
    return {"us": us, "of_copy": {k: copy_us / v for k, v in us.items()}, "hideable_us": hideable}


def graph_us(torch, fn, args, flush, steps=GRAPH_STEPS, replays=7) -> float:
    """Per-step µs of `fn(*args)` replayed from a CUDA graph of `steps` calls, each behind `flush` (a memset of twice
    the L2), less the same graph of flushes alone; medians over `replays`."""
    def make(body):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body()                                                   # warm-up on the capturing stream
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(steps):
                    body()
        torch.cuda.current_stream().wait_stream(s)
        return g

    def timed(g):
        g.replay()
        out = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / steps)
        return statistics.median(out)

    with_fn = make(lambda: (flush.zero_(), fn(*args)))
    alone = make(lambda: flush.zero_())
    return timed(with_fn) - timed(alone)


def run(t, torch, copy_gbps, *, quick=False, caches=CACHES, qkv_caches=QKV_CACHES, log=print, time_fn=None,
        graph_fn=None, device="cuda", ops=None, shape=(B, HQ, HKV, D)):
    """The rows (one per cache and producer); CPU tests pass `time_fn(fns, inputs)` and `graph_fn(fn, args)` for the
    timings, `device`, `ops` (the plain and the PDL decode, for the registered ops) and a small `shape` (B, Hq, Hkv,
    d)."""
    B, HQ, HKV, D = shape
    from kernellab.run.launch.launch import deferred_sync

    F = torch.nn.functional
    if time_fn is None:
        from as_called import time_as_called

        def time_fn(fns, inputs):
            return time_as_called(fns, inputs, quick=quick, generator_device=device, host=False)
    if graph_fn is None:
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 * 2**20)
        flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)

        def graph_fn(fn, args):
            return graph_us(torch, fn, args, flush)
    append = t["decode_append"]
    plain_op, pdl_op = ops or (torch.ops.kl.decode_attention, torch.ops.kl.decode_attention_pdl)
    dtype = torch.bfloat16
    rows = []
    cases = [(L, "append") for L in caches] + [(L, "qkv projection + append") for L in qkv_caches]
    for L, producer in cases:
        H = HQ + 2 * HKV

        def inputs(g, L=L, producer=producer):
            kc, vc = (torch.randn(B, HKV, L, D, generator=g, device=device).to(dtype) for _ in range(2))
            x = torch.randn(B, HQ * D, generator=g, device=device).to(dtype)
            w = ((torch.randn(HQ * D, H * D, generator=g, device=device) * (HQ * D) ** -0.5).to(dtype)
                 if producer != "append" else x[:0])                  # the projection's weights where it runs
            qkv = torch.randn(B, H, 1, D, generator=g, device=device).to(dtype)
            old = torch.full((B,), L - 1, dtype=torch.int32, device=device)   # the new row is the cache's last
            q = qkv[:, :HQ].clone()                                  # what the producer writes: decode alone reads
            sl = torch.full((B,), L, dtype=torch.int32, device=device)  # them before any step has run on this set
            return qkv, x, w, kc, vc, old, q, sl

        if producer == "append":
            def produce(qkv, x, w, kc, vc, old, q, sl):
                return append(qkv, kc, vc, old, seqlens=sl, q=q)
        else:
            def produce(qkv, x, w, kc, vc, old, q, sl):
                return append((x @ w).view(B, H, 1, D), kc, vc, old, seqlens=sl, q=q)

        def step(*a, op):
            produce(*a)
            return op(a[6], a[3], a[4], a[7])

        fns = {STEP_PDL: lambda *a: step(*a, op=pdl_op), STEP: lambda *a: step(*a, op=plain_op),
               PRODUCER: produce, DECODE: lambda *a: plain_op(a[6], a[3], a[4], a[7])}
        args = inputs(torch.Generator(device).manual_seed(0))
        label = f"B={B} cache={L} producer: {producer}"
        with deferred_sync():                    # queued as timed: at the top level a launch would wait for its kernel
            plain_out = step(*args, op=plain_op).clone()
            pdl_out = step(*args, op=pdl_op)
        q, kc, vc, sl = args[6], args[3], args[4], args[7]
        ref = F.scaled_dot_product_attention(q.float(), kc.float(), vc.float(), enable_gqa=True)
        err = (pdl_out.float() - ref).abs().max().item()
        check = "passed"
        if sl.tolist() != [L] * B or err >= 3e-2:
            check = f"FAILED (max error against SDPA {err:.2e}, cache_seqlens {sl.tolist()})"
        elif not torch.equal(pdl_out, plain_out):
            check = "FAILED (the PDL step's output differs from the plain step's)"
        ms = time_fn(fns, inputs)
        us = {m: {n: v * 1e3 for n, v in ms[m].items()} for m in ms}
        us["CUDA graph"] = {n: graph_fn(fns[n], args) for n in (STEP_PDL, STEP, PRODUCER, DECODE)}
        moved = _moved(L, B, HQ, HKV, D)
        copy_us = moved / (copy_gbps * 1e3)
        share = {m: {"alone": copy_us / u[DECODE], "step": copy_us / max(u[STEP] - u[PRODUCER], 1e-9),
                     "step, PDL": copy_us / max(u[STEP_PDL] - u[PRODUCER], 1e-9)} for m, u in us.items()}
        row = {"label": label, "L": L, "producer": producer, "check": check, "us": us, "of_copy": share,
               "pdl_speedup": {m: u[STEP] / u[STEP_PDL] for m, u in us.items()}, "moved": moved}
        if (B, HQ, HKV, D) == (1, 32, 8, 128):
            row["predicted_of_copy"] = prediction(L, copy_gbps=copy_gbps)["of_copy"]
        rows.append(row)
        k = "kernellab.bench" if "kernellab.bench" in us else next(iter(us))
        u, s = us[k], share[k]
        log(f"{label:46s} [{k}] producer {u[PRODUCER]:7.1f} us, decode alone {u[DECODE]:7.1f} us ({s['alone']:4.0%} "
            f"of copy), step {u[STEP]:7.1f} us (decode {s['step']:4.0%}), step with PDL {u[STEP_PDL]:7.1f} us "
            f"(decode {s['step, PDL']:4.0%}): {row['pdl_speedup'][k]:.2f}x"
            + (f"  [predicted {row['predicted_of_copy']['alone']:.0%} / {row['predicted_of_copy']['step']:.0%} / "
               f"{row['predicted_of_copy']['step, PDL']:.0%}]" if "predicted_of_copy" in row else "")
            + ("" if check == "passed" else "  " + check))
    return rows


def table(rows, copy_gbps) -> str:
    """The markdown table: per case and timing method, the step with and without PDL and decode's share of copy."""
    out = [f"| decode step (copy {copy_gbps / 1e3:.2f} TB/s) | method | check | producer us | decode alone us | "
           "step us | step with PDL us | PDL speedup | decode of copy: alone | in the step | in the step with PDL | "
           "predicted (model): alone / step / step with PDL |",
           "|" + "---|" * 12]
    for r in rows:
        for m, u in r["us"].items():
            s = r["of_copy"][m]
            out.append(f"| {r['label']} | {m} | {r['check']} | {u[PRODUCER]:.1f} | {u[DECODE]:.1f} | {u[STEP]:.1f} | "
                       f"{u[STEP_PDL]:.1f} | {r['pdl_speedup'][m]:.2f}x | {s['alone']:.0%} | {s['step']:.0%} | "
                       f"{s['step, PDL']:.0%} | " + (" / ".join(f"{r['predicted_of_copy'][k]:.0%}" for k in
                                                                 ("alone", "step", "step, PDL"))
                                                        if "predicted_of_copy" in r else "-") + " |")
    eights = [r for r in rows if r["L"] == 8192 and r["producer"] == "append"]
    if eights:
        r = eights[0]
        k = "kernellab.bench" if "kernellab.bench" in r["of_copy"] else next(iter(r["of_copy"]))
        out.append(f"\ndecode at B = 1 8k behind its producer ({k}): {r['of_copy'][k]['alone']:.0%} of copy alone, "
                   f"{r['of_copy'][k]['step']:.0%} in the step, {r['of_copy'][k]['step, PDL']:.0%} in the step with "
                   f"PDL (target 80 %; the latency model predicted "
                   + " / ".join(f"{v:.0%}" for v in prediction(8192, copy_gbps=copy_gbps)["of_copy"].values()) + ")")
    speedups = [v for r in rows for v in r["pdl_speedup"].values()]
    if speedups:
        out.append(f"PDL step over the plain step, every case and method: {min(speedups):.2f}x to "
                   f"{max(speedups):.2f}x")
    return "\n".join(out)
