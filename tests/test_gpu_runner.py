"""tools/gpu/run.py, the one GPU runner, without a GPU: every file its suites name exists, every GPU test file belongs
to exactly one test suite (a new one that is in none fails here, not silently on the GPU machine), arguments parse
as documented, and the summary reads pytest's counts."""
import importlib.util
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("gpu_runner", ROOT / "tools" / "gpu" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_runner"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_file_a_suite_names_exists(runner):
    named = {name: suite.paths() for name, suite in runner.SUITES.items()}
    assert all(named[s] for s in named if s != "probe"), "a suite that names no file"
    missing = [f"{name}: {p}" for name, paths in named.items() for p in paths if not (ROOT / p).is_file()]
    assert not missing, f"suites name files that do not exist: {missing}"


def gpu_test_files() -> set[str]:
    """Test files holding a `gpu` mark, wherever they are under tests/."""
    found = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if re.search(r"pytest\.mark\.gpu\b|pytestmark\s*=.*\bgpu\b", path.read_text()):
            found.add(str(path.relative_to(ROOT)))
    return found


def test_every_gpu_test_file_is_in_exactly_one_test_suite(runner):
    owners: dict[str, list[str]] = {}
    for name, suite in runner.SUITES.items():
        for path in suite.tests:
            owners.setdefault(path, []).append(name)
    gpu_files = gpu_test_files()
    assert len(gpu_files) >= 15, "the search for GPU test files found too few to be right"
    unowned = sorted(gpu_files - set(owners))
    assert not unowned, f"GPU test files in no suite of tools/gpu/run.py (add each to one tests-* suite): {unowned}"
    twice = {p: o for p, o in owners.items() if len(o) > 1 and not all(runner.SUITES[n].select for n in o)}
    assert not twice, f"GPU test files in more than one suite without a -k share each: {twice}"
    assert set(runner.GROUPS["tests"]) == {n for n, s in runner.SUITES.items() if s.tests}


def collected(files, select=""):
    """Test ids pytest collects from `files` (with -k `select`), as the GPU machine would."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu", *files]
    p = subprocess.run(cmd + (["-k", select] if select else []), cwd=ROOT, capture_output=True, text=True)
    assert p.returncode in (0, 5), p.stdout[-2000:] + p.stderr[-2000:]
    return {line for line in p.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_suites_sharing_a_file_split_its_tests_without_gap_or_overlap(runner):
    """Where one file's GPU tests are spread over suites by -k (the exercise graders: ~7 s a test), every test runs in
    exactly one of them."""
    shared: dict[str, list[str]] = {}
    for name, suite in runner.SUITES.items():
        if suite.select:
            for path in suite.tests:
                shared.setdefault(path, []).append(name)
    assert shared
    for path, names in shared.items():
        every = collected([path])
        parts = {n: collected([path], runner.SUITES[n].select) for n in names}
        assert every and set().union(*parts.values()) == every, (path, every - set().union(*parts.values()))
        assert sum(len(p) for p in parts.values()) == len(every), f"{path}: a test in two suites"


def test_arguments_follow_their_suite(runner):
    plan = runner.parse_args(["tests", "notebooks", "04", "07-fused-attention", "bench-matmul", "--only", "sgemm"])
    tests = [s for s in runner.SUITES if s.startswith("tests-")]
    assert {"tests-launch", "tests-measure", "tests-sim", "tests-tutorials", "tests-attention-inference",
            "tests-norm-backward", "tests-attention-backward"} <= set(tests)
    assert plan == [(s, []) for s in tests] + [("notebooks", ["04", "07-fused-attention"]),
                                               ("bench-matmul", ["--only", "sgemm"])]
    with pytest.raises(SystemExit, match="unknown suite 'nope'"):
        runner.parse_args(["nope"])
    with pytest.raises(SystemExit, match="unknown suite '--rounds'"):
        runner.parse_args(["launch-overhead", "--rounds", "3"])        # launch-overhead takes no arguments
    with pytest.raises(SystemExit, match="name at least one suite"):
        runner.parse_args([])


def test_commands_of_a_plan(runner, tmp_path):
    (nb,) = runner.commands("notebooks", ["04"], tmp_path)
    assert nb[1:] == ["tools/gpu/run_notebooks.py", str(tmp_path / "notebooks"), "notebooks/04-layernorm.py"]
    every = runner.commands("notebooks", [], tmp_path)[0][3:]
    assert every == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9]*.py"))
    with pytest.raises(SystemExit, match="'9' names 0 tutorials"):
        runner.commands("notebooks", ["9"], tmp_path)
    (bench,) = runner.commands("bench-memory", ["--ops", "softmax"], tmp_path)
    assert bench[-4:] == ["--out", str(tmp_path / "bench-memory"), "--ops", "softmax"]
    (train,) = runner.commands("train-gpt2", ["--diagnose"], tmp_path)         # benchmarks/train_gpt2.py's option
    assert train[1] == "benchmarks/train_gpt2.py" and train[-1] == "--diagnose"
    (diagnose,) = runner.commands("train-gpt2-diagnose", [], tmp_path)
    assert "--diagnose" in diagnose and diagnose[diagnose.index("--out") + 1] == str(tmp_path / "train-gpt2-diagnose")
    (tests,) = runner.commands("tests-sim", [], tmp_path)
    assert tests[:3] == ["python3", "-m", "pytest"] and "-m" in tests and "gpu" in tests
    assert "tests/gpu/test_racecheck_gpu.py" in tests


def test_outcome_reads_pytest_counts_and_exit_statuses(runner):
    assert runner.outcome("tests-sim", "...\n12 passed, 1 failed, 2 skipped in 30.1s\n", [1]) == \
        "12 passed, 1 failed, 2 skipped"
    # a test's own output naming errors (compute-sanitizer's counts after a float) is not pytest's summary
    log = "[pool] racecheck racy: context_s=1.052659511566162 errors=513\n1 error in the log\n5 passed in 58.77s\n"
    assert runner.outcome("tests-sanitizer-pool", log, [0]) == "5 passed"
    assert runner.outcome("tests-sim", "partial output", [124]) == "TIMEOUT"
    assert runner.outcome("bench-matmul", "table", [0]) == "ok"
    assert runner.outcome("launch-overhead", "", [0, 2]) == "FAILED (rc 0, 2)"


def test_a_suite_runs_logs_and_summarises(runner, tmp_path, monkeypatch, capsys):
    """A stand-in suite (a Python one-liner) goes through the real loop: its log, its line, the table, the status."""
    monkeypatch.setitem(runner.SUITES, "fake", runner.Suite("stand-in", 30, commands=(
        (sys.executable, "-c", "print('3 passed in 0.1s')"),)))
    monkeypatch.setitem(runner.SUITES, "fake-fail", runner.Suite("stand-in", 30, commands=(
        (sys.executable, "-c", "import sys; sys.exit(3)"),)))
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(runner, "ROOT", tmp_path)                  # no .whl/ there: nothing installed
    before = signal.getsignal(signal.SIGINT)
    assert runner.main(["fake"]) == 0
    assert signal.getsignal(signal.SIGINT) is before                   # the caller's Ctrl-C handling is left alone
    assert "3 passed" in (tmp_path / "fake.log").read_text()
    assert runner.main(["fake", "fake-fail"]) == 1
    table = capsys.readouterr().out.split("suite")[-1]
    assert re.search(r"fake\s+\d+\s+ok", table) and re.search(r"fake-fail\s+\d+\s+FAILED \(rc 3\)", table)


def test_commands_in_the_docs_name_real_suites(runner):
    """Every `tools/gpu/run.py SUITE ...` quoted in README.md, docs/ and benchmarks/ parses: a renamed suite cannot
    leave a document pointing at nothing."""
    quoted = []
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")]:
        quoted += [(doc.name, m) for m in re.findall(r"`python3 tools/gpu/run\.py ([^`]+)`", doc.read_text())]
    assert len(quoted) >= 10, quoted
    for doc, words in quoted:
        words = [w for w in words.split() if w not in ("SUITE", "[SUITE", "...]", "...")]
        if words and not words[0].startswith("-"):
            for name, args in runner.parse_args(words):
                if name == "notebooks":
                    runner.notebook_paths(args)


def test_gpus_spreads_one_gpu_suites_over_lanes_and_keeps_all_gpu_suites_out(runner):
    plan = runner.parse_args(["tests", "notebooks", "04", "launch-overhead"])
    lanes = runner.lanes([s for s in plan if not runner.SUITES[s[0]].all_gpus], 3)
    assert sorted(n for lane in lanes for n, _ in lane) == sorted(n for n, _ in plan)
    assert all(lanes), "a lane left idle while suites wait"
    limits = [sum(runner.SUITES[n].limit_s for n, _ in lane) for lane in lanes]
    assert max(limits) - min(limits) <= max(s.limit_s for s in runner.SUITES.values())
    assert ("notebooks", ["04"]) in [s for lane in lanes for s in lane]       # a suite keeps its arguments
    assert runner.SUITES["autotune-multigpu"].all_gpus


def test_a_suite_named_twice_runs_in_two_lanes_with_a_log_each(runner, monkeypatch, tmp_path):
    """`notebooks 07 notebooks 08` on two GPUs: each entry keeps its arguments, runs in its own lane at the same
    time as the other, and writes its own log (named by its arguments); the table has a row for each."""
    import os
    import time
    code = "import sys, time; print('args', sys.argv[1:], flush=True); time.sleep(1.5)"
    suite = runner.Suite(about="t", limit_s=60, commands=((sys.executable, "-c", code, "{out}"),), takes_args=True)
    monkeypatch.setitem(runner.SUITES, "twice", suite)
    monkeypatch.setattr(runner, "commands", lambda name, args, out: [[sys.executable, "-c", code, *args]])
    plan = runner.parse_args(["twice", "a", "twice", "b"])
    assert plan == [("twice", ["a"]), ("twice", ["b"])]
    t0 = time.monotonic()
    rows = runner.run_plan(plan, tmp_path, dict(os.environ), 2)
    assert time.monotonic() - t0 < 2.9, "the two entries ran one after the other"
    assert [r[0].split(" (GPU")[0] for r in rows] == ["twice.a", "twice.b"] and all(r[2] == "ok" for r in rows)
    assert "args ['a']" in (tmp_path / "twice.a.log").read_text()
    assert "args ['b']" in (tmp_path / "twice.b.log").read_text()


def _sleeper_suite(runner, monkeypatch, limit_s):
    """A suite whose one command prints a line at once, then sleeps 60 s."""
    code = "import time; print('first line', flush=True); time.sleep(60); print('never')"
    suite = runner.Suite(about="test", limit_s=limit_s, commands=((sys.executable, "-c", code),))
    monkeypatch.setitem(runner.SUITES, "sleeper", suite)
    monkeypatch.setattr(runner, "INTERRUPTED", False)


def test_a_suite_cut_at_its_limit_keeps_what_it_printed(runner, monkeypatch, tmp_path):
    _sleeper_suite(runner, monkeypatch, limit_s=3)
    t0 = __import__("time").monotonic()
    seconds, result = runner.run_suite("sleeper", [], tmp_path, dict(__import__("os").environ))
    assert result == "TIMEOUT" and __import__("time").monotonic() - t0 < 20
    log = (tmp_path / "sleeper.log").read_text()
    assert "\nfirst line\n" in log and "\nnever" not in log and "[stopped at the suite's limit of 3 s]" in log


def test_an_interrupted_runner_ends_the_suite_keeps_its_log_and_prints_the_table(tmp_path):
    """SIGINT to the runner (as `timeout -s INT` sends): the running command is ended, its printed lines are in
    the log, the suites after it are not started, and the summary table is still printed."""
    import os
    import signal
    import textwrap
    import time
    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("gpu_runner", {str(ROOT / "tools" / "gpu" / "run.py")!r})
        runner = importlib.util.module_from_spec(spec); sys.modules["gpu_runner"] = runner; spec.loader.exec_module(runner)
        code = "import time; print('first line', flush=True); time.sleep(60)"
        for name in ("sleeper", "after"):
            runner.SUITES[name] = runner.Suite(about="t", limit_s=120, commands=((sys.executable, "-c", code),))
        runner.environment = lambda out: dict(__import__("os").environ)
        sys.exit(runner.main(["sleeper", "after"]))
    """))
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    log = tmp_path / "out" / "sleeper.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (log.exists() and "first line" in log.read_text()):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    printed, _ = p.communicate(timeout=30)
    assert p.returncode == 1
    assert "first line" in log.read_text() and "[interrupted" in log.read_text()
    assert re.search(r"sleeper\s+\d+\s+INTERRUPTED", printed), printed
    assert re.search(r"after\s+\d+\s+not run \(interrupted\)", printed), printed
    assert (tmp_path / "out" / "after.log").read_text() == ""
    import tarfile
    with tarfile.open(tmp_path / "out" / "0-sleeper.after.tgz") as tar:    # everything in one file to bring back
        assert {"sleeper.log", "after.log", "sleeper", "after"} <= set(tar.getnames())
        assert b"first line" in tar.extractfile("sleeper.log").read()


def test_pytest_args_are_split_as_a_shell_splits_them(runner, monkeypatch, tmp_path):
    """PYTEST_ARGS='-k "hopper or op"' reaches pytest as two arguments, the expression whole (split on spaces it
    became "-k", '"hopper', 'or', 'op"' and pytest read 'or' as a file)."""
    monkeypatch.setenv("PYTEST_ARGS", '-k "hopper or op" -x')
    argv = runner.commands("tests-attention-backward", [], tmp_path)[0]
    assert argv[-3:] == ["-k", "hopper or op", "-x"]
