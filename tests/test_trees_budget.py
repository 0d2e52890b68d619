"""Tree budgets (specpipe/trees/budget.py): a fixed budget caps the nodes a tree verifies,
budget=auto sizes trees from measured acceptance priced through T(n)/T(1), falls back to
plain steps (0 nodes) when nothing pays, logs every choice, and stays lossless."""

from __future__ import annotations

import pytest
from conftest import make_drafter, pair_with_baseline, prepared

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.budgets.rates import FORGET, PRIOR_TRIALS
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import TreePricing
from specpipe.core.protocols import BudgetBase
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.events import Drafted
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.budget import TreeGains, TreeSizer
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree

MAX_TOKENS = 40
SHAPE = TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6)
GAINS = TreeGains(min_gain=0.03, thin_gain=0.10)  # conf/tree/dynamic.yaml's tree.min_gain / tree.thin_gain


class _Auto(BudgetBase):
    """A budget that prices trees as auto does, with chosen numbers (the worked example in trees/budget.py):
    the sizer sees it only through `tree_pricing()`, as it sees AutoBudget."""

    name = "priced"
    alpha, continuation, c = 0.6, 5 / 6, 0.0

    def __init__(self, ratio, timing_due=False):
        self.ratio, self.timing_due = ratio, timing_due

    def tree_pricing(self) -> TreePricing:
        return TreePricing(
            alpha=self.alpha,
            continuation=self.continuation,
            prior_trials=PRIOR_TRIALS,
            forget=FORGET,
            draft_cost=self.c,
            verify_curve=self.ratio,
            timing_due=self.timing_due,
            probe_k=2,
            probe_every=8,
            probe_max=64,
        )

    def observe(self, *a, **kw):
        pass


def _example_tree() -> TokenTree:
    t = TokenTree()
    a = t.add(5, -1, 1.0)
    t.add(6, a, 0.5)
    t.add(7, -1, 0.2)
    return t


def test_worked_example_chooses_three_nodes_and_a_steep_curve_chooses_none():
    flat = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15}
    sizer = TreeSizer(_Auto(flat), SHAPE, free=True, gains=GAINS)
    sizer.accepted, sizer.scored = {1: 0.6 * 98, 2: 0.5 * 98}, {1: 98.0, 2: 98.0}  # lambda ~ [0.6, 0.5]
    assert sizer.size(_example_tree(), draft_forwards=0) == 3
    assert sizer.decision.k == 3 and sizer.decision.reason == "tree cost model"
    assert sizer.decision.predicted == pytest.approx(1.97 / 1.15, abs=0.01)
    steep = TreeSizer(_Auto({n: float(n) for n in range(1, 5)}), SHAPE, free=True, gains=GAINS)
    steep.accepted, steep.scored = sizer.accepted, sizer.scored
    assert steep.size(_example_tree(), draft_forwards=0) == 0 and steep.decision.reason == "tree plain"


def _one_node(score: float) -> TokenTree:
    t = TokenTree()
    t.add(5, -1, score)
    return t


@pytest.mark.parametrize(
    "score, timing_due, nodes, reason",
    [
        (0.20, False, 0, "tree plain"),  # 1.02 tokens per unit of cost: within the estimates' error
        (0.26, False, 1, "tree cost model"),  # 1.05: verified while T(1) is well timed
        (0.26, True, 0, "tree plain (timing T(1))"),  # 1.05 on a stale T(1): a plain step times it
        (0.90, True, 1, "tree cost model"),  # 1.5: a clear gain does not wait for the timing
    ],
)
def test_a_thin_predicted_gain_stays_plain_or_times_t1_first(score, timing_due, nodes, reason):
    """One node at depth 1, lambda 0.6, T(2)/T(1) = 1.1: tokens 1 + 0.6 * score over 1.1."""
    sizer = TreeSizer(_Auto({1: 1.0, 2: 1.1, 3: 1.2}, timing_due), SHAPE, free=True, gains=GAINS)
    sizer.accepted, sizer.scored = {1: 0.6 * 98}, {1: 98.0}
    assert sizer.size(_one_node(score), draft_forwards=0) == nodes
    assert sizer.decision.reason == reason


def test_the_prior_fades_as_unaccepted_trees_come_in(monkeypatch):
    """Auto's prior (alpha 0.6) weighs two trials before any tree; after 20 one-node trees of score 0.1,
    none accepted, the evidence outweighs it and a node of score 0.3 is not worth a verify at T(2)/T(1)
    = 1.06 (1 + 0.13 * 0.3 = 1.04 tokens for 1.06); with the prior's weight held at two trials it still
    was (lambda 0.42: 1.13 tokens, 1.06x)."""
    import specpipe.trees.budget as tree_budget

    def sizer_after_20_misses() -> TreeSizer:
        sizer = TreeSizer(_Auto({1: 1.0, 2: 1.06, 3: 1.12}), SHAPE, free=True, gains=GAINS)
        assert sizer._lambda(1, sizer.budget.tree_pricing()) == pytest.approx(0.6)
        for _ in range(20):
            sizer.observe(_one_node(0.1), [], draft_s=0.0, verify_s=0.01, depth=1)
        return sizer

    faded = sizer_after_20_misses()
    p = faded.budget.tree_pricing()
    assert faded._lambda(1, p) < 0.15 and faded._reach(1, p) < 0.02
    assert faded.size(_one_node(0.3), draft_forwards=0) == 0
    monkeypatch.setattr(tree_budget, "PRIOR_FADES", False)
    fixed = sizer_after_20_misses()
    assert fixed._lambda(1, p) > 0.4 and fixed._reach(1, p) > 0.1
    assert fixed.size(_one_node(0.3), draft_forwards=0) == 1


