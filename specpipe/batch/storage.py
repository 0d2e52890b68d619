"""The rows of one batch as a row storage (core/storage.py): one target forward over [B, N], one commit.

Contract: `BatchStorage(batch)` is the storage every row of one RaggedBatch (batch/cache.py) shares. `forward`
runs ONE `Engine.forward` over [B, N]: each row's [last_id, *fed] padded to N, at its own positions under its
own mask (a tree row's nodes at offset + depth under its ancestor mask inside the batch's mask), hidden states /
layer taps captured when any row's drafter asks, recurrent states when the batch has recurrent layers.
`commit` then keeps once what every row kept (`RaggedBatch.commit(kept, N)`: a batched row's rollback is the
mask, its rejected and padding columns holes; a tree row keeps its root and path wherever they were fed).
Every row of the batch steps, in the batch's order.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from specpipe.batch.cache import RaggedBatch
from specpipe.engine.engine import Capture, ForwardResult

if TYPE_CHECKING:
    from specpipe.core.row import Row


class BatchStorage:
    """The rows of one RaggedBatch (`batch`), fed and committed together."""

    tree_rollback = "mask"  # a tree row's unkept nodes become holes at the batch's commit

    def __init__(self, batch: RaggedBatch):
        self.batch = batch

    def forward(self, target, rows: list[Row], proposals: list) -> list[ForwardResult]:
        return _forward_batch(self.batch, target, rows, proposals)

    def commit(self, rows: list[Row], proposals: list, results: list[ForwardResult], kept: list[int]) -> None:
        trees = {b: p.kept_rows for b, p in enumerate(proposals) if p.tree is not None}
        n = 1 + max(len(p.fed_ids) for p in proposals)
        fed = _fed_positions(self.batch, proposals, n) if trees else None
        tree_columns = {b: (columns, fed[b]) for b, columns in trees.items()} if fed is not None else None
        # recurrent layers: each row its state after its kept[b]-th column
        self.batch.commit(kept, n, states=results[0].states, trees=tree_columns)

    def keep_tree_path(self, row: Row, start: int, kept_rows: list[int]) -> None:
        pass  # the batch's commit keeps them (the rest become holes)

    def tree_start(self, row: Row) -> int:
        return len(row.context) - 1  # the row's cache: all but the newest token

    def kv_figures(self, row: Row) -> dict:
        if row.row_id is None or row.row_id not in self.batch.row_ids:
            return {}  # it left the batch: no positions held
        return self.batch.kv_figures(row.row_id)


def _forward_batch(batch: RaggedBatch, target, rows: list[Row], proposals: list) -> list[ForwardResult]:
    """The rows of one RaggedBatch in one forward over [B, N]: each row's [last_id, *fed] padded to N."""
    if batch.size != len(rows) or any(r.storage is not rows[0].storage for r in rows):
        raise ValueError(f"forward_rows: {len(rows)} rows of a batch of {batch.size}: every row of it steps, in order")
    fed = [[row.last_id, *p.fed_ids] for row, p in zip(rows, proposals)]
    n = max(len(f) for f in fed)
    ids = np.zeros((len(rows), n), dtype=np.uint32)  # padding columns are never kept (the commit's holes)
    for b, f in enumerate(fed):
        ids[b, : len(f)] = f
    positions, mask = batch.positions(n), batch.mask(n)
    if any(p.tree is not None for p in proposals):  # tree rows: each node at offset + depth, seeing its ancestors
        positions = _fed_positions(batch, proposals, n)
        mask = mx.concatenate([mask[..., : mask.shape[-1] - n], _fed_mask(proposals, n)], axis=-1)
    capture = _joint_capture([p.capture for p in proposals], batch.state_capture())
    started = time.perf_counter()
    for p in proposals:
        p.started = started  # a row's verify seconds: the shared forward's, not the later rows' drafting too
    result = target.forward(ids, batch.layers, capture=capture, positions=positions, mask=mask)
    lazy = [result.logits, *(a for a in (result.hidden, result.layer_hidden) if a is not None)]
    mx.eval(lazy, [layer.state for layer in batch.layers])

    def part(a, b: int, m: int):
        return a[b, :m] if a is not None else None

    return [
        ForwardResult(
            logits=result.logits[b, : len(f)],
            hidden=part(result.hidden, b, len(f)),
            layer_hidden=part(result.layer_hidden, b, len(f)),
            states=result.states,  # the whole batch's: its commit picks each row's
        )
        for b, f in enumerate(fed)
    ]


def _fed_positions(batch, proposals: list, n: int) -> np.ndarray:
    """[B, n] each fed column's position: a chain row's offset + column, a tree row's node at offset + depth."""
    positions = batch.positions(n)
    for b, p in enumerate(proposals):
        if p.tree is not None:
            depths = [0, *p.tree.depths()]
            positions[b, : len(depths)] = batch.offsets[b] + np.asarray(depths, dtype=np.int32)
    return positions


def _fed_mask(proposals: list, n: int) -> mx.array:
    """[B, n, n] which fed columns each fed column sees: causal for a chain row, the ancestor mask for a tree's
    root and nodes (its padding columns see causally and are never kept)."""
    block = np.tril(np.ones((len(proposals), n, n), dtype=bool))
    for b, p in enumerate(proposals):
        if p.tree is not None:
            m = len(p.tree) + 1
            block[b, :m, :m] = np.asarray(p.tree.ancestor_mask(), dtype=bool)
    return mx.array(block)


def _joint_capture(captures: list, states) -> Capture | None:
    """One capture for the batch's forward: hidden states or layer taps when any row's drafter asks (all rows
    get them), and the batch's per-position recurrent states when it has recurrent layers (`states`). No K/V
    view: a drafter attending to the target's K/V reads its own row of the batch, lent as it joined."""
    asked = [c for c in captures if c is not None]
    if not asked and states is None:
        return None  # the plain forward: nothing recorded
    layers = {c.layers for c in asked if c.layers}
    if len(layers) > 1:
        raise ValueError(f"rows of one batch tap different layers: {sorted(layers)}")
    return Capture(hidden=any(c.hidden for c in asked), states=states, layers=layers.pop() if layers else ())
