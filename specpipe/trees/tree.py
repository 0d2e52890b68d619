"""The token tree: draft nodes, their parents and draft scores, and the
shapes that select a tree from a drafter's scored candidates.

Contract: pure Python, no MLX. Node i has token `tokens[i]`, parent
`parents[i]` (-1: a child of the root, the newest context token, which the
verify feeds first) and a score (draft probability of the whole path, or
the share of n-gram matches through it). Parents come before children, so
the flattened order is a valid forward order. A tree a model drafter drew
under sampling also records, per expanded node, the distribution q its
children were drawn from and their draw order (`drawn`, keyed by the node's
token path: the key survives `select_*` and every other cut, which re-index
nodes), for recursive rejection sampling (trees/verify.py).

Worked example: root r, tokens [5, 7, 9, 4], parents [-1, 0, 0, -1]
    r ── 5 ── 7
    │    └─── 9
    └─── 4
depths [1, 2, 2, 1]; path_to(2) == [0, 2] (tokens 5, 9).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Drawn:
    """A node's children as a model drafter drew them under sampling."""

    q: np.ndarray  # [vocab] the drafter's processed distribution at the node (the sampler's probs)
    order: list[int]  # the drawn tokens, distinct, in draw order (the first is the chain's next token)


@dataclass
class TokenTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    # token path from the root (() = the root itself) -> how that node's children were drawn; empty for
    # greedy and point-mass candidates (n-gram, lookahead, a greedy top-k chain)
    drawn: dict[tuple[int, ...], Drawn] = field(default_factory=dict)

    @classmethod
    def chain(cls, token_ids: list[int]) -> TokenTree:
        """A single branch (today's draft)."""
        tree = cls()
        for i, tid in enumerate(token_ids):
            tree.add(tid, i - 1)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, score: float = 1.0) -> int:
        """Add `token` under `parent` unless that child exists (prefixes stay deduplicated); its index."""
        for i in self.children(parent):
            if self.tokens[i] == token:
                self.scores[i] = max(self.scores[i], score)
                return i
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(float(score))
        return len(self.tokens) - 1

    def children(self, parent: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == parent]

    def depths(self) -> list[int]:
        """Depth of each node (1 for children of the root)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def path_tokens(self, node: int) -> tuple[int, ...]:
        """The tokens from the root's child down to `node` (() for node -1): the key of `drawn`."""
        return tuple(self.tokens[i] for i in self.path_to(node))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for node -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> np.ndarray:
        """[n + 1, n + 1] bool: row i may attend to column j (root at 0, node i at i + 1).

        Each fed position sees itself, its ancestors and the root: the
        attention a plain sequence along its own path would have had.
        """
        n = len(self)
        mask = np.zeros((n + 1, n + 1), dtype=bool)
        mask[:, 0] = True
        mask[0, 0] = True
        for i, p in enumerate(self.parents):
            row = i + 1
            mask[row, row] = True
            if p >= 0:
                mask[row] |= mask[p + 1]
        return mask


# ---------------------------------------------------------------- shapes


def select_static(candidates: TokenTree, branching: list[int]) -> TokenTree:
    """At depth d keep the `branching[d-1]` best-scored children of every kept node.

    Example: branching [2, 1] over candidates with root children a (0.6),
    b (0.3), c (0.1) and a's child x -> a, b, x (c cut at depth 1).
    """
    tree = TokenTree()

    def grow(cand_parent: int, tree_parent: int, depth: int) -> None:
        if depth > len(branching):
            return
        kids = sorted(candidates.children(cand_parent), key=lambda i: -candidates.scores[i])[: branching[depth - 1]]
        for c in kids:
            node = tree.add(candidates.tokens[c], tree_parent, candidates.scores[c])
            grow(c, node, depth + 1)

    grow(-1, -1, 1)
    return tree


def select_dynamic(candidates: TokenTree, nodes: int) -> TokenTree:
    """EAGLE-2's rule: keep the `nodes` candidates of highest path score.

    A child's path score never exceeds its parent's (a product of
    probabilities, or a count of matches), so the best `nodes` form a tree;
    ties go to the shallower, earlier node, which keeps parents first.
    """
    depth = candidates.depths()
    order = sorted(range(len(candidates)), key=lambda i: (-candidates.scores[i], depth[i], i))
    kept: set[int] = set()
    for i in order:
        if len(kept) >= nodes:
            break
        if candidates.parents[i] < 0 or candidates.parents[i] in kept:
            kept.add(i)
    tree, index = TokenTree(), dict[int, int]()
    for i in sorted(kept, key=lambda i: (depth[i], i)):  # parents before children
        p = candidates.parents[i]
        index[i] = tree.add(candidates.tokens[i], index[p] if p >= 0 else -1, candidates.scores[i])
    return tree
