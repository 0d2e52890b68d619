"""`rollback=checkpoint`: keep the recurrent state after every verified position,
restore the one at the accepted length; attention layers are truncated.

Contract: `before_forward(cache)` starts a record for every recurrent layer
and returns the StateCapture that the caller passes to the forward(s) on
that cache (`Engine.forward(..., capture=Capture(states=...))`); there each
recurrent mixer runs position by position (engine/recurrent.py) and records
its states. The records live here, never on the cache; `rollback(cache, n_drop,
fed_ids=...)` restores the states after `len(fed_ids) - n_drop` positions and
trims attention layers by `n_drop`. Costs memory (one state per fed position
and recurrent layer, `peak_bytes`), no extra forward. Refuses, at the first
rollback and before any token is emitted, a model whose recurrent mixers
are not in introspect.MIXERS (use `rollback=recompute`).

Worked example (2-layer hybrid: layer 0 Gated DeltaNet, layer 1 attention;
cache holds 10 positions): verify feeds [last, d1, d2, d3] (14 positions);
1 draft accepted -> n_drop = 2, keep = 2: layer 0 gets the state recorded
after d1, layer 1's KV cache is trimmed from 14 to 12 positions.
"""

from __future__ import annotations

import time

from specpipe.core.protocols import RollbackBase
from specpipe.engine import introspect
from specpipe.engine.recurrent import StateCapture, StateRecord
from specpipe.errors import SpecpipeError
from specpipe.rollbacks import layers as cache_layers


class CheckpointRollback(RollbackBase):
    name = "checkpoint"

    def __init__(self):
        self.dropped = 0
        self.peak_bytes = 0  # most snapshot memory held at once (target + draft captures)
        self.time_s = 0.0  # time spent restoring states and trimming
        self.recompute_tokens = 0  # always 0: checkpoint never re-runs tokens
        self._active: dict[int, tuple] = {}  # id(leaf) -> (leaf, StateRecord) between before_forward and rollback

    def check(self, cache: list, role: str) -> None:
        cache_layers.check(cache, role, self.name)

    def before_forward(self, cache: list) -> StateCapture | None:
        """Start recording every recurrent layer of `cache`; None when it has none (nothing to record)."""
        recurrent = cache_layers.split(cache).recurrent
        if not recurrent:
            return None
        states = StateCapture()
        for leaf in recurrent:
            self._active[id(leaf)] = (leaf, states.start(leaf))
        return states

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        t0 = time.perf_counter()
        layers = cache_layers.split(cache)
        self._note_memory()
        for leaf in layers.recurrent:
            capture = take(self._active, leaf)
            if capture is None:
                if n_drop <= 0:
                    continue  # nothing to undo, and nothing was captured
                raise RuntimeError("rollback=checkpoint: rollback() without before_forward() on this cache")
            fed = restore(leaf, capture, n_drop, fed_ids, engine)
            if fed is None:
                raise SpecpipeError(
                    f"rollback=checkpoint has no per-position hook for the recurrent layers of "
                    f"{_arch(engine)} (supported: {', '.join(introspect.MIXERS)}); use rollback=recompute"
                )
        cache_layers.trim(layers.attention, n_drop)
        self.dropped += max(n_drop, 0)
        self.time_s += time.perf_counter() - t0

    def _note_memory(self) -> None:
        held = sum(cache_layers.slot_bytes(c.arrays(), exclude=leaf.cache) for leaf, c in self._active.values())
        self.peak_bytes = max(self.peak_bytes, held)


def take(active: dict, leaf) -> StateRecord | None:
    """Remove and return `leaf`'s record from a strategy's `_active` map (None if it has none)."""
    entry = active.pop(id(leaf), None)
    return entry[1] if entry is not None and entry[0] is leaf else None


def restore(leaf, capture: StateRecord, n_drop: int, fed_ids: list[int] | None, engine=None) -> int | None:
    """Put `leaf` back to its state after the kept positions.

    Returns:
        The number of positions the capture covered, or None when it cannot
        serve this rollback (a mixer not in introspect.MIXERS, or overflow);
        `leaf` is untouched then.
    """
    fed = capture.positions()
    if fed is None or fed < n_drop or (fed_ids is not None and fed != len(fed_ids)):
        return None
    if n_drop > 0:
        leaf.cache = capture.state_at(fed - n_drop)
    return fed


def _arch(engine) -> str:
    info = getattr(engine, "info", None)
    return f"the {info.arch} model" if info is not None else "this model"
