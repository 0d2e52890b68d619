"""A short run of scripts/soak_serve.py: 8 streaming and non-streaming clients with random hang-ups
against the real server (a tiny random model, so the run is about the server, not the model's
speed): zero server errors, no answer mixed up between batch rows, every hang-up cancelled within a
few steps. The long run (memory flat, figures in docs/faults.md) is by hand:
`python scripts/soak_serve.py --clients 8 --seconds 180 --max-tokens 64 -- model=tiny-random draft=ngram budget.k=6`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak_serve.py"


@pytest.mark.statistical  # a load test: `python -m pytest -q -m statistical`
def test_eight_streaming_clients_with_hang_ups(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("soak_serve", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    monkeypatch.chdir(tmp_path)  # the server's run folder
    result = soak.soak(
        ["model=tiny-random", "draft=ngram", "budget.k=6"],
        clients=8,
        seconds=12,
        max_tokens=40,
        disconnect=0.4,
        rss_slack=1.0,
    )  # 12 s is too short to judge memory; the long run does
    assert result["errors"] == 0, result["first_errors"]
    assert result["mixed"] == 0 and result["completed"] >= 8 and result["hung_up"] > 0, result
    assert result["stream"] > 0 and result["whole"] > 0 and result["server_5xx"] == 0, result
    assert result["cancelled"] > 0 and result["disconnects_logged"] > 0, result
    assert result["disconnects_unfinished"] == 0 and result["cancel_steps_max"] <= 3, result
