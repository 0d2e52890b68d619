"""The run driver: admit, then one step (core/step.py) at a time until the answer is done, as events.

Contract: `SpeculativePipeline.run(prompt_ids, max_tokens)` yields typed
events (events.py) ending in exactly one RunFinished, also on Ctrl-C. It
admits one request as the batch decoder admits its rows (core/admission.py),
drives its `Row` (its own cache: core/storage.py `LoneCache`) through `step`
(plan, propose, verify, compare, commit, bonus, emit) and ends it as a batched
row ends (core/finish.py); it reaches each plug-in only through its protocol
(specpipe/core/protocols.py).

Cache invariant: the target cache holds every context token except the
newest one (`last_id`), which the next verify feeds first.
"""

from __future__ import annotations

import time
from collections.abc import Generator

import mlx.core as mx

from specpipe import signals
from specpipe.core.admission import admit
from specpipe.core.finish import close_step, run_finished
from specpipe.core.plan import RunControl
from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.row import Row
from specpipe.core.step import cut, step
from specpipe.events import Emitted, Event, PrefillProgress, RunStarted
from specpipe.metrics import StatsCollector

__all__ = ["RunControl", "SpeculativePipeline", "cut"]  # cut: the batch decoder's too


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
        tree=None,
    ):
        self.target, self.drafter, self.budget = target, drafter, budget
        self.tree = tree  # tree != chain: the row's TreeParts (trees/proposal.py), else None
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
        mx.reset_peak_memory()

        def emit(event: Event) -> Event:
            collector.consume(event)
            return event

        if self.started is not None:
            yield emit(self.started)
        context = self.context = list(prompt_ids)
        cache = self.cache = self.target.make_cache()
        self.drafter.use_rollback(self.rollback)  # a session may hand one drafter to several pipelines
        # an MTP head reads the target's hidden states, an EAGLE-3 head its layer taps
        draft_capture = self.drafter.capture
        wants_hidden = draft_capture is not None
        # a draft model prefills after the first token, which a plain step gives: plain decoding's TTFT
        deferred = self.drafter.prefill_after_first_token and not wants_hidden
        row = Row(
            context=context,
            cache=cache,
            drafter=self.drafter,
            budget=self.budget,
            comparator=self.comparator,
            rollback=self.rollback,
            bonus=self.bonus,
            detok=detok,
            max_tokens=max_tokens,
            stop_ids=stop_ids,
            tree=self.tree,
            draft_ready=not deferred,
            draft_capture=draft_capture,
        )
        try:
            # ---- admission: the target cache takes the prompt but its last token, a chunk at a time
            admission = admit(self.target, row, context, cache)
            total = len(context) - 1
            for done in admission.chunks(total):
                if total > self.target.prefill_chunk:  # a long prompt: say how far it got
                    yield emit(PrefillProgress(t=clock(), tokens=done, total=total))
            yield emit(admission.admitted(clock))
            reason = "max_tokens"
            while len(row.output) < max_tokens:
                signals.check()  # a stop whose KeyboardInterrupt was swallowed ends the run here
                if control.stop_requested:
                    reason = "stopped"
                    break
                row.k_override = control.k
                held: list[Event] = []  # the step's Emitted, its row's last event: its text completes at the end
                for _, event in step(self.target, [row], clock):
                    if isinstance(event, Emitted):
                        held.append(event)
                    else:
                        yield emit(event)
                close_step(row, held)
                for event in held:
                    yield emit(event)
                if row.finished:
                    reason = row.finished
                    break
        except KeyboardInterrupt:
            reason = "interrupted"
        yield emit(run_finished(row, collector, reason, clock(), mx.get_peak_memory()))
