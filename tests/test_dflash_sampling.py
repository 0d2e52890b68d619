"""draft=dflash under sampling: each position's token drawn from that position's own q, and that q handed to
the comparator, keeps the target's distribution exact (chi-square over seeded runs, `-m statistical`), for
chains and trees; a broken variant that hands the comparator a q other than the one drafted from is caught
by the same test. `proposal=argmax` (each position's argmax, no q: the comparator's one-hot) is exact too.
The fast tests check the q rows themselves."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from conftest import first_pair_counts
from dflash_tiny import write_drafter
from test_sampling import N_RUNS, VOCAB, chi_square_rejects, exact_joint

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import SampledBonus
from specpipe.core.stages.compare import RejectionComparator
from specpipe.drafters.dflash import drafter as dflash_drafter
from specpipe.drafters.dflash.drafter import DFlashDrafter
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

# as tests/test_eagle3_pipeline.py: a hot, cut distribution spreads the first two tokens over enough cells
SAMPLING = {"temperature": 4.0, "top_k": 6}
LAYERS = 4


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A tiny llama of VOCAB ids and a random DFlash head on its layers 0 and 2 (mask id 7), its
    weights large enough that the block's positions draft from different q."""
    target = load_engine(
        "tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB, "num_hidden_layers": 4}
    )
    folder = write_drafter(
        tmp_path_factory.mktemp("dflash") / "d", LAYERS, seed=4, scale=0.3, target_layer_ids=[0, 2], mask_token_id=7
    )
    return target, str(folder)


def test_each_drafted_token_comes_with_its_positions_q(small_vocab):
    target, folder = small_vocab
    sampler = Sampler(**SAMPLING, seed=0)
    drafter = DFlashDrafter(target, folder, sampler=sampler, proposal="sample")
    prompt = [1, 2, 3, 1, 2]
    draft = drafter.propose(prompt, StepPlan(k=3))
    q = np.array(draft.probs)
    want = np.array(sampler.probs(drafter.block_logits(prompt)[:3]))  # each position's own q, top-k applied
    assert q.shape == (3, VOCAB) and np.allclose(q, want, atol=1e-6)
    assert all(q[i, t] > 0 for i, t in enumerate(draft.token_ids))
    assert ((q > 0).sum(-1) == 6).all()  # top_k=6: two ids of each row are never drafted


def test_an_argmax_proposal_drafts_each_positions_best_with_no_q(small_vocab):
    target, folder = small_vocab
    drafter = DFlashDrafter(target, folder, sampler=Sampler(**SAMPLING, seed=0), proposal="argmax")
    prompt = [1, 2, 3, 1, 2]
    draft = drafter.propose(prompt, StepPlan(k=3))
    assert draft.probs is None  # the comparator reads one-hot rows: exact (the statistical test below)
    assert draft.token_ids == mx.argmax(drafter.block_logits(prompt)[:3], axis=-1).tolist()
    with pytest.raises(SpecpipeError, match="draft.proposal=best: expected one of sample, argmax"):
        DFlashDrafter(target, folder, proposal="best")


def sampled_pairs(target, folder, sampler, prompt, shape=None, proposal="sample") -> Counter:
    """The first two tokens of N_RUNS seeded runs drafted by the head (chains of 2, or trees of `shape`)."""
    drafter = DFlashDrafter(target, folder, sampler=sampler, proposal=proposal)
    tree = tree_parts(target, drafter, shape) if shape is not None else None
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=2), RejectionComparator(sampler=sampler), TrimRollback(),
        SampledBonus(sampler=sampler), tree=tree,
    )  # fmt: skip
    return first_pair_counts(pipe, prompt, sampler, N_RUNS)


def q_is_not_the_one_drafted_from(monkeypatch):
    """The broken variant: tokens still drawn from each position's q (temperature 4, top-k 6), but the comparator
    is handed the plain softmax of that position's logits, before the sampler's processing: a q other than the
    one drafted from. (A one-hot q on the drawn token would not do: that is exact, as the match rule is.)"""
    real = dflash_drafter.chain

    def raw_q(next_logits, k, sampler, *args):
        tokens, _ = real(next_logits, k, sampler, *args)
        return tokens, [mx.softmax(next_logits(i, None), axis=-1) for i in range(len(tokens))]

    monkeypatch.setattr(dflash_drafter, "chain", raw_q)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("shape", "broken", "proposal"),
    [
        ("chain", False, "sample"),
        ("chain", True, "sample"),
        ("dynamic", False, "sample"),
        ("chain", False, "argmax"),
        ("dynamic", False, "argmax"),
    ],
)
def test_sampled_dflash_matches_the_targets_distribution(small_vocab, monkeypatch, shape, broken, proposal):
    target, folder = small_vocab
    sampler = Sampler(**SAMPLING)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    if broken:
        q_is_not_the_one_drafted_from(monkeypatch)
    shapes = {"dynamic": TreeShape(kind="dynamic", nodes=6, depth=2, branching=[3, 2])}
    counts = sampled_pairs(target, folder, sampler, prompt, shapes.get(shape), proposal)
    rejects, stat, critical = chi_square_rejects(counts, joint)
    if broken:
        assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the wrong q went unnoticed"
    else:
        assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"
