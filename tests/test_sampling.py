"""Lossless sampling: the rejection rule is exact in one round (analytically),
the pipeline's sampled output follows the target's distribution (chi-square),
and a deliberately broken rule is caught by the same test."""

from __future__ import annotations

import math
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from conftest import noisy_copy

import specpipe.core.stages.compare as compare
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import SampledBonus
from specpipe.core.stages.compare import MatchComparator, RejectionComparator
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.ngram import NgramDrafter
from specpipe.engine.load.loader import load_engine
from specpipe.rollbacks.trim import TrimRollback

# ---------------------------------------------------------------- one round, exactly


def emitted_distribution(p: mx.array, q: mx.array) -> np.ndarray:
    """P(emitted = y) for one draft position, from the implementation's own rule:
    draft x ~ q is kept with acceptance_probability, else y ~ residual."""
    a = compare.acceptance_probability(p, q)
    kept = q * a
    rejected_mass = mx.sum(q * (1 - a))
    return np.array(kept + rejected_mass * compare.residual_distribution(p[None], q[None])[0])


def random_dist(rng, v, zeros=0):
    x = rng.gamma(0.5, size=v)
    x[rng.choice(v, zeros, replace=False)] = 0
    return mx.array(x / x.sum(), dtype=mx.float32)


@pytest.mark.parametrize("seed", range(20))
def test_one_round_emits_exactly_p(seed):
    rng = np.random.default_rng(seed)
    p, q = random_dist(rng, 7, zeros=seed % 3), random_dist(rng, 7, zeros=(seed + 1) % 3)
    np.testing.assert_allclose(emitted_distribution(p, q), np.array(p), atol=1e-6)


def test_point_mass_draft_emits_exactly_p():
    """n-gram drafts have no probabilities: q = onehot(x) for every x."""
    rng = np.random.default_rng(0)
    p = random_dist(rng, 6)
    for x in range(6):
        q = mx.array(np.eye(6, dtype=np.float32)[x])
        np.testing.assert_allclose(emitted_distribution(p, q), np.array(p), atol=1e-6)


def test_unnormalised_residual_is_not_exact(monkeypatch):
    monkeypatch.setattr(compare, "residual_distribution", lambda p, q: mx.maximum(p - q, 0.0))
    rng = np.random.default_rng(1)
    p, q = random_dist(rng, 7), random_dist(rng, 7)
    assert not np.allclose(emitted_distribution(p, q), np.array(p), atol=1e-3)


# ---------------------------------------------------------------- logits processing


def test_processing_top_k_top_p_min_p():
    logits = mx.log(mx.array([[0.5, 0.25, 0.15, 0.1]]))
    assert np.count_nonzero(np.array(Sampler(1.0, top_k=2).probs(logits))) == 2
    assert np.count_nonzero(np.array(Sampler(1.0, top_p=0.7).probs(logits))) == 2  # 0.5 + 0.25 reaches 0.7
    assert np.count_nonzero(np.array(Sampler(1.0, min_p=0.25).probs(logits))) == 3  # keeps >= 0.125
    np.testing.assert_allclose(np.array(Sampler(1.0).probs(logits)), [[0.5, 0.25, 0.15, 0.1]], atol=1e-6)
    sharp = np.array(Sampler(0.5).probs(logits))[0]
    assert sharp[0] > 0.5 and abs(sharp.sum() - 1) < 1e-6


# ---------------------------------------------------------------- the pipeline, statistically

VOCAB, N_RUNS = 8, 1500


@pytest.fixture(scope="module")
def small_vocab_models():
    target = load_engine("tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB})
    draft = noisy_copy(
        target, scale=3.0, seed=7, tiny={"vocab_size": VOCAB}
    )  # a poor drafter: many rejections exercise the residual
    return target, draft


def exact_joint(target, sampler, prompt):
    """P(t1, t2) of plain sampling, computed from the target's logits."""
    p1 = np.array(sampler.probs(target.forward(mx.array(prompt), target.make_cache()).logits[-1:]))[0]
    joint = np.zeros((VOCAB, VOCAB))
    for t1 in range(VOCAB):
        p2 = np.array(sampler.probs(target.forward(mx.array(prompt + [t1]), target.make_cache()).logits[-1:]))[0]
        joint[t1] = p1[t1] * p2
    return joint


def sample_pairs(target, drafter, comparator_cls, sampler, prompt, k=2, rollback=None):
    rollback = rollback or TrimRollback()
    # two tokens per run: a draft model's plain first step (its prefill waits for the first token) would leave
    # no room for a draft, and the comparator under test would never run
    drafter.prefill_after_first_token = False
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=k), comparator_cls(sampler=sampler), rollback, SampledBonus(sampler=sampler)
    )
    counts = Counter()
    for seed in range(N_RUNS):
        sampler.seed = seed
        sampler.reset()
        final = list(pipe.run(prompt, 2, stop_ids=set()))[-1]
        counts[tuple(final.token_ids)] += 1
    return counts


