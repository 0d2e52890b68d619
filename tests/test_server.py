"""`specpipe-serve` over real HTTP: a real server process, a real client (urllib), the packaged SmolLM2.

Greedy answers through speculative decoding equal the same server's model decoding alone
(draft=none), for concurrent requests too; streaming concatenates to the whole answer; stop
strings cut; bad requests are one-line 400s; SIGTERM exits 143 with every request logged.
Traffic goes to 127.0.0.1 only, a handful of bounded requests.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

PROMPTS = [
    "Rename the variable `items` to `values`:\n\ndef total(items):\n    return sum(item for item in items)",
    "Add a docstring:\n\ndef square(x):\n    return x * x",
    "Write the word hello three times.",
]


class Server:
    def __init__(self, cwd: Path, *overrides: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specpipe.serve.cli", "port=0", "max_tokens=24", *overrides],
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()  # the start line names the port
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.base = f"http://127.0.0.1:{match.group(1)}"
        self.log = Path(line.rsplit("requests -> ", 1)[1].strip())

    def post(self, path: str, body: dict, timeout: float = 300):
        req = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read().decode()
                return resp.status, raw
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def chat(self, prompt: str, **extra) -> dict:
        status, raw = self.post("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **extra})
        assert status == 200, raw
        return json.loads(raw)

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


@pytest.fixture(scope="module")
def servers(tmp_path_factory, smollm2_gguf):
    cwd = tmp_path_factory.mktemp("serve")
    spec = Server(cwd, "draft=ngram", "budget.k=8")
    plain = Server(cwd, "draft=none")
    yield spec, plain
    for s in (spec, plain):
        if s.proc.poll() is None:
            s.proc.kill()


def test_concurrent_speculative_answers_equal_plain_decoding(servers):
    spec, plain = servers
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(spec.chat, PROMPTS))
    for prompt, answer in zip(PROMPTS, answers):
        alone = plain.chat(prompt)
        assert answer["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]
    assert sum(a["specpipe"]["accepted"] for a in answers) > 0  # speculation really happened
    assert all(a["specpipe"]["batched"] for a in answers)


def test_streaming_concatenates_to_the_whole_answer(servers):
    spec, _ = servers
    whole = spec.chat(PROMPTS[0])["choices"][0]["message"]["content"]
    status, raw = spec.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}], "stream": True}
    )
    assert status == 200
    events = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and "usage" in chunks[-1]


def test_stop_string_and_plain_completions(servers):
    spec, plain = servers
    whole = plain.chat(PROMPTS[0])["choices"][0]["message"]["content"]
    stop = whole[5:8]
    cut = spec.chat(PROMPTS[0], stop=[stop])
    assert cut["choices"][0]["message"]["content"] == whole[: whole.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
    status, raw = spec.post("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 8})
    text_spec = json.loads(raw)["choices"][0]["text"]
    status2, raw2 = plain.post("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 8})
    assert status == status2 == 200 and text_spec == json.loads(raw2)["choices"][0]["text"]


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/chat/completions", {"messages": []}, "messages is empty"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature=-1"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p=0"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens=0"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "unknown role"),
        ("/v1/completions", {"prompt": 3}, "invalid request"),
        ("/v1/nothing", {}, "no route"),
        ("/v1/completions", {"prompt": "w " * 9000, "max_tokens": 8}, "context is 8192 tokens"),
        ("/v1/completions", {"prompt": "w " * 6000, "max_tokens": 4096}, "past smollm2-135m's context of 8192"),
    ],
)
def test_bad_requests_are_one_line(servers, path, body, words):
    spec, _ = servers
    status, raw = spec.post(path, body)
    assert status in (400, 404)
    message = json.loads(raw)["error"]["message"]
    assert words in message and "\n" not in message


@pytest.fixture(scope="module")
def small(tmp_path_factory, smollm2_gguf):
    """Two batch slots and a queue of four: more clients than slots wait, more than that get 429."""
    server = Server(tmp_path_factory.mktemp("small"), "draft=ngram", "budget.k=8", "max_batch=2", "max_queue=4")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()


def open_stream(server: Server, prompt: str, max_tokens: int, **extra):
    """A streaming chat request; returns (status, connection, response) with the body unread."""
    host, port = server.base.rsplit("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens, **extra}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, conn, resp


def metric(server: Server, name: str) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_more_clients_than_slots_wait_then_match_plain_decoding(small, servers):
    _, plain = servers
    prompts = PROMPTS + [PROMPTS[0] + "\n"]  # 4 clients, 2 slots
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(small.chat, prompts))
    for prompt, answer in zip(prompts, answers):
        assert answer["choices"][0]["message"]["content"] == plain.chat(prompt)["choices"][0]["message"]["content"]
    assert max(a["specpipe"]["queue_s"] for a in answers) > 0.01  # two waited for a slot


def test_a_full_queue_answers_429_and_the_rest_complete(small):
    def one(i):
        status, conn, resp = open_stream(small, PROMPTS[i % 3], 24)
        raw = resp.read().decode()
        conn.close()
        return status, raw

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    statuses = [s for s, _ in results]
    # 2 slots + 4 queued = 6 held at once; a request or two more fit when the worker takes a job
    # off the queue while the burst is still arriving (it prefills the first ones meanwhile)
    assert statuses.count(429) >= 12 - 8 and set(statuses) <= {200, 429}, statuses
    assert all(raw.rstrip().endswith("data: [DONE]") for s, raw in results if s == 200)
    assert "retry later" in next(raw for s, raw in results if s == 429)


def test_a_client_that_disconnects_frees_its_slot(small):
    before = metric(small, 'specpipe_requests_total{status="cancelled"}')
    status, conn, resp = open_stream(small, PROMPTS[0], 2000)
    assert status == 200 and resp.readline().startswith(b"data: ")
    resp.close()  # the socket lives in the response (Connection: close)
    conn.close()
    deadline = time.monotonic() + 60
    while metric(small, 'specpipe_requests_total{status="cancelled"}') <= before:
        assert time.monotonic() < deadline, "the disconnected request was never cancelled"
        time.sleep(0.2)
    assert small.chat(PROMPTS[1])["choices"][0]["finish_reason"] in ("stop", "length")
    records = [json.loads(line) for line in small.log.read_text().splitlines()]
    assert any(r["finish_reason"] == "client_disconnected" for r in records)  # the request is logged too


def test_seeded_sampling_is_reproducible_per_request(small):
    def sample(seed):
        return small.chat(PROMPTS[2], temperature=0.9, seed=seed, max_tokens=16)["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(3) as pool:  # batched together, and with each other's rows
        a, b, c = pool.map(sample, [11, 11, 12])
    assert a == b == sample(11) and c != a


def test_metrics_are_prometheus_text(small):
    small.chat("the cat sat on the mat, the cat sat on the", max_tokens=16)  # its own traffic: it passes alone too
    with urllib.request.urlopen(small.base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE specpipe_ttft_seconds histogram" in text and 'specpipe_ttft_seconds_bucket{le="+Inf"}' in text
    assert metric(small, "specpipe_inter_token_seconds_count") > 0 and metric(small, "specpipe_steps_total") > 0
    assert metric(small, "specpipe_accepted_tokens_total") > 0


@pytest.mark.parametrize(
    "overrides,why",
    [
        (["model.arch=llama4", "draft=ngram"], "a batch holds plain, sliding-window and recurrent layers only"),
    ],
    ids=["chunked-attention-target"],
)
def test_an_unbatchable_server_says_so_and_serves_one_request_at_a_time(tmp_path, overrides, why):
    """Batching is refused in one line at start; batch 1 serves, feeding /metrics and the request log."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.serve.cli", "port=0", "max_tokens=8", "model=tiny-random", *overrides],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        refusal = proc.stderr.readline()
        assert f"{why}" in refusal and refusal.rstrip().endswith("serving one request at a time"), refusal
        start = proc.stderr.readline()
        server = Server.__new__(Server)  # the started process, without starting another
        server.base = "http://127.0.0.1:" + re.search(r"http://127\.0\.0\.1:(\d+)/v1", start).group(1)
        server.log = Path(start.rsplit("requests -> ", 1)[1].strip())
        status, raw = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 8}, timeout=120)
        answer = json.loads(raw)
        assert status == 200 and answer["usage"]["completion_tokens"] > 0 and "batched" not in answer["specpipe"]
        assert server.post("/v1/completions", {"prompt": "hello", "max_tokens": 0})[0] == 400
        assert metric(server, 'specpipe_requests_total{status="ok"}') == 1
        assert metric(server, 'specpipe_requests_total{status="bad_request"}') == 1
        steps = metric(server, "specpipe_steps_total")
        assert steps > 0 and metric(server, "specpipe_batch_rows_total") == steps
        assert metric(server, "specpipe_ttft_seconds_count") == 1
        assert metric(server, "specpipe_generated_tokens_total") == answer["usage"]["completion_tokens"]
        assert metric(server, "specpipe_drafted_tokens_total") == answer["specpipe"]["drafted"]
        records = [json.loads(line) for line in server.log.read_text().splitlines()]
        assert [r["finish_reason"] for r in records] == [answer["choices"][0]["finish_reason"], "bad_request"]
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_stops_with_every_request_logged(servers):
    spec, plain = servers
    for server in (spec, plain):
        code, err = server.stop()
        assert code == 143 and "Traceback" not in err and "stopped (SIGTERM)" in err, err
        lines = [json.loads(line) for line in server.log.read_text().splitlines()]
        answered = [r for r in lines if r["finish_reason"] != "bad_request"]  # a 400 is logged too
        assert answered and all(r["finish_reason"] in ("stop", "length") for r in answered)
        assert len(lines) > len(answered) or server is plain  # test_bad_requests_are_one_line sent them to spec
