"""`draft=chain`: several drafters (`draft.sources=[ngram, model]`) asked in order until one proposes, each
priced per step by its own measured cost per drafted token and acceptance; a plain step when none pays.

Contract: `ChainDrafter.propose(context_ids, plan)` returns the first paying source's Draft unchanged (its q rows
too, so a sampled comparator sees the proposing source's distribution: exact), with `Draft.source` naming it (a
suffix source's own: history or context). A source that runs a model is priced before it is asked
(source_price.SourcePrice on the plan's k); a free one (no engine, no cost: n-gram, lookahead) is asked first,
since asking costs nothing, and its draft in hand, priced by its evidence class (n-gram: the match length), goes
on unless a later costly source is expected to return more. The verdict comes back through `rollback(kept_len)`:
accepted = kept_len - the context's length, of the tokens the step verified (the proposal's Draft, which the step
cuts to the budget's k in place). Prefill, rollback, hindsight and hidden states go to every source that holds
state, so each keeps its own cache consistent with the target's accepted tokens whichever source drafted; a tree's
verdict goes to the source that drafted it. Nothing here imports MLX at import time (preflight calls
`check_sources`).

Towards budget=auto the chain looks like a model drafter with a prompt lookup in front (drafters/model.py
lookup_min_n), which is the case [ngram, model] of it: `engine` and `cost_per_token` are its first costly
source's, a free source's drafts carry their evidence class with `evidence_is_free`, so auto prices those
at no draft cost and offers them `plan.lookup_k` whatever K it gives the models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import Drafter, DrafterBase, Rollback
from specpipe.core.stages.compare import first_false
from specpipe.core.stages.draft import Draft
from specpipe.drafters.source_price import SourcePrice
from specpipe.errors import ConfigError

if TYPE_CHECKING:
    import mlx.core as mx

    from specpipe.engine.engine import Capture, Engine
    from specpipe.trees.drafting import TreeDraft
    from specpipe.trees.shape import TreeShape
    from specpipe.trees.tree import TokenTree

SOURCES = ("ngram", "suffix", "lookahead", "mtp", "layerskip", "model", "eagle3")  # the drafters a chain may ask
TREES_ONLY = ("lookahead",)  # its chain propose never drafts (its pool fills from tree steps)
T1_FORGET = 0.9  # a target forward's measured seconds: each verify moves the estimate by a tenth


def check_sources(sources: Any, tree: str | None = "chain") -> str | None:
    """One line for a source list the chain cannot build (unknown, repeated, itself, none), else None.

    `tree`: the run's tree option; a trees-only source under tree=chain is refused too."""
    names = list(sources) if isinstance(sources, (list, tuple)) else None
    if not names:
        return f"draft.sources={sources!r}: name the drafters to ask in order, e.g. draft.sources=[ngram,model]"
    for name in names:
        if name in ("chain", "none"):
            what = "a chain cannot ask a chain" if name == "chain" else "draft=none drafts nothing"
            return f"draft.sources names {name}: {what}; choose from {', '.join(SOURCES)}"
        if name not in SOURCES:
            return f"draft.sources names {name!r}, not a drafter a chain can ask: choose from {', '.join(SOURCES)}"
        if names.count(name) > 1:
            return f"draft.sources names {name} twice: each source once (its keys are draft.{name}.*)"
        if name in TREES_ONLY and tree == "chain":
            return f"draft.sources names {name}, which drafts only token trees: add tree=dynamic, or drop {name}"
    return None


def is_free(source: Drafter) -> bool:
    """Proposing costs no forward: no engine and no cost of its own (n-gram, lookahead)."""
    return source.engine is None and not source.cost_per_token


@dataclass(frozen=True)
class SourceStates:
    """What each source kept for the prefix store, in source order (None: it prefills)."""

    states: list[Any]

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(st, "nbytes", 0) or 0) for st in self.states)


