"""`rollback=recompute`: snapshot the recurrent state before a forward; on a
partial acceptance restore it and re-run the accepted tokens.

Contract: `before_forward(cache)` keeps a reference to every recurrent
layer's state (arrays are immutable, so this copies nothing: the memory cost
is that the old state stays alive, one state per recurrent layer).
`rollback(cache, n_drop, engine=, fed_ids=)` with n_drop > 0 restores those
states, truncates attention layers by *all* `len(fed_ids)` fed positions,
then feeds `fed_ids[:len(fed_ids) - n_drop]` through `engine.forward`, so
every layer, attention included, holds exactly the accepted prefix again.
Costs time (`recompute_tokens`, `time_s`), works for any recurrent family.

Worked example (cache holds 10 positions): verify feeds [last, d1, d2, d3];
1 draft accepted -> n_drop = 2: restore the states at 10, trim attention
14 -> 10, re-run [last, d1] -> 12 positions everywhere. n_drop = 0 (all
accepted): nothing to do, the forward's states are already right.
"""

from __future__ import annotations

import time

import mlx.core as mx

from specpipe.core.protocols import RollbackBase
from specpipe.rollbacks import layers as cache_layers


class RecomputeRollback(RollbackBase):
    name = "recompute"

    def __init__(self):
        self.dropped = 0
        self.peak_bytes = 0  # most pre-forward state kept alive at once (target + draft)
        self.time_s = 0.0  # time spent restoring, trimming and re-running accepted tokens
        self.recompute_tokens = 0  # tokens fed a second time
        self._saved: dict[int, tuple] = {}  # id(leaf) -> (leaf, its slots before the forward), until rollback

    def check(self, cache: list, role: str) -> None:
        cache_layers.check(cache, role, self.name)

    def before_forward(self, cache: list) -> None:
        """Keep every recurrent layer's slots; no per-position states needed (returns None: nothing to capture)."""
        for leaf in cache_layers.split(cache).recurrent:
            self._saved[id(leaf)] = (leaf, list(leaf.cache))

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        t0 = time.perf_counter()
        layers = cache_layers.split(cache)
        held = sum(cache_layers.slot_bytes(slots, exclude=leaf.cache) for leaf, slots in self._saved.values())
        self.peak_bytes = max(self.peak_bytes, held)
        saved = []
        for leaf in layers.recurrent:
            entry = self._saved.pop(id(leaf), None)
            saved.append(entry[1] if entry is not None and entry[0] is leaf else None)
        if n_drop > 0:
            if engine is None or fed_ids is None or any(s is None for s in saved):
                raise RuntimeError("rollback=recompute needs before_forward(), engine= and fed_ids=")
            replay(cache, layers, saved, fed_ids, n_drop, engine)
            self.recompute_tokens += len(fed_ids) - n_drop
            self.dropped += n_drop
        self.time_s += time.perf_counter() - t0


def replay(cache: list, layers: cache_layers.Layers, saved: list, fed_ids: list[int], n_drop: int, engine) -> None:
    """Rewind every layer to before `fed_ids`, then feed the kept ones again.

    Args:
        saved: per recurrent part of `layers`, its slots before the forward.
    """
    for leaf, slots in zip(layers.recurrent, saved):
        leaf.cache = list(slots)
    cache_layers.trim(layers.attention, len(fed_ids))
    keep = fed_ids[: len(fed_ids) - n_drop]
    if keep:
        engine.forward(mx.array(keep, dtype=mx.uint32), cache)  # logits unused: only the caches advance
        # Evaluate now, so the cost lands in this stage's time, not the next forward's.
        mx.eval([leaf.cache for leaf in layers.recurrent] + [leaf.state for leaf in layers.attention])
