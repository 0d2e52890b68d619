"""`budget=auto`: pick K each step from a cost model; K = 0 (plain decoding)
when no K is expected to beat it. Each choice is logged (`decision`, carried
by the step's Drafted event): K, the predicted speed-up and the rates used.

Expected speed-up of K (calibrate.expected_speedup) uses the device's
measured verify cost T(K+1)/T(1), the drafter's cost c per drafted token,
and the acceptance rates estimated online. When the rates say "plain" but
the rates plus one standard error say "draft" (thin evidence, e.g. one
rejected probe), the step drafts a probe of the K that pays on those
optimistic rates: the bandit's rule for acting on little evidence. A draft
model that nearly always agrees thus proves itself on a long draft within
a step or two; a fixed 2-token probe proves little about long drafts and,
where a short verify costs as much as a long one, costs as much.

Acceptance is two rates, each a success / trial count with exponential
forgetting so it follows the text: alpha, that the first drafted token is
accepted, and the continuation, that a token is accepted given the one
before it was. Drafts are bursty (an n-gram that matched a copied span keeps
matching: on code, 44% first-token acceptance but ~80-100% after that), so
one geometric rate would undervalue long drafts exactly where they pay.

While K = 0 is chosen, a draft every `probe_every` steps keeps the rates
fresh (at least probe_k tokens: a one-token probe says nothing about the
continuation, which then stays at its prior and keeps long drafts priced
out); a probe that held entirely is followed by another at once (doubling
the wait after it cost many plain steps at high acceptance; docs/benchmarks.md);
any other probe that leaves K at 0 doubles the wait (up to `probe_max`), so text the drafter
cannot predict costs a few probes, not one every 8 steps. The very first
K = 0 decision probes at once, so a prior that says "plain" does not cost a
run its first steps.

Drafters that classify their drafts (`last_evidence`; n-gram: the length
of the matched suffix) get rates per class too: a draft is sized by its own
class's rates once proposed (`fit`), and a free drafter (n-gram) is asked for
up to k_max tokens every step so that fit, not the pooled rates, decides. On
the code suite a 1-token n-gram match led to an accepted first token 30% of
the time and a 4-token match 87%: pooled, those make one K too long for the
first and too short for the second. A new class starts from the pooled
rates (PRIOR_TRIALS trials' worth). A model drafter with a prompt lookup in
front (`evidence_is_free`) classes only its lookup drafts: those are priced
at no draft cost and counted in their class alone, so the model's pooled
rates and its cost per token c stay the model's own.

Drafters that can guess tokens the target already emitted without a target
forward (`hindsight`: n-gram, MTP heads) are probed that way instead: no
verify slot is spent, so a free drafter (n-gram) is checked on every plain
step and a head on the same schedule, one token (one LM head) at a time.
A model drafter whose lookup can look back (`evidence_is_free` and
`supports_hindsight`: draft=chain [ngram, layerskip]) looks back with the
lookup on every plain step, as draft=ngram does, and the look back counts for
the lookup's class alone: the model is still probed by verifies. Its classes
start from the lookups' pooled rates, never the model's (one rejected layer
skip draft priced the chain's first n-gram classes at 0.32 on SmolLM2).

A drafter that runs a model (draft model, MTP head, layer skip) is also told
where to stop inside the step's K (`chain_stop`, drafters/chain.py): no
draft forward for the next token once the chance that the chain holds up to
this one is under S·(c + ΔT). One more token returns that chance in expected
tokens and costs c plus ΔT, its share of the verify, while drafting steps
return S tokens per unit of cost (S: measured): a token expected to return
less lowers the step's rate. A token already computed costs only ΔT, so it is
kept down to S·ΔT. The chance is read from the draft's confidence in its chain (the
product of its top probabilities), through hold rates measured per tenth of
confidence on this run's verified drafts (optimistic by one standard error,
from a prior that trusts the confidence as it is, and never falling as the
confidence rises): the 0.5B draft of the 1.5B held 94-100% of its chains at
confidence 0.5-0.9 and 22-33% at 0.1-0.4. The rates price the typical draft;
the stop cuts the one the draft model is unsure of (the real pair drafted 16
tokens on code and lost the first one twice in a row).

Constructing the budget measures nothing: `prepare(target, drafter)`, which
the session calls once after loading, reads the device's calibrated verify
curve (timed and cached on first use, before any request) and the drafter's
cost. A request never waits on a timing: at a long context the curve comes
from what `specpipe-calibrate` cached there, or else from the short curve and
a context-length model (costmodel/context_curve.py); each decision's
`context_curve` says which. c starts from
that calibration (a draft model timed alone on this device; for
a drafter running part of the target, its share of the target's weight
bytes) and then follows the run: each step's draft seconds per drafted token
over the target step time implied by that step's verify (verify seconds /
T(k+1)/T(1)).

Rates and c carry over: one budget serves every turn of a Session, and a new
Session of this process with the same target and drafter starts from what
the last one learned (as a light prior, CARRY_TRIALS trials' worth).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace

from specpipe.budgets.fixed import K_MAX
from specpipe.core.plan import StepPlan
from specpipe.core.protocols import BudgetBase, Drafter
from specpipe.costmodel.context_curve import ContextCurve
from specpipe.drafters.chain import BUCKETS, ChainStop, bucket
from specpipe.errors import SpecpipeError
from specpipe.events import BudgetDecision

FREE = 0.01  # a look back cheaper than this share of a target step is taken on every plain step
MEASURED_WINDOW = 9  # verify timings: the median of the last few per length, robust to a descheduled step
PLAIN_TIMINGS = 3  # plain-step timings the measured curve needs before its T(1) is trusted without a refresh
PLAIN_STALE = 32  # verifies since the last plain one after which T(1) is timed again where a verify's gain is thin
PRIOR_TRIALS = 2.0  # weight of the pooled rates a new evidence class starts from
EXPLORE_COST = 0.9  # a longer draft that tests a thin continuation may be priced this share of the best one
THIN_TRIALS = 2 * PRIOR_TRIALS  # a continuation with fewer trials than this is tested on a longer draft
LOSS_STEPS = 5.0  # drafting steps' worth of this run's timings (forgotten) before `realized` is judged
LOSS_MARGIN = 0.97  # drafting that returned under this share of plain's speed stops, but for probes
DESCHEDULED = 3.0  # a drafting step over this many times its measured price was descheduled: `realized` prices it
NEW_REQUEST_STEPS = 2.0  # weight of the last request's realized figures in a new one
CARRY_TRIALS = 4.0  # weight of rates carried from an earlier session: a prior that new text overrides in a few steps
# (target, drafter) -> rates an earlier budget of this process learned: a new session (the TUI's, a bench
# sweep job) starts from them instead of the 0.5 prior. Within a session one budget serves every turn.
_LEARNED: dict[tuple, dict] = {}


class AutoBudget(BudgetBase):
    name = "auto"
    label_params = ("k_max",)  # what a report needs to tell two runs apart
    # a run's first step is plain: its token comes as soon as plain decoding's, not after a K + 1 verify (on a
    # 40-token prompt that verify made SmolLM2's first token ~20% later); the drafter sees the prompt meanwhile
    first_token_plain = True

    def __init__(
        self,
        k_max: int = 16,
        probe_every: int = 8,
        probe_k: int = 2,
        forget: float = 0.9,
        prior_alpha: float = 0.5,
        quick: bool = True,
        probe_max: int = 64,
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
        self.lookup_k = k_max  # a model drafter's free lookup drafts up to k_max; fit sizes it by its class
        self.probe_max, self.quick = probe_max, quick
        self._realized = (0.0, 0.0, 0.0)  # drafting steps: tokens, cost in plain steps, steps (each forgotten)
        self._room = 0  # the last plan's room: a larger one starts a new request
        self._probe_wait = 1  # plain steps before the next probe: the first K = 0 decision probes at once
        self._probe_due: int | None = None  # a verify probe's wait before it was doubled, until it drafts
        # a weak prior, two trials' worth each: [successes, failures]
        self._first = [2 * prior_alpha, 2 * (1 - prior_alpha)]
        self._next = [2 * prior_alpha, 2 * (1 - prior_alpha)]
        # evidence class -> its own [first, next] counts (a drafter's last_evidence; fit sizes drafts by them)
        self._classes: dict[int, tuple[list[float], list[float]]] = {}
        # a lookup beside a model (evidence_is_free): its drafts' and look backs' pooled rates, a new class's prior
        self._lookups = ([2 * prior_alpha, 2 * (1 - prior_alpha)], [2 * prior_alpha, 2 * (1 - prior_alpha)])
        self._step_evidence: int | None = None  # the class fit saw this step, for observe
        self._since_probe = 0
        self._drafted_before = False  # the previous step drafted (the drafter was up to date)
        self._base: dict[int, float] = {}  # the short-context curve (the ratio setter fills it)
        self._calibrated: dict[int, float] = {}
        self._seconds: dict[int, deque[float]] = {}  # n -> this run's last verify seconds over n tokens
        self._since_plain = 0  # verifies since the last plain (n = 1) one
        self._batch_curve: dict[int, float] | None = None  # price_batch's, while the row is batched
        self.ratio = {n: float(n) for n in range(1, K_MAX + 2)}  # pessimistic until calibrated
        self.c = 1.0
        # the drafter can guess tokens already emitted (n-gram, MTP): probe in hindsight, no verify
        self.hindsight = False
        # its lookup beside a model can (draft=chain's free sources): a free look back on every plain step,
        # for the lookup's classes; the model is still probed by verifies
        self.lookup_hindsight = False
        self.hindsight_k = 0
        self.decision: BudgetDecision | None = None  # why the last next_k chose its K
        self.chain_stop: ChainStop | None = None  # where a model drafter stops inside K (set by each decision)
        # per tenth of the draft's chain confidence: [held, not held] (ChainStop.hold), prior = the confidence
        self._holds = [
            [PRIOR_TRIALS * (b + 0.5) / BUCKETS, PRIOR_TRIALS * (1 - (b + 0.5) / BUCKETS)] for b in range(BUCKETS)
        ]
        # tokens per unit of cost (target steps) the drafting steps actually returned: the chain stop's S. The
        # predicted one assumes the rates hold for all K; with the stop, drafts end where the draft is unsure
        # and the continuation measured on them nears 1, so the prediction rose to 1.5-2 where steps returned 1.2
        self._rate = 1.0
        self._drafter: Drafter | None = None  # its last_tops: the top probabilities of the step's chain
        self._key: tuple | None = None
        self._context: ContextCurve | None = None  # T(n)/T(1) by cache length, from prepare
        self.k = self.best_k()

    def prepare(self, target, drafter: Drafter) -> None:
        """Calibrate for this target and drafter: the device's verify curve and the draft cost (both
        timed once per device and cached on disk), whether the drafter can look back, and the rates an
        earlier session of this process learned for the same pair."""
        from specpipe.costmodel.calibration import draft_cost, verify_cost_curve

        self.ratio = verify_cost_curve(target, self.quick)["ratio"]
        self._context = ContextCurve(target)  # long contexts: curves specpipe-calibrate timed, else modelled
        self.c = draft_cost(drafter, target, self.quick)
        self.hindsight = drafter.supports_hindsight and not drafter.evidence_is_free
        self.lookup_hindsight = drafter.supports_hindsight and drafter.evidence_is_free
        self._drafter = drafter
        self._key = _pair_key(target, drafter)
        self._carry_in(_LEARNED.get(self._key))
        self.k = self.best_k()

    def at_context(self, cache_len: int) -> None:
        """Price verifies with the curve at this cache length (timed by specpipe-calibrate, else modelled:
        nothing is timed here, on the request's path); this run's timings still correct it."""
        calibrated = self._context.ratio_at(cache_len, self._base) if self._context is not None else self._base
        if calibrated is not self._calibrated:
            self._calibrated, self._curve = calibrated, _monotone(calibrated)

    @property
    def context_curve(self) -> ContextCurve | None:
        """The long-context curve prepare() set up: what an idle refinement (costmodel/refine.py) times."""
        return self._context

    @property
    def calibrated(self) -> bool:
        """Whether prepare() gave it a verify curve (from the cache or a timing); before that `ratio` is empty."""
        return bool(self._base)

    @property
    def ratio(self) -> dict[int, float]:
        """T(n)/T(1) the cost model uses: the calibrated curve, corrected by this run's verify timings; in a
        batch, the batch's price of this row's draft (`price_batch`)."""
        return self._batch_curve if self._batch_curve is not None else self._curve

    @ratio.setter
    def ratio(self, calibrated: dict[int, float]) -> None:
        self._base = self._calibrated = dict(calibrated)  # _base: the short-context curve at_context starts from
        self._seconds.clear()
        self._curve = _monotone(calibrated)

    def expected_tokens(self, k: int) -> float:
        """Tokens a step drafting k yields by this run's pooled rates: 1 + alpha (1 - g^k) / (1 - g)."""
        g = self.continuation
        return 1.0 + (self.alpha * (k if g >= 1.0 else (1 - g**k) / (1 - g)) if k else 0.0)

    @property
    def draft_cost(self) -> float:
        return self.c

    def price_batch(self, curve: dict[int, float] | None) -> None:
        """Price drafts by `curve` while the row shares a batched forward (None: alone again). Its verify
        timings are then the shared forward's, at the batch's widest draft: they do not correct this row's curve.
        The batch's width (the positions it prices below BEYOND, less the root) caps every draft of the row,
        probes too (`plan`)."""
        self._batch_curve = _monotone(curve) if curve is not None else None

    @property
    def _batch_width(self) -> int | None:
        """The batch's K this step, read off its price (the positions below BEYOND, less the root); None alone."""
        from specpipe.batch.pricing import BEYOND  # here: the batch imports this module's budget

        if self._batch_curve is None:
            return None
        return max(n for n, price in self._batch_curve.items() if price < BEYOND) - 1

    def _observe_verify(self, n: int, seconds: float) -> None:
        """A verify over n tokens took `seconds` (n = 1: a plain step). Once a plain step has been timed,
        measured points replace the calibration's and the rest of the curve is scaled by the median
        measured / calibrated ratio: a calibration taken while another process held the cores
        must not keep auto from drafting for the whole run.

        Each point is the median of its last MEASURED_WINDOW timings, and the curve never falls as n
        grows: on a loaded machine one plain step descheduled for a second made a 10-token verify look
        free (T(10)/T(1) = 1.0), and auto drafted 281 tokens at 3% acceptance on a prose prompt."""
        if self._batch_curve is not None:
            return  # the shared forward's seconds, at the batch's widest draft: not this row's T(n)
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
        self._curve = _monotone({m: measured.get(m, r * scale) for m, r in self._calibrated.items()})

    def plain_timing_due(self) -> bool:
        """T(1) needs a plain step's timing: too few of them this run, or none for PLAIN_STALE verifies.

        A drafter that verifies a node on every step never times a plain one again, and the curve's
        T(2)/T(1) stays where the first, cold step left it: on SmolLM2 + lookahead (prose) one plain step
        timed slow made a one-node verify look free (T(2)/T(1) = 1.0, measured 1.08), and the sizer
        verified one node at 5% acceptance on 60 of 61 steps (0.95x of plain)."""
        return len(self._seconds.get(1, ())) < PLAIN_TIMINGS or self._since_plain >= PLAIN_STALE

    def _carry_in(self, learned: dict | None) -> None:
        """Start from an earlier session's rates for the same pair, scaled to CARRY_TRIALS' weight."""
        if not learned:
            return
        scale = lambda counts: [x * min(1.0, CARRY_TRIALS / sum(counts)) for x in counts]  # noqa: E731
        self._first, self._next = scale(learned["first"]), scale(learned["next"])
        self._classes = {e: (scale(f), scale(n)) for e, (f, n) in learned.get("classes", {}).items()}
        if "lookups" in learned:
            self._lookups = (scale(learned["lookups"][0]), scale(learned["lookups"][1]))
        self.c = learned["c"]
        if "holds" in learned:
            self._holds = [list(h) for h in learned["holds"]]

    def _learned(self) -> dict:
        """The rates a later session (or request) starts from: `_carry_in` reads them."""
        return {
            "first": list(self._first),
            "next": list(self._next),
            "classes": {e: (list(f), list(n)) for e, (f, n) in self._classes.items()},
            "lookups": (list(self._lookups[0]), list(self._lookups[1])),
            "c": self.c,
            "holds": [list(h) for h in self._holds],
        }

    def _carry_out(self) -> None:
        if self._key is not None:
            _LEARNED[self._key] = self._learned()

    @property
    def _lookup_drafts(self) -> bool:
        """The drafter's classed drafts are free lookups beside its model (drafters/model.py lookup_min_n)."""
        return self._drafter is not None and self._drafter.evidence_is_free

    @property
    def alpha(self) -> float:
        """P(the first drafted token is accepted)."""
        return self._first[0] / sum(self._first)

    @property
    def continuation(self) -> float:
        """P(a drafted token is accepted | the one before it was)."""
        return self._next[0] / sum(self._next)

    def _count(self, drafted: int, accepted: int, evidence: int | None = None, pooled: bool = True) -> None:
        """One step's evidence: a draft of `drafted` tokens whose first `accepted` were right; a draft of
        class `evidence` counts for that class's rates as well as the pooled ones (not `pooled`: a lookup's
        beside a model, for the lookups' pooled rates instead, which new classes start from)."""
        if pooled:
            self._first, self._next = _counted(self._first, self._next, drafted, accepted, self.forget)
        elif evidence is not None:
            self._lookups = _counted(*self._lookups, drafted, accepted, self.forget)
        if evidence is not None:
            first, nxt = self._class(evidence)
            self._classes[evidence] = _counted(first, nxt, drafted, accepted, self.forget)

    def _class(self, evidence: int) -> tuple[list[float], list[float]]:
        """A class's [first, next] counts; a new one starts from the pooled rates, PRIOR_TRIALS' worth (a
        lookup beside a model: the lookups' own, not the model's)."""
        if evidence not in self._classes:
            prior = lambda counts: [x * PRIOR_TRIALS / sum(counts) for x in counts]  # noqa: E731
            first, nxt = self._lookups if self._lookup_drafts else (self._first, self._next)
            self._classes[evidence] = (prior(first), prior(nxt))
        return self._classes[evidence]

    @property
    def alpha_optimistic(self) -> float:
        """alpha plus one standard error: little evidence (one failed probe) must not pin K at 0 for long.

        With forgetting the evidence saturates near 1 / (1 - forget) steps' worth, so the bonus shrinks
        to a few points once acceptance is known; where speculation cannot pay it still decides K = 0.
        """
        return _optimistic(self._first)

    @property
    def continuation_optimistic(self) -> float:
        return _optimistic(self._next)

    def _best(self, alpha: float, g: float | None = None, c: float | None = None) -> int:
        from specpipe.costmodel.calibration import expected_speedup

        g = self.continuation if g is None else g
        c = self.c if c is None else c
        scores = {k: expected_speedup(alpha, k, c, self.ratio, g) for k in range(0, self.k_max + 1)}
        return max(scores, key=lambda k: (scores[k], -k))  # ties go to the shorter draft

    def _pays(self, k: int, alpha: float, continuation: float, c: float | None = None) -> bool:
        """A draft of k tokens at these rates (and draft cost c per token) is expected to beat plain decoding."""
        from specpipe.costmodel.calibration import expected_speedup

        return expected_speedup(alpha, k, self.c if c is None else c, self.ratio, continuation) >= 1.0

    def _probe_size(self) -> int:
        """A probe's K, priced by the cost model on the optimistic rates: the draft that would pay
        if acceptance is as good as the evidence allows, and never under probe_k.
        A short probe on a drafter that nearly always
        agrees proves little about long drafts and, where a short verify costs as much as a long one, costs as much."""
        return max(self.probe_k, self._best(self.alpha_optimistic, self.continuation_optimistic))

    def _decide(
        self,
        k: int,
        reason: str,
        rates: tuple[float, float] | None = None,
        evidence: int | None = None,
        c: float | None = None,
    ) -> int:
        """Record why this step drafts k (the step's Drafted event carries it) and return k. `rates`: the
        (alpha, continuation) used when not the pooled ones (an evidence class's); `c`: the draft's cost per
        token when not the drafter's (a free lookup draft's 0)."""
        c = self.c if c is None else c
        from specpipe.costmodel.calibration import expected_speedup

        if k == 0 and self.lookup_hindsight:
            self.hindsight_k = self.probe_k  # the lookup looks back for free whatever the model's K: its classes learn
        a, g = rates or (
            (self.alpha_optimistic, self.continuation_optimistic)
            if reason == "probe"
            else (self.alpha, self.continuation)
        )
        predicted = expected_speedup(a, k, c, self.ratio, g)
        t_verify = self.ratio[min(k + 1, max(self.ratio))]
        # a drafter with a cost per token stops where one more token returns less than the step's rate
        # rate: the tokens per unit of cost drafting steps returned; slot: one drafted token's share of the verify
        rate, slot = max(1.0, self._rate), (t_verify - 1.0) / max(k, 1)
        self.chain_stop = (
            ChainStop(rate * (c + slot), self._hold_rates(), keep=rate * slot) if k > 0 and c >= FREE else None
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
            context_curve=self._context.source if self._context is not None else "",
        )
        return k

    def best_k(self) -> int:
        """K by the cost model; probe_k when only the optimistic alpha says drafting pays."""
        k = self._best(self.alpha)
        if k == 0 and self._best(self.alpha_optimistic, self.continuation_optimistic) > 0:
            return self._probe_size()
        return k

    def next_k(self) -> int:
        """K for this step. With K = 0, `hindsight_k` > 0 asks the step to look back instead (plan carries it)."""
        self.hindsight_k = 0
        self._step_evidence = None
        if self.lost:
            return self._plain_while_lost()
        if self._classes and self.c * self.k_max < FREE and self._some_class_pays():
            # a free drafter that classifies its drafts, on text where some class's drafts pay: let it propose
            # all it can, fit sizes the draft by its class. Where no class pays (prose), the steps stay plain
            # and look back: sizing by class there drafted 80 tokens at 2% acceptance (0.93x of plain). Not
            # the pooled rates: weak one-token matches dilute them, and on rag-521 (SmolLM2, a 43-token answer)
            # they priced out the 2-token matches that held 7 of 9 times, 0.97x of plain where K = 2 ran 1.45x
            self.k = self.k_max
            return self._decide(self.k, "cap")
        self.k = self._best(self.alpha)
        if self.k == 1 and self.k_max > 1:
            # one-token drafts never test the continuation rate, so a low one is never corrected (the 1.5B
            # with its 0.5B draft sat at K = 1 on a long document at 96% acceptance, 0.79 of fixed K = 8):
            # draft what its optimistic value pays for; a continuation that is really low soon shows it
            longer = self._best(self.alpha, self.continuation_optimistic)
            if longer > 1:
                self._since_probe, self._probe_wait = 0, self.probe_every
                self.k = longer
                return self._decide(self.k, "probe", (self.alpha, self.continuation_optimistic))
        if self.k > 0:
            self._since_probe = 0  # counts plain steps since the last draft or probe
            self._probe_wait = self.probe_every  # drafting pays: once it stops, probe after probe_every
            return self._decide(self.k, "cost model")
        thin = self._best(self.alpha_optimistic, self.continuation_optimistic) > 0
        self._since_probe += 1
        if self.hindsight:
            # A look back costs no verify: take one on thin evidence, every step when drafting is
            # free (n-gram), else on the probe schedule; one token only when each costs an LM head.
            if thin or self.c * self.probe_k < FREE or self._since_probe >= self._probe_wait:
                self.hindsight_k = self.probe_k if self.c * self.probe_k < FREE else 1
            return self._decide(0, "plain")
        if thin:  # optimism buys a probe as long as the optimistic rates say pays
            self._since_probe, self._probe_wait = 0, self.probe_every
            self.k = self._probe_size()
        elif self._since_probe >= self._probe_wait:
            self._advance_probe_schedule(verify=True)
            self.k = self._probe_size()
        return self._decide(self.k, "probe" if self.k else "plain")

    def plan(self, cache_len: int, room: int) -> StepPlan:
        """This step's K (`next_k` at this cache length), with what else the decision set: the chain stop, the
        look back on a plain step, a free lookup's k_max; never past `room`."""
        if room > self._room:  # room only falls within a run: this is a new request's first drafting step
            self._new_request()
        self._room = room
        self.at_context(cache_len)
        k = self.next_k()
        lookup_k, width = self.lookup_k, self._batch_width
        if width is not None and max(k, lookup_k) > width:
            # the batch decided its width from every row's rates (batch/pricing.py): a row probing past it made
            # the batch's step wider for all. The Qwen pair's rows at 8 clients, held probes re-probing every
            # step, drafted 2 tokens a step where the batch priced plain: 0.63x of plain decoding's throughput
            k, lookup_k = min(k, width), min(lookup_k, width)
            self.k = self._decide(k, "batch width")
        return self._planned(StepPlan(k=k, lookup_k=lookup_k)).capped(room)

    def _new_request(self) -> None:
        """Each request is judged on its own steps (the bench's next question, a chat's next turn): the last
        request's realized figures stay as a prior of NEW_REQUEST_STEPS steps' worth, under what LOSS_STEPS
        needs; its rates as a prior of CARRY_TRIALS' worth, as a new session's are (`_carry_in`); and the probe
        schedule starts again. Kept at full weight (~10 steps), the rates one task learned priced the next
        task's drafts: SmolLM2 + n-gram on Spec-Bench, rag-547 after rag-521 drafted 3-7 tokens on 4-gram and
        1-token matches at the alpha of 0.5-0.64 earlier questions had left, 4 of 18 drafts held, the loss
        guard took the rest of the 35-token answer plain: 1.01x where K = 2 gave 1.24x."""
        won, spent, steps = self._realized
        keep = min(1.0, NEW_REQUEST_STEPS / steps) if steps else 0.0
        self._realized = (won * keep, spent * keep, steps * keep)
        self._carry_in(self._learned())
        self._probe_wait, self._since_probe, self._probe_due = 1, 0, None

    def fit(self, plan: StepPlan, evidence: int, drafted: int) -> StepPlan:
        """The plan for a draft of class `evidence` in hand (`fit_k`), with the decision and look back it set."""
        return self._planned(replace(plan, k=self.fit_k(evidence, drafted)))

    def _planned(self, plan: StepPlan) -> StepPlan:
        """`plan` with what the last decision set (`_decide`, `next_k`, `fit_k`)."""
        decision = self.decision
        probe = decision is not None and decision.reason == "probe"
        return replace(plan, chain_stop=self.chain_stop, hindsight_k=self.hindsight_k, probe=probe, decision=decision)

    def fit_k(self, evidence: int, k: int) -> int:
        """K for a draft of class `evidence` in hand (at most k): that class's rates through the cost model.
        When they say plain, a drafter that can look back does so (free evidence, as in next_k); another gets
        a probe when only the class's optimistic rates say drafting pays. A free lookup draft of a model
        drafter (`evidence_is_free`) is priced at no draft cost; where its class does not pay, the step is
        plain (the model does not draft instead: at lookup_min_n >= 3 such classes are rare)."""
        self._step_evidence = evidence
        c = 0.0 if self._lookup_drafts else self.c
        first, nxt = self._class(evidence)
        rates = (first[0] / sum(first), nxt[0] / sum(nxt))
        best, reason = self._best(*rates, c=c), "cost model"
        longer = self._longer(best, *rates, nxt, c)
        if longer > best:  # the class's continuation is thin evidence: test it on a longer draft
            best, reason, rates = longer, "probe", (rates[0], _optimistic(nxt))
        if best == 0:
            hopeful = (_optimistic(first), _optimistic(nxt))
            if self.hindsight or self.lookup_hindsight:  # a free look back teaches the class, as a probe would
                reason = "plain"
                self.hindsight_k = self.probe_k if c * self.probe_k < FREE else 1
            elif self._best(*hopeful, c=c) > 0:
                best, reason, rates = max(self.probe_k, self._best(*hopeful, c=c)), "probe", hopeful
            else:
                reason = "plain"
        if 0 < best < self.probe_k and c * self.probe_k < FREE and self._pays(self.probe_k, *rates, c=c):
            # never one free token alone: a one-token draft teaches nothing of the class's continuation,
            # which then stays at its prior, and the second token's verify costs next to nothing. Only where
            # the longer draft still beats plain: on a curve where the second token's verify is not cheap
            # (SmolLM2, one thread: T(3)/T(1) 1.2-1.4) prose-letter drafted K = 2 at a predicted 0.92-0.98
            # seven times in one answer, and the run was 0.95x of plain
            best = self.probe_k
        self.k = min(best, k)
        return self._decide(self.k, reason, rates, evidence, c=c)

    def _some_class_pays(self) -> bool:
        """Some evidence class's point rates price a draft above plain decoding (fit would draft it)."""
        return any(self._best(f[0] / sum(f), n[0] / sum(n)) > 0 for f, n in self._classes.values())

    def _longer(self, k: int, alpha: float, g: float, nxt: list[float], c: float) -> int:
        """For k > 0 and a continuation `nxt` ([held, not held]) of under THIN_TRIALS trials, k + 1 where that
        pays better at the continuation's optimistic value and the point rates price it within EXPLORE_COST of
        k's (and above plain); else k. Thicker evidence is not explored: a class that holds two tokens and
        never a third would otherwise draft ~9 at a 10% loss for good. One token further, not to where the
        optimistic value peaks: a held token thickens the continuation and the point rates size the next
        draft, while the peak of a continuation one held draft left at 0.98 was 10-11 tokens, which
        SmolLM2's n-gram drafted on rag-521 and rag-547 at 25-63% first-token acceptance and lost whole
        (a 10-token verify costs ~1.9 plain steps at their 750-820-token contexts).

        A class's continuation is learned only from its drafts' second and later tokens, so short drafts keep
        it at its prior: translation-201 (SmolLM2 + n-gram) drafted K = 2 at 74-84% first-token acceptance for
        a dozen steps while its continuation crept up from 0.5, and ran at 2.2x of plain against fixed K = 8's
        4.3x. One long draft that holds says more than ten short ones; one that fails costs a few percent."""
        from specpipe.costmodel.calibration import expected_speedup

        hopeful = _optimistic(nxt)
        if k == 0 or sum(nxt) >= THIN_TRIALS or hopeful <= g:
            return k
        floor = max(1.0, EXPLORE_COST * expected_speedup(alpha, k, c, self.ratio, g))
        near = [m for m in range(1, self.k_max + 1) if expected_speedup(alpha, m, c, self.ratio, g) >= floor]
        hoped = {m: expected_speedup(alpha, m, c, self.ratio, hopeful) for m in near}
        return max(k, min(k + 1, max(hoped, key=lambda m: (hoped[m], -m))))

    def _hold_rates(self) -> tuple[float, ...]:
        """ChainStop.hold: each tenth of confidence's hold rate plus one standard error (a tenth never verified
        keeps its prior's doubt), then never above a higher tenth's: chains at 0.3-0.4 that fail say that
        chains at 0.2-0.3, which a cut at 0.3 leaves unverified, fail too."""
        rates, lowest = [], 1.0
        for counts in reversed(self._holds):
            lowest = min(lowest, _optimistic(counts))
            rates.append(lowest)
        return tuple(reversed(rates))

    @property
    def realized(self) -> float | None:
        """This run's drafting steps' tokens per plain step's time (their own verify and draft seconds over the
        median plain step's), forgotten as the rates are; None before LOSS_STEPS steps' worth or without
        PLAIN_TIMINGS plain steps. What the cost model predicted, measured: the two part where it misprices."""
        won, spent, steps = self._realized
        return won / spent if steps >= LOSS_STEPS and spent > 0 else None

    @property
    def lost(self) -> bool:
        """Drafting returned under LOSS_MARGIN of plain's speed on this run: steps stay plain but for probes."""
        realized = self.realized
        return realized is not None and realized < LOSS_MARGIN

    def _plain_while_lost(self) -> int:
        """A plain step (a look back where that is free), and on the probe schedule a probe at the K the cost
        model would draft, so the loss is bounded by the probes' and a text that turns predictable is found.
        qa-334 (SmolLM2 + n-gram): every K lost (0.76-0.81x) while the cost model priced drafts above plain."""
        self._since_probe += 1
        if self.hindsight and self.c * self.probe_k < FREE:
            self.hindsight_k = self.probe_k
        if self._since_probe < self._probe_wait:
            self.k = 0
            return self._decide(0, "lost")
        self._advance_probe_schedule(verify=True)  # the next probe waits twice as long unless this one wins
        self.hindsight_k = 0
        self.k = max(self.probe_k, self._best(self.alpha))
        return self._decide(self.k, "probe")

    def _realize(self, accepted: int, draft_s: float | None, verify_s: float | None, fed: int) -> None:
        """Count one drafting step's tokens and its seconds in plain steps' units (`realized`); `fed`: the
        tokens its verify scored."""
        plain = self._seconds.get(1)
        if not verify_s or not plain or len(plain) < PLAIN_TIMINGS or self._batch_curve is not None:
            return  # a batched step's seconds are the shared forward's: not in units of this row's plain step
        t1 = statistics.median(plain)
        priced = self._curve[min(fed, max(self._curve))]
        # one step descheduled (another process, a page fault) is no price of drafting: on rag-521 a 4-token
        # verify took 0.43 s, six plain steps, among five drafting steps, and the guard kept the rest of the
        # answer plain while its look backs accepted 60-70%. The curve's medians ignore such a step; so does this
        verify = verify_s if verify_s <= DESCHEDULED * priced * t1 else priced * t1
        cost = (verify + (draft_s or 0.0)) / t1
        won, spent, steps = self._realized
        f = self.forget
        self._realized = (f * won + accepted + 1, f * spent + cost, f * steps + 1)

    def _advance_probe_schedule(self, verify: bool = False) -> None:
        """A probe is taken while K is 0: if it leaves K at 0, the next one waits twice as long. A `verify`
        probe may find nothing to draft (observe then puts the schedule back)."""
        w = self._probe_wait
        self._since_probe = 0
        self._probe_wait = self.probe_every if w < self.probe_every else min(2 * w, self.probe_max)
        self._probe_due = w if verify else None

    def observe_hindsight(self, checked: int, matched: int, evidence: int | None = None) -> None:
        """The drafter guessed `checked` tokens the target had already emitted, the first `matched` right
        (a guess of class `evidence`). A lookup's guess beside a model (`lookup_hindsight`) counts for its
        class alone, as its drafts do (observe), and is no probe of the model: the probe schedule stays."""
        lookup = self.lookup_hindsight and evidence is not None
        if not lookup and self._since_probe >= self._probe_wait:
            self._advance_probe_schedule()
        if checked:
            self._count(checked, matched, evidence, pooled=not lookup)
            self._carry_out()

    def observe(
        self,
        drafted: int,
        accepted: int,
        *,
        draft_s: float | None = None,
        verify_s: float | None = None,
        verified: int | None = None,
    ) -> None:
        """`verified`: tokens the verify fed after the root when not `drafted` (a token tree's nodes)."""
        fed = (drafted if verified is None else verified) + 1
        if drafted:  # before the curve takes this step's seconds: a step is judged by the price it was planned at
            self._realize(accepted, draft_s, verify_s, fed)
        if verify_s:
            self._observe_verify(fed, verify_s)
        evidence, self._step_evidence = self._step_evidence, None
        due, self._probe_due = self._probe_due, None
        if drafted == 0:
            self._drafted_before = False
            if due is not None and self.c * self.probe_k < FREE:
                # a free drafter's probe that drafted nothing (no n-gram match, or a class that does not pay)
                # tested nothing and cost nothing: the next step probes again at the wait it had. Counted as
                # probes, two empty ones on mt_bench-147 (SmolLM2) doubled the wait to 64 steps, and the
                # answer's last 90 tokens were plain while its look backs said 2-token drafts paid (fixed
                # K = 2 1.2x, auto 1.0x)
                self._probe_wait, self._since_probe = due, due
            return  # nothing proposed (e.g. no n-gram match): no evidence either way
        if self._lookup_drafts and self._drafter is not None and self._drafter.last_evidence is not None:
            # a lookup draft beside a model (read from the drafter: an override step skips fit): its class
            # learns; the model's rates, its cost c and the chain stop's rate S do not (a free step's tokens
            # per cost would raise S until every model chain stopped after one token). The next model draft
            # first catches up on the accepted tokens, which must not be charged to c either.
            self._count(drafted, accepted, self._drafter.last_evidence, pooled=False)
            self._drafted_before = False
            self._carry_out()
            return
        self._count(drafted, accepted, evidence)
        tops = self._drafter.last_tops if self._drafter is not None and self.chain_stop is not None else []
        forwards = max(drafted, len(tops))  # a chain cut by the stop also computed the token it dropped
        # the row's own curve, alone or batched: a batch's price (`ratio` while batched) marks positions past
        # the batch's width unpayable (BEYOND), which is no cost of this row's step
        cost = forwards * self.c + self._curve[min(fed, max(self._curve))]
        self._rate = self.forget * self._rate + (1 - self.forget) * (accepted + 1) / cost
        confidence = 1.0
        for i, top in enumerate(tops[:drafted]):  # what the chain stop's hold rates learn: each verified token
            confidence *= top
            held = self._holds[bucket(confidence)]
            held[0], held[1] = held[0] + (accepted > i), held[1] + (accepted <= i)
        if accepted == drafted and self.decision is not None and self.decision.reason == "probe":
            # a probe that held entirely is a lead, not a reason to wait longer: probe again next step
            self._since_probe, self._probe_wait = 0, 1
        # Only steps after a drafting step: after plain steps a model drafter first catches up on the
        # tokens it missed, and charging that to a short probe would inflate c and keep K at 0. Not in a
        # batch: its verify seconds are the shared forward's, which implies no T(1) of this row (a probe past
        # the batch's width, priced BEYOND there, once implied a T(1) of microseconds and c grew to 10^5)
        if draft_s is not None and verify_s and self._drafted_before and self._batch_curve is None:
            t1 = verify_s / self._curve[min(fed, max(self._curve))]  # this step's implied T(1)
            self.c = self.forget * self.c + (1 - self.forget) * (draft_s / forwards) / t1
        self._drafted_before = True
        self._carry_out()


def _pair_key(target, drafter: Drafter) -> tuple:
    """Which learned rates apply: the target and the drafter (with its model, if any) by name, and how many
    rows the draft's LM head scores (a cut head, draft.vocab, makes the same model a cheaper drafter)."""
    engine = drafter.engine
    name = engine.info.name if engine is not None else ""
    return (target.info.name, target.info.precision, drafter.name, name, drafter.head_rows)


def _monotone(curve: dict[int, float]) -> dict[int, float]:
    """T(n)/T(1) as the cost model may use it: 1 at n = 1 and never falling as n grows. Timings of a tiny
    model or of a loaded machine say otherwise (T(3)/T(1) = 0.69 in a fresh calibration); a longer verify
    does the work of a shorter one and more."""
    out, highest = {}, 1.0
    for n in sorted(curve):
        highest = out[n] = 1.0 if n == 1 else max(highest, curve[n])
    return out


def _counted(
    first: list[float], nxt: list[float], drafted: int, accepted: int, forget: float
) -> tuple[list[float], list[float]]:
    """[successes, failures] counts for the first token and the continuation, after one draft of `drafted`
    tokens whose first `accepted` held, the old evidence discounted by `forget`."""
    first = [forget * first[0] + (accepted > 0), forget * first[1] + (accepted == 0)]
    if accepted > 0 and drafted > 1:  # tokens 2..: each tried only when the previous one held
        nxt = [forget * nxt[0] + accepted - 1, forget * nxt[1] + (accepted < drafted)]
    elif drafted == 1:
        # a one-token draft tests no continuation, but the text moved on: the old evidence fades as if
        # tested, so its optimistic value rises until the K = 1 escape (next_k) drafts long enough to test
        # it. Untouched, a continuation of 0.50 on four trials kept the 1.5B with its 0.5B draft at K = 1
        # through two math answers whose fixed K = 4 drafts held 4 of 4 at most steps.
        nxt = [forget * nxt[0], forget * nxt[1]]
    return first, nxt


def _optimistic(counts: list[float]) -> float:
    """A [successes, failures] rate plus one standard error (at most 1)."""
    n = sum(counts)
    m = counts[0] / n
    return min(1.0, m + (m * (1 - m) / n) ** 0.5)
