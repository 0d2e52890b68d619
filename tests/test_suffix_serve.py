"""draft=suffix through specpipe-serve over HTTP (127.0.0.1, tiny llama): every request, batched or alone, drafts
from one history the server shares, so a request that repeats an earlier one's answer drafts it back; every greedy
answer is draft=none's."""

from __future__ import annotations

import json
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
    finally:
        server.stop()
    assert [a["choices"][0]["text"] for a in first] == expected
    assert [a["choices"][0]["text"] for a in again] == expected
    accepted = [sum(a["specpipe"]["accepted"] for a in answers) for answers in (first, again)]
    assert accepted[1] >= accepted[0] + 30, accepted
