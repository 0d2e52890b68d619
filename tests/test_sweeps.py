"""Sweeps through Hydra's launchers: jobs in other processes, one sweep JSONL, one report.

Runs the real console scripts with the joblib and submitit_local launchers on a tiny model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = ["-m", "budget.k=4,8", "model=tiny-random", "limit=2", "max_tokens=8", "anchor=false", "warmup=false"]


def _console(tool: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_bench_sweep_through_a_launcher_gives_one_report(tmp_path, launcher):
    proc = _console("specpipe.bench.harness", [f"hydra/launcher={launcher}", *BENCH], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (sweep,) = list((tmp_path / "outputs" / "bench" / "multirun").glob("*/*"))
    records = [json.loads(line) for line in (sweep / "bench.jsonl").read_text().splitlines()]
    # Every job's every prompt, in the one sweep file, each measured with the fast BLAS the parent chose.
    assert sorted((r["label"]["k"], r["prompt_id"]) for r in records) == sorted(
        (k, p) for k in (4, 8) for p in {r["prompt_id"] for r in records}
    )
    assert len(records) == 4
    assert len({r["device"]["blas"] for r in records}) == 1
    report = _console("specpipe.bench.report", [str(sweep)], tmp_path)
    assert report.returncode == 0, report.stderr
    text = (sweep / "report.md").read_text()
    assert "| 4 |" in text.replace("k=4", "| 4 |") and "| 8 |" in text.replace("k=8", "| 8 |")


def test_specpipe_sweep_through_joblib(tmp_path):
    proc = _console(
        "specpipe.cli",
        ["-m", "hydra/launcher=joblib", "budget.k=2,4", "model=tiny-random", "max_tokens=4", "prompt.text=ab ab"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = sorted((tmp_path / "outputs" / "multirun").glob("*/*/*/summary.json"))
    assert len(summaries) == 2
    assert {json.loads(s.read_text())["budget"] for s in summaries} == {"fixed(k=2)", "fixed(k=4)"}
