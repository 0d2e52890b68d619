"""draft=eagle3: lossless greedy output on a tiny random llama target with tiny random heads in each
layout, drafts that equal a from-scratch recompute, q = 0 outside the draft vocabulary, and the
drafter built from the packaged config (draft.path=...)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import generate, make_drafter
from eagle3_tiny import head_config, random_weights, write

import specpipe.config.schema  # noqa: F401  (registers the schemas and resolvers the packaged config reads)
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.drafters.eagle3.drafter import Eagle3Drafter
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError

LAYERS = 8
TOKENS = 40


@pytest.fixture(scope="module")
def target():
    return load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": LAYERS})


@pytest.fixture(scope="module")
def prompt(target):
    return target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)


@pytest.fixture(scope="module")
def baseline(target, prompt):
    return generate(target, make_drafter("none", target), 1, prompt, TOKENS)[0]


def head_folder(tmp_path, layout="eagle", seed=0, **overrides):
    cfg = head_config(**overrides)
    return write(tmp_path / f"{layout}-{seed}", layout, cfg, random_weights(cfg, seed=seed, embedding=seed % 2 == 0))


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
@pytest.mark.parametrize("k", [1, 5])
def test_greedy_output_equals_draft_none(tmp_path, target, prompt, baseline, layout, k):
    drafter = Eagle3Drafter(target, str(head_folder(tmp_path, layout, seed=k)))
    got, final, _, _ = generate(target, drafter, k, prompt, TOKENS)
    assert got == baseline
    assert drafter.forwards > 0 and drafter.target_recomputes == 0  # the taps came from the verifies


def test_a_head_that_drafts_the_targets_tokens_is_accepted_and_stays_lossless(tmp_path, target, prompt, baseline):
    # a draft vocabulary of one id, the target's most frequent token here: every draft is that id, so some
    # steps accept several tokens and the chained pairs behind a rejection must be dropped
    common = max(set(baseline), key=baseline.count)
    cfg = head_config(draft_vocab_size=1)
    weights = random_weights(cfg)
    weights["d2t"] = np.array([common], dtype=np.int64)
    weights["t2d"] = np.arange(cfg.vocab_size) == common
    drafter = Eagle3Drafter(target, str(write(tmp_path / "one", "eagle", cfg, weights)))
    got, final, _, _ = generate(target, drafter, 4, prompt, TOKENS)
    assert got == baseline
    assert final.stats.accepted > 0, "no draft was accepted: the test exercises nothing"


def test_every_draft_equals_a_from_scratch_recompute(tmp_path, target, baseline, prompt):
    folder = str(head_folder(tmp_path))
    reused = Eagle3Drafter(target, folder)
    reused.prefill(prompt)
    contexts = [prompt + baseline[:n] for n in (0, 3, 4, 9, 2, 12)]  # grows, rewinds, grows again
    for context in contexts:
        fresh = Eagle3Drafter(target, folder)
        fresh.prefill(context)
        assert reused.propose(context, StepPlan(k=4)).token_ids == fresh.propose(context, StepPlan(k=4)).token_ids


def test_sampled_drafts_put_no_mass_outside_the_draft_vocabulary(tmp_path, target, prompt):
    cfg = head_config()
    weights = random_weights(cfg)
    drafter = Eagle3Drafter(target, str(write(tmp_path / "h", "speculators", cfg, weights)), sampler=Sampler(1.0))
    drafter.prefill(prompt)
    draft = drafter.propose(prompt, StepPlan(k=3))
    q = np.array(draft.probs)
    assert q.shape == (3, cfg.vocab_size) and np.allclose(q.sum(-1), 1, atol=1e-5)
    assert (q[:, ~weights["t2d"]] == 0).all()
    assert all(weights["t2d"][t] for t in draft.token_ids)


def test_a_head_for_another_target_is_one_line(tmp_path, target):
    with pytest.raises(SpecpipeError, match="needs the head's folder"):
        Eagle3Drafter(target, "")
    wide = head_folder(tmp_path, target_hidden_size=32)
    with pytest.raises(SpecpipeError, match="fuses 3 taps of width 32, the target gives 3 of width 64") as err:
        Eagle3Drafter(target, str(wide))
    assert "\n" not in str(err.value)
    with pytest.raises(SpecpipeError, match="do not fit a target with 8 layers"):
        Eagle3Drafter(target, str(head_folder(tmp_path)), layers=[2, 4, 9])


def test_the_packaged_config_builds_it(tmp_path, target, prompt):
    from hydra import compose, initialize

    from specpipe.plugins import build_plugin

    folder = head_folder(tmp_path)
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["draft=eagle3", f"draft.path={folder}", "draft.layers=[1,4,7]"])
    drafter = build_plugin(cfg.draft, "draft", target=target, load=None)
    assert isinstance(drafter, Eagle3Drafter) and drafter.layers == (1, 4, 7)
    drafter.prefill(prompt)
    assert len(drafter.propose(prompt, StepPlan(k=3)).token_ids) == 3
    assert mx.array(drafter.head.d2t).shape == (100,)
