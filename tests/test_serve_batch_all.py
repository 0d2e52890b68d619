"""Every drafter batched through the real server: `specpipe-serve` processes on tiny random llama and qwen3
targets, 4 concurrent requests from real HTTP clients (urllib, 127.0.0.1 only, bounded), each row drafting with
its own drafter (n-gram, a draft model, layer skip, an MTP head, lookahead), sampler and budget.

Greedy: each answer equals that prompt decoded alone by a draft=none server. Seeded sampling: each answer
equals the same request (same seed) sent alone. A streaming client that hangs up mid-answer frees its row:
it is logged cancelled and the next requests are answered in full. Token trees (tree=dynamic: a draft model's,
draft=lookahead's) are rows of the batch too. A Gemma-4 assistant (draft=gemma4_assistant on a tiny gemma4_text
target) reads each row's own target K/V from the batch, chains and trees.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.test_server import Server, metric

PROMPTS = [
    "the cat sat on the mat, the cat sat on the",
    "Quick zephyrs blow, vexing daft Jim",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
    "one two three one two three one",
]
MAX_TOKENS = [20, 13, 20, 9]  # rows leave the batch at different steps
SEEDS = [3, 11, 7, 5]
DRAFTS = {
    "ngram": ["draft=ngram"],
    "model": ["draft=model", "draft.model=tiny-random"],
    "layerskip": ["draft=layerskip", "draft.depth=1"],
    "mtp": ["draft=mtp"],  # draft.head=: a random head saved for the arch below
    "lookahead": ["draft=lookahead", "tree=dynamic"],  # its Jacobi window is a tree branch: tree rows in the batch
    "model-tree": ["draft=model", "draft.model=tiny-random", "tree=dynamic"],
}


def _start(cwd, arch: str, *overrides: str) -> Server:
    common = ["model=tiny-random", f"model.arch={arch}", "max_batch=4", "budget=fixed", "budget.k=4"]
    return Server(cwd, *common, *overrides)


def _complete(server: Server, i: int, **extra) -> dict:
    body = {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], **extra}
    status, raw = server.post("/v1/completions", body, timeout=120)
    assert status == 200, raw
    return json.loads(raw)


def _text(answer: dict) -> str:
    return answer["choices"][0]["text"]


def _concurrently(server: Server, **extra_of) -> list[dict]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda i: _complete(server, i, **extra_of.get(str(i), {})), range(len(PROMPTS))))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def head(arch, tmp_path_factory):
    """A random MTP head for the arch's tiny target (exactness needs no training)."""
    from specpipe.drafters.mtp_head import new_head, save_head
    from tests.conftest import tiny

    target = tiny(arch)
    module, _ = new_head(target.hidden_parts()[0])
    folder = tmp_path_factory.mktemp(f"head-{arch}")
    save_head(module, folder, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
    return str(folder)


@pytest.fixture(scope="module")
def plain(arch, tmp_path_factory):
    """Each prompt decoded alone by a draft=none server, greedy: the answers every drafter must give."""
    server = _start(tmp_path_factory.mktemp(f"plain-{arch}"), arch, "draft=none")
    try:
        yield [_text(_complete(server, i)) for i in range(len(PROMPTS))]
    finally:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(params=list(DRAFTS))
def server(request, arch, head, tmp_path):
    extra = [f"draft.head={head}"] if request.param == "mtp" else []
    s = _start(tmp_path, arch, *DRAFTS[request.param], *extra)
    yield s
    s.proc.kill()
    s.proc.wait()


def test_four_concurrent_requests_each_get_their_answer_alone(server, plain):
    greedy = _concurrently(server)
    assert [_text(a) for a in greedy] == plain
    assert all(a["specpipe"]["batched"] for a in greedy) and sum(a["specpipe"]["drafted"] for a in greedy) > 0

    sampled = {str(i): {"temperature": 1.0, "seed": SEEDS[i]} for i in range(len(PROMPTS))}
    alone = [_text(_complete(server, i, **sampled[str(i)])) for i in range(len(PROMPTS))]
    together = _concurrently(server, **sampled)
    assert [_text(a) for a in together] == alone
    assert alone != plain  # sampling really sampled

    batches = metric(server, "specpipe_batch_rows_total") / metric(server, "specpipe_steps_total")
    assert batches > 1.5, "the concurrent requests should have shared forwards"


def test_a_client_that_hangs_up_mid_stream_frees_its_row(arch, tmp_path):
    s = _start(tmp_path, arch, "draft=ngram", "max_batch=2", "max_tokens=400")
    try:
        url = urllib.parse.urlparse(s.base)
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 400, "stream": True}).encode()
        sock = socket.create_connection((url.hostname, url.port), timeout=60)
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        got = b""
        while got.count(b"data: ") < 3:  # a few chunks: the row is decoding
            piece = sock.recv(4096)
            assert piece, got.decode(errors="replace")
            got += piece
        sock.close()
        left = time.monotonic()
        while metric(s, 'specpipe_requests_total{status="cancelled"}') < 1:
            assert time.monotonic() - left < 20, "the row of the client that left was never freed"
            time.sleep(0.1)
        # both slots are free again: two requests at once are answered in full, side by side
        answers = _concurrently_two(s)
        assert [a["usage"]["completion_tokens"] for a in answers] == [MAX_TOKENS[1], MAX_TOKENS[2]]
    finally:
        s.proc.kill()
        s.proc.wait()


