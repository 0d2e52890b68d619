"""ruff's lint rules and formatter must pass over the repository ([tool.ruff] in pyproject.toml):
one style, lines of at most 120 characters, imports sorted, no unused names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_fix():
    proc = ruff("check", "--output-format", "concise", ".")
    assert proc.returncode == 0, "ruff check:\n" + proc.stdout + proc.stderr


def test_every_file_is_formatted():
    proc = ruff("format", "--check", ".")
    assert proc.returncode == 0, "ruff format --check (run `ruff format .`):\n" + proc.stdout + proc.stderr
