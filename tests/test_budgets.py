"""Draft budgets: adaptive, confidence and auto behave as specified and keep
greedy output identical to the target alone; the cost model and calibration
curve are sane."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, noisy_copy, prepared, tiny

from specpipe.budgets.adaptive import AdaptiveBudget
from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.confidence import ConfidenceBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.calibration import expected_speedup, interpolate, verify_cost_curve
from specpipe.drafters.model import ModelDrafter
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.trim import TrimRollback

FLAT = {n: 1.0 + 0.02 * n for n in range(1, 34)}  # verify almost free (float32 + BLAS-like)
LINEAR = {n: float(n) for n in range(1, 34)}  # verify costs n steps (quantized CPU kernels)


# ---------------------------------------------------------------- adaptive


def test_adaptive_grows_after_full_accept_and_shrinks_after_reject():
    b = AdaptiveBudget(k=8, k_min=2, k_max=32)
    b.observe(8, 8)
    assert b.next_k() == 16
    b.observe(16, 3)
    assert b.next_k() == 10  # halfway between 16 and 3 + 1
    b.observe(10, 0)
    assert b.next_k() == 6
    for _ in range(5):
        b.observe(b.k, 0)
    assert b.next_k() == 2  # floor


def test_adaptive_ignores_short_drafts():
    b = AdaptiveBudget(k=8)
    b.observe(3, 3)  # the n-gram found only 3 tokens to propose
    assert b.next_k() == 8


@pytest.mark.parametrize("kw", [dict(k_min=0), dict(k_max=40), dict(k=20, k_max=16), dict(k_min=8, k_max=4)])
def test_adaptive_bad_bounds(kw):
    with pytest.raises(SpecpipeError):
        AdaptiveBudget(**kw)


# ---------------------------------------------------------------- cost model and auto


def test_expected_speedup_formula():
    assert expected_speedup(0.5, 0, 0.0, FLAT) == 1.0
    # alpha 0.5, K 2: (1 - 0.125) / 0.5 = 1.75 tokens for a cost of T(3)/T(1) = 1.06
    assert expected_speedup(0.5, 2, 0.0, FLAT) == pytest.approx(1.75 / 1.06)
    assert expected_speedup(1.0, 4, 0.0, FLAT) == pytest.approx(5 / 1.10)
    # first token 50%, every later one held once the first did (a copied span): 1 + 0.5 * 4 tokens
    assert expected_speedup(0.5, 4, 0.0, FLAT, continuation=1.0) == pytest.approx(3 / 1.10)


def auto_with(ratio, c, alpha):
    b = AutoBudget(k_max=32, prior_alpha=alpha)
    b.ratio, b.c = ratio, c
    return b


def test_auto_turns_speculation_off_when_it_cannot_pay():
    assert auto_with(LINEAR, 0.3, 0.5).best_k() == 0  # verify costs K steps: never pays
    assert auto_with(FLAT, 1.0, 0.3).best_k() == 0  # self-draft costs a full step per token


def test_auto_drafts_long_when_verify_is_cheap_and_acceptance_high():
    assert auto_with(FLAT, 0.0, 0.95).next_k() >= 16
    b = auto_with(FLAT, 0.0, 0.5)
    for _ in range(30):  # acceptance known to be about one half
        b.observe(2, 1)
    assert 1 <= b.next_k() <= 8


def test_auto_drafts_long_when_drafts_are_all_or_nothing():
    """Same first-token rate (1/2), different bursts: a span that holds once it starts earns a long draft."""
    bursty, scattered = auto_with(FLAT, 0.05, 0.5), auto_with(FLAT, 0.05, 0.5)
    for _ in range(20):
        bursty.observe(8, 8)
        bursty.observe(8, 0)
        scattered.observe(8, 1)
        scattered.observe(8, 0)
    assert bursty.alpha == pytest.approx(scattered.alpha)
    assert bursty.continuation > 0.9 and scattered.continuation < 0.1
    assert bursty.next_k() >= 8 and scattered.next_k() <= 2


def test_auto_learns_acceptance_and_probes_while_off():
    b = auto_with(FLAT, 0.2, 0.9)
    assert b.next_k() > 0
    for _ in range(30):
        b.observe(b.k, 0)  # everything rejected
    assert b.best_k() == 0
    ks = [b.next_k() for _ in range(b.probe_every)]
    assert ks[:-1] == [0] * (b.probe_every - 1) and ks[-1] == b.probe_k
    assert b.decision.reason == "probe" and b.decision.k == b.probe_k


def probe_gaps(b, steps: int, accept: int = 0) -> list[int]:
    """Plain steps between probes while every probe accepts `accept` tokens."""
    gaps, since = [], 0
    for _ in range(steps):
        k = b.next_k()
        since += 1
        if k:
            gaps.append(since)
            since = 0
        b.observe(k, min(accept, k))
    return gaps


def test_auto_backs_off_probing_text_the_drafter_cannot_predict():
    b = auto_with(FLAT, 0.2, 0.9)
    assert b.next_k() > 0  # drafting, until the text turns unpredictable
    for _ in range(30):
        b.observe(4, 0)
    assert probe_gaps(b, 8 + 16 + 32 + 64 + 64 + 64) == [8, 16, 32, 64, 64, 64]  # capped at probe_max
    # when a probe shows drafting pays again, K comes back and the next lull probes promptly
    for _ in range(30):
        b.observe(b.probe_k, b.probe_k)
    assert b.next_k() > 0
    for _ in range(30):
        b.observe(4, 0)
    assert probe_gaps(b, 8 + 16) == [8, 16]


def test_auto_probe_bounds():
    with pytest.raises(SpecpipeError, match="probe_every"):
        AutoBudget(probe_every=16, probe_max=8)
    with pytest.raises(SpecpipeError, match="probe_k"):
        AutoBudget(probe_k=0)


def test_auto_probes_on_its_first_step_even_when_the_prior_says_plain():
    b = auto_with(FLAT, 1.0, 0.3)  # drafting costs a full step: plain wins even on the optimistic estimate
    assert b.best_k() == 0 and b.next_k() == b.probe_k  # learn alpha now, not after probe_every plain steps
    b.c = 0.3  # a cheaper drafter (as the run would measure it) that keeps agreeing
    for _ in range(3):
        b.observe(b.probe_k, b.probe_k)
    assert b.next_k() > 0


def test_auto_follows_the_draft_cost_measured_in_the_run():
    b = auto_with(FLAT, 0.6, 0.6)
    for _ in range(30):
        b.observe(4, 2)  # acceptance settles; no timings: c stays at the calibrated 0.6
    short = b.best_k()
    for _ in range(80):  # same acceptance, but drafting 4 tokens takes 0.4 s while a verify of 5 takes 1.0 s: c ~ 0.1
        b.observe(4, 2, draft_s=0.4, verify_s=1.0)
    assert b.c == pytest.approx(0.1 * FLAT[5], rel=0.05)
    assert b.best_k() > short
    c = b.c
    b.observe(0, 0)  # a plain step: the next draft starts with the drafter catching up on missed tokens
    b.observe(2, 1, draft_s=5.0, verify_s=1.0)
    assert b.c == c  # that catch-up is not the per-token draft cost


def test_auto_probes_in_hindsight_instead_of_spending_a_verify():
    b = AutoBudget(k_max=32, prior_alpha=0.9)
    b.hindsight = True  # as prepare() sets it for a drafter that can look back (n-gram, MTP)
    b.ratio, b.c = FLAT, 0.0  # a free drafter (n-gram): look back on every plain step
    assert b.next_k() > 0
    for _ in range(30):
        b.observe(4, 0)
    for _ in range(5):
        assert b.next_k() == 0 and b.hindsight_k == b.probe_k  # never a verify probe
        b.observe(0, 0)
        b.observe_hindsight(b.probe_k, 0)
    for _ in range(10):  # the text turns predictable: the look backs bring drafting back
        b.next_k()
        b.observe(0, 0)
        b.observe_hindsight(b.probe_k, b.probe_k)
    assert b.next_k() > 0 and b.hindsight_k == 0


def test_auto_looks_back_one_token_on_the_probe_schedule_when_each_costs_an_lm_head():
    b = AutoBudget(k_max=32, prior_alpha=0.9)
    b.hindsight = True  # as prepare() sets it for a drafter that can look back (n-gram, MTP)
    b.ratio, b.c = FLAT, 0.2  # an MTP head: each guessed token runs the LM head
    assert b.next_k() > 0
    for _ in range(30):
        b.observe(4, 0)
    gaps, since = [], 0
    for _ in range(8 + 16 + 32):
        assert b.next_k() == 0
        since += 1
        if b.hindsight_k:
            assert b.hindsight_k == 1
            gaps.append(since)
            since = 0
            b.observe_hindsight(1, 0)
    assert gaps == [8, 16, 32]


def test_interpolated_curve():
    curve = interpolate({1: 0.1, 3: 0.2, 33: 0.5})
    assert curve[1] == 1.0 and curve[2] == pytest.approx(1.5) and curve[33] == pytest.approx(5.0)
    assert len(curve) == 33


def test_calibration_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    engine = tiny("llama")
    first = verify_cost_curve(engine)
    assert first["ratio"][1] == 1.0 and set(first["ratio"]) == set(range(1, 34))
    assert list((tmp_path / "calibration").glob("*.json"))
    import specpipe.costmodel.calibration as cal

    monkeypatch.setattr(cal, "time_forwards", lambda *a, **k: pytest.fail("should read the cache"))
    assert verify_cost_curve(engine)["t1_s"] == first["t1_s"]


# ---------------------------------------------------------------- confidence


def test_confidence_stops_unsure_drafts_and_stays_lossless():
    target = tiny("qwen2")
    draft = noisy_copy(target, scale=1.0)
    prompt = target.encode_prompt("abc abc abc abc abc", chat=False)
    baseline, *_ = generate(target, make_drafter("none", target), 1, prompt, 40)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other")
    drafter.p_min = 0.9
    budget = ConfidenceBudget(k=16, p_min=0.9)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    final = list(pipe.run(prompt, 40, stop_ids=set()))[-1]
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    assert final.stats.drafted < 16 * final.stats.steps  # some drafts stopped early


def test_confidence_bad_p_min():
    with pytest.raises(SpecpipeError, match="p_min"):
        ConfidenceBudget(p_min=1.5)


# ---------------------------------------------------------------- every budget is lossless


@pytest.mark.parametrize("budget_name", ["adaptive", "auto"])
@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_budgets_keep_greedy_output(budget_name, kind, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, *_ = generate(target, make_drafter("none", target), 1, prompt, 48)
    drafter = make_drafter(kind, target, draft)
    budget = AdaptiveBudget(k=2, k_max=32) if budget_name == "adaptive" else prepared(AutoBudget(), target, drafter)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    final = list(pipe.run(prompt, 48, stop_ids=set()))[-1]
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
