"""`draft=ngram`: prompt lookup. Match the last n tokens of the context
against earlier context and propose what followed; no model.

Worked example (max_n=2, k=3): context [1, 2, 3, 4, 2, 3]: the suffix
[2, 3] occurred at index 1, followed by [4, 2, 3] -> propose [4, 2, 3].
The most recent earlier match wins; longer n are tried first. The n that
matched is the draft's `last_evidence`: on the code suite a 1-token match
led to an accepted first token 30% of the time, a 4-token match 87%
(docs/benchmarks/log/2026-12-01-auto-match-length.md), so budget=auto sizes each draft by its class.

The context is searched through an incremental hashed n-gram index
(ngram_index.py): appending a token and looking up a suffix cost the same at
1k and at 32k tokens of context. `window` (None: the whole context) limits
how far back a match may start.
"""

from __future__ import annotations

import numpy as np

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.drafters.ngram_index import NgramIndex
from specpipe.errors import SpecpipeError

MAX_N = 64  # the longest n-gram indexed: one table per n, and no match is longer in practice


class NgramDrafter(DrafterBase):
    name = "ngram"
    supports_hindsight = True
    supports_trees = True

    def __init__(self, min_n: int = 1, max_n: int = 4, window: int | None = None):
        if not 1 <= min_n <= max_n:
            raise SpecpipeError(f"draft.min_n={min_n}, draft.max_n={max_n}: need 1 <= min_n <= max_n")
        if max_n > MAX_N:  # the index keeps a table per n: an absurd max_n would exhaust memory before any step
            raise SpecpipeError(f"draft.max_n={max_n} is out of range: match at most {MAX_N} tokens (draft.max_n=4)")
        self.min_n, self.max_n, self.window = min_n, max_n, window
        self._index = NgramIndex(min_n, max_n)

    def prefill(self, prompt_ids: list[int]) -> None:
        self._index = NgramIndex(self.min_n, self.max_n)
        self._index.append(prompt_ids)

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        self._sync(context_ids)
        ids, self.last_evidence = self._lookup(len(self._index), plan.k)
        return Draft(token_ids=ids)

    def propose_tree(self, context_ids: list[int], shape):
        """Candidates from every earlier match, deduplicated into a trie (tree != chain; specpipe/trees/)."""
        from specpipe.trees.drafting import ngram_candidates

        self._sync(context_ids)
        ids = self._index.ids
        start = max(0, len(ids) - self.window) if self.window else 0
        return ngram_candidates(np.asarray(ids[start:], dtype=np.int64), self.min_n, self.max_n, shape.max_depth)

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """What propose would have said before the last m tokens (a lookup, no state change)."""
        self._sync(context_ids)
        ids, self.last_evidence = self._lookup(len(self._index) - m, m)
        return ids

    def _sync(self, context_ids: list[int]) -> None:
        """Bring the index to `context_ids`: the context only grows between steps, so only
        its new tail is indexed; a shorter context (a caller that rolled back) is truncated."""
        if len(context_ids) < len(self._index):
            self._index.truncate(len(context_ids))
        self._index.append(context_ids[len(self._index) :])

    def _lookup(self, end: int, k: int) -> tuple[list[int], int | None]:
        """Up to k ids that followed the latest earlier match of the ids before `end`, and the match's n
        (None when nothing matched)."""
        if k <= 0:
            return [], None
        earliest = max(0, end - self.window) if self.window else 0
        for n in range(min(self.max_n, end - earliest - 1), self.min_n - 1, -1):
            e = self._index.lookup(end, n, earliest_start=earliest)
            if e is not None:
                return self._index.ids[e : min(e + k, end)], n
        return [], None
