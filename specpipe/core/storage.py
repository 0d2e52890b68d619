"""Where a row's target K/V lives, behind the one interface the step uses: a storage choice, not a second driver.

Contract: a `RowStorage` runs a step's one target forward over its rows' [last_id, *fed] (`forward`), keeps
what each row kept once every row settled (`commit`), keeps a tree row's root and accepted path
(`keep_tree_path`), says where a tree row's nodes start (`tree_start`) and what K/V a row holds
(`kv_figures`). `LoneCache` is one request's own mlx-lm cache, of any kind a lone row may hold (trimmed,
checkpointed or recomputed by its rollback strategy; quantized, windowed or chunked KV): its row's rollback
already brought it to what the row kept while the row settled, so its commit has nothing left to do. Rows
of one batch share a batch/storage.py `BatchStorage` (a RaggedBatch: one forward over [B, N], the rest holes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from specpipe.core.stages.verify import verify
from specpipe.engine.kv import kv_figures

if TYPE_CHECKING:
    from specpipe.core.row import Row
    from specpipe.engine.engine import ForwardResult


class RowStorage(Protocol):
    tree_rollback: str  # RolledBack.strategy of a tree row's target: "tree-compact" (kept in place) | "mask"

    def forward(self, target, rows: list[Row], proposals: list) -> list[ForwardResult]:
        """One target forward over every row's [last_id, *fed]; per row its ForwardResult, root first."""
        ...

    def commit(self, rows: list[Row], proposals: list, results: list[ForwardResult], kept: list[int]) -> None:
        """After every row settled: each row keeps `kept[b]` of the columns it was fed (accepted + next)."""
        ...

    def keep_tree_path(self, row: Row, start: int, kept_rows: list[int]) -> None:
        """A tree row keeps its root and accepted path (`kept_rows`: fed columns counted from `start`)."""
        ...

    def tree_start(self, row: Row) -> int:
        """Positions the row's target cache holds before this step's feed (where a tree's root goes)."""
        ...

    def kv_figures(self, row: Row) -> dict:
        """RunStats' kv_bytes / kv_bytes_per_token of the positions the row holds ({} once it holds none)."""
        ...


class LoneCache:
    """One request's own target cache (`layers`: the model's cache list), fed exactly as a chain verify or a
    tree forward of that request alone."""

    tree_rollback = "tree-compact"

    def __init__(self, layers: list):
        self.layers = layers

    def forward(self, target, rows: list[Row], proposals: list) -> list[ForwardResult]:
        if len(rows) != 1:
            raise ValueError(f"forward_rows: {len(rows)} rows without a shared batch (RaggedBatch): one row alone")
        (row,), (proposal,) = rows, proposals
        if proposal.tree is None:
            return [verify(target, self.layers, row.last_id, proposal.fed_ids, proposal.capture)]
        from specpipe.trees.forward import tree_forward

        return [tree_forward(target, self.layers, row.last_id, proposal.tree, proposal.capture)]

    def commit(self, rows: list[Row], proposals: list, results: list[ForwardResult], kept: list[int]) -> None:
        pass  # the row's rollback strategy (or a tree's keep_tree_path) already kept what it kept

    def keep_tree_path(self, row: Row, start: int, kept_rows: list[int]) -> None:
        from specpipe.engine.keep import keep_path

        keep_path(self.layers, start, kept_rows)

    def tree_start(self, row: Row) -> int:
        return self.layers[0].offset

    def kv_figures(self, row: Row) -> dict:
        return kv_figures(self.layers)