def chi_square_rejects(counts: Counter, joint: np.ndarray, alpha_z: float = 3.09) -> tuple[bool, float, float]:
    """Pearson chi-square against the exact joint, cells with expected < 5 pooled.
    Critical value by Wilson-Hilferty at z = 3.09 (alpha ~ 0.001)."""
    expected = joint.ravel() * N_RUNS
    observed = np.array([counts[(a, b)] for a in range(VOCAB) for b in range(VOCAB)], dtype=float)
    big = expected >= 5
    exp_cells = np.append(expected[big], expected[~big].sum())
    obs_cells = np.append(observed[big], observed[~big].sum())
    if exp_cells[-1] < 5:
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    dof = len(exp_cells) - 1
    critical = dof * (1 - 2 / (9 * dof) + alpha_z * math.sqrt(2 / (9 * dof))) ** 3
    return stat > critical, stat, critical


# The default run keeps one exactness check (rejection sampling, draft model) and its broken variant below;
# the rest of the sweep is `-m statistical` (~20 s each).
_SWEEP = pytest.mark.statistical


@pytest.mark.slow
@pytest.mark.parametrize(
    "drafter_kind",
    [
        "model",
        pytest.param("ngram", marks=_SWEEP),
        pytest.param("model+lookup", marks=_SWEEP),
        pytest.param("model+vocab", marks=_SWEEP),
        pytest.param("model+context", marks=_SWEEP),
    ],
)
@pytest.mark.parametrize("comparator_cls", [RejectionComparator, pytest.param(MatchComparator, marks=_SWEEP)])
def test_speculative_sampling_matches_target_distribution(small_vocab_models, drafter_kind, comparator_cls):
    target, draft = small_vocab_models
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    if drafter_kind == "model":
        drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler)
    elif drafter_kind == "model+lookup":  # point-mass lookup drafts where [1, 2] repeats, the model's q elsewhere
        drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler, lookup_min_n=2)
    elif (
        drafter_kind == "model+vocab"
    ):  # a cut draft head: the kept ids are the prompt's (1, 2, 3) and what the target emits; q is 0 elsewhere
        drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler, vocab=3)
    elif drafter_kind == "model+context":  # draft.context: the draft reads sink 1 + the last 2 of [1, 2, 3, 1]
        drafter = ModelDrafter(
            target=target, load=lambda **_: draft, model="other", sampler=sampler, context=2, sinks=1
        )
    else:
        drafter = NgramDrafter(min_n=1, max_n=2)
    rejects, stat, critical = chi_square_rejects(sample_pairs(target, drafter, comparator_cls, sampler, prompt), joint)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"


@pytest.mark.slow
def test_broken_residual_is_caught(small_vocab_models, monkeypatch):
    """The same statistical test fails a rule that recovers from p instead of the residual."""
    target, draft = small_vocab_models
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    monkeypatch.setattr(compare, "residual_distribution", lambda p, q: p)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler)
    rejects, stat, critical = chi_square_rejects(
        sample_pairs(target, drafter, RejectionComparator, sampler, prompt), joint
    )
    assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the broken rule went unnoticed"


# ---------------------------------------------------------------- acceptance and reproducibility


def sampled_run(target, comparator_cls, seed=0, k=4, max_tokens=40):
    sampler = Sampler(temperature=0.8, top_p=0.95, seed=seed)
    drafter = ModelDrafter(target=target, load=None, model="self", sampler=sampler)
    pipe = SpeculativePipeline(
        target,
        drafter,
        FixedBudget(k=k),
        comparator_cls(sampler=sampler),
        TrimRollback(),
        SampledBonus(sampler=sampler),
    )
    return list(pipe.run(target.encode_prompt("once upon a time", chat=False), max_tokens, stop_ids=set()))[-1]


def test_self_draft_sampled_acceptance_rejection_vs_match():
    target = load_engine("tiny-random", precision="float32", arch="qwen2", seed=0)
    rejection = sampled_run(target, RejectionComparator).stats
    match = sampled_run(target, MatchComparator).stats
    assert rejection.acceptance_rate > 0.97, rejection.acceptance_rate
    assert match.acceptance_rate < rejection.acceptance_rate - 0.1, (match.acceptance_rate, rejection.acceptance_rate)
    assert abs(rejection.expected_acceptance - 1.0) < 1e-3
    assert len(rejection.acceptance_by_position) == 4


def test_same_seed_same_tokens():
    target = load_engine("tiny-random", precision="float32", arch="llama", seed=0)
    a = sampled_run(target, RejectionComparator, seed=5).token_ids
    b = sampled_run(target, RejectionComparator, seed=5).token_ids
    c = sampled_run(target, RejectionComparator, seed=6).token_ids
    assert a == b and a != c


@pytest.mark.statistical
@pytest.mark.parametrize("strategy", ["checkpoint", "recompute"])
def test_speculative_sampling_is_exact_on_a_hybrid_model(strategy):
    """Gated DeltaNet + attention target and draft: rejection sampling stays
    exact when recurrent state is rolled back by checkpoint or recompute."""
    from specpipe.rollbacks.checkpoint import CheckpointRollback
    from specpipe.rollbacks.recompute import RecomputeRollback

    tiny_args = {"vocab_size": VOCAB}
    target = load_engine("tiny-random", precision="float32", arch="qwen3_next", seed=3, tiny=tiny_args)
    draft = noisy_copy(target, scale=3.0, seed=7, tiny=tiny_args)
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler)
    rollback = CheckpointRollback() if strategy == "checkpoint" else RecomputeRollback()
    counts = sample_pairs(target, drafter, RejectionComparator, sampler, prompt, rollback=rollback)
    rejects, stat, critical = chi_square_rejects(counts, joint)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"
