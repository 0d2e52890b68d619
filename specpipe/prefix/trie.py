"""A radix trie over token ids: which stored id lists are prefixes of a request's ids.

Contract: `insert(ids, value)` stores a value under an id list (returning the one it replaced),
`remove(ids)` takes it out, `walk(ids)` returns every stored key that is a prefix of `ids` (shortest
first) and how far `ids` runs along the trie's edges (`matched`), with one stored key that continues
past that point (`below`: what an entry sharing only part of `ids` would be trimmed from). Edges hold
runs of ids, so a conversation of n tokens costs a handful of nodes, not n. Holds values, never reads
them.

Worked example: after insert([1, 2, 3], a) and insert([1, 2, 5, 6], b), walk([1, 2, 3, 4]) finds
a at depth 3 (matched 3); walk([1, 2, 5, 9]) finds nothing stored at a prefix, matched 3, below
(4, b): b's first 3 ids are shared; walk([1, 2, 7]) leaves at the branch node after [1, 2]: matched 2, below
(3, a), the shallowest key under it (a second burst of new questions after one system prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Node:
    edges: dict[int, tuple[list[int], _Node]] = field(default_factory=dict)  # first id -> (run of ids, child)
    value: Any = None
    stored: bool = False


@dataclass
class Walk:
    """What `walk(ids)` found: stored prefixes of ids as (depth, value), shortest first; how many ids match
    along the trie; one stored key continuing past that point, as (depth, value), or None."""

    prefixes: list[tuple[int, Any]]
    matched: int
    below: tuple[int, Any] | None


class TokenTrie:
    def __init__(self) -> None:
        self._root = _Node()
        self.size = 0  # stored keys

    def insert(self, ids: list[int], value: Any) -> Any:
        """Store `value` under `ids`; returns the value it replaced, or None."""
        node, i = self._root, 0
        while i < len(ids):
            edge = node.edges.get(ids[i])
            if edge is None:
                child = _Node()
                node.edges[ids[i]] = (list(ids[i:]), child)
                node, i = child, len(ids)
                break
            run, child = edge
            common = _common(run, ids, i)
            if common < len(run):  # split the edge where ids leave it
                middle = _Node(edges={run[common]: (run[common:], child)})
                node.edges[ids[i]] = (run[:common], middle)
                child = middle
            node, i = child, i + common
        old = node.value if node.stored else None
        if not node.stored:
            self.size += 1
        node.value, node.stored = value, True
        return old

    def remove(self, ids: list[int]) -> Any:
        """Take out the value stored under `ids` (None when there is none); empty branches are pruned."""
        path: list[tuple[_Node, int]] = []  # (parent, first id of the edge taken)
        node, i = self._root, 0
        while i < len(ids):
            edge = node.edges.get(ids[i])
            if edge is None or _common(edge[0], ids, i) < len(edge[0]):
                return None
            path.append((node, ids[i]))
            node, i = edge[1], i + len(edge[0])
        if not node.stored:
            return None
        old, node.value, node.stored = node.value, None, False
        self.size -= 1
        for parent, first in reversed(path):  # drop leaves left holding nothing
            child = parent.edges[first][1]
            if child.stored or child.edges:
                break
            del parent.edges[first]
        return old

    def walk(self, ids: list[int]) -> Walk:
        prefixes: list[tuple[int, Any]] = []
        node, i = self._root, 0
        while True:
            if node.stored and i > 0:
                prefixes.append((i, node.value))
            if i >= len(ids):
                return Walk(prefixes, i, _first_stored(node, i, skip_self=True))
            edge = node.edges.get(ids[i])
            if edge is None:  # ids leave the trie at a branch node: a stored key below it shares these i ids
                return Walk(prefixes, i, _first_stored(node, i, skip_self=True))
            run, child = edge
            common = _common(run, ids, i)
            if common < len(run):  # ids leave the trie inside this edge: a stored key below shares i + common
                return Walk(prefixes, i + common, _first_stored(child, i + len(run), skip_self=False))
            node, i = child, i + len(run)


def _common(run: list[int], ids: list[int], start: int) -> int:
    """How many leading ids of `run` equal ids[start:]."""
    n = min(len(run), len(ids) - start)
    for j in range(n):
        if run[j] != ids[start + j]:
            return j
    return n


def _first_stored(node: _Node, depth: int, skip_self: bool) -> tuple[int, Any] | None:
    """The shallowest stored key at or under `node` (at `depth`), breadth first."""
    level = [(node, depth)]
    while level:
        for n, d in level:
            if n.stored and not (skip_self and n is node):
                return d, n.value
        level = [(child, d + len(run)) for n, d in level for run, child in n.edges.values()]
    return None
