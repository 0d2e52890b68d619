"""Config folders someone else may have written (`--config-dir DIR`, the user's config folder with the presets
`specpipe-tune` writes or a colleague sent) read as data, and the few Hydra settings such a file may change.

Contract: `check_shared_files(folders)` reads every YAML file under those folders with the data loader
(yaml_data.py: no anchors, aliases, repeated keys or deep nesting) and refuses any resolver call
(`${oc.decode:...}`, `${oc.env:...}`), one line naming the file and the key. `check_shared_effect(job, shared,
packaged)` compares a config composed with the shared folders against the same command line composed from
the packaged files alone: Hydra's node may differ only at SHARED_HYDRA_KEYS, and `output_dir` and `api_key`
not at all (output locations and secrets come from the command line). Both read values; nothing named is
imported or run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from specpipe.config.yaml_data import MAX_BYTES, find_resolver, load_yaml_data
from specpipe.errors import ConfigError

# Hydra settings a shared file may change: where the job runs and how much it logs. Logging handlers,
# formatters, env_set, launchers, callbacks and the run / sweep folders are the user's command line's.
SHARED_HYDRA_KEYS = ("job.chdir", "verbose", "job_logging.root.level", "hydra_logging.root.level")
# Hydra's bookkeeping of what was chosen (the preset's name, the search path): differs by construction
HYDRA_BOOKKEEPING = ("runtime", "overrides", "searchpath", "job.override_dirname")
MAX_FILES = 1000  # a config folder holds a few presets; a home directory given by mistake is not walked


def shared_folders(search_dir: str | None) -> list[Path]:
    """`--config-dir DIR` and the user's config folder, those that exist."""
    from specpipe.config.user_config import user_config_dir

    folders = [Path(search_dir)] if search_dir else []
    return [f for f in [*folders, user_config_dir()] if f.is_dir()]


def check_shared_files(folders: list[Path]) -> str | None:
    """One line for the first YAML file under `folders` that is not plain data, else None."""
    for path in _yaml_files(folders):
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
            text = data.decode("utf-8")
            node = load_yaml_data(text, str(path))
        except ConfigError as exc:
            return str(exc)
        except OSError as exc:
            return f"cannot read {path} ({exc.strerror}): fix its permissions or move it out of the config folder"
        except UnicodeDecodeError as exc:
            return f"{path} is not UTF-8 text (byte {exc.start}): fix the file or move it out of the config folder"
        found = find_resolver(node)
        if found:
            key, value = found
            return (
                f"{path}: {key}={value!r} calls a resolver, which a shared config may not: "
                "write the value itself (resolvers belong on your own command line)"
            )
    return None


def check_shared_effect(shared: dict, packaged: dict, where: str) -> str | None:
    """One line when the shared folders changed Hydra's node beyond SHARED_HYDRA_KEYS, or `output_dir`.

    Args:
        shared: the composed config (Hydra's node under "hydra"), unresolved, with the shared folders.
        packaged: the same command line composed from specpipe's and Hydra's packaged files alone.
        where: the folders, for the message.
    """
    for key, value in _differences(shared.get("hydra") or {}, packaged.get("hydra") or {}, ""):
        if key in SHARED_HYDRA_KEYS or key.startswith(tuple(f"{b}." for b in HYDRA_BOOKKEEPING)):
            continue
        if key in HYDRA_BOOKKEEPING:
            continue
        return (
            f"hydra.{key}={_short(value)} comes from {where}, and a shared config may set only "
            f"hydra.{', hydra.'.join(SHARED_HYDRA_KEYS)}: remove it from the file (give run folders on the "
            "command line: hydra.run.dir=<folder>)"
        )
    if shared.get("api_key") != packaged.get("api_key"):
        return (
            f"api_key comes from {where}: a key written in a shared file is no secret; remove it and give "
            "api_key=... on the command line or SPECPIPE_API_KEY in the environment"
        )
    if shared.get("output_dir") != packaged.get("output_dir"):
        return (
            f"output_dir={_short(shared.get('output_dir'))} comes from {where}: output locations come only from "
            "the command line; remove it from the file and give output_dir=<folder> when you run"
        )
    return None


def packaged_overrides(job: list[str]) -> list[str]:
    """`job` without the overrides that choose an option only a shared folder has (`preset=mine`)."""
    conf = resources.files("specpipe.conf")
    out = []
    for override in job:
        key, eq, value = override.partition("=")
        group = key.lstrip("+~").split("@")[0]
        if eq and "/" not in group and "." not in group and conf.joinpath(group).is_dir():
            if not conf.joinpath(group, f"{value}.yaml").is_file():
                continue
        out.append(override)
    return out


# ---------------------------------------------------------------- walking


def _yaml_files(folders: list[Path]) -> Iterator[Path]:
    count = 0
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                if name.endswith((".yaml", ".yml")):
                    count += 1
                    if count > MAX_FILES:
                        return
                    yield Path(root) / name


def _differences(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value in `a`) wherever `a` and `b` differ, a key missing on one side included."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            name = f"{path}.{key}" if path else str(key)
            if key not in a:
                yield name, None
            elif key not in b:
                yield name, a[key]
            else:
                yield from _differences(a[key], b[key], name)
    elif a != b:
        yield path, a


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
