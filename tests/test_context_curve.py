"""T(n)/T(1) by cache length (costmodel/context_curve.py): the synthetic fill gives a cache of the
asked length that a forward attends over, the curve is interpolated in the cache length and held
flat past the longest timing, and budget=auto prices its K with the curve of the run's context."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.costmodel.context_curve import FIRST_CONTEXT, ContextCurve, fill_cache, time_at_context
from specpipe.engine.kv import QuantizedKV
from specpipe.engine.load.loader import load_engine

SHORT = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}  # verify nearly free: long drafts pay
STEEP = {n: float(n) for n in range(1, 34)}  # verify costs n steps: nothing pays


@pytest.mark.parametrize("kv", [None, QuantizedKV(bits=8, group_size=32)])
def test_fill_reaches_the_length_and_a_forward_attends_over_it(kv):
    engine = load_engine("tiny-random", precision="float32", arch="llama", tiny={"hidden_size": 128, "head_dim": 32})
    engine.kv = kv
    cache = engine.make_cache()
    fill_cache(engine, cache, 700)
    assert [layer.offset for layer in cache] == [700] * len(cache)
    logits = engine.forward(mx.array([5, 6, 7], dtype=mx.uint32), cache).logits
    assert logits.shape[-2] == 3 and cache[0].offset == 703 and bool(mx.all(mx.isfinite(logits)))


def test_timing_at_a_context_gives_every_point():
    timed = time_at_context(tiny(), 600, points=[1, 2, 5], repeats=1)
    assert sorted(timed) == [1, 2, 5] and all(t > 0 for t in timed.values())


def curve_with(timed: dict[int, dict[int, float]]) -> ContextCurve:
    curve = ContextCurve(engine=None)
    curve._curves = {length: {"t1_s": 0.1, "ratio": ratio} for length, ratio in timed.items()}  # as if cached
    return curve


def test_curve_is_the_base_below_the_first_context_then_interpolated_then_flat():
    base = {n: 1.0 for n in range(1, 34)}
    curve = curve_with({1024: {n: 2.0 for n in range(1, 34)}, 4096: {n: 4.0 for n in range(1, 34)}})
    assert curve.ratio_at(FIRST_CONTEXT - 1, base) is base
    assert curve.ratio_at(576, base)[9] == pytest.approx(1.0 + (512 - 128) / (1024 - 128))  # bucket 512
    assert curve.ratio_at(2560, base)[9] == pytest.approx(3.0)  # halfway between 1024 and 4096
    assert curve.ratio_at(2600, base) is curve.ratio_at(2560, base)  # one object per bucket
    assert curve.ratio_at(50_000, base)[17] == 4.0  # beyond the longest timing: held flat


def test_auto_drafts_less_when_the_long_context_verify_is_steep():
    budget = AutoBudget(k_max=16, prior_alpha=0.7)
    budget.ratio, budget.c = SHORT, 0.0
    budget.costs.context = curve_with({1024: STEEP, 8128: STEEP})
    budget.at_context(100)
    short_k = budget.next_k()
    budget.at_context(6000)
    long_k = budget.next_k()
    assert short_k > 1 and long_k < short_k and budget.decision.t_verify == STEEP[long_k + 1]
    budget.at_context(100)  # a new, short run: back to the short-context curve
    assert budget.next_k() == short_k


def test_calibrate_times_the_long_context_curves_ahead_of_a_run(tmp_path):
    """specpipe-calibrate times the curves at long contexts too, so a run's first long prompt does not time
    them mid-run (the 1.5B's first 1k-token curve was timed at 04:24 while the machine was loaded); the
    cache the budget reads is written under the same key."""
    import json
    import os

    from conftest import run_module

    env = {**os.environ, "SPECPIPE_CACHE": str(tmp_path / "cache")}
    proc = run_module("specpipe.cli.calibrate", ["model=tiny-random", "quick=true"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "after 1024 cached positions: one token" in proc.stdout, proc.stdout
    saved = json.loads(next(tmp_path.glob("outputs/**/calibration.json")).read_text())
    curve = saved["contexts"]["1024"]
    # timed values only: a tiny model's T(9)/T(1) on a loaded machine fell to 0.46 (the budget reads the curve
    # through _monotone); what must hold is a curve per verify width, relative to T(1), from a real T(1)
    assert curve["ratio"]["1"] == 1.0 and curve["t1_s"] > 0
    assert {"2", "9", "17"} <= set(curve["ratio"]) and all(r > 0 for r in curve["ratio"].values())
    (cached,) = (tmp_path / "cache" / "calibration").glob("*-ctx-full.json")
    assert "1024" in json.loads(cached.read_text())
