"""One request's answer as both workers stream it: typed deltas built from the run's events.

Contract: `AnswerStream(job)` consumes one run's events (a chain run's, from `Session.generate`,
or one batched row's `RowStep.events`) and puts `("delta", Delta)` pieces on the job's queue;
`finish(...)` puts the last piece and `("done", Finished)`. Stop strings are cut here: text that
could still grow into one is held back until it cannot. Never touches HTTP.

A Delta carries its text and the tokens whose text it completes, each with its role in the step
that made it (`accepted`: a drafted token the target kept; `bonus`: the target's token after a
fully accepted draft; `recovered`: the target's token at the first rejection; `plain`: the
target's token of a step that drafted nothing), plus the rejected draft ids of the steps whose
first token it carries, each with its text. Over a whole answer the tokens' texts join to its
text and their ids decode to it; where a stop string cut the answer, the token the stop string
starts in keeps the text before the cut (its id decodes to more) and the tokens after it are dropped.

Worked example (hold 0): step 3 drafts [a, b, c], the target keeps a, b and says X instead of c;
Emitted(step=3, token_ids=[a, b, X], from_draft=2) -> Delta(text="abX", tokens=[a accepted,
b accepted, X recovered], rejected=[Rejection(step=3, ids=[c], text="c")]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from specpipe.events import Emitted, Event, RunFinished, RunStats, Verified
from specpipe.serve.field_shapes import DraftTally, llama_timings

ACCEPTED, BONUS, RECOVERED, PLAIN = "accepted", "bonus", "recovered", "plain"


class Token(msgspec.Struct, frozen=True):
    """One emitted token: its id, its role (ACCEPTED | BONUS | RECOVERED | PLAIN), the step that made it,
    and its piece of the answer's text ("" while a character is incomplete: the next token's has it)."""

    id: int
    role: str
    step: int
    text: str = ""


class Rejection(msgspec.Struct, frozen=True):
    """The draft ids a step's verify rejected (never part of the answer), and their text for display."""

    step: int
    ids: list[int]
    text: str = ""


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """A piece of the answer for the client: text, the tokens it completes, rejected drafts."""

    text: str
    tokens: list[Token] = []
    rejected: list[Rejection] = []

    @property
    def from_draft(self) -> int:
        """How many of its tokens were accepted drafts."""
        return sum(t.role == ACCEPTED for t in self.tokens)


@dataclass
class Finished:
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length" (max_tokens) | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    stats: dict  # the run's figures: acceptance, tokens per forward, decode tok/s, TTFT ...
    queue_s: float  # waited before decoding started
    timings: dict = field(default_factory=dict)  # llama-server's shape (field_shapes.py); {} when no run finished
    speculative_decoding: dict = field(default_factory=dict)  # vLLM's per-request shape (field_shapes.py)


def answer_figures(stats: RunStats, batched: bool = False) -> dict:
    """The figures an answer carries (`specpipe` field, requests.jsonl): every RunStats figure (metrics.py, named
    as in a CLI run's summary.json, KV and rollback figures included)."""
    figures = msgspec.to_builtins(stats)
    return figures | {"batched": True} if batched else figures


