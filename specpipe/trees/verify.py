"""Greedy comparison on a token tree: the longest root-to-leaf path that the
target's argmax would have produced, and the token after it.

Contract: `pick_path(tree, argmax_ids)` reads the target's argmax per fed
row (row 0: the root, row i + 1: node i) and returns the accepted node
indices and the target's next token. Lossless by construction: every
accepted token is the argmax after its own path, which is what decoding
without a draft emits. `pick_path_sampled` is the sampling counterpart
(recursive rejection sampling over each node's children, SpecInfer).

Worked example: tree tokens [5, 7, 9], parents [-1, 0, 0]; argmax per row
[5, 9, 1, 8]: the root's argmax 5 is node 0, node 0's argmax 9 is node 2,
node 2 (row 3) has no children -> path [0, 2], next token 8 (a bonus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specpipe.trees.tree import TokenTree


@dataclass
class TreeVerdict:
    path: list[int]  # accepted node indices, root's child first
    next_id: int  # the target's token after the path
    bonus: bool  # True when the path ends at a leaf (nothing drafted was rejected there)


def pick_path(tree: TokenTree, argmax_ids: list[int]) -> TreeVerdict:
    """The accepted path.

    Args:
        tree: the verified nodes (children unique per parent: TokenTree.add deduplicates).
        argmax_ids: [n + 1] the target's argmax per fed row.
    """
    children: dict[int, dict[int, int]] = {}
    for i, (tok, parent) in enumerate(zip(tree.tokens, tree.parents)):
        children.setdefault(parent, {})[tok] = i
    node, path = -1, list[int]()
    while True:
        want = argmax_ids[node + 1]
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return TreeVerdict(path=path, next_id=want, bonus=node not in children)
        path.append(nxt)
        node = nxt


def pick_path_sampled(
    tree: TokenTree,
    target_probs: Callable[[int], np.ndarray],
    uniform: Callable[[], float],
    sample: Callable[[np.ndarray], int],
    residual: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> TreeVerdict:
    """Multi-candidate rejection sampling: the output is distributed exactly as the target samples.

    At a node with target distribution p, try its children best-scored
    first: child token x is accepted with probability p(x) (the children
    are fixed by the context, so each is a point-mass proposal); on
    rejection p becomes the residual, p with x removed and renormalised,
    for the next child. After the last rejection (or at a leaf) the next
    token is sampled from what is left. By induction P(token = y) = p(y).

    Example: p = [0.5, 0.3, 0.2], children tokens 1 then 0: accept 1 with
    0.3; else p -> [5/7, 0, 2/7], accept 0 with 5/7; else sample 2.

    Args:
        target_probs: row -> [vocab] processed target probabilities (row 0 the root, node i at i + 1).
        uniform: a draw from U[0, 1) (the sampler's key stream).
        sample: a token drawn from a [vocab] distribution.
        residual: (p, rejected token) -> next p; the correct rule unless a test swaps in a broken one.
    """
    residual = residual or _without
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    node, path = -1, list[int]()
    while True:
        p = target_probs(node + 1)
        kids = sorted(children.get(node, []), key=lambda i: -tree.scores[i])
        chosen = None
        for kid in kids:
            tok = tree.tokens[kid]
            if uniform() < p[tok]:
                chosen = kid
                break
            p = residual(p, tok)
        if chosen is None:
            return TreeVerdict(path=path, next_id=sample(p), bonus=not kids)
        path.append(chosen)
        node = chosen


def _without(p: np.ndarray, token: int) -> np.ndarray:
    """p with `token` removed, renormalised (max(0, p - onehot(token)) / Z)."""
    p = p.copy()
    p[token] = 0.0
    total = p.sum()
    return p / total if total > 0 else p
