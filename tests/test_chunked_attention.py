"""Chunked-attention targets and drafts (llama4's ChunkedKVCache layers) roll back exactly.

Golden: on the tiny llama4 target (chunks of 32 positions), greedy
speculative output equals mlx-lm's own plain `generate_step` and the
pipeline's draft=none, token for token, for the n-gram and noisy-copy
drafters, K = 4 / 8 and every rollback strategy, with the run well past
three chunk boundaries (55-token prompt, 80 tokens out).

Why the target was never at risk: its cache is rolled back after each
verify, by at most what that one forward fed, and mlx-lm's ChunkedKVCache
keeps the last chunk_size positions from before the forward. A draft model
is not so lucky: its K one-token forwards each move the cache's start on, so
a rollback over them could leave the next query without the start of its
chunk (mlx-lm's cache trimmed silently; the draft then drafted from a
context it never saw, which costs acceptance but not the output). The engine
gives such layers ExactChunkedKVCache (engine/kv.py), which keeps a rollback
margin in whole chunks and refuses, in one line, a rollback past it. The
golden runs use a margin of 16 so that chunks are dropped within them.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import ROLLBACKS, first_difference, generate, make_drafter, with_mlx_reference
from mlx_lm.models.cache import ChunkedKVCache, KVCache

from specpipe.engine.kv import ExactChunkedKVCache, model_cache
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RolledBack, Verified

MAX_TOKENS = 80
MARGIN = 16  # positions kept before the current chunk in the golden runs: more than K = 8 gives back


@pytest.fixture(scope="module")
def setup():
    """The target, a noisy copy to draft with, the prompt and mlx-lm's plain greedy tokens for it."""
    target, draft, prompt, reference = with_mlx_reference("llama4", MAX_TOKENS)
    chunk = target.model.args.text_config.attention_chunk_size
    assert len(prompt) + MAX_TOKENS > 4 * chunk, "the run must cross several chunk boundaries"
    return target, draft, prompt, reference, chunk


def run(target, drafter, k: int, strategy: str, prompt: list[int]) -> list:
    return generate(target, drafter, k, prompt, MAX_TOKENS, rollback=ROLLBACKS[strategy]())[2]


def with_margin(monkeypatch, engine, margin: int, made: list) -> None:
    """`engine.make_cache` gives its chunked layers `margin` (each cache it makes is appended to `made`)."""

    def make_cache():
        cache = [
            ExactChunkedKVCache(c.chunk_size, margin) if isinstance(c, ExactChunkedKVCache) else c
            for c in model_cache(engine.model)
        ]
        made.append(cache)
        return cache

    monkeypatch.setattr(engine, "make_cache", make_cache)


def test_chunked_layers_get_an_exact_cache(setup):
    """The engine's cache: ExactChunkedKVCache of the model's chunk size where mlx-lm uses ChunkedKVCache."""
    target, _, _, _, chunk = setup
    own, ours = target.model.make_cache(), target.make_cache()
    assert any(isinstance(c, ChunkedKVCache) for c in own)
    for theirs, mine in zip(own, ours):
        if isinstance(theirs, ChunkedKVCache):
            assert isinstance(mine, ExactChunkedKVCache) and mine.chunk_size == theirs.chunk_size == chunk
        else:
            assert type(mine) is KVCache


