"""Tutorial 07's entry point (the `# launchers: kl::attention` cell) without a GPU: every kernel the selection model can
pick exists in the notebook's cells, and the cell launches exactly what the plan names (kernel, grid, threads, shared
memory, arguments), run on CPU tensors against stand-in kernels that record their launches."""
import json
import pathlib
import sys
import types

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
from notebook_cells import cuda_cells, launcher_cells, named_cuda_cells_with_arch  # noqa: E402

from kernellab.compile.signature import find_kernels  # noqa: E402
from kernellab.teach.attention_plan import CANDIDATES, plan_attention  # noqa: E402

NOTEBOOK = "07-fused-attention.py"


def every_entry():
    return sorted({m.entry(dt, c) for m in CANDIDATES for dt in ("bf16", "fp16") for c in (False, True)})


def test_every_kernel_the_model_can_pick_is_in_the_notebook():
    cells = named_cuda_cells_with_arch(NOTEBOOK)
    assert cells["fa3_cell"][0] == "sm_90a" and cells["fa2_cell"][0] is None
    # the entry points are macro invocations (FA2_ENTRY, FA3_ENTRY, FA3P_ENTRY): find_kernels expands the cells' macros
    defined = {k.name: k for _, c in cells.values() for k in find_kernels(c) if k.name.startswith("fa")}
    missing = [e for e in every_entry() if e not in defined]
    assert not missing, f"the model can pick kernels the cells do not define: {missing}"
    for name in every_entry():      # each takes what its step's launcher passes, in its dtype
        params = defined[name].params
        dtype = "bfloat16" if "_bf16_" in name else "float16"
        if name.startswith("fa2_"):
            assert [p.name for p in params] == ["q", "k", "v", "o", "lse", "n", "scale"], (name, params)
            assert [p.dtype for p in params[:4]] == [dtype] * 4 and params[4].dtype == "float32", (name, params)
        else:
            tail = ["n", "bh", "heads_per_section", "work_counter", "scale"] if name.startswith("fa3p_") else ["n", "scale"]
            assert [p.name for p in params] == ["tq", "tk", "tv", "o"] + tail, (name, params)
            assert all(p.tensor_map for p in params[:3]) and params[3].pointer and params[3].dtype == dtype, (name, params)


