"""Sort a model's cache into what truncates and what must be restored.

Contract: `split(cache)` flattens an mlx-lm prompt cache (a list with one
entry per layer; `CacheList` entries hold several, as Falcon-H1's parallel
Mamba + attention layers do) into attention parts, which roll back by
truncation (`trim(n)`), and recurrent parts (`ArraysCache`: SSM / delta-rule
/ conv states), which hold one state for "everything so far" and must be
restored. Anything else is refused by `check` with one line naming it.
Parts are sorted by kind, never by how full they are now: mlx-lm's
RotatingKVCache truncates only until it wraps, so it is always refused
(the engine gives sliding-window layers engine/kv.py's WindowKVCache; only
one with attention sinks, keep > 0, is left). Nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_lm.models.cache import CacheList, RotatingKVCache

from specpipe.errors import SpecpipeError

STRATEGIES = "rollback=checkpoint, rollback=recompute or rollback=auto"


@dataclass
class Layers:
    attention: list = field(default_factory=list)  # truncatable parts (KVCache, WindowKVCache, ...)
    recurrent: list = field(default_factory=list)  # ArraysCache-like parts: `.cache` is a list of state slots
    other: list = field(default_factory=list)  # neither: no strategy here can roll them back


def parts(entry) -> list:
    """The leaf caches of one layer's entry (a CacheList holds several)."""
    if isinstance(entry, CacheList):
        return [leaf for c in entry.caches for leaf in parts(c)]
    return [entry]


def is_recurrent(leaf) -> bool:
    # ArraysCache (and its old alias MambaCache) keeps its state slots in a list named `cache`.
    return not leaf.is_trimmable() and isinstance(getattr(leaf, "cache", None), list)


def split(cache: list) -> Layers:
    layers = Layers()
    for entry in cache:
        for leaf in parts(entry):
            if is_recurrent(leaf):
                layers.recurrent.append(leaf)
            elif isinstance(leaf, RotatingKVCache):
                # trimmable on a fresh cache, not once wrapped: sorted as what it becomes,
                # so `check` refuses it and no rollback passes over it
                layers.other.append(leaf)
            elif leaf.is_trimmable():
                layers.attention.append(leaf)
            else:
                layers.other.append(leaf)
    return layers


def kinds(leaves: list) -> str:
    """'ArraysCache, KVCache': the distinct cache types, for messages."""
    return ", ".join(sorted({type(c).__name__ for c in leaves}))


def check(cache: list, role: str, strategy: str) -> Layers:
    """Refuse a cache with parts that neither truncate nor hold restorable state."""
    layers = split(cache)
    refuse_rotating(layers.other, role, strategy)
    if layers.other:
        raise SpecpipeError(
            f"rollback={strategy} cannot roll back the {role} model: its {kinds(layers.other)} layers neither "
            "truncate nor hold restorable recurrent state; use draft=none"
        )
    return layers


def refuse_rotating(leaves: list, role: str, strategy: str) -> None:
    """Refuse mlx-lm RotatingKVCache parts in one line (engine/kv.py swaps the keep=0 ones before this)."""
    rotating = [leaf for leaf in leaves if isinstance(leaf, RotatingKVCache)]
    if rotating:
        keep = ", ".join(sorted({str(leaf.keep) for leaf in rotating}))
        raise SpecpipeError(
            f"rollback={strategy} cannot roll back the {role} model: its RotatingKVCache layers (keep={keep}) "
            f"cannot give positions back once past their window of {rotating[0].max_size}; use draft=none"
        )


def trim(leaves: list, n: int) -> None:
    """Drop the newest `n` positions of every attention part."""
    if n <= 0:
        return
    for leaf in leaves:
        if not leaf.is_trimmable():
            raise SpecpipeError(f"cannot roll back a {type(leaf).__name__} layer just now; use draft=none")
        trimmed = leaf.trim(n)
        if trimmed != n:
            raise SpecpipeError(f"a {type(leaf).__name__} layer gave back {trimmed} of {n} positions; use draft=none")


def slot_bytes(arrays, exclude=()) -> int:
    """Bytes of the distinct arrays in `arrays` (None skipped), except those in `exclude`."""
    skip = {id(a) for a in exclude if a is not None}
    seen: dict[int, int] = {}
    for a in arrays:
        if a is not None and id(a) not in skip:
            seen[id(a)] = a.nbytes
    return sum(seen.values())
