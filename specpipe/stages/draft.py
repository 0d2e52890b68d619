"""Draft stage: a drafter proposes up to k next tokens for the context.

Contract: `propose(context_ids, k)` returns a Draft of at most k ids (maybe
none). A drafter that runs a model keeps its own cache and rolls it back
itself: the pipeline binds the run's rollback strategy once
(`use_rollback`) and after each verify calls `rollback(kept_len)` with the
context length the target accepted. A drafter that `needs_hidden` gets the
target's hidden states of every prefill and verify (`observe_hidden`).

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
    cache: list | None  # its own cache, rolled back by `rollback`
    cached_len: int  # context tokens held in `cache`
    forwards: int  # model forwards over the drafter's lifetime; the pipeline books each step's difference
    needs_hidden: bool  # True: the pipeline calls observe_hidden with the target's hidden states

    def use_rollback(self, strategy) -> None:
        """Roll its own cache back with `strategy` (SpecpipeError now if it cannot)."""

    def rollback(self, kept_len: int) -> int:
        """Keep the first `kept_len` context tokens; returns the positions dropped."""

    def prefill(self, prompt_ids: list[int]) -> None:
        """See the prompt once before the first step."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Propose up to k tokens to follow `context_ids`."""

    # Only where needs_hidden:
    # def observe_hidden(self, start: int, token_ids: list[int], hidden) -> None:
    #     """The target's [n, hidden] states of `token_ids`, fed at its cache positions start.."""

    # Optional, for drafters that can answer it without a target forward (n-gram, MTP head):
    # def hindsight(self, context_ids: list[int], m: int) -> list[int]:
    #     """Up to m greedy tokens it would have proposed after context_ids[:-m]. Leaves the
    #     drafter ready for the next propose(context_ids, k). budget=auto uses it to probe
    #     acceptance while K = 0 at no verify cost."""
