"""StatsPanel: the live figures of the current answer plus an acceptance sparkline over steps.

Draws a `Figures` (tui/figures.py); knows nothing about where events come from.
"""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline, Static

from tui.figures import Figures


class StatsPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Label("acceptance per step", classes="panel-title")
        yield Sparkline([], summary_function=max, id="acceptance-spark")
        yield Static(id="figures")

    def show(self, figures: Figures, next_k: int | None = None) -> None:
        """Redraw from `figures`; `next_k` is a K override waiting for the next steps."""
        self.query_one(Sparkline).data = figures.step_rates
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in figures.rows():
            if label == "K" and next_k is not None and next_k != figures.k:
                value = f"{next_k}" if figures.k is None else f"{value} -> {next_k} next"
            table.add_row(label, value)
        self.query_one("#figures", Static).update(table)
