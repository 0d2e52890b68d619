"""HelpScreen: the key bindings and what the token styles mean. Any key closes it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.widgets.legend import Legend

KEYS = """\
[b]Enter[/b]          send the message
[b]Escape, Ctrl+C[/b] stop generating (the partial answer is kept)
[b]Ctrl+N[/b]         new chat (clears history and figures)
[b]+ / -[/b]          K (draft budget) for the next steps (Ctrl+Up / Ctrl+Down in the input)
[b]Ctrl+T[/b]         highlighting: all -> without rejected drafts -> off
[b]F2[/b]             composed config
[b]F1, ?[/b]          this help
[b]Ctrl+Q[/b]         quit

Each step the drafter proposes K tokens and one target forward checks them:
[i]accepted[/i] draft tokens are kept, the [i]rejected[/i] rest is shown struck
through (never part of the answer), then the target's own token follows:
[i]recovered[/i] at the first rejection, or a [i]bonus[/i] when all K were accepted.
Plain decoding (draft=none) shows [i]target[/i] tokens only."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape,f1,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(KEYS)
            yield Legend()

    def on_click(self) -> None:
        self.dismiss()
