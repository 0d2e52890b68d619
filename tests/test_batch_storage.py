"""batch/cache.py RaggedBatch holding recurrent (qwen3_next, mamba2) and sliding-window (gemma3) layers, driven
through Engine.forward directly: rows of different prompt lengths take steps of hand-made drafts, each keeps
its own count of columns (the rest: rejected drafts and end padding), rows join and leave between steps, and
every row's logits equal that row's whole context fed alone through a fresh cache of the plain model."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import tiny

from specpipe.batch.cache import RaggedBatch, storage_refusal
from specpipe.engine.engine import Capture
from specpipe.engine.kv import WindowKV, WindowKVCache
from specpipe.engine.load.loader import load_engine

# float32 logits of magnitude ~30: OpenBLAS's blocking differs with the batch's shape, so a row batched and the
# same row alone differ by up to ~2e-4 (qwen3_5); a row given another's state, or padding in its own, by > 1
ATOL = 1e-3

# gemma3_text / gemma3 (the 4b+ wrapper): window 64 on the sliding layers, so contexts of ~100 positions pass
# it; qwen3_next / qwen3_5: Gated DeltaNet beside attention; mamba2: recurrent layers only (no columns at all)
ARCHS = ["qwen3_next", "qwen3_5", "mamba2", "gemma3_text", "gemma3"]


def tokens(seed: int, n: int) -> list[int]:
    return [3 + (i * 7 + seed * 13) % 200 for i in range(n)]


class Rows:
    """A RaggedBatch and, per row, the context its cache holds (what the row alone would have fed)."""

    def __init__(self, engine):
        self.e = engine
        self.batch = RaggedBatch(len(engine.make_cache()))
        self.contexts: list[list[int]] = []
        self.dropped = 0  # positions the joining rows' window layers had dropped

    def join(self, prompt: list[int]) -> None:
        solo = self.e.make_cache()
        for c in solo:
            if isinstance(c, WindowKVCache):
                c.margin = 4  # drops its oldest positions early: a row joins holding fewer columns than it fed
        if prompt:
            self.e.prefill(prompt[:-3], solo)
            self.e.prefill(prompt[-3:], solo)  # this update drops what the first left past window + margin
        self.dropped += sum(getattr(c, "start", 0) for c in solo)
        self.batch.add(solo, length=len(prompt))
        self.contexts.append(list(prompt))

    def leave(self, keep: list[int]) -> None:
        self.batch.keep_rows(keep)
        self.contexts = [self.contexts[b] for b in keep]

    def step(self, fed: list[list[int]], kept: list[int]) -> None:
        """One forward over every row's fed columns (padded to the longest), checked against each row alone,
        then row b keeps its first kept[b] columns."""
        n = max(len(f) for f in fed)
        ids = np.zeros((len(fed), n), dtype=np.uint32)  # the padding: column ids no row keeps
        for b, f in enumerate(fed):
            ids[b, : len(f)] = f
        capture = Capture(states=self.batch.state_capture()) if self.batch.wants_states else None
        out = self.e.forward(
            ids, self.batch.layers, capture=capture, positions=self.batch.positions(n), mask=self.batch.mask(n)
        )
        for b, f in enumerate(fed):
            alone = self.e.forward(self.contexts[b] + f, self.e.make_cache()).logits[-len(f) :]
            assert mx.allclose(out.logits[b, : len(f)], alone, atol=ATOL).item(), (self.e.info.arch, b, f)
        self.batch.commit(kept, n, states=out.states)
        for b, k in enumerate(kept):
            self.contexts[b] += fed[b][:k]
        assert list(self.batch.offsets) == [len(c) for c in self.contexts]


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_that_keep_different_columns_join_and_leave_equal_each_row_alone(arch):
    e = tiny(arch)
    assert storage_refusal(e) is None
    rows = Rows(e)
    rows.join(tokens(0, 90))
    rows.join(tokens(1, 30))
    assert rows.batch.wants_states == (not arch.startswith("gemma3"))
    # row 0 keeps 2 of 4 (drafts rejected); row 1 keeps both of its 2 real columns, 2 short of the padded 4
    rows.step([[5, 9, 11, 3], [6, 4]], [2, 2])
    rows.join(tokens(2, 7))  # shorter than every row: left holes for it
    rows.step([[7, 2, 8], [3, 3, 3], [9]], [3, 1, 1])
    rows.join(tokens(3, 120))  # longer than every row: left holes for the others
    rows.step([[4, 4], [2, 6, 1, 7, 5], [8, 1, 1], [6]], [1, 5, 2, 1])
    rows.leave([3, 0, 2])  # row 1 leaves (a client gone), the rest reorder
    rows.step([[1, 2, 3], [5], [7, 7]], [3, 1, 2])
    rows.batch.compact()  # holes squeezed out: each row's kept columns only
    sliding = [layer for layer in rows.batch.layers if getattr(layer, "window", None)]
    assert len(sliding) == arch.startswith("gemma3")  # gemma3's sliding layer keeps its last columns only
    assert all(0 < layer.first_column <= rows.batch.idx - 63 for layer in sliding)
    rows.step([[9, 8, 7, 6], [2, 2], [3]], [2, 2, 1])
    rows.step([[1], [4], [5]], [1, 1, 1])
    assert not arch.startswith("gemma3") or rows.dropped > 0, (
        "no row joined from a window cache that had dropped positions"
    )


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2"])
def test_a_row_with_nothing_prefilled_joins_rows_with_states(arch):
    """A one-token prompt prefills nothing: its recurrent slots are empty (None) beside the others' states."""
    rows = Rows(tiny(arch))
    rows.join(tokens(0, 12))
    rows.join([])
    rows.step([[5, 9], [6, 4, 2]], [1, 3])
    rows.step([[4], [7]], [1, 1])
    rows.leave([1])
    rows.join([])
    rows.step([[3, 1], [2]], [2, 1])
    rows.step([[1], [1]], [1, 1])


