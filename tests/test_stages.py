"""Stage units: comparator scenarios and properties, n-gram lookup, rollback round trip."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import generate, make_drafter, tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from specpipe.core.pipeline import cut
from specpipe.core.plan import StepPlan
from specpipe.core.stages.compare import GreedyComparator
from specpipe.core.stages.draft import Draft
from specpipe.drafters.ngram import NgramDrafter
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.trim import TrimRollback

V = 10


def logits_for(target_ids: list[int]) -> mx.array:
    """[len, V] logits whose argmax rows are `target_ids`."""
    rows = np.zeros((len(target_ids), V), dtype=np.float32)
    rows[np.arange(len(target_ids)), target_ids] = 5.0
    return mx.array(rows)


# ---------------------------------------------------------------- compare


def test_perfect_match():
    v = GreedyComparator().compare(Draft([1, 2, 3]), logits_for([1, 2, 3, 4]))
    assert (v.accepted, v.recovered_id) == (3, None)


def test_early_mismatch():
    v = GreedyComparator().compare(Draft([1, 2, 3]), logits_for([7, 2, 3, 4]))
    assert (v.accepted, v.recovered_id) == (0, 7)


def test_late_mismatch():
    v = GreedyComparator().compare(Draft([1, 2, 3]), logits_for([1, 2, 9, 4]))
    assert (v.accepted, v.recovered_id) == (2, 9)


def test_empty_draft():
    v = GreedyComparator().compare(Draft([]), logits_for([4]))
    assert (v.accepted, v.recovered_id) == (0, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, V - 1), min_size=0, max_size=8), st.data())
def test_accepted_is_a_prefix_and_emission_is_bounded(draft_ids, data):
    k = len(draft_ids)
    target_ids = data.draw(st.lists(st.integers(0, V - 1), min_size=k + 1, max_size=k + 1))
    v = GreedyComparator().compare(Draft(draft_ids), logits_for(target_ids))
    n = v.accepted
    assert draft_ids[:n] == target_ids[:n]  # accepted tokens are a prefix the target agrees with
    assert n == k or draft_ids[n] != target_ids[n]  # ... and the longest one
    emitted = n + 1  # accepted + recovered or bonus
    assert 1 <= emitted <= k + 1
    assert (v.recovered_id is None) == (n == k)  # a bonus only when all k were accepted


@given(st.lists(st.integers(0, 5), max_size=10), st.integers(0, 10), st.integers(0, 12))
def test_cut_stops_at_stop_token_and_room(new_ids, n_from_draft, room):
    n_from_draft = min(n_from_draft, len(new_ids))
    kept, from_draft = cut(new_ids, n_from_draft, {0}, room)
    assert 0 not in kept and len(kept) <= room
    assert kept == new_ids[: len(kept)]
    assert from_draft <= n_from_draft


# ---------------------------------------------------------------- ngram


def test_ngram_worked_example():
    d = NgramDrafter(min_n=1, max_n=2)
    d.prefill([1, 2, 3, 4, 2, 3])
    assert d.propose([1, 2, 3, 4, 2, 3], StepPlan(k=3)).token_ids == [4, 2, 3]


def test_ngram_prefers_most_recent_match_and_longest_n():
    d = NgramDrafter(min_n=1, max_n=3)
    ctx = [5, 1, 2, 9, 1, 2, 8, 7, 1, 2]
    d.prefill(ctx)
    # [1, 2] occurs at 1 and 4: the most recent one (4) is followed by 8, 7
    assert d.propose(ctx, StepPlan(k=2)).token_ids == [8, 7]


def test_ngram_no_match_proposes_nothing():
    d = NgramDrafter()
    d.prefill([1, 2, 3])
    assert d.propose([1, 2, 3], StepPlan(k=4)).token_ids == []


def test_ngram_context_grows_incrementally():
    d = NgramDrafter(min_n=1, max_n=2)
    d.prefill([1, 2])
    assert d.propose([1, 2, 3, 1, 2], StepPlan(k=2)).token_ids == [3, 1]


def test_ngram_hindsight_is_the_proposal_it_would_have_made_earlier():
    d = NgramDrafter(min_n=1, max_n=2)
    ctx = [7, 1, 2, 3, 9, 1, 2, 3]
    d.prefill(ctx[:2])
    earlier = NgramDrafter(min_n=1, max_n=2)
    earlier.prefill(ctx[:-2])
    # before the last [2, 3] the context ended in [9, 1]; [1] was followed by [2, 3] at index 1
    assert d.hindsight(ctx, 2) == earlier.propose(ctx[:-2], StepPlan(k=2)).token_ids == [2, 3]
    assert d.propose(ctx, StepPlan(k=2)).token_ids == [9, 1]  # the look back changed nothing


def test_ngram_bad_sizes():
    with pytest.raises(SpecpipeError, match="min_n"):
        NgramDrafter(min_n=3, max_n=2)


# ---------------------------------------------------------------- rollback


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("n_drop", [1, 3, 7])
def test_trim_round_trip(arch, n_drop):
    """Forward, roll back n, forward the same tokens again: same logits."""
    engine = tiny(arch)
    ids = mx.array(list(range(3, 23)), dtype=mx.uint32)
    cache = engine.make_cache()
    first = engine.forward(ids, cache).logits
    rollback = TrimRollback()
    rollback.rollback(cache, n_drop)
    assert cache[0].offset == len(ids) - n_drop
    again = engine.forward(ids[-n_drop:], cache).logits
    assert mx.allclose(first[-n_drop:], again, atol=1e-4).item()
    assert mx.argmax(first[-n_drop:], axis=-1).tolist() == mx.argmax(again, axis=-1).tolist()
    assert rollback.dropped == n_drop


def test_trim_refuses_recurrent_cache():
    from mlx_lm.models.cache import ArraysCache, KVCache

    with pytest.raises(SpecpipeError, match="ArraysCache"):
        TrimRollback().check([KVCache(), ArraysCache(size=2)], "target")


def test_events_tell_the_step_story():
    """Each step: drafted ids = accepted + rejected; exactly one of recovered/bonus."""
    from specpipe.events import Drafted, Emitted, Verified

    target = tiny("llama")
    prompt = target.encode_prompt("abc abc abc abc", chat=False)
    _, final, events, _ = generate(target, make_drafter("ngram", target), 4, prompt, 30)
    drafted = [e for e in events if isinstance(e, Drafted)]
    verified = [e for e in events if isinstance(e, Verified)]
    emitted = [e for e in events if isinstance(e, Emitted)]
    assert len(drafted) == len(verified) == len(emitted) == final.stats.steps
    for d, v in zip(drafted, verified):
        assert d.draft_ids == v.accepted_ids + v.rejected_ids
        assert (v.bonus_id is None) != (v.recovered_id is None)
        assert (v.bonus_id is not None) == (not v.rejected_ids)
    assert sum(len(e.token_ids) for e in emitted) == final.stats.generated_tokens == 30
