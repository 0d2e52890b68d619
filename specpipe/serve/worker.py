"""One thread owns the Session and decodes queued requests one at a time (batch 1).

`GenerationWorker(session).submit(job)` queues a `Job`; the worker runs the pipeline for it and
puts `("delta", Delta)` pieces, then one `("done", Finished)` (or `("error", message)`) on the
job's own queue, so an HTTP thread can stream them; the pieces are built from the run's events
by `answer.AnswerStream`, as the batching worker builds its rows' (one delta type for both). It
feeds `/metrics` as the batching worker does (steps, batch size 1, K, tokens, TTFT, inter-token
gaps, outcomes). With nothing queued it times budget=auto's long-context curves (serve/idle.py),
one forward between two looks at the queue. A request whose generation raises is that request's error (each
`Session.generate` builds its pipeline anew, so the next one starts sound); anything else that raises in the
thread stops it through its `breakdown.Breakdown`: queued requests get that one line, later ones a
`WorkerStopped` (HTTP 503) at once, `failure` says why (/health). Never touches HTTP.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from specpipe.serve.answer import AnswerStream, Finished, answer_figures
from specpipe.serve.breakdown import Breakdown, QueueFull, WorkerStopped, fault
from specpipe.serve.idle import IdleRefinement

__all__ = ["SHUTTING_DOWN", "Finished", "GenerationWorker", "Job", "QueueFull", "WorkerStopped"]


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    out: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client went away
    submitted: float = field(default_factory=time.perf_counter)
    seed: int | None = None  # this request's sampling seed (None: the server's)
    sampling: dict = field(default_factory=dict)  # this request's temperature= / top_p= (batched serving)
    k: int | None = None  # this request's fixed K (the body's specpipe.k); None: the server's budget plans
    end_step: float | None = None  # the server's step count when the worker ended it cancelled (/metrics)
    # requests.jsonl's `timeline`, where a request's time to first token went, in seconds since `submitted`:
    # received (negative: the body read, the chat template, tokenizing), then in the batching worker held, begun,
    # prefilled, joined, first_token, kept (its prompt in the prefix store), and sent (its first chunk handed to
    # the HTTP layer, streamed answers)
    timeline: dict[str, float] = field(default_factory=dict)

    def mark(self, moment: str) -> None:
        """Stamp `moment` once, in seconds since the job was submitted."""
        self.timeline.setdefault(moment, round(time.perf_counter() - self.submitted, 4))


def mark_end(job: Job, metrics) -> None:
    """Stamp a cancelled job with the step it ended at (the HTTP layer logs how many steps ran
    after it saw the client leave, without counting its own lag in hearing of the end)."""
    if metrics is not None:
        job.end_step = metrics.value("specpipe_steps_total")


def cancelled_unstarted(job: Job, metrics=None) -> Finished:
    """What a job whose client left before it was decoded ends with: nothing generated."""
    mark_end(job, metrics)
    return Finished("", "cancelled", len(job.prompt_ids), 0, {}, time.perf_counter() - job.submitted)


SHUTTING_DOWN = "the server is shutting down"


def drop_cancelled(jobs: queue.Queue, metrics=None) -> None:
    """End the waiting jobs whose client left, now (not when a slot frees): each gets its
    cancelled ending, so its handler logs it at once. Called by the decoding thread between steps."""
    with jobs.mutex:
        left = [j for j in jobs.queue if j is not None and j.cancelled.is_set()]
        for job in left:
            jobs.queue.remove(job)
        if left:
            jobs.not_full.notify(len(left))
    for job in left:
        job.out.put(("done", cancelled_unstarted(job, metrics)))
        if metrics:
            metrics.count("specpipe_requests_total", status="cancelled")


class GenerationWorker:
    per_request_sampling = False  # one session sampler: a request's temperature must be the server's

    def __init__(self, session, max_waiting: int, metrics=None, log=None):
        """`log`: record -> None (requests.jsonl): what an idle refinement timed."""
        self.session = session
        self.metrics = metrics
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_waiting)
        self._closing = threading.Event()
        self._breakdown = Breakdown()
        self._current: Job | None = None  # the request the thread took, until it is answered
        # the session's one budget decodes every request: its curve is refined in place
        curve = session.budget.context_curve  # budget=auto's; None for budgets that do not price
        self._idle = IdleRefinement(session.target, log, curve)
        self._thread = threading.Thread(target=self._loop, name="specpipe-generate", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a request. Raises QueueFull (HTTP 429) or WorkerStopped (HTTP 503)."""
        self._breakdown.put(self._jobs, job, f"{self._jobs.maxsize} requests are already waiting")
        if self.metrics:
            self.metrics.set("specpipe_queue_length", self._jobs.qsize())

    def alive(self) -> bool:
        """Whether the decoding thread still runs (False once it ended: /health is then 503)."""
        return self._thread.is_alive()

    @property
    def failure(self) -> str | None:
        """Why the decoding thread stopped (one line), None while it runs or after a clean close."""
        return self._breakdown.reason

    def waiting(self) -> int:
        return self._jobs.qsize()

    def close(self, timeout: float = 30) -> None:
        """Stop at the next step: the request being decoded ends as cancelled, waiting ones get an error."""
        self._closing.set()
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the decoding thread

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # outside any one request's handling: the thread cannot tell what state it left
            reason = self._breakdown.stop(exc, self._jobs)
            if self._current is not None:  # taken off the queue, not yet answered
                self._current.out.put(("error", reason))
                if self.metrics:
                    self.metrics.count("specpipe_requests_total", status="error")

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                if self._closing.is_set():
                    return
                self._idle.run(self._busy)  # a request that comes meanwhile waits one forward at most
                continue
            if job is None:
                return
            self._current = job
            self._answer(job)
            self._current = None

    def _answer(self, job: Job) -> None:
        """One request from the queue: refused at shutdown, ended if its client left, else generated."""
        if self._closing.is_set():
            job.out.put(("error", SHUTTING_DOWN))
            return
        if job.cancelled.is_set():
            job.out.put(("done", cancelled_unstarted(job, self.metrics)))
            if self.metrics:
                self.metrics.count("specpipe_requests_total", status="cancelled")
            return
        if self.metrics:
            self.metrics.set("specpipe_queue_length", self._jobs.qsize())
        try:
            self._run(job)
        except Exception as exc:  # one request's failure must not stop the server: each generate starts anew
            job.out.put(("error", f"{fault(exc)}: this request failed; the server goes on"))
            if self.metrics:
                self.metrics.count("specpipe_requests_total", status="error")

    def _busy(self) -> bool:
        return not self._jobs.empty() or self._closing.is_set()

    def _run(self, job: Job) -> None:
        from specpipe.core.pipeline import RunControl
        from specpipe.events import Drafted, Emitted, Verified

        started = time.perf_counter()
        control = RunControl(k=job.k)
        answer = AnswerStream(job)
        meter = _Meter(self.metrics, job.submitted)
        if job.seed is not None:  # this thread owns the session: the request's seed for this generation
            self.session.sampler.seed = job.seed
        for event in self.session.generate(job.prompt_ids, max_tokens=job.max_tokens, control=control):
            if job.cancelled.is_set() or self._closing.is_set():
                control.stop_requested = True
            if isinstance(event, Drafted):
                meter.drafted(event.k)
            elif isinstance(event, Verified):
                meter.step()
                drop_cancelled(self._jobs, self.metrics)  # a waiting client that left hears it now
            elif isinstance(event, Emitted):
                meter.emitted(len(event.token_ids))
            if answer.consume(event):
                control.stop_requested = True  # a stop string: the rest of this step is discarded
        finished = answer.finished
        if finished is None:  # pragma: no cover - the pipeline always ends with RunFinished
            job.out.put(("error", "the run ended without a result"))
            return
        reason = {"eos": "stop", "max_tokens": "length"}.get(finished.stop_reason, "stop")
        if job.cancelled.is_set() or self._closing.is_set():
            reason = "cancelled"
            mark_end(job, self.metrics)
        s = finished.stats
        meter.finished("cancelled" if reason == "cancelled" else "ok", s.drafted, s.accepted)
        answer.finish(reason, len(job.prompt_ids), answer_figures(s), started - job.submitted)


