"""HelpScreen: the key bindings and what the views show; fits an 80x24 terminal. Any key closes it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = """\
[b]Enter[/b]        send (replays: play the recording again)
[b]Esc[/b]          stop the answer (what was written is kept)
[b]Ctrl+C[/b]       stop; idle: copy the selection, clear the line, or quit
             (press twice on an empty line)
[b]Ctrl+Q[/b]       quit
[b]Ctrl+N[/b]       new chat            [b]Ctrl+S[/b]  save (resume: --resume FILE)
[b]Ctrl+T[/b]       view: clean -> full -> plain
[b]Ctrl+Y[/b]       copy the last answer (no drafts, no special tokens)
[b]Ctrl+Up/Down[/b] K (draft budget) for the next steps; + / - while answering
[b]F2[/b] config     [b]F1[/b] this help
[b]F3, F4[/b]       view, new chat under --web (browsers keep Ctrl+T, Ctrl+N)

[b]clean[/b]: the answer as text; [i]accepted[/i] draft tokens coloured in place.
The strip under it has one cell per step, as high as the share of the draft
accepted (\u2588 all, \u2581 none, \u00b7 nothing drafted).
[b]full[/b]: rejected drafts struck through where proposed, the target's
[i]recovered[/i] token reversed, a [i]bonus[/i] token bold, special tokens
as \u27e8markers\u27e9."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(KEYS)

    def on_key(self) -> None:
        self.dismiss()

    def on_click(self) -> None:
        self.dismiss()
