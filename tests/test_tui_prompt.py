"""The chat input keeps a pasted block whole (code prompts span lines), Enter sends all of it, Ctrl+J starts a
new line by hand."""

from __future__ import annotations

from test_tui import SIZE, tiny_cfg, wait_for
from textual import events

from tui.app import ChatApp
from tui.sources import LiveSource

CODE = "Add type hints:\n\ndef area(w, h):\n    return w * h\n"


async def test_a_pasted_block_is_sent_whole(tmp_path):
    # a model that cannot load: the turn is still drawn with the text that was sent, and no model is needed
    app = ChatApp(LiveSource(tiny_cfg(f"model.path={tmp_path}/missing.gguf", "model.name=null")))
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one("#prompt")
        await pilot.click("#prompt")
        app.post_message(events.Paste(CODE))  # as a terminal delivers a bracketed paste: to the app
        await pilot.pause()
        assert prompt.value == CODE  # every line, not the first one only
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.control is None)
        sent = app.query(".user").last()
        assert str(sent.render()) == CODE.strip()
        assert prompt.value == ""


async def test_ctrl_j_starts_a_new_line_and_enter_sends(tmp_path):
    app = ChatApp(LiveSource(tiny_cfg(f"model.path={tmp_path}/missing.gguf", "model.name=null")))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one("#prompt").value == "a\nb"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.control is None)
        assert str(app.query(".user").last().render()) == "a\nb"
