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

from specpipe.core.protocols import Rollback

RollbackStrategy = Rollback  # the protocol, in specpipe/core/protocols.py with the other kinds'
