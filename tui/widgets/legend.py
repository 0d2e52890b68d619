"""Legend: one sample of each token style, drawn with the same component classes as answers."""

from __future__ import annotations

from tui.transcript import ACCEPTED, BONUS, RECOVERED, REJECTED, TARGET, Piece
from tui.widgets.token_view import TokenView

GAP = Piece("  ", TARGET, 0)
SAMPLES = [
    Piece("accepted", ACCEPTED, 0), GAP, Piece("rejected", REJECTED, 0), GAP, Piece("recovered", RECOVERED, 0),
    Piece("\n", TARGET, 0), Piece("bonus", BONUS, 0), GAP, Piece("target (no draft)", TARGET, 0),
]


class Legend(TokenView):
    def __init__(self, **kwargs):
        super().__init__("", **kwargs)
        self.mode = "all"

    def on_mount(self) -> None:
        self.refresh_text()

    def refresh_text(self) -> None:
        if self.mode == "off":
            self.update("highlighting off (ctrl+t)")
        else:
            shown = SAMPLES if self.mode == "all" else [p if p.kind != REJECTED else Piece("(hidden)", TARGET, 0) for p in SAMPLES]
            self.update(self.styled(shown, self.mode))
