"""Rollback stage: bring a cache back to the accepted length.

Contract: `before_forward(cache)` is called before every forward whose
positions may be rejected (a snapshot point) and returns what those
forwards must capture for it (an engine StateCapture of per-position
recurrent states) or None; `rollback(cache, n_drop,
engine=, fed_ids=)` removes the newest `n_drop` positions from every layer
of `cache`, where `fed_ids` are the ids fed since `before_forward`, so the
next forward continues from the accepted prefix. `check(cache, role)`
refuses, before the run starts, a cache the strategy cannot roll back.

Worked example: cache holds 10 positions; verify feeds [last, d1, d2, d3]
(14 positions); 1 draft token accepted -> n_drop = 2, keeping [last, d1].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from specpipe.engine.recurrent import StateCapture


class RollbackStrategy(Protocol):
    name: str
    dropped: int  # positions removed so far (stats)

    def check(self, cache: list, role: str) -> None:
        """Raise SpecpipeError if this strategy cannot roll `cache` back."""

    def before_forward(self, cache: list) -> StateCapture | None:
        """A forward that may be partly rejected is about to run on `cache`.

        Returns:
            The StateCapture to pass to the forward(s) on `cache` until
            `rollback` (`Engine.forward(..., capture=Capture(states=...))`),
            or None when this strategy needs nothing recorded.
        """

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        """Drop the newest `n_drop` positions of `cache` (in place).

        Args:
            engine: the Engine owning `cache` (strategies that recompute).
            fed_ids: ids fed into `cache` since `before_forward`.
        """
