"""A real `jupyter lab` server (private settings, cache and runtime dirs) and a headless Chromium page driving it.

Needs Debian's Chromium (/usr/bin/chromium, or $KERNELLAB_CHROMIUM) and the `playwright` package; `make test`
installs both. Never `playwright install`: the browser is the system's.
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("KERNELLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]

# JupyterLab settings that keep toasts and dialogs out of the way of the test.
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"renameUntitledFileOnSave": False},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labextension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(pathlib.Path(p, "kernellab-jupyter", "package.json").exists() for p in jupyter_path("labextensions"))


@pytest.fixture(scope="session")
def artifacts() -> pathlib.Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """Start `jupyter lab` on a free port in an empty directory; yield (base_url, token, root_dir); stop it by PID."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install -y --no-install-recommends chromium` (make test does)")
    pytest.importorskip("playwright", reason="the playwright package is missing: pip install -e '.[test]'")
    assert _labextension_installed(), "the kernellab-jupyter labextension is not installed: run `make extension install`"

    home = tmp_path_factory.mktemp("lab")
    root, settings = home / "notebooks", home / "settings"
    root.mkdir()
    for name, values in SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), KERNELLAB_CACHE_DIR=str(home / "cache"), MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    built = ROOT / "kernellab" / "labextension"
    if (built / "package.json").exists():     # this checkout's build first (JUPYTER_PATH precedes the venv's)
        data = home / "data"
        (data / "labextensions").mkdir(parents=True)
        (data / "labextensions" / "kernellab-jupyter").symlink_to(built.resolve())
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(data), os.environ.get("JUPYTER_PATH")) if p)
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={home / 'workspaces'}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not start:\n{(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield base, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, artifacts, request):
    """A fresh page; on failure its screenshot lands in test-artifacts/browser/FAILED-<test>.png."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        pg.screenshot(path=str(artifacts / f"FAILED-{request.node.name}.png"), full_page=True)
    context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
