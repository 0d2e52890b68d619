"""The user's own config folder, where `specpipe-tune` writes presets that every command then finds.

Contract: `user_config_dir()` is `$SPECPIPE_CONFIG_DIR`, else `$XDG_CONFIG_HOME/specpipe`, else
`~/.config/specpipe`; `search_path()` (the `specpipe_user_conf` resolver, read by the `hydra.searchpath`
of every primary config) is that folder as a Hydra search-path entry when it exists, else the packaged
configs again, because Hydra warns on every run about a search-path folder that does not exist and a
user who never tuned has none; inside `packaged_only()` it is always the latter (the config composed
without the shared folder, to compare against: shared_config.py). Nothing here creates a file or a
folder, and nothing writes into the installed package.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PRESET_GROUP = "preset"
_packaged_only = False


def user_config_dir() -> Path:
    """Where the user's presets live (`<dir>/preset/<name>.yaml`)."""
    if os.environ.get("SPECPIPE_CONFIG_DIR"):
        return Path(os.environ["SPECPIPE_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "specpipe"


def search_path() -> str:
    """`file://<user config dir>` when it exists; else `pkg://specpipe.conf`, an entry that adds nothing."""
    folder = user_config_dir()
    if _packaged_only:
        return "pkg://specpipe.conf"
    return f"file://{folder.resolve()}" if folder.is_dir() else "pkg://specpipe.conf"


@contextlib.contextmanager
def packaged_only() -> Iterator[None]:
    """Compose as if the user had no config folder (`search_path()` adds nothing) for the `with` block."""
    global _packaged_only
    _packaged_only = True
    try:
        yield
    finally:
        _packaged_only = False


def user_preset_path(name: str) -> Path:
    return user_config_dir() / PRESET_GROUP / f"{name}.yaml"


def user_options(group: str) -> list[str]:
    """The user's own options of `group` (`<dir>/<group>/<name>.yaml`, e.g. the presets specpipe-tune wrote),
    sorted; [] when there are none (or the folder cannot be read)."""
    try:
        return sorted(
            p.name[: -len(".yaml")] for p in (user_config_dir() / group).iterdir() if p.name.endswith(".yaml")
        )
    except OSError:
        return []
