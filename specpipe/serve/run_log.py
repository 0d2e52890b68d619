"""The server's JSONL logs (`requests.jsonl`, `steps.jsonl`): a failed write costs that record, never the server.

Contract: `JsonlLog(path, tool).write(record)` appends one whole line, from any thread. A write that fails (a full
disk: ENOSPC, EIO) cuts the file back to its last whole line, counts the record as lost and says so once on
stderr (`specpipe-serve: cannot write requests.jsonl (No space left on device): ...`); later records are tried
again, so logging resumes when space is freed. `problem()` is that state in one line for /health, None while
every write lands.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


class JsonlLog:
    def __init__(self, path: Path, tool: str):
        self.path, self.tool = path, tool
        # unbuffered: a failed write leaves nothing in a buffer that the next flush would write again
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115  (closed by close())
        self._lock = threading.Lock()
        self.lost = 0
        self._error: str | None = None
        self._told = False

    def write(self, record: dict) -> None:
        data = (json.dumps(record) + "\n").encode()
        with self._lock:
            start = None
            try:
                start = os.fstat(self._file.fileno()).st_size
                view = memoryview(data)
                while view:  # a write may land in part (the disk filled mid-record)
                    view = view[self._file.write(view) or 0 :]
                self._error = None
            except (OSError, ValueError) as exc:
                self._failed(exc, start)

    def _failed(self, exc: Exception, start: int | None) -> None:
        self.lost += 1
        self._error = getattr(exc, "strerror", None) or str(exc)
        if start is not None:
            try:  # no torn line: a reader sees whole records only
                os.ftruncate(self._file.fileno(), start)
            except OSError:
                pass  # a device (/dev/full) or a file we may not cut: its lines stay as they were
        if not self._told:
            self._told = True
            try:
                print(
                    f"{self.tool}: cannot write {self.path} ({self._error}): serving goes on, its records are lost "
                    "until the disk has room again (free some space; /health says so meanwhile)",
                    file=sys.stderr,
                    flush=True,
                )
            except (OSError, ValueError):
                pass

    def problem(self) -> str | None:
        """One line while writes fail (`requests.jsonl: 3 records lost (No space left on device)`), else None."""
        if self._error is None:
            return None
        return f"{self.path.name}: {self.lost} records lost ({self._error})"

    def close(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:
                pass
