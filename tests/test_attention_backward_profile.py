"""benchmarks/attention_backward.py --profile without a GPU: the model of atomic_w8's tile step from the compiled
kernel (NVRTC + ptxas, sm_90), Nsight Compute on a program's launches by kernel-name regex
(kernellab.run.nvtools.ncu.profile_command) against a stand-in ncu, the launches labelled, and the tables and
verdict from fake reports.

Fakes, said as such: the stand-in ncu prints the real H200 capture (tests/fixtures/captured/ncu_metrics_details.csv,
one launch of transpose_naive) copied under three launch IDs and kernel names, with a made-up duration row per
launch; the reports of the end-to-end test are made-up numbers chosen so that one hypothesis holds."""
import importlib.util
import io
import json
import pathlib
import stat
import sys
import textwrap
from contextlib import redirect_stdout

import pytest

from kernellab.run.nvtools import ncu as P
from kernellab.run.nvtools.ncu import Metric, ProfileReport, profile_command, split_launches, top_stalls

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CAPTURED = HERE / "fixtures" / "captured" / "ncu_metrics_details.csv"
sys.path.insert(0, str(HERE / "gpu"))


def _bench():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("bench_attention_backward_profile",
                                                  ROOT / "benchmarks" / "attention_backward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- profile_command: several launches of one program, by kernel-name regex ------------------------------------------
FAKE_NAMES = ("bwd_pre_bf16_d64", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "bwd_dq_convert_bf16")


def _ncu(tmp_path, unknown=()):
    """A stand-in ncu (fake): logs its command line; stops at a requested metric in `unknown` as ncu does; else the
    real capture's rows once per name in FAKE_NAMES (ID 0, 1, 2), each with a duration of (ID + 1) microseconds."""
    log = tmp_path / "calls.jsonl"
    path = tmp_path / "ncu"
    path.write_text("#!" + sys.executable + "\n" + textwrap.dedent(f"""
        import json, sys
        argv = sys.argv[1:]
        open({str(log)!r}, "a").write(json.dumps(argv) + "\\n")
        names = argv[argv.index("--metrics") + 1].split(",")
        for n in names:
            if n in {list(unknown)!r}:
                print("==ERROR== Failed to find metric " + n)
                sys.exit(1)
        print("the program's own output")
        lines = [l for l in open({str(CAPTURED)!r}).read().splitlines() if l.startswith('"')]
        print(lines[0])
        for i, name in enumerate({list(FAKE_NAMES)!r}):
            for row in lines[1:]:
                cells = row.split('","')
                cells[0], cells[4] = '"%d' % i, name
                if "gpu__time_duration" in row:
                    cells[-1] = '%d,000"' % (i + 1)
                print('","'.join(cells))
    """))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), log


