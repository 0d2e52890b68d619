"""draft=eagle3 inside the pipeline: the head reads the taps of the pipeline's own prefill and verify
forwards (no target forward of its own), lossless greedy against draft=none on tiny random llama /
qwen2 / qwen3 targets under every rollback, chains and EAGLE-2-style trees (tree=static / dynamic),
and seeded sampling exact (chi-square, `-m statistical`) with a broken variant that the same test catches."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROLLBACKS, first_pair_counts, generate, make_drafter
from eagle3_tiny import head_config, random_weights, write
from test_sampling import N_RUNS, VOCAB, chi_square_rejects, exact_joint

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
from specpipe.core.stages.compare import GreedyComparator, RejectionComparator
from specpipe.drafters import tape_head
from specpipe.drafters.eagle3.drafter import Eagle3Drafter
from specpipe.engine.engine import Capture
from specpipe.engine.load.loader import load_engine
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

LAYERS = 8  # EAGLE's default taps 2, N//2, N-3 are distinct from 6 layers on
TOKENS = 32
# the head's layout per target: qwen3 targets get speculators' qwen3 layer (q / k norms), as published
LAYOUT = {"llama": ("eagle", False), "qwen2": ("angelslim", False), "qwen3": ("speculators", True)}
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=8, depth=4, branching=[3, 3]),
}


def tiny_target(arch: str, **tiny):
    return load_engine(
        "tiny-random", precision="float32", arch=arch, seed=0, tiny={"num_hidden_layers": LAYERS, **tiny}
    )


@pytest.fixture(scope="module", params=list(LAYOUT))
def setup(request):
    """(arch, target, prompt, draft=none's tokens)."""
    target = tiny_target(request.param)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline = generate(target, make_drafter("none", target), 1, prompt, TOKENS)[0]
    return request.param, target, prompt, baseline


def head_of(tmp_path, arch: str, keep: list[int], seed: int = 0) -> str:
    """A random head of `arch`'s layout whose draft vocabulary is `keep` (target ids): drafting the target's
    frequent tokens, it gets some drafts accepted and others rejected, so rollbacks run both ways."""
    layout, qk_norm = LAYOUT[arch]
    cfg = head_config(draft_vocab_size=len(keep), qk_norm=qk_norm)
    weights = random_weights(cfg, seed=seed)
    ids = np.array(sorted(keep))
    weights["d2t"] = (ids - np.arange(len(ids))).astype(np.int64)
    weights["t2d"] = np.isin(np.arange(cfg.vocab_size), ids)
    return str(write(tmp_path / f"{arch}-{layout}-{len(keep)}-{seed}", layout, cfg, weights))


def frequent(tokens: list[int], n: int) -> list[int]:
    return [t for t, _ in Counter(tokens).most_common(n)]


def assert_tape_holds_the_context(target, drafter, pipe):
    """The tape holds the taps of the whole cached context, as one forward computes them: so the prefill and
    each verify (chain: every fed row; tree: root and path) reached observe_hidden at the right positions."""
    cached = pipe.context[:-1]
    assert drafter.tape.tokens == cached
    want = target.forward(cached, None, capture=Capture(layers=drafter.layers)).layer_hidden
    assert mx.allclose(drafter.tape.rows(0, len(cached)), want, atol=1e-4).item()


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_greedy_chain_equals_draft_none_under_every_rollback(tmp_path, setup, rollback):
    arch, target, prompt, baseline = setup
    drafter = Eagle3Drafter(target, head_of(tmp_path, arch, frequent(baseline, 1)))
    got, final, _, pipe = generate(target, drafter, 4, prompt, TOKENS, rollback=ROLLBACKS[rollback]())
    assert got == baseline
    assert final.stats.accepted > 0 and final.stats.accepted < final.stats.drafted  # accepts and rejects ran
    assert drafter.target_recomputes == 0  # every tap came from the pipeline's own forwards
    assert_tape_holds_the_context(target, drafter, pipe)


def tree_run(target, drafter, shape, prompt, max_tokens):
    pipe = SpeculativePipeline(
        target,
        drafter,
        FixedBudget(k=4),
        GreedyComparator(),
        TrimRollback(),
        GreedyBonus(),
        tree=tree_parts(target, drafter, shape),
    )
    final = list(pipe.run(prompt, max_tokens, stop_ids=set()))[-1]
    return final, pipe


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tree_equals_draft_none(tmp_path, setup, shape):
    arch, target, prompt, baseline = setup
    drafter = Eagle3Drafter(target, head_of(tmp_path, arch, frequent(baseline, 3), seed=1))
    final, pipe = tree_run(target, drafter, SHAPES[shape], prompt, TOKENS)
    assert final.token_ids == baseline
    assert final.stats.accepted > 0
    assert drafter.target_recomputes == 0
    assert_tape_holds_the_context(target, drafter, pipe)


def test_a_trees_first_branch_is_the_chain_and_its_nodes_are_target_ids_of_the_draft_vocabulary(tmp_path):
    target = tiny_target("llama")
    prompt = target.encode_prompt("the cat sat on the mat", chat=False)
    keep = list(range(40, 60))
    folder = head_of(tmp_path, "llama", keep, seed=2)
    trees, chains = Eagle3Drafter(target, folder), Eagle3Drafter(target, folder)
    for d in (trees, chains):
        d.prefill(prompt)
    draft = trees.propose_tree(prompt, TreeShape(kind="dynamic", nodes=8, depth=3, branching=[3, 3]))
    tree, node, branch = draft.candidates, -1, []
    while kids := tree.children(node):
        node = kids[0]
        branch.append(tree.tokens[node])
    assert branch == chains.propose(prompt, StepPlan(k=3)).token_ids
    assert len(tree) == 9 and set(tree.tokens) <= set(keep)  # 3 depths x width 3, siblings from the draft vocabulary


# ---------------------------------------------------------------- sampling, statistically

# tiny random models grow peaked with depth: at temperature 4 a 4-layer one spreads the first two tokens over
# ~26 cells of 1500 runs (at 1, ~4), so the chi-square has degrees of freedom to see a wrong distribution
SAMPLING = {"temperature": 4.0, "top_k": 6}


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A tiny llama of VOCAB ids and a head whose draft vocabulary is 5 of them (d2t / t2d)."""
    target = load_engine(
        "tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB, "num_hidden_layers": 4}
    )
    cfg = head_config(vocab_size=VOCAB, draft_vocab_size=5)
    weights = random_weights(cfg, seed=4)
    return target, str(write(tmp_path_factory.mktemp("head") / "h", "speculators", cfg, weights))


def sampled_pairs(target, folder, sampler, prompt, shape=None) -> Counter:
    """The first two tokens of N_RUNS seeded runs drafted by the head (chains of 2, or trees of `shape`)."""
    drafter = Eagle3Drafter(target, folder, sampler=sampler, layers=[1, 2, 3])
    tree = tree_parts(target, drafter, shape) if shape is not None else None
    pipe = SpeculativePipeline(
        target,
        drafter,
        FixedBudget(k=2),
        RejectionComparator(sampler=sampler),
        TrimRollback(),
        SampledBonus(sampler=sampler),
        tree=tree,
    )
    return first_pair_counts(pipe, prompt, sampler, N_RUNS)


def q_leaks_outside_the_draft_vocabulary(monkeypatch):
    """The broken variant: tokens still drawn from the head's q, but the q handed to the comparator puts half
    its mass evenly on every target id, also those outside the draft vocabulary (where q must be 0)."""
    real = tape_head.to_draft

    def leaky(tokens, q_rows, **kw):
        return real(tokens, [0.5 * q + 0.5 / q.shape[-1] for q in q_rows], **kw)

    monkeypatch.setattr(tape_head, "to_draft", leaky)


@pytest.mark.statistical
@pytest.mark.parametrize(("shape", "broken"), [("chain", False), ("chain", True), ("dynamic", False)])
def test_sampled_eagle3_matches_the_targets_distribution(small_vocab, monkeypatch, shape, broken):
    target, folder = small_vocab
    sampler = Sampler(**SAMPLING)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    if broken:
        q_leaks_outside_the_draft_vocabulary(monkeypatch)
    counts = sampled_pairs(target, folder, sampler, prompt, SHAPES.get(shape))
    rejects, stat, critical = chi_square_rejects(counts, joint)
    if broken:
        assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the leaky q went unnoticed"
    else:
        assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"
