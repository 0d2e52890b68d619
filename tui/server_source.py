"""ServerSource: the chat app's answers come from a running `specpipe-serve`, not a local model.

Same interface as `LiveSource` (`generate(messages, control) -> Iterator[Event]`, `decode`,
`special`, `k`, `config_yaml`, `replay = False`). Each answer is one streamed POST to
`/v1/chat/completions` (stdlib `http.client`, no new dependency); its SSE chunks become
specpipe events: RunStarted, the steps' events, RunFinished with the text and the final chunk's
usage / `specpipe` figures where they fit RunStats. A server error mid-answer becomes RunError
then RunFinished(stop_reason="error"), keeping what was shown.

Each chunk's `specpipe.ids` / `specpipe.rejected` (docs/serve.md) give the tokens with their
roles and the rejected drafts, step by step: each step becomes the Drafted / Verified / Emitted
a local run yields (`ServedSteps`), so the app shows accepted, rejected, recovered and bonus
spans as for a local chat, rejected drafts included. A server without those fields (an older
specpipe-serve) sends text and counts only: then one Emitted per chunk, with one `UNKNOWN_ID`
per token the chunk took (`from_draft` its accepted drafts), as one highlighted span.
A stop request (`control.stop_requested`) shuts the socket: the server sees the client leave
and frees the batch slot at its next step. `check_server(url)` is the start-up check
(`/v1/models`): one actionable line when the server cannot be used.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import msgspec

from specpipe.events import Drafted, Emitted, Event, ModelInfo, RunError, RunFinished, RunStarted, RunStats, Verified
from tui.transcript import SPECIAL

UNKNOWN_ID = -1  # the server streams text only; one of these per token keeps the token counts
CHECK_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0  # a long prefill on a busy server sends nothing for a while
STOP_POLL_S = 0.05
_STATS_FIELDS = set(RunStats.__struct_fields__)


class ServerUnavailable(ValueError):
    """The server cannot be used; the message is one line that says what to do."""


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL. Raises ServerUnavailable for anything else."""
    parts = urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port < 1 or parts.path.strip("/"):
        raise ServerUnavailable(f"serve.url={url!r}: give the server's base URL, e.g. http://127.0.0.1:8000")
    return parts.hostname, port


def check_server(url: str, timeout: float = CHECK_TIMEOUT_S) -> str:
    """The served model's name, read from `/v1/models`. Raises ServerUnavailable (one line)."""
    parse_url(url)
    hint = "start `specpipe-serve` or fix serve.url"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read())
        return str(data["data"][0]["id"])
    except urllib.error.HTTPError as exc:
        raise ServerUnavailable(f"{url} answered {exc.code} on /v1/models: is it a specpipe-serve? {hint}") from None
    except urllib.error.URLError as exc:
        reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
        raise ServerUnavailable(f"cannot reach {url} ({reason.lower()}): {hint}") from None
    except (OSError, TimeoutError) as exc:
        raise ServerUnavailable(f"cannot reach {url} ({exc or type(exc).__name__}): {hint}") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerUnavailable(f"{url}/v1/models did not list a model: is it a specpipe-serve? {hint}") from None


