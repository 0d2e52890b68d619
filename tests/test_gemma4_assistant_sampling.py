"""Seeded sampling through draft=gemma4_assistant keeps the target's distribution, chains and trees (a tree's
chain and siblings drawn from the assistant's q without replacement, verified by recursive rejection
sampling): a chi-square test on the first two tokens of N_RUNS runs against the exact joint, and the same test
catches a broken variant (tokens drawn from the assistant's q, but another q handed to the comparator).
Deselected by default (-m statistical)."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import first_pair_counts
from gemma4_tiny import config, random_weights, write
from test_gemma4_assistant import tiny_gemma4
from test_sampling import N_RUNS, VOCAB, chi_square_rejects, exact_joint

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import SampledBonus
from specpipe.core.stages.compare import RejectionComparator
from specpipe.drafters.gemma4_assistant import drafter as assistant_drafter
from specpipe.drafters.gemma4_assistant.drafter import Gemma4AssistantDrafter
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

SAMPLING = {"temperature": 1.0}


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A tiny gemma4_text target of VOCAB ids and a random assistant of the same vocabulary."""
    target = tiny_gemma4(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB)
    cfg = config(vocab=VOCAB)
    weights = random_weights(cfg, seed=4)
    weights["model.embed_tokens.weight"] *= 3.0  # a confident assistant: its q far from uniform
    return target, str(write(tmp_path_factory.mktemp("assistant") / "a", cfg, weights))


def sampled_pairs(target, folder, sampler, prompt, shape=None) -> Counter:
    """The first two tokens of N_RUNS seeded runs drafted by the assistant (chains of 2, or trees of `shape`)."""
    drafter = Gemma4AssistantDrafter(target, folder, sampler=sampler)
    tree = tree_parts(target, drafter, shape) if shape is not None else None
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=2), RejectionComparator(sampler=sampler), TrimRollback(),
        SampledBonus(sampler=sampler), tree=tree,
    )  # fmt: skip
    return first_pair_counts(pipe, prompt, sampler, N_RUNS)


def q_is_not_the_one_drawn_from(monkeypatch):
    """The broken variant: tokens drawn from q, the comparator told half of q and half uniform."""
    real = assistant_drafter.to_draft

    def leaky(tokens, q_rows, **kw):
        return real(tokens, [0.5 * q + 0.5 / q.shape[-1] for q in q_rows], **kw)

    monkeypatch.setattr(assistant_drafter, "to_draft", leaky)


def tree_q_is_not_the_one_drawn_from(monkeypatch):
    """The broken tree: children still drawn from q, but each node's recorded q (what recursive rejection
    sampling divides by) half q and half uniform."""
    from specpipe.trees import drafting

    real = drafting.drawn_chain

    def leaky(next_logits, depth, width, sampler):
        tree, chain = real(next_logits, depth, width, sampler)
        for path, drawn in tree.drawn.items():
            tree.drawn[path] = type(drawn)(q=0.5 * drawn.q + 0.5 / drawn.q.shape[-1], order=drawn.order)
        return tree, chain

    monkeypatch.setattr(drafting, "drawn_chain", leaky)


SHAPES = {"chain": None, "dynamic": TreeShape(kind="dynamic", nodes=6, depth=2, branching=[3, 2])}


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("shape", "broken"), [("chain", False), ("chain", True), ("dynamic", False), ("dynamic", True)]
)
def test_sampled_assistant_matches_the_targets_distribution(small_vocab, monkeypatch, shape, broken):
    target, folder = small_vocab
    sampler = Sampler(**SAMPLING)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    if broken:
        (q_is_not_the_one_drawn_from if shape == "chain" else tree_q_is_not_the_one_drawn_from)(monkeypatch)
    counts = sampled_pairs(target, folder, sampler, prompt, SHAPES[shape])
    rejects, stat, critical = chi_square_rejects(counts, joint)
    if broken:
        assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the wrong q went unnoticed"
    else:
        assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"