class Recorder:
    """A stand-in Kernel: k[grid, block, smem](*args) records (name, grid, block, smem, args)."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, config):
        grid, block, smem = config
        return lambda *args: self.log.append((self.name, grid, block, smem, args))


def launcher_namespace(kernel_type, log):
    """07's launcher cell run in a namespace whose step 2 and 3 cells hold `kernel_type(name, log)` stand-ins, on a
    CPU device of 132 SMs."""
    kernels = [kernel_type(n, log) for n in every_entry()]
    ns = {"__name__": "tutorial_07", "fa2_cell": types.SimpleNamespace(kernels=[k for k in kernels if "fa2" in k.name]),
          "fa3_cell": types.SimpleNamespace(kernels=[k for k in kernels if "fa2" not in k.name])}
    (cell,) = launcher_cells(NOTEBOOK)
    exec(compile(cell, f"{NOTEBOOK}:launchers", "exec"), ns)
    ns["_attention_sms"][torch.device("cpu")] = 132
    return ns


@pytest.fixture(scope="module")
def entry():
    """The launcher cell run in a namespace whose step 2 and 3 cells are recorders; tensor maps are stand-ins."""
    log = []
    ns = launcher_namespace(Recorder, log)
    ns["kernellab"] = types.SimpleNamespace(tensor_map=lambda x, box: ("map", x.shape, box))
    ns["log"] = log
    return ns


@pytest.mark.parametrize("B,H,N,d,causal,kernel", [
    (4, 16, 4096, 64, False, None), (32, 16, 512, 64, True, None), (1, 16, 128, 64, False, None),
    (2, 8, 1031, 128, True, None), (2, 3, 65, 64, True, "fa3p_bm64"), (2, 3, 1000, 128, False, "fa3"),
    (1, 2, 63, 128, False, "fa2"),
])
def test_the_entry_point_launches_what_its_plan_names(entry, B, H, N, d, causal, kernel):
    q, k, v = (torch.zeros(B, H, N, d, dtype=torch.bfloat16) for _ in range(3))
    entry["log"].clear()
    out = entry["attention"](q, k, v, causal=causal, kernel=kernel)
    plan = plan_attention(B, H, N, d, causal, "bf16", 132, kernel=kernel)
    assert entry["attention_plan"](q, causal, kernel) == plan
    ((name, grid, block, smem, args),) = entry["log"]
    assert (name, block, smem) == (plan.entry, plan.threads, plan.shared_bytes)
    assert args[-1] == pytest.approx(d ** -0.5) and out.shape == q.shape and out.dtype == q.dtype
    if plan.persistent:
        assert grid == (plan.ctas,) and plan.ctas <= 132 * plan.ctas_per_sm
        maps, (o, n, bh, sections, counter, _) = args[:3], args[3:]
        assert [m[2] for m in maps] == [(1, plan.block_m, 64), (1, plan.block_n, 64), (1, plan.block_n, 64)]
        assert maps[0][1] == (B * H, N, d) and o is out and (n, bh) == (N, B * H) and 1 <= sections <= B * H
        assert counter.dtype == torch.int32 and int(counter) == 0
    elif plan.family == "fa2":
        assert grid == (-(-N // 128), B * H) and args[:4] == (q, k, v, out) and args[4] is None and args[5] == N
    else:
        assert grid == (-(-N // plan.block_m), B * H) and args[3] is out and args[4] == N
    # a second call with the same shape reuses the launch (no new plan) and writes into a given output
    given = torch.empty_like(q)
    assert entry["attention"](q, k, v, given, causal, kernel=kernel) is given
    assert entry["log"][-1][:4] == (name, grid, block, smem)


def test_the_entry_point_plans_with_its_devices_constants(entry):
    """The launcher cell passes the device's name to the plan (on a GPU, from its properties): an H200 launches what
    the H200's constants choose, here the 64-row variant where the H100's choose step 2."""
    q = torch.zeros(1, 16, 128, 64, dtype=torch.bfloat16)
    cpu = torch.device("cpu")
    assert entry["attention_plan"](q).kernel == "fa2"                     # no name: the H100's constants
    entry["_attention_gpus"][cpu] = "NVIDIA H200"
    try:
        plan = entry["attention_plan"](q)
        assert plan == plan_attention(1, 16, 128, 64, False, "bf16", 132, device="NVIDIA H200")
        assert plan.kernel == "fa3p_bm64" and plan.constants == "H200 constants (attention_plan_h200.json)"
        entry["log"].clear()
        entry["attention"](q, q, q, kernel=None, ctas=3)                 # a fresh launch key: planned anew
        assert entry["log"][0][0] == plan.entry == "fa3p_bf16_d64_bm64"
    finally:
        del entry["_attention_gpus"][cpu]


def test_the_entry_point_refuses_what_no_kernel_takes(entry):
    q = torch.zeros(1, 2, 64, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="d = 64 or 128"):
        entry["attention"](q, q, q)
    q = torch.zeros(1, 2, 64, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        entry["attention"](q, q, q)
    q = torch.zeros(1, 2, 64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="contiguous"):
        entry["attention"](q, q.transpose(2, 3).contiguous().transpose(2, 3), q)


def test_the_op_keeps_its_name_and_schema(entry):
    op = entry["kl_attention"]
    meta = torch.empty(2, 16, 8192, 64, device="meta", dtype=torch.bfloat16)
    assert op(meta, meta, meta, True).shape == meta.shape
    schema = str(torch.ops.kl.attention.default._schema)
    assert schema == "kl::attention(Tensor q, Tensor k, Tensor v, bool causal) -> Tensor", schema


def test_the_benchmark_reads_the_same_cells():
    """benchmarks/attention.py's families come from the same %%cuda cells (the variant is in family fa3p)."""
    assert any("fa3p_bf16_d64_causal_bm64" in c for c in cuda_cells(NOTEBOOK))


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(HERE))
    from attention_steps import attention_benchmark

    return attention_benchmark()


