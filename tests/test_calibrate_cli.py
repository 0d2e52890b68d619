"""specpipe-calibrate says what it is doing while it times (one line per step on stderr, before the step),
defines the prediction table's rows and columns instead of an undefined "alpha", and ends with a short
measured check: plain against the drafter under budget=auto, the prediction and the measurement one line each."""

from __future__ import annotations

import json
import os
import re


def calibrate(tmp_path, *args):
    from conftest import run_module

    env = {**os.environ, "SPECPIPE_CACHE": str(tmp_path / "cache")}
    argv = ["model=tiny-random", "quick=true", "contexts=false", f"hydra.run.dir={tmp_path / 'run'}", *args]
    return run_module("specpipe.cli.calibrate", argv, tmp_path, env)


def test_calibrate_shows_each_step_names_its_columns_and_checks_its_prediction(tmp_path):
    proc = calibrate(tmp_path, "check_tokens=24")
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("[calibrate ")]
    assert [s.split(",")[0] for s in steps] == [f"[calibrate {n}/4" for n in (1, 2, 3, 4)], proc.stderr
    # the check's cost is said before it is paid, with the key that skips it
    assert re.search(
        r"measured check: 24 tokens .*\((about \d+ s|under a second) plus prefills; check=false skips it\)", steps[3]
    )
    assert "rows: acceptance, the chance the target accepts each drafted token" in proc.stdout
    assert "columns: K, tokens drafted per step (K = 0 is plain decoding)" in proc.stdout
    assert "alpha" not in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.strip().startswith("acceptance "))
    assert header.split()[1:] == ["0", "1", "2", "4", "8", "16", "32"]

    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("measured check: draft=ngram budget=auto"))
    assert "prompt=code-edit" in lines[head] and "the same tokens as plain" in lines[head]
    predicted, measured = lines[head + 1], lines[head + 2]
    assert re.match(r"  predicted \d+\.\d\dx vs plain: ", predicted), predicted
    shown = re.match(
        r"  measured  (\d+\.\d\d)x vs plain: decode (\d+\.\d) tok/s against plain's (\d+\.\d) tok/s", measured
    )
    assert shown, measured
    # the ratio printed is the two rates printed (to their rounding), and calibration.json keeps the check
    assert abs(float(shown[1]) - float(shown[2]) / float(shown[3])) < 0.02 * float(shown[1]) + 0.01
    saved = json.loads((tmp_path / "run" / "calibration.json").read_text())["check"]
    assert saved["same_tokens"] and saved["tokens"] == 24 and saved["plain_tok_s"] > 0 and saved["spec_tok_s"] > 0
    assert saved["predicted"] == 0.0 or f"{saved['predicted']:.2f}x" in predicted


def test_check_false_skips_the_check_and_a_bad_length_is_one_line(tmp_path):
    proc = calibrate(tmp_path, "check=false")
    assert proc.returncode == 0, proc.stderr
    assert [line.split(",")[0] for line in proc.stderr.splitlines() if line.startswith("[calibrate ")][-1] == (
        "[calibrate 3/3"
    )
    assert "measured check" not in proc.stdout
    assert json.loads((tmp_path / "run" / "calibration.json").read_text())["check"] is None
    (tmp_path / "bad").mkdir()
    bad = calibrate(tmp_path / "bad", "check_tokens=0")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "check_tokens" in bad.stderr
