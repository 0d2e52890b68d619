"""draft=suffix under sampling: its drafts are point masses, so the rejection rule keeps the target's distribution
whatever the store holds. Default run: the rule applied to the drafter's own proposal from a warm store emits
exactly p (analytically), and a rule that trusts the history is caught. `-m statistical` (~20 s): 1500 seeded
two-token runs, the store carrying every earlier run's sample, against the exact joint (chi-square), and the
same test rejects the rule that trusts the history."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_sampling import VOCAB, chi_square_rejects, emitted_distribution, exact_joint, sample_pairs

import specpipe.core.stages.compare as compare
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.core.stages.compare import RejectionComparator
from specpipe.drafters.suffix import SuffixDrafter
from specpipe.drafters.suffix_store import HistoryShelf
from specpipe.engine.load.loader import load_engine

PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture(scope="module")
def target():
    return load_engine("tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB})


def _warm_drafter() -> SuffixDrafter:
    """A drafter whose session already saw [1, 2] followed by 5 three times (and by 3 in this prompt)."""
    shelf = HistoryShelf()
    for _ in range(3):
        earlier = SuffixDrafter(max_n=2, history=shelf)
        earlier.prefill([7, 1, 2, 5, 6])
    drafter = SuffixDrafter(max_n=2, history=shelf)
    drafter.prefill(PROMPT)
    return drafter


def _first_position(target, drafter) -> tuple[mx.array, mx.array]:
    """(p, q) at the first drafted position: the target's sampled distribution and the draft's point mass."""
    sampler = Sampler(temperature=1.0, top_k=6)
    p = sampler.probs(target.forward(mx.array(PROMPT), target.make_cache()).logits[-1:])[0]
    draft = drafter.propose(PROMPT, StepPlan(k=2))
    assert draft.probs is None and draft.token_ids[:1] == [5]  # the history's most frequent branch
    q = mx.array(np.eye(VOCAB, dtype=np.float32)[draft.token_ids[0]])
    return p, q


def test_a_draft_from_history_emits_exactly_p(target):
    p, q = _first_position(target, _warm_drafter())
    np.testing.assert_allclose(emitted_distribution(p, q), np.array(p), atol=1e-6)


def test_a_rule_that_trusts_the_history_is_caught(target, monkeypatch):
    p, q = _first_position(target, _warm_drafter())
    monkeypatch.setattr(compare, "acceptance_probability", lambda p, q: mx.ones_like(q))
    assert not np.allclose(emitted_distribution(p, q), np.array(p), atol=1e-3)


@pytest.mark.statistical
@pytest.mark.parametrize("broken", [False, True], ids=["exact", "broken"])
def test_sampled_runs_keep_the_target_distribution_with_history(target, monkeypatch, broken):
    sampler = Sampler(temperature=1.0, top_k=6)
    joint = exact_joint(target, sampler, PROMPT)
    drafter = _warm_drafter()  # and every run adds its sample to the store: later runs draft from earlier ones
    if broken:
        monkeypatch.setattr(compare, "acceptance_probability", lambda p, q: mx.ones_like(q))
    rejects, stat, critical = chi_square_rejects(
        sample_pairs(target, drafter, RejectionComparator, sampler, PROMPT), joint
    )
    if broken:
        assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the rule that trusts the history went unnoticed"
    else:
        assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"
    assert drafter.store.sequences > 1000  # the history really grew run after run
