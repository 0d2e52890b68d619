"""budget=auto's chain stop (drafters/chain.py ChainStop): a model drafter stops inside K where its own
confidence in the chain, read through hold rates measured on this run's verified drafts, says one more
token would cost more than it returns. Greedy output stays the target's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import generate, make_drafter, noisy_copy, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.calibration import interpolate
from specpipe.drafters.chain import BUCKETS, ChainStop, chain
from specpipe.events import Drafted
from specpipe.rollbacks.trim import TrimRollback

VOCAB = 8


def logits_with_top(p: float) -> mx.array:
    """[1, VOCAB] logits whose softmax puts p on token 0 and spreads the rest evenly."""
    rest = (1 - p) / (VOCAB - 1)
    return mx.log(mx.array([[p] + [rest] * (VOCAB - 1)], dtype=mx.float32))


def test_the_chain_drops_a_computed_token_whose_confidence_bucket_is_not_worth_its_verify_slot():
    tops = [0.95, 0.9, 0.8, 0.9, 0.9]  # chain confidence 0.95, 0.855, 0.684, 0.616, 0.554
    hold = tuple(0.2 if b < 6 else 0.95 for b in range(BUCKETS))  # chains under 0.6 rarely hold
    seen: list[float] = []
    tokens, _ = chain(lambda i, y: logits_with_top(tops[i]), 5, stop=ChainStop(0.5, hold, keep=0.3), tops=seen)
    assert len(tokens) == 4  # the fifth token's chain (0.554) falls in a bucket that holds 20% of the time
    assert seen == pytest.approx(tops)  # the cut token's top probability is reported too: it was computed


def test_a_token_under_the_floor_is_kept_but_no_forward_is_spent_after_it():
    """Its forward is paid: it costs only its verify slot (keep). The next token's chain can hold no likelier,
    and would cost a forward besides (floor): the chain ends without computing it."""
    tops = [0.95, 0.9, 0.6, 0.9, 0.9]  # chain confidence 0.95, 0.855, 0.513, ...
    hold = tuple(0.4 if b < 6 else 0.95 for b in range(BUCKETS))
    calls: list[int] = []

    def next_logits(i, y):
        calls.append(i)
        return logits_with_top(tops[i])

    tokens, _ = chain(next_logits, 5, stop=ChainStop(0.5, hold, keep=0.3))
    assert len(tokens) == 3 and calls == [0, 1, 2]  # 0.4 clears keep, not floor: kept, then no fourth forward


def test_the_first_token_is_drafted_however_unsure_and_nothing_after_it():
    calls: list[int] = []

    def next_logits(i, y):
        calls.append(i)
        return logits_with_top(0.15)

    tokens, _ = chain(next_logits, 4, stop=ChainStop(0.9, (0.0,) * BUCKETS, keep=0.5))
    assert len(tokens) == 1 and calls == [0]  # no second forward whose token could only be dropped


def test_no_stop_drafts_all_k_and_reads_nothing_on_the_host():
    seen: list[float] = []
    tokens, _ = chain(lambda i, y: logits_with_top(0.15), 4, tops=seen)
    assert len(tokens) == 4 and seen == []


def test_hold_rates_learn_where_the_drafts_confidence_fails():
    """Before evidence every tenth is trusted optimistically (the draft's confidence as it is, plus one
    standard error): nothing is cut for lack of data. After chains at confidence 0.36 kept failing and
    chains at 0.9 kept holding, the stop cuts the first and keeps the second."""

    b = AutoBudget(k_max=16)
    b.ratio = interpolate({1: 1.0, 2: 1.02, 3: 1.29, 5: 1.22, 9: 1.43, 17: 1.76, 33: 2.6})
    b.c, b.rates.first, b.rates.next = 0.30, [9.0, 1.0], [9.0, 1.0]
    b.next_k()
    before, floor = b.rates.hold_rates(), b.chain_stop.floor
    assert before[3] > floor > 0.3
    for _ in range(12):
        b.next_k()
        draft = Draft(token_ids=[5, 6], tops=[0.9, 0.4])  # chain confidence 0.9, then 0.36
        b.observe(2, 1, draft=draft)  # the first held, the second did not
    after = b.rates.hold_rates()
    assert after[3] < b.chain_stop.floor and after[9] > 0.9
    assert list(after) == sorted(after)  # never falls as the confidence rises


def test_a_free_drafter_gets_no_stop():
    b = AutoBudget(k_max=16)
    b.ratio = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 34)}
    b.c, b.rates.first = 0.0, [9.0, 1.0]
    assert b.next_k() > 0 and b.chain_stop is None and b.decision.floor == 0.0


class PinnedCosts(AutoBudget):
    """auto with its draft cost c and verify curve held where the test put them: a tiny model's forwards take
    about a millisecond, and one descheduled step once moved them far enough that auto chose K = 1 throughout
    (a full run of the suite: no draft to cut). The rates and the chain stop still learn as in a run."""

    def observe(self, *args, **kwargs) -> None:
        c, curve = self.c, self.costs.curve
        super().observe(*args, **kwargs)
        self.c, self.costs.curve = c, curve


def test_auto_cuts_drafts_and_stays_lossless(tmp_path, monkeypatch):
    """A tiny draft's flat distributions put its chains in the lowest buckets: auto cuts them, a cut spends at
    most the one forward of the token it dropped (shown as wasted), and the tokens are the target's alone."""
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, *_ = generate(target, make_drafter("none", target), 1, prompt, 40)
    drafter = make_drafter("model", target, draft)
    budget = prepared(PinnedCosts(k_max=8), target, drafter)
    budget.ratio = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 34)}  # not this run's millisecond timings
    # drafting pays (K > 1), and a draft token costs enough that an unsure one is not worth its forward
    budget.c, budget.rates.first, budget.rates.next = 0.3, [9.0, 1.0], [9.0, 1.0]
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    events = list(pipe.run(prompt, 40, stop_ids=set()))
    assert events[-1].token_ids == baseline
    cut = [e for e in events if isinstance(e, Drafted) and 0 < len(e.draft_ids) < e.k]
    assert cut and all(e.wasted_forwards <= 1 and e.decision.floor > 0 for e in cut)
