"""`budget=auto`: the plug-in that wires the rates model, the cost model and the policy to the step.

Contract: `prepare(target, drafter)` (once, after loading) reads the device's calibrated verify curve and the
draft cost and notes what the drafter can do; `start_request()` (each request, called by both drivers) carries
the last request's rates over as a light prior and restarts the probe schedule; `plan` / `fit`
(budgets/policy.py) decide, the request's first plan also how a deferred draft model prefills
(budgets/prefill_price.py: whole prompt, window, none; on `StepPlan.prefill`), every plan priced for the
answer tokens still expected (earlier answers' length, carried like the rates); `observe(..., draft=)` /
`observe_hindsight` feed the step's outcome to `rates` (budgets/rates.py) and `costs` (budgets/costs.py). The
Draft carries what the budget learns from (its evidence class, the drafter's top probabilities); the batch's
price comes with `plan(price=)`. It keeps no drafter, and constructing it measures nothing. Rates and c carry
over between sessions of this process for the same (target, drafter) pair (rates.LEARNED). Why each rule is
there, with the runs that showed it: docs/benchmarks/log/ and the git history of budgets/auto.py.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec

from specpipe.budgets import rates
from specpipe.budgets.costs import Costs
from specpipe.budgets.fixed import K_MAX
from specpipe.budgets.policy import FREE, LOSS_STEPS, AutoPolicy
from specpipe.budgets.prefill_price import KINDS, PrefillPrices, choose_prefill
from specpipe.budgets.rates import CARRY_TRIALS, FORGET, Rates
from specpipe.core.plan import DraftPrefill, StepPlan, TreePricing
from specpipe.core.protocols import BudgetBase, Drafter
from specpipe.costmodel.calibration import expected_speedup
from specpipe.costmodel.context_curve import ContextCurve
from specpipe.drafters.chain import ChainStop
from specpipe.errors import SpecpipeError
from specpipe.events import BudgetDecision

if TYPE_CHECKING:
    from specpipe.core.stages.draft import Draft

__all__ = ["CARRY_TRIALS", "FREE", "AutoBudget"]

# How earlier answers' lengths are remembered: estimators, not preferences (a user states an answer's length
# with max_tokens). The mean prices each step; the last few, as a sample, price a draft prefill that pays only
# on some of them (budgets/prefill_price.py's chunked option).
ANSWER_MEMORY = 0.5  # weight of the earlier answers' length against the last one's
ANSWER_SAMPLE = 8  # the earlier answers' lengths kept as a sample


class AutoBudget(AutoPolicy, BudgetBase):
    name = "auto"
    label_params = ("k_max",)  # what a report needs to tell two runs apart
    first_token_plain = True  # the first token as soon as plain decoding's, not after a K + 1 verify

    def __init__(
        self,
        k_max: int = 16,
        probe_every: int = 8,
        probe_k: int = 2,
        forget: float = FORGET,
        prior_alpha: float = 0.5,
        quick: bool = True,
        probe_max: int = 64,
        loss_margin: float = 0.97,
        explore_cost: float = 0.9,
        prefill_window: int = 256,
        prefill_sinks: int = 4,
        window_keeps: float = 0.5,
        prefill_chunk_steps: float = 0.0,
        draft_prefill: str | None = None,
    ):
        if not 1 <= k_max <= K_MAX:
            raise SpecpipeError(f"budget.k_max={k_max} is out of range: choose 1..{K_MAX}")
        if not 0.0 < forget <= 1.0:
            raise SpecpipeError(f"budget.forget={forget}: use a factor in (0, 1]")
        if not 1 <= probe_k <= K_MAX:
            raise SpecpipeError(f"budget.probe_k={probe_k} is out of range: choose 1..{K_MAX}")
        if not 1 <= probe_every <= probe_max:
            raise SpecpipeError(
                f"budget.probe_every={probe_every}, budget.probe_max={probe_max}: need 1 <= probe_every <= probe_max"
            )
        self.k_max, self.probe_every, self.probe_k, self.forget = k_max, probe_every, probe_k, forget
        if not 0.0 < loss_margin <= 1.0 or not 0.0 < explore_cost <= 1.0:
            raise SpecpipeError(
                f"budget.loss_margin={loss_margin}, budget.explore_cost={explore_cost}: use shares in (0, 1]"
            )
        self.probe_max, self.quick = probe_max, quick
        if draft_prefill is not None and draft_prefill not in KINDS:
            raise SpecpipeError(f"budget.draft_prefill={draft_prefill}: choose {', '.join(KINDS)} or null (priced)")
        if prefill_window < 1 or prefill_sinks < 0 or not 0.0 < window_keeps <= 1.0 or prefill_chunk_steps < 0:
            raise SpecpipeError(
                f"budget.prefill_window={prefill_window}, prefill_sinks={prefill_sinks}, window_keeps="
                f"{window_keeps}, prefill_chunk_steps={prefill_chunk_steps}: need a window >= 1, sinks >= 0, "
                "a share in (0, 1] and chunk steps >= 0 (0: no chunked prefill)"
            )
        self.prefill_window, self.prefill_sinks, self.window_keeps = prefill_window, prefill_sinks, window_keeps
        self.prefill_chunk_steps, self.draft_prefill = prefill_chunk_steps, draft_prefill
        self.loss_margin, self.explore_cost = loss_margin, explore_cost
        self.lookup_k = k_max  # a model drafter's free lookup drafts up to k_max; fit sizes it by its class
        self.rates, self.costs = Rates(forget, prior_alpha), Costs(forget)
        self._probe_wait = 1  # plain steps before the next probe: the first K = 0 decision probes at once
        self._since_probe = 0
        self._probe_due: int | None = None  # a verify probe's wait before it was doubled, until it drafts
        self._step_evidence: int | None = None  # the class fit saw this step, for observe
        self._drafted_before = False  # the previous step drafted (a model drafter was up to date)
        self.hindsight = False  # the drafter guesses emitted tokens without a verify (n-gram, MTP): look back
        self.lookup_hindsight = False  # its lookup beside a model does: look back for the lookup's classes
        self.hindsight_k = 0
        self.decision: BudgetDecision | None = None  # why the last plan chose its K
        self.chain_stop: ChainStop | None = None
        self._key: tuple | None = None
        self._prefill_cost = 0.0  # a draft model's prefill per prompt token, in target steps (0: none to price)
        self._window: int | None = None  # draft.context's window when the user set one
        self.prefill_choice: DraftPrefill | None = None  # this request's choice, made at its first plan
        self.answer_len: float | None = None  # earlier answers' tokens (forgotten by ANSWER_MEMORY)
        self.answers: deque[int] = deque(maxlen=ANSWER_SAMPLE)  # the last few answers' tokens
        self._answer_tokens = 0  # this request's tokens so far
        self.k = self.best_k()

    def prepare(self, target, drafter: Drafter) -> None:
        """The device's verify curve and the draft cost (timed once per device, cached), what the drafter can
        do (look back, free lookups), and the rates an earlier session of this process learned for the pair.
        The drafter is read here only; the budget keeps nothing of it."""
        from specpipe.costmodel.calibration import draft_cost, verify_cost_curve

        self.costs.calibrate(verify_cost_curve(target, self.quick)["ratio"])
        self.costs.context = ContextCurve(target)
        self.costs.c = draft_cost(drafter, target, self.quick)
        self.hindsight = drafter.supports_hindsight and not drafter.evidence_is_free
        self.lookup_hindsight = drafter.supports_hindsight and drafter.evidence_is_free
        self.rates.lookup_classes = drafter.evidence_is_free  # classed drafts are free lookups beside a model
        if drafter.plans_prefill:
            from specpipe.costmodel.calibration import draft_prefill_cost

            self._prefill_cost = draft_prefill_cost(drafter, target, self.quick)
            self._window = drafter.prefill_window
        engine = drafter.engine  # which learned rates apply: the pair by name, and the rows a cut head scores
        self._key = (
            target.info.name,
            target.info.precision,
            drafter.name,
            engine.info.name if engine else "",
            drafter.head_rows,
        )
        if self._key in rates.LEARNED:
            self._carry_in(rates.LEARNED[self._key])
        self.k = self.best_k()

    # ---------------------------------------------------------------- what other parts read

    @property
    def ratio(self) -> dict[int, float]:
        return self.costs.ratio

    @ratio.setter
    def ratio(self, curve: dict[int, float]) -> None:
        self.costs.calibrate(curve)

    @property
    def c(self) -> float:
        return self.costs.c

    @c.setter
    def c(self, c: float) -> None:
        self.costs.c = c

    @property
    def alpha(self) -> float:
        return self.rates.alpha

    @property
    def continuation(self) -> float:
        return self.rates.continuation

    @property
    def draft_cost(self) -> float:
        return self.costs.c

    @property
    def context_curve(self) -> ContextCurve | None:
        """The long-context curve prepare() set up: what an idle refinement (costmodel/refine.py) times."""
        return self.costs.context

    @property
    def calibrated(self) -> bool:
        return bool(self.costs.base)

    @property
    def verify_curve(self) -> dict[int, float] | None:
        return dict(self.costs.ratio) if self.calibrated else None

    def at_context(self, cache_len: int) -> None:
        self.costs.at_context(cache_len)

    def tree_pricing(self) -> TreePricing:
        """The chain rates (prior weight rates.PRIOR_TRIALS), costs and probe schedule a tree step is sized by."""
        return TreePricing(
            alpha=self.rates.alpha,
            continuation=self.rates.continuation,
            prior_trials=rates.PRIOR_TRIALS,
            forget=self.forget,
            draft_cost=self.costs.c,
            verify_curve=self.costs.ratio,
            timing_due=self.costs.plain_timing_due(),
            probe_k=self.probe_k,
            probe_every=self.probe_every,
            probe_max=self.probe_max,
        )

    def plain_timing_due(self) -> bool:
        return self.costs.plain_timing_due()

    def expected_tokens(self, k: int) -> float:
        """Tokens a step drafting k yields by the pooled rates: 1 + alpha (1 - g^k) / (1 - g)."""
        g = self.rates.continuation
        return 1.0 + (self.rates.alpha * (k if g >= 1.0 else (1 - g**k) / (1 - g)) if k else 0.0)

    @property
    def realized(self) -> float | None:
        return self.costs.realized(LOSS_STEPS)

    # ---------------------------------------------------------------- the protocol

    def start_request(self) -> None:
        """A new request (the bench's next question, a chat's next turn) is judged on its own steps: the last
        one's rates stay as a light prior (CARRY_TRIALS), its `realized` at NEW_REQUEST_STEPS, and the probe
        schedule starts again."""
        self.costs.start_request()
        if self._answer_tokens:
            n = self._answer_tokens
            self.answer_len = (
                n if self.answer_len is None else ANSWER_MEMORY * self.answer_len + (1 - ANSWER_MEMORY) * n
            )
            self.answers.append(n)
        self._answer_tokens, self.prefill_choice = 0, None
        self._carry_in(self._learned())
        self._probe_wait, self._since_probe, self._probe_due = 1, 0, None

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        """The policy's plan, priced for the answer tokens still expected; on the request's first plan the
        draft model's prefill is chosen too (whole prompt, window, none: `prefill_choice`), and "none" leaves only
        free drafts for the request."""
        # memoryless: an answer that has run past the usual length is as likely to go on as a new one
        self.expected_left = room + 1.0 if self.answer_len is None else min(room + 1.0, self.answer_len)
        first = self._prefill_cost > 0 and self.prefill_choice is None
        if first:
            self.prefill_choice = choose_prefill(self._prefill_prices(cache_len, room), self.draft_prefill)
        if self.prefill_choice is not None and self.prefill_choice.kind == "none":
            plan = self._free_only(room)
        else:
            plan = super().plan(cache_len, room, price)
        if self.prefill_choice is None:
            return plan
        if first and plan.decision is not None:
            self.decision = msgspec.structs.replace(plan.decision, prefill=self.prefill_choice.label())
            plan = replace(plan, decision=self.decision)
        return replace(plan, prefill=self.prefill_choice)

    def _prefill_prices(self, prompt_len: int, room: int) -> PrefillPrices:
        """What this request's draft prefill options cost and save, by the rates and costs so far."""
        # the optimistic rates, as a probe's: on thin evidence (a first request) the draft must get its chance to
        # show what it accepts, or its rates would never be learned; a short answer still repays no prefill
        r, costs = self.rates, self.costs
        a, g = r.alpha_optimistic, r.continuation_optimistic
        k = self._best(a, g)
        speedup = expected_speedup(a, k, costs.c, costs.ratio, g) if k else 1.0
        return PrefillPrices(
            prompt_len=prompt_len,
            tokens=self.expected_left,
            prefill=self._prefill_cost,
            saving=1.0 - 1.0 / speedup,
            window=self._window if self._window is not None else self.prefill_window,
            sinks=self.prefill_sinks,
            window_keeps=1.0 if self._window is not None else self.window_keeps,
            full=self._window is None,
            # a chunk costing prefill_chunk_steps target steps: each catch-up step at most that much slower
            chunk=max(1, round(self.prefill_chunk_steps / self._prefill_cost)) if self.prefill_chunk_steps else 0,
            answers=tuple(min(room + 1.0, n) for n in self.answers),
        )

    def _free_only(self, room: int) -> StepPlan:
        """A step of a request whose draft model reads nothing: a free lookup beside it may draft, never the
        model (whose catch-up would be the whole prefill after all)."""
        lookup = self.rates.lookup_classes
        self.k, self.hindsight_k, self.chain_stop = 0, self.probe_k if self.lookup_hindsight else 0, None
        self._decide(0, "no draft prefill")
        plan = StepPlan(k=0, lookup_k=self.lookup_k if lookup else 0, hindsight_k=self.hindsight_k)
        return replace(plan, decision=self.decision).capped(room)

    def observe_hindsight(self, checked: int, matched: int, evidence: int | None = None) -> None:
        """The drafter guessed `checked` emitted tokens, the first `matched` right (of class `evidence`). A
        lookup's guess beside a model counts for its class alone and is no probe of the model."""
        lookup = self.lookup_hindsight and evidence is not None
        if not lookup and self._since_probe >= self._probe_wait:
            self._advance_probe_schedule()
        if checked:
            self.rates.count(checked, matched, evidence, pooled=not lookup)
            self._carry_out()

    def observe(
        self,
        drafted: int,
        accepted: int,
        *,
        draft_s: float | None = None,
        verify_s: float | None = None,
        verified: int | None = None,
        draft: Draft | None = None,
    ) -> None:
        """The step's outcome. `verified`: tokens the verify fed after the root when not `drafted` (a tree's
        nodes); `verify_s` None for a batched row (the shared forward's seconds are no T(n) of this row)."""
        fed = (drafted if verified is None else verified) + 1
        self._answer_tokens += accepted + 1
        if drafted:  # before the curve takes this step's seconds: a step is judged by the price it was planned at
            self.costs.realize(accepted, draft_s, verify_s, fed)
        if verify_s:
            self.costs.observe_verify(fed, verify_s)
        evidence, self._step_evidence = self._step_evidence, None
        due, self._probe_due = self._probe_due, None
        if drafted == 0:
            self._drafted_before = False
            if due is not None and self.c * self.probe_k < FREE:
                self._probe_wait, self._since_probe = due, due  # a free probe that drafted nothing tested nothing
            return
        if self.rates.lookup_classes and draft is not None and draft.evidence is not None:
            # a lookup draft beside a model: its class learns; the model's rates, c and S do not (and the next
            # model draft's catch-up on these tokens must not be charged to c either)
            self.rates.count(drafted, accepted, draft.evidence, pooled=False)
            self._drafted_before = False
            self._carry_out()
            return
        self.rates.count(drafted, accepted, evidence)
        tops = draft.tops if draft is not None and self.chain_stop is not None else []
        forwards = max(drafted, len(tops))  # a chain cut by the stop also computed the token it dropped
        self.rates.count_holds(tops[:drafted], accepted)
        if accepted == drafted and self.decision is not None and self.decision.reason == "probe":
            self._since_probe, self._probe_wait = 0, 1  # a probe that held entirely is a lead: probe again
        # c only from steps after a drafting step: after plain ones a model drafter first catches up
        self.costs.learn(accepted, forwards, fed, draft_s if self._drafted_before else None, verify_s)
        self._drafted_before = True
        self._carry_out()

    # ---------------------------------------------------------------- carrying rates over

    def _learned(self) -> dict:
        return {**self.rates.learned(), "c": self.costs.c, "answer_len": self.answer_len, "answers": list(self.answers)}

    def _carry_in(self, learned: dict) -> None:
        self.rates.carry_in(learned)
        self.costs.c = learned["c"]
        if learned.get("answer_len") is not None:
            self.answer_len = learned["answer_len"]
            self.answers = deque(learned.get("answers", ()), maxlen=ANSWER_SAMPLE)

    def _carry_out(self) -> None:
        if self._key is not None:
            rates.LEARNED[self._key] = self._learned()
