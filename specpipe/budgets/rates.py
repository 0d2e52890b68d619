"""budget=auto's rates model: how often drafts hold, learned from verified drafts and look backs.

Contract: `Rates(forget, prior_alpha)` keeps success / failure counts, each discounted by `forget` per new
observation so the rates follow the text. `count(drafted, accepted, evidence)` takes one draft's outcome;
`first_token` / `continuation` (and their `optimistic` values) are what the cost model prices a draft by;
`hold_rates()` is the chain stop's table. It never prices, times or plans anything, and reads no drafter.

Acceptance is two rates: alpha, that the first drafted token is accepted, and the continuation, that a
token is accepted given the one before it was. Drafts are bursty (an n-gram that matched a copied span keeps
matching), so one geometric rate would undervalue long drafts exactly where they pay. Drafters that class
their drafts (`Draft.evidence`; n-gram: the matched suffix's length) get a pair of rates per class, a new
class starting from the pooled rates at PRIOR_TRIALS' weight. A model drafter's free prompt lookup
(`evidence_is_free`) counts its classes apart (`lookups`): a new lookup class starts from the lookups'
pooled rates, never the model's.

Rates carry over: `learned()` is what a later request or session starts from, through `carry_in`, at
CARRY_TRIALS' weight; `LEARNED` keeps each (target, drafter) pair's last rates for this process.

The constants below are not a user's choice: they are weights of evidence (in trials) that make the
estimates' standard errors mean what the policy assumes; the user's knobs are `forget` and `prior_alpha`.
"""

from __future__ import annotations

from specpipe.drafters.chain import BUCKETS, bucket

FORGET = 0.9  # the default discount of old evidence per observation, for every acceptance estimate (budget.forget)
PRIOR_TRIALS = 2.0  # weight of the pooled rates a new evidence class starts from (and of each hold prior)
CARRY_TRIALS = 4.0  # weight of rates carried from an earlier request or session: new text overrides it in a few steps
THIN_TRIALS = 2 * PRIOR_TRIALS  # a continuation with fewer trials than this is thin evidence (the policy tests it)

# (target, drafter) -> the rates a budget of this process learned for that pair: a new session (the TUI's, a
# bench sweep job) starts from them instead of the prior. Within a session one budget serves every turn.
LEARNED: dict[tuple, dict] = {}

Counts = list[float]  # [successes, failures]


def rate(counts: Counts) -> float:
    return counts[0] / sum(counts)


def optimistic(counts: Counts) -> float:
    """A [successes, failures] rate plus one standard error (at most 1)."""
    n = sum(counts)
    m = counts[0] / n
    return min(1.0, m + (m * (1 - m) / n) ** 0.5)


def counted(first: Counts, nxt: Counts, drafted: int, accepted: int, forget: float) -> tuple[Counts, Counts]:
    """[successes, failures] counts for the first token and the continuation, after one draft of `drafted`
    tokens whose first `accepted` held, the old evidence discounted by `forget`.

    Example (forget 1): first [1, 1], next [1, 1], a draft of 4 whose first 2 held -> first [2, 1] (the first
    token held), next [2, 2] (the second held given the first; the third failed given the second)."""
    first = [forget * first[0] + (accepted > 0), forget * first[1] + (accepted == 0)]
    if accepted > 0 and drafted > 1:  # tokens 2..: each tried only when the previous one held
        nxt = [forget * nxt[0] + accepted - 1, forget * nxt[1] + (accepted < drafted)]
    elif drafted == 1:
        # a one-token draft tests no continuation, but the text moved on: the old evidence fades as if tested,
        # so its optimistic value rises until a longer draft tests it (else a low continuation is never corrected)
        nxt = [forget * nxt[0], forget * nxt[1]]
    return first, nxt


