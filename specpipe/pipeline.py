"""The step loop: draft -> verify -> compare -> rollback -> bonus, as events.

Contract: `SpeculativePipeline.run(prompt_ids, max_tokens)` yields typed
events (events.py) ending in exactly one RunFinished, also on Ctrl-C. It
delegates every decision to its stages and touches MLX only through them
and the target Engine.

Cache invariant: the target cache holds every context token except the
newest one (`last_id`), which the next verify feeds first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
import msgspec

from specpipe.engine.kv import kv_figures
from specpipe.events import BudgetDecision, Drafted, Emitted, Event, PrefillDone, PrefillProgress, RolledBack, RunFinished, RunStarted, Verified
from specpipe.metrics import StatsCollector
from specpipe.stages.compare import first_false
from specpipe.stages.draft import Draft
from specpipe.stages.verify import verify


class SpeculativePipeline:
    def __init__(self, target, drafter, budget, comparator, rollback, bonus, started: RunStarted | None = None):
        self.target, self.drafter, self.budget = target, drafter, budget
        self.comparator, self.rollback, self.bonus = comparator, rollback, bonus
        self.started = started
        self.cache: list | None = None  # the last run's target cache and context (multi-turn reuse, tests)
        self.context: list[int] = []
        self.rollback.check(target.make_cache(), "target")
        if drafter.cache is not None:
            self.rollback.check(drafter.cache, "draft")

    def run(
        self, prompt_ids: list[int], max_tokens: int, stop_ids: set[int] | None = None, control: RunControl | None = None
    ) -> Iterator[Event]:
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
                rollback_peak_bytes=getattr(self.rollback, "peak_bytes", 0),
                rollback_time_s=getattr(self.rollback, "time_s", 0.0),
                recompute_tokens=getattr(self.rollback, "recompute_tokens", 0),
            )
            return RunFinished(t=clock(), stop_reason=reason, token_ids=collector.token_ids, text=collector.text, stats=stats)

        if self.started is not None:
            yield emit(self.started)
        context = self.context = list(prompt_ids)
        output: list[int] = []
        try:
            # ---- prefill: both caches see the prompt, except its last token
            cache = self.cache = self.target.make_cache()
            s = time.perf_counter()
            for done in self.target.prefill_steps(context[:-1], cache):
                if len(context) - 1 > self.target.prefill_chunk:  # a long prompt: say how far it got
                    yield emit(PrefillProgress(t=clock(), tokens=done, total=len(context) - 1))
            target_s, s = time.perf_counter() - s, time.perf_counter()
            self.drafter.prefill(context)
            yield emit(PrefillDone(
                t=clock(), tokens=len(context), seconds=clock(), target_seconds=target_s, draft_seconds=time.perf_counter() - s,
            ))
            last_id, step, reason = context[-1], 0, "max_tokens"

            while len(output) < max_tokens:
                if control.stop_requested:
                    reason = "stopped"
                    break
                step += 1
                # ---- draft: never more than the tokens still wanted, minus the bonus
                if control.k is not None:
                    k, decision = control.k, BudgetDecision(k=control.k, reason="override")
                else:
                    k, decision = self.budget.next_k(), getattr(self.budget, "decision", None)
                k = min(k, max_tokens - len(output) - 1)
                s = time.perf_counter()
                draft_start = self.drafter.cached_len
                if self.drafter.cache is not None:
                    self.rollback.before_forward(self.drafter.cache)
                f0 = self.drafter.forwards
                draft = self.drafter.propose(context, k) if k > 0 else Draft(token_ids=[])
                f1 = self.drafter.forwards
                draft.token_ids = draft.token_ids[: max(k, 0)]
                k_eff = len(draft.token_ids)
                looked_back, matched = self._hindsight(k, len(output), context) if control.k is None else ([], 0)
                draft_s = time.perf_counter() - s
                # every draft forward of this step, by purpose: what proposed a verified token, what did not
                drafting = min(f1 - f0 - draft.catchup_forwards, k_eff)
                yield emit(Drafted(
                    t=clock(), step=step, k=max(k, 0), draft_ids=draft.token_ids, seconds=draft_s,
                    hindsight_ids=looked_back, hindsight_matched=matched,
                    forwards=self.drafter.forwards - f0, draft_forwards=drafting,
                    catchup_forwards=draft.catchup_forwards, catchup_tokens=draft.catchup_tokens,
                    hindsight_forwards=self.drafter.forwards - f1,
                    wasted_forwards=f1 - f0 - draft.catchup_forwards - drafting,
                    probe=decision is not None and decision.reason == "probe" and k_eff > 0, decision=decision,
                ))

                # ---- verify + compare + bonus
                s = time.perf_counter()
                self.rollback.before_forward(cache)
                logits = verify(self.target, cache, last_id, draft.token_ids)
                verdict = self.comparator.compare(draft, logits)
                n = verdict.accepted
                bonus_id = self.bonus.pick(logits[k_eff]) if n == k_eff else None
                verify_s = time.perf_counter() - s
                new_ids = draft.token_ids[:n] + [verdict.recovered_id if bonus_id is None else bonus_id]
                yield emit(Verified(
                    t=clock(), step=step, accepted_ids=draft.token_ids[:n], rejected_ids=draft.token_ids[n:],
                    recovered_id=verdict.recovered_id if bonus_id is None else None, bonus_id=bonus_id,
                    seconds=verify_s,
                    rejected_text=self.target.decode(draft.token_ids[n:]) if n < k_eff else "",
                    overlap=verdict.overlap,
                ))

                # ---- rollback: keep context + accepted drafts in both caches
                s = time.perf_counter()
                target_drop = k_eff - n
                draft_drop = max(0, self.drafter.cached_len - (len(context) + n))
                self.rollback.rollback(cache, target_drop, engine=self.target, fed_ids=[last_id, *draft.token_ids])
                if self.drafter.cache is not None:
                    # only the short tail since draft_start: no copy of the whole context
                    fed = (context[draft_start:] + draft.token_ids)[: self.drafter.cached_len - draft_start]
                    self.rollback.rollback(self.drafter.cache, draft_drop, engine=self.drafter.engine, fed_ids=fed)
                    self.drafter.cached_len -= draft_drop
                self.budget.observe(k_eff, n, draft_s=draft_s, verify_s=verify_s)
                yield emit(RolledBack(
                    t=clock(), step=step, strategy=getattr(self.rollback, "last_choice", "") or self.rollback.name,
                    target_dropped=target_drop,
                    draft_dropped=draft_drop, seconds=time.perf_counter() - s,
                ))

                # ---- emit, cut at a stop token or at max_tokens
                kept, from_draft = cut(new_ids, n, stop_ids, max_tokens - len(output))
                pieces = []
                for tid in kept:
                    detok.add_token(tid)
                    pieces.append(detok.last_segment)
                yield emit(Emitted(
                    t=clock(), step=step, token_ids=kept, text="".join(pieces), from_draft=from_draft, token_texts=pieces,
                ))
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
        m = min(getattr(self.budget, "hindsight_k", 0), generated) if k <= 0 else 0
        if m <= 0 or not hasattr(self.drafter, "hindsight"):
            return [], 0
        guess = self.drafter.hindsight(context, m)[:m]
        matched = first_false([g == t for g, t in zip(guess, context[-m:])])  # the greedy comparator's rule
        self.budget.observe_hindsight(len(guess), matched)
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
