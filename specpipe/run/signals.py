"""Stop signals handled like Ctrl-C in every command: SIGINT, SIGTERM, SIGHUP
(and a closed stdout pipe) all raise KeyboardInterrupt in the main thread,
so the one code path that keeps what was generated serves them all.

Contract: `install()` once per process (console scripts call it first); the
exit code of an interrupted command is `exit_code()` (130 SIGINT, 143
SIGTERM, 129 SIGHUP, 141 broken pipe, 74 any other failed stdout write:
a full disk, an I/O error); `deferred()` holds a signal back
while a file is being written, so a checkpoint or summary is never cut in
half by the stop it is recording (and while Hydra starts, whose parser would
turn it into a multi-line error or swallow it). No stop is lost: every signal
raises outside `deferred()`, and `check()` raises at the next load or step
boundary one whose KeyboardInterrupt was swallowed. A signal that was ignored
when the process started (nohup, a background job) stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

STOP_SIGNALS: dict[int, str] = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
BROKEN_PIPE = 13  # SIGPIPE's number: the exit code convention for "the reader went away" (128 + 13)
STDOUT_FAILED = -1  # stdout could not be written (ENOSPC, EIO, ...): no signal number, so a code of its own
EXIT_STDOUT_FAILED = 74  # sysexits.h EX_IOERR: "an error occurred while doing I/O on some file"

_received: int | None = None  # the first stop signal (or BROKEN_PIPE) this process got
_defer_depth = 0
_pending = False  # a signal arrived inside deferred(): raise when the outermost block ends
_raised = False  # KeyboardInterrupt already raised once: later signals are recorded, not raised again
_stdout_error = ""  # strerror of the failed stdout write, for name()


def install() -> None:
    """Route SIGINT / SIGTERM / SIGHUP to KeyboardInterrupt (main thread only)."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # nohup / background jobs asked for this one to be ignored
        signal.signal(signum, _handle)
    if sys.unraisablehook is not _quiet_unraisable:
        global _default_unraisable
        _default_unraisable = sys.unraisablehook
        sys.unraisablehook = _quiet_unraisable


_default_unraisable = sys.unraisablehook


def _quiet_unraisable(unraisable) -> None:
    """A stop signal that lands inside a finalizer (a `__del__`, a weakref callback) raises there, where Python
    can only print "Exception ignored ... Traceback" and go on: the stop is recorded, `check()` raises it at the
    next boundary, so that KeyboardInterrupt is not news and the user gets the one line, not a traceback."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received is not None:
        return
    _default_unraisable(unraisable)


def _handle(signum, frame) -> None:
    global _received, _pending, _raised
    if _received is None:
        _received = signum
    if _defer_depth:
        _pending = True
        return
    # every signal raises, a second one too: the first KeyboardInterrupt may have been swallowed (C code,
    # a library's bare except) and the user's next Ctrl-C / SIGTERM must still stop the command
    _raised = True
    raise KeyboardInterrupt


def check() -> None:
    """At a boundary (the task's start, a model load, a decoding step): a stop received but never acted on
    (its KeyboardInterrupt swallowed where it landed) is raised here, so no stop is lost."""
    if _received is not None and not _defer_depth:
        raise KeyboardInterrupt


@contextmanager
def undeferred():
    """Signals raise again inside the block even within `deferred()` (the task Hydra calls, inside the deferred
    start); one that waited is raised at the block's start by `check()`."""
    global _defer_depth, _pending
    depth, _defer_depth = _defer_depth, 0
    _pending = False
    try:
        yield
    finally:
        _defer_depth = depth


def note_stdout_lost(exc: OSError) -> None:
    """stdout cannot be written (its reader went away, or a full disk / an I/O error behind a redirect):
    silence stdout and stop like a signal would. The caller raises KeyboardInterrupt itself."""
    global _received, _raised, _stdout_error
    if _received is None:
        _received = BROKEN_PIPE if isinstance(exc, BrokenPipeError) else STDOUT_FAILED
        _stdout_error = exc.strerror or str(exc)
    _raised = True
    try:  # later writes (and the interpreter's final flush) go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class GuardedStdout:
    """sys.stdout for printing we do not own (Hydra's --help, --cfg job): a write that fails stops the
    command as a closed pipe does (KeyboardInterrupt after `note_stdout_lost`), so the shell's one line
    and exit code (141, 74) answer it instead of Hydra's traceback."""

    def __init__(self, real):
        self._real = real

    def write(self, text: str) -> int:
        try:
            return self._real.write(text)
        except OSError as exc:
            note_stdout_lost(exc)
            raise KeyboardInterrupt from None

    def flush(self) -> None:
        try:
            self._real.flush()
        except OSError as exc:
            note_stdout_lost(exc)
            raise KeyboardInterrupt from None

    def __getattr__(self, name: str):
        return getattr(self._real, name)


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


def stdout_lost() -> bool:
    """True once stdout could not be written (a closed pipe, a full disk): output was lost."""
    return _received in (BROKEN_PIPE, STDOUT_FAILED)


def name() -> str:
    """What stopped the process, for messages: "SIGTERM", "a closed stdout pipe", ... ("Ctrl-C" by default)."""
    if _received == BROKEN_PIPE:
        return "a closed stdout pipe"
    if _received == STDOUT_FAILED:
        return f"a failed write to stdout ({_stdout_error})"
    if _received in (None, signal.SIGINT):
        return "Ctrl-C (SIGINT)"
    return STOP_SIGNALS.get(_received, f"signal {_received}")


def exit_code() -> int:
    """128 + the signal's number, as shells report it; 130 when it was a plain KeyboardInterrupt;
    74 when stdout could not be written for another reason than a closed pipe."""
    # CPython remembers a KeyboardInterrupt that escaped an exec() of source text (a dataclass or namedtuple
    # being built when the signal landed) and kills itself with SIGINT at exit, whatever code it exits with
    # (-2 where 143 was due); each exec() of text resets that flag, so a trivial one makes our code stand.
    exec("None", {})  # noqa: S102
    if _received == STDOUT_FAILED:
        return EXIT_STDOUT_FAILED
    return 128 + (_received or signal.SIGINT)


def reset() -> None:
    """Forget what was received (tests, and a process that goes on after handling one)."""
    global _received, _pending, _raised, _stdout_error
    _received, _pending, _raised, _stdout_error = None, False, False, ""
