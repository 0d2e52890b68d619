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

from specpipe.core.plan import K_MAX


class BadRequest(ValueError):
    """The request cannot be served as sent; the message says which field and why."""


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str | dict = ""


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: str | None = None
    type: str = "function"


class Message(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None  # a string, or text parts as the OpenAI SDK sends them
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one of them


class SpecpipeOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The request's own `specpipe` extension (beside the OpenAI fields): knobs a client may turn per request."""

    k: int | None = None  # draft tokens per step for this request (0: plain decoding), fixed; None: the server's budget


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
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict] | None = None  # the functions the chat template may show the model
    specpipe: SpecpipeOptions | None = None


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
    logprobs: int | None = None
    echo: bool = False
    specpipe: SpecpipeOptions | None = None


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
    model: str | None = None
    tools: list[dict] | None = None
    uses_tools: bool = False  # a message is a tool's answer or carries tool calls (the template must know them)
    k: int | None = None  # specpipe.k: this request's fixed K (None: the server's budget)


def parse_chat(body: bytes) -> Request:
    b = _decode(body, ChatBody)
    if not b.messages:
        raise BadRequest("messages is empty: send at least one {'role': 'user', 'content': '...'}")
    roles = {m.role for m in b.messages} - {"system", "developer", "user", "assistant", "tool"}
    if roles:
        raise BadRequest(f"messages: unknown role {sorted(roles)[0]!r}: use system, user, assistant or tool")
    _check_common(b.n)
    if b.logprobs or b.top_logprobs:
        raise BadRequest(_NO_LOGPROBS)
    messages = [_message(i, m) for i, m in enumerate(b.messages)]
    return Request(
        kind="chat",
        messages=messages,
        max_tokens=b.max_completion_tokens or b.max_tokens,
        stream=b.stream,
        stop=_stops(b.stop),
        temperature=b.temperature,
        top_p=b.top_p,
        seed=b.seed,
        model=b.model,
        tools=b.tools or None,
        uses_tools=any("tool_calls" in m or m["role"] == "tool" for m in messages),
        k=_k(b.specpipe),
    )


def parse_completion(body: bytes) -> Request:
    b = _decode(body, CompletionBody)
    _check_common(b.n)
    if b.logprobs is not None:
        raise BadRequest(_NO_LOGPROBS)
    if b.echo:
        raise BadRequest("echo=true: this server does not return the prompt with the answer; drop echo")
    return Request(
        kind="text",
        prompt=b.prompt,
        max_tokens=b.max_tokens,
        stream=b.stream,
        stop=_stops(b.stop),
        temperature=b.temperature,
        top_p=b.top_p,
        seed=b.seed,
        model=b.model,
        k=_k(b.specpipe),
    )


MAX_JSON_DEPTH = 32  # tools' JSON schemas nest a few levels; a chat template renders them recursively
MAX_REQUEST_K = K_MAX  # the longest draft a request may ask for: every K's one cap (core/plan.py)


def _k(options: SpecpipeOptions | None) -> int | None:
    if options is None or options.k is None:
        return None
    if not 0 <= options.k <= MAX_REQUEST_K:
        raise BadRequest(f"specpipe.k={options.k}: choose 0..{MAX_REQUEST_K} (0: plain decoding), or leave it out")
    return options.k


_NO_LOGPROBS = "logprobs: this server does not return token log-probabilities; drop logprobs / top_logprobs"


def _message(i: int, m: Message) -> dict:
    """One message as a chat template takes it: content a string (text parts joined), tool fields kept."""
    if isinstance(m.content, list):
        other = sorted({p.type for p in m.content} - {"text"})
        if other:
            raise BadRequest(f"messages[{i}].content: a {other[0]!r} part; this server reads text parts only")
        content = "".join(p.text or "" for p in m.content)
    else:
        content = m.content or ""
    if m.content is None and not m.tool_calls:
        raise BadRequest(f"messages[{i}]: no content; send 'content': '...'")
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
    if m.tool_calls:
        if m.role != "assistant":
            raise BadRequest(f"messages[{i}]: tool_calls belong to an assistant message, not {m.role!r}")
        out["tool_calls"] = [msgspec.to_builtins(c) for c in m.tool_calls]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id or ""
    if m.name:
        out["name"] = m.name
    return out


def _decode(body: bytes, kind):
    try:
        decoded = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from None
    except RecursionError:  # msgspec's own bound, about 1000 levels
        raise BadRequest(f"the body nests deeper than {MAX_JSON_DEPTH} levels: send flatter JSON") from None
    for field in ("tools", "messages"):  # free-form JSON a chat template walks recursively
        where = _too_deep(msgspec.to_builtins(getattr(decoded, field, None)))
        if where:
            raise BadRequest(f"{field} nests deeper than {MAX_JSON_DEPTH} levels (at {where}): send flatter JSON")
    return decoded


def _too_deep(node) -> str | None:
    """The path of the first value deeper than MAX_JSON_DEPTH under `node` (walked without recursion), or None."""
    stack = [(node, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return path or "the top"
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend((child, f"{path}.{key}" if path else str(key), depth + 1) for key, child in items)
    return None


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


def completion_body(kind: str, rid: str, model: str, finished, seed: int | None = None) -> dict:
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
        "specpipe": specpipe_figures(finished, seed),
        **other_shapes(finished),
    }


def chunk_body(kind: str, rid: str, model: str, text: str | None, finished=None, seed: int | None = None) -> dict:
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
        body["specpipe"] = specpipe_figures(finished, seed)
        body.update(other_shapes(finished))
    return body


def other_shapes(finished) -> dict:
    """The answer's figures as llama-server (`timings`) and vLLM (`speculative_decoding`) give them."""
    shapes = {"timings": finished.timings} if finished.timings else {}
    return shapes | {"speculative_decoding": finished.speculative_decoding} if finished.speculative_decoding else shapes


def delta_fields(delta) -> dict:
    """A streamed chunk's `specpipe` field (docs/serve.md): the tokens its text completes, each
    {"id", "role", "step"} (role: accepted | bonus | recovered | plain), the rejected drafts of
    their steps [{"step", "ids"}], and the counts older clients read (`tokens`, `from_draft`)."""
    return {
        "tokens": len(delta.tokens),
        "from_draft": delta.from_draft,
        "ids": msgspec.to_builtins(delta.tokens),
        "rejected": msgspec.to_builtins(delta.rejected),
    }


def usage(finished) -> dict:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix store gave (not
    prefilled), as OpenAI reports its own prompt caching."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": int(finished.stats.get("cached_tokens", 0))},
    }


def specpipe_figures(finished, seed: int | None = None) -> dict:
    figures = {**finished.stats, "queue_s": finished.queue_s}
    if seed is not None:  # the seed this request was sampled with (drawn fresh when it sent none)
        figures["seed"] = seed
    if finished.finish_reason == "cancelled":
        figures["cut"] = "shutdown"
    return figures


def _reason(reason: str) -> str:
    # Only a request cut by the server's shutdown reaches a client as "cancelled" (a client that left
    # reads nothing): it did not end on its own, so it must not look finished ("stop"). "length" is what
    # OpenAI clients already treat as "cut short"; the `specpipe.cut` field says why.
    return "length" if reason == "cancelled" else reason


def error_body(message: str, kind: str = "invalid_request_error", code: int | str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}
