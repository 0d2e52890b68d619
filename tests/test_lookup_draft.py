"""`draft=model draft.lookup_min_n=n`: a prompt lookup in front of the draft model.

Where the context's last n+ tokens occurred earlier, what followed them is the draft and no draft forward
runs; elsewhere the model drafts. Both must leave the output equal to the target decoding alone, and
budget=auto must price the lookup's drafts as free without letting them change the model's cost or rates.
"""

from __future__ import annotations

import pytest
from conftest import first_difference, noisy_copy, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.core.stages.draft import Draft
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RunFinished
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


def run(target, drafter, budget, prompt, max_tokens, tree: TreeShape | None = None):
    rollback = TrimRollback()
    step = tree_parts(target, drafter, tree) if tree else None
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback, GreedyBonus(), tree=step)
    events = list(pipe.run(prompt, max_tokens, stop_ids=set()))
    assert isinstance(events[-1], RunFinished)
    return events[-1].token_ids, [e for e in events if isinstance(e, Drafted)]


def lookup_drafter(target, draft, min_n=2):
    return ModelDrafter(target=target, load=lambda **_: draft, model="other", lookup_min_n=min_n)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_lookup_then_model_drafts_are_lossless_and_lookups_run_no_draft_forward(arch, budget):
    target = tiny(arch)
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt, 40)
    drafter = lookup_drafter(target, draft)
    b = FixedBudget(k=6) if budget == "fixed" else prepared(AutoBudget(), target, drafter)
    got, drafted = run(target, drafter, b, prompt, 40)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    lookups = [e for e in drafted if e.draft_ids and e.forwards == 0]
    modelled = [e for e in drafted if e.draft_ids and e.forwards > 0]
    assert lookups, "the repeated prompt gives the lookup matches: some drafts must cost no forward"
    assert modelled or budget == "auto", "fixed K: steps without a match fall back to the model"


def test_the_lookup_leaves_the_model_fewer_forwards_for_the_same_tokens():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    plain_model = ModelDrafter(target=target, load=lambda **_: draft, model="other")
    with_model, _ = run(target, plain_model, FixedBudget(k=6), prompt, 40)
    hybrid = lookup_drafter(target, draft)
    with_lookup, _ = run(target, hybrid, FixedBudget(k=6), prompt, 40)
    assert with_lookup == with_model
    assert hybrid.forwards < plain_model.forwards


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_tree_takes_the_lookup_trie_where_the_context_matched(arch):
    target = tiny(arch)
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt, 32)
    drafter = lookup_drafter(target, draft)
    shape = TreeShape(kind="dynamic", nodes=8, depth=4, branching=[3] * 4)
    got, drafted = run(target, drafter, FixedBudget(k=8), prompt, 32, tree=shape)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert any(e.draft_ids and e.forwards == 0 for e in drafted)


def _lookup(k: int, evidence: int | None) -> Draft:
    """A draft of a model drafter with a lookup in front, as the step hands it to the budget."""
    return Draft(token_ids=list(range(k)), evidence=evidence)


def test_auto_prices_lookup_drafts_free_and_keeps_them_out_of_the_models_rates_cost_and_stop():
    b = AutoBudget(k_max=16)
    b.ratio = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}
    b.c, b.rates.lookup_classes = 0.4, True  # what prepare notes of a drafter whose evidence is free
    for _ in range(6):  # the model: first token right, second wrong
        b.next_k()
        b.observe(min(b.k, 4), 1, draft_s=0.04, verify_s=0.1, draft=_lookup(min(b.k, 4), None))
    model = (b.alpha, b.continuation, b.c, b.costs.returned)
    for _ in range(10):  # lookups of class 4 hold entirely
        b.next_k()
        k = b.fit_k(4, 16)
        assert b.decision.c == 0.0 and b.decision.evidence == 4  # priced without a draft cost
        b.observe(k, k, draft_s=0.0001, verify_s=0.1, draft=_lookup(k, 4))
    assert (b.alpha, b.continuation, b.c, b.costs.returned) == model  # returned: the chain stop's S, so its floor too
    b.next_k()
    assert b.fit_k(4, 16) >= 8  # a free, always-right class drafts long


def test_an_override_step_that_drew_a_lookup_does_not_teach_the_model_cost():
    b = AutoBudget(k_max=16)
    b.ratio = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}
    b.c, b.rates.lookup_classes = 0.4, True
    for _ in range(5):  # no fit ran (the step's K was set by hand), the draft was still a lookup (class 3)
        b.observe(4, 4, draft_s=0.0001, verify_s=0.1, draft=_lookup(4, 3))
    assert b.c == 0.4


def test_auto_lookups_draft_past_the_models_k_and_are_logged_as_free():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt, 48)
    drafter = lookup_drafter(target, draft)
    b = prepared(AutoBudget(k_max=16), target, drafter)
    got, drafted = run(target, drafter, b, prompt, 48)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    lookups = [e for e in drafted if e.draft_ids and e.forwards == 0]
    assert lookups and all(e.decision.c == 0.0 and e.decision.evidence for e in lookups)
    assert all(e.decision.c > 0 for e in drafted if e.forwards > 0)  # model steps keep the model's cost


def test_lookup_min_n_out_of_range_is_refused_in_one_line():
    target = tiny("llama")
    with pytest.raises(SpecpipeError, match="draft.lookup_min_n=99 is out of range"):
        ModelDrafter(target=target, load=None, model="self", lookup_min_n=99)


def test_a_lookup_may_draft_past_the_models_k_when_the_budget_allows():
    target = tiny("llama")
    drafter = lookup_drafter(target, noisy_copy(target, scale=0.5))
    ids = target.encode_prompt(PROMPT, chat=False)
    drafter.prefill(ids)
    assert (
        drafter.propose(ids, StepPlan(k=0)).token_ids == []
    )  # fixed budgets: lookup_k 0, the step's K caps the lookup
    assert len(drafter.propose(ids, StepPlan(k=2)).token_ids) == 2
    # auto: up to k_max, even at K = 0, and no draft forward
    assert len(drafter.propose(ids, StepPlan(k=0, lookup_k=8)).token_ids) > 2 and drafter.forwards == 0