def test_a_paid_draft_judged_not_worth_verifying_is_followed_by_a_verified_probe():
    """A drafter that costs forwards (c = 0.02): the reach rates say drafting pays (plan), the head's steady
    0.84 score says a verify does not quite (size: 1 + 0.6 * 0.84 over T(2)/T(1) = 1.5 is under 1.03).
    Without the probe after a discarded draft it drafted all 200 steps and verified none (helper review);
    with it every other draft is verified, acceptance is learned, and verifies take over."""
    sizer = TreeSizer(
        _Auto({1: 1.0, 2: 1.5, 3: 1.9}),
        TreeShape(kind="dynamic", nodes=2, depth=1, branching=[2]),
        free=False,
        gains=GAINS,
    )
    sizer.budget.c = 0.02
    drafted = verified = 0
    for _ in range(200):
        shape, probing = sizer.plan()
        if shape is None:
            sizer.observe(TokenTree(), [], draft_s=0.0, verify_s=0.01, depth=0)
            continue
        drafted += 1
        n = sizer.size(_one_node(0.84), draft_forwards=1, probing=probing)
        tree = sizer.cut(_one_node(0.84), n) if n else TokenTree()
        verified += n > 0
        sizer.observe(tree, [0] if n else [], draft_s=0.0, verify_s=0.01, depth=1)  # accepted when verified
    assert drafted > 0 and verified >= drafted - 5  # a few discarded drafts while lambda learns, then verifies


def test_auto_asks_for_a_plain_timing_until_it_has_a_few_and_again_when_stale():
    budget = AutoBudget()
    budget.ratio = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 18)}
    assert budget.plain_timing_due()  # nothing timed yet
    for _ in range(3):
        budget.observe(0, 0, verify_s=0.08)  # plain steps
    assert not budget.plain_timing_due()
    for _ in range(31):
        budget.observe(1, 0, verify_s=0.085)  # one-token verifies
    assert not budget.plain_timing_due()
    budget.observe(1, 0, verify_s=0.085)
    assert budget.plain_timing_due()  # 32 verifies since the last plain one
    budget.observe(0, 0, verify_s=0.08)
    assert not budget.plain_timing_due()


def test_cut_keeps_the_best_scored_nodes_as_a_tree():
    sizer = TreeSizer(FixedBudget(k=2), SHAPE, free=True, gains=GAINS)
    cut = sizer.cut(_example_tree(), sizer.size(_example_tree(), 0))
    assert (cut.tokens, cut.parents) == ([5, 6], [-1, 0])


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request):
    return pair_with_baseline(request.param, MAX_TOKENS)


def _run(target, drafter, budget, prompt):
    rollback = TrimRollback()
    step = tree_parts(target, drafter, SHAPE, budget=budget, gains=GAINS)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback, GreedyBonus(), tree=step)
    events = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))
    return events[-1], [e for e in events if isinstance(e, Drafted)], step


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_fixed_budget_caps_the_node_count(setup, kind):
    target, draft, prompt, baseline = setup
    final, drafted, _ = _run(target, make_drafter(kind, target, draft), FixedBudget(k=3), prompt)
    assert final.token_ids == baseline
    assert max(d.k for d in drafted) == 3 and all(len(d.draft_ids) <= 3 for d in drafted)


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_auto_sizes_trees_losslessly_and_logs_each_choice(setup, kind):
    target, draft, prompt, baseline = setup
    drafter = make_drafter(kind, target, draft)
    budget = prepared(AutoBudget(), target, drafter)
    budget.ratio = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 34)}  # a flat curve: wide trees pay
    final, drafted, step = _run(target, drafter, budget, prompt)
    assert final.token_ids == baseline
    decided = [d for d in drafted if d.decision is not None]
    assert len(decided) >= len(drafted) - 1  # the last step has no room to draft
    # budget=auto's first step is plain: its token as soon as plain decoding's
    assert decided[0].step == 1 and decided[0].decision.reason == "first token" and not decided[0].draft_ids
    assert all(d.decision.reason.startswith("tree ") for d in decided[1:])
    assert all(d.decision.k >= len(d.draft_ids) for d in decided)  # cut only by the tokens still wanted
    assert any(len(d.draft_ids) > 1 for d in drafted)
    assert step.sizer.reach_by_depth()[1] > 0  # acceptance by depth was measured


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_auto_falls_back_to_plain_when_nothing_pays(setup, kind):
    """A verify curve where every node costs a full forward: no tree beats one plain step, so the
    steps verify nothing, except the cost-paying drafter's scheduled probes, and the n-gram's
    candidates are still checked in hindsight (no verify spent)."""
    target, draft, prompt, baseline = setup
    drafter = make_drafter(kind, target, draft)
    budget = prepared(AutoBudget(), target, drafter)
    budget.ratio = {n: float(n) for n in range(1, 34)}
    final, drafted, step = _run(target, drafter, budget, prompt)
    assert final.token_ids == baseline
    verified = [d for d in drafted if d.draft_ids]
    if kind == "ngram":
        assert not verified and step.sizer.reached  # hindsight alone measured acceptance
    else:
        assert all(d.probe for d in verified) and len(verified) <= 5
    assert sum(d.decision is not None and d.decision.reason == "tree plain" for d in drafted) >= len(drafted) - 6


def test_session_passes_its_budget_to_the_tree_step():
    from test_trees import _compose

    from specpipe.run.session import Session

    session = Session(_compose(["model=tiny-random", "tree=dynamic", "budget=fixed", "budget.k=5"]))
    assert session.tree.sizer.budget is session.budget and not session.tree.sizer.priced
