"""What speculation was worth in one run: the cost model's estimate of its speed-up against plain decoding.

Priced from the run's own figures and nothing timed on its path: every verify step's tokens (accepted + the
recovered / bonus one) over its cost in plain steps, k·c + T(k+1)/T(1) (calibration.expected_speedup's model),
with T(n)/T(1) the curve the budget already holds (budget=auto) or the one a calibration cached for this target.
Without a curve, the run's plain steps (K = 0) time T(1) and the drafting steps' measured seconds are priced
against it; a run with neither says nothing (0.0).

`end_to_end(estimate, stats)` turns it into the whole request's speed-up: the decode time the estimate says
plain decoding would have taken, plus the target's prefill, over the request's wall time (the draft model's
prefill in it): a long prompt with a short answer can lose end to end what decoding won.

`estimate_speedup(steps, budget, target, drafter)` is the one call for the figure and its uncertainty (the CLI's
summary line and the chat show the same): a 90% range from resampling the run's own steps (how sure its
acceptance is), widened by the curve's timing noise when a curve priced it; `phrase` words it
(`~1.6x (1.4-1.8) vs plain (estimated)`), or says it has no range.

RESAMPLES and MIN_DRAFTING_STEPS are the statistics of the estimate's range, not a user's choice.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from specpipe.events import Drafted, Event, Verified

RESAMPLES = 200  # bootstrap draws of the run's steps: the 5th and 95th percentiles are stable to ~0.01x
MIN_DRAFTING_STEPS = 5  # fewer drafting steps than this: a range would be a guess, so none is given


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
        return _priced(self.steps, self.draft_s, ratio, c)

    def interval(self, ratio: dict[int, float] | None, c: float | None) -> tuple[float, float] | None:
        """The estimate's 5th-95th percentile over RESAMPLES resamplings of the run's steps (seeded: the same run
        gives the same range); None with fewer than MIN_DRAFTING_STEPS drafting steps or nothing to price."""
        drafting = sum(1 for k, _, _ in self.steps if k)
        if drafting < MIN_DRAFTING_STEPS:
            return None
        rng, n = random.Random(0), len(self.steps)
        values = []
        for _ in range(RESAMPLES):
            drawn = [self.steps[rng.randrange(n)] for _ in range(n)]
            share = sum(1 for k, _, _ in drawn if k) / drafting  # the drafting seconds follow the drafting steps
            value, _ = _priced(drawn, self.draft_s * share, ratio, c)
            if value > 0:
                values.append(value)
        if len(values) < RESAMPLES // 2:
            return None
        values.sort()
        return values[int(0.05 * (len(values) - 1))], values[int(0.95 * (len(values) - 1))]


def _priced(
    steps: list[tuple[int, int, float]], draft_s: float, ratio: dict[int, float] | None, c: float | None
) -> tuple[float, str]:
    """The speed-up the cost model gives these steps (see StepLog.estimate)."""
    if not steps or not any(k for k, _, _ in steps):
        return 0.0, ""  # plain decoding throughout (or no step at all): nothing to compare
    tokens = sum(t for _, t, _ in steps)
    if ratio and c is not None:
        top = max(ratio)
        cost = sum(k * c + ratio[min(k + 1, top)] if k else 1.0 for k, _, _ in steps)
        return tokens / cost, "calibration"
    plain = [s for k, _, s in steps if k == 0]
    if not plain:
        return 0.0, ""
    t1 = statistics.median(plain)
    spent = sum(s for _, _, s in steps) + draft_s  # the plain steps' own drafting is ~0
    return (tokens * t1 / spent, "plain steps") if spent > 0 and t1 > 0 else (0.0, "")


@dataclass(frozen=True)
class Estimate:
    """The cost model's speed-up against plain decoding: value (0.0: none), its range (0.0s: none), its source."""

    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    source: str = ""  # "calibration" | "plain steps" | ""


def estimate_speedup(steps: StepLog, budget, target, drafter) -> Estimate:
    """What speculation was worth in a finished run, with its uncertainty: the one function the CLI and the chat
    call. The range is the steps' resampling range, widened by the priced curve's timing noise."""
    ratio, c = calibrated_costs(budget, target, drafter)
    return priced_estimate(steps, ratio, c, curve_noise(target))


def priced_estimate(steps: StepLog, ratio: dict[int, float] | None, c: float | None, noise: float = 0.0) -> Estimate:
    """The estimate and its range from costs in hand (the chat has RunStarted's); `noise`, the curve's timing
    noise as a share, widens the range where the curve priced it."""
    value, source = steps.estimate(ratio, c)
    if value <= 0:
        return Estimate()
    span = steps.interval(ratio, c)
    if span is None:
        return Estimate(value, source=source)
    widen = 1 + (noise if source == "calibration" else 0.0)
    return Estimate(value, min(span[0], value) / widen, max(span[1], value) * widen, source)


def end_to_end(decode: Estimate, wall_s: float, target_prefill_s: float, draft_prefill_s: float) -> Estimate:
    """The request's end-to-end speed-up over plain decoding from the decode estimate (and its range).

    Plain would take target prefill + decode time x the decode speed-up; this run took its wall time, the draft
    model's prefill included. Example: wall 10 s = 2 s target prefill + 3 s draft prefill + 5 s decoding at an
    estimated 1.6x: plain 2 + 8 = 10 s -> 1.0x end to end.
    """
    decoding = wall_s - target_prefill_s - draft_prefill_s
    if decode.value <= 0 or wall_s <= 0 or decoding <= 0:
        return Estimate()

    def whole(speedup: float) -> float:
        return (target_prefill_s + decoding * speedup) / wall_s if speedup > 0 else 0.0

    return Estimate(whole(decode.value), whole(decode.low), whole(decode.high), decode.source)


def phrase(value: float, low: float = 0.0, high: float = 0.0) -> str:
    """`~1.6x (1.4-1.8) vs plain (estimated)`; without a range `~1.6x vs plain (estimated, no range: too few
    drafting steps)`; "" when there is no estimate."""
    if value <= 0:
        return ""
    if low > 0 and high > 0:
        return f"~{value:.1f}x ({low:.1f}-{high:.1f}) vs plain (estimated)"
    return f"~{value:.1f}x vs plain (estimated, no range: too few drafting steps)"


def calibrated_costs(budget, target, drafter) -> tuple[dict[int, float] | None, float | None]:
    """(T(n)/T(1), c) without timing anything: the target's cached curve (budget=auto: else the budget's own, as
    prepare calibrated it) and the budget's draft cost or one known without a timing; (None, None) when none."""
    own_curve = budget.verify_curve  # budget=auto, prepared
    if own_curve is not None:
        # the device's saved curve before the budget's own: auto corrects its curve by this run's verify timings,
        # which move with other processes' load, and the estimate should move with what was accepted
        return cached_ratio(target) or own_curve, float(budget.draft_cost)
    ratio = cached_ratio(target)
    if ratio is None:
        return None, None
    if drafter.cost_per_token is not None:
        return ratio, float(drafter.cost_per_token)
    engine = drafter.engine
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


def curve_noise(engine) -> float:
    """The cached curve's timing noise (curve_guard.noise); 0.0 when it has none on record."""
    data = _cached(engine)
    return float(data.get("noise", 0.0)) if data else 0.0
