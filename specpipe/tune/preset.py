"""The winning setup as a preset in the user's config folder, which every command's search path reads.

Contract: `write_preset(cfg, candidate, option, name, notes)` writes `<user config dir>/preset/<name>.yaml`
(specpipe/config/user_config.py: never inside the installed package) and returns its path. The file holds group
choices and plain values only (no `_target_`: the packaged option YAMLs keep those), so
`preset=<name>` composes in specpipe, specpipe-chat, specpipe-serve and specpipe-bench like a packaged preset.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from omegaconf import OmegaConf

from specpipe.config.user_config import user_preset_path
from specpipe.errors import ConfigError
from specpipe.tune.plan import Candidate

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
PACKAGED = ("quick", "real-pair")


def check_name(name: str) -> None:
    """A preset name is a file name in one folder, and never shadows a packaged preset."""
    if not NAME.match(name) or name.endswith(".yaml"):
        raise ConfigError(f"save_as={name!r}: use letters, digits, '-', '_' or '.' (save_as=tuned)")
    if name in PACKAGED:
        raise ConfigError(f"save_as={name}: a packaged preset has that name; choose another (save_as=tuned)")


def changed_values(cfg, group: str, option: str, keep: dict | None = None) -> dict:
    """The group's values in `cfg` that differ from the packaged option's YAML (what the user overrode)."""
    from specpipe.config.config_groups import group_option

    packaged = group_option(group, option)
    mine = cast(dict, OmegaConf.to_container(cfg[group], resolve=True)) if group in cfg else {}
    out = {k: v for k, v in mine.items() if k not in ("_target_", "_partial_", "name") and packaged.get(k) != v}
    out.update(keep or {})
    return out


def write_preset(cfg, choices: dict, candidate: Candidate, option: str, name: str, notes: list[str]) -> Path:
    """Write the preset; `choices` are the composed run's group choices (HydraConfig's runtime.choices)."""
    check_name(name)
    model = choices.get("model") or "smollm2-135m"
    tree = "dynamic" if candidate.tree else (choices.get("tree") or "chain")
    budget = "auto" if option == "auto" else "fixed"
    defaults = [
        {"override /model": model},
        {"override /draft": candidate.draft},
        {"override /budget": budget},
        {"override /tree": tree},
    ]
    body: dict = {}
    for group, opt, keep in (
        ("model", model, None),
        ("draft", candidate.draft, dict(candidate.values)),
        ("quant", choices.get("quant") or "auto", None),
    ):
        values = changed_values(cfg, group, opt, keep) if group != "draft" else dict(keep or {})
        if values:
            body[group] = values
    if option != "auto":
        body["budget"] = {"k": int(option[2:])}
    elif cfg.budget.name == "auto":
        body.update({"budget": v} if (v := changed_values(cfg, "budget", "auto")) else {})
    if choices.get("quant") and choices["quant"] != "auto":
        defaults.append({"override /quant": choices["quant"]})
    path = user_preset_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "# @package _global_",
        f"# written by specpipe-tune on {stamp}; use: specpipe preset={name} | specpipe-chat preset={name} | "
        f"specpipe-serve preset={name}",
        *(f"# {line}" for line in notes),
    ]
    text = OmegaConf.to_yaml(OmegaConf.create({"defaults": defaults, **body}))
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text("\n".join(header) + "\n" + text, encoding="utf-8")
    tmp.replace(path)  # a rerun replaces the preset whole, never half
    return path
