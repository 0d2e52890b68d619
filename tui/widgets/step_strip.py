"""StepStrip: one cell per speculation step under an answer, so the drafts'
fate is visible without putting rejected text into the answer.

A cell's height is the share of that step's draft the target accepted
(`█` all, `▁` none); `·` is a step that drafted nothing (plain decoding). A
token-tree step that tried several branches shows their count (`3`, `+` for
10 or more) in the colour of how far its accepted path got.
Colours are component classes (`strip--all`, `strip--some`, `strip--none`,
`strip--plain`) in app.tcss. The answer's status note (stop reason, error,
"loading model...") follows the cells.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

LEVELS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # ▁ .. █


def step_cell(drafted: int, accepted: int) -> tuple[str, str]:
    """(glyph, class) of one step. Example: 4 drafted, 2 accepted -> ("▅", "some")."""
    if drafted == 0:
        return "\u00b7", "plain"
    if accepted == drafted:
        return LEVELS[-1], "all"
    if accepted == 0:
        return LEVELS[0], "none"
    return LEVELS[max(1, min(6, round(accepted / drafted * 7)))], "some"


class StepStrip(Static):
    COMPONENT_CLASSES = {"strip--all", "strip--some", "strip--none", "strip--plain"}

    def show_steps(self, steps: list[tuple[int, int]], note: str = "", branches: list[int] | None = None) -> None:
        text = Text()
        for i, (drafted, accepted) in enumerate(steps):
            glyph, kind = step_cell(drafted, accepted)
            tried = branches[i] if branches and i < len(branches) else 0
            if tried > 1:  # a token tree: the branches it tried, coloured by how far the accepted path got
                glyph = str(tried) if tried < 10 else "+"
            text.append(glyph, self.get_component_rich_style(f"strip--{kind}", partial=True))
        if note:
            text.append(("  " if steps else "") + note, "italic dim")
        self.display = bool(text.plain)
        self.update(text)
