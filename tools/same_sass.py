"""Prove that a change to the tutorials' device code (moving it into kernellab's headers, renaming, reordering) leaves
every kernel's SASS as it was, so that the notebooks' committed GPU outputs stay valid without a re-run.

    python tools/same_sass.py main notebooks/03-reductions-softmax.py notebooks/04-layernorm.py

Each `%%cuda` cell of each notebook (jupytext .py) at git revision REV and in the working tree is compiled with
kernellab's NVRTC (no GPU needed), with the cell's own --arch (default sm_90) and -O options; the cells are paired in
order. A pair passes when both compile to the same kernels (symbols) and every kernel's SASS is the same text.
Prints one line per cell and exits 1 if any cell differs.
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cuda_cells(text: str) -> list[tuple[str, str]]:
    """(the %%cuda magic's options, the cell's source without the magic line) of each %%cuda cell of a jupytext .py."""
    out = []
    for cell in re.split(r"^# %%(?: .*)?\n", text, flags=re.M)[1:]:
        if cell.startswith("# %%cuda"):
            first, _, body = cell.partition("\n")
            out.append((first[len("# %%cuda"):].strip(), body.rstrip() + "\n"))
    return out


def compile_cell(flags: str, source: str) -> dict[str, str]:
    """{kernel symbol: SASS} of one cell compiled as the %%cuda magic compiles it (first_line=2)."""
    import kernellab

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--name")
    p.add_argument("-O", "--options", action="append", default=[])
    args, _ = p.parse_known_args(shlex.split(flags))
    options = tuple(o for group in args.options for o in group.split())
    module = kernellab.compile_cuda(source, arch=args.arch, options=options, first_line=2, filename="cell.cu")
    return {k.symbol: k.sass for k in module.kernels}


def compare(rev: str, notebook: str) -> list[str]:
    """One line per %%cuda cell of `notebook`: 'same' or what differs between REV and the working tree."""
    before = cuda_cells(subprocess.run(["git", "show", f"{rev}:{notebook}"], cwd=ROOT, check=True,
                                       capture_output=True, text=True).stdout)
    after = cuda_cells((ROOT / notebook).read_text())
    if len(before) != len(after):
        return [f"{notebook}: {len(before)} %%cuda cells at {rev}, {len(after)} now: cannot pair them"]
    lines = []
    for i, ((fb, sb), (fa, sa)) in enumerate(zip(before, after)):
        where = f"{notebook} cell {i + 1} ({fa or 'no flags'})"
        if sb == sa:
            lines.append(f"{where}: source unchanged")
            continue
        old, new = compile_cell(fb, sb), compile_cell(fa, sa)
        if set(old) != set(new):
            lines.append(f"{where}: DIFFERENT kernels: {sorted(set(old) ^ set(new))}")
            continue
        differ = [s for s in old if old[s] != new[s]]
        lines.append(f"{where}: {len(old)} kernels, " + (f"DIFFERENT SASS in {differ}" if differ else
                                                         "identical SASS"))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision to compare against (e.g. main)")
    ap.add_argument("notebooks", nargs="+", help="jupytext .py files, relative to the repository root")
    args = ap.parse_args(argv)
    bad = 0
    for nb in args.notebooks:
        for line in compare(args.rev, nb):
            print(line, flush=True)
            bad += "DIFFERENT" in line or "cannot" in line
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
