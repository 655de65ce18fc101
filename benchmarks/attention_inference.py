"""Tutorial 09's kernels against PyTorch: grouped-query attention (forward) and flash-decoding, timed as called.

    python3 benchmarks/attention_inference.py [--quick] [--part gqa|decode|both] [--out DIR]
    python3 benchmarks/attention_inference.py --part decode --profile [--out DIR]   # why small caches are slow
    python3 benchmarks/attention_inference.py --part decode --floor [--out DIR]     # the split floor's default
    python3 benchmarks/attention_inference.py --part decode --pdl [--quick] [--out DIR]   # a decode step, with PDL

Method. The kernels and launchers are the tutorial's own (the `%%cuda` and `# launchers` cells of
notebooks/09-attention-inference.py, compiled by NVRTC as the magic compiles them); each is called through its
registered op (torch.ops.kl.gqa_attention, torch.ops.kl.decode_attention), launch path and allocations included.
Every function is timed three ways in one run (benchmarks/as_called.py): kernellab.bench, triton's do_bench and
kernellab.bench(sustained=True); every ratio is baseline time / our time from the same method and run.
- GQA grid: N 128..16k, d 64 and 128, causal and not, B * Hq from 16 to 512, GQA ratios 1, 4, 8, in bf16 (fp16 with
  --dtypes), against three PyTorch baselines: SDPA FLASH on K, V expanded to Hq heads beforehand (the expansion
  outside the timing: the FLASH kernel alone, the issue's "SDPA FLASH"), SDPA with enable_gqa=True as PyTorch
  dispatches it (the backend it picks, torch._fused_sdp_choice, is printed per case) and SDPA CUDNN forced (with
  enable_gqa where cuDNN takes it, else on K, V expanded beforehand; the table says which). "ours" is the op
  (kl::gqa_attention: on sm_90 the wgmma step where tutorial 09's gqa_step picks it, else the mma.sync kernel); both
  kernels are also timed through their own launchers, and a second table compares them and the op's choice.
- Decoding: one token (--nq), Hq = 32 over Hkv = 8, d = 128, bf16, caches of 1k..128k positions (all full, so every
  SDPA backend can run without a mask), B 1..32; against each SDPA backend that accepts the case with enable_gqa
  (those that refuse it are skipped, one line says which and why), and torch.compile of the grouped-matmul version
  (decode_torch in tutorial 09's launchers). Reported as a fraction of the copy bandwidth kernellab measures
  (kernellab.run.measure.ceilings: a device-to-device copy, read + write bytes) and against the fastest PyTorch path
  of the same method. "ours" is the op (one launch: the last block of each (sequence, KV head) merges the split
  partials); the tutorial's previous step (split kernel + combine kernel, decode_attention_two_kernels) is timed
  beside it, and at B = 1 with caches up to 8k (SWEEP_CASES) the fused launcher with other split floors
  (min_keys, the plan's fewest keys a split) so that the plan's choice is checked against its neighbours; at B = 1
  the decode variants merge="online" and merge="online", early=True (benchmarks/decode_profile.py's predictions),
  timed as called beside the op, one line each over the default.
--floor (with --part decode): the plan's default split floor (tutorial 09's decode_floor) against min_keys 64, 16
and 32 at B = 1, caches 512 to 8k, a line per cache with the ratio (benchmarks/decode_profile.py floor_sweep).
Each case is checked once before it is timed, against SDPA (GQA: enable_gqa in the same dtype; decoding: float32, or
the float64 reference with several tokens); a failed check is printed and its row marked.
The last thing printed is the two tables.
--pdl (with --part decode): a decode step as a model meets it, the producer kernel (tutorial 09's decode_append; at
8k also a QKV projection before it) then the decode, plain and as a programmatic dependent launch (PDL) behind the
producer, at B = 1 and caches 1k-128k: decode's share of copy alone and in the step (benchmarks/decode_pdl.py).
--profile (with --part decode): the decode's latency model, Nsight Compute on its kernel and the op's time by L2 state
at B = 1 (1k, 8k, 128k) and B = 32 (8k), then what each outcome means (benchmarks/decode_profile.py).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))

NOTEBOOK = "09-attention-inference.py"
# (N, B * Hq): B * Hq from 512 at short N down to 16 at 16k
GQA_GRID = ((128, 512), (512, 512), (1024, 256), (2048, 128), (4096, 64), (8192, 32), (16384, 16))
# --quick: N = 1024 checks where the op's d = 64 choice moves to the wgmma step; G = 4 only (G = 8 measured within
# 4 % of it at every quick case on an H100, both kernels)
GQA_QUICK = ((512, 512), (1024, 256), (4096, 64))
QUICK_RATIOS = (4,)
RATIOS = (1, 4, 8)
DECODE_CACHES = (1024, 4096, 8192, 32768, 131072)
DECODE_B = (1, 4, 8, 32)
DECODE_QUICK = ((1, 1024), (1, 8192), (1, 131072), (8, 32768), (32, 8192))
TARGET_OF_COPY = 0.80          # decoding, caches of 8k and more
TWO_KERNELS = "two-kernel step (split + combine)"
ONLINE_STEP = "ours, merge=online"      # decode_attention(merge="online"): the last block's merge in one pass
BOTH_STEP = "ours, merge=online, early"  # and each warp's first tile asked for before cache_seqlens arrives
SWEEP_MIN_KEYS = (16, 32, 64)   # beside the plan's default (tutorial 09's decode_floor: 32 at B = 1 1k, 64 at 8k)
SWEEP_CASES = ((1, 1024), (1, 8192))
DEVICE = "cuda"                # (tests/test_attention_inference.py runs both loops on the CPU with fake timings)
FLASH_EXPANDED = "SDPA flash (K/V expanded beforehand)"
SDPA_DEFAULT = "SDPA enable_gqa (PyTorch's choice)"
SDPA_CUDNN = "SDPA cudnn"
GQA_BASELINES = (FLASH_EXPANDED, SDPA_DEFAULT, SDPA_CUDNN)
MMA = "mma.sync kernel"
WGMMA = "wgmma step (sm_90)"


def log(*parts):
    print(" ".join(str(p) for p in parts), flush=True)


def attempt(what, fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - report and go on
        log(f"  ! {what}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        traceback.print_exc(file=sys.stderr)
        return None


_SKIPPED: set = set()


def refusal(fn, *args):
    """Why `fn(*args)` cannot run (an SDPA backend that does not take the case: its own warning, one line), or None
    where it runs. Quiet: PyTorch's warnings and the traceback are not printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(*args)
            return None
        except RuntimeError as exc:
            said = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
            said = [m for m in said if m and not m.endswith("because:") and "runtime disabled" not in m]
            text = said[0] if said else str(exc).strip().splitlines()[0]
            return text.split(". ")[0].rstrip(".")[:160]        # its first sentence: the same for every shape


