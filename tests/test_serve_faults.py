"""`specpipe-serve` against faults, as a real server process on 127.0.0.1 (tiny random model): no secret in its
run folder, a SIGHUP ends it as SIGTERM does, an unexpected failure in one request is that request's logged
500, bodies nested past a bound are one-line 400s. Rows in docs/faults.md (server faults)."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from test_serve_http import COMPLETION, TinyServer


def test_the_api_key_is_in_no_file_of_the_run_folder(tmp_path):
    """`api_key=KEY` on the command line was written in clear into .hydra/config.yaml, overrides.yaml and
    hydra.yaml (mode 0644); it now reaches the server through its environment, and still guards every route."""
    secret = "sk-never-on-disk-4711"
    server = TinyServer(tmp_path, f"api_key={secret}")
    try:
        headers = {"Authorization": f"Bearer {secret}"}
        assert server.request("POST", "/v1/completions", COMPLETION)[0] == 401
        assert server.request("POST", "/v1/completions", COMPLETION, headers)[0] == 200
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.communicate(timeout=60)
    run_folder = server.log.parent
    files = [p for p in run_folder.rglob("*") if p.is_file()]
    assert {"config.yaml", "overrides.yaml", "hydra.yaml", "requests.jsonl"} <= {p.name for p in files}
    holding = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert holding == [], f"the key is written in {holding}"


def test_sighup_ends_the_server_as_sigterm_does(tmp_path):
    """SIGHUP (the terminal closed) gave 500s, streams cut without `finish_reason` or [DONE], an `Event loop is
    closed` traceback and lost requests.jsonl lines; now both answers end cut ("length", cut: shutdown, the
    stream with [DONE]), both are logged, and the server exits 129 with its one stop line.

    TinyServer starts the server with SIGHUP at its default: a suite run under nohup once passed its ignored
    SIGHUP on, the server kept it ignored (as documented for nohup) and decoded on until an end token."""
    server = TinyServer(tmp_path, "draft=none", "max_batch=2", "max_tokens_limit=4096")
    try:
        with ThreadPoolExecutor(2) as pool:
            whole = pool.submit(server.request, "POST", "/v1/completions", {"prompt": "Count:", "max_tokens": 4000})
            stream = pool.submit(
                server.request, "POST", "/v1/completions", {"prompt": "Go:", "max_tokens": 4000, "stream": True}
            )
            deadline = time.monotonic() + 30
            while server.metric("specpipe_batch_size") < 2:  # both decoding
                assert time.monotonic() < deadline
                time.sleep(0.05)
            server.proc.send_signal(signal.SIGHUP)
            (status, _, body), (status_s, _, text) = whole.result(timeout=60), stream.result(timeout=60)
        data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
        assert body["specpipe"]["cut"] == "shutdown"
        assert status_s == 200 and data[-1] == "[DONE]", text[-500:]
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
        _, err = server.proc.communicate(timeout=60)
        assert server.proc.returncode == 129 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("specpipe-serve: stopped (SIGHUP)"), err
        assert [r["finish_reason"] for r in server.records()] == ["cancelled", "cancelled"]
    finally:
        server.close()


def test_a_full_disk_under_the_logs_costs_records_not_the_server(tmp_path):
    """Once steps.jsonl / requests.jsonl hit ENOSPC the decoding thread died: every later request hung or got a
    500 while /health said ok. Here both files are /dev/full (the kernel's own ENOSPC): every request is still
    answered, each file's failure is one stderr line (said once, however many records fail), /health says
    "degraded" naming both, and the stop is the usual exit 143."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("requests.jsonl", "steps.jsonl"):
        (run / name).symlink_to("/dev/full")
    server = TinyServer(tmp_path, "draft=ngram", "max_batch=2", f"hydra.run.dir={run}")
    try:
        answers = [server.request("POST", "/v1/completions", {"prompt": f"Hi {i}", "max_tokens": 6}) for i in range(3)]
        assert [status for status, _, _ in answers] == [200, 200, 200], answers
        assert all(body["usage"]["completion_tokens"] == 6 for _, _, body in answers)
        status, _, health = server.request("GET", "/health")
        assert status == 200 and health["status"] == "degraded", health
        assert any(p.startswith("requests.jsonl: 3 records lost (No space left") for p in health["problems"]), health
        assert any(p.startswith("steps.jsonl:") for p in health["problems"]), health
    finally:
        server.proc.send_signal(signal.SIGTERM)
        _, err = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 143 and "Traceback" not in err, err
    lost = [line for line in err.splitlines() if "cannot write" in line]
    assert len(lost) == 2 and all("No space left on device" in line for line in lost), err


def deeply_nested_tools(depth: int) -> str:
    """A chat body whose one tool's `parameters` is `depth` nested lists (as text: json.loads stops near 1000)."""
    parameters = "[" * depth + "]" * depth
    return (
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": "function", '
        f'"function": {{"name": "f", "parameters": {parameters}}}}}]}}'
    )


def test_deeply_nested_tools_are_a_one_line_400(tmp_path):
    """`tools` nested a few thousand levels was a 500 logged nowhere (msgspec's RecursionError); 40 levels would
    reach the chat template's recursive rendering. Both are a 400 naming the bound, logged; the server goes on."""
    server = TinyServer(tmp_path, "draft=none")
    try:
        for depth in (40, 5000):
            status, _, body = server.request("POST", "/v1/chat/completions", deeply_nested_tools(depth))
            assert status == 400 and "nests deeper than 32 levels" in body["error"]["message"], (depth, body)
            assert "\n" not in body["error"]["message"]
        assert server.request("POST", "/v1/chat/completions", deeply_nested_tools(3))[0] in (200, 400)
        assert server.request("POST", "/v1/completions", COMPLETION)[0] == 200
        assert [r["status"] for r in server.records()[:2]] == [400, 400]
    finally:
        server.close()


def test_an_unexpected_exception_is_that_requests_logged_500(tmp_path):
    """A fault nobody foresaw inside one request (here the worker's submit fails, injected into a real server
    on 127.0.0.1 answering a real HTTP client) was Starlette's bare "Internal Server Error", logged nowhere. It
    is now an OpenAI error object naming the request id, the same id is a requests.jsonl record, and the next
    request is served."""
    import http.client
    import socket
    import threading

    import uvicorn
    from hydra import compose, initialize_config_module

    import specpipe.serve.config  # noqa: F401
    from specpipe.run.session import Session
    from specpipe.serve.guard import policy_for
    from specpipe.serve.http import ServeState, make_app
    from specpipe.serve.worker import GenerationWorker

    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        cfg = compose(config_name="serve", overrides=["model=tiny-random", "draft=none", "port=0"])
    session = Session(cfg)
    worker = GenerationWorker(session, max_waiting=4)
    real_submit, calls = worker.submit, []

    def submit(job):
        calls.append(job)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        real_submit(job)

    worker.submit = submit  # type: ignore[method-assign]
    records: list[dict] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    state = ServeState(session, worker, session.target.info.name, records.append)
    server = uvicorn.Server(
        uvicorn.Config(make_app(state, policy_for("127.0.0.1", port, False, None, [])), lifespan="off", log_config=None)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:

        def post():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            for _ in range(100):
                try:
                    conn.request(
                        "POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "application/json"}
                    )
                    break
                except ConnectionRefusedError:
                    time.sleep(0.05)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())

        status, body = post()
        assert status == 500, body
        message = body["error"]["message"]
        assert "RuntimeError: injected fault" in message and "\n" not in message, message
        logged = [r for r in records if r.get("status") == 500]
        assert len(logged) == 1 and logged[0]["id"] in message, records
        status, body = post()
        assert status == 200 and body["usage"]["completion_tokens"] == 2, body
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        worker.close()


def test_the_full_disk_soak_runs(tmp_path):
    """scripts/soak_full_disk.py briefly, its run folder's logs on /dev/full (the tmpfs that fills mid-soak is
    its documented run, docs/faults.md): no request hangs or is mixed up, /health truthful, exit 143."""
    import subprocess
    import sys
    from pathlib import Path

    run = tmp_path / "run"
    run.mkdir()
    for name in ("requests.jsonl", "steps.jsonl"):
        (run / name).symlink_to("/dev/full")
    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_full_disk.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--run-dir", str(run), "--clients", "2", "--seconds", "4", "--max-tokens", "8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["answers"] > 0 and summary["hung"] == 0 and summary["cannot_write_lines"] == 2, summary
