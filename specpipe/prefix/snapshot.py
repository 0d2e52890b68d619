"""Copies of a cache (target or draft) as it stood after some positions, restored into a fresh cache exactly.

Contract: `take(cache, length)` copies every leaf's held state into new arrays (MLX caches are written in place by
slice assignment, so a snapshot that shared an array with a live cache would change under it) and returns a
`Snapshot`, or raises `NotStorable` naming a leaf kind it cannot copy. `restore(snapshot, fresh, length)`
writes those arrays into `fresh` (a cache of the same model and KV policy) and returns it: the
cache a run would have had after feeding the same ids, position for position. Never runs a model.

Full and quantized KV are restored as new array objects over the snapshot's buffers, not copies: an MLX write
(`keys[..., a:b, :] = x`) rebinds the array object it is made through to a new result and reuses a buffer in place
only when nothing else holds it, so the snapshot, holding its own objects, never changes; and a restored
KVCache holds exactly its positions, so its first write grows it (mlx-lm's concatenate: the one copy a restore
needs, made by the prefill of the rest instead of before it). The other kinds are copied.

What each leaf kind keeps (engine/kv.py, rollbacks/layers.py):
- KVCache (kv=full) and QuantizedKVCache (kv=quantized): the first `length` columns (a cache holding more,
  a draft model's, is cut); these hold every position, so a snapshot also restores any shorter length
  exactly (`Snapshot.trimmable`).
- WindowKVCache (sliding-window layers, kv=window) and ExactChunkedKVCache: the held buffer and where it
  starts; only the stored length is restored.
- ArraysCache (recurrent / hybrid layers: SSM, gated-delta, conv states): the state after the stored
  positions, one state for "everything so far", so only the stored length is restored; never approximate.
- anything else (RotatingKVCache with attention sinks): NotStorable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache

from specpipe.engine.kv import ExactChunkedKVCache, WindowKVCache


class NotStorable(Exception):
    """A cache with a leaf kind the store cannot copy exactly (the message names it)."""


@dataclass(frozen=True)
class Snapshot:
    leaves: tuple[tuple[type[Any], tuple], ...]  # per leaf, in cache order: (its type, its copied state)
    length: int  # positions the cache held
    nbytes: int
    trimmable: bool  # every leaf holds every position: any shorter length restores exactly


def _copy(a: mx.array) -> mx.array:
    return mx.array(a)  # a new array: a later in-place write to either side leaves the other as it was


def _leaves(cache: list) -> list[Any]:
    out: list[Any] = []
    for entry in cache:
        out.extend(_leaves(list(entry.caches)) if isinstance(entry, CacheList) else [entry])
    return out


def take(cache: list, length: int) -> Snapshot:
    """Copy `cache`, which holds `length` positions.

    Raises:
        NotStorable: a leaf kind without an exact copy here (its type named).
    """
    leaves: list[tuple[type[Any], tuple]] = []
    arrays: list[mx.array] = []
    trimmable = True
    for leaf in _leaves(cache):
        kind = type(leaf)
        if kind in (WindowKVCache, ExactChunkedKVCache):
            start = leaf.start if kind is WindowKVCache else leaf.start_position
            held = leaf.offset - start
            keys, values = _cut(leaf.keys, held), _cut(leaf.values, held)
            state: tuple = (keys, values, leaf.offset, start)
            arrays += [a for a in (keys, values) if a is not None]
            trimmable = False
        elif kind is KVCache:  # holding more than `length` (a draft cache): its first `length` positions
            _check_holds(leaf, length)
            keys, values = _cut(leaf.keys, length), _cut(leaf.values, length)
            state = (keys, values, length)
            arrays += [a for a in (keys, values) if a is not None]
        elif kind is QuantizedKVCache:
            _check_holds(leaf, length)
            keys = None if leaf.keys is None else tuple(_cut(k, length) for k in leaf.keys)
            values = None if leaf.values is None else tuple(_cut(v, length) for v in leaf.values)
            state = (keys, values, length, leaf.group_size, leaf.bits)
            arrays += [*(keys or ()), *(values or ())]
        elif isinstance(leaf, ArraysCache):
            if leaf.left_padding is not None or leaf.lengths is not None:
                raise NotStorable(f"a batched {kind.__name__} (left padding) is no single request's state")
            slots = [None if s is None else _copy(s) for s in leaf.cache]
            state = (slots,)
            arrays += [s for s in slots if s is not None]
            trimmable = False
        else:
            raise NotStorable(
                f"{kind.__name__} layers cannot be stored exactly (prefix_cache keeps full, "
                "quantized, window, chunked and recurrent layers)"
            )
        if kind in (WindowKVCache, ExactChunkedKVCache) and leaf.offset != length:
            raise NotStorable(f"a {kind.__name__} holds {leaf.offset} positions, not the {length} stored")
        leaves.append((kind, state))
    mx.eval(*arrays)
    return Snapshot(tuple(leaves), length, sum(a.nbytes for a in arrays), trimmable)


def _check_holds(leaf, length: int) -> None:
    if leaf.offset < length:
        raise NotStorable(f"a {type(leaf).__name__} holds {leaf.offset} positions, not the {length} stored")


def restore(snapshot: Snapshot, fresh: list, length: int | None = None) -> list:
    """`fresh` (a new cache of the same model and policy) holding the snapshot's first `length` positions.

    Args:
        snapshot: what `take` copied.
        fresh: an empty cache from the same `make_cache`; filled in place and returned.
        length: positions to restore (default: all); shorter only for a trimmable snapshot.
    """
    length = snapshot.length if length is None else length
    if length != snapshot.length and not (snapshot.trimmable and 0 < length < snapshot.length):
        raise ValueError(
            f"restore: {length} of a {snapshot.length}-position snapshot (trimmable: {snapshot.trimmable})"
        )
    leaves = _leaves(fresh)
    if len(leaves) != len(snapshot.leaves):
        raise ValueError(f"restore: a cache of {len(leaves)} layers for a snapshot of {len(snapshot.leaves)}")
    for leaf, (kind, state) in zip(leaves, snapshot.leaves):
        if type(leaf) is not kind:
            raise ValueError(f"restore: a {type(leaf).__name__} layer for a stored {kind.__name__}")
        if kind is KVCache:  # views, not copies (the module docstring says why the entry stays as it was)
            leaf.state = (_cut(state[0], length, copy=False), _cut(state[1], length, copy=False), length)
        elif kind is QuantizedKVCache:
            keys, values = (None if p is None else tuple(_cut(a, length, copy=False) for a in p) for p in state[:2])
            leaf.state = (keys, values, length, state[3], state[4])
        elif kind in (WindowKVCache, ExactChunkedKVCache):
            keys, values, offset, start = state
            keys, values = _cut(keys, None, copy=True), _cut(values, None, copy=True)
            if kind is WindowKVCache:
                leaf.state = (keys, values, offset, start)
            else:
                leaf.state = (keys, values, offset, leaf.chunk_size, start)
        else:
            leaf.cache = [None if s is None else _copy(s) for s in state[0]]
    return fresh


def _cut(a: Any, n: int | None, copy: bool = True) -> Any:
    """The first n columns (axis 2, positions) of a KV array, copied or (copy=False, n given) a new array object
    over the same buffer; None stays None."""
    if a is None:
        return None
    if not copy and n is not None:
        return a[..., :n, :]
    return _copy(a if n is None else a[..., :n, :])
