"""The cost model's cache files (calibration curves, long-context curves): JSON written through a
temporary file and a rename, so a reader sees the old file or the new one, never half of one.

Contract: `read(path, check)` returns the decoded data, or None when the file is missing, torn,
not JSON or fails `check` (stale: an older layout); in the last three cases it prints one notice line
on stderr and the caller measures again. `write(path, data)` replaces the file whole or not at all.
Nothing here times or decides anything.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def read(path: Path, check: Callable[[dict], object] | None = None) -> dict | None:
    """The JSON object in `path`; None (with one notice line when the file exists) if it cannot be used.

    Args:
        path: the cache file.
        check: called on the decoded object; any exception it raises marks the file stale (its
            KeyError / ValueError is what a file of another layout gives).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        _unusable(path, f"unreadable ({type(exc).__name__})")
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        if check is not None:
            check(data)
    except json.JSONDecodeError:
        _unusable(path, "torn or not JSON")
        return None
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        _unusable(path, f"stale ({type(exc).__name__}: {exc})")
        return None
    return data


def write(path: Path, data: dict, *, indent: int | None = 2, kept: str = "it is measured again next run") -> None:
    """Write `data` as JSON to `path` through a temporary file in the same folder and a rename.

    A cache that cannot be written (read-only or full disk) is not an error: the figures are used
    in memory and measured again next time, which the notice says (`kept`: what the user keeps instead).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=indent, separators=None if indent else (",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        print(f"specpipe: could not save {path} ({exc.strerror or exc}); {kept}", file=sys.stderr)


def _unusable(path: Path, why: str) -> None:
    print(f"specpipe: cache {path} is {why}; measuring it again", file=sys.stderr)
