"""The target's final hidden states (the LM head's input, after the final
norm) per position of the pipeline's target cache, as an MTP drafter keeps them.

Contract: `write(start, token_ids, hidden)` stores the rows the engine
handed back for a forward that fed `token_ids` at cache positions start..,
dropping anything beyond them, so the tape mirrors the cache: after a
rollback the next verify overwrites the rejected rows. It never runs a
model; the pipeline passes it each prefill's and verify's `ForwardResult.hidden`.

`TapeResume` gives the drafters that read a tape (MTP, EAGLE-3, DFlash, a Gemma-4 assistant) their
prefix-store hooks: the tape's first rows are kept with the target's snapshot (`prefix(n)`), since
without them the drafter could only get them from another target forward over the prefix.
"""

from __future__ import annotations

from typing import Any

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
            if rows is None or s >= end:  # a segment recorded without rows (see holds_rows), or past the range
                continue
            lo, hi = max(begin, s), min(end, s + rows.shape[0])
            if lo < hi:
                parts.append(rows[lo - s : hi - s])
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)

    def covers(self, context_ids: list[int], end: int) -> bool:
        """True when the tape holds positions [0, end) of exactly this context."""
        return len(self.tokens) >= end and self.tokens[:end] == context_ids[:end]

    def holds_rows(self, end: int) -> bool:
        """True when every position in [0, end) has its row: a batched row's tape may record a forward's
        tokens without rows (a drafter that reads the target's K/V, not its hidden states, at join)."""
        return all(rows is not None for s, rows in self._segments if s < end)

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for _, rows in self._segments if rows is not None)

    def prefix(self, n: int) -> HiddenTape:
        """A new tape holding copies of positions [0, n) (the prefix store keeps it; this one goes on)."""
        tape = HiddenTape()
        tape.tokens = self.tokens[:n]
        if n:
            rows = mx.array(self.rows(0, n))
            mx.eval(rows)
            tape._segments = [(0, rows)]
        return tape

    def copy(self) -> HiddenTape:
        """A tape that later writes to leave this one as it is (the rows themselves are never written)."""
        tape = HiddenTape()
        tape.tokens, tape._segments = list(self.tokens), list(self._segments)
        return tape


class TapeResume:
    """The prefix store's hooks for a drafter reading `self.tape`: its first `length` rows go with the target's
    snapshot, and a request resuming from that snapshot starts with them (its prompt's later rows arrive through
    `observe_hidden` from the reused length on). Without them a stored target cache cannot serve it
    (`resumes_without_state` False): the rows come only from target forwards."""

    tape: HiddenTape
    resumes_without_state = False

    def prefill(self, prompt_ids: list[int]) -> None:
        raise NotImplementedError  # the drafter's own

    def prefix_state(self, context_ids: list[int], length: int) -> Any:
        if length < 1 or not self.tape.covers(context_ids, length) or not self.tape.holds_rows(length):
            return None  # nothing kept: this request's target snapshot is stored without a drafter state
        return self.tape.prefix(length)

    def resume(self, prompt_ids: list[int], state: Any) -> None:
        self.prefill(prompt_ids)  # a fresh head cache: its first propose reads the pairs off the tape
        self.tape = state.copy()
