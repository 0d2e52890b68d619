"""Answer: one streamed model answer, drawn from its AnswerTranscript.

The app feeds events to `consume` and calls `refresh_text` once per batch;
the widget never sees the pipeline, only events.
"""

from __future__ import annotations

from tui.transcript import AnswerTranscript
from tui.widgets.token_view import TokenView


class Answer(TokenView):
    def __init__(self, decode=None, mode: str = "all", **kwargs):
        super().__init__("", **kwargs)
        self.transcript = AnswerTranscript(decode)
        self.mode = mode  # see TokenView.styled
        self.note = ""  # status line under the text: "loading model...", stop reason, error

    def consume(self, event) -> None:
        self.transcript.consume(event)

    @property
    def text(self) -> str:
        return self.transcript.text

    def refresh_text(self) -> None:
        body = self.styled(self.transcript.pieces, self.mode)
        if self.note:
            body.append(("\n" if body.plain else "") + self.note, "italic dim")
        self.update(body)
