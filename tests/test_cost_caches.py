"""The cost model's caches and its long-context prices (issues 33 and 38): a torn or stale calibration or
context-curve file is measured again with one notice line, never a traceback; files are replaced whole;
and budget=auto never times a forward on a request's path: an untimed long context is priced from the
short curve and a context-length model, and the step's decision says so."""

from __future__ import annotations

import json

import pytest
from conftest import tiny

import specpipe.costmodel.calibration as cal
import specpipe.costmodel.context_curve as cc
from specpipe.budgets.auto import AutoBudget
from specpipe.costmodel import cache_file
from specpipe.drafters.ngram import NgramDrafter


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    return tiny("llama")


@pytest.mark.parametrize(
    "content", ['{"t1_s": 0.01, "ratio": {"1": 1.0, "2"', "\x00\x01garbage", '{"ratio": {}}', "[]"]
)
def test_a_torn_or_stale_calibration_is_measured_again_with_one_notice(engine, tmp_path, capsys, content):
    path = tmp_path / "calibration" / f"{cal.calibration_key(engine)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    curve = cal.verify_cost_curve(engine)
    assert curve["ratio"][1] == 1.0 and set(curve["ratio"]) == set(range(1, 34))
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and str(path) in notice[0] and "measuring it again" in notice[0]
    assert json.loads(path.read_text())["ratio"]["33"] == curve["ratio"][33]  # replaced by a whole file
    assert not list(path.parent.glob(".*.tmp"))  # no temporary left behind


def test_a_torn_context_curve_file_is_measured_again(engine, tmp_path, capsys, monkeypatch):
    path = tmp_path / "calibration" / f"{cc.context_key(engine)}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"1024": {"t1_s": 0.1, "ratio": {"1": 1.0')
    assert cc.cached_curves(engine) is None  # what a run reads: nothing usable, one notice, no traceback
    assert "torn" in capsys.readouterr().err
    monkeypatch.setattr(cc, "CONTEXTS", (1024,))
    monkeypatch.setattr(cc, "time_at_context", lambda e, length: {n: 0.01 * n for n in cal.QUICK_POINTS})
    timed = cc.context_curves(engine)  # specpipe-calibrate's path: times again and replaces the file
    assert cc.cached_curves(engine) == timed and set(timed[1024]["ratio"]) == set(range(1, 34))


def test_a_write_that_fails_leaves_the_old_file_and_says_so(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.json"
    cache_file.write(path, {"a": 1})
    monkeypatch.setattr(cache_file.json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space")))
    cache_file.write(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1} and "could not save" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_auto_never_times_a_long_context_on_the_request_path(engine, monkeypatch):
    """A 635-token prompt with a fresh cache waited 47.8 s for its first token while the 1k-8k curves were
    timed inside the request; now the step is priced from the model at once, and says so."""
    forbidden = lambda *a, **k: pytest.fail("timed a forward inside a request")  # noqa: E731
    budget = AutoBudget(k_max=8, prior_alpha=0.8)
    budget.prepare(engine, NgramDrafter())  # the short curve: timed here, before any request
    monkeypatch.setattr(cc, "time_at_context", forbidden)
    monkeypatch.setattr(cc, "time_on_cache", forbidden)
    monkeypatch.setattr(cal, "time_on_cache", forbidden)
    budget.at_context(100)
    budget.next_k()
    assert budget.decision.context_curve == ""
    budget.at_context(634)
    budget.next_k()
    assert budget.decision.context_curve == "modelled"


def test_the_modelled_curve_steepens_with_the_context_and_prices_shorter_drafts(engine):
    base = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}
    cost = cc.context_cost(engine)
    assert cost is not None and cost[0] > 0 and cost[1] > 0
    near, far = cc.modelled(base, 1024, cost), cc.modelled(base, 16384, cost)
    assert near[1] == far[1] == 1.0
    assert base[17] < near[17] < far[17]  # a long draft's verify costs relatively more at long context
    budget = AutoBudget(k_max=16, prior_alpha=0.7)
    budget.ratio, budget.c = base, 0.0
    budget.costs.context = cc.ContextCurve(engine)
    budget.costs.context._read = True  # no cached curves: the model prices
    budget.at_context(100)
    short_k = budget.next_k()
    budget.at_context(60_000)
    assert budget.next_k() <= short_k and budget.decision.context_curve == "modelled"


def test_smollm2_geometry_gives_the_documented_context_cost(monkeypatch):
    """The docstring's worked example: SmolLM2's KV bytes per position against its weight bytes."""

    class Args:
        num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim = 30, 9, 3, 64

    class Model:
        args = Args()

    class Info:
        precision = "float32"

    class Engine:
        model, kv, info = Model(), None, Info()

    import specpipe.costmodel.weights as w

    monkeypatch.setattr(w, "weight_bytes", lambda *m: 538_000_000)
    a, b = cc.context_cost(Engine())
    assert a == pytest.approx(1.3e-4, rel=0.05) and b == pytest.approx(6.9e-5, rel=0.05)
