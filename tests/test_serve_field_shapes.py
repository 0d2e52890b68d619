"""`specpipe-serve`'s figures in the field's shapes, read over real HTTP from a real server (127.0.0.1, SmolLM2):
llama-server's `timings` (a client written from llama.cpp's tools/server/README.md: plain urllib, reading
`timings.draft_n` / `draft_n_accepted` from a whole response and from the last streamed chunk) and vLLM's
per-request `speculative_decoding`; the `openai` client reads the same answers unchanged."""

from __future__ import annotations

import json

import pytest

from specpipe.events import Verified
from specpipe.serve.field_shapes import DraftTally
from tests.test_server import PROMPTS, Server

TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
TIMINGS |= {"draft_n", "draft_n_accepted"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_gguf):
    s = Server(tmp_path_factory.mktemp("shapes"), "draft=ngram", "budget.k=8")
    yield s
    if s.proc.poll() is None:
        s.proc.kill()


def _ask(server: Server, stream: bool) -> dict:
    """The answer's body (not streamed), or its last chunk before [DONE] (streamed)."""
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 24, "stream": stream}
    status, raw = server.post("/v1/chat/completions", body)
    assert status == 200, raw
    if not stream:
        return json.loads(raw)
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]
    assert all("timings" not in c for c in chunks[:-1])  # llama-server: only the last chunk carries them
    return chunks[-1]


def test_llama_server_timings_streamed_and_not(server):
    whole, last = _ask(server, stream=False), _ask(server, stream=True)
    for answer in (whole, last):
        t = answer["timings"]
        assert TIMINGS <= set(t)
        assert t["draft_n"] == answer["specpipe"]["drafted"] and t["draft_n_accepted"] == answer["specpipe"]["accepted"]
        assert t["predicted_n"] == answer["usage"]["completion_tokens"]
        # llama-server's prompt_n counts the prompt tokens prefilled, cache_n those its cache gave (the second
        # request here repeats the first: all but its last prompt token come from the prefix store)
        assert t["prompt_n"] + t["cache_n"] == answer["usage"]["prompt_tokens"]
        assert t["cache_n"] == answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 < t["draft_n_accepted"] <= t["draft_n"] and t["predicted_ms"] > 0 and t["prompt_ms"] > 0
    assert (whole["timings"]["cache_n"], last["timings"]["prompt_n"]) == (0, 1)
    # greedy and one request at a time: the same drafts, whichever way the answer travelled
    assert whole["timings"]["draft_n_accepted"] == last["timings"]["draft_n_accepted"]


def test_vllm_speculative_decoding_summary(server):
    answer = _ask(server, stream=False)
    sd, t = answer["speculative_decoding"], answer["timings"]
    assert sd["num_draft_tokens"] == t["draft_n"] and sd["num_accepted_tokens"] == t["draft_n_accepted"]
    assert sum(sd["num_accepted_tokens_per_pos"]) == sd["num_accepted_tokens"]
    assert sd["mean_acceptance_length"] == pytest.approx(1 + sd["num_accepted_tokens"] / sd["num_drafts"])
    assert sd["acceptance_rate"] == pytest.approx(answer["specpipe"]["acceptance_rate"])
    rates = sd["acceptance_rate_per_pos"]
    assert len(rates) == len(sd["num_accepted_tokens_per_pos"]) and all(0 <= r <= 1 for r in rates)


def test_the_openai_client_reads_the_same_answers(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    plain = _ask(server, stream=False)
    assert reply.choices[0].message.content == plain["choices"][0]["message"]["content"]
    assert reply.usage.completion_tokens == plain["usage"]["completion_tokens"]
    assert (reply.model_extra or {})["timings"]["draft_n"] == plain["timings"]["draft_n"]
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == plain["choices"][0]["message"]["content"]


def test_draft_tally_counts_positions():
    tally = DraftTally()
    tally.count(Verified(step=1, accepted_ids=[1, 2], rejected_ids=[3], recovered_id=9, seconds=0.0))
    tally.count(Verified(step=2, accepted_ids=[], rejected_ids=[4, 5], recovered_id=8, seconds=0.0))
    tally.count(Verified(step=3, accepted_ids=[], rejected_ids=[], recovered_id=7, seconds=0.0))  # plain step
    sd = tally.speculative_decoding()
    assert (sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"]) == (2, 5, 2)
    assert sd["num_accepted_tokens_per_pos"] == [1, 1, 0] and sd["acceptance_rate_per_pos"] == [0.5, 0.5, 0.0]
    assert sd["mean_acceptance_length"] == 2.0
