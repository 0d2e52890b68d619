"""One draft budget K per step for the whole batch, from the measured cost T(B, n) of a forward.

Contract: `BatchBudget.next_k(rows)` returns K for the next step (and leaves its reasons in
`decision`, one dict per step that the server logs); `observe(report)` learns from each step.
`fixed` drafts K every step. `auto` picks the K that maximises expected tokens per second for the
batch, priced through the calibrated table T(B, n) (batch/costs.py, cached per device):

    rate(K) = B * E(K) / T(B, 1 + K),   E(K) = rho * (1 + a * (1 - g^K) / (1 - g)) + (1 - rho)

where a is the rate at which a row's first drafted token is accepted, g the rate at which a
drafted token is accepted given the one before it was, and rho the share of rows whose drafter
proposed something (n-gram finds no match on some rows). Two rates, as budgets/auto.py keeps them,
because n-gram drafts are bursty: on code about 45% of first tokens hold but most tokens after a
held one do, so one geometric rate prices long drafts far below what they return. Once the batch
is compute-bound, T(B, n) grows with n about as fast as E(K), and when acceptance is low E(K)
barely grows: K = 0 (plain decoding for every row) wins. A K > 0 must beat plain by `margin` (3%):
a mispriced step costs a whole batch, so near-ties go to plain decoding.

While K = 0 the rates still learn. Drafters that can guess tokens the target already emitted
(`supports_hindsight`: n-gram) are asked, on every plain step and for every row, what they would
have drafted before the last `hindsight_len` tokens: evidence with no verify slot spent
(`hindsight_k`, `observe_hindsight`). Other drafters get a `probe_k` draft every `probe_every`
plain steps. The calibration is corrected by the run's own step times: T(B, n) is scaled by the
decayed mean of measured / calibrated seconds, kept per batch size and apart for plain steps
(n = 1) and speculative ones (n > 1; until one is measured they borrow the plain steps' scale), so
a neighbour that slows the machine after start-up changes K too, and a table that was right at
B = 1 but not at B = 8 is corrected at B = 8 without being wrongly corrected at B = 1.

Its settings have no defaults here: `AutoSettings.from_config` reads `probe_every`, `probe_k`,
`forget` and `prior_alpha` from the served `budget=auto` (conf/budget/auto.yaml, as a chain run
reads them) and `margin` / `hindsight_len` from conf/serve.yaml's `batch:`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.batch.costs import CostTable, calibrate
from specpipe.events import BudgetDecision

__all__ = ["AutoSettings", "BatchBudget", "CostTable", "calibrate"]


@dataclass(frozen=True)
class AutoSettings:
    """What budget=auto over a batch is tuned by; every value from the YAML (no defaults here)."""

    probe_every: int  # plain steps between probes (drafters without hindsight)
    probe_k: int  # tokens a probe drafts
    forget: float  # decay of the rates and step-time scales per step
    prior_alpha: float  # the rates' prior, 4 trials' worth
    margin: float  # a K > 0 must beat plain decoding by this share
    hindsight_len: int  # tokens an n-gram row looks back on a plain step

    @classmethod
    def from_config(cls, budget, batch) -> AutoSettings:
        """From the served `cfg.budget` (budget=auto's keys) and conf/serve.yaml's `cfg.batch`."""
        return cls(
            probe_every=int(budget.probe_every),
            probe_k=int(budget.probe_k),
            forget=float(budget.forget),
            prior_alpha=float(budget.prior_alpha),
            margin=float(batch.margin),
            hindsight_len=int(batch.hindsight_len),
        )


class BatchBudget:
    def __init__(
        self,
        k: int,
        auto: AutoSettings | None = None,
        costs: CostTable | None = None,
        hindsight: bool = False,
    ):
        """
        Args:
            k: K of every step (fixed), or the largest K auto may choose.
            auto: choose K per step from `costs` and the measured rates, tuned by these settings;
                None: K every step (fixed), nothing learned.
            costs: the calibrated T(B, n) (auto only).
            hindsight: the rows' drafters support `hindsight` (n-gram): learn on plain steps for free.
        """
        if auto is not None and costs is None:
            raise ValueError("budget=auto needs a CostTable (batch/costs.py cost_table)")
        self.k, self.auto, self.costs, self.hindsight = k, auto is not None, costs, hindsight
        self.settings = auto
        if auto is not None:  # a fixed K learns nothing (observe returns at once)
            self.probe_every, self.probe_k, self.forget = auto.probe_every, auto.probe_k, auto.forget
            self.margin, self.hindsight_len = auto.margin, auto.hindsight_len
        prior_alpha = auto.prior_alpha if auto is not None else 0.5  # unread by a fixed K
        # [successes, trials] with exponential forgetting, from a weak prior of 4 trials
        self._first = [4 * prior_alpha, 4.0]  # a row's first drafted token accepted
        self._cont = [4 * prior_alpha, 4.0]  # a drafted token accepted after an accepted one
        self._rows_with_draft, self._rows = 4.0, 4.0
        self._plain_steps = 0
        # (rows or None for any, n == 1) -> [decayed sum of measured / calibrated seconds, weight]
        self._scale: dict[tuple[int | None, bool], list[float]] = {}
        self.last_reason = "fixed"
        self.hindsight_k = 0  # > 0: the decoder looks back this many tokens on this (plain) step
        self.decision: dict = {"k": k, "reason": "fixed"}

    @property
    def alpha(self) -> float:
        """Rate at which a row's first drafted token is accepted."""
        return min(self._first[0] / self._first[1], 0.999)

    @property
    def continuation(self) -> float:
        """Rate at which a drafted token is accepted, given the one before it was."""
        return min(self._cont[0] / self._cont[1], 0.999)

    @property
    def rho(self) -> float:
        return self._rows_with_draft / self._rows

    def next_k(self, rows: int) -> int:
        self.hindsight_k = 0
        if not self.auto:
            return self._decide(self.k, "fixed", rows)
        plain = self.rate(rows, 0)
        best = max(range(self.k + 1), key=lambda k: self.rate(rows, k))
        if best > 0 and self.rate(rows, best) > plain * (1 + self.margin):
            self._plain_steps = 0
            return self._decide(best, "cost", rows)
        if self.hindsight:
            self.hindsight_k = min(self.hindsight_len, self.k)
            return self._decide(0, "plain", rows)
        self._plain_steps += 1
        if self._plain_steps >= self.probe_every:
            self._plain_steps = 0
            return self._decide(min(self.probe_k, self.k), "probe", rows)
        return self._decide(0, "plain", rows)

    def _decide(self, k: int, reason: str, rows: int) -> int:
        """Remember why this step drafts k (the server writes it to the run folder's steps.jsonl)."""
        self.last_reason = reason
        self.decision = {"k": k, "reason": reason, "batch": rows}
        if self.auto:
            plain = self.rate(rows, 0)
            self.decision |= {
                "alpha": round(self.alpha, 3),
                "continuation": round(self.continuation, 3),
                "rho": round(self.rho, 3),
                "predicted_speedup": round(self.rate(rows, k) / plain, 3),
                "best_k_speedup": round(max(self.rate(rows, j) for j in range(self.k + 1)) / plain, 3),
            }
        return k

    def decision_event(self) -> BudgetDecision | None:
        """The last decision as the Drafted event carries it (None for a fixed K, as a chain run's)."""
        d = self.decision
        if not self.auto:
            return None
        reason = {"cost": "cost model"}.get(d["reason"], d["reason"])
        return BudgetDecision(
            k=d["k"],
            reason=reason,
            predicted=d.get("predicted_speedup", 1.0),
            alpha=d.get("alpha", 0.0),
            continuation=d.get("continuation", 0.0),
        )

    def rate(self, rows: int, k: int) -> float:
        """Expected tokens per second of the batch with K = k (see the module docstring)."""
        a, g, rho = self.alpha, self.continuation, self.rho
        expected = rho * (1 + a * (1 - g**k) / (1 - g)) + (1 - rho) if k > 0 else 1.0
        return rows * expected / self.step_time(rows, 1 + k)

    def step_time(self, rows: int, n: int) -> float:
        """Calibrated T(rows, n) times what this run's steps of that batch size and kind (plain or
        speculative) measured against it. Unmeasured, it borrows, in order: the plain steps of that
        batch size, the steps of that kind at any batch size, the plain steps at any size."""
        assert self.costs is not None, "auto prices steps only with a calibrated cost table"
        for key in ((rows, n == 1), (rows, True), (None, n == 1), (None, True)):
            total, weight = self._scale.get(key, (0.0, 0.0))
            if weight >= 1.0:
                return self.costs.time(rows, n) * total / weight
        return self.costs.time(rows, n)

    def observe(self, report) -> None:
        """Learn step cost, acceptance and draft availability from a step (K = 0 steps teach only cost)."""
        if not self.auto:
            return
        if self.costs is not None and report.verify_s > 0:
            ratio = report.verify_s / self.costs.time(report.batch, report.positions)
            for key in ((report.batch, report.positions == 1), (None, report.positions == 1)):
                scale = self._scale.setdefault(key, [0.0, 0.0])
                scale[0], scale[1] = self.forget * scale[0] + ratio, self.forget * scale[1] + 1.0
        if all(r.drafted == 0 for r in report.rows) and self.last_reason == "plain":
            return
        self._count([(r.drafted, r.accepted) for r in report.rows])

    def observe_hindsight(self, guesses: list[tuple[int, int]]) -> None:
        """On a plain step each checked row's drafter guessed tokens the target had already
        emitted: (tokens guessed, of them matched as a prefix), one pair per row."""
        if guesses:
            self._count(guesses)

    def _count(self, rows: list[tuple[int, int]]) -> None:
        """Per row (drafted d, accepted n): the first token is one trial (held if n >= 1); the
        continuation has min(n + 1, d) - 1 trials (the positions reached after the first), n - 1 held.
        E.g. d = 4: n = 4 -> 3 of 3; n = 2 -> 1 of 2; n = 0 -> no continuation trial."""
        f = self.forget
        drafting = [(d, n) for d, n in rows if d > 0]
        self._first[0] = f * self._first[0] + sum(n >= 1 for _, n in drafting)
        self._first[1] = f * self._first[1] + len(drafting)
        self._cont[0] = f * self._cont[0] + sum(max(n - 1, 0) for _, n in drafting)
        self._cont[1] = f * self._cont[1] + sum(min(n + 1, d) - 1 for d, n in drafting)
        self._rows_with_draft = f * self._rows_with_draft + len(drafting)
        self._rows = f * self._rows + len(rows)
