"""Token trees (specpipe/trees/): the tree forward equals plain forwards
along each path, greedy tree output equals the target decoding alone
(draft=none) for every shape x drafter x architecture, events carry the
tree, and targets that cannot hold a tree are refused in one line."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import first_difference, make_drafter, pair_with_baseline, tiny

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.engine.kv import WindowKV, WindowKVCache
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, Verified
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.drafting import ngram_candidates
from specpipe.trees.forward import keep_path, tree_forward, tree_mask, tree_refusal
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree, select_dynamic, select_static
from specpipe.trees.verify import pick_path, pick_path_sampled

ARCHS = ["llama", "qwen2", "qwen3"]
MAX_TOKENS = 40
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=12, depth=6, branching=[3] * 6),
}


def sample_tree() -> TokenTree:
    #  r ── 5 ── 7
    #  │    └─── 9 ── 11
    #  └─── 4
    t = TokenTree()
    a = t.add(5, -1)
    t.add(7, a)
    c = t.add(9, a)
    t.add(4, -1)
    t.add(11, c)
    return t


# ---------------------------------------------------------------- pure tree logic


def test_dedup_depths_paths_and_mask():
    t = sample_tree()
    assert t.add(9, 0) == 2  # an existing child is not added twice
    assert t.depths() == [1, 2, 2, 1, 3]
    assert t.path_to(4) == [0, 2, 4]
    m = t.ancestor_mask()
    assert m[5].tolist() == [True, True, False, True, False, True]  # node 4 sees root, 0, 2, itself
    assert m[4].tolist() == [True, False, False, False, True, False]


def test_pick_path_bonus_and_recovered():
    t = sample_tree()
    # rows: root, 5, 7, 9, 4, 11
    assert pick_path(t, [5, 9, 0, 11, 0, 8]).__dict__ == {"path": [0, 2, 4], "next_id": 8, "bonus": True}
    assert pick_path(t, [5, 3, 0, 0, 0, 0]).__dict__ == {"path": [0], "next_id": 3, "bonus": False}
    assert pick_path(t, [6, 0, 0, 0, 0, 0]).__dict__ == {"path": [], "next_id": 6, "bonus": False}


def test_static_and_dynamic_selection():
    cand = TokenTree()
    a = cand.add(1, -1, 0.6)
    cand.add(2, -1, 0.3)
    cand.add(3, -1, 0.1)
    cand.add(4, a, 0.5)
    cand.add(5, a, 0.05)
    s = select_static(cand, [2, 1])
    assert (s.tokens, s.parents) == ([1, 4, 2], [-1, 0, -1])
    d = select_dynamic(cand, 3)
    assert sorted(d.tokens) == [1, 2, 4] and d.parents[d.tokens.index(4)] == d.tokens.index(1)


def test_ngram_trie_puts_the_chain_first():
    ids = mx.array([1, 2, 9, 1, 2, 7, 1, 2]).tolist()
    import numpy as np

    cand = ngram_candidates(np.array(ids), 1, 2, 2).candidates
    first = cand.children(-1)
    assert cand.tokens[max(first, key=lambda i: cand.scores[i])] == 7  # the most recent match, as the chain
    assert set(cand.tokens[i] for i in first) == {7, 9}


# ---------------------------------------------------------------- tree forward


def small_margins(cache: list, margin: int = 4) -> list:
    """Window caches that drop their oldest positions after window + 2 * margin (a 256 margin hides that)."""
    for c in cache:
        if isinstance(c, WindowKVCache):
            c.margin = margin
    return cache


# gemma3_text: sliding-window layers (window 64) beside global ones; a 100-token context passes the window,
# and with a small margin its window caches have dropped their oldest positions before the tree's forward.
# gemma3: the same text model in the multimodal wrapper (4b+ checkpoints). kv=window (size 32): a window on
# every layer, chosen by the user; plain forwards see the same window, so the tree must too. gemma4_text /
# gemma4: the same past the window, with 2 KV-shared layers (reading earlier layers' K/V) and soft-capped logits.
@pytest.mark.parametrize(
    "arch, context, kv_window",
    [(a, 27, None) for a in ARCHS + ["mistral", "gemma3_text"]]
    + [("gemma3_text", 100, None), ("gemma3", 100, None), ("llama", 100, 32), ("gemma3_text", 100, 32)]
    + [("gemma4_text", 27, None), ("gemma4_text", 100, None), ("gemma4", 100, None), ("gemma4_text", 100, 32)],
)
def test_tree_forward_equals_each_path_and_compaction_leaves_a_plain_sequence(arch, context, kv_window):
    e = tiny(arch)

    def make_cache() -> list:
        return small_margins(WindowKV(kv_window).make_cache(e.model) if kv_window else e.make_cache())

    prompt = [3 + i % 40 for i in range(context)]
    t = sample_tree()
    cache = make_cache()
    assert tree_refusal(e.model, cache, e.info.name, e.info.arch) is None
    e.prefill(prompt[:-1], cache)
    logits = tree_forward(e, cache, prompt[-1], t).logits
    for node in range(len(t)):
        ref_cache = make_cache()
        e.prefill(prompt[:-1], ref_cache)
        ref = e.forward([prompt[-1]] + [t.tokens[i] for i in t.path_to(node)], ref_cache).logits[-1]
        assert mx.allclose(logits[node + 1], ref, atol=1e-4), (arch, node)
    if context > 64:
        assert any(getattr(c, "start", 0) > 0 for c in cache), "the window caches dropped nothing"
    keep_path(cache, len(prompt) - 1, [0] + [i + 1 for i in t.path_to(4)])
    nxt = e.forward([3], cache).logits[-1]
    ref_cache = make_cache()
    ref = e.forward(prompt + [5, 9, 11, 3], ref_cache).logits[-1]
    assert mx.allclose(nxt, ref, atol=1e-4)
    # the rope children were put back: a plain forward is untouched
    assert all(type(layer.self_attn.rope).__name__ != "_TreeRope" for layer in e.model.layers)


def test_tree_mask_windows_context_and_tree():
    """offset 10, held from 6, window 4: root (10) sees 7..9; a depth-2 node (12) sees 9, root, parent."""
    t = TokenTree()
    a = t.add(5, -1)
    t.add(7, a)
    depths = mx.array([0, *t.depths()])
    m = tree_mask(10, 6, depths, mx.array(t.ancestor_mask()), 4)
    assert m.tolist() == [
        [False, True, True, True, True, False, False],
        [False, False, True, True, True, True, False],
        [False, False, False, True, True, True, True],
    ]
    assert tree_mask(10, 6, depths, mx.array(t.ancestor_mask()), None)[:, :4].all().item()


# ---------------------------------------------------------------- lossless generation


def tree_generate(target, drafter, shape, prompt, max_tokens, stop_ids=None):
    """(ids, RunFinished, events, pipeline) of a tree run."""
    rollback = TrimRollback()
    step = tree_parts(target, drafter, shape)
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=4), GreedyComparator(), rollback, GreedyBonus(), tree=step
    )
    events = list(pipe.run(prompt, max_tokens, stop_ids=set() if stop_ids is None else stop_ids))
    return events[-1].token_ids, events[-1], events, pipe


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    return pair_with_baseline(request.param, MAX_TOKENS)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["ngram", "model", "self"])
def test_tree_greedy_equals_target_alone(setup, kind, shape):
    target, draft, prompt, baseline = setup
    got, final, events, pipe = tree_generate(
        target, make_drafter(kind, target, draft), SHAPES[shape], prompt, MAX_TOKENS
    )
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stop_reason == "max_tokens"
    assert pipe.cache[0].offset == len(pipe.context) - 1  # compaction left a plain sequence
    drafted = [e for e in events if isinstance(e, Drafted)]
    verified = [e for e in events if isinstance(e, Verified)]
    assert any(d.tree_parents for d in drafted)
    for d, v in zip(drafted, verified):
        assert len(d.tree_parents) == len(d.draft_ids)
        assert [d.draft_ids[i] for i in v.accepted_path] == v.accepted_ids
    s = final.stats
    assert 0 < s.tree_steps <= s.steps and s.tree_nodes_per_step > 0  # steps with no n-gram match verify no tree
    if kind == "self":  # the target as its own drafter: the whole chain branch is always accepted
        assert s.tree_path_length >= SHAPES[shape].max_depth - 1


def test_tree_stops_at_a_stop_token(setup):
    target, draft, prompt, baseline = setup
    stop = baseline[13]
    expected = baseline[: baseline.index(stop)]
    got, final, _, _ = tree_generate(target, make_drafter("self", target), SHAPES["static"], prompt, MAX_TOKENS, {stop})
    assert got == expected and final.stop_reason == "eos"


@pytest.mark.parametrize("max_tokens", [1, 5])
def test_tree_max_tokens(setup, max_tokens):
    target, _, prompt, baseline = setup
    got, _, _, _ = tree_generate(target, make_drafter("self", target), SHAPES["dynamic"], prompt, max_tokens)
    assert got == baseline[:max_tokens]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "arch", ["qwen3_next", "llama4", "phi3"]
)  # hybrid recurrent; chunked attention; untested family
def test_target_without_tree_support_is_refused_naming_tree_chain(arch):
    from specpipe.engine.load.loader import load_engine

    target = load_engine("tiny-random", precision="float32", arch=arch)
    with pytest.raises(SpecpipeError) as err:
        tree_parts(target, make_drafter("ngram", target), SHAPES["static"])
    msg = str(err.value)
    assert "tree=chain" in msg and "\n" not in msg


def test_drafter_without_trees_is_refused():
    target = tiny("llama")
    with pytest.raises(SpecpipeError, match="tree=chain"):
        tree_parts(target, make_drafter("none", target), SHAPES["static"])


def test_old_recordings_read_without_tree_fields_and_tree_events_round_trip():
    import msgspec

    from specpipe.events import Event

    decoder = msgspec.json.Decoder(Event)
    old = b'{"kind":"verified","t":1.0,"step":1,"accepted_ids":[4],"rejected_ids":[5],"recovered_id":6,"seconds":0.1}'
    v = decoder.decode(old)
    assert v.accepted_path == [] and v.tree_depth == 0
    d = Drafted(t=0.0, step=1, k=3, draft_ids=[5, 7, 4], tree_parents=[-1, 0, -1], seconds=0.1)
    assert decoder.decode(msgspec.json.encode(d)) == d


# ---------------------------------------------------------------- sampling: recursive rejection sampling


def _markov_tree(root: int) -> TokenTree:
    """A fixed tree for each root token: 3 children, two grandchildren under the best one."""
    t = TokenTree()
    a = t.add((root + 1) % 6, -1, 0.5)
    t.add((root + 2) % 6, -1, 0.3)
    t.add((root + 4) % 6, -1, 0.1)
    t.add((root + 2) % 6, a, 0.4)
    t.add((root + 3) % 6, a, 0.05)
    return t


def _two_tokens(P, rng, residual=None):
    """First two emitted tokens of sampled tree steps over a Markov target P[prev] (root token 0)."""
    out, root = [], 0
    while len(out) < 2:
        tree = _markov_tree(root)
        rows = [root] + tree.tokens  # the token each fed row follows
        v = pick_path_sampled(
            tree,
            target_probs=lambda row: P[rows[row]].copy(),
            uniform=rng.random,
            sample=lambda p: int(rng.choice(len(p), p=p / p.sum())),
            residual=residual,
        )
        step = [tree.tokens[i] for i in v.path] + [v.next_id]
        out.extend(step)
        root = step[-1]
    return out[0], out[1]


@pytest.mark.parametrize("broken", [False, True])
def test_tree_rejection_sampling_keeps_the_target_distribution(broken):
    """Joint law of the first two tokens == the target's; a variant that resamples from p
    itself after a rejection (no residual) is caught."""
    import numpy as np

    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.full(6, 0.7), size=6)
    want = P[0][:, None] * P  # P(y1, y2)
    n = 20000
    got = np.zeros((6, 6))
    for _ in range(n):
        y1, y2 = _two_tokens(P, rng, residual=(lambda p, tok: p) if broken else None)
        got[y1, y2] += 1
    tv = 0.5 * np.abs(got / n - want).sum()
    if broken:
        assert tv > 0.05, tv
    else:
        assert tv < 0.03, tv


@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_sampled_tree_run_is_seeded_and_reproducible(setup, rule):
    """Each sampling comparator settles trees by its own rule (Comparator.compare_tree), seeded."""
    from specpipe.core.sampling import Sampler
    from specpipe.core.stages.bonus import SampledBonus
    from specpipe.core.stages.compare import MatchComparator, RejectionComparator

    target, _, prompt, _ = setup
    runs = []
    for _ in range(2):
        sampler = Sampler(temperature=0.8, seed=3)
        drafter = make_drafter("ngram", target)
        step = tree_parts(target, drafter, SHAPES["dynamic"])
        comparator = {"rejection": RejectionComparator, "match": MatchComparator}[rule](sampler=sampler)
        pipe = SpeculativePipeline(
            target, drafter, FixedBudget(k=4), comparator, TrimRollback(), SampledBonus(sampler=sampler), tree=step
        )
        runs.append(list(pipe.run(prompt, 24, stop_ids=set()))[-1].token_ids)
        assert pipe.cache[0].offset == len(pipe.context) - 1
    assert runs[0] == runs[1] and len(runs[0]) == 24


def test_single_branch_tree_takes_the_plain_forward():
    e = tiny("qwen2")
    prompt = list(range(3, 20))
    a, b = e.make_cache(), e.make_cache()
    e.prefill(prompt[:-1], a)
    e.prefill(prompt[:-1], b)
    got = tree_forward(e, a, prompt[-1], TokenTree.chain([5, 6, 7])).logits
    want = e.forward([prompt[-1], 5, 6, 7], b).logits
    assert mx.array_equal(got, want) and a[0].offset == b[0].offset


@pytest.mark.parametrize("shape", list(SHAPES))
def test_layerskip_drafts_trees_through_the_model_drafter(setup, shape):
    from specpipe.drafters.layerskip import LayerSkipDrafter

    target, _, prompt, baseline = setup
    got, final, _, _ = tree_generate(target, LayerSkipDrafter(target, depth=1), SHAPES[shape], prompt, MAX_TOKENS)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stats.tree_steps > 0


def test_tree_events_read_in_the_tui_transcript_and_figures(setup):
    """The TUI consumes tree steps like chain steps: its answer is the run's text, its figures count them."""
    from tui.figures import Figures
    from tui.transcript import AnswerTranscript

    target, _, prompt, _ = setup
    _, final, events, _ = tree_generate(target, make_drafter("ngram", target), SHAPES["dynamic"], prompt, 24)
    transcript, figures = AnswerTranscript(), Figures()
    for event in events:
        transcript.consume(event)
        figures.consume(event)
    assert transcript.text == final.text
    assert len(transcript.steps) == final.stats.steps
    assert dict(figures.rows())["tok/forward"] == f"{final.stats.tokens_per_forward:.2f}"


# ---------------------------------------------------------------- the `tree` group through Hydra and Session


def _compose(overrides):
    from hydra import compose, initialize

    import specpipe.config.schema  # noqa: F401  (registers the schemas)

    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose(config_name="config", overrides=overrides)


def test_tree_group_builds_a_tree_step_and_refuses_before_loading():
    from specpipe.errors import ConfigError
    from specpipe.run.session import Session

    session = Session(_compose(["model=tiny-random", "tree=dynamic", "tree.nodes=8"]))
    assert session.tree is not None and session.tree.shape.nodes == 8
    assert Session(_compose(["model=tiny-random"])).tree is None  # tree=chain: the chain path
    with pytest.raises(ConfigError, match="at most 64"):
        Session(_compose(["model.name=no-such-model", "tree=static", "tree.branching=[8,8,2]"]))
    with pytest.raises(SpecpipeError, match="use tree=chain") as err:
        Session(_compose(["model=tiny-random", "model.arch=qwen3_next", "tree=static", "rollback=checkpoint"]))
    assert "\n" not in str(err.value)
