"""Batched speculative decoding: one target forward verifies the drafts of every active request.

Contract: `BatchDecoder(target, plugins)`; `add(prompt_ids, max_tokens, seed)` prefills one
request alone and puts it in the batch (continuous batching: rows join and leave between any
two steps; `begin` / `Joining.prefill(n)` / `join` do the same a chunk at a time, so a server
can interleave a long prompt's prefill with the active rows' steps). `step(k)` lets each row's
own drafter propose up to k tokens, runs ONE target forward over B rows x (1 + longest draft)
positions (shorter drafts padded; padding is never kept), compares each row with its own
comparator and seeded sampler, keeps per row what it accepted (`RaggedBatch.commit`: rejected
columns become masked holes, no copy) and returns what every row emitted; finished rows leave
the batch. A greedy row emits exactly the tokens that request gets decoded alone with
`draft=none` (tests/test_batch.py). Never touches HTTP.

Events: every row yields what a chain run yields (events.py), on the row's own clock (t = 0 when
it was admitted, `begin`): PrefillDone once it joins, then per step Drafted, Verified (the
step's verify seconds, shared by every row of the forward), RolledBack (strategy "mask": the
rejected and padding columns became masked holes; the seconds of the shared commit) and
Emitted, and RunFinished once it ends (`Row.result`). A row's figures come from metrics.py's
StatsCollector over those events (`Row.collector`), never from counters kept beside them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from specpipe.batch.cache import RaggedBatch
from specpipe.core.pipeline import cut
from specpipe.core.plan import StepPlan
from specpipe.core.stages.compare import first_false
from specpipe.core.stages.draft import Draft
from specpipe.events import BudgetDecision, Drafted, Emitted, Event, PrefillDone, RolledBack, RunFinished, Verified
from specpipe.metrics import StatsCollector

BATCHABLE_DRAFTERS = ("none", "ngram")  # drafters without a model cache of their own


def refusal(target, drafter_name: str) -> str | None:
    """Why this target / drafter cannot be batched (one line), or None when it can."""
    kinds = {type(c).__name__ for c in target.make_cache()}
    if kinds != {KVCache.__name__}:
        return (
            f"{target.info.name} has {'/'.join(sorted(kinds - {KVCache.__name__}))} layers (recurrent or "
            "sliding-window state): batching needs plain attention KV caches"
        )
    if drafter_name not in BATCHABLE_DRAFTERS:
        return f"draft={drafter_name} keeps a model cache per request: batching supports draft=none / ngram"
    return None


def session_plugins(session):
    """(seed, temperature=, top_p=) -> (drafter, comparator, bonus, greedy): what `Session` builds,
    fresh for each row; None keeps the server's configured value."""
    from specpipe.core.sampling import Sampler
    from specpipe.session import build_plugin, comparator_and_bonus

    cfg = session.cfg

    def plugins(seed: int | None, temperature: float | None = None, top_p: float | None = None):
        s = cfg.sampling
        sampler = Sampler(
            s.temperature if temperature is None else temperature,
            s.top_k,
            s.top_p if top_p is None else top_p,
            s.min_p,
            s.seed if seed is None else seed,
        )
        drafter = build_plugin(cfg.draft, "draft", target=session.target, load=None, sampler=sampler)
        comparator, bonus = comparator_and_bonus(cfg, sampler)
        return drafter, comparator, bonus, sampler.greedy

    return plugins


