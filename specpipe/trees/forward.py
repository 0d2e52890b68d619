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

A tree is only positions and a mask: this module builds both and calls
`Engine.forward(ids, cache, positions=, mask=)`; how a model takes them
(and which models cannot: `tree_refusal`) is the engine's
(engine/positions.py). Nothing here touches a model's modules.
"""

from __future__ import annotations

import mlx.core as mx

from specpipe.engine.engine import ForwardResult
from specpipe.engine.keep import keep_path
from specpipe.engine.positions import ATTENTION_CACHES, POSITIONED_ARCHS
from specpipe.engine.positions import refusal as tree_refusal
from specpipe.trees.tree import TokenTree

TREE_ARCHS = POSITIONED_ARCHS  # the families a tree forward is checked on (engine/positions.py)
TREE_CACHES = ATTENTION_CACHES  # layer caches a tree forward can write and `keep_path` compact

__all__ = ["TREE_ARCHS", "TREE_CACHES", "keep_path", "tree_forward", "tree_mask", "tree_refusal"]


def tree_forward(engine, cache: list, root_id: int, tree: TokenTree, capture=None) -> ForwardResult:
    """Logits for the root and every node of `tree`, through `engine.forward` (its captures included).

    Args:
        engine: the target Engine (its model passes `tree_refusal`).
        cache: the target cache (KVCache / WindowKVCache layers), extended in place by n + 1.
        root_id: the newest context token (not yet in the cache).
        tree: the draft nodes.
        capture: as Engine.forward's (HIDDEN: an MTP drafter reads the final hidden states); None: logits only.

    Returns:
        ForwardResult: [n + 1, vocab] float32 logits (lazy), rows as fed (root first); with HIDDEN also
        the [n + 1, hidden] final hidden states.
    """
    ids = mx.array([root_id, *tree.tokens], dtype=mx.uint32)
    if tree.parents == list(range(-1, len(tree) - 1)):
        # a single branch (an n-gram with one match, a pruned tree): the plain causal forward
        return engine.forward(ids, cache, capture=capture)
    offset = cache[0].offset
    depths = mx.array([0, *tree.depths()], dtype=mx.int32)  # root first
    mask = tree_mask(offset, 0, depths, mx.array(tree.ancestor_mask()), None)  # [n + 1, offset + n + 1]
    return engine.forward(ids, cache, capture=capture, positions=offset + depths, mask=mask)


def tree_mask(offset: int, first: int, depths: mx.array, allowed: mx.array, window: int | None) -> mx.array:
    """[n + 1, offset - first + n + 1] bool: which positions from `first` on each of root + nodes attends to.

    depths: [n + 1] int, the root's 0 then each node's depth; allowed: [n + 1, n + 1] bool, the
    ancestor mask (TokenTree.ancestor_mask); first: the oldest position a layer's cache holds.

    Row i is at position offset + depths[i]. Context positions first..offset-1 are all earlier; tree
    columns follow the ancestor mask. With a window, a query sees only keys less than `window`
    positions before its own (mlx-lm's sliding-window rule; the engine applies it per layer, so
    `tree_forward` passes first 0 and no window).
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
