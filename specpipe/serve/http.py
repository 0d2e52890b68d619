"""The HTTP layer: routes OpenAI-style requests to the decoding worker, JSON or server-sent events.

`make_app(state, policy)` returns an ASGI app (Starlette behind `guard.Guard`), served by uvicorn
with h11 (serve/cli.py): h11 frames every request, so a bad `Content-Length` or a broken chunked
body is a 400 before any route runs. Routes: GET /v1/models, GET /health, GET /metrics (Prometheus
text), POST /v1/chat/completions, POST /v1/completions. A bad request is a 400 with one line, an
unknown `model` a 404, a full queue a 429. Decoding stays on the worker's one thread; its pieces
reach the event loop through `_Bridge` (call_soon_threadsafe), so no thread waits per request.

Endings: a client that disconnects (streamed or not) is seen by uvicorn at once and its job is
cancelled, freeing its batch slot at the next step; requests.jsonl logs it `client_disconnected`
with the tokens decoded until then. A request cut by shutdown is answered `finish_reason: "length"`
with `specpipe.cut: "shutdown"` (never "stop") and logged `cancelled`. Both workers queue one
delta type (`answer.Delta`); each streamed chunk carries it as its `specpipe` field: the token ids
its text completes with their roles, the rejected drafts of their steps, and the counts
(`openai_api.delta_fields`, docs/serve.md).
"""

from __future__ import annotations

import asyncio
import json
import queue
import secrets
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specpipe.core.sampling import check_sampling
from specpipe.engine.context import overflow_message
from specpipe.serve.access_log import AccessLog, note
from specpipe.serve.breakdown import STOPPED, WorkerStopped
from specpipe.serve.guard import Guard, Policy
from specpipe.serve.openai_api import (
    BadRequest,
    chunk_body,
    completion_body,
    delta_fields,
    error_body,
    new_id,
    parse_chat,
    parse_completion,
)
from specpipe.serve.prometheus import CONTENT_TYPE, Metrics
from specpipe.serve.templates import encode_chat
from specpipe.serve.worker import SHUTTING_DOWN, Job, QueueFull

MAX_BODY = 8 << 20  # 8 MiB: a long prompt fits; anything larger is refused before it is read whole
RESULT_TIMEOUT_S = 3600  # a request never waits forever for its worker
DISCONNECTED_WAIT_S = 60  # how long a left client's job is followed to log what it decoded
SEED_BITS = 31  # a drawn seed fits every sampler's int


class ServeState:
    """What every request handler needs: the session (tokenizer, config), the worker, a request log."""

    def __init__(self, session, worker, model_name: str, log=None, metrics: Metrics | None = None):
        self.session, self.worker, self.model_name = session, worker, model_name
        self.log = log or (lambda record: None)
        self.metrics = metrics or Metrics()
        self.per_request_sampling = bool(worker.per_request_sampling)  # batched rows each own a seeded sampler
        s = session.cfg
        self.temperature = float(s.sampling.temperature)
        self.default_max_tokens = int(s.max_tokens)
        self.max_tokens_limit = int(s.max_tokens_limit)
        self.aliases = model_aliases(model_name, session)
        self.followers: set[asyncio.Task] = set()  # jobs of clients that left, followed until they end
        self.problems: Callable[[], list[str]] = lambda: []  # what /health reports beside "ok" (a log not written)


def model_aliases(model_name: str, session) -> set[str]:
    """The `model` values a request may send: the id /v1/models lists, and the names the user started
    the server with (the config's model name, the path or repo id, the file's name with and without suffix)."""
    names = {model_name}
    model_cfg = session.cfg.get("model") or {}
    for value in (model_cfg.get("name"), model_cfg.get("path"), getattr(session.target.info, "path", "")):
        if value:
            names |= {str(value), Path(str(value)).name, Path(str(value)).stem}
    return {n for n in names if n}


