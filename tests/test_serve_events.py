"""Typed events through `specpipe-serve` (issue 34), real servers on 127.0.0.1 (tiny random model):
streamed chunks carry token ids with their roles (docs/serve.md) that join to the answer and match
the run's figures, concurrent streams each get exactly their answer alone, a served chat
(tui/server_source.py) rebuilds the steps with their rejected drafts, and a server without the
fields (an older one) is still shown as text."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from specpipe.drafters.none import NoneDrafter
from specpipe.events import Drafted, Emitted, RunFinished, Verified
from tests.conftest import generate, tiny
from tests.test_server import Server
from tui.server_source import UNKNOWN_ID, ServerSource
from tui.transcript import REJECTED, AnswerTranscript

# Repetitive text: the n-gram drafter finds matches, some accepted and some rejected by the random model.
PROMPT = "one two three one two three one two three one two three"
OTHERS = ["Quick zephyrs blow, vexing daft Jim", "def f(x):\n    return x + 1\n\ndef g(x):"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def target():
    return tiny("llama")  # the servers' model=tiny-random (llama, seed 0, float32 on CPU)


@pytest.fixture(scope="module")
def ngram(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("events-ngram"), "model=tiny-random", "draft=ngram", "budget.k=4")
    yield server
    server.proc.kill()
    server.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("events-plain"), "model=tiny-random", "draft=none")
    yield server
    server.proc.kill()
    server.proc.wait(timeout=30)


def stream_completion(server: Server, prompt: str, max_tokens: int = MAX_TOKENS, **extra) -> tuple[list[dict], dict]:
    """(text chunks, last chunk) of one streamed /v1/completions request (`extra`: more body fields)."""
    host, port = server.base.rsplit("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, **extra}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    chunks = [json.loads(line[6:]) for line in resp.read().decode().splitlines() if line.startswith("data: {")]
    conn.close()
    last = chunks.pop()
    assert "usage" in last and last["choices"][0]["finish_reason"] in ("stop", "length")
    return chunks, last


def streamed_tokens(chunks: list[dict]) -> list[dict]:
    return [t for c in chunks for t in c["specpipe"]["ids"]]


def detokenize(target, ids: list[int]) -> str:
    """The ids as the server's streaming detokenizer writes them (random models emit partial characters)."""
    detok = target.tokenizer.detokenizer
    detok.reset()
    for tid in ids:
        detok.add_token(tid)
    detok.finalize()
    return detok.text