def test_the_grid_covers_the_issue_and_its_quick_subset_is_a_part(bench):
    full, quick = bench.grid_shapes(False), bench.grid_shapes(True)
    assert {s[2] for s in full} == {128, 256, 512, 1024, 2048, 4096, 8192, 16384}
    assert {s[3] for s in full} == {64, 128} and {s[4] for s in full} == {False, True}
    assert {s[0] * s[1] for s in full} == {16, 64, 256, 512}
    assert all(s[0] * s[1] * s[2] <= bench.GRID_TOKENS for s in full)
    assert set(quick) < set(full) and len(quick) <= 32
    cost = [s[0] * s[1] * s[2] ** 2 * s[3] / (2 if s[4] else 1) for s in quick]
    assert cost == sorted(cost)                                   # a time budget drops the longest calls


def row(label, entry, steps, flash, choice="fa3p", host_bound=False):
    ms = {"entry": entry, **steps, "FLASH": flash, "CUDNN": flash * 0.8}
    return dict(B=1, H=16, N=512, d=64, causal=False, label=label, choice=choice, host_bound=host_bound,
                predicted_gpu_us={s: 500.0 for s in steps},
                ms={"kernellab.bench": ms, "do_bench": dict(ms, entry=entry * 1.5), "sustained": ms})


def test_the_grid_verdict_names_losses_to_steps_and_to_flash(bench, capsys):
    rows = [row("a", 1.00, {"fa2": 1.10, "fa3p": 1.00}, 1.2),     # the entry is its best step: fine
            row("b", 1.05, {"fa2": 1.00, "fa3p": 1.05}, 1.2),     # 5 % slower than fa2: a loss
            row("c", 1.01, {"fa2": 1.00, "fa3p": 1.01}, 0.9),     # 1 % (noise), and below FLASH
            dict(B=1, H=16, N=1, d=64, causal=True, label="d", choice="fa2", error="RuntimeError: boom"),
            # the plan's model calls it host-bound; it is judged by kernellab.bench all the same (the GPU's time, what
            # the plan predicts), where the entry ties fa2; do_bench's 1.5x is not a loss to a step
            row("h", 0.02, {"fa2": 0.02, "fa3p": 0.025}, 0.03, choice="fa2", host_bound=True),
            # the plan chose the fastest step, but the entry point's call of it timed 5 % slower than the step's own
            row("s", 1.05, {"fa2": 1.10, "fa3p": 1.00}, 10.0)]
    lines, lost = bench.grid_verdict(rows, ["e"])
    assert lost == 2
    assert "b [kernellab.bench] (fa3p 1050.0 µs, fa2 1000.0 µs)" in lines[0] and "h [" not in lines[0], lines[0]
    assert "any margin: 3" in lines[1]
    assert lines[2] == ("  of those, the plan chose a slower step at 1; at 1 it chose the fastest step and the entry "
                        "point's call of it timed slower than the step's own: s"), lines[2]
    assert lines[3].startswith("entry point below 1.0x SDPA FLASH (kernellab.bench): 1 shape(s): c 0.89x"), lines[3]
    assert "(do_bench): 3 shape(s): a 0.80x; b 0.76x; c 0.59x" in lines[4]   # do_bench: the entry 1.5x slower; h ties
    # a, b, c, s measured 1.00-1.10 ms where 0.5 ms was predicted, h 0.02 ms
    assert "fa2 2.00 (5), fa3p 2.00 (5)" in lines[6], lines[6]
    assert lines[7].startswith("refit fa2 d=64: tflops ") and "launch" in lines[7] and "over 5 shapes" in lines[7]
    assert any("failed: 1" in x and "boom" in x for x in lines) and "left out past the time budget: 1" in lines[-1]
    for r in rows:
        bench.print_grid_row(r)
    out = capsys.readouterr().out
    assert "fa3p" in out and "error: RuntimeError: boom" in out and "0.95x" in out  # b: fa2's 1000 over 1050


