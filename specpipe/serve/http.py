"""The HTTP layer: routes OpenAI-style requests to the GenerationWorker, JSON or server-sent events.

`make_server(state, host, port)` returns a ThreadingHTTPServer (one thread per connection;
decoding itself happens in the worker's one thread). Routes: GET /v1/models, GET /health,
GET /metrics (Prometheus text), POST /v1/chat/completions, POST /v1/completions. A bad request
is a 400 with one line; a full queue a 429; a client that disconnects mid-stream frees its
batch slot at the next step. Streamed chunks carry `specpipe.tokens` / `specpipe.from_draft`:
how many tokens the chunk's text took and how many of them were accepted drafts.
"""

from __future__ import annotations

import json
import queue
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specpipe.core.sampling import check_sampling
from specpipe.engine.context import overflow_message
from specpipe.serve.openai_api import (
    BadRequest,
    chunk_body,
    completion_body,
    error_body,
    new_id,
    parse_chat,
    parse_completion,
)
from specpipe.serve.prometheus import Metrics
from specpipe.serve.worker import Job, QueueFull

MAX_BODY = 8 << 20  # 8 MiB: a long prompt fits; anything larger is refused before it is read
RESULT_TIMEOUT_S = 3600  # a request never waits forever for its worker


class ServeState:
    """What every request handler needs: the session (tokenizer, config), the worker, a request log."""

    def __init__(self, session, worker, model_name: str, log=None, metrics: Metrics | None = None):
        self.session, self.worker, self.model_name = session, worker, model_name
        self.log = log or (lambda record: None)
        self.metrics = metrics or Metrics()
        self.per_request_sampling = hasattr(worker, "decoder")  # batched rows each own a seeded sampler
        s = session.cfg
        self.temperature = float(s.sampling.temperature)
        self.default_max_tokens = int(s.max_tokens)
        self.max_tokens_limit = int(s.get("max_tokens_limit", 4096))


