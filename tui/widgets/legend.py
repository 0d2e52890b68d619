"""Legend: what the current view's styles mean, drawn with the same component
classes as answers and step strips (so a theme recolours both alike)."""

from __future__ import annotations

from rich.text import Text

from tui.transcript import ACCEPTED, BONUS, RECOVERED, REJECTED, TARGET, Piece
from tui.widgets.step_strip import LEVELS, StepStrip
from tui.widgets.token_view import TokenView, special_marker

FULL_SAMPLES = [
    Piece("accepted", ACCEPTED, 0),
    Piece("rejected", REJECTED, 0),
    Piece("recovered", RECOVERED, 0),
    Piece("bonus", BONUS, 0),
    Piece("target", TARGET, 0),
    Piece("<|im_end|>", REJECTED, 0),
]


class Legend(TokenView):
    COMPONENT_CLASSES = TokenView.COMPONENT_CLASSES | StepStrip.COMPONENT_CLASSES

    def __init__(self, **kwargs):
        super().__init__("", **kwargs)
        self.mode = "clean"

    def on_mount(self) -> None:
        self.refresh_text()

    def refresh_text(self) -> None:
        self.update(self.legend(self.mode))

    def legend(self, mode: str) -> Text:
        """Labels separated by two spaces, so wrapped lines never run two together."""
        text = Text()
        if mode == "plain":
            return Text(f"plain view: {'f3' if self.app.is_web else 'ctrl+t'} for highlighting", style="dim")
        if mode == "clean":
            text.append("accepted draft", self.component_style("accepted-inline"))
            text.append("  steps ")
            strip = self.get_component_rich_style
            for glyph, kind in ((LEVELS[-1], "all"), (LEVELS[4], "some"), (LEVELS[0], "none"), ("\u00b7", "plain")):
                text.append(glyph, strip(f"strip--{kind}", partial=True))
            text.append(f"  {'f3' if self.app.is_web else 'ctrl+t'}: full view", style="dim")
            return text
        for i, piece in enumerate(FULL_SAMPLES):
            if i:
                text.append("  ")
            if piece.text.startswith("<|"):
                text.append(
                    special_marker(piece.text), self.component_style("special") + self.component_style(REJECTED)
                )
            else:
                text.append(piece.text, self.component_style(piece.kind))
        return text
