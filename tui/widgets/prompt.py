"""The chat's input: a TextArea, so a pasted block keeps every line (code prompts), and Enter still sends.

Contract: `PromptArea` posts `PromptArea.Submitted(area, value)` on Enter; a paste (bracketed, as Textual
asks terminals and browsers for) inserts its text whole, newlines included; Ctrl+J (and Shift+Enter where
the terminal reports it) starts a new line by hand. `value` is the text, as `Input.value` was, so callers
read and clear it the same way. It grows with its text up to the height the stylesheet allows.
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptArea(TextArea):
    BINDINGS = [Binding("ctrl+j,shift+enter", "newline", "New line", show=False)]

    class Submitted(Message):
        """Enter was pressed: `value` is the whole text, every line of it."""

        def __init__(self, area: PromptArea, value: str) -> None:
            super().__init__()
            self.area, self.value = area, value

        @property
        def control(self) -> PromptArea:
            return self.area

    def __init__(self, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(id=id, placeholder=placeholder, soft_wrap=True, highlight_cursor_line=False)

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text

    async def _on_key(self, event: events.Key) -> None:
        # TextArea turns Enter into a newline before any binding sees it; here Enter sends, as Input's did
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")
