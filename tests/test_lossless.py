"""Golden losslessness: greedy speculative output equals the target decoding
alone (draft=none), token for token, for every drafter and K."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, pair_with_baseline

KS = [1, 2, 4, 8, 16, 32]
ARCHS = ["llama", "qwen2", "qwen3"]
MAX_TOKENS = 48


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    return pair_with_baseline(request.param, MAX_TOKENS)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", ["ngram", "self", "model"])
def test_greedy_equals_target_alone(setup, kind, k):
    target, draft, prompt, baseline = setup
    got, final, _, _ = generate(target, make_drafter(kind, target, draft), k, prompt, MAX_TOKENS)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stop_reason == "max_tokens"


@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize("kind", ["ngram", "self", "model"])
def test_stop_token_in_the_middle_of_a_draft(setup, kind, k):
    """Generation stops at the first stop token even when it arrives mid-draft."""
    target, draft, prompt, baseline = setup
    stop_at = 13
    stop = baseline[stop_at]
    expected = baseline[: baseline.index(stop)]
    got, final, _, _ = generate(target, make_drafter(kind, target, draft), k, prompt, MAX_TOKENS, stop_ids={stop})
    assert got == expected, first_difference(target, prompt, expected, got)
    assert final.stop_reason == "eos"


@pytest.mark.parametrize("max_tokens", [1, 5, 17])
def test_max_tokens_cut_mid_draft(setup, max_tokens):
    target, draft, prompt, baseline = setup
    got, final, _, _ = generate(target, make_drafter("self", target), 8, prompt, max_tokens)
    assert got == baseline[:max_tokens]
    assert final.stats.generated_tokens == max_tokens


def test_self_draft_accepts_everything(setup):
    """The target drafting for itself: acceptance 1.0, K+1 tokens per forward."""
    target, _, prompt, baseline = setup
    k = 4
    got, final, events, _ = generate(target, make_drafter("self", target), k, prompt, 5 * (k + 1))
    s = final.stats
    assert got == baseline[: 5 * (k + 1)]
    assert s.acceptance_rate == 1.0
    assert s.accepted == s.drafted == 5 * k
    assert s.tokens_per_forward == k + 1
    assert s.acceptance_length == k + 1


def test_cache_holds_context_minus_newest_token(setup):
    """After every run the target cache length is the context length - 1."""
    target, draft, prompt, _ = setup
    for kind in ("ngram", "model", "self"):
        _, _, _, pipe = generate(target, make_drafter(kind, target, draft), 8, prompt, 30)
        assert pipe.cache[0].offset == len(pipe.context) - 1
