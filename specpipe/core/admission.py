"""How a request becomes a row, the same for a lone request (core/pipeline.py) and a batched one (batch/decoder.py).

Contract: `admit(target, row, prompt_ids, cache)` starts the request (its detokenizer reset, its budget's
`start_request()`) and returns its `Admission`: `chunks(n)` / `prefill(n)` feed up to n more prompt tokens
into `cache` in the engine's prefill chunks (all but the last prompt token, which the first step feeds),
recording what the row's drafter reads of those forwards (`row.draft_capture`: hidden states, layer taps);
`admitted(clock)` then prefills the drafter (unless its prefill waits for the first drafting step,
`row.draft_ready` False) and hands it those recordings, and returns the row's `PrefillDone`. The caller
decides where the cache lives afterwards: the lone row keeps it, a batch copies it into its RaggedBatch.
Never steps, never reads a config.

The prompt ids and the cache are values the caller passes: a cache that already holds a prompt's first
positions (a prefix store's, specpipe/prefix/) is fed only the rest (`fed`: the positions it holds); the
drafter then resumes from `row.draft_resume` where the store kept its state, and reads the recordings of the
fed positions only (`observe_hidden` from position `fed`). PrefillDone.cached_tokens says how many.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specpipe.engine.engine import joined_rows
from specpipe.events import PrefillDone

if TYPE_CHECKING:
    from specpipe.core.row import Row


def admit(target, row: Row, prompt_ids: list[int], cache: list, fed: int = 0) -> Admission:
    """Start one request: the row's detokenizer and budget begin anew, its prompt waits to be fed.

    Args:
        target: the target Engine.
        row: the request's Row (core/step.py), its context the prompt.
        prompt_ids: the prompt, at least one token.
        cache: the target cache the prompt goes into (a lone row's own, or a solo cache a batch takes at join).
        fed: prompt positions the cache already holds.
    """
    if not prompt_ids:
        raise ValueError("admit: an empty prompt (at least one token: the first step feeds it)")
    row.detok.reset()
    row.budget.start_request()  # one budget may serve many requests (a session's turns, the server's rows)
    if not 0 <= fed < len(prompt_ids):
        raise ValueError(f"admit: {fed} prompt positions already fed of {len(prompt_ids)} (at most all but the last)")
    return Admission(target, row, list(prompt_ids), cache, fed, reused=fed)


@dataclass
class Admission:
    """A request being admitted: its prompt fed to `cache` a chunk at a time, then its drafter's prefill."""

    target: Any
    row: Row
    prompt_ids: list[int]
    cache: list
    fed: int = 0  # prompt tokens in `cache` so far
    reused: int = 0  # of those, the ones it held when admitted (a prefix store's): never fed here
    seconds: float = 0.0  # spent feeding them (waits between chunks excluded: other rows' steps, a consumer)
    hidden: list = field(default_factory=list)  # the prompt's final hidden states, for a drafter that reads them
    taps: list = field(default_factory=list)  # ... and its decoder-layer taps (draft=eagle3)

    @property
    def todo(self) -> int:
        return len(self.prompt_ids) - 1 - self.fed

    @property
    def done(self) -> bool:
        return self.todo <= 0

    def chunks(self, n: int) -> Iterator[int]:
        """Feed up to n more prompt tokens; yields the prompt tokens in the cache after each engine chunk."""
        take = min(n, self.todo)
        if take <= 0:
            return
        start = self.fed
        ids = self.prompt_ids[start : start + take]
        s = time.perf_counter()
        for done in self.target.prefill_steps(ids, self.cache, self.row.draft_capture, self.hidden, self.taps):
            self.fed = start + done
            self.seconds += time.perf_counter() - s
            yield self.fed
            s = time.perf_counter()

    def prefill(self, n: int) -> bool:
        """Feed up to n more prompt tokens; True once all are in."""
        for _ in self.chunks(n):
            pass
        return self.done

    def admitted(self, clock: Callable[[], float]) -> PrefillDone:
        """The drafter's prefill (now unless it waits for the first drafting step) and what it reads of the
        prompt's forwards; returns the PrefillDone, its `t` and `seconds` on the row's `clock`."""
        if not self.done:
            raise ValueError(f"admitted() with {self.todo} prompt tokens still to prefill")
        row = self.row
        s = time.perf_counter()
        if row.draft_ready:
            row.prefill_drafter(self.prompt_ids)
        if row.wants_hidden:
            start = self.reused  # the positions before were recorded with the store's snapshot (draft_resume)
            hidden, taps = joined_rows(self.hidden), joined_rows(self.taps)
            row.drafter.observe_hidden(start, self.prompt_ids[start:-1], hidden, taps)
        # a deferred draft model prefills on its row's first drafting step, whose Drafted seconds count it
        draft_s = time.perf_counter() - s if row.draft_ready or row.wants_hidden else 0.0
        t = clock()
        return PrefillDone(
            t=t,
            tokens=len(self.prompt_ids),
            seconds=t,
            target_seconds=self.seconds,
            draft_seconds=draft_s,
            cached_tokens=self.reused,
        )
