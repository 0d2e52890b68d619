"""The prefix store: cache snapshots by the token ids they hold, bounded in bytes, least recently used out.

Contract (what the drivers and the server call; stable):
- `PrefixStore(max_bytes, make_cache)`: `make_cache()` gives a fresh empty target cache (the Engine's).
- `lookup(ids) -> Hit | None`: the longest stored prefix of `ids` that a request may reuse, at most
  len(ids) - 1 positions (the target cache never holds the newest token: the first step feeds it). The
  Hit holds `tokens` (positions reused), `cache` (a fresh cache restored to them: the store's arrays are
  never handed out) and `drafter_state` (what the drafter kept with that snapshot, or None when the entry
  was cut shorter or the drafter kept nothing). An entry sharing only part of `ids` serves when its cache
  kind trims exactly (full / quantized KV: cut to the shared part, as mlx-lm's `fetch_nearest_cache`
  does); window, chunked and recurrent snapshots serve only at exactly their stored length.
- `keep(ids, target_cache, drafter_state=None)`: store a copy of `target_cache`, which holds exactly
  `ids`; the least recently used entries leave until the bytes fit (an entry larger than `max_bytes` is
  not kept). A full-KV entry makes its stored prefixes redundant (they are cut from it), so they leave.
  Returns False (nothing kept) for a cache kind with no exact copy; `refusal` then names it.
- `stats` (`StoreStats`: hits, misses, tokens_reused, bytes_held, evictions, entries), `clear()`.
`drafter_state` is opaque here: an object with an `nbytes` attribute counts those bytes too. Not thread
safe: one Session's driver (or the server's one worker thread) calls it. Never runs a model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specpipe.prefix.snapshot import NotStorable, Snapshot, restore, take
from specpipe.prefix.trie import TokenTrie


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0  # positions requests took from the store instead of prefilling them
    bytes_held: int = 0
    evictions: int = 0  # entries pushed out by the byte bound
    entries: int = 0


@dataclass(frozen=True)
class Hit:
    tokens: int  # leading ids of the request already in `cache`
    cache: list  # a fresh target cache holding them, the request's own
    drafter_state: Any = None  # what `keep` got with the snapshot (None: cut shorter, or nothing kept)


@dataclass
class _Entry:
    ids: tuple[int, ...]
    snapshot: Snapshot
    drafter_state: Any
    nbytes: int


class PrefixStore:
    def __init__(self, max_bytes: int, make_cache: Callable[[], list]):
        if max_bytes < 0:
            raise ValueError(f"prefix_cache.bytes={max_bytes}: must be 0 or more")
        self.max_bytes = max_bytes
        self.make_cache = make_cache
        self.stats = StoreStats()
        self.refusal = ""  # why the last keep stored nothing (a cache kind without an exact copy)
        self._trie = TokenTrie()
        self._lru: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # oldest first

    def lookup(self, ids: list[int], with_drafter_state: bool = False) -> Hit | None:
        """The longest reusable stored prefix of `ids` (see the module docstring), restored; None: a miss.

        `with_drafter_state`: only an entry kept with a drafter state, used at its stored length (a drafter
        that cannot read a prompt without it: `Drafter.resumes_without_state` False)."""
        limit = len(ids) - 1
        walk = self._trie.walk(ids)
        # exact boundaries first: on a tie they win, with the drafter's state
        candidates = [(depth, entry) for depth, entry in walk.prefixes if depth <= limit]
        if with_drafter_state:
            candidates = [(d, e) for d, e in candidates if e.drafter_state is not None]
        else:
            candidates += [(min(d, limit), e) for d, e in self._longer(walk, ids) if e.snapshot.trimmable]
        best = max(candidates, key=lambda c: c[0], default=None)
        if best is None or best[0] <= 0:
            self.stats.misses += 1
            return None
        tokens, entry = best
        self._lru.move_to_end(entry.ids)
        cache = restore(entry.snapshot, self.make_cache(), tokens)
        self.stats.hits += 1
        self.stats.tokens_reused += tokens
        state = entry.drafter_state if tokens == entry.snapshot.length else None
        return Hit(tokens, cache, state)

    def _longer(self, walk, ids: list[int]) -> list[tuple[int, _Entry]]:
        """Entries that go past what `ids` share with the trie, as (shared positions, entry): a full-KV one
        cut to the shared part serves too (stored prefixes of ids are in walk.prefixes already)."""
        out = []
        if walk.below is not None:
            out.append((walk.matched, walk.below[1]))
        # ids themselves stored (an exact repeat): reuse all but the last position by cutting
        if walk.prefixes and walk.prefixes[-1][0] == len(ids):
            out.append((len(ids), walk.prefixes[-1][1]))
        return out

    def keep(self, ids: list[int], target_cache: list, drafter_state: Any = None) -> bool:
        """Store a copy of `target_cache`, which holds exactly `ids`; False when its kind cannot be stored."""
        if not ids:
            return False
        key = tuple(ids)
        old = self._lru.get(key)
        if old is not None and drafter_state is None:
            self._lru.move_to_end(key)  # the same positions again: the entry already holds them
            return True
        try:
            snapshot = take(target_cache, len(ids))
        except NotStorable as e:
            self.refusal = str(e)
            return False
        walk = self._trie.walk(ids)
        # a longer entry holds these positions only when all of ids run along the trie (not a shared head alone)
        below = walk.below if walk.matched == len(ids) else None
        if snapshot.trimmable and drafter_state is None and below is not None and below[1].snapshot.trimmable:
            self._lru.move_to_end(below[1].ids)  # a longer full-KV entry holds these positions: a cut of it serves
            return True
        nbytes = snapshot.nbytes + int(getattr(drafter_state, "nbytes", 0) or 0)
        if nbytes > self.max_bytes:
            return False
        entry = _Entry(key, snapshot, drafter_state, nbytes)
        if old is not None:
            self._drop(old)
        self._trie.insert(ids, entry)
        self._lru[key] = entry
        self.stats.bytes_held += nbytes
        if snapshot.trimmable:  # shorter full-KV entries on this path are cuts of this one
            for depth, shorter in self._trie.walk(ids).prefixes:
                if depth < len(ids) and shorter.snapshot.trimmable and shorter.drafter_state is None:
                    self._drop(shorter)
        while self.stats.bytes_held > self.max_bytes and self._lru:
            self._drop(next(iter(self._lru.values())))
            self.stats.evictions += 1
        self.stats.entries = len(self._lru)
        return True

    def _drop(self, entry: _Entry) -> None:
        self._trie.remove(list(entry.ids))
        del self._lru[entry.ids]
        self.stats.bytes_held -= entry.nbytes
        self.stats.entries = len(self._lru)

    def clear(self) -> None:
        """Forget every entry (the counters stay)."""
        self._trie = TokenTrie()
        self._lru.clear()
        self.stats.bytes_held = 0
        self.stats.entries = 0
