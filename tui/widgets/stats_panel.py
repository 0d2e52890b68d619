"""StatsPanel: the live figures of the current answer plus an acceptance sparkline over steps.

Draws a `Figures` (tui/figures.py); knows nothing about where events come
from. The figures flow into as many label/value column pairs as its width
holds, so under the chat at 80 columns every row still shows (in 5 lines).
"""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from tui.figures import Figures

COLUMN_WIDTH = 26  # one label + value pair: "acceptance  30% (33/111)"


class StatsPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shown: tuple[Figures, int | None] = (Figures(), None)

    def compose(self) -> ComposeResult:
        with Horizontal(id="spark-row"):
            yield Label("acceptance per step", classes="panel-title")
            yield Sparkline([], summary_function=max, id="acceptance-spark")
        yield Static(id="figures")

    def on_resize(self) -> None:
        self.show(*self._shown)

    def show(self, figures: Figures, next_k: int | None = None) -> None:
        """Redraw from `figures`; `next_k` is a K override waiting for the next steps."""
        self._shown = (figures, next_k)
        self.query_one(Sparkline).data = figures.step_rates
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
