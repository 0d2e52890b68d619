"""Engine.forward(positions=, mask=) on tiny random models (engine/positions.py): explicit
consecutive positions are the plain forward, a mask hides exactly what it says, batched rows at
their own offsets with holes (batch/cache.py RaggedBatch) equal each row alone, sliding windows
included, and what cannot take positions or a tree's mask is refused in one line."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import tiny

from specpipe.batch.cache import RaggedBatch
from specpipe.engine import introspect
from specpipe.engine.kv import WindowKVCache
from specpipe.engine.positions import refusal
from specpipe.errors import SpecpipeError

FED = [5, 9, 11, 3, 7]
# gemma3_text: sliding layers (window 64) beside global ones; a 100-token context passes the window
ARCHS = [("llama", 20), ("qwen3", 20), ("gemma3_text", 100)]


def prefilled(e, context: int) -> list:
    cache = e.make_cache()
    e.prefill([3 + i % 40 for i in range(context)], cache)
    return cache


def causal(columns: int, n: int) -> np.ndarray:
    """[n, columns + n]: every held column, then causal over the fed tokens."""
    return np.concatenate([np.ones((n, columns), bool), np.tril(np.ones((n, n), bool))], axis=1)


@pytest.mark.parametrize("arch, context", ARCHS)
def test_explicit_consecutive_positions_and_causal_mask_are_the_plain_forward(arch, context):
    e = tiny(arch)
    plain = e.forward(FED, prefilled(e, context)).logits
    positions = context + np.arange(len(FED))
    for kwargs in ({"positions": positions}, {"positions": positions, "mask": causal(context, len(FED))}):
        cache = prefilled(e, context)
        got = e.forward(FED, cache, **kwargs).logits
        assert mx.allclose(got, plain, atol=1e-4).item(), (arch, list(kwargs))
        assert cache[0].offset == context + len(FED)


@pytest.mark.parametrize("arch, context", ARCHS)
def test_a_mask_that_hides_a_key_changes_exactly_the_rows_that_saw_it(arch, context):
    e = tiny(arch)
    plain = e.forward(FED, prefilled(e, context)).logits
    mask = causal(context, len(FED))
    mask[2:, context + 1] = False  # fed token 1 hidden from fed tokens 2, 3, 4
    got = e.forward(FED, prefilled(e, context), mask=mask).logits
    same = [bool(mx.allclose(got[i], plain[i], atol=1e-4).item()) for i in range(len(FED))]
    assert same == [True, True, False, False, False], arch


@pytest.mark.parametrize("arch, context", ARCHS)
def test_batched_rows_at_their_own_offsets_with_holes_equal_each_row_alone(arch, context):
    """Three rows of different lengths in one RaggedBatch: a step of 3 columns, each row keeping a
    different number (holes), then a second step; every row's logits equal that row fed alone."""
    e = tiny(arch)
    lengths = [context, context // 2, 7]
    prompts = [[3 + (i * 7 + r) % 40 for i in range(n)] for r, n in enumerate(lengths)]
    batch = RaggedBatch(len(e.make_cache()))
    solos = []
    for p in prompts:
        solo = e.make_cache()
        for c in solo:
            if isinstance(c, WindowKVCache):
                c.margin = 4  # drops its oldest positions past window + 8: a row joins with fewer columns
        e.prefill(p[:-5], solo)
        e.prefill(p[-5:], solo)  # the second update drops what the first left past the margin
        batch.add(solo)
        solos.append(solo)
    assert arch != "gemma3_text" or solos[0][0].start > 0, "the window cache dropped nothing"
    steps = [np.array([[5, 9, 11], [6, 4, 2], [8, 8, 1]]), np.array([[7, 2, 0], [3, 3, 3], [9, 1, 4]])]
    kept = [3, 1, 2]
    for s, ids in enumerate(steps):
        n = ids.shape[1]
        got = e.forward(ids, batch.layers, positions=batch.positions(n), mask=batch.mask(n)).logits  # [3, n, vocab]
        for r, solo in enumerate(solos):
            alone = e.forward(ids[r], solo).logits
            assert mx.allclose(got[r], alone, atol=1e-4).item(), (arch, s, r)
            if s == 0:
                for c in solo:
                    c.trim(n - kept[r])  # the row alone keeps what the batch row keeps
        if s == 0:
            batch.commit(kept, n)
            assert batch.holes() == sum(n - k for k in kept) + sum(max(lengths) - n for n in lengths)


def test_a_tree_mask_through_a_recurrent_layer_is_refused_in_one_line():
    for arch in ("qwen3_next", "mamba2"):
        e = tiny(arch)
        cache = e.make_cache()
        line = refusal(e.model, cache, e.info.name, e.info.arch)
        assert line and "use tree=chain" in line and "\n" not in line
        tree = np.tril(np.ones((3, 3), bool))
        tree[2, 1] = False  # two branches under the root: they cannot share one recurrent state
        with pytest.raises(SpecpipeError, match="recurrent layer keeps one state per row.*tree=chain"):
            e.forward([5, 9, 11], cache, mask=tree)
        with pytest.raises(SpecpipeError, match="tree=chain"):
            e.forward([5, 9, 11], e.make_cache(), positions=[0, 1, 1])


def test_consecutive_causal_rows_pass_a_recurrent_layer():
    """A batch's rows (consecutive positions, causal fed tokens) are what a recurrent state can follow."""
    e = tiny("qwen3_next")
    plain = e.forward(FED, prefilled(e, 9)).logits
    got = e.forward(FED, prefilled(e, 9), positions=9 + np.arange(len(FED)), mask=causal(9, len(FED))).logits
    assert mx.allclose(got, plain, atol=1e-4).item()


def test_a_tree_forward_leaves_the_model_as_mlx_lm_built_it():
    e = tiny("llama")
    cache = prefilled(e, 10)
    tree = np.tril(np.ones((3, 3), bool))
    tree[2, 1] = False
    e.forward([5, 9, 11], cache, positions=[10, 11, 11], mask=np.concatenate([np.ones((3, 10), bool), tree], 1))
    assert introspect.foreign_modules(e.model) == []
    assert all(type(m["rope"]).__module__.startswith("mlx") for m in introspect.rope_owners(e.model))


def test_wrong_shapes_name_what_was_expected():
    e = tiny("llama")
    with pytest.raises(ValueError, match=r"mask \(5, 5\): \[5, 15\]"):
        e.forward(FED, prefilled(e, 10), mask=np.ones((5, 5), bool))
    with pytest.raises(ValueError, match=r"positions \(1, 4\)"):
        e.forward(FED, prefilled(e, 10), positions=[1, 2, 3, 4])
