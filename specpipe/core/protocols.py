"""One `typing.Protocol` per plug-in kind, and the base classes that give optional hooks their defaults.

Contract: the pipeline and the session reach a plug-in only through the members declared here (no
`getattr` / `hasattr` probing; read-only members are properties, so a class attribute, an instance
attribute or a property satisfies them); mypy (tests/test_typecheck.py) checks every plug-in class against its
protocol in `specpipe/plugins.py`. A plug-in's constructor takes its YAML keys plus the runtime objects
its kind offers (`plugins.RUNTIME`), nothing else, and has no side effects: work that needs the loaded
models (budget=auto's calibration) is an explicit step, `Budget.prepare`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # only for annotations: the stage modules import this one
    import mlx.core as mx

    from specpipe.core.plan import DraftPrefill, StepPlan, TreePricing
    from specpipe.core.stages.compare import Verdict
    from specpipe.core.stages.draft import Draft
    from specpipe.costmodel.context_curve import ContextCurve
    from specpipe.engine.engine import Capture, Engine
    from specpipe.engine.recurrent import StateCapture
    from specpipe.trees.drafting import TreeDraft
    from specpipe.trees.shape import TreeShape
    from specpipe.trees.tree import TokenTree
    from specpipe.trees.verify import TreeVerdict


# ---------------------------------------------------------------- draft


class Drafter(Protocol):
    """Proposes up to k next tokens for the context (stages/draft.py)."""

    @property
    def name(self) -> str: ...
    @property
    def label(self) -> str: ...  # the run header's name: `name`, a chain's with its sources (chain[ngram>model])
    @property
    def engine(self) -> Engine | None: ...  # the Engine it runs, or None (n-gram, none, an MTP head)
    @property
    def cache(self) -> list[Any] | None: ...  # its own cache, rolled back by `rollback`

    cached_len: int  # context tokens held in `cache`
    forwards: int  # model forwards over the drafter's lifetime; the pipeline books each step's difference

    # a drafted token's cost relative to a target forward when the drafter knows it (a part of the
    # target: MTP head, layer subset); None: budget=auto times `engine` against the target
    @property
    def cost_per_token(self) -> float | None: ...
    @property
    def head_rows(self) -> int | None: ...  # rows its LM head scores whatever the context (None: every row)
    @property
    def vocab_map(self) -> str: ...  # a draft with another tokenizer: "intersection" | "text"; "" for none
    @property
    def vocab_shared(self) -> int | None: ...  # ids both tokenizers have (with a vocab_map), else None
    @property
    def supports_hindsight(self) -> bool: ...  # `hindsight` answers without a target forward (n-gram, MTP head)
    @property
    def needs_hidden(self) -> bool: ...  # True: the pipeline calls observe_hidden with the target's hidden states
    # what the prefill and every verify forward must record for it (final hidden state, decoder-layer taps),
    # handed to observe_hidden; None: nothing (DrafterBase: the final hidden state when needs_hidden)
    @property
    def capture(self) -> Capture | None: ...
    @property
    def last_evidence(self) -> int | None: ...  # how sure its last propose / hindsight was, as a class

    # (n-gram: the length of the matched suffix); None: it does not say. budget=auto keeps rates per class.
    # evidence_is_free: drafts with a class ran no draft forward (a model drafter's prompt lookup), so
    # budget=auto prices them at no draft cost and keeps their rates apart from the model's.
    @property
    def evidence_is_free(self) -> bool: ...
    # True: its prefill runs a model (a draft model), so the pipeline gives the first token from a plain
    # step and prefills the drafter after it: the first token as fast as plain decoding's
    @property
    def prefill_after_first_token(self) -> bool: ...

    # True: its deferred prefill reads what the budget chose (`prefill_planned`: whole prompt, window, none);
    # `prefill_window` is the window the user fixed (draft.context), None where the budget may choose
    @property
    def plans_prefill(self) -> bool: ...
    @property
    def prefill_window(self) -> int | None: ...

    # True: it proposes token trees of its own (`propose_tree`); the tree step refuses the others
    @property
    def supports_trees(self) -> bool: ...

    # A drafter that chains a model (drafters/chain.py) and was given a stop rule (`plan.chain_stop`) lists
    # its drafted tokens' top probabilities here, for the budget's hold rates; other drafters leave it empty.
    last_tops: list[float]

    def use_rollback(self, strategy: Rollback) -> None:
        """Roll its own cache back with `strategy` (SpecpipeError now if it cannot)."""

    def prefill(self, prompt_ids: list[int]) -> None:
        """See the prompt once before the first step."""

    # The prefix store (specpipe/prefix/): a request whose target cache starts from a stored prefix hands the
    # drafter what it kept with that snapshot. False: it cannot read the prompt without that state (a head
    # fed the target's hidden states of every position), so the target reuses only entries holding it.
    @property
    def resumes_without_state(self) -> bool: ...
    # one line for a session with a prefix store when this drafter cannot resume (it prefills itself whole
    # each request); "" when it resumes
    @property
    def prefix_notice(self) -> str: ...

    def prefix_state(self, context_ids: list[int], length: int) -> Any:
        """What to keep beside a target snapshot of context_ids[:length] so that a later request resumes from it
        (a copy: the drafter goes on changing its own); None: nothing (it prefills from the prompt)."""

    def resume(self, prompt_ids: list[int], state: Any) -> None:
        """`prefill(prompt_ids)` from `state`, which `prefix_state` gave for a prefix of prompt_ids: only the
        rest is read. Drafts afterwards as after a prefill of the whole prompt."""

    def prefill_planned(self, prompt_ids: list[int], prefill: DraftPrefill | None) -> None:
        """A deferred prefill (`prefill_after_first_token`) as the budget chose it for this request: the whole
        prompt, a window of it, none of it, or the whole of it in chunks (`catch_up`; None: as configured)."""

    # prompt tokens its last prefill (or `catch_up` chunk) fed its model: DraftPrefilled.tokens; None: it feeds no
    # model of its own, or it read the whole context but the newest token
    @property
    def prefill_tokens(self) -> int | None: ...
    # True while a chunked prefill (DraftPrefill kind "chunked") has not caught up: only its free drafts draft
    @property
    def catching_up(self) -> bool: ...

    def catch_up(self, context_ids: list[int]) -> int:
        """One more chunk of a chunked prefill over `context_ids`, between target steps; returns the tokens fed
        (0: nothing left, the model drafts from its next propose, which feeds the rest)."""

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        """Propose up to `plan.k` tokens to follow `context_ids` (a free lookup up to `plan.lookup_k`; a model
        chain stops where `plan.chain_stop` says)."""

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """Scored candidates up to `shape.max_depth` deep to follow `context_ids` (tree != chain; asked only
        when `supports_trees`); its first branch is what `propose` would have drafted."""

    def observe_tree(self, context_len: int, tree: TokenTree, argmax_ids: list[int], emitted: int) -> None:
        """After a tree step: the verified `tree`, the target's [n + 1] argmax per fed row (root first), the
        context's length before the step and the tokens it emitted (lookahead advances its window)."""

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """Up to m greedy tokens it would have proposed after context_ids[:-m] (asked only when
        `supports_hindsight`). Leaves the drafter ready for the next propose(context_ids, plan)."""

    def rollback(self, kept_len: int) -> int:
        """Keep the first `kept_len` context tokens in its own cache; returns the positions dropped."""

    def observe_hidden(
        self, start: int, token_ids: list[int], hidden: mx.array | None, layer_hidden: mx.array | None = None
    ) -> None:
        """What `capture` asked the forward that fed `token_ids` at the target's cache positions start.. to record:
        `hidden` [n, hidden] final states, `layer_hidden` [n, len(layers) * hidden] taps (None: not asked)."""