def test_the_sustained_anomaly_is_named_from_the_rows_own_numbers(bench):
    """Golden row (H100, 2026-11-27, attention_plan_h100.json): B*H = 16, N = 128, d = 64, not causal. The entry point
    (step 2) took 7.9 µs by kernellab.bench and 11.5 sustained; SDPA FLASH 9.0 and 43.2: FLASH's host path outlasts
    the L2 flush ahead of each back-to-back call, so the 3.75x sustained ratio compares host paths."""
    from kernellab.teach.attention_plan import H100_TABLE

    golden = json.loads(H100_TABLE.read_text())["grid"]["rows"][1]
    assert (golden["N"], golden["d"], golden["causal"], golden["entry_chose"]) == (128, 64, False, "fa2")
    us = golden["us"]
    ms = {m: {"entry": us[m]["fa2"] / 1e3, "FLASH": us[m]["FLASH"] / 1e3, "CUDNN": us[m]["CUDNN"] / 1e3}
          for m in ("kernellab.bench", "sustained")}
    ms["sustained"]["entry"] = 11.52e-3                            # the entry op's own sustained time in that run
    why = bench.sustained_why(dict(ms=ms))
    assert why.startswith("host-bound under back-to-back calls: FLASH and CUDNN"), why
    assert "3.75x compares host paths" in why and "1.14x by kernellab.bench" in why
    # where the methods agree there is nothing to say; where neither side slowed 1.5x it is the clock
    assert bench.sustained_why(dict(ms={m: dict(ms["kernellab.bench"]) for m in ms})) == ""
    clock = {"kernellab.bench": {"entry": 1.0, "FLASH": 1.2}, "sustained": {"entry": 1.0, "FLASH": 1.35}}
    assert bench.sustained_why(dict(ms=clock)).startswith("the power-capped clock")
    # B*H = 16, N = 2048, d = 64, full (same run): every side slowed 1.4-2.2x back to back at 44-65 µs a call: not
    # host time, and the table must not call it that
    long = {"kernellab.bench": {"entry": 54.3e-3, "FLASH": 64.8e-3, "CUDNN": 44.2e-3},
            "sustained": {"entry": 97.1e-3, "FLASH": 93.3e-3, "CUDNN": 98.8e-3}}
    assert bench.sustained_why(dict(ms=long)).startswith("not host time (kernels of 44 µs and more")
    assert "sustained" in bench.GRID_LEGEND and "host path" in bench.GRID_LEGEND


def test_the_grid_times_the_steps_in_the_running(bench):
    """Steps the model predicts 1.3x slower than its choice are not timed (what keeps the grid inside its budget);
    the choice always is, and --all-steps times every one."""
    from kernellab.teach.attention_plan import plan_attention

    plan = plan_attention(16, 16, 8192, 128, False)
    running = bench.steps_in_the_running(plan)
    assert running[0] == plan.kernel == "fa3p" and "fa2" not in running
    assert len(bench.steps_in_the_running(plan, all_steps=True)) == 3
    small = plan_attention(1, 16, 128, 64, False)
    assert set(bench.steps_in_the_running(small)) >= {"fa3p_bm64", "fa2"}


def test_the_grid_says_last_where_the_plan_left_the_golden_runs_choice(bench):
    """Replayed on the golden quick grid (H100, 2026-11-27, attention_plan_h100.json) as if this run had measured the
    same times: the shapes whose choice the model's refit moved are named with the old and the new choice and both
    steps' times, and whether the change paid; a change this run did not confirm, or could not time, says so."""
    from kernellab.teach.attention_plan import plan_attention

    golden = bench.golden_grid()
    assert len(golden) == 32
    rows = []
    for (B, H, N, d, causal), g in golden.items():
        plan = plan_attention(B, H, N, d, causal)
        ms = {s: us / 1e3 for s, us in g["us"]["kernellab.bench"].items()}
        ms["entry"] = ms.get(plan.kernel, ms["entry"])             # this run's entry point runs the plan's step
        rows.append(dict(B=B, H=H, N=N, d=d, causal=causal, label=f"B*H={B * H} N={N} d={d} "
                         f"{'causal' if causal else 'full'}", choice=plan.kernel, ms={"kernellab.bench": ms}))
    lines = bench.plan_change_lines(rows, golden)
    moved = [r for r in rows if r["choice"] != golden[r["B"], r["H"], r["N"], r["d"], r["causal"]]["entry_chose"]]
    assert lines[0].startswith("plan changed from the golden run's choice (NVIDIA H100 80GB HBM3, 2026-11-27")
    assert lines[0].endswith(f": {len(moved)} shape(s)") and len(lines) == 1 + len(moved) >= 2
    line = next(x for x in lines if "B*H=256 N=512 d=128 causal" in x)
    # the golden run's entry point ran fa3 (83.9 µs); this run's runs fa3p
    assert ("fa3 -> fa3p: this run fa3 83.8 µs, fa3p 74.7 (entry 74.7) µs; golden run fa3 83.8 (entry 83.9) µs, "
            "fa3p 74.7 µs") in line, line
    assert line.endswith("the new choice 1.12x the old's speed here: confirmed")
    assert all("confirmed" in x and "NOT" not in x for x in lines[1:]), lines     # the golden times agree with it
    # a run where the new choice came out slower, and one where the old choice could not be timed
    k = (16, 16, 512, 128, True)
    slower = dict(rows[list(golden).index(k)], ms={"kernellab.bench": {"fa3": 80e-3, "fa3p": 90e-3}})
    assert bench.plan_change_lines([slower], golden)[1].endswith("0.89x the old's speed here: NOT confirmed "
                                                                  "(slower by over 3 %)")
    untimed = dict(slower, ms={"kernellab.bench": {"fa3p": 70e-3}})
    assert "fa3 not timed µs" in bench.plan_change_lines([untimed], golden)[1]
    assert bench.plan_change_lines([untimed], golden)[1].endswith("not confirmed: a step was not timed")
    # the grid times the old choice where the plan moved, and nothing more where it did not
    assert bench.golden_choice(k, golden, "fa3p") == "fa3" and bench.golden_choice(k, golden, "fa3") is None
    assert bench.golden_choice((3, 16, 512, 128, True), golden, "fa3p") is None   # not on the golden grid


