"""Shared config folders are data (issue 49): a preset, a `--config-dir` folder or the user's config folder may
change only a few of Hydra's settings, call no resolver and hold only plain YAML; nothing they name is written
or run. Rows in docs/faults.md (the table test in test_faults.py reads this module too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_module
from test_faults import ENV, error_line

TINY = ["model=tiny-random", "prompt.text=hi", "max_tokens=2"]


def preset(folder: Path, body: str, name: str = "p") -> Path:
    """`folder/preset/<name>.yaml`, a `_global_` preset as specpipe-tune writes them."""
    (folder / "preset").mkdir(parents=True, exist_ok=True)
    path = folder / "preset" / f"{name}.yaml"
    path.write_text("# @package _global_\n" + body)
    return path


TRUNCATING_HANDLER = """hydra:
  job_logging:
    handlers:
      file:
        filename: {victim}
        mode: w
"""


def test_a_preset_logging_handler_writes_no_file(tmp_path):
    """The issue's repro (a): a preset's `FileHandler` with `mode: w` truncated any file the user can write,
    through the user config folder ($SPECPIPE_CONFIG_DIR) and `--config-dir`, for every command."""
    import specpipe.serve.config  # noqa: F401  (the apps' schemas, as their console scripts register them)
    import specpipe.tune.config  # noqa: F401
    from specpipe.cli.argv import validate_overrides

    victim = tmp_path / "victim.txt"
    victim.write_text("data\n")
    preset(tmp_path / "c", TRUNCATING_HANDLER.format(victim=victim))
    env = dict(ENV, SPECPIPE_CONFIG_DIR=str(tmp_path / "c"))
    proc = run_module("specpipe.cli", [*TINY, "preset=p"], tmp_path, env)
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc.stderr)
    assert "hydra.job_logging.handlers.file" in line and "may set only" in line, line
    proc = run_module("specpipe.bench", ["--config-dir", str(tmp_path / "c"), *TINY[:1], "preset=p"], tmp_path, ENV)
    assert proc.returncode == 2, proc.stderr
    assert "hydra.job_logging.handlers.file" in error_line(proc.stderr, "specpipe-bench")
    for app in ("serve", "tune"):
        message = validate_overrides(["model=tiny-random", "preset=p"], app, search_dir=str(tmp_path / "c"))
        assert message and "hydra.job_logging.handlers.file" in message, (app, message)
    assert victim.read_text() == "data\n"


def test_a_preset_env_set_is_refused(tmp_path):
    """The issue's repro (b): `hydra.job.env_set` put LD_PRELOAD into the process that starts MLX's compiler."""
    from specpipe.cli.argv import validate_overrides

    preset(tmp_path / "c", "hydra:\n  job:\n    env_set:\n      LD_PRELOAD: /tmp/evil.so\n")
    message = validate_overrides([*TINY, "preset=p"], search_dir=str(tmp_path / "c"))
    assert message and "hydra.job.env_set" in message and "LD_PRELOAD" in message, message


def test_an_interpolation_hides_no_logging_factory(tmp_path):
    """The issue's repro (c): `${oc.decode:...}` turned a string into a `()` factory after the check had read
    it (shutil.copyfile overwrote a file). A shared file calls no resolver; the refusal names file and key."""
    victim, source = tmp_path / "victim.txt", tmp_path / "source.txt"
    victim.write_text("data\n")
    source.write_text("overwritten\n")
    factory = json.dumps({"()": "shutil.copyfile", "src": str(source), "dst": str(victim)})
    hidden = {"hydra": {"job_logging": {"formatters": {"x": "${oc.decode:'" + factory + "'}"}}}}
    preset(tmp_path / "c", yaml.safe_dump(hidden))
    proc = run_module("specpipe.cli", ["--config-dir", str(tmp_path / "c"), *TINY, "preset=p"], tmp_path, ENV)
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc.stderr)
    assert "p.yaml" in line and "hydra.job_logging.formatters.x" in line and "resolver" in line, line
    assert victim.read_text() == "data\n"


def test_a_shared_file_may_set_only_the_listed_hydra_keys(tmp_path):
    """`hydra.job.chdir` and log levels pass; run folders and `output_dir` come only from the command line."""
    from specpipe.cli.argv import validate_overrides

    folder = str(tmp_path / "c")
    preset(tmp_path / "c", "max_tokens: 3\nhydra:\n  job:\n    chdir: true\n  verbose: true\n", "fine")
    assert validate_overrides([*TINY, "preset=fine"], search_dir=folder) is None
    preset(tmp_path / "c", "hydra:\n  run:\n    dir: /tmp/elsewhere\n", "rundir")
    message = validate_overrides([*TINY, "preset=rundir"], search_dir=folder)
    assert message and "hydra.run.dir='/tmp/elsewhere'" in message, message
    preset(tmp_path / "c", "output_dir: /tmp/elsewhere\n", "outdir")
    message = validate_overrides([*TINY, "preset=outdir"], search_dir=folder)
    assert message and "output_dir='/tmp/elsewhere'" in message and "command line" in message, message
    snapshot = tmp_path / "run" / ".hydra"  # a shared run folder's snapshot: its output_dir is not followed
    snapshot.mkdir(parents=True)
    (snapshot / "config.yaml").write_text("max_tokens: 2\noutput_dir: /tmp/elsewhere\n")
    (snapshot / "overrides.yaml").write_text("[]\n")
    message = validate_overrides(["max_tokens=2"], config_dir=str(snapshot))
    assert message and "output_dir='/tmp/elsewhere'" in message and "command line" in message, message
    # the user's own command line still chooses (the same keys, or a resolver of their own)
    own = [*TINY, "preset=fine", f"hydra.run.dir={tmp_path}/run", "output_dir=${oc.env:HOME}"]
    assert validate_overrides(own, search_dir=folder) is None


NOT_DATA = {
    "alias bomb": ("a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b]\n", "anchor"),
    "repeated key": ("max_tokens: 3\nmax_tokens: 9999\n", "the key 'max_tokens' twice"),
    "deep nesting": ("x: " + "[" * 200 + "]" * 200 + "\n", "nesting deeper than"),
}


@pytest.mark.parametrize("kind", sorted(NOT_DATA))
def test_yaml_that_is_not_plain_data_is_one_line(tmp_path, kind):
    """Aliases that expand to gigabytes, a key given twice, nesting past 32 levels: refused in a preset, a run
    folder's snapshot and a chat recording's config, naming the file and the line."""
    from specpipe.cli.argv import validate_overrides
    from specpipe.config.snapshot import read_snapshot_text
    from specpipe.errors import ConfigError

    body, words = NOT_DATA[kind]
    path = preset(tmp_path / "c", body)
    message = validate_overrides([*TINY, "preset=p"], search_dir=str(tmp_path / "c"))
    assert message and str(path) in message and words in message and "\n" not in message, message
    with pytest.raises(ConfigError, match=words):
        read_snapshot_text("max_tokens: 2\n" * (kind == "alias bomb") + body, "run/.hydra/config.yaml")
