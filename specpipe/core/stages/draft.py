"""Draft stage: a drafter proposes up to k next tokens for the context.

Contract: `propose(context_ids, plan)` returns a Draft of at most `plan.k` ids
(maybe none; a free lookup up to `plan.lookup_k`: core/plan.py's StepPlan). A
drafter that runs a model keeps its own cache and rolls it back itself: the
step binds the run's rollback strategy once (`use_rollback`) and after each
verify calls `rollback(kept_len)` with the context length the target accepted. A drafter that `needs_hidden` gets the
target's hidden states of every prefill and verify (`observe_hidden`).

`hindsight(context_ids, m)` (when `supports_hindsight`) is the drafter's guess for tokens
the target already emitted: acceptance evidence without a verify forward.
The Drafter protocol itself is in specpipe/core/protocols.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specpipe.core.protocols import Drafter  # noqa: F401  (the protocol lives with the other kinds')


@dataclass
class Draft:
    """Proposed continuation.

    token_ids: the proposed ids, len <= k.
    probs: [len, vocab] draft distribution per position when the drafter has
        one (model drafters), None for point-mass drafters such as n-gram.
    catchup_tokens: context tokens the drafter fed before drafting (tokens
        emitted since its last forward), for the step's accounting.
    catchup_forwards: forwards spent only on that catch-up (0 when it rides
        in the first drafting forward, as the model drafter does).
    source: which of a chain's drafters proposed it (draft=chain, drafters/sources.py); "" for the others.
    evidence: how sure the drafter was of it, as a class (`Drafter.last_evidence`; n-gram: the matched
        suffix's length), or None; what budget=auto keeps rates per class by.
    tops: the drafted tokens' top draft probabilities where a model chain ran under a stop rule (the chain
        stop's hold rates learn from them); empty otherwise.
    """

    token_ids: list[int]
    probs: Any = None
    catchup_tokens: int = 0
    catchup_forwards: int = 0
    source: str = ""
    evidence: int | None = None
    tops: list[float] = field(default_factory=list)
