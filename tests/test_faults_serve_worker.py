"""A failure inside `specpipe-serve`'s decoding thread, injected into a real server process on 127.0.0.1 (tiny
random model) through the plug-in methods it calls: the n-gram drafter's `prefill` (a row joining the batch)
and `propose` (a step), the batch storage's `keep_rows` (emptying the batch) and the idle refinement's `run`.
Each armed by writing its name into a trigger file, so the same server serves before and after. Rows in
docs/faults.md (the table test in test_faults.py reads this module too)."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve_http import TinyServer

# Runs specpipe-serve with four methods wrapped: each raises while its name is in the trigger file.
FAULTY_SERVER = """
import os, runpy
from pathlib import Path

trigger = Path(os.environ["SPECPIPE_FAULT_TRIGGER"])

def failing(cls, name):
    real = getattr(cls, name)
    def method(self, *args, **kwargs):
        if trigger.exists() and name in trigger.read_text().split():
            raise RuntimeError(f"injected fault in {cls.__name__}.{name}")
        return real(self, *args, **kwargs)
    setattr(cls, name, method)

from specpipe.batch.cache import RaggedBatch
from specpipe.drafters.ngram import NgramDrafter
from specpipe.serve.idle import IdleRefinement

for cls, name in ((NgramDrafter, "prefill"), (NgramDrafter, "propose"), (RaggedBatch, "keep_rows"),
                  (IdleRefinement, "run")):
    failing(cls, name)
runpy.run_module("specpipe.serve.cli", run_name="__main__")
"""


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    # TinyServer starts `python -m specpipe.serve.cli ...`: the same arguments go to the wrapped server
    real_popen = subprocess.Popen

    def popen(args, **kw):
        if args[1:3] == ["-m", "specpipe.serve.cli"]:
            args = [args[0], "-c", FAULTY_SERVER, *args[3:]]
        return real_popen(args, **kw)

    monkeypatch.setattr(subprocess, "Popen", popen)
    servers: list[TinyServer] = []

    def start(*overrides: str) -> TinyServer:
        trigger = tmp_path / "faults"
        server = TinyServer(tmp_path, *overrides, env={"SPECPIPE_FAULT_TRIGGER": str(trigger)})
        server.trigger = trigger  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def arm(server, *names: str) -> None:
    server.trigger.write_text(" ".join(names))


def stream(server, body: dict, timeout: float = 120) -> list[str]:
    """A streamed completion's `data:` payloads, in order."""
    status, _, text = server.request("POST", "/v1/completions", {**body, "stream": True}, timeout=timeout)
    assert status == 200, text
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def one_line_error(body: dict, *parts: str) -> str:
    message = body["error"]["message"]
    assert "\n" not in message and all(p in message for p in parts), message
    return message


def test_a_drafter_fault_fails_only_the_requests_it_touched(faulty):
    """A drafter that raised as its row joined the batch killed the batching thread: that request and every
    later one waited forever while /health said ok. Now the joining request alone gets a 500 (the row decoding
    beside it answers in full, the same text as alone), a step that raises fails its rows (a stream: the error
    chunk, then [DONE]), each is a requests.jsonl record saying why, and the next request is served."""
    server = faulty("draft=ngram", "max_batch=4", "max_tokens_limit=4096", "prefix_cache.enabled=false")
    long_ask = {"prompt": "Count:", "max_tokens": 400}
    with ThreadPoolExecutor(1) as pool:
        beside = pool.submit(server.request, "POST", "/v1/completions", long_ask, None, 180)
        deadline = time.monotonic() + 120
        while server.metric("specpipe_batch_size") < 1:  # it decodes
            assert time.monotonic() < deadline
            time.sleep(0.02)
        arm(server, "prefill")
        status, _, body = server.request("POST", "/v1/completions", {"prompt": "Join:", "max_tokens": 4}, timeout=120)
        assert status == 500, body
        one_line_error(body, "injected fault in NgramDrafter.prefill", "the server goes on")
        arm(server)
        status, _, whole = beside.result(timeout=180)
    assert status == 200 and whole["usage"]["completion_tokens"] > 100, whole  # it decoded on (an EOS may end it)
    status, _, alone = server.request("POST", "/v1/completions", long_ask, timeout=180)
    assert status == 200 and alone["choices"][0]["text"] == whole["choices"][0]["text"]

    arm(server, "propose")
    data = stream(server, {"prompt": "Step:", "max_tokens": 6})
    assert data[-1] == "[DONE]", data
    one_line_error(json.loads(data[-2]), "injected fault in NgramDrafter.propose", "this step failed")
    arm(server)
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "After:", "max_tokens": 6})
    assert status == 200 and body["usage"]["completion_tokens"] == 6, body
    status, _, health = server.request("GET", "/health")
    assert status == 200 and health["status"] == "ok", health
    failed = [r for r in server.records() if r.get("status") == 500]
    assert [r["finish_reason"] for r in failed] == ["error", "error"], server.records()
    assert "NgramDrafter.prefill" in failed[0]["error"] and "NgramDrafter.propose" in failed[1]["error"]


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_worker_that_cannot_go_on_says_so_and_answers_503_at_once(faulty, max_batch):
    """Where the thread itself cannot go on (the batch cannot even be emptied after a failed step; a fault
    outside any request, in the idle refinement), the request in flight got no answer and every later one
    waited forever. Now the one in flight ends with the reason (a stream: error chunk, [DONE]), /health is 503
    naming it, a new request is a 503 at once with that one line, logged, and stderr says it once."""
    fault = "RaggedBatch.keep_rows" if max_batch > 1 else "IdleRefinement.run"
    server = faulty("draft=ngram", f"max_batch={max_batch}", "prefix_cache.enabled=false")
    if max_batch > 1:  # a step fails, then emptying the batch fails too: a request is in flight
        arm(server, "propose", "keep_rows")
        data = stream(server, {"prompt": "Now:", "max_tokens": 6})
        assert data[-1] == "[DONE]", data
        one_line_error(json.loads(data[-2]), "injected fault in NgramDrafter.propose", "this step failed")
    else:  # the idle refinement (between requests) fails
        arm(server, "run")
    deadline = time.monotonic() + 60
    while (status_health := server.request("GET", "/health"))[0] == 200:
        assert time.monotonic() < deadline, status_health
        time.sleep(0.05)
    status, _, health = status_health
    assert status == 503 and health["status"] == "error", health
    assert f"injected fault in {fault}" in health["problems"][0] and "restart specpipe-serve" in health["problems"][0]
    started = time.monotonic()
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "Later:", "max_tokens": 4}, timeout=30)
    assert status == 503 and time.monotonic() - started < 15, body  # no step runs for it: at once, even when busy
    one_line_error(body, "decoding thread stopped", f"injected fault in {fault}", "restart specpipe-serve")
    assert server.records()[-1]["status"] == 503 and server.records()[-1]["finish_reason"] == "unavailable"
    server.proc.terminate()
    _, err = server.proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if "decoding thread stopped" in line]
    assert len(said) == 1 and said[0].startswith("specpipe-serve: error: "), err