class DrafterBase:
    """Defaults for a drafter without a model, a cache or a look back (none, n-gram)."""

    name: str
    engine: Engine | None = None
    cache: list[Any] | None = None
    cached_len: int = 0
    forwards: int = 0
    cost_per_token: float | None = None
    bytes_share: float = 1.0  # of its engine's weight bytes a drafted token reads (< 1: a cut draft head)
    head_rows: int | None = None  # the rows its LM head scores whatever the context (None: every row)
    vocab_map: str = ""  # the target's own tokenizer: no token map (drafters/cross_vocab.py)
    vocab_shared: int | None = None
    supports_hindsight: bool = False
    needs_hidden: bool = False
    last_evidence: int | None = None
    evidence_is_free: bool = False
    prefill_after_first_token: bool = False
    plans_prefill: bool = False  # its deferred prefill takes the budget's choice (`prefill_planned`)
    prefill_window: int | None = None  # draft.context's window where the user set one
    supports_trees: bool = False  # a drafter with a `propose_tree` of its own says True
    last_tops: list[float] = []  # noqa: RUF012  (read only; a drafter that chains assigns its own list)

    @property
    def label(self) -> str:
        return self.name

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} defines no propose")  # every drafter defines its own

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        return []  # never asked while supports_hindsight is False

    def use_rollback(self, strategy: Rollback) -> None:
        pass  # no cache to roll back

    resumes_without_state: bool = True
    prefix_notice: str = ""

    def prefix_state(self, context_ids: list[int], length: int) -> Any:
        return None  # nothing kept: reading the prompt again is cheap (an index, a lookup table)

    def resume(self, prompt_ids: list[int], state: Any) -> None:
        self.prefill(prompt_ids)  # type: ignore[attr-defined]  # every drafter defines prefill

    def prefill_planned(self, prompt_ids: list[int], prefill: DraftPrefill | None) -> None:
        self.prefill(prompt_ids)  # type: ignore[attr-defined]  # every drafter defines its prefill; no choice here

    prefill_tokens: int | None = None
    catching_up: bool = False

    def catch_up(self, context_ids: list[int]) -> int:
        return 0  # never asked while catching_up is False

    def rollback(self, kept_len: int) -> int:
        if self.cache is not None:  # a drafter that keeps a cache must say how it rolls it back
            raise NotImplementedError(f"{type(self).__name__} keeps a cache but defines no rollback")
        return 0

    @property
    def capture(self) -> Capture | None:
        from specpipe.engine.engine import HIDDEN

        return HIDDEN if self.needs_hidden else None

    def observe_hidden(
        self, start: int, token_ids: list[int], hidden: mx.array | None, layer_hidden: mx.array | None = None
    ) -> None:
        pass  # never called while capture is None

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """The chain `propose` of `shape.max_depth` tokens as a one-branch tree (a chain is a tree with one
        branch); its drafts, all but the last, are what a model drafter's cache then holds."""
        from specpipe.core.plan import StepPlan
        from specpipe.trees.drafting import TreeDraft
        from specpipe.trees.tree import TokenTree

        draft = self.propose(context_ids, StepPlan(k=shape.max_depth))
        tree = TokenTree.chain(draft.token_ids)
        return TreeDraft(tree, cached_tail=draft.token_ids[:-1], catchup_tokens=draft.catchup_tokens)

    def observe_tree(self, context_len: int, tree: TokenTree, argmax_ids: list[int], emitted: int) -> None:
        pass  # what the target said about the tree teaches it nothing (all but lookahead)


