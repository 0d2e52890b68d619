"""Golden losslessness on the real packaged SmolLM2-135M (float32)."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter

KS = [1, 2, 4, 8, 16, 32]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def baseline(smollm2):
    prompt = smollm2.encode_prompt("Repeat this code exactly:\ndef add(a, b):\n    return a + b\n", chat=True)
    ids, final, _, _ = generate(
        smollm2, make_drafter("none", smollm2), 1, prompt, MAX_TOKENS, stop_ids=smollm2.eos_token_ids
    )
    return prompt, ids, final.stop_reason


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_smollm2_greedy_equals_target_alone(smollm2, baseline, kind, k):
    prompt, expected, reason = baseline
    got, final, _, _ = generate(
        smollm2, make_drafter(kind, smollm2), k, prompt, MAX_TOKENS, stop_ids=smollm2.eos_token_ids
    )
    assert got == expected, first_difference(smollm2, prompt, expected, got)
    assert final.stop_reason == reason
    if kind == "self":
        assert final.stats.acceptance_rate > 0.95


@pytest.mark.parametrize("shape", ["static", "dynamic"])
@pytest.mark.parametrize("kind", ["ngram", "lookahead", pytest.param("self", marks=pytest.mark.slow)])
def test_smollm2_tree_greedy_equals_target_alone(smollm2, baseline, kind, shape):
    """Token trees (tree=static / dynamic) on the real model: same tokens as decoding alone."""
    from conftest import run_pipeline

    from specpipe.trees.proposal import tree_parts
    from specpipe.trees.shape import TreeShape

    prompt, expected, reason = baseline
    shapes = {
        "static": TreeShape(kind="static", branching=[4, 2, 1, 1, 1, 1]),
        "dynamic": TreeShape(kind="dynamic", nodes=16, depth=8, branching=[4] * 8),
    }
    drafter = make_drafter(kind, smollm2)
    step = tree_parts(smollm2, drafter, shapes[shape])
    got, final = run_pipeline(smollm2, drafter, prompt, MAX_TOKENS, stop_ids=smollm2.eos_token_ids, tree=step)
    assert got == expected, first_difference(smollm2, prompt, expected, got)
    assert final.stop_reason == reason
    assert final.stats.tree_steps > 0
