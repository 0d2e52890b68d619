"""`--help` teaches, `--version` names what runs, a mistyped flag gets a suggestion (issue 51).

Commands run as processes where what the user sees is the point; the help text of every command is
checked in-process, including that each override it recommends composes under that command's config.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from specpipe.cli.usage import USAGES, unknown_flag, usage

CONFIG_OF = {
    "specpipe": "config",
    "specpipe-chat": "config",
    "specpipe-bench": "bench",
    "specpipe-serve": "serve",
    "specpipe-tune": "tune",
    "specpipe-calibrate": "calibrate",
    "specpipe-train-drafter": "train_drafter",
}


def run(module: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_help_teaches_instead_of_printing_raw_yaml(tmp_path):
    proc = run("specpipe.cli", ["--help"], tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "_target_" not in out and "== Config ==" not in out  # the raw YAML is --cfg job's
    for form in ('specpipe "', "specpipe --prompt", "specpipe prompt.file=", "specpipe - <"):
        assert form in out, form
    for part in ("Most used overrides", "preset=quick", "preset=real-pair", "Results: ", "outputs/", "Docs: "):
        assert part in out, part
    assert "--rerun RUN_DIR" in out and "--cfg job" in out


def test_the_servers_help_is_its_own(tmp_path):
    out = run("specpipe.serve.cli", ["--help"], tmp_path).stdout
    assert out.startswith("specpipe-serve: an OpenAI-compatible API") and "allowed_origins=" in out
    assert "prompt.file=" not in out  # a server takes no prompt


@pytest.mark.parametrize("tool", sorted(USAGES))
def test_every_commands_help_recommends_overrides_that_compose(tool):
    """Each recommended override (the first spelling of each line) is accepted by that command's config:
    the help cannot drift from the configs it describes."""
    import specpipe.serve.config
    import specpipe.tune.config  # noqa: F401  (the schemas their configs extend)
    from specpipe.cli.argv import validate_overrides

    text = usage(tool)
    assert text.startswith(f"{tool}: ") and "Usage:" in text and "Results: " in text
    overrides = text.split("Most used overrides", 1)[1].split("Presets", 1)[0].splitlines()[1:]
    assert len([o for o in overrides if o.strip()]) == 5
    for line in filter(str.strip, overrides):
        spelling = re.split(r"\s{2,}", line.strip())[0].split("|")[0].split()  # the first alternative's words
        first = spelling[0].strip('"')
        words = [w.strip('"') for w in spelling] + (["draft=model"] if first.startswith("draft.model=") else [])
        message = validate_overrides(["model=tiny-random", *words], CONFIG_OF[tool], tool)
        assert message is None or "prompts.file" in first and "does not exist" in message, (first, message)


def test_version_names_specpipe_mlx_mlx_lm_hydra_and_the_blas(tmp_path):
    proc = run("specpipe.cli", ["--version"], tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"specpipe {version('specpipe')} (MLX {version('mlx')}, mlx-lm {version('mlx-lm')}, ")
    assert f"Hydra {version('hydra-core')}" in line and re.search(r"BLAS \w+", line), line


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["--promt", "hi"], "did you mean --prompt?"),
        (["--rerrun", "outputs/x"], "did you mean --rerun?"),
        (["--multi-run", "budget.k=4,8"], "did you mean --multirun?"),
        (["--zzzzzz"], "`specpipe --help` lists what it takes"),
    ],
)
def test_a_mistyped_flag_is_one_line_with_a_suggestion(argv, hint):
    message = unknown_flag(argv, "specpipe")
    assert message is not None and hint in message and message.startswith(f"unknown flag {argv[0]}")


def test_flag_values_and_prompts_are_not_flags():
    assert unknown_flag(["--prompt", "--not-a-flag"], "specpipe") is None
    assert unknown_flag(["-cd", "--odd-folder", "--cfg", "job", "max_tokens=4"], "specpipe") is None


def test_the_mistyped_flag_from_the_issue_end_to_end(tmp_path):
    proc = run("specpipe.cli", ["--promt", "hi"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "specpipe: error: unknown flag --promt: did you mean --prompt? (settings are key=value, e.g. max_tokens=64)"
    )
