"""draft=lookahead (specpipe/drafters/lookahead.py): Jacobi window + n-gram pool from the target's own
forwards, verified as a token tree. Greedy output equals the target decoding alone for every shape and
architecture; the Jacobi update and the n-gram harvest follow the paper's rule; tree=chain is refused
before anything loads."""

from __future__ import annotations

import pytest
from conftest import first_difference, make_drafter, pair_with_baseline, run_pipeline

from specpipe.core.plan import StepPlan
from specpipe.drafters.lookahead import LookaheadDrafter
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree

MAX_TOKENS = 40
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6),
}


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def setup(request):
    return pair_with_baseline(request.param, MAX_TOKENS)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_lookahead_greedy_equals_target_alone(setup, shape):
    target, _, prompt, baseline = setup
    drafter = make_drafter("lookahead", target)
    step = tree_parts(target, drafter, SHAPES[shape])
    got, final = run_pipeline(target, drafter, prompt, MAX_TOKENS, tree=step)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stats.tree_steps > 0
    assert drafter.pool  # n-grams were gathered from the target's forwards


def test_lookahead_accepts_tokens_on_repetitive_text(setup):
    """The tiny models repeat themselves: the window converges and the pool's n-grams get accepted."""
    target, _, prompt, baseline = setup
    drafter = make_drafter("lookahead", target)
    step = tree_parts(target, drafter, SHAPES["dynamic"])
    got, final = run_pipeline(target, drafter, prompt, MAX_TOKENS, tree=step)
    assert got == baseline
    assert final.stats.accepted > 0 and final.stats.tokens_per_forward > 1.0


def _window_tree(drafter: LookaheadDrafter, context: list[int]) -> TokenTree:
    shape = TreeShape(kind="dynamic", nodes=16, depth=3, branching=[1] * 3)
    return drafter.propose_tree(context, shape).candidates


def test_jacobi_update_and_ngram_harvest_worked_example():
    """ngram 3: iteration t guessed 7 at position q with output 8; iteration t + 1 fed 8 at q + 1
    and the target answered 9 -> pool[7] holds (8, 9)."""
    d = LookaheadDrafter(window=2, ngram=3)
    d.prefill([1, 2, 3])
    context = [1, 2, 3]  # root at position 2; the window guesses positions 3 and 4
    d._guess = {3: 7, 4: 5}
    tree = _window_tree(d, context)
    assert d._fed == [7, 5] and (tree.tokens, tree.parents) == ([7, 5], [-1, 0])
    # the target's argmax per row: root -> 4 (position 3's truth), after 7 -> 8, after 5 -> 6
    d.observe_tree(len(context), tree, [4, 8, 6], emitted=1)  # 7 rejected: 4 emitted, window moves on
    assert d._guess[4] == 8 and d._guess[5] == 6 and 3 not in d._guess
    context = [1, 2, 3, 4]
    tree = _window_tree(d, context)
    assert d._fed == [8, 6]  # the Jacobi iterate: yesterday's outputs are today's guesses
    d.observe_tree(len(context), tree, [8, 9, 2], emitted=2)
    assert d.pool[7] == [(8, 9)]
    assert d.propose([1, 7], StepPlan(k=4)).token_ids == [8, 9]


def test_lookahead_options_are_checked():
    with pytest.raises(SpecpipeError, match="draft.window"):
        LookaheadDrafter(window=0)
    with pytest.raises(SpecpipeError, match="draft.ngram"):
        LookaheadDrafter(ngram=1)


def test_lookahead_through_hydra_needs_a_tree():
    from test_trees import _compose

    from specpipe.errors import ConfigError
    from specpipe.run.session import Session

    with pytest.raises(ConfigError, match="tree=dynamic") as err:
        Session(_compose(["model.name=no-such-model", "draft=lookahead"]))
    assert "\n" not in str(err.value)
    session = Session(_compose(["model=tiny-random", "draft=lookahead", "tree=dynamic", "max_tokens=12"]))
    events = list(session.generate(session.encode("the cat sat on the mat, the cat"), 12))
    assert any(isinstance(e, Drafted) and e.tree_parents for e in events)
    assert len(events[-1].token_ids) == 12
