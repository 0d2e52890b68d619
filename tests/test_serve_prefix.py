"""`specpipe-serve` with its prefix store, over real HTTP (a real server process on 127.0.0.1, the packaged SmolLM2,
urllib and the `openai` client): a second turn that resends the first turn and its answer takes them from the store
(`usage.prompt_tokens_details.cached_tokens`, the `specpipe` field, llama-server's `timings.cache_n`) and answers
exactly as SmolLM2 decoding the whole prompt alone does (draft=none, no store); `/metrics` counts what the answers
reported. One server for the module, a handful of bounded requests."""

from __future__ import annotations

import json

import pytest

from specpipe.drafters.none import NoneDrafter
from tests.conftest import generate
from tests.test_server import Server, metric

MAX_TOKENS = 16
DOC = (
    "The Harbour Line runs from Quayside to Northgate in 24 minutes. A single ticket costs 2.10 for up to three "
    "stations and 3.40 for a longer trip; a day pass costs 7.50. Trains run every 6 minutes at peak times."
)
FIRST = [{"role": "user", "content": f"{DOC}\n\nHow long is the trip from Quayside to Northgate?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_gguf):
    s = Server(tmp_path_factory.mktemp("prefix"), "draft=ngram", "budget.k=8", f"max_tokens={MAX_TOKENS}")
    yield s
    if s.proc.poll() is None:
        s.proc.kill()


def plain_text(target, messages: list[dict]) -> str:
    """The messages' answer from the target decoding alone, the whole prompt prefilled (no store)."""
    ids = target.encode_messages(messages)
    detok = target.tokenizer.detokenizer
    detok.reset()
    for token in generate(target, NoneDrafter(), 1, ids, MAX_TOKENS)[0]:
        detok.add_token(token)
    detok.finalize()
    return detok.text


def ask(server: Server, path: str, body: dict) -> dict:
    """The whole answer (not streamed), or the streamed one folded into the same shape from its chunks."""
    status, raw = server.post(path, body)
    assert status == 200, raw
    if not body.get("stream"):
        return json.loads(raw)
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]
    text = "".join(c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or "" for c in chunks)
    return chunks[-1] | {"text": text}


def cached(answer: dict) -> int:
    n = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert n == answer["specpipe"]["cached_tokens"] == answer["timings"]["cache_n"]
    assert answer["timings"]["prompt_n"] + n == answer["usage"]["prompt_tokens"]  # llama-server: prefilled + cached
    return n


def test_a_second_turn_reuses_the_first_and_answers_as_plain_decoding(server, smollm2):
    first = ask(server, "/v1/chat/completions", {"messages": FIRST})
    answer = first["choices"][0]["message"]["content"]
    second_turn = [*FIRST, {"role": "assistant", "content": answer}, {"role": "user", "content": "And a day pass?"}]
    second = ask(server, "/v1/chat/completions", {"messages": second_turn})
    # the first turn's prompt at least (its answer too, as far as re-encoding its text gives the same ids)
    assert cached(second) >= first["usage"]["prompt_tokens"] - 1, (cached(second), first["usage"])
    assert second["choices"][0]["message"]["content"] == plain_text(smollm2, second_turn)
    # streamed, the same request again: every prompt token but the last from the store, the same answer
    again = ask(server, "/v1/chat/completions", {"messages": second_turn, "stream": True})
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    assert again["text"] == second["choices"][0]["message"]["content"]


def test_completions_and_the_openai_client_read_cached_tokens(server):
    openai = pytest.importorskip("openai")
    status, raw = server.post("/v1/completions", {"prompt": DOC, "max_tokens": 4})
    assert status == 200, raw
    longer = ask(server, "/v1/completions", {"prompt": DOC + " Trains also run on Sundays.", "stream": True})
    assert cached(longer) >= json.loads(raw)["usage"]["prompt_tokens"] - 1
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model, messages=FIRST, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens > 0


def test_metrics_count_what_the_answers_reported(server):
    # after the tests above (module order): every request's cached tokens, as requests.jsonl logged them
    records = [json.loads(line) for line in server.log.read_text().splitlines()]
    reused = sum(r.get("cached_tokens", 0) for r in records)
    assert reused > 0
    assert metric(server, "specpipe_prefix_cache_tokens_reused_total") == reused
    hits = sum(r.get("cached_tokens", 0) > 0 for r in records)
    assert metric(server, "specpipe_prefix_cache_hits_total") == hits
    assert metric(server, "specpipe_prefix_cache_misses_total") == len(records) - hits
    assert metric(server, "specpipe_prefix_cache_bytes") > 0 and metric(server, "specpipe_prefix_cache_entries") > 0
