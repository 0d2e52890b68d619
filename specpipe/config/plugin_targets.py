"""Which classes a config may name: a `_target_` is data to check, never code to run unchecked.

Contract: `allowed_targets()` maps each config path that holds a plug-in (`draft`, `budget`, ...) to the
`_target_` values specpipe's own packaged YAML (`specpipe/conf/`) gives it; `check_targets(cfg)` returns one
line for the first `_target_` anywhere in a config (a run folder's snapshot, a chat recording, a user's
preset) that is not one of them, and `check_hydra_targets(hydra_node)` the same for Hydra's own node
(launcher, sweeper, callbacks, logging handlers). Both read values only: nothing named is imported, so a
shared run folder cannot run code by naming `os.system` (Hydra's `get_method` imports anything it is given).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib import resources
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

# Hydra's own node: a launcher / sweeper from Hydra or an installed Hydra plug-in (hydra/launcher=joblib),
# a callback Hydra ships. Logging handlers and formatters are built by logging.config, which also imports
# what `class` / `()` name and resolves `ext://` values by importing a module.
HYDRA_TARGETS = {
    "launcher": ("hydra._internal.core_plugins.", "hydra_plugins."),
    "sweeper": ("hydra._internal.core_plugins.", "hydra_plugins."),
    "callbacks": ("hydra.experimental.callbacks.",),
}
LOGGING_FACTORIES = ("logging.", "hydra.", "colorlog.")
LOGGING_EXTERNALS = ("ext://sys.",)


@functools.cache
def allowed_targets() -> dict[str, frozenset[str]]:
    """Config path -> the `_target_` values the packaged YAML puts there, e.g. "draft" -> NgramDrafter, ...

    Example: conf/draft/ngram.yaml's `_target_: specpipe.drafters.ngram.NgramDrafter` allows that class at
    `draft`; an `# @package _global_` file (experiment/, preset/) contributes at the paths it writes.
    """
    found: dict[str, set[str]] = {}
    conf = resources.files("specpipe.conf")
    for group in conf.iterdir():
        if not group.is_dir() or group.name.startswith("_"):
            continue
        for option in group.iterdir():
            if not option.name.endswith(".yaml"):
                continue
            text = option.read_text(encoding="utf-8")
            node = yaml.safe_load(text) or {}
            header = [line for line in text.splitlines() if line.startswith("# @package")][:1]
            prefix = "" if header and header[0].split()[-1] == "_global_" else group.name
            for path, target in _targets_in(node, prefix):
                found.setdefault(path, set()).add(target)
    return {path: frozenset(targets) for path, targets in found.items()}


def check_target(path: str, target: Any) -> str | None:
    """One line when `target` is not a class specpipe's own YAML names at `path` (e.g. "draft")."""
    allowed = allowed_targets().get(path, frozenset())
    if isinstance(target, str) and target in allowed:
        return None
    key = f"{path}._target_" if path else "_target_"
    if not allowed:
        return (
            f"{key}={target!r} is refused: only specpipe's plug-in groups (draft, budget, rollback, compare, kv) "
            "name a class, and only specpipe's own; remove the key"
        )
    return (
        f"{key}={target!r} is not one of specpipe's {path} plug-ins ({', '.join(sorted(allowed))}): "
        f"a config may only name specpipe's own classes; choose {path}=<option> (`specpipe --help` lists them)"
    )


def check_targets(cfg: DictConfig | dict) -> str | None:
    """The first `_target_` of a config (Hydra's node excluded) that names a class specpipe does not ship."""
    tree = _container(cfg)
    for path, target in _targets_in({k: v for k, v in tree.items() if k != "hydra"}, ""):
        message = check_target(path, target)
        if message:
            return message
    return None


def check_hydra_targets(hydra: DictConfig | dict) -> str | None:
    """The first class Hydra's own node would import that neither Hydra nor an installed Hydra plug-in ships."""
    tree = _container(hydra)
    for path, target in _targets_in(tree, "hydra"):
        kind = path.split(".")[1] if "." in path else ""
        if not (isinstance(target, str) and target.startswith(HYDRA_TARGETS.get(kind, ()))):
            return (
                f"{path}._target_={target!r} is refused: Hydra's launcher, sweeper and callbacks may only be "
                "Hydra's own or an installed Hydra plug-in's (hydra/launcher=joblib)"
            )
    for section in ("job_logging", "hydra_logging"):
        for path, key, value in _logging_factories(tree.get(section), f"hydra.{section}"):
            allowed = LOGGING_EXTERNALS if key == "ext" else LOGGING_FACTORIES
            if not (isinstance(value, str) and value.startswith(allowed)):
                shown = f"{path}={value!r}" if key == "ext" else f"{path}.{key}={value!r}"
                return (
                    f"{shown} is refused: logging handlers and formatters may only be logging's, Hydra's or "
                    "colorlog's classes (streams: ext://sys.stdout / ext://sys.stderr)"
                )
    return None


# ---------------------------------------------------------------- walking


def _container(cfg: DictConfig | dict) -> dict:
    """A plain dict, interpolations left as text: resolving could run a resolver a snapshot names."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
        return value if isinstance(value, dict) else {}
    return cfg if isinstance(cfg, dict) else {}


def _targets_in(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path of the node holding it, value) for every `_target_` under `node`, lists included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield path, value
            else:
                yield from _targets_in(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets_in(value, f"{path}.{i}" if path else str(i))


def _logging_factories(node: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(path, "class" | "()" | "ext", value) for what logging.config.dictConfig would import."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("class", "()"):
                yield path, str(key), value
            elif isinstance(value, str) and value.startswith("ext://"):
                yield f"{path}.{key}", "ext", value
            else:
                yield from _logging_factories(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, str) and value.startswith("ext://"):
                yield f"{path}.{i}", "ext", value
            else:
                yield from _logging_factories(value, f"{path}.{i}")