def alone(target, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    """The prompt decoded alone with draft=none through the CLI's pipeline (EOS ends it, as served)."""
    ids = list(target.tokenizer.encode(prompt))
    return generate(target, NoneDrafter(), 1, ids, max_tokens, stop_ids=target.eos_token_ids)[0]


def test_streamed_ids_join_to_the_answer_with_the_runs_roles(ngram, target):
    chunks, last = stream_completion(ngram, PROMPT)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = streamed_tokens(chunks)
    ids = [t["id"] for t in tokens]
    assert ids == alone(target, PROMPT)  # greedy: exactly the plain decoding's tokens
    assert detokenize(target, ids) == text == "".join(t["text"] for t in tokens)
    assert all(c["specpipe"]["tokens"] == len(c["specpipe"]["ids"]) for c in chunks)
    # the roles are the run's: its accepted drafts (the last step may be cut by max_tokens), its rejections
    figures, roles = last["specpipe"], Counter(t["role"] for t in tokens)
    assert 0 < roles["accepted"] <= figures["accepted"] and set(roles) <= {"accepted", "bonus", "recovered", "plain"}
    rejected = [r for c in chunks for r in c["specpipe"]["rejected"]]
    assert sum(len(r["ids"]) for r in rejected) == figures["drafted"] - figures["accepted"] > 0
    assert roles["recovered"] == len({r["step"] for r in rejected})  # each rejecting step recovered one token
    assert sum(c["specpipe"]["from_draft"] for c in chunks) == roles["accepted"]
    steps = [t["step"] for t in tokens]
    assert steps == sorted(steps) and len(set(steps)) <= figures["target_forwards"]


def test_the_batch_1_worker_streams_the_same_tokens_and_roles(ngram, tmp_path):
    """max_batch=1 serves through the CLI's pipeline (serve/worker.py): one delta type, the same fields."""
    solo = Server(tmp_path, "model=tiny-random", "draft=ngram", "budget.k=4", "max_batch=1")
    try:
        one, last = stream_completion(solo, PROMPT)
    finally:
        solo.proc.kill()
        solo.proc.wait(timeout=30)
    batched, _ = stream_completion(ngram, PROMPT)
    assert "batched" not in last["specpipe"]

    def steps(chunks):
        tokens = [(t["id"], t["role"], t["step"]) for t in streamed_tokens(chunks)]
        return tokens, [(r["step"], r["ids"], r["text"]) for c in chunks for r in c["specpipe"]["rejected"]]

    assert steps(one) == steps(batched) and steps(one)[1]


def test_plain_decoding_streams_plain_tokens_only(plain, target):
    chunks, last = stream_completion(plain, PROMPT)
    tokens = streamed_tokens(chunks)
    assert {t["role"] for t in tokens} == {"plain"} and not any(c["specpipe"]["rejected"] for c in chunks)
    assert [t["id"] for t in tokens] == alone(target, PROMPT)
    assert last["specpipe"]["drafted"] == 0 and last["usage"]["completion_tokens"] == len(tokens)


def test_concurrent_streams_each_get_their_answer_alone(ngram, target):
    prompts = [PROMPT, *OTHERS, PROMPT + " one"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: stream_completion(ngram, p), prompts))
    for prompt, (chunks, last) in zip(prompts, answers):
        ids = [t["id"] for t in streamed_tokens(chunks)]
        assert ids == alone(target, prompt), prompt
        assert "".join(c["choices"][0]["text"] for c in chunks) == detokenize(target, ids)
        assert last["specpipe"]["batched"]


def test_a_served_chat_rebuilds_the_steps_with_their_rejected_drafts(ngram):
    source = ServerSource(ngram.base, "tiny-random", max_tokens=MAX_TOKENS)
    events = list(source.generate([{"role": "user", "content": PROMPT}], SimpleNamespace(stop_requested=False, k=None)))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.stop_reason in ("eos", "max_tokens")
    verified = [e for e in events if isinstance(e, Verified)]
    emitted = [e for e in events if isinstance(e, Emitted)]
    rejecting = [v for v in verified if v.rejected_ids]
    assert rejecting and all(v.rejected_text for v in rejecting)  # the drafts the target said no to, with text
    assert all(v.recovered_id is not None for v in rejecting)
    assert any(v.accepted_ids for v in verified) and UNKNOWN_ID not in finished.token_ids
    # one Drafted / Verified / Emitted per step, as a local run yields them
    assert [e.step for e in events if isinstance(e, Drafted)] == [v.step for v in verified] == [e.step for e in emitted]
    assert "".join(e.text for e in emitted) == finished.text
    assert sum(len(v.accepted_ids) for v in verified) >= finished.stats.accepted - 4  # the last step may be cut
    transcript = AnswerTranscript()
    for event in events:
        transcript.consume(event)
    assert {"accepted", REJECTED} <= {p.kind for p in transcript.pieces}
    assert transcript.text == finished.text  # rejected drafts shown, never part of the answer


OLD_CHUNKS = [  # what a specpipe-serve before the token ids streamed: text and counts
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "one two"}}], "specpipe": {"tokens": 2, "from_draft": 1}},
    {"choices": [{"index": 0, "delta": {"content": " three"}}], "specpipe": {"tokens": 1, "from_draft": 0}},
    {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        "specpipe": {"drafted": 2, "accepted": 1, "target_forwards": 2},
    },
]


