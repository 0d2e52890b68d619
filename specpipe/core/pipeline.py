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

With a prefix store (specpipe/prefix/, `prefix_store`), the run starts from the
longest stored prefix of its prompt (prefilling only the rest; the drafter
resumes from what it kept with it) and keeps the cache twice: once the prompt
is in, and when the answer ends (not after Ctrl-C), so that the next turn,
whose prompt holds this one's prompt and answer, finds them.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING

import mlx.core as mx

from specpipe.core.admission import admit
from specpipe.core.finish import close_step, run_finished
from specpipe.core.plan import RunControl
from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.row import Row
from specpipe.core.step import cut, step
from specpipe.events import Emitted, Event, PrefillProgress, RunStarted
from specpipe.metrics import StatsCollector
from specpipe.run import signals

if TYPE_CHECKING:  # the store is the Session's; the driver only calls it
    from specpipe.prefix.store import Hit, PrefixStore

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
        prefix_store: PrefixStore | None = None,
    ):
        self.target, self.drafter, self.budget = target, drafter, budget
        self.tree = tree  # tree != chain: the row's TreeParts (trees/proposal.py), else None
        self.comparator, self.rollback, self.bonus = comparator, rollback, bonus
        self.started = started
        self.prefix_store = prefix_store
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
        hit = self._lookup(context)
        cache = self.cache = hit.cache if hit is not None else self.target.make_cache()
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
            draft_resume=hit.drafter_state if hit is not None else None,
        )
        try:
            # ---- admission: the target cache takes the prompt but its last token, a chunk at a time
            admission = admit(self.target, row, context, cache, fed=hit.tokens if hit is not None else 0)
            total = len(context) - 1
            for done in admission.chunks(total):
                if total - admission.reused > self.target.prefill_chunk:  # a long prompt: say how far it got
                    yield emit(PrefillProgress(t=clock(), tokens=done, total=total))
            yield emit(admission.admitted(clock))
            self._keep(row)
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
        if reason != "interrupted":  # a step cut short may leave the cache between two lengths
            self._keep(row)
        yield emit(run_finished(row, collector, reason, clock(), mx.get_peak_memory()))

    def _lookup(self, context: list[int]) -> Hit | None:
        """The prefix store's longest reusable prefix of the prompt (one whose drafter state the drafter needs)."""
        if self.prefix_store is None:
            return None
        return self.prefix_store.lookup(context, with_drafter_state=not self.drafter.resumes_without_state)

    def _keep(self, row: Row) -> None:
        """The cache, which holds all of the context but its newest token, into the prefix store, with the
        drafter's state for those positions (none while its prefill still waits: it read nothing yet)."""
        if self.prefix_store is None or len(row.context) < 2:
            return
        held = row.context[:-1]
        state = row.drafter.prefix_state(row.context, len(held)) if row.draft_ready else None
        self.prefix_store.keep(held, row.cache, state)
