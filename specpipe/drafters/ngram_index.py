"""An incremental hashed n-gram index over a growing token sequence.

Contract: `append(ids)` adds tokens, `truncate(length)` gives the newest ones
back exactly, `lookup(end, n)` returns where the most recent earlier copy of
the n ids before `end` ended. Each append costs (max_n - min_n + 1) dict
updates and each lookup one dict read plus a binary search, whatever the
sequence length: the n-gram drafter's per-step cost does not grow with the
context (a rescan per step did).

Worked example (n = 2): ids [1, 2, 3, 4, 2, 3]. When id 3 arrives at position
2, the 2-gram (1, 2) gains a follower: table[(1, 2)] = [2] (the position the
copy ends at, i.e. where its follower sits). After all six ids, table[(2, 3)]
= [3]: lookup(end=6, n=2) reads the suffix (2, 3) and finds the copy ending
at 3, so the drafter proposes ids[3:] = [4, 2, 3].
"""

from __future__ import annotations

from bisect import bisect_right


class NgramIndex:
    """Ends of every n-gram (min_n <= n <= max_n) that is followed by a token.

    Args:
        min_n, max_n: the n-gram lengths indexed.
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.ids: list[int] = []
        # per n: n-gram -> ascending ends e (ids[e - n:e] is the n-gram, ids[e] follows it)
        self._tables: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_n, max_n + 1)}

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, new_ids: list[int]) -> None:
        """Add tokens at the end; each one gives the n-grams just before it a follower."""
        ids = self.ids
        for token in new_ids:
            end = len(ids)  # the n-grams ending here are followed by `token`
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._tables[n].setdefault(tuple(ids[end - n : end]), []).append(end)
            ids.append(int(token))

    def truncate(self, length: int) -> None:
        """Forget every token from position `length` on (exact: the index is as if they never came)."""
        ids = self.ids
        while len(ids) > length:
            ids.pop()
            end = len(ids)  # the entries the popped token created all end here, and are the newest of their lists
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(ids[end - n : end])
                ends = self._tables[n][key]
                ends.pop()
                if not ends:
                    del self._tables[n][key]

    def lookup(self, end: int, n: int, earliest_start: int = 0) -> int | None:
        """Where the most recent earlier copy of ids[end - n:end] ends, followed by a token before `end`.

        Args:
            end: the sequence length to look from (<= len(self)).
            n: the n-gram length (min_n <= n <= max_n).
            earliest_start: copies starting before this position do not count (a window).

        Returns:
            e with ids[e - n:e] == ids[end - n:end] and e <= end - 1, the largest such; None when none.
        """
        if n > end - 1:
            return None
        ends = self._tables[n].get(tuple(self.ids[end - n : end]))
        if not ends:
            return None
        i = bisect_right(ends, end - 1)  # copies whose follower is inside ids[:end]
        if i == 0:
            return None
        e = ends[i - 1]
        return e if e - n >= earliest_start else None
