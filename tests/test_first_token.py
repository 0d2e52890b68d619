"""A first token as fast as plain decoding's with a draft model (issue 33): the first step is plain and the
draft model prefills after its token is out (a DraftPrefilled event), the output stays the target's own,
and the deferred prefill counts as prefill, not as decoding. draft.model=self keeps its every-step-accepts-K
invariant by prefilling first, as before."""

from __future__ import annotations

import pytest
from conftest import generate, make_drafter, pair_with_baseline

from specpipe.events import Drafted, DraftPrefilled, Emitted, PrefillDone
from specpipe.metrics import StatsCollector


@pytest.fixture(scope="module")
def setup():
    return pair_with_baseline("llama", 24)


@pytest.mark.parametrize("k", [1, 4])
def test_the_first_token_comes_before_the_draft_prefills_and_output_is_unchanged(setup, k):
    target, draft, prompt, baseline = setup
    got, final, events, _ = generate(target, make_drafter("model", target, draft), k, prompt, 24)
    assert got == baseline[:24]
    kinds = [type(e) for e in events]
    first_emit, prefilled = kinds.index(Emitted), kinds.index(DraftPrefilled)
    assert first_emit < prefilled  # the token went out, then the draft read the prompt
    assert kinds.count(DraftPrefilled) == 1
    done = next(e for e in events if isinstance(e, PrefillDone))
    assert done.draft_seconds == 0.0
    first = next(e for e in events if isinstance(e, Drafted))
    assert first.step == 1 and first.k == 0 and first.decision.reason == "first token"
    assert events[prefilled].tokens == len(prompt) + 1  # the prompt and the first token
    assert final.stats.draft_prefill_s == events[prefilled].seconds > 0


def test_a_one_token_answer_never_prefills_the_draft(setup):
    target, draft, prompt, baseline = setup
    got, _, events, _ = generate(target, make_drafter("model", target, draft), 4, prompt, 1)
    assert got == baseline[:1] and not any(isinstance(e, DraftPrefilled) for e in events)


def test_self_draft_still_prefills_first_and_accepts_every_step(setup):
    target, _, prompt, baseline = setup
    got, _, events, _ = generate(target, make_drafter("self", target), 4, prompt, 10)
    assert got == baseline[:10] and not any(isinstance(e, DraftPrefilled) for e in events)
    assert next(e for e in events if isinstance(e, Drafted)).k == 4


def test_the_deferred_prefill_is_prefill_not_decoding():
    collector = StatsCollector()
    collector.consume(PrefillDone(t=1.0, tokens=10, seconds=1.0, target_seconds=1.0))
    collector.consume(Emitted(t=1.5, step=1, token_ids=[5], text="a", from_draft=0, token_texts=["a"]))
    collector.consume(DraftPrefilled(t=3.5, tokens=11, seconds=2.0))
    collector.consume(Emitted(t=4.0, step=2, token_ids=[6, 7, 8], text="bcd", from_draft=2, token_texts=list("bcd")))
    stats = collector.stats()
    assert stats.ttft_s == 1.5 and stats.draft_prefill_s == 2.0
    assert stats.decode_tok_s == pytest.approx(4 / 1.0)  # 3 s after the prefill, 2 of them the draft's prefill