def _concurrently_two(server: Server) -> list[dict]:
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda i: _complete(server, i), [1, 2]))


@pytest.mark.parametrize(
    "target_arch, overrides",
    [
        ("qwen3_next", ["draft=model", "draft.model=tiny-random"]),  # hybrid: recurrent states per row
        ("mamba2", ["draft=ngram"]),  # recurrent only
        ("gemma3_text", ["draft=model", "draft.model=tiny-random", "tree=dynamic"]),  # sliding window, tree rows
    ],
    ids=["qwen3_next-model", "mamba2-ngram", "gemma3-model-tree"],
)
def test_hybrid_recurrent_and_sliding_window_targets_batch_through_the_server(target_arch, overrides, tmp_path):
    """The served batch holds every cache kind: 4 concurrent greedy requests each get draft=none's answer alone,
    and they shared forwards (the in-process matrix: tests/test_batch_drafters.py)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "draft").mkdir()
    plain_server = _start(tmp_path / "plain", target_arch, "draft=none")
    try:
        plain = [_text(_complete(plain_server, i)) for i in range(len(PROMPTS))]
    finally:
        plain_server.proc.kill()
        plain_server.proc.wait()
    s = _start(tmp_path / "draft", target_arch, *overrides)
    try:
        answers = _concurrently(s)
        assert [_text(a) for a in answers] == plain
        assert all(a["specpipe"]["batched"] for a in answers) and sum(a["specpipe"]["drafted"] for a in answers) > 0
        assert metric(s, "specpipe_batch_rows_total") / metric(s, "specpipe_steps_total") > 1.5
    finally:
        s.proc.kill()
        s.proc.wait()


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory) -> tuple[str, list[str]]:
    """(a random Gemma-4 assistant's folder for the tiny gemma4_text target, each prompt's answer alone from a
    draft=none server): exactness needs no training."""
    from tests.gemma4_tiny import config, random_weights, write

    cfg = config()
    folder = write(tmp_path_factory.mktemp("assistant") / "a", cfg, random_weights(cfg, seed=2))
    server = _start(tmp_path_factory.mktemp("plain-gemma4"), "gemma4_text", "draft=none")
    try:
        return str(folder), [_text(_complete(server, i)) for i in range(len(PROMPTS))]
    finally:
        server.proc.kill()
        server.proc.wait()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_gemma4_assistant_rows_each_read_their_own_kv_through_the_server(gemma4, tree, tmp_path):
    """draft=gemma4_assistant attends to the target's K/V: each row's drafter reads its own row of the batch's
    storage (batch/cache.py RowKv). 4 concurrent requests each get their answer alone, greedy (a draft=none
    server's) and seeded sampling (the same request sent alone), chains and trees (tree=dynamic)."""
    folder, plain = gemma4
    s = _start(
        tmp_path, "gemma4_text", "draft=gemma4_assistant", f"draft.path={folder}", *(["tree=dynamic"] if tree else [])
    )
    try:
        greedy = _concurrently(s)
        assert [_text(a) for a in greedy] == plain
        assert all(a["specpipe"]["batched"] for a in greedy) and sum(a["specpipe"]["drafted"] for a in greedy) > 0
        sampled = {str(i): {"temperature": 1.0, "seed": SEEDS[i]} for i in range(len(PROMPTS))}
        alone = [_text(_complete(s, i, **sampled[str(i)])) for i in range(len(PROMPTS))]
        assert [_text(a) for a in _concurrently(s, **sampled)] == alone
        assert alone != plain  # sampling really sampled
        assert metric(s, "specpipe_batch_rows_total") / metric(s, "specpipe_steps_total") > 1.5
    finally:
        s.proc.kill()
        s.proc.wait()
