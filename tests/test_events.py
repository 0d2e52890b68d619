"""Events are a file format: every kind round-trips; a recorded run replays
into the same statistics."""

from __future__ import annotations

import msgspec
import pytest
from conftest import generate, make_drafter, tiny

from specpipe.events import EVENT_TYPES, Event, EventWriter, read_events
from specpipe.metrics import StatsCollector


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    target = tiny("qwen2")
    target.prefill_chunk = 8  # a prompt of several chunks: PrefillProgress events too
    prompt = target.encode_prompt("one two one two one two", chat=False)
    _, final, events, _ = generate(target, make_drafter("ngram", target), 6, prompt, 40)
    path = tmp_path_factory.mktemp("rec") / "events.jsonl"
    with EventWriter(path) as w:
        for e in events:
            w.write(e)
    return path, events, final


def test_every_kind_round_trips(recorded):
    _, events, _ = recorded
    kinds = {type(e) for e in events}
    assert kinds >= set(EVENT_TYPES) - {
        __import__("specpipe.events").events.RunError,
        __import__("specpipe.events").events.RunStarted,
        __import__("specpipe.events").events.DraftPrefilled,  # a draft model's only (tests/test_first_token.py)
    }
    for e in events:
        assert msgspec.json.decode(msgspec.json.encode(e), type=Event) == e


def test_replay_reproduces_the_run(recorded):
    path, events, final = recorded
    replayed = read_events(path)
    assert replayed == events
    collector = StatsCollector()
    for e in replayed:
        collector.consume(e)
    assert collector.token_ids == final.token_ids
    again = collector.stats(final.stats.draft_forwards, final.stats.peak_memory_bytes)
    for field in (
        "generated_tokens",
        "steps",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tokens_per_forward",
        "ttft_s",
        "latency_ms",
    ):
        assert getattr(again, field) == getattr(final.stats, field), field
