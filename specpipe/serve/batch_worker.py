"""The batching decoding thread: up to `max_batch` requests decoded together, the rest queued.

Contract: same interface as `GenerationWorker` (`submit`, `waiting`, `close`; pieces on each
job's own queue: ("delta", Delta), then ("done", Finished) or ("error", message)). Between two
steps it drops rows whose client left or whose stop string appeared, admits waiting requests
(each prefilled alone, `prefill_per_step` prompt tokens between two steps while other rows
decode, then a row of the batch) and runs one `BatchDecoder.step`, where each row's own budget
(built from the served `cfg.budget`) plans its K, or the request's own `specpipe.k` fixes it.
Each row's events go through its `answer.AnswerStream` (the one delta type
both workers queue), and its figures are its RunFinished's (metrics.py), not counted here. A full
queue raises QueueFull (HTTP 429). With no row decoding and nothing queued it times budget=auto's
long-context curves up to the contexts the rows reached (serve/idle.py), one forward between two looks
at the queue. With a prefix store, a request whose prompt shares at least `prefix_wait_tokens` leading
tokens with a prompt still being prefilled waits (outside the slots) until that one joins and leaves its
prompt in the store, so clients that arrive together with one system prompt prefill it once.

Failures end the requests they touched, each with one line (HTTP: a 500 error object, a stream's error chunk
and [DONE]): a request that cannot begin, prefill or join fails alone; a row whose events cannot be
answered leaves alone; a failed step fails every row of it and empties the batch (its storage's state is
unknown), so the next requests start sound. What fails outside those (emptying the batch itself, the idle
refinement) stops the thread through its `breakdown.Breakdown`: every request in flight or queued gets that
line, later ones a `WorkerStopped` (HTTP 503) at once, and `failure` says why (/health). Never touches HTTP.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from specpipe.batch.decoder import BatchLost
from specpipe.events import Emitted
from specpipe.serve.answer import AnswerStream, answer_figures
from specpipe.serve.breakdown import Breakdown, fault
from specpipe.serve.idle import IdleRefinement
from specpipe.serve.worker import SHUTTING_DOWN, Job, cancelled_unstarted, drop_cancelled, mark_end

IDLE_POLL_S = 0.2  # how often an idle worker looks at its close flag


@dataclass
class Active:
    """A job being decoded: its row and its answer's stream."""

    job: Job
    row: Any  # batch.decoder.Row
    started: float
    answer: AnswerStream
    last_emit: float | None = None  # when its previous tokens came (/metrics' TTFT and inter-token gaps)