class _Meter:
    """One request's figures into `/metrics` (None: no metrics), the batching worker's names at B = 1."""

    def __init__(self, metrics, submitted: float):
        self.metrics, self.submitted = metrics, submitted
        self.last: float | None = None  # when this request's previous tokens were emitted

    def drafted(self, k: int) -> None:
        if self.metrics:
            self.metrics.set("specpipe_draft_k", k)

    def step(self) -> None:
        if self.metrics:
            self.metrics.set("specpipe_batch_size", 1)
            self.metrics.count("specpipe_steps_total")
            self.metrics.count("specpipe_batch_rows_total")

    def emitted(self, tokens: int) -> None:
        if not self.metrics or not tokens:
            return
        now = time.perf_counter()
        if self.last is None:
            self.metrics.observe("specpipe_ttft_seconds", now - self.submitted)
        else:
            self.metrics.observe("specpipe_inter_token_seconds", now - self.last)
        self.last = now
        self.metrics.emitted(tokens)

    def finished(self, status: str, drafted: int, accepted: int) -> None:
        if self.metrics:
            self.metrics.count("specpipe_requests_total", status=status)
            self.metrics.observe("specpipe_request_seconds", time.perf_counter() - self.submitted)
            self.metrics.count("specpipe_drafted_tokens_total", drafted)
            self.metrics.count("specpipe_accepted_tokens_total", accepted)