@dataclass
class Row:
    """One request in the batch: its context, its own drafter / comparator / sampler, its figures."""

    prompt_ids: list[int]
    max_tokens: int
    drafter: Any
    comparator: Any
    bonus: Any
    greedy: bool
    detok: Any
    context: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    finished: str | None = None  # "eos" | "max_tokens" | "stopped"
    t0: float = field(default_factory=time.perf_counter)  # the row's clock: its events' t counts from here
    collector: StatsCollector = field(default_factory=StatsCollector)  # its figures, from its events alone
    pending: list[Event] = field(default_factory=list)  # events for its next RowStep (PrefillDone at join)
    hindsight: tuple[list[int], int] = ([], 0)  # this step's look back: (guessed ids, of them matched)

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

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def result(self, reason: str | None = None) -> RunFinished:
        """The row's RunFinished: its tokens, text and figures (`reason`: how it ended when it did not end
        on its own, e.g. "stopped" for a cancelled request or a stop string)."""
        t = self.clock()
        return RunFinished(
            t=t,
            stop_reason=reason or self.finished or "stopped",
            token_ids=list(self.collector.token_ids),
            text=self.collector.text,
            stats=self.collector.stats(wall_s=t),
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


@dataclass
class Outcome:
    """One row's verdict on its draft: the ids it keeps (accepted drafts, then the target's token)."""

    new_ids: list[int]
    accepted: int
    bonus: bool  # the whole draft held: the last id is the bonus (else the recovered token)
    overlap: list[float] = field(default_factory=list)  # Σ min(p, q) per draft position (sampling rules)


@dataclass
class StepReport:
    rows: list[RowStep]
    batch: int  # rows in the forward
    positions: int  # 1 + the longest draft
    draft_s: float
    verify_s: float


@dataclass
class Joining:
    """A request being prefilled alone before it joins the batch (the cache holds all but its last token)."""

    target: Any
    row: Row
    cache: list
    fed: int = 0  # prompt tokens in `cache` so far
    seconds: float = 0.0  # spent prefilling (the wait between chunks, while other rows step, excluded)

    @property
    def todo(self) -> int:
        return len(self.row.prompt_ids) - 1 - self.fed

    @property
    def done(self) -> bool:
        return self.todo <= 0

    def prefill(self, n: int) -> bool:
        """Feed up to n more prompt tokens (in the engine's prefill chunks); True once all are in."""
        take = min(n, self.todo)
        if take > 0:
            s = time.perf_counter()
            self.target.prefill(self.row.prompt_ids[self.fed : self.fed + take], self.cache)
            self.seconds += time.perf_counter() - s
            self.fed += take
        return self.done


class BatchDecoder:
    def __init__(self, target, plugins):
        """
        Args:
            target: the target Engine (attention-only; see `refusal`).
            plugins: seed -> (drafter, comparator, bonus, greedy): fresh per-row plug-ins.
        """
        self.target, self.plugins = target, plugins
        self.cache = RaggedBatch(len(target.make_cache()))
        self.rows: list[Row] = []
        self.stop_ids = target.eos_token_ids

    def add(self, prompt_ids: list[int], max_tokens: int, seed: int | None = None, **sampling) -> Row:
        """Prefill one request alone, then make it a row of the batch (between steps).

        `sampling`: this request's temperature= / top_p= (the plug-in factory's defaults otherwise).
        """
        joining = self.begin(prompt_ids, max_tokens, seed, **sampling)
        while not joining.prefill(len(prompt_ids)):
            pass
        return self.join(joining)

    def begin(self, prompt_ids: list[int], max_tokens: int, seed: int | None = None, **sampling) -> Joining:
        """A request that will join: its plug-ins and an empty solo cache; `Joining.prefill(n)` feeds
        its prompt n tokens at a time (between decode steps, so the active rows do not stall), then
        `join` makes it a row."""
        drafter, comparator, bonus, greedy = self.plugins(seed, **sampling)
        row = Row(
            list(prompt_ids),
            max_tokens,
            drafter,
            comparator,
            bonus,
            greedy,
            self.target.tokenizer.detokenizer,
            context=list(prompt_ids),
        )
        return Joining(self.target, row, self.target.make_cache())

    def join(self, joining: Joining) -> Row:
        """The prefilled request becomes a row of the batch (between steps)."""
        assert joining.done, "join() after the whole prompt is prefilled"
        row = joining.row
        s = time.perf_counter()
        row.drafter.prefill(row.prompt_ids)
        draft_s = time.perf_counter() - s
        self.cache.add(joining.cache)
        self.rows.append(row)
        t = row.clock()  # from admission: a prompt fed over several steps waited between its chunks
        done = PrefillDone(
            t=t, tokens=len(row.prompt_ids), seconds=t, target_seconds=joining.seconds, draft_seconds=draft_s
        )
        row.collector.consume(done)
        row.pending.append(done)
        return row

    def remove(self, rows: list[Row]) -> None:
        """These rows leave the batch (cancelled, or finished)."""
        gone = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) < len(self.rows):
            self.cache.keep_rows(keep)
            self.rows = [self.rows[i] for i in keep]

    def step(self, k: int, decision: BudgetDecision | None = None) -> StepReport:
        """One draft -> verify -> compare -> keep round for every row; finished rows leave after it.

        Args:
            k: the most tokens any row drafts this step.
            decision: why the batch's budget chose k (carried by every row's Drafted event).
        """
        t0 = time.perf_counter()
        drafts, drafting = [], []  # per row: its draft, (its own draft seconds, its drafter's forwards)
        for row in self.rows:
            s, f0 = time.perf_counter(), row.drafter.forwards
            drafts.append(self._draft(row, k))
            drafting.append((time.perf_counter() - s, row.drafter.forwards - f0))
        draft_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = 1 + max(len(d.token_ids) for d in drafts)
        ids = np.zeros((len(self.rows), n), dtype=np.uint32)  # [B, n]: newest token, draft, padding
        for b, (row, d) in enumerate(zip(self.rows, drafts)):
            ids[b, 0] = row.context[-1]
            ids[b, 1 : 1 + len(d.token_ids)] = d.token_ids
        logits = self.target.forward(  # [B, n, vocab]: each row at its own positions, its holes masked
            ids, self.cache.layers, positions=self.cache.positions(n), mask=self.cache.mask(n)
        ).logits
        mx.eval(logits, [layer.state for layer in self.cache.layers])
        argmax = mx.argmax(logits, axis=-1).tolist() if any(r.greedy for r in self.rows) else None
        outcomes = [self._compare(b, row, d, logits, argmax) for b, (row, d) in enumerate(zip(self.rows, drafts))]
        compared = time.perf_counter()
        self.cache.commit([len(o.new_ids) for o in outcomes], n)
        verify_s, commit_s = time.perf_counter() - t0, time.perf_counter() - compared
        steps = [
            self._emit(row, k, d, timing, o, verify_s - commit_s, commit_s, n, decision)
            for row, d, timing, o in zip(self.rows, drafts, drafting, outcomes)
        ]
        report = StepReport(steps, len(self.rows), n, draft_s, verify_s)
        self.remove([row for row in self.rows if row.finished])
        if (
            self.cache.holes() > self.cache.size * 256
            and self.cache.holes() > self.cache.valid[:, : self.cache.idx].sum()
        ):
            self.cache.compact()  # holes outnumber kept columns: attention would mostly read masked keys
        return report

    def look_back(self, m: int) -> list[tuple[int, int]]:
        """Before a plain step: what each row's drafter would have drafted before its last m
        emitted tokens (n-gram `hindsight`: a lookup, no forward, no state change).

        Returns:
            One (tokens guessed, of them matched as a prefix) per row checked; a row is checked
            only once it has emitted m tokens (its prompt is never guessed).
        """
        guesses = []
        for row in self.rows:
            if m <= 0 or len(row.output) < m or not row.drafter.supports_hindsight:
                continue
            guess = row.drafter.hindsight(row.context, m)[:m]
            matched = first_false([g == t for g, t in zip(guess, row.context[-m:])])
            row.hindsight = (list(guess), matched)  # the row's next Drafted event carries it
            guesses.append((len(guess), matched))
        return guesses

    # ---------------------------------------------------------------- per row

    def _draft(self, row: Row, k: int) -> Draft:
        k = min(k, row.max_tokens - len(row.output) - 1)  # never more than still wanted, minus the bonus
        draft = row.drafter.propose(row.context, StepPlan(k=k)) if k > 0 else Draft(token_ids=[])
        draft.token_ids = list(draft.token_ids[: max(k, 0)])
        return draft

    @staticmethod
    def _compare(b: int, row: Row, draft: Draft, logits: mx.array, argmax) -> Outcome:
        """What this row keeps of its draft, and whether its last id is the bonus or the recovered token."""
        k = len(draft.token_ids)
        if row.greedy:
            target_ids = argmax[b]
            n = first_false([t == d for t, d in zip(target_ids, draft.token_ids)])
            return Outcome(draft.token_ids[:n] + [target_ids[n]], n, n == k)
        verdict = row.comparator.compare(draft, logits[b, : k + 1])
        n = verdict.accepted
        last = row.bonus.pick(logits[b, k]) if n == k else verdict.recovered_id
        assert last is not None, "a comparator that rejects must recover a token"
        return Outcome(draft.token_ids[:n] + [last], n, n == k, list(verdict.overlap))

    def _emit(
        self,
        row: Row,
        k: int,
        draft: Draft,
        drafting: tuple[float, int],
        out: Outcome,
        verify_s: float,
        commit_s: float,
        columns: int,
        decision: BudgetDecision | None,
    ) -> RowStep:
        """Keep the row's new tokens (cut at a stop token or max_tokens) and say so in events, as
        core/pipeline.py does for one step of a chain run."""
        step, ids, n = row.steps + 1, draft.token_ids, out.accepted
        draft_s, forwards = drafting
        guess, matched = row.hindsight
        row.hindsight = ([], 0)
        pending, row.pending = row.pending, []  # already counted by the collector (join)
        events: list[Event] = []
        drafted_forwards = min(forwards - draft.catchup_forwards, len(ids))
        events.append(
            Drafted(
                t=row.clock(),
                step=step,
                k=max(min(k, row.max_tokens - len(row.output) - 1), 0),
                draft_ids=list(ids),
                seconds=draft_s,
                hindsight_ids=guess,
                hindsight_matched=matched,
                forwards=forwards,
                draft_forwards=drafted_forwards,
                catchup_forwards=draft.catchup_forwards,
                catchup_tokens=draft.catchup_tokens,
                wasted_forwards=forwards - draft.catchup_forwards - drafted_forwards,
                probe=decision is not None and decision.reason == "probe" and bool(ids),
                decision=decision,
            )
        )
        last = out.new_ids[-1]
        events.append(
            Verified(
                t=row.clock(),
                step=step,
                accepted_ids=list(ids[:n]),
                rejected_ids=list(ids[n:]),
                recovered_id=None if out.bonus else last,
                bonus_id=last if out.bonus else None,
                seconds=verify_s,
                rejected_text=self.target.decode(ids[n:]) if n < len(ids) else "",
                overlap=out.overlap,
            )
        )
        # the columns this row fed and does not keep (rejected drafts, padding) are masked holes now
        events.append(
            RolledBack(
                t=row.clock(),
                step=step,
                strategy="mask",
                target_dropped=columns - len(out.new_ids),
                draft_dropped=0,
                seconds=commit_s,
            )
        )
        kept, from_draft = cut(out.new_ids, n, self.stop_ids, row.max_tokens - len(row.output))
        texts = []
        for tid in kept:
            row.detok.add_token(tid)
            texts.append(row.detok.last_segment)
        row.output.extend(kept)
        row.context.extend(out.new_ids)
        if len(kept) < len(out.new_ids) and len(row.output) < row.max_tokens:
            row.finished = "eos"
        elif len(row.output) >= row.max_tokens:
            row.finished = "max_tokens"
        text = "".join(texts)
        if row.finished:
            row.detok.finalize()
            tail = row.detok.last_segment  # text held back for a character still incomplete
            if tail and texts:
                texts[-1] += tail
            text += tail
        events.append(
            Emitted(t=row.clock(), step=step, token_ids=kept, text=text, from_draft=from_draft, token_texts=texts)
        )
        for event in events:
            row.collector.consume(event)
        if row.finished:
            events.append(row.result())
        return RowStep(row, pending + events)
