"""`specpipe-chat --web` in a real headless Chromium (Debian's `chromium`
package), driven over the DevTools protocol: the page loads, a prompt is
typed into the terminal, and the answer is drawn with accepted draft tokens
in the accepted colour (counted in screenshots of the page).

Skips with a plain message where no Chromium is installed (CI machines). The
browser may reach 127.0.0.1 only (`--host-resolver-rules`), every wait is
bounded, and the browser and server are stopped whatever happens.

SPECPIPE_BROWSER_SHOT=PATH keeps the screenshot once the answer has finished;
docs/tui-web.png is made with a real model that way:

    SPECPIPE_BROWSER_SHOT=docs/tui-web.png SPECPIPE_BROWSER_CHAT="model=smollm2-135m max_tokens=100" \
    SPECPIPE_BROWSER_PROMPT="Repeat this sentence three times: the quick brown fox jumps over the lazy dog." \
    python -m pytest -q tests/test_tui_browser.py
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from tui_script import scripted_events
from web_helpers import web_server

from tui.app import ChatApp
from tui.sources import ReplaySource
from tui.widgets.legend import Legend

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium installed (Debian: apt-get install chromium); "
    "the browser test of specpipe-chat --web did not run",
)
# The target drafts for itself: every draft is accepted, so the answer is mostly in the accepted colour.
LIVE = ["model=tiny-random", "draft=model", "draft.model=self", "budget.k=4", "max_tokens=64"]
CHAT = os.environ.get("SPECPIPE_BROWSER_CHAT", "").split() or LIVE
PROMPT = os.environ.get("SPECPIPE_BROWSER_PROMPT", "Say hello")
WINDOW = (1280, 800)


async def accepted_rgb() -> np.ndarray:
    """The clean view's accepted colour in the default theme, as the app itself resolves it."""
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test():
        style = app.query_one(Legend).component_style("accepted-inline")
        return np.array(style.color.get_truecolor(), dtype=np.int16)


@contextlib.contextmanager
def chromium():
    """Headless Chromium with a DevTools port; yields that port."""
    profile = tempfile.mkdtemp(prefix="specpipe-chromium-")
    process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--remote-debugging-port=0",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",  # nothing beyond this machine (fonts CDN)
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file, deadline = Path(profile) / "DevToolsActivePort", time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            time.sleep(0.1)
        yield int(port_file.read_text().split()[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


class DevTools:
    """The few DevTools calls the test needs, over one page's websocket."""

    def __init__(self, ws):
        self.ws, self.ids = ws, itertools.count(1)

    async def call(self, method: str, timeout_s: float = 20, **params):
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout_s
        while True:
            message = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message.get("result", {})

    async def screenshot(self) -> np.ndarray:
        shot = await self.call("Page.captureScreenshot", format="png")
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB"), dtype=np.int16)

    async def key(self, key: str, code: int, text: str) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=key,
                windowsVirtualKeyCode=code,
                text=text if kind == "keyDown" else "",
            )


def coloured_pixels(image: np.ndarray, rgb: np.ndarray, tolerance: int = 12) -> int:
    return int((np.abs(image - rgb).max(axis=2) <= tolerance).sum())


async def test_browser_types_a_prompt_and_sees_a_highlighted_answer():
    rgb = await accepted_rgb()
    with web_server(*CHAT) as url, chromium() as devtools_port:
        async with aiohttp.ClientSession() as http:
            pages = await (await http.get(f"http://127.0.0.1:{devtools_port}/json/list", timeout=10)).json()
            page = next(p for p in pages if p["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                tools = DevTools(ws)
                await tools.call("Page.enable")
                await tools.call("Page.navigate", url=url + "/")
                # textual.js sets this class on the app's first output
                ready = "!!document.body && document.body.classList.contains('-first-byte')"
                await wait_until(
                    lambda: tools.call("Runtime.evaluate", expression=ready),
                    lambda r: r["result"].get("value") is True,
                    60,
                )
                await asyncio.sleep(2)  # the app's first frames
                before = coloured_pixels(await tools.screenshot(), rgb)

                await tools.call(
                    "Runtime.evaluate", expression="document.querySelector('.xterm-helper-textarea').focus()"
                )
                await tools.call("Input.insertText", text=PROMPT)
                await tools.key("Enter", 13, "\r")
                shot = await wait_until(tools.screenshot, lambda image: coloured_pixels(image, rgb) > before + 150, 90)
                if os.environ.get("SPECPIPE_BROWSER_SHOT"):
                    shot = await save_when_settled(tools, Path(os.environ["SPECPIPE_BROWSER_SHOT"]), timeout_s=400)
                after = coloured_pixels(shot, rgb)
    assert after > before + 150, f"accepted-colour pixels: {before} before the prompt, {after} after"


async def save_when_settled(tools: DevTools, path: Path, timeout_s: float) -> np.ndarray:
    """Keep the page's screenshot once it stops changing for 8 s (the answer finished), bounded in time."""
    shot = await tools.call("Page.captureScreenshot", format="png")
    deadline, still_since = time.monotonic() + timeout_s, time.monotonic()
    while time.monotonic() - still_since < 8 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        new = await tools.call("Page.captureScreenshot", format="png")
        if new["data"] != shot["data"]:
            still_since = time.monotonic()
        shot = new
    path.write_bytes(base64.b64decode(shot["data"]))
    return await tools.screenshot()


async def wait_until(probe, done, timeout_s: float):
    """Call `probe` about twice a second until `done(result)`; returns the last result (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe()
        if done(result) or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.5)
