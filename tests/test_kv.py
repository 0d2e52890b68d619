"""`kv=full | quantized | window`: greedy speculation on a KV choice equals
plain decoding (draft=none) on the same choice, for every drafter and a
rollback at every step; the window cache attends exactly as mlx-lm's
RotatingKVCache(keep=0) does, keeps rolling back after it has wrapped, and
refuses a rollback past its margin in one line."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import first_difference, generate, make_drafter, noisy_copy
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache

from specpipe.engine.kv import FullKV, QuantizedKV, WindowKV, WindowKVCache, kv_figures
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.recompute import RecomputeRollback

TINY = {"hidden_size": 128, "head_dim": 32}  # mx.quantize needs groups of 32+ along the head
MAX_TOKENS = 40
POLICIES = {
    "full": FullKV(),
    "quantized8": QuantizedKV(bits=8, group_size=32),
    "quantized4": QuantizedKV(bits=4, group_size=32),
    "window": WindowKV(size=12),
}


def engine(arch: str, kv, seed: int = 0):
    e = load_engine("tiny-random", precision="float32", arch=arch, seed=seed, tiny=TINY)
    kv.check(e)
    e.kv = kv
    return e


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch(request):
    return request.param


@pytest.fixture(scope="module", params=list(POLICIES))
def setup(request, arch):
    kv = POLICIES[request.param]
    if isinstance(kv, WindowKV):
        kv.margin = 20  # small, so these runs drop old positions (K <= 16: a step gives back at most 16)
    target = engine(arch, kv)
    draft = noisy_copy(target, scale=0.5, tiny=TINY)
    draft.kv = kv
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, final, _, _ = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS)
    return target, draft, prompt, baseline, final


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("kind", ["ngram", "self", "model"])
def test_greedy_equals_plain_on_the_same_kv(setup, kind, k):
    target, draft, prompt, baseline, _ = setup
    got, final, events, pipe = generate(target, make_drafter(kind, target, draft), k, prompt, MAX_TOKENS)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    if isinstance(target.kv, WindowKV):
        assert pipe.cache[0].start > 0  # wrapped and dropped old positions, rolled back all along
    assert sum(e.target_dropped for e in events if type(e).__name__ == "RolledBack") > 0 or kind == "self"


def test_kv_changes_the_cache_it_claims(setup):
    target, _, prompt, _, final = setup
    kinds = {type(c) for c in target.make_cache()}
    assert kinds <= {type(target.kv.make_cache(target.model)[0])}
    assert final.stats.kv_bytes > 0 and final.stats.kv_bytes_per_token > 0


def test_quantized_caches_are_smaller(arch):
    per_token = {}
    for name in ("full", "quantized8", "quantized4"):
        target = engine(arch, POLICIES[name])
        prompt = [3 + i % 250 for i in range(300)]  # ids inside the tiny vocabulary
        _, final, _, _ = generate(target, make_drafter("none", target), 1, prompt, 2)
        per_token[name] = final.stats.kv_bytes / (len(prompt) + 1)
    assert per_token["quantized4"] < per_token["quantized8"] < per_token["full"]


def test_window_attends_like_mlx_lm_rotating_cache(arch):
    """Plain decoding through WindowKVCache = through RotatingKVCache(max_size, keep=0), past the wrap."""
    target = engine(arch, WindowKV(size=10))
    prompt = target.encode_prompt("one two three four five six seven eight nine ten eleven", chat=False)
    ours, reference = target.make_cache(), [RotatingKVCache(max_size=10, keep=0) for _ in target.make_cache()]
    for cache in (ours, reference):
        target.forward(prompt[:-1], cache)
    a = b = prompt[-1]
    for _ in range(30):
        la, lb = target.forward([a], ours).logits[-1], target.forward([b], reference).logits[-1]
        assert mx.allclose(la, lb, atol=1e-4).item()
        a, b = int(mx.argmax(la).item()), int(mx.argmax(lb).item())
        assert a == b
    assert isinstance(ours[0], WindowKVCache) and ours[0].offset > 10


def test_window_rolls_back_after_wrapping_and_refuses_past_its_margin():
    cache = WindowKVCache(size=4, margin=2)
    kv = lambda n: (mx.zeros((1, 1, n, 32)), mx.zeros((1, 1, n, 32)))  # noqa: E731
    cache.update_and_fetch(*kv(10))  # held 10 > 4 + 2 * 2: the next update drops down to 6
    cache.update_and_fetch(*kv(1))
    assert (cache.start, cache.offset) == (4, 11)
    assert cache.trim(2) == 2 and cache.offset == 9  # the next query (9) needs 6.. : held
    with pytest.raises(SpecpipeError, match="margin"):
        cache.trim(5)


def test_recompute_rollback_on_a_window(arch):
    """rollback=recompute trims the fed positions and replays the kept ones: exact on a window too."""
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.pipeline import SpeculativePipeline
    from specpipe.core.stages.bonus import GreedyBonus
    from specpipe.core.stages.compare import GreedyComparator

    kv = WindowKV(size=12)
    target = engine(arch, kv)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS)
    pipe = SpeculativePipeline(
        target, make_drafter("ngram", target), FixedBudget(k=4), GreedyComparator(), RecomputeRollback(), GreedyBonus()
    )
    final = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))[-1]
    assert final.token_ids == baseline


def test_refusals_are_one_line():
    gemma = load_engine("tiny-random", precision="float32", arch="gemma2", seed=0)
    with pytest.raises(SpecpipeError, match="kv=quantized") as exc:
        QuantizedKV().check(gemma)
    assert "\n" not in str(exc.value)
    with pytest.raises(SpecpipeError, match="kv.bits=3"):
        QuantizedKV(bits=3)
    with pytest.raises(SpecpipeError, match="group_size"):
        QuantizedKV(group_size=64).check(load_engine("tiny-random", precision="float32", arch="llama", seed=0))


def test_kv_figures_count_held_positions():
    cache = [QuantizedKVCache(group_size=32, bits=8)]
    cache[0].update_and_fetch(mx.zeros((1, 2, 5, 32)), mx.zeros((1, 2, 5, 32)))
    figures = kv_figures(cache)
    per_column = cache[0].nbytes / cache[0].keys[0].shape[2]  # the buffer has 256 columns, 5 of them held
    assert figures["kv_bytes"] == int(5 * per_column) and figures["kv_bytes_per_token"] == per_column
