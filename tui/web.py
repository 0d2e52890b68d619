"""The `--web` server: textual-serve bound to 127.0.0.1, for this machine's browser only, stopped by
SIGINT / SIGTERM with the exit codes the other specpipe commands use (130 / 143).

Each browser tab gets its own app process (textual-serve runs the command per websocket, through
`sh -c`). Two things textual-serve leaves open are closed here:
- who may connect: a request whose `Host` is not this server's loopback address, or whose `Origin`
  is not one of them, is refused (403) before a page or a websocket (a model load per connection)
  is served: without it any web page the user visits could start the app, type into it and read it;
- who may frame it: no page (`frame-ancestors 'none'`, `X-Frame-Options: DENY` on every response);
- no orphans: every app runs in its own process group; when its tab leaves (even during start-up,
  when the app cannot yet read textual-serve's "quit") or the server stops, the group gets SIGTERM,
  then SIGKILL after `KILL_AFTER_S` (an app still loading a model has ignored SIGTERM).
This module never imports the app or mlx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from aiohttp import web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

from specpipe.serve.guard import local_hosts

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
QUIT_WAIT_S = 2.0  # an app that got "quit" has this long to end by itself
KILL_AFTER_S = 3.0  # then SIGTERM to its group, and SIGKILL this much later


class LocalServer(Server):
    def __init__(self, command: str, port: int):
        super().__init__(command, host="127.0.0.1", port=port, title="specpipe-chat")
        self.exit_code = 0
        self.hosts = local_hosts("127.0.0.1", port)  # the Host values the API server accepts too
        self.origins = {f"http://{h}" for h in self.hosts}
        self.apps: set[asyncio.subprocess.Process] = set()  # every app process still running

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._local_only)
        app.on_response_prepare.append(_not_frameable)
        return app

    @web.middleware
    async def _local_only(self, request: web.Request, handler):
        host, origin = request.headers.get("Host", ""), request.headers.get("Origin")
        if host not in self.hosts:
            return web.Response(
                status=403, text=f"Host {host!r} is not this server's address (127.0.0.1:{self.port})\n"
            )
        if origin is not None and origin not in self.origins:
            return web.Response(
                status=403, text=f"Origin {origin!r} may not open specpipe-chat: open it from this machine\n"
            )
        return await handler(request)

    async def on_startup(self, app) -> None:
        await super().on_startup(app)
        loop = asyncio.get_running_loop()
        for sig, code in SIGNAL_EXIT.items():  # replaces textual-serve's handlers, which cannot tell the signals apart
            loop.add_signal_handler(sig, self._stop, code)

    async def on_shutdown(self, app) -> None:
        """The server stops: so does every app it started (before aiohttp cancels their handlers)."""
        await asyncio.gather(*(end_process(p) for p in list(self.apps)))

    def _stop(self, code: int) -> None:
        self.exit_code = code
        self.request_exit()

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's handler, with an app service that owns its process group."""
        websocket = web.WebSocketResponse(heartbeat=15)
        width = to_int(request.query.get("width", "80"), 80)
        height = to_int(request.query.get("height", "24"), 24)
        app_service: OwnedApp | None = None
        try:
            await websocket.prepare(request)
            app_service = OwnedApp(
                self.command,
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=websocket.close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            app_service.registry = self.apps
            await app_service.start(width, height)
            await self._process_messages(websocket, app_service)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception:  # a broken socket or message ends this tab, not the server
            pass
        finally:
            if app_service is not None:
                await app_service.stop()
        return websocket


class OwnedApp(AppService):
    """An app process in its own session (process group), ended with its tab."""

    registry: set

    async def _open_app_process(self, width: int = 80, height: int = 24):
        environment = self._build_environment(width=width, height=height)
        self._process = process = await asyncio.create_subprocess_shell(
            self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            start_new_session=True,  # its group: `sh -c` and the app end together
        )
        self._stdin = process.stdin
        self.registry.add(process)
        return process

    async def stop(self) -> None:
        process = self._process
        if self._task is not None:
            try:  # textual-serve's way first: "quit", then wait for the output to end
                await asyncio.wait_for(super().stop(), QUIT_WAIT_S)
            except (TimeoutError, ConnectionError, RuntimeError):
                self._task = None
        if process is not None:
            await end_process(process)
            self.registry.discard(process)


async def _not_frameable(request: web.Request, response: web.StreamResponse) -> None:
    """No page may show this one in a frame (each hidden frame would start an app and load a model, and a page
    over it could steer the clicks): CSP for today's browsers, X-Frame-Options for older ones."""
    response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
    response.headers["X-Frame-Options"] = "DENY"


async def end_process(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the process's group, SIGKILL after KILL_AFTER_S, then reap it."""
    if process.returncode is not None:
        return  # it ended by itself (and its group with it)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), KILL_AFTER_S)
        if process.returncode is not None:
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # an app that outlived `sh` in the group
