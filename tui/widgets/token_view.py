"""TokenView: a Static that draws `Piece`s with themeable per-kind styles.

Styles live in app.tcss as component classes (`tokens--accepted`, ...), so a
theme can recolour them; each also has a text style (underline, bold, strike,
dim) that survives 256-colour and no-colour terminals.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.transcript import KINDS, Piece, printable

MODES = ("all", "kept", "off")  # highlighting, cycled with ctrl+t


class TokenView(Static):
    COMPONENT_CLASSES = {f"tokens--{kind}" for kind in KINDS}

    def styled(self, pieces: list[Piece], mode: str = "all") -> Text:
        """Rich Text of the pieces.

        mode: "all" styles every kind and shows rejected drafts; "kept" styles
        only what is in the answer; "off" is the plain answer.
        """
        text = Text()
        for piece in pieces:
            if piece.kind == "rejected" and mode != "all":
                continue
            style = self.get_component_rich_style(f"tokens--{piece.kind}", partial=True) if mode != "off" else ""
            text.append(printable(piece.text), style)
        return text
