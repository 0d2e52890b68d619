"""draft=dflash: lossless greedy output against draft=none on tiny random llama / qwen2 / qwen3 targets
(chains under every rollback, trees), drafts that are actually accepted, a head cache that rolls back to
exactly what a fresh drafter computes, one-line errors for layouts it cannot read, and the drafter built
from the packaged config (draft.path=...)."""

from __future__ import annotations

import json
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROLLBACKS, generate, make_drafter
from dflash_tiny import config, random_weights, write, write_drafter

import specpipe.config.schema  # noqa: F401  (registers the schemas the packaged config reads)
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.dflash.drafter import DFlashDrafter
from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

LAYERS = 6
TOKENS = 32
SHAPES = {
    "static": TreeShape(kind="static", branching=[3, 2, 1]),
    "dynamic": TreeShape(kind="dynamic", nodes=8, depth=4, branching=[3, 3]),
}


def tiny_target(arch: str):
    return load_engine("tiny-random", precision="float32", arch=arch, seed=0, tiny={"num_hidden_layers": LAYERS})


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def setup(request):
    """(target, prompt, draft=none's tokens)."""
    target = tiny_target(request.param)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    return target, prompt, generate(target, make_drafter("none", target), 1, prompt, TOKENS)[0]


def hitting_drafter(tmp_path, target, token: int) -> str:
    """A head that drafts `token` at every position: no attention or MLP output (o_proj, down_proj zero), so a
    mask position's hidden state is the mask's embedding, and the final norm's weight turns that into the
    direction of `token`'s LM-head row. Drafting the target's most frequent token, some drafts are accepted
    and others rejected, so the head cache is trimmed both ways."""
    cfg = config(LAYERS, mask_token_id=7)
    weights = random_weights(cfg)
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name][:] = 0
    inner, _ = introspect.llama_parts(target.model, "dflash")
    lm = np.array(introspect.lm_head_weights(target.model, inner).weight)
    mask_row = np.array(inner.embed_tokens.weight[7])
    weights["norm.weight"] = (lm[token] / mask_row).astype(np.float32)
    return str(write(tmp_path / f"hit-{token}", cfg, weights))


def assert_tape_holds_the_context(target, drafter, pipe):
    """The taps came from the pipeline's own forwards, at the right positions."""
    cached = pipe.context[:-1]
    assert drafter.tape.tokens == cached and drafter.target_recomputes == 0
    want = target.forward(cached, None, capture=Capture(layers=drafter.layers)).layer_hidden
    assert mx.allclose(drafter.tape.rows(0, len(cached)), want, atol=1e-4).item()


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_greedy_chain_of_accepted_drafts_equals_draft_none_under_every_rollback(tmp_path, setup, rollback):
    target, prompt, baseline = setup
    common = Counter(baseline).most_common(1)[0][0]
    folder = hitting_drafter(tmp_path, target, common)
    assert DFlashDrafter(target, folder).propose(prompt, StepPlan(k=3)).token_ids == [common] * 3  # as built
    drafter = DFlashDrafter(target, folder)
    got, final, _, pipe = generate(target, drafter, 4, prompt, TOKENS, rollback=ROLLBACKS[rollback]())
    assert got == baseline
    assert 0 < final.stats.accepted < final.stats.drafted  # accepts and rejects ran
    assert_tape_holds_the_context(target, drafter, pipe)


@pytest.mark.parametrize("k", [1, 5])
def test_greedy_chain_of_a_random_head_equals_draft_none(tmp_path, setup, k):
    target, prompt, baseline = setup
    drafter = DFlashDrafter(target, str(write_drafter(tmp_path / "d", LAYERS, seed=k)))
    got, final, _, pipe = generate(target, drafter, k, prompt, TOKENS)
    assert got == baseline
    # one head forward per drafting step, whatever k (a step with no room left drafts nothing)
    assert drafter.forwards <= final.stats.steps
    assert (k - 1) * drafter.forwards < final.stats.drafted <= k * drafter.forwards
    assert_tape_holds_the_context(target, drafter, pipe)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tree_equals_draft_none(tmp_path, setup, shape):
    target, prompt, baseline = setup
    common = Counter(baseline).most_common(1)[0][0]
    drafter = DFlashDrafter(target, hitting_drafter(tmp_path, target, common))
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=4), GreedyComparator(), TrimRollback(), GreedyBonus(),
        tree=tree_parts(target, drafter, SHAPES[shape]),
    )  # fmt: skip
    final = list(pipe.run(prompt, TOKENS, stop_ids=set()))[-1]
    assert final.token_ids == baseline
    assert final.stats.accepted > 0
    assert_tape_holds_the_context(target, drafter, pipe)


