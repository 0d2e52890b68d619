"""draft=mtp proposes token trees (MtpDrafter.propose_tree): greedy tree
output equals the target decoding alone (draft=none) for every shape x
architecture, the tree step hands the head the hidden states of the root
and the accepted path (the tape equals a whole-context recompute and none
was needed), and the tree's first branch is what `propose` drafts."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import first_difference, pair_with_baseline, prepared

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.mtp import MtpDrafter
from specpipe.drafters.mtp_head import new_head, save_head
from specpipe.engine.engine import HIDDEN
from specpipe.engine.introspect import llama_parts
from specpipe.events import Drafted, RolledBack, Verified
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.budget import TreeGains
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

ARCHS = ["llama", "qwen2", "qwen3"]  # the tree families an MTP head works on (llama-like hidden states)
MAX_TOKENS = 40
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6),
}


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tmp_path_factory):
    """A tiny target, a prompt, its draft=none tokens, and a random head (exactness needs no training)."""
    target, _, prompt, baseline = pair_with_baseline(request.param, MAX_TOKENS)
    inner, _ = llama_parts(target.model, "mtp")
    mx.random.seed(0)
    head, _ = new_head(inner)
    folder = tmp_path_factory.mktemp("head")
    save_head(head, folder, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
    return target, prompt, baseline, str(folder)


class OracleMtp(MtpDrafter):
    """An MTP head whose tree also holds the target's own next tokens as a second branch under the root.

    A random head is almost never accepted, so its paths are empty; this branch makes paths run deep
    through a sibling of the head's chain (rows 1 + i off the contiguous prefix), as a trained head's do.
    """

    def __init__(self, target, head: str, prompt: list[int], baseline: list[int]):
        super().__init__(target=target, head=head)
        self.prompt_len, self.baseline = len(prompt), baseline

    def propose_tree(self, context_ids, shape):
        draft = super().propose_tree(context_ids, shape)
        tree = draft.candidates
        done = len(context_ids) - self.prompt_len  # the baseline tokens already in the context
        # just under the head's best first token: kept by both shapes, second among the root's children
        score = 0.9 * max(tree.scores[i] for i in tree.children(-1))
        parent = -1
        for tok in self.baseline[done : done + shape.max_depth]:
            parent = tree.add(tok, parent, score)
        return draft


def tree_run(target, drafter, shape, prompt, max_tokens, sampler=None, budget=None):
    """(ids, events, pipeline) of a tree run; `budget` sizes the trees (None: the shape alone)."""
    gains = TreeGains(min_gain=0.03, thin_gain=0.10)  # conf/tree/dynamic.yaml's
    step = tree_parts(target, drafter, shape, budget, gains)
    pipe = SpeculativePipeline(
        target, drafter, budget or FixedBudget(k=4), GreedyComparator(), TrimRollback(), GreedyBonus(), tree=step
    )
    events = list(pipe.run(prompt, max_tokens, stop_ids=set()))
    return events[-1].token_ids, events, pipe


def assert_tape_holds_the_context(target, drafter, pipe):
    """The tape holds the target's hidden states of the whole cached context, as one forward computes them:
    so the tree step observed the root and the accepted path, in order, at the right positions."""
    cached = pipe.context[:-1]
    assert drafter.tape.tokens == cached
    want = target.forward(cached, None, capture=HIDDEN).hidden
    assert mx.allclose(drafter.tape.rows(0, len(cached)), want, atol=1e-4).item()


def first_branch(tree) -> list[int]:
    """The tokens along each node's first child: top_k_chain adds the chain's token first."""
    out, node = [], -1
    while kids := tree.children(node):
        node = kids[0]
        assert tree.scores[node] == max(tree.scores[i] for i in kids)  # the chain's token is the best scored
        out.append(tree.tokens[node])
    return out


# ---------------------------------------------------------------- lossless generation


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mtp_tree_greedy_equals_target_alone(setup, shape):
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head)
    got, events, pipe = tree_run(target, drafter, SHAPES[shape], prompt, MAX_TOKENS)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert pipe.cache[0].offset == len(pipe.context) - 1  # compaction left a plain sequence
    # every verify's hidden states reached the tape: the head never had the target recompute the context
    assert drafter.target_recomputes == 0
    assert_tape_holds_the_context(target, drafter, pipe)
    assert events[-1].stats.tree_steps > 0
    # the head's chained pairs are dropped by its next draft: RolledBack counts them, as on the chain path
    depth = SHAPES[shape].max_depth
    assert {e.draft_dropped for e in events if isinstance(e, RolledBack)} <= {0, depth - 1}
    assert any(e.draft_dropped == depth - 1 for e in events if isinstance(e, RolledBack))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_deep_paths_through_siblings_reach_the_tape(setup, shape):
    """Accepted paths that leave the head's chain (a sibling, then its descendants): the tape gets their rows."""
    target, prompt, baseline, head = setup
    drafter = OracleMtp(target, head, prompt, baseline)
    got, events, pipe = tree_run(target, drafter, SHAPES[shape], prompt, MAX_TOKENS)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    paths = [e.accepted_path for e in events if isinstance(e, Verified)]
    assert any(len(p) >= 2 and p != list(range(len(p))) for p in paths)  # not just the contiguous prefix
    assert drafter.target_recomputes == 0
    assert_tape_holds_the_context(target, drafter, pipe)


