"""Per-token positions and attention masks for one forward (token trees, batched rows with holes).

Contract: `Engine.forward(ids, cache, positions=, mask=)` hands its arguments to `placed`, which
yields the cache list the model is called with for that one forward, and `refusal` says (one line)
why a model or cache cannot take them. Nothing here changes a class, and the cache objects of the
caller are never replaced: storage, offsets and updates stay theirs.

- positions: int [n] or [B, n], each fed token's absolute (RoPE) position.
- mask: bool [n, L] or [B, n, L], True = may attend. L = C + n, where C counts the key columns the
  cache held before this forward (a plain KVCache: its offset, so column j is position j; a
  RaggedBatch: its shared write column `idx`, holes included) and column C + t is fed token t. A
  layer cache that holds only its newest columns (WindowKVCache) is masked with the mask's last
  columns; a sliding-window layer also hides keys `window` or more positions before each query's
  position, so one mask serves every layer (gemma3's global and sliding layers alike).

How, without patching mlx-lm: its attention layers build masks with `cache.make_mask(N)` and rotate
by `self.rope(x, offset=cache.offset)`. Each attention cache entry is seen through a `FedCache`
whose `make_mask` returns this forward's mask for that layer and whose `offset` is each row's first
position (an int, or one per row: mlx's rope takes a vector). Only when a row's positions are not
consecutive (a tree) is each attention layer's `rope` child replaced, on this model instance and for
this forward only, by `PerTokenRope` (mlx's rope takes one offset per batch row, so each token
becomes its own row), then put back (module swaps live in engine/ only: tests/test_seam.py fails on one anywhere else).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache

from specpipe.engine import introspect
from specpipe.engine.kv import WindowKVCache
from specpipe.errors import SpecpipeError

# Families whose attention reads positions only through `rope(x, offset=cache.offset)` and whose masks
# come from `cache.make_mask` (gemma3 / gemma4: one for their global layers, one with `window_size` for their
# sliding ones): checked against plain forwards in tests/test_positions.py, tests/test_trees.py and
# tests/test_gemma4_trees.py. Others may use the offset elsewhere (attention temperature by position,
# chunked attention) and are refused. gemma4's KV-shared layers (no cache entry of their own) take the K/V,
# the offset and the kind's mask of earlier layers, all built through these wrappers; their own `rope`
# children are swapped too, so their queries sit at each token's position.
# gemma3 / gemma4: the multimodal wrappers around gemma3_text / gemma4_text
POSITIONED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3", "gemma4_text", "gemma4")
# layer caches whose keys a positioned forward can mask (a RaggedBatch's LayerCache says so itself)
ATTENTION_CACHES: tuple[type, ...] = (KVCache, WindowKVCache)
# recurrent layer caches: one state per row that reads every fed token in order; they take
# consecutive positions and a causal mask over the fed tokens (a batch's rows), never a tree
RECURRENT_CACHES: tuple[type, ...] = (ArraysCache,)  # mamba2, qwen3_next, ...: their states live in ArraysCache


def refusal(model: nn.Module, cache: list, model_name: str, arch: str, what: str = "tree verification") -> str | None:
    """One line saying why `what` (a forward with per-token positions and a mask that is not causal)
    cannot run on this model, naming tree=chain; None when it can.

    Refused: a cache layer that cannot hold one (recurrent: a tree's branches cannot share one
    recurrent state; chunked, rotating with sinks, quantized), an untested family, or no `rope`
    child to position tokens with.
    """
    kinds = sorted({type(c).__name__ for c in cache if not _is_attention(c)})
    if kinds:
        return (
            f"{what} needs attention-only KV caches, but {model_name} has {', '.join(kinds)} layers "
            "(recurrent, chunked, rotating with sinks or quantized): use tree=chain with this model"
        )
    if arch not in POSITIONED_ARCHS:
        return f"{what} is checked for {' / '.join(POSITIONED_ARCHS)} attention; {model_name} is {arch}: use tree=chain"
    if not introspect.rope_owners(model):
        return f"{what} positions tokens through each attention layer's rope, which {model_name} lacks: use tree=chain"
    return None


# ---------------------------------------------------------------- one positioned forward


@contextmanager
def placed(ropes: list[nn.Module], cache: list, rows: int, n: int, positions, mask) -> Iterator[list]:
    """The cache list to call the model with so that fed token t of row b sits at positions[b, t] and
    sees what mask[b, t] allows (see the module docstring for shapes).

    Args:
        ropes: the model's rope owners (introspect.rope_owners), swapped only for non-consecutive rows.
        cache: the caller's per-layer cache (updated in place by the forward, as always).
        rows, n: the fed ids' shape [rows, n].
        positions: int [n] / [rows, n] (numpy, list or mx.array) or None: each row continues its cache.
        mask: bool [n, L] / [rows, n, L] or None: causal over the fed tokens, every held key visible.

    Raises:
        SpecpipeError (one line) for a layer that cannot take them; ValueError for a wrong shape.
    """
    columns = _columns_before(cache)
    pos = _positions(cache, positions, rows, n)  # numpy [rows, n]
    consecutive = bool((np.diff(pos, axis=1) == 1).all()) if n > 1 else True
    full = _mask(mask, rows, n, columns)
    _check_layers(cache, consecutive, full, n)
    starts = pos[:, 0]
    offset: Any = int(starts[0]) if rows == 1 or (starts == starts[0]).all() else mx.array(starts)
    pos_mx = mx.array(pos)
    fed = [FedCache(c, full, pos_mx, offset) if _is_attention(c) else c for c in cache]
    if consecutive:
        yield fed
        return
    originals = [m["rope"] for m in ropes]
    try:
        for owner, rope in zip(ropes, originals):
            owner["rope"] = PerTokenRope(rope, pos_mx.reshape(-1))  # this instance's child only; the class is untouched
        yield fed
    finally:
        for owner, rope in zip(ropes, originals):
            owner["rope"] = rope


class FedCache:
    """A layer cache seen through one forward's positions and mask: same storage, same updates.

    `offset`: each row's first position (mlx-lm's rope reads it); `make_mask`: this forward's mask
    cut to the columns this layer holds, with the layer's sliding window applied from the positions.
    """

    def __init__(self, inner, mask: mx.array, positions: mx.array, offset):
        self._inner, self._mask, self._positions, self.offset = inner, mask, positions, offset

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        inner = self._inner
        windows = [w for w in (getattr(inner, "window", None), window_size) if w]
        window = min(windows) if windows else None
        # the columns before the layer's buffer: what a WindowKVCache's update will drop, or what a batch's
        # window layer already freed (batch/cache.py LayerCache.first_column)
        first = inner.next_start() if isinstance(inner, WindowKVCache) else getattr(inner, "first_column", 0)
        mask = self._mask[..., first:]  # [rows, n, L - first]
        if window is not None:
            keys = mx.concatenate(
                [
                    mx.broadcast_to(_held_positions(inner, first), (self._positions.shape[0], mask.shape[-1] - n)),
                    self._positions,
                ],
                axis=1,
            )  # [rows, L - first]: each held column's position
            mask = mask & (self._positions[:, :, None] - keys[:, None, :] < window)
        return mask[0] if mask.shape[0] == 1 else mask[:, None]  # [n, L'] or [rows, 1, n, L']

    def __getattr__(self, name):  # update_and_fetch, keys, state, ...
        return getattr(self._inner, name)


class PerTokenRope(nn.Module):
    """Rotates token t of a [B, H, n, D] input at `positions[b * n + t]` instead of offset + t."""

    def __init__(self, inner: nn.Module, positions: mx.array):
        super().__init__()
        self.inner = inner
        self._positions = positions  # [B * n]

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        # mlx's rope takes one offset per batch row: make each token its own row
        b, h, n, d = x.shape
        rows = x.transpose(0, 2, 1, 3).reshape(b * n, h, 1, d)
        out = self.inner(rows, offset=self._positions)
        return out.reshape(b, n, h, d).transpose(0, 2, 1, 3)


# ---------------------------------------------------------------- inputs


def _is_attention(layer) -> bool:
    return type(layer) in ATTENTION_CACHES or getattr(layer, "positioned", False)


def _columns_before(cache: list) -> int:
    """C: key columns held before this forward (a RaggedBatch's shared write column, else the offset)."""
    for c in cache:
        if getattr(c, "positioned", False):
            return int(c.columns)
        if _is_attention(c):
            return int(c.offset)
    return 0


def _positions(cache: list, positions, rows: int, n: int) -> np.ndarray:
    if positions is None:  # each row continues its own cache (a RaggedBatch keeps one offset per row)
        offset = next((c.offset for c in cache if _is_attention(c)), 0)
        starts = np.broadcast_to(np.asarray(offset, dtype=np.int64).reshape(-1), (rows,))
        return (starts[:, None] + np.arange(n)[None]).astype(np.int32)
    pos = np.asarray(positions, dtype=np.int32)
    if pos.ndim == 1:
        pos = pos[None]
    if pos.shape[-1] != n or pos.shape[0] not in (1, rows):
        raise ValueError(f"positions {pos.shape}: one per fed token, [{n}] or [{rows}, {n}]")
    return np.broadcast_to(pos, (rows, n))


def _mask(mask, rows: int, n: int, columns: int) -> mx.array:
    if mask is None:  # causal over the fed tokens, every held column visible
        return mx.concatenate(
            [mx.ones((1, n, columns), dtype=mx.bool_), mx.tril(mx.ones((1, n, n), dtype=mx.bool_))], -1
        )
    given = mask if isinstance(mask, mx.array) else mx.array(np.asarray(mask))
    m = given[None] if given.ndim == 2 else given
    if m.ndim != 3 or m.shape[1] != n or m.shape[2] != columns + n or m.shape[0] not in (1, rows):
        raise ValueError(
            f"mask {tuple(given.shape)}: [{n}, {columns + n}] or [{rows}, {n}, {columns + n}] "
            "(fed tokens x the cache's columns before this forward plus the fed tokens)"
        )
    return m.astype(mx.bool_)


def _check_layers(cache: list, consecutive: bool, mask: mx.array, n: int) -> None:
    """Refuse a layer that cannot take these positions / this mask (one line)."""
    others = sorted({type(c).__name__ for c in cache if not _is_attention(c) and not isinstance(c, RECURRENT_CACHES)})
    if others:
        raise SpecpipeError(
            f"per-token positions / masks need attention KV caches; this cache has {', '.join(others)} layers "
            "(chunked, rotating with sinks or quantized): use tree=chain, or kv=full"
        )
    if not any(isinstance(c, RECURRENT_CACHES) for c in cache):
        return
    # a recurrent layer reads every fed token of a row in order into one state: it can follow a batch's
    # rows, not a tree's branches
    causal = bool(np.array(mask[..., -n:] == mx.tril(mx.ones((n, n), dtype=mx.bool_))).all())
    if not (consecutive and causal):
        raise SpecpipeError(
            "a recurrent layer keeps one state per row, so a tree's branches cannot share it: "
            "use tree=chain with this model"
        )


def _held_positions(cache, first: int) -> mx.array:
    """[rows or 1, C - first]: the position of each key column the layer holds before this forward."""
    if getattr(cache, "positioned", False):
        return cache.column_positions()  # a RaggedBatch: each row's own positions, holes included
    return mx.arange(first, cache.offset)[None]