class ChainDrafter(DrafterBase):
    name = "chain"
    cache = None  # each source keeps (and rolls back) its own

    def __init__(
        self,
        target,
        load,
        sources: list[str],
        ngram: dict,
        model: dict,
        layerskip: dict,
        mtp: dict,
        lookahead: dict,
        eagle3: dict,
        suffix: dict,
        probe_every: int = 16,
        sampler=None,
        p_min: float = 0.0,
        history=None,
    ):
        """
        Args:
            target: the target Engine (each source gets it, as draft=<source> would).
            load: callable(name, path, precision) -> Engine, from the runner (draft models).
            sources: the drafters to ask, in order (SOURCES).
            ngram, model, layerskip, mtp, lookahead, eagle3, suffix: each source's own config node
                (conf/draft/<name>.yaml, overridden as draft.<name>.<key>=...); only the named are built.
            probe_every: a source priced out this many steps running drafts once anyway (its rates stay fresh).
            sampler: the run's Sampler (model sources draft from its q).
            p_min: budget=confidence's floor, for the sources that take one.
            history: the session's shelf of suffix stores (drafters/suffix_store.py), for a suffix source.
        """
        message = check_sources(sources, tree=None)
        if message:
            raise ConfigError(message)
        if probe_every < 1:
            raise ConfigError(f"draft.probe_every={probe_every} is out of range: at least 1, e.g. 16")
        from specpipe.plugins import build_plugin

        nodes = {"ngram": ngram, "model": model, "layerskip": layerskip, "mtp": mtp}
        nodes |= {"lookahead": lookahead, "eagle3": eagle3, "suffix": suffix}
        runtime = {"target": target, "load": load, "sampler": sampler, "p_min": p_min, "history": history}
        self.names = list(sources)
        self.sources: list[Drafter] = [
            build_plugin({**nodes[n], "_partial_": True}, "draft", **runtime) for n in sources
        ]
        self.free = [is_free(s) for s in self.sources]
        self.probe_every = probe_every
        costly = [s for s, f in zip(self.sources, self.free) if not f]
        self._primary: Drafter | None = costly[0] if costly else None  # what budget=auto times and prices
        # a free source's drafts are priced apart per evidence class; a costly source's per source
        self.prices = [SourcePrice(c=0.0 if f else _prior_cost(s, target)) for s, f in zip(self.sources, self.free)]
        self._classes: dict[tuple[int, int], SourcePrice] = {}
        self.evidence_is_free = any(self.free) and self._primary is not None
        self.prefill_after_first_token = any(s.prefill_after_first_token for s in self.sources)
        self.resumes_without_state = all(s.resumes_without_state for s in self.sources)
        self.prefix_notice = "; ".join(s.prefix_notice for s in self.sources if s.prefix_notice)
        self.supports_trees = any(s.supports_trees for s in self.sources)
        # beside a costly source, the look back is the free sources' (a lookup's: budget=auto counts it for
        # its class alone, as draft=ngram's); without one, every source must be able to look back
        if self.evidence_is_free:
            self._lookers = [i for i, s in enumerate(self.sources) if s.supports_hindsight and self.free[i]]
        elif all(s.supports_hindsight for s in self.sources):
            self._lookers = list(range(len(self.sources)))
        else:
            self._lookers = []
        self.supports_hindsight = bool(self._lookers)
        self.needs_hidden = any(s.needs_hidden for s in self.sources)
        self._slope = 0.0  # verify cost per extra token in target forwards (budget=auto's t_verify, last seen)
        self._t1_s = 0.0  # a target forward's seconds, measured from this run's verifies
        # the step's proposal until its verdict: (source, evidence class, context length, draft, verify start)
        self._pending: tuple[int, int | None, int, Draft, float] | None = None
        self._tree_source: Drafter | None = None  # the source whose tree this step verifies
        self.counts = {n: [0, 0] for n in self.names}  # source -> [drafted, accepted] over its lifetime
        self.forwards = 0

    # ---------------------------------------------------------------- what the budget and session read

    @property
    def label(self) -> str:  # type: ignore[override]  # DrafterBase's plain name, with the sources here
        """The run header's name: the sources in the order they are asked, e.g. chain[ngram>layerskip]."""
        return f"chain[{'>'.join(self.names)}]"

    @property
    def engine(self) -> Engine | None:  # type: ignore[override]  # DrafterBase's plain None, computed here
        return self._primary.engine if self._primary is not None else None

    @property
    def cost_per_token(self) -> float | None:  # type: ignore[override]
        return self._primary.cost_per_token if self._primary is not None else None

    @property
    def bytes_share(self) -> float:  # type: ignore[override]
        return self._primary.bytes_share if isinstance(self._primary, DrafterBase) else 1.0

    @property
    def head_rows(self) -> int | None:  # type: ignore[override]
        return self._primary.head_rows if self._primary is not None else None

    @property
    def vocab_map(self) -> str:  # type: ignore[override]
        return next((s.vocab_map for s in self.sources if s.vocab_map), "")

    @property
    def vocab_shared(self) -> int | None:  # type: ignore[override]
        return next((s.vocab_shared for s in self.sources if s.vocab_map), None)

    # ---------------------------------------------------------------- state every source keeps

    def use_rollback(self, strategy: Rollback) -> None:
        for s in self.sources:
            s.use_rollback(strategy)

    def prefill(self, prompt_ids: list[int]) -> None:
        for s in self.sources:
            s.prefill(prompt_ids)
        self._pending = None
        self._count_forwards()

    def prefix_state(self, context_ids: list[int], length: int) -> Any:
        """Every source's own state for the prefix store (None where a source keeps none)."""
        states = [s.prefix_state(context_ids, length) for s in self.sources]
        return SourceStates(states) if any(st is not None for st in states) else None

    def resume(self, prompt_ids: list[int], state: Any) -> None:
        for s, own in zip(self.sources, state.states):
            if own is not None:
                s.resume(prompt_ids, own)
            else:
                s.prefill(prompt_ids)
        self._pending = None
        self._count_forwards()

    @property
    def capture(self) -> Capture | None:  # type: ignore[override]  # DrafterBase's, from every source's here
        """What the target's forwards record for the sources: the final hidden state if any reads it (MTP),
        the layer taps of the one that reads them (EAGLE-3; each source is named once, so one at most)."""
        wanted = [c for c in (s.capture for s in self.sources) if c is not None]
        if not wanted:
            return None
        from specpipe.engine.engine import Capture

        layers = next((c.layers for c in wanted if c.layers), ())
        return Capture(hidden=any(c.hidden for c in wanted), layers=layers)

    def observe_hidden(
        self, start: int, token_ids: list[int], hidden: mx.array | None, layer_hidden: mx.array | None = None
    ) -> None:
        for s in self.sources:
            if s.capture is not None:  # every verify's states, whichever source drafted: its tape stays whole
                s.observe_hidden(start, token_ids, hidden, layer_hidden)

    def rollback(self, kept_len: int) -> int:
        """Every source keeps the first `kept_len` context tokens; the proposing one learns its verdict.

        Example: context of 10, the n-gram drafted 4, the step verified 3 of them (fit cut one), the target
        accepted 2 -> kept_len 12: the n-gram's class counts 2 of 3, the model's cache keeps 12 (or fewer).
        """
        if self._pending is not None:
            self._settle(kept_len)
        return sum(s.rollback(kept_len) for s in self.sources)

    def observe_tree(self, context_len: int, tree: TokenTree, argmax_ids: list[int], emitted: int) -> None:
        """The tree's verdict goes to the source that drafted it: lookahead reads its own window's rows in it
        (a window it fed on an earlier step would be matched against another source's nodes)."""
        if self._tree_source is not None:
            self._tree_source.observe_tree(context_len, tree, argmax_ids, emitted)

    # ---------------------------------------------------------------- drafting

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        """The first source that proposes and pays; an empty draft (a plain step) when none does."""
        self._pending = None
        self.last_evidence, self.last_tops = None, []
        decision = plan.decision
        if decision is not None and decision.k > 0 and decision.t_verify > 0:
            self._slope = max(0.0, (decision.t_verify - 1.0) / decision.k)
        for i, s in enumerate(self.sources):
            # a free source may draft up to the lookup's share even where the models get K = 0 (auto's lookup_k)
            k = (
                max(plan.k, plan.lookup_k)
                if self.free[i]
                else self.prices[i].k_to_draft(plan.k, self._slope, self.probe_every)
            )
            if k <= 0:
                continue
            s0 = time.perf_counter()
            draft = s.propose(context_ids, StepPlan(k=k) if self.free[i] else replace(plan, k=k))
            draft_s = time.perf_counter() - s0
            if draft.token_ids and self.free[i] and self._later_pays_more(i, len(draft.token_ids), s, plan.k):
                continue  # its class is worth less here than a later source's draft (n-gram: a short match on prose)
            if not draft.token_ids:
                continue
            if not self.free[i] and draft.catchup_tokens <= 1:
                # timed only where it drafted the step before or so: a draft model catching up on the tokens
                # other sources drafted feeds them in its first forward, which is not a drafted token's cost
                self.prices[i].charge(draft_s, len(draft.token_ids), self._t1_s)
            evidence_free = self.free[i] or s.evidence_is_free
            self.last_evidence = s.last_evidence if evidence_free or not self.evidence_is_free else None
            self.last_tops = s.last_tops
            draft.source = draft.source or self.names[i]  # a suffix source's own: history or context
            self._pending = (i, s.last_evidence if self.free[i] else None, len(context_ids), draft, time.perf_counter())
            break
        else:
            draft = Draft(token_ids=[])
        self._count_forwards()
        return draft

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """The first looking source's guess that says anything: beside a costly source only the free ones look
        (a lookup's look back, budget=auto counts it for the lookup's class alone), else every source.

        A free source's guess is checked here too, against the last m context tokens (the greedy rule, as
        the step checks it for the budget): its class's price learns as draft=ngram's classes do in auto.
        Example: context [.., 7, 8, 9], m = 2, the n-gram (a 3-token match) guesses [8, 5]: class 3 sees a
        draft of 2 whose first 1 held."""
        guess: list[int] = []
        self.last_evidence = None
        for i in self._lookers:
            s = self.sources[i]
            guess = s.hindsight(context_ids, m)
            if guess:
                self.last_evidence = s.last_evidence
                if self.free[i]:
                    held = [g == t for g, t in zip(guess, context_ids[len(context_ids) - m :])]
                    self._class_price(i, s.last_evidence).observe(len(held), first_false(held))
                break
        self._count_forwards()
        return guess

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """The first tree-drafting source's non-empty tree (the tree sizer prices trees, not the chain)."""
        from specpipe.trees.drafting import TreeDraft
        from specpipe.trees.tree import TokenTree

        self._pending, self._tree_source = None, None
        tree = TreeDraft(TokenTree())
        for name, s in zip(self.names, self.sources):
            if s.supports_trees:
                tree = s.propose_tree(context_ids, shape)
                if tree.candidates.tokens:
                    self._tree_source, tree.source = s, name  # the tree step's Drafted names it
                    break
        self._count_forwards()
        return tree

    # ---------------------------------------------------------------- prices

    def _later_pays_more(self, i: int, drafted: int, source: Drafter, k: int) -> bool:
        """A free source's draft of `drafted` tokens is in hand: whether a later costly source is expected
        to return more (its rates and cost at the plan's k) than this draft's class does. Otherwise the draft
        goes on whole, and the budget sizes it (budget=auto fits it to its own rates per class)."""
        _, mine = self._class_price(i, source.last_evidence).best(drafted, self._slope)
        later = [self.prices[j].best(k, self._slope)[1] for j in range(i + 1, len(self.sources)) if not self.free[j]]
        return max(later, default=1.0) > mine

    def _class_price(self, i: int, evidence: int | None) -> SourcePrice:
        """A free source's price for drafts of class `evidence` (its pooled price without a class)."""
        if evidence is None:
            return self.prices[i]
        return self._classes.setdefault((i, evidence), SourcePrice())

    def _settle(self, kept_len: int) -> None:
        """The proposing source's verdict: the tokens the step verified (the draft, cut in place) and kept."""
        assert self._pending is not None
        i, evidence, start, draft, verify_from = self._pending
        self._pending = None
        verified = len(draft.token_ids)
        accepted = min(max(0, kept_len - start), verified)
        if verified == 0:
            return  # the budget made the step plain: no verdict on this source
        t1 = (time.perf_counter() - verify_from) / (1.0 + self._slope * verified)
        self._t1_s = t1 if self._t1_s == 0 else T1_FORGET * self._t1_s + (1 - T1_FORGET) * t1
        price = self._class_price(i, evidence) if self.free[i] else self.prices[i]
        price.observe(verified, accepted)
        counts = self.counts[self.names[i]]
        counts[0], counts[1] = counts[0] + verified, counts[1] + accepted

    def _count_forwards(self) -> None:
        self.forwards = sum(s.forwards for s in self.sources)
        self.cached_len = self._primary.cached_len if self._primary is not None else 0


def _prior_cost(source: Drafter, target) -> float:
    """A costly source's cost per drafted token before any is timed: its own figure (layer skip, MTP and
    EAGLE-3 heads: their share of the target's bytes), else its model's weight bytes over the target's."""
    if source.cost_per_token is not None:
        return float(source.cost_per_token)
    engine = source.engine
    if engine is None or engine is target:
        return 1.0  # draft.model=self: a target forward per token
    from specpipe.costmodel.weights import weight_bytes

    share = source.bytes_share if isinstance(source, DrafterBase) else 1.0
    return share * weight_bytes(engine.model) / weight_bytes(target.model)
