"""Hydra compose tests: every option of every group composes and builds;
bad overrides give one line."""

from __future__ import annotations

import os

import pytest
from conftest import CONF_DIR, tiny
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401
from specpipe.cli.argv import validate_overrides
from specpipe.core.plan import StepPlan
from specpipe.errors import SpecpipeError
from specpipe.plugins import build_plugin

GROUPS = ["model", "draft", "quant", "budget", "rollback", "compare", "sampling", "prompt", "experiment"]


def options(group: str) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, group)) if f.endswith(".yaml"))


def compose_with(overrides):
    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("override", [f"{g}={o}" for g in GROUPS for o in options(g)])
def test_every_option_composes(override):
    cfg = compose_with([override])
    assert cfg.max_tokens > 0 and cfg.prompt.text


@pytest.mark.parametrize("option", options("draft"))
def test_every_drafter_builds_against_a_tiny_model(option):
    if option == "mtp":
        pytest.skip("needs a trained or shipped head: built from a checkpoint folder in test_drafters_extra.py")
    if option == "eagle3":
        pytest.skip("needs a head folder (draft.path): built from one in test_eagle3_drafter.py")
    if option == "gemma4_assistant":
        pytest.skip("needs an assistant folder and a gemma4 target: built from them in test_gemma4_assistant.py")
    if option == "dflash":
        pytest.skip("needs a drafter folder (draft.path): built from one in test_dflash_drafter.py")
    extra = {"layerskip": ["draft.depth=1"], "model": ["draft.model=self"]}.get(option, [])
    cfg = compose_with([f"draft={option}", *extra])
    target = tiny("llama")
    drafter = build_plugin(cfg.draft, "draft", target=target, load=None)
    assert drafter.name == option
    context = [1, 2, 3, 1, 2]  # "1 2" was followed by "3 1 2" once: an n-gram drafter has a full guess
    drafter.prefill(context)
    draft = drafter.propose(context, StepPlan(k=3)).token_ids
    # lookahead's pool fills from tree steps' forwards only (tests/test_lookahead.py): empty before one
    assert len(draft) == (0 if option in ("none", "lookahead") else 3), f"draft={option} proposed {draft}"
    assert all(0 <= t < target.vocab_size for t in draft)
    if option == "ngram":
        assert draft == [3, 1, 2]
    if option == "model":  # draft.model=self: the target's own greedy continuation
        assert draft == greedy_continuation(target, context, 3)


def greedy_continuation(target, context: list[int], n: int) -> list[int]:
    import mlx.core as mx

    ids = list(context)
    for _ in range(n):
        ids.append(int(mx.argmax(target.forward(mx.array(ids), target.make_cache()).logits[-1]).item()))
    return ids[len(context) :]


@pytest.mark.parametrize("group", ["budget", "rollback"])
def test_every_budget_and_rollback_builds(group):
    for option in options(group):
        cfg = compose_with([f"{group}={option}"])
        assert build_plugin(cfg[group], group).name == option


@pytest.mark.parametrize(
    "override, words",
    [
        ("draft=bogus", "unknown option draft=bogus: choose one of"),
        ("budget.k=abc", "budget.k"),
        ("foo=1", "unknown config key 'foo'"),
        ("draft.foo=3", "unknown config key 'draft.foo'"),
        ("max_tokens=many", "max_tokens"),
    ],
)
def test_bad_overrides_give_one_line(override, words):
    message = validate_overrides([override])
    assert message is not None and words in message
    assert "\n" not in message


def test_every_job_of_a_sweep_is_checked():
    assert validate_overrides(["-m", "suite=code,prose", "budget.k=4,8"], config_name="bench") is None
    message = validate_overrides(["-m", "draft=ngram,bogus", "budget.k=4,8"])
    assert message.startswith("unknown option draft=bogus") and "(in the sweep job draft=bogus budget.k=4)" in message
    assert "\n" not in message


def test_good_overrides_pass():
    assert (
        validate_overrides(["draft=model", "draft.model=self", "budget.k=16", "model=tiny-random", "model.arch=qwen2"])
        is None
    )


@pytest.mark.parametrize("k", [0, 33, -1])
def test_budget_out_of_range(k):
    cfg = compose_with([f"budget.k={k}"])
    with pytest.raises(SpecpipeError, match="out of range"):
        build_plugin(cfg.budget, "budget")
