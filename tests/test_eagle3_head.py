"""EAGLE-3 heads: every published layout reads to the same head, its KV cache rolls back exactly,
the reduced vocabulary maps through d2t, and a folder in no known layout is one line.

Parity with the reference implementations (torch) is tests/test_eagle3_parity.py (-m parity).
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from eagle3_tiny import head_config, random_weights, write

from specpipe.drafters.eagle3.layouts import load_head
from specpipe.errors import SpecpipeError

LAYOUTS = ["eagle", "angelslim", "specforge", "speculators"]


def inputs(cfg, n=7, seed=1):
    rng = np.random.default_rng(seed)
    ids = mx.array(rng.integers(0, cfg.vocab_size, n), dtype=mx.uint32)
    taps = mx.array(rng.standard_normal((n, 3 * cfg.target_hidden_size)).astype(np.float32))
    return ids, taps


def draft_logits(head, ids, taps):
    logits, _ = head.step(ids, head.fuse(taps), head.make_cache())
    return logits


def test_every_layout_reads_to_the_same_head(tmp_path):
    cfg = head_config()
    weights = random_weights(cfg)
    ids, taps = inputs(cfg)
    results = {}
    for layout in LAYOUTS:
        head, source = load_head(write(tmp_path / layout, layout, cfg, weights))
        assert source.layout == ("speculators" if layout == "speculators" else "eagle")
        results[layout] = draft_logits(head, ids, taps)
    first = results["eagle"]
    assert first.shape == (len(ids), cfg.draft_vocab_size)
    for layout, logits in results.items():
        assert mx.array_equal(logits, first).item(), layout
    # and the weights matter: another seed's head drafts otherwise
    other, _ = load_head(write(tmp_path / "other", "eagle", cfg, random_weights(cfg, seed=5)))
    assert not mx.allclose(draft_logits(other, ids, taps), first, atol=1e-3).item()


def test_steps_one_at_a_time_and_a_rollback_equal_one_pass(tmp_path):
    cfg = head_config()
    head, _ = load_head(write(tmp_path / "h", "eagle", cfg, random_weights(cfg)))
    ids, taps = inputs(cfg)
    fused = head.fuse(taps)
    whole = draft_logits(head, ids, taps)
    cache = head.make_cache()
    rows = [head.step(ids[i : i + 1], fused[i : i + 1], cache)[0] for i in range(len(ids))]
    assert mx.allclose(mx.concatenate(rows), whole, atol=1e-5).item()
    # roll back 3 pairs (a rejected chain) and feed other ones, then the real ones again
    for c in cache:
        c.trim(3)
    head.step(ids[:3], fused[:3], cache)
    for c in cache:
        c.trim(3)
    again, _ = head.step(ids[4:], fused[4:], cache)
    assert mx.allclose(again, whole[4:], atol=1e-5).item()


def test_the_draft_vocabulary_maps_through_d2t(tmp_path):
    cfg = head_config()
    weights = random_weights(cfg)
    head, _ = load_head(write(tmp_path / "h", "speculators", cfg, weights))
    ids, taps = inputs(cfg)
    logits = draft_logits(head, ids, taps)
    full = head.target_logits(logits)
    assert full.shape == (len(ids), cfg.vocab_size)
    kept = np.flatnonzero(weights["t2d"])
    outside = np.setdiff1d(np.arange(cfg.vocab_size), kept)
    assert np.isneginf(np.array(full)[:, outside]).all()  # probability 0 outside the draft vocabulary
    assert mx.array_equal(mx.argmax(full, axis=-1), head.target_ids(mx.argmax(logits, axis=-1))).item()
    assert set(np.array(head.target_ids(mx.arange(cfg.draft_vocab_size))).tolist()) == set(kept.tolist())


def test_one_vocabulary_needs_no_map_and_a_head_may_share_the_targets_embedding(tmp_path):
    cfg = head_config(draft_vocab_size=259)
    weights = random_weights(cfg, embedding=False)
    assert "d2t" not in weights
    with pytest.raises(SpecpipeError, match="ships no embed_tokens.weight"):
        load_head(write(tmp_path / "h", "eagle", cfg, weights))
    table = mx.array(np.random.default_rng(3).standard_normal((259, 64)).astype(np.float32))
    head, _ = load_head(tmp_path / "h", embed=lambda ids: table[ids])
    assert head.d2t is None and not head.cfg.has_embedding
    ids, taps = inputs(cfg)
    assert draft_logits(head, ids, taps).shape == (len(ids), 259)


def test_taps_follow_each_layouts_convention(tmp_path):
    cfg = head_config()
    weights = random_weights(cfg)
    # SGLang / SpecForge name layer outputs (+1 = the input the engine taps); speculators / vLLM name inputs
    _, specforge = load_head(write(tmp_path / "sf", "specforge", cfg, weights, taps=[1, 3, 4]))
    _, speculators = load_head(write(tmp_path / "sp", "speculators", cfg, weights, taps=[2, 4, 5]))
    _, eagle = load_head(write(tmp_path / "e", "eagle", cfg, weights))
    assert specforge.taps == (2, 4, 5) and speculators.taps == (2, 4, 5) and eagle.taps is None
    assert speculators.verifier == "tiny-random-llama"


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_folders_in_no_known_layout_are_one_line(tmp_path):
    with pytest.raises(SpecpipeError) as err:
        load_head(tmp_path / "missing")
    assert "no such folder" in one_line(err)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecpipeError) as err:
        load_head(tmp_path / "empty")
    assert "no config.json" in one_line(err) and "expected an EAGLE-3 head folder" in one_line(err)
    # a plain model folder (a llama config without draft_vocab_size)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64}))
    with pytest.raises(SpecpipeError) as err:
        load_head(plain)
    assert "'Qwen3ForCausalLM'" in one_line(err) and "speculators_model_type" in one_line(err)
    # a speculators folder of another algorithm
    cfg = head_config()
    folder = write(tmp_path / "dflash", "speculators", cfg, random_weights(cfg))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "speculators_model_type": "dflash"}))
    with pytest.raises(SpecpipeError) as err:
        load_head(folder)
    assert "speculators_model_type 'dflash', expected eagle3" in one_line(err)


def test_missing_misshapen_and_absent_weights_are_named(tmp_path):
    cfg = head_config()
    weights = random_weights(cfg)
    folder = write(tmp_path / "h", "eagle", cfg, {k: v for k, v in weights.items() if k != "fc.weight"})
    with pytest.raises(SpecpipeError) as err:
        load_head(folder)
    assert "missing tensors ['fc.weight']" in one_line(err)
    bad = dict(weights, **{"lm_head.weight": weights["lm_head.weight"][:50]})
    with pytest.raises(SpecpipeError) as err:
        load_head(write(tmp_path / "b", "eagle", cfg, bad))
    assert "misshapen tensors: lm_head.weight (50, 64) (expected (100, 64))" in one_line(err)
    (folder / "model.safetensors").unlink()
    with pytest.raises(SpecpipeError) as err:
        load_head(folder)
    assert "found ['config.json']" in one_line(err) and "model.safetensors or pytorch_model.bin" in one_line(err)
    t2d = np.array(weights["t2d"])
    t2d[np.flatnonzero(t2d)[0]] = False
    t2d[np.flatnonzero(~t2d)[0]] = True
    with pytest.raises(SpecpipeError) as err:
        load_head(write(tmp_path / "t", "eagle", cfg, dict(weights, t2d=t2d)))
    assert "t2d and d2t name different target ids" in one_line(err)