def make_server(state: ServeState, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    state: ServeState
    protocol_version = "HTTP/1.1"
    server_version = "specpipe-serve"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # requests are logged as JSON lines by the state's log, not as Apache lines on stderr

    # ------------------------------------------------------------------ routes

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path.rstrip("/") == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.state.model_name, "object": "model", "created": 0, "owned_by": "specpipe"}],
                },
            )
        elif self.path.rstrip("/") == "/health":
            self._json(200, {"status": "ok", "waiting": self.state.worker.waiting()})
        elif self.path.rstrip("/") == "/metrics":
            self.state.metrics.set("specpipe_queue_length", self.state.worker.waiting())
            self._send(200, self.state.metrics.render().encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, error_body(f"no route GET {self.path}: try /v1/models", "not_found"))

    def do_POST(self):  # noqa: N802
        route = self.path.rstrip("/")
        parsers = {"/v1/chat/completions": parse_chat, "/v1/completions": parse_completion}
        if route not in parsers:
            self._json(
                404, error_body(f"no route POST {self.path}: use /v1/chat/completions or /v1/completions", "not_found")
            )
            return
        try:
            request = parsers[route](self._body())
            job = self._job(request)
            self.state.worker.submit(job)
        except BadRequest as exc:
            self.state.metrics.count("specpipe_requests_total", status="bad_request")
            self.state.log({"route": route, "status": 400, "finish_reason": "bad_request", "error": str(exc)})
            self._json(400, error_body(str(exc)))
            return
        except QueueFull as exc:
            self.state.metrics.count("specpipe_requests_total", status="rejected_queue_full")
            self.state.log({"route": route, "status": 429, "finish_reason": "rejected_queue_full", "error": str(exc)})
            self._json(429, error_body(f"busy: {exc}; retry later", "server_busy"))
            return
        rid = new_id(request.kind)
        if request.stream:
            self._stream(request.kind, rid, job)
        else:
            self._whole(request.kind, rid, job)

    # ------------------------------------------------------------------ pieces

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise BadRequest(f"the body is {length} bytes; at most {MAX_BODY}")
        return self.rfile.read(length)

    def _job(self, request) -> Job:
        st = self.state
        sampling = {}
        if st.per_request_sampling:
            s = st.session.cfg.sampling
            temperature = s.temperature if request.temperature is None else request.temperature
            top_p = s.top_p if request.top_p is None else request.top_p
            message = check_sampling(temperature, 0, top_p, 0.0, 0 if request.seed is None else request.seed)
            if message:
                raise BadRequest(message.replace("sampling.", ""))
            sampling = {
                k: v for k, v in (("temperature", request.temperature), ("top_p", request.top_p)) if v is not None
            }
        elif request.temperature is not None and abs(request.temperature - st.temperature) > 1e-9:
            how = "sampling=greedy" if st.temperature == 0 else f"sampling.temperature={st.temperature}"
            raise BadRequest(
                f"temperature={request.temperature}: this server decodes with {how}; send that "
                "temperature (or none), or start a server with the sampling you want"
            )
        max_tokens = request.max_tokens if request.max_tokens is not None else st.default_max_tokens
        if not 1 <= max_tokens <= st.max_tokens_limit:
            raise BadRequest(f"max_tokens={max_tokens}: choose 1..{st.max_tokens_limit}")
        target = st.session.target
        if request.kind == "chat":
            ids = target.encode_messages(request.messages)
        else:
            ids = list(target.tokenizer.encode(request.prompt))
        if not ids:
            raise BadRequest("the prompt is empty")
        overflow = overflow_message(target, len(ids), max_tokens)
        if overflow:  # a 400 now, not a failure after the request waited in the queue
            raise BadRequest(overflow)
        return Job(prompt_ids=ids, max_tokens=max_tokens, stop=request.stop, seed=request.seed, sampling=sampling)

    def _results(self, job: Job):
        """The job's pieces as they come; ends after ("done", Finished) or ("error", message)."""
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while True:
            try:
                item = job.out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                job.cancelled.set()
                yield ("error", "timed out waiting for the model")
                return
            yield item
            if item[0] != "delta":
                return

    def _whole(self, kind: str, rid: str, job: Job) -> None:
        for tag, value in self._results(job):
            if tag == "error":
                self.state.log(_error_fields(rid, False, job, value))
                self._json(500, error_body(value, "server_error"))
            elif tag == "done":
                self.state.log({"id": rid, "stream": False, **_log_fields(value)})
                self._json(200, completion_body(kind, rid, self.state.model_name, value))

    def _stream(self, kind: str, rid: str, job: Job) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        model = self.state.model_name
        try:
            if kind == "chat":
                self._event(
                    chunk_body(kind, rid, model, None)
                    | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                )
            for tag, value in self._results(job):
                if tag == "delta":
                    body = chunk_body(kind, rid, model, getattr(value, "text", value))
                    if hasattr(value, "from_draft"):  # a client may highlight the accepted drafts
                        body["specpipe"] = {"tokens": value.tokens, "from_draft": value.from_draft}
                    self._event(body)
                elif tag == "error":
                    self.state.log(_error_fields(rid, True, job, value))
                    self._event(error_body(value, "server_error"))
                else:
                    self.state.log({"id": rid, "stream": True, **_log_fields(value)})
                    self._event(chunk_body(kind, rid, model, None if kind == "chat" else "", finished=value))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            job.cancelled.set()  # the client left: stop decoding for it at the next step
            self.state.log(
                {
                    "id": rid,
                    "stream": True,
                    "finish_reason": "client_disconnected",
                    "prompt_tokens": len(job.prompt_ids),
                }
            )

    def _event(self, body: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, body: dict) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _error_fields(rid: str, stream: bool, job: Job, message: str) -> dict:
    return {
        "id": rid,
        "stream": stream,
        "status": 500,
        "finish_reason": "error",
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
