"""The prefix store's parts alone (specpipe/prefix/): the radix trie, snapshots of every cache kind, the byte
bound. Tiny random models, real MLX forwards; the runs that reuse a prefix are in test_prefix_reuse.py."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import tiny

from specpipe.engine.kv import QuantizedKV, WindowKV
from specpipe.engine.load.loader import load_engine
from specpipe.prefix.snapshot import restore, take
from specpipe.prefix.store import PrefixStore
from specpipe.prefix.trie import TokenTrie


def test_trie_finds_stored_prefixes_and_what_continues_past_a_split():
    trie = TokenTrie()
    trie.insert([1, 2, 3], "a")
    trie.insert([1, 2, 5, 6], "b")
    trie.insert([1], "c")
    walk = trie.walk([1, 2, 3, 4])
    assert walk.prefixes == [(1, "c"), (3, "a")] and walk.matched == 3
    walk = trie.walk([1, 2, 5, 9])
    assert walk.prefixes == [(1, "c")] and walk.matched == 3 and walk.below == (4, "b")
    assert trie.walk([1, 2]).below == (3, "a")  # the shallowest stored key under [1, 2]
    # ids leaving the trie at the branch node itself ([1, 2] then neither 3 nor 5) still share [1, 2] with both
    walk = trie.walk([1, 2, 7])
    assert walk.matched == 2 and walk.below == (3, "a")
    assert trie.remove([1, 2, 3]) == "a" and trie.remove([1, 2, 3]) is None
    assert trie.walk([1, 2, 3, 4]).prefixes == [(1, "c")] and trie.size == 2
    assert trie.insert([1, 2, 5, 6], "b2") == "b" and trie.size == 2


def _fed(engine, ids, cache):
    return engine.forward(mx.array(ids, dtype=mx.uint32), cache).logits[-1]


def _window(size: int, margin: int) -> WindowKV:
    kv = WindowKV(size=size)
    kv.margin = margin  # small: 20 positions drop old ones
    return kv


QUANT_TINY = {"hidden_size": 128, "head_dim": 32}  # mx.quantize needs groups of 32+ along the head


@pytest.mark.parametrize(
    "arch, kv",
    [
        ("llama", None),
        ("llama", QuantizedKV(bits=8, group_size=32)),
        ("llama", _window(6, 3)),
        ("gemma3", None),
        ("qwen3_next", None),
        ("mamba2", None),
    ],
    ids=["full", "quantized", "window", "gemma3-sliding", "qwen3_next", "mamba2"],
)
def test_a_restored_snapshot_continues_as_the_live_cache_and_never_aliases_it(arch, kv):
    """Snapshot after 20 positions, feed the live cache on (in place), restore: the next forward's logits from
    the restored cache equal those of a cache that was fed the same 20 positions, bit for bit."""
    quantized = isinstance(kv, QuantizedKV)
    engine = (
        load_engine("tiny-random", precision="float32", arch=arch, seed=0, tiny=QUANT_TINY) if quantized else tiny(arch)
    )
    engine.kv = kv
    ids = [(7 * i + 3) % 200 for i in range(30)]
    live = engine.make_cache()
    _fed(engine, ids[:20], live)
    snap = take(live, 20)
    _fed(engine, ids[20:], live)  # written in place: the snapshot must not change
    restored = restore(snap, engine.make_cache())
    fresh = engine.make_cache()
    _fed(engine, ids[:20], fresh)
    a, b = _fed(engine, ids[20:25], restored), _fed(engine, ids[20:25], fresh)
    assert mx.array_equal(a, b).item()
    if snap.trimmable:  # full-history caches restore any shorter length (K/V computed by a 20-wide forward:
        # the same numbers up to the matmul's blocking, as a prefill in other chunks)
        short, fresh = restore(snap, engine.make_cache(), 12), engine.make_cache()
        _fed(engine, ids[:12], fresh)
        assert mx.allclose(_fed(engine, ids[12:16], short), _fed(engine, ids[12:16], fresh), atol=1e-4).item()


@pytest.mark.parametrize("kv", [None, QuantizedKV(bits=8, group_size=32)], ids=["full", "quantized"])
def test_a_restored_cache_written_and_trimmed_leaves_the_snapshot_as_it_was(kv):
    """Full and quantized KV restore as views of the snapshot (no copy): a restored cache fed on, trimmed back
    and written again in place must leave the snapshot as it was, so a second restore continues exactly as a
    cache fed the same positions."""
    engine = load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny=QUANT_TINY)
    engine.kv = kv
    ids = [(5 * i + 1) % 200 for i in range(30)]
    live = engine.make_cache()
    _fed(engine, ids[:20], live)
    snap = take(live, 20)
    first = restore(snap, engine.make_cache())
    for layer in first:
        layer.trim(4)  # back to 16 positions: the next write lands in place, in the restored arrays
    _fed(engine, [8, 8, 8, 8], first)
    _fed(engine, [9, 9, 9, 9, 9, 9], first)  # grows it
    cut = restore(snap, engine.make_cache(), 12)  # a cut: the first 12 columns, written in place after a trim
    for layer in cut:
        layer.trim(2)
    _fed(engine, [7, 7], cut)
    again, fresh = restore(snap, engine.make_cache()), engine.make_cache()
    _fed(engine, ids[:20], fresh)
    assert mx.array_equal(_fed(engine, ids[20:25], again), _fed(engine, ids[20:25], fresh)).item()


def test_store_takes_the_longest_prefix_cuts_full_kv_and_evicts_least_recently_used():
    engine = tiny("llama")
    ids = [(5 * i + 1) % 200 for i in range(40)]
    cache = engine.make_cache()
    _fed(engine, ids[:30], cache)
    store = PrefixStore(1 << 30, engine.make_cache)
    assert store.lookup(ids) is None and store.stats.misses == 1
    assert store.keep(ids[:30], cache)
    hit = store.lookup(ids)
    assert hit is not None and hit.tokens == 30 and hit.cache[0].offset == 30
    # a request sharing only 25 ids: the full-KV entry is cut to them
    other = ids[:25] + [199, 198, 197]
    hit = store.lookup(other)
    assert hit is not None and hit.tokens == 25 and hit.cache[0].offset == 25
    # the same ids again: all but the last (the first step feeds it)
    assert store.lookup(ids[:30]).tokens == 29
    assert store.stats.hits == 3 and store.stats.tokens_reused == 30 + 25 + 29
    # a prefix of a stored full-KV entry is a cut of it: not stored twice; a longer one replaces the shorter
    shorter = engine.make_cache()
    _fed(engine, ids[:20], shorter)
    held = store.stats.bytes_held
    assert store.keep(ids[:20], shorter) and store.stats.entries == 1 and store.stats.bytes_held == held
    longer = engine.make_cache()
    _fed(engine, ids[:36], longer)
    assert store.keep(ids[:36], longer) and store.stats.entries == 1 and store.lookup(ids).tokens == 36
    # bounded in bytes: a second entry that does not fit with the first pushes it out
    one = store.stats.bytes_held
    small = PrefixStore(one + one // 2, engine.make_cache)
    small.keep(ids[:30], cache)
    other_cache = engine.make_cache()
    _fed(engine, [3] * 30, other_cache)
    small.keep([3] * 30, other_cache)
    assert small.stats.entries == 1 and small.stats.evictions == 1 and small.lookup(ids) is None
    assert small.stats.bytes_held <= small.max_bytes
    assert not PrefixStore(10, engine.make_cache).keep(ids[:30], cache)  # larger than the whole store


def test_recurrent_entries_serve_only_at_their_exact_length():
    engine = tiny("qwen3_next")
    ids = [(3 * i + 2) % 200 for i in range(30)]
    cache = engine.make_cache()
    _fed(engine, ids[:20], cache)
    store = PrefixStore(1 << 30, engine.make_cache)
    assert store.keep(ids[:20], cache)
    assert store.lookup(ids).tokens == 20
    assert store.lookup(ids[:15] + [1, 1, 1, 1, 1, 1]) is None  # a state cannot be cut back
    assert store.lookup(ids[:20]) is None  # needs all 20 positions, but may reuse 19 at most