def make_app(state: ServeState, policy: Policy, access_log: Callable[[str], None] | None = None):
    """The server's ASGI app; `access_log` takes one console line per request (None: no lines)."""
    budget = state.session.budget
    # what a client shows beside the answers (specpipe-chat serve.url=...): the drafter and the budget's K
    setup = {
        "drafter": state.session.drafter.name,
        "budget": state.session.budget_label(),
        "k": int(budget.k) if budget.name == "fixed" else None,  # budget=auto chooses K per step
    }

    async def models(request: Request) -> Response:
        data = [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "specpipe", "specpipe": setup}]
        return _json(200, {"object": "list", "data": data})

    async def health(request: Request) -> Response:
        problems = state.problems()
        failure = state.worker.failure
        if failure is not None or not state.worker.alive():  # the decoding thread ended: nothing will be answered
            stopped = [failure or f"{STOPPED}: restart specpipe-serve"]
            return _json(503, {"status": "error", "waiting": state.worker.waiting(), "problems": stopped + problems})
        status = "degraded" if problems else "ok"  # answering, but e.g. requests.jsonl cannot be written
        return _json(200, {"status": status, "waiting": state.worker.waiting(), "problems": problems})

    async def metrics(request: Request) -> Response:
        state.metrics.set("specpipe_queue_length", state.worker.waiting())
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def chat(request: Request) -> Response:
        return await _complete(state, request, parse_chat)

    async def completions(request: Request) -> Response:
        return await _complete(state, request, parse_completion)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]

    async def not_found(request: Request, exc) -> Response:
        method, path = request.method, request.url.path
        stripped = path.rstrip("/")
        for route in routes:  # a trailing slash is the same route (as before), not a redirect
            if stripped == route.path and method in (route.methods or ()):
                return await route.endpoint(request)
        if any(stripped == route.path for route in routes):
            return _json(405, error_body(f"{method} {path}: not allowed on this route", "invalid_request_error", 405))
        hint = "try /v1/models" if method == "GET" else "use /v1/chat/completions or /v1/completions"
        return _json(404, error_body(f"no route {method} {path}: {hint}", "not_found", 404))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.router.redirect_slashes = False
    guarded = Guard(app, policy)
    return AccessLog(guarded, access_log) if access_log is not None else guarded


# ---------------------------------------------------------------------- routes


def _json(status: int, body: dict) -> Response:
    return JSONResponse(body, status_code=status)


async def _complete(state: ServeState, http: Request, parse) -> Response:
    """The route's answer; an exception nobody foresaw is this request's logged 500 (with its id), not the server's."""
    route = http.url.path.rstrip("/")
    rid = new_id("chat" if route.endswith("chat/completions") else "text")
    note(http.scope, id=rid)  # the access log's line names it, a 500's too
    try:
        return await _answer(state, http, parse, route, rid)
    except Exception as exc:  # noqa: BLE001  (the request ends; the server and its other requests go on)
        message = f"internal error ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        state.metrics.count("specpipe_requests_total", status="error")
        state.log({"id": rid, "route": route, "status": 500, "finish_reason": "error", "error": message})
        return _json(500, error_body(f"{message}; request {rid} is in requests.jsonl", "server_error", 500))