def test_on_an_h200_the_grid_compares_with_the_h200s_golden_run(bench):
    """The device's name picks the golden run as it picks the constants: replayed on the H200's table (whose entry
    point ran the H100's constants) with the H200's, the report names that table and the two choices the H200's
    constants move (B*H = 16, N = 128 unmasked: step 2 to the 64-row variant at d = 64, to step 3 at d = 128), both
    confirmed by that run's times; with the H100's constants nothing moves."""
    from kernellab.teach.attention_plan import plan_attention

    golden = bench.golden_grid(device="NVIDIA H200")
    assert len(golden) == 32 and {g["device"] for g in golden.values()} == {"NVIDIA H200"}

    def replay(device):
        rows = []
        for (B, H, N, d, causal), g in golden.items():
            plan = plan_attention(B, H, N, d, causal, device=device)
            ms = {s: us / 1e3 for s, us in g["us"]["kernellab.bench"].items()}
            rows.append(dict(B=B, H=H, N=N, d=d, causal=causal, label=f"B*H={B * H} N={N} d={d} "
                             f"{'causal' if causal else 'full'}", choice=plan.kernel, ms={"kernellab.bench": ms}))
        return bench.plan_change_lines(rows, golden)

    lines = replay("NVIDIA H200")
    assert lines[0] == ("plan changed from the golden run's choice (NVIDIA H200, 2026-11-28, "
                        "kernellab/teach/attention_plan_h200.json): 2 shape(s)") and len(lines) == 3
    assert lines[1].startswith("  B*H=16 N=128 d=64 full: fa2 -> fa3p_bm64: ") and "1.08x" in lines[1], lines
    assert lines[2].startswith("  B*H=16 N=128 d=128 full: fa2 -> fa3: ") and "1.05x" in lines[2], lines
    assert all(x.endswith("the old's speed here: confirmed") for x in lines[1:]), lines
    assert replay("NVIDIA H100 80GB HBM3")[0].endswith(": 0 shape(s)")
    assert bench.golden_grid()[1, 16, 128, 64, False]["file"] == "attention_plan_h100.json"   # no name: the H100's
    # the refit lines set a grid's refit beside the constants of the table the plan used
    rows = [dict(B=B, H=H, N=N, d=d, causal=c, ms={"kernellab.bench": {s: us / 1e3 for s, us in
                                                                         g["us"]["kernellab.bench"].items()}})
            for (B, H, N, d, c), g in golden.items()]
    fa3p = next(x for x in bench.refit_lines(rows, device="NVIDIA H200") if x.startswith("refit fa3p d=128"))
    assert "(model 681)" in fa3p and "(model 665)" in next(x for x in bench.refit_lines(rows)
                                                          if x.startswith("refit fa3p d=128"))


