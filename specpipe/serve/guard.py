"""Who may talk to the server: an ASGI middleware in front of every route.

Contract: `Guard(app, policy)` refuses, in OpenAI's error shape and one line each,
- a `Host` header that is not the bound address (DNS rebinding: a web page whose name resolves to
  127.0.0.1 would otherwise read the answers) -> 400; with `allow_remote` any Host passes (the key guards);
- an `Origin` that is neither this server's own nor in `allowed_origins` -> 403 (a page on another
  origin may not drive the API even where the browser lets the request through without a preflight);
- a POST whose `Content-Type` is not `application/json` -> 415 (`text/plain` needs no CORS preflight);
- a missing or wrong `Authorization: Bearer <key>` when a key is set -> 401 (compared in constant time).
An allowed origin gets the CORS headers it needs, its preflight `OPTIONS` a 204 that allows the request
headers it asks for (the OpenAI JS SDK's `x-stainless-*`, `openai-organization`...: mlx_lm.server and
llama-server allow any; the checks above are what guard the API, not the header list). /health needs no key
(a load balancer's probe) but still a local Host. No HTTP framing here: uvicorn/h11 refuse bad framing.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from dataclasses import dataclass, field

CORS_MAX_AGE_S = "600"
ALWAYS_ALLOWED_HEADERS = ("Authorization", "Content-Type")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: anything else is not echoed
OPEN_PATHS = ("/health",)  # answered without a key: it tells nothing but "up" and the queue length


@dataclass
class Policy:
    hosts: set[str]  # Host header values accepted (host:port); empty: any (allow_remote)
    allowed_origins: set[str] = field(default_factory=set)
    api_key: str | None = None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_hosts(host: str, port: int) -> set[str]:
    """The Host values a client on this machine sends for a loopback bind (any loopback spelling)."""
    names = {"127.0.0.1", "localhost", "[::1]"} | ({f"[{host}]" if ":" in host else host})
    hosts = {f"{n}:{port}" for n in names}
    return hosts | (names if port == 80 else set())


def policy_for(host: str, port: int, allow_remote: bool, api_key: str | None, allowed_origins) -> Policy:
    return Policy(
        hosts=set() if allow_remote and not is_loopback(host) else local_hosts(host, port),
        allowed_origins={o.rstrip("/") for o in allowed_origins or ()},
        api_key=api_key or None,
    )


class Guard:
    def __init__(self, app, policy: Policy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.refusal(scope, headers)
        origin = headers.get("origin")
        cors = origin is not None and origin.rstrip("/") in self.policy.allowed_origins
        if refusal is not None:
            await _error(send, *refusal, cors_origin=origin if cors else None)
            return
        if scope["method"] == "OPTIONS":  # a CORS preflight from an allowed origin (refusal let it through)
            await _preflight(send, origin or "", headers.get("access-control-request-headers", ""))
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_cors_headers(origin or "")]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def refusal(self, scope, headers: dict) -> tuple[int, str, str] | None:
        """(status, message, error type) when the request is refused, else None."""
        p = self.policy
        host = headers.get("host", "")
        if p.hosts and host not in p.hosts:
            return (
                400,
                f"Host {host!r} is not this server's address ({sorted(p.hosts)[0]}): "
                "send the request to the address the server printed at start",
                "invalid_request_error",
            )
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/") not in p.allowed_origins and origin != f"http://{host}":
            return (
                403,
                f"Origin {origin!r} may not use this server: add it to allowed_origins=[...] to let that page in",
                "permission_error",
            )
        if scope["method"] == "OPTIONS":
            if origin is None:
                return (
                    405,
                    "OPTIONS is only answered as a CORS preflight (with an Origin header)",
                    "invalid_request_error",
                )
            return None  # a preflight carries no key: the browser sends it before the real request
        if p.api_key is not None and scope["path"] not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), p.api_key.encode())
            if not ok:
                why = "no Authorization header" if not auth else "a wrong API key"
                return (
                    401,
                    f"{why}: send Authorization: Bearer <key> with the server's api_key (or SPECPIPE_API_KEY)",
                    "invalid_api_key",
                )
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return (
                    415,
                    f"Content-Type {kind or 'missing'!r}: send the JSON body with Content-Type: application/json",
                    "invalid_request_error",
                )
        return None


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"vary", b"Origin"),
    ]


def allowed_request_headers(requested: str) -> str:
    """The preflight's Access-Control-Allow-Headers: what the page asked for, plus Authorization and
    Content-Type (a `*` would not cover Authorization in browsers, so the names are echoed)."""
    names = list(ALWAYS_ALLOWED_HEADERS)
    for name in (n.strip() for n in requested.split(",")):
        if _HEADER_NAME.fullmatch(name) and name.lower() not in {n.lower() for n in names}:
            names.append(name)
    return ", ".join(names)


async def _preflight(send, origin: str, requested_headers: str) -> None:
    headers = [
        *_cors_headers(origin),
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", allowed_request_headers(requested_headers).encode("latin-1")),
        (b"access-control-max-age", CORS_MAX_AGE_S.encode()),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _error(send, status: int, message: str, kind: str, cors_origin: str | None = None) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if cors_origin:  # an allowed page may read why it was refused
        headers += _cors_headers(cors_origin)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
