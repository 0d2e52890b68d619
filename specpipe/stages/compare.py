"""Compare stage: how much of the draft does the target accept?

Contract: `compare(draft, logits)` returns a Verdict: the accepted count n
(a prefix of the draft) and, when n < k, the target's replacement token at
position n (the *recovered* token). Greedy compares argmaxes; the sampling
rules (rejection, match) plug in here later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from specpipe.stages.draft import Draft


@dataclass
class Verdict:
    accepted: int  # n: draft[:n] is kept
    recovered_id: int | None  # target token at position n when n < k


class Comparator(Protocol):
    name: str

    def compare(self, draft: Draft, logits: mx.array) -> Verdict:
        """`logits`: [k + 1, vocab] from the verify stage."""


class GreedyComparator:
    """Accept the longest prefix where the draft equals the target's argmax.

    Example: draft [5, 7, 9], target argmax rows [5, 7, 2, 4]
    -> accepted 2, recovered 2 (row 2 disagrees with draft[2] = 9).
    """

    name = "greedy"

    def compare(self, draft: Draft, logits: mx.array) -> Verdict:
        k = len(draft.token_ids)
        if k == 0:
            return Verdict(accepted=0, recovered_id=None)
        target_ids = mx.argmax(logits[:k], axis=-1).tolist()
        n = 0
        while n < k and target_ids[n] == draft.token_ids[n]:
            n += 1
        return Verdict(accepted=n, recovered_id=target_ids[n] if n < k else None)
