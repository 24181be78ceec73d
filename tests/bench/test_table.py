"""bench/table.py: the benchmark table of docs/benchmarks.md, regenerated from a results dict between its markers."""
from __future__ import annotations

import pytest

from bench import table as bench_table

RESULTS = {
    "preview_overhead_ratio": {"value": 6.812, "unit": "ratio", "target": "<= 2.0"},
    "policy_resources_per_s": {"value": 334.4, "unit": "res/s", "target": ">= 100 (71 prod resources)"},
    "preview_dev_s": {"value": 1.8412, "unit": "s", "target": "info"},
    "odd|unit": {"value": 0.0, "unit": "a|b", "target": "0"},
}


def test_table_rows_in_name_order_with_value_unit_target_and_status():
    lines = bench_table.table(RESULTS, "2026-12-01").splitlines()
    assert lines[0] == "Figures of one `make bench` run (2026-12-01); a figure that misses its target says so."
    assert lines[2:4] == ["| figure | value | target | |", "|---|---|---|---|"]
    assert lines[4:] == [
        "| `odd|unit` | 0 a\\|b | 0 | met |",
        "| `policy_resources_per_s` | 334.4 res/s | >= 100 (71 prod resources) | met |",
        "| `preview_dev_s` | 1.841 s | info |  |",
        "| `preview_overhead_ratio` | 6.812 ratio | <= 2.0 | **missed** |",
    ]


def test_only_the_text_between_the_markers_changes():
    before = f"# title\n\nintro\n\n{bench_table.BEGIN}\n| old | table |\n{bench_table.END}\n\nprose after\n"
    block = bench_table.table(RESULTS, "2026-12-01")
    after = bench_table.replace_table(before, block)
    assert after == f"# title\n\nintro\n\n{bench_table.BEGIN}\n{block}\n{bench_table.END}\n\nprose after\n"
    assert bench_table.replace_table(after, block) == after  # regenerating is stable


def test_missing_markers_are_an_error():
    with pytest.raises(ValueError, match="markers"):
        bench_table.replace_table("# no markers here\n", "| t |")


def test_the_benchmarks_doc_has_the_markers():
    text = bench_table.DOC.read_text()
    assert text.count(bench_table.BEGIN) == 1 and text.count(bench_table.END) == 1
