"""Token trees under sampling (trees/drafting.drawn_chain, trees/verify.compare_tree): a model drafter's
children drawn from its own q without replacement and verified by recursive rejection sampling emit exactly
the target's distribution (an exact enumeration of the rule at a node; a chi-square through real tiny
models, `-m statistical`), broken variants of the rule are caught by the same checks, and a self-drafted
tree accepts its whole drafted path, as the sampled chain does."""

from __future__ import annotations

import itertools
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from conftest import noisy_copy
from test_sampling import N_RUNS, VOCAB, chi_square_rejects, exact_joint

import specpipe.trees.verify as verify
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import SampledBonus
from specpipe.core.stages.compare import RejectionComparator
from specpipe.drafters.model import ModelDrafter
from specpipe.engine.load.loader import load_engine
from specpipe.events import Drafted, Verified
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.drafting import drawn_chain, top_k_chain
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import Drawn, TokenTree
from specpipe.trees.verify import pick_path_sampled

# ---------------------------------------------------------------- one node, exactly


class Coins:
    """`uniform()` for pick_path_sampled that follows a script of accept / reject decisions and records the
    probability each was taken with, so one node's law is enumerated exactly instead of sampled."""

    def __init__(self, script: list[bool]):
        self.script, self.weight, self.asked = script, 1.0, 0

    def __call__(self):
        return self

    def __lt__(self, accept_probability) -> bool:  # `uniform() < a`
        a = float(accept_probability)
        take = self.script[self.asked] if self.asked < len(self.script) else False
        self.asked += 1
        self.weight *= a if take else 1.0 - a
        return take


def node_law(p: np.ndarray, tree: TokenTree, drawn: dict | None) -> np.ndarray:
    """P(first emitted token = y) at the root of a one-level `tree`, from the implementation's own rule."""
    law = np.zeros_like(p)
    kids = len(tree.children(-1))
    for accepted_at in range(kids + 1):  # stage accepted_at accepts (kids: every stage rejects)
        coins = Coins([False] * accepted_at + [True])
        left: list[np.ndarray] = []
        verdict = pick_path_sampled(
            tree,
            target_probs=lambda row: p.copy(),
            uniform=coins,
            sample=lambda r: left.append(r) or -1,
            drawn=drawn,
        )
        if verdict.path:
            law[tree.tokens[verdict.path[0]]] += coins.weight
        elif left and left[0].sum() > 0:  # every child rejected: the residual's mass (a broken rule may leave none)
            law += coins.weight * left[0] / left[0].sum()
    return law


def orderings(q: np.ndarray, m: int):
    """Every ordered draw of m distinct tokens without replacement from q, with its probability."""
    support = [int(t) for t in np.flatnonzero(q > 0)]
    for order in itertools.permutations(support, min(m, len(support))):
        w, left = 1.0, 1.0
        for t in order:
            w *= q[t] / left
            left -= q[t]
        yield list(order), w


def emitted_by_a_drawn_node(p: np.ndarray, q: np.ndarray, m: int, keep=None) -> np.ndarray:
    """The law of the token a node emits when its m children are drawn from q and recursive rejection
    sampling verifies them; `keep(order)` picks which drawn children the tree kept (default: all)."""
    law = np.zeros_like(p)
    for order, w in orderings(q, m):
        tree = TokenTree()
        for t in keep(order) if keep else order:
            tree.add(t, -1)
        law += w * node_law(p, tree, {(): Drawn(q=q, order=order)})
    return law


def random_pair(seed: int, v: int = 6):
    rng = np.random.default_rng(seed)
    p, q = rng.gamma(0.5, size=v), rng.gamma(0.5, size=v)
    p[rng.choice(v, seed % 3, replace=False)] = 0  # tokens the target never emits, and ones the draft never draws
    q[rng.choice(v, (seed + 1) % 3, replace=False)] = 0
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("seed", range(8))
def test_a_drawn_node_emits_exactly_p(seed, m):
    p, q = random_pair(seed)
    np.testing.assert_allclose(emitted_by_a_drawn_node(p, q, m), p, atol=1e-9)


def test_a_gap_in_the_draw_order_leaves_a_point_mass_and_stays_exact():
    """A cut that kept the 1st and 3rd drawn children: the 3rd is then verified as a point mass."""
    p, q = random_pair(3)
    np.testing.assert_allclose(emitted_by_a_drawn_node(p, q, 3, keep=lambda o: [o[0], o[2]]), p, atol=1e-9)


def test_the_docstring_example():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.4, 0.0])
    np.testing.assert_allclose(emitted_by_a_drawn_node(p, q, 2), p, atol=1e-12)


