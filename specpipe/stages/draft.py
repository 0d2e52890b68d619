"""Draft stage: a drafter proposes up to k next tokens for the context.

Contract: `propose(context_ids, k)` returns a Draft of at most k ids (maybe
none). A drafter that runs a model keeps its own cache and says how many
context tokens it holds, so the rollback stage can trim it.

`hindsight(context_ids, m)` (optional) is the drafter's guess for tokens the
target already emitted: acceptance evidence without a verify forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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
    """

    token_ids: list[int]
    probs: Any = None
    catchup_tokens: int = 0
    catchup_forwards: int = 0


class Drafter(Protocol):
    name: str
    engine: Any  # the Engine it runs, or None (n-gram, none)
    cache: list | None  # its own cache, trimmed by the rollback stage
    cached_len: int  # context tokens held in `cache`
    forwards: int  # model forwards over the drafter's lifetime; the pipeline books each step's difference

    def prefill(self, prompt_ids: list[int]) -> None:
        """See the prompt once before the first step."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Propose up to k tokens to follow `context_ids`."""

    # Optional, for drafters that can answer it without a target forward (n-gram, MTP head):
    # def hindsight(self, context_ids: list[int], m: int) -> list[int]:
    #     """Up to m greedy tokens it would have proposed after context_ids[:-m]. Leaves the
    #     drafter ready for the next propose(context_ids, k). budget=auto uses it to probe
    #     acceptance while K = 0 at no verify cost."""
