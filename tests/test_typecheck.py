"""mypy on specpipe/ with pyproject's [tool.mypy] must report nothing: it is what checks each plug-in
class against its protocol (specpipe/plugins.py) and the loop's use of those protocols.

About 1.5 s with a warm cache (.mypy_cache/), 20-50 s cold on a 2-core machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert proc.returncode == 0, "mypy found errors:\n" + "\n".join(errors or [proc.stdout, proc.stderr])
