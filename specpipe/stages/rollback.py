"""Rollback stage: bring a cache back to the accepted length.

Contract: `rollback(cache, n_drop)` removes the newest `n_drop` positions
from every layer of `cache`, so the next forward continues from the
accepted prefix. `check(cache, role)` refuses, before the run starts, a
cache the strategy cannot roll back (naming its layer types).
"""

from __future__ import annotations

from typing import Protocol


class RollbackStrategy(Protocol):
    name: str
    dropped: int  # positions removed so far (stats)

    def check(self, cache: list, role: str) -> None:
        """Raise SpecpipeError if this strategy cannot roll `cache` back."""

    def rollback(self, cache: list, n_drop: int) -> None:
        """Drop the newest `n_drop` positions of `cache` (in place)."""
