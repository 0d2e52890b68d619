"""draft.store_file: the suffix drafter's history kept across processes, as data only.

Contract: `read_store_file(path, model)` returns the stored sequences (lists of token ids), [] when the file
does not exist yet; a file that is torn, not JSON, another program's, another model's or holds anything but
token ids raises SpecpipeError with one line naming the file and what to do. Nothing in it is ever run: it is
JSON of integers, checked value by value. `write_store_file(path, model, sequences)` replaces the file whole
(a temporary file in the same folder, then a rename), so a crash mid-write leaves the old file.

Layout: {"specpipe": "suffix-store", "version": 1, "model": "<name> <sha256>", "sequences": [[ids], ...]}.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.costmodel import cache_file
from specpipe.errors import SpecpipeError

KIND, VERSION = "suffix-store", 1
MAX_BYTES = 256 * 1024 * 1024  # far above any store_tokens worth keeping; a larger file is not one of ours
MAX_ID = 1 << 24  # no tokenizer has 16M ids: a larger value is not a token id


def read_store_file(path: str | Path, model: str) -> list[list[int]]:
    """The sequences a store file holds for `model` ("<name> <sha256>"); [] when it does not exist yet."""
    path = Path(path).expanduser()
    redo = "delete it or choose another draft.store_file (draft.store_file=null keeps no file)"

    def refuse(why: str) -> SpecpipeError:
        return SpecpipeError(f"draft.store_file={path} {why}: {redo}")

    try:
        if path.stat().st_size > MAX_BYTES:
            raise refuse(f"is over {MAX_BYTES >> 20} MiB, not a suffix store")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise refuse(f"cannot be read as text ({type(exc).__name__})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise refuse("is torn or not JSON") from None
    if not isinstance(data, dict) or data.get("specpipe") != KIND:
        raise refuse("is not a specpipe suffix store")
    if data.get("version") != VERSION:
        raise refuse(f"has layout version {data.get('version')!r}, not {VERSION}")
    if data.get("model") != model:
        raise refuse(f"was written for another model ({str(data.get('model'))[:80]!r})")
    sequences = data.get("sequences")
    if not isinstance(sequences, list) or not all(_is_ids(s) for s in sequences):
        raise refuse("holds something other than lists of token ids")
    return sequences


def write_store_file(path: str | Path, model: str, sequences: list[list[int]]) -> None:
    """Replace the store file whole (an unwritable folder prints one notice; the run goes on)."""
    path = Path(path).expanduser()
    data = {"specpipe": KIND, "version": VERSION, "model": model, "sequences": sequences}
    cache_file.write(path, data, indent=None, kept=f"draft.store_file={path}: history kept in memory")


def _is_ids(seq: object) -> bool:
    return isinstance(seq, list) and all(type(t) is int and 0 <= t < MAX_ID for t in seq)