# ---------------------------------------------------------------- budget


class Budget(Protocol):
    """How much to draft per step (budgets/): a StepPlan per step, the outcome back through `observe`. What
    goes down and comes back up are values (the plan; the Draft with its evidence; the batch's price): a
    budget keeps no reference to a drafter or another plug-in."""

    @property
    def name(self) -> str: ...
    @property
    def label_params(self) -> tuple[str, ...]: ...  # attributes a report shows to tell two runs apart: fixed(k=8)
    @property
    def first_token_plain(self) -> bool: ...  # True: a run's first step is plain (its token as soon as plain's)
    @property
    def p_min(
        self,
    ) -> float: ...  # > 0: the drafter stops below this top probability (confidence), given to its constructor

    def prepare(self, target: Engine, drafter: Drafter) -> None:
        """Once, after the models load: measure what the budget needs from them (auto calibrates)."""

    def start_request(self) -> None:
        """A new request begins (each driver calls it once per request, before its first step): a budget that
        learns across requests decides here what carries over (auto: the rates as a light prior, the probe
        schedule afresh)."""

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        """This step's plan: the target cache holds `cache_len` positions (auto prices verifies by it), at
        most `room` drafted tokens are still wanted (the plan's k and lookup_k never exceed it), and `price`
        is the batch's price of a draft of n - 1 tokens in this row's plain steps (batch/pricing.py, from the
        measured T(B, n)) while the row shares a batched forward, None while it decodes alone."""

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
        """The step's outcome: `accepted` of `drafted` tokens held; its draft and verify seconds (verify_s None
        for a batched row: the shared forward's seconds are no timing of this row); `verified`: the tokens the
        verify fed after the root when not `drafted` (a tree's nodes, `drafted` its depth); the `draft`
        verified, with what the drafter said of it (its evidence class, its top probabilities)."""

    def fit(self, plan: StepPlan, evidence: int, drafted: int) -> StepPlan:
        """The draft in hand (`drafted` tokens, at most the plan's) is of class `evidence` (the drafter's
        `last_evidence`): the plan to verify it by, its k how many of those tokens (auto: by that class's
        acceptance, 0 for a plain step, with its decision and look back). The step's `observe` reports on it."""

    def observe_hindsight(self, checked: int, matched: int, evidence: int | None = None) -> None:
        """The drafter guessed `checked` already emitted tokens, the first `matched` right (a guess of class
        `evidence`)."""

    def expected_tokens(self, k: int) -> float | None:
        """Tokens a step drafting k is expected to yield by this budget's rates (None: it does not price K)."""

    @property
    def draft_cost(self) -> float:
        """One drafted token's cost in target forwards, as the budget measured it (0 where it does not price)."""

    @property
    def context_curve(self) -> ContextCurve | None:
        """The verify cost curve by cache length it prices by (auto), which an idle refinement times further;
        None where it prices nothing."""

    @property
    def verify_curve(self) -> dict[int, float] | None:
        """T(n)/T(1) as it prices verifies now, once prepared (auto); None where it prices nothing."""

    def tree_pricing(self) -> TreePricing | None:
        """What the tree sizer (trees/budget.py) prices this step's tree by: the chain rates, the draft cost, the
        verify curve and the probe schedule (auto); None where it prices nothing (its K caps a tree's nodes)."""


