"""A step's plan: everything a budget decides for one row before its drafter proposes.

Contract: `Budget.plan(cache_len, room, price=)` returns a StepPlan; the drafter reads its draft length and
limits from it (`Drafter.propose(context_ids, plan)`), the step reads how to look back and what to log. A plan
is frozen: a budget that resizes the draft in hand (`Budget.fit`) returns a new one. Beside it: K_MAX, every
K's one cap, TreePricing (what a pricing budget tells the tree sizer), and RunControl, the knobs that override
plans from another thread. Nothing here imports mlx.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: drafters/chain.py imports mlx
    from specpipe.drafters.chain import ChainStop
    from specpipe.events import BudgetDecision
    from specpipe.trees.shape import TreeShape


# The longest chain a step drafts, whoever asks (a budget's k / k_max, a request's specpipe.k, the chat's K key):
# the verify cost curves are calibrated up to T(K_MAX + 1) (costmodel/calibration.py QUICK_POINTS).
K_MAX = 32


@dataclass(frozen=True, slots=True)
class DraftPrefill:
    """How a draft model prepares for one request, as its budget chose it (budgets/prefill_price.py).

    kind: "full" (the whole prompt), "window" (`sinks` + the last `window` tokens: drafters/draft_window.py),
        "none" (no draft-model prefill: only free drafters draft, e.g. a prompt lookup; else plain steps) or
        "chunked" (the whole prompt, `chunk` tokens per step between target steps; only free drafters draft
        until it caught up, and an answer that ends first drops the rest: `Drafter.catch_up`).
    tokens: the answer tokens the choice was priced for.
    net: each option's predicted net saving in target steps (what the decision log and summary show).
    """

    kind: str
    window: int = 0
    sinks: int = 4
    chunk: int = 0
    tokens: float = 0.0
    net: dict[str, float] | None = None

    def label(self) -> str:
        """One phrase for the summary line: "draft prefill window 256 (net +12.3 steps; full -40.1, none 0.0)"."""
        head = {"window": f"window {self.window}", "chunked": f"chunked {self.chunk}"}.get(self.kind, self.kind)
        nets = self.net or {}
        rest = ", ".join(f"{k} {v:+.1f}" for k, v in nets.items() if k != self.kind)
        mine = f"net {nets[self.kind]:+.1f} steps" if self.kind in nets else ""
        inside = "; ".join(x for x in (mine, rest) if x)
        return f"draft prefill {head}" + (f" ({inside}) over ~{self.tokens:.0f} tokens" if inside else "")


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One row's step, as its budget planned it.

    k: chain tokens to draft (0: a plain step).
    nodes: a tree step's node cap (None: a chain, or the shape's own count / the tree sizer's choice).
    shape: the tree to draft this step (None: a chain, or a plain tree step); the sizer may cut its depth.
    lookup_k: a free lookup (a model drafter's prompt lookup) may draft up to this many tokens whatever k,
        even at k = 0 (budget=auto: k_max; 0: k caps it too).
    chain_stop: where a model drafter stops inside k (budget=auto's drafters.chain.ChainStop; None: never).
    hindsight_k: on a plain step, look back this many emitted tokens instead (drafters with `hindsight`).
    probe: the step drafts to learn (auto's probe), not because the cost model says it pays.
    decision: why the budget chose this (the step's Drafted event carries it).
    fit: the budget may resize the draft in hand by the drafter's evidence (False: a K override, a
        plain first token: the plan is final).
    prefill: how a draft model that has not prefilled yet prepares for this request (budget=auto's choice;
        None: as configured, the whole prompt or draft.context's window).
    """

    k: int = 0
    nodes: int | None = None
    shape: TreeShape | None = None
    lookup_k: int = 0
    chain_stop: ChainStop | None = None
    hindsight_k: int = 0
    probe: bool = False
    decision: BudgetDecision | None = None
    fit: bool = True
    prefill: DraftPrefill | None = None

    @classmethod
    def first_token(cls) -> StepPlan:
        """A run's plain first step: its token as soon as plain decoding's (Budget.first_token_plain, or a
        draft model that prefills after it)."""
        from specpipe.events import BudgetDecision

        return cls(decision=BudgetDecision(k=0, reason="first token"), fit=False)

    @classmethod
    def override(cls, k: int, room: int) -> StepPlan:
        """RunControl's K: drafted as given (never past `room`), no stop rule, no lookup, no look back."""
        from specpipe.events import BudgetDecision

        return cls(k=min(k, room), decision=BudgetDecision(k=k, reason="override"), fit=False)

    def free_only(self) -> StepPlan:
        """This plan without the model's draft: a free lookup (`lookup_k`) and the look back only, for a step whose
        draft model is still catching up on a chunked prefill."""
        if self.k == 0 and self.chain_stop is None:
            return self
        import msgspec

        from specpipe.events import BudgetDecision

        behind = "draft catching up"
        decision = BudgetDecision(k=0, reason=behind) if self.decision is None else self.decision
        decision = msgspec.structs.replace(decision, k=0, reason=behind)
        return replace(self, k=0, chain_stop=None, nodes=None, shape=None, decision=decision)

    def capped(self, room: int) -> StepPlan:
        """Never more than the tokens still wanted minus the bonus (`room`)."""
        if self.k <= room and self.lookup_k <= room:
            return self
        return replace(self, k=min(self.k, room), lookup_k=min(self.lookup_k, room))


@dataclass(frozen=True, slots=True)
class TreePricing:
    """What a budget that prices drafts (auto) tells the tree sizer (trees/budget.py) for one step, through
    `Budget.tree_pricing()`; a budget that prices nothing gives None and its K caps a tree's nodes.

    alpha, continuation: its chain rates (P(first drafted token held), P(next held | previous held)); a tree's
        depth d is expected reached alpha * continuation ** (d - 1) before trees are measured there.
    prior_trials: the weight, in trials, of that prior (the weight its own rates give a prior).
    forget: its discount of old evidence per observation, which the sizer's rates by depth use too.
    draft_cost: one draft forward's cost in target forwards (c).
    verify_curve: T(n)/T(1) as it prices a verify of n tokens now (read only; n up to its longest point).
    timing_due: its T(1) wants a plain step's timing (a thin gain waits for it).
    probe_k, probe_every, probe_max: its probe schedule (probe length; plain steps before a probe, doubling
        up to probe_max while probes find nothing).
    """

    alpha: float
    continuation: float
    prior_trials: float
    forget: float
    draft_cost: float
    verify_curve: dict[int, float]
    timing_due: bool
    probe_k: int
    probe_every: int
    probe_max: int

    def verify_ratio(self, n: int) -> float:
        """T(n)/T(1), past the curve's end its last point."""
        return self.verify_curve[min(n, max(self.verify_curve))]

    def chain_reach(self, depth: int) -> float:
        """P(a chain's accepted tokens reach `depth`) by the chain rates: alpha * continuation ** (depth - 1)."""
        return self.alpha * self.continuation ** (depth - 1)


@dataclass
class RunControl:
    """Knobs another thread (the TUI) may turn while a run is going; here, beside the plans they override, so a
    consumer that turns them imports no mlx.

    stop_requested: finish after the current step (stop_reason "stopped").
    k: draft budget override for the next steps (None: ask the budget).
    """

    stop_requested: bool = False
    k: int | None = None
