"""What an Engine was loaded from: its name, source, architecture, precision and size.

Defined here, beside the engine that fills it in, so the engine needs nothing from the event
vocabulary; events.py carries it in RunStarted and re-exports it.
"""

from __future__ import annotations

import msgspec


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What was loaded: enough to reproduce and to label a report."""

    name: str
    source: str  # "packaged" | "gguf" | "folder" | "tiny-random"
    arch: str
    precision: str
    path: str = ""
    sha256: str = ""
    parameters: int = 0
    weight_bytes: int = 0