class BudgetBase:
    """Defaults for the optional hooks: no calibration, no decision log, no look back, no confidence floor.

    Its `plan` is K from `next_k` (after `at_context`), cut to the room: a budget that only chooses K
    defines `next_k` (fixed, adaptive, confidence); one that plans more (auto) defines `plan`."""

    name: str
    label_params: tuple[str, ...] = ()
    p_min: float = 0.0
    first_token_plain: bool = False

    def prepare(self, target: Engine, drafter: Drafter) -> None:
        pass  # nothing to measure

    def at_context(self, cache_len: int) -> None:
        pass  # K does not depend on the context length

    def next_k(self) -> int:
        """K for this step (0: plain decoding)."""
        raise NotImplementedError(f"{type(self).__name__} defines neither plan nor next_k")

    def start_request(self) -> None:
        pass  # nothing learned carries over differently between requests

    def plan(self, cache_len: int, room: int, price: dict[int, float] | None = None) -> StepPlan:
        from specpipe.core.plan import StepPlan

        self.at_context(cache_len)
        return StepPlan(k=min(self.next_k(), room))

    def fit(self, plan: StepPlan, evidence: int, drafted: int) -> StepPlan:
        from dataclasses import replace

        return replace(plan, k=drafted)  # the budget's K does not depend on how sure the drafter is

    def observe_hindsight(self, checked: int, matched: int, evidence: int | None = None) -> None:
        pass  # never asked while its plans' hindsight_k is 0

    def expected_tokens(self, k: int) -> float | None:
        return None  # no rates: a batch leaves this row's K to it

    @property
    def draft_cost(self) -> float:
        return 0.0

    @property
    def context_curve(self) -> ContextCurve | None:
        return None  # K is not priced by cache length

    @property
    def verify_curve(self) -> dict[int, float] | None:
        return None  # K is not priced by a verify's cost

    def tree_pricing(self) -> TreePricing | None:
        return None  # a tree's nodes are capped at this budget's K


