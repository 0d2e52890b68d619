"""The EAGLE-3 trainer's chained steps compute what drafting computes: for every depth s and position i,
step s's logits over the whole sequence equal the head's s-th chained step after a context ending at
token i - s + 1, run with its KV cache as `draft=eagle3` runs it (the true tokens fed as the drafts)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from eagle3_tiny import head_config, random_weights, write

from specpipe.drafters.eagle3.layouts import load_head
from specpipe.train.eagle3_ttt import ttt_steps

T, STEPS = 9, 4


def drafting(head, tokens: mx.array, taps: mx.array, n: int, steps: int) -> list[mx.array]:
    """The head's logits at chained steps 1..steps after context t_0..t_n, fed t_{n+1}.. as drafts."""
    cache = head.make_cache()
    fused = head.fuse(taps[:n])  # pairs (r_{i-1}, t_i), i = 1..n
    logits, out = head.step(tokens[1 : n + 1], fused, cache)
    rows, last = [logits[-1]], out[-1:]
    for s in range(2, steps + 1):
        logits, out = head.step(tokens[n + s - 1 : n + s], last, cache)
        rows.append(logits[-1])
        last = out
    return rows


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_layers": 2}, {"norm_before_residual": True, "qk_norm": True}, {"norm_output": True}],
    ids=["one-layer", "two-layers", "qk-norm", "norm-output"],
)
def test_training_steps_equal_drafting_steps(tmp_path, overrides):
    cfg = head_config(**overrides)
    head, _ = load_head(write(tmp_path / "h", "speculators", cfg, random_weights(cfg)))
    rng = np.random.default_rng(3)
    tokens = mx.array(rng.integers(0, cfg.vocab_size, T), dtype=mx.uint32)
    taps = mx.array(rng.standard_normal((T, 3 * cfg.target_hidden_size)).astype(np.float32))
    trained = [logits[0] for logits, _ in ttt_steps(head, tokens[None], taps[None], STEPS)]
    for n in range(1, T - STEPS + 1):
        for s, row in enumerate(drafting(head, tokens, taps, n, STEPS), start=1):
            i = n + s - 1  # the position step s scores
            assert mx.allclose(trained[s - 1][i - s], row, atol=2e-5).item(), (n, s)


def test_later_steps_do_not_attend_to_their_own_earlier_positions(tmp_path):
    """The causal pass the trainer used before: step 2 attending to step-2 keys everywhere differs from drafting."""
    cfg = head_config()
    head, _ = load_head(write(tmp_path / "h", "speculators", cfg, random_weights(cfg)))
    rng = np.random.default_rng(4)
    tokens = mx.array(rng.integers(0, cfg.vocab_size, T), dtype=mx.uint32)
    taps = mx.array(rng.standard_normal((T, 3 * cfg.target_hidden_size)).astype(np.float32))
    x = head.fuse(taps[None, :-1])
    _, x = head.forward(tokens[None, 1:], x)
    causal, _ = head.forward(tokens[None, 2:], x[:, :-1])
    _, (second, _) = list(ttt_steps(head, tokens[None], taps[None], 2))
    # every row differs: even position 2's second step reads step 1's key at position 1 when drafting
    rows_equal = [mx.allclose(causal[0, a], second[0, a], atol=1e-3).item() for a in range(T - 2)]
    assert not any(rows_equal)
