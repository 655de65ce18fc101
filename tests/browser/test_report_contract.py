"""The report JSON the Python side emits has every field the JupyterLab panels read (extension/src/report/render.ts),
and the jest fixtures (extension/test/fixtures/reports.json) still have the shape of today's reports."""
from __future__ import annotations

import json

import pytest

from .report_fixtures import FIXTURES, reports

# Field -> what the panel does with it. Nested: "kernels[]" is each element of the list "kernels".
READS = {
    "compile": {
        "": ["kind", "version", "title", "arch", "cache", "cache_source", "compile_ms", "wall_ms", "notes", "kernels",
             "diagnostics"],
        "kernels[]": ["name", "signature", "registers", "shared_bytes", "local_bytes", "spill_store_bytes",
                      "spill_load_bytes", "max_threads_per_block", "occupancy", "best_block_sizes", "instructions"],
        "kernels[].occupancy": ["block_size", "block_source", "ratio", "limiter", "blocks_per_sm"],
        "kernels[].instructions": ["lines", "headline", "total"],
    },
    "compile_failed": {
        "": ["kind", "title", "ok", "diagnostics", "log"],
        "diagnostics[]": ["line", "column", "severity", "message"],
    },
    "occupancy": {
        "": ["ratio", "limiter", "limiters", "block_size", "blocks_per_sm", "warps_per_sm", "max_warps_per_sm",
             "registers", "shared_bytes", "arch", "limits", "reasons"],
    },
    "check_failed": {
        "": ["passed", "trials", "message", "mismatches", "max_abs_error", "max_rel_error", "atol", "rtol",
             "worst_values", "dtype", "shape", "tolerance", "reproduce", "exception"],
    },
    "bench": {
        "": ["name", "device", "method", "median_ms", "quantiles_ms", "tflops", "gbps", "baselines", "speedups"],
        "speedups[]": ["baseline", "ratio", "low", "high", "rounds"],
    },
}


def _at(report: dict, path: str) -> list[dict]:
    """The objects at a path like "kernels[].occupancy" ("" is the report itself)."""
    nodes = [report]
    for part in filter(None, path.split(".")):
        key, many = part.removesuffix("[]"), part.endswith("[]")
        nodes = [x for n in nodes for x in (n[key] if many else [n[key]])]
    return nodes


@pytest.fixture(scope="module")
def fresh():
    pytest.importorskip("torch")
    return reports()


@pytest.mark.parametrize("name", sorted(READS))
def test_reports_have_the_fields_the_panels_read(fresh, name):
    for path, fields in READS[name].items():
        nodes = _at(fresh[name], path)
        assert nodes, f"{name}: nothing at {path!r}"
        for node in nodes:
            missing = [f for f in fields if f not in node]
            assert not missing, f"{name} {path or 'report'} lacks {missing}: update extension/src/report/render.ts"


def test_jest_fixtures_match_todays_reports(fresh):
    committed = json.loads(FIXTURES.read_text())
    assert sorted(committed) == sorted(fresh)
    for name, report in fresh.items():
        assert sorted(committed[name]) == sorted(report), (
            f"{name}: the report's fields changed; run `python tests/browser/report_fixtures.py --write` "
            "and check the panels (jlpm test, make test-browser)")
