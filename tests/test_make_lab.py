"""`make lab`: works as root, takes LAB_ARGS, opens Lab on a git-ignored working folder with the tutorials copied in.

The slow test starts the real server through make (with this test's own environment as the venv, so nothing is
installed) on a loopback port, asks it for /api/status, makes a notebook and stops the server by its process group.
"""
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
VENV = pathlib.Path(sys.prefix)
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def _make_lab(*extra, dry_run=False, work):
    """make lab against this interpreter's environment, with the install steps taken as done (-o)."""
    return [MAKE, "--no-print-directory", "-C", str(ROOT), *(["-n"] if dry_run else []), "-o", str(VENV / ".kernellab-installed"),
            "-o", "kernellab/labextension/package.json", "lab", f"VENV={VENV}", f"WORK={work}", *extra]


def test_make_lab_command_line(tmp_path):
    out = subprocess.run(_make_lab('LAB_ARGS=--port 8899 --no-browser', dry_run=True, work=tmp_path / "w"),
                         capture_output=True, text=True, check=True).stdout
    command = out.strip().splitlines()[-1].split()
    assert command[:2] == [str(VENV / "bin" / "jupyter"), "lab"]
    assert f"--ServerApp.root_dir={tmp_path / 'w'}" in command and command[-3:] == ["--port", "8899", "--no-browser"]
    assert ("--allow-root" in command) == (os.geteuid() == 0)


def test_the_working_folder_is_ignored_by_git():
    out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-v", "lab-work/Untitled.ipynb"], capture_output=True,
                         text=True)
    assert out.returncode == 0, "lab-work/ must be git-ignored: notebooks made in Lab land there"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base, token, path, method="GET", body=None):
    req = urllib.request.Request(f"{base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read() or b"null")


@pytest.mark.slow
def test_make_lab_serves_as_root_on_the_working_folder(tmp_path):
    if not (VENV / "bin" / "jupyter").exists():
        pytest.skip(f"no jupyter in {VENV}: make lab runs $(VENV)/bin/jupyter")
    port, token, work = _free_port(), secrets.token_hex(16), tmp_path / "work"
    home = tmp_path / "home"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_DATA_DIR=str(home / "data"), IPYTHONDIR=str(home / "ipython"))
    env.setdefault("JUPYTER_PATH", str(VENV / "share" / "jupyter"))
    log = open(tmp_path / "make-lab.log", "w")
    args = f"LAB_ARGS=--port {port} --no-browser --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token}"
    proc = subprocess.Popen(_make_lab(args, work=work), stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    before = set(os.listdir(ROOT / "notebooks"))
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                status, body = _api(base, token, "/api/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                assert proc.poll() is None, (tmp_path / "make-lab.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "jupyter lab did not answer within 90 s"
                time.sleep(0.5)
        assert status == 200 and "started" in body
        # The server's root is the working folder, holding the tutorials ...
        _, listing = _api(base, token, "/api/contents")
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "notebooks").glob("*.ipynb")} <= names
        # ... and a new notebook lands there, not in the tracked notebooks/ folder.
        status, made = _api(base, token, "/api/contents", method="POST", body={"type": "notebook"})
        assert status == 201 and (work / made["path"]).exists()
        assert set(os.listdir(ROOT / "notebooks")) == before
        text = (tmp_path / "make-lab.log").read_text()
        if os.geteuid() == 0:
            assert "--allow-root" in text          # and it is running: as root that flag is what lets it start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)    # make and the jupyter it started: this test's process group
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _api(base, token, "/api/status")