@pytest.mark.parametrize("margin", [None, 8])
def test_rollback_over_several_forwards_is_exact(setup, margin):
    """k one-token forwards (a draft chain), then give back d of them: the next logits equal a fresh cache's."""
    target, _, _, _, chunk = setup
    ids = mx.random.randint(0, 256, (2 * chunk + 16,), key=mx.random.key(3)).tolist()

    def make_cache():
        cache = target.make_cache()
        if margin is not None:  # layers 0-2 are the chunked ones
            cache[:3] = [ExactChunkedKVCache(chunk, margin) for _ in range(3)]
        return cache

    for length in range(chunk + 22, chunk + 32, 3):  # chains that end in the next chunk, rolled back into this one
        for d in (3, 6, 8):
            cache = make_cache()
            target.forward(ids[:length], cache)
            for i in range(8):
                target.forward(ids[length + i : length + i + 1], cache)
            for layer in cache:
                assert layer.trim(d) == d
            kept = length + 8 - d
            got = target.forward(ids[kept : kept + 1], cache).logits[-1]
            want = target.forward(ids[: kept + 1], make_cache()).logits[-1]
            assert mx.allclose(got, want, atol=1e-4).item(), f"{length} cached, 8 fed, {d} given back"
            if margin is not None:
                assert cache[0].start_position > 0, "the margin must have dropped chunks"


def test_draft_none_equals_mlx_lm(setup):
    target, _, prompt, reference, _ = setup
    final = run(target, make_drafter("none", target), 1, "trim", prompt)[-1]
    assert final.token_ids == reference, first_difference(target, prompt, reference, final.token_ids)


@pytest.mark.parametrize("strategy", list(ROLLBACKS))
@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_greedy_equals_mlx_lm_past_chunk_boundaries(setup, monkeypatch, kind, k, strategy):
    target, draft, prompt, reference, chunk = setup
    made: list = []
    with_margin(monkeypatch, target, MARGIN, made)
    with_margin(monkeypatch, draft, MARGIN, made)
    events = run(target, make_drafter(kind, target, draft), k, strategy, prompt)
    final = events[-1]
    assert final.token_ids == reference, first_difference(target, prompt, reference, final.token_ids)
    assert any(c[0].start_position > 0 for c in made), "no chunk was dropped: the margin was never exercised"
    cached, late_drops = len(prompt) - 1, 0
    for event in events:
        if isinstance(event, Verified):
            cached += len(event.accepted_ids) + 1
        elif isinstance(event, RolledBack) and cached > 2 * chunk:
            late_drops += event.target_dropped
    assert late_drops > 0, "no rollback happened past the second chunk boundary"


def greedy_continuation(engine, context: list[int], k: int) -> list[int]:
    """The engine's own greedy k tokens after `context`, on a fresh cache, one token per forward."""
    cache = engine.make_cache()
    logits = engine.forward(context, cache).logits[-1]
    tokens: list[int] = []
    for _ in range(k):
        tokens.append(int(mx.argmax(logits).item()))
        logits = engine.forward(tokens[-1:], cache).logits[-1]
    return tokens


def test_drafts_equal_the_draft_models_own_decoding(setup):
    """Every chain the draft model proposes is its plain greedy decoding of the context (mlx-lm's
    ChunkedKVCache, trimmed over a chain, made 5 of 67 drafts differ here)."""
    target, draft, prompt, _, _ = setup
    context, differing = list(prompt), []
    for event in run(target, make_drafter("model", target, draft), 8, "trim", prompt):
        if isinstance(event, Drafted) and event.draft_ids:
            if greedy_continuation(draft, context, len(event.draft_ids)) != event.draft_ids:
                differing.append(len(context))
        elif isinstance(event, Verified):
            recovered = event.recovered_id if event.recovered_id is not None else event.bonus_id
            context += [*event.accepted_ids, recovered]
    assert not differing, f"drafts unlike the draft model's own decoding at context lengths {differing}"


def test_a_rollback_past_the_margin_is_refused_in_one_line():
    cache = ExactChunkedKVCache(chunk_size=4, margin=3)
    keys = mx.zeros((1, 1, 10, 2))
    cache.update_and_fetch(keys, keys)
    cache.maybe_trim_front()  # offset 10: keeps the chunk of position 10 - 3 on
    assert cache.start_position == 4 and cache.trim(6) == 6  # back to 4: its query needs only its own chunk
    with pytest.raises(SpecpipeError) as err:
        cache.trim(1)  # position 3's query needs 0..2, dropped
    assert "\n" not in str(err.value) and "margin" in str(err.value)
    assert cache.offset == 4
