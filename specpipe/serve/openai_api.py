"""OpenAI's request and response shapes for /v1/chat/completions and /v1/completions.

`parse_chat(body)` / `parse_completion(body)` turn a JSON body into a `Request` or raise
`BadRequest` with one line that names the field; `completion_body` / `chunk_body` build the
responses (a `specpipe` field carries the run's speculation figures). No HTTP, no MLX.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec


class BadRequest(ValueError):
    """The request cannot be served as sent; the message says which field and why."""


class Message(msgspec.Struct):
    role: str
    content: str


class ChatBody(msgspec.Struct):
    messages: list[Message]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1


class CompletionBody(msgspec.Struct):
    prompt: str
    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1


class Request(msgspec.Struct, kw_only=True):
    kind: str  # "chat" | "text"
    messages: list[dict] | None = None
    prompt: str | None = None
    max_tokens: int | None
    stream: bool
    stop: list[str]
    temperature: float | None
    top_p: float | None = None
    seed: int | None = None


def parse_chat(body: bytes) -> Request:
    b = _decode(body, ChatBody)
    if not b.messages:
        raise BadRequest("messages is empty: send at least one {'role': 'user', 'content': '...'}")
    roles = {m.role for m in b.messages} - {"system", "user", "assistant"}
    if roles:
        raise BadRequest(f"messages: unknown role {sorted(roles)[0]!r}: use system, user or assistant")
    _check_common(b.n)
    return Request(
        kind="chat",
        messages=[{"role": m.role, "content": m.content} for m in b.messages],
        max_tokens=b.max_completion_tokens or b.max_tokens,
        stream=b.stream,
        stop=_stops(b.stop),
        temperature=b.temperature,
        top_p=b.top_p,
        seed=b.seed,
    )


def parse_completion(body: bytes) -> Request:
    b = _decode(body, CompletionBody)
    _check_common(b.n)
    return Request(
        kind="text",
        prompt=b.prompt,
        max_tokens=b.max_tokens,
        stream=b.stream,
        stop=_stops(b.stop),
        temperature=b.temperature,
        top_p=b.top_p,
        seed=b.seed,
    )


def _decode(body: bytes, kind):
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from None


def _check_common(n: int) -> None:
    if n != 1:
        raise BadRequest(f"n={n}: this server returns one choice per request (n=1)")


def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4:
        raise BadRequest(f"stop: {len(stops)} strings; at most 4")
    return [s for s in stops if s]


# ---------------------------------------------------------------- responses


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def completion_body(kind: str, rid: str, model: str, finished) -> dict:
    choice = {"index": 0, "finish_reason": _reason(finished.finish_reason), "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": finished.text}
    else:
        choice["text"] = finished.text
    return {
        "id": rid,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(finished),
        "specpipe": specpipe_figures(finished),
    }


def chunk_body(kind: str, rid: str, model: str, text: str | None, finished=None) -> dict:
    """One streamed piece; `finished` set on the last one (finish_reason, usage, figures)."""
    if kind == "chat":
        choice = {"index": 0, "delta": {"content": text} if text is not None else {}, "finish_reason": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": None}
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    if finished is not None:
        choice["finish_reason"] = _reason(finished.finish_reason)
        body["usage"] = usage(finished)
        body["specpipe"] = specpipe_figures(finished)
    return body


def usage(finished) -> dict:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }


def specpipe_figures(finished) -> dict:
    return {**finished.stats, "queue_s": finished.queue_s}


def _reason(reason: str) -> str:
    return "stop" if reason == "cancelled" else reason


def error_body(message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind}}
