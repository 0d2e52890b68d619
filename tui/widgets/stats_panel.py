"""StatsPanel: the live figures of the current answer plus an acceptance sparkline over steps.

Draws a `Figures` (tui/figures.py); knows nothing about where events come
from. The figures flow into as many label/value column pairs as its width
holds, so under the chat at 80 columns every row still shows (in 5 lines).
"""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Static

from tui.figures import Figures
from tui.widgets.step_strip import LEVELS

COLUMN_WIDTH = 26  # one label + value pair: "acceptance  30% (33/111)"


def rate_bars(rates: list[float], width: int) -> str:
    """The last `width` steps' acceptance on a fixed 0..1 scale (`▁` none, `█` all), so a 12% step is low
    however the other steps went (a min-max scaled sparkline drew a lone 12% step at full height).
    Example: [0.0, 0.125, 1.0] -> "▁▂█"."""
    return "".join(LEVELS[min(len(LEVELS) - 1, round(rate * (len(LEVELS) - 1)))] for rate in rates[-width:])


class StatsPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shown: tuple[Figures, int | None] = (Figures(), None)

    def compose(self) -> ComposeResult:
        with Horizontal(id="spark-row"):
            yield Label("acceptance per step", classes="panel-title")
            yield Static(id="acceptance-spark")
        yield Static(id="figures")

    def on_resize(self) -> None:
        self.show(*self._shown)

    def show(self, figures: Figures, next_k: int | None = None) -> None:
        """Redraw from `figures`; `next_k` is a K override waiting for the next steps."""
        self._shown = (figures, next_k)
        spark = self.query_one("#acceptance-spark", Static)
        spark.update(rate_bars(figures.step_rates, max(1, spark.size.width)))
        rows = []
        for label, value in figures.rows():
            if label == "K" and next_k is not None and next_k != figures.k:
                value = f"{next_k}" if figures.k is None else f"{value} -> {next_k} next"
            rows.append((label, value))
        columns = max(1, min(3, self.size.width // COLUMN_WIDTH))
        per_column = -(-len(rows) // columns)
        table = Table.grid(padding=(0, 1), expand=True)
        for _ in range(columns):
            table.add_column(style="bold", no_wrap=True)
            table.add_column(overflow="fold", ratio=1)
        for i in range(per_column):
            cells = []
            for c in range(columns):
                j = c * per_column + i
                cells += list(rows[j]) if j < len(rows) else ["", ""]
            table.add_row(*cells)
        self.query_one("#figures", Static).update(table)
