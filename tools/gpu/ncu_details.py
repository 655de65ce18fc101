"""What tools/gpu/sgemm_stalls.py and norm_stalls.py share: the warp-stall metrics they ask Nsight Compute for,
its `--csv --page details` output read into {(section, metric): (value, unit)}, and those printed side by side."""
from __future__ import annotations

import csv
import io

STALLS = ("barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "not_selected",
          "selected", "wait", "dispatch_stall", "no_instruction", "lg_throttle", "branch_resolving", "membar",
          "drain", "tex_throttle", "misc", "sleeping")


def stall_metrics() -> list[str]:
    """Warps stalled for each reason per issued instruction (ncu --metrics names)."""
    return [f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALLS]


def parse_details(text: str, name_width: int = 60) -> dict:
    """{(section, metric): (value, unit)} of one kernel's details page, plus ("kernel", "name")."""
    vals = {}
    lines = [l for l in text.splitlines() if l.startswith('"')]
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        vals[(r.get("Section Name", ""), r.get("Metric Name", ""))] = (r.get("Metric Value", ""),
                                                                        r.get("Metric Unit", ""))
        vals.setdefault(("kernel", "name"), (r.get("Kernel Name", "")[:name_width], ""))
    return vals


def side_by_side(results: dict, keys, metric_width: int, column_width: int, section_width: int = 22) -> str:
    """One line per key, one column per result (value and unit), headed by the results' names."""
    out = [f"{'metric':{metric_width}s} " + " ".join(f"{n[:column_width]:>{column_width}s}" for n in results)]
    for k in keys:
        out.append(f"{(k[0][:section_width] + ' / ' + k[1])[:metric_width]:{metric_width}s} " + " ".join(
            f"{(results[n].get(k, ('-', ''))[0] + ' ' + results[n].get(k, ('', ''))[1])[:column_width]:>{column_width}s}"
            for n in results))
    return "\n".join(out)
