"""One chained source's price: its acceptance and its cost per drafted token, as measured on this run.

Contract: `SourcePrice.k_to_draft(k, slope)` says how many of `k` tokens the source should draft this step
(0: skip it), by Leviathan et al.'s expected speed-up (costmodel/calibration.expected_speedup) at its own
rates (optimistic by one standard error) and cost; `observe` takes a verified draft's outcome and `charge`
its draft seconds against the target step time. Nothing here runs a model, times anything or imports MLX.

Units: c is a drafted token's cost in target forwards (T(1)); a verify of n tokens costs
1 + slope * (n - 1) target forwards, the slope from budget=auto's verify-cost figure for the step's K
(`BudgetDecision.t_verify`) when the plan carries one, else 0 (a verify as cheap as a plain step:
memory-bound decoding, and optimistic, so a source is skipped only on its own evidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpipe.budgets.rates import FORGET  # evidence per verified draft decays as budget=auto's does
from specpipe.budgets.rates import optimistic as _optimistic

PRIOR = 2.0  # trials' worth of the 0.5 prior each rate starts from


def ratio_curve(slope: float, k: int) -> dict[int, float]:
    """T(n)/T(1) for n = 1..k + 1 on a straight line: expected_speedup's verify costs."""
    return {n: 1.0 + slope * (n - 1) for n in range(1, k + 2)}


@dataclass
class SourcePrice:
    """What the chain knows about one source (one per source, and one per evidence class of a free one).

    first / nxt: [successes, failures] for the first drafted token and for a token given the one before it
    held (budget=auto's two rates: drafts are bursty). c: cost per drafted token in target forwards.
    skipped: steps in a row this source was priced out (after `probe_every` it is asked once anyway).
    """

    c: float = 0.0
    first: list[float] = field(default_factory=lambda: [PRIOR / 2, PRIOR / 2])
    nxt: list[float] = field(default_factory=lambda: [PRIOR / 2, PRIOR / 2])
    skipped: int = 0
    timed: int = 0  # drafts whose seconds moved c from its prior (weight bytes, or the drafter's own figure)

    def best(self, k: int, slope: float) -> tuple[int, float]:
        """(the K up to `k` that maximises this source's expected speed-up, that speed-up); (0, 1.0): none of
        them beats a plain step. Ties go to the shorter draft."""
        from specpipe.costmodel.calibration import expected_speedup  # MLX: not at import (preflight)

        if k <= 0:
            return 0, 1.0
        alpha, g = _optimistic(self.first), _optimistic(self.nxt)
        ratio = ratio_curve(slope, k)
        scores = {j: expected_speedup(alpha, j, self.c, ratio, g) for j in range(0, k + 1)}
        j = max(scores, key=lambda j: (scores[j], -j))
        return j, scores[j]

    def k_to_draft(self, k: int, slope: float, probe_every: int) -> int:
        """`best`'s K, counting a 0 as a skip: after `probe_every` skips in a row it drafts the plan's k once,
        to learn (its rates follow the text)."""
        if k <= 0:
            return 0
        best, _ = self.best(k, slope)
        if best > 0:
            self.skipped = 0
            return best
        self.skipped += 1
        if self.skipped > probe_every:
            self.skipped = 0
            return k
        return 0

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified draft of `drafted` tokens whose first `accepted` held."""
        if drafted <= 0:
            return
        f, n = self.first, self.nxt
        self.first = [FORGET * f[0] + (accepted > 0), FORGET * f[1] + (accepted == 0)]
        if accepted > 0 and drafted > 1:  # tokens 2..: each tried only when the previous one held
            self.nxt = [FORGET * n[0] + accepted - 1, FORGET * n[1] + (accepted < drafted)]

    def charge(self, draft_s: float, drafted: int, t1_s: float) -> None:
        """`drafted` tokens took `draft_s` seconds to draft; a target forward takes `t1_s`."""
        if drafted <= 0 or t1_s <= 0:
            return
        self.c = FORGET * self.c + (1 - FORGET) * draft_s / drafted / t1_s  # from the prior: one slow first
        self.timed += 1  # draft (MLX compiling its graphs) must not price a model out at once

    @property
    def acceptance(self) -> float:
        """The first token's acceptance rate (its point estimate), for the report."""
        return self.first[0] / sum(self.first)
