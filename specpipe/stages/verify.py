"""Verify stage: one target forward over [last, *draft] -> k+1 logit rows.

Row i scores the token after position i: row 0 checks draft[0], row k
proposes the bonus. The target cache grows by k+1 positions; rollback
trims what the comparator rejects.
"""

from __future__ import annotations

import mlx.core as mx


def verify(target, cache: list, last_id: int, draft_ids: list[int]) -> mx.array:
    """Score a draft with the target.

    Args:
        target: the target Engine.
        cache: its cache, holding every context token except `last_id`.
        last_id: the newest emitted token (not yet in the cache).
        draft_ids: the k proposed tokens.

    Returns:
        [k + 1, vocab] float32 logits, evaluated.
    """
    logits = target.forward(mx.array([last_id, *draft_ids], dtype=mx.uint32), cache)
    mx.eval(logits)
    return logits
