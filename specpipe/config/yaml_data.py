"""YAML read as data: the one loader for every file someone else may have written (a run's snapshot, a chat
recording's config, a preset, a `--config-dir` folder).

Contract: `load_yaml_data(text, where)` returns the plain value (dicts, lists, scalars) or raises ConfigError
with one line naming `where` and what is refused: an anchor or alias (a few lines that expand to gigabytes),
a key given twice in one mapping (which one counts is a guess), nesting deeper than MAX_DEPTH, or text
longer than MAX_BYTES. `find_resolver(node)` names the first string that calls an OmegaConf resolver
(`${oc.decode:...}`, `${oc.env:...}`): a shared file's value must be what it says, not what a resolver
makes of it at run time. Nothing here imports or runs what a file names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from specpipe.errors import ConfigError

MAX_DEPTH = 32  # specpipe's own configs nest 4 levels; Hydra's node 6
MAX_BYTES = 1 << 20  # a config is a few KiB; a recording's config_yaml the same
# `${name:` is a resolver call (oc.decode, oc.env, oc.create, now, ...); `${a.b}` is a plain reference
RESOLVER = re.compile(r"\$\{\s*[A-Za-z_][\w.]*\s*:")


class _DataLoader(yaml.SafeLoader):
    """SafeLoader that refuses what data does not need: anchors, aliases, repeated keys, deep nesting."""

    depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused("an anchor or alias (&name / *name)", event.start_mark)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _Refused(f"the key {key!r} twice in one mapping", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Refused(Exception):
    def __init__(self, what: str, mark) -> None:  # type: ignore[no-untyped-def]
        super().__init__(what)
        self.what, self.mark = what, mark


def load_yaml_data(text: str, where: str, fix: str = "fix the file") -> Any:
    """The YAML `text` as plain data; ConfigError (one line naming `where`) for what a config never needs."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{where} is {len(text)} characters, over the {MAX_BYTES} a config may have: refused")
    try:
        return yaml.load(text, Loader=_DataLoader)  # noqa: S506  (_DataLoader is a SafeLoader)
    except _Refused as exc:
        at = f" at line {exc.mark.line + 1}, column {exc.mark.column + 1}" if exc.mark is not None else ""
        raise ConfigError(
            f"{where} holds {exc.what}{at}: a shared config is plain data; write the values out"
        ) from None
    except RecursionError as exc:
        raise ConfigError(f"{where} nests too deeply to read: refused") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where} is not valid YAML ({problem}{at}): {fix}") from exc


def find_resolver(node: Any, path: str = "") -> tuple[str, str] | None:
    """(dotted key, value) of the first string under `node` that calls a resolver, else None."""
    for key, value in _leaves(node, path):
        if isinstance(value, str) and RESOLVER.search(value):
            return key, value
    return None


def _leaves(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if items is None:
        yield path, node
        return
    for key, value in items:
        name = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and RESOLVER.search(key):
            yield name, key
        yield from _leaves(value, name)
