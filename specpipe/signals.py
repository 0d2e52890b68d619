"""Stop signals handled like Ctrl-C in every command: SIGINT, SIGTERM, SIGHUP
(and a closed stdout pipe) all raise KeyboardInterrupt in the main thread,
so the one code path that keeps what was generated serves them all.

Contract: `install()` once per process (console scripts call it first); the
exit code of an interrupted command is `exit_code()` (130 SIGINT, 143
SIGTERM, 129 SIGHUP, 141 broken pipe); `deferred()` holds a signal back
while a file is being written, so a checkpoint or summary is never cut in
half by the stop it is recording. A signal that was ignored when the process
started (nohup, a background job) stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

STOP_SIGNALS: dict[int, str] = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
BROKEN_PIPE = 13  # SIGPIPE's number: the exit code convention for "the reader went away" (128 + 13)

_received: int | None = None  # the first stop signal (or BROKEN_PIPE) this process got
_defer_depth = 0
_pending = False  # a signal arrived inside deferred(): raise when the outermost block ends
_raised = False  # KeyboardInterrupt already raised once: later signals are recorded, not raised again


def install() -> None:
    """Route SIGINT / SIGTERM / SIGHUP to KeyboardInterrupt (main thread only)."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # nohup / background jobs asked for this one to be ignored
        signal.signal(signum, _handle)


def _handle(signum, frame) -> None:
    global _received, _pending, _raised
    if _received is None:
        _received = signum
    if _defer_depth:
        _pending = True
        return
    if not _raised:
        _raised = True
        raise KeyboardInterrupt


def note_broken_pipe() -> None:
    """stdout's reader went away: silence stdout and stop like a signal would."""
    global _received, _raised
    if _received is None:
        _received = BROKEN_PIPE
    _raised = True  # the caller raises KeyboardInterrupt itself
    try:  # later writes (and the interpreter's final flush) go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


@contextmanager
def deferred(then_raise: bool = True):
    """Hold stop signals back inside the block; raise KeyboardInterrupt once it ends
    (only recorded, for `exit_code()`, when `then_raise` is False: the work is done anyway)."""
    global _defer_depth, _pending, _raised
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
    if not _defer_depth and _pending:
        _pending = False
        if then_raise and not _raised:
            _raised = True
            raise KeyboardInterrupt


def received() -> int | None:
    return _received


def name() -> str:
    """What stopped the process, for messages: "SIGTERM", "a closed stdout pipe", ... ("Ctrl-C" by default)."""
    if _received == BROKEN_PIPE:
        return "a closed stdout pipe"
    if _received in (None, signal.SIGINT):
        return "Ctrl-C (SIGINT)"
    return STOP_SIGNALS.get(_received, f"signal {_received}")


def exit_code() -> int:
    """128 + the signal's number, as shells report it; 130 when it was a plain KeyboardInterrupt."""
    return 128 + (_received or signal.SIGINT)


def reset() -> None:
    """Forget what was received (tests, and a process that goes on after handling one)."""
    global _received, _pending, _raised
    _received, _pending, _raised = None, False, False
