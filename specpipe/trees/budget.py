"""How many nodes a tree step verifies: the run's `budget` applied to trees.

Contract: `TreeSizer(budget, shape, free)` is asked once per step. Any budget
but auto caps the node count at its K (`budget=fixed budget.k=8` verifies at
most 8 nodes; a larger static shape keeps its 8 best-scored nodes). With
`budget=auto` the sizer chooses the node count N (and, for a drafter that pays
per drafted level, the depth) from the drafter's scored candidates, the
measured acceptance by depth, and auto's verify curve T(n)/T(1) and draft cost
c (what `Budget.tree_pricing()` returns each step: a TreePricing value):

    expected tokens(N) = 1 + sum over the N best nodes of min(1, lambda_d * score)
    cost(N)            = depth * c + T(N + 1) / T(1)

and N = 0 (a plain step, 1.0) when no N beats it by tree.min_gain (the cost curve
and the rates are estimates: a predicted gain of a few percent is within their
error, and a step verified on it loses as often as it wins); while the gain is
that thin and auto's T(1) is not timed well enough, the step is plain and times
it (TreePricing.timing_due). A drafter that pays per level checks both
before drafting (plan), on its reach rates; where a paid draft is still judged
not worth a verify, the next step verifies one as a probe, so the rates and
the scores cannot disagree for ever unchecked. lambda_d calibrates the
drafter's scores at depth d: accepted nodes at depth d over the scores of the
nodes verified there (auto's forgetting; prior from auto's chain rates at its
prior weight, fading as trees come in: PRIOR_FADES). A free drafter (n-gram, lookahead)
still proposes on plain steps, and its candidates
are checked in hindsight against the tokens the target then emitted: evidence
at no verify cost, as the chain's auto does. A drafter with a cost probes on
auto's schedule (probe_every plain steps, doubling up to probe_max while a
probe leaves N at 0). Every choice is a BudgetDecision on the step's Drafted.

Worked example: scores of the 3 best nodes [1.0, 0.5, 0.2] at depths
[1, 2, 1], lambda = [0.6, 0.5], c = 0, T(2..4)/T(1) = [1.05, 1.1, 1.15]:
tokens 1.6 / 1.05 = 1.52 (N=1), 1.85 / 1.1 = 1.68 (N=2), 1.97 / 1.15 = 1.71 (N=3) -> N = 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from specpipe.events import BudgetDecision
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree, select_dynamic

if TYPE_CHECKING:
    from specpipe.core.plan import TreePricing
    from specpipe.core.protocols import Budget

# the prior's weight (TreePricing.prior_trials) fades as evidence at its depth comes in, as old evidence does: a
# fixed two trials' worth of auto's 0.5 prior against the ~10 trials forgetting keeps made lookahead's nodes
# (small scores, ~5% accepted) look worth a verify for 20+ steps of nothing accepted
PRIOR_FADES = True
PRIOR_FLOOR = 0.1  # the prior never goes: a depth's rate stays defined on little evidence


@dataclass
class _Hindsight:
    """Candidates a free drafter proposed on a plain step, waiting for the tokens that followed."""

    tree: TokenTree
    position: int  # len(context) when proposed: the first token it predicts is context[position]


@dataclass(frozen=True)
class TreeGains:
    """conf/tree/*.yaml's tree.min_gain / tree.thin_gain: the predicted speed-up over a plain step a verify must
    beat, and the gain below which the choice hangs on T(1) (time it when it is due)."""

    min_gain: float
    thin_gain: float


@dataclass
class TreeSizer:
    budget: Budget  # the run's budget, read through its protocol: `tree_pricing()` (None: its K caps the nodes)
    shape: TreeShape
    free: bool  # the drafter costs nothing per proposal (n-gram, lookahead): candidates every step
    gains: TreeGains
    accepted: dict[int, float] = field(default_factory=dict)  # depth -> accepted nodes (forgetting sum)
    scored: dict[int, float] = field(default_factory=dict)  # depth -> scores of the nodes verified there
    reached: dict[int, list[float]] = field(default_factory=dict)  # depth -> [path reached it, tree had it]
    decision: BudgetDecision | None = None
    _pending: list[_Hindsight] = field(default_factory=list)
    _since_probe: int = 0
    _probe_wait: int = 1
    _discarded: bool = False  # the last step's paid draft was not verified (see plan)

    @property
    def priced(self) -> bool:
        """The budget prices trees (auto); otherwise its K caps a tree's nodes and nothing here is learned."""
        return self.budget.tree_pricing() is not None

    # ---------------------------------------------------------------- before drafting

    def plan(self) -> tuple[TreeShape | None, bool]:
        """(the shape to draft this step, whether it is a probe); shape None: a plain step without
        proposing (a drafter that costs, on auto, when nothing pays and no probe is due)."""
        p = self.budget.tree_pricing()
        if p is None or self.free:
            return self.shape, False
        if self._discarded:
            # the last step paid for a draft that `size` then judged not worth a verify: the rates here and
            # the scores there disagree, and a discarded draft teaches neither. Verify this one as a probe,
            # or a steady disagreement drafts every step and verifies none
            self._discarded = False
            return self._with_depth(max(2, p.probe_k)), True
        depth, value = self._depth_worth_drafting(p)
        if depth > 0 and self._t1_decides(value, p):
            # decided by a few percent: time a plain step first (before paying for the draft, not after)
            self.decision = self._decide(0, "plain (timing T(1))", 1.0, p)
            return None, False
        if depth > 0:
            self._since_probe, self._probe_wait = 0, p.probe_every
            return self._with_depth(depth), False
        self._since_probe += 1
        if self._since_probe >= self._probe_wait:
            w, every = self._probe_wait, p.probe_every
            self._since_probe = 0
            self._probe_wait = every if w < every else min(2 * w, p.probe_max)
            return self._with_depth(max(2, p.probe_k)), True
        self.decision = self._decide(0, "plain", 1.0, p)
        return None, False

    def _t1_decides(self, value: float, p: TreePricing) -> bool:
        """A gain this thin hangs on T(1), and auto's is not timed well enough yet: a plain step times it."""
        return value < 1 + self.gains.thin_gain and p.timing_due

    def _with_depth(self, depth: int) -> TreeShape:
        if self.shape.kind != "dynamic" or depth >= self.shape.depth:
            return self.shape
        return replace(self.shape, depth=depth, branching=self.shape.branching[:depth])

    def _depth_worth_drafting(self, p: TreePricing) -> tuple[int, float]:
        """(deepest level d whose chance of being reached is at least its draft cost c, its predicted
        speed-up): a level the path rarely reaches does not pay for the draft forward that proposes it.
        (0, 1.0) when no chain beats a plain step by tree.min_gain."""
        depth = 0
        for d in range(1, self.shape.max_depth + 1):
            if self._reach(d, p) >= p.draft_cost:
                depth = d
            else:
                break
        best_n, value = self._best_n_from_rates(depth, p)
        return (depth, value) if best_n > 0 else (0, 1.0)

    def _best_n_from_rates(self, depth: int, p: TreePricing) -> tuple[int, float]:
        """Before a costly draft: the chain of `depth` priced on the reach rates (a tree does at least as well),
        as (best length, its predicted speed-up); (0, 1.0) when none beats a plain step by tree.min_gain, as `size`
        would judge it after the draft."""
        tokens, best, best_n = 1.0, 1.0 + self.gains.min_gain, 0
        for d in range(1, depth + 1):
            tokens += self._reach(d, p)
            value = tokens / (depth * p.draft_cost + p.verify_ratio(d + 1))
            if value > best:
                best, best_n = value, d
        return (best_n, best) if best_n else (0, 1.0)

    # ---------------------------------------------------------------- after drafting

    def size(self, selected: TokenTree, draft_forwards: int, probing: bool = False, cache_len: int = 0) -> int:
        """Nodes to verify out of the shape's `selected` tree (the best-scored ones when cut); `cache_len`: the
        target cache's positions, which a budget that does not price trees plans its K (the node cap) at."""
        p = self.budget.tree_pricing()
        if p is None:
            plan = self.budget.plan(cache_len, len(selected))
            self.decision = plan.decision
            return plan.k
        order = _score_order(selected)
        depths = selected.depths()
        draft_cost = draft_forwards * p.draft_cost  # already spent: it decides what to draft (plan), not what to verify
        tokens, best, best_n, best_tokens = 1.0, 1.0, 0, 1.0
        for n, i in enumerate(order, start=1):
            tokens += min(1.0, self._lambda(depths[i], p) * selected.scores[i])
            value = tokens / p.verify_ratio(n + 1)
            if value > best + 1e-9:
                best, best_n, best_tokens = value, n, tokens
        plain_reason = "plain"
        if best_n and best < 1 + self.gains.min_gain:
            best_n, best_tokens = 0, 1.0  # within the estimates' error: not worth a verify
        elif best_n and self._t1_decides(best, p):
            best_n, best_tokens, plain_reason = 0, 1.0, "plain (timing T(1))"
        if best_n == 0 and probing:
            best_n = min(len(selected), max(2, p.probe_k))
        # a draft that cost forwards and is not verified: the next step verifies one as a probe (plan)
        self._discarded = best_n == 0 and draft_forwards > 0 and not self.free
        reason = "probe" if probing else "cost model" if best_n else plain_reason
        predicted = best_tokens / (draft_cost + p.verify_ratio(best_n + 1)) if best_n else 1.0
        self.decision = self._decide(best_n, reason, predicted, p)
        return best_n

    def cut(self, selected: TokenTree, n: int) -> TokenTree:
        """The n best-scored nodes of `selected` (a tree: parents score at least their children)."""
        return selected if n >= len(selected) else select_dynamic(selected, n)

    # ---------------------------------------------------------------- after verifying

    def observe(self, tree: TokenTree, path: list[int], draft_s: float, verify_s: float, depth: int) -> None:
        """One verified tree (possibly empty: a plain step) and its accepted path."""
        p = self.budget.tree_pricing()
        if p is None:
            self.budget.observe(len(tree), len(path), draft_s=draft_s, verify_s=verify_s)  # adaptive learns
            return
        if tree.tokens:
            self._count(tree, len(path), p)
        # auto's own bookkeeping: its verify-curve correction (n = nodes + 1) and draft cost per level
        drafted = depth if tree.tokens else 0
        self.budget.observe(drafted, len(path), draft_s=draft_s, verify_s=verify_s, verified=len(tree))

    def hindsight(self, context: list[int], plain_candidates: TokenTree | None) -> None:
        """Free drafters on auto: settle earlier plain steps' candidates against the tokens that came
        after them (`context`), and keep this plain step's candidates for the next steps."""
        p = self.budget.tree_pricing()
        if p is None or not self.free:
            return
        still = []
        for h in self._pending:
            after = context[h.position :]
            path = _follow(h.tree, after)
            if len(path) < len(after) or (path and not h.tree.children(path[-1])):
                self._count(h.tree, len(path), p)  # the path left the tree, or reached a leaf: final
            else:
                still.append(h)  # every token so far is on the tree and it goes deeper: wait
        self._pending = still[-self.shape.max_depth :]
        if plain_candidates is not None and len(plain_candidates):
            self._pending.append(_Hindsight(plain_candidates, len(context)))

    # ---------------------------------------------------------------- rates

    def _count(self, tree: TokenTree, path_len: int, p: TreePricing) -> None:
        depths, forget = tree.depths(), p.forget  # per tree step, as auto's rates: acceptance follows the text
        for d in set(depths):
            s = sum(sc for sc, dd in zip(tree.scores, depths) if dd == d)
            self.scored[d] = forget * self.scored.get(d, 0.0) + s
            self.accepted[d] = forget * self.accepted.get(d, 0.0) + (path_len >= d)
            r = self.reached.setdefault(d, [0.0, 0.0])
            r[0], r[1] = forget * r[0] + (path_len >= d), forget * r[1] + 1

    def _prior_weight(self, d: int, p: TreePricing) -> float:
        """The budget's prior weight, faded once per tree counted at depth d (its `reached` trials hold
        forget**n there)."""
        if not PRIOR_FADES:
            return p.prior_trials
        trials = self.reached.get(d, [0.0, 0.0])[1]
        left = max(0.0, 1.0 - trials * (1.0 - p.forget))  # n counted trees sum (1 - forget**n) / (1 - forget)
        return max(PRIOR_FLOOR, p.prior_trials * left)

    def _reach(self, d: int, p: TreePricing) -> float:
        """P(the accepted path reaches depth d), measured, with auto's chain rates as prior."""
        hit, trials = self.reached.get(d, [0.0, 0.0])
        w = self._prior_weight(d, p)
        return (hit + w * p.chain_reach(d)) / (trials + w)

    def _lambda(self, d: int, p: TreePricing) -> float:
        """Accepted nodes per unit of score at depth d (scores are shares or probabilities, not rates)."""
        prior, w = p.chain_reach(d), self._prior_weight(d, p)
        return (self.accepted.get(d, 0.0) + w * prior) / (self.scored.get(d, 0.0) + w)

    def reach_by_depth(self) -> dict[int, float]:
        """P(the path reaches depth d) for each depth trees were measured at ({} unless the budget prices)."""
        p = self.budget.tree_pricing()
        return {} if p is None else {d: round(self._reach(d, p), 3) for d in sorted(self.reached)}

    def _decide(self, n: int, reason: str, predicted: float, p: TreePricing) -> BudgetDecision:
        return BudgetDecision(
            k=n,
            reason=f"tree {reason}",
            predicted=round(predicted, 4),
            alpha=round(self._reach(1, p), 4),
            continuation=round(self._reach(2, p) / max(self._reach(1, p), 1e-9), 4),
            c=round(p.draft_cost, 4),
            t_verify=round(p.verify_ratio(n + 1), 4),
        )


def _score_order(tree: TokenTree) -> list[int]:
    """Nodes best score first, parents before children on ties (select_dynamic's order)."""
    depths = tree.depths()
    return sorted(range(len(tree)), key=lambda i: (-tree.scores[i], depths[i], i))


def _follow(tree: TokenTree, tokens: list[int]) -> list[int]:
    """The nodes along `tokens` from the root, as far as the tree has them."""
    node, path = -1, []
    for tok in tokens:
        nxt = next((i for i, p in enumerate(tree.parents) if p == node and tree.tokens[i] == tok), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path
