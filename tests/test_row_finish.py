"""One finish for every row: a served request's record carries the figures a CLI run's summary.json does.

The same greedy request (tiny random llama, a byte-level tokenizer, n-gram drafts at a fixed K) runs once
through `specpipe` (summary.json) and once through `specpipe-serve` with continuous batching and with
batch 1 (requests.jsonl and the HTTP answer), real processes and a real HTTP client on 127.0.0.1. Its
answer is cut by max_tokens inside a multi-byte character, so the detokenizer holds bytes back at the
end: every path gives the text its token ids decode to, to the last byte, and the same RunStats figures
(KV bytes and rollback figures included; only clocks and memory peaks differ between processes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from specpipe.events import RunStats
from tests.test_server import Server

PROMPT = "the cat sat on the mat"
MAX_TOKENS = 24  # the tiny llama's answer then ends with two bytes of an unfinished character
COMMON = ["model=tiny-random", "draft=ngram", "budget=fixed", "budget.k=4"]
TIMED = {  # clocks and process-wide peaks: never equal between two processes
    "prefill_tok_s",
    "prefill_s",
    "draft_prefill_s",
    "draft_s",
    "decode_tok_s",
    "ttft_s",
    "wall_s",
    "latency_ms",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "rollback_time_s",
}
FIELDS = [f for f in RunStats.__struct_fields__ if f not in TIMED]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cli") / "run"
    cmd = [sys.executable, "-m", "specpipe.cli", *COMMON, "prompt.chat=false", f"prompt.text={PROMPT}"]
    done = subprocess.run(
        [*cmd, f"max_tokens={MAX_TOKENS}", f"hydra.run.dir={out}"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())


def _served(cwd, *overrides: str) -> tuple[str, dict]:
    server = Server(cwd, *COMMON, *overrides)
    try:
        status, raw = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_TOKENS}, timeout=120)
        assert status == 200, raw
        record = json.loads(server.log.read_text().splitlines()[-1])
    finally:
        server.stop()
    return json.loads(raw)["choices"][0]["text"], record


def test_the_cli_answer_ends_inside_a_character_and_keeps_its_bytes(cli_run):
    from specpipe.engine.load.tiny import byte_tokenizer

    decoded = byte_tokenizer().decode(cli_run["tokens"])
    assert cli_run["stop_reason"] == "max_tokens" and len(cli_run["tokens"]) == MAX_TOKENS
    assert decoded.endswith("\ufffd")  # the last bytes start a character that never came
    assert cli_run["text"] == decoded


@pytest.mark.parametrize("max_batch", [8, 1])
def test_a_served_record_carries_the_cli_runs_figures_and_text(cli_run, max_batch, tmp_path):
    text, record = _served(tmp_path, f"max_batch={max_batch}")
    assert text == cli_run["text"]  # to the last byte
    stats = cli_run["stats"]
    missing = [f for f in RunStats.__struct_fields__ if f not in record]
    assert not missing, f"requests.jsonl lacks {missing}"
    # a batched row's target rollback is the batch's mask; batch 1 rolls back with the run's strategy
    same = [f for f in FIELDS if f != "rollback_strategy" or max_batch == 1]
    assert {f: record[f] for f in same} == {f: stats[f] for f in same}
    assert record["kv_bytes"] > 0 and record["rollback_strategy"] == (
        "mask" if max_batch > 1 else stats["rollback_strategy"]
    )
    msgspec.convert({f: record[f] for f in RunStats.__struct_fields__}, RunStats)  # the record's figures type-check
