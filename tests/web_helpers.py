"""Start `specpipe-chat --web` on a free 127.0.0.1 port for a test, and stop it.

Every request the tests make goes to 127.0.0.1, bounded in count and time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(rb"\x1b(?:\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78])")


LAST: dict = {}  # the latest server process, for tests that signal it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def web_server(*args: str, startup_s: float = 30.0):
    """`python -m tui.cli --web --port P *args` in its own process group; yields the base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "--web", "--port", str(port), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    LAST["process"] = process
    try:
        deadline = time.monotonic() + startup_s
        while True:
            assert process.poll() is None, (
                f"the web server exited: {process.stdout.read().decode(errors='replace')[-2000:]}"
            )
            try:
                urllib.request.urlopen(url + "/", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the web server did not answer in time"
                time.sleep(0.25)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # the server and the app processes it started
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        process.stdout.close()


def terminal_text(data: bytes) -> str:
    """What a terminal stream writes, escape sequences removed (text of one line stays contiguous)."""
    return ANSI.sub(b"", data).decode("utf-8", errors="replace")
