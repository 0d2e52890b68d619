"""Keep some of the positions one forward fed, in place (a token tree's accepted path).

Contract: `keep_path(cache, start, kept_rows)` moves the kept rows' keys and values down to
consecutive positions from `start` in every layer cache and sets each offset to start + kept; the
cache then holds a plain sequence, as if only those tokens had been fed. Works on the layer caches a
positioned forward can write (engine/positions.py ATTENTION_CACHES: KVCache, WindowKVCache).
"""

from __future__ import annotations

import mlx.core as mx

from specpipe.engine.kv import WindowKVCache


def keep_path(cache: list, start: int, kept_rows: list[int]) -> None:
    """Keep only the fed rows `kept_rows` (root first, then the accepted path) after `start`.

    Example: start 100, fed [root, a, b, c] with accepted path b -> kept_rows
    [0, 2]: positions 100 and 102 move to 100 and 101, offset becomes 102.
    """
    contiguous = kept_rows == list(range(len(kept_rows)))
    for c in cache:
        if not contiguous:
            at = start - _first_held(c)  # storage row of position `start` (a window cache has dropped its oldest)
            src = mx.array([at + r for r in kept_rows])
            c.keys[..., at : at + len(kept_rows), :] = c.keys[..., src, :]
            c.values[..., at : at + len(kept_rows), :] = c.values[..., src, :]
        c.offset = start + len(kept_rows)


def _first_held(cache) -> int:
    """The position in a layer cache's first storage row: 0, or a WindowKVCache's start."""
    return cache.start if isinstance(cache, WindowKVCache) else 0