def test_a_trees_first_branch_is_the_chain(tmp_path):
    target = tiny_target("llama")
    prompt = target.encode_prompt("the cat sat on the mat", chat=False)
    folder = str(write_drafter(tmp_path / "d", LAYERS, seed=2))
    trees, chains = DFlashDrafter(target, folder), DFlashDrafter(target, folder)
    draft = trees.propose_tree(prompt, TreeShape(kind="dynamic", nodes=8, depth=3, branching=[3, 3]))
    tree, node, branch = draft.candidates, -1, []
    while kids := tree.children(node):
        node = kids[0]
        branch.append(tree.tokens[node])
    assert branch == chains.propose(prompt, StepPlan(k=3)).token_ids
    assert len(tree) == 9 and trees.forwards == 1  # 3 positions x width 3, one block forward


def test_the_head_cache_after_any_rollback_equals_a_fresh_drafters(tmp_path):
    target = tiny_target("qwen3")
    folder = str(write_drafter(tmp_path / "d", LAYERS, seed=3))
    prompt = target.encode_prompt("the cat sat on the mat, the cat", chat=False)
    more = generate(target, make_drafter("none", target), 1, prompt, 14)[0]
    reused = DFlashDrafter(target, folder)
    reused.prefill(prompt)
    for n in (0, 3, 4, 9, 2, 12, 12, 1):  # grows, rewinds, grows again, repeats
        context = prompt + more[:n]
        fresh = DFlashDrafter(target, folder)
        got, want = reused.block_logits(context), fresh.block_logits(context)
        assert reused._head_cache[0].offset == len(context) - 1
        assert mx.allclose(got, want, atol=1e-5).item(), f"context +{n}: {mx.abs(got - want).max().item()}"


def test_k_is_capped_by_the_block(tmp_path):
    target = tiny_target("llama")
    drafter = DFlashDrafter(target, str(write_drafter(tmp_path / "d", LAYERS, block_size=4)))
    prompt = target.encode_prompt("the cat", chat=False)
    assert len(drafter.propose(prompt, StepPlan(k=9)).token_ids) == 3


def test_layouts_it_cannot_read_are_one_line(tmp_path):
    target = tiny_target("llama")
    with pytest.raises(SpecpipeError, match="needs the drafter's folder"):
        DFlashDrafter(target, "")
    cases = {
        "dflash2": ({"architectures": ["DFlash2DraftModel"]}, r"architectures \['DFlash2DraftModel'\], expected"),
        "sliding": ({"layer_types": ["sliding_attention"] * 2, "sliding_window": 8}, "only full_attention"),
        "no-mask": ({"dflash_config": {"target_layer_ids": [1, 3]}}, "expected {mask_token_id, target_layer_ids}"),
        "other-target": ({"num_target_layers": 28}, "trained on a target of 28 layers of width 64, this target has 6"),
        "taps": ({"dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 6]}}, "do not fit a target with 6"),
    }
    for name, (overrides, message) in cases.items():
        cfg = config(LAYERS) | overrides
        folder = write(tmp_path / name, cfg, random_weights(config(LAYERS)))
        with pytest.raises(SpecpipeError, match=message) as err:
            DFlashDrafter(target, str(folder))
        assert "\n" not in str(err.value), name
    folder = write_drafter(tmp_path / "extra", LAYERS)
    (folder / "model.safetensors").unlink()
    with pytest.raises(SpecpipeError, match=r"found \['config.json'\], expected a DFlash drafter folder"):
        DFlashDrafter(target, str(folder))
    weights = random_weights(config(LAYERS)) | {"lm_head.weight": np.zeros((4, 64), np.float32)}
    with pytest.raises(SpecpipeError, match=r"unexpected \['lm_head.weight'\]"):
        DFlashDrafter(target, str(write(tmp_path / "lm", config(LAYERS), weights)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecpipeError, match="found nothing, expected a DFlash drafter folder"):
        DFlashDrafter(target, str(tmp_path / "empty"))
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_the_packaged_config_builds_it(tmp_path):
    from hydra import compose, initialize

    from specpipe.plugins import build_plugin

    target = tiny_target("llama")
    folder = write_drafter(tmp_path / "d", LAYERS)
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["draft=dflash", f"draft.path={folder}", "draft.proposal=sample"])
    drafter = build_plugin(cfg.draft, "draft", target=target, load=None)
    assert isinstance(drafter, DFlashDrafter) and drafter.layers == (2, 4) and drafter.proposal == "sample"
    prompt = target.encode_prompt("the cat", chat=False)
    assert len(drafter.propose(prompt, StepPlan(k=3)).token_ids) == 3
