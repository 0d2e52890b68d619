"""A first token as fast as plain decoding's with a draft model (issue 33): the first step is plain and the
draft model prefills after its token is out (a DraftPrefilled event), the output stays the target's own,
and the deferred prefill counts as prefill, not as decoding. draft.model=self keeps its every-step-accepts-K
invariant by prefilling first, as before."""

from __future__ import annotations

import pytest
from conftest import generate, make_drafter, pair_with_baseline

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.events import Drafted, DraftPrefilled, Emitted, PrefillDone
from specpipe.metrics import StatsCollector
from specpipe.rollbacks.trim import TrimRollback


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
    assert events[prefilled].tokens == len(prompt)  # the prompt and the first token, but the newest token
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


class _PlainThenK(FixedBudget):
    """Plain steps first (a budget judging that drafting does not pay, or a batch decoding plain), then K."""

    def __init__(self, plain_steps: int, k: int):
        super().__init__(k=k)
        self.plain_steps, self.planned = plain_steps, 0

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        self.planned += 1
        return StepPlan(k=0) if self.planned <= self.plain_steps else super().plan(cache_len, room, price)


def test_the_draft_prefills_only_when_its_row_first_drafts(setup):
    """Steps the budget makes plain need no draft: its prefill waits for the first step that drafts (a batch of
    8 rows decoding plain on a CPU stalled for every joining row's draft prefill), over the context by then."""
    target, draft, prompt, baseline = setup
    pipe = SpeculativePipeline(
        target,
        make_drafter("model", target, draft),
        _PlainThenK(5, 4),
        GreedyComparator(),
        TrimRollback(),
        GreedyBonus(),
    )
    events = list(pipe.run(prompt, 24, stop_ids=set()))
    assert events[-1].token_ids == baseline[:24]
    prefilled = [e for e in events if isinstance(e, DraftPrefilled)]
    assert len(prefilled) == 1 and prefilled[0].tokens == len(prompt) + 5  # the first token, 5 plain ones
    drafted = [e for e in events if isinstance(e, Drafted)]
    assert [d.k for d in drafted[:7]] == [0, 0, 0, 0, 0, 0, 4]
    assert events.index(prefilled[0]) < events.index(drafted[6])
    plain = SpeculativePipeline(
        target,
        make_drafter("model", target, draft),
        _PlainThenK(10**6, 4),
        GreedyComparator(),
        TrimRollback(),
        GreedyBonus(),
    )
    never = list(plain.run(prompt, 24, stop_ids=set()))
    assert never[-1].token_ids == baseline[:24] and not any(isinstance(e, DraftPrefilled) for e in never)
