"""`specpipe-chat serve.url=...`: ServerSource against a real `specpipe-serve` (tiny random model, ngram drafter).

The events' text equals the same server's non-streamed answer, the steps' events carry the
stream's token ids and roles (`specpipe.ids`), each answer ends with RunFinished (usage figures in
its stats), a stop ends the answer early, and an unreachable server is one line and exit 2.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from specpipe.events import Emitted, RunFinished, RunStarted
from tests.test_server import Server, open_stream
from tests.test_tui import answers, wait_for
from tui.app import ChatApp
from tui.cli import parse_flags, web_command
from tui.server_source import ServerSource, ServerUnavailable, check_server, parse_url

# Repetitive text gives the ngram drafter something to accept, so from_draft is not always 0.
PROMPT = "one two three one two three one two three one two three"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("chat-serve"), "model=tiny-random", "draft=ngram", "budget.k=4")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(timeout=30)


def stream_tokens(server: Server, prompt: str) -> list[dict]:
    """The `specpipe.ids` entries ({"id", "role", "step", "text"}) of a raw streamed request, in order."""
    status, conn, resp = open_stream(server, prompt, 24)
    assert status == 200
    tokens = []
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            tokens += json.loads(line[6:]).get("specpipe", {}).get("ids", [])
    conn.close()
    return tokens


def test_events_follow_the_servers_answer_and_draft_flags(server):
    model = check_server(server.base)
    source = ServerSource(server.base, model)
    messages = [{"role": "user", "content": PROMPT}]
    events = list(source.generate(messages, SimpleNamespace(stop_requested=False, k=None)))

    assert isinstance(events[0], RunStarted) and events[0].target.name == model
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.stop_reason in ("eos", "max_tokens")
    whole = server.chat(PROMPT)
    assert finished.text == whole["choices"][0]["message"]["content"]
    assert finished.stats.generated_tokens == whole["usage"]["completion_tokens"] == len(finished.token_ids)
    assert finished.stats.prompt_tokens == whole["usage"]["prompt_tokens"]

    emitted = [e for e in events if isinstance(e, Emitted)]
    assert "".join(e.text for e in emitted) == finished.text
    # Greedy decoding is deterministic: a second streamed request carries the same tokens, steps and roles.
    tokens = stream_tokens(server, PROMPT)
    assert [(i, e.step) for e in emitted for i in e.token_ids] == [(t["id"], t["step"]) for t in tokens]
    assert [e.from_draft for e in emitted] == [
        sum(t["role"] == "accepted" for t in tokens if t["step"] == e.step) for e in emitted
    ]
    assert sum(e.from_draft for e in emitted) == finished.stats.accepted > 0  # the repetition was drafted


def test_a_stop_ends_the_answer_and_frees_the_servers_slot(server):
    # A long answer (4000 tokens of the tiny model take seconds): the stop lands while the server still streams.
    source = ServerSource(server.base, check_server(server.base), max_tokens=4000)
    control = SimpleNamespace(stop_requested=False, k=None)
    events = []
    for event in source.generate([{"role": "user", "content": PROMPT}], control):
        events.append(event)
        if isinstance(event, Emitted):
            control.stop_requested = True
    emitted = [e for e in events if isinstance(e, Emitted)]
    assert len(emitted) == 1
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason == "stopped"
    assert events[-1].text == emitted[0].text
    deadline = time.monotonic() + 30
    while "client_disconnected" not in (server.log.read_text() if server.log.exists() else ""):
        assert time.monotonic() < deadline, "the server did not see the client leave"
        time.sleep(0.1)


async def test_the_app_chats_through_the_server_with_drafts_highlighted(server):
    app = ChatApp(ServerSource(server.base, check_server(server.base)))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*PROMPT, "enter")
        await wait_for(pilot, lambda: app.control is None and answers(app))
        (answer,) = answers(app)
        assert answer.text == server.chat(PROMPT)["choices"][0]["message"]["content"]
        assert {"accepted", "rejected"} <= {p.kind for p in answer.transcript.pieces}  # as a local chat shows
        assert app.messages[-1] == {"role": "assistant", "content": answer.text}
        # the side panel shows the server's drafter, K and the answer's acceptance, not "-"
        rows = dict(app.figures.rows())
        assert (rows["drafter"], rows["budget"], rows["K"]) == ("ngram", "fixed(k=4)", "4")
        assert rows["acceptance"].startswith(f"{app.figures._finished.acceptance_rate:.0%} (")
        assert rows["tok/forward"] == f"{app.figures._finished.tokens_per_forward:.2f}" != "0.00"


def test_an_unreachable_server_is_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "tui.cli", "serve.url=http://127.0.0.1:9"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "cannot reach http://127.0.0.1:9" in lines[0] and "specpipe-serve" in lines[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve.url=ftp://x:8000"], "base URL"),
        (["serve.url=http://127.0.0.1:8000", "draft=ngram"], "drop draft=ngram"),
    ],
)
def test_bad_serve_urls_are_one_line_and_exit_2(argv, words):
    result = subprocess.run([sys.executable, "-m", "tui.cli", *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr


def test_serve_url_is_a_chat_flag_and_travels_to_the_web_command():
    flags = parse_flags(["--web", "serve.url=http://127.0.0.1:8000"])
    assert flags.serve_url == "http://127.0.0.1:8000" and flags.rest == []
    assert web_command(flags).endswith("-m tui.cli serve.url=http://127.0.0.1:8000")


def test_parse_url_names_host_and_port():
    assert parse_url("http://127.0.0.1:8000/") == ("127.0.0.1", 8000)
    with pytest.raises(ServerUnavailable, match="base URL"):
        parse_url("127.0.0.1:8000")


def test_a_served_budget_label_gives_the_panels_k():
    from tui.figures import served_k

    assert (served_k("fixed(k=4)"), served_k("auto(k_max=16)"), served_k("server")) == ("4", "auto <= 16", "")
