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
    stream with [DONE]), both are logged, and the server exits 129 with its one stop line."""
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
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
        assert body["specpipe"]["cut"] == "shutdown"
        data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
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
