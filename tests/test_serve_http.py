"""`specpipe-serve`'s HTTP edge against a real server process (tiny random model, 127.0.0.1 only):
who may connect (Host, Origin, Content-Type, API key, CORS for allowed_origins), framing refused by
h11, honest endings (a non-streamed client that leaves is cancelled within a few steps; a shutdown
cut is never `stop`), unknown models, fresh seeds, and requests as OpenAI clients send them."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_faults import default_stop_signals


class TinyServer:
    def __init__(self, cwd: Path, *overrides: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specpipe.serve.cli", "port=0", "max_tokens=8", "model=tiny-random", *overrides],
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=default_stop_signals,  # under nohup the server would inherit an ignored SIGHUP and keep it
        )
        line = self.proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port = int(match.group(1))
        self.log = Path(line.rsplit("requests -> ", 1)[1].strip())

    def request(self, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 60):
        """(status, headers, parsed JSON or text) for one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        sent = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, data, {**sent, **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read().decode()
        conn.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        return resp.status, resp.headers, parsed

    def raw(self, data: bytes, timeout: float = 10) -> bytes:
        """The reply to bytes sent as they are (the request asks Connection: close; the socket stays
        open for writing: uvicorn takes a half-close for a client that left)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out

    def metric(self, name: str) -> float:
        _, _, text = self.request("GET", "/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = TinyServer(tmp_path_factory.mktemp("edge"), "draft=none", "max_batch=2", "max_tokens_limit=4096")
    yield s
    s.proc.send_signal(signal.SIGTERM)
    _, err = s.proc.communicate(timeout=60)  # every refusal above was an answer, none a traceback
    assert s.proc.returncode == 143 and "Traceback" not in err and "Error" not in err, err


def one_line(body) -> str:
    message = body["error"]["message"]
    assert "\n" not in message and body["error"]["type"], body
    return message


COMPLETION = {"prompt": "Hi", "max_tokens": 2}


def test_the_issue_reproduction_foreign_host_and_text_plain_is_refused(server):
    status, _, body = server.request(
        "POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "text/plain", "Host": "evil.example"}
    )
    assert status == 400 and "evil.example" in one_line(body)
    status, _, body = server.request("POST", "/v1/completions", COMPLETION, {"Host": f"evil.example:{server.port}"})
    assert status == 400 and "not this server's address" in one_line(body)
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        assert server.request("POST", "/v1/completions", COMPLETION, {"Host": host})[0] == 200


def test_text_plain_and_missing_content_type_are_415(server):
    for kind in ("text/plain", "application/x-www-form-urlencoded", ""):
        status, _, body = server.request("POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": kind})
        assert status == 415 and "application/json" in one_line(body)
    ok = server.request("POST", "/v1/completions", COMPLETION, {"Content-Type": "application/json; charset=utf-8"})
    assert ok[0] == 200


def test_a_foreign_origin_is_403_and_the_same_origin_passes(server):
    status, headers, body = server.request("POST", "/v1/completions", COMPLETION, {"Origin": "http://evil.example"})
    assert status == 403 and "allowed_origins" in one_line(body) and "access-control-allow-origin" not in headers
    same = f"http://127.0.0.1:{server.port}"
    assert server.request("POST", "/v1/completions", COMPLETION, {"Origin": same})[0] == 200
    # a preflight from a page that was not allowed gets no CORS headers: the browser stops there
    status, headers, _ = server.request(
        "OPTIONS",
        "/v1/completions",
        headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"},
    )
    assert status == 403 and "access-control-allow-origin" not in headers


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"5, 6"])
def test_malformed_content_length_is_400(server, length):
    reply = server.raw(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %s\r\n\r\n{}" % (server.port, length)
    )
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


def test_a_chunked_body_is_read_and_a_broken_one_is_400(server):
    body = json.dumps(COMPLETION).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n" % server.port
    good = server.raw(
        head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    assert good.startswith(b"HTTP/1.1 200"), good[:300]
    bad = server.raw(head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400"), bad[:200]


def test_an_unknown_model_is_404_and_the_listed_one_or_its_alias_passes(server):
    status, _, body = server.request("POST", "/v1/completions", {**COMPLETION, "model": "gpt-9"})
    assert status == 404 and body["error"]["code"] == "model_not_found" and "GET /v1/models" in one_line(body)
    listed = server.request("GET", "/v1/models")[2]["data"][0]["id"]
    for name in (listed, "tiny-random"):  # the id /v1/models lists, and the name the server was started with
        assert server.request("POST", "/v1/completions", {**COMPLETION, "model": name})[0] == 200, name


def test_unseeded_samples_draw_fresh_seeds_that_reproduce(server):
    ask = {"prompt": "Once upon", "max_tokens": 12, "temperature": 1.0}
    answers = [server.request("POST", "/v1/completions", ask)[2] for _ in range(3)]
    seeds = [a["specpipe"]["seed"] for a in answers]
    assert len(set(seeds)) == 3, seeds
    assert len({a["choices"][0]["text"] for a in answers}) > 1  # not the same sample every time
    again = server.request("POST", "/v1/completions", {**ask, "seed": seeds[0]})[2]
    assert again["choices"][0]["text"] == answers[0]["choices"][0]["text"] and again["specpipe"]["seed"] == seeds[0]
    assert "seed" not in server.request("POST", "/v1/completions", COMPLETION)[2]["specpipe"]  # greedy: no seed


def test_content_parts_are_the_same_prompt_as_a_string(server):
    def answer(content):
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 6}
        status, _, reply = server.request("POST", "/v1/chat/completions", body)
        assert status == 200, reply
        return reply

    whole = answer("Hello there")
    parts = answer([{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}])
    assert parts["choices"][0]["message"] == whole["choices"][0]["message"]
    assert parts["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "logprobs"),
        ({"prompt": "x", "logprobs": 1}, "logprobs"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "text parts only"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
                    {"role": "tool", "tool_call_id": "1", "content": "42"},
                ]
            },
            "chat template does not render tool_calls / tool",
        ),
    ],
    ids=["logprobs", "top_logprobs", "completion-logprobs", "image-part", "tool-turns"],
)
def test_what_is_not_served_is_one_line_400(server, body, words):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, _, reply = server.request("POST", path, body)
    assert status == 400 and words in one_line(reply)


def test_a_non_streamed_client_that_leaves_is_cancelled_within_a_few_steps(server):
    before = server.metric('specpipe_requests_total{status="cancelled"}')
    body = json.dumps({"prompt": "Count:", "max_tokens": 4000}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (server.port, len(body), body)
    )
    deadline = time.monotonic() + 30
    while server.metric("specpipe_generated_tokens_total") < 20:  # decoding has started
        assert time.monotonic() < deadline
        time.sleep(0.05)
    steps_at_close = server.metric("specpipe_steps_total")
    s.close()
    closed = time.monotonic()
    while server.metric('specpipe_requests_total{status="cancelled"}') <= before:
        assert time.monotonic() - closed < 10, "the left request was never cancelled"
        time.sleep(0.05)
    record = next(r for r in reversed(server.records()) if r.get("finish_reason") == "client_disconnected")
    assert record["stream"] is False and record["completion_tokens"] < 4000
    # plain decoding: one target forward per step; the steps after the close are the ones the
    # metrics read took (a few ms each), not thousands decoded for nobody
    extra = server.metric("specpipe_steps_total") - steps_at_close
    assert extra < 60, extra
    time.sleep(0.3)
    assert server.metric("specpipe_steps_total") - steps_at_close == extra  # nothing decodes after it
    assert server.proc.poll() is None


def test_shutdown_mid_answer_is_never_stop_and_is_logged_cancelled(tmp_path):
    s = TinyServer(tmp_path, "draft=none", "max_batch=2", "max_tokens_limit=4096")
    try:

        def whole():
            return s.request("POST", "/v1/completions", {"prompt": "Count:", "max_tokens": 4000}, timeout=60)

        def streamed():
            status, _, text = s.request(
                "POST", "/v1/completions", {"prompt": "Go:", "max_tokens": 4000, "stream": True}, timeout=60
            )
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            return status, [json.loads(e) for e in events if e != "[DONE]"]

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.submit(whole), pool.submit(streamed)
            deadline = time.monotonic() + 30
            while s.metric("specpipe_batch_size") < 2:  # both decoding
                assert time.monotonic() < deadline
                time.sleep(0.05)
            s.proc.send_signal(signal.SIGTERM)
            status, _, body = a.result(timeout=60)
            status_b, chunks = b.result(timeout=60)
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
        assert body["specpipe"]["cut"] == "shutdown" and body["usage"]["completion_tokens"] < 4000
        assert status_b == 200 and chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
        assert chunks[-1]["specpipe"]["cut"] == "shutdown"
        _, err = s.proc.communicate(timeout=60)
        assert s.proc.returncode == 143 and "Traceback" not in err, err
        assert [r["finish_reason"] for r in s.records()] == ["cancelled", "cancelled"]
    finally:
        s.close()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """allow_remote with a key (from the environment), bound to 127.0.0.1 so that no traffic leaves
    the machine, and one page allowed from another local origin."""
    s = TinyServer(
        tmp_path_factory.mktemp("guarded"),
        "allow_remote=true",
        "allowed_origins=[http://localhost:3000]",
        env={"SPECPIPE_API_KEY": "sk-test-123"},
    )
    yield s
    s.close()


KEY = {"Authorization": "Bearer sk-test-123"}


def test_the_api_key_is_checked_as_a_bearer_token(guarded):
    for headers, why in (({}, "no Authorization header"), ({"Authorization": "Bearer sk-wrong"}, "a wrong API key")):
        status, resp_headers, body = guarded.request("POST", "/v1/completions", COMPLETION, headers)
        assert status == 401 and body["error"]["type"] == "invalid_api_key" and why in one_line(body)
        assert resp_headers["www-authenticate"] == "Bearer"
    assert guarded.request("GET", "/v1/models")[0] == 401
    assert guarded.request("POST", "/v1/completions", COMPLETION, KEY)[0] == 200
    assert guarded.request("GET", "/health")[0] == 200  # a probe needs no key
    assert "sk-test-123" not in guarded.log.read_text()


def test_an_allowed_origin_gets_cors_and_its_preflight(guarded):
    page = "http://localhost:3000"
    status, headers, _ = guarded.request(
        "OPTIONS",
        "/v1/chat/completions",
        headers={
            "Origin": page,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert status == 204 and headers["access-control-allow-origin"] == page
    assert "POST" in headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {
        h.strip().lower() for h in headers["access-control-allow-headers"].split(",")
    }
    status, headers, _ = guarded.request("POST", "/v1/completions", COMPLETION, {"Origin": page, **KEY})
    assert status == 200 and headers["access-control-allow-origin"] == page and headers["vary"] == "Origin"
    status, headers, _ = guarded.request(
        "POST", "/v1/completions", COMPLETION, {"Origin": "http://localhost:3001", **KEY}
    )
    assert status == 403 and "access-control-allow-origin" not in headers


@pytest.mark.parametrize(
    "overrides, env, words",
    [
        (["host=0.0.0.0"], {}, "add allow_remote=true and an api_key="),
        (["host=0.0.0.0", "allow_remote=true"], {"SPECPIPE_API_KEY": ""}, "needs an API key"),
        (["allowed_origins=[localhost:3000]"], {}, "is not an origin"),
    ],
    ids=["remote-without-allow", "remote-without-key", "bad-origin"],
)
def test_a_non_loopback_host_needs_allow_remote_and_a_key(tmp_path, overrides, env, words):
    result = subprocess.run(
        [sys.executable, "-m", "specpipe.serve.cli", "port=0", "model=tiny-random", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr


# A tool-aware template in the shape real ones have (Qwen2.5's, cut to what this test needs):
# assistant tool calls as <tool_call> blocks, tool answers as <tool_response> blocks, tools listed.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>"
    "{{ c.function.name }}({{ c.function.arguments }})</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tool_turns_go_through_a_template_that_renders_them():
    from conftest import tiny

    from specpipe.serve.openai_api import parse_chat
    from specpipe.serve.templates import encode_chat

    target = tiny()
    target.tokenizer.chat_template = TOOL_TEMPLATE
    request = parse_chat(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
                ],
                "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
            }
        ).encode()
    )
    text = target.tokenizer.decode(encode_chat(target, request.messages, request.tools, request.uses_tools))
    assert '<tool_call>weather({"city":"Oslo"})</tool_call>' in text and "<tool_response>-3 C</tool_response>" in text
    assert '"name": "weather"' in text and text.endswith("<|im_start|>assistant\n")


def test_shutdown_cuts_a_batch_1_server_too(tmp_path):
    """The one-request-at-a-time worker (unbatchable targets): the request decoding ends cut
    ("length", cut: shutdown), the one waiting gets a 503 error object, both logged cancelled."""
    s = TinyServer(tmp_path, "draft=none", "max_batch=1", "max_tokens_limit=4096")
    try:
        ask = {"prompt": "Count:", "max_tokens": 4000}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(s.request, "POST", "/v1/completions", ask)
            deadline = time.monotonic() + 30
            while s.metric("specpipe_steps_total") < 5:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            second = pool.submit(s.request, "POST", "/v1/completions", ask)
            while s.metric("specpipe_queue_length") < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            s.proc.send_signal(signal.SIGTERM)
            (status, _, body), (status2, _, body2) = first.result(timeout=60), second.result(timeout=60)
        assert (
            status == 200 and body["choices"][0]["finish_reason"] == "length" and body["specpipe"]["cut"] == "shutdown"
        )
        assert status2 == 503 and "shutting down" in one_line(body2)
        _, err = s.proc.communicate(timeout=60)
        assert s.proc.returncode == 143 and "Traceback" not in err, err
        assert sorted(r["finish_reason"] for r in s.records()) == ["cancelled", "cancelled"]
    finally:
        s.close()


def this_machines_address() -> str | None:
    """A non-loopback address of this machine (the route's source address; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_non_loopback_bind_says_so_and_serves_only_with_the_key(tmp_path):
    address = this_machines_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.serve.cli", "port=0", "max_tokens=4", "model=tiny-random"]
        + [f"host={address}", "allow_remote=true", "api_key=sk-remote-1"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        notice, start = proc.stderr.readline(), proc.stderr.readline()
        assert "listening beyond this machine" in notice and "Authorization: Bearer" in notice, notice + start
        assert "sk-remote-1" not in notice + start
        port = int(re.search(rf"http://{re.escape(address)}:(\d+)/v1", start).group(1))

        def post(headers):
            conn = http.client.HTTPConnection(address, port, timeout=60)  # this machine's own address
            conn.request(
                "POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "application/json", **headers}
            )
            status = conn.getresponse().status
            conn.close()
            return status

        assert post({}) == 401
        assert post({"Authorization": "Bearer sk-remote-1"}) == 200
        assert (
            post({"Authorization": "Bearer sk-remote-1", "Host": "my-box.lan:8000"}) == 200
        )  # any name: the key guards
    finally:
        proc.kill()
        proc.wait()