def test_each_sampling_comparator_settles_a_tree_by_its_own_rule():
    """compare=match reaches trees through the plug-in: a child drawn from q with p(x) = q(x) = 0.5 is always
    kept by rejection sampling (min(1, p / q) = 1) but only with p(x) = 0.5 by the match rule; a rejected
    match still emits a draw of p, never the child's token."""
    from specpipe.core.stages.compare import MatchComparator
    from specpipe.trees.drafting import TreeDraft

    p = np.array([0.5, 0.3, 0.2, 0.0])
    logits = mx.log(mx.array(np.stack([p, [1.0, 0, 0, 0]]) + 1e-12, dtype=mx.float32))  # [root, node 0]
    tree = TokenTree()
    tree.add(0, -1)
    tree.drawn[()] = Drawn(q=[0.5, 0.0, 0.0, 0.5], order=[0])
    draft = TreeDraft(tree)
    kept = {}
    for rule, comparator in (("rejection", RejectionComparator), ("match", MatchComparator)):
        compare = comparator(sampler=Sampler(temperature=1.0, seed=5)).compare_tree
        verdicts = [compare(tree, logits, draft) for _ in range(400)]
        kept[rule] = sum(v.path == [0] for v in verdicts)
        assert all(v.next_id in (1, 2) for v in verdicts if not v.path)
    assert kept["rejection"] == 400 and 150 < kept["match"] < 250, kept


