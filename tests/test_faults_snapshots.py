"""Configs that are data, not code, and config values that are one line: a run folder's snapshot, a chat
recording or a preset naming a foreign `_target_` runs nothing; damaged snapshots, out-of-range values
and Hydra's own errors are one line, exit 2, before anything loads. Rows in docs/faults.md (the table test
in test_faults.py reads this module too)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_module
from test_faults import ENV, error_line

TINY = ["model=tiny-random", "prompt.text=hi", "max_tokens=2"]
MARKER = "PWNED"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A real run folder of a tiny run (its .hydra/ snapshot and events.jsonl)."""
    cwd = tmp_path_factory.mktemp("run")
    proc = run_module("specpipe.cli", [*TINY, "hydra.run.dir=run"], cwd, ENV)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


def foreign_draft(marker: Path) -> dict:
    """The issue's reproduction: a drafter node that names os.system with a shell command."""
    return {"_target_": "os.system", "_partial_": True, "command": f"touch {marker}", "name": "ngram"}


def copy_run(run_folder: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "shared-run"
    shutil.copytree(run_folder, folder)
    snapshot = folder / ".hydra" / "config.yaml"
    edit(snapshot)
    return folder


def with_foreign_draft(marker: Path):
    def edit(snapshot: Path) -> None:
        cfg = yaml.safe_load(snapshot.read_text())
        cfg["draft"] = foreign_draft(marker)
        snapshot.write_text(yaml.safe_dump(cfg))

    return edit


def assert_refused(proc, marker: Path, tool: str = "specpipe") -> str:
    assert not marker.exists(), "the snapshot's command ran"
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc.stderr, tool)
    assert "_target_" in line and "'os.system'" in line, line
    return line


@pytest.mark.parametrize("how", ["--rerun", "--config-dir"])
def test_foreign_target_in_a_run_folder_runs_nothing(tmp_path, run_folder, how):
    marker = tmp_path / MARKER
    folder = copy_run(run_folder, tmp_path, with_foreign_draft(marker))
    args = ["--rerun", str(folder)] if how == "--rerun" else ["--config-dir", f"{folder}/.hydra", "-cn", "config"]
    line = assert_refused(run_module("specpipe.cli", args, tmp_path, ENV), marker)
    assert "draft._target_" in line


def test_foreign_target_in_a_chat_recording_runs_nothing(tmp_path, run_folder):
    from specpipe.events import read_events
    from tui.cli import recorded_config

    marker = tmp_path / MARKER
    lines = []
    for line in (run_folder / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "run_started":
            cfg = yaml.safe_load(event["config_yaml"])
            cfg["draft"] = foreign_draft(marker)
            event["config_yaml"] = yaml.safe_dump(cfg)
        lines.append(json.dumps(event))
    recording = tmp_path / "chat.jsonl"
    recording.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"draft\._target_='os\.system'"):
        recorded_config(read_events(recording), [])
    assert_refused(run_module("tui.cli", ["--resume", str(recording)], tmp_path, ENV), marker, "specpipe-chat")


@pytest.mark.parametrize("where", ["hydra-callback", "draft"])
def test_foreign_target_in_a_user_preset_runs_nothing(tmp_path, where):
    from specpipe.cli.argv import validate_overrides

    marker = tmp_path / MARKER
    (tmp_path / "mine" / "preset").mkdir(parents=True)
    if where == "hydra-callback":  # Hydra instantiates callbacks itself, before specpipe's task
        body = {"hydra": {"callbacks": {"x": {"_target_": "os.system", "command": f"touch {marker}"}}}}
    else:
        body = {"defaults": [{"override /draft": "none"}], "draft": {"_target_": "os.system"}}
    preset = tmp_path / "mine" / "preset" / "evil.yaml"
    preset.write_text("# @package _global_\n" + yaml.safe_dump(body))
    message = validate_overrides([*TINY, "preset=evil"], search_dir=str(tmp_path / "mine"))
    assert message and "_target_='os.system'" in message
    if where == "hydra-callback":
        proc = run_module("specpipe.cli", ["--config-dir", str(tmp_path / "mine"), *TINY, "preset=evil"], tmp_path, ENV)
        assert_refused(proc, marker)


