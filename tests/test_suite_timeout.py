"""The suite's own guard against hangs: pytest-timeout is installed and configured (pyproject.toml), and a test that
hangs is ended and reported as a failure instead of stalling `make test`."""
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_test_has_a_generous_timeout(pytestconfig):
    # getini raises ValueError for an option no installed plugin declares: pytest-timeout must be there
    assert float(pytestconfig.getini("timeout")) >= 600          # the slowest tests take minutes on 2 busy cores
    assert pytestconfig.getini("timeout_method") == "thread"     # fires even inside a C call that never returns


def test_a_hung_test_fails_instead_of_stalling_the_run(tmp_path):
    hung = tmp_path / "test_hung.py"
    hung.write_text("import threading\n\ndef test_waits_forever():\n    threading.Event().wait()\n")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), "--timeout=2", str(hung)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Timeout" in out and "test_waits_forever" in out, out[-3000:]
    assert time.monotonic() - start < 60
