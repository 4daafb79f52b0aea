"""The benchmark harness runs and its comparisons are sound (numbers themselves are not asserted)."""

import json

import pytest

from nvrm.bench import clean_json as main_json, format_table, run_bench


@pytest.mark.slow
def test_bench_smoke_tiny():
    report = run_bench("tiny", groups=(1, 2), contexts=(5,), fps=8, size=(96, 128))
    assert report["preprocessing"]["bit_identical"] is True
    paths = {(r["group"], r["path"]) for r in report["rows"]}
    assert paths == {(g, p) for g in (1, 2) for p in ("naive", "batch", "group")}
    for r in report["rows"]:
        assert r["candidates_per_s"] > 0 and r["seconds_per_group"] > 0
        # every path computes the same rewards as the naive reference (bf16 noise only)
        assert r["max_abs_diff_vs_naive"] <= 0.05
    parsed = json.loads(main_json(report))
    assert parsed["rows"][0]["path"] == "naive"
    assert "| 5 s | 2 | group |" in format_table(report)
