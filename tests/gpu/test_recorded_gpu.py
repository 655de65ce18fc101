"""The maintainer's flow for the GPU outputs kernellab ships (kernellab/notebook/recorded.py), on a GPU: a notebook run
by tools/gpu/run_notebooks.py is stamped with this GPU and today's date, its %%gpu cell runs there (not skipped),
and the recorded copy extracted from it holds that cell's outputs under that stamp."""
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernellab.notebook import recorded

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PROBE = """# %%
# %load_ext kernellab

# %%
# %%gpu
import torch
print(torch.cuda.get_device_name(0))
"""


def test_run_notebooks_stamps_the_gpu_and_its_outputs_are_recorded(tmp_path):
    import torch

    src = tmp_path / "99-probe.py"
    src.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "run_notebooks.py"), str(tmp_path / "out"),
                          str(src)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    nb = json.loads((tmp_path / "out" / "99-probe.ipynb").read_text())
    device = torch.cuda.get_device_name(0)
    assert nb["metadata"]["kernellab"]["recorded_on"] == {"device": device,
                                                          "date": datetime.date.today().isoformat()}
    rec = recorded.extract(nb, "99-probe.ipynb")
    [(key, cell)] = rec["cells"].items()
    assert [o["output_type"] for o in cell["outputs"]] == ["stream"], cell     # ran: no skip line
    assert cell["outputs"][0]["text"].strip() == device
    gpu_cell = next(c for c in nb["cells"] if "".join(c["source"]).startswith("%%gpu"))
    assert key == recorded.cell_key(*recorded.split_cell("".join(gpu_cell["source"])))
