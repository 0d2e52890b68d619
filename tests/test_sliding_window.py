"""Sliding-window targets (gemma3's RotatingKVCache layers) stay lossless past the window.

Golden: on the tiny gemma3_text target (window 64), greedy speculative
output equals mlx-lm's own plain `generate_step`, token for token, for the
n-gram, noisy-copy and self drafters, K = 1 / 4 / 8 and every rollback
strategy, with rollbacks well after the window has wrapped (55-token prompt,
60 tokens out), and for static and dynamic token trees, whose nodes see
only their own window. The engine gives such layers specpipe's
WindowKVCache of the same window (engine/kv.py), which truncates exactly; a
rotating layer that cannot be swapped (keep > 0) is refused in one line
before anything runs.
"""

from __future__ import annotations

import pytest
from conftest import ROLLBACKS, first_difference, generate, make_drafter, with_mlx_reference
from mlx_lm.models.cache import KVCache, RotatingKVCache

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.engine.kv import WindowKVCache
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RolledBack, Verified
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

MAX_TOKENS = 60


@pytest.fixture(scope="module")
def setup():
    """The target, a noisy copy to draft with, the prompt and mlx-lm's plain greedy tokens for it."""
    target, draft, prompt, reference = with_mlx_reference("gemma3_text", MAX_TOKENS)
    window = target.model.args.sliding_window
    assert len(prompt) < window < len(prompt) + MAX_TOKENS - 30, "the run must pass the window by a wide margin"
    return target, draft, prompt, reference, window


def drops_past_window(events: list, prompt_len: int, window: int) -> int:
    """Positions given back by rollbacks of steps that started with more than `window` positions cached."""
    cached, dropped, step_start = prompt_len - 1, 0, prompt_len - 1
    for event in events:
        if isinstance(event, Verified):
            step_start = cached
            cached += len(event.accepted_ids) + 1
        elif isinstance(event, RolledBack) and step_start > window:
            dropped += event.target_dropped
    return dropped


@pytest.mark.parametrize("strategy", list(ROLLBACKS))
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("kind", ["ngram", "model", "self"])
def test_greedy_equals_mlx_lm_past_the_window(setup, kind, k, strategy):
    target, draft, prompt, reference, window = setup
    got, _, events, _ = generate(
        target, make_drafter(kind, target, draft), k, prompt, MAX_TOKENS, rollback=ROLLBACKS[strategy]()
    )
    assert got == reference, first_difference(target, prompt, reference, got)
    if kind != "self":  # self-draft accepts everything: nothing to give back
        assert drops_past_window(events, len(prompt), window) > 0, "no rollback happened past the window"


@pytest.mark.parametrize(
    "shape",
    [TreeShape(kind="static", branching=[3, 2, 1, 1]), TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6)],
    ids=["static", "dynamic"],
)
@pytest.mark.parametrize("kind", ["ngram", "model", "self"])
def test_tree_greedy_equals_mlx_lm_past_the_window(setup, kind, shape):
    target, draft, prompt, reference, window = setup
    drafter, rollback = make_drafter(kind, target, draft), TrimRollback()
    step = tree_parts(target, drafter, shape)
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=4), GreedyComparator(), rollback, GreedyBonus(), tree=step
    )
    events = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))
    got = events[-1].token_ids
    assert got == reference, first_difference(target, prompt, reference, got)
    # trees with siblings were verified after the context passed the window
    cached, branched_past_window = len(prompt) - 1, 0
    for event in events:
        if isinstance(event, Drafted):
            branched_past_window += cached > window and len(set(event.tree_parents)) < len(event.tree_parents)
        elif isinstance(event, Verified):
            cached += len(event.accepted_ids) + 1
    assert branched_past_window > 0


def test_sliding_layers_get_an_exact_window_cache(setup):
    """The engine's cache: WindowKVCache of the model's window where mlx-lm would use RotatingKVCache."""
    target, _, _, _, window = setup
    own = target.model.make_cache()
    ours = target.make_cache()
    assert any(isinstance(c, RotatingKVCache) for c in own)
    for theirs, mine in zip(own, ours):
        if isinstance(theirs, RotatingKVCache):
            assert isinstance(mine, WindowKVCache) and mine.window == theirs.max_size == window
        else:
            assert type(mine) is KVCache


def test_rotating_layers_with_sinks_are_refused_in_one_line(setup, monkeypatch):
    """keep > 0 (attention sinks) cannot be swapped for an exact window: refused before the run."""
    target, _, _, _, _ = setup
    layers = len(target.model.layers)
    monkeypatch.setattr(type(target.model), "make_cache", lambda self: [RotatingKVCache(64, keep=4)] * layers)
    for strategy in ROLLBACKS.values():
        with pytest.raises(SpecpipeError) as err:
            SpeculativePipeline(
                target, make_drafter("ngram", target), FixedBudget(k=4), GreedyComparator(), strategy(), GreedyBonus()
            )
        message = str(err.value)
        assert "\n" not in message and "RotatingKVCache" in message and "draft=none" in message