class BatchWorker:
    per_request_sampling = True  # every row owns a seeded sampler: a request may set temperature / top_p / seed

    def __init__(
        self,
        decoder,
        max_batch: int,
        max_waiting: int,
        metrics=None,
        log_step=None,
        prefill_per_step: int = 0,
        log=None,
        prefix_wait_tokens: int = 0,
    ):
        """
        Args:
            log_step: record -> None, one dict per step (the rows' budget decisions, batch, positions, seconds).
            log: record -> None (requests.jsonl): what an idle refinement timed.
            prefill_per_step: prompt tokens of joining requests prefilled between two decode steps
                while other rows are active (0: a joining prompt is prefilled whole, stalling them).
            prefix_wait_tokens: a request sharing this many leading prompt tokens with a joining one waits
                for it to join (its prompt is then in the decoder's prefix store); 0 or no store: never waits.
        """
        self.decoder, self.max_batch = decoder, max_batch
        self.metrics = metrics
        self.log_step = log_step
        self.prefill_per_step = prefill_per_step
        self._steps = 0
        self._joining: list[tuple[Job, Any, float]] = []  # (job, core.admission.Admission, admitted at)
        self.prefix_wait_tokens = prefix_wait_tokens if decoder.prefix_store is not None else 0
        self._held: list[Job] = []  # taken off the queue, waiting for a joining prompt they share (oldest first)
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=max_waiting)
        self._active: list[Active] = []
        self._closing = threading.Event()
        self._breakdown = Breakdown()
        self._idle = IdleRefinement(decoder.target, log)  # its curve follows the rows' budgets (budget=auto)
        self._thread = threading.Thread(target=self._loop, name="specpipe-batch", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a request. Raises QueueFull (HTTP 429) or WorkerStopped (HTTP 503)."""
        full = f"{self._jobs.maxsize} requests are already waiting for one of {self.max_batch} batch slots"
        self._breakdown.put(self._jobs, job, full)
        self._gauge("specpipe_queue_length", self._jobs.qsize())

    def alive(self) -> bool:
        """Whether the decoding thread still runs (False once it ended: /health is then 503)."""
        return self._thread.is_alive()

    @property
    def failure(self) -> str | None:
        """Why the decoding thread stopped (one line), None while it runs or after a clean close."""
        return self._breakdown.reason

    def waiting(self) -> int:
        return self._jobs.qsize()

    def active(self) -> int:
        return len(self._active)

    def close(self, timeout: float = 30) -> None:
        """Stop after the current step; requests still decoding or waiting end as cancelled."""
        self._closing.set()
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the decoding thread

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # outside what one request or one step can fail: the batch's state is unknown
            reason = self._breakdown.stop(exc, self._jobs)
            for job in [a.job for a in self._active] + [j for j, _, _ in self._joining] + self._held:
                job.out.put(("error", reason))
                self._count("specpipe_requests_total", status="error")
            return
        for a in list(self._active):
            self._finish(a, "cancelled")
        for job in [j for j, _, _ in self._joining] + self._held:
            job.out.put(("error", SHUTTING_DOWN))
        while True:
            try:
                self._jobs.get_nowait().out.put(("error", SHUTTING_DOWN))
            except queue.Empty:
                break

    def _serve(self) -> None:
        while not self._closing.is_set():
            self._admit()
            if not self._active:
                if not self._joining:  # idle: a request that comes meanwhile waits one forward at most
                    self._idle.run(self._busy)
                continue
            try:
                report = self.decoder.step(keep_joined=False)  # a joined prompt is stored after its first tokens
            except Exception as exc:  # a failed step fails its rows, not the server
                self._fail_batch(f"{fault(exc)}: this step failed, and every request in it")
                continue
            self._record_step(report, report.positions - 1)
            self._log_step(report)
            for step in report.rows:
                a = next(a for a in self._active if a.row is step.row)
                try:
                    self._emit(a, step)
                except Exception as exc:  # its answer cannot go on (a detokenizer, a stop string): it alone ends
                    self._fail(a, f"{fault(exc)}: this request failed; the server goes on")
            self._keep_joined()

    def _keep_joined(self) -> None:
        """The prompts that joined before this step into the prefix store, now that their first tokens are out
        (a later request sharing one finds it: `begin` looks only after this); a failed keep fails its request."""
        for row, exc in self.decoder.keep_joined():
            a = next((a for a in self._active if a.row is row), None)
            if exc is not None:
                if a is not None:
                    self._fail(a, f"{fault(exc)}: this request failed; the server goes on")
            elif a is not None:
                a.job.mark("kept")

    def _busy(self) -> bool:
        return not self._jobs.empty() or self._closing.is_set()

    def _admit(self) -> None:
        """Drop rows whose client left, take waiting requests into free slots (block only when
        idle), then prefill joining prompts: whole when no row is active, else at most
        `prefill_per_step` tokens before the next step (a long prompt joins over several steps)."""
        for a in [a for a in self._active if a.job.cancelled.is_set()]:
            self._finish(a, "cancelled")
        drop_cancelled(self._jobs, self.metrics)  # a waiting client that left is answered now, not at its turn
        for entry in [e for e in self._joining if e[0].cancelled.is_set()]:
            self._joining.remove(entry)
            entry[0].out.put(("done", cancelled_unstarted(entry[0], self.metrics)))  # its handler logs it and returns
            self._count("specpipe_requests_total", status="cancelled")
        while len(self._active) + len(self._joining) < self.max_batch:
            job = self._next_job()
            if job is None:
                break
            if job.cancelled.is_set():
                job.out.put(("done", cancelled_unstarted(job, self.metrics)))
                self._count("specpipe_requests_total", status="cancelled")
                continue
            try:
                joining = self.decoder.begin(job.prompt_ids, job.max_tokens, job.seed, k=job.k, **job.sampling)
            except Exception as exc:
                self._reject(job, exc)
                continue
            job.mark("begun")
            self._joining.append((job, joining, time.perf_counter()))
        self._prefill_joining()

    def _next_job(self) -> Job | None:
        """The oldest held job no joining prompt blocks any more, else the next queued one that none blocks
        (a blocked one is held: at most `max_batch` are), else None. Blocks only when nothing at all runs."""
        for job in self._held:
            if not self._blocked(job):
                self._held.remove(job)
                return job
        while len(self._held) < self.max_batch:
            idle = not self._active and not self._joining and not self._held
            try:
                job = self._jobs.get(timeout=IDLE_POLL_S) if idle else self._jobs.get_nowait()
            except queue.Empty:
                return None
            self._gauge("specpipe_queue_length", self._jobs.qsize())
            if not self._blocked(job):
                return job
            job.mark("held")
            self._held.append(job)
        return None

    def _blocked(self, job: Job) -> bool:
        """Whether a joining prompt that is prefilling them itself shares at least `prefix_wait_tokens` leading
        tokens with this job's: once it joins, the store holds them and this job prefills only the rest."""
        if not self.prefix_wait_tokens or job.cancelled.is_set():
            return False
        n = self.prefix_wait_tokens
        head = job.prompt_ids[:n]
        # a joining prompt the store already gave those tokens to blocks nothing: they are stored
        return len(head) == n and any(j.prompt_ids[:n] == head and a.reused < n for j, a, _ in self._joining)

    def _prefill_joining(self) -> None:
        budget = self.prefill_per_step if self._active and self.prefill_per_step > 0 else None
        for entry in list(self._joining):
            job, joining, admitted = entry
            if budget is not None and budget <= 0:
                break
            n = joining.todo if budget is None else min(budget, joining.todo)
            try:
                joining.prefill(n)
            except Exception as exc:  # e.g. a prompt longer than the context: this job only
                self._joining.remove(entry)
                self._reject(job, exc)
                continue
            if budget is not None:
                budget -= n
            if joining.done:
                self._joining.remove(entry)
                job.mark("prefilled")
                try:
                    row = self.decoder.join(joining)
                except BatchLost as exc:  # the batch's storage failed: every row left it
                    self._reject(job, exc)
                    self._fail_batch(f"{exc}: every request in the batch failed")
                    continue
                except Exception as exc:  # e.g. its drafter's prefill or state: this job only, the batch untouched
                    self._reject(job, exc)
                    continue
                job.mark("joined")
                self._active.append(Active(job, row, admitted, AnswerStream(job)))

    def _reject(self, job: Job, exc: Exception) -> None:
        job.out.put(("error", f"{fault(exc)}: this request failed; the server goes on"))
        self._count("specpipe_requests_total", status="error")

    def _emit(self, a: Active, step) -> None:
        for event in step.events:
            if isinstance(event, Emitted) and event.token_ids:
                self._timed(a, len(event.token_ids))
            a.answer.consume(event)  # a stop string ends the row below: its later tokens are not the answer
        if a.answer.stopped or step.row.finished:
            self._finish(a, "stop" if a.answer.stopped or step.row.finished == "eos" else "length")

    def _timed(self, a: Active, tokens: int) -> None:
        """/metrics: TTFT at a request's first tokens, the gap since its last ones after that."""
        now = time.perf_counter()
        if a.last_emit is None:
            a.job.mark("first_token")
            self._observe("specpipe_ttft_seconds", now - a.job.submitted)
        else:
            self._observe("specpipe_inter_token_seconds", now - a.last_emit)
        a.last_emit = now
        if self.metrics:
            self.metrics.emitted(tokens)

    def _finish(self, a: Active, reason: str) -> None:
        result = a.row.result()  # its figures (core/finish.py), read while it still holds its row of the batch
        self.decoder.remove([a.row])
        self._active.remove(a)
        self._idle.follow(a.row.budget)  # the context it reached is priced by a timed curve next time
        a.answer.finished = result
        if reason == "cancelled":
            mark_end(a.job, self.metrics)
        figures = answer_figures(result.stats, batched=True) | {"timeline": a.job.timeline}
        a.answer.finish(reason, len(a.row.prompt_ids), figures, a.started - a.job.submitted)
        self._count("specpipe_requests_total", status="cancelled" if reason == "cancelled" else "ok")
        self._observe("specpipe_request_seconds", time.perf_counter() - a.job.submitted)
        self._count("specpipe_drafted_tokens_total", result.stats.drafted)
        self._count("specpipe_accepted_tokens_total", result.stats.accepted)

    def _fail(self, a: Active, message: str) -> None:
        """One row ends with an error: it leaves the batch, the others go on."""
        if a in self._active:  # else its ending had begun (_finish)
            self._active.remove(a)
        a.job.out.put(("error", message))
        self._count("specpipe_requests_total", status="error")
        self.decoder.remove([a.row])  # raises only if the batch's storage failed: the thread then stops

    def _fail_batch(self, message: str) -> None:
        """Every active row ends with an error and the batch is emptied: a step or a join that failed part-way
        leaves its storage in a state nobody knows. Requests still joining keep their own solo caches."""
        for a in list(self._active):
            a.job.out.put(("error", message))
            self._count("specpipe_requests_total", status="error")
        self._active.clear()
        self.decoder.clear()  # raises only if even that fails: the thread then stops (_loop)

    # ------------------------------------------------------------------ metrics (optional)

    def _log_step(self, report) -> None:
        self._steps += 1
        if self.log_step is None:
            return
        decisions = [_decision(r) for r in report.rows]  # each row's own budget planned its K
        self.log_step(
            {
                "step": self._steps,
                "batch": report.batch,
                "k": max((d["k"] for d in decisions), default=0),
                "reason": ",".join(sorted({d["reason"] for d in decisions})),
                "rows": decisions,
                "positions": report.positions,
                "drafted": sum(r.drafted for r in report.rows),
                "accepted": sum(r.accepted for r in report.rows),
                "emitted": sum(len(r.token_ids) for r in report.rows),
                "draft_s": round(report.draft_s, 6),
                "verify_s": round(report.verify_s, 6),
            }
        )

    def _record_step(self, report, k: int) -> None:
        self._gauge("specpipe_batch_size", report.batch)
        self._gauge("specpipe_draft_k", k)
        self._count("specpipe_steps_total")
        self._count("specpipe_batch_rows_total", report.batch)

    def _count(self, name: str, value: float = 1.0, **labels) -> None:
        if self.metrics:
            self.metrics.count(name, value, **labels)

    def _gauge(self, name: str, value: float) -> None:
        if self.metrics:
            self.metrics.set(name, value)

    def _observe(self, name: str, seconds: float) -> None:
        if self.metrics:
            self.metrics.observe(name, seconds)


def _decision(step) -> dict:
    """One row's budget decision for the step log: K, why, and the rates it used (a fixed K: its K alone)."""
    d = step.decision
    if d is None:
        return {"k": step.drafted, "reason": "fixed"}
    return msgspec.structs.asdict(d)
