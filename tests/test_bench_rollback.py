"""scripts/bench_rollback.py (docs/rollback.md's figures) runs as documented, cut short: one K, one round."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_rollback.py"


@pytest.mark.slow
def test_the_rollback_cost_table_prints_every_accepted_count():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--ks", "4", "--reps", "1", "--prompt-tokens", "16"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["4"]]
    assert [int(r[1]) for r in rows] == [0, 1, 2, 3, 4], proc.stdout  # accepted = 0..K
    assert "cheaper (CPU time)" in proc.stdout
