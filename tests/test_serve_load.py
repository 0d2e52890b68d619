"""`specpipe-bench-serve` end to end: two real servers (tiny random model) at concurrency 1 and 2, one line
per (variant, level), every answer equal to the plain server's, and a report drawn from the file; bad
variants are one line before any server starts."""

from __future__ import annotations

import json
import subprocess
import sys

from specpipe.bench.report import main as report_main
from specpipe.bench.serve_report import is_serve_record


def test_two_servers_two_levels_give_a_lossless_jsonl_the_report_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the servers' run folders
    out = tmp_path / "serve.jsonl"
    from specpipe.bench.serve_load import main

    main(
        ["--model", "tiny-random", "--concurrency", "1", "2", "--requests-per-client", "1", "--max-tokens", "8"]
        + ["--variants", "off=draft=none", "on=draft=ngram,budget.k=4", "--out", str(out)]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["variant"], r["clients"]) for r in rows] == [("off", 1), ("on", 1), ("off", 2), ("on", 2)]
    assert all(is_serve_record(r) and r["lossless"] and r["tokens"] > 0 for r in rows), rows
    assert sum(r["drafted"] for r in rows if r["variant"] == "on") > 0  # the n-gram server drafted: figures arrived
    report_main([str(out)])
    assert "| 2 |" in (tmp_path / "report.md").read_text()


def test_a_variant_without_overrides_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.bench.serve_load", "--variants", "off"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "name=override" in proc.stderr, proc.stderr
