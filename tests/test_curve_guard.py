"""Verify curves that cannot lie: an impossible or too noisy timing is timed once more, then never saved (one
notice; the run plans from the cached curve, else from the timing made non-decreasing); the cache keeps the
better-conditioned curve; a curve saved before these checks with T(n)/T(1) < 1 is measured again. The timings
fed here stand in for a busy machine's (T(5)/T(1) = 0.92 is what one gave); the model and its cache key are real."""

from __future__ import annotations

import json

import pytest

import specpipe.costmodel.calibration as cal
from specpipe.costmodel import curve_guard
from specpipe.costmodel.calibration import QUICK_POINTS, verify_cost_curve
from tests.conftest import tiny

GOOD = {1: 1.00, 2: 1.05, 3: 1.10, 5: 1.20, 9: 1.40, 17: 1.80, 33: 2.60}  # seconds: a big model on a slow CPU
IMPOSSIBLE = {**GOOD, 5: 0.92, 9: 0.93}  # T(5)/T(1) = 0.92


def timer(measured: dict[int, float], spread: float = 0.0, calls: list | None = None):
    """A stand-in for time_forwards: the given fastest samples, the others `spread` slower."""

    def time_forwards(engine, points, repeats=3, samples=None):
        if calls is not None:
            calls.append(1)
        if samples is not None:
            samples.update({n: [measured[n], measured[n] * (1 + spread), measured[n] * (1 + spread)] for n in points})
        return {n: measured[n] for n in points}

    return time_forwards


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    return tiny("llama")


def cached(tmp_path) -> dict | None:
    files = list((tmp_path / "calibration").glob("*.json"))
    return json.loads(files[0].read_text()) if files else None


def test_an_impossible_timing_is_timed_again_then_not_saved(tmp_path, engine, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(cal, "time_forwards", timer(IMPOSSIBLE, calls=calls))
    curve = verify_cost_curve(engine)
    assert len(calls) == cal.ATTEMPTS and cached(tmp_path) is None
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "T(5)/T(1) = 0.92" in notice[0] and "not saved" in notice[0]
    ratios = [curve["ratio"][n] for n in sorted(curve["ratio"])]
    assert min(ratios) >= 1.0 and ratios == sorted(ratios)  # planned from in memory, made possible


def test_a_failing_timing_never_replaces_a_good_curve(tmp_path, engine, monkeypatch, capsys):
    monkeypatch.setattr(cal, "time_forwards", timer(GOOD, spread=0.02))
    good = verify_cost_curve(engine)
    saved = cached(tmp_path)
    assert saved is not None and saved["noise"] == pytest.approx(0.02, abs=1e-3)
    monkeypatch.setattr(cal, "time_forwards", timer(IMPOSSIBLE))
    again = verify_cost_curve(engine, refresh=True)  # specpipe-calibrate / specpipe-tune time it again
    assert again["ratio"] == good["ratio"] and cached(tmp_path) == saved
    assert "planning from the cached curve" in capsys.readouterr().err
    # a too-noisy timing (repeats 1.8x their fastest) is refused the same way
    monkeypatch.setattr(cal, "time_forwards", timer(GOOD, spread=0.8))
    verify_cost_curve(engine, refresh=True)
    assert cached(tmp_path) == saved and "too busy" in capsys.readouterr().err


def test_the_cache_keeps_the_better_conditioned_curve(tmp_path, engine, monkeypatch):
    monkeypatch.setattr(cal, "time_forwards", timer(GOOD, spread=0.03))
    verify_cost_curve(engine)
    noisier = {n: t * (1.04 if n > 1 else 1.0) for n, t in GOOD.items()}
    monkeypatch.setattr(cal, "time_forwards", timer(noisier, spread=0.2))
    verify_cost_curve(engine, refresh=True)
    assert cached(tmp_path)["noise"] == pytest.approx(0.03, abs=1e-3)  # kept: timed with less noise
    monkeypatch.setattr(cal, "time_forwards", timer(noisier, spread=0.01))
    verify_cost_curve(engine, refresh=True)
    assert cached(tmp_path)["noise"] == pytest.approx(0.01, abs=1e-3)  # replaced: quieter than the cached one


def test_a_cached_impossible_curve_is_measured_again(tmp_path, engine, monkeypatch, capsys):
    monkeypatch.setattr(cal, "time_forwards", timer(GOOD))
    verify_cost_curve(engine)
    path = next((tmp_path / "calibration").glob("*.json"))
    data = json.loads(path.read_text())
    data["ratio"]["5"] = 0.92  # as an unchecked calibration saved it on a busy machine
    data["measured"]["5"] = 0.92 * data["measured"]["1"]
    path.write_text(json.dumps(data))
    calls: list = []
    monkeypatch.setattr(cal, "time_forwards", timer(GOOD, calls=calls))
    assert verify_cost_curve(engine)["ratio"][5] > 1.0 and calls == [1]
    assert "stale" in capsys.readouterr().err


def test_problems_name_what_is_wrong():
    assert curve_guard.problems(GOOD) == []
    assert curve_guard.problems({1: 1.0, 2: 0.97, 3: 1.02}) == []  # within the noise
    assert curve_guard.problems({1: 0.0010, 2: 0.0008}) == []  # 0.2 ms apart: within the scheduler's jitter
    assert curve_guard.problems({1: 1.0, 2: 0.8}, jitter=0.0)  # the same shape in seconds: impossible
    falls = curve_guard.problems({1: 1.0, 9: 1.5, 17: 1.3})
    assert len(falls) == 1 and "falls" in falls[0]
    assert curve_guard.monotone({1: 1.0, 2: 0.9, 3: 1.2, 4: 1.1}) == {1: 1.0, 2: 1.0, 3: 1.2, 4: 1.2}
    assert set(QUICK_POINTS) == set(GOOD)


def test_the_estimate_carries_its_range():
    from specpipe.costmodel.worth import StepLog, phrase
    from specpipe.events import Verified

    ratio = cal.interpolate(GOOD)
    log = StepLog()
    for i in range(40):  # K = 4 each step; accepted 0..4 in turn: tokens per step vary as real acceptance does
        n = i % 5
        log.consume(Verified(step=i, accepted_ids=[1] * n, rejected_ids=[2] * (4 - n), seconds=0.01))
    value, source = log.estimate(ratio, 0.0)
    low, high = log.interval(ratio, 0.0)
    assert source == "calibration" and low < value < high and high / low < 1.6
    assert phrase(value, low, high) == f"~{value:.1f}x ({low:.1f}-{high:.1f}) vs plain (estimated)"
    short = StepLog()
    for i in range(3):
        short.consume(Verified(step=i, accepted_ids=[1], rejected_ids=[2], seconds=0.01))
    assert short.interval(ratio, 0.0) is None and "no range" in phrase(short.estimate(ratio, 0.0)[0])


def test_the_estimate_prices_auto_runs_by_the_saved_curve(engine, monkeypatch):
    """budget=auto corrects its own curve by the run's verify timings (load moves them); the summary's estimate
    prices the steps by the device's saved curve, so it moves with acceptance, not with another process."""
    from types import SimpleNamespace

    from specpipe.costmodel.worth import calibrated_costs

    monkeypatch.setattr(cal, "time_forwards", timer(GOOD))
    saved = verify_cost_curve(engine)["ratio"]
    loaded = SimpleNamespace(draft_cost=0.0, verify_curve={n: 3.0 * r for n, r in saved.items()})
    drafter = SimpleNamespace(cost_per_token=None, engine=None)
    assert calibrated_costs(loaded, engine, drafter) == (saved, 0.0)
