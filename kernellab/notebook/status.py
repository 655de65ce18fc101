"""The kernel's GPU status for JupyterLab's status bar: one `application/vnd.kernellab.status+json` display.

Contract (extension/README.md, "Status contract"): `%load_ext kernellab` calls `publish_status()`, which displays one
output (hidden by the JupyterLab extension, one text line elsewhere) with display id `kernellab-status`; after each
magic, `publish_status(update=True)` sends an `update_display_data` for that id, which adds no output. The extension
reads every such message on the kernel's IOPub channel, whichever cell sent it.
"""
from __future__ import annotations

import os

STATUS_MIME = "application/vnd.kernellab.status+json"
DISPLAY_ID = "kernellab-status"


def _gpu() -> tuple[str | None, int | None, int | None]:
    """(name, memory in use, total memory) of the current CUDA device, or (None, None, None) without one."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, None, None
        device = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
        free_bytes, total_bytes = device.mem_info
        return (name.decode() if isinstance(name, bytes) else str(name)), int(total_bytes - free_bytes), int(total_bytes)
    except Exception:  # no cupy, no driver, no device: all mean "no GPU" here
        return None, None, None


_simulator_used = False


def note_simulator() -> None:
    """A cell's kernels run in Numba's CUDA simulator (`%%numba --sim`, or no GPU): the status says so from now on."""
    global _simulator_used
    _simulator_used = True


def simulator_in_use() -> bool:
    """Whether kernels in this kernel session run in the simulator (NUMBA_ENABLE_CUDASIM, or a simulated cell)."""
    return _simulator_used or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def status() -> dict:
    """The status payload: {"gpu", "memory_used_bytes", "memory_total_bytes", "mode", "simulator"}.

    mode: "gpu" with a GPU; without one, "simulator" once a cell's kernels run in Numba's simulator, else
    "compile-only". simulator: whether any do (on a GPU machine too, after `%%numba --sim`)."""
    name, used_bytes, total_bytes = _gpu()
    sim = simulator_in_use()
    if name is not None:
        mode = "gpu"
    elif sim:
        mode = "simulator"
    else:
        mode = "compile-only"
    return {"gpu": name, "memory_used_bytes": used_bytes, "memory_total_bytes": total_bytes, "mode": mode,
            "simulator": sim}


def status_text(payload: dict) -> str:
    """One line for front ends without the extension: `kernellab: NVIDIA H200, 1.2 of 139.8 GiB in use`."""
    if payload["gpu"] is None:
        return f"kernellab: no GPU ({payload['mode']})"
    used, total = payload["memory_used_bytes"], payload["memory_total_bytes"]
    sim = " (and the simulator)" if payload.get("simulator") else ""
    if used is None or total is None:
        return f"kernellab: {payload['gpu']}{sim}"
    return f"kernellab: {payload['gpu']}, {used / 2**30:.1f} of {total / 2**30:.1f} GiB in use{sim}"


def status_bundle() -> dict:
    """The MIME bundle: the status JSON and its text line."""
    payload = status()
    return {STATUS_MIME: payload, "text/plain": status_text(payload)}


def publish_status(update: bool = False) -> None:
    """Display the status (on `%load_ext`) or, with update=True, refresh it in place (after a magic)."""
    from IPython.display import display

    display(status_bundle(), raw=True, display_id=DISPLAY_ID, update=update)
