"""Every command in the README runs as written.

Reads the README's ```sh blocks. Each line that needs no download runs for real, on a tiny random
model where it uses the default one (16 layers, so layer skip has layers to skip) and cut short
(`max_tokens=2`, `limit=1`); a line that needs a download, a user's own file or minutes of work
composes its config (`--cfg job`). Placeholder run folders become a real one; `task.txt` is written first.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MODULES = {
    "specpipe": "specpipe.cli.generate",
    "specpipe-bench": "specpipe.bench.harness",
    "specpipe-calibrate": "specpipe.cli.calibrate",
    "specpipe-train-drafter": "specpipe.train.drafter",
    "specpipe-chat": "tui.cli",
    "specpipe-models": "specpipe.engine.load.model_store",
    "specpipe-bench-report": "specpipe.bench.report",
    "specpipe-serve": "specpipe.serve.cli",
    "specpipe-tune": "specpipe.tune.cli",
}
NEEDS_DOWNLOAD = re.compile(r"qwen|real-pair|/path/to|fetch ")
TINY = ["model=tiny-random", "+model.tiny.num_hidden_layers=16"]
# minutes, interactive, or serving until stopped (tests/test_server.py runs it): compose only
SLOW = ("specpipe-calibrate", "specpipe-train-drafter", "specpipe-chat", "specpipe-serve", "specpipe-tune")
# Lines whose documented prerequisite a fresh machine lacks: they must fail with this one-line advice.
PREREQUISITE = {"draft=mtp": "specpipe-train-drafter"}


CONFIG_NAME = {
    "specpipe-bench": "bench",
    "specpipe-train-drafter": "train_drafter",
    "specpipe-serve": "serve",
    "specpipe-calibrate": "calibrate",
    "specpipe-tune": "tune",
}  # else "config"


def readme_commands(path: Path = README) -> list[str]:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
    lines = [ln.strip() for block in blocks for ln in block.splitlines()]
    return [ln for ln in lines if ln.split(" ", 1)[0] in MODULES or ln.startswith("eval ")]


def docs_commands() -> list[str]:
    return [ln for doc in sorted((README.parent / "docs").glob("*.md")) for ln in readme_commands(doc)]


def compose(words: list[str]) -> str | None:
    """The config check `specpipe ... --cfg job` does, in this process: a one-line message or None."""
    import specpipe.serve.config  # noqa: F401  (the serve schema)
    import specpipe.tune.config  # noqa: F401  (the tune schema)
    from specpipe.cli.argv import flags_first as _flags_first
    from specpipe.cli.argv import rerun_args, validate_overrides
    from specpipe.cli.prompt_args import expand_prompt_args

    tool, args = words[0], _flags_first(expand_prompt_args(rerun_args(words[1:])))
    return validate_overrides(args, CONFIG_NAME.get(tool, "config"), tool)


def _argv(line: str) -> tuple[list[str], str | None]:
    """The line's words without its comment; `- < FILE` becomes stdin text."""
    words = shlex.split(line, comments=True)
    stdin = None
    if "<" in words:
        at = words.index("<")
        stdin = Path(words[at + 1]).read_text() if Path(words[at + 1]).exists() else None
        words = words[:at]
    return words, stdin


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, smollm2_gguf):
    folder = tmp_path_factory.mktemp("readme")
    (folder / "task.txt").write_text("Rename x to y in: def f(x): return x + 1\n")
    made = subprocess.run(
        [sys.executable, "-m", "specpipe.cli.generate", "model=tiny-random", "max_tokens=2", "hi"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    (run,) = list(folder.glob("outputs/*/*"))
    return folder, run


def test_the_readme_has_commands():
    assert len(readme_commands()) >= 25


def plugin_variants(lines: list[str]) -> set[str]:
    """The lines that only choose other plug-ins for a command an earlier line already runs with overrides
    (`specpipe draft=none`, `specpipe budget=adaptive`, ...), except a documented prerequisite's: the default
    run composes each of them in this process (the check `specpipe` makes before loading anything) and runs
    them for real under `-m statistical`; what a real run of each adds, its plug-in generating tokens, the
    plug-ins' own tests do in-process (test_lossless, test_kv, test_trees, test_budgets, test_sampling)."""
    seen, variants = set(), set()
    for line in lines:
        words, _ = _argv(line) if not line.startswith("eval ") else ([], None)
        if not words or words[0] not in ("specpipe", "specpipe-bench"):
            continue
        overrides_only = all("=" in w and not w.startswith("-") for w in words[1:])
        prerequisite = any(key in line.split("#")[0] for key in PREREQUISITE)
        if overrides_only and not prerequisite:
            (variants if words[0] in seen else seen).add(line if words[0] in seen else words[0])
    return variants


VARIANTS = plugin_variants(readme_commands())


@pytest.mark.parametrize("line", sorted(VARIANTS))
def test_readme_plugin_variant_composes(line):
    words, _ = _argv(line)
    assert compose(words) is None, f"{line}: {compose(words)}"


@pytest.mark.parametrize(
    "line", [pytest.param(ln, marks=[pytest.mark.statistical] if ln in VARIANTS else []) for ln in readme_commands()]
)
def test_readme_line_runs_as_written(line, workdir):
    folder, run = workdir
    line = re.sub(r"outputs/(\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d|<date>/<time>)", str(run), line)
    if "--replay" in line or "--resume" in line:
        pytest.skip("an interactive replay / resume of a recording: tests/test_tui.py covers both")
    if line.startswith("eval "):
        words = shlex.split(line[len("eval ") :].strip('"$()'))
        words = shlex.split(words[0]) if len(words) == 1 else words
        compose_only, stdin = False, None
    else:
        words, stdin = _argv(line)
    if words[0] == "specpipe-chat":
        from tui.cli import parse_flags

        words = words[:1] + parse_flags(words[1:]).rest  # --web / --port are the chat's own flags
    tool, args = words[0], words[1:]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    compose_only = bool(NEEDS_DOWNLOAD.search(line)) or tool in SLOW
    if tool == "specpipe-models":
        if compose_only:
            pytest.skip("fetching needs the network: tests/test_model_store.py covers it")
    elif compose_only:
        assert compose(words) is None, f"{line}: {compose(words)}"
        return
    elif tool in ("specpipe", "specpipe-bench") and not any(
        a in args for a in ("--cfg", "--info", "--shell-completion")
    ):
        tiny = [] if any(a.startswith("model=") for a in args) or "--rerun" in args else TINY
        args = (
            args
            + tiny
            + ["max_tokens=2"]
            + (["limit=1", "anchor=false", "warmup=false"] if tool == "specpipe-bench" else [])
        )
    proc = subprocess.run(
        [sys.executable, "-m", MODULES[tool], *args],
        cwd=folder,
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    expected = next((advice for key, advice in PREREQUISITE.items() if key in line.split("#")[0]), None)
    if expected:
        assert proc.returncode != 0 and expected in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    else:
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("line", docs_commands())
def test_docs_line_composes(line):
    if "<" in line or tool_of(line) in ("specpipe-models", "specpipe-bench-report"):
        pytest.skip("a placeholder path, or no config to compose")
    words, _ = _argv(line)
    assert compose(words) is None, f"{line}: {compose(words)}"


def tool_of(line: str) -> str:
    return line.split(" ", 1)[0]
