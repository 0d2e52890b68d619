"""The target's own attention K/V, as a drafter that attends to them sees them (draft=gemma4_assistant).

Contract: a drafter puts a `TargetKv` in its `Capture(kv=...)`; each engine forward that records the
capture (the pipeline's prefill chunks and verifies) points it at the cache it ran on. `read(length)`
then hands back, per attention kind, the K/V of the target's last cache entry of that kind over
positions [.., length): the accepted prefix that the pipeline's rollback left, never a position past it.
It never runs a model and never changes a cache; which entry is which kind is introspect's knowledge.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specpipe.engine import introspect
from specpipe.engine.kv import WindowKVCache
from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class KvRows:
    """One attention kind's K/V, oldest position first.

    keys, values: [1, kv_heads, n, head_dim] (after the target's k_norm / RoPE, as its attention reads them).
    first: the absolute position of row 0 (> 0 for a sliding-window layer past its window).
    """

    keys: mx.array
    values: mx.array
    first: int


class TargetKv:
    """A read-only view of the target cache the last recording forward ran on."""

    def __init__(self):
        self._cache: list | None = None
        self._types: list[str] | None = None
        self._batched = False

    def attach(self, model, cache: list | None, batched: bool) -> None:
        """Called by the engine: the forward recording this capture runs on `cache`."""
        if self._types is None:
            self._types = introspect.cache_layer_types(model)
            if self._types is None:
                raise SpecpipeError(
                    f"{type(model).__module__.rsplit('.', 1)[-1]}: its layers do not name their attention kind "
                    "(layer_types); a drafter that attends to the target's KV needs a gemma4 / gemma4_text target"
                )
        self._cache, self._batched = cache, batched

    def read(self, length: int) -> dict[str, KvRows]:
        """Per attention kind, the K/V of the kind's last cache entry over positions [0, length) (a window
        layer: its last `window` of them).

        Raises:
            SpecpipeError (one line) when no forward recorded into this view, a batched forward did, the cache
            holds fewer than `length` positions, or an entry is of a class it cannot read (quantized).
        """
        if self._cache is None or self._types is None:
            raise SpecpipeError(
                "no target forward recorded the KV this drafter attends to (a draft=chain source or a batch row "
                "cannot lend it): use the drafter alone in a single-request run"
            )
        if self._batched:
            raise SpecpipeError("the target's KV came from a batched forward: this drafter reads one request's cache")
        last: dict[str, object] = {}
        for kind, entry in zip(self._types, self._cache):  # entries past the KV-sharing point are not cached
            last[kind] = entry
        return {kind: _rows(entry, length, kind) for kind, entry in last.items()}


def _rows(entry, length: int, kind: str) -> KvRows:
    if entry.offset < length:
        raise SpecpipeError(
            f"the target's {kind} cache holds {entry.offset} positions, the context needs {length}: "
            "this request's forwards did not record it (batched decoding does not lend it: one request at a time)"
        )
    if isinstance(entry, WindowKVCache):
        first = max(entry.start, length - entry.window)
        keys, values = entry.keys_and_values()
        lo, hi = first - entry.start, length - entry.start
        return KvRows(keys[..., lo:hi, :], values[..., lo:hi, :], first)
    if type(entry) is KVCache:
        return KvRows(entry.keys[..., :length, :], entry.values[..., :length, :], 0)
    raise SpecpipeError(
        f"the target's {kind} cache is a {type(entry).__name__}, which this drafter cannot read (a batched or "
        "quantized cache): run one request at a time with kv=full"
    )
