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
from specpipe.core.stages.compare import first_false
from specpipe.core.stages.draft import Draft

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
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target forwards this row took part in
    finished: str | None = None  # "eos" | "max_tokens" | "stopped"


@dataclass
class RowStep:
    """What one row emitted in one step."""

    row: Row
    token_ids: list[int]
    texts: list[str]  # one printable piece per token (may be "" while a character is incomplete)
    from_draft: int  # how many of token_ids were accepted drafts (they come first)
    drafted: int
    accepted: int


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
            self.target.prefill(self.row.prompt_ids[self.fed : self.fed + take], self.cache)
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
        joining.row.drafter.prefill(joining.row.prompt_ids)
        self.cache.add(joining.cache)
        self.rows.append(joining.row)
        return joining.row

    def remove(self, rows: list[Row]) -> None:
        """These rows leave the batch (cancelled, or finished)."""
        gone = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) < len(self.rows):
            self.cache.keep_rows(keep)
            self.rows = [self.rows[i] for i in keep]

    def step(self, k: int) -> StepReport:
        """One draft -> verify -> compare -> keep round for every row; finished rows leave after it."""
        t0 = time.perf_counter()
        drafts = [self._draft(row, k) for row in self.rows]
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
        verdicts = [self._compare(b, row, d, logits, argmax) for b, (row, d) in enumerate(zip(self.rows, drafts))]
        self.cache.commit([len(new_ids) for new_ids, _ in verdicts], n)
        verify_s = time.perf_counter() - t0
        steps = [
            self._emit(row, d, new_ids, accepted) for row, d, (new_ids, accepted) in zip(self.rows, drafts, verdicts)
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
            guesses.append((len(guess), first_false([g == t for g, t in zip(guess, row.context[-m:])])))
        return guesses

    # ---------------------------------------------------------------- per row

    def _draft(self, row: Row, k: int) -> Draft:
        k = min(k, row.max_tokens - len(row.output) - 1)  # never more than still wanted, minus the bonus
        draft = row.drafter.propose(row.context, k) if k > 0 else Draft(token_ids=[])
        draft.token_ids = list(draft.token_ids[: max(k, 0)])
        return draft

    @staticmethod
    def _compare(b: int, row: Row, draft: Draft, logits: mx.array, argmax) -> tuple[list[int], int]:
        """(the ids this row keeps: accepted drafts + recovered or bonus, accepted count)."""
        k = len(draft.token_ids)
        if row.greedy:
            target_ids = argmax[b]
            n = first_false([t == d for t, d in zip(target_ids, draft.token_ids)])
            return draft.token_ids[:n] + [target_ids[n]], n
        verdict = row.comparator.compare(draft, logits[b, : k + 1])
        n = verdict.accepted
        last = row.bonus.pick(logits[b, k]) if n == k else verdict.recovered_id
        return draft.token_ids[:n] + [last], n

    def _emit(self, row: Row, draft: Draft, new_ids: list[int], accepted: int) -> RowStep:
        kept, from_draft = cut(new_ids, accepted, self.stop_ids, row.max_tokens - len(row.output))
        texts = []
        for tid in kept:
            row.detok.add_token(tid)
            texts.append(row.detok.last_segment)
        row.output.extend(kept)
        row.context.extend(new_ids)
        row.drafted += len(draft.token_ids)
        row.accepted += accepted
        row.steps += 1
        if len(kept) < len(new_ids) and len(row.output) < row.max_tokens:
            row.finished = "eos"
        elif len(row.output) >= row.max_tokens:
            row.finished = "max_tokens"
        if row.finished:
            row.detok.finalize()
            tail = row.detok.last_segment  # text held back for a character still incomplete
            if tail:
                texts[-1:] = [(texts[-1] if texts else "") + tail]
        return RowStep(row, kept, texts, from_draft, len(draft.token_ids), accepted)
