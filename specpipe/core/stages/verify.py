"""Verify stage: one target forward over [last, *draft] -> k+1 logit rows.

Row i scores the token after position i: row 0 checks draft[0], row k
proposes the bonus. The target cache grows by k+1 positions; rollback
trims what the comparator rejects. What the rollback strategy or the
drafter asked to capture (recurrent states, hidden states) comes back in
the same ForwardResult.
"""

from __future__ import annotations

import mlx.core as mx


def verify(target, cache: list, last_id: int, draft_ids: list[int], capture=None):
    """Score a draft with the target.

    Args:
        target: the target Engine.
        cache: its cache, holding every context token except `last_id`.
        last_id: the newest emitted token (not yet in the cache).
        draft_ids: the k proposed tokens.
        capture: engine.Capture, or None for logits only.

    Returns:
        ForwardResult: [k + 1, vocab] float32 logits (and hidden states when
        captured), evaluated.
    """
    result = target.forward(mx.array([last_id, *draft_ids], dtype=mx.uint32), cache, capture=capture)
    mx.eval(result.logits if result.hidden is None else [result.logits, result.hidden])
    return result
