"""One streamed greedy chat request to an OpenAI-compatible server on 127.0.0.1, timed on the client's clock.

Contract: `stream_chat(port, messages, max_tokens, timeout)` sends /v1/chat/completions with `stream: true`
and `stream_options.include_usage` (so specpipe-serve and mlx_lm.server both end with usage) and returns the
answer's text, time to its first text chunk and to its end, and the usage's prompt and cached token counts
(`prompt_tokens_details.cached_tokens`; None when the server gives none). Raises `ChatError` on a non-200 answer
or a stream cut before its end. Loopback only; the timeout bounds every socket wait.
"""

from __future__ import annotations

import http.client
import json
import time


class ChatError(Exception):
    """A request the server refused or cut; the message says which and how."""


def stream_chat(port: int, messages: list[dict], max_tokens: int, timeout: float = 300.0) -> dict:
    """Returns {"text", "ttft_s", "wall_s", "prompt_tokens", "cached_tokens", "completion_tokens", "specpipe"}."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ChatError(f"the server on port {port} answered {resp.status}: {resp.read().decode()[:200]}")
        text: list[str] = []
        first: float | None = None
        usage: dict = {}
        figures: dict = {}
        done = False
        for raw in resp:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
                break
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            delta = (event.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                text.append(delta)
                first = first if first is not None else time.perf_counter()
            usage = event.get("usage") or usage
            figures = event.get("specpipe") or figures
    finally:
        conn.close()
    ended = time.perf_counter()
    if not done:
        raise ChatError(f"the stream from port {port} ended without [DONE]")
    details = usage.get("prompt_tokens_details") or {}
    return {
        "text": "".join(text),
        "ttft_s": (first if first is not None else ended) - started,
        "wall_s": ended - started,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "specpipe": figures,
    }
