"""The JupyterLab extension's packaging and Python side: the wheel ships the prebuilt labextension, the venv has it
enabled, the jest suite passes, and kernellab.notebook.status keeps the status contract of extension/README.md."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTENSION = ROOT / "extension"
LABEXT = ROOT / "kernellab" / "labextension"
SHARE = "share/jupyter/labextensions/kernellab-jupyter"
BUILD_HINT = "the extension is not built: run `make extension` (jlpm install + build into kernellab/labextension)"


def _package_json() -> dict:
    return json.loads((EXTENSION / "package.json").read_text())


def test_extension_builds_where_the_wheel_takes_it_from():
    """package.json's outputDir, pyproject's shared-data and the build hook all name kernellab/labextension."""
    pkg = _package_json()
    assert pkg["name"] == "kernellab-jupyter"
    assert (EXTENSION / pkg["jupyterlab"]["outputDir"]).resolve() == LABEXT
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert hatch["targets"]["wheel"]["shared-data"] == {"kernellab/labextension": SHARE}
    hook = hatch["hooks"]["jupyter-builder"]
    assert hook["ensured-targets"] == hook["skip-if-exists"] == ["kernellab/labextension/package.json"]
    assert hook["build-kwargs"]["path"] == "extension"
    # jlpm install fails on this registry without the rspack pin (../shared/PLATFORM.md).
    assert pkg["resolutions"]["@rspack/core"] == pkg["resolutions"]["@rspack/binding"]


def test_build_output_is_not_committed():
    ignored = subprocess.run(["git", "check-ignore", "-q", "kernellab/labextension/package.json"], cwd=ROOT).returncode
    assert ignored == 0, "kernellab/labextension must stay git-ignored: it is build output"


@pytest.mark.slow
def test_wheel_ships_the_prebuilt_labextension(tmp_path):
    """`pip wheel` as a user would run it (isolated build: hatchling and the hook come from PyPI); the hook finds the
    extension built and leaves it. The device headers ship too."""
    assert (LABEXT / "package.json").exists(), BUILD_HINT
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = tmp_path.glob("kernellab-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
        assert f"{SHARE}/package.json" in data
        assert any(n.startswith(f"{SHARE}/static/remoteEntry.") for n in data), data
        built = json.loads(whl.read(next(n for n in names if n.endswith(f"{SHARE}/package.json"))))
    assert built["name"] == "kernellab-jupyter" and "_build" in built["jupyterlab"]
    assert not [n for n in names if "node_modules" in n or n.startswith("extension/") or "/labextension/" in n]
    # kernellab's device headers (#include <kl/...> in every %%cuda cell) ship inside the package
    headers = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "kernellab" / "include" / "kl").glob("*.cuh"))
    assert headers and set(headers) <= set(names), sorted(set(headers) - set(names))


@pytest.mark.slow
def test_labextension_is_enabled_in_this_environment():
    """What `make lab` shows: `jupyter labextension list` lists kernellab-jupyter, enabled and OK."""
    jupyter = pathlib.Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        pytest.skip("no jupyter in this environment (install the lab extra)")
    out = subprocess.run([str(jupyter), "labextension", "list"], capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"))
    line = next((l for l in (out.stdout + out.stderr).splitlines() if "kernellab-jupyter" in l), None)
    assert line is not None, f"kernellab-jupyter is not installed: run `make install`\n{out.stdout}{out.stderr}"
    assert "enabled" in line and "OK" in line, line


def test_jest_suite_passes():
    """The TypeScript unit tests (extension/test/*.spec.ts) through `jlpm test`."""
    jlpm = shutil.which("jlpm", path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert jlpm, "jlpm not found: it comes with jupyterlab (jupyter_builder); run `make install`"
    assert (EXTENSION / "node_modules").is_dir(), BUILD_HINT
    out = subprocess.run([jlpm, "test", "--ci", "--silent"], cwd=EXTENSION, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


# --- the status contract (extension/README.md) ---------------------------------------------------------------


def test_status_bundle_without_a_gpu(monkeypatch):
    from kernellab.notebook import status

    monkeypatch.setattr(status, "_gpu", lambda: (None, None, None))
    monkeypatch.setattr(status, "_simulator_used", False)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    bundle = status.status_bundle()
    assert bundle == {
        "application/vnd.kernellab.status+json": {"gpu": None, "memory_used_bytes": None, "memory_total_bytes": None,
                                                  "mode": "compile-only", "simulator": False},
        "text/plain": "kernellab: no GPU (compile-only)",
    }
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert status.status()["mode"] == "simulator"


def test_status_says_simulator_after_a_simulated_numba_cell(monkeypatch, tmp_cache):
    """`%%numba --sim` runs its kernels in the simulator without NUMBA_ENABLE_CUDASIM: the status follows the cell."""
    pytest.importorskip("numba")
    from IPython.core.interactiveshell import InteractiveShell

    from kernellab.notebook import status

    monkeypatch.setattr(status, "_gpu", lambda: (None, None, None))
    monkeypatch.setattr(status, "_simulator_used", False)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernellab")
    assert status.status()["mode"] == "compile-only"
    result = shell.run_cell("%%numba --sim\n@cuda.jit\ndef one(x):\n    x[cuda.grid(1)] = 1\n")
    assert result.success, result.error_in_exec
    assert status.status()["mode"] == "simulator" and status.status()["simulator"] is True
    monkeypatch.setattr(status, "_gpu", lambda: ("NVIDIA H200", 0, 140 * 2**30))
    payload = status.status()
    assert payload["mode"] == "gpu" and payload["simulator"] is True
    assert status.status_text(payload).endswith("(and the simulator)")


def test_status_bundle_with_a_gpu(monkeypatch):
    from kernellab.notebook import status

    monkeypatch.setattr(status, "_gpu", lambda: ("NVIDIA H200", 3 * 2**30, 140 * 2**30))
    monkeypatch.setattr(status, "_simulator_used", False)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    payload = status.status_bundle()
    assert payload[status.STATUS_MIME] == {"gpu": "NVIDIA H200", "memory_used_bytes": 3 * 2**30,
                                           "memory_total_bytes": 140 * 2**30, "mode": "gpu", "simulator": False}
    assert payload["text/plain"] == "kernellab: NVIDIA H200, 3.0 of 140.0 GiB in use"


def test_status_detection_never_raises():
    from kernellab.notebook import status

    payload = status.status()
    assert payload["mode"] in ("gpu", "simulator", "compile-only")
    assert (payload["gpu"] is None) == (payload["mode"] != "gpu")
    json.dumps(payload)


def test_publish_status_displays_once_then_updates_in_place():
    """%load_ext shows one status output; later calls send update_display_data for it (no new outputs)."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    from kernellab.notebook import status

    shell = InteractiveShell.instance()
    sent = []
    publisher = shell.display_pub
    original = publisher.publish
    publisher.publish = lambda data, metadata=None, source=None, *, transient=None, update=False, **kw: \
        sent.append((data, transient, update))
    try:
        status.publish_status()
        status.publish_status(update=True)
    finally:
        publisher.publish = original
    assert [(t, u) for _, t, u in sent] == [({"display_id": status.DISPLAY_ID}, False),
                                           ({"display_id": status.DISPLAY_ID}, True)]
    assert status.STATUS_MIME in sent[0][0] and "text/plain" in sent[0][0]