def test_every_row_keeping_every_column_needs_no_recorded_states():
    e = tiny("qwen3_next")
    batch = RaggedBatch(len(e.make_cache()))
    for p in (tokens(0, 9), tokens(1, 4)):
        solo = e.make_cache()
        e.prefill(p, solo)
        batch.add(solo)
    ids = np.array([[5, 9], [6, 4]], dtype=np.uint32)
    e.forward(ids, batch.layers, positions=batch.positions(2), mask=batch.mask(2))
    batch.commit([2, 2], 2)  # the states after the forward are every row's
    e.forward(ids, batch.layers, positions=batch.positions(2), mask=batch.mask(2))
    with pytest.raises(ValueError, match="recorded no states"):
        batch.commit([2, 1], 2)


@pytest.mark.parametrize("arch", ["llama4", "falcon_h1"])  # chunked attention; Mamba2 + attention in a CacheList
def test_a_cache_kind_the_batch_cannot_hold_is_refused_in_one_line(arch):
    e = tiny(arch)
    line = storage_refusal(e)
    assert line and "\n" not in line and "max_batch=1" in line
    batch = RaggedBatch(len(e.make_cache()))
    with pytest.raises(ValueError, match="a batch holds plain, sliding-window and recurrent layers only"):
        batch.add(e.make_cache())


def test_plain_attention_targets_are_held():
    for arch in ("llama", "qwen3"):
        assert storage_refusal(tiny(arch)) is None


def test_a_quantized_kv_cache_is_refused_naming_kv_full():
    from specpipe.engine.kv import QuantizedKV

    e = tiny("llama")
    e.kv = QuantizedKV(bits=8, group_size=32)
    try:
        line = storage_refusal(e)
    finally:
        e.kv = None
    assert line and "QuantizedKVCache" in line and "kv=full" in line


def windowed(which: str):
    """Targets whose every attention layer has a window of 16: kv=window on llama, recurrent_gemma's local layers."""
    if which == "kv=window":
        e = tiny("llama")
        e.kv = WindowKV(16)
        return e
    return load_engine("tiny-random", precision="float32", arch=which, seed=0, tiny={"attention_window_size": 16})


@pytest.mark.parametrize("which", ["kv=window", "recurrent_gemma"])
def test_where_every_layer_has_a_window_the_batch_stays_one_window_long(which):
    """Each row attends to its last 16 positions as alone; the columns no window reaches become holes that
    compaction frees, so the buffer does not grow with the rows' contexts."""
    rows = Rows(windowed(which))
    rows.join(tokens(0, 40))
    rows.join(tokens(1, 12))
    for s in range(12):
        rows.step([[5, 9, 11, 3], [6, 4 + s]], [1 + s % 4, 1 + s % 2])
        if s % 3 == 2:
            rows.batch.compact()
            # each row's columns inside its window only: its next query reads 15 back, a drafter attending to its
            # K/V (draft=gemma4_assistant) 16, from the row's newest position (RaggedBatch._reach)
            assert rows.batch.idx <= 16
        if s == 5:
            rows.join(tokens(2, 30))
            rows.leave([2, 0])
    assert min(len(c) for c in rows.contexts) > 16


def test_gemma3s_sliding_layers_free_the_columns_past_every_rows_window(monkeypatch):
    """Between compactions too: once a block of columns lies before every row's window, the sliding layer
    frees it (blocks of GROW, 8 here) while the global layer keeps every column; rows that join later (longer
    than the batch, or after a long row left) still find their whole window, and each row equals alone."""
    from specpipe.batch import cache

    monkeypatch.setattr(cache, "GROW", 8)
    rows = Rows(tiny("gemma3_text"))
    rows.join(tokens(1, 10))
    rows.join(tokens(0, 70))  # longer than the batch's 10 columns: holes before the first row, none dropped
    for s in range(30):
        if s == 4:
            rows.leave([0])  # the long row leaves: the short one's window starts late, yet room is kept
        if s == 12:
            rows.join(tokens(2, 66))  # its window reaches 63 columns back from the write column
        if s == 20:
            rows.batch.compact()
            rows.join(tokens(3, 130))  # longer than the compacted batch
        fed = [[5, 9, 3 + s], [6, 4, 2], [7, 1 + s, 8]][: rows.batch.size]
        rows.step(fed, [3, 1 + s % 3, 2 - s % 2][: rows.batch.size])
    sliding, full = (next(layer for layer in rows.batch.layers if (layer.window is None) == g) for g in (False, True))
    assert sliding.first_column > 0 and full.first_column == 0
    assert sliding.keys.shape[2] < full.keys.shape[2] - 8