def test_profile_command_gives_one_report_per_launch_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_unknown_metrics", {})
    exe, log = _ncu(tmp_path)
    reps = profile_command(["python3", "child.py", "--x"], kernel_regex="bwd", launch_count=18,
                           metrics=["gpu__time_duration.sum", "dram__bytes.sum"], executable=exe)
    (cmd,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert cmd[cmd.index("--kernel-name-base") + 1] == "function"      # template-free names for SDPA's kernels
    assert cmd[cmd.index("-k") + 1] == "regex:bwd" and cmd[cmd.index("-c") + 1] == "18"
    assert cmd[-3:] == ["python3", "child.py", "--x"]
    assert [r.kernel for r in reps] == list(FAKE_NAMES) and all(r.ok for r in reps)
    assert [r.duration_ms for r in reps] == pytest.approx([1e-3, 2e-3, 3e-3])       # nsecond: 1,000 ns = 1 us
    assert all(r["dram__bytes.sum"] == 4_197_376 for r in reps)                     # the capture's own value


def test_profile_command_leaves_out_unknown_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_unknown_metrics", {})
    exe, log = _ncu(tmp_path, unknown=("smsp__inst_executed_op_ldsm.sum",))
    reps = profile_command(["prog"], kernel_regex="bwd", launch_count=3,
                           metrics=["gpu__time_duration.sum", "smsp__inst_executed_op_ldsm.sum"], executable=exe)
    assert len(log.read_text().splitlines()) == 2 and len(reps) == 3
    assert all(any("does not know smsp__inst_executed_op_ldsm.sum" in n for n in r.notes) for r in reps)


def test_no_launch_is_one_report_saying_why():
    assert split_launches("==PROF== nothing\n") == []
    (rep,) = P.reports_from_output("==WARNING== No kernels were profiled.\n")
    assert not rep.ok and "no launch" in rep.error


# -- the launches labelled --------------------------------------------------------------------------------------------
def test_launches_are_labelled_by_name_and_order():
    b = _bench()
    names = ["bwd_pre_bf16_d64", "bwd_dkdv_w8_bf16_d64", "bwd_dq_convert_bf16",
             "bwd_pre_bf16_d64", "hbwd_bf16_d64", "bwd_dq_convert_bf16",
             "flash_bwd_dot_do_o_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "flash_bwd_convert_dq_kernel",
             "bwd_pre_bf16_d128", "bwd_dkdv_w8_bf16_d128", "bwd_dq_convert_bf16",
             "flash_bwd_dot_do_o_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "flash_bwd_convert_dq_kernel"]
    tags = b.label_launches(names, [(64, 4096), (128, 4096)])
    assert tags == [("atomic_w8", 64, 4096, "preprocess"), ("atomic_w8", 64, 4096, "dK/dV (+dQ red)"),
                    ("atomic_w8", 64, 4096, "dQ convert"),
                    ("hopper", 64, 4096, "preprocess"), ("hopper", 64, 4096, "dK/dV/dQ"),
                    ("hopper", 64, 4096, "dQ convert"),
                    ("FLASH", 64, 4096, "preprocess"), ("FLASH", 64, 4096, "dK/dV/dQ"),
                    ("FLASH", 64, 4096, "dQ convert"),
                    ("atomic_w8", 128, 4096, "preprocess"), ("atomic_w8", 128, 4096, "dK/dV (+dQ red)"),
                    ("atomic_w8", 128, 4096, "dQ convert"),
                    ("FLASH", 128, 4096, "preprocess"), ("FLASH", 128, 4096, "dK/dV/dQ"),
                    ("FLASH", 128, 4096, "dQ convert")]


@pytest.mark.parametrize("first,second,first_label,label", [
    ("bwd_dkdv_w8_bf16_d64", "bwd_dkdv_2d_bf16_d64", "atomic_w8", "atomic_2d"),          # rung 8 after atomic_w8
    ("bwd_dkdv_2d_bf16_d64", "bwd_dkdv_ilp_bf16_d64", "atomic_2d", "atomic_2d_ilp"),     # rung 9 after rung 8
    ("bwd_dkdv_ilp_bf16_d64", "bwd_dkdv_fa2_bf16_d64", "atomic_2d_ilp", "atomic_fa2"),    # rung 10 after rung 9
])
def test_each_rungs_launches_are_labelled_by_its_dkdv_kernel(first, second, first_label, label):
    b = _bench()
    names = ["bwd_pre_bf16_d64", first, "bwd_dq_convert_bf16",
             "bwd_pre_bf16_d64", second, "bwd_dq_convert_bf16",
             "flash_bwd_dot_do_o_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "flash_bwd_convert_dq_kernel"]
    tags = b.label_launches(names, [(64, 4096)])
    assert tags[3:6] == [(label, 64, 4096, "preprocess"), (label, 64, 4096, "dK/dV (+dQ red)"),
                         (label, 64, 4096, "dQ convert")]
    assert tags[1] == (first_label, 64, 4096, "dK/dV (+dQ red)")


# -- the model, from the compiled kernel ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def step2():
    import kernellab
    from notebook_cells import named_cuda_cells_with_arch

    arch, source = named_cuda_cells_with_arch("08-attention-backward.py")["attn_bwd"]
    return kernellab.compile_cuda(source, first_line=2, filename="cell.cu", **({"arch": arch} if arch else {}))


@pytest.mark.parametrize("d", (64, 128))
def test_the_model_counts_what_the_kernel_does(step2, d):
    b = _bench()
    k = step2[f"bwd_dkdv_w8_bf16_d{d}"]
    loop = b.loop_body(str(k.sass))
    # the tile step's loop holds every HMMA and reduction of the kernel (the dQ k-loop once: 8 of its 32 HMMA)
    assert b._count(loop, "HMMA") == 128 + 8 and b._count(loop, "REDG") == 8
    assert b._count(loop, "LDSM") == {64: 78, 128: 86}[d] and b._count(loop, "BAR") == 2
    m = b.static_model(step2, d, 4096)
    assert m["hmma_per_warp_step"] == 160 and m["ldsm_x4_per_warp_step"] == {64: 96, 128: 104}[d]
    # shared traffic besides ldmatrix: the LSE / Dv reads and dS stores, not ptxas's never-executed `@!PT LDS`
    assert b._count(loop, "LDS") == {64: 24, 128: 12}[d] and loop.get("LDS@!PT") == 48
    rows = {r["resource"].split(" (")[0]: r for r in m["rows"]}
    wf = rows["shared memory"]["per_block_step"] / rows["tensor pipe"]["per_block_step"]
    # Nsight Compute on an H100 (NOTES-attention-backward.md, 2026-11-28): 2.81 / 2.86 wavefronts a HMMA
    assert wf == pytest.approx({64: 2.81, 128: 2.86}[d], abs=0.08), wf
    # every HMMA is a FLOP of 10 B H N^2 d (the five products): the counts and the FLOP formula agree exactly
    assert m["blocks"] * m["steps"] * 8 * m["hmma_per_warp_step"] * 4096 == m["flops"]
    # the dQ share a step reaches L2 once: N / 128 key blocks x the [N, d] fp32 dQ of every head
    red = next(r for r in m["rows"] if r["resource"].startswith("dQ reductions"))
    assert m["blocks"] * m["steps"] * red["per_block_step"] == (4096 // 128) * m["B"] * m["H"] * 4096 * d * 4
    assert m["registers"] == k.resources.registers and m["blocks_per_sm"] == 1      # 210 / 255 registers x 256
    # the verdict the model gives: shared memory (0.6 ldmatrix.x4 per HMMA, 4 wavefronts each) over the tensor pipe
    assert m["bound"].startswith("shared memory")
    tensor = next(r for r in m["rows"] if r["resource"].startswith("tensor"))["alone_ms"]
    assert 1.8 < m["predicted_ms"] / tensor < 2.4
    flash_ms = m["flops"] / (b.H100_MEASURED_TFLOPS[d]["FLASH"] * 1e12) * 1e3
    atomic_ms = m["flops"] / (b.H100_MEASURED_TFLOPS[d]["atomic_w8"] * 1e12) * 1e3
    assert m["predicted_ms"] < flash_ms < atomic_ms      # at its bound it would just beat FLASH; measured, it does not
    # the two small kernels stream [B H N d] arrays: 8 B an element in, 6 B for the conversion (~60-80 us each)
    assert m["pre_us"] == pytest.approx((m["B"] * m["H"] * 4096 * (8 * d + 4)) / 3.35e12 * 1e6)
    assert 50 < m["convert_us"] < m["pre_us"] < 100
    text = b.model_table(m, flash_ms)
    assert "bound: shared memory" in text and f"{m['ldsm_per_hmma']:.2f} per HMMA" in text


def test_the_model_of_rung_8_counts_its_2d_tile(step2):
    """atomic_2d (4 warps of 32 keys, 32 queries a step, 2 blocks an SM): the same 160 HMMA a warp step with 72
    ldmatrix.x4 instead of 96, the SASS loop agreeing (its dQ k-loop unrolled by 4: 16 of 32 HMMA, 12 of 24 LDSM);
    fewer shared wavefronts per 64 queries than atomic_w8, the same HMMA and reductions."""
    b = _bench()
    k = step2["bwd_dkdv_2d_bf16_d64"]
    loop = b.loop_body(str(k.sass))
    assert b._count(loop, "HMMA") == 128 + 16 and b._count(loop, "LDSM") == 48 + 12 and b._count(loop, "REDG") == 8
    m = b.static_model(step2, 64, 4096, variant="atomic_2d")
    w8 = b.static_model(step2, 64, 4096)
    assert (m["warps"], m["keys"], m["BM"], m["mt"]) == (4, 128, 32, 2) and m["blocks_per_sm"] == 2
    assert m["hmma_per_warp_step"] == 160 and m["ldsm_x4_per_warp_step"] == 72
    assert m["blocks"] * m["steps"] * 4 * m["hmma_per_warp_step"] * 4096 == m["flops"] == w8["flops"]
    rows = {r["resource"].split(" (")[0]: r for r in m["rows"]}
    rows8 = {r["resource"].split(" (")[0]: r for r in w8["rows"]}
    assert rows["tensor pipe"]["per_64_queries"] == rows8["tensor pipe"]["per_64_queries"]
    assert rows["dQ reductions"]["alone_ms"] == pytest.approx(rows8["dQ reductions"]["alone_ms"])
    wf, wf8 = (x["shared memory"]["per_64_queries"] / x["tensor pipe"]["per_64_queries"] for x in (rows, rows8))
    assert wf < 2.15 < 2.6 < wf8, (wf, wf8)             # the model's 2.08 against 2.75 wavefronts a HMMA
    assert b.model_beside(m)["occupancy_pct"] == pytest.approx(12.5)      # 2 blocks x 4 warps of 64
    # d = 128: warp pairs (bwd::dkdv_pair), 8 warps, 1 block; again 160 HMMA and 72 ldmatrix.x4 a warp step against
    # atomic_w8's 104; the P^T tile (fp32) in the shared memory that sets the occupancy
    k = step2["bwd_dkdv_2d_bf16_d128"]
    loop = b.loop_body(str(k.sass))
    assert b._count(loop, "HMMA") == 128 + 16 and b._count(loop, "LDSM") == 48 + 12 and b._count(loop, "BAR") == 3
    assert b._count(loop, "STS") == 32 and b._count(loop, "REDG") == 8          # 16 STS.64 (P^T), 16 STS (dS^T)
    m = b.static_model(step2, 128, 4096, variant="atomic_2d")
    w8 = b.static_model(step2, 128, 4096)
    assert (m["warps"], m["keys"], m["BM"], m["mt"]) == (8, 128, 32, 2) and m["blocks_per_sm"] == 1
    assert m["hmma_per_warp_step"] == 160 and m["ldsm_x4_per_warp_step"] == 72 and w8["ldsm_x4_per_warp_step"] == 104
    assert m["shared_bytes"] == 131_584 and m["flops"] == w8["flops"]
    rows = {r["resource"].split(" (")[0]: r for r in m["rows"]}
    wf = rows["shared memory"]["per_block_step"] / rows["tensor pipe"]["per_block_step"]
    assert 2.2 < wf < 2.6, wf              # both of a pair's hand-over branches counted: 2.46 (each warp's own ~2.25)


def test_a_measured_instruction_count_replaces_the_static_one(step2):
    b = _bench()
    static = b.static_model(step2, 64, 4096)
    blocks_steps_warps = static["blocks"] * static["steps"] * 8
    m = b.static_model(step2, 64, 4096, clock_hz=1.98e9, instructions=2_000 * blocks_steps_warps)
    assert m["instructions_per_warp_step"] == pytest.approx(2_000)
    assert m["bound"].startswith("issue")                # 8 x 2,000 / 4 a clock > the 3,524 shared wavefronts
    assert m["clock_hz"] == 1.98e9


# -- the tables and the verdict from fake reports ---------------------------------------------------------------------
def _fake_report(name, us, **values):
    """A made-up ProfileReport (fake): duration `us`, and metrics by the short keys below."""
    names = {"tensor": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
             "issue": "smsp__issue_active.avg.pct_of_peak_sustained_active",
             "shared": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
             "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
             "wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
             "hmma": "sm__inst_executed_pipe_tensor_op_hmma.sum", "red": "lts__t_sectors_op_red.sum",
             "clock": "sm__cycles_elapsed.avg.per_second",
             "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"}
    metrics = [Metric("gpu__time_duration.sum", "duration", us * 1e-6, "second")]
    for key, v in values.items():
        if key.startswith("stall_"):
            metrics.append(Metric(f"{P.STALL_PREFIX}{key[6:]}{P.STALL_SUFFIX}", key, float(v), ""))
        else:
            metrics.append(Metric(names[key], key, float(v), "%" if key in ("tensor", "issue", "shared", "occupancy")
                                  else ""))
    return ProfileReport(kernel=name, metrics=tuple(metrics))


def test_top_stalls_leave_out_issuing_warps():
    rep = _fake_report("k", 1, stall_selected=9, stall_not_selected=8, stall_barrier=1, stall_short_scoreboard=3,
                       stall_mio_throttle=2, stall_wait=0.5)
    assert top_stalls(rep) == [("short_scoreboard", 3.0), ("mio_throttle", 2.0), ("barrier", 1.0)]


def test_run_profile_prints_the_tables_and_the_verdict(step2, tmp_path, monkeypatch):
    b = _bench()
    monkeypatch.setattr(b, "load_tutorial", lambda notebook, compile=None: {"attn_bwd": step2})
    ours = dict(tensor=38, issue=45, shared=88, occupancy=12.4, wavefronts=3.2e8, hmma=8.4e7, red=1.3e8,
                clock=1.755e9, conflicts=1.2e6, stall_short_scoreboard=2.1, stall_mio_throttle=1.4, stall_barrier=0.9,
                stall_selected=1)
    flash = dict(tensor=62, issue=50, shared=55, occupancy=24, wavefronts=1.6e8, hmma=8.4e7, stall_wait=1.1)
    launches = {64: [("bwd_pre_bf16_d64", 90, {}), ("bwd_dkdv_w8_bf16_d64", 6400, ours),
                     ("bwd_dq_convert_bf16", 60, {}), ("bwd_pre_bf16_d64", 90, {}), ("hbwd_bf16_d64", 4400, {}),
                     ("bwd_dq_convert_bf16", 60, {}), ("flash_bwd_dot_do_o_kernel", 80, {}),
                     ("flash_bwd_clear_dkvaccum", 20, dict(tensor=0, shared=0)),   # a small one: not the main
                     ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 4900, flash),
                     ("flash_bwd_convert_dq_kernel", 50, {})],
                128: [("bwd_pre_bf16_d128", 90, {}), ("bwd_dkdv_w8_bf16_d128", 6300, ours),
                      ("bwd_dq_convert_bf16", 60, {}), ("flash_bwd_dot_do_o_kernel", 80, {}),
                      ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 4600, flash),
                      ("flash_bwd_convert_dq_kernel", 50, {})]}
    asked = {}

    def fake_profile(argv, **kw):
        asked.update(kw, argv=argv)
        return [_fake_report(n, us, **v) for d in (64, 128) for n, us, v in launches[d]]

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = b.run_profile(tmp_path, (4096,), (64, 128), profile=fake_profile)
    text = buf.getvalue()
    assert rc == 0, text
    assert asked["kernel_regex"] == "bwd" and "--profile-child" in asked["argv"]
    assert tuple(asked["extra_args"]) == ("--print-units", "base")      # counts unscaled, whatever their size
    assert "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" in asked["metrics"]
    assert any("lg_throttle" in m for m in asked["metrics"])
    last = text[text.index("== Where the time goes"):]
    # the whole backward: ncu durations summed per implementation
    assert "atomic_w8 6,550 us, FLASH 5,050 us (0.77x FLASH's speed), hopper 4,550 us" in last
    assert "atomic_w8 6,450 us, FLASH 4,730 us" in last
    assert "atomic_w8 dK/dV d64 | 6,400 | 38 % | 45 % | 88 % | 3.81 |" in last     # 3.2e8 / 8.4e7 wavefronts/HMMA
    assert "FLASH dK/dV/dQ d64 | 4,900 | 62 %" in last
    assert last.count("SUPPORTED shared-memory bound") == 2
    assert last.count("not shown dQ reductions bound") == 2 and last.count("not shown tensor bound") == 2
    assert last.count("not shown too little overlap") == 2          # the first stall is shared memory's, not a wait
    assert "(FLASH 1.90)" in last and "model: shared memory" in last
    saved = json.loads((tmp_path / "attention_backward_profile.json").read_text())
    assert [r["d"] for r in saved["results"]] == [64, 128]
    assert saved["results"][0]["whole_us"]["hopper"] == pytest.approx(4550)


def test_run_profile_puts_rung_8_beside_atomic_w8_and_flash(step2, tmp_path, monkeypatch):
    """With atomic_2d's launches among the reports (d = 64): its row and its model's in the short table, its
    wavefronts a HMMA and time against the prediction, its whole backward against FLASH's."""
    b = _bench()
    monkeypatch.setattr(b, "load_tutorial", lambda notebook, compile=None: {"attn_bwd": step2})
    ours = dict(tensor=33, issue=34, shared=60, occupancy=12.4, wavefronts=2.4e8, hmma=8.4e7, clock=1.755e9,
                stall_wait=2.0, stall_short_scoreboard=1.5, stall_barrier=1.0)
    two = dict(tensor=47, issue=40, shared=62, occupancy=12.4, wavefronts=1.8e8, hmma=8.4e7, clock=1.755e9,
               stall_wait=2.0, stall_short_scoreboard=1.4, stall_long_scoreboard=1.0)
    flash = dict(tensor=46, issue=33, shared=61, occupancy=12.4, wavefronts=1.75e8, hmma=8.4e7, stall_wait=1.1)
    launches = [("bwd_pre_bf16_d64", 90, {}), ("bwd_dkdv_w8_bf16_d64", 6600, ours), ("bwd_dq_convert_bf16", 60, {}),
                ("bwd_pre_bf16_d64", 90, {}), ("bwd_dkdv_2d_bf16_d64", 4700, two), ("bwd_dq_convert_bf16", 60, {}),
                ("flash_bwd_dot_do_o_kernel", 80, {}), ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 4750, flash),
                ("flash_bwd_convert_dq_kernel", 50, {})]
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = b.run_profile(tmp_path, (4096,), (64,),
                           profile=lambda argv, **kw: [_fake_report(n, us, **v) for n, us, v in launches])
    text = buf.getvalue()
    assert rc == 0, text
    last = text[text.index("== Where the time goes"):]
    assert "atomic_w8 6,750 us, FLASH 4,880 us (0.72x FLASH's speed), atomic_2d 4,850 us (1.01x FLASH's speed)" in last
    assert "atomic_2d dK/dV d64 | 4,700 | 47 % | 40 % | 62 % | 2.14 |" in last        # 1.8e8 / 8.4e7
    assert "\natomic_2d dK/dV d64 | 4,700 |" in last and "\nmodel 2d d64 (" in last      # after atomic_w8 and its model
    assert ("atomic_2d: shared wavefronts per HMMA 2.14 (predicted 2.0-2.2: as predicted; atomic_w8 2.86, FLASH "
            "2.08), dK/dV kernel 4,700 us (predicted 4,500-5,600: as predicted") in last
    assert "atomic_2d: beside FLASH's dK/dV/dQ kernel: shared wavefronts per HMMA 2.14 (FLASH 2.08)" in last
    saved = json.loads((tmp_path / "attention_backward_profile.json").read_text())
    assert saved["results"][0]["whole_us"]["atomic_2d"] == pytest.approx(4850)


def test_the_suite_runs_the_profile():
    spec = importlib.util.spec_from_file_location("gpu_run_for_profile", ROOT / "tools" / "gpu" / "run.py")
    run = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = run                # dataclasses look the module up while the file runs
    spec.loader.exec_module(run)
    suite = run.SUITES["profile-attention-backward"]
    assert suite.limit_s <= 300 and ("python3", "benchmarks/attention_backward.py", "--profile", "--out",
                                     "{out}") in suite.commands


def test_each_hypothesis_can_hold():
    b = _bench()
    stalls = (lambda *names: [(n, 1.0) for n in names])     # noqa: E731
    base = dict(tensor_pct=30, issue_pct=40, shared_pct=40, occupancy_pct=12.4, red_gb_per_s=300)
    cases = {"dQ reductions bound": dict(base, stalls=stalls("lg_throttle", "barrier")),
             "too little overlap": dict(base, stalls=stalls("barrier", "long_scoreboard")),
             "issue bound": dict(base, issue_pct=85, stalls=stalls("not_selected")),
             "tensor bound": dict(base, tensor_pct=90, stalls=stalls("math_pipe_throttle")),
             "shared-memory bound": dict(base, stalls=stalls("mio_throttle"))}
    for name, summary in cases.items():
        held = [line for line in b.verdict(summary, None, None) if line.startswith("SUPPORTED")]
        assert [line.split(":")[0] for line in held] == [f"SUPPORTED {name}"], (name, held)


def test_a_failed_profile_says_why_and_fails(step2, tmp_path, monkeypatch):
    b = _bench()
    monkeypatch.setattr(b, "load_tutorial", lambda notebook, compile=None: {"attn_bwd": step2})
    said = ("Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory\n"
            "==WARNING== No kernels were profiled.")

    def fake_profile(argv, **kw):
        return P.reports_from_output(said, command=("ncu", "python3", "child"))

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = b.run_profile(tmp_path, (4096,), (64,), profile=fake_profile)
    text = buf.getvalue()
    assert rc == 1 and "RuntimeError: CUDA error: out of memory" in text and "profile INCOMPLETE" in text
    assert "no profile of atomic_w8's dK/dV kernel at d = 64" in text


def test_the_clock_is_read_in_any_unit():
    b = _bench()
    for value, unit in ((1.755e9, "cycle/second"), (1.755, "cycle/nsecond"), (1.755, "Ghz"), (1755.0, "Mhz"),
                        (1.755e9, "hz"), (1.755, "")):
        rep = ProfileReport(kernel="k", metrics=(Metric("sm__cycles_elapsed.avg.per_second", "SM clock", value, unit),))
        assert b._clock_hz(rep) == pytest.approx(1.755e9), unit
    assert b._clock_hz(ProfileReport(kernel="k")) is None


def test_step3bs_launches_are_labelled_and_a_wgmma_kernel_counts_hmma_equivalents():
    """Step 3b's launches (hbwd_pre_*, hbwd_rows_*, the dQ conversion) are hopper_rows', step 3's hopper's; and a wgmma
    kernel's wavefronts a HMMA are per HMMA.16816 equivalent (4,096 FLOP) when its FLOPs are given: ncu's HMMA-pipe
    count is of HGMMA warp instructions there (step 3 on an H100: 3.40e8 wavefronts, 4.40e7 HGMMA warp instructions,
    7.73 of them each, 1.01 per equivalent at d = 64, N = 4096)."""
    b = _bench()
    names = ["bwd_pre_bf16_d64", "hbwd_bf16_d64", "bwd_dq_convert_bf16",
             "hbwd_pre_bf16_d64", "hbwd_rows_bf16_d64", "bwd_dq_convert_bf16",
             "flash_bwd_dot_do_o_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "flash_bwd_convert_dq_kernel"]
    assert b.label_launches(names, [(64, 4096)]) == [
        ("hopper", 64, 4096, "preprocess"), ("hopper", 64, 4096, "dK/dV/dQ"), ("hopper", 64, 4096, "dQ convert"),
        ("hopper_rows", 64, 4096, "preprocess"), ("hopper_rows", 64, 4096, "dK/dV/dQ"),
        ("hopper_rows", 64, 4096, "dQ convert"),
        ("FLASH", 64, 4096, "preprocess"), ("FLASH", 64, 4096, "dK/dV/dQ"), ("FLASH", 64, 4096, "dQ convert")]
    rep = _fake_report("hbwd_bf16_d64", 4467, wavefronts=340_272_337, hmma=44_040_192)
    assert b.summarize_kernel(rep)["wavefronts_per_hmma"] == pytest.approx(7.73, abs=0.01)
    flops = 10 * 4 * 32 * 4096 * 4096 * 64
    s = b.summarize_kernel(rep, flops)
    assert s["wavefronts_per_hmma"] == pytest.approx(1.014, abs=0.01)   # 1,298 a block's tile step / 1,280 HMMA eq.
    assert s["hmma_tflops"] == pytest.approx(flops / 4467e-6 / 1e12)


# -- rung 8's shared accesses by the bank model, and rung 9 against its prediction -------------------------------------
def test_every_shared_access_of_rung_8_is_conflict_free_by_the_bank_model():
    """Each warp's lane addresses of every shared access of rung 8's step at d = 64 (as the kernel computes them)
    through kernellab.analysis.banks: 72 ldmatrix.x4 and 16 dS^T stores a warp step as the SASS has them, no bank
    conflict anywhere, 2.10 wavefronts a HMMA (the profile measured 2.20 with 14.7 conflict wavefronts a warp step)."""
    b = _bench()
    s = b.rung8_bank_summary(64)
    by = {r["site"]: r for r in s["rows"]}
    ldsm = sum(r["instructions"] for r in s["rows"] if r["what"].startswith("ldmatrix"))
    assert ldsm == 72 and by["dS^T store"]["instructions"] == 16 and s["hmma"] == 160
    assert all(r["excess_wavefronts"] == 0 and r["ways"] == 1 for r in s["rows"]), s["rows"]
    assert all(r["wavefronts"] == 4 * r["instructions"] for r in s["rows"] if r["what"].startswith("ldmatrix"))
    assert s["wavefronts"] == pytest.approx(336.5) and s["wavefronts_per_hmma"] == pytest.approx(2.103, abs=1e-3)
    assert "0 from bank conflicts" in b.rung8_bank_table(64) and "2.10 a HMMA" in b.rung8_bank_table(64)


def test_the_bank_table_sees_conflicts_where_the_swizzle_is_taken_away(monkeypatch):
    """The same accesses with the swizzle removed (row-major rows of 128 bytes): ldmatrix's 8 rows a phase fall in one
    bank group (8-way), the dS^T stores 8-way too; the table is not blind to conflicts."""
    b = _bench()
    monkeypatch.setattr(b, "_swz", lambda row, chunk, cols: row * cols * 2 + (chunk << 4))
    s = b.rung8_bank_summary(64)
    by = {r["site"]: r for r in s["rows"]}
    assert by["S^T = K Q^T: A (K)"]["ways"] == 8 and by["dS^T store"]["ways"] == 8
    assert by["S^T = K Q^T: A (K)"]["wavefronts"] == 8 * by["S^T = K Q^T: A (K)"]["ideal_wavefronts"]
    assert s["excess_wavefronts"] > 1000


def _summary(**kw):
    base = dict(us=5519.0, tensor_pct=39.0, wavefronts_per_hmma=2.20, bank_conflicts=30_828_655.0,
                stalls=[("wait", 1.72), ("short_scoreboard", 0.79), ("barrier", 0.34)])
    return dict(base, **kw)


def test_rung_9_lines_weigh_the_l1_hypothesis_and_the_speed():
    b = _bench()
    two = _summary()
    held = b.rung_9_lines(_summary(us=5250.0, wavefronts_per_hmma=2.12, bank_conflicts=1.1e6), two, 64)
    text = "\n".join(held)
    assert "shared wavefronts per HMMA 2.12 (predicted 2.10-2.14: as predicted; atomic_2d 2.20" in text
    assert "bank conflicts 1,100,000 (atomic_2d 30,828,655" in text and "hypothesis SUPPORTED" in text
    assert "dK/dV kernel 5,250 us, 1.051x atomic_2d's speed (5,519 us; predicted 1.03-1.08x: as predicted)" in text
    rejected = "\n".join(b.rung_9_lines(_summary(us=5600.0, bank_conflicts=3.05e7), two, 64))
    assert "hypothesis REJECTED" in rejected and "0.986x atomic_2d's speed" in rejected
    assert "below the prediction" in rejected and "ABOVE the prediction" in rejected      # 2.20 wf: above 2.14
    d128 = b.rung_9_lines(_summary(us=6844 / 1.02), _summary(us=6844.0), 128)
    assert len(d128) == 1 and "1.020x atomic_2d's speed" in d128[0] and "predicted 0.97-1.03x: as predicted" in d128[0]


def test_rung_10_lines_weigh_the_kernel_against_its_bound_and_flash():
    """The model's bound from rung 10's own model (a made-up one here): 1.65x it is inside the predicted 1.5-1.8x,
    2.0x above; the wavefronts beside the bank model's count and FLASH's."""
    b = _bench()
    model = dict(predicted_ms=3.0, blocks_per_sm=1, warps=8, blocks=100, steps=64, bound="shared memory (x)",
                 rows=[dict(resource="tensor pipe", alone_ms=2.2, per_block_step=2560),
                       dict(resource="issue", alone_ms=1.0, per_block_step=1),
                       dict(resource="shared memory (ldmatrix)", alone_ms=3.0, per_block_step=5200),
                       dict(resource="dQ reductions", alone_ms=0.5, per_block_step=512)])
    flash = _summary(us=4429.0, wavefronts_per_hmma=1.95, tensor_pct=49.0)
    inside = "\n".join(b.rung_10_lines(_summary(us=4950.0, wavefronts_per_hmma=2.05), flash, model, 128))
    assert "shared wavefronts per HMMA 2.05 (bank model 2.03; FLASH 1.95)" in inside
    assert "dK/dV kernel 4,950 us, 1.65x the model's bound (3,000 us; predicted 1.5-1.8x: as predicted)" in inside
    assert "FLASH's dK/dV/dQ 4,429 us" in inside and "tensor 39% (FLASH 49%)" in inside.replace(" %", "%")
    above = "\n".join(b.rung_10_lines(_summary(us=6000.0), flash, model, 128))
    assert "2.00x the model's bound" in above and "ABOVE the prediction" in above


def test_bank_lines_say_which_instructions_carry_the_conflicts():
    """A made-up per-line report (fake NcuBankReport): the excess by instruction kind, the worst lines, and what the
    launch's counter counted beyond the instructions' own excess."""
    from kernellab.run.nvtools.ncu_source import LineCounters, NcuBankReport

    b = _bench()
    rep = NcuBankReport("bwd_dkdv_2d_bf16_d64", (
        LineCounters(120, "load", 10, 400, 400, 1.0, 16, "ldmatrix_x4(af[m], ...)", ("LDSM.16.M88.4 R1, [R2]",)),
        LineCounters(140, "store", 8, 900, 100, 9.0, 16, "cp_async_4(dst + 4 * i, ...)", ("LDGSTS.E [R3], [R4]",)),
        LineCounters(150, "store", 16, 16, 16, 1.0, 4, "*reinterpret_cast<uint32_t*>(ds + ...)", ("STS [R5], R6",))))
    lines = b.bank_lines("atomic_2d", rep, counted=30_000.0)
    assert lines[0].startswith("atomic_2d: ncu source counters: 1,316 shared wavefronts, 516 ideal, 800 excess")
    assert "the difference 29,200 is on no instruction's addresses" in lines[0]
    assert lines[1] == "atomic_2d: excess by instruction: LDGSTS.E 800, LDSM.16.M88.4 0, STS 0"
    assert lines[2].startswith("  line 140 (store, LDGSTS.E): 800 excess of 900 wavefronts; cp_async_4")
    assert len(lines) == 3
    assert "not measured" in b.bank_lines("x", NcuBankReport("k", (), reason="no ncu"))[0]


def test_run_profile_puts_rung_9_beside_rung_8_with_the_per_line_counters(step2, tmp_path, monkeypatch):
    """rung 9's launches among the reports (d = 64): its row after rung 8's model, its lines against its prediction,
    its whole backward; the per-line section asks `banks` for both kernels' symbols on a d = 64 child."""
    from kernellab.run.nvtools.ncu_source import LineCounters, NcuBankReport

    b = _bench()
    monkeypatch.setattr(b, "load_tutorial", lambda notebook, compile=None: {"attn_bwd": step2})
    w8 = dict(tensor=33, issue=34, shared=60, occupancy=12.4, wavefronts=2.36e8, hmma=8.4e7, clock=1.8e9,
              conflicts=1.0e6, stall_wait=1.56)
    two = dict(tensor=39, issue=39, shared=56, occupancy=12.2, wavefronts=1.85e8, hmma=8.4e7, clock=1.8e9,
               conflicts=3.08e7, stall_wait=1.72, stall_short_scoreboard=0.79)
    ilp = dict(tensor=41, issue=40, shared=55, occupancy=12.2, wavefronts=1.78e8, hmma=8.4e7, clock=1.8e9,
               conflicts=1.5e6, stall_wait=1.60)
    flash = dict(tensor=46, issue=33, shared=62, occupancy=12.5, wavefronts=1.75e8, hmma=8.4e7, stall_wait=1.75)
    launches = [("bwd_pre_bf16_d64", 97, {}), ("bwd_dkdv_w8_bf16_d64", 6662, w8), ("bwd_dq_convert_bf16", 85, {}),
                ("bwd_pre_bf16_d64", 97, {}), ("bwd_dkdv_2d_bf16_d64", 5519, two), ("bwd_dq_convert_bf16", 85, {}),
                ("bwd_pre_bf16_d64", 97, {}), ("bwd_dkdv_ilp_bf16_d64", 5250, ilp), ("bwd_dq_convert_bf16", 85, {}),
                ("flash_bwd_dot_do_o_kernel", 98, {}), ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 4794, flash),
                ("flash_bwd_convert_dq_kernel", 75, {})]
    asked = []

    def fake_banks(argv, symbol):
        asked.append((tuple(argv), symbol))
        return NcuBankReport(symbol, (LineCounters(140, "store", 8, 90, 10, 9.0, 4, "cp_async_4(...)",
                                                   ("LDGSTS.E [R3], [R4]",)),))

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = b.run_profile(tmp_path, (4096,), (64,), banks=fake_banks,
                           profile=lambda argv, **kw: [_fake_report(n, us, **v) for n, us, v in launches])
    text = buf.getvalue()
    assert rc == 0, text
    assert [s for _, s in asked] == ["bwd_dkdv_2d_bf16_d64", "bwd_dkdv_ilp_bf16_d64"]
    assert all("--profile-child" in a and a[a.index("--dims") + 1] == "64" for a, _ in asked)
    per_line = text[text.index("== Shared wavefronts per source line"):text.index("== Where the time goes")]
    assert "atomic_2d: ncu source counters: 90 shared wavefronts, 10 ideal, 80 excess on its instructions (the " \
           "launch's bank-conflict counter: 30,800,000" in per_line
    last = text[text.index("== Where the time goes"):]
    assert "atomic_2d_ilp 5,432 us (0.91x FLASH's speed)" in last
    assert "\natomic_2d_ilp dK/dV d64 | 5,250 | 41 % |" in last
    assert last.index("\nmodel 2d d64 (") < last.index("\natomic_2d_ilp dK/dV d64") < last.index("\nFLASH dK/dV/dQ")
    assert "atomic_2d_ilp: bank conflicts 1,500,000 (atomic_2d 30,800,000" in last and "SUPPORTED" in last
    assert "1.051x atomic_2d's speed" in last
    saved = json.loads((tmp_path / "attention_backward_profile.json").read_text())
    assert saved["results"][0]["whole_us"]["atomic_2d_ilp"] == pytest.approx(5432)


def test_the_bench_prints_rung_9_beside_its_prediction():
    b = _bench()
    rows = [dict(d=64, causal=False, N=4096, tflops={"ours (atomic_2d_ilp)": 255.0, "ours (atomic_2d)": 243.1,
                                                     "SDPA FLASH": 268.3}),
            dict(d=128, causal=True, N=4096, tflops={"ours (atomic_2d_ilp)": 170.0, "ours (atomic_2d)": 178.3,
                                                     "SDPA FLASH": 257.1}),
            dict(d=64, causal=True, N=4096, error="RuntimeError: boom")]
    lines = b.rung_9_bench_lines(rows)
    assert len(lines) == 3
    assert "d= 64 causal=False N=4096:  255.0 TFLOP/s, 0.95x FLASH (predicted 0.93-0.98: as predicted), 1.049x " \
           "atomic_2d (predicted 1.03-1.08: as predicted); target 1.0x FLASH missed by 5 %" in lines[1]
    assert "0.66x FLASH (predicted 0.68-0.71: below the prediction), 0.953x atomic_2d (predicted 0.97-1.03: below" \
           in lines[2]


def test_the_2d_suite_benchmarks_rung_9_beside_rung_8():
    spec = importlib.util.spec_from_file_location("gpu_run_for_rung9", ROOT / "tools" / "gpu" / "run.py")
    run = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = run
    spec.loader.exec_module(run)
    suite = run.SUITES["bench-attention-backward-2d"]
    assert suite.limit_s <= 300
    tests, bench = suite.commands
    assert tests[tests.index("-k") + 1] == "atomic_2d or atomic_fa2"   # selects atomic_2d_ilp's tests too
    assert bench[bench.index("--variants") + 1].split(",") == ["atomic_fa2", "atomic_2d_ilp", "atomic_2d",
                                                                  "atomic_w8"]
    assert bench[bench.index("--dims") + 1] == "64,128" and bench[bench.index("--ns") + 1] == "4096"


# -- rung 10 (atomic_fa2): FlashAttention-2's tile, its model and bank table, its prediction beside the bench ----------
@pytest.mark.parametrize("d", (64, 128))
def test_every_shared_access_of_rung_10_is_conflict_free_by_the_bank_model(d):
    """Each warp's lane addresses of every shared access of rung 10's step (lane_off and the constant XORs, as the
    kernel computes them) through kernellab.analysis.banks: 88 / 144 ldmatrix.x4 a warp step (as the SASS), 16 P
    and 16 dS stores, no conflict anywhere; 2.55 wavefronts a HMMA at d = 64, 2.03 at d = 128 (FLASH measured
    2.09 / 1.95)."""
    b = _bench()
    rows = b.fa2_shared_accesses(d)
    by = {r["site"]: r for r in rows}
    ldsm = sum(r["instructions"] for r in rows if r["what"].startswith("ldmatrix"))
    assert ldsm == {64: 88, 128: 144}[d]
    assert by["P store"]["instructions"] == 16 and by["dS store"]["instructions"] == 16
    assert all(r["excess_wavefronts"] == 0 and r["ways"] == 1 for r in rows), rows
    wf = sum(r["wavefronts"] for r in rows)
    assert wf / (5 * d // 2) == pytest.approx({64: 2.553, 128: 2.027}[d], abs=1e-3)
    table = b.rung10_bank_table(d)
    assert "0 from bank conflicts" in table and f"{wf / (5 * d // 2):.2f} a HMMA" in table


def test_the_rung_10_bank_table_sees_conflicts_where_the_swizzle_is_taken_away(monkeypatch):
    """Without the XOR of lane_off (row-major rows), the P / dS stores and the transposed reads conflict."""
    b = _bench()
    monkeypatch.setattr(b, "_lane_off", lambda lr, lc, cfold, cols: lr * 2 * cols | ((lc ^ cfold) << 4))
    by = {r["site"]: r for r in b.fa2_shared_accesses(128)}
    assert by["P store"]["ways"] > 1 and by["dV += P^T dO: A (P^T)"]["ways"] == 8


def test_the_model_of_rung_10_counts_flashattention_2s_tile(step2):
    """atomic_fa2 (8 warps, 128 keys, 64 queries a step, P and dS in shared memory): 5 d / 2 HMMA a warp step (the
    SASS loop holds all of them), 88 / 144 ldmatrix.x4, the FLOPs of 10 B H N^2 d; one block an SM; the model's
    wavefronts a HMMA 2.55 / 2.03 (rung 8 2.08, atomic_w8 2.75 / 2.83) and the shared bound 3.81 / 3.03 ms."""
    b = _bench()
    for d, ldsm, wf_want, bound in ((64, 88, 2.55, 3.81), (128, 144, 2.03, 3.03)):
        k = step2[f"bwd_dkdv_fa2_bf16_d{d}"]
        loop = b.loop_body(str(k.sass))
        assert b._count(loop, "HMMA") == 5 * d // 2 and b._count(loop, "LDSM") == ldsm
        assert b._count(loop, "STS") == 32 and b._count(loop, "BAR") == 2 and b._count(loop, "REDG") == d // 8
        m = b.static_model(step2, d, 4096, variant="atomic_fa2")
        w8 = b.static_model(step2, d, 4096)
        assert (m["warps"], m["keys"], m["BM"], m["mt"]) == (8, 128, 64, 2) and m["blocks_per_sm"] == 1
        assert m["hmma_per_warp_step"] == 5 * d // 2 and m["ldsm_x4_per_warp_step"] == ldsm
        assert m["shared_bytes"] == {64: 99_328, 128: 164_864}[d] and m["flops"] == w8["flops"]
        assert m["blocks"] * m["steps"] * 8 * m["hmma_per_warp_step"] * 4096 == m["flops"]
        rows = {r["resource"].split(" (")[0]: r for r in m["rows"]}
        wf = rows["shared memory"]["per_block_step"] / rows["tensor pipe"]["per_block_step"]
        assert wf == pytest.approx(wf_want, abs=0.01), wf
        red = rows["dQ reductions"]
        assert m["blocks"] * m["steps"] * red["per_block_step"] == (4096 // 128) * m["B"] * m["H"] * 4096 * d * 4
        assert m["bound"].startswith("shared memory") and m["predicted_ms"] == pytest.approx(bound, abs=0.01)


def test_the_bench_prints_rung_10_beside_its_prediction():
    b = _bench()
    rows = [dict(d=128, causal=False, N=4096, tflops={"ours (atomic_fa2)": 270.0, "ours (atomic_w8)": 205.0,
                                                      "SDPA FLASH": 289.0}),
            dict(d=64, causal=True, N=4096, tflops={"ours (atomic_fa2)": 240.0, "ours (atomic_2d_ilp)": 226.9,
                                                    "SDPA FLASH": 231.6}),
            dict(d=64, causal=False, N=4096, error="RuntimeError: boom")]
    lines = b.rung_10_bench_lines(rows)
    assert len(lines) == 3
    assert "d=128 causal=False N=4096:  270.0 TFLOP/s, 0.93x FLASH (predicted 0.85-1.00: as predicted), 1.32x " \
           "atomic_w8 (predicted 1.20-1.45: as predicted); target 1.0x FLASH missed by 7 %" in lines[1]
    assert "1.04x FLASH (predicted 0.73-0.87: ABOVE the prediction), 1.06x atomic_2d_ilp (predicted 0.78-0.93: " \
           "ABOVE the prediction); target 1.0x FLASH reached" in lines[2]
