"""The compile cache: in memory and on disk, keyed on everything that changes the output.

Set KERNELLAB_CACHE=0 to switch both off; KERNELLAB_CACHE_DIR moves the disk cache
(default ~/.cache/kernellab). Entries are versioned by CACHE_FORMAT.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile

from .._version import __version__
from .toolkit import own_headers_digest

CACHE_FORMAT = 2   # 2: NVRTC compiled with --no-cache; entries of 1 may hold outputs without ptxas reports
_memory: dict[str, object] = {}


def enabled() -> bool:
    """Whether caching is on (KERNELLAB_CACHE not set to 0/false/off)."""
    return os.environ.get("KERNELLAB_CACHE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> str:
    """Where compile results are stored on disk."""
    root = os.environ.get("KERNELLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernellab")
    return os.path.join(root, f"compile-v{CACHE_FORMAT}")


def make_key(**parts) -> str:
    """A stable hash of the parts (source, options, arch, compiler version, ...) plus kernellab's version and the
    content of its own headers (a source may #include <kl/...>)."""
    parts = dict(parts, kernellab=__version__, format=CACHE_FORMAT, headers=own_headers_digest())
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def get(key: str):
    """The cached value for `key` and where it came from ('memory', 'disk'), or (None, None)."""
    if not enabled():
        return None, None
    if key in _memory:
        return _memory[key], "memory"
    path = os.path.join(cache_dir(), key[:2], key + ".pkl")
    try:
        with open(path, "rb") as fh:
            value = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None, None
    _memory[key] = value
    return value, "disk"


def put(key: str, value) -> None:
    """Store `value` in memory and, atomically, on disk (a failed disk write is not an error)."""
    if not enabled():
        return
    _memory[key] = value
    folder = os.path.join(cache_dir(), key[:2])
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, os.path.join(folder, key + ".pkl"))
    except OSError:
        pass


def clear_memory() -> None:
    """Forget the in-memory entries (the disk cache stays)."""
    _memory.clear()
