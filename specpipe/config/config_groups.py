"""A group option's packaged YAML as a plain node, for code that swaps one plug-in in-process.

Contract: `group_option("budget", "fixed", k=1)` reads `conf/budget/fixed.yaml` (its `_target_`,
`name` and values; the schema `defaults` line dropped) and applies `values` on top, so the YAML
stays the one source of every `_target_` and default. `with_group(cfg, group, option)` is `cfg`
with that group replaced wholesale (no keys of the old option left behind).
"""

from __future__ import annotations

from importlib import resources
from typing import cast

from omegaconf import DictConfig, OmegaConf


def group_option(group: str, option: str, **values) -> dict:
    """The option's YAML as a dict, `values` applied, `_partial_` set as the session instantiates it."""
    text = resources.files("specpipe.conf").joinpath(group, f"{option}.yaml").read_text(encoding="utf-8")
    node = cast(dict, OmegaConf.to_container(OmegaConf.create(text), resolve=True))
    node.pop("defaults", None)
    unknown = set(values) - set(node)
    if unknown:
        raise KeyError(f"{group}={option} has no key {', '.join(sorted(unknown))}")
    node.update(values)
    node["_partial_"] = True
    return node


def with_group(cfg: DictConfig, group: str, option: str, **values) -> DictConfig:
    """`cfg` (unchanged) copied with `group` replaced by the packaged `option`."""
    node = cast(dict, OmegaConf.to_container(cfg, resolve=True))
    node[group] = group_option(group, option, **values)
    return OmegaConf.create(node)