def test_a_grid_run_becomes_a_golden_table_as_the_golden_tables_were_made(bench):
    """golden_table turns a run's rows (ms) into a golden table's (µs to 2 decimals, entry_chose): fed the H200
    golden run's rows back as the grid wrote them, it gives that table's rows; golden_json writes it one row a line,
    and reads back as written."""
    from kernellab.teach.attention_plan import H200_TABLE

    data = json.loads(H200_TABLE.read_text())
    grid = data["quick_grid"]
    rows = [dict(B=r["B"], H=r["H"], N=r["N"], d=r["d"], causal=r["causal"], choice=r["entry_chose"],
                 ms={m: {k: us / 1e3 for k, us in t.items()} for m, t in r["us"].items()}) for r in grid["rows"]]
    failed = dict(rows[0], error="RuntimeError: boom")
    del failed["ms"]
    table = bench.golden_table("NVIDIA H200", "2026-11-28", rows + [failed], [])
    assert table["rows"] == grid["rows"] and "32 shapes (0 left out" in table["source"]
    assert {k: table[k] for k in ("device", "date", "dtype", "timing")} == {k: grid[k] for k in
                                                                             ("device", "date", "dtype", "timing")}
    text = bench.golden_json({"about": data["about"], "quick_grid": table})
    assert json.loads(text) == {"about": data["about"], "quick_grid": table}
    assert text.count("\n") == 2 + 1 + 5 + 1 + 32 + 3 and text == H200_TABLE.read_text()


def test_fewer_ctas_for_a_persistent_kernel(entry):
    q = torch.zeros(1, 2, 1031, 64, dtype=torch.float16)
    entry["log"].clear()
    entry["attention"](q, q, q, causal=True, kernel="fa3p_bm64", ctas=7)
    entry["attention"](q, q, q, causal=True, kernel="fa2", ctas=7)           # not persistent: the grid is the work
    (_, grid, *_), (_, grid2, *_) = entry["log"]
    assert grid == (7,) and grid2 == (9, 2)


def test_the_quick_grid_fits_250_s_and_the_full_grid_540_s(bench):
    """The grid's wall time as predicted from the plan's GPU times (benchmarks/attention.py grid_seconds). The
    prediction is held to the first measurement (H100, 2026-11-27: the grid timed every step by all three methods,
    without the paired timing, and ran its 16 cheapest quick shapes in 224 s): timed that way it predicts at least
    that, so it does not flatter the new way. The whole quick grid ran in 104 s on an H100 and 123 s on an
    H200 where this model, without the paired timing, predicts 117 s; the full grid (not a suite: a run by hand under
    its 540 s budget) is held to 1.3x room."""
    quick, full = bench.grid_shapes(True), bench.grid_shapes(False)
    before = bench.grid_seconds(quick[:16], all_steps=True, every_method=True, min_reps=20, max_reps=10_000,
                                paired=False)
    assert before >= 224
    assert bench.grid_seconds(quick) <= 250 / 1.5          # room for the model to be 1.5x optimistic
    assert bench.grid_seconds(full) <= 540 / 1.3
    assert bench.grid_seconds(quick, all_steps=True) > bench.grid_seconds(quick)


def test_the_profile_option_reads_shapes_and_asks_for_what_explains_short_n(bench):
    """benchmarks/attention.py --profile: shapes as B*HxNxd[c]; the metrics the short-sequence question needs."""
    assert bench.parse_profile_shape("256x512x64c") == (16, 16, 512, 64, True)
    assert bench.parse_profile_shape("16x128x128") == (1, 16, 128, 128, False)
    with pytest.raises(ValueError, match="B\\*HxNxd"):
        bench.parse_profile_shape("16-512")
    names = " ".join(m for m, _ in bench.PROFILE_METRICS)
    for wanted in ("pipe_tensor_op", "sm__warps_active", "sm__cycles_active", "gpu__time_duration",
                   "stalled_long_scoreboard", "stalled_barrier", "dram__throughput"):
        assert wanted in names, wanted
    assert all(bench.parse_profile_shape(s) for s in bench.PROFILE_SHAPES)
    assert "launch_us" in bench.PROFILE_READING and "long_scoreboard" in bench.PROFILE_READING


