"""Plug-in contracts: every YAML key is a constructor parameter and back, one source per default,
misspelled keys fail with one line, constructors have no side effects, every plug-in has its protocol's
members (mypy checks their types: test_typecheck.py)."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONF_DIR
from omegaconf import MISSING, OmegaConf

import specpipe
from specpipe.config.preflight import check_config
from specpipe.core import protocols
from specpipe.errors import ConfigError
from specpipe.plugins import RUNTIME, build_plugin, check_plugin_keys, config_parameters, plugin_class
from specpipe.run.session import check_supported

PROTOCOLS = {
    "draft": protocols.Drafter,
    "budget": protocols.Budget,
    "rollback": protocols.Rollback,
    "compare": protocols.Comparator,
    "kv": protocols.KvPolicy,
}
HYDRA_KEYS = {"defaults", "_target_", "_partial_", "name"}


def plugin_yamls():
    for group in RUNTIME:
        for path in sorted((Path(CONF_DIR) / group).glob("*.yaml")):
            yield pytest.param(group, path, id=f"{group}={path.stem}")


def schema_of(raw: dict, group: str):
    """The dataclass a YAML names first in its defaults list (/schema/<group>/<name>@_here_)."""
    (entry,) = [d for d in raw["defaults"] if str(d).startswith(f"/schema/{group}/")]
    name = entry.split("/")[-1].split("@")[0]
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance().load(f"schema/{group}/{name}.yaml").node


@pytest.mark.parametrize("group, path", plugin_yamls())
def test_yaml_keys_are_the_constructor_parameters(group, path):
    raw = yaml.safe_load(path.read_text())
    cls = plugin_class(raw, group)
    yaml_keys = set(raw) - HYDRA_KEYS
    params = set(config_parameters(cls, group))
    assert yaml_keys == params, f"{path.name}: YAML only {yaml_keys - params}, constructor only {params - yaml_keys}"
    assert raw["name"] == path.stem == cls.name  # the choice, the file and the class agree
    # one source per default: a constructor default, where it has one, is the YAML's value
    for key, p in inspect.signature(cls).parameters.items():
        if key in yaml_keys and p.default is not p.empty:
            assert p.default == raw[key], f"{cls.__name__}({key}={p.default!r}) but {path.name} says {raw[key]!r}"
    # the schema holds types only: every option's value comes from the YAML
    schema = schema_of(raw, group)
    for key in yaml_keys:
        assert OmegaConf.is_missing(schema, key), f"{group} schema has a default for {key}: YAML holds the values"
    assert set(schema.keys()) - HYDRA_KEYS == yaml_keys


@pytest.mark.parametrize("group, path", plugin_yamls())
def test_every_plugin_is_checked_against_its_protocol(group, path):
    """plugins.py lists each class under TYPE_CHECKING as its protocol; mypy does the structural check."""
    import specpipe.plugins

    cls = plugin_class(yaml.safe_load(path.read_text()), group)
    protocol = PROTOCOLS[group].__name__
    listed = [line for line in inspect.getsource(specpipe.plugins).splitlines() if f"type[{protocol}]" in line]
    assert listed and cls.__name__ in listed[0], f"add {cls.__name__} to the {protocol} tuple in specpipe/plugins.py"


# ---------------------------------------------------------------- misspelled keys


@pytest.mark.parametrize(
    "group, node, key",
    [
        ("budget", {"_target_": "specpipe.budgets.fixed.FixedBudget", "name": "fixed", "kk": 3}, "budget.kk"),
        (
            "draft",
            {
                "_target_": "specpipe.drafters.ngram.NgramDrafter",
                "name": "ngram",
                "min_n": 1,
                "max_n": 4,
                "window": 64,
                "min_nn": 2,
            },
            "draft.min_nn",
        ),
        (
            "rollback",
            {"_target_": "specpipe.rollbacks.auto.AutoRollback", "name": "auto", "max_snapshot_mbb": 3.0},
            "rollback.max_snapshot_mbb",
        ),
    ],
)
def test_a_misspelled_key_is_an_error_not_swallowed(group, node, key):
    """A YAML without a schema (a user's own option file) reaches the constructor with the typo."""
    with pytest.raises(ConfigError, match=f"unknown option {key} ") as info:
        build_plugin({"_partial_": True, **node}, group)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    cfg = OmegaConf.create({"max_tokens": 8, group: {"_partial_": True, **node}})
    with pytest.raises(ConfigError, match=f"unknown option {key} "):
        check_supported(cfg)  # Session, before it loads a model
    if group != "rollback":  # model-free plug-ins are built by preflight too, before the run folder is claimed
        assert check_config(cfg) == str(info.value)


def test_a_runtime_object_is_not_a_yaml_option():
    node = {
        "_target_": "specpipe.drafters.model.ModelDrafter",
        "name": "model",
        "model": "self",
        "path": None,
        "quant": None,
        "target": "x",
    }
    assert check_plugin_keys(node, "draft").startswith("unknown option draft.target ")


@pytest.mark.parametrize("override", ["budget.kk=3", "draft.min_nn=2", "rollback.max_snapshot_mbb=3", "+budget.kk=3"])
def test_cli_misspelled_key_exits_2_with_one_line(tmp_path, override):
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "model=tiny-random", override],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and override.lstrip("+").split("=")[0] in lines[0], proc.stderr
    assert not list(tmp_path.glob("outputs/*/*/summary.json"))


