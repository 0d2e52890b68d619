"""`draft=ngram`: prompt lookup. Match the last n tokens of the context
against earlier context and propose what followed; no model, no memory.

Worked example (max_n=2, k=3): context [1, 2, 3, 4, 2, 3]: the suffix
[2, 3] occurred at index 1, followed by [4, 2, 3] -> propose [4, 2, 3].
The most recent earlier match wins; longer n are tried first.
"""

from __future__ import annotations

import numpy as np

from specpipe.errors import SpecpipeError
from specpipe.protocols import DrafterBase
from specpipe.stages.draft import Draft


class NgramDrafter(DrafterBase):
    name = "ngram"
    supports_hindsight = True

    def __init__(self, min_n: int = 1, max_n: int = 4, window: int = 4096):
        if not 1 <= min_n <= max_n:
            raise SpecpipeError(f"draft.min_n={min_n}, draft.max_n={max_n}: need 1 <= min_n <= max_n")
        self.min_n, self.max_n, self.window = min_n, max_n, window
        self._ids = np.zeros(1024, dtype=np.int64)
        self._len = 0

    def prefill(self, prompt_ids: list[int]) -> None:
        self._len = 0
        self._extend(prompt_ids)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        # The context only grows between steps: append the new tail instead
        # of copying the whole history every step.
        self._extend(context_ids[self._len :])
        return Draft(token_ids=self._lookup(self._len, k))

    def propose_tree(self, context_ids: list[int], shape):
        """Candidates from every earlier match, deduplicated into a trie (tree != chain; specpipe/trees/)."""
        from specpipe.trees.drafting import ngram_candidates

        self._extend(context_ids[self._len :])
        ids = self._ids[max(0, self._len - self.window) : self._len]
        return ngram_candidates(ids, self.min_n, self.max_n, shape.max_depth)

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """What propose would have said before the last m tokens (a lookup, no state change)."""
        self._extend(context_ids[self._len :])
        return self._lookup(self._len - m, m)

    def _lookup(self, end: int, k: int) -> list[int]:
        """Up to k ids that followed the latest earlier match of the ids before `end`."""
        if k <= 0:
            return []
        ids = self._ids[max(0, end - self.window) : end]
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._find(ids, n)
            if start is not None:
                return ids[start + n : start + n + k].tolist()
        return []

    @staticmethod
    def _find(ids: np.ndarray, n: int) -> int | None:
        """Start of the most recent earlier occurrence of the last n ids."""
        suffix = ids[-n:]
        body = ids[:-1]  # a match must be followed by at least one token
        if len(body) < n:
            return None
        windows = np.lib.stride_tricks.sliding_window_view(body, n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        return int(hits[-1]) if len(hits) else None

    def _extend(self, new_ids: list[int]) -> None:
        need = self._len + len(new_ids)
        if need > len(self._ids):
            self._ids = np.resize(self._ids, max(need, 2 * len(self._ids)))
        self._ids[self._len : need] = new_ids
        self._len = need
