"""Greedy comparison on a token tree: the longest root-to-leaf path that the
target's argmax would have produced, and the token after it.

Contract: `pick_path(tree, argmax_ids)` reads the target's argmax per fed
row (row 0: the root, row i + 1: node i) and returns the accepted node
indices and the target's next token. Lossless by construction: every
accepted token is the argmax after its own path, which is what decoding
without a draft emits. Sampling on trees is refused (session: tree=chain).

Worked example: tree tokens [5, 7, 9], parents [-1, 0, 0]; argmax per row
[5, 9, 1, 8]: the root's argmax 5 is node 0, node 0's argmax 9 is node 2,
node 2 (row 3) has no children -> path [0, 2], next token 8 (a bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    node, path = -1, []
    while True:
        want = argmax_ids[node + 1]
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return TreeVerdict(path=path, next_id=want, bonus=node not in children)
        path.append(nxt)
        node = nxt
