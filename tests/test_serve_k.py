"""A request's own K (`"specpipe": {"k": N}` beside the OpenAI fields, issue 39): real servers on 127.0.0.1
(tiny random model, n-gram drafts), one request at a time and batched. K = 0 decodes plainly, K = 1 drafts at
most one token a step, both give the answer the server's own budget gives (greedy is lossless whatever K is),
a K out of range is a 400 naming the range, and `specpipe-chat serve.url=...` sends the K its keys set."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specpipe.core.pipeline import RunControl
from specpipe.events import Drafted, RunFinished
from tests.test_serve_events import PROMPT, stream_completion, streamed_tokens
from tests.test_server import Server
from tui.server_source import ServerSource


def _server(tmp_path_factory, name: str, *overrides: str):
    server = Server(tmp_path_factory.mktemp(name), "model=tiny-random", "draft=ngram", "budget.k=4", *overrides)
    yield server
    server.proc.kill()
    server.proc.wait(timeout=30)


@pytest.fixture(scope="module", params=["max_batch=1", "max_batch=4"], ids=["one-at-a-time", "batched"])
def server(request, tmp_path_factory):
    yield from _server(tmp_path_factory, "k-" + request.param.replace("=", ""), request.param)


def drafted_per_step(tokens: list[dict], rejected: list[dict]) -> Counter:
    """How many tokens each step drafted: its accepted ones plus its rejected ones."""
    per_step: Counter = Counter()
    for t in tokens:
        per_step[t["step"]] += t["role"] == "accepted"
    for r in rejected:
        per_step[r["step"]] += len(r["ids"])
    return per_step


def run(server: Server, k: int | None) -> tuple[list[dict], list[dict], str]:
    extra = {} if k is None else {"specpipe": {"k": k}}
    chunks, last = stream_completion(server, PROMPT, 32, **extra)
    rejected = [r for c in chunks for r in c["specpipe"].get("rejected") or []]
    tokens = streamed_tokens(chunks)
    return tokens, rejected, "".join(t["text"] for t in tokens)


def test_a_requests_k_sets_its_drafts_and_keeps_its_answer(server):
    budget_tokens, budget_rejected, budget_text = run(server, None)
    assert max(drafted_per_step(budget_tokens, budget_rejected).values()) > 1  # the server's K = 4 drafts

    plain_tokens, plain_rejected, plain_text = run(server, 0)
    assert {t["role"] for t in plain_tokens} == {"plain"} and not plain_rejected

    one_tokens, one_rejected, one_text = run(server, 1)
    assert max(drafted_per_step(one_tokens, one_rejected).values()) == 1

    assert plain_text == one_text == budget_text
    assert [t["id"] for t in plain_tokens] == [t["id"] for t in one_tokens] == [t["id"] for t in budget_tokens]


@pytest.mark.parametrize("k", [-1, 65, "four"])
def test_a_k_out_of_range_is_one_line(server, k):
    status, raw = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "specpipe": {"k": k}})
    assert status == 400
    message = json.loads(raw)["error"]["message"]
    assert "specpipe.k" in message and "\n" not in message


def test_the_served_chat_sends_its_k(server):
    source = ServerSource(server.base, "tiny-random", max_tokens=24)
    messages = [{"role": "user", "content": PROMPT}]
    answers = {}
    for k in (None, 0):
        events = list(source.generate(messages, RunControl(k=k)))
        answers[k] = events[-1]
        assert isinstance(answers[k], RunFinished) and answers[k].stop_reason != "error"
        drafted = sum(len(e.draft_ids) for e in events if isinstance(e, Drafted))
        assert (drafted == 0) == (k == 0)
    assert answers[0].text == answers[None].text
