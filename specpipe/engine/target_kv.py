"""The target's own attention K/V, as a drafter that attends to them sees them (draft=gemma4_assistant).

Contract: a drafter puts a `TargetKv` in its `Capture(kv=...)`; each engine forward that records the
capture (a request's prefill chunks and verifies) points it at the cache it ran on (`attach`), and a batch
lends a row of its storage instead (`lend`, batch/cache.py RowKv: the request's own row, whatever rows join
or leave). `read(length)` then hands back, per attention kind, the K/V of the target's last cache entry of
that kind over positions [.., length): the accepted prefix that the rollback (or the batch's commit) left,
never a position past it. It never runs a model and never changes a cache; which entry is which kind is
introspect's knowledge, where a row's K/V lies in a batch the batch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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


class LentRows(Protocol):
    """One request's row of a batched target cache (batch/cache.py RowKv)."""

    @property
    def layers(self) -> int: ...

    def kv_rows(self, layer: int, length: int, kind: str) -> KvRows:
        """Cache entry `layer`'s K/V of this row over positions [.., length) (a window layer: its last `window`)."""
        ...


class TargetKv:
    """A read-only view of the target cache the last recording forward ran on, or of a batch row lent to it."""

    def __init__(self):
        self._cache: list | None = None
        self._row: LentRows | None = None
        self._types: list[str] | None = None
        self._batched = False

    def attach(self, model, cache: list | None, batched: bool) -> None:
        """Called by the engine: the forward recording this capture runs on `cache`."""
        self._know(model)
        self._cache, self._row, self._batched = cache, None, batched

    def lend(self, model, row: LentRows) -> None:
        """Called by a batch as the request joins it: from now on its K/V is this row of the batch's storage."""
        self._know(model)
        self._cache, self._row, self._batched = None, row, False

    def _know(self, model) -> None:
        if self._types is None:
            self._types = introspect.cache_layer_types(model)
            if self._types is None:
                raise SpecpipeError(
                    f"{type(model).__module__.rsplit('.', 1)[-1]}: its layers do not name their attention kind "
                    "(layer_types); a drafter that attends to the target's KV needs a gemma4 / gemma4_text target"
                )

    def read(self, length: int) -> dict[str, KvRows]:
        """Per attention kind, the K/V of the kind's last cache entry over positions [0, length) (a window
        layer: its last `window` of them).

        Raises:
            SpecpipeError (one line) when no forward recorded into this view, a batched forward did (rows are
            lent by the batch instead), the cache holds fewer than `length` positions, or an entry is of a
            class it cannot read (quantized).
        """
        if self._types is None or (self._cache is None and self._row is None):
            raise SpecpipeError(
                "no target forward recorded the KV this drafter attends to (a draft=chain source cannot lend it): "
                "use the drafter alone (draft=gemma4_assistant)"
            )
        if self._batched:
            raise SpecpipeError(
                "the target's KV came from a batched forward without a row lent to this drafter: a batch lends "
                "each request its own row as it joins (batch/decoder.py)"
            )
        entries = self._row.layers if self._row is not None else len(self._cache or [])
        last: dict[str, int] = {}
        for i, kind in zip(range(entries), self._types):  # entries past the KV-sharing point are not cached
            last[kind] = i
        if self._row is not None:
            row = self._row
            return {kind: row.kv_rows(i, length, kind) for kind, i in last.items()}
        cache = self._cache or []
        return {kind: _rows(cache[i], length, kind) for kind, i in last.items()}


def _rows(entry, length: int, kind: str) -> KvRows:
    if entry.offset < length:
        raise SpecpipeError(
            f"the target's {kind} cache holds {entry.offset} positions, the context needs {length}: "
            "this request's forwards did not record it"
        )
    if isinstance(entry, WindowKVCache):
        first = max(entry.start, length - entry.window)
        keys, values = entry.keys_and_values()
        lo, hi = first - entry.start, length - entry.start
        return KvRows(keys[..., lo:hi, :], values[..., lo:hi, :], first)
    if type(entry) is KVCache:
        return KvRows(entry.keys[..., :length, :], entry.values[..., :length, :], 0)
    raise SpecpipeError(
        f"the target's {kind} cache is a {type(entry).__name__}, which this drafter cannot read (a quantized "
        "cache): use kv=full"
    )