# ---------------------------------------------------------------- compare, rollback, bonus


class Comparator(Protocol):
    """How much of the draft the target accepts (stages/compare.py)."""

    @property
    def name(self) -> str: ...

    def compare(self, draft: Draft, logits: mx.array) -> Verdict:
        """`logits`: [k + 1, vocab] from the verify stage."""

    def compare_tree(
        self, tree: TokenTree, logits: mx.array, draft: TreeDraft | None = None, argmax_ids: list[int] | None = None
    ) -> TreeVerdict:
        """A verified token tree's accepted path by the same rule; `logits`: [n + 1, vocab] (row 0 the root)."""


class Rollback(Protocol):
    """Brings a cache back to the accepted length (stages/rollback.py, rollbacks/)."""

    @property
    def name(self) -> str: ...
    @property
    def dropped(self) -> int: ...  # positions removed so far
    @property
    def peak_bytes(self) -> int: ...  # most snapshot memory held at once
    @property
    def time_s(self) -> float: ...  # time spent rolling back
    @property
    def recompute_tokens(self) -> int: ...  # tokens fed a second time
    @property
    def last_choice(
        self,
    ) -> str: ...  # what the last rollback used when the strategy chooses per step (auto); "" otherwise

    def check(self, cache: list[Any], role: str) -> None:
        """Raise SpecpipeError if this strategy cannot roll `cache` back."""

    def before_forward(self, cache: list[Any]) -> StateCapture | None:
        """A forward that may be partly rejected is about to run on `cache`. Returns the StateCapture to pass
        to the forward(s) on `cache` until `rollback` (`Engine.forward(..., capture=Capture(states=...))`),
        or None when this strategy needs nothing recorded."""

    def rollback(
        self, cache: list[Any], n_drop: int, *, engine: Engine | None = None, fed_ids: list[int] | None = None
    ) -> None:
        """Drop the newest `n_drop` positions of `cache` (in place); `fed_ids`: ids fed since before_forward."""


class RollbackBase:
    """Statistics a strategy that keeps nothing and re-runs nothing reports (trim)."""

    name: str
    dropped: int = 0
    peak_bytes: int = 0
    time_s: float = 0.0
    recompute_tokens: int = 0
    last_choice: str = ""


class Bonus(Protocol):
    """The token after a fully accepted draft (stages/bonus.py)."""

    def pick(self, row: mx.array) -> int:
        """`row`: [vocab] logits after the last draft token."""


# ---------------------------------------------------------------- KV cache policy


class KvPolicy(Protocol):
    """Which cache each attention layer gets (engine/kv.py: full, quantized, window)."""

    @property
    def name(self) -> str: ...

    def check(self, engine: Engine) -> None:
        """Raise SpecpipeError (one line) when `engine`'s model cannot use this policy."""

    def make_cache(self, model: Any) -> list[Any]:
        """A fresh per-layer cache for `model` under this policy."""
