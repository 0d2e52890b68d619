"""A browser SDK's CORS preflight and the server's per-request console line, against a real
`specpipe-serve` process (tiny random model, 127.0.0.1 only, a handful of requests)."""

from __future__ import annotations

import json
import re
import signal

import pytest
from test_serve_http import COMPLETION, TinyServer

PAGE = "http://localhost:3000"
ACCESS_LINE = re.compile(r"specpipe-serve: \S+ (GET|POST|OPTIONS) /")
# What the OpenAI JavaScript SDK (dangerouslyAllowBrowser) sends beside the body, as a browser lists it
# in the preflight's Access-Control-Request-Headers (lower case; Accept is CORS-safelisted, so absent).
OPENAI_JS_HEADERS = [
    "authorization",
    "content-type",
    "openai-organization",
    "openai-project",
    "x-stainless-arch",
    "x-stainless-helper-method",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
]


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    s = TinyServer(tmp_path_factory.mktemp("console"), "draft=none", f"allowed_origins=[{PAGE}]")
    yield s
    s.close()


def preflight(server: TinyServer, origin: str, requested: list[str]):
    return server.request(
        "OPTIONS",
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": ",".join(requested),
        },
    )


def test_the_openai_js_sdk_preflight_passes_and_the_guard_still_refuses(page_server):
    status, headers, _ = preflight(page_server, PAGE, OPENAI_JS_HEADERS)
    assert status == 204 and headers["access-control-allow-origin"] == PAGE
    allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    assert set(OPENAI_JS_HEADERS) <= allowed, sorted(set(OPENAI_JS_HEADERS) - allowed)
    # a header name that is not an HTTP token is not echoed back
    _, headers, _ = preflight(page_server, PAGE, ["x-ok", "bad (header)"])
    assert "bad" not in headers["access-control-allow-headers"] and "x-ok" in headers["access-control-allow-headers"]
    # the real request with the SDK's headers, then the guard's other checks, unchanged
    sdk = {h: "1" for h in OPENAI_JS_HEADERS if h not in ("authorization", "content-type")}
    status, headers, body = page_server.request("POST", "/v1/completions", COMPLETION, {"Origin": PAGE, **sdk})
    assert status == 200 and headers["access-control-allow-origin"] == PAGE and body["choices"]
    assert preflight(page_server, "http://localhost:3001", OPENAI_JS_HEADERS)[0] == 403
    assert (
        page_server.request("POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "text/plain"})[0] == 415
    )


def stop(server: TinyServer) -> list[str]:
    """The console lines after the start line, once the server has stopped."""
    server.proc.send_signal(signal.SIGTERM)
    _, err = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 143 and "Traceback" not in err, err
    return err.splitlines()


def test_every_request_gets_one_console_line_refusals_too(tmp_path):
    server = TinyServer(tmp_path, "draft=none", f"allowed_origins=[{PAGE}]")
    try:
        whole = server.request("POST", "/v1/completions", COMPLETION)[2]
        server.request(
            "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        )
        server.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
        server.request("GET", "/health")
    finally:
        lines = [line for line in stop(server) if ACCESS_LINE.match(line)]
    assert len(lines) == 4, lines
    done, streamed, refused, health = lines
    usage = whole["usage"]
    assert done.startswith("specpipe-serve: 127.0.0.1 POST /v1/completions 200 " + whole["id"] + " ")
    assert f"tokens={usage['prompt_tokens']}+{usage['completion_tokens']} " in done and done.endswith("s")
    assert " POST /v1/chat/completions 200 chatcmpl-" in streamed and "tokens=-" not in streamed
    assert " GET /v1/models 403 - tokens=- " in refused  # the guard's refusal has its line
    assert " GET /health 200 " in health


def test_access_log_false_keeps_the_console_quiet(tmp_path):
    server = TinyServer(tmp_path, "draft=none", "access_log=false")
    try:
        assert server.request("POST", "/v1/completions", COMPLETION)[0] == 200
    finally:
        lines = stop(server)
    assert not [line for line in lines if ACCESS_LINE.match(line)], lines
    assert len(server.records()) == 1  # requests.jsonl, the full record, is kept either way