BROKEN = {
    "residual from p": ("_residual", lambda p, q: p),
    "unnormalised residual": ("_residual", lambda p, q: np.maximum(p - q, 0.0)),
    "q kept whole after a sibling": ("_drop", lambda q, token: q),
    "sibling removed, q not renormalised": ("_drop", lambda q, token: np.where(np.arange(len(q)) == token, 0.0, q)),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_rule_is_not_exact(monkeypatch, broken):
    name, rule = BROKEN[broken]
    monkeypatch.setattr(verify, name, rule)
    worst = max(np.abs(emitted_by_a_drawn_node(*random_pair(s), 2) - random_pair(s)[0]).max() for s in range(8))
    assert worst > 1e-3, worst


# ---------------------------------------------------------------- drawing


def fixed_logits(rows: list[list[float]]):
    """next_logits for drawn_chain / top_k_chain: row i's logits at depth i, whatever was drawn."""
    return lambda i, y: mx.log(mx.array([rows[i]], dtype=mx.float32))


def test_siblings_are_drawn_without_replacement():
    """The first two draws at a node: P(a, b) = q(a) q(b) / (1 - q(a)) (chi-square over 4000 draws)."""
    q = [0.4, 0.3, 0.15, 0.1, 0.05]
    sampler = Sampler(temperature=1.0, seed=11)
    counts = Counter()
    n = 4000
    for _ in range(n):
        tree, chain = drawn_chain(fixed_logits([q]), 1, 2, sampler)
        counts[tuple(tree.drawn[()].order)] += 1
        assert chain == tree.drawn[()].order[:1]
    want = {(a, b): q[a] * q[b] / (1 - q[a]) for a in range(5) for b in range(5) if a != b}
    stat = sum((counts[c] - n * w) ** 2 / (n * w) for c, w in want.items())
    assert sum(counts.values()) == n and set(counts) <= set(want)
    assert stat < 45.3, stat  # chi-square, 19 degrees of freedom, alpha 0.001


def test_layout_is_fixed_before_drawing_and_short_supports_are_filled():
    """Scores: the chain 1.0, the j-th sibling the root's j-th probability, at every depth; a node whose q holds
    fewer tokens than the root's fills its slots with the draft's next best raw logits (not in the draw order)."""
    rows = [[0.5, 0.3, 0.2, 0.0], [0.9, 0.1, 0.0, 0.0]]  # depth 1 has two tokens of q, the root three
    tree, chain = drawn_chain(fixed_logits(rows), 2, 3, Sampler(temperature=1.0, seed=2))
    assert tree.depths() == [1, 1, 1, 2, 2, 2]
    np.testing.assert_allclose(tree.scores, [1.0, 0.3, 0.2, 1.0, 0.3, 0.2], rtol=1e-6)
    assert tree.drawn[()].order == tree.tokens[:3] and chain[0] == tree.tokens[0]
    second = tree.drawn[(chain[0],)].order
    assert sorted(second) == [0, 1] and tree.tokens[3:5] == second and tree.tokens[5] not in (0, 1)


def test_a_greedy_sampler_keeps_the_top_k_chain():
    rows = [[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]]
    greedy, chain = top_k_chain(fixed_logits(rows), 2, 2, Sampler(temperature=0.0))
    plain, plain_chain = top_k_chain(fixed_logits(rows), 2, 2)
    assert (greedy.tokens, greedy.parents, greedy.scores, chain) == (
        plain.tokens,
        plain.parents,
        plain.scores,
        plain_chain,
    )
    assert greedy.tokens == [0, 1, 3, 2] and chain == [0, 3] and greedy.drawn == {}


# ---------------------------------------------------------------- a self-drafted tree, end to end


def _compose(overrides):
    from hydra import compose, initialize

    import specpipe.config.schema  # noqa: F401  (registers the schemas)

    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose(config_name="config", overrides=overrides)


def first_branch_depth(drafted: Drafted) -> int:
    """Depth of the tree's first branch: each node's first child (the chain's token, drawn or greedy)."""
    node, depth = -1, 0
    while node in drafted.tree_parents:
        node, depth = drafted.tree_parents.index(node), depth + 1
    return depth


def path_acceptance(events) -> float:
    """Accepted tokens over the depth of the first branch the trees offered (the drafted path)."""
    drafted = [e for e in events if isinstance(e, Drafted) and e.draft_ids]
    accepted = sum(len(e.accepted_ids) for e in events if isinstance(e, Verified))
    return accepted / sum(first_branch_depth(d) for d in drafted)


@pytest.fixture(scope="module")
def self_drafted():
    from specpipe.run.session import Session

    overrides = ["model=tiny-random", "draft=model", "draft.model=self", "tree=dynamic", "sampling=sample"]
    return Session(_compose(overrides + ["sampling.temperature=0.8", "max_tokens=48"]))


def test_a_self_drafted_sampled_tree_accepts_its_drafted_path(self_drafted):
    session = self_drafted
    ids = session.encode()
    events = list(session.generate(ids))
    assert events[-1].stats.tree_steps > 0
    assert path_acceptance(events) >= 0.95
    # today's rule: greedy top-k candidates whose children are point masses (accepted with p(x))
    session.drafter.sampler = None
    try:
        old = path_acceptance(list(session.generate(ids)))
    finally:
        session.drafter.sampler = session.sampler
    assert old < 0.8, old


# ---------------------------------------------------------------- the target's distribution, statistically


@pytest.fixture(scope="module")
def small_vocab_models():
    target = load_engine("tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB})
    # a poor drafter (many rejections exercise the residual) whose q, at SAMPLING's temperature 2, is flat
    # enough that drawn siblings are tried and accepted (at temperature 1 these tiny models are near point masses)
    return target, noisy_copy(target, scale=1.0, seed=7, tiny={"vocab_size": VOCAB})


def sampled_tree_pairs(target, draft, sampler, prompt, shape) -> Counter:
    """The first two tokens of N_RUNS seeded runs whose steps verify sampled trees of a draft model."""
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler)
    drafter.prefill_after_first_token = False  # the first step drafts a tree (not a plain step)
    rollback = TrimRollback()
    pipe = SpeculativePipeline(
        target,
        drafter,
        FixedBudget(k=8),
        RejectionComparator(sampler=sampler),
        rollback,
        SampledBonus(sampler=sampler),
        tree=tree_parts(target, drafter, shape),
    )
    counts = Counter()
    for seed in range(N_RUNS):
        sampler.seed = seed
        sampler.reset()
        final = list(pipe.run(prompt, 3, stop_ids=set()))[-1]  # 3: the first step's tree may be 2 deep
        counts[tuple(final.token_ids[:2])] += 1
    return counts


SAMPLING = {"temperature": 2.0, "top_k": 6}
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2]),
    "dynamic": TreeShape(kind="dynamic", nodes=5, depth=2, branching=[3, 3]),
}


@pytest.mark.statistical
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sampled_tree_matches_target_distribution(small_vocab_models, shape):
    target, draft = small_vocab_models
    sampler = Sampler(**SAMPLING)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    counts = sampled_tree_pairs(target, draft, sampler, prompt, SHAPES[shape])
    rejects, stat, critical = chi_square_rejects(counts, joint)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"


@pytest.mark.statistical
@pytest.mark.parametrize("broken", ["residual from p", "q kept whole after a sibling"])
def test_a_broken_tree_rule_is_caught(small_vocab_models, monkeypatch, broken):
    target, draft = small_vocab_models
    sampler = Sampler(**SAMPLING)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    monkeypatch.setattr(verify, *BROKEN[broken])
    counts = sampled_tree_pairs(target, draft, sampler, prompt, SHAPES["static"])
    rejects, stat, critical = chi_square_rejects(counts, joint)
    assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the broken rule went unnoticed"
