"""Run tutorials top to bottom on a GPU machine and keep the executed notebooks (their outputs are what we commit).

    PYTHONPATH=/tmp/site:$PWD python3 tools/gpu/run_notebooks.py OUTDIR notebooks/07-fused-attention.py [...]
Each notebook is read from its jupytext source, executed by nbclient in notebooks/ (as JupyterLab would), and written
to OUTDIR/<name>.ipynb; a failing cell stops that notebook (its partial outputs are still written) and the next one
runs. A one-line summary per notebook is printed last: seconds, cells run, the first error if any.
Each notebook's metadata is stamped with the GPU and the date (kernellab.recorded_on): after committing the
notebooks, `python tools/record_gpu_outputs.py` copies their %%gpu outputs into kernellab (shown where there is no GPU).
"""
import datetime
import pathlib
import sys
import time

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def _device_name() -> str:
    """The GPU's name as torch reports it ("NVIDIA H100 80GB HBM3")."""
    import torch

    return torch.cuda.get_device_name(0)


def main(outdir: str, *paths: str) -> int:
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    summary, failed = [], 0
    for path in map(pathlib.Path, paths):
        nb = jupytext.read(path)
        client = NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(path.resolve().parent)}})
        t0, error = time.time(), None
        try:
            client.execute()
        except CellExecutionError as exc:
            error = str(exc).strip().splitlines()[-1][:300]
            failed += 1
        nb.metadata.setdefault("kernellab", {})["recorded_on"] = {"device": _device_name(),
                                                                 "date": datetime.date.today().isoformat()}
        nbformat.write(nb, out / (path.stem + ".ipynb"))
        ran = sum(1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count"))
        summary.append(f"{path.stem}: {time.time() - t0:.0f} s, {ran} cells run" + (f", FAILED: {error}" if error else ""))
        print(summary[-1], flush=True)
    print("\n".join(["", "notebooks:"] + summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
