"""Answer: one streamed model answer, drawn from its AnswerTranscript.

The app feeds events to `consume` and calls `refresh_text` once per batch;
the widget never sees the pipeline, only events. It draws the answer's text
alone; its step strip and status note ("loading model...", the stop reason)
are a separate widget, so selecting the answer never picks them up. The app
mounts the strip right under it; it is redrawn with the answer.
"""

from __future__ import annotations

from tui.transcript import SPECIAL, AnswerTranscript
from tui.widgets.step_strip import StepStrip
from tui.widgets.token_view import TokenView


class Answer(TokenView):
    def __init__(self, decode=None, mode: str = "clean", special=SPECIAL, **kwargs):
        super().__init__("", **kwargs)
        self.transcript = AnswerTranscript(decode)
        self.mode = mode  # one of token_view.MODES
        self.special = special  # the special-token pattern (the live tokenizer's, once loaded)
        self.note = ""  # status line under the text: "loading model...", stop reason, error
        self.strip = StepStrip(classes="strip")

    def on_mount(self) -> None:
        # Events may arrive before the widget is mounted (a replay posts a whole answer at once):
        # drawing again once mounted makes the layout measure the full text, not the first line.
        self.refresh_text()

    def consume(self, event) -> None:
        self.transcript.consume(event)

    @property
    def text(self) -> str:
        """The answer as the model wrote it (rejected drafts excluded)."""
        return self.transcript.text

    @property
    def answer(self) -> str:
        """What copying yields: no rejected drafts, no special tokens."""
        return self.transcript.answer(self.special)

    def refresh_text(self) -> None:
        self.update(self.styled(self.transcript.pieces, self.mode, self.special))
        self.display = bool(self.transcript.pieces)  # no empty line before the first token
        plain = self.mode == "plain"
        self.strip.show_steps([] if plain else self.transcript.steps, self.note, self.transcript.branches)
