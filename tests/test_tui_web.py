"""`specpipe-chat --web`: the HTTP level, everywhere (page and script served,
the websocket runs the chat and streams its answer). No browser needed; the
real-browser test is tests/test_tui_browser.py."""

from __future__ import annotations

import json
import time
import urllib.request

import aiohttp
import pytest
from tui_script import scripted_events
from web_helpers import LAST, terminal_text, web_server

from specpipe.events import EventWriter
from tui.cli import Flags, web_command


@pytest.fixture
def recording(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    for event in scripted_events():
        writer.write(event)
    writer.close()
    return path


def test_web_command_runs_this_cli_without_the_web_flags():
    command = web_command(Flags(web=True, port=9000, replay="a b.jsonl", speed=0, rest=["x=1"]))
    assert command.endswith("-m tui.cli --replay 'a b.jsonl' --speed 0 x=1") and "--web" not in command


async def read_until(ws, words: list[str], timeout_s: float) -> str:
    """Collect the app's terminal output until every word shows (or the time is up)."""
    data, deadline = b"", time.monotonic() + timeout_s
    while not all(w in terminal_text(data) for w in words) and time.monotonic() < deadline:
        try:
            message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            break
        if message.type == aiohttp.WSMsgType.BINARY:
            data += message.data
        elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            break
    return terminal_text(data)


async def closes(ws, timeout_s: float) -> bool:
    """Drain the last frames; True once the server closes the socket."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return True
    return False


async def test_web_serves_the_page_and_the_websocket_runs_the_chat(recording):
    with web_server("--replay", str(recording), "--speed", "0") as url:
        page = urllib.request.urlopen(url + "/", timeout=10).read().decode()
        assert "textual-terminal" in page and 'data-session-websocket-url="ws://127.0.0.1:' in page
        assert urllib.request.urlopen(url + "/static/js/textual.js", timeout=10).status == 200

        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url.replace("http", "ws") + "/ws?width=100&height=30") as ws:
                await ws.send_str(json.dumps(["ping", "1"]))
                shown = await read_until(ws, ["specpipe-chat", "return a + b", "# done"], timeout_s=45)
                assert "specpipe-chat" in shown and "return a + b" in shown and "# done" in shown, shown[-500:]
                await ws.send_str(json.dumps(["stdin", "\x11"]))  # Ctrl+Q: the app quits and the socket closes
                assert await closes(ws, timeout_s=20)


def test_web_refuses_bad_arguments_before_serving(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--web", "--replay", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "cannot read" in result.stderr


def test_web_stops_on_sigint_and_sigterm_with_their_exit_codes(recording):
    import os
    import signal

    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        with web_server("--replay", str(recording)) as url:
            os.kill(LAST["process"].pid, sig)
            assert LAST["process"].wait(timeout=20) == code, url


def test_web_refuses_a_port_in_use(recording):
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "tui.cli", "--web", "--port", str(port), "--replay", str(recording)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "in use" in result.stderr
