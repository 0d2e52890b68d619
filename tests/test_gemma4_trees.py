"""Token trees on Gemma-4 targets: tiny random gemma4_text and its multimodal wrapper gemma4 (sliding-window
layers of window 64 beside global ones, the last 2 layers KV-shared: no cache entry of their own, they read
the K/V of the last earlier layer of their kind; logits soft-capped). tests/test_trees.py checks the tree
forward against plain forwards along each path; here greedy tree runs (tree=static / dynamic) with
draft=ngram and draft=gemma4_assistant equal draft=none token for token, 60 tokens out of a 55-token prompt,
so branched trees are verified well past the window, and the assistant's tree holds its chain first, its
siblings read from the same logits (no extra forward)."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import LONG_PROMPT, ROLLBACKS, first_difference, generate, make_drafter, tiny
from gemma4_tiny import aim_at, config, random_weights, write

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.gemma4_assistant.drafter import Gemma4AssistantDrafter
from specpipe.events import Drafted, Verified
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

MAX_TOKENS = 60
WINDOW = 64  # tiny.py's gemma4_text sliding_window
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6),
}


@pytest.fixture(scope="module", params=["gemma4_text", "gemma4"])
def setup(request, tmp_path_factory):
    """(target, prompt, draft=none's tokens, an assistant folder aimed at the baseline's 3 most frequent tokens:
    some drafts hit, some miss)."""
    target = tiny(request.param)
    prompt = target.encode_prompt(LONG_PROMPT, chat=False)
    assert len(prompt) < WINDOW < len(prompt) + MAX_TOKENS - 30, "the run must pass the window by a wide margin"
    baseline = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS)[0]
    cfg = config()
    frequent = [t for t, _ in Counter(baseline).most_common(3)]
    folder = write(tmp_path_factory.mktemp("assistant") / "a", cfg, aim_at(random_weights(cfg, 1), frequent, 1))
    return target, prompt, baseline, str(folder)


def drafter_of(kind: str, target, folder: str):
    return Gemma4AssistantDrafter(target, folder) if kind == "gemma4_assistant" else make_drafter(kind, target)


def tree_run(target, drafter, shape, prompt, rollback=None) -> list:
    step = tree_parts(target, drafter, shape)
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=4), GreedyComparator(), rollback or TrimRollback(), GreedyBonus(), tree=step
    )
    return list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))


def branched_past_window(events: list, prompt_len: int) -> int:
    """Trees with siblings verified once the cache held more than the window."""
    cached, count = prompt_len - 1, 0
    for event in events:
        if isinstance(event, Drafted):
            count += cached > WINDOW and len(set(event.tree_parents)) < len(event.tree_parents)
        elif isinstance(event, Verified):
            cached += len(event.accepted_ids) + 1
    return count


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["ngram", "gemma4_assistant"])
def test_tree_greedy_equals_draft_none_past_the_window(setup, kind, shape):
    target, prompt, baseline, folder = setup
    events = tree_run(target, drafter_of(kind, target, folder), SHAPES[shape], prompt)
    got = events[-1].token_ids
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert branched_past_window(events, len(prompt)) > 0
    stats = events[-1].stats
    assert 0 < stats.accepted < stats.drafted  # paths both accepted and cut


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_assistant_trees_are_lossless_under_every_rollback(setup, rollback):
    """The target keeps a tree's path by compaction whatever the strategy; the strategy still runs the plain
    first step and binds the drafter's rollback, so each one is run."""
    target, prompt, baseline, folder = setup
    events = tree_run(
        target, drafter_of("gemma4_assistant", target, folder), SHAPES["dynamic"], prompt, ROLLBACKS[rollback]()
    )
    assert events[-1].token_ids == baseline


def test_the_assistants_tree_is_its_chain_with_siblings_from_the_same_forwards(setup):
    """The first branch is `propose(context, depth)`'s chain, for as many forwards; every chain node has
    width - 1 siblings, scored below it, and nothing is left in a cache to roll back."""
    target, prompt, _, folder = setup
    drafter = drafter_of("gemma4_assistant", target, folder)
    context = generate(target, drafter, 3, prompt, 8)[3].context  # a run's forwards recorded its K/V and tape
    before = drafter.forwards
    chain = drafter.propose(context, StepPlan(k=4)).token_ids
    assert drafter.forwards - before == 4
    draft = drafter.propose_tree(context, TreeShape(kind="static", branching=[3, 3, 3, 3]))
    assert drafter.forwards - before == 8
    tree, first_branch, node = draft.candidates, [], -1
    for _ in range(4):
        children = tree.children(node)
        assert len(children) == 3 and tree.scores[children[0]] >= max(tree.scores[c] for c in children[1:])
        node = children[0]
        first_branch.append(tree.tokens[node])
    assert first_branch == chain and draft.cached_tail == []
    assert drafter.propose_tree(context[:1], SHAPES["static"]).candidates.tokens == []