def note_skipped(name, reason):
    """One line per backend and reason, the first time it is met."""
    if (name, reason) not in _SKIPPED:
        _SKIPPED.add((name, reason))
        log(f"  (skipping {name} where it refuses the case: {reason})")


def sdpa_choice(torch, q, k, v, causal):
    """The SDPA backend PyTorch dispatches to for these inputs with enable_gqa=True."""
    from torch.nn.attention import SDPBackend

    code = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, enable_gqa=True)
    return next((n for n, b in SDPBackend.__members__.items() if int(b) == code), str(code)).lower()


def gqa_rows(t, torch, quick, dtypes, methods_quick, shapes=None, ratios=None, op=None):
    from as_called import time_as_called

    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # every function takes (q, k, v, k_expanded, v_expanded): the expansion to Hq heads is made with the inputs,
    # outside the timing
    def flash_expanded(causal):
        def run(q, k, v, ke, ve):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
        return run

    def sdpa_gqa(causal):
        return lambda q, k, v, ke, ve: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def cudnn(causal, expanded):
        def run(q, k, v, ke, ve):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                if expanded:
                    return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return run

    op = op or torch.ops.kl.gqa_attention                  # the registered op (a CPU test passes a stand-in)
    # the wgmma step where it runs: sm_90 (the CPU test's stand-in tutorial has both kernels)
    hopper = "gqa_attention_wgmma" in t and (DEVICE == "cpu" or torch.cuda.get_device_capability() == (9, 0))
    rows = []
    grid = shapes or (GQA_QUICK if quick else GQA_GRID)
    for dtype in dtypes:
        for N, bh in grid:
            for d in (64, 128):
                for causal in (False, True):
                    for ratio in ratios or (QUICK_RATIOS if quick else RATIOS):
                        Hq = min(32, bh)
                        B, Hkv = bh // Hq, Hq // ratio

                        def inputs(g, B=B, Hq=Hq, Hkv=Hkv, N=N, d=d, G=ratio):
                            q = torch.randn(B, Hq, N, d, generator=g, device=DEVICE).to(dtype)
                            k, v = (torch.randn(B, Hkv, N, d, generator=g, device=DEVICE).to(dtype) for _ in range(2))
                            return q, k, v, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)

                        label = f"{str(dtype)[6:]} N={N} d={d} B*Hq={bh} G={ratio}{' causal' if causal else ''}"
                        args = inputs(torch.Generator(DEVICE).manual_seed(0))
                        q, k, v = args[:3]
                        err = (op(q, k, v, causal).float()                                  # against SDPA, same dtype
                               - sdpa_gqa(causal)(*args).float()).abs().max().item()
                        tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
                        ok = err < tol
                        choice = sdpa_choice(torch, q, k, v, causal)
                        fns = {"ours": lambda q, k, v, ke, ve, c=causal: op(q, k, v, c),
                               FLASH_EXPANDED: flash_expanded(causal), SDPA_DEFAULT: sdpa_gqa(causal)}
                        cudnn_how = None
                        for expanded in (False, True):
                            why = refusal(cudnn(causal, expanded), *args)
                            if why is None:
                                fns[SDPA_CUDNN], cudnn_how = cudnn(causal, expanded), \
                                    "K/V expanded beforehand" if expanded else "enable_gqa"
                                break
                            note_skipped(f"SDPA cudnn ({'K/V expanded' if expanded else 'enable_gqa'})", why)
                        steps = {MMA: "gqa_attention_mma"} | ({WGMMA: "gqa_attention_wgmma"} if hopper else {})
                        step_err = {}
                        for step, fn_name in steps.items():      # each kernel through its own launcher
                            fns[step] = lambda q, k, v, ke, ve, c=causal, f=t[fn_name]: f(q, k, v, c)
                            step_err[step] = attempt(f"{step} on {label}", lambda: (fns[step](*args).float() - sdpa_gqa(
                                causal)(*args).float()).abs().max().item())
                            if step_err[step] is None:
                                del fns[step]
                        ms = attempt(label, lambda: time_as_called(fns, inputs, quick=quick, generator_device=DEVICE))
                        if not ms:
                            continue
                        flops = 4 * B * Hq * N * N * d / (2 if causal else 1)
                        row = {"label": label, "check": "passed" if ok else f"FAILED (max error {err:.2e})",
                               "ms": ms, "tflops": flops / (ms["kernellab.bench"]["ours"] * 1e-3) / 1e12,
                               "sdpa_choice": choice, "cudnn_how": cudnn_how,
                               "vs": {b: {m: ms[m][b] / ms[m]["ours"] for m in ms} for b in fns
                                      if b not in ("ours", MMA, WGMMA)}}
                        picks = t["gqa_step"](q, N, d)
                        row["op_picks"] = picks
                        row["steps"] = {
                            step: {"check": "passed" if step_err[step] < tol else f"FAILED (max error {step_err[step]:.2e})",
                                   "tflops": flops / (ms["kernellab.bench"][step] * 1e-3) / 1e12}
                            for step in steps if step in fns}
                        if MMA in fns and WGMMA in fns:
                            row["wgmma_over_mma"] = {m: ms[m][MMA] / ms[m][WGMMA] for m in ms}
                            best = min((MMA, WGMMA), key=lambda st: ms["kernellab.bench"][st])
                            row["op_over_best_step"] = {m: ms[m][best] / ms[m]["ours"] for m in ms}
                        rows.append(row)
                        log(f"{label:44s} {row['tflops']:6.1f} TFLOP/s  " + "  ".join(
                            f"{r['kernellab.bench']:.2f}x {b}" for b, r in row["vs"].items())
                            + f"  [PyTorch picks {choice}; cudnn {cudnn_how or 'refused'}]"
                            + ("" if ok else "  " + row["check"]))
                        log(f"{'':44s} the op picks {picks}; " + ", ".join(
                            f"{st} {x['tflops']:.1f} TFLOP/s" + ("" if x["check"] == "passed" else f" {x['check']}")
                            for st, x in row["steps"].items()))
    return rows


