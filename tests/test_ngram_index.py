"""The n-gram drafter's incremental index proposes exactly what the old
per-step rescan proposed (kept here as the reference), through appends,
hindsight lookups, windows and truncations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specpipe.core.plan import StepPlan
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.ngram_index import NgramIndex


def rescan(ids: list[int], end: int, k: int, min_n: int, max_n: int, window: int) -> list[int]:
    """The drafter before the index (commit e1fab75): slice a window, search it for the suffix."""
    if k <= 0:
        return []
    arr = np.asarray(ids[max(0, end - window) : end], dtype=np.int64)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        suffix, body = arr[-n:], arr[:-1]
        if len(body) < n:
            continue
        hits = np.flatnonzero((np.lib.stride_tricks.sliding_window_view(body, n) == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1])
            return arr[start + n : start + n + k].tolist()
    return []


tokens = st.lists(st.integers(0, 5), min_size=1, max_size=120)  # a small vocabulary: many repeats


@settings(max_examples=200, deadline=None)
@given(
    ids=tokens,
    steps=st.lists(st.integers(1, 9), max_size=12),
    k=st.integers(0, 6),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    window=st.sampled_from([None, 3, 8, 50]),
)
def test_proposals_equal_the_rescan(ids, steps, k, min_n, extra_n, window):
    max_n = min_n + extra_n
    drafter = NgramDrafter(min_n=min_n, max_n=max_n, window=window)
    prompt_len = max(1, len(ids) // 3)
    drafter.prefill(ids[:prompt_len])
    end = prompt_len
    for step in steps + [len(ids)]:
        end = min(len(ids), end + step)
        got = drafter.propose(ids[:end], StepPlan(k=k)).token_ids
        assert got == rescan(ids, end, k, min_n, max_n, window or 10**9), (end, k)
        m = min(k, end - 1)
        if m > 0:
            assert drafter.hindsight(ids[:end], m) == rescan(ids, end - m, m, min_n, max_n, window or 10**9)


@settings(max_examples=100, deadline=None)
@given(ids=tokens, cut=st.integers(0, 120), more=tokens)
def test_truncate_is_exact(ids, cut, more):
    """Truncate, then append other ids: the same index as built from scratch."""
    cut = min(cut, len(ids))
    index = NgramIndex(1, 3)
    index.append(ids)
    index.truncate(cut)
    index.append(more)
    fresh = NgramIndex(1, 3)
    fresh.append(ids[:cut] + more)
    assert index.ids == fresh.ids and index._tables == fresh._tables


def test_worked_example():
    index = NgramIndex(2, 2)
    index.append([1, 2, 3, 4, 2, 3])
    assert index.lookup(6, 2) == 3
    assert NgramDrafter(min_n=1, max_n=2).propose([1, 2, 3, 4, 2, 3], StepPlan(k=3)).token_ids == [4, 2, 3]


def test_a_shorter_context_rolls_the_index_back():
    drafter = NgramDrafter(min_n=1, max_n=2)
    drafter.prefill([1, 2, 3, 1, 2, 9])
    assert drafter.propose([1, 2, 3, 1, 2, 9], StepPlan(k=2)).token_ids == []
    assert drafter.propose([1, 2, 3, 1, 2], StepPlan(k=2)).token_ids == [3, 1]
