"""The `--web` server: textual-serve bound to 127.0.0.1, stopped by SIGINT / SIGTERM
with the exit codes the other specpipe commands use (130 / 143).

Each browser tab gets its own app process (textual-serve runs the command per
websocket); this module never imports the app or mlx.
"""

from __future__ import annotations

import asyncio
import signal

from textual_serve.server import Server

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


class LocalServer(Server):
    def __init__(self, command: str, port: int):
        super().__init__(command, host="127.0.0.1", port=port, title="specpipe-chat")
        self.exit_code = 0

    async def on_startup(self, app) -> None:
        await super().on_startup(app)
        loop = asyncio.get_running_loop()
        for sig, code in SIGNAL_EXIT.items():  # replaces textual-serve's handlers, which cannot tell the signals apart
            loop.add_signal_handler(sig, self._stop, code)

    def _stop(self, code: int) -> None:
        self.exit_code = code
        self.request_exit()
