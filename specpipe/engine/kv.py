"""KV cache policies (`kv=full | quantized | window`): which cache each attention layer gets.

Contract: a policy's `check(engine)` raises SpecpipeError (one line) when the
model cannot use it, before anything runs; `make_cache(model)` returns the
model's own prompt cache (`model_cache`) with every plain `KVCache` replaced
(recurrent and model-specific layers are kept). Every cache made here
truncates exactly, so every rollback strategy stays lossless: greedy
speculation on a `kv` choice equals plain decoding on the same choice.

`model_cache` is the model's own cache with each of its sliding-window
layers (mlx-lm's `RotatingKVCache(keep=0)`, e.g. gemma3's) swapped for a
`WindowKVCache` of the same window: the same attention, but rollbacks past
the wrap stay exact. A rotating layer with attention sinks (keep > 0) is
kept, and rollbacks/layers.py refuses it before a run. Chunked-attention
layers (mlx-lm's `ChunkedKVCache`, llama4's) become `ExactChunkedKVCache`,
which keeps a rollback margin before the current chunk (see its docstring).

- `full`: mlx-lm's KVCache, every position in the model's precision.
- `quantized`: mlx-lm's QuantizedKVCache (`bits` 4 / 8, `group_size`):
  each position's keys and values are quantized on their own, so a prompt
  fed in chunks or a token at a time stores the same numbers; `trim` is
  `offset -= n`. Needs attention that goes through mlx-lm's
  `base.scaled_dot_product_attention` (llama, qwen2, qwen3, ...; not gemma2).
- `window`: attention over the last `size` positions, as mlx-lm's
  `RotatingKVCache(max_size=size, keep=0)` computes it. That class cannot
  give positions back once it has wrapped (`is_trimmable` is
  `offset < max_size`; a trim after wrapping corrupts its ring order), so
  `WindowKVCache` below keeps `MARGIN` positions beyond the window and drops
  older ones in blocks: a step can give back up to MARGIN positions exactly.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import base as mlx_base
from mlx_lm.models.cache import (
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from specpipe.errors import SpecpipeError

MARGIN = 256  # positions kept past the window: more than any step feeds and gives back (2 * (K + 1), K <= 64)


class FullKV:
    name = "full"

    def __init__(self):
        pass

    def check(self, engine) -> None:
        pass

    def make_cache(self, model) -> list:
        return model_cache(model)


class QuantizedKV:
    name = "quantized"

    def __init__(self, bits: int = 8, group_size: int = 64):
        if bits not in (4, 8):
            raise SpecpipeError(f"kv.bits={bits}: quantized KV caches take 4 or 8 bits")
        if group_size not in (32, 64, 128):
            raise SpecpipeError(f"kv.group_size={group_size}: use 32, 64 or 128")
        self.bits, self.group_size = bits, group_size

    def check(self, engine) -> None:
        if not uses_base_attention(engine.model):
            raise SpecpipeError(
                f"kv=quantized: {engine.info.name} ({engine.info.arch}) computes attention without mlx-lm's "
                "quantized-cache path; use kv=full or kv=window"
            )
        _require_plain_layers(make_prompt_cache(engine.model), engine, "quantized")
        head_dim = _model_head_dim(engine.model)
        if head_dim and head_dim % self.group_size:
            raise SpecpipeError(
                f"kv.group_size={self.group_size} does not divide {engine.info.name}'s head size {head_dim}: "
                + (
                    f"use a kv.group_size of 32, 64 or 128 that divides {head_dim}"
                    if head_dim % 32 == 0
                    else "use kv=full"
                )
            )

    def make_cache(self, model) -> list:
        return [
            _replace(c, lambda: QuantizedKVCache(group_size=self.group_size, bits=self.bits))
            for c in model_cache(model)
        ]


class WindowKV:
    name = "window"

    def __init__(self, size: int = 4096):
        if size < 1:
            raise SpecpipeError(f"kv.size={size}: a window holds at least one position")
        self.size = size
        self.margin = MARGIN

    def check(self, engine) -> None:
        _require_plain_layers(make_prompt_cache(engine.model), engine, "window")

    def make_cache(self, model) -> list:
        return [_replace(c, lambda: WindowKVCache(self.size, self.margin)) for c in model_cache(model)]


def model_cache(model) -> list:
    """The model's own prompt cache, each layer that drops old positions as an exact twin.

    mlx-lm's RotatingKVCache cannot give positions back once it has wrapped,
    so a rollback past the window would keep rejected drafts (or fail);
    WindowKVCache attends the same way and truncates exactly. ChunkedKVCache
    keeps only the last chunk_size positions of the forward before, so a
    rollback over several forwards (a draft model's chain) would lose the
    start of the current chunk; ExactChunkedKVCache keeps a margin.
    """
    return [_exact(c) for c in make_prompt_cache(model)]


def _exact(layer):
    """`layer`, or an exact twin of a RotatingKVCache(keep=0) / ChunkedKVCache (also inside a CacheList)."""
    if isinstance(layer, CacheList):
        return CacheList(*(_exact(c) for c in layer.caches))
    if type(layer) is RotatingKVCache and layer.keep == 0:
        return WindowKVCache(layer.max_size)
    if type(layer) is ChunkedKVCache:
        return ExactChunkedKVCache(layer.chunk_size)
    return layer


# ---------------------------------------------------------------- the sliding-window cache


class WindowKVCache(KVCache):
    """KV positions [start, offset) kept in order; each query attends to the last `size` positions.

    `offset` counts every position ever fed (rotary embeddings need it); the
    buffer starts at absolute position `start`. Worked example (size 4,
    MARGIN 2): after 9 positions the buffer may hold 3..8 (start 3); a query
    at position 9 sees 6, 7, 8 and itself, masked from the buffer. Once more
    than size + 2 * MARGIN positions are held, the oldest are dropped down to
    size + MARGIN, so `trim(n)` for n <= MARGIN never needs a dropped one.
    """

    def __init__(self, size: int, margin: int = MARGIN):
        super().__init__()
        # KVCache's own fields, restated so mypy knows their types (mlx-lm is untyped here)
        self.offset: int = 0
        self.keys: Any = None
        self.values: Any = None
        self.window, self.margin = size, margin
        self.start = 0

    def update_and_fetch(self, keys, values):
        self._evict()
        held, fed = self.offset - self.start, keys.shape[2]
        if self.keys is None or held + fed > self.keys.shape[2]:
            # grow in whole steps, as KVCache does (fewer reallocations)
            grow = (self.step + fed - 1) // self.step * self.step
            new_k = mx.zeros((*keys.shape[:2], grow, keys.shape[3]), keys.dtype)
            new_v = mx.zeros((*values.shape[:2], grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :held, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :held, :], new_v], axis=2)
        self.keys[..., held : held + fed, :] = keys
        self.values[..., held : held + fed, :] = values
        self.offset += fed
        return self.keys_and_values()

    def keys_and_values(self):
        held = self.offset - self.start
        if held < self.keys.shape[2]:
            return self.keys[..., :held, :], self.values[..., :held, :]
        return self.keys, self.values

    def _evict(self) -> None:
        drop = self.next_start() - self.start
        if drop:
            held = self.offset - self.start
            self.keys = self.keys[..., drop:held, :]
            self.values = self.values[..., drop:held, :]
            self.start += drop

    def next_start(self) -> int:
        """Where the buffer will start once the next update has dropped what it drops.

        The model builds its mask from the first layer's cache before any layer
        updates, so the mask must already see the buffer the update will leave.
        """
        held = self.offset - self.start
        if self.keys is None or held <= self.window + 2 * self.margin:
            return self.start
        return self.offset - (self.window + self.margin)

    def make_mask(self, N: int, window_size=None, return_array: bool = False, **_unused):
        """Causal, limited to the last `window` positions (built before this forward's update).

        A model may ask for a narrower window (`window_size`), as RotatingKVCache honours.
        """
        window = min(self.window, window_size) if window_size else self.window
        start = self.next_start()
        if start > self.offset + N - 1 - window and not return_array:
            return "causal" if N > 1 else None  # every held position is inside the newest query's window
        queries = mx.arange(self.offset, self.offset + N)[:, None]
        keys = mx.arange(start, self.offset + N)[None]
        return (queries >= keys) & (queries < keys + window)

    def size(self) -> int:
        return self.offset - self.start

    def trim(self, n: int) -> int:
        n = min(self.offset - self.start, n)
        # the next query (at offset - n) needs positions from offset - n - window + 1 on
        if self.start > max(0, self.offset - n - self.window + 1):
            raise SpecpipeError(
                f"kv=window: a rollback of {n} positions reaches past the margin of {self.margin} positions kept "
                f"beyond the window; use a budget with K below {self.margin // 2 - 1}"
            )
        self.offset -= n
        return n

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.start

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.start = v

    def to_quantized(self, group_size: int = 64, bits: int = 4):
        raise NotImplementedError("kv=window does not combine with quantization")


# ---------------------------------------------------------------- the chunked-attention cache


class ExactChunkedKVCache(ChunkedKVCache):
    """mlx-lm's ChunkedKVCache (llama4's chunked layers) that gives back up to `margin` positions exactly.

    A query at position p attends to its own chunk only, [p // C * C, p] for
    chunk size C. mlx-lm's cache keeps, before each forward, the last C
    positions (from offset - C), and the model masks with `start_position`.
    That is enough to roll back the forward just fed, not several: after a
    draft model's one-token forwards at offsets 62..69 (C = 32) it starts at
    37, and a rollback to 63 would leave position 63's query without 32..36.
    This cache drops in whole chunks, and only those before the chunk of
    `offset - margin`: it always starts on a chunk's first position, so it can
    give back every position it holds, and it holds at least `margin`
    (worked example: offset 300, C 32, margin 256 -> it keeps 32..299; a
    rollback to 44 still sees 32..43).
    """

    def __init__(self, chunk_size: int, margin: int = MARGIN):
        super().__init__(chunk_size)
        # ChunkedKVCache's own fields, restated so mypy knows their types (mlx-lm is untyped here)
        self.offset: int = 0
        self.start_position: int = 0
        self.chunk_size: int = chunk_size
        self.keys: Any = None
        self.values: Any = None
        self.margin = margin

    def maybe_trim_front(self):
        """Drop the chunks no query can reach, even after a rollback of `margin` (the model calls this
        before each forward, then masks from `start_position`)."""
        if self.keys is None:
            return
        drop = self._chunk_start(max(0, self.offset - self.margin)) - self.start_position
        if drop > 0:
            held = self.offset - self.start_position
            self.keys = self.keys[..., drop:held, :]
            self.values = self.values[..., drop:held, :]
            self.start_position += drop

    def _chunk_start(self, position: int) -> int:
        return position // self.chunk_size * self.chunk_size

    def size(self) -> int:
        return self.offset - self.start_position

    def trim(self, n: int) -> int:
        # the buffer starts on a chunk's first position, so the next query (at offset - n) finds its whole
        # chunk whenever offset - n is still held
        if n > self.offset - self.start_position:
            raise SpecpipeError(
                f"a rollback of {n} positions reaches past the margin of {self.margin} positions kept before the "
                f"attention chunk; use a budget with K below {self.margin // 2 - 1}"
            )
        self.offset -= n
        return n


# ---------------------------------------------------------------- helpers


def _replace(layer, make):
    """A fresh cache from `make` where the model uses a plain KVCache; any other layer as it is."""
    return make() if type(layer) is KVCache else layer


def _require_plain_layers(cache: list, engine, option: str) -> None:
    if not any(type(c) is KVCache for c in cache):
        kinds = ", ".join(sorted({type(c).__name__ for c in cache}))
        raise SpecpipeError(
            f"kv={option}: {engine.info.name} has no plain attention KV layers to change "
            f"(its caches: {kinds}); use kv=full"
        )


def uses_base_attention(model) -> bool:
    """True when some module of the model calls mlx-lm's base scaled_dot_product_attention
    (the function that dispatches to the quantized kernel when the cache has `bits`)."""
    import sys

    for module in model.modules():
        namespace = sys.modules.get(type(module).__module__)
        if getattr(namespace, "scaled_dot_product_attention", None) is mlx_base.scaled_dot_product_attention:
            return True
    return False


def _model_head_dim(model) -> int | None:
    args = getattr(model, "args", None)
    head_dim = getattr(args, "head_dim", None)
    if head_dim:
        return int(head_dim)
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    return hidden // heads if hidden and heads else None


def kv_figures(cache: list | None) -> dict:
    """The bytes the KV cache's held positions take, and per position, for RunStats (kv_bytes, kv_bytes_per_token).

    A layer's buffer grows ahead of its positions (mlx-lm allocates 256 columns at a time), so each layer counts
    its bytes per column times the positions it holds: a lone row and a batched row holding the same positions
    (batch/cache.py `RaggedBatch.kv_figures`) report the same bytes. A recurrent state counts whole.
    """
    if not cache:
        return {}
    total, positions = 0.0, 0
    for c in cache:
        try:
            nbytes = c.nbytes
        except (NotImplementedError, AttributeError):
            continue
        held, columns = _held_and_columns(c)
        total += nbytes * min(held, columns) / columns if columns else nbytes
        positions = max(positions, c.size() or getattr(c, "offset", 0))
    return {"kv_bytes": int(total), "kv_bytes_per_token": total / positions if positions else 0.0}


def _held_and_columns(c) -> tuple[int, int]:
    """(positions the layer holds, columns its buffer has); columns 0: no columns (a recurrent state)."""
    keys = getattr(c, "keys", None)
    if keys is None:
        return 0, 0
    columns = int((keys[0] if isinstance(keys, (tuple, list)) else keys).shape[2])
    held = c.offset - c.start if isinstance(c, WindowKVCache) else int(c.size() or c.offset)
    return held, columns
