"""The batching decoding thread: up to `max_batch` requests decoded together, the rest queued.

Contract: same interface as `GenerationWorker` (`submit`, `waiting`, `close`; pieces on each
job's own queue: ("delta", Delta), then ("done", Finished) or ("error", message)). Between two
steps it drops rows whose client left or whose stop string appeared, admits waiting requests
(each prefilled alone, `prefill_per_step` prompt tokens between two steps while other rows
decode, then a row of the batch), asks the budget for one K for the whole batch and runs one
`BatchDecoder.step`. A full queue raises QueueFull (HTTP 429). Never touches HTTP.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specpipe.serve.worker import (
    SHUTTING_DOWN,
    Finished,
    Job,
    QueueFull,
    cancelled_unstarted,
    drop_cancelled,
    first_stop,
    mark_end,
)

IDLE_POLL_S = 0.2  # how often an idle worker looks at its close flag


@dataclass
class Delta:
    """A piece of text for the client, with how many tokens it took and how many were accepted drafts."""

    text: str
    tokens: int = 0
    from_draft: int = 0


@dataclass
class Active:
    """A job being decoded: its row and what has been streamed of it."""

    job: Job
    row: Any  # batch.decoder.Row
    started: float
    hold: int  # characters held back: a stop string may still be forming
    text: str = ""
    sent: int = 0
    stopped: bool = False
    first_token: float | None = None
    last_emit: float | None = None
    pending_tokens: int = 0
    pending_draft: int = 0
    intervals: list[float] = field(default_factory=list)


class BatchWorker:
    def __init__(
        self,
        decoder,
        budget,
        max_batch: int = 8,
        max_waiting: int = 16,
        metrics=None,
        log_step=None,
        prefill_per_step: int = 0,
    ):
        """
        Args:
            log_step: record -> None, one dict per step (the budget's decision, batch, positions, seconds).
            prefill_per_step: prompt tokens of joining requests prefilled between two decode steps
                while other rows are active (0: a joining prompt is prefilled whole, stalling them).
        """
        self.decoder, self.budget, self.max_batch = decoder, budget, max_batch
        self.metrics = metrics
        self.log_step = log_step
        self.prefill_per_step = prefill_per_step
        self._steps = 0
        self._joining: list[tuple[Job, Any, float]] = []  # (job, batch.decoder.Joining, admitted at)
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=max_waiting)
        self._active: list[Active] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specpipe-batch", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull(
                f"{self._jobs.maxsize} requests are already waiting for one of {self.max_batch} batch slots"
            ) from None
        self._gauge("specpipe_queue_length", self._jobs.qsize())

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
        while not self._closing.is_set():
            self._admit()
            if not self._active:
                continue
            try:
                k = self.budget.next_k(len(self._active))
                if self.budget.hindsight_k:  # a plain step: the drafters still learn, looking back
                    self.budget.observe_hindsight(self.decoder.look_back(self.budget.hindsight_k))
                report = self.decoder.step(k)
            except Exception as exc:  # a failed step fails its rows, not the server
                self._fail_all(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            self.budget.observe(report)
            self._record_step(report, k)
            self._log_step(report)
            for step in report.rows:
                self._emit(step)
        for a in list(self._active):
            self._finish(a, "cancelled")
        for job, _, _ in self._joining:
            job.out.put(("error", SHUTTING_DOWN))
        while True:
            try:
                self._jobs.get_nowait().out.put(("error", SHUTTING_DOWN))
            except queue.Empty:
                break

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
            idle = not self._active and not self._joining
            try:
                job = self._jobs.get(timeout=IDLE_POLL_S) if idle else self._jobs.get_nowait()
            except queue.Empty:
                break
            self._gauge("specpipe_queue_length", self._jobs.qsize())
            if job.cancelled.is_set():
                job.out.put(("done", cancelled_unstarted(job, self.metrics)))
                self._count("specpipe_requests_total", status="cancelled")
                continue
            try:
                joining = self.decoder.begin(job.prompt_ids, job.max_tokens, job.seed, **job.sampling)
            except Exception as exc:
                self._reject(job, exc)
                continue
            self._joining.append((job, joining, time.perf_counter()))
        self._prefill_joining()

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
                row = self.decoder.join(joining)
                hold = max((len(s) for s in job.stop), default=1) - 1
                self._active.append(Active(job, row, admitted, hold))

    def _reject(self, job: Job, exc: Exception) -> None:
        job.out.put(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        self._count("specpipe_requests_total", status="error")

    def _emit(self, step) -> None:
        a = next(a for a in self._active if a.row is step.row)
        now = time.perf_counter()
        if step.token_ids:
            if a.first_token is None:
                a.first_token = now
                self._observe("specpipe_ttft_seconds", now - a.job.submitted)
            elif a.last_emit is not None:
                a.intervals.append(now - a.last_emit)
                self._observe("specpipe_inter_token_seconds", now - a.last_emit)
            a.last_emit = now
            if self.metrics:
                self.metrics.emitted(len(step.token_ids))
        a.pending_tokens += len(step.token_ids)
        a.pending_draft += step.from_draft
        a.text += "".join(step.texts)
        cut = first_stop(a.text, a.job.stop)
        if cut is not None:
            a.text, a.stopped = a.text[:cut], True
        safe = len(a.text) if cut is not None or step.row.finished else max(a.sent, len(a.text) - a.hold)
        if safe > a.sent:
            a.job.out.put(("delta", Delta(a.text[a.sent : safe], a.pending_tokens, a.pending_draft)))
            a.sent, a.pending_tokens, a.pending_draft = safe, 0, 0
        if a.stopped or step.row.finished:
            self._finish(a, "stop" if a.stopped or step.row.finished == "eos" else "length")

    def _finish(self, a: Active, reason: str) -> None:
        self.decoder.remove([a.row])
        self._active.remove(a)
        row, now = a.row, time.perf_counter()
        tokens = len(row.output)
        decode_s = (now - a.first_token) if a.first_token else 0.0
        stats = {
            "drafted": row.drafted,
            "accepted": row.accepted,
            "acceptance_rate": row.accepted / row.drafted if row.drafted else 0.0,
            "tokens_per_forward": tokens / row.steps if row.steps else 0.0,
            "target_forwards": row.steps,
            "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0,
            "ttft_s": (a.first_token - a.started) if a.first_token else 0.0,
            "batched": True,
        }
        if reason == "cancelled":
            mark_end(a.job, self.metrics)
        if len(a.text) > a.sent and reason != "cancelled":
            a.job.out.put(("delta", Delta(a.text[a.sent :], a.pending_tokens, a.pending_draft)))
        a.job.out.put(
            (
                "done",
                Finished(
                    text=a.text,
                    finish_reason=reason,
                    prompt_tokens=len(row.prompt_ids),
                    completion_tokens=tokens,
                    stats=stats,
                    queue_s=a.started - a.job.submitted,
                ),
            )
        )
        self._count("specpipe_requests_total", status="cancelled" if reason == "cancelled" else "ok")
        self._observe("specpipe_request_seconds", now - a.job.submitted)
        self._count("specpipe_drafted_tokens_total", row.drafted)
        self._count("specpipe_accepted_tokens_total", row.accepted)

    def _fail_all(self, message: str) -> None:
        for a in list(self._active):
            a.job.out.put(("error", message))
            self._count("specpipe_requests_total", status="error")
        self.decoder.remove([a.row for a in self._active])
        self._active.clear()

    # ------------------------------------------------------------------ metrics (optional)

    def _log_step(self, report) -> None:
        self._steps += 1
        if self.log_step is None:
            return
        self.log_step(
            {
                "step": self._steps,
                **self.budget.decision,
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