async def _answer(state: ServeState, http: Request, parse, route: str, rid: str) -> Response:
    received = time.perf_counter()
    try:
        request = parse(await _body(http))
        if request.model and request.model not in state.aliases:
            message = (
                f"model {request.model!r} is not served here: this server serves {state.model_name!r} "
                "(GET /v1/models); send that name, or none"
            )
            state.log({"route": route, "status": 404, "finish_reason": "model_not_found", "error": message})
            return _json(404, error_body(message, "invalid_request_error", "model_not_found"))
        job, seed = await run_in_threadpool(_job, state, request)  # tokenizing a long prompt blocks no stream
        job.out = _Bridge(asyncio.get_running_loop())
        job.timeline["received"] = round(received - job.submitted, 4)
        state.worker.submit(job)
    except BadRequest as exc:
        state.metrics.count("specpipe_requests_total", status="bad_request")
        state.log({"route": route, "status": 400, "finish_reason": "bad_request", "error": str(exc)})
        return _json(400, error_body(str(exc)))
    except WorkerStopped as exc:  # nothing queued now would be answered: say so at once
        state.metrics.count("specpipe_requests_total", status="unavailable")
        state.log({"route": route, "status": 503, "finish_reason": "unavailable", "error": str(exc)})
        return _json(503, error_body(str(exc), "server_error", 503))
    except QueueFull as exc:
        state.metrics.count("specpipe_requests_total", status="rejected_queue_full")
        state.log({"route": route, "status": 429, "finish_reason": "rejected_queue_full", "error": str(exc)})
        return _json(429, error_body(f"busy: {exc}; retry later", "server_busy", 429))
    if request.stream:
        return StreamingResponse(
            _stream(state, request.kind, rid, job, seed, http.scope),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return await _whole(state, http, request.kind, rid, job, seed)


# ---------------------------------------------------------------------- pieces


async def _body(http: Request) -> bytes:
    length = http.headers.get("content-length")
    if length is not None and int(length) > MAX_BODY:  # h11 has checked it is a non-negative integer
        raise BadRequest(f"the body is {length} bytes; at most {MAX_BODY}")
    data = bytearray()
    async for chunk in http.stream():  # a chunked body: counted as it comes
        data += chunk
        if len(data) > MAX_BODY:
            raise BadRequest(f"the body is over {MAX_BODY} bytes")
    return bytes(data)


def _job(state: ServeState, request) -> tuple[Job, int | None]:
    """The worker's job for a parsed request, and the seed it samples with (None: greedy)."""
    st = state
    sampling = {}
    temperature = st.temperature if request.temperature is None else request.temperature
    if st.per_request_sampling:
        s = st.session.cfg.sampling
        top_p = s.top_p if request.top_p is None else request.top_p
        message = check_sampling(temperature, 0, top_p, 0.0, 0 if request.seed is None else request.seed)
        if message:
            raise BadRequest(message.replace("sampling.", ""))
        sampling = {k: v for k, v in (("temperature", request.temperature), ("top_p", request.top_p)) if v is not None}
    elif request.temperature is not None and abs(request.temperature - st.temperature) > 1e-9:
        how = "sampling=greedy" if st.temperature == 0 else f"sampling.temperature={st.temperature}"
        raise BadRequest(
            f"temperature={request.temperature}: this server decodes with {how}; send that "
            "temperature (or none), or start a server with the sampling you want"
        )
    seed = request.seed
    if temperature > 0 and seed is None:  # a fresh draw per request: two unseeded samples differ
        seed = secrets.randbits(SEED_BITS)
    max_tokens = request.max_tokens if request.max_tokens is not None else st.default_max_tokens
    if not 1 <= max_tokens <= st.max_tokens_limit:
        raise BadRequest(f"max_tokens={max_tokens}: choose 1..{st.max_tokens_limit}")
    target = st.session.target
    if request.kind == "chat":
        ids = encode_chat(target, request.messages, request.tools, request.uses_tools)
    else:
        ids = list(target.tokenizer.encode(request.prompt))
    if not ids:
        raise BadRequest("the prompt is empty")
    overflow = overflow_message(target, len(ids), max_tokens)
    if overflow:  # a 400 now, not a failure after the request waited in the queue
        raise BadRequest(overflow)
    job = Job(prompt_ids=ids, max_tokens=max_tokens, stop=request.stop, seed=seed, sampling=sampling, k=request.k)
    return job, (seed if temperature > 0 else None)


class _Bridge(queue.Queue):
    """A job's output queue the worker thread puts into and the event loop awaits: each put is
    handed to the loop with call_soon_threadsafe."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop = loop
        self.items: asyncio.Queue = asyncio.Queue()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop has closed (the server stopped): nobody waits for it
            pass


async def _results(job: Job):
    """The job's pieces as they come; ends after ("done", Finished) or ("error", message)."""
    items = job.out.items  # type: ignore[attr-defined]  # a _Bridge (make_app sets it)
    while True:
        try:
            item = await asyncio.wait_for(items.get(), timeout=RESULT_TIMEOUT_S)
        except TimeoutError:
            job.cancelled.set()
            yield ("error", "timed out waiting for the model")
            return
        yield item
        if item[0] != "delta":
            return


async def _whole(state: ServeState, http: Request, kind: str, rid: str, job: Job, seed: int | None) -> Response:
    """Waits for the answer while watching the socket: a client that leaves cancels its job."""
    gone = asyncio.create_task(_disconnected(http))
    answer = asyncio.create_task(_last(job))
    try:
        await asyncio.wait({gone, answer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        _follow(state, rid, False, job, answer)
        return Response(status_code=499)  # nobody reads it: uvicorn drops it with the closed socket
    tag, value = answer.result()
    if tag == "error":
        state.log(_error_fields(rid, False, job, value))
        status = _error_status(value)
        return _json(status, error_body(value, "server_error", status))
    state.log({"id": rid, "stream": False, **_log_fields(value)})
    note(http.scope, prompt_tokens=value.prompt_tokens, completion_tokens=value.completion_tokens)
    return _json(200, completion_body(kind, rid, state.model_name, value, seed))


async def _last(job: Job):
    last = None
    async for item in _results(job):
        last = item
    return last


async def _disconnected(http: Request) -> None:
    """Returns when the client has gone (the body is read: the next ASGI message is the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _stream(state: ServeState, kind: str, rid: str, job: Job, seed: int | None, scope: MutableMapping[str, Any]):
    """The SSE body. Starlette cancels it when the client disconnects: `finally` cancels the job."""
    model = state.model_name
    ended = False
    try:
        if kind == "chat":
            yield _event(
                chunk_body(kind, rid, model, None)
                | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            )
        async for tag, value in _results(job):
            if tag == "delta":  # an answer.Delta, from either worker
                job.mark("sent")
                yield _event(chunk_body(kind, rid, model, value.text) | {"specpipe": delta_fields(value)})
            elif tag == "error":
                ended = True
                state.log(_error_fields(rid, True, job, value))
                yield _event(error_body(value, "server_error", _error_status(value)))
            else:
                ended = True
                state.log({"id": rid, "stream": True, **_log_fields(value)})
                note(scope, prompt_tokens=value.prompt_tokens, completion_tokens=value.completion_tokens)
                yield _event(chunk_body(kind, rid, model, None if kind == "chat" else "", finished=value, seed=seed))
        yield b"data: [DONE]\n\n"
    finally:
        if not ended:  # the client left before the end: stop decoding for it at the next step
            _follow(state, rid, True, job, asyncio.ensure_future(_last(job)))


def _follow(state: ServeState, rid: str, stream: bool, job: Job, answer: asyncio.Future) -> None:
    """Cancel a left client's job (the worker ends it at its next step) and log it once it has ended:
    what it decoded, and how many steps that took."""
    left, steps = time.perf_counter(), state.metrics.value("specpipe_steps_total")
    job.cancelled.set()

    async def follow():
        record = {"id": rid, "stream": stream, "finish_reason": "client_disconnected"}
        try:
            item = await asyncio.wait_for(answer, timeout=DISCONNECTED_WAIT_S)
        except (TimeoutError, asyncio.CancelledError):
            item = None
        if item is not None and item[0] == "done":
            record |= {k: v for k, v in _log_fields(item[1]).items() if k != "finish_reason"}
            record["cancel_s"] = round(time.perf_counter() - left, 6)  # seen to ended: a step or so
            # decoding steps run between the hang-up and the job's end (stamped by the worker)
            ended = job.end_step if job.end_step is not None else state.metrics.value("specpipe_steps_total")
            record["cancel_steps"] = int(ended - steps)
        else:
            record["prompt_tokens"] = len(job.prompt_ids)
        state.log(record)

    task = asyncio.ensure_future(follow())
    state.followers.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(state.followers.discard)


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _error_status(message: str) -> int:
    """503 where the server is going away or cannot answer any more; 500 for this request's own failure."""
    return 503 if message == SHUTTING_DOWN or message.startswith(STOPPED) else 500


def _error_fields(rid: str, stream: bool, job: Job, message: str) -> dict:
    return {
        "id": rid,
        "stream": stream,
        "status": _error_status(message),
        # a request the shutdown took out of the queue was cut, as the decoding ones were
        "finish_reason": "cancelled" if message == SHUTTING_DOWN else "error",
        "error": message,
        "prompt_tokens": len(job.prompt_ids),
    }


def _log_fields(finished) -> dict:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "finish_reason": finished.finish_reason,
        "queue_s": finished.queue_s,
        **finished.stats,
    }
