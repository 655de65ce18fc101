"""Record compute-sanitizer's racecheck and synccheck verdicts on the race corpus, as a golden table.

Run on a GPU machine (numba-cuda, torch or CuPy, compute-sanitizer):
    PYTHONPATH=. python3 tools/gpu/record_racecheck.py OUTDIR
For each case of tests/fixtures/race_corpus.py and each tool (racecheck, synccheck) it runs the launch under
compute-sanitizer through kernellab (NumbaKernel.sanitize: the cubin ptxas made, in a fresh process, with
--racecheck-report all for racecheck), writes OUTDIR/racecheck_sm<cc>.csv (copy it to tests/golden/ for
tests/test_simrace.py::test_simulator_agrees_with_compute_sanitizer), keeps each raw report in OUTDIR/raw/, and
prints the GPU's verdict beside the simulator's (kernellab.run.simrace) with a count of agreements.
Findings are written by marker (the `# @name` comments of race_corpus.py), so the table survives edits that keep them.
"""
import csv
import datetime
import importlib.util
import io
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("racecheck", "synccheck")


def load_corpus():
    spec = importlib.util.spec_from_file_location("kernellab_race_corpus", ROOT / "tests" / "fixtures" / "race_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_gpu(args):
    """The case's NumPy arguments as CUDA arrays (torch where it imports, else CuPy); numbers as they are."""
    import numpy as np

    try:
        import torch

        return tuple(torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args)
    except ImportError:
        import cupy

        return tuple(cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args)


def sanitizer_version() -> str:
    from kernellab.run.sanitize import sanitizer_path

    try:
        out = subprocess.run([sanitizer_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
        return " ".join(line.strip() for line in out.splitlines() if "Version" in line or "version" in line) or "?"
    except Exception as exc:
        return f"? ({exc})"


def main():
    import numpy as np

    import kernellab
    from kernellab.run.device import device_info
    from kernellab.run.simrace import sanitize_simulated

    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "racecheck-out")
    (out / "raw").mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    dev = device_info()
    rows, agree, total = [], 0, 0
    for c in corpus.CASES:
        kernel = kernellab.numba_kernel(c.kernel, simulate=False)
        for tool in TOOLS:
            host = c.args(np.random.default_rng(0))
            rep = kernel.sanitize(c.grid, c.block, *on_gpu(host), tool=tool, shared_bytes=c.shared_bytes, sim=False)
            (out / "raw" / f"{c.name}_{tool}.txt").write_text(rep.raw)
            sim = sanitize_simulated(c.kernel, c.grid, c.block, host, tool=tool, shared_bytes=c.shared_bytes)
            gpu_v, gpu_f = corpus.verdict(rep), corpus.describe(c, rep)
            sim_v, sim_f = corpus.verdict(sim), corpus.describe(c, sim)
            same = (gpu_v, gpu_f) == (sim_v, sim_f)
            agree += same
            total += 1
            print(f"{'same' if same else 'DIFF'}  {c.name:32s} {tool:9s} gpu: {gpu_v:8s} {gpu_f:28s} "
                  f"simulator: {sim_v:8s} {sim_f}")
            rows.append({"kernel": c.name, "tool": tool, "verdict": gpu_v, "findings": gpu_f,
                         "error_count": "" if rep.error_count is None else rep.error_count,
                         "job_status": rep.job_status or ""})
    arch = dev.arch
    path = out / f"racecheck_{arch.replace('_', '')}.csv"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, ["kernel", "tool", "verdict", "findings", "error_count", "job_status"],
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    header = (f"# Recorded on {dev.name} ({arch}) on {datetime.date.today()} by tools/gpu/record_racecheck.py with\n"
              f"# {sanitizer_version()}: each case of tests/fixtures/race_corpus.py under compute-sanitizer --tool\n"
              f"# racecheck (--racecheck-report all) and --tool synccheck, launched by NumbaKernel.sanitize.\n"
              f"# findings: races as 'marker-marker' (the two lines' `# @` markers in line order), barriers as\n"
              f"# 'marker:warp' or 'marker:block' ('line123' where a line has no marker), joined by ';'.\n")
    path.write_text(header + buf.getvalue())
    print(f"\n{agree} of {total} verdicts agree with the simulator; wrote {path}")
    print(f"copy it: cp {path} {ROOT / 'tests' / 'golden' / path.name}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
