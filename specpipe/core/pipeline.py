"""The step loop: draft -> verify -> compare -> rollback -> bonus, as events.

Contract: `SpeculativePipeline.run(prompt_ids, max_tokens)` yields typed
events (events.py) ending in exactly one RunFinished, also on Ctrl-C. It
delegates every decision to its stages and touches MLX only through them
and the target Engine; it reaches each plug-in only through its protocol
(specpipe/core/protocols.py).

Cache invariant: the target cache holds every context token except the
newest one (`last_id`), which the next verify feeds first.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass

import mlx.core as mx
import msgspec

from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.stages.compare import first_false
from specpipe.core.stages.draft import Draft
from specpipe.core.stages.verify import verify
from specpipe.engine.engine import Capture, joined_rows
from specpipe.engine.kv import kv_figures
from specpipe.events import (
    BudgetDecision,
    Drafted,
    DraftPrefilled,
    Emitted,
    Event,
    PrefillDone,
    PrefillProgress,
    RolledBack,
    RunFinished,
    RunStarted,
    Verified,
)
from specpipe.metrics import StatsCollector


class SpeculativePipeline:
    def __init__(
        self,
        target,
        drafter: Drafter,
        budget: Budget,
        comparator: Comparator,
        rollback: Rollback,
        bonus: Bonus,
        started: RunStarted | None = None,
        tree_step=None,
    ):
        self.target, self.drafter, self.budget = target, drafter, budget
        self.tree_step = (
            tree_step  # tree != chain: draft + verify + compare + compaction of a token tree (trees/step.py)
        )
        self.comparator, self.rollback, self.bonus = comparator, rollback, bonus
        self.started = started
        self.cache: list | None = None  # the last run's target cache and context (multi-turn reuse, tests)
        self.context: list[int] = []
        self.rollback.check(target.make_cache(), "target")
        drafter.use_rollback(rollback)  # the drafter rolls its own cache back with the same strategy

    def run(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        stop_ids: set[int] | None = None,
        control: RunControl | None = None,
    ) -> Generator[Event, None, None]:
        """Generate up to `max_tokens` tokens after `prompt_ids`.

        Args:
            prompt_ids: the prompt, at least one token.
            max_tokens: upper bound on emitted tokens.
            stop_ids: ids that end generation (excluded from the output);
                defaults to the target's EOS ids.
            control: live knobs from another thread (stop, K override).
        """
        control = control or RunControl()
        stop_ids = self.target.eos_token_ids if stop_ids is None else stop_ids
        collector = StatsCollector()
        t0 = time.perf_counter()
        clock = lambda: time.perf_counter() - t0  # noqa: E731
        detok = self.target.tokenizer.detokenizer
        detok.reset()
        mx.reset_peak_memory()

        def emit(event: Event) -> Event:
            collector.consume(event)
            return event

        def finish(reason: str) -> RunFinished:
            detok.finalize()
            stats = msgspec.structs.replace(
                collector.stats(peak_memory_bytes=mx.get_peak_memory(), wall_s=clock()),
                rollback_strategy=self.rollback.name,
                **kv_figures(self.cache),
                rollback_peak_bytes=self.rollback.peak_bytes,
                rollback_time_s=self.rollback.time_s,
                recompute_tokens=self.rollback.recompute_tokens,
            )
            return RunFinished(
                t=clock(), stop_reason=reason, token_ids=collector.token_ids, text=collector.text, stats=stats
            )

        if self.started is not None:
            yield emit(self.started)
        context = self.context = list(prompt_ids)
        output: list[int] = []
        try:
            # ---- prefill: both caches see the prompt, except its last token
            cache = self.cache = self.target.make_cache()
            self.drafter.use_rollback(self.rollback)  # a session may hand one drafter to several pipelines
            wants_hidden = self.drafter.needs_hidden  # an MTP head reads the target's hidden states
            hidden_rows: list = []
            s = time.perf_counter()
            prefill_capture = Capture(hidden=True) if wants_hidden else None
            for done in self.target.prefill_steps(context[:-1], cache, prefill_capture, hidden_rows):
                if len(context) - 1 > self.target.prefill_chunk:  # a long prompt: say how far it got
                    yield emit(PrefillProgress(t=clock(), tokens=done, total=len(context) - 1))
            target_s, s = time.perf_counter() - s, time.perf_counter()
            # a draft model prefills after the first token, which a plain step gives: plain decoding's TTFT
            deferred = self.drafter.prefill_after_first_token and not wants_hidden
            if not deferred:
                self.drafter.prefill(context)
            if wants_hidden:
                self.drafter.observe_hidden(0, context[:-1], joined_rows(hidden_rows))
            yield emit(
                PrefillDone(
                    t=clock(),
                    tokens=len(context),
                    seconds=clock(),
                    target_seconds=target_s,
                    draft_seconds=0.0 if deferred else time.perf_counter() - s,
                )
            )
            last_id, step, reason = context[-1], 0, "max_tokens"

            while len(output) < max_tokens:
                if control.stop_requested:
                    reason = "stopped"
                    break
                step += 1
                # the first token as soon as plain decoding's: before a draft model's prefill, or where the budget
                # asks (auto: a first verify of K + 1 tokens made short prompts' TTFT 10-30% later than plain's)
                first_plain = step == 1 and (deferred or (self.budget.first_token_plain and control.k is None))
                if deferred and step == 2:
                    s = time.perf_counter()
                    self.drafter.prefill(context)
                    yield emit(DraftPrefilled(t=clock(), tokens=len(context), seconds=time.perf_counter() - s))
                if self.tree_step is not None and not first_plain:
                    # tree != chain: draft, verify, compare and compact a token tree in trees/step.py
                    for event in self.tree_step.run(step, clock, context, last_id, cache, max_tokens - len(output) - 1):
                        yield emit(event)
                    new_ids, n = self.tree_step.new_ids, self.tree_step.accepted
                else:
                    # ---- draft: never more than the tokens still wanted, minus the bonus
                    decision: BudgetDecision | None
                    if first_plain:
                        k, decision = 0, BudgetDecision(k=0, reason="first token")
                    elif control.k is not None:
                        k, decision = control.k, BudgetDecision(k=control.k, reason="override")
                    else:
                        self.budget.at_context(len(context) - 1)  # the cache holds all but the newest token
                        k = self.budget.next_k()
                        decision = self.budget.decision
                    k = min(k, max_tokens - len(output) - 1)
                    # a free lookup beside a model (evidence_is_free) may draft past the model's K, even at K = 0
                    free_lookup = control.k is None and self.drafter.evidence_is_free and not first_plain
                    lookup_k = self.budget.lookup_k if free_lookup else 0
                    lookup_k = min(lookup_k, max_tokens - len(output) - 1)
                    s = time.perf_counter()
                    f0 = self.drafter.forwards
                    self.drafter.chain_stop = self.budget.chain_stop if control.k is None else None
                    self.drafter.lookup_k = lookup_k
                    draft = self.drafter.propose(context, k) if max(k, lookup_k) > 0 else Draft(token_ids=[])
                    f1 = self.drafter.forwards
                    if draft.token_ids and self.drafter.last_evidence is not None and control.k is None:
                        # the drafter said how sure this draft is (n-gram: the match length): the budget keeps
                        # as much of it as that class's acceptance pays for, maybe none (a plain step)
                        k = self.budget.fit(self.drafter.last_evidence, min(max(k, lookup_k), len(draft.token_ids)))
                        decision = self.budget.decision
                    draft.token_ids = draft.token_ids[: max(k, 0)]
                    k_eff = len(draft.token_ids)
                    looked_back, matched = self._hindsight(k, len(output), context) if control.k is None else ([], 0)
                    draft_s = time.perf_counter() - s
                    # every draft forward of this step, by purpose: what proposed a verified token, what did not
                    drafting = min(f1 - f0 - draft.catchup_forwards, k_eff)
                    yield emit(
                        Drafted(
                            t=clock(),
                            step=step,
                            k=max(k, 0),
                            draft_ids=draft.token_ids,
                            seconds=draft_s,
                            hindsight_ids=looked_back,
                            hindsight_matched=matched,
                            forwards=self.drafter.forwards - f0,
                            draft_forwards=drafting,
                            catchup_forwards=draft.catchup_forwards,
                            catchup_tokens=draft.catchup_tokens,
                            hindsight_forwards=self.drafter.forwards - f1,
                            wasted_forwards=f1 - f0 - draft.catchup_forwards - drafting,
                            probe=decision is not None and decision.reason == "probe" and k_eff > 0,
                            decision=decision,
                        )
                    )

                    # ---- verify + compare + bonus
                    s = time.perf_counter()
                    states = self.rollback.before_forward(cache)
                    # nothing asked for, no capture: the plain forward (draft=none, trim)
                    capture = (
                        Capture(hidden=wants_hidden, states=states) if states is not None or wants_hidden else None
                    )
                    result = verify(self.target, cache, last_id, draft.token_ids, capture)
                    logits = result.logits
                    if wants_hidden:
                        self.drafter.observe_hidden(len(context) - 1, [last_id, *draft.token_ids], result.hidden)
                    verdict = self.comparator.compare(draft, logits)
                    n = verdict.accepted
                    bonus_id = self.bonus.pick(logits[k_eff]) if n == k_eff else None
                    verify_s = time.perf_counter() - s
                    next_id = verdict.recovered_id if bonus_id is None else bonus_id
                    assert next_id is not None, "a comparator that rejects must recover a token"
                    new_ids = draft.token_ids[:n] + [next_id]
                    yield emit(
                        Verified(
                            t=clock(),
                            step=step,
                            accepted_ids=draft.token_ids[:n],
                            rejected_ids=draft.token_ids[n:],
                            recovered_id=verdict.recovered_id if bonus_id is None else None,
                            bonus_id=bonus_id,
                            seconds=verify_s,
                            rejected_text=self.target.decode(draft.token_ids[n:]) if n < k_eff else "",
                            overlap=verdict.overlap,
                        )
                    )

                    # ---- rollback: keep context + accepted drafts in both caches
                    s = time.perf_counter()
                    target_drop = k_eff - n
                    self.rollback.rollback(cache, target_drop, engine=self.target, fed_ids=[last_id, *draft.token_ids])
                    draft_drop = 0 if first_plain else self.drafter.rollback(len(context) + n)
                    self.budget.observe(k_eff, n, draft_s=draft_s, verify_s=verify_s)
                    yield emit(
                        RolledBack(
                            t=clock(),
                            step=step,
                            strategy=self.rollback.last_choice or self.rollback.name,
                            target_dropped=target_drop,
                            draft_dropped=draft_drop,
                            seconds=time.perf_counter() - s,
                        )
                    )

                # ---- emit, cut at a stop token or at max_tokens
                kept, from_draft = cut(new_ids, n, stop_ids, max_tokens - len(output))
                pieces = []
                for tid in kept:
                    detok.add_token(tid)
                    pieces.append(detok.last_segment)
                yield emit(
                    Emitted(
                        t=clock(),
                        step=step,
                        token_ids=kept,
                        text="".join(pieces),
                        from_draft=from_draft,
                        token_texts=pieces,
                    )
                )
                output.extend(kept)
                context.extend(new_ids)
                last_id = new_ids[-1]
                if len(kept) < len(new_ids) and len(output) < max_tokens:
                    reason = "eos"
                    break
        except KeyboardInterrupt:
            reason = "interrupted"
        yield emit(finish(reason))

    def _hindsight(self, k: int, generated: int, context: list[int]) -> tuple[list[int], int]:
        """On a K = 0 step the budget may ask what the drafter would have said for the last
        tokens the target emitted (never the prompt's): evidence without a verify forward."""
        m = min(self.budget.hindsight_k, generated) if k <= 0 else 0
        if m <= 0 or not self.drafter.supports_hindsight:
            return [], 0
        guess = self.drafter.hindsight(context, m)[:m]
        matched = first_false([g == t for g, t in zip(guess, context[-m:])])  # the greedy comparator's rule
        self.budget.observe_hindsight(len(guess), matched, evidence=self.drafter.last_evidence)
        return guess, matched


@dataclass
class RunControl:
    """Knobs another thread (the TUI) may turn while a run is going.

    stop_requested: finish after the current step (stop_reason "stopped").
    k: draft budget override for the next steps (None: ask the budget).
    """

    stop_requested: bool = False
    k: int | None = None


def cut(new_ids: list[int], n_from_draft: int, stop_ids: set[int], room: int) -> tuple[list[int], int]:
    """Tokens of this step that reach the output.

    Example: new_ids [4, 9, 2, 7] (3 from the draft), stop {2}, room 10
    -> ([4, 9], 2): the stop token and everything after it are dropped.
    """
    kept = []
    for tid in new_ids[:room]:
        if tid in stop_ids:
            break
        kept.append(tid)
    return kept, min(len(kept), n_from_draft)