def test_auto_prices_the_head_and_plain_steps_still_feed_the_tape(setup):
    """budget=auto: the head runs forwards, so it is not priced as free (an n-gram); where no tree pays,
    steps verify no tree (no proposal but the probes), and their root's hidden state still reaches the tape."""
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head)
    budget = prepared(AutoBudget(), target, drafter)
    budget.ratio = {n: float(n) for n in range(1, 34)}  # every node costs a full forward: nothing pays
    got, events, pipe = tree_run(target, drafter, SHAPES["dynamic"], prompt, MAX_TOKENS, budget=budget)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert pipe.tree.sizer.free is False
    drafted = [e for e in events if isinstance(e, Drafted)]
    assert all(d.probe for d in drafted if d.draft_ids) and sum(not d.draft_ids for d in drafted) > len(drafted) // 2
    assert drafter.target_recomputes == 0
    assert_tape_holds_the_context(target, drafter, pipe)


# ---------------------------------------------------------------- the proposal


@pytest.mark.parametrize("shape", list(SHAPES))
def test_first_branch_is_the_chain_and_siblings_are_its_runners_up(setup, shape):
    """After a tree run: the tree's first branch is propose's greedy chain (for the same head forwards),
    each depth has `width` candidates, and the next propose drops the tree's chained pairs as after a chain."""
    target, prompt, baseline, head = setup
    s = SHAPES[shape]
    drafter = OracleMtp(target, head, prompt, baseline)
    _, _, pipe = tree_run(target, drafter, s, prompt, 16)
    context = pipe.context
    forwards = drafter.forwards
    tree = MtpDrafter.propose_tree(drafter, context, s).candidates  # the head's own tree, no oracle branch
    assert drafter.forwards - forwards == s.max_depth
    assert drafter.cached_len == len(context) + s.max_depth - 1  # context + chained pairs, as after propose
    assert len(tree) == s.max_depth * s.width and len(tree.children(-1)) == s.width
    chain = first_branch(tree)
    assert len(chain) == s.max_depth
    fresh = MtpDrafter(target=target, head=head)  # its tape comes from one whole-context recompute
    fresh.prefill(prompt)
    assert chain == fresh.propose(context, StepPlan(k=s.max_depth)).token_ids
    assert chain == drafter.propose(context, StepPlan(k=s.max_depth)).token_ids  # the tree's chained pairs were dropped
    assert drafter.target_recomputes == 0


def test_too_short_a_context_proposes_an_empty_tree(setup):
    target, _, _, head = setup
    drafter = MtpDrafter(target=target, head=head)
    assert len(drafter.propose_tree([5], SHAPES["static"]).candidates) == 0


# ---------------------------------------------------------------- sampling


def test_sampled_mtp_tree_run_is_seeded_and_reproducible(setup):
    """Recursive rejection sampling takes the head's top-k tree as fixed candidates: seeded runs repeat,
    and the tape still follows the sampled path."""
    target, prompt, _, head = setup
    runs = []
    for _ in range(2):
        drafter = MtpDrafter(target=target, head=head, sampler=Sampler(temperature=0.8, seed=3))
        got, _, pipe = tree_run(target, drafter, SHAPES["dynamic"], prompt, 24, Sampler(temperature=0.8, seed=3))
        assert pipe.cache[0].offset == len(pipe.context) - 1
        assert drafter.target_recomputes == 0
        assert_tape_holds_the_context(target, drafter, pipe)
        runs.append(got)
    assert runs[0] == runs[1] and len(runs[0]) == 24
