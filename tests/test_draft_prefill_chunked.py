"""A chunked draft prefill: the draft model reads the prompt a chunk per step while the free drafters draft.

Golden: greedy output equals the target decoding alone (draft=none) on an attention target and a hybrid
(Gated DeltaNet) one, with and without a prompt lookup drafting during the catch-up. An answer that ends
before the draft caught up leaves the rest of the prompt unread. budget=auto chooses it for a price table
where answers are either shorter than the catch-up or long, never on one expected length; a fixed
budget.draft_prefill is taken. DraftPrefilled.tokens counts what the draft model was fed (a window's, none).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import first_difference, noisy_copy, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.budgets.prefill_price import PrefillPrices, choose_prefill
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import DraftPrefill, StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, DraftPrefilled, RunFinished
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.trim import TrimRollback

PROMPT = "the cat sat on the mat, the cat sat on the hat; the dog sat on the log, the dog"  # 79 ids
CHUNK = 8
_SETUPS: dict = {}


class ChunkedFixed(FixedBudget):
    """K every step, the draft model prefilled `prefill` (a chunked one unless told)."""

    def __init__(self, k: int, prefill: DraftPrefill):
        super().__init__(k=k)
        self.prefill = prefill

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        plan = super().plan(cache_len, room, price)
        return replace(plan, lookup_k=plan.k, prefill=self.prefill)


def setup_for(arch: str, max_tokens: int = 40):
    """Target, noisy draft copy, prompt ids and the draft=none output (cached per arch)."""
    if arch not in _SETUPS:
        target = tiny(arch)
        draft = noisy_copy(target, scale=0.03 if arch == "qwen3_next" else 0.3)
        prompt = target.encode_prompt(PROMPT, chat=False)
        pipe = SpeculativePipeline(
            target, NoneDrafter(), FixedBudget(k=1), GreedyComparator(), rollback(arch), GreedyBonus()
        )
        final = list(pipe.run(prompt, max_tokens, stop_ids=set()))[-1]
        _SETUPS[arch] = (target, draft, prompt, final.token_ids)
    return _SETUPS[arch]


def rollback(arch: str):
    return CheckpointRollback() if arch == "qwen3_next" else TrimRollback()


def run(arch: str, budget, max_tokens: int = 40, lookup: int = 0, **drafter_kw):
    target, draft, prompt, baseline = setup_for(arch)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", lookup_min_n=lookup, **drafter_kw)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback(arch), GreedyBonus())
    events = list(pipe.run(prompt, max_tokens, stop_ids=set()))
    return target, prompt, baseline[:max_tokens], drafter, events


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
@pytest.mark.parametrize("lookup", [0, 2])
def test_greedy_output_equals_the_target_alone_while_the_draft_catches_up(arch, lookup):
    target, prompt, baseline, drafter, events = run(
        arch, ChunkedFixed(4, DraftPrefill("chunked", chunk=CHUNK)), lookup=lookup
    )
    final = events[-1]
    assert isinstance(final, RunFinished)
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    chunks = [e.tokens for e in events if isinstance(e, DraftPrefilled)]
    # the start reads nothing; then a chunk a step until the rest fits one chunk (the model's first draft feeds it)
    assert chunks[0] == 0 and set(chunks[1:]) == {CHUNK} and len(chunks) - 1 >= (len(prompt) - 1) // CHUNK - 1
    drafted = [e for e in events if isinstance(e, Drafted)]
    behind = [d for d in drafted if d.decision is not None and d.decision.reason == "draft catching up"]
    assert len(behind) == len(chunks) - 1 and not any(d.draft_forwards for d in behind)  # the model drafted nothing
    if lookup and arch == "llama":  # its answer repeats itself from the 6th token: the lookup finds it
        assert any(d.draft_ids for d in behind), "the prompt lookup drafts while the draft model catches up"
    assert final.stats.accepted > 0 and any(d.draft_forwards for d in drafted), "the model drafts once caught up"
    assert not drafter.catching_up


def test_an_answer_that_ends_first_leaves_the_rest_unread():
    steps = 4  # the first token, then 3 steps: 3 chunks of the prompt before the answer ends
    _, prompt, baseline, drafter, events = run("llama", ChunkedFixed(1, DraftPrefill("chunked", chunk=CHUNK)), steps)
    assert events[-1].token_ids == baseline
    read = sum(e.tokens for e in events if isinstance(e, DraftPrefilled))
    assert read == 3 * CHUNK == drafter.cached_len < len(prompt) - 1 and drafter.catching_up
    full = run("llama", ChunkedFixed(1, DraftPrefill("full")), steps)[4]
    assert [e.tokens for e in full if isinstance(e, DraftPrefilled)] == [
        len(prompt)
    ]  # the whole context but the newest


@pytest.mark.parametrize(
    "prefill, tokens",
    [(DraftPrefill("window", window=8, sinks=2), 10), (DraftPrefill("none"), 0), (DraftPrefill("full"), 79)],
)
def test_draft_prefilled_counts_what_the_draft_model_was_fed(prefill, tokens):
    _, prompt, baseline, _, events = run("llama", ChunkedFixed(2, prefill), 8)
    assert events[-1].token_ids == baseline and len(prompt) == 79
    assert [e.tokens for e in events if isinstance(e, DraftPrefilled)] == [tokens]  # the context is 80 by then


def prices(**kw) -> PrefillPrices:
    table = {"prompt_len": 800, "tokens": 102.5, "prefill": 0.02, "saving": 0.3, "chunk": 64} | kw
    return PrefillPrices(**table)


@pytest.mark.parametrize(
    "table, kind",
    [
        (prices(answers=(5, 200)), "chunked"),  # the docstring's example: +16.85 against full's +14.75
        (prices(), "full"),  # the same mean as one expected length: chunked only delays the same bet
        (prices(tokens=20), "none"),
        (prices(answers=(40, 165)), "full"),  # both answers outlast the 13-step catch-up: it only costs drafts
        (prices(answers=(5, 200), chunk=0), "full"),  # no chunked option
        (prices(answers=(5, 200), chunk=1000), "full"),  # a prompt shorter than a chunk: nothing to spread
        (prices(answers=(2, 3)), "none"),
    ],
)
def test_the_choice_for_a_price_table_with_chunks(table, kind):
    choice = choose_prefill(table)
    assert choice.kind == kind, choice
    assert choice.net is not None and choice.net[kind] == max(choice.net.values())
    assert (choice.chunk > 0) == (kind == "chunked")


def test_the_example_figures_and_a_fixed_choice():
    choice = choose_prefill(prices(answers=(5, 200)))
    assert choice.net == {"none": 0.0, "chunked": 16.85, "full": 14.75} and choice.tokens == 102.5
    assert choice.label().startswith("draft prefill chunked 64 (net +16.9 steps; ")
    assert choose_prefill(prices(tokens=20), fixed="chunked").kind == "chunked"
    assert choose_prefill(prices(), fixed="window").kind == "full"  # no window option offered: the priced one


def test_auto_takes_the_users_fixed_choice_and_stays_lossless():
    budget = AutoBudget(draft_prefill="chunked", prefill_chunk_steps=1.0)
    target, draft, _, _ = setup_for("llama")
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other")
    budget = prepared(budget, target, drafter)
    budget._prefill_cost = 1.0 / CHUNK  # a chunk of CHUNK tokens costs one target step
    _, prompt, baseline, _, events = run("llama", budget)
    assert events[-1].token_ids == baseline
    assert budget.prefill_choice is not None and budget.prefill_choice.kind == "chunked"
    assert budget.prefill_choice.chunk == CHUNK
    assert events[-1].stats.draft_prefill.startswith(f"draft prefill chunked {CHUNK}")
    with pytest.raises(SpecpipeError, match="budget.draft_prefill=half"):
        AutoBudget(draft_prefill="half")


def test_auto_prices_chunks_from_the_earlier_answers_sample():
    assert AutoBudget()._prefill_prices(800, room=500).chunk == 0  # off by default: no chunked option priced
    b = AutoBudget(prefill_chunk_steps=1.0)
    b._prefill_cost = 0.02
    for n in (5, 200, 5, 200):
        b.start_request()
        b._answer_tokens = n
    b.start_request()
    p = b._prefill_prices(800, room=500)
    assert p.chunk == 50 and p.answers == (5, 200, 5, 200) and p.window == 256 and p.window_keeps == 0.5
    assert b._prefill_prices(800, room=100).answers == (5, 101, 5, 101)  # cut to this request's room
