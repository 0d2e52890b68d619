"""specpipe-calibrate says what it is doing while it times (one line per step on stderr, before the step) and
defines the prediction table's rows and columns instead of an undefined "alpha"."""

from __future__ import annotations

import os


def test_calibrate_shows_each_step_and_names_its_columns(tmp_path):
    from conftest import run_module

    env = {**os.environ, "SPECPIPE_CACHE": str(tmp_path / "cache")}
    proc = run_module("specpipe.cli.calibrate", ["model=tiny-random", "quick=true", "contexts=false"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("[calibrate ")]
    assert [s.split(",")[0] for s in steps] == ["[calibrate 1/3", "[calibrate 2/3", "[calibrate 3/3"], proc.stderr
    assert "rows: acceptance, the chance the target accepts each drafted token" in proc.stdout
    assert "columns: K, tokens drafted per step (K = 0 is plain decoding)" in proc.stdout
    assert "alpha" not in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.strip().startswith("acceptance "))
    assert header.split()[1:] == ["0", "1", "2", "4", "8", "16", "32"]
