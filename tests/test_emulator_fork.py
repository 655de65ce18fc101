"""A launch on the CPU path with fewer checks built in runs in a forked child (kernellab.run.sim.cuda.emulate): a kernel
that never ends must not outlive the process waiting for it (else a grading worker restarted by its nanny leaves
one spinning a core)."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SPIN = r"""extern "C" __global__ void spin(const float* in, float* out, int n) {
    volatile const float* first = in;
    float seen = first[0];
    while (first[0] == seen || first[0] != seen) { }
    out[0] = seen;
}
"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_kernel_that_never_ends_dies_with_the_process_that_launched_it(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np
        from kernellab.run.sim.cuda.emulate import compile_host
        k = compile_host({SPIN!r}, checks=1)["spin"]              # pointer checks only: the launch is forked
        assert k.host.level < 2
        print("launching", flush=True)
        k[1, 1](np.zeros(1, np.float32), np.zeros(1, np.float32), 1)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNELLAB_EMU_FORK": "1"}
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "launching", p.stderr.read()
        deadline, forked = time.monotonic() + 60, []
        while not forked and time.monotonic() < deadline:
            forked = [c for c in _children(p.pid) if _alive(c)]
            time.sleep(0.05)
        assert forked, "no forked launch appeared"
        time.sleep(0.3)
        assert all(_alive(c) for c in forked)                    # it spins while its parent waits
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in forked) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [c for c in forked if _alive(c)]
    finally:
        if p.poll() is None:
            p.kill()
    for c in left:
        os.kill(c, signal.SIGKILL)
    assert not left, f"the forked launch {left} outlived its parent"