class _OldServer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in OLD_CHUNKS) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # /v1/models without a specpipe entry
        body = json.dumps({"object": "list", "data": [{"id": "old", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_older_server_without_token_ids_is_shown_as_text():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _OldServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        source = ServerSource(f"http://127.0.0.1:{httpd.server_port}", "old")
        events = list(
            source.generate([{"role": "user", "content": "x"}], SimpleNamespace(stop_requested=False, k=None))
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    emitted = [e for e in events if isinstance(e, Emitted)]
    assert [(e.text, e.token_ids, e.from_draft) for e in emitted] == [
        ("one two", [UNKNOWN_ID] * 2, 1),
        (" three", [UNKNOWN_ID], 0),
    ]
    assert not any(isinstance(e, Verified) for e in events)
    assert events[-1].text == "one two three" and events[-1].stop_reason == "max_tokens"


@pytest.mark.parametrize(
    "override, words",
    [
        ("max_batch=0", "need max_batch >= 1"),
        ("prefill_per_step=-1", "prefill_per_step >= 0"),
        ("prefix_wait_tokens=-1", "prefix_wait_tokens=-1: need 0 (never wait) or more"),
        ("max_queue=0", "max_queue >= 1"),
        ("shutdown_grace_s=-1", "shutdown_grace_s >= 0"),
        ("keep_alive_s=0", "keep_alive_s > 0"),
    ],
)
def test_a_bad_server_value_is_one_line_before_the_model_loads(override, words, capsys):
    """conf/serve.yaml's values, overridden out of range: one line, exit 2, nothing loaded (the model path is
    missing: a check that ran after loading would fail on the model instead)."""
    from hydra import compose, initialize

    import specpipe.serve.config  # noqa: F401  (the serve schema)
    from specpipe.serve.cli import _task

    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="serve", overrides=["model.path=/nowhere/model.gguf", override])
    with pytest.raises(SystemExit) as stop:
        _task(cfg)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and words in lines[0], lines


def test_answer_stream_pairs_text_tokens_roles_and_stop_strings():
    """serve/answer.py on scripted events (no model): a token whose piece is empty travels with the one that
    completes its character, a step's rejection comes with its first token, a stop string cuts inside a token."""
    import queue

    from specpipe.serve.answer import AnswerStream, Delta, Rejection, Token
    from specpipe.serve.worker import Job

    def run(stop: list[str]) -> list:
        job = Job(prompt_ids=[0], max_tokens=8, stop=stop, out=queue.Queue())
        answer = AnswerStream(job)
        events = [
            Verified(step=1, accepted_ids=[1, 2], rejected_ids=[3], recovered_id=9, seconds=0.0, rejected_text="c"),
            Emitted(step=1, token_ids=[1, 2, 9], text="abc", from_draft=2, token_texts=["a", "", "bc"]),
            Verified(step=2, accepted_ids=[], rejected_ids=[], bonus_id=5, seconds=0.0),
            Emitted(step=2, token_ids=[5], text="d.e", from_draft=0, token_texts=["d.e"]),
        ]
        stopped = [answer.consume(e) for e in events]
        answer.finish("stop", 1, {}, 0.0)
        return stopped, [job.out.get_nowait() for _ in range(job.out.qsize())]

    stopped, pieces = run(["."])
    assert stopped == [False, False, False, True]
    first = Delta(
        text="abc",
        tokens=[Token(1, "accepted", 1, "a"), Token(2, "accepted", 1, ""), Token(9, "recovered", 1, "bc")],
        rejected=[Rejection(1, [3], "c")],
    )
    assert pieces[:2] == [("delta", first), ("delta", Delta(text="d", tokens=[Token(5, "plain", 2, "d")]))]
    assert pieces[2][0] == "done" and pieces[2][1].text == "abcd" and len(pieces) == 3

    # a longer stop string holds text back: the empty-piece token waits with the text that completes it
    _, pieces = run(["zzz"])
    deltas = [value for tag, value in pieces if tag == "delta"]
    assert deltas[0] == Delta(text="a", tokens=[Token(1, "accepted", 1, "a")], rejected=[Rejection(1, [3], "c")])
    assert [t.id for d in deltas for t in d.tokens] == [1, 2, 9, 5]
    assert "".join(d.text for d in deltas) == "".join(t.text for d in deltas for t in d.tokens) == "abcd.e"
    assert [r for d in deltas for r in d.rejected] == [Rejection(1, [3], "c")]
