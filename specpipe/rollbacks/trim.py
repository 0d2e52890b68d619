"""`rollback=trim`: truncate attention KV caches (offset -= n).

Refuses, before the run, caches with non-trimmable layers (recurrent state:
Mamba, Gated DeltaNet, ...), because truncation would silently keep state
from rejected tokens, and mlx-lm RotatingKVCache layers, which stop
truncating once they wrap (the engine's sliding-window layers are
WindowKVCache, which truncates exactly: engine/kv.py).
"""

from __future__ import annotations

from mlx_lm.models.cache import can_trim_prompt_cache

from specpipe.core.protocols import RollbackBase
from specpipe.errors import SpecpipeError
from specpipe.rollbacks import layers as cache_layers


class TrimRollback(RollbackBase):
    name = "trim"

    def __init__(self):
        self.dropped = 0

    def check(self, cache: list, role: str) -> None:
        cache_layers.refuse_rotating([leaf for entry in cache for leaf in cache_layers.parts(entry)], role, self.name)
        if not can_trim_prompt_cache(cache):
            kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
            raise SpecpipeError(
                f"rollback=trim cannot roll back the {role} model: its layers use {', '.join(kinds)} "
                "(recurrent state, not truncatable); use rollback=checkpoint, rollback=recompute or rollback=auto"
            )

    def before_forward(self, cache: list) -> None:
        pass  # truncation needs no snapshot

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        if n_drop > 0:
            # every part, one by one: a part that cannot give the positions back is named in one line
            cache_layers.trim([leaf for entry in cache for leaf in cache_layers.parts(entry)], n_drop)
            self.dropped += n_drop