def test_plugin_class_refuses_a_foreign_target_before_importing_it():
    from specpipe.errors import ConfigError
    from specpipe.plugins import build_plugin, plugin_class

    with pytest.raises(ConfigError, match=r"budget\._target_='os\.system'"):
        plugin_class({"_target_": "os.system"}, "budget")
    with pytest.raises(ConfigError, match="not one of specpipe's budget plug-ins"):  # a drafter is not a budget
        build_plugin({"_target_": "specpipe.drafters.none.NoneDrafter", "name": "none"}, "budget")
    with pytest.raises(ConfigError, match="not one of specpipe's draft plug-ins"):
        plugin_class({"_target_": "antigravity.fly"}, "draft")
    assert "antigravity" not in sys.modules  # importing it would have run its code (it opens a browser)


DAMAGED = {
    "empty": (lambda text: "", "is empty"),
    "cut short": (lambda text: text[: text.rindex("\n", 0, len(text) // 3) + 1], "has no value for"),  # whole lines
    "garbage YAML": (lambda text: "model: [unclosed\n  : : x: {\n", "is not valid YAML"),
    "random bytes": (lambda text: b"\xff\xfe\x00garbage\x81", "is not text"),
    "max_tokens: abc": (lambda text: text.replace("max_tokens: 2", "max_tokens: abc"), "max_tokens='abc'"),
    "hydra node": (lambda text: text + "hydra:\n  job:\n    env_set:\n      LD_PRELOAD: /x.so\n", "sets 'hydra'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_damaged_snapshot_is_one_line(tmp_path, run_folder, damage):
    from specpipe.cli.argv import validate_overrides

    change, words = DAMAGED[damage]

    def edit(snapshot: Path) -> None:
        new = change(snapshot.read_text())
        snapshot.write_bytes(new if isinstance(new, bytes) else new.encode())

    folder = copy_run(run_folder, tmp_path, edit)
    message = validate_overrides([], config_dir=f"{folder}/.hydra")
    assert message and "\n" not in message and words in message, message
    if damage == "max_tokens: abc":  # and end to end: exit 2, one line
        proc = run_module("specpipe.cli", ["--rerun", str(folder)], tmp_path, ENV)
        assert proc.returncode == 2 and words in error_line(proc.stderr)


def test_rerun_of_an_older_snapshot_fills_the_groups_it_predates(tmp_path, run_folder):
    from specpipe.cli.argv import validate_overrides

    def edit(snapshot: Path) -> None:
        cfg = yaml.safe_load(snapshot.read_text())
        del cfg["kv"], cfg["tree"], cfg["draft"]["window"]  # written before kv=, tree= and draft.window existed
        snapshot.write_text(yaml.safe_dump(cfg, sort_keys=False))

    folder = copy_run(run_folder, tmp_path, edit)
    assert validate_overrides([], config_dir=f"{folder}/.hydra") is None


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["budget=auto", "budget.prior_alpha=-1"], "budget.prior_alpha=-1.0 is out of range"),
        (["budget=auto", "budget.prior_alpha=1e300"], "budget.prior_alpha=1e+300 is out of range"),
        (["draft=model", "tree=dynamic", "tree.width=0"], "tree.width=0 is out of range"),
        (["draft=model", "tree=dynamic", "tree.width=-1"], "tree.width=-1 is out of range"),
        (["draft=model", "tree=dynamic", "tree.width=1000"], "tree.width=1000 is out of range"),
        (["tree=dynamic", "tree.depth=65"], "tree.depth=65 is out of range"),
        (["model.arch=qwen3", "+model.tiny.num_hidden_layers=0"], "model.tiny.num_hidden_layers=0 is out of range"),
        (["+model.tiny.vocab_size=0"], "model.tiny.vocab_size=0 is out of range"),
        (["hydra/launcher=nosuch"], "unknown option hydra/launcher=nosuch: choose one of basic"),
        (["hydra.run.dir=out/a b,c"], "has a comma, which Hydra reads as a sweep"),
    ],
)
def test_out_of_range_values_and_hydra_errors_are_one_line(overrides, words):
    from specpipe.cli.argv import validate_overrides

    message = validate_overrides([*TINY, *overrides])
    assert message and "\n" not in message and words in message, message


def test_tiny_sizes_that_do_not_compute_and_a_module_that_is_no_architecture(tmp_path):
    for args, words in [
        (["+model.tiny.num_attention_heads=3"], "sizes do not compute"),  # 3 heads over 2 KV heads
        (["model.arch=cache"], "'cache' is not an mlx-lm architecture: choose one of"),
    ]:
        proc = run_module("specpipe.cli", [*TINY, *args], tmp_path, ENV)
        assert proc.returncode in (1, 2) and words in error_line(proc.stderr), proc.stderr
