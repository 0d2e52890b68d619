"""`specpipe-bench-report` on specpipe-bench-serve's JSONL: a small recorded run (tiny random model,
2 variants, concurrency 1 and 2, 2 repeats) -> the concurrency table, speed-up vs concurrency and
the inter-token latency CDF per concurrency."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specpipe.bench.report import main as report_main
from specpipe.bench.serve_report import is_serve_record, summarize_levels

RECORDED = Path(__file__).parent / "data" / "serve_bench_small.jsonl"


@pytest.fixture
def records():
    return [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]


def test_levels_pool_repeats_and_compare_within_a_repeat(records):
    assert all(is_serve_record(r) for r in records)
    levels = summarize_levels(records)
    base = records[0]["variant"]
    assert {(s["variant"], s["clients"]) for s in levels} == {(r["variant"], r["clients"]) for r in records}
    for s in levels:
        same = [r for r in records if r["variant"] == s["variant"] and r["clients"] == s["clients"]]
        assert s["repeats"] == len(same) and s["lossless"] == all(r["lossless"] for r in same)
        assert min(r["tok_s"] for r in same) <= s["tok_s"] <= max(r["tok_s"] for r in same)
        assert len(s["gaps_s"]) == sum(len(r["gaps_s"]) for r in same)
        ratios = [
            r["tok_s"]
            / next(
                b for b in records if (b["variant"], b["clients"], b["repeat"]) == (base, r["clients"], r["repeat"])
            )["tok_s"]
            for r in same
        ]
        assert s["speedup_min"] == pytest.approx(min(ratios))
        if s["variant"] == base:
            assert s["speedup"] == pytest.approx(1.0)


def test_report_writes_the_table_and_both_plots(tmp_path, records, capsys):
    jsonl = tmp_path / "serve_bench.jsonl"
    shutil.copy(RECORDED, jsonl)
    report_main([str(jsonl)])
    report = Path(capsys.readouterr().out.strip())
    text = report.read_text()
    assert "| model | variant | clients |" in text
    for r in records:
        assert f"| {r['variant']} | {r['clients']} |" in text
    for png in ("speedup_vs_concurrency.png", "itl_cdf_by_concurrency.png"):
        assert (tmp_path / png).stat().st_size > 5000 and f"({png})" in text
