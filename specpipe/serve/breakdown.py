"""When a decoding worker's thread cannot go on: say so once, answer everyone at once, never hang.

Contract: each worker (serve/worker.py, serve/batch_worker.py) owns one `Breakdown`. `put(jobs, job)` queues a
request unless the thread has stopped (then `WorkerStopped`: the HTTP layer's immediate 503 with one line);
`stop(exc, jobs)` records why the thread ends, answers every queued job with that line as its error, and prints
it once on stderr. Both happen under one lock, so no request is queued after the last drain and waits
forever. A failure the worker can contain (one request's, one step's) never comes here: only what leaves its
state unknown. Never touches HTTP or a model.
"""

from __future__ import annotations

import queue
import sys
import threading

STOPPED = "the server's decoding thread stopped"  # every stopped-worker message starts so (HTTP: 503)


class WorkerStopped(Exception):
    """The decoding thread has stopped: nothing queued now would ever be answered."""


class QueueFull(Exception):
    """More requests wait than the server was configured to hold."""


def fault(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Breakdown:
    """Why a worker's thread stopped (None while it runs), and the queue's door that closes with it."""

    def __init__(self, tool: str = "specpipe-serve"):
        self.tool = tool
        self.reason: str | None = None
        self._lock = threading.Lock()

    def put(self, jobs: queue.Queue, job, full: str) -> None:
        """Queue `job`; `full`: the QueueFull line when the queue is full.

        Raises:
            WorkerStopped: the thread has stopped (its reason, one line).
            QueueFull: `jobs` is full.
        """
        with self._lock:
            if self.reason is not None:
                raise WorkerStopped(self.reason)
            try:
                jobs.put_nowait(job)
            except queue.Full:
                raise QueueFull(full) from None

    def stop(self, exc: BaseException, jobs: queue.Queue) -> str:
        """Record why the thread cannot go on (returned as the line every job in flight gets), answer the jobs
        still queued with it, and print it on stderr."""
        with self._lock:
            self.reason = (
                f"{STOPPED} after an internal error ({fault(exc)}): no request can be answered; "
                f"restart {self.tool} (requests.jsonl names the requests it failed)"
            )
            while True:
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job.out.put(("error", self.reason))
        print(f"{self.tool}: error: {self.reason}", file=sys.stderr, flush=True)
        return self.reason
