"""A bounded store of token sequences (earlier prompts and answers, and the requests in flight) indexed
for the suffix drafter: which tokens followed each n-gram, and how often.

Contract: `open()` starts a sequence and returns its id; `append(seq, ids)` / `truncate(seq, length)` grow
it or give its newest tokens back exactly; `followers(pattern)` returns the longest suffix of `pattern`
(min_n <= n <= max_n) that occurred followed by a token, with the follower counts over every stored
sequence. The store holds at most `capacity` tokens: when an append passes it, whole sequences leave,
least recently used first (used: appended to or matched), never the one being appended to, so a single
request longer than `capacity` is the only way past it. Thread-safe (the server's rows share one).

Worked example (min_n=1, max_n=2): sequences [5, 6, 7] and [5, 6, 8, 5, 6, 7]. The 2-gram (5, 6) was
followed by 7 twice and by 8 once: followers([9, 5, 6]) = (2, {7: 2, 8: 1}, 3), and the suffix drafter
proposes 7 with frequency 2/3. This is a suffix trie cut at depth max_n, stored as one dict per node.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Node:
    """One n-gram: how many times each token followed it, and their sum."""

    total: int = 0
    counts: dict[int, int] = field(default_factory=dict)

    def best(self) -> tuple[int, int]:
        """The most frequent follower and its count (of equals, the one that followed first)."""
        return max(self.counts.items(), key=lambda item: item[1])


class SuffixStore:
    """N-gram follower counts over a bounded, least-recently-used set of token sequences.

    Args:
        capacity: tokens kept over all sequences (draft.store_tokens).
        min_n, max_n: the n-gram lengths indexed (the trie's depth).
    """

    def __init__(self, capacity: int, min_n: int, max_n: int):
        self.capacity, self.min_n, self.max_n = capacity, min_n, max_n
        self._seqs: OrderedDict[int, list[int]] = OrderedDict()  # least recently used first
        self._nodes: dict[tuple[int, ...], Node] = {}
        self._tokens = 0
        self._next_id = 0
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        """Tokens held over all sequences."""
        return self._tokens

    @property
    def sequences(self) -> int:
        return len(self._seqs)

    def holds(self, seq: int) -> bool:
        """Whether sequence `seq` is still stored (eviction may have taken it)."""
        return seq in self._seqs

    def length(self, seq: int) -> int:
        return len(self._seqs.get(seq, ()))

    def open(self) -> int:
        """A new, empty sequence (the most recently used); returns its id."""
        with self._lock:
            self._next_id += 1
            self._seqs[self._next_id] = []
            return self._next_id

    def append(self, seq: int, new_ids: list[int]) -> None:
        """Add tokens at the end of sequence `seq`; each one becomes a follower of the n-grams before it."""
        with self._lock:
            ids = self._seqs[seq]
            self._seqs.move_to_end(seq)
            for token in new_ids:
                token = int(token)
                end = len(ids)
                for n in range(self.min_n, min(self.max_n, end) + 1):
                    node = self._nodes.get(key := tuple(ids[end - n : end]))
                    if node is None:
                        node = self._nodes[key] = Node()
                    node.total += 1
                    node.counts[token] = node.counts.get(token, 0) + 1
                ids.append(token)
            self._tokens += len(new_ids)
            self._evict(keep=seq)

    def truncate(self, seq: int, length: int) -> None:
        """Forget sequence `seq`'s tokens from position `length` on (exact: as if they never came)."""
        with self._lock:
            ids = self._seqs[seq]
            while len(ids) > length:
                self._forget_last(ids)

    def close(self, seq: int) -> None:
        """Drop sequence `seq` now (an empty request leaves nothing to remember)."""
        with self._lock:
            self._drop(seq)

    def followers(self, pattern: list[int], shortest: int = 0) -> tuple[int, Node] | None:
        """The longest suffix of `pattern` (at least max(min_n, shortest) long) seen followed by a token,
        as (its length n, its Node); None when none was. Marks nothing used: `touch` does."""
        with self._lock:
            for n in range(min(self.max_n, len(pattern)), max(self.min_n, shortest) - 1, -1):
                node = self._nodes.get(tuple(pattern[len(pattern) - n :]))
                if node is not None and node.total:
                    return n, node
            return None

    def touch(self, seq: int) -> None:
        """Mark sequence `seq` recently used (the drafter's own request is, every step)."""
        with self._lock:
            if seq in self._seqs:
                self._seqs.move_to_end(seq)

    def sequences_ids(self) -> list[list[int]]:
        """Every sequence's ids, least recently used first (what draft.store_file keeps)."""
        with self._lock:
            return [list(ids) for ids in self._seqs.values() if ids]

    def clear(self) -> None:
        """Forget every sequence (a new bench session); drafters holding one open a new one at their next step."""
        with self._lock:
            self._seqs.clear()
            self._nodes.clear()
            self._tokens = 0

    # ---------------------------------------------------------------- internals (lock held)

    def _forget_last(self, ids: list[int]) -> None:
        token = ids.pop()
        end = len(ids)  # the n-grams that the popped token followed all end here
        for n in range(self.min_n, min(self.max_n, end) + 1):
            key = tuple(ids[end - n : end])
            node = self._nodes[key]
            node.total -= 1
            left = node.counts[token] - 1
            if left:
                node.counts[token] = left
            else:
                del node.counts[token]
            if not node.total:
                del self._nodes[key]
        self._tokens -= 1

    def _drop(self, seq: int) -> None:
        ids = self._seqs.get(seq)
        if ids is None:
            return
        while ids:
            self._forget_last(ids)
        del self._seqs[seq]

    def _evict(self, keep: int) -> None:
        """Drop least recently used sequences (never `keep`) until the store fits its capacity."""
        while self._tokens > self.capacity:
            victim = next((s for s in self._seqs if s != keep), None)
            if victim is None:
                return  # `keep` alone is longer than the capacity: it is the request in flight
            self._drop(victim)


class HistoryShelf:
    """One SuffixStore per (capacity, min_n, max_n), shared by every suffix drafter given this shelf: a
    Session's own drafter and the server's rows' drafters see the same earlier requests. A new Session
    is a new shelf, so a new session starts with an empty history."""

    def __init__(self) -> None:
        self._stores: dict[tuple[int, int, int], SuffixStore] = {}
        self._lock = threading.Lock()

    def store(self, capacity: int, min_n: int, max_n: int, earlier: list[list[int]] | None = None) -> SuffixStore:
        """The shelf's store of this shape; a new one starts from `earlier` sequences (a store file's)."""
        with self._lock:
            key = (capacity, min_n, max_n)
            if key not in self._stores:
                store = self._stores[key] = SuffixStore(capacity, min_n, max_n)
                for ids in earlier or []:
                    store.append(store.open(), ids)
            return self._stores[key]

    @property
    def stores(self) -> int:
        """Stores on the shelf (one per drafter shape; 0 where no suffix drafter was made)."""
        return len(self._stores)

    @property
    def tokens(self) -> int:
        """Tokens held over the shelf's stores (each within its own capacity)."""
        with self._lock:
            return sum(store.tokens for store in self._stores.values())

    @property
    def sequences(self) -> int:
        """Requests (sequences) held over the shelf's stores."""
        with self._lock:
            return sum(store.sequences for store in self._stores.values())

    def clear(self) -> None:
        """Empty every store on the shelf: what a new session would start with, keeping the drafters."""
        with self._lock:
            for store in self._stores.values():
                store.clear()
