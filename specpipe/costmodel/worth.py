"""What speculation was worth in one run: the cost model's estimate of its speed-up against plain decoding.

Priced from the run's own figures and nothing timed on its path: every verify step's tokens (accepted + the
recovered / bonus one) over its cost in plain steps, k·c + T(k+1)/T(1) (calibration.expected_speedup's model),
with T(n)/T(1) the curve the budget already holds (budget=auto) or the one a calibration cached for this target.
Without a curve, the run's plain steps (K = 0) time T(1) and the drafting steps' measured seconds are priced
against it; a run with neither says nothing (0.0).
"""

from __future__ import annotations

import statistics

from specpipe.events import Drafted, Event, Verified


class StepLog:
    """Per verify step: drafted count, tokens it yielded, verify seconds; and the drafting seconds in all."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, float]] = []  # (k, tokens, verify seconds)
        self.draft_s = 0.0

    def consume(self, event: Event) -> None:
        if isinstance(event, Drafted):
            self.draft_s += event.seconds
        elif isinstance(event, Verified):
            k = len(event.accepted_ids) + len(event.rejected_ids)
            self.steps.append((k, len(event.accepted_ids) + 1, event.seconds))

    def estimate(self, ratio: dict[int, float] | None, c: float | None) -> tuple[float, str]:
        """(speed-up against plain decoding, where its costs came from), or (0.0, "") when nothing can price it."""
        if not self.steps or not any(k for k, _, _ in self.steps):
            return 0.0, ""  # plain decoding throughout (or no step at all): nothing to compare
        tokens = sum(t for _, t, _ in self.steps)
        if ratio and c is not None:
            top = max(ratio)
            cost = sum(k * c + ratio[min(k + 1, top)] if k else 1.0 for k, _, _ in self.steps)
            return tokens / cost, "calibration"
        plain = [s for k, _, s in self.steps if k == 0]
        if not plain:
            return 0.0, ""
        t1 = statistics.median(plain)
        spent = sum(s for _, _, s in self.steps) + self.draft_s  # the plain steps' own drafting is ~0
        return (tokens * t1 / spent, "plain steps") if spent > 0 and t1 > 0 else (0.0, "")


def calibrated_costs(budget, target, drafter) -> tuple[dict[int, float] | None, float | None]:
    """(T(n)/T(1), c) without timing anything: the budget's own (budget=auto calibrated in prepare), else
    the target's cached curve and a draft cost known without a timing; (None, None) when there is none."""
    if getattr(budget, "calibrated", False) and getattr(budget, "c", None) is not None:  # budget=auto
        return dict(budget.ratio), float(budget.c)
    ratio = cached_ratio(target)
    if ratio is None:
        return None, None
    if drafter.cost_per_token is not None:
        return ratio, float(drafter.cost_per_token)
    engine = getattr(drafter, "engine", None)
    if engine is None:
        return ratio, 0.0  # model-free drafters (n-gram, lookahead)
    if engine is target:
        return ratio, 1.0
    mine, theirs = cached_t1(engine), cached_t1(target)
    if mine is None or theirs is None:
        return None, None
    return ratio, drafter.bytes_share * mine / theirs


def _cached(engine) -> dict | None:
    from specpipe.costmodel import cache_file
    from specpipe.costmodel.calibration import _check_curve, calibration_key
    from specpipe.engine.load.model_store import cache_dir

    try:
        return cache_file.read(cache_dir() / "calibration" / f"{calibration_key(engine)}.json", _check_curve)
    except (AttributeError, OSError):  # an engine without info (a test double) or an unreadable cache dir
        return None


def cached_ratio(engine) -> dict[int, float] | None:
    data = _cached(engine)
    return {int(k): float(v) for k, v in data["ratio"].items()} if data else None


def cached_t1(engine) -> float | None:
    data = _cached(engine)
    return float(data["t1_s"]) if data else None
