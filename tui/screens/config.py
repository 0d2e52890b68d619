"""ConfigScreen: the composed config of the run (RunStarted.config_yaml), scrollable."""

from __future__ import annotations

from rich.syntax import Syntax
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfigScreen(ModalScreen[None]):
    BINDINGS = [("escape,f2,q", "dismiss", "Close")]

    def __init__(self, config_yaml: str):
        super().__init__()
        self.config_yaml = config_yaml or "# no config yet: it arrives with the first answer"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="config-box"):
            yield Static(Syntax(self.config_yaml, "yaml", theme="ansi_dark", background_color="default"))
