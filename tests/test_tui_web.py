"""`specpipe-chat --web`: the HTTP level, everywhere (page and script served,
the websocket runs the chat and streams its answer). No browser needed; the
real-browser test is tests/test_tui_browser.py."""

from __future__ import annotations

import json
import time
import urllib.error
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


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc: the apps textual-serve started, their `sh`)."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":  # a zombie has ended
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:

    left = set()
    for pid in pids:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                left.add(pid)
        except OSError:
            pass
    return left


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "http://evil.example"}, {"Host": "evil.example"}, {"Origin": "null"}],
    ids=["foreign-origin", "foreign-host", "null-origin"],
)
async def test_web_refuses_a_foreign_origin_or_host_and_starts_no_app(recording, headers):
    with web_server("--replay", str(recording), "--speed", "0") as url:
        request = urllib.request.Request(url + "/", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as ws_refused:
                await http.ws_connect(url.replace("http", "ws") + "/ws", headers=headers)
            assert ws_refused.value.status == 403
            # this machine's page (its own origin, any loopback spelling) still gets in
            same = {"Origin": url.replace("127.0.0.1", "localhost")}
            async with http.ws_connect(url.replace("http", "ws") + "/ws", headers=same) as ws:
                await ws.send_str(json.dumps(["ping", "1"]))
                assert "specpipe-chat" in await read_until(ws, ["specpipe-chat"], timeout_s=45)
        time.sleep(0.5)
        assert len(descendants(LAST["process"].pid)) <= 2  # only the allowed tab's app (and its sh), if still up


def test_the_web_page_may_not_be_framed(recording):
    """Any site could show the --web page in a hidden frame (each one starts an app and loads a model) or under
    its own clicks; every answer, a refusal included, now forbids framing."""
    with web_server("--replay", str(recording), "--speed", "0") as url:
        with urllib.request.urlopen(url + "/", timeout=10) as page:
            headers = page.headers
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url + "/", headers={"Origin": "http://evil.example"}))
    for answer in (headers, refused.value.headers):
        assert answer["Content-Security-Policy"] == "frame-ancestors 'none'", dict(answer)
        assert answer["X-Frame-Options"] == "DENY"


async def test_a_tab_that_leaves_during_start_up_ends_its_app(recording):
    with web_server("--replay", str(recording), "--speed", "0") as url:
        server = LAST["process"].pid
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url.replace("http", "ws") + "/ws?width=80&height=24")
            assert wait_for(lambda: descendants(server), 10), "no app process started"
            apps = descendants(server)
            await ws.close()  # before the app has drawn anything
        assert wait_for(lambda: not alive(apps), 15), f"app processes left: {alive(apps)}"


async def test_sigterm_to_the_server_ends_every_app(recording):
    import os
    import signal

    with web_server("--replay", str(recording)) as url:
        server = LAST["process"]
        async with aiohttp.ClientSession() as http:
            tabs = [await http.ws_connect(url.replace("http", "ws") + "/ws") for _ in range(2)]
            await tabs[0].send_str(json.dumps(["ping", "1"]))
            await read_until(tabs[0], ["specpipe-chat"], timeout_s=45)  # one app up, one perhaps still starting
            apps = descendants(server.pid)
            assert apps
            os.kill(server.pid, signal.SIGTERM)  # the server only, not its process group
            assert server.wait(timeout=30) == 143
            for ws in tabs:
                await ws.close()
        assert wait_for(lambda: not alive(apps), 10), f"app processes outlived the server: {alive(apps)}"


# like an app still loading its model: reads no "quit", ignores SIGTERM
IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
STUBBORN_APP = f"python -c '{IGNORES_SIGTERM}'"


async def test_an_app_that_ignores_quit_and_sigterm_is_killed_with_its_tab_and_with_the_server(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from web_helpers import ROOT, free_port

    port = free_port()
    serve = f"s = LocalServer({STUBBORN_APP!r}, port={port}); s.serve(); raise SystemExit(s.exit_code)"
    code = "from tui.web import LocalServer; " + serve
    server = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"ws://127.0.0.1:{port}/ws"
    try:
        async with aiohttp.ClientSession() as http:
            assert wait_for(lambda: _answers(port), 20), "the web server did not start"
            left = await http.ws_connect(url)
            assert wait_for(lambda: descendants(server.pid), 10)
            first = descendants(server.pid)
            stays = await http.ws_connect(url)
            assert wait_for(lambda: descendants(server.pid) - first, 10)
            second = descendants(server.pid) - first
            await left.close()
            assert wait_for(lambda: not alive(first), 15), f"the left tab's app survived: {alive(first)}"
            assert alive(second)
            os.kill(server.pid, signal.SIGTERM)
            assert server.wait(timeout=30) == 143
            await stays.close()
        assert not alive(second), f"an app outlived the server: {alive(second)}"
    finally:
        for pid in alive(descendants(server.pid)):
            os.kill(pid, signal.SIGKILL)
        server.kill()
        server.wait()


def _answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
        return True
    except OSError:
        return False