def test_confidence_without_a_drafter_that_takes_p_min_is_refused_before_loading():
    from specpipe.cli.argv import validate_overrides

    message = validate_overrides(["budget=confidence", "draft=ngram"])
    assert message is not None and "needs a drafter with probabilities" in message
    assert validate_overrides(["budget=confidence", "draft=model", "draft.model=self"]) is None


# ---------------------------------------------------------------- no side effects


def test_building_auto_times_nothing_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    import specpipe.costmodel.calibration as calibrate

    def forbidden(*args, **kwargs):
        raise AssertionError("constructing a budget must not calibrate")

    monkeypatch.setattr(calibrate, "verify_cost_curve", forbidden)
    monkeypatch.setattr(calibrate, "draft_cost", forbidden)
    raw = yaml.safe_load((Path(CONF_DIR) / "budget" / "auto.yaml").read_text())
    raw.pop("defaults")
    budget = build_plugin(raw, "budget")
    assert budget.name == "auto" and budget.next_k() >= 0
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- one source per default, every group


def schema_modules() -> list[str]:
    """Every module of specpipe that registers a schema in Hydra's ConfigStore (config.py, serve's, tune's...)."""
    root = Path(specpipe.__file__).parent  # the package, wherever the schema module sits in it
    found = [p for p in root.rglob("*.py") if {"ConfigStore", ".store("} <= _words(p.read_text(encoding="utf-8"))]
    return sorted("specpipe." + ".".join(p.relative_to(root).with_suffix("").parts) for p in found)


def _words(text: str) -> set[str]:
    return {w for w in ("ConfigStore", ".store(") if w in text}


def test_the_schema_modules_are_found():
    assert {"specpipe.config.schema", "specpipe.serve.config", "specpipe.tune.config"} <= set(schema_modules())


@pytest.mark.parametrize("module", schema_modules())
def test_config_schemas_hold_types_only(module):
    """No schema carries a value a YAML could contradict (nested groups are structure)."""
    import importlib

    mod = importlib.import_module(module)
    for schema in vars(mod).values():
        if not (dataclasses.is_dataclass(schema) and schema.__module__ == mod.__name__):
            continue
        for f in dataclasses.fields(schema):
            if f.name in ("_target_", "_partial_"):
                continue
            structure = f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)
            assert f.default is MISSING or structure, (
                f"{schema.__name__}.{f.name} = {f.default!r}: the YAML holds values"
            )


@pytest.mark.parametrize(
    "primary, group",
    [("config", g) for g in ("model", "quant", "sampling", "prompt", *RUNTIME)]
    + [("bench", "suite"), ("train_drafter", "model")]
    + [(app, g) for app in ("serve", "tune", "calibrate") for g in ("budget", "draft")],
)
def test_every_option_gives_every_value(primary, group):
    from hydra import compose, initialize

    import specpipe.serve.config  # noqa: F401  (the serve and tune schemas, registered on import)
    import specpipe.tune.config  # noqa: F401

    for path in sorted((Path(CONF_DIR) / group).glob("*.yaml")):
        with initialize(version_base=None, config_path="../specpipe/conf"):
            cfg = compose(config_name=primary, overrides=[f"{group}={path.stem}"])
        missing = OmegaConf.missing_keys(cfg)
        assert not missing, f"{primary} with {group}={path.stem} leaves {sorted(missing)} unset: give them in the YAML"
