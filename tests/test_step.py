"""The one step (core/step.py) and the plan protocol (core/plan.py): what a budget plans reaches the drafter,
a drafter's tree support is a property, and the one forward takes one row until batching lands."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import first_difference, generate, make_drafter, noisy_copy, tiny

from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.protocols import BudgetBase, DrafterBase
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.core.step import Row, forward_rows
from specpipe.drafters.chain import ChainStop
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.ngram import NgramDrafter
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RunFinished
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

MAX_TOKENS = 24
SHAPE = TreeShape(kind="dynamic", nodes=8, depth=4, branching=[2] * 4)


class PlannedBudget(BudgetBase):
    """Plans every step as `plan` says (the chain stop, the lookup share), whatever the room allows."""

    name = "planned"

    def __init__(self, plan: StepPlan):
        self._plan = plan

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        return self._plan.capped(room)

    def observe(self, drafted, accepted, *, draft_s=None, verify_s=None, draft=None) -> None:
        pass


class RecordingNgram(NgramDrafter):
    """An n-gram drafter that keeps every plan it was given."""

    def __init__(self):
        super().__init__(min_n=1, max_n=3)
        self.plans: list[StepPlan] = []

    def propose(self, context_ids, plan):
        self.plans.append(plan)
        return super().propose(context_ids, plan)


def run(target, drafter, budget, prompt, tree=None):
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus(), tree=tree)
    events = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))
    assert isinstance(events[-1], RunFinished)
    return events[-1].token_ids, [e for e in events if isinstance(e, Drafted)]


@pytest.fixture(scope="module")
def setup():
    target = tiny("llama")
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)  # ends in a match
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS)
    return target, noisy_copy(target, scale=0.5), prompt, baseline


def test_the_budgets_plan_reaches_the_drafter(setup):
    target, _, prompt, baseline = setup
    stop = ChainStop(floor=0.25)
    drafter = RecordingNgram()
    got, _ = run(target, drafter, PlannedBudget(StepPlan(k=3, lookup_k=5, chain_stop=stop)), prompt)
    assert got == baseline
    first = drafter.plans[0]
    assert (first.k, first.lookup_k) == (3, 5) and all(p.chain_stop is stop for p in drafter.plans)
    cut = [p.lookup_k for p in drafter.plans if p.lookup_k < 5]  # cut to the room: tokens still wanted - the bonus
    assert cut and all(p.k <= p.lookup_k for p in drafter.plans if p.lookup_k < 3)


def test_a_plans_chain_stop_cuts_a_model_drafters_chain(setup):
    """A stop whose floor no chain reaches (hold rates 1.0 < floor 1.1) drafts one token a step instead of K."""
    target, draft, prompt, baseline = setup
    lengths = {}
    for name, stop in (("none", None), ("cut", ChainStop(floor=1.1))):
        drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other")
        got, drafted = run(target, drafter, PlannedBudget(StepPlan(k=4, chain_stop=stop)), prompt)
        assert got == baseline, first_difference(target, prompt, baseline, got)
        lengths[name] = max(len(d.draft_ids) for d in drafted)
    assert lengths == {"none": 4, "cut": 1}


def test_a_plans_lookup_k_lets_the_lookup_draft_at_k_0(setup):
    """K = 0 with lookup_k 8: a model drafter's prompt lookup drafts without a draft forward."""
    target, draft, prompt, baseline = setup
    for lookup_k, drafts in ((0, False), (8, True)):
        drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", lookup_min_n=2)
        got, drafted = run(target, drafter, PlannedBudget(StepPlan(k=0, lookup_k=lookup_k)), prompt)
        assert got == baseline
        assert any(d.draft_ids for d in drafted) is drafts
        assert all(d.forwards == 0 for d in drafted)  # only lookups: no draft forward ever ran


def test_a_drafter_without_trees_is_refused_by_its_property():
    """It has a propose_tree (DrafterBase's one-branch default); what refuses it is `supports_trees`."""
    target = tiny("llama")

    class ChainsOnly(NgramDrafter):
        supports_trees = False

    with pytest.raises(SpecpipeError) as err:
        tree_parts(target, ChainsOnly(), SHAPE)
    message = str(err.value)
    assert "tree=chain" in message and "\n" not in message and "draft=ngram cannot propose token trees" in message


def test_the_default_tree_is_the_chain_as_one_branch(setup):
    """A drafter that says it does trees but keeps DrafterBase's propose_tree verifies its chain as a tree."""
    target, _, prompt, baseline = setup

    class OneBranch(NgramDrafter):
        propose_tree = DrafterBase.propose_tree

    drafter = OneBranch(min_n=1, max_n=3)
    got, drafted = run(target, drafter, PlannedBudget(StepPlan(k=4)), prompt, tree_parts(target, drafter, SHAPE))
    assert got == baseline
    trees = [d for d in drafted if d.draft_ids]
    assert trees and all(d.tree_parents == list(range(-1, len(d.draft_ids) - 1)) for d in trees)


def test_rows_without_a_shared_batch_are_refused():
    """Several rows share one forward only as rows of one RaggedBatch (tests/test_batch.py); alone, one row."""
    target = tiny("llama")
    row = Row(
        context=[1, 2, 3],
        cache=target.make_cache(),
        drafter=make_drafter("none", target),
        budget=PlannedBudget(StepPlan()),
        comparator=GreedyComparator(),
        rollback=TrimRollback(),
        bonus=GreedyBonus(),
        detok=None,
        max_tokens=4,
        stop_ids=set(),
    )
    with pytest.raises(ValueError, match="2 rows without a shared batch"):
        forward_rows(target, [row, replace(row)], [None, None])


def test_capped_plans_never_pass_the_room():
    plan = StepPlan(k=8, lookup_k=16)
    assert plan.capped(3) == replace(plan, k=3, lookup_k=3) and plan.capped(20) is plan
    assert StepPlan.override(6, room=2).k == 2 and not StepPlan.override(6, room=2).fit
    assert StepPlan.first_token().decision.reason == "first token" and StepPlan.first_token().k == 0


def test_the_step_never_asks_where_a_row_lives():
    """One step for a lone row and a batched one: where a row's K/V lives is its storage's (core/storage.py), so
    neither the step nor the admission nor the finish branches on a batch."""
    import re

    import specpipe.core.admission
    import specpipe.core.finish
    import specpipe.core.step

    for module in (specpipe.core.step, specpipe.core.admission, specpipe.core.finish):
        code = Path(module.__file__).read_text()
        assert not re.search(r"\.batch\b|batch is (not )?None", code), module.__name__
