"""budget=auto sizes each n-gram draft by how long its match was.

On the code suite (SmolLM2, 96 tokens, K = 16) a draft from a 1-token match had its first token accepted
30% of the time and 1.0 tokens accepted on average, one from a 4-token match 87% and 7.5: pooled rates make
one K too long for the first and too short for the second (docs/benchmarks/log/2026-12-01-auto-match-length.md)."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.calibration import interpolate
from specpipe.drafters.ngram import NgramDrafter
from specpipe.events import Drafted
from specpipe.rollbacks.trim import TrimRollback

# T(n)/T(1) of SmolLM2 with two OpenBLAS threads (quiet, 2026-12-01)
OPENBLAS_LIKE = interpolate({1: 1.0, 2: 1.16, 3: 1.13, 5: 1.35, 9: 1.31, 17: 1.67, 33: 2.51})


def free_budget() -> AutoBudget:
    b = AutoBudget(k_max=16)
    b.ratio, b.c, b.hindsight = OPENBLAS_LIKE, 0.0, True
    return b


def test_long_matches_get_long_drafts_and_one_token_matches_none():
    b = free_budget()
    for _ in range(20):  # long matches hold entirely, one-token matches never
        b.next_k()
        b.observe(b.fit_k(4, 16), b.k)
        b.next_k()
        b.observe(b.fit_k(1, 16), 0)
    assert b.next_k() == 16 and b.decision.reason == "cap"  # a free drafter proposes all it can
    assert b.fit_k(4, 16) >= 12 and b.decision.evidence == 4
    assert b.fit_k(1, 16) == 0 and b.decision.reason == "plain"
    assert b.hindsight_k > 0  # the plain step still looks back: the class keeps learning for free


def test_a_new_class_starts_from_the_pooled_rates_and_a_free_draft_is_never_one_token():
    b = free_budget()
    for _ in range(10):
        b.next_k()
        b.observe(b.fit_k(2, 16), 3)  # class 2: the first three tokens hold
    pooled = (b.alpha, b.continuation)
    b.next_k()
    k = b.fit_k(3, 16)  # never seen: priced on the pooled rates (its continuation thin: tested long, test_auto_sizing)
    first, nxt = b.rates.of_class(3)
    assert (first[0] / sum(first), nxt[0] / sum(nxt)) == (pytest.approx(pooled[0]), pytest.approx(pooled[1]))
    assert b.decision.alpha == round(pooled[0], 4) and b.decision.continuation >= round(pooled[1], 4)
    assert k != 1


def test_hindsight_counts_for_the_class_of_the_look_back():
    b = free_budget()
    b.next_k()
    b.fit_k(1, 16)
    before = b.decision.alpha
    for _ in range(10):
        b.observe_hindsight(2, 2, evidence=1)
    b.next_k()
    b.fit_k(1, 16)
    assert b.decision.alpha > before


def test_ngram_reports_the_length_of_its_match():
    d = NgramDrafter(min_n=1, max_n=3)
    d.prefill([5, 6, 7, 8, 5, 6, 7])
    assert d.propose([5, 6, 7, 8, 5, 6, 7], StepPlan(k=2)).token_ids == [8, 5] and d.last_evidence == 3
    d.prefill([1, 2, 3])
    assert d.propose([1, 2, 3], StepPlan(k=2)).token_ids == [] and d.last_evidence is None
    d.prefill([9, 4, 9])
    assert d.propose([9, 4, 9], StepPlan(k=2)).token_ids == [4, 9] and d.last_evidence == 1


def test_auto_with_ngram_classes_is_lossless_and_logs_each_class(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    target = tiny("llama")
    prompt = target.encode_prompt("one two three four, one two three four, one two three", chat=False)
    baseline, *_ = generate(target, make_drafter("none", target), 1, prompt, 48)
    drafter = make_drafter("ngram", target)
    budget = prepared(AutoBudget(), target, drafter)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    for _ in range(2):  # the second run starts from the classes the first one learned
        events = list(pipe.run(prompt, 48, stop_ids=set()))
        assert events[-1].token_ids == baseline, first_difference(target, prompt, baseline, events[-1].token_ids)
    fitted = [e for e in events if isinstance(e, Drafted) and e.decision and e.decision.evidence is not None]
    assert fitted, "no draft was sized by its class"
    for e in fitted:
        assert len(e.draft_ids) == e.decision.k <= e.k and 1 <= e.decision.evidence <= drafter.max_n


def test_where_no_class_pays_the_steps_stay_plain_and_look_back():
    """Prose: sizing every draft by its class drafted 80 tokens at 2% acceptance (0.93x of plain); the steps
    stay plain and look back while no class's rates say a draft pays."""
    b = free_budget()
    b.next_k()
    b.observe(b.fit_k(4, 16), 0)  # a long match missed
    for _ in range(30):
        b.observe_hindsight(2, 0, evidence=1)  # and nothing the n-gram guesses is right
        b.observe_hindsight(2, 0, evidence=4)
    assert b.next_k() == 0 and b.decision.reason == "plain" and b.hindsight_k > 0


def test_a_class_that_holds_drafts_while_weak_classes_pull_the_pooled_rates_under_plain():
    """rag-521 (SmolLM2, a 43-token answer): one-token matches missed, their look backs pulled the pooled
    first-token rate to 0.1 and auto stopped asking the n-gram, while 2-token matches held 7 of 9 times
    (0.97x of plain; fixed K = 2 1.45x). The class in hand decides, not the pool."""
    b = free_budget()
    for _ in range(3):
        b.next_k()
        b.observe(b.fit_k(2, 16), b.k)  # 2-token matches hold
    for _ in range(30):
        b.observe_hindsight(2, 0, evidence=1)  # one-token matches never do
    assert b._best(b.alpha) == 0  # pooled, drafting does not pay
    assert b.next_k() == 16 and b.decision.reason == "cap"  # the n-gram is still asked
    assert b.fit_k(2, 16) >= 2 and b.decision.evidence == 2
    assert b.fit_k(1, 16) == 0 and b.decision.reason == "plain" and b.hindsight_k > 0


def test_a_one_token_draft_is_lengthened_only_where_the_longer_one_still_beats_plain():
    """ "Never one free token alone" drafted K = 2 at a predicted 0.92-0.98 on prose-letter (0.95x of plain):
    where the second token's verify is dear, a class whose rates pay for one token keeps one."""
    from specpipe.costmodel.calibration import expected_speedup

    b = free_budget()
    b.ratio = interpolate({1: 1.0, 2: 1.05, 3: 1.3, 5: 1.4, 9: 1.5, 17: 1.8, 33: 2.6})
    for _ in range(3):
        b.observe_hindsight(2, 1, evidence=1)  # the first token holds now and then, the second never
        for _ in range(4):
            b.observe_hindsight(2, 0, evidence=1)
    b.next_k()
    k = b.fit_k(1, 16)
    rates = (b.decision.alpha, b.decision.continuation)
    assert (
        expected_speedup(*rates[:1], 1, 0.0, b.ratio, rates[1])
        > 1.0
        > expected_speedup(rates[0], 2, 0.0, b.ratio, rates[1])
    ), rates
    assert k == 1

    b.ratio = OPENBLAS_LIKE  # the second token's verify costs next to nothing: the one-token draft grows
    b.next_k()
    assert b.fit_k(1, 16) == 2
