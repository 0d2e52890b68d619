"""The idle refinement of the long-context curves (costmodel/refine.py): it times one unit of work per
`should_stop()` check, so a request waits one forward at most; it resumes where it stopped; what it
finishes is cached, merged with what was there, and read by the budget's curve at once; it times only
lengths a request came near. Real forwards of a tiny random model; no timing is asserted."""

from __future__ import annotations

import json

import pytest
from conftest import tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.costmodel.context_curve import ContextCurve, cached_curves, context_lengths, curve_path
from specpipe.costmodel.refine import next_length, refine_idle


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    engine = tiny()
    forwards = []
    real = engine.forward

    def counted(*args, **kwargs):
        forwards.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "forward", counted)
    engine.forwards = forwards  # the test reads how many forwards ran between checks
    return engine


def test_short_turns_time_nothing(engine):
    curve = ContextCurve(engine)
    curve.ratio_at(200, {n: 1.0 for n in range(1, 34)})  # a chat of short turns
    assert refine_idle(engine, curve, lambda: False) is True
    assert engine.forwards == [] and cached_curves(engine) is None


def test_each_check_lets_at_most_one_forward_run_and_a_stopped_refinement_resumes(engine):
    curve = ContextCurve(engine)
    curve.longest = 600  # a request passed FIRST_CONTEXT: the 1024 curve is wanted
    assert next_length(engine, curve) == 1024
    checks = []

    def stop_after(n):
        def should_stop():
            checks.append(len(engine.forwards))
            return len(checks) > n

        return should_stop

    assert refine_idle(engine, curve, stop_after(3)) is False  # asked to stop: returns, keeps its place
    assert curve.refining is not None and cached_curves(engine) is None
    steps = [b - a for a, b in zip(checks, checks[1:])]
    assert all(s <= 1 for s in steps), steps  # one fill chunk or one forward between two checks

    checks.clear()
    assert refine_idle(engine, curve, stop_after(10_000)) is True  # resumed and finished
    assert all(b - a <= 1 for a, b in zip(checks, checks[1:]))
    timed = cached_curves(engine)
    assert set(timed) == {1024} and timed[1024]["ratio"][1] == 1.0 and set(timed[1024]["ratio"]) == set(range(1, 34))
    assert curve.refining is None and next_length(engine, curve) is None

    before = len(engine.forwards)
    assert refine_idle(engine, curve, lambda: False) is True and len(engine.forwards) == before  # nothing left


def test_a_finished_length_is_merged_and_the_budget_prices_from_it_at_once(engine):
    budget = AutoBudget()
    budget.ratio = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}
    budget.costs.context = ContextCurve(engine)
    budget.at_context(700)
    assert budget.context_curve.source == "modelled"
    path = curve_path(engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    other = {"t1_s": 0.1, "ratio": {str(n): 9.0 if n > 1 else 1.0 for n in range(1, 34)}}
    path.write_text(json.dumps({"4096": other}))  # a longer curve another process cached
    budget.context_curve.refresh()
    assert next_length(engine, budget.context_curve) == 1024

    assert refine_idle(engine, budget, lambda: False) is True  # through the budget, as the chat calls it
    assert set(cached_curves(engine)) == {1024, 4096}  # the other process's curve stays
    budget.at_context(1024)
    assert budget.context_curve.source == "timed"
    assert budget.ratio[17] == pytest.approx(_monotone_at(cached_curves(engine)[1024]["ratio"], 17))


def test_past_the_longest_timing_the_curve_grows_by_the_model(engine):
    curve = ContextCurve(engine)
    base = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}
    curve._curves, curve._read = {1024: {"t1_s": 0.1, "ratio": dict(base)}}, True
    assert curve.ratio_at(1024, base)[17] == pytest.approx(base[17]) and curve.source == "timed"
    far = curve.ratio_at(6000, base)
    assert curve.source == "modelled" and far[17] > base[17]  # dearer with the context, never held at 1024's


def test_other_budgets_refine_nothing(engine):
    assert refine_idle(engine, FixedBudget(k=4), lambda: False) is True and engine.forwards == []


def _monotone_at(ratio: dict[int, float], n: int) -> float:
    return max(ratio[m] for m in range(2, n + 1)) if n > 1 else 1.0


# ---- the chat's hook: between turns, until the next one starts


def test_a_chat_source_refines_after_a_long_turn(tmp_path, monkeypatch):
    """LiveSource.refine_idle, as the chat calls it between turns: a turn past FIRST_CONTEXT / 2 positions
    leaves the curves up to its context's timed and cached for the next one."""
    from test_tui import tiny_cfg

    from specpipe.core.pipeline import RunControl
    from tui.sources import LiveSource

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    source = LiveSource(tiny_cfg("budget=auto", "max_tokens=8", "prompt.chat=false"))
    long_text = " ".join(f"w{i % 50}" for i in range(400))
    events = list(source.generate([{"role": "user", "content": long_text}], RunControl()))
    assert events[-1].token_ids
    source.refine_idle(lambda: False)
    target, curve = source.session.target, source.session.budget.context_curve
    timed = set(cached_curves(target))
    assert 1024 in timed and next_length(target, curve) is None
    # up to the first timed length past the turn's context, none beyond
    assert max(timed) == min(n for n in context_lengths(target) if n >= curve.longest)


async def test_the_chat_refines_between_turns_and_stops_for_the_next_one():
    import time

    from test_tui import SIZE, answers, scripted_events, wait_for

    from tui.app import ChatApp
    from tui.sources import ReplaySource

    class Recording(ReplaySource):
        calls: list[str] = []

        def refine_idle(self, should_stop) -> None:
            self.calls.append("idle")
            while not should_stop():
                time.sleep(0.01)
            self.calls.append("stopped")

    source = Recording(scripted_events(), speed=0)
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app) and source.calls == ["idle"])
        await pilot.press("enter")  # the next turn: the idle refinement is told to stop, then it runs again
        await wait_for(pilot, lambda: len(answers(app)) == 2 and app.control is None and len(source.calls) >= 3)
        # the first refinement was told to stop and the next turn's began: two worker threads, so the new one's
        # "idle" may land before the old one's "stopped" (a LiveSource's lock orders their forwards, not this list)
        assert source.calls[0] == "idle" and sorted(source.calls[:3]) == ["idle", "idle", "stopped"]
