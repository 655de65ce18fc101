"""SASS text for a cubin, through the cuobjdump (or nvdisasm) from the CUDA wheels; no GPU needed."""
from __future__ import annotations

import os
import subprocess
import tempfile

from ..errors import KernellabError
from . import toolkit


def sass(cubin: bytes, symbol: str | None = None) -> str:
    """Disassemble `cubin` (optionally one function) to SASS text."""
    tool = toolkit.find_tool("cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        if tool:
            cmd = [tool, "-sass", path] + (["-fun", symbol] if symbol else [])
        else:
            tool = toolkit.find_tool("nvdisasm")
            if not tool:
                raise KernellabError("SASS needs cuobjdump or nvdisasm; neither was found. Install the wheels "
                                     "nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (pip) or set CUDA_HOME.")
            cmd = [tool, "-c", "-g", path] + (["-fun", symbol] if symbol else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise KernellabError(f"{os.path.basename(cmd[0])} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout
