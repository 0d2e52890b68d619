"""The draft-chaining loop shared by every drafter that runs a model (draft
model, layer skip, MTP head).

Contract: `chain(next_logits, k, sampler, p_min)` asks `next_logits(i, y)`
for the logits of drafted position i (y: the token drafted at i - 1, None
for i = 0), picks each token greedily or from the sampler's q, and stops
early below a confidence floor. The graph stays lazy: one host round trip
at the end, except with a floor, where each token is checked on the host
before the next. It never touches a cache itself; `next_logits` does.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from specpipe.core.stages.draft import Draft


def chain(next_logits: Callable, k: int, sampler=None, p_min: float = 0.0) -> tuple[list, list]:
    """Draft up to k tokens.

    Args:
        next_logits: (i, previous token [1] uint32 or None) -> [1, vocab] float32 logits.
        sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
        p_min: budget=confidence's floor on the top probability (0: none).

    Returns:
        (tokens, q_rows): [1] uint32 arrays per drafted token, and the [1, vocab]
        draft distribution of each when sampling (else empty).
    """
    sampled = sampler is not None and not sampler.greedy
    tokens, q_rows = [], []
    y = None
    for i in range(k):
        logits = next_logits(i, y)
        if sampled:
            q = sampler.probs(logits)  # built exactly as the comparator builds p (same processing)
            y = sampler.sample(q)
        else:
            q = None
            y = mx.argmax(logits, axis=-1).astype(mx.uint32)
        if p_min > 0 and mx.max(q if q is not None else mx.softmax(logits, axis=-1)).item() < p_min:
            break  # unsure: stop here rather than spend a verify slot on a likely reject
        tokens.append(y)
        if q is not None:
            q_rows.append(q)
    return tokens, q_rows


def to_draft(tokens: list, q_rows: list, **accounting) -> Draft:
    """One Draft from `chain`'s output (one evaluation of the whole chain)."""
    if not tokens:
        return Draft(token_ids=[], **accounting)
    return Draft(
        token_ids=mx.concatenate(tokens).tolist(), probs=mx.concatenate(q_rows) if q_rows else None, **accounting
    )
