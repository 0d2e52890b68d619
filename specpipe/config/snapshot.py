"""A saved config (a run folder's `.hydra/config.yaml`, a chat recording's `RunStarted.config_yaml`) read as
data and typed again by the schemas before anything runs.

Contract: `read_snapshot_text(text, where)` returns the YAML as a dict or raises ConfigError (not text, not
YAML, empty, not a mapping, not plain data (anchors, aliases, repeated keys, deep nesting: yaml_data.py), calling
a resolver (`${oc.decode:...}`), or holding `hydra` / `defaults`, which Hydra never writes into a snapshot and
which would let a file choose launchers, callbacks, logging handlers or environment variables);
`retype(cfg, app)` merges a composed snapshot onto the schema of `conf/<app>.yaml` and of each group's
option (chosen by its `name`), raising ConfigError for a wrong type, an unknown key or a missing value
(a file cut short). Nothing here imports a plug-in or loads a model; `_target_`s are checked by preflight.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, cast

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specpipe.config.yaml_data import find_resolver, load_yaml_data
from specpipe.errors import ConfigError

# what a snapshot never holds: Hydra writes its own node to hydra.yaml and composes the defaults away
FOREIGN_KEYS = ("hydra", "defaults")
REDO = "the snapshot is damaged or was edited: fix it, or rerun the original command instead"
CUT = "the snapshot was cut short or edited: fix it, or rerun the original command instead"


def is_snapshot_dir(folder: str) -> bool:
    """A run's `.hydra/` folder, as Hydra writes it (config.yaml beside overrides.yaml)."""
    import os

    return os.path.isfile(os.path.join(folder, "config.yaml")) and os.path.isfile(
        os.path.join(folder, "overrides.yaml")
    )


def read_snapshot_file(path: str) -> dict:
    """`read_snapshot_text` of a file (ConfigError when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the snapshot {path} ({exc.strerror}): check the run folder") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not text (byte {data[exc.start : exc.start + 1]!r} at offset {exc.start}): {REDO}"
        ) from exc
    return read_snapshot_text(text, path)


def read_snapshot_text(text: str, where: str) -> dict:
    """The snapshot's YAML as a dict; ConfigError (one line naming `where`) when it is not a whole config."""
    node = load_yaml_data(text, where, REDO)
    if node is None:
        raise ConfigError(f"{where} is empty: {REDO}")
    if not isinstance(node, dict):
        raise ConfigError(f"{where} holds a {type(node).__name__}, not a config: {REDO}")
    for key in FOREIGN_KEYS:
        if key in node:
            raise ConfigError(
                f"{where} sets '{key}', which a run's snapshot never holds (it would choose Hydra's launcher, "
                f"callbacks or logging): refused; remove '{key}' or rerun the original command"
            )
    found = find_resolver(node)
    if found:
        raise ConfigError(
            f"{where}: {found[0]}={found[1]!r} calls a resolver, which a shared config may not: write the value "
            "itself, or rerun the original command"
        )
    return node


def retype(cfg: DictConfig | dict, app: str, where: str = "the snapshot") -> DictConfig:
    """`cfg` merged onto `conf/<app>.yaml`'s schema and each group option's schema (a typed DictConfig).

    Example: a snapshot's `max_tokens: abc` -> ConfigError "the snapshot ...: max_tokens='abc' is not an int
    ..."; `draft: {name: ngram, ...}` is typed by conf/draft/ngram.yaml's schema (schema/draft/ngram).
    """
    schema = app_schema(app)
    plain = cast(dict, OmegaConf.to_container(cfg, resolve=False)) if isinstance(cfg, DictConfig) else dict(cfg)
    if schema is None:  # an app whose schema this process has not registered: typed by compose alone
        return OmegaConf.create(plain)
    plain = with_newer_keys(plain, app, where)
    groups = {g for g in plain if isinstance(plain[g], dict) and group_field_is_open(schema, g)}
    prefix = ""
    try:
        typed = OmegaConf.merge(schema, {k: v for k, v in plain.items() if k not in groups})
        for group in sorted(groups):
            prefix = f"{group}."  # OmegaConf names the key inside the group's own node
            typed[group] = OmegaConf.merge(option_schema(group, plain[group], where), plain[group])
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {describe(exc, prefix)}: {REDO}") from exc
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"{where} has no value for {missing[0]}{more}: {CUT}")
    return cast(DictConfig, typed)


