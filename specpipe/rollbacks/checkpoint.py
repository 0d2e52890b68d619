"""`rollback=checkpoint`: keep the recurrent state after every verified position,
restore the one at the accepted length; attention layers are truncated.

Contract: `before_forward(cache)` starts a capture on every recurrent layer;
during the forward each recurrent mixer runs position by position
(rollbacks/stepwise.py) and records its states; `rollback(cache, n_drop,
fed_ids=...)` restores the states after `len(fed_ids) - n_drop` positions and
trims attention layers by `n_drop`. Costs memory (one state per fed position
and recurrent layer, `peak_bytes`), no extra forward. Refuses, at the first
rollback and before any token is emitted, a model whose recurrent mixers
have no stepwise hook (use `rollback=recompute`).

Worked example (2-layer hybrid: layer 0 Gated DeltaNet, layer 1 attention;
cache holds 10 positions): verify feeds [last, d1, d2, d3] (14 positions);
1 draft accepted -> n_drop = 2, keep = 2: layer 0 gets the state recorded
after d1, layer 1's KV cache is trimmed from 14 to 12 positions.
"""

from __future__ import annotations

import time

from specpipe.errors import SpecpipeError
from specpipe.protocols import RollbackBase
from specpipe.rollbacks import layers as cache_layers
from specpipe.rollbacks import stepwise


class CheckpointRollback(RollbackBase):
    name = "checkpoint"

    def __init__(self):
        stepwise.install()
        self.dropped = 0
        self.peak_bytes = 0  # most snapshot memory held at once (target + draft captures)
        self.time_s = 0.0  # time spent restoring states and trimming
        self.recompute_tokens = 0  # always 0: checkpoint never re-runs tokens
        self._active: dict[int, tuple] = {}  # id(leaf) -> (leaf, Capture) between before_forward and rollback

    def check(self, cache: list, role: str) -> None:
        cache_layers.check(cache, role, self.name)

    def before_forward(self, cache: list) -> None:
        for leaf in cache_layers.split(cache).recurrent:
            self._active[id(leaf)] = (leaf, stepwise.start(leaf))

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        t0 = time.perf_counter()
        layers = cache_layers.split(cache)
        self._note_memory()
        for leaf in layers.recurrent:
            capture = stepwise.stop(leaf)
            self._active.pop(id(leaf), None)
            if capture is None:
                if n_drop <= 0:
                    continue  # nothing to undo, and nothing was captured
                raise RuntimeError("rollback=checkpoint: rollback() without before_forward() on this cache")
            fed = restore(leaf, capture, n_drop, fed_ids, engine)
            if fed is None:
                raise SpecpipeError(
                    f"rollback=checkpoint has no per-position hook for the recurrent layers of "
                    f"{_arch(engine)} (supported: {', '.join(stepwise.MIXERS)}); use rollback=recompute"
                )
        cache_layers.trim(layers.attention, n_drop)
        self.dropped += max(n_drop, 0)
        self.time_s += time.perf_counter() - t0

    def _note_memory(self) -> None:
        held = sum(c.held_bytes(leaf.cache) for leaf, c in self._active.values())
        self.peak_bytes = max(self.peak_bytes, held)


def restore(leaf, capture: stepwise.Capture, n_drop: int, fed_ids: list[int] | None, engine=None) -> int | None:
    """Put `leaf` back to its state after the kept positions.

    Returns:
        The number of positions the capture covered, or None when it cannot
        serve this rollback (a mixer without a stepwise hook, or overflow);
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
