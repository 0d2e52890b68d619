"""draft=suffix through specpipe-serve over HTTP (127.0.0.1, tiny llama): every request, batched or alone, drafts
from one history the server shares, so a request that repeats an earlier one's answer drafts it back, and its
`specpipe` field says those drafts came from history; every greedy answer is draft=none's."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tests.test_server import Server

PROMPTS = ["the cat sat on the mat, the cat sat on the", "Quick zephyrs blow, vexing daft Jim", "one two three"]
COMMON = ["model=tiny-random", "max_batch=4", "budget=fixed", "budget.k=8"]


def _complete(server: Server, prompt: str) -> dict:
    status, raw = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 24}, timeout=120)
    assert status == 200, raw
    return json.loads(raw)


def test_requests_share_one_history_through_the_server(tmp_path):
    plain = Server(tmp_path, *COMMON, "draft=none")
    try:
        expected = [_complete(plain, p)["choices"][0]["text"] for p in PROMPTS]
    finally:
        plain.stop()
    server = Server(tmp_path, *COMMON, "draft=suffix")
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # batched rows, each adding its request to the history
            first = list(pool.map(lambda p: _complete(server, p), PROMPTS))
        again = [_complete(server, p) for p in PROMPTS]  # one at a time: drafted from the first round's answers
        with urllib.request.urlopen(server.base + "/metrics", timeout=30) as resp:
            exposed = resp.read().decode()
    finally:
        server.stop()
    assert [a["choices"][0]["text"] for a in first] == expected
    assert [a["choices"][0]["text"] for a in again] == expected
    accepted = [sum(a["specpipe"]["accepted"] for a in answers) for answers in (first, again)]
    assert accepted[1] >= accepted[0] + 30, accepted
    # each answer's `specpipe` field says how much came from history: the repeats' drafts mostly did
    history = [sum(a["specpipe"]["accepted_by_source"].get("history", 0) for a in got) for got in (first, again)]
    assert history[1] >= 20 and history[1] > history[0], (history, [a["specpipe"] for a in again])
    # /metrics says what the history holds: every request's prompt and answer, within draft.store_tokens
    held = {n: float(v) for n, v in re.findall(r"^(specpipe_suffix_history_\w+) (\S+)$", exposed, re.M)}
    assert held["specpipe_suffix_history_sequences"] == 2 * len(PROMPTS), held
    assert 0 < held["specpipe_suffix_history_tokens"] <= 200_000, held