class Rates:
    """Pooled, per-class and lookup acceptance counts, and the chain stop's hold counts."""

    def __init__(self, forget: float, prior_alpha: float):
        self.forget = forget
        self.lookup_classes = False  # classes are a free lookup's beside a model (their prior: the lookups' rates)
        prior = [2 * prior_alpha, 2 * (1 - prior_alpha)]  # a weak prior, two trials' worth each
        self.first, self.next = list(prior), list(prior)
        self.classes: dict[int, tuple[Counts, Counts]] = {}  # evidence class -> its own [first, next]
        self.lookups: tuple[Counts, Counts] = (list(prior), list(prior))  # a free lookup's pooled rates
        # per tenth of the draft's chain confidence: [held, not held]; the prior trusts the confidence as it is
        self.holds = [
            [PRIOR_TRIALS * (b + 0.5) / BUCKETS, PRIOR_TRIALS * (1 - (b + 0.5) / BUCKETS)] for b in range(BUCKETS)
        ]

    # ---------------------------------------------------------------- reading

    @property
    def alpha(self) -> float:
        """P(the first drafted token is accepted)."""
        return rate(self.first)

    @property
    def continuation(self) -> float:
        """P(a drafted token is accepted | the one before it was)."""
        return rate(self.next)

    @property
    def alpha_optimistic(self) -> float:
        """alpha plus one standard error: little evidence (one failed probe) must not pin K at 0 for long.
        With forgetting the evidence saturates near 1 / (1 - forget) trials, so the bonus shrinks to a few
        points once acceptance is known."""
        return optimistic(self.first)

    @property
    def continuation_optimistic(self) -> float:
        return optimistic(self.next)

    def of_class(self, evidence: int) -> tuple[Counts, Counts]:
        """A class's [first, next] counts; a new one starts from the pooled rates at PRIOR_TRIALS' weight
        (`lookup_classes`: from the lookups' pooled rates, not the model's)."""
        if evidence not in self.classes:
            first, nxt = self.lookups if self.lookup_classes else (self.first, self.next)
            self.classes[evidence] = (
                [x * PRIOR_TRIALS / sum(first) for x in first],
                [x * PRIOR_TRIALS / sum(nxt) for x in nxt],
            )
        return self.classes[evidence]

    def class_rates(self) -> list[tuple[float, float]]:
        """Every class's point (alpha, continuation)."""
        return [(rate(f), rate(n)) for f, n in self.classes.values()]

    def hold_rates(self) -> tuple[float, ...]:
        """ChainStop.hold: each tenth of confidence's hold rate plus one standard error, never above a higher
        tenth's (chains at 0.3-0.4 that fail say that chains at 0.2-0.3, which a cut at 0.3 leaves unverified,
        fail too)."""
        rates, lowest = [], 1.0
        for counts in reversed(self.holds):
            lowest = min(lowest, optimistic(counts))
            rates.append(lowest)
        return tuple(reversed(rates))

    # ---------------------------------------------------------------- learning

    def count(self, drafted: int, accepted: int, evidence: int | None = None, pooled: bool = True) -> None:
        """One draft of `drafted` tokens whose first `accepted` held; of class `evidence`, it counts for that
        class as well as the pooled rates (not `pooled`: a lookup's beside a model, for the lookups' rates)."""
        if pooled:
            self.first, self.next = counted(self.first, self.next, drafted, accepted, self.forget)
        elif evidence is not None:
            self.lookups = counted(*self.lookups, drafted, accepted, self.forget)
        if evidence is not None:
            first, nxt = self.of_class(evidence)
            self.classes[evidence] = counted(first, nxt, drafted, accepted, self.forget)

    def count_holds(self, tops: list[float], accepted: int) -> None:
        """Each verified token of a chain whose drafted tokens had these top probabilities: did the chain
        hold up to it, at the chain's confidence there (the product of the tops so far)?"""
        confidence = 1.0
        for i, top in enumerate(tops):
            confidence *= top
            held = self.holds[bucket(confidence)]
            held[0], held[1] = held[0] + (accepted > i), held[1] + (accepted <= i)

    # ---------------------------------------------------------------- carrying over

    def learned(self) -> dict:
        """What a later request or session starts from (`carry_in`), besides the draft cost `c`."""
        return {
            "first": list(self.first),
            "next": list(self.next),
            "classes": {e: (list(f), list(n)) for e, (f, n) in self.classes.items()},
            "lookups": (list(self.lookups[0]), list(self.lookups[1])),
            "holds": [list(h) for h in self.holds],
        }

    def carry_in(self, learned: dict) -> None:
        """Start from `learned` rates, each scaled down to CARRY_TRIALS' weight (hold counts as they are)."""

        def scale(counts: Counts) -> Counts:
            return [x * min(1.0, CARRY_TRIALS / sum(counts)) for x in counts]

        self.first, self.next = scale(learned["first"]), scale(learned["next"])
        self.classes = {e: (scale(f), scale(n)) for e, (f, n) in learned.get("classes", {}).items()}
        if "lookups" in learned:
            self.lookups = (scale(learned["lookups"][0]), scale(learned["lookups"][1]))
        if "holds" in learned:
            self.holds = [list(h) for h in learned["holds"]]
