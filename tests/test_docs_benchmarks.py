"""docs/benchmarks.md stays a reference page (issue 39): at most ~300 lines, every link it makes points at a
file in the repository, and every command it names is one of specpipe's (or a shipped script), so a reader can
rerun what a table says."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 300


def test_the_page_is_short():
    lines = PAGE.read_text().splitlines()
    assert len(lines) <= MAX_LINES + 5, f"{len(lines)} lines: move history to docs/benchmarks/log/"


def test_every_link_resolves():
    for target in re.findall(r"\]\(([^)#\s]+)\)", PAGE.read_text()):
        if "://" in target:
            continue
        assert (PAGE.parent / target).exists(), target


def test_every_command_is_specpipes():
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    text = PAGE.read_text()
    named = re.findall(r"`((?:specpipe[\w-]*|python scripts/\S+))\s[^`]*`", text)
    named += [line.split()[0] for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()]
    assert named
    for command in named:
        if command.startswith("python scripts/"):
            assert (ROOT / command.split()[1]).exists(), command
        else:
            assert command in scripts, command