def server_setup(url: str, timeout: float = CHECK_TIMEOUT_S) -> dict:
    """The `specpipe` entry of `/v1/models` (drafter, budget label, fixed K); {} from a server without one."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
            entry = json.loads(resp.read())["data"][0].get("specpipe")
        return entry if isinstance(entry, dict) else {}
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return {}  # the panel then says "server": the answers still come


class ServerSource:
    """Answers from a `specpipe-serve` at `url` (its model, drafter and K are the server's).

    Args:
        url: the server's base URL, e.g. http://127.0.0.1:8000.
        model: the served model's name (from `check_server`), shown in RunStarted.
        max_tokens: sent with each request; None leaves the server's default.
    """

    replay = False
    decode = None  # no tokenizer here: the server sends text
    special = SPECIAL
    k = None  # the server's budget until the user sets K: then each request carries it (specpipe.k)
    k_live = False  # a K changed mid-answer reaches the server with the next request, not this stream

    def __init__(self, url: str, model: str, max_tokens: int | None = None):
        self.host, self.port = parse_url(url)
        self.url, self.model, self.max_tokens = url.rstrip("/"), model, max_tokens
        self.setup = server_setup(self.url)  # the server's drafter, budget and K, for the side panel
        self.config_yaml = f"serve:\n  url: {self.url}\n  model: {model}\n"

    def generate(self, messages: list[dict], control) -> Iterator[Event]:
        start = time.monotonic()
        yield RunStarted(
            target=ModelInfo(name=self.model, source="server", arch="", precision=""),
            drafter=str(self.setup.get("drafter") or "server"),
            budget=str(self.setup.get("budget") or "server"),
            rollback="server",
            compare="server",
            prompt_text=messages[-1]["content"],
            max_tokens=self.max_tokens or 0,
            config_yaml=self.config_yaml,
        )
        body: dict = {"messages": messages, "stream": True}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if control.k is not None:  # the user's K (+ / - keys): this request's fixed K on the server
            body["specpipe"] = {"k": control.k}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=READ_TIMEOUT_S)
        done = threading.Event()
        texts: list[str] = []
        ids: list[int] = []
        steps = ServedSteps()
        final: dict = {}
        error = ""
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                error = f"the server answered {resp.status}: {_error_message(resp.read())}"
            else:
                threading.Thread(target=_close_on_stop, args=(conn, control, done), daemon=True).start()
                for chunk in _sse_chunks(resp):
                    if "error" in chunk:
                        error = _error_message(json.dumps(chunk).encode())
                        break
                    piece = chunk.get("choices", [{}])[0].get("delta", {}).get("content")
                    figures = chunk.get("specpipe") or {}
                    if isinstance(figures.get("ids"), list):  # token ids with roles: the steps themselves
                        texts.append(piece or "")
                        for event in steps.chunk(figures, time.monotonic() - start):
                            ids += event.token_ids if isinstance(event, Emitted) else []
                            yield event
                            if control.stop_requested:
                                break  # the chunk's later steps stay unshown
                    elif piece:
                        tokens = int(figures.get("tokens") or 1)
                        texts.append(piece)
                        ids += [UNKNOWN_ID] * tokens
                        yield Emitted(
                            t=time.monotonic() - start,
                            step=len(texts) - 1,
                            token_ids=[UNKNOWN_ID] * tokens,
                            text=piece,
                            from_draft=min(int(figures.get("from_draft") or 0), tokens),
                        )
                    if "usage" in chunk:
                        final = chunk
                    if control.stop_requested:
                        break  # chunks already read stay unshown: the stop lands at once
        except (OSError, http.client.HTTPException) as exc:
            if not control.stop_requested:
                error = f"lost the server at {self.url} ({exc or type(exc).__name__})"
        finally:
            done.set()
            conn.close()
        t = time.monotonic() - start
        for event in [] if control.stop_requested else steps.end(t, "".join(texts)):
            ids += event.token_ids if isinstance(event, Emitted) else []  # a step cut by EOS / max_tokens
            yield event
        if not (error or final or control.stop_requested):
            error = f"the stream from {self.url} ended before its last chunk"
        if error:
            yield RunError(t=t, message=error)
        reason = "error" if error else "stopped" if control.stop_requested else _reason(final)
        text = steps.shown if steps.used else "".join(texts)  # what the events showed
        yield RunFinished(t=t, stop_reason=reason, token_ids=ids, text=text, stats=_stats(final, t))

    def refine_idle(self, should_stop) -> None:
        pass  # the server refines its own cost model between requests

    def close(self) -> None:
        pass  # nothing held between answers: each one is its own connection


class ServedSteps:
    """The step events a local run yields, rebuilt from the chunks' token roles.

    A step's events come once its tokens are in: at the target's own token (bonus, recovered,
    plain), which ends every step but one cut short (EOS, max_tokens: `end`). Example: ids
    [{5 accepted step 3}, {8 recovered step 3}] with rejected [{step 3, ids [9]}] -> Drafted(draft_ids
    [5, 9]), Verified(accepted [5], rejected [9], recovered 8), Emitted([5, 8], from_draft=1).
    """

    def __init__(self) -> None:
        self._tokens: dict[int, list[dict]] = {}  # step -> its tokens so far
        self._rejected: dict[int, dict] = {}  # step -> its rejection
        self.shown = ""  # the text the rebuilt Emitted events carry
        self.used = False  # the server sent token ids (an older one sends text only)

    def chunk(self, figures: dict, t: float) -> Iterator[Event]:
        self.used = True
        for r in figures.get("rejected") or []:
            self._rejected[int(r["step"])] = r
        for token in figures["ids"]:
            step = int(token["step"])
            self._tokens.setdefault(step, []).append(token)
            if token.get("role") != "accepted":  # the step's own token: the step is whole
                yield from self._step(step, t)

    def end(self, t: float, received: str) -> Iterator[Event]:
        """The steps still open, then any text the tokens did not carry (an older server's tail) as one span."""
        for step in sorted(set(self._tokens) | set(self._rejected)):
            yield from self._step(step, t)
        if self.used and received.startswith(self.shown) and len(received) > len(self.shown):
            extra = received[len(self.shown) :]
            self.shown = received
            yield Emitted(t=t, step=-1, token_ids=[UNKNOWN_ID], text=extra, from_draft=0, token_texts=[extra])

    def _step(self, step: int, t: float) -> Iterator[Event]:
        tokens, rejection = self._tokens.pop(step, []), self._rejected.pop(step, {})
        accepted = [int(x["id"]) for x in tokens if x.get("role") == "accepted"]
        own = [x for x in tokens if x.get("role") != "accepted"]
        rejected = [int(i) for i in rejection.get("ids", [])]
        last = int(own[-1]["id"]) if own else None
        recovered = last if own and own[-1].get("role") == "recovered" else None
        yield Drafted(t=t, step=step, k=len(accepted) + len(rejected), draft_ids=accepted + rejected, seconds=0.0)
        yield Verified(
            t=t,
            step=step,
            accepted_ids=accepted,
            rejected_ids=rejected,
            recovered_id=recovered,
            bonus_id=last if recovered is None else None,
            seconds=0.0,
            rejected_text=str(rejection.get("text") or ""),
        )
        pieces = [str(x.get("text") or "") for x in tokens]
        self.shown += "".join(pieces)
        ids = [int(x["id"]) for x in tokens]
        yield Emitted(t=t, step=step, token_ids=ids, text="".join(pieces), from_draft=len(accepted), token_texts=pieces)


def _close_on_stop(conn: http.client.HTTPConnection, control, done: threading.Event) -> None:
    """Shut the socket once a stop is asked: the blocked read ends and the server frees the slot."""
    while not done.wait(STOP_POLL_S):
        if control.stop_requested:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the other side
            return


def _sse_chunks(resp) -> Iterator[dict]:
    """The JSON objects of an SSE stream's `data:` lines, until `[DONE]` or the end."""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _error_message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"]).splitlines()[0]
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace").strip().splitlines()[0] if raw.strip() else "no message"


def _reason(final: dict) -> str:
    """OpenAI's finish_reason as a specpipe stop_reason: `stop` is EOS or a stop string, `length` max_tokens."""
    reason = final.get("choices", [{}])[0].get("finish_reason")
    return {"stop": "eos", "length": "max_tokens"}.get(reason, reason or "eos")


def _stats(final: dict, wall_s: float) -> RunStats:
    """RunStats from the last chunk's usage and `specpipe` figures (the fields RunStats has)."""
    usage = final.get("usage") or {}
    figures = {k: v for k, v in (final.get("specpipe") or {}).items() if k in _STATS_FIELDS}
    figures.setdefault("steps", figures.get("target_forwards", 0))  # one target forward per batch step
    figures |= {"prompt_tokens": usage.get("prompt_tokens", 0), "generated_tokens": usage.get("completion_tokens", 0)}
    try:
        return msgspec.convert({**figures, "wall_s": wall_s}, RunStats)
    except msgspec.ValidationError:  # a server of another version: keep the counts at least
        return RunStats(wall_s=wall_s, **{k: figures[k] for k in ("prompt_tokens", "generated_tokens")})
