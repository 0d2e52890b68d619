"""Batched speculative decoding: the one step (core/step.py) over every active request, one target forward.

Contract: `BatchDecoder(target, plugins)`; `add(prompt_ids, max_tokens, seed)` prefills one
request alone and puts it in the batch (continuous batching: rows join and leave between any
two steps; `begin` / `Admission.prefill(n)` (core/admission.py) / `join` do the same a chunk at a time, so a server
can interleave a long prompt's prefill with the active rows' steps). `step(k=None)` runs
`core.step.step` over every row: each row's own budget plans (or `k` for every row, a row's own
`k` from `begin` first), its own drafter proposes (a draft model, an MTP head, layer skip keep
their caches per row), ONE target forward runs over B rows x N positions (shorter drafts padded;
padding is never kept), each row's comparator and bonus settle it, and the batch keeps per row
what it accepted (`RaggedBatch.commit`: rejected columns become masked holes, no copy). Finished
rows leave the batch. A greedy row emits exactly the tokens that request gets decoded alone with
`draft=none` (tests/test_batch.py); a seeded sampled row what it gets alone with that seed. This
module only adapts: joins and leaves, prefill a chunk at a time, the rows' events into StepReports.
Never touches HTTP.

A step or a join that raises part-way leaves the batch's storage unknown: the caller fails its rows and calls
`clear()` (a join does so itself and raises `BatchLost`); a request still joining keeps its own solo cache.

Prefix store (`prefix_store`, specpipe/prefix/; the Session's `prefix_store`): `begin` restores the longest
stored prefix of the prompt into the request's solo cache, and `join` copies that cache into the batch and sets
it aside for the store, which `keep_joined()` writes: a server calls it once the row's first tokens are out (the
store's copy is not on the path to the first token); `step()` and `begin` call it themselves, so a lookup always
sees every joined prompt. A finished row keeps its prompt and answer (full-attention and recurrent layers; a
window layer's row is not rebuilt). Why copies rather than copy-on-write: a RaggedBatch writes every row at one
shared column into one [B, H, cols, D] buffer per layer, so a row cannot point at another buffer's columns; the
copy at join is the one the batch always made from the solo cache (a prefill costs a forward per chunk, a copy
one memory pass), and the store's own copy is what keeps its entry safe from in-place writes.

Events: every row yields what a chain run yields (events.py), on the row's own clock (t = 0 when
it was admitted, `begin`): PrefillDone once it joins, then per step [DraftPrefilled], Drafted,
Verified (the shared forward's seconds), RolledBack (strategy "mask": the rejected columns became
masked holes) and Emitted, and RunFinished once it ends (`Row.result`). A row's figures come from
metrics.py's StatsCollector over those events (`Row.collector`), never from counters kept beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx

from specpipe.batch.cache import RaggedBatch, storage_refusal
from specpipe.batch.pricing import BatchPricing, RowRates
from specpipe.batch.storage import BatchStorage
from specpipe.core.admission import Admission, admit
from specpipe.core.finish import close_step, run_finished
from specpipe.core.protocols import BudgetBase, RollbackBase
from specpipe.core.row import Row as StepRow
from specpipe.core.step import step as one_step
from specpipe.events import Drafted, Emitted, Event, RunFinished, Verified
from specpipe.metrics import StatsCollector

if TYPE_CHECKING:  # the store is the Session's; the decoder only calls it
    from specpipe.prefix.store import PrefixStore

RHO_PRIOR = 0.75  # a new row's drafter is expected to propose on 3 of 4 asked steps (a model drafter: always)
RHO_DECAY = 0.8

Expectation = Callable[[int], float]  # tokens a step drafting k yields (batch/pricing.py RowRates)


class BatchLost(Exception):
    """Writing a joining row into the batch's storage failed part-way: every row has left the batch (its
    requests fail), which is empty and sound again."""


def refusal(target) -> str | None:
    """Why this target cannot be batched (one line naming what to use), or None when it can.

    Every drafter batches (each row proposes with its own; one that attends to the target's K/V reads its own
    row of the batch, lent at `join`); what cannot is a cache layer the batch's storage cannot hold
    (batch/cache.py: plain, sliding-window and recurrent layers are held)."""
    return storage_refusal(target)


@dataclass
class RowPlugins:
    """One request's own plug-ins: what `Session` builds, fresh for each row.

    budget: plans each step of this row (None: a fixed K given to `step(k)` or `begin(k=)`).
    rollback: the strategy the drafter rolls its own cache back with (None: trim); the target's is the batch mask.
    tree: the row's tree parts (tree=static|dynamic: trees/proposal.py), None: chains.
    """

    drafter: Any
    comparator: Any
    bonus: Any
    greedy: bool = True
    budget: Any = None
    rollback: Any = None
    tree: Any = None


def session_plugins(session):
    """(seed, temperature=, top_p=) -> RowPlugins, built from `session.cfg` as `Session` builds its own,
    sharing the loaded models (a draft model's weights, not its cache); None keeps the server's value."""
    from specpipe.core.sampling import Sampler
    from specpipe.run.session import build_plugin, comparator_and_bonus, tree_for

    cfg = session.cfg
    draft_engine = session.drafter.engine

    def plugins(seed: int | None, temperature: float | None = None, top_p: float | None = None) -> RowPlugins:
        s = cfg.sampling
        sampler = Sampler(
            s.temperature if temperature is None else temperature,
            s.top_k,
            s.top_p if top_p is None else top_p,
            s.min_p,
            s.seed if seed is None else seed,
        )
        budget = build_plugin(cfg.budget, "budget")
        floor = {"p_min": budget.p_min} if budget.p_min > 0 else {}
        drafter = build_plugin(
            cfg.draft,
            "draft",
            target=session.target,
            load=lambda **_: draft_engine,
            sampler=sampler,
            history=session.history,  # draft=suffix: every row drafts from (and adds to) the session's history
            **floor,
        )
        budget.prepare(session.target, drafter)  # budget=auto: the device's curves, cached since the session's
        comparator, bonus = comparator_and_bonus(cfg, sampler)
        rollback = build_plugin(cfg.rollback, "rollback")
        tree = tree_for(cfg, session.target, drafter, budget)  # its own tree sizer, from its budget
        return RowPlugins(drafter, comparator, bonus, sampler.greedy, budget, rollback, tree)

    return plugins


class MaskRollback(RollbackBase):
    """A batched row's target rollback: nothing to do here; the batch's commit masks what the row did not keep."""

    name = "mask"

    def check(self, cache: list, role: str) -> None:
        pass  # a RaggedBatch: any row can keep any prefix of its columns

    def before_forward(self, cache: list):
        return None  # nothing recorded: the columns stay, masked

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids=None) -> None:
        self.dropped += n_drop


class _FixedK(BudgetBase):
    """The budget of a row planned only by K overrides (`step(k)`, `begin(k=)`): nothing to plan or learn."""

    name = "fixed"

    def next_k(self) -> int:
        raise AssertionError("a row without a budget steps only with a K (step(k) or begin(k=))")

    def observe(self, drafted: int, accepted: int, *, draft_s=None, verify_s=None, verified=None, draft=None) -> None:
        pass


@dataclass
class Row(StepRow):
    """One request in the batch: the one step's Row plus its prompt, clock, figures and pending events."""

    prompt_ids: list[int] = field(default_factory=list)
    greedy: bool = True
    k: int | None = None  # this request's own fixed K (None: its budget plans, or the step's k)
    t0: float = field(default_factory=time.perf_counter)  # the row's clock: its events' t counts from here
    collector: StatsCollector = field(default_factory=StatsCollector)  # its figures, from its events alone
    pending: list[Event] = field(default_factory=list)  # events for its next RowStep (PrefillDone at join)
    rho: float = RHO_PRIOR  # decayed share of its asked steps on which its drafter proposed (batch pricing)
    ended: RunFinished | None = None  # its RunFinished, once a step ended it

    @property
    def expects(self) -> bool:
        """Its budget prices K by rates (budget=auto): the batch's width is priced from them."""
        return self.budget.expected_tokens(1) is not None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.clock = self.since_admission

    def since_admission(self) -> float:
        """The row's clock: seconds since `begin` admitted it."""
        return time.perf_counter() - self.t0

    @property
    def drafted(self) -> int:
        return self.collector.drafted

    @property
    def accepted(self) -> int:
        return self.collector.accepted

    @property
    def steps(self) -> int:
        """Target forwards this row took part in."""
        return self.collector.steps

    def result(self, reason: str | None = None) -> RunFinished:
        """The row's RunFinished: its tokens, text and figures (core/finish.py, as a lone run's); `reason`: how it
        ended when it did not end on its own, e.g. "stopped" for a cancelled request or a stop string. A row that
        ended in a step keeps the RunFinished that step gave (its KV figures were read while it held its row)."""
        if self.ended is not None and reason is None:
            return self.ended
        return run_finished(
            self, self.collector, reason or self.finished or "stopped", self.since_admission(), mx.get_peak_memory()
        )


@dataclass
class RowStep:
    """One row's step as events: [PrefillDone], Drafted, Verified, RolledBack, Emitted[, RunFinished]."""

    row: Row
    events: list[Event]

    def _one(self, kind):
        return next((e for e in self.events if isinstance(e, kind)), None)

    @property
    def token_ids(self) -> list[int]:
        emitted = self._one(Emitted)
        return list(emitted.token_ids) if emitted else []

    @property
    def texts(self) -> list[str]:
        """One printable piece per token (may be "" while a character is incomplete)."""
        emitted = self._one(Emitted)
        return list(emitted.token_texts) if emitted else []

    @property
    def from_draft(self) -> int:
        """How many of token_ids were accepted drafts (they come first)."""
        emitted = self._one(Emitted)
        return emitted.from_draft if emitted else 0

    @property
    def drafted(self) -> int:
        drafted = self._one(Drafted)
        return len(drafted.draft_ids) if drafted else 0

    @property
    def accepted(self) -> int:
        verified = self._one(Verified)
        return len(verified.accepted_ids) if verified else 0

    @property
    def decision(self):
        """Why its budget chose this step's K (Drafted.decision; None for a fixed K)."""
        drafted = self._one(Drafted)
        return drafted.decision if drafted else None


@dataclass
class StepReport:
    rows: list[RowStep]
    batch: int  # rows in the forward
    positions: int  # 1 + the longest draft
    draft_s: float
    verify_s: float


class BatchDecoder:
    def __init__(self, target, plugins, pricing: BatchPricing | None = None, prefix_store: PrefixStore | None = None):
        """
        Args:
            target: the target Engine (plain attention; see `refusal`).
            plugins: (seed, **sampling) -> RowPlugins: fresh per-row plug-ins.
            pricing: the batch's price of a row's draft, from the measured T(B, n) (budget=auto rows plan by it
                while B > 1); None: each row prices its draft as if alone.
            prefix_store: where rows start from and keep their prefixes (the Session's); None: none.
        """
        self.target, self.plugins, self.pricing = target, plugins, pricing
        self.prefix_store = prefix_store
        self.cache = RaggedBatch(len(target.make_cache()))
        self.storage = BatchStorage(self.cache)  # every row's: one forward over the batch, one commit
        self.rows: list[Row] = []
        self.stop_ids = target.eos_token_ids
        self._unkept: list[_Unkept] = []  # joined prompts not in the store yet (keep_joined)

    def add(self, prompt_ids: list[int], max_tokens: int, seed: int | None = None, **sampling) -> Row:
        """Prefill one request alone, then make it a row of the batch (between steps).

        `sampling`: this request's temperature= / top_p= (the plug-in factory's defaults otherwise).
        """
        admission = self.begin(prompt_ids, max_tokens, seed, **sampling)
        admission.prefill(len(prompt_ids))
        return self.join(admission)

    def begin(
        self, prompt_ids: list[int], max_tokens: int, seed: int | None = None, k: int | None = None, **sampling
    ) -> Admission:
        """A request that will join: its plug-ins and an empty solo cache; `Admission.prefill(n)` feeds
        its prompt n tokens at a time (between decode steps, so the active rows do not stall), then
        `join` makes it a row. `k`: this request's own fixed K (None: its budget plans)."""
        self._keep_joined()  # its lookup finds every prompt that joined before it
        p = self.plugins(seed, **sampling)
        p.drafter.use_rollback(p.rollback if p.rollback is not None else _trim())
        draft_capture = p.drafter.capture  # an MTP head reads the target's hidden states, an EAGLE-3 head its taps
        row = Row(
            context=list(prompt_ids),
            cache=[],  # the batch holds its target cache
            drafter=p.drafter,
            budget=p.budget if p.budget is not None else _FixedK(),
            comparator=p.comparator,
            bonus=p.bonus,
            rollback=MaskRollback(),
            detok=self.target.tokenizer.detokenizer,
            max_tokens=max_tokens,
            stop_ids=self.stop_ids,
            tree=p.tree,
            # a draft model prefills after the first token, which a plain step gives: plain decoding's TTFT
            draft_ready=not (p.drafter.prefill_after_first_token and draft_capture is None),
            draft_capture=draft_capture,
            storage=self.storage,
            prompt_ids=list(prompt_ids),
            greedy=p.greedy,
            k=k,
        )
        hit = None
        if self.prefix_store is not None:
            hit = self.prefix_store.lookup(row.prompt_ids, with_drafter_state=not p.drafter.resumes_without_state)
        if hit is None:
            return admit(self.target, row, row.prompt_ids, self.target.make_cache())
        row.draft_resume = hit.drafter_state
        return admit(self.target, row, row.prompt_ids, hit.cache, fed=hit.tokens)

    def join(self, admission: Admission) -> Row:
        """The prefilled request becomes a row of the batch (between steps)."""
        row = cast(Row, admission.row)
        done = admission.admitted(row.since_admission)  # a prompt fed over several steps waited between its chunks
        unkept = self._unkept_prompt(row, admission.cache)
        try:
            row_id = row.row_id = self.cache.add(admission.cache, length=len(row.prompt_ids) - 1)
            kv = row.draft_capture.kv if row.draft_capture is not None else None
            if kv is not None:  # draft=gemma4_assistant: from now on its request's K/V is this row of the batch
                kv.lend(self.target.model, self.cache.row_kv(row_id))
        except Exception as exc:  # some layers may hold the row and others not: no row's columns can be trusted
            self.clear()
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise BatchLost(f"joining the batch failed ({type(exc).__name__}: {first})") from exc
        self.rows.append(row)
        if unkept is not None:
            self._unkept.append(unkept)
        row.collector.consume(done)
        row.pending.append(done)
        return row

    def keep_joined(self) -> list[tuple[Row, Exception | None]]:
        """Write the prompts of the rows that joined since the last call into the prefix store (their solo caches,
        which nothing writes after the join). Returns each of those rows with what its keep raised (None: kept,
        or refused by its cache kind, `PrefixStore.refusal`); `step` and `begin` raise the first failure."""
        unkept, self._unkept = self._unkept, []
        done: list[tuple[Row, Exception | None]] = []
        for u in unkept:
            try:
                self.prefix_store.keep(u.ids, u.cache, u.drafter_state)  # type: ignore[union-attr]  # _unkept_prompt
            except Exception as exc:  # noqa: BLE001  (the caller says whose request it was)
                done.append((u.row, exc))
            else:
                done.append((u.row, None))
        return done

    def _keep_joined(self) -> None:
        failed = next((exc for _, exc in self.keep_joined() if exc is not None), None)
        if failed is not None:
            raise failed

    def clear(self) -> None:
        """Every row leaves and the batch's storage starts empty (after a step or a join that failed part-way)."""
        self.rows = []
        self.cache.keep_rows([])

    def remove(self, rows: list[Row]) -> None:
        """These rows leave the batch (cancelled, or finished)."""
        gone = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) < len(self.rows):
            self.cache.keep_rows(keep)
            self.rows = [self.rows[i] for i in keep]

    def step(self, k: int | None = None, keep_joined: bool = True) -> StepReport:
        """One plan -> propose -> verify -> settle -> emit round for every row (core/step.py); finished rows
        leave after it.

        Args:
            k: the K of every row this step (a K override); None: each row's own K or budget plans.
            keep_joined: write the prompts joined before this step into the prefix store after its forward;
                False: the caller does (`keep_joined()`, once it has sent the step's tokens).
        """
        for row in self.rows:
            row.k_override = row.k if row.k is not None else k
        self._price(k)
        events: dict[int, list[Event]] = {id(row): [] for row in self.rows}
        for stepped, event in one_step(self.target, list(self.rows), lambda: 0.0):  # each row on its own clock
            events[id(stepped)].append(event)
        steps = [self._finish_step(row, events[id(row)]) for row in self.rows]
        drafted = [e for s in steps for e in s.events if isinstance(e, Drafted)]
        verified = [e for s in steps for e in s.events if isinstance(e, Verified)]
        report = StepReport(
            steps,
            len(self.rows),
            1 + max((len(e.draft_ids) for e in drafted), default=0),
            sum(e.seconds for e in drafted),
            max((e.seconds for e in verified), default=0.0),
        )
        for s in steps:  # what share of its asked steps each row's drafter proposed on (n-gram: found a match)
            asked = next((e for e in s.events if isinstance(e, Drafted) and e.k > 0), None)
            if asked is not None:
                s.row.rho = RHO_DECAY * s.row.rho + (1 - RHO_DECAY) * bool(asked.draft_ids)
        if keep_joined:
            self._keep_joined()
        for row in self.rows:
            if row.finished:
                self._keep(row)  # its prompt and answer, for the request that continues the conversation
        self.remove([row for row in self.rows if row.finished])
        if (
            self.cache.holes() > self.cache.size * 256
            and self.cache.holes() > self.cache.valid[:, : self.cache.idx].sum()
        ):
            self.cache.compact()  # holes outnumber kept columns: attention would mostly read masked keys
        return report

    def _price(self, k: int | None) -> None:
        """Every budget-planned row prices its draft by the batch's width this step (batch/pricing.py); a batch
        of one, or a batch without pricing, leaves each row pricing as if alone."""
        priced = [r for r in self.rows if r.k_override is None and r.tree is None and r.expects]
        curve = None
        if self.pricing is not None:
            # a priced row expects (its budget's expected_tokens(1) is not None): its figures are floats
            rates = [RowRates(cast(Expectation, r.budget.expected_tokens), r.budget.draft_cost, r.rho) for r in priced]
            curve = self.pricing.curve(rates, len(self.rows))
        for row in priced:
            row.price = curve  # its plan takes it (`Budget.plan(price=)`)

    @staticmethod
    def _finish_step(row: Row, events: list[Event]) -> RowStep:
        """The row's step events, its end said and its text completed (core/finish.py), counted by its collector."""
        close_step(row, events)
        for event in events:
            row.collector.consume(event)
        pending, row.pending = row.pending, []  # already counted by the collector (join)
        if row.finished:
            row.ended = row.result()
            events.append(row.ended)
        return RowStep(row, pending + events)

    def _unkept_prompt(self, row: Row, cache: list) -> _Unkept | None:
        """A joining row's prompt but its last token, its solo cache and its drafter's state at that length, set
        aside for `keep_joined` (the drafter's state now: its first step moves it on); None without a store."""
        if self.prefix_store is None or len(row.context) < 2:
            return None
        held = row.context[:-1]
        state = row.drafter.prefix_state(row.context, len(held)) if row.draft_ready else None
        return _Unkept(row, held, cache, state)

    def _keep(self, row: Row) -> None:
        """A finished row's context but its newest token into the prefix store, rebuilt from its row of the
        batch before it leaves."""
        store = self.prefix_store
        if store is None or len(row.context) < 2 or row.row_id is None:
            return
        cache = self.cache.row_cache(row.row_id, self.target.make_cache())
        if cache is None:
            return
        held = row.context[:-1]
        state = row.drafter.prefix_state(row.context, len(held)) if row.draft_ready else None
        store.keep(held, cache, state)


@dataclass
class _Unkept:
    """A joined row's prompt waiting for `keep_joined`: the ids its solo cache holds, that cache, its drafter's
    state at that length."""

    row: Row
    ids: list[int]
    cache: list
    drafter_state: Any


def _trim():
    from specpipe.rollbacks.trim import TrimRollback

    return TrimRollback()
