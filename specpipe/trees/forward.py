"""One target forward over a flattened token tree (route a in docs/benchmarks/log/2026-11-30-trees-first-slice.md).

Contract: `tree_forward(engine, cache, root_id, tree)` feeds [root, *nodes]
after the cache's context and returns the engine's ForwardResult: [n + 1,
vocab] float32 logits, row 0 for the root, row i + 1 for node i. Each node attends to the context, the
root and its own ancestors only, and is rotated at position
`offset + depth`, so its logits (and, captured, its final hidden
states) equal those of a plain forward along its own path; in a
sliding-window layer (gemma3's, or kv=window) a node also sees only the
positions within the window of its own position, as it would in that
plain forward. The cache then holds all n + 1 positions; `keep_path`
compacts it.

How, without patching mlx-lm: mlx-lm attention asks `cache.make_mask(N)`
for its mask and calls `self.rope(x, offset=cache.offset)`. For this one
forward the cache entries are wrapped (`_TreeMaskCache` returns the
ancestor mask, limited to each node's window in a window cache) and each
attention layer's `rope` child is replaced on that instance by `_TreeRope`
(rotates each token at its own position), then put back. Only plain
KVCache layers and the engine's WindowKVCache are supported
(`tree_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from specpipe.engine.engine import ForwardResult
from specpipe.engine.kv import WindowKVCache
from specpipe.trees.tree import TokenTree

# Families whose attention reads positions only through `rope(x, offset=cache.offset)` and whose masks come
# from `cache.make_mask` (gemma3: one for its global layers, one with `window_size` for its sliding ones):
# checked against plain forwards in tests/test_trees.py. Others may use the offset elsewhere (attention
# temperature by position, chunked attention) and are refused rather than trusted.
TREE_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3")  # gemma3: the 4b+ wrapper
TREE_CACHES = (KVCache, WindowKVCache)  # layer caches a tree forward can write and `keep_path` compact


def tree_refusal(model: nn.Module, cache: list, model_name: str, arch: str) -> str | None:
    """One line naming tree=chain when the model cannot verify a tree: a cache layer that cannot
    hold one (recurrent, chunked, rotating with sinks, quantized), an untested family, or no `rope`
    child to position nodes."""
    kinds = sorted({type(c).__name__ for c in cache if type(c) not in TREE_CACHES})
    if kinds:
        return (
            f"tree verification needs attention-only KV caches, but {model_name} has {', '.join(kinds)} layers "
            "(recurrent, chunked, rotating with sinks or quantized): use tree=chain with this model"
        )
    if arch not in TREE_ARCHS:
        return (
            f"tree verification is checked for {' / '.join(TREE_ARCHS)} attention; "
            f"{model_name} is {arch}: use tree=chain"
        )
    if not _rope_owners(model):
        return (
            f"tree verification positions nodes through each attention layer's rope, "
            f"which {model_name} lacks: use tree=chain"
        )
    return None


def tree_forward(engine, cache: list, root_id: int, tree: TokenTree, capture=None) -> ForwardResult:
    """Logits for the root and every node of `tree`, through `engine.forward` (its captures included).

    Args:
        engine: the target Engine; its model's attention layers own a `rope` child.
        cache: the target cache (KVCache / WindowKVCache layers), extended in place by n + 1.
        root_id: the newest context token (not yet in the cache).
        tree: the draft nodes.
        capture: as Engine.forward's (HIDDEN: an MTP drafter reads the final hidden states); None: logits only.

    Returns:
        ForwardResult: [n + 1, vocab] float32 logits (lazy), rows as fed (root first); with HIDDEN also
        the [n + 1, hidden] final hidden states.
    """
    offset = cache[0].offset
    ids = mx.array([root_id, *tree.tokens], dtype=mx.uint32)
    if tree.parents == list(range(-1, len(tree) - 1)):
        # a single branch (an n-gram with one match, a pruned tree): the plain causal forward, no wrappers
        return engine.forward(ids, cache, capture=capture)
    depths = mx.array([0, *tree.depths()], dtype=mx.int32)  # root first
    allowed = mx.array(tree.ancestor_mask())  # [n + 1, n + 1]
    wrapped = [_TreeMaskCache(c, depths, allowed) for c in cache]
    with _ropes_at(engine.model, offset + depths):
        return engine.forward(ids, wrapped, capture=capture)


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


# ---------------------------------------------------------------- wrappers


def _first_held(cache) -> int:
    """The position in a layer cache's first storage row: 0, or a WindowKVCache's start."""
    return cache.start if isinstance(cache, WindowKVCache) else 0


def tree_mask(offset: int, first: int, depths: mx.array, allowed: mx.array, window: int | None) -> mx.array:
    """[n + 1, offset - first + n + 1] bool: which held positions each of root + nodes attends to.

    depths: [n + 1] int, the root's 0 then each node's depth; allowed: [n + 1, n + 1] bool, the
    ancestor mask (TokenTree.ancestor_mask); first: the oldest position the layer's cache holds.

    Row i is at position offset + depths[i]. Context positions first..offset-1 are all earlier; tree
    columns follow the ancestor mask. With a window, a query sees only keys less than `window`
    positions before its own (mlx-lm's sliding-window rule, as WindowKVCache.make_mask applies it).
    Example: offset 10, first 6, window 4, a node at depth 2 (position 12) sees context 9 only,
    then root (10) and its depth-1 parent (11).
    """
    ctx = mx.arange(first, offset)[None]
    query = offset + depths[:, None]
    if window is None:
        seen_ctx = mx.ones((depths.shape[0], offset - first), dtype=mx.bool_)
        return mx.concatenate([seen_ctx, allowed], axis=1)
    seen_ctx = query - ctx < window
    seen_tree = allowed & (depths[:, None] - depths[None, :] < window)
    return mx.concatenate([seen_ctx, seen_tree], axis=1)


class _TreeMaskCache:
    """A layer cache seen through a tree mask: same storage, same offset, this forward's mask."""

    def __init__(self, inner: KVCache, depths: mx.array, allowed: mx.array):
        self._inner, self._depths, self._allowed = inner, depths, allowed

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        inner = self._inner
        # the window this layer attends within: its cache's (WindowKVCache) and / or the model's request
        windows = [w for w in (getattr(inner, "window", None), window_size) if w]
        # a window cache drops its oldest positions in the update that follows: mask what will be held
        first = inner.next_start() if isinstance(inner, WindowKVCache) else 0
        return tree_mask(inner.offset, first, self._depths, self._allowed, min(windows) if windows else None)

    def __getattr__(self, name):  # offset, update_and_fetch, keys, state, ...
        return getattr(self._inner, name)


class _TreeRope(nn.Module):
    """Rotates token t of a [B, H, L, D] input at `positions[t]` instead of offset + t."""

    def __init__(self, inner: nn.Module, positions: mx.array):
        super().__init__()
        self.inner = inner
        self._positions = positions

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        # mlx's rope takes one offset per batch row: make each token its own row
        b, h, n, d = x.shape
        rows = x.transpose(0, 2, 1, 3).reshape(b * n, h, 1, d)
        out = self.inner(rows, offset=mx.tile(self._positions, b))
        return out.reshape(b, n, h, d).transpose(0, 2, 1, 3)


@contextmanager
def _ropes_at(model: nn.Module, positions: mx.array) -> Iterator[None]:
    """Swap every attention layer's `rope` child for a _TreeRope on this model instance, and back."""
    owners = _rope_owners(model)
    originals = [m["rope"] for m in owners]
    try:
        for m, rope in zip(owners, originals):
            m["rope"] = _TreeRope(rope, positions)  # this instance's child only; the class is untouched
        yield
    finally:
        for m, rope in zip(owners, originals):
            m["rope"] = rope


def _rope_owners(model: nn.Module) -> list[nn.Module]:
    """The modules (attention layers) that hold a `rope` child module."""
    return [m for _, m in model.named_modules() if isinstance(m.get("rope"), nn.Module)]
