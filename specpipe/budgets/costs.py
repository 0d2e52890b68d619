"""budget=auto's cost model: what a draft costs in plain steps, and what drafting steps returned.

Contract: `Costs(forget)` holds the verify cost curve T(n)/T(1) (`ratio`: the calibrated curve at this cache
length, corrected by this run's verify timings; a batch's price of the row's draft while the row shares a
batched forward), the draft cost `c` per drafted token in target steps, and two measured figures: `realized`
(drafting steps' tokens per plain step's time) and `returned` (tokens per unit of cost, the chain stop's S).
`speedup` / `best` price a draft through costmodel/calibration.expected_speedup. It never times anything
(the curves come from `costmodel`, timed before any request) and never reads a drafter or the rates.

The constants below are not a user's choice: they make the measured curve robust to a shared machine (a
median window, a rule for a descheduled step) and say when a timing is stale; the user's knob is `forget`.
"""

from __future__ import annotations

import statistics
from collections import deque

from specpipe.budgets.fixed import K_MAX
from specpipe.costmodel.context_curve import ContextCurve

MEASURED_WINDOW = 9  # verify timings: the median of the last few per length, robust to a descheduled step
PLAIN_TIMINGS = 3  # plain-step timings the measured curve needs before its T(1) is trusted without a refresh
PLAIN_STALE = 32  # verifies since the last plain one after which T(1) is timed again where a verify's gain is thin
DESCHEDULED = 3.0  # a drafting step over this many times its measured price was descheduled: `realized` prices it
NEW_REQUEST_STEPS = 2.0  # weight, in drafting steps, of the last request's `realized` in a new one


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """T(n)/T(1) as the cost model may use it: 1 at n = 1 and never falling as n grows. Timings of a tiny model
    or of a loaded machine say otherwise (T(3)/T(1) = 0.69); a longer verify does a shorter one's work and more.

    Example: {1: 1.0, 2: 1.2, 3: 0.9, 4: 1.5} -> {1: 1.0, 2: 1.2, 3: 1.2, 4: 1.5}."""
    out, highest = {}, 1.0
    for n in sorted(curve):
        highest = out[n] = 1.0 if n == 1 else max(highest, curve[n])
    return out