def first_stop(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None. ("ab.cd", [".", "c"]) -> 2."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


class AnswerStream:
    """Events in, deltas out, for one job (its `out` queue and `stop` strings)."""

    def __init__(self, job):
        self.job = job
        self.hold = max((len(s) for s in job.stop), default=1) - 1  # a stop string may still be forming
        self.text = ""  # the answer so far, cut at a stop string
        self.sent = 0  # characters of it already put on the queue
        self.stopped = False  # a stop string appeared: later tokens are not the answer
        self.finished: RunFinished | None = None  # the run's last event, once seen
        self._tokens: list[tuple[Token, int, int]] = []  # not yet sent: (token, its text's start, end)
        self._rejected: list[Rejection] = []  # not yet sent
        self._verified: dict[int, Verified] = {}  # step -> its verdict, until the step's Emitted
        self.tally = DraftTally()  # every verified draft, for the vLLM-shaped summary

    def consume(self, event: Event) -> bool:
        """Take one event; True once a stop string has appeared (the run should stop: later steps are discarded)."""
        if isinstance(event, Verified):
            self._verified[event.step] = event
            self.tally.count(event)
        elif isinstance(event, Emitted) and not self.stopped:
            self._emitted(event)
        elif isinstance(event, RunFinished):
            self.finished = event
        return self.stopped

    def finish(self, reason: str, prompt_tokens: int, figures: dict, queue_s: float) -> None:
        """Put what is left (a job cut by shutdown too: its client still reads) and the job's ending."""
        self._flush(final=True)
        completion = self.finished.stats.generated_tokens if self.finished is not None else 0
        timings = llama_timings(self.finished.stats) if self.finished is not None else {}
        done = Finished(
            self.text, reason, prompt_tokens, completion, figures, queue_s, timings, self.tally.speculative_decoding()
        )
        self.job.out.put(("done", done))

    # ---------------------------------------------------------------- pieces

    def _emitted(self, event: Emitted) -> None:
        verified = self._verified.pop(event.step, None)
        if verified is not None and verified.rejected_ids:
            self._rejected.append(Rejection(event.step, list(verified.rejected_ids), verified.rejected_text))
        ids = list(event.token_ids)
        pieces = list(event.token_texts) if len(event.token_texts) == len(ids) else [""] * len(ids)
        joined = "".join(pieces)
        # text the pieces do not hold (a character finished at the run's end; an event without pieces)
        tail = event.text[len(joined) :] if event.text.startswith(joined) else event.text
        if tail and pieces:
            pieces[-1] += tail
        target_role = _target_role(verified)
        for i, (tid, piece) in enumerate(zip(ids, pieces)):
            start = len(self.text)
            self.text += piece
            role = ACCEPTED if i < event.from_draft else target_role
            self._tokens.append((Token(tid, role, event.step, piece), start, len(self.text)))
        if tail and not pieces:
            self.text += tail
        # text already sent was past any stop string's start: look from there, not over the whole answer
        found = first_stop(self.text[self.sent :], self.job.stop) if self.job.stop else None
        cut = None if found is None else self.sent + found
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            # the token the stop string starts in keeps the text before it; the ones after are not the answer
            kept = [(t, a, b) for t, a, b in self._tokens if a < cut]
            self._tokens = [
                (t if b <= cut else msgspec.structs.replace(t, text=t.text[: cut - a]), a, min(b, cut))
                for t, a, b in kept
            ]
        self._flush(final=self.stopped)

    def _flush(self, final: bool) -> None:
        """Put the text that can no longer become a stop string, with the tokens it completes; a token
        whose piece is still empty (a character in progress) waits for the text that finishes it."""
        safe = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        n = 0
        while n < len(self._tokens) and self._tokens[n][2] <= safe:
            n += 1
        if not final:
            while n > 0 and self._tokens[n - 1][1] == self._tokens[n - 1][2]:
                n -= 1
        tokens = [t for t, _, _ in self._tokens[:n]]
        if final:
            self._tokens = []  # past a stop string's start: not the answer
        else:
            del self._tokens[:n]
        last_step = tokens[-1].step if tokens else -1
        rejected = [r for r in self._rejected if final or r.step <= last_step]
        self._rejected = [r for r in self._rejected if r not in rejected]
        if safe > self.sent or tokens or rejected:
            self.job.out.put(("delta", Delta(text=self.text[self.sent : safe], tokens=tokens, rejected=rejected)))
            self.sent = safe


def _target_role(verified: Verified | None) -> str:
    """The role of a step's own (target) token: plain when nothing was drafted."""
    if verified is None or not (verified.accepted_ids or verified.rejected_ids):
        return PLAIN
    return BONUS if verified.bonus_id is not None else RECOVERED
