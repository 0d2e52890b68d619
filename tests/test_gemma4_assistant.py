"""draft=gemma4_assistant on a tiny random gemma4_text target: greedy output equals draft=none (chain under
every rollback), drafts are both accepted and rejected, the drafter reads only the accepted prefix
of the target's K/V, and unreadable layouts and non-Gemma-4 targets fail in one line. (Trees:
tests/test_gemma4_trees.py; batched rows: tests/test_gemma4_assistant_batch.py.)"""

from __future__ import annotations

import json
from collections import Counter

import mlx.core as mx
import pytest
from conftest import ROLLBACKS, generate, make_drafter
from gemma4_tiny import TARGET_TINY, aim_at, config, random_weights, write

from specpipe.core.plan import StepPlan
from specpipe.drafters.gemma4_assistant.drafter import Gemma4AssistantDrafter
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError

TOKENS = 32


def tiny_gemma4(**tiny):
    return load_engine("tiny-random", precision="float32", arch="gemma4_text", seed=0, tiny={**TARGET_TINY, **tiny})


@pytest.fixture(scope="module")
def setup():
    """(target, prompt, draft=none's tokens)."""
    target = tiny_gemma4()
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline = generate(target, make_drafter("none", target), 1, prompt, TOKENS)[0]
    return target, prompt, baseline


def aimed(tmp_path, baseline, n: int, seed: int = 0, **cfg_over) -> str:
    """An assistant that drafts only the baseline's n most frequent tokens: some drafts hit, some miss."""
    cfg = config(**cfg_over)
    frequent = [t for t, _ in Counter(baseline).most_common(n)]
    return str(write(tmp_path / f"a{n}-{seed}", cfg, aim_at(random_weights(cfg, seed), frequent, seed)))


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_greedy_chain_equals_draft_none_under_every_rollback(tmp_path, setup, rollback):
    target, prompt, baseline = setup
    drafter = Gemma4AssistantDrafter(target, aimed(tmp_path, baseline, 2))
    got, final, _, _ = generate(target, drafter, 4, prompt, TOKENS, rollback=ROLLBACKS[rollback]())
    assert got == baseline
    assert 0 < final.stats.accepted < final.stats.drafted  # accepts and rejects both ran


def test_a_random_assistant_with_the_centroid_head_is_lossless(tmp_path, setup):
    target, prompt, baseline = setup
    cfg = config(centroids=7)  # 259 ids = 7 clusters of 37
    drafter = Gemma4AssistantDrafter(target, str(write(tmp_path / "c", cfg, random_weights(cfg, 5))))
    got, final, _, _ = generate(target, drafter, 3, prompt, TOKENS)
    assert got == baseline and final.stats.drafted > 0


def test_the_drafter_sees_only_the_accepted_prefix(tmp_path, setup):
    """After a run, the K/V it reads is the target cache's over context[:-1], equal to a fresh forward's,
    and its draft equals the one drafted over a cache that never held a rejected draft."""
    target, prompt, baseline = setup
    drafter = Gemma4AssistantDrafter(target, aimed(tmp_path, baseline, 2))
    _, _, _, pipe = generate(target, drafter, 4, prompt, TOKENS)
    context = pipe.context
    seen = drafter.kv.read(len(context) - 1)
    fresh = Gemma4AssistantDrafter(target, aimed(tmp_path, baseline, 2))
    cached = context[:-1]  # one prefill over the final context: a cache that never held a rejected draft
    fresh.observe_hidden(0, cached, target.prefill(cached, target.make_cache(), fresh.capture))
    want = fresh.kv.read(len(context) - 1)
    for kind, rows in seen.items():
        # the context passes the 64-position window: the sliding kind lends only its last 64 positions
        assert rows.keys.shape[2] == (64 if kind == "sliding_attention" else len(context) - 1) < len(context)
        assert rows.keys.shape == want[kind].keys.shape and rows.first == want[kind].first
        assert mx.allclose(rows.keys, want[kind].keys, atol=1e-5).item()
        assert mx.allclose(rows.values, want[kind].values, atol=1e-5).item()
    plan = StepPlan(k=4)
    assert drafter.propose(context, plan).token_ids == fresh.propose(context, plan).token_ids


# ---------------------------------------------------------------- one-line refusals


def test_a_non_gemma4_target_is_refused_in_one_line(tmp_path):
    llama = load_engine("tiny-random", precision="float32", arch="llama", seed=0)
    cfg = config()
    folder = write(tmp_path / "a", cfg, random_weights(cfg))
    with pytest.raises(SpecpipeError, match="gemma4 / gemma4_text targets") as err:
        Gemma4AssistantDrafter(llama, str(folder))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda f, c, w: (c.update(model_type="eagle3"), w), "model_type='eagle3'; expected gemma4_assistant"),
        (lambda f, c, w: (c.pop("text_config"), w), "no text_config"),
        (lambda f, c, w: (c, w.pop("pre_projection.weight")), "missing pre_projection.weight"),
        (lambda f, c, w: (c, w.update({"mtp.fc.weight": w["post_projection.weight"]})), "unexpected mtp.fc.weight"),
        (lambda f, c, w: (c.update(backbone_hidden_size=48), w), "pre_projection.weight has shape"),
    ],
)
def test_an_unreadable_layout_is_one_line_naming_what_it_found(tmp_path, setup, spoil, message):
    target = setup[0]
    cfg = config()
    weights = random_weights(cfg)
    spoil(tmp_path, cfg, weights)
    folder = tmp_path / "bad"
    write(folder, config(), weights)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecpipeError, match=message) as err:
        Gemma4AssistantDrafter(target, str(folder))
    assert "\n" not in str(err.value)


def test_an_assistant_of_another_size_is_refused(tmp_path):
    target = tiny_gemma4(hidden_size=48)
    cfg = config()  # backbone 64
    with pytest.raises(SpecpipeError, match="hidden size 64 .* the target has 48"):
        Gemma4AssistantDrafter(target, str(write(tmp_path / "a", cfg, random_weights(cfg))))


# ---------------------------------------------------------------- config and command line


def test_draft_gemma4_assistant_composes_and_builds(tmp_path, setup):
    from hydra import compose, initialize

    import specpipe.config.schema  # noqa: F401  (registers the schemas)
    from specpipe.plugins import build_plugin

    target, prompt, baseline = setup
    folder = aimed(tmp_path, baseline, 2)
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["draft=gemma4_assistant", f"draft.path={folder}"])
    drafter = build_plugin(cfg.draft, "draft", target=target, load=None)
    assert isinstance(drafter, Gemma4AssistantDrafter) and drafter.name == "gemma4_assistant"


def cli(args, cwd):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "specpipe.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


TINY_RUN = ["model=tiny-random", "model.arch=gemma4_text", "+model.tiny.num_hidden_layers=4", "max_tokens=16",
            "prompt.text=the cat sat on the mat, the cat sat on the", "budget.k=3"]  # fmt: skip


def test_the_command_runs_and_a_missing_folder_is_one_line(tmp_path, setup):
    folder = aimed(tmp_path, setup[2], 2)
    ok = cli([*TINY_RUN, "draft=gemma4_assistant", f"draft.path={folder}"], tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = cli([*TINY_RUN, "draft=gemma4_assistant", f"draft.path={tmp_path / 'nowhere'}"], tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    lines = [line for line in bad.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "not a folder" in lines[0], bad.stderr
