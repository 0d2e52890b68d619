"""One line per HTTP request on the server's console: who asked what, the answer's status, id, tokens, time.

Contract: `AccessLog(app, write)` is the outermost ASGI middleware, so a request the guard refuses
(a foreign Origin, a missing key, a preflight) gets its line too. The line is written once the response
has been sent (a stream: once its last chunk has gone, or the client left), e.g.
`127.0.0.1 POST /v1/chat/completions 200 chatcmpl-3f2a... tokens=12+34 0.84s`.
Route handlers name the request's id and tokens through `note(scope, ...)`; a request without them
(a refusal, /health) shows `-`. requests.jsonl stays the full record; this is only what a person watches.
`write` failing (a closed console) never costs a request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

STATE_KEY = "specpipe.access"  # in scope["state"], which Starlette's `request.state` reads and writes


def note(scope: MutableMapping[str, Any], **fields) -> None:
    """What a route handler knows about its request (`id=`, `prompt_tokens=`, `completion_tokens=`)."""
    scope.setdefault("state", {}).setdefault(STATE_KEY, {}).update(fields)


def format_line(client: str, method: str, path: str, status: int | None, fields: dict, seconds: float) -> str:
    """The console line for one finished request (no status: the client left before any answer started)."""
    prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
    tokens = f"tokens={prompt}+{completion}" if prompt is not None and completion is not None else "tokens=-"
    shown = status if status is not None else "-"
    return f"{client} {method} {path} {shown} {fields.get('id') or '-'} {tokens} {seconds:.2f}s"


class AccessLog:
    def __init__(self, app, write: Callable[[str], None]):
        self.app, self.write = app, write

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: list[int] = []
        logged = False

        def log() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            client = (scope.get("client") or ("-",))[0]
            fields = scope.get("state", {}).get(STATE_KEY, {})
            line = format_line(
                client,
                scope["method"],
                scope["path"],
                status[0] if status else None,
                fields,
                time.perf_counter() - start,
            )
            try:
                self.write(line)
            except (OSError, ValueError):  # a console that went away: the request still counts
                pass

        async def send_and_watch(message):
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                log()

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            log()  # a stream cut by a client that left, or a handler that raised: still one line
