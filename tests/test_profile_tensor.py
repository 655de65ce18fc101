"""Kernel.profile and the tensor pipe (no GPU): the default metric set asks for tensor-pipe utilisation (HMMA and
Hopper's GMMA), the report exposes it, and a metric the device's ncu does not know is left out with a note instead of
failing the profile (a stand-in ncu that rejects the GMMA metrics as an older ncu or another GPU would)."""
import json
import pathlib
import stat
import sys
import textwrap

import pytest

from kernellab.run.nvtools import ncu as P
from kernellab.run.launch.job import ArgSpec, KernelJob
from kernellab.run.nvtools.ncu import DEFAULT_METRICS, TENSOR_GMMA_PCT, TENSOR_HMMA_PCT, profile, report_from_output

CAPTURED = pathlib.Path(__file__).resolve().parent / "fixtures" / "captured" / "ncu_metrics_details.csv"
HEAD = '"0","485","python3.12","127.0.0.1","mma_tile","1","7","(32, 1, 1)","(64, 1, 1)","0","9.0",' \
       '"Command line profiler metrics"'


def _job(name="mma_tile", device=None):
    return KernelJob(symbol=name, grid=(64, 1, 1), block=(32, 1, 1), args=(ArgSpec("scalar", "n", "int32", value=1),),
                     name=name, device=device)


def _ncu(tmp_path, unknown=()):
    """A stand-in ncu: logs each command line; stops at the first requested metric in `unknown`, as ncu does;
    otherwise prints the captured CSV plus a row per requested tensor metric."""
    log = tmp_path / "calls.jsonl"
    path = tmp_path / "ncu"
    path.write_text("#!" + sys.executable + "\n" + textwrap.dedent(f"""
        import json, sys
        argv = sys.argv[1:]
        open({str(log)!r}, "a").write(json.dumps(argv) + "\\n")
        names = argv[argv.index("--metrics") + 1].split(",")
        for n in names:
            if n in {list(unknown)!r}:
                print("==PROF== Connected to process 9 (python)")
                print("==ERROR== Failed to find metric " + n)
                sys.exit(1)
        sys.stdout.write(open({str(CAPTURED)!r}).read())
        values = {{{TENSOR_HMMA_PCT!r}: ("%", "63.25"), {TENSOR_GMMA_PCT!r}: ("%", "71.5"),
                  "sm__inst_executed_pipe_tensor_op_hmma.sum": ("inst", "1,024"),
                  "sm__inst_executed_pipe_tensor_op_gmma.sum": ("inst", "256")}}
        for n in names:
            if n in values:
                print({HEAD!r} + ',"%s","%s","%s"' % (n, *values[n]))
    """))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), log


def _calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_default_metrics_ask_for_the_tensor_pipe():
    names = [m for m, _ in DEFAULT_METRICS]
    for n in (TENSOR_HMMA_PCT, TENSOR_GMMA_PCT, "sm__inst_executed_pipe_tensor_op_hmma.sum",
              "sm__inst_executed_pipe_tensor_op_gmma.sum"):
        assert n in names
    assert dict(DEFAULT_METRICS)[TENSOR_GMMA_PCT] == "tensor pipe active, GMMA (wgmma)"


def test_tensor_pipe_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_unknown_metrics", {})
    exe, log = _ncu(tmp_path)
    rep = profile(_job(), executable=exe)
    assert rep.ok and len(_calls(log)) == 1
    assert rep.tensor_pipe_pct == {"hmma": 63.25, "gmma": 71.5}
    assert rep["tensor-pipe instructions executed (HMMA and HGMMA, per warp)"] == 1024 and rep["GMMA instructions executed"] == 256
    assert "tensor pipe active, GMMA (wgmma)" in str(rep) and "71.5 %" in str(rep)
    assert rep.to_json()["tensor_pipe_pct"] == {"hmma": 63.25, "gmma": 71.5}
    assert rep["shared load bank conflicts"] == 1_015_918               # the rest of the set is still there


def test_unknown_metrics_are_left_out_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_unknown_metrics", {})
    gmma = (TENSOR_GMMA_PCT, "sm__inst_executed_pipe_tensor_op_gmma.sum")
    exe, log = _ncu(tmp_path, unknown=gmma)
    rep = profile(_job(), executable=exe)
    calls = _calls(log)
    assert len(calls) == 3                                   # ncu names one unknown metric per run
    last = calls[-1][calls[-1].index("--metrics") + 1].split(",")
    assert not set(gmma) & set(last) and TENSOR_HMMA_PCT in last
    assert rep.ok and rep.error is None and rep.tensor_pipe_pct == {"hmma": 63.25}
    assert rep.get(TENSOR_GMMA_PCT) is None
    (note,) = [n for n in rep.notes if "does not know" in n]
    assert all(g in note for g in gmma) and note.endswith("left out")
    # the next profile in this process on the same GPU leaves them out at once, and says so
    again = profile(_job(), executable=exe)
    assert len(_calls(log)) == 4 and again.ok and any("does not know" in n for n in again.notes)
    # another GPU is asked afresh
    profile(_job(device=1), executable=exe)
    assert len(_calls(log)) == 7


def test_a_list_of_only_unknown_metrics_is_still_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_unknown_metrics", {})
    exe, log = _ncu(tmp_path, unknown=("sm__bogus.sum",))
    rep = profile(_job(), metrics=["sm__bogus.sum"], executable=exe)
    assert len(_calls(log)) == 1 and not rep.ok and "rejected the metric list" in rep.error


def test_unknown_metric_messages():
    names = ["sm__a.sum", "flop_count_sp.sum", "flop_count_sp.avg", "sm__b.avg.pct_of_peak_sustained_active"]
    assert P.unknown_metrics("==ERROR== Failed to find metric sm__a.sum\n", names) == ["sm__a.sum"]
    text = r"==ERROR== Failed to find metric regex:^flop_count_sp\.(sum|min|max|avg|pct|ratio|max_rate)$"
    assert P.unknown_metrics(text, names) == ["flop_count_sp.sum", "flop_count_sp.avg"]
    assert P.unknown_metrics("==ERROR== Failed to find metric sm__b", names) == []     # not one of ours: no retry
    assert P.unknown_metrics("all fine", names) == []


def test_report_without_tensor_metrics_has_an_empty_tensor_pipe():
    rep = report_from_output(CAPTURED.read_text(), kernel="transpose_naive")
    assert rep.ok and rep.tensor_pipe_pct == {} and rep.to_json()["tensor_pipe_pct"] == {}
