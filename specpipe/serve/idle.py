"""A server's idle refinement: while nothing is queued or decoding, budget=auto's long-context verify curves
are timed (costmodel/refine.py), so no request waits on a measurement, only on the one forward in flight.

Contract: `IdleRefinement(engine, log, curve)`; the decoding thread calls `run(should_stop)` when it has
nothing to do, and `follow(budget)` when a batched row ends (its context is wanted too). `run` returns
within one fill chunk or one forward of `should_stop()` turning true, and resumes the same length on the
next call. Each call that timed something is one `{"refine": ...}` record through `log` (requests.jsonl).
A budget other than auto has no curve: nothing is timed, nothing logged. A timing that fails is logged
and ends the refinement; the server serves on with the curves it has.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from specpipe.costmodel.context_curve import ContextCurve
from specpipe.costmodel.refine import refine_idle


class IdleRefinement:
    def __init__(self, engine, log: Callable[[dict], None] | None = None, curve: ContextCurve | None = None):
        """
        Args:
            engine: the served target (the curves price its verifies).
            log: record -> None (requests.jsonl); None: not recorded.
            curve: the one budget's curve a one-at-a-time server decodes with (refined in place, so its next
                request prices from what was timed); None: built from the batched rows' budgets (`follow`).
        """
        self.engine, self.curve = engine, curve
        self.log = log or (lambda record: None)
        self._finished_at: int | None = None  # the curve's reach when nothing was left: idle until it grows
        self.failed = False  # a timing raised: not tried again in this server's life

    def follow(self, budget) -> None:
        """A batched row ended: refine up to the context it reached. Its budget left with it, so the reach goes
        into a curve of the server's own; a later row's budget reads the cached curves when it first needs them."""
        seen: ContextCurve | None = budget.context_curve  # budget=auto's only
        if seen is None or seen is self.curve:
            return
        if self.curve is None:
            self.curve = ContextCurve(self.engine)
        self.curve.longest = max(self.curve.longest, seen.longest)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Time what the curve still wants until `should_stop()`; one record if any work ran."""
        curve = self.curve
        if curve is None or self.failed or curve.longest == self._finished_at or should_stop():
            return
        resumed = curve.refining[0] if curve.refining is not None else None
        timed: list[dict] = []
        checks = 0

        def stop() -> bool:
            nonlocal checks
            checks += 1
            return should_stop()

        def record(length: int, curve_at: dict) -> None:
            ratio = curve_at["ratio"]
            timed.append({"context": length, "t1_s": round(curve_at["t1_s"], 6), "ratio_17": round(ratio[17], 4)})

        start = time.perf_counter()
        try:
            finished = refine_idle(self.engine, curve, stop, on_timed=record)
        except Exception as exc:  # e.g. memory for a long cache: the server goes on serving, priced as before
            curve.refining, self.failed = None, True
            self.log({"refine": {"timed": timed, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}})
            return
        seconds = time.perf_counter() - start
        # each check answered False let one unit run, but for the last check: it said stop, or found nothing left
        units = checks - 1
        if finished:
            self._finished_at = curve.longest
        if units <= 0:
            return
        self.log(
            {
                "refine": {
                    "timed": timed,  # lengths finished and cached in this idle spell
                    "resumed": resumed,  # a length an earlier spell began
                    "timing": curve.refining[0] if curve.refining is not None else None,  # left for the next spell
                    "stopped": not finished,  # a request (or the shutdown) came: it waited one unit at most
                    "units": units,  # fill chunks, forwards and saves run
                    "seconds": round(seconds, 6),
                }
            }
        )
