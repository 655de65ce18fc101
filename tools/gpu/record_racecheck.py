"""Record compute-sanitizer's racecheck and synccheck verdicts on the race corpus, as a golden table.

Run on a GPU machine (numba-cuda, torch or CuPy, compute-sanitizer):
    PYTHONPATH=. python3 tools/gpu/record_racecheck.py OUTDIR
For each case of tests/fixtures/race_corpus.py and each tool (racecheck, synccheck) it runs the launch under
compute-sanitizer through kernellab (NumbaKernel.sanitize: the cubin ptxas made, in a fresh process, with
--racecheck-report all for racecheck, and a print limit of PRINT_LIMIT so that every hazard is printed: with the
default 100 a racy matmul's list stopped before its second pair of lines), writes OUTDIR/racecheck_sm<cc>.csv (copy
it to tests/golden/ for tests/test_simrace.py::test_simulator_agrees_with_compute_sanitizer), keeps each raw report in
OUTDIR/raw/, and prints the GPU's verdict beside the simulator's (kernellab.run.sim.race) with a count of agreements.
Findings are written by marker (the `# @name` comments of race_corpus.py), so the table survives edits that keep them.
The `complete` column says whether the tool printed everything it counted ('no': it stopped at the print limit, so
the findings are a lower bound).

Without a GPU, the table can be rebuilt from a run's raw reports (e.g. after a parser change):
    PYTHONPATH=. python3 tools/gpu/record_racecheck.py --from-raw OUTDIR/raw tests/golden/racecheck_sm90.csv
parses OUTDIR/raw/<case>_<tool>.txt with kernellab's parser and rewrites the table, keeping its recorded header.
The raw reports name source lines: they must come from a run of race_corpus.py with its kernels on the same lines.
"""
import csv
import datetime
import importlib.util
import io
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("racecheck", "synccheck")
PRINT_LIMIT = 100_000        # the corpus's largest report (transpose_racy) counts about 3,800 hazards
COLUMNS = ["kernel", "tool", "verdict", "findings", "error_count", "job_status", "complete"]
_JOB_LINE = re.compile(r"^kernellab\.run\.job: (?P<label>.+): (?P<status>\w+) in [\d.]+ ms", re.M)


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
    from kernellab.run.nvtools.sanitize import sanitizer_path

    try:
        out = subprocess.run([sanitizer_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
        return " ".join(line.strip() for line in out.splitlines() if "Version" in line or "version" in line) or "?"
    except Exception as exc:
        return f"? ({exc})"


def row(c, tool, rep, corpus) -> dict:
    """One golden-table row from compute-sanitizer's report on case `c`."""
    from kernellab.run.nvtools.sanitize import PRINT_LIMIT_NOTE

    return {"kernel": c.name, "tool": tool, "verdict": corpus.verdict(rep), "findings": corpus.describe(c, rep),
            "error_count": "" if rep.error_count is None else rep.error_count, "job_status": rep.job_status or "",
            "complete": "no" if any(PRINT_LIMIT_NOTE in n for n in rep.notes) else "yes"}


def compare(c, tool, gpu_row, host) -> bool:
    """Print the GPU's verdict beside the simulator's; whether they agree."""
    from kernellab.run.sim.race import sanitize_simulated

    corpus = sys.modules["kernellab_race_corpus"]
    sim = sanitize_simulated(c.kernel, c.grid, c.block, host, tool=tool, shared_bytes=c.shared_bytes)
    sim_v, sim_f = corpus.verdict(sim), corpus.describe(c, sim)
    if gpu_row["complete"] == "yes":
        same, cut = (gpu_row["verdict"], gpu_row["findings"]) == (sim_v, sim_f), ""
    else:                    # what the GPU printed is a lower bound (as tests/test_simrace.py compares it)
        shown = set(filter(None, gpu_row["findings"].split(";")))
        same, cut = gpu_row["verdict"] == sim_v and shown <= set(sim_f.split(";")), " (cut at the print limit)"
    print(f"{'same' if same else 'DIFF'}  {c.name:32s} {tool:9s} gpu: {gpu_row['verdict']:8s} "
          f"{gpu_row['findings'] + cut:28s} simulator: {sim_v:8s} {sim_f}")
    return same


def write_table(path: pathlib.Path, rows, header: str) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(header + buf.getvalue())


def header_text(dev_name: str, arch: str, version: str) -> str:
    return (f"# Recorded on {dev_name} ({arch}) on {datetime.date.today()} by tools/gpu/record_racecheck.py with\n"
            f"# {version}: each case of tests/fixtures/race_corpus.py under compute-sanitizer --tool\n"
            f"# racecheck (--racecheck-report all) and --tool synccheck, launched by NumbaKernel.sanitize.\n"
            f"# findings: races as 'marker-marker' (the two lines' `# @` markers in line order), barriers as\n"
            f"# 'marker:warp' or 'marker:block' ('line123' where a line has no marker), joined by ';'.\n"
            f"# complete: 'no' where the tool stopped printing at its print limit (the findings are a lower bound).\n")


def main():
    import numpy as np

    import kernellab
    from kernellab.run.launch.device import device_info

    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "racecheck-out")
    (out / "raw").mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    dev = device_info()
    rows, agree, total = [], 0, 0
    for c in corpus.CASES:
        kernel = kernellab.numba_kernel(c.kernel, simulate=False)
        for tool in TOOLS:
            host = c.args(np.random.default_rng(0))
            rep = kernel.sanitize(c.grid, c.block, *on_gpu(host), tool=tool, shared_bytes=c.shared_bytes, sim=False,
                                  print_limit=PRINT_LIMIT)
            (out / "raw" / f"{c.name}_{tool}.txt").write_text(rep.raw)
            rows.append(row(c, tool, rep, corpus))
            agree += compare(c, tool, rows[-1], host)
            total += 1
    arch = dev.arch
    path = out / f"racecheck_{arch.replace('_', '')}.csv"
    write_table(path, rows, header_text(dev.name, arch, sanitizer_version()))
    print(f"\n{agree} of {total} verdicts agree with the simulator; wrote {path}")
    print(f"copy it: cp {path} {ROOT / 'tests' / 'golden' / path.name}")


def from_raw(raw_dir: pathlib.Path, table: pathlib.Path) -> None:
    """Rebuild `table` from a recording's raw reports (no GPU), keeping the header it was recorded with."""
    import numpy as np

    from kernellab.run.nvtools.sanitize import report_from_text

    corpus = load_corpus()
    kept = [line for line in table.read_text().splitlines(keepends=True) if line.startswith("#")] \
        if table.exists() else ["# (no recorded header)\n"]
    kept = [line for line in kept if not line.startswith(("# complete:", "# Rebuilt "))]
    rows, agree = [], 0
    for c in corpus.CASES:
        for tool in TOOLS:
            text = (raw_dir / f"{c.name}_{tool}.txt").read_text()
            job = _JOB_LINE.search(text)
            rep = report_from_text(text, tool=tool, kernel=c.name, job_status=job.group("status") if job else None)
            rows.append(row(c, tool, rep, corpus))
            agree += compare(c, tool, rows[-1], c.args(np.random.default_rng(0)))
    header = "".join(kept) + (
        f"# complete: 'no' where the tool stopped printing at its print limit (the findings are a lower bound).\n"
        f"# Rebuilt on {datetime.date.today()} from that run's raw reports by record_racecheck.py --from-raw.\n")
    write_table(table, rows, header)
    print(f"\n{agree} of {len(rows)} verdicts agree with the simulator; rewrote {table}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if len(sys.argv) == 4 and sys.argv[1] == "--from-raw":
        from_raw(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
    else:
        main()