class Costs:
    """The verify curve, the batch's price, the draft cost c, and what drafting steps returned."""

    def __init__(self, forget: float):
        self.forget = forget
        self.c = 1.0  # pessimistic until calibrated
        self.context: ContextCurve | None = None  # T(n)/T(1) by cache length (long contexts)
        self._seconds: dict[int, deque[float]] = {}  # n -> this run's last verify seconds over n tokens
        self._since_plain = 0  # verifies since the last plain (n = 1) one
        self._batch: dict[int, float] | None = None  # the batch's price of this row's draft, this step
        self._realized = (0.0, 0.0, 0.0)  # drafting steps: tokens, cost in plain steps, steps (each forgotten)
        self.returned = 1.0  # tokens per unit of cost (target steps) drafting steps returned
        self.calibrate({n: float(n) for n in range(1, K_MAX + 2)})  # pessimistic until calibrated

    # ---------------------------------------------------------------- the verify curve

    def calibrate(self, curve: dict[int, float]) -> None:
        """The device's short-context curve (the run's timings so far are dropped)."""
        self.base = self._calibrated = dict(curve)  # base: the short-context curve at_context starts from
        self._seconds.clear()
        self.curve = monotone(curve)

    def at_context(self, cache_len: int) -> None:
        """Price verifies with the curve at this cache length (timed by specpipe-calibrate, else modelled);
        this run's timings still correct it."""
        calibrated = self.context.ratio_at(cache_len, self.base) if self.context is not None else self.base
        if calibrated is not self._calibrated:
            self._calibrated, self.curve = calibrated, monotone(calibrated)

    def price(self, batch: dict[int, float] | None) -> None:
        """This step's batch price of the row's draft (None: the row decodes alone)."""
        self._batch = monotone(batch) if batch is not None else None

    @property
    def ratio(self) -> dict[int, float]:
        """T(n)/T(1) a draft is priced by: the batch's price while batched, else the row's own curve."""
        return self._batch if self._batch is not None else self.curve

    @property
    def batch_width(self) -> int | None:
        """The batch's K this step, read off its price (the positions below BEYOND, less the root); None alone."""
        from specpipe.batch.pricing import BEYOND  # here: the batch imports the budgets

        if self._batch is None:
            return None
        return max(n for n, price in self._batch.items() if price < BEYOND) - 1

    def own(self, n: int) -> float:
        """The row's own T(n)/T(1) (never the batch's price, which marks positions past its width unpayable)."""
        return self.curve[min(n, max(self.curve))]

    def observe_verify(self, n: int, seconds: float) -> None:
        """A verify over n tokens took `seconds` (n = 1: a plain step). Once a plain step is timed, measured
        points replace the calibration's and the rest of the curve is scaled by the median measured /
        calibrated ratio, each point the median of its last MEASURED_WINDOW timings: a calibration taken while
        another process held the cores must not keep auto from drafting, nor one slow plain step make a long
        verify look free."""
        self._seconds.setdefault(n, deque(maxlen=MEASURED_WINDOW)).append(seconds)
        self._since_plain = 0 if n == 1 else self._since_plain + 1
        plain = self._seconds.get(1)
        if not plain:
            return
        t1 = statistics.median(plain)
        measured = {
            m: max(1.0, statistics.median(t) / t1) for m, t in self._seconds.items() if m > 1 and m in self._calibrated
        }
        if not measured:
            return
        scale = sorted(measured[m] / self._calibrated[m] for m in measured)[len(measured) // 2]
        self.curve = monotone({m: measured.get(m, r * scale) for m, r in self._calibrated.items()})

    def plain_timing_due(self) -> bool:
        """T(1) needs a plain step's timing: too few this run, or none for PLAIN_STALE verifies (a drafter that
        verifies on every step would otherwise keep the first, cold step's T(1))."""
        return len(self._seconds.get(1, ())) < PLAIN_TIMINGS or self._since_plain >= PLAIN_STALE

    # ---------------------------------------------------------------- what drafting cost and returned

    def realize(self, accepted: int, draft_s: float | None, verify_s: float | None, fed: int) -> None:
        """Count one drafting step's tokens and its seconds in plain steps' units (`realized`); `fed`: the
        tokens its verify scored. A step over DESCHEDULED times its price is charged its price: one step
        descheduled by another process is no price of drafting."""
        plain = self._seconds.get(1)
        if not verify_s or not plain or len(plain) < PLAIN_TIMINGS:
            return
        t1 = statistics.median(plain)
        priced = self.own(fed)
        verify = verify_s if verify_s <= DESCHEDULED * priced * t1 else priced * t1
        cost = (verify + (draft_s or 0.0)) / t1
        won, spent, steps = self._realized
        f = self.forget
        self._realized = (f * won + accepted + 1, f * spent + cost, f * steps + 1)

    def realized(self, min_steps: float) -> float | None:
        """Drafting steps' tokens per plain step's time, forgotten as the rates are; None before `min_steps`
        steps' worth or before PLAIN_TIMINGS plain steps."""
        won, spent, steps = self._realized
        return won / spent if steps >= min_steps and spent > 0 else None

    def learn(self, accepted: int, forwards: int, fed: int, draft_s: float | None, verify_s: float | None) -> None:
        """A drafting step's `returned` tokens per cost, and (with its seconds) the draft cost c: its draft
        seconds per draft forward over the target step its verify implies."""
        cost = forwards * self.c + self.own(fed)
        self.returned = self.forget * self.returned + (1 - self.forget) * (accepted + 1) / cost
        if draft_s is not None and verify_s:
            t1 = verify_s / self.own(fed)  # this step's implied T(1)
            self.c = self.forget * self.c + (1 - self.forget) * (draft_s / forwards) / t1

    def start_request(self) -> None:
        """A new request is judged on its own steps: the last one's `realized` stays at NEW_REQUEST_STEPS' weight."""
        won, spent, steps = self._realized
        keep = min(1.0, NEW_REQUEST_STEPS / steps) if steps else 0.0
        self._realized = (won * keep, spent * keep, steps * keep)