class Profiled(Recorder):
    """A stand-in Kernel whose profile(...) records the launch and returns counters as Nsight Compute would."""

    def profile(self, grid, block, *args, shared_bytes=0, metrics=None):
        from kernellab.run.nvtools.ncu import Metric, ProfileReport

        self.log.append((self.name, grid, block, shared_bytes, args, tuple(metrics)))
        return ProfileReport(kernel=self.name, metrics=(
            Metric("gpu__time_duration.sum", "duration", 12.0e-6, "second"),
            Metric("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor", 31.5, "%"),
            Metric("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "ls", 2.5, "")))


def test_the_profile_runs_each_step_as_the_entry_point_launches_it(bench, monkeypatch, tmp_path, capsys):
    """--profile on the CPU with stand-ins for the kernels and ncu: one profile per step at the shape, each the
    launch 07's attention() makes for that step (kernel, grid, block, shared memory, arguments), the metrics asked
    for, the counters and the time per item in the table, the reading printed last, the JSON written."""
    import notebook_cells

    log = []
    ns = launcher_namespace(Profiled, log)
    monkeypatch.setattr(notebook_cells, "load_tutorial", lambda name: ns)
    monkeypatch.setattr(bench.kernellab, "tensor_map", lambda x, box: ("map", tuple(x.shape), box))
    assert bench.run_profile(["16x512x64c"], None, tmp_path, device="cpu") == 0
    assert [r[0] for r in log] == [plan_attention(1, 16, 512, 64, True, kernel=s).entry for s in bench.STEPS[64]]
    for name, grid, block, smem, args, metrics in log:
        step = next(s for s in bench.STEPS[64] if plan_attention(1, 16, 512, 64, True, kernel=s).entry == name)
        plan = plan_attention(1, 16, 512, 64, True, kernel=step)
        assert (block, smem) == (plan.threads, plan.shared_bytes)
        assert metrics == tuple(m for m, _ in bench.PROFILE_METRICS)
        if plan.family == "fa2":
            assert grid == (4, 16) and args[4] is None and len(args) == 7          # q, k, v, o, lse, N, scale
        else:
            assert args[0] == ("map", (16, 512, 64), (1, plan.block_m, 64)) and args[3].shape == (1, 16, 512, 64)
            assert grid == ((plan.ctas,) if plan.persistent else (-(-512 // plan.block_m), 16))
    out = capsys.readouterr().out
    assert "16x512x64c: B=1 H=16 N=512 d=64 causal" in out and "per item, measured" in out and "31.5" in out
    assert out.rstrip().endswith(bench.PROFILE_READING.splitlines()[-1])
    saved = json.loads((tmp_path / "attention_profile.json").read_text())
    assert saved["results"][0]["steps"]["fa3p_bm64"]["duration"] == "12.00 us"


@pytest.mark.parametrize("d", [64, 128])
def test_the_profile_launches_the_ping_pong_variant_as_fa3p_attention_does(bench, monkeypatch, tmp_path, d):
    """--profile --steps fa3p,fa3p_sched: the variant (not a plan candidate) runs on step 3b's CTAs and maps, with
    the launch 07's fa3p_attention(sched=True) makes: its entry, 192-row items at d = 64, 128 threads a consumer
    warpgroup and one producer, and the shared memory of 2 Q buffers and the K/V stages."""
    import notebook_cells

    log = []
    ns = launcher_namespace(Profiled, log)
    name = f"fa3p_sched_bf16_d{d}_causal"
    ns["ATTENTION_KERNELS"][name] = Profiled(name, log)
    monkeypatch.setattr(notebook_cells, "load_tutorial", lambda _: ns)
    monkeypatch.setattr(bench.kernellab, "tensor_map", lambda x, box: ("map", tuple(x.shape), box))
    assert bench.run_profile([f"16x4096x{d}c"], ["fa3p", "fa3p_sched"], tmp_path, device="cpu") == 0
    (base, _, base_block, _, base_args, _), (got, grid, block, smem, args, _) = log
    plan = plan_attention(1, 16, 4096, d, True, kernel="fa3p")
    block_m, stages = (192, 3) if d == 64 else (128, 2)                       # 07's FA3P[d]
    assert base == plan.entry and got == name and grid == (plan.ctas,)
    assert block == 128 * (block_m // 64 + 1) and smem == 1024 + (2 * block_m + 2 * stages * 128) * d * 2 + 256
    assert args[0] == ("map", (16, 4096, d), (1, block_m, 64)) and args[1] == base_args[1]   # K's map: fa3p's
    assert args[4:] == base_args[4:]                                           # N, heads, sections, counter, scale


def test_the_ready_calls_launch_what_the_uncached_plan_picks_on_the_grid(bench, monkeypatch):
    """Every shape of the full grid, planned as on an H100 and as on an H200: the entry point's ready call (made on a
    shape's first call, then taken from _attention_calls) holds and launches exactly the plan the model makes
    afresh (plan_attention without its cache), and a second call launches the same."""
    log = []
    ns = launcher_namespace(Recorder, log)
    ns["kernellab"] = types.SimpleNamespace(tensor_map=lambda x, box: ("map", tuple(x.shape), box))
    meta = torch.device("meta")
    for gpu in (None, "NVIDIA H200"):
        monkeypatch.setitem(ns["_attention_sms"], meta, 132)
        monkeypatch.setitem(ns["_attention_gpus"], meta, gpu)
        ns["_attention_calls"].clear()                  # the device's name changed: its calls are made again
        for B, H, N, d, causal in bench.grid_shapes(False):
            q = torch.empty(B, H, N, d, device="meta", dtype=torch.bfloat16)
            want = plan_attention.__wrapped__(B, H, N, d, causal, "bf16", 132, device=gpu)
            for _ in range(2):
                log.clear()
                ns["attention"](q, q, q, causal=causal)
                ((name, grid, block, smem, args),) = log
                assert (name, block, smem) == (want.entry, want.threads, want.shared_bytes), (gpu, B, H, N, d, causal)
                assert grid == ((want.ctas,) if want.persistent else (-(-N // want.block_m), B * H))
            assert ns["_attention_calls"][q.shape, q.dtype, meta, causal, None, None].plan == want


def test_a_warm_call_plans_nothing_and_each_key_gets_its_own_ready_call(monkeypatch):
    """The plan is made once per (shape, dtype, device, mask, forced kernel, CTA cap): warm calls take the ready call
    and plan nothing; another dtype, device, shape or a forced kernel plans anew, once, and leaves the others' choice
    as it was."""
    log, planned = [], []
    ns = launcher_namespace(Recorder, log)
    ns["kernellab"] = types.SimpleNamespace(tensor_map=lambda x, box: ("map", tuple(x.shape), box))
    real = ns["attention_plan"]
    ns["attention_plan"] = lambda q, causal=False, kernel=None: planned.append((q.dtype, q.device, kernel)) or real(
        q, causal, kernel)
    meta, cpu = torch.device("meta"), torch.device("cpu")
    ns["_attention_sms"][meta], ns["_attention_gpus"][meta] = 132, "NVIDIA H200"   # cpu: no name, the H100's
    attention = ns["attention"]

    def launched(q, **kw):
        log.clear()
        attention(q, q, q, **kw)
        return log[-1][0]

    q = torch.empty(1, 16, 128, 64, device="meta", dtype=torch.bfloat16)
    assert [launched(q) for _ in range(5)] == ["fa3p_bf16_d64_bm64"] * 5 and len(planned) == 1
    assert launched(q.half()) == "fa3p_f16_d64_bm64" and len(planned) == 2              # a new dtype
    assert launched(q, kernel="fa2") == "fa2_bf16_d64" and planned[-1][2] == "fa2"      # forcing a kernel
    assert launched(q) == "fa3p_bf16_d64_bm64" and len(planned) == 3                    # the choice kept
    here = torch.zeros(1, 16, 128, 64, dtype=torch.bfloat16)
    assert launched(here) == "fa2_bf16_d64" and planned[-1][1] == cpu                   # a new device, its constants
    assert launched(q, causal=True) == "fa3p_bf16_d64_causal_bm64" and len(planned) == 5
    assert launched(torch.empty(1, 16, 256, 64, device="meta", dtype=torch.bfloat16)) and len(planned) == 6
    assert [launched(x) for x in (q, here, q.half())] == ["fa3p_bf16_d64_bm64", "fa2_bf16_d64", "fa3p_f16_d64_bm64"]
    assert len(planned) == 6 and len(ns["_attention_calls"]) == 6
    # the checks run on every call, not only the first: a transposed k is refused on a warm key
    with pytest.raises(ValueError, match="contiguous"):
        attention(here, here.transpose(2, 3).contiguous().transpose(2, 3), here)
    with pytest.raises(ValueError, match="one shape"):
        attention(here, here[:, :8].contiguous(), here)
