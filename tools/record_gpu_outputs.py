"""Extract what the tutorials' `%%gpu` cells showed on the GPU into kernellab/notebook/recorded/ (shipped with
kernellab: a cell skipped without a GPU shows these outputs again, labelled with the device and the date).

Run it after committing tutorials re-run on a GPU (tools/gpu/run_notebooks.py stamps their metadata):
    python tools/record_gpu_outputs.py            # rewrite the recorded copies from notebooks/*.ipynb
    python tools/record_gpu_outputs.py --check    # exit 1, naming them, where a recorded copy is stale
A notebook without the stamp is an error; `--device NAME --date YYYY-MM-DD [NOTEBOOK ...]` stamps those named (for
outputs recorded before the stamp existed). tests/test_recorded_outputs.py runs the check on the CPU.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernellab.notebook import recorded  # noqa: E402


def notebooks(names=()) -> list[pathlib.Path]:
    found = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    if names:
        found = [p for p in found if p.name in names or p.stem in names or str(p) in names]
    return found


def _stamp(nb: dict):
    return nb.get("metadata", {}).get("kernellab", {}).get("recorded_on")


def _gpu_outputs(nb: dict) -> bool:
    """Whether any `%%gpu` cell of the notebook has outputs."""
    return any(c.get("cell_type") == "code" and c.get("outputs")
               and recorded.split_cell("".join(c["source"]) if isinstance(c["source"], list) else c["source"])
               for c in nb.get("cells", []))


def stale() -> list[str]:
    """What differs between the committed notebooks and their recorded copies (empty: all fresh)."""
    problems = []
    wanted = set()
    for path in notebooks():
        nb = json.loads(path.read_text())
        if not _stamp(nb) and not _gpu_outputs(nb):
            continue                      # a tutorial not yet run on a GPU: nothing to record until it is
        target = recorded.RECORDED_DIR / f"{path.stem}.json"
        wanted.add(target.name)
        try:
            text = recorded.dumps(recorded.extract(nb, path.name))
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if not target.exists():
            problems.append(f"{target.relative_to(ROOT)} is missing")
        elif target.read_text() != text:
            problems.append(f"{target.relative_to(ROOT)} differs from {path.relative_to(ROOT)}'s %%gpu outputs")
    for extra in recorded.RECORDED_DIR.glob("*.json"):
        if extra.name not in wanted:
            problems.append(f"{extra.relative_to(ROOT)} has no notebook")
    return problems


def stamp(paths, device: str, date: str) -> None:
    """Write kernellab.recorded_on into each notebook's metadata (keeping the file's layout: nbformat's)."""
    import nbformat

    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nb.metadata.setdefault("kernellab", {})["recorded_on"] = {"device": device, "date": date}
        nbformat.write(nb, path)
        print(f"stamped {path.relative_to(ROOT)}: {device}, {date}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say whether the recorded copies are stale")
    ap.add_argument("--device", help="stamp the named notebooks' outputs as recorded on this device")
    ap.add_argument("--date", help="... on this date (YYYY-MM-DD)")
    ap.add_argument("names", nargs="*", help="notebooks to stamp (with --device and --date)")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        for p in problems:
            print(p)
        if problems:
            print("run: python tools/record_gpu_outputs.py")
        return 1 if problems else 0
    if args.device or args.date:
        if not (args.device and args.date and args.names):
            ap.error("--device and --date stamp the notebooks named after them")
        stamp(notebooks(args.names), args.device, args.date)
    recorded.RECORDED_DIR.mkdir(exist_ok=True)
    wanted = set()
    for path in notebooks():
        rec = recorded.extract(json.loads(path.read_text()), path.name)
        target = recorded.RECORDED_DIR / f"{path.stem}.json"
        wanted.add(target.name)
        target.write_text(recorded.dumps(rec))
        print(f"{target.relative_to(ROOT)}: {len(rec['cells'])} cells recorded on {rec['device']}, {rec['date']}")
    for extra in recorded.RECORDED_DIR.glob("*.json"):
        if extra.name not in wanted:
            extra.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
