"""One KV buffer per layer for B rows that accept different numbers of drafted tokens.

Contract: every step each row writes the same number of columns N (its newest token, its
draft, padding up to the longest draft); `commit(kept)` then says how many of those N columns
each row keeps (accepted drafts + 1). Nothing is copied on a partial accept: the columns a row
did not keep stay in the buffer as holes that `make_mask` hides from every later query, and the
row's RoPE position (`offsets`, one per row) advances only by what it kept, so a row's keys carry
the positions they would have alone. `compact()` squeezes the holes out once they outnumber the
kept columns. Rows join (`add`, from a solo prefill cache) and leave (`keep_rows`) between steps.

The batch is storage and bookkeeping only: a step's forward is
`Engine.forward(ids, batch.layers, positions=batch.positions(n), mask=batch.mask(n))`, the
engine's one mechanism for per-token positions and masks (engine/positions.py), the same one a
token tree goes through. Each column's position is kept too (`column_positions`), so a
sliding-window layer masks by position, holes or not.

Worked example (2 rows, N = 3 columns per step): row 0 keeps 3 (2 drafts accepted), row 1
keeps 1 (its draft rejected). Columns written [10, 11, 12]: row 0 sees all three from now on,
row 1 sees column 10 only; their offsets advance by 3 and 1.

Recurrent layers (qwen3_next's Gated DeltaNet, mamba2, ...) hold no columns: one state per row
(`RecurrentLayer`, an ArraysCache with the rows' states stacked on the batch axis) that has read
every fed column, padding included, so it cannot be masked afterwards. Such a batch `wants_states`:
its forward records each position's state (`state_capture()`, engine/recurrent.py) and `commit(kept,
n, states=)` gives row b the state after its kept[b]-th column. A batch of recurrent layers only
(mamba2) has no columns at all (`idx` stays 0); its rows still count their positions (`offsets`).
Sliding-window layers (gemma3) are attention layers here: a row joins from its window twin
(engine/kv.py WindowKVCache) and every forward masks them by position, so `compact` keeps all kept
columns and the window is applied at attention time. `storage_refusal` names what cannot be held.

A drafter that attends to the target's own K/V (draft=gemma4_assistant, engine/target_kv.py) reads its
request's row through `row_kv(row_id)` (`add` returns the id; it follows the row as others join, leave or
compact): the row's kept columns over its accepted prefix, never a hole or a padding column. Its query sits at
the row's newest cached position, one before the target's next, so a window layer holds one more position
than the target alone would read (`_reach`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

from specpipe.engine import introspect
from specpipe.engine.kv import WindowKVCache
from specpipe.engine.recurrent import StateCapture
from specpipe.engine.target_kv import KvRows
from specpipe.errors import SpecpipeError

GROW = 256  # columns added at a time, as mlx-lm's KVCache does


def storage_refusal(target) -> str | None:
    """One line saying which of the target's cache layers a RaggedBatch cannot hold, or None when it holds all.

    Held: plain attention (mlx-lm's KVCache), sliding-window attention (engine/kv.py WindowKVCache) and
    recurrent states (ArraysCache) of a family whose mixers record per-position states (introspect.MIXERS).
    """
    return _refusal(target.make_cache(), target.info.name, target.info.arch)


def _refusal(cache: list, name: str, arch: str) -> str | None:
    others = sorted({type(c).__name__ for c in cache if _kind(c) is None})
    if others:
        quantized = any(isinstance(c, QuantizedKVCache) for c in cache)
        return (
            f"{name} has {'/'.join(others)} layers (chunked, grouped, rotating with sinks or quantized): a batch "
            "holds plain, sliding-window and recurrent layers only; "
            + ("use kv=full to batch it" if quantized else "serve it with max_batch=1")
        )
    if any(_kind(c) is RecurrentLayer for c in cache) and arch not in introspect.MIXERS:
        return (
            f"{name} ({arch}) has recurrent layers without a per-position state hook (supported: "
            f"{', '.join(introspect.MIXERS)}): a batch cannot give each row its own kept state; "
            "serve it with max_batch=1"
        )
    return None


def _kind(solo) -> type | None:
    """The batch layer class that holds this solo cache layer, or None: none can."""
    if type(solo) in (KVCache, WindowKVCache):
        return LayerCache
    if isinstance(solo, ArraysCache):
        return RecurrentLayer
    return None


class RaggedBatch:
    """The batch's shared bookkeeping plus one `LayerCache` per layer (pass `.layers` to the model)."""

    def __init__(self, n_layers: int):
        self._next_id = 0  # `add` numbers rows; an id is never reused, so a lent view cannot read another row
        self._reset(n_layers)

    def _reset(self, n_layers: int) -> None:
        # attention until the first row joins: its solo cache says which layers are recurrent
        self.layers: list[LayerCache | RecurrentLayer] = [LayerCache(self) for _ in range(n_layers)]
        self.valid = np.zeros((0, 0), dtype=bool)  # [B, capacity]: which columns each row attends to
        self.pos = np.zeros((0, 0), dtype=np.int32)  # [B, capacity]: each column's position in its row
        self.offsets = np.zeros(0, dtype=np.int32)  # [B]: RoPE position of each row's next token
        self.idx = 0  # columns written so far (shared by every row)
        self.row_ids: list[int] = []  # [B]: each row's id from `add`, in row order

    @property
    def size(self) -> int:
        return len(self.offsets)

    @property
    def wants_states(self) -> bool:
        """Some layer is recurrent: the forward must record per-position states (`state_capture`) for `commit`."""
        return any(isinstance(layer, RecurrentLayer) for layer in self.layers)

    def state_capture(self) -> StateCapture | None:
        """A capture recording every recurrent layer's state after each fed column (pass it to the forward as
        `Capture(states=...)`, then its `ForwardResult.states` to `commit`); None when no layer is recurrent."""
        if not self.wants_states:
            return None
        capture = StateCapture()
        for layer in self.layers:
            if isinstance(layer, RecurrentLayer):
                capture.start(layer)
        return capture

    # ---------------------------------------------------------------- rows join and leave

    def add(self, solo_cache: list, length: int | None = None) -> int:
        """Append one row from a batch-1 prefill (the target's own cache list, one entry per layer).

        Its P prefilled columns go right-aligned before `idx`; when P > idx every row first gets
        P - idx hole columns on the left, so all rows stay aligned on the same write column.
        Recurrent layers append the row's states. `length`: the positions prefilled, needed only
        when no layer is attention (mamba2: no offset to read it from).

        Returns:
            the row's id (`row_kv`), kept while it stays in the batch.

        Raises:
            ValueError: a layer kind the batch cannot hold (`storage_refusal`), or other layers than its rows'.
        """
        if len(solo_cache) != len(self.layers):
            raise ValueError(f"a row of {len(solo_cache)} cache layers joins a batch of {len(self.layers)}")
        kinds = [_kind(c) for c in solo_cache]
        if None in kinds:
            raise ValueError(_refusal(solo_cache, "the joining row's model", ""))
        if self.size == 0:
            self.layers = [
                LayerCache(self) if k is LayerCache else RecurrentLayer(self, len(c.cache))
                for k, c in zip(kinds, solo_cache)
            ]
        elif kinds != [type(layer) for layer in self.layers]:
            raise ValueError("a row whose cache layers differ from the batch's joins it (another model?)")
        attention = [c for c, k in zip(solo_cache, kinds) if k is LayerCache]
        P = int(attention[0].offset) if attention else int(length or 0)
        if attention and length is not None and length != P:
            raise ValueError(f"length={length}, but the row's attention cache holds {P} positions")
        if not attention:  # no columns to align: only the row's states and its position
            for layer, solo in zip(self.layers, solo_cache):
                layer.add_row(solo, 0, 0)
            self.valid = np.zeros((self.size + 1, 0), dtype=bool)
            self.pos = np.zeros((self.size + 1, 0), dtype=np.int32)
            self.offsets = np.append(self.offsets, np.int32(P))
            return self._new_id()
        if P > self.idx:
            for layer in self.layers:
                layer.pad_left(P - self.idx, self.idx)
            self.valid = np.pad(self.valid[:, : self.idx], ((0, 0), (P - self.idx, 0)))
            self.pos = np.pad(self.pos[:, : self.idx], ((0, 0), (P - self.idx, 0)))
            self.idx = P
        for layer, solo in zip(self.layers, solo_cache):
            layer.add_row(solo, P, self.idx)
        row_valid = np.zeros((1, self.valid.shape[1]), dtype=bool)
        row_valid[0, self.idx - P : self.idx] = True
        row_pos = np.zeros((1, self.valid.shape[1]), dtype=np.int32)
        row_pos[0, self.idx - P : self.idx] = np.arange(P)
        self.valid = np.concatenate([self.valid, row_valid])
        self.pos = np.concatenate([self.pos, row_pos])
        self.offsets = np.append(self.offsets, np.int32(P))
        self._forget_past_window()  # the zeros before a window cache's newest columns among them
        return self._new_id()

    def _new_id(self) -> int:
        self.row_ids.append(self._next_id)
        self._next_id += 1
        return self.row_ids[-1]

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (in this order); the others leave the batch."""
        if not rows:
            self._reset(len(self.layers))
            return
        for layer in self.layers:
            layer.take_rows(rows)
        self.valid, self.pos, self.offsets = self.valid[rows], self.pos[rows], self.offsets[rows]
        self.row_ids = [self.row_ids[i] for i in rows]

    def row_cache(self, row_id: int, fresh: list) -> list | None:
        """The row as a lone cache would hold it, written into `fresh` (the target's `make_cache()`): each full
        attention layer's kept columns in position order, each recurrent layer the row's state; for the prefix
        store to keep a finished row's prompt and answer. None where a layer is a window (the batch kept no
        rollback margin before it) or `fresh` is not of plain and recurrent layers."""
        b = self.row_ids.index(row_id)
        length = int(self.offsets[b])
        view = self.row_kv(row_id)
        for i, (layer, solo) in enumerate(zip(self.layers, fresh)):
            if isinstance(layer, RecurrentLayer) and isinstance(solo, ArraysCache):
                solo.cache = [None if s is None else s[b : b + 1] for s in layer.cache]
            elif isinstance(layer, LayerCache) and type(solo) is KVCache and layer.window is None:
                rows = view.kv_rows(i, length, "target")
                solo.state = (rows.keys, rows.values, length)
            else:
                return None
        return fresh

    def row_kv(self, row_id: int) -> RowKv:
        """The K/V of the row `add` numbered `row_id`, as engine/target_kv.py's TargetKv reads it (`lend`)."""
        return RowKv(self, row_id)

    # ---------------------------------------------------------------- the step

    def kv_figures(self, row_id: int) -> dict:
        """The row's KV figures as engine/kv.py `kv_figures` gives a lone cache holding its positions: each
        attention layer's bytes per row and column times the row's kept columns there (holes and other rows
        apart), each recurrent layer its row's states."""
        b = self.row_ids.index(row_id)
        total = 0.0
        for layer in self.layers:
            if isinstance(layer, RecurrentLayer):
                total += sum(a.nbytes for a in layer.cache if a is not None) / self.size
            elif layer.keys is not None:
                columns = layer.keys.shape[2]
                per_column = (layer.keys.nbytes + layer.values.nbytes) / (self.size * columns)
                total += per_column * int(self.valid[b, layer.first_column : self.idx].sum())
        positions = int(self.offsets[b])
        return {"kv_bytes": int(total), "kv_bytes_per_token": total / positions if positions else 0.0}

    def positions(self, n: int) -> np.ndarray:
        """[B, n] int: the positions of the next n columns of each row (its offset on)."""
        return self.offsets[:, None] + np.arange(n, dtype=np.int32)[None, :]

    def mask(self, n: int) -> mx.array:
        """[B, n, idx + n] bool: earlier columns each row kept, then causal over the new n (Engine.forward's mask)."""
        past = mx.broadcast_to(mx.array(self.valid[:, : self.idx])[:, None, :], (self.size, n, self.idx))
        causal = mx.broadcast_to(mx.tril(mx.ones((n, n), dtype=mx.bool_)), (self.size, n, n))
        return mx.concatenate([past, causal], axis=-1)

    def column_positions(self) -> mx.array:
        """[B, idx] int: each written column's position in its row (a hole's: whatever it was fed at)."""
        return mx.array(self.pos[:, : self.idx])

    def commit(self, kept: list[int], n: int, states: StateCapture | None = None, trees: dict | None = None) -> None:
        """After a forward over n columns per row: row b keeps its first kept[b] of them.

        Args:
            kept: per row, the columns it keeps (1..n: its newest token, then its accepted drafts).
            n: the columns every row was fed (padding included).
            states: the forward's recorded states (`state_capture()`, ForwardResult.states); needed when
                a layer is recurrent and some row keeps fewer than n columns.
            trees: row b -> (the fed columns it keeps, its n fed positions) for a token tree's row: its root and
                path, wherever fed (core/step.py); kept[b] is their count.
        """
        if len(kept) != self.size or any(k < 0 or k > n for k in kept):
            raise ValueError(f"kept {list(kept)}: one count per row ({self.size}), each 0..{n}")
        for layer in self.layers:
            if isinstance(layer, RecurrentLayer):
                layer.keep(kept, n, states)
        if not any(isinstance(layer, LayerCache) for layer in self.layers):
            self.offsets = self.offsets + np.asarray(kept, dtype=np.int32)
            return  # no attention layer: no columns
        if self.valid.shape[1] < self.idx + n:
            more = ((0, 0), (0, self.idx + n - self.valid.shape[1] + GROW))
            self.valid, self.pos = np.pad(self.valid, more), np.pad(self.pos, more)
        self.valid[:, self.idx : self.idx + n] = np.arange(n)[None, :] < np.asarray(kept)[:, None]
        self.pos[:, self.idx : self.idx + n] = self.positions(n)
        for b, (columns, fed_positions) in (trees or {}).items():
            self.valid[b, self.idx : self.idx + n] = np.isin(np.arange(n), columns)
            self.pos[b, self.idx : self.idx + n] = fed_positions
        self.offsets = self.offsets + np.asarray(kept, dtype=np.int32)
        self.idx += n
        self._forget_past_window()
        self._drop_columns(at_least=GROW)  # in blocks: each drop copies the window layers' buffers

    def _forget_past_window(self) -> None:
        """Where every attention layer has a window (kv=window, recurrent_gemma), a column no later query of
        its row can reach becomes a hole, so `compact` frees it: the buffer stays about one window long.

        Example (window 4): a row's next position is 10; its queries (10, 11, ...) see keys from 7 on, a drafter
        reading its K/V from 6 on (`_reach`), so its columns at positions 0..5 are holes. A model with global
        layers too (gemma3) forgets nothing.
        """
        windows = [layer.window for layer in self.layers if isinstance(layer, LayerCache)]
        if not windows or None in windows:
            return
        reach = self._reach(max(w for w in windows if w is not None))
        self.valid[:, : self.idx] &= self.pos[:, : self.idx] > reach[:, None]

    def _reach(self, window: int) -> np.ndarray:
        """[B]: per row, the last position no later read of a layer of this window needs (keys at or before it
        are out). The row's next query (position offset) sees keys from offset - window + 1; a drafter reading
        the row's K/V (`row_kv`) queries from offset - 1, so from offset - window: one more is held for it."""
        return self.offsets - window - 1

    def _first_needed_column(self, window: int) -> int:
        """The first column a layer of this window must still hold: the first some row's next read can see
        (`_reach`), and never past the last window columns (a row joining next brings its window there).

        Example (window 4, rows at next positions 10 and 6): row 0 needs positions 6.. , row 1 positions 2..;
        the first column holding either is the answer.
        """
        reach = self._reach(window)
        live = (self.valid[:, : self.idx] & (self.pos[:, : self.idx] > reach[:, None])).any(axis=0)
        first = int(np.argmax(live)) if live.any() else self.idx
        return min(first, max(0, self.idx - window))

    def _drop_columns(self, at_least: int) -> None:
        """Free each sliding-window layer's columns before its first needed one, once `at_least` of them are
        (its buffer then starts at `first_column`; global layers keep every column)."""
        for layer in self.layers:
            if isinstance(layer, LayerCache) and layer.window is not None:
                layer.drop_before(self._first_needed_column(layer.window), at_least)

    def holes(self) -> int:
        """Columns written that no row attends to, summed over rows."""
        return int(self.size * self.idx - self.valid[:, : self.idx].sum())

    def compact(self) -> None:
        """Gather each row's kept columns, right-aligned, into a buffer as long as the longest row.

        Example: valid rows [T F T T, F F T F] -> [T T T, F F T] (row 1 left-padded with holes).
        """
        counts = self.valid[:, : self.idx].sum(axis=1)
        width = int(counts.max()) if self.size else 0
        index = np.zeros((self.size, width), dtype=np.int32)
        valid = np.zeros((self.size, width), dtype=bool)
        for b, c in enumerate(counts):
            index[b, width - c :] = np.flatnonzero(self.valid[b, : self.idx])
            valid[b, width - c :] = True
        gather = mx.array(index)[:, None, :, None]
        for layer in self.layers:
            layer.gather(gather)
        self.pos = np.take_along_axis(self.pos[:, : self.idx], index, axis=1) if self.size else self.pos[:, :0]
        self.valid, self.idx = valid, width
        self._drop_columns(at_least=1)  # right-aligned now: a window layer keeps its last columns only


class LayerCache:
    """One attention layer's storage for the batch: keys / values [B, H, cols, D], written at the shared
    column `idx`. It holds no mask of its own: Engine.forward sees it through engine/positions.py."""

    positioned = True  # engine/positions.py: an attention cache that counts its columns itself (`columns`)

    def __init__(self, batch: RaggedBatch):
        self.batch = batch
        self.keys: Any = None  # mx.array once a row is in (Any: mlx is untyped for mypy here)
        self.values: Any = None
        # a sliding-window layer's window (its rows' WindowKVCache's): engine/positions.py's FedCache masks
        # by it, as it does a window the model names (gemma3); kv=window's layers are known only this way
        self.window: int | None = None
        # the column the buffer starts at: a window layer frees the columns before every row's window
        # (`drop_before`), so on gemma3 its sliding layers stay about a window long while global ones grow
        self.first_column = 0

    @property
    def columns(self) -> int:
        return self.batch.idx  # key columns written so far, holes included (the mask's width before a forward)

    @property
    def offset(self) -> np.ndarray:
        return self.batch.offsets  # [B]: each row's next position

    def column_positions(self) -> mx.array:
        return self.batch.column_positions()[:, self.first_column :]  # the columns this layer holds

    @property
    def state(self):
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        # reached only by a direct model call, which would attend to the holes
        raise ValueError("a RaggedBatch is fed through Engine.forward(ids, batch.layers, positions=, mask=)")

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start, n = self.batch.idx - self.first_column, keys.shape[2]
        if self.keys is None or start + n > self.keys.shape[2]:
            self._grow(keys, values, start + n)
        self.keys[..., start : start + n, :] = keys
        self.values[..., start : start + n, :] = values
        return self.keys[..., : start + n, :], self.values[..., : start + n, :]

    # ---------------------------------------------------------------- buffer surgery (between steps)

    def _grow(self, keys: mx.array, values: mx.array, need: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        more = (need - have + GROW - 1) // GROW * GROW
        B, H, _, Dk = keys.shape
        new_k = mx.zeros((B, H, more, Dk), keys.dtype)
        new_v = mx.zeros((B, H, more, values.shape[3]), values.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
        else:
            self.keys = mx.concatenate([self.keys, new_k], axis=2)
            self.values = mx.concatenate([self.values, new_v], axis=2)

    def add_row(self, solo, P: int, idx: int) -> None:
        """Append a row holding the solo cache's P columns at [idx - P, idx).

        A window layer (engine/kv.py WindowKVCache) may have dropped its oldest positions: it fills
        only its newest columns; the zeros before them lie outside every later query's window.
        """
        if isinstance(solo, WindowKVCache):
            self.window = solo.window
        if self.keys is None and solo.keys is None:
            return  # nothing prefilled anywhere yet: the first forward allocates
        like_k = self.keys if self.keys is not None else solo.keys
        like_v = self.values if self.values is not None else solo.values
        end = idx - self.first_column  # the buffer's column for idx
        width = self.keys.shape[2] if self.keys is not None else end
        H, Dk, Dv = like_k.shape[1], like_k.shape[3], like_v.shape[3]
        row_k = mx.zeros((1, H, width, Dk), like_k.dtype)
        row_v = mx.zeros((1, H, width, Dv), like_v.dtype)
        held = P - getattr(solo, "start", 0)
        # its columns before the buffer's first lie outside the row's window (`_first_needed_column`)
        skip = min(held, max(0, self.first_column - (idx - held)))
        if held > skip:
            row_k[..., end - held + skip : end, :] = solo.keys[..., skip:held, :]
            row_v[..., end - held + skip : end, :] = solo.values[..., skip:held, :]
        if self.keys is None:  # rows already here had nothing prefilled: holes for them
            B = self.batch.size
            self.keys = mx.zeros((B, H, width, Dk), like_k.dtype)
            self.values = mx.zeros((B, H, width, Dv), like_v.dtype)
        self.keys = mx.concatenate([self.keys, row_k])
        self.values = mx.concatenate([self.values, row_v])

    def take_rows(self, rows: list[int]) -> None:
        if self.keys is not None:
            index = mx.array(rows)
            self.keys, self.values = self.keys[index], self.values[index]

    def pad_left(self, m: int, idx: int) -> None:
        """m hole columns before column 0 (a longer row joins; idx: the columns written before it)."""
        if self.keys is None:
            return
        if self.window is not None and self.first_column + m <= max(0, idx + m - self.window):
            self.first_column += m  # the new columns lie before the buffer, outside every window: nothing moves
            return
        pad = [(0, 0), (0, 0), (m, 0), (0, 0)]
        self.keys = mx.pad(self.keys[..., : idx - self.first_column, :], pad)
        self.values = mx.pad(self.values[..., : idx - self.first_column, :], pad)

    def gather(self, index: mx.array) -> None:
        """Take these columns (compaction's [B, 1, width, 1] index); the buffer then starts at column 0."""
        if self.keys is not None:
            if self.first_column:  # a column before the buffer is a hole or past its row's window: masked
                index = mx.maximum(index - self.first_column, 0)
            self.keys = mx.take_along_axis(self.keys, index, axis=2)
            self.values = mx.take_along_axis(self.values, index, axis=2)
            self.first_column = 0

    def drop_before(self, column: int, at_least: int) -> None:
        """Free the buffer's columns before `column` (no row's window reaches them) once `at_least` would go."""
        if self.keys is None or column - self.first_column < max(at_least, 1):
            return
        cut = column - self.first_column
        self.keys, self.values = self.keys[..., cut:, :], self.values[..., cut:, :]
        self.first_column = column


class RowKv:
    """One row's K/V in the batch's storage, as a drafter attending to the target's K/V reads it
    (engine/target_kv.py's LentRows): found by the id `add` gave it, so rows joining, leaving or compacting
    never point it at another row.

    Worked example (window 4, row 1 of a batch: its valid columns hold positions 0..9 with holes between):
    `kv_rows(sliding layer, 10, kind)` gathers the columns of positions 6..9, oldest first, first = 6.
    """

    def __init__(self, batch: RaggedBatch, row_id: int):
        self.batch, self.row_id = batch, row_id

    @property
    def layers(self) -> int:
        return len(self.batch.layers)

    def kv_rows(self, layer: int, length: int, kind: str) -> KvRows:
        """Entry `layer`'s keys / values of this row over positions [first, length): every kept position of an
        attention layer, a window layer's last `window` of them ([1, kv_heads, n, head_dim] each).

        Raises:
            SpecpipeError (one line): the row left the batch, holds fewer than `length` positions, or the layer
            is not attention (a recurrent state has no K/V to lend).
        """
        batch = self.batch
        if self.row_id not in batch.row_ids:
            raise SpecpipeError(f"batch row {self.row_id} left the batch: its drafter has no target K/V to read")
        b = batch.row_ids.index(self.row_id)
        cache = batch.layers[layer]
        if not isinstance(cache, LayerCache):
            raise SpecpipeError(f"the target's {kind} cache entry {layer} is recurrent: it has no K/V to lend")
        if batch.offsets[b] < length:
            raise SpecpipeError(
                f"the batch's row holds {batch.offsets[b]} positions of the target's {kind} cache, the context "
                f"needs {length}"
            )
        first = max(0, length - cache.window) if cache.window is not None else 0
        pos = batch.pos[b, : batch.idx]
        columns = np.flatnonzero(batch.valid[b, : batch.idx] & (pos >= first) & (pos < length))
        columns = columns[np.argsort(pos[columns], kind="stable")]  # oldest position first, as a solo cache
        if len(columns) != length - first or (len(columns) and columns[0] < cache.first_column):
            raise SpecpipeError(
                f"the batch no longer holds positions {first}..{length - 1} of the row's {kind} layer "
                f"({len(columns)} of them kept): it cannot lend them"
            )
        if len(columns) == 0 or bool(np.all(np.diff(columns) == 1)):  # no holes, in order: a slice, no gather
            lo = int(columns[0]) - cache.first_column if len(columns) else 0
            hi = lo + len(columns)
            return KvRows(cache.keys[b : b + 1, :, lo:hi], cache.values[b : b + 1, :, lo:hi], first)
        index = mx.array(columns - cache.first_column)
        return KvRows(
            mx.take(cache.keys[b : b + 1], index, axis=2), mx.take(cache.values[b : b + 1], index, axis=2), first
        )


class RecurrentLayer(ArraysCache):
    """One recurrent layer's states for the batch: mlx-lm's ArraysCache with each slot [B, ...], row b's
    state in row b. The model's own mixer reads and rebinds the slots as for any batched ArraysCache;
    `keep` then puts back, per row, the state after its kept columns (`StateRecord.state_per_row`)."""

    def __init__(self, batch: RaggedBatch, slots: int):
        super().__init__(slots)
        self.cache: list[Any] = self.cache  # ArraysCache's slots, typed for mypy (mlx-lm is untyped here)
        self.batch = batch

    def add_row(self, solo, P: int, idx: int) -> None:
        """Append the solo cache's states as the last row; an empty slot (nothing prefilled) is the zero state."""
        rows = self.batch.size  # the rows already here (the batch appends this one's offset afterwards)
        joined: list[Any] = []
        for mine, theirs in zip(self.cache, solo.cache):
            like = mine if mine is not None else theirs
            if like is None:
                joined.append(None)  # no row has this state yet: the mixer starts it
                continue
            a = mine if mine is not None else mx.zeros((rows, *like.shape[1:]), like.dtype)
            b = theirs if theirs is not None else mx.zeros((1, *like.shape[1:]), like.dtype)
            joined.append(mx.concatenate([a, b]))
        self.cache = joined

    def keep(self, kept: list[int], n: int, states: StateCapture | None) -> None:
        record = states.get(self) if states is not None else None
        if record is None:
            if all(k == n for k in kept):
                return  # every row kept every column: the states after the forward are the ones to keep
            raise ValueError(
                "a recurrent layer's rows kept different columns, but the forward recorded no states for it: "
                "pass Capture(states=batch.state_capture()) to the forward and its states to commit"
            )
        if record.positions() != n:
            raise ValueError(f"the forward recorded {record.positions()} positions of states, not the {n} fed")
        self.cache = record.state_per_row(kept)

    def take_rows(self, rows: list[int]) -> None:
        self.filter(mx.array(rows))

    def pad_left(self, m: int, idx: int) -> None:
        pass  # a state has no columns

    def gather(self, index: mx.array) -> None:
        pass
