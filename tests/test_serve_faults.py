"""`specpipe-serve` against faults, as a real server process on 127.0.0.1 (tiny random model): no secret in its
run folder, a SIGHUP ends it as SIGTERM does, an unexpected failure in one request is that request's logged
500, bodies nested past a bound are one-line 400s. Rows in docs/faults.md (server faults)."""

from __future__ import annotations

import signal

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
