"""budget=auto's policy: each step's K from the rates model and the cost model, and why.

Contract: `AutoPolicy.plan(cache_len, room, price=)` returns the step's StepPlan and `fit` resizes a draft in
hand by its evidence class; both log their reason (`decision`, carried by the step's Drafted event). The
policy owns only the probe schedule and the last decision; what it prices by is `rates` (budgets/rates.py)
and `costs` (budgets/costs.py), which budgets/auto.py's AutoBudget feeds from each step's outcome.

- K maximises the expected speed-up over 0..k_max; 0 is plain decoding.
- Probes: where the rates say plain but the rates plus one standard error say draft, the step drafts the K
  that pays on the optimistic rates. While K = 0 a probe comes every `probe_every` steps; one that leaves K
  at 0 doubles the wait (up to `probe_max`). A drafter that guesses emitted tokens without a verify
  (`hindsight`) looks back instead: every plain step where that is free, else on the probe schedule.
- Evidence classes: a free drafter is asked for k_max tokens where some class pays, and `fit` sizes the
  draft by its own class; a thin continuation is tested one token further (`_longer`).
- Loss guard: once drafting returned under `loss_margin` of plain's speed, steps stay plain but for probes.
- Short answers: a probe is bought only where the answer's expected remaining tokens (`expected_left`, set
  by auto.py each plan) can repay what it is expected to lose, on the optimistic rates (`_repays`).
- Chain stop: a model drafter stops inside K where the chance its chain holds returns less than the step's
  rate S per unit of cost (drafters/chain.py ChainStop).

The user's knobs are conf/budget/auto.yaml's (`loss_margin`, `explore_cost` beside K's and the probes'). The
constants below are not a user's choice: FREE says when a cost rounds to nothing (a look back that costs
a hundredth of a step is taken every plain step rather than scheduled), LOSS_STEPS is the weight of
evidence `realized` needs before it can be told from noise, a property of the estimator, not a preference.
The short-answer and thin-continuation rules (and PROBE_HOPE) are budgets/probe_rules.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace

from specpipe.budgets import probe_rules
from specpipe.budgets.costs import Costs
from specpipe.budgets.rates import Rates, optimistic, rate
from specpipe.core.plan import StepPlan
from specpipe.costmodel.calibration import expected_speedup
from specpipe.drafters.chain import ChainStop
from specpipe.events import BudgetDecision

FREE = 0.01  # a draft or look back cheaper than this share of a target step is free: taken on every plain step
LOSS_STEPS = 5.0  # drafting steps' worth of this run's timings (forgotten) before `realized` is judged


class AutoPolicy:
    """The decisions of budget=auto; AutoBudget (budgets/auto.py) sets these members and feeds the models."""

    k_max: int
    probe_k: int
    probe_every: int
    probe_max: int
    loss_margin: float  # drafting that returned under this share of plain's speed stops, but for probes
    explore_cost: float  # a longer draft that tests a thin continuation may be priced this share of the best one
    lookup_k: int
    rates: Rates
    costs: Costs
    hindsight: bool  # the drafter guesses emitted tokens without a verify (n-gram, MTP): look back
    lookup_hindsight: bool  # its lookup beside a model does: look back for the lookup's classes
    k: int
    hindsight_k: int
    decision: BudgetDecision | None
    chain_stop: ChainStop | None
    _probe_wait: int  # plain steps before the next probe
    _since_probe: int
    _probe_due: int | None  # a verify probe's wait before it was doubled, until it drafts
    _step_evidence: int | None  # the class fit saw this step, for observe
    expected_left: float = math.inf  # answer tokens still expected (auto.py sets it per plan; inf: unknown)

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        """This step's K at this cache length (priced by the batch's `price` while batched), with what the
        decision set: the chain stop, the look back on a plain step, a free lookup's k_max; never past `room`."""
        self.costs.price(price)
        self.costs.at_context(cache_len)
        k, lookup_k, width = self.next_k(), self.lookup_k, self.costs.batch_width
        if width is not None and max(k, lookup_k) > width:
            # the batch chose its width from every row's rates (batch/pricing.py): a row drafting past it
            # would make the batch's step wider for all
            k, lookup_k = min(k, width), min(lookup_k, width)
            self.k = self._decide(k, "batch width")
        return self._planned(StepPlan(k=k, lookup_k=lookup_k)).capped(room)

    def fit(self, plan: StepPlan, evidence: int, drafted: int) -> StepPlan:
        """The plan for a draft of class `evidence` in hand (`fit_k`), with the decision and look back it set."""
        return self._planned(replace(plan, k=self.fit_k(evidence, drafted)))

    def _planned(self, plan: StepPlan) -> StepPlan:
        probe = self.decision is not None and self.decision.reason == "probe"
        return replace(
            plan, chain_stop=self.chain_stop, hindsight_k=self.hindsight_k, probe=probe, decision=self.decision
        )

    def next_k(self) -> int:
        """K for this step. With K = 0, `hindsight_k` > 0 asks the step to look back instead."""
        r = self.rates
        self.hindsight_k, self._step_evidence = 0, None
        if self.lost:
            return self._plain_while_lost()
        if r.classes and self.costs.c * self.k_max < FREE and self._some_class_pays():
            # a free drafter on text where some class pays proposes all it can; fit sizes it by its class
            # (not the pooled rates, which weak one-token matches dilute)
            self.k = self.k_max
            return self._decide(self.k, "cap")
        self.k = self._best(r.alpha)
        if self.k == 1 and self.k_max > 1:
            # one-token drafts never test the continuation: draft what its optimistic value pays for
            longer = self._best(r.alpha, r.continuation_optimistic)
            if longer > 1 and self._repays(longer):
                self._since_probe, self._probe_wait = 0, self.probe_every
                self.k = longer
                return self._decide(self.k, "probe", (r.alpha, r.continuation_optimistic))
        if self.k > 0:
            self._since_probe, self._probe_wait = 0, self.probe_every  # once drafting stops, probe after probe_every
            return self._decide(self.k, "cost model")
        thin = self._best(r.alpha_optimistic, r.continuation_optimistic) > 0
        self._since_probe += 1
        free = self.costs.c * self.probe_k < FREE
        if self.hindsight:  # a look back costs no verify: on thin evidence, every step when free, else on schedule
            if thin or free or self._since_probe >= self._probe_wait:
                self.hindsight_k = self.probe_k if free else 1
            return self._decide(0, "plain")
        if (thin or self._since_probe >= self._probe_wait) and not self._repays(self._probe_size()):
            return self._decide(0, "short answer")  # the schedule waits: a longer answer may still probe
        if thin:  # optimism buys a probe as long as the optimistic rates say it pays
            self._since_probe, self._probe_wait = 0, self.probe_every
            self.k = self._probe_size()
        elif self._since_probe >= self._probe_wait:
            self._advance_probe_schedule(verify=True)
            self.k = self._probe_size()
        return self._decide(self.k, "probe" if self.k else "plain")

    def fit_k(self, evidence: int, k: int) -> int:
        """K for a draft of class `evidence` in hand (at most k), by that class's rates. Where they say plain,
        a drafter that can look back does so; another probes where the class's optimistic rates pay. A free
        lookup beside a model is priced at no draft cost."""
        self._step_evidence = evidence
        c = 0.0 if self.rates.lookup_classes else self.costs.c  # a free lookup beside a model
        first, nxt = self.rates.of_class(evidence)
        rates = (rate(first), rate(nxt))
        best, reason = self._best(*rates, c=c), "cost model"
        longer = self._longer(best, *rates, nxt, c)
        if longer > best:  # the class's continuation is thin evidence: test it on a longer draft
            best, reason, rates = longer, "probe", (rates[0], optimistic(nxt))
        if best == 0:
            hopeful = (optimistic(first), optimistic(nxt))
            if self.hindsight or self.lookup_hindsight:  # a free look back teaches the class, as a probe would
                reason = "plain"
                self.hindsight_k = self.probe_k if c * self.probe_k < FREE else 1
            elif self._best(*hopeful, c=c) > 0:
                best, reason, rates = max(self.probe_k, self._best(*hopeful, c=c)), "probe", hopeful
            else:
                reason = "plain"
        if 0 < best < self.probe_k and c * self.probe_k < FREE and self._pays(self.probe_k, *rates, c=c):
            best = self.probe_k  # never one free token alone: it teaches nothing of the class's continuation
        self.k = min(best, k)
        return self._decide(self.k, reason, rates, evidence, c=c)

    def best_k(self) -> int:
        """K by the cost model; a probe's K when only the optimistic rates say drafting pays."""
        k = self._best(self.rates.alpha)
        if k == 0 and self._best(self.rates.alpha_optimistic, self.rates.continuation_optimistic) > 0:
            return self._probe_size()
        return k

    @property
    def lost(self) -> bool:
        """Drafting returned under `loss_margin` of plain's speed on this run: steps stay plain but for probes."""
        realized = self.costs.realized(LOSS_STEPS)
        return realized is not None and realized < self.loss_margin

    # ---------------------------------------------------------------- pricing

    def _best(self, alpha: float, g: float | None = None, c: float | None = None) -> int:
        """The K of 0..k_max with the best expected speed-up (ties go to the shorter draft)."""
        g = self.rates.continuation if g is None else g
        c = self.costs.c if c is None else c
        scores = {k: expected_speedup(alpha, k, c, self.costs.ratio, g) for k in range(0, self.k_max + 1)}
        return max(scores, key=lambda k: (scores[k], -k))

    def _pays(self, k: int, alpha: float, continuation: float, c: float) -> bool:
        return expected_speedup(alpha, k, c, self.costs.ratio, continuation) >= 1.0

    def _repays(self, k: int) -> bool:
        """A probe of k tokens can repay its loss within the answer's expected rest (budgets/probe_rules.py)."""
        return probe_rules.repays(k, self.rates, self.costs.c, self.costs.ratio, self.expected_left, self._best)

    def _some_class_pays(self) -> bool:
        return any(self._best(a, g) > 0 for a, g in self.rates.class_rates())

    def _probe_size(self) -> int:
        """A probe's K: the draft that pays on the optimistic rates, never under probe_k."""
        return max(self.probe_k, self._best(self.rates.alpha_optimistic, self.rates.continuation_optimistic))

    def _longer(self, k: int, alpha: float, g: float, nxt: list[float], c: float) -> int:
        """k, or k + 1 where a thin continuation is worth testing (budgets/probe_rules.py `longer`)."""
        return probe_rules.longer(k, alpha, g, nxt, c, self.costs.ratio, self.explore_cost, self.k_max)

    # ---------------------------------------------------------------- probes and the loss guard

    def _plain_while_lost(self) -> int:
        """A plain step (a free look back where that is free), and on the probe schedule a probe at the K the
        cost model would draft: the loss is bounded by the probes', and text that turns predictable is found."""
        self._since_probe += 1
        if self.hindsight and self.costs.c * self.probe_k < FREE:
            self.hindsight_k = self.probe_k
        if self._since_probe < self._probe_wait:
            self.k = 0
            return self._decide(0, "lost")
        if not self._repays(max(self.probe_k, self._best(self.rates.alpha))):
            self.k = 0
            return self._decide(0, "short answer")
        self._advance_probe_schedule(verify=True)  # the next probe waits twice as long unless this one wins
        self.hindsight_k = 0
        self.k = max(self.probe_k, self._best(self.rates.alpha))
        return self._decide(self.k, "probe")

    def _advance_probe_schedule(self, verify: bool = False) -> None:
        """A probe is taken while K is 0: if it leaves K at 0, the next one waits twice as long. A `verify`
        probe may find nothing to draft (observe then puts the schedule back)."""
        w = self._probe_wait
        self._since_probe = 0
        self._probe_wait = self.probe_every if w < self.probe_every else min(2 * w, self.probe_max)
        self._probe_due = w if verify else None

    def _decide(self, k: int, reason: str, rates=None, evidence: int | None = None, c: float | None = None) -> int:
        """Record why this step drafts k and return k. `rates`: the (alpha, continuation) used when not the
        pooled ones; `c`: the draft's cost per token when not the drafter's (a free lookup's 0)."""
        r, costs = self.rates, self.costs
        c = costs.c if c is None else c
        if k == 0 and self.lookup_hindsight:
            self.hindsight_k = self.probe_k  # the lookup looks back for free whatever the model's K
        a, g = rates or (
            (r.alpha_optimistic, r.continuation_optimistic) if reason == "probe" else (r.alpha, r.continuation)
        )
        ratio = costs.ratio
        predicted = expected_speedup(a, k, c, ratio, g)
        t_verify = ratio[min(k + 1, max(ratio))]
        # the chain stop: one more token must return the step's rate S (drafting steps' tokens per cost) on its
        # cost c plus its share of the verify (`slot`); a token already computed costs only its slot
        rate_s, slot = max(1.0, costs.returned), (t_verify - 1.0) / max(k, 1)
        self.chain_stop = (
            ChainStop(rate_s * (c + slot), r.hold_rates(), keep=rate_s * slot) if k > 0 and c >= FREE else None
        )
        self.decision = BudgetDecision(
            k=k,
            reason=reason,
            predicted=round(predicted, 4),
            alpha=round(a, 4),
            continuation=round(g, 4),
            c=round(c, 4),
            t_verify=round(t_verify, 4),
            evidence=evidence,
            floor=round(self.chain_stop.floor, 4) if self.chain_stop else 0.0,
            context_curve=costs.context.source if costs.context is not None else "",
        )
        return k
