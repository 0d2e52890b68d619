"""The draft-chaining loop shared by every drafter that runs a model (draft
model, layer skip, MTP head).

Contract: `chain(next_logits, k, sampler, p_min, stop)` asks `next_logits(i, y)`
for the logits of drafted position i (y: the token drafted at i - 1, None
for i = 0), picks each token greedily or from the sampler's q, and stops
early: below a confidence floor on one token (p_min, budget=confidence), or
where `stop` (a ChainStop, budget=auto) says the chain is unlikely to hold
further. The graph stays lazy: one host round trip at the end, except with
a floor or a stop rule, where each token's top probability is read on the
host before the next. It never touches a cache itself; `next_logits` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from specpipe.core.stages.draft import Draft

BUCKETS = 10  # the draft's confidence in its chain so far, in tenths: 0.0-0.1 .. 0.9-1.0


def bucket(confidence: float) -> int:
    return min(BUCKETS - 1, int(confidence * BUCKETS))


@dataclass(frozen=True)
class ChainStop:
    """Stop drafting once the chain is unlikely to hold this far (budget=auto sets it per step).

    The draft's confidence in its chain up to a token is the product of the tokens' top probabilities.
    What that confidence is worth is measured, not assumed: `hold[b]` is the budget's estimate that a
    chain whose confidence lies in bucket b is accepted up to there (the 0.5B draft of the 1.5B on code:
    0.94-1.0 from 0.5 up, 0.22-0.33 from 0.1 to 0.4, so its raw confidence undersells the middle).

    Two lines, because a token's draft forward is spent before its confidence is known:
    - `floor` (the next forward's cost plus its verify slot, in tokens): no forward is run for the next
      token once this one's estimate is under it, since the chain's confidence only falls;
    - `keep` (the verify slot alone): a token already computed is kept unless its estimate is under this.
    The first token is always drafted: a step the cost model chose to draft proves something.
    """

    floor: float
    hold: tuple[float, ...] = (1.0,) * BUCKETS
    keep: float = 0.0


def chain(
    next_logits: Callable, k: int, sampler=None, p_min: float = 0.0, stop: ChainStop | None = None, tops=None
) -> tuple[list, list]:
    """Draft up to k tokens.

    Args:
        next_logits: (i, previous token [1] uint32 or None) -> [1, vocab] float32 logits.
        sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
        p_min: budget=confidence's floor on the top probability (0: none).
        stop: budget=auto's rule on the whole chain's confidence (None: draft all k).
        tops: a list that receives the top probability of each token drafted, and of one cut by `stop.keep`
            (read only with p_min or stop): a budget measures `ChainStop.hold` from them.

    Returns:
        (tokens, q_rows): [1] uint32 arrays per drafted token, and the [1, vocab]
        draft distribution of each when sampling (else empty).
    """
    sampled = sampler is not None and not sampler.greedy
    tokens, q_rows = [], []
    y = None
    confidence = 1.0  # the draft's: the product of its tokens' top probabilities so far
    for i in range(k):
        logits = next_logits(i, y)
        if sampled:
            q = sampler.probs(logits)  # built exactly as the comparator builds p (same processing)
            y = sampler.sample(q)
        else:
            q = None
            y = mx.argmax(logits, axis=-1).astype(mx.uint32)
        held = 1.0  # the stop's estimate that the chain holds up to this token
        if p_min > 0 or stop is not None:
            top = mx.max(q if q is not None else mx.softmax(logits, axis=-1)).item()
            if top < p_min:
                break  # unsure: stop here rather than spend a verify slot on a likely reject
            if tops is not None:
                tops.append(top)
            if stop is not None:
                confidence *= top
                held = stop.hold[bucket(confidence)]
                if i > 0 and held < stop.keep:
                    break  # computed, but unlikely enough to hold that even its verify slot costs more
        tokens.append(y)
        if q is not None:
            q_rows.append(q)
        if stop is not None and held < stop.floor:
            break  # the next token holds no likelier and would cost a draft forward besides: none is run
    return tokens, q_rows


def to_draft(tokens: list, q_rows: list, **accounting) -> Draft:
    """One Draft from `chain`'s output (one evaluation of the whole chain)."""
    if not tokens:
        return Draft(token_ids=[], **accounting)
    return Draft(
        token_ids=mx.concatenate(tokens).tolist(), probs=mx.concatenate(q_rows) if q_rows else None, **accounting
    )
