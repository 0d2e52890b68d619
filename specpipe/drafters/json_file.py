"""A drafter checkpoint's JSON files (config.json, *.index.json) read as data, or a one-line error: a cut or
garbled file says so instead of a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.errors import SpecpipeError


def read_json(path: Path) -> dict:
    """The JSON object in `path`; SpecpipeError (one line) when it is not valid JSON or not an object."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecpipeError(f"{path}: not valid JSON ({err}); re-download the checkpoint folder") from None
    if not isinstance(data, dict):
        raise SpecpipeError(f"{path}: holds a JSON {type(data).__name__}, expected an object; re-download the folder")
    return data
