"""The target's final hidden states (the LM head's input, after the final
norm) per position of the pipeline's target cache, as an MTP drafter keeps them.

Contract: `write(start, token_ids, hidden)` stores the rows the engine
handed back for a forward that fed `token_ids` at cache positions start..,
dropping anything beyond them, so the tape mirrors the cache: after a
rollback the next verify overwrites the rejected rows. It never runs a
model; the pipeline passes it each prefill's and verify's `ForwardResult.hidden`.
"""

from __future__ import annotations

import mlx.core as mx


class HiddenTape:
    def __init__(self):
        self.tokens: list[int] = []  # token id per recorded position
        self._segments: list[tuple[int, mx.array]] = []  # (first position, [n, hidden]) in order

    def __len__(self) -> int:
        return len(self.tokens)

    def write(self, start: int, token_ids: list[int], hidden: mx.array) -> None:
        """Overwrite positions from `start` on (anything beyond is stale)."""
        start = min(start, len(self.tokens))
        del self.tokens[start:]
        kept = []
        for s, rows in self._segments:
            if s < start:
                kept.append((s, rows[: start - s]))
        self._segments = kept
        self.tokens.extend(token_ids)
        self._segments.append((start, hidden))

    def rows(self, begin: int, end: int) -> mx.array:
        """Hidden states of positions [begin, end) -> [end - begin, hidden]."""
        parts = []
        for s, rows in self._segments:
            lo, hi = max(begin, s), min(end, s + rows.shape[0])
            if lo < hi:
                parts.append(rows[lo - s : hi - s])
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)

    def covers(self, context_ids: list[int], end: int) -> bool:
        """True when the tape holds positions [0, end) of exactly this context."""
        return len(self.tokens) >= end and self.tokens[:end] == context_ids[:end]