def decode_rows(t, torch, quick, copy_gbps, nq, cases=None, op=None, steps=None):
    from as_called import time_as_called

    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    Hq, Hkv, d, dtype = 32, 8, 128, torch.bfloat16
    compiled = torch.compile(t["decode_torch"])
    backends = (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("SDPA cudnn", SDPBackend.CUDNN_ATTENTION), ("SDPA math", SDPBackend.MATH))
    cases = cases or (DECODE_QUICK if quick else [(B, L) for L in DECODE_CACHES for B in DECODE_B
                                                   if B * L <= 32 * 32768])
    op = op or torch.ops.kl.decode_attention              # the registered op (a CPU test passes a stand-in)
    rows = []
    for B, L in cases:
        def inputs(g, B=B, L=L):
            q = torch.randn(B, Hq, nq, d, generator=g, device=DEVICE).to(dtype)
            kc, vc = (torch.randn(B, Hkv, L, d, generator=g, device=DEVICE).to(dtype) for _ in range(2))
            return q, kc, vc, torch.full((B,), L, dtype=torch.int32, device=DEVICE)

        args = inputs(torch.Generator(DEVICE).manual_seed(0))
        ref = F.scaled_dot_product_attention(args[0].float(), args[1].float(), args[2].float(), enable_gqa=True,
                                             is_causal=False) if nq == 1 else t["decode_reference"](*args)
        err = (op(*args).float() - ref.float()).abs().max().item()
        # our other launches: the two-kernel step, and the split-floor sweep (launchers, not the op: the op takes
        # no min_keys); name -> function, checked like the op
        # (the decode variants at B = 1 only, where the fixed part matters and the suite's time allows)
        ours = steps(B, L) if steps else {TWO_KERNELS: t["decode_attention_two_kernels"]} | ({
            ONLINE_STEP: lambda *a: t["decode_attention"](*a, merge="online"),
            BOTH_STEP: lambda *a: t["decode_attention"](*a, merge="online", early=True)} if B == 1 else {}) | {
            f"ours, min_keys={mk}": (lambda *a, mk=mk: t["decode_attention"](*a, min_keys=mk))
            for mk in SWEEP_MIN_KEYS if (B, L) in SWEEP_CASES}
        ours_err = {name: attempt(f"{name} on B={B} cache={L}", lambda f=f: (f(*args).float() - ref.float()).abs()
                                  .max().item()) for name, f in ours.items()}
        fns = {"ours": lambda *a: op(*a), "torch.compile grouped matmul": compiled}
        fns |= {name: f for name, f in ours.items() if ours_err[name] is not None}
        for name, backend in backends:
            def run(q, kc, vc, sl, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            if nq != 1:
                continue
            why = refusal(run, *args)
            if why is None:
                fns[name] = run
            else:
                note_skipped(name, why)
        if attempt("torch.compile of decode_torch", lambda: compiled(*args)) is None:
            del fns["torch.compile grouped matmul"]                 # said why above; time the rest
        label = f"B={B} cache={L} nq={nq}"
        # the split-floor sweep under kernellab.bench only (its share of copy is read from that method)
        only = {m: tuple(n for n in fns if not n.startswith("ours, min_keys")) for m in ("do_bench", "sustained")}
        ms = attempt(label, lambda: time_as_called(fns, inputs, quick=quick, generator_device=DEVICE, only=only))
        if not ms:
            continue
        moved = 2 * B * Hkv * L * d * 2 + 2 * B * Hq * nq * d * 2
        of_copy = {m: moved / (ms[m]["ours"] * 1e-3) / 1e9 / copy_gbps for m in ms}
        best = {m: min((b for b in ms[m] if b != "ours" and b not in ours), key=lambda b: ms[m][b]) for m in ms}
        failed = [f"{name} FAILED (max error {e:.2e})" for name, e in ours_err.items() if e is not None and e >= 3e-2]
        row = {"label": label, "B": B, "L": L, "check": "passed" if err < 3e-2 else f"FAILED (max error {err:.2e})",
               "ms": ms, "of_copy": of_copy, "fastest_torch": best,
               "vs_fastest": {m: ms[m][best[m]] / ms[m]["ours"] for m in ms},
               "steps_check": failed,
               # the fused op over the two-kernel step (> 1: the fused is faster), and each sweep point's share of copy
               "vs_two_kernels": {m: ms[m][TWO_KERNELS] / ms[m]["ours"] for m in ms if TWO_KERNELS in ms[m]},
               # the default's time over the online merge's (> 1: the online merge is faster), every method
               "online_speedup": {m: ms[m]["ours"] / ms[m][ONLINE_STEP] for m in ms if ONLINE_STEP in ms[m]},
               "both_speedup": {m: ms[m]["ours"] / ms[m][BOTH_STEP] for m in ms if BOTH_STEP in ms[m]},
               "sweep_of_copy": {name: moved / (ms["kernellab.bench"][name] * 1e-3) / 1e9 / copy_gbps
                                 for name in ours if name not in (TWO_KERNELS, ONLINE_STEP, BOTH_STEP)
                                 and name in ms.get("kernellab.bench", {})},
               # host µs per call (as_called's host_ms, where measured): what sustained times once the host is slower
               "host_us": {n: v * 1e3 for n, v in (getattr(ms, "host_ms", None) or {}).items()}}
        rows.append(row)
        k = "kernellab.bench"
        log(f"{label:26s} {ms[k]['ours'] * 1e3:9.1f} us  {of_copy[k]:5.0%} of copy  {row['vs_fastest'][k]:.2f}x "
            f"{best[k]} ({ms[k][best[k]] * 1e3:.1f} us)"
            + (f"  {row['vs_two_kernels'][k]:.2f}x the two-kernel step ({ms[k][TWO_KERNELS] * 1e3:.1f} us)"
               if k in row["vs_two_kernels"] else "")
            + "".join(f"  [{n}: {v:.0%} of copy]" for n, v in row["sweep_of_copy"].items())
            + (f"  online merge {ms[k][ONLINE_STEP] * 1e3:.1f} us ({row['online_speedup'][k]:.2f}x the default)"
               if k in row["online_speedup"] else "")
            + (f"  online + early {ms[k][BOTH_STEP] * 1e3:.1f} us ({row['both_speedup'][k]:.2f}x)"
               if k in row["both_speedup"] else "")
            + ("  host per call: " + ", ".join(f"{n} {v:.1f} us" for n, v in row["host_us"].items()
                                               if n in ("ours", TWO_KERNELS, best[k])) if row["host_us"] else "")
            + ("" if row["check"] == "passed" else "  " + row["check"]) + "".join("  " + f for f in failed))
    return rows


def tables(gqa, dec, copy_gbps):
    from as_called import METHODS

    out = []
    if gqa:
        base = [b for b in GQA_BASELINES if any(b in r["vs"] for r in gqa)]
        out.append("| GQA case | TFLOP/s | check | PyTorch's choice | cudnn as | "
                   + " | ".join(f"vs {b}, {m}" for b in base for m in METHODS) + " |")
        out.append("|" + "---|" * (5 + len(base) * len(METHODS)))
        for r in gqa:
            cells = [f"{r['vs'][b][m]:.2f}x" if b in r["vs"] and m in r["vs"][b] else "-" for b in base for m in METHODS]
            out.append(f"| {r['label']} | {r['tflops']:.0f} | {r['check']} | {r.get('sdpa_choice', '-')} | "
                       f"{r.get('cudnn_how') or '-'} | " + " | ".join(cells) + " |")
        lows = [f"{b} {min(min(r['vs'][b].values()) for r in gqa if b in r['vs']):.2f}x" for b in base]
        out.append(f"\nGQA: lowest ratio over all methods (the expansion of K/V outside the timing): {'; '.join(lows)} "
                   f"(target 1.0x against {FLASH_EXPANDED}); cases >= 1.0x by every method: "
                   + "; ".join(f"{sum(min(r['vs'][b].values()) >= 1.0 for r in gqa if b in r['vs'])}/"
                               f"{sum(b in r['vs'] for r in gqa)} against {b}" for b in base))
    st = [r for r in gqa if "steps" in r]
    if st:
        out.append(f"\n| GQA case | the op picks | {MMA} TFLOP/s | {WGMMA} TFLOP/s | "
                   + " | ".join(f"wgmma / mma.sync, {m}" for m in METHODS) + " | "
                   + " | ".join(f"op / its best step, {m}" for m in METHODS) + " |")
        out.append("|" + "---|" * (4 + 2 * len(METHODS)))
        for r in st:
            tf = [f"{r['steps'][x]['tflops']:.0f}" + ("" if r["steps"][x]["check"] == "passed" else " FAILED")
                  if x in r["steps"] else "-" for x in (MMA, WGMMA)]
            cells = [f"{r[key][m]:.2f}x" if key in r and m in r[key] else "-"
                     for key in ("wgmma_over_mma", "op_over_best_step") for m in METHODS]
            out.append(f"| {r['label']} | {r.get('op_picks', '-')} | " + " | ".join(tf + cells) + " |")
        both = [r for r in st if "op_over_best_step" in r]
        if both:
            out.append(f"\nthe op against the faster of its two kernels (kernellab.bench): lowest "
                       f"{min(r['op_over_best_step']['kernellab.bench'] for r in both):.2f}x")
    if dec:
        out.append(f"\n| decode case (copy {copy_gbps / 1e3:.2f} TB/s) | check | "
                   + " | ".join(f"of copy, {m}" for m in METHODS) + " | "
                   + " | ".join(f"vs fastest PyTorch, {m}" for m in METHODS) + " | fastest PyTorch (kernellab.bench) | "
                   + " | ".join(f"vs {TWO_KERNELS}, {m}" for m in METHODS) + " |")
        out.append("|" + "---|" * (4 + 3 * len(METHODS)))
        for r in dec:
            two = r.get("vs_two_kernels", {})
            out.append(f"| {r['label']} | {r['check']} | "
                       + " | ".join(f"{r['of_copy'][m]:.0%}" if m in r["of_copy"] else "-" for m in METHODS) + " | "
                       + " | ".join(f"{r['vs_fastest'][m]:.2f}x" if m in r["vs_fastest"] else "-" for m in METHODS)
                       + f" | {r['fastest_torch'].get('kernellab.bench', '-')} | "
                       + " | ".join(f"{two[m]:.2f}x" if m in two else "-" for m in METHODS) + " |")
        sweeps = [r for r in dec if r.get("sweep_of_copy")]
        if sweeps:
            out.append("\nsplit floor (kernellab.bench, share of copy; the op uses the plan's default min_keys): "
                       + "; ".join(f"{r['label']}: default {r['of_copy']['kernellab.bench']:.0%}, "
                                   + ", ".join(f"{n.split(', ')[1]} {v:.0%}" for n, v in r["sweep_of_copy"].items())
                                   for r in sweeps))
        long = [r for r in dec if r["L"] >= 8192]
        if long:
            low = min(long, key=lambda r: r["of_copy"]["kernellab.bench"])
            out.append(f"\ndecode, caches >= 8k: lowest {low['of_copy']['kernellab.bench']:.0%} of copy "
                       f"({low['label']}, kernellab.bench; target {TARGET_OF_COPY:.0%}); lowest ratio to the fastest "
                       f"PyTorch path {min(min(r['vs_fastest'].values()) for r in dec):.2f}x (target 1.0x)")
        online = [r for r in dec if r.get("online_speedup")]
        if online:
            out.append("decode, the online merge (merge='online') over the default, as called (> 1: faster): "
                       + "; ".join(f"{r['label']}: " + ", ".join(f"{m} {v:.2f}x" for m, v in r["online_speedup"].items())
                                   for r in online))
        both = [r for r in dec if r.get("both_speedup")]
        if both:
            out.append("decode, the online merge and the early first tile (merge='online', early=True) over the "
                       "default, as called (> 1: faster): "
                       + "; ".join(f"{r['label']}: " + ", ".join(f"{m} {v:.2f}x" for m, v in r["both_speedup"].items())
                                   for r in both))
        two = [v for r in dec for v in r.get("vs_two_kernels", {}).values()]
        if two:
            out.append(f"decode, the one-launch op over the two-kernel step (every case and method): "
                       f"{min(two):.2f}x to {max(two):.2f}x")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes (the runner's suite, under 300 s)")
    ap.add_argument("--part", choices=("gqa", "decode", "both"), default="both")
    ap.add_argument("--dtypes", default="bfloat16", help="GQA dtypes, e.g. bfloat16,float16")
    ap.add_argument("--nq", type=int, default=1, help="query tokens per sequence when decoding")
    ap.add_argument("--shapes", default="", help="GQA (N, B*Hq) pairs instead of the grid, e.g. 1024:256,2048:128")
    ap.add_argument("--ratios", default="", help="GQA ratios instead of the grid's, e.g. 4,8")
    ap.add_argument("--out", default="", help="folder for attention_inference.json")
    ap.add_argument("--profile", action="store_true", help="with --part decode: Nsight Compute and the timing split "
                    "of the one-launch decode beside its latency model (benchmarks/decode_profile.py)")
    ap.add_argument("--floor", action="store_true", help="with --part decode: the plan's default split floor against "
                    "min_keys 16, 32 and 64 at B = 1, caches 512 to 8k (benchmarks/decode_profile.py floor_sweep)")
    ap.add_argument("--pdl", action="store_true", help="with --part decode: a decode step (producer kernel, then the "
                    "decode) with and without programmatic dependent launch at B = 1, caches 1k-128k "
                    "(benchmarks/decode_pdl.py)")
    args = ap.parse_args(argv)
    if (args.profile or args.floor or args.pdl) and args.part != "decode":
        ap.error("--profile, --floor and --pdl measure the decode: pass --part decode with them")
    import torch

    if not torch.cuda.is_available():
        log("no CUDA GPU: this script times kernels and needs one (tests/test_attention_inference.py checks them on "
            "the CPU)")
        return 2
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64
    from notebook_cells import load_tutorial

    from kernellab.run.measure.ceilings import device_ceilings

    t0 = time.time()
    t = load_tutorial(NOTEBOOK)
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; compiled tutorial 09 in {time.time() - t0:.1f} s")
    ceil = device_ceilings()
    copy_gbps = ceil.dram_gbps
    log(f"copy bandwidth (kernellab ceilings, {ceil.source}): {copy_gbps / 1e3:.2f} TB/s")
    if args.profile:
        import decode_profile

        return decode_profile.run(t, torch, pathlib.Path(args.out or "."), copy_gbps, started=t0, log=log)
    if args.floor:
        import decode_profile

        return decode_profile.floor_sweep(t, torch, pathlib.Path(args.out or "."), log=log)
    if args.pdl:
        import decode_pdl

        hopper = torch.cuda.get_device_capability() >= (9, 0)
        log("PDL: on" if hopper else "PDL: not on this GPU (below sm_90): the PDL launches are plain ones")
        rows = decode_pdl.run(t, torch, copy_gbps, quick=args.quick, log=log)
        text = decode_pdl.table(rows, copy_gbps)
        if args.out:
            out = pathlib.Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "decode_pdl.json").write_text(json.dumps(
                {"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "rows": rows}, indent=1))
            (out / "decode_pdl.md").write_text(text + "\n")
        log(f"\n{time.time() - t0:.0f} s in all\n")
        log(text)
        failed = [r["label"] for r in rows if r["check"] != "passed"]
        if failed:
            log(f"\nFAILED checks: {', '.join(failed)}")
        return 1 if failed or not rows else 0
    dtypes = tuple(getattr(torch, name) for name in args.dtypes.split(","))
    shapes = [tuple(int(x) for x in pair.split(":")) for pair in args.shapes.split(",") if pair]
    ratios = [int(x) for x in args.ratios.split(",") if x]
    gqa = gqa_rows(t, torch, args.quick, dtypes, args.quick, shapes, ratios) if args.part in ("gqa", "both") else []
    dec = decode_rows(t, torch, args.quick, copy_gbps, args.nq) if args.part in ("decode", "both") else []
    text = tables(gqa, dec, copy_gbps)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention_inference.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "gqa": gqa, "decode": dec}, indent=1))
        (out / "attention_inference.md").write_text(text + "\n")
    log(f"\n{time.time() - t0:.0f} s in all\n")
    log(text)
    failed = [r["label"] for r in gqa + dec if r["check"] != "passed"]
    failed += [f"{r['label']} ({x})" for r in dec for x in r.get("steps_check", [])]
    failed += [f"{r['label']} ({step})" for r in gqa for step, x in r.get("steps", {}).items()
               if x["check"] != "passed"]
    if failed:
        log(f"\nFAILED checks: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
