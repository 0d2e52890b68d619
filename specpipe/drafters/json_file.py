"""A drafter checkpoint's JSON files (config.json, *.index.json) read as data, or a one-line error: a cut or
garbled file, or one giving absurd sizes (a billion layers), says so instead of a traceback or an allocation."""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.config.size_bounds import check_sizes
from specpipe.errors import SpecpipeError

MAX_BYTES = 16 << 20  # a config.json is a few KiB; a shard index a few MiB


def read_json(path: Path) -> dict:
    """The JSON object in `path`; SpecpipeError (one line) when it is not valid JSON or not an object, is over
    MAX_BYTES, or gives a size outside size_bounds.SIZE_BOUNDS (layers, widths, vocabulary, block size)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise SpecpipeError(f"{path}: over {MAX_BYTES} bytes, not a checkpoint's config; re-download the folder")
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SpecpipeError(f"{path}: not valid JSON ({first}); re-download the checkpoint folder") from None
    except IsADirectoryError:
        raise SpecpipeError(f"{path}: a folder where a JSON file belongs; re-download the checkpoint folder") from None
    except OSError as err:
        raise SpecpipeError(f"{path}: cannot be read ({err.strerror}); check the folder's permissions") from None
    if not isinstance(data, dict):
        raise SpecpipeError(f"{path}: holds a JSON {type(data).__name__}, expected an object; re-download the folder")
    message = check_sizes(data, str(path))
    if message:
        raise SpecpipeError(message)
    return data
