"""TokenView: a Static that draws `Piece`s with themeable per-kind styles.

Styles live in app.tcss as component classes (`tokens--accepted`, ...), so a
theme can recolour them; each also has a text style (underline, bold, strike,
dim) that survives 256-colour and no-colour terminals.

Views (cycled with ctrl+t):
- "clean" (default): the answer as plain text, accepted draft tokens coloured
  in place (LM Studio's convention); no rejected drafts, no special tokens.
- "full": every kind styled, rejected drafts struck through where they were
  proposed, special tokens as dim markers (`⟨im_end⟩`), never as raw text.
- "plain": the answer alone, unstyled.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import Static

from tui.transcript import ACCEPTED, KINDS, REJECTED, SPECIAL, Piece, printable, split_special

MODES = ("clean", "full", "plain")


def special_marker(token: str) -> str:
    """`<|im_end|>` -> `⟨im_end⟩`: says what the token was without reading as text."""
    return f"\u27e8{token.strip('<>|')}\u27e9"


class TokenView(Static):
    COMPONENT_CLASSES = {f"tokens--{kind}" for kind in KINDS} | {"tokens--accepted-inline", "tokens--special"}

    def styled(self, pieces: list[Piece], mode: str = "clean", special: re.Pattern = SPECIAL) -> Text:
        """Rich Text of the pieces in one of MODES."""
        text = Text()
        for piece in pieces:
            if piece.kind == REJECTED and mode != "full":
                continue
            style = self.piece_style(piece.kind, mode)
            for segment, is_special in split_special(piece.text, special):
                if not is_special:
                    text.append(printable(segment), style)
                elif mode == "full":
                    text.append(special_marker(segment), self.component_style("special") + style)
        return text

    def piece_style(self, kind: str, mode: str):
        if mode == "full":
            return self.component_style(kind)
        if mode == "clean" and kind == ACCEPTED:
            return self.component_style("accepted-inline")
        return ""

    def component_style(self, name: str):
        return self.get_component_rich_style(f"tokens--{name}", partial=True)