def with_newer_keys(plain: dict, app: str, where: str) -> dict:
    """`plain` with what an older snapshot predates filled from the packaged YAML: a group it lacks (`kv`,
    `tree`) gets the app's default option, a group option's key it lacks (`draft.vocab`) that option's
    value, as the plug-in's constructor default would. A top-level value it lacks (`max_tokens`,
    `output_dir`: Hydra writes them last) means the file was cut short: ConfigError."""
    from specpipe.config.config_groups import group_option

    defaults = packaged_defaults(app)
    missing = [k for k, v in defaults.items() if k not in plain and not isinstance(v, dict)]
    if missing:
        raise ConfigError(f"{where} has no value for {missing[0]}: {CUT}")
    out = dict(plain)
    for key, value in defaults.items():
        if not isinstance(value, dict):
            continue
        node = out.get(key)
        if node is None and key not in out:
            out[key] = value
        elif isinstance(node, dict):
            name = node.get("name")
            option = resources.files("specpipe.conf").joinpath(key, f"{name}.yaml")
            if isinstance(name, str) and "/" not in name and option.is_file() and "_target_" in value:
                base = group_option(key, name)
            else:  # a typed group (model, sampling, prompt) or an option this version no longer has
                base = {} if "_target_" in value else value
            out[key] = {**{k: v for k, v in base.items() if k not in node}, **node}
    return out


def packaged_defaults(app: str) -> dict:
    """`conf/<app>.yaml` composed from the packaged files alone (no Hydra): each group's default option
    and the file's own values, Hydra's node left out."""
    from specpipe.config.config_groups import group_option

    conf = resources.files("specpipe.conf")
    top = yaml.safe_load(conf.joinpath(f"{app}.yaml").read_text(encoding="utf-8")) or {}
    out: dict = {}
    for entry in top.get("defaults") or []:
        if isinstance(entry, dict):
            (group, option), *_ = entry.items()
            if option is not None and group != "hydra" and conf.joinpath(group, f"{option}.yaml").is_file():
                node = group_option(group, option)
                if "_target_" not in node:
                    node.pop("_partial_", None)  # only plug-in nodes carry it
                out[group] = node
    out.update({k: v for k, v in top.items() if k not in FOREIGN_KEYS})
    return out


def app_schema(app: str) -> DictConfig | None:
    """The structured node `conf/<app>.yaml` names first in its defaults (`specpipe_schema`, ...)."""
    import importlib

    importlib.import_module("specpipe.config.schema")  # registers the schemas (a chat resume imports nothing else)
    if app == "serve":
        importlib.import_module("specpipe.serve.config")
    text = resources.files("specpipe.conf").joinpath(f"{app}.yaml").read_text(encoding="utf-8")
    first = (yaml.safe_load(text).get("defaults") or [None])[0]
    if not isinstance(first, str):
        return None
    try:
        return ConfigStore.instance().load(f"{first}.yaml").node
    except Exception:  # noqa: BLE001  (ConfigLoadError / KeyError by Hydra version: not registered here)
        return None


def group_field_is_open(schema: DictConfig, key: str) -> bool:
    """Whether the app schema leaves `key` to a group option's schema (`draft: Any`) and conf/ has the group."""
    import dataclasses

    owner = OmegaConf.get_type(schema)
    fields = {f.name: f for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else {}
    return (
        key in fields and fields[key].type in (Any, "Any") and resources.files("specpipe.conf").joinpath(key).is_dir()
    )


def option_schema(group: str, node: dict, where: str) -> DictConfig:
    """The schema of the group option a snapshot's node names (`draft.name: ngram` -> schema/draft/ngram)."""
    name = node.get("name")
    if name is None:
        raise ConfigError(f"{where} has no value for {group}.name: {CUT}")
    option = resources.files("specpipe.conf").joinpath(group, f"{name}.yaml")
    if not isinstance(name, str) or "/" in name or not option.is_file():
        options = sorted(p.name[:-5] for p in resources.files("specpipe.conf").joinpath(group).iterdir())
        raise ConfigError(f"{where}: {group}.name={name!r} is not a {group} option ({', '.join(options)}): {REDO}")
    defaults = yaml.safe_load(option.read_text(encoding="utf-8")).get("defaults") or []
    ref = next((d for d in defaults if isinstance(d, str) and d.startswith("/schema/")), None)
    if ref is None:
        return OmegaConf.create({})
    return ConfigStore.instance().load(ref.lstrip("/").split("@")[0] + ".yaml").node


def describe(exc: OmegaConfBaseException, prefix: str = "") -> str:
    """`key=value: what is wrong` from OmegaConf's multi-line message."""
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    key = f"{prefix}{key}" if key else key
    value = getattr(exc, "value", None)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not key:
        return first
    return f"{key}: {first}" if value is None else f"{key}={value!r}: {first}"


def check_snapshot(cfg: DictConfig, app: str, where: str) -> str | None:
    """One line for the first problem of a loaded snapshot: a foreign `_target_` (named before anything is
    imported), a value the schemas refuse, then every preflight check; None when it may run."""
    from specpipe.config.plugin_targets import check_targets
    from specpipe.config.preflight import check_config

    message = check_targets(cfg)
    if message:
        return message
    try:
        return check_config(retype(cfg, app, where))
    except ConfigError as exc:
        return str(exc)
