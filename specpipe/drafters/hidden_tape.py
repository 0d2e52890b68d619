"""Record the target's final hidden states (the LM head's input, after the
final norm) for every position of the pipeline's target cache.

Contract: `attach(engine)` hooks the engine's inner mlx-lm model once and
returns its HiddenTape. Every forward through that model that continues the
tracked cache (or starts a new one at offset 0: a new generation's prefill
or first verify) writes its rows at the positions the cache held before the
call, dropping anything beyond them, so the tape mirrors the cache: after
a rollback the next forward overwrites the rejected rows. It never runs the
model itself and never changes a logit.

Why a hook: the pipeline gives drafters only token ids; an MTP head needs
h[i] of the last accepted position, which exists only inside the verify
forward (and the prefill) the pipeline already ran.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import mlx.nn as nn

TAPE_ATTR = "_specpipe_hidden_tape"


class HiddenTape:
    def __init__(self):
        self.tokens: list[int] = []  # token id per recorded position
        self._segments: list[tuple[int, mx.array]] = []  # (first position, [n, hidden]) in order
        self._cache = None  # the cache list being mirrored
        self._paused = False

    def __len__(self) -> int:
        return len(self.tokens)

    def record(self, cache, start: int, token_ids: list[int], hidden: mx.array) -> None:
        """Write `hidden` [n, hidden] for positions start.. of `cache`."""
        if self._paused or cache is None:
            return
        if cache is not self._cache:
            if start != 0:
                return  # someone else's cache mid-way (a draft model, a test): not ours
            self._cache = cache
        self.write(start, token_ids, hidden)

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

    @contextlib.contextmanager
    def paused(self):
        """Forwards inside this block are not recorded (the drafter's own recompute)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False


def cache_offset(cache) -> int:
    """Positions a cache list holds: the first layer cache that knows its offset."""
    for c in cache:
        if hasattr(c, "offset"):
            return int(c.offset)
    return 0


def attach(inner: nn.Module) -> HiddenTape:
    """Hook `inner` (the mlx-lm module that returns normed hidden states) once.

    The instance's class is swapped for a subclass whose __call__ records its
    output: the parameter tree, the weights and the outputs stay identical.
    """
    tape = getattr(inner, TAPE_ATTR, None)
    if tape is not None:
        return tape
    tape = HiddenTape()
    base = type(inner)

    def taped_call(self, inputs, cache=None, *args, **kwargs):
        start = cache_offset(cache) if cache is not None else 0
        hidden = base.__call__(self, inputs, cache, *args, **kwargs)
        if inputs is not None and cache is not None and hidden.shape[0] == 1:
            tape.record(cache, start, inputs[0].tolist(), hidden[0])
        return hidden

    inner.__class__ = type(f"Taped{base.__name__}", (base,), {"__call__": taped_call})
    object.__setattr__(inner, TAPE_ATTR, tape)
    return tape
